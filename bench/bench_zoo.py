"""Time the zoo presets on the phantom and probe what each model learned.

Usage::

    .venv/bin/python bench/bench_zoo.py [quick|default|full ...] [--probe] [--device cuda] [--estimate]

For each preset: trains the zoo into a fresh temporary cache folder (the
phantom itself comes from the normal crslib cache), prints the total wall
time against the budget (quick 120 s, default 600 s on 2 cores), the CPU
time, the load average before and after (other work on the machine inflates
wall time), and per model: wall and CPU seconds, loss, embedding spread,
effective rank and the card's probe margin over its initial weights
(:func:`crslib.models.zoo_probe.probe_zoo`: out-of-fold probe AUROC on the
held-out images, the paired difference and its patient-grouped 95%
interval); with ``--probe`` also the mean linear-probe AUROC over the 8
findings fitted on the training split, scored on val + test. The recorded
table has the preset's time against its budget, the training time per
objective and each trained model's margin. ``--estimate`` trains nothing:
it times a few steps of each model and multiplies by its steps: an idle-machine
estimate (the full preset's factor zoo, say) without spending the hours.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import crslib  # noqa: F401  (before torch/timm)
from _results import record, row  # noqa: E402  (bench/ is the script's folder)

from crslib.config import preset_zoo_data

# full has no budget of its own: configs/full.yaml says how long its whole book takes
BUDGET_S = {"quick": 120.0, "default": 600.0, "full": 3600.0}


def probe_auroc(manifest, encoder) -> float:
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from crslib.data import read_image

    emb = encoder.encode(encoder.preprocess_batch([read_image(p) for p in manifest["path"]]))
    train = (manifest["split"] == "train").to_numpy()
    emb = (emb - emb[train].mean(0)) / (emb[train].std(0) + 1e-6)
    aucs = []
    for column in [c for c in manifest.columns if c.startswith("finding_")]:
        y = manifest[column].to_numpy()
        if len(set(y[train])) < 2 or len(set(y[~train])) < 2:
            continue
        clf = LogisticRegression(C=0.1, max_iter=3000).fit(emb[train], y[train])
        aucs.append(roc_auc_score(y[~train], clf.decision_function(emb[~train])))
    return float(np.mean(aucs))


def estimate(preset: str, manifest, repeats: int = 6) -> float:
    """Idle-machine estimate of a preset's training time: the fastest of
    ``repeats`` timed steps of each model (the minimum filters out time lost
    to other processes), times its number of steps."""
    import torch

    from crslib.models import ZOO_THREADS, build_encoder_module, zoo_specs
    from crslib.models._training import training_context
    from crslib.models.objectives import _build_objective
    from crslib.models.trainer import _labels_for, _load_pool
    from crslib.models.zoo_presets import _preset_image_size

    size = _preset_image_size(preset, None)
    pool = _load_pool(manifest, size, False)
    total = 0.0
    with training_context(ZOO_THREADS):
        for spec in zoo_specs(preset):
            if spec.objective == "random_init":
                continue
            cols, labels, classes = _labels_for(spec.objective, pool.rows)
            torch.manual_seed(0)
            model = _build_objective(spec, build_encoder_module(spec.architecture),
                                     len(cols) if spec.objective == "supervised_multilabel" else len(classes), size)
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
            gen = torch.Generator().manual_seed(0)
            batch = min(spec.batch_size, len(pool.rows))
            x = pool.images[:batch]
            y = None if labels is None else torch.from_numpy(labels[:batch].copy())
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                loss = model.loss(x, y, gen, lambda v: (v - pool.mean) / pool.std)
                opt.zero_grad()
                loss.backward()
                opt.step()
                model.after_step(0.5)
                times.append(time.perf_counter() - t)
            n_rows = len(pool.rows) // 2 if spec.patients != "all" else len(pool.rows)  # a patient half
            steps = (n_rows // batch) * spec.epochs
            total += min(times[1:]) * steps
            print(f"  {spec.name:42s} {min(times[1:]) * 1000:6.1f} ms/step x {steps} steps = "
                  f"{min(times[1:]) * steps:6.1f} s", flush=True)
    return total


def objective_rows(preset: str, cards) -> list[dict]:
    """Training time per objective, and each trained model's probe margin over its initial weights."""
    rows = []
    for objective, group in cards.groupby("objective", sort=False):
        rows.append(row(f"{preset}: training time, {objective} ({len(group)} model(s))",
                        f"{group['wall_time_s'].sum():.0f} s",
                        note=f"CPU {group['cpu_time_s'].sum():.0f} s; effective rank of the embeddings "
                        + ", ".join(f"{v:.1f}" for v in group["embedding_effective_rank"])))
    if "probe_difference" not in cards.columns:
        return rows
    for _, card in cards[cards["probe_difference"].notna()].iterrows():
        rows.append(row(f"{preset}: probe margin over initial weights, {card['name']}",
                        f"{card['probe_difference']:+.3f}", "95% CI low > 0", bool(card["probe_learned"]),
                        f"probe AUROC {card['probe_auroc']:.3f}; 95% CI [{card['probe_low']:+.3f}, "
                        f"{card['probe_high']:+.3f}]; probed on {card['probe_target']}"
                        + ("" if card["probe_learned"] else "; flagged")))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("presets", nargs="*", default=["quick", "default"])
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--device", default="cpu",
                        help="where the models train (crslib.device.resolve_device); a run off the CPU "
                        "is recorded as its own entry, zoo-<device>")
    parser.add_argument("--estimate", action="store_true",
                        help="only estimate the idle-machine training time from the fastest of a few steps")
    args = parser.parse_args(argv)

    import torch

    from crslib.data import load_data
    from crslib.models import load_zoo_encoder, train_zoo

    torch.set_num_threads(2)
    table, start = [], time.perf_counter()
    for preset in args.presets:
        manifest = load_data(preset_zoo_data(preset))
        if args.estimate:
            total = estimate(preset, manifest)
            print(f"== {preset}: estimated {total:.1f} s of training on an idle 2-core machine "
                  f"(budget {BUDGET_S[preset]:.0f} s)")
            continue
        root = tempfile.mkdtemp(prefix=f"crs-zoo-bench-{preset}-")
        load_before = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        cards = train_zoo(manifest, preset=preset, cache_root=root, progress=False, device=args.device)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        load_after = os.getloadavg()[0]
        print(f"\n== zoo preset {preset}: {len(cards)} models on {preset_zoo_data(preset)} "
              f"({int((manifest['split'] == 'train').sum())} training images)")
        print(f"wall {wall:.1f} s (budget {BUDGET_S[preset]:.0f} s, ratio {wall / BUDGET_S[preset]:.2f}); "
              f"CPU {cpu:.1f} s; load average before/after {load_before:.2f}/{load_after:.2f}")
        rows = []
        for _, card in cards.iterrows():
            line = (f"{card['name']:42s} wall {card['wall_time_s']:6.1f}s cpu {card['cpu_time_s']:6.1f}s "
                    f"loss {card['initial_loss'] if card['initial_loss'] == card['initial_loss'] else float('nan'):7.4f}"
                    f" -> {card['final_loss'] if card['final_loss'] == card['final_loss'] else float('nan'):7.4f} "
                    f"spread {card['embedding_spread']:.3f} eff.rank {card['embedding_effective_rank']:6.2f}")
            if args.probe:
                line += f" probe AUROC {probe_auroc(manifest, load_zoo_encoder(card['name'], cache_root=root)):.3f}"
            rows.append(line)
        print("\n".join(rows))
        sys.stdout.flush()
        budget = BUDGET_S[preset]
        table.append(row(f"zoo training, preset {preset}: {len(cards)} models on {args.device}", f"{wall:.0f} s",
                         f"<= {budget:.0f} s", wall <= budget,
                         f"ratio {wall / budget:.2f}; load average {load_before:.1f} before, {load_after:.1f} after"))
        table.extend(objective_rows(preset, cards))
    if table:
        on_cpu = args.device == "cpu"
        record("zoo" if on_cpu else f"zoo-{args.device.replace(':', '')}", table,
               title="Model zoo training" + ("" if on_cpu else f" on {args.device}"),
               seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

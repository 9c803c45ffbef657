"""The ``crs`` command line.

Each subcommand is a thin shell over a crslib function. A user error (a
:class:`crslib.errors.CRSError`) prints one line naming the problem and exits
with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import crslib
from crslib.config import PRESET_NAMES
from crslib.errors import CRSError

log = logging.getLogger("crslib.cli")


def _cmd_phantom(args: argparse.Namespace) -> int:
    from crslib.data.phantom import generate_phantom

    manifest = generate_phantom(
        args.out_dir,
        n_patients=args.patients,
        image_size=args.image_size,
        random_state=args.seed,
        n_sources=args.sources,
        shortcut_strength=args.shortcut_strength,
        split_shift=args.split_shift,
        kermany_layout=args.kermany_layout,
        progress=sys.stderr.isatty(),
    )
    print(
        f"wrote {len(manifest)} images of {manifest['patient_id'].nunique()} patients to {args.out_dir}"
    )
    return 0


def _add_scheduler(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the shard tasks on Dask: 'local' or 'local:N' (a local cluster of N workers) "
                   "or a scheduler address such as tcp://HOST:8786 (default: in this process)")


def _add_device(p: argparse.ArgumentParser, *, amp: bool = False) -> None:
    p.add_argument("--device", default="auto", metavar="{auto,cpu,cuda,mps}",
                   help="where models compute: auto (a GPU when torch sees one, else the CPU; the default), "
                   "cpu, cuda (or cuda:N) or mps; results are cached alike on every device")
    if amp:
        p.add_argument("--amp", action="store_true",
                       help="mixed precision (float16 on a GPU, bfloat16 on the CPU): faster, not bit-equal to "
                       "float32, so it has its own cache entries (default: off)")


def _cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    from crslib._io import atomic_save_npy
    from crslib.data import load_data
    from crslib.embed import extract_embeddings, save_embeddings
    from crslib.models import load_encoder

    manifest = load_data(args.data)
    encoder = load_encoder(args.model)
    result = extract_embeddings(
        manifest,
        encoder,
        batch_size=args.batch_size,
        num_workers=args.workers,
        cache=not args.no_cache,
        on_error="skip" if args.skip_unreadable else "raise",
        progress=None,
        scheduler=args.scheduler,
        device=args.device, amp=args.amp,
        frame=args.frame,
    )
    # the loader leaves out files without an image (DICOM reports, plans, text); name each of them too
    for path in manifest.attrs.get("ignored_files", []):
        print(f"ignored {path}: no image in it (not an image file, or DICOM without Rows/Columns)", file=sys.stderr)
    for row in result.skipped.itertuples():
        print(f"skipped {row.path}: {row.reason}", file=sys.stderr)
    status = "cache hit" if result.cache_hit else "computed"
    if result.shards and not result.cache_hit:
        status += f", {result.shards['from_cache']} of {result.shards['total']} shards from the cache"
    print(
        f"{result.X.shape[0]} embeddings of dimension {result.X.shape[1]} from {encoder.name} "
        f"({status}, {result.seconds:.2f} s, key {result.key[:12]})"
    )
    if args.out:
        out = Path(args.out)
        save_embeddings(out, result.X, dtype=args.store)
        atomic_save_npy(out.with_name(out.stem + "_image_ids.npy"), np.asarray(result.image_ids, dtype=str))
        print(f"saved {out}")
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from crslib.config import preset_zoo_data
    from crslib.data import load_data
    from crslib.models import list_zoo, train_zoo

    if args.retrain or args.ship:
        return _zoo_retrain(args)
    if args.list:
        cards = list_zoo(include_shipped=True)
    else:
        data = args.data or preset_zoo_data(args.preset)
        cards = train_zoo(load_data(data), preset=args.preset, force=args.force, progress=None,
                          scheduler=args.scheduler, device=args.device)
    if cards.empty:
        print("no zoo models trained yet: run crs zoo --preset quick")
        return 0
    columns = [c for c in ["name", "weights", "objective", "architecture", "seed", "epochs", "final_loss",
                           "wall_time_s", "reused"] if c in cards.columns]
    print(cards[columns].to_string(index=False))
    if "wall_time_s" in cards.columns and "reused" in cards.columns:
        trained = cards.loc[~cards["reused"].astype(bool), "wall_time_s"].sum()
        print(f"{len(cards)} models; trained now: {int((~cards['reused'].astype(bool)).sum())} in {trained:.1f} s")
    if "key" in cards.columns and not args.list:
        print("load a model trained here as zoo:NAME@KEY (zoo:NAME loads the shipped one), e.g. "
              f"zoo:{cards['name'].iloc[0]}@{str(cards['key'].iloc[0])[:16]}")
    return 0


def _zoo_retrain(args: argparse.Namespace) -> int:
    """``crs zoo --retrain``: train anew, compare with the shipped zoo; exit 1 when a model did not learn."""
    import pandas as pd

    from crslib.zoo_retrain import retrain_zoo

    table = retrain_zoo(args.preset, models=args.models, data=args.data, force=args.force,
                        scheduler=args.scheduler, device=args.device)

    def margin(row: pd.Series, which: str) -> str:
        value = row[f"{which}_margin"]
        if pd.isna(value):
            return "-"
        return f"{value:+.3f} [{row[f'{which}_low']:+.3f}, {row[f'{which}_high']:+.3f}]"

    shown = pd.DataFrame({
        "model": table["name"], "shipped margin": [margin(r, "shipped") for _, r in table.iterrows()],
        "retrained margin": [margin(r, "retrained") for _, r in table.iterrows()],
        "overlap@10 with shipped": [("-" if pd.isna(v) else f"{v:.3f}") for v in table["overlap_with_shipped"]],
        "same weights": table["same_weights"].map({True: "yes", False: "no"})})
    print(shown.to_string(index=False))
    print("margin: probe AUROC minus the initial weights' on the zoo data's held-out images, 95% interval; "
          "overlap@10: shared share of 10 nearest neighbours, shipped vs retrained embeddings of those images")
    if args.ship:
        _ship(args, table)
    unlearned = table.loc[table["retrained_learned"].notna() & ~table["retrained_learned"].astype(bool), "name"]
    if len(unlearned):
        print(f"{len(unlearned)} retrained model(s) do not clear their initial weights: {', '.join(unlearned)}")
        return 1
    return 0


def _ship(args: argparse.Namespace, table) -> None:
    """``crs zoo --ship``: copy the retrained models into the shipped zoo (a developer step, then commit)."""
    from crslib.config import preset_zoo_data
    from crslib.models import list_zoo
    from crslib.models.zoo_shipped import ship_model
    from crslib.staging import git_commit

    data = args.data or preset_zoo_data(args.preset)
    cards = list_zoo().set_index("key")
    commit = git_commit()
    for key in table["key"]:
        card = cards.loc[key].to_dict() | {"key": key}
        print(f"shipped {ship_model(card, zoo_data=data, commit=commit)}")


def _cmd_compare(args: argparse.Namespace) -> int:
    from crslib._io import atomic_write_text
    from crslib.cluster import open_client
    from crslib.compare import binary_label_frame, compare_embeddings, model_provenance
    from crslib.data import load_data
    from crslib.embed import extract_embeddings
    from crslib.models import load_encoder, random_init_spec
    from crslib.reports import render_report_html

    manifest = load_data(args.data)
    labels = binary_label_frame(manifest, args.labels) if args.labels else None
    reference = None if args.no_reference else (args.reference or random_init_spec(args.new))
    embeddings, models = {}, {}
    with open_client(args.scheduler) as client:  # one cluster for every model and search
        for role, spec in (("old", args.old), ("new", args.new), ("reference", reference)):
            if spec is None:
                continue
            encoder = load_encoder(spec)
            # the report names a model by the spec the user wrote; the encoder's name (the resolved spec,
            # which can be a cache path) is provenance
            models[role] = model_provenance(spec, encoder)
            embeddings[role] = extract_embeddings(manifest, encoder, progress=None, scheduler=client,
                                                  device=args.device).X
        result = compare_embeddings(
            embeddings["old"], embeddings["new"], manifest, old=args.old, new=args.new, k=args.k,
            X_reference=embeddings.get("reference"), reference=reference if "reference" in embeddings else None,
            labels=labels, min_overlap=args.min_overlap, decision=args.decision, n_resamples=args.resamples,
            n_permutations=args.permutations, models=models, random_state=args.seed, scheduler=client,
            device=args.device, target_recall=args.target_recall,
        )
    out = Path(args.out)
    atomic_write_text(out / "compare.json", result.to_json())
    atomic_write_text(out / "report.html", render_report_html(result))
    print(f"mutual {result.k}-NN overlap {result.overlap:.3f} (95% CI {result.overlap_low:.3f}-"
          f"{result.overlap_high:.3f}); chance {result.chance:.4f}")
    if result.null is not None:
        print(f"permutation null ({result.null['n_permutations']} relabellings): mean {result.null['mean']:.4f} "
              f"(95% range {result.null['low']:.4f}-{result.null['high']:.4f}), p = {result.null['p_value']:.3g}")
    if result.overlap_error_bound > 0:
        recalls = ", ".join(f"{role} {info['recall']:.3f}" for role, info in result.search.items()
                            if info.get("recall") is not None)
        print(f"approximate neighbour index: recall@{result.k} {recalls}; the overlap is off by at most "
              f"{result.overlap_error_bound:.3f}")
    if result.reference_overlap is not None:
        print(f"old vs {result.reference}: {result.reference_overlap:.3f}")
    if result.map_r2 is not None:
        print(f"linear map new -> old, held-out R^2 {result.map_r2:.3f}")
    for row in result.transfer:
        print(f"transfer {row['finding']}: retention {row['retention']:.3f}")
    print(f"report: {out / 'report.html'}")
    if result.passed is False:
        print(f"FAIL: {result.gate}", file=sys.stderr)
        return 1
    if result.passed:
        print(f"PASS: {result.gate}")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    import json

    from crslib._io import atomic_write_text
    from crslib.audit import run_audit
    from crslib.data import file_properties, load_data
    from crslib.duplicates import image_fingerprints
    from crslib.embed import extract_embeddings
    from crslib.models import load_encoder
    from crslib.reports import render_audit_html

    manifest = load_data(args.data)
    properties = file_properties(manifest, progress=None)
    X, name = None, None
    if args.model.lower() != "none":
        encoder = load_encoder(args.model)
        X, name = extract_embeddings(manifest, encoder, progress=None, device=args.device).X, encoder.name
    fingerprints = image_fingerprints(manifest) if args.leakage else None
    result = run_audit(manifest, properties, embeddings=X, embedding_name=name, fingerprints=fingerprints,
                       label_column=args.label, n_resamples=args.resamples, random_state=args.seed,
                       n_permutations=args.permutations)
    out = Path(args.out)
    atomic_write_text(out / "audit.json", result.to_json())
    atomic_write_text(out / "audit.html", render_audit_html(result))
    # the checklist evidence, where `crs checklist` finds it: */evidence.json of the folder holding the report
    evidence = result.checklist_evidence(data=args.data, source="crs audit")
    atomic_write_text(out / "evidence.json", json.dumps(evidence, indent=2))
    for what, part in (("file properties", result.partition_properties), (name, result.partition_embeddings)):
        if part is None:
            continue
        for row in part.table.itertuples():
            print(f"partition AUC ({what}, {row.scope}): {row.auc:.3f} "
                  f"({100 * part.confidence:g}% CI {row.low:.3f}-{row.high:.3f})")
    for row in result.shortcut.table.itertuples():
        print(f"shortcut balanced accuracy ({row.scope}): {row.balanced_accuracy:.3f} "
              f"({100 * result.shortcut.confidence:g}% CI {row.low:.3f}-{row.high:.3f})")
    if result.leakage is not None:
        print(f"leakage: {result.leakage.summary()}")
    for note in result.notes:
        print(f"note: {note}")
    print(f"report: {out / 'audit.html'}")
    print(f"checklist evidence: {out / 'evidence.json'} (crs checklist {out.resolve().parent})")
    return 0


def _cmd_risk(args: argparse.Namespace) -> int:
    from crslib._io import atomic_write_text
    from crslib.data import load_data
    from crslib.embed import embed_models
    from crslib.errors import DataError
    from crslib.reports import render_risk_html
    from crslib.risk import representation_risk
    from crslib.risk_needs import task_need
    from crslib.risk_results import stability_table

    manifest = load_data(args.data)
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    missing = [t for t in tasks if t not in manifest.columns]
    if missing:
        raise DataError(f"--task column(s) {', '.join(missing)} not in the manifest; columns: "
                        f"{', '.join(map(str, manifest.columns))}")
    groups = manifest["patient_id"] if "patient_id" in manifest.columns else manifest["image_id"]
    for task in tasks:  # before anything is embedded: one line naming the column and what it lacks
        reason = task_need(manifest[task], groups=groups.to_numpy(), n_partitions=args.partitions,
                           random_state=args.seed, name=task, task=args.task_type)
        if reason:
            raise DataError(f"--task {reason}")
    specs = [s.strip() for s in args.models.split(",") if s.strip()]
    embeddings = embed_models(manifest, specs, device=args.device)
    out = Path(args.out)
    outcomes = {}
    for task in tasks:
        result = representation_risk(
            embeddings, manifest[task].to_numpy(), groups=groups.to_numpy(), n_components=args.components,
            n_partitions=args.partitions, n_resamples=args.resamples, random_state=args.seed, task=args.task_type,
            loss=args.loss, union_size=args.union_size,
            combinations=[c.strip() for c in args.combinations.split(",") if c.strip()],
        )
        outcomes[task] = result
        result.save(out, name=task)
        scores = result.selected_test_scores
        print(f"{task} ({result.task}): selected {result.primary.selected}, test {result.metric} "
              f"{result.primary.selected_row['test_score']:.3f}; over {len(scores)} partitions "
              f"{scores.min():.3f}-{scores.max():.3f}; selected most often: "
              f"{result.stability()['selected most often']}")
    atomic_write_text(out / "stability.csv", stability_table(outcomes).to_csv())
    atomic_write_text(out / "risk.html", render_risk_html(outcomes))
    print(f"report: {out / 'risk.html'}")
    return 0


def _cmd_checklist(args: argparse.Namespace) -> int:
    from crslib._io import atomic_write_text
    from crslib.checklist import build_checklist
    from crslib.records import run_results_folder
    from crslib.runner import read_run_evidence

    run_results_folder(args.run_dir)  # a folder that holds no run is refused before anything is written
    evidence, run_id = read_run_evidence(args.run_dir)
    checklist = build_checklist(evidence, run_id=run_id)
    print(checklist.to_markdown())
    out = Path(args.out) if args.out else Path(args.run_dir)
    atomic_write_text(out / "checklist.md", checklist.to_markdown())
    atomic_write_text(out / "checklist.json", checklist.to_json())
    print(f"{checklist.n_complete} of {len(checklist.items)} items complete; written to "
          f"{out / 'checklist.md'} and {out / 'checklist.json'}")
    return 1 if args.strict and checklist.n_missing else 0


def _cmd_claims(args: argparse.Namespace) -> int:
    from crslib._io import atomic_write_text
    from crslib.claims import build_ledger
    from crslib.records import run_results_folder

    ledger = build_ledger(run_results_folder(args.run_dir))
    print(ledger.to_markdown())
    print(", ".join(f"{n} {name}" for name, n in ledger.counts().items() if n) + f" (of {len(ledger.verdicts)})")
    for path, text in ((args.json, ledger.to_json()), (args.markdown, ledger.to_markdown())):
        if path:
            atomic_write_text(path, text)
            print(f"written to {path}")
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from crslib._io import atomic_write_text
    from crslib.diff import diff_runs
    from crslib.reports import render_diff_html

    diff = diff_runs(args.run_a, args.run_b)
    out = Path(args.out)
    atomic_write_text(out / "diff.json", diff.to_json())
    atomic_write_text(out / "diff.html", render_diff_html(diff))
    print(diff.summary())
    for row in diff.flips.itertuples():
        print(f"flipped: {row.id} ({row.chapter}): {row.verdict_a} -> {row.verdict_b}")
    for table in diff.tables:
        if table.status != "same":
            counts = table.counts()
            parts = [f"{n} {what}" for n, what in (
                (counts["real"], "real"), (counts["within_interval"], "within intervals"),
                (counts["no_interval"], "without interval"), (counts["text_changed"], "text"),
                (len(table.rows_only_a), "rows only in A"), (len(table.rows_only_b), "rows only in B"),
                (len(table.columns_only_a) + len(table.columns_only_b), "columns in one run only")) if n]
            print(f"{table.status}: {table.table}" + (f" ({', '.join(parts)})" if parts else ""))
    for item in diff.unreadable:
        print(f"not compared (unreadable): {item}", file=sys.stderr)
    print(f"report: {out / 'diff.html'}")
    print(f"json: {out / 'diff.json'}")
    return 1 if args.fail_on_flip and diff.flipped else 0


def _cmd_book(args: argparse.Namespace) -> int:
    from crslib.runner import Progress, build_book

    def clock(seconds: float) -> str:
        if seconds < 60:
            return f"{seconds:.1f} s"
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"

    def show(step: Progress) -> None:
        # one plain line per event, flushed: readable in a CI log, where stdout is a pipe
        where = f"[{step.index}/{step.total}] {step.name}"
        if step.event == "start":
            line = f"{where}: running..."
        elif step.event == "failed":
            line = f"{where}: failed after {clock(step.seconds or 0.0)}"
        elif step.event == "build":
            line = "building the HTML book..."
        elif step.event == "built":
            line = f"HTML book built in {clock(step.seconds or 0.0)}, elapsed {clock(step.elapsed)}"
        elif step.event == "unchanged":
            line = (f"HTML book unchanged (it shows run {step.reused_from}, whose executions this run reused): "
                    f"not rebuilt, elapsed {clock(step.elapsed)}")
        else:
            how = (f"reused from run {step.reused_from} (identical execution)" if step.reused_from
                   else f"done in {clock(step.seconds or 0.0)}")
            ended = step.completed or step.index  # notebooks run side by side: the bar counts those that ended
            filled = round(20 * ended / step.total)
            line = (f"{where}: {how}  [{'#' * filled}{'.' * (20 - filled)}] {ended}/{step.total}, "
                    f"elapsed {clock(step.elapsed)}")
        print(line, flush=True)

    record = build_book(args.config or args.preset, only=args.only, build=not args.no_build,
                        repository_url=args.repository_url, reuse=not args.rerun, data=args.data,
                        models=args.models, overrides=[tuple(pair) for pair in args.parameters or ()]
                        + ([("zoo_weights", "retrain")] if args.zoo == "retrain" else [])
                        + ([("strict", "true")] if args.strict else []),
                        progress=show)
    for notebook in record.notebooks:
        for skip in notebook.skips:
            print(f"{notebook.name}: skipped {skip['analysis']}: {skip['reason']}")
    print(f"run folder: {record.run_dir}")
    if record.html_index:
        print(f"book: {record.html_index}")
    return 0


def _add_phantom_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "phantom",
        help="generate the synthetic chest-radiograph data set",
        description="Generate the phantom data set: image files, manifest.csv and latents.csv. "
        "The same arguments give byte-identical files.",
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder to write (created)")
    p.add_argument("--patients", type=int, default=300, help="number of patients (default 300)")
    p.add_argument("--image-size", type=int, default=64, help="image size in pixels, 32-512 (default 64)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--sources", type=int, default=4, help="number of acquisition sites (default 4)")
    p.add_argument("--shortcut-strength", type=float, default=0.0,
                   help="coupling of label and file encoding in the training pool, 0-1 (default 0)")
    p.add_argument("--split-shift", type=float, default=0.0,
                   help="acquisition shift of the official test split, 0-1 (default 0)")
    p.add_argument("--kermany-layout", action="store_true",
                   help="single label, chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}/ folders, Kermany file names")
    p.set_defaults(func=_cmd_phantom)


def _add_embed_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed",
        help="extract (cached) embeddings of a data set with a model",
        description="Extract embeddings with a content-addressed cache: a second run with the same "
        "images and weights is a cache hit; an interrupted run resumes.",
    )
    p.add_argument("--data", required=True, metavar="DATA",
                   help="manifest .csv/.parquet, data folder, image folder, MedMNIST .npz, or 'phantom?patients=N&size=PX&seed=S'")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help="model spec: timm:NAME[?weights=PATH|pretrained=hf][&size=PX], "
                   "onnx:PATH#OUTPUT[?size=..&mean=..&std=..&bgr=1&scale=255], zoo:NAME, public:NAME")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--workers", type=int, default=None, help="data loader workers (default: automatic)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="skip unreadable images and list them, instead of stopping at the first")
    p.add_argument("--frame", choices=("middle", "first", "all"), default="middle",
                   help="which frame of a multi-frame DICOM file is the image: the middle one (default), "
                   "the first, or all (their mean); single-frame files read the same under each")
    p.add_argument("--out", metavar="FILE.npy", help="also save the embeddings (and FILE_image_ids.npy)")
    p.add_argument("--store", choices=("float32", "float16"), default="float32",
                   help="number type of --out: float16 halves the file and the memory a search maps "
                   "(see crslib.embed.save_embeddings for its measured effect on neighbours)")
    _add_scheduler(p)
    _add_device(p, amp=True)
    p.set_defaults(func=_cmd_embed)


def _add_zoo_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "zoo",
        help="train (or reuse) the model zoo on the phantom training pool",
        description="Train small encoders that differ in one factor at a time (objective, seed, size; "
        "with --preset full also initialisation, training patients and recipe); each gets a checkpoint "
        "and a model card in the cache, and a trained model is reused.",
    )
    p.add_argument("--preset", default="default", choices=list(PRESET_NAMES),
                   help="which zoo to train (default: default; full adds the factor pairs, hours on 2 cores)")
    p.add_argument("--data", metavar="DATA", help="training data (default: the preset's phantom)")
    p.add_argument("--force", action="store_true", help="retrain even when a cached model matches")
    p.add_argument("--list", action="store_true", help="list the trained models and exit")
    p.add_argument("--retrain", action="store_true",
                   help="train the preset's models anew into the cache and compare each with the shipped one "
                   "(probe margins, neighbour overlap); exit 1 when a retrained model does not clear its initial "
                   "weights")
    p.add_argument("--models", nargs="+", metavar="PATTERN",
                   help="with --retrain: only the models whose names match these shell patterns")
    p.add_argument("--ship", action="store_true",
                   help="with --retrain: copy the retrained models into crslib/models/zoo_weights (for "
                   "maintainers; commit the result)")
    _add_scheduler(p)
    _add_device(p)
    p.set_defaults(func=_cmd_zoo)


def _add_compare_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="check whether a successor model returns the same neighbours as the old one",
        description="Model-replacement check on unlabelled images: mutual kNN overlap with a CI against "
        "chance and a random-init reference, per subgroup, the linear map's held-out R^2 and, with "
        "--labels, classifier transfer retention, and thumbnails of the images whose neighbours changed "
        "most. Writes report.html and compare.json; exits 1 when the overlap's lower 95% bound (with "
        "--decision upper: its upper bound) is below --min-overlap.",
    )
    p.add_argument("--old", required=True, metavar="SPEC", help="the model in use")
    p.add_argument("--new", required=True, metavar="SPEC", help="the candidate successor")
    p.add_argument("--data", required=True, metavar="DATA", help="images (labels optional)")
    p.add_argument("--k", type=int, default=10, help="neighbours per image (default 10)")
    p.add_argument("--labels", nargs="+", metavar="COL", help="manifest columns for classifier transfer")
    p.add_argument("--min-overlap", type=float, metavar="X", help="fail (exit 1) below this overlap")
    p.add_argument("--decision", default="lower", choices=["lower", "upper"],
                   help="which end of the overlap's 95%% CI must reach --min-overlap: lower (default; the data "
                   "must show the overlap is high enough) or upper (lenient: a wide interval passes)")
    p.add_argument("--reference", metavar="SPEC",
                   help="reference model (default: the new model's architecture, randomly initialised)")
    p.add_argument("--no-reference", action="store_true", help="skip the random-init reference")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--permutations", type=int, default=199, metavar="N",
                   help="relabellings of the new model's neighbours for the permutation null (default 199; 0 skips)")
    p.add_argument("--seed", type=int, default=0, help="seed of bootstrap, permutations and splits (default 0)")
    p.add_argument("--target-recall", type=float, default=0.95, metavar="R",
                   help="above 200,000 images the neighbour search is approximate, tuned until the lower 95%% "
                   "bound of its recall@k reaches R (default 0.95)")
    p.add_argument("--out", default="crs-compare", metavar="DIR", help="report folder (default crs-compare)")
    _add_scheduler(p)
    _add_device(p)
    p.set_defaults(func=_cmd_compare)


def _add_audit_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="audit a data set's official split and its files for shortcuts",
        description="Split and shortcut audits of study 2 on any data: a partition classifier "
        "(training pool vs official test split) from file properties and from a model's embeddings, "
        "and a classifier from file properties alone to the label, in the pool (patient-grouped CV) "
        "and on the test split; and duplicate images (exact, near, embedding) and possibly shared patients within "
        "and across the splits. Writes audit.html (self-contained), audit.json and evidence.json (the split and "
        "shortcut items of the reporting checklist: run `crs checklist` on the folder that holds the audit folder).",
    )
    p.add_argument("--data", required=True, metavar="DATA",
                   help="manifest, data folder (e.g. a Kermany chest_xray/ copy) or 'phantom?...'")
    p.add_argument("--model", default="public:efficientnet_lite0", metavar="SPEC",
                   help="model for the embedding partition audit, or 'none' (default public:efficientnet_lite0)")
    p.add_argument("--label", default="label", metavar="COL", help="label column (default label)")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of folds and bootstrap (default 0)")
    p.add_argument("--permutations", type=int, default=None, metavar="N",
                   help="label permutations per permutation test (default: run_audit's, 100)")
    p.add_argument("--no-leakage", dest="leakage", action="store_false",
                   help="skip the duplicate and shared-patient audit (it reads every image once more)")
    p.add_argument("--out", default="crs-audit", metavar="DIR", help="report folder (default crs-audit)")
    _add_device(p)
    p.set_defaults(func=_cmd_audit)


def _add_risk_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "risk",
        help="representation risk: benchmark encoders, select on locked validation data",
        description="Benchmark several encoders on a task under common dimension control (PCA fitted on "
        "training rows), with linear, kNN and MLP heads; select on a locked validation partition; accept a "
        "feature union or a combination of the encoders' predictions (average, greedy average, linear stack) "
        "only with validation evidence; select by a proper score (log loss, MSE or MAE) with a tie rule that "
        "prefers the simpler candidate; refit the choice on train + validation; report paired test comparisons "
        "and the spread over repeated patient-grouped partitions. Writes CSV tables and risk.html.",
    )
    p.add_argument("--data", required=True, metavar="DATA", help="images with the task column(s)")
    p.add_argument("--models", required=True, metavar="SPEC,SPEC,...", help="comma-separated model specs")
    p.add_argument("--task", required=True, metavar="COL[,COL]",
                   help="target column(s): two values -> binary; text, or integers with 3-20 values -> "
                   "multiclass; other numbers -> regression (see --task-type)")
    p.add_argument("--task-type", default="auto", choices=("auto", "binary", "multiclass", "regression"),
                   help="override the guessed task type of every --task column (default auto)")
    p.add_argument("--components", type=int, default=128, help="shared PCA dimension (default 128)")
    p.add_argument("--partitions", type=int, default=12, help="repeated partitions (default 12)")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--loss", default="auto", choices=("auto", "log_loss", "mse", "mae"),
                   help="proper score that selects on validation: auto = log_loss (classification), mse "
                   "(regression)")
    p.add_argument("--union-size", type=int, default=2, metavar="N",
                   help="encoders in the feature union (0: none; default 2)")
    p.add_argument("--combinations", default="average,greedy,stack", metavar="KIND,...",
                   help="prediction-level combinations to try (default average,greedy,stack; '' for none)")
    p.add_argument("--seed", type=int, default=0, help="seed of partitions and bootstrap (default 0)")
    p.add_argument("--out", default="crs-risk", metavar="DIR", help="output folder (default crs-risk)")
    _add_device(p)
    p.set_defaults(func=_cmd_risk)


def _add_checklist_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "checklist",
        help="fill the seven-item reporting checklist from a run folder",
        description="Read the evidence a book run recorded (results/*/evidence.json), or that commands such as "
        "`crs audit --out DIR/audit` wrote (DIR/*/evidence.json), and print the "
        "seven-item reporting checklist of study 2: each item complete or missing, with the effect "
        "measured in this run beside the paper's, and its crosswalk to CLAIM 2024, TRIPOD+AI, MI-CLAIM "
        "and DOME. Writes checklist.md and checklist.json.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder under runs/, or a folder holding crs audit output")
    p.add_argument("--out", metavar="DIR", help="where to write checklist.md/.json (default: RUN_DIR)")
    p.add_argument("--strict", action="store_true", help="exit 1 when an item is missing")
    p.set_defaults(func=_cmd_checklist)


def _add_claims_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "claims",
        help="the claims ledger of a run folder: each claim of the studies, this run's number, the verdict",
        description="Read a run folder's result tables (from `crs book`, with its own --data/--models or the "
        "default) and print the claims ledger: every claim of the three studies with the paper's number, "
        "this run's number and interval, the decision rule and the verdict (held, not held, reversed, "
        "inconclusive, not evaluated with the reason). Exit status 0 whatever the verdicts.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder under runs/ (or its results/ folder)")
    p.add_argument("--json", metavar="FILE", help="also write the ledger as JSON (one object per claim)")
    p.add_argument("--markdown", metavar="FILE", help="also write the ledger as a Markdown table")
    p.set_defaults(func=_cmd_claims)


def _add_diff_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="what changed between two run folders: result tables and claim verdicts",
        description="Compare two run folders (from `crs book`): every result table (results/**/*.csv, matched by "
        "path; rows matched on the text columns) number by number, a change counted as real only where the "
        "table has the runs' own intervals and the two intervals do not overlap; and every claim verdict of the "
        "ledger that flipped. Writes diff.html and diff.json; exit 0, or 1 with --fail-on-flip when a verdict "
        "flipped.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="the earlier (reference) run folder")
    p.add_argument("run_b", metavar="RUN_B", help="the later run folder")
    p.add_argument("--out", default="crs-diff", metavar="DIR", help="report folder (default crs-diff)")
    p.add_argument("--fail-on-flip", action="store_true", help="exit 1 when a claim verdict flipped")
    p.set_defaults(func=_cmd_diff)


def _add_book_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "book",
        help="run the notebooks with a preset and build the book",
        description="Execute notebooks/*.py with papermill into a new run folder runs/<time>-<preset>/, "
        "then build the HTML book with jupyter-book and print the path of index.html.",
    )
    p.add_argument("--preset", default="default", choices=list(PRESET_NAMES),
                   help="parameter preset from configs/ (default: default)")
    p.add_argument("--config", metavar="FILE", help="a YAML config file instead of a preset")
    p.add_argument("--data", metavar="PATH",
                   help="the data every chapter studies instead of the preset's phantom: a folder of images, a "
                   "manifest (.csv/.parquet), a Kermany-layout folder, a DICOM folder or a MedMNIST .npz")
    p.add_argument("--models", metavar="SPEC,SPEC,...",
                   help="the models every chapter studies (comma-separated specs, e.g. "
                   "public:efficientnet_lite0,onnx:/m.onnx#feat; zoo:* adds the zoo, trained on the phantom)")
    p.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="run only these notebooks (name or number)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", dest="parameters", metavar=("NAME", "VALUE"),
                   help="set a notebook parameter on top of the preset or --config, the papermill way "
                   "(repeatable): NAME in every selected notebook that has it, NOTEBOOK.NAME (e.g. "
                   "02_agreement.k or 02.k) in one; VALUE is read as YAML (20 an int, 0.5 a float, true a "
                   "bool, other text a string) and must fit the type of the notebook's default")
    p.add_argument("--zoo", choices=["shipped", "retrain"], default="shipped",
                   help="the zoo's weights: shipped (trained once, in the repository; the default) or retrain "
                   "(trained anew in the cache, as crs zoo --retrain does)")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first file of the data that is not a readable image (default: leave such "
                   "files out, as crs embed --skip-unreadable does, and list them in chapter 01)")
    p.add_argument("--no-build", action="store_true", help="execute the notebooks but do not build HTML")
    p.add_argument("--rerun", action="store_true",
                   help="execute every notebook, even one whose identical execution (same source, parameters, "
                   "crslib code and package versions, on the embedded default data) an earlier run cached")
    p.add_argument("--repository-url", metavar="URL",
                   help="the public GitHub repository's https URL, for the repository, Binder and "
                   "Colab buttons; overrides repository.url in _config.yml (default: no such buttons)")
    p.set_defaults(func=_cmd_book)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``crs`` (exposed for the CLI reference page)."""
    parser = argparse.ArgumentParser(
        prog="crs",
        description="CRS companion: agreement, protocol sensitivity and representation risk "
        "of medical image encoders.",
    )
    parser.add_argument("--version", action="version", version=f"crs {crslib.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_phantom_command(sub)
    _add_embed_command(sub)
    _add_zoo_command(sub)
    _add_compare_command(sub)
    _add_audit_command(sub)
    _add_risk_command(sub)
    _add_checklist_command(sub)
    _add_claims_command(sub)
    _add_diff_command(sub)
    _add_book_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``crs``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.debug:
        # pydicom logs each decoder plugin's failure with its traceback before it raises, and warns
        # about each odd header value it reads past; a failure reaches the user once, as the
        # ImageReadError's one line (which quotes every plugin's reason). A filter on our handlers,
        # not a logger level: importing pydicom resets its logger's level.
        def shown(record: logging.LogRecord) -> bool:
            return record.name.split(".")[0] != "pydicom" or (
                record.levelno >= logging.ERROR and not record.exc_info)

        for handler in logging.getLogger().handlers:
            handler.addFilter(shown)
    try:
        return int(args.func(args) or 0)
    except CRSError as exc:
        if args.debug:
            raise
        message = str(exc).strip().splitlines()
        print(f"crs {args.command}: error: {message[0] if message else type(exc).__name__}", file=sys.stderr)
        for line in message[1:]:
            print(f"  {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("crs: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

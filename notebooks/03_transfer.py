# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Carrying classifiers across encoders
#
# Two encoders that share few neighbours may still carry the same
# information, arranged differently. CRS-Bench tests this with a
# **{ref}`linear map <glossary-linear-map>`** between two models' embedding spaces, fitted on unlabelled images:
# classifiers trained on the old model are applied to the new model's
# embeddings mapped into the old space. The share of {ref}`AUROC <glossary-auroc>` kept ({ref}`retention <glossary-retention>`
# = transferred / original) measures how much survives the change of
# encoder; the paper reports **0.987** over 14 findings with a map fitted on
# 4,096 unlabelled images (the paper's number, on real chest radiographs).
#
# With the default parameters the old model is a zoo encoder and the
# candidates are another seed of the same objective, another objective and a
# public ImageNet network, on the phantom; the line below the setup names the
# models and data of this run. The map images, the classifiers' training
# images and their test images are disjoint sets of patients. The linear
# maps need only the images; the classifiers need 0/1 `finding_*` columns
# or a two-class `label` in the manifest.
#
# *Terms used in this chapter*, defined in the {doc}`glossary <../glossary>`: {ref}`linear map <glossary-linear-map>`, {ref}`classifier transfer and retention <glossary-classifier-transfer>`, {ref}`Procrustes <glossary-procrustes>`, {ref}`AUROC <glossary-auroc>`.

# %% tags=["parameters"]
data = "phantom?patients=300&size=64&seed=1"  # other patients than the zoo trained on (zoo_data, seed 0)
strict = False  # True: stop at the first file that is not a readable image (default: leave it out, list it)
zoo_data = "phantom?patients=600&size=64&seed=0"
zoo_preset = "default"
zoo_weights = "shipped"  # shipped: the zoo trained once and shipped with crslib; retrain: trained anew here
public_size = 64
old_model = "zoo:supervised_multilabel-cnn_small-seed0"
new_models = "zoo:supervised_multilabel-cnn_small-seed1,zoo:contrastive-cnn_small-seed0,public:efficientnet_lite0"
seed = 0
n_resamples = 500
device = "auto"  # where models compute: auto (a GPU when torch sees one), cpu, cuda, mps
results_dir = "results/03_transfer"

# %% tags=["hide-input"]
import html
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import HTML, Markdown, display

import crslib
from crslib import claims, paper, plots
from crslib.data import drop_unreadable, load_data
from crslib.embed import embed_models
from crslib.models.lineup import resolve_models
from crslib.runner import SkipLog
from crslib.splits import MIN_PATIENTS, grouped_partition, min_patients
from crslib.transfer import classifier_transfer, fit_linear_map, held_out_r2, transfer_sweep, transfer_targets


def code(text):
    """A model spec, column or class name, shown literally."""
    return f"<code>{html.escape(str(text))}</code>"


results = Path(results_dir)
plots.set_reader_display()
results.mkdir(parents=True, exist_ok=True)
skips = SkipLog(results)
manifest, _ = drop_unreadable(load_data(data), strict=strict)  # chapter 01 lists the files left out
# the zoo is trained (or reused) only when a zoo: model is listed, on zoo_data, never on data
requested = [old_model, *[s.strip() for s in new_models.split(",") if s.strip()]]
lineup = resolve_models(requested, zoo_data=zoo_data, zoo_preset=zoo_preset,
                        zoo_weights=zoo_weights, public_size=int(public_size),
                        device=device)
# models by their spec as given (zoo models as zoo:NAME), embedded with the loadable spec
shown = {row.name: row.spec if row.backend == "zoo" else row.name for row in lineup.info.itertuples()}
embeddings = embed_models(manifest, {shown[name]: lineup.specs[name] for name in lineup.names}, device=device)
old_model, *candidates = shown.values()
groups = manifest["patient_id"].to_numpy()
fractions = (0.5, 0.25, 0.25)
n_patients = len(pd.unique(groups))
need_patients = max(min_patients(fractions), MIN_PATIENTS)
can_map = skips.check(
    "the comparison of the old model with new models",
    None if candidates else (f"only one model is listed ({old_model}); list the old model and at least one new "
                             "one (`crs book --models OLD,NEW`, or the new_models parameter) to compare them"),
) and skips.check(
    "the linear maps and the classifier transfer",
    None if n_patients >= need_patients else (
        f"the map, training and test partitions ({', '.join(f'{v:.0%}' for v in fractions)} of patients) need "
        f"at least {need_patients} patients; the manifest has {n_patients}"),
)
can_transfer = False
if can_map:
    map_idx, train_idx, test_idx = grouped_partition(groups, fractions, random_state=seed)
    labels, left_out = transfer_targets(manifest)
    labels = labels.reset_index(drop=True)
    can_transfer = skips.check("the classifier transfer",
                               "; ".join(left_out.values()) if labels.shape[1] == 0 else None)
    if can_transfer:
        for column, reason in left_out.items():
            skips.check(f"the classifier transfer of {column}", reason)
    findings = can_transfer and all(c.startswith("finding_") for c in labels.columns)
    target_word = "findings" if findings else "targets"
    if findings:
        what = f"{labels.shape[1]} findings"
    else:
        what = "; ".join(f"target {code(c.split('=', 1)[0])}, positive class {code(c.split('=', 1)[1])}"
                         if "=" in c else f"target {code(c)}" for c in labels.columns)
    display(Markdown(
        f"Old model {code(old_model)}; new {'model' if len(candidates) == 1 else 'models'} "
        f"{', '.join(code(c) for c in candidates)}; "
        + (f"{len(map_idx):,} images for the map, {len(train_idx):,} to train the classifiers, {len(test_idx):,} "
           f"to test them ({what})" if can_transfer else
           f"{len(map_idx):,} images to fit the maps and {len(test_idx):,} to test them")
        + f"; {n_patients:,} patients in all."
    ))

# %% [markdown]
# ## Retention per finding
#
# For each finding (or the two-class `label` of a manifest without
# findings) a logistic regression is trained on the old model's
# embeddings; a ridge map (regularisation chosen by cross-validation) from
# each new model's space to the old one is fitted on the map images; the old
# classifier then scores the mapped test images. Each bar's interval in
# the figure is a bootstrap interval over test patients; the summary table
# after it averages over findings and carries no interval.

# %% tags=["hide-input"]
transferred = False
if can_transfer:
    tables = []
    for spec in candidates:
        table = classifier_transfer(
            embeddings[old_model], embeddings[spec], labels, map_idx=map_idx, train_idx=train_idx,
            test_idx=test_idx, groups=groups, n_resamples=n_resamples, random_state=seed,
        ).table
        tables.append(table.assign(new_model=spec))
    transfer = pd.concat(tables, ignore_index=True)
    transfer.to_csv(results / "retention_by_finding.csv", index=False)
    # the classifiers and their test images are the same for every new model: so are the targets left out
    for row in tables[0][tables[0]["reason"].ne("")].itertuples():
        skips.check(f"the classifier transfer of {row.finding}", f"{row.reason} of this run's patient partition")
    transferred = skips.check(
        "the retention figure and summary",
        None if transfer["reason"].eq("").any() else
        "no target has both classes among the training and among the test images of this run's patient partition",
    )

# %% tags=["hide-input"] mystnb={"figure": {"caption": "AUROC retention per finding when the old model's classifiers score the new model's embeddings mapped into the old space.", "name": "fig-03-4"}, "image": {"alt": "Bar charts of AUROC retention per finding for each new model"}}
if transferred:
    fig, axes = plt.subplots(1, len(candidates), figsize=(4.2 * len(candidates), 3.6), sharex=True, squeeze=False)
    for ax, spec in zip(axes[0], candidates):
        plots.retention_bars(transfer[transfer["new_model"] == spec], ax=ax)
        ax.set_title(spec.split(":", 1)[1], fontsize=9)
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if transferred:
    summary = transfer.groupby("new_model").agg(
        mean_original_auroc=("auroc_original", "mean"),
        mean_transferred_auroc=("auroc_transferred", "mean"),
        mean_retention=("retention", "mean"),
        map_r2=("map_r2", "first"),
    ).reindex(candidates)
    summary.to_csv(results / "retention_summary.csv")
    ranked = summary["mean_retention"].dropna().sort_values()
    lead = ("Mean retention over findings" if findings else
            f"Retention of the {code(labels.columns[0])} classifier" if labels.shape[1] == 1 else
            "Mean retention over targets")
    display(Markdown(
        f"{lead}, this run: "
        + "; ".join(f"{code(name)} {row.mean_retention:.3f}" for name, row in summary.iterrows())
        + (f" (highest {code(ranked.index[-1])}, lowest {code(ranked.index[0])}; the maps' held-out R² ranges "
           f"from {summary['map_r2'].min():.3f} to {summary['map_r2'].max():.3f})" if len(ranked) > 1 else "")
        + f". The paper reports {paper.value('transfer_auroc_retention'):.3f} over 14 findings on real radiographs."
    ))
    display(plots.reader_table(summary))

# %% [markdown]
# ## How many unlabelled images does the map need?
#
# The paper fits its map on 4,096 images. Retention as a function of the
# number of map images n, for the first candidate (when the data has fewer
# images than the paper's largest n, the sweep stops at what the data
# allows).

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Mean retention and the map's held-out R² as the number of unlabelled map images grows; the paper's 0.987 at n = 4,096 for reference.", "name": "fig-03-6"}, "image": {"alt": "Line plot of retention and R² against the number of map images"}}
if can_transfer:
    swept = transfer_sweep(embeddings[old_model], embeddings[candidates[0]], labels, groups=groups,
                           n_resamples=min(n_resamples, 200), random_state=seed)
    sweep = swept.table
    sweep.to_csv(results / "retention_by_n.csv", index=False)
    by_n = sweep.groupby("n_map", as_index=False)[["retention", "map_r2"]].mean()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(by_n["n_map"], by_n["retention"], marker="o", label=f"mean retention over {target_word}")
    ax.plot(by_n["n_map"], by_n["map_r2"], marker="s", linestyle="--", label="map held-out R²")
    ax.axhline(paper.value("transfer_auroc_retention"), color="grey", linestyle=":",
               label=f"paper: {paper.value('transfer_auroc_retention'):.3f} at n = {paper.value('map_fit_images'):,.0f}")
    ax.set(xscale="log", xlabel="unlabelled images used to fit the map (n)", ylim=(0, 1.05))
    ax.minorticks_off()
    ax.set_xticks(by_n["n_map"], labels=[f"{int(n):,}" for n in by_n["n_map"]])
    ax.legend(frameon=False, fontsize=8)
    plt.show()

# %% tags=["hide-input"]
if can_transfer:
    display(plots.reader_table(by_n))
    first, last = by_n.iloc[0], by_n.iloc[-1]
    left = sorted(sweep.loc[sweep["reason"].ne(""), "finding"].unique())
    retention_text = (
        "no retention could be computed: no target has both classes among the sweep's training and test images"
        if by_n["retention"].isna().all() else
        f"mean retention {first.retention:.3f}" if len(by_n) == 1 else
        f"mean retention from {first.retention:.3f} to {last.retention:.3f}")
    display(Markdown(
        f"The sweep's own patient split holds a map pool of {swept.n_pool:,} images, {swept.n_train:,} images to "
        f"train the classifiers and {swept.n_test:,} to test them. "
        + (f"With n = {int(first.n_map):,} map images the map's held-out R² is {first.map_r2:.3f}; "
           if len(by_n) == 1 else
           f"From n = {int(first.n_map):,} to n = {int(last.n_map):,} map images the map's held-out R² goes from "
           f"{first.map_r2:.3f} to {last.map_r2:.3f}; ")
        + retention_text
        + (f" (the paper's n = {paper.value('map_fit_images'):,.0f} is more than this pool holds)"
           if swept.n_pool < paper.value("map_fit_images") else "")
        + "."
        + (f" Left out of the mean (one class in the sweep's training or test images): "
           f"{', '.join(code(f) for f in left)}." if left else "")
    ))

# %% [markdown]
# ## Which map?
#
# Ridge regression, plain least squares and an orthogonal {ref}`Procrustes <glossary-procrustes>` map
# (rotation and one scale) compared by held-out R² of the mapped
# embeddings. Least squares overfits when the map images are few relative
# to the dimensions; Procrustes keeps only rotations, so it measures how
# much of the relation is a rigid change of basis.

# %% tags=["hide-input"]
if can_map:
    rows = []
    for spec in candidates:
        for method in ["ridge", "lstsq", "procrustes"]:
            linear = fit_linear_map(embeddings[spec][map_idx], embeddings[old_model][map_idx], method=method,
                                    random_state=seed)
            rows.append({"new model": spec, "method": method,
                         "held-out R²": held_out_r2(linear, embeddings[spec][test_idx], embeddings[old_model][test_idx])})
    maps = pd.DataFrame(rows)
    maps.to_csv(results / "map_methods.csv", index=False)
    display(plots.reader_table(maps.pivot(index="new model", columns="method", values="held-out R²")))
    best = maps.loc[maps.groupby("new model", sort=False)["held-out R²"].idxmax()]
    wins = best["method"].value_counts()
    display(Markdown(
        f"Best map by held-out R² on {len(test_idx):,} test images, fitted on {len(map_idx):,}: "
        + "; ".join(f"{code(r['new model'])} {r['method']} ({r['held-out R²']:.3f})" for _, r in best.iterrows())
        + ". " + "; ".join(f"{method.capitalize()} is best for {n} of {len(candidates)} new "
                           f"{'model' if len(candidates) == 1 else 'models'}" for method, n in wins.items()) + "."
    ))
    negative = maps[maps["held-out R²"] < 0]
    if len(negative):
        worst = negative.loc[negative["held-out R²"].idxmin()]
        display(Markdown(
            f"A held-out R² below 0 ({len(negative)} map(s); the lowest, {worst['method']} for "
            f"{code(worst['new model'])}, is {worst['held-out R²']:.3f}) means the map predicts the old model's test "
            "embeddings worse than their mean does: fitted on "
            f"{len(map_idx):,} images for {embeddings[worst['new model']].shape[1]:,} input dimensions, it learned "
            "the map images' noise. That is the overfitting this section warns about, not a property of the two "
            "encoders; the regularised ridge map is the one the retention above uses."))

# %% [markdown]
# ## What this run shows
#
# Each claim of the study that this chapter measures, with this run's number
# and the verdict of a decision rule fixed before the run (`crslib.claims`;
# the [claims at a glance](claims.md) page has the whole run's ledger).

# %% tags=["hide-input"]
display(HTML(claims.build_ledger(results.parent).chapter_html("03")))

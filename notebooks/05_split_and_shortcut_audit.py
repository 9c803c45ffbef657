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
# # Is the test split like the training pool? Do the files give the label away?
#
# Two audits that need no anatomy at all, only the split and the files.
#
# **{ref}`Partition classifier <glossary-partition-classifier>` (adversarial validation).** Train a classifier to
# tell images of the official test split from images of the training pool.
# If the two came from the same distribution it cannot (AUC 0.5); if it can,
# the test split measures something other than the pool. On Kermany the
# paper's partition classifier reached **AUC 0.697**, and **0.898 among
# normal images** (the paper's numbers).
#
# **{ref}`Shortcut <glossary-shortcut>` classifier.** Train a classifier on *file properties only*
# (size in bytes, pixel dimensions, mode and bit depth, JPEG quality
# estimated from the quantisation tables, progressive flag, chroma
# subsampling, PNG chunks, EXIF and metadata) to predict the label. On
# Kermany it reached **0.992 {ref}`balanced accuracy <glossary-balanced-accuracy>` in the training pool and
# 0.496 on the official test split** (the paper's numbers): the files of the
# pool encode the label, those of the test split do not, so a model that
# learns the encoding looks excellent in cross-validation and fails on test.
#
# By default both audits run on the Kermany-like phantom, whose knobs put
# these effects in on purpose: `shortcut` couples the file encoding to the
# label in the training pool only, `shift` draws the official test split from
# a later acquisition batch. A second phantom with both knobs at 0 shows that
# the audits do not invent effects that are not there. With
# `crs book --data` they run on your data alone; they need a `split` column
# with train and test rows, a two-class `label` and patient ids (a
# Kermany `chest_xray/` folder has all three). The file properties are
# described for any files. The same audits run from the command line:
# `crs audit --data chest_xray/`.
#
# *Terms used in this chapter*, defined in the {doc}`glossary <../glossary>`: {ref}`partition classifier <glossary-partition-classifier>`, {ref}`shortcut <glossary-shortcut>`, {ref}`balanced accuracy <glossary-balanced-accuracy>`, {ref}`AUROC <glossary-auroc>`.

# %% tags=["parameters"]
data = "phantom?patients=400&size=64&seed=1&kermany=1&shortcut=0.9&shift=0.5"
null_data = "phantom?patients=400&size=64&seed=2&kermany=1"  # audited only when `data` is a phantom
model = "public:efficientnet_lite0"
zoo_data = "phantom?patients=300&size=64&seed=0"  # what a zoo: model trains on (only when `model` is one)
zoo_preset = "quick"
public_size = 64
n_resamples = 500
n_permutations = None  # None: run_audit's default, 100 (embeddings: only up to 1,000,000 values)
seed = 0
results_dir = "results/05_split_and_shortcut_audit"

# %% tags=["hide-input"]
import html
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import HTML, Markdown, display

import crslib
from crslib import claims, plots
from crslib.audit import PAPER_NUMBERS, run_audit
from crslib.shortcut import permutation_note
from crslib.data import file_properties, load_data
from crslib.embed import embed_models
from crslib.errors import DataError, InputError
from crslib.models.lineup import resolve_models
from crslib.needs import unmet_need
from crslib.runner import SkipLog

results = Path(results_dir)
plots.set_reader_display()
results.mkdir(parents=True, exist_ok=True)
skips = SkipLog(results)
is_phantom = str(data).startswith("phantom")
# the zoo trains (or is reused) only when `model` is a zoo: spec, and then on zoo_data
model_spec = resolve_models(model, zoo_data=zoo_data, zoo_preset=zoo_preset, public_size=int(public_size)).specs
model_spec = next(iter(model_spec.values()))


def code(text) -> str:
    """User-given text (a path, a column value) shown literally in Markdown."""
    return f"<code>{html.escape(str(text))}</code>"


def audit_need(manifest: pd.DataFrame) -> str | None:
    """What the audits need that the manifest lacks (columns the loader filled in count as missing)."""
    observed = manifest.drop(columns=manifest.attrs.get("filled_columns") or [])
    need = (unmet_need(observed, splits=["train", "test"]) or unmet_need(observed, binary="label")
            or unmet_need(observed, columns=["patient_id"]))
    if need:
        return need
    split = observed["split"].astype(str)
    pool_need = unmet_need(observed[split.isin(["train", "val"])], binary="label", groups="patient_id",
                           min_per_class=5)
    test_need = unmet_need(observed[split == "test"], binary="label", groups="patient_id")
    return (f"in the training pool (train + val), {pool_need}" if pool_need
            else f"in the test split, {test_need}" if test_need else None)


def audit(manifest: pd.DataFrame, properties: pd.DataFrame):
    X = embed_models(manifest, {model: model_spec})[model]
    return run_audit(manifest, properties, embeddings=X, embedding_name=model, n_resamples=int(n_resamples),
                     random_state=seed, n_permutations=None if n_permutations is None else int(n_permutations))


def label_names(values: pd.Series) -> pd.Series:
    """The phantom's 0/1 label as Kermany's folder names; any other label as it is."""
    return values.map({0: "NORMAL", 1: "PNEUMONIA"}) if is_phantom else values.astype(str)


manifest = load_data(data)
properties = file_properties(manifest)
need = audit_need(manifest)
result = None
if need is None:
    try:
        result = audit(manifest, properties)
    except (DataError, InputError) as exc:  # e.g. too few patients of one kind for the cross-validation folds
        need = str(exc)
level = f"{100 * result.shortcut.confidence:g}%" if result is not None else "95%"  # the intervals' coverage
if result is not None:
    (results / "audit.json").write_text(result.to_json())
    shared = int(result.provenance["n_patients_in_several_splits"])
    display(Markdown(
        f"{result.n_images:,} images; " + ", ".join(
            f"{html.escape(str(s['split']))}: {s['images']:,} images of {s['patients']:,} patients"
            for s in result.provenance["splits"])
        + f"; patients in more than one split: **{shared}**."
    ))
else:
    display(Markdown(f"{code(data)}: {len(manifest):,} images; the file properties below describe them."))
by = [c for c in ("split", "label") if c in manifest.columns and c not in (manifest.attrs.get("filled_columns") or [])]
summary = properties.assign(**{c: (label_names(manifest[c]) if c == "label" else manifest[c].astype(str)).to_numpy()
                               for c in by})
file_table = summary.groupby(by or (lambda _: "all images")).agg(
    images=("image_id", "size"), mean_kB=("file_size", lambda s: s.mean() / 1000), mean_width=("width", "mean"),
    share_rgb=("mode", lambda s: (s == "RGB").mean()), mean_jpeg_quality=("jpeg_quality", "mean"),
    share_progressive=("jpeg_progressive", lambda s: s.astype(float).mean()),
).round(2)
display(plots.reader_table(file_table, digits=2))
gaps = []
if "label" in by:
    for split, rows in (file_table.groupby(level="split") if "split" in by else [(None, file_table)]):
        if len(rows) == 2:
            (_, a), (_, b) = rows.iterrows()
            gaps.append(("" if split is None else f"{code(split)} ")
                        + f"{abs(a.mean_kB - b.mean_kB):.2f} kB and {abs(a.mean_width - b.mean_width):.1f} px")
if gaps:
    display(Markdown("Difference between the two classes' mean file size and mean width"
                     + (", per split: " if "split" in by else ": ") + "; ".join(gaps) + ". "
                     + ("A difference in the pool that the test split does not share is what the shortcut "
                        "classifier below picks up." if result is not None else
                        "Without the audits below this is only a hint that the files could give the label away.")))
else:
    display(Markdown(f"Mean file size {properties['file_size'].mean() / 1000:.2f} kB, widths "
                     f"{properties['width'].min():.0f}-{properties['width'].max():.0f} px, "
                     f"{(properties['mode'] == 'RGB').mean():.0%} RGB."))


# %% [markdown]
# ## Partition classifier
#
# Training pool (train + val) vs official test split, patient-grouped
# 5-fold cross-validation (all images of a patient in one fold), out-of-fold
# AUC with a 95 % patient-grouped bootstrap interval; overall and within
# each class. Once from the encoder's embeddings, once from file
# properties (logistic regression on standardised features both times).
# The bootstrap interval holds the out-of-fold scores fixed and so is too
# narrow; the permutation p-value (the split shuffled between whole
# patients and the cross-validation rerun) is the test of "no difference".
# It needs at least 20 permutations to be able to fall below 0.05 (the
# smallest possible p is 1 / (permutations + 1)), and it comes with the AUCs
# of the shuffled splits: cross-validated AUCs of splits that do not differ
# scatter around, and often below, 0.5, so an AUC at or below them is not
# evidence of a difference, even when its interval lies below 0.5.

# %% tags=["hide-input"]
def partition_rows(res, name):
    rows = []
    for source, part in (("embeddings", res.partition_embeddings), ("file properties", res.partition_properties)):
        if part is None:
            continue
        t = part.table.copy()
        t["source"] = source
        t["data"] = name
        rows.append(t)
    return pd.concat(rows, ignore_index=True)


audits = []  # (name in the partition tables, name in the shortcut tables, result)
if result is not None:
    audits.append(("phantom with shift", "phantom with shortcut", result) if is_phantom
                  else ("this data", "this data", result))
    if is_phantom:  # the comparison "with the effects / without" exists only on the phantom
        manifest_null = load_data(null_data)
        properties_null = file_properties(manifest_null)
        null_need = audit_need(manifest_null)
        if skips.check("the audit of the phantom without shortcut and shift", null_need):
            result_null = audit(manifest_null, properties_null)
            (results / "audit_null.json").write_text(result_null.to_json())
            audits.append(("phantom without", "phantom without", result_null))
run_partition = skips.check("the partition classifier (training pool vs official test split)", need)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Partition classifier AUC (training pool vs official test split) from embeddings and file properties, overall and per class; on the phantom with and without the injected effects.", "name": "fig-05-4"}, "image": {"alt": "Dot plots with intervals of partition AUC by source and class"}}
if run_partition:
    partition = pd.concat([partition_rows(res, name) for name, _, res in audits], ignore_index=True)
    partition["scope"] = (partition["scope"].replace({"class=0": "NORMAL", "class=1": "PNEUMONIA"}) if is_phantom
                          else [s.removeprefix("class=") for s in partition["scope"]])
    partition.to_csv(results / "partition_auc.csv", index=False)

    fig, axes = plt.subplots(1, len(audits), figsize=(5 * len(audits), 3.4), sharey=True, squeeze=False)
    for ax, (name, _, _) in zip(axes[0], audits):
        part = partition[partition["data"] == name].reset_index(drop=True)
        labels = [f"{r.source}\n{r.scope}" for r in part.itertuples()]
        plots.interval_dots(part["auc"], part["low"], part["high"], ax=ax, capsize=3)
        ax.set_yticks(range(len(part)), labels, fontsize=8)
        ax.axvline(0.5, color="grey", linestyle=":", label="no shift (0.5)")
        ax.axvline(PAPER_NUMBERS["partition_auc"], color="black", linestyle="--", linewidth=0.8,
                   label=f"paper: {PAPER_NUMBERS['partition_auc']:.3f} overall")
        ax.axvline(PAPER_NUMBERS["partition_auc_normal"], color="black", linestyle="-.", linewidth=0.8,
                   label=f"paper: {PAPER_NUMBERS['partition_auc_normal']:.3f} normal images")
        ax.set(xlim=(min(0.3, partition["low"].min() - 0.02), 1.02), xlabel=f"partition AUC ({level} CI)",
               title=name)
        ax.invert_yaxis()
    axes[0][-1].legend(frameon=False, fontsize=7, loc="lower right")
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
NULL_LABELS = {"null_mean": "shuffled: mean", "null_low": "shuffled: low", "null_high": "shuffled: high",
               "evidence": "permutation verdict"}
PARTITION_WORDS = {"yes": "the test split differs from the pool", "no": "not evidence of a difference",
                   "too few permutations": "too few permutations to decide"}


def permutation_notes(parts) -> str:
    """Why the permutation tests of these audit parts decide nothing, as sentences ('' when they can)."""
    notes = sorted({permutation_note(part.n_permutations) for part in parts if part is not None} - {""})
    return "".join(f" {note[:1].upper()}{note[1:]} (`n_permutations`)." for note in notes)


if run_partition:
    display(plots.reader_table(
        partition[["data", "source", "scope", "auc", "low", "high", "p_value", "null_mean", "null_low", "null_high",
                   "evidence", "n_pool", "n_test"]], labels=NULL_LABELS))
    overall = partition[partition["scope"] == "all"]
    display(Markdown(
        "Overall partition AUC: " + "; ".join(
            f"{r.data}, {r.source} **{r.auc:.3f}** ({level} CI {r.low:.3f}-{r.high:.3f}"
            + (f", permutation p = {r.p_value:.3f} against shuffled splits of mean {r.null_mean:.3f}, {level} range "
               f"{r.null_low:.3f}-{r.null_high:.3f}: {PARTITION_WORDS[r.evidence]})" if np.isfinite(r.p_value)
               else ", no permutation test)")
            for r in overall.itertuples())
        + f"; the paper's: {PAPER_NUMBERS['partition_auc']:.3f} overall, "
        f"{PAPER_NUMBERS['partition_auc_normal']:.3f} among normal images. A permutation p below 0.05 says the "
        "test split can be told from the pool (it measures something other than the pool); an AUC at or below "
        "the shuffled splits' AUCs is not evidence of a difference, even with an interval below 0.5. The interval "
        "alone is too narrow to say either."
        + permutation_notes([part for _, _, res in audits
                             for part in (res.partition_embeddings, res.partition_properties)])
    ))
    if is_phantom and len(audits) == 2:
        with_effects, without = (overall[overall["data"] == name] for name in ("phantom with shift", "phantom without"))
        no_difference = int((without["evidence"] == "no").sum())
        undecided = int((without["evidence"] == "too few permutations").sum())
        display(Markdown(
            f"With the knobs on, the partition AUC is {with_effects['auc'].min():.3f}-{with_effects['auc'].max():.3f} "
            "over the two sources. Two injected effects add up here: the later acquisition batch of the test split "
            "(`shift`) and the shortcut encodings, which exist only in the pool and include padding and rescaling "
            "that any image model sees. On Kermany the two are entangled in the same way, which is why the audit "
            "cannot say *which* difference it found, only that the test split is not a sample of the pool. "
            f"Without the knobs the AUC is {without['auc'].min():.3f}-{without['auc'].max():.3f}, and the "
            f"permutation test gives no evidence of a difference for {no_difference} of {len(without)} sources"
            + (f" and has too few permutations to decide for {undecided}." if undecided else ".")
        ))

# %% [markdown]
# ## Shortcut classifier
#
# File properties → label. In the pool: patient-grouped cross-validated
# balanced accuracy (out-of-fold); on test: a model fitted on the whole pool.
# Which file properties carry the label: each property alone, cross-validated
# in the pool (permutation importances are saved too, but with a strong
# shortcut every property carries it redundantly, so shuffling any one
# changes little).

# %% tags=["hide-input"]
run_shortcut = skips.check("the shortcut classifier (file properties to label)", need)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Balanced accuracy of the file-property classifier in the pool and on the test split, and the file properties that carry the label.", "name": "fig-05-6"}, "image": {"alt": "Dot plot of shortcut balanced accuracy and bar chart of single-property accuracy"}}
if run_shortcut:
    shortcut = pd.concat([res.shortcut.table.assign(data=name) for _, name, res in audits], ignore_index=True)
    shortcut.to_csv(results / "shortcut_balanced_accuracy.csv", index=False)
    result.shortcut.importances.to_csv(results / "shortcut_importances.csv", index=False)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), gridspec_kw={"width_ratios": [1, 1.3]})
    ax = axes[0]
    colours = ("#c44e52", "#4c72b0")
    offsets = (-0.12, 0.12) if len(audits) == 2 else (0.0,)
    for offset, colour, (_, name, _) in zip(offsets, colours, audits):
        part = shortcut[shortcut["data"] == name].set_index("scope").loc[["pool", "test"]]
        ax.errorbar(np.arange(2) + offset, part["balanced_accuracy"],
                    yerr=[part["balanced_accuracy"] - part["low"], part["high"] - part["balanced_accuracy"]],
                    fmt="o", capsize=3, color=colour, label=name)
    ax.scatter([0, 1], [PAPER_NUMBERS["shortcut_pool"], PAPER_NUMBERS["shortcut_test"]], marker="D", color="black",
               zorder=3, label="paper (Kermany)")
    ax.axhline(0.5, color="grey", linestyle=":")
    ax.set_xticks([0, 1], ["training pool (CV)", "official test split"])
    ax.set(ylim=(min(0.3, shortcut["low"].min() - 0.02), 1.02), ylabel=f"balanced accuracy ({level} CI)")
    ax.legend(frameon=False, fontsize=7)
    top = result.shortcut.importances.sort_values("alone", ascending=False).head(10).iloc[::-1]
    axes[1].barh(top["feature"], top["alone"], color="#c44e52")
    axes[1].axvline(0.5, color="grey", linestyle=":")
    axes[1].set(xlim=(min(0.3, top["alone"].min() - 0.02), 1.02),
                xlabel="pool balanced accuracy of this property alone (CV)")
    axes[1].tick_params(axis="y", labelsize=8)
    axes[1].set_title("which file properties carry the label", fontsize=9)
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if run_shortcut:
    display(plots.reader_table(
        shortcut[["data", "scope", "balanced_accuracy", "low", "high", "p_value", "null_mean", "null_low",
                  "null_high", "evidence", "n_images"]], labels=NULL_LABELS))
    shortcut_words = {"yes": "above chance", "no": "no evidence above chance",
                      "too few permutations": "too few permutations to decide", "no permutation test": "no test"}
    cells = shortcut.set_index(["data", "scope"])
    top3 = result.shortcut.importances.sort_values("alone", ascending=False).head(3)
    display(Markdown(
        "File properties → label, balanced accuracy: " + "; ".join(
            f"{name}: pool **{cells.loc[(name, 'pool'), 'balanced_accuracy']:.3f}** "
            f"({level} CI {cells.loc[(name, 'pool'), 'low']:.3f}-{cells.loc[(name, 'pool'), 'high']:.3f}; "
            f"permutation test: {shortcut_words[cells.loc[(name, 'pool'), 'evidence']]}), test "
            f"**{cells.loc[(name, 'test'), 'balanced_accuracy']:.3f}** "
            f"({cells.loc[(name, 'test'), 'low']:.3f}-{cells.loc[(name, 'test'), 'high']:.3f}; "
            f"permutation test: {shortcut_words[cells.loc[(name, 'test'), 'evidence']]})"
            for _, name, _ in audits)
        + f"; the paper's on Kermany: pool {PAPER_NUMBERS['shortcut_pool']:.3f}, test "
        f"{PAPER_NUMBERS['shortcut_test']:.3f}. The properties that carry the label best alone: "
        + ", ".join(f"{code(r.feature)} ({r.alone:.3f})" for r in top3.itertuples())
        + ". A pool accuracy well above 0.5 means the files encode the label; if the test accuracy falls to chance, "
        "a model that learns the encoding looks excellent in cross-validation and fails on test."
        + permutation_notes([res.shortcut for _, _, res in audits])
    ))
    if is_phantom and len(audits) == 2:
        display(Markdown(
            "On the phantom the shortcut is switched on in the pool only, the pattern the paper found on Kermany; "
            "with both knobs at 0 there is nothing to find. A model trained on the pixels can pick the same "
            "signal up where the encoding is visible (padding, rescaling), which is one reason the protocol "
            "notebook's test numbers differ from its validation numbers."
        ))

# %% [markdown]
# The full report, as `crs audit` writes it, is saved next to the results
# (`audit.html`), with the checklist evidence of the audit.

# %% tags=["hide-input"]
from crslib.reports import render_audit_html

if skips.check("the audit report and its checklist evidence", need):
    (results / "audit.html").write_text(render_audit_html(result), encoding="utf-8")
    # the checklist evidence of this audit (split provenance and shift audit; shortcut), as `crs audit` records it
    evidence = result.checklist_evidence(data=data, source="05_split_and_shortcut_audit")
    (results / "evidence.json").write_text(json.dumps(evidence, indent=2))
    display(Markdown(f"Recorded checklist evidence for: {', '.join(evidence)}."))

# %% [markdown]
# ## What this run shows
#
# Each claim of the study that this chapter measures, with this run's number
# and the verdict of a decision rule fixed before the run (`crslib.claims`;
# the [claims at a glance](claims.md) page has the whole run's ledger).

# %% tags=["hide-input"]
display(HTML(claims.build_ledger(results.parent).chapter_html("05")))

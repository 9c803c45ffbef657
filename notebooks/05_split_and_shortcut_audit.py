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
# **Leakage.** Is the same image, or possibly the same patient, on both
# sides of the split? Exact copies, near copies and shared person numbers
# let a model be scored on images it has seen. The last section looks for
# them and shows what they do to a test number.
#
# By default the audits run on the Kermany-like phantom, whose knobs put
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
strict = False  # True: stop at the first file that is not a readable image (default: leave it out, list it)
null_data = "phantom?patients=400&size=64&seed=2&kermany=1"  # audited only when `data` is a phantom
model = "public:efficientnet_lite0"
zoo_data = "phantom?patients=600&size=64&seed=0"  # what a zoo: model trains on (only when `model` is one)
zoo_preset = "default"
zoo_weights = "shipped"  # shipped: the zoo trained once and shipped with crslib; retrain: trained anew here
public_size = 64
n_resamples = 500
n_permutations = None  # None: run_audit's default, 100 (embeddings: only up to 1,000,000 values)
seed = 0
device = "auto"  # where models compute: auto (a GPU when torch sees one), cpu, cuda, mps
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
from crslib.data import drop_unreadable, file_properties, load_data
from crslib.duplicates import image_fingerprints
from crslib.embed import embed_models
from crslib.errors import DataError, InputError
from crslib.leakage import leakage_audit, leakage_effect
from crslib.models.lineup import resolve_models
from crslib.needs import unmet_need
from crslib.runner import SkipLog

results = Path(results_dir)
plots.set_reader_display()
results.mkdir(parents=True, exist_ok=True)
skips = SkipLog(results)
is_phantom = str(data).startswith("phantom")
# the zoo trains (or is reused) only when `model` is a zoo: spec, and then on zoo_data
model_spec = resolve_models(model, zoo_data=zoo_data, zoo_preset=zoo_preset,
                            zoo_weights=zoo_weights, public_size=int(public_size),
                            device=device).specs
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


def leakage_need(manifest: pd.DataFrame) -> str | None:
    """What the duplicate and shared-patient audit needs: image files and a train/test split."""
    observed = manifest.drop(columns=manifest.attrs.get("filled_columns") or [])
    return unmet_need(observed, columns=["path"]) or unmet_need(observed, splits=["train", "test"])


def embed(manifest: pd.DataFrame) -> np.ndarray:
    return embed_models(manifest, {model: model_spec}, device=device)[model]


def audit(manifest: pd.DataFrame, properties: pd.DataFrame, X: np.ndarray, fingerprints=None):
    return run_audit(manifest, properties, embeddings=X, embedding_name=model, fingerprints=fingerprints,
                     n_resamples=int(n_resamples), random_state=seed,
                     n_permutations=None if n_permutations is None else int(n_permutations))


def label_names(values: pd.Series) -> pd.Series:
    """The phantom's 0/1 label as Kermany's folder names; any other label as it is."""
    return values.map({0: "NORMAL", 1: "PNEUMONIA"}) if is_phantom else values.astype(str)


manifest, _ = drop_unreadable(load_data(data), strict=strict)  # chapter 01 lists the files left out
properties = file_properties(manifest)
need, leak_need = audit_need(manifest), leakage_need(manifest)
# pixel digests and perceptual hashes of every image, for the duplicate audit of the last section
fingerprints = image_fingerprints(manifest) if leak_need is None else None
result = X = None
if need is None:
    try:
        X = embed(manifest)
        result = audit(manifest, properties, X, fingerprints)
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
            result_null = audit(manifest_null, properties_null, embed(manifest_null))
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
# ## Is the same image or patient on both sides of the split?
#
# A test image whose copy is in the training pool, or another image of the
# same patient, lets a model be scored on what it has seen. Every image is
# compared with every other in four ways: **exact** duplicates (the same
# decoded pixels, whatever the file format), **near** duplicates (a
# perceptual hash that survives re-encoding, resizing and a few per cent of
# cropping), **embedding** near duplicates (the encoder's embeddings closer
# than a threshold calibrated on this data) and **person numbers** of
# Kermany-style file names found in more than one split. Duplicates are
# grouped into clusters, and a cluster is *across* the split when it holds
# images of the training pool and of the test split.
#
# Whether an archive numbers the persons of its test split anew is not known
# from the files, so a shared person number is a *possible*, not a proven,
# same patient. A near-duplicate measure that matches most images with
# others of their own split does not tell this data's images apart; its
# counts are then shown but not counted as leakage.

# %% tags=["hide-input"]
run_leakage = skips.check("the duplicate and shared-patient audit", leak_need)
leakage = None
if run_leakage:
    # run_audit computed it with the embeddings; without the audits above, from the image files alone
    leakage = result.leakage if result is not None else leakage_audit(manifest, fingerprints)
    counts = leakage.counts_table()
    counts.to_csv(results / "leakage_counts.csv", index=False)
    display(plots.reader_table(counts.set_index("kind"), labels={
        "counted": "counted as leakage", "between_pool": "between pool splits", "test_images": "test images"}))
    table = counts.set_index("kind")
    words = []
    for kind, name in (("exact", "exact duplicates"), ("embedding", "embedding near duplicates"),
                       ("near", "near duplicates (pHash)")):
        row = table.loc[kind]
        if row["counted"] == "not run":
            words.append(f"{name}: not run" + (" (no embeddings: the audits above were skipped)"
                                                if kind == "embedding" else ""))
        elif kind == "near" and not leakage.near_informative:
            share = leakage.near.calibration["fraction_with_match_in_split"]
            words.append(f"{name}: **not informative on this data**: {share:.0%} of the images have a near duplicate "
                         f"in their own split, so its {row['across']} cluster(s) across the split are an upper bound, "
                         "not leakage, and are left out below")
        else:
            words.append(f"{name}: **{row['across']}** cluster(s) across the split ({row['test_images']} test images), "
                         f"{row['within']} within one split, {row['between_pool']} between pool splits")
    patients = table.loc["patient"]
    words.append(f"person numbers in both the training pool and the test split: **{patients['across']}** "
                 f"({patients['test_images']} test images), possibly the same patients")
    display(Markdown(f"Of {leakage.n_images:,} images: " + "; ".join(words) + "."))
    for note in leakage.notes:
        display(Markdown(f"*Note:* {html.escape(note, quote=False)}."))

# %% tags=["hide-input"]
def shown_path(path, image_id) -> str:
    """An image's path relative to the data folder where it lies in it (else as it is), or its id."""
    if path is None:
        return str(image_id)
    root = manifest.attrs.get("root")
    try:
        return str(Path(path).relative_to(root)) if root else str(path)
    except ValueError:
        return str(path)


if run_leakage:
    across = leakage.across_clusters()
    if across:
        lines = []
        for cluster in across[:12]:
            members = ", ".join(f"{html.escape(str(s))} {code(shown_path(p, i))}" for i, p, s in
                                zip(cluster["image_ids"], cluster["paths"], cluster["splits"]))
            lines.append(f"- {' and '.join(cluster['kinds'])}, {cluster['size']} images: {members}")
        more = len(across) - len(lines)
        display(Markdown(f"{len(across)} cluster(s) of duplicates cross from the training pool to the test split"
                         + (f"; the first {len(lines)}" if more else "") + ":\n\n" + "\n".join(lines)
                         + (f"\n\nand {more} more (`leakage.json` lists them all)." if more else "")))
    else:
        display(Markdown("No exact or embedding duplicate crosses the split"
                         + (", nor a near duplicate" if leakage.near_informative else "") + ": no test image has a "
                         "copy in the training pool by these measures."))
    shared = leakage.patients.table
    shared = shared[shared["scope"] == "across"]
    if len(shared):
        n_test_images = int((leakage.splits == leakage.test).sum())
        display(Markdown(
            f"{len(shared)} person number(s) occur in both the training pool and the test split, e.g. "
            + ", ".join(code(r) for r in shared["raw_id"].head(5))
            + f"; they cover {int(patients['test_images'])} of the {n_test_images} test images. "
            + ("The phantom numbers the children of each split from 1, as the Kermany loader assumes the archive "
               "does, so here every shared number is a different child: the check cannot tell a restarted "
               "numbering from a shared patient, which is why it says *possible*."
               if is_phantom else "Check the archive's documentation: if it numbers persons across all splits, "
               "these are the same patients on both sides of the split.")))

# %% [markdown]
# **Effect on the number.** A linear probe (logistic regression on the
# embeddings) is trained on the training pool and scored on the test split,
# once on every test image and once without the leaked ones (the duplicates
# above; then also those with a shared person number). The intervals
# resample the test split's patients, and the change is paired: both AUROCs
# on the same resampled patients.

# %% tags=["hide-input"]
effect = None
if run_leakage and skips.check("the effect of the leaked test images on a test AUROC", need):
    duplicates = leakage.leaked_test_mask()
    or_patients = leakage.leaked_test_mask(kinds=(*leakage.counted_kinds(), "patient"))
    # a variant only where it drops a test image (the second: one more than the first)
    drops = {name: mask for name, mask, extra in (("without duplicates", duplicates, duplicates),
                                                   ("without duplicates or possible same patients", or_patients,
                                                    or_patients & ~duplicates)) if extra.any()}
    if not drops:
        display(Markdown("No exact or embedding duplicate crosses the split and no person number is shared between "
                         "the pool and the test split: there is no leaked test image to drop, and the test numbers "
                         "of this data need no correction for leakage by these measures."))
    else:
        effect = leakage_effect(X, manifest["label"], manifest["split"], groups=manifest["patient_id"], drop=drops,
                                n_resamples=int(n_resamples), confidence=result.shortcut.confidence,
                                random_state=seed)
        display(plots.reader_table(effect.set_index("test_images"), labels={
            "test_images": "test images", "n_images": "images left", "n_dropped": "dropped", "n_patients": "patients",
            "change": "change", "change_low": "change: low", "change_high": "change: high"}))
        everything = effect.iloc[0]
        sentences = [f"On all {everything['n_images']} test images the probe's AUROC is **{everything['auroc']:.3f}** "
                     f"({level} CI {everything['low']:.3f}-{everything['high']:.3f})."]
        if "without duplicates" not in drops:
            sentences.append("No exact or embedding duplicate crosses the split, so only the test images with a "
                             "person number of the pool are dropped.")
        for row in effect.iloc[1:].itertuples():
            if row.reason:
                sentences.append(f"{row.test_images[:1].upper()}{row.test_images[1:]} it cannot be computed: "
                                 f"{row.reason} after dropping {row.n_dropped} of {everything['n_images']} test "
                                 "images.")
                continue
            verdict = ("the interval of the change excludes 0: the leaked images move the number"
                       if row.change_low > 0 or row.change_high < 0 else
                       "the interval of the change includes 0: no evidence that they move the number")
            sentences.append(f"{row.test_images[:1].upper()}{row.test_images[1:]} ({row.n_dropped} dropped, "
                             f"{row.n_images} left) it is **{row.auroc:.3f}** ({row.low:.3f}-{row.high:.3f}), a change "
                             f"of {row.change:+.3f} ({level} CI {row.change_low:+.3f} to {row.change_high:+.3f}); "
                             f"{verdict}.")
        display(Markdown(" ".join(sentences)))
if leakage is not None:
    (results / "leakage.json").write_text(leakage.to_json())
if effect is not None:
    effect.to_csv(results / "leakage_effect.csv", index=False)

# %% [markdown]
# The full report, as `crs audit` writes it, is saved next to the results
# (`audit.html`, with the duplicates and their thumbnails), with the
# checklist evidence of the audit.

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

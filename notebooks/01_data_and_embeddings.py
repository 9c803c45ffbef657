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
# # Data and embeddings
#
# Every study in this book starts the same way: images and a manifest go
# through an encoder, and the encoder's embeddings, one vector per image, are
# what the analyses compare. By default this notebook shows that first step
# on the book's embedded default, the **phantom**: procedural
# chest-radiograph-like images with known anatomy, findings, acquisition
# sites and file encodings, so every later analysis has a ground truth to
# recover. The phantom is not real data and does not reproduce any study's
# numbers; it makes the methods checkable.
#
# To run it on your own images or model, change the parameters below (see
# [Run it on your own data and models](../own_data.md)). Any folder of images
# will do: an analysis that needs something the data lacks (a `label`, a
# `source` with at least two values, `finding_*` columns) is skipped with one
# sentence saying what to add to the manifest.

# %% tags=["parameters"]
data = "phantom?patients=300&size=64&seed=1"  # other patients than the zoo trained on (zoo_data, seed 0)
strict = False  # True: stop at the first file that is not a readable image (default: leave it out, list it)
model = "timm:resnet18?size=64"
seed = 0
tsne_perplexity = 30.0
max_map_points = 2000
examples_per_group = 4
device = "auto"  # where models compute: auto (a GPU when torch sees one), cpu, cuda, mps
results_dir = "results/01_data_and_embeddings"

# %% tags=["hide-input"]
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display
from sklearn.metrics import silhouette_score

import crslib
from crslib import data as crs_data
from crslib import plots
from crslib.embed import extract_embeddings
from crslib.models import load_encoder
from crslib.needs import unmet_need
from crslib.projection import project_2d
from crslib.runner import SkipLog

results = Path(results_dir)
plots.set_reader_display()
results.mkdir(parents=True, exist_ok=True)
skips = SkipLog(results)
manifest, unreadable = crs_data.drop_unreadable(crs_data.load_data(data), strict=strict)
finding_columns = [c for c in manifest.columns if c.startswith("finding_")]
# columns the loader filled with one value because the data had none (e.g. `source` of a plain folder):
# the analyses' needs are checked on the columns the data really has
filled = [c for c in manifest.attrs.get("filled_columns", []) if c in manifest.columns]
given = manifest.drop(columns=filled)
MAX_LEVELS = 20  # the most groups an example grid or a coloured map shows


def code(text):
    """User-provided text (a path, a value, a model spec) as inline code in Markdown."""
    text = " ".join(str(text).split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def levels_need(column, *, min_per_level=1, max_levels=None):
    """Why `column` cannot group the images (None when it can): it must vary, and each level hold enough images."""
    reason = unmet_need(given, varying=[column])
    if reason is not None:
        return reason
    counts = given[column].dropna().astype(str).value_counts()
    if counts.min() < min_per_level:
        rare = counts[counts < min_per_level]
        return (f"`{column}` has {len(rare)} value(s) with fewer than {min_per_level} images "
                f"(e.g. {rare.index[0]!r}: {rare.iloc[0]}); every value needs at least {min_per_level}")
    if max_levels is not None and len(counts) > max_levels:
        return f"`{column}` has {len(counts)} different values; this view shows at most {max_levels}"
    return None


# %% [markdown]
# ## What the data is
#
# The manifest is a table with one row per image: its file, its patient, its
# split, the acquisition site (`source`), the view, and its labels; columns
# the data does not have are filled with a single value. The table counts,
# per split, the images, patients, sources and views, the images of each
# `label` value and the share of images with each `finding_*`. Splits should
# be made at patient level, so that no patient's images fall on both sides
# of a split; the text below checks it.

# %% tags=["hide-input"]
summary = crs_data.summarize_manifest(manifest)
summary.to_csv(results / "manifest_summary.csv")
n_images, n_patients = len(manifest), manifest["patient_id"].nunique()
if "patient_id" in filled:
    patients_text = ", each counted as its own patient (the manifest has no `patient_id` column)"
elif n_patients == n_images and (manifest["patient_id"].astype(str) == manifest["image_id"].astype(str)).all():
    patients_text = f" of **{n_patients:,} patients** (each image is its own patient: no patient ids were given)"
else:
    patients_text = f" of **{n_patients:,} patients**"
n_sources = manifest["source"].nunique()
sources_text = (" from one source (the data has no `source` column)" if "source" in filled
                else f" from **{n_sources} source{'s' if n_sources != 1 else ''}**")
sentences = [f"**{n_images:,} images**{patients_text}{sources_text}; data: {code(data)}."]
if "source" not in filled and n_sources > 1:
    source_counts = manifest["source"].astype(str).value_counts()
    sentences.append(
        f"Each source has {source_counts.iloc[0]:,} images." if source_counts.nunique() == 1 else
        "Images per source: " + ", ".join(f"{code(v)} {c:,}" for v, c in source_counts.head(8).items())
        + (", ..." if len(source_counts) > 8 else "") + ".")

split_counts = manifest.groupby("split", sort=False)["patient_id"].agg(["size", "nunique"])
split_counts = split_counts.reindex([s for s in ("train", "val", "test") if s in split_counts.index]
                                    + sorted(s for s in split_counts.index if s not in ("train", "val", "test")))
if "split" in filled or len(split_counts) == 1:
    sentences.append(f"There is no train/validation/test split (every image is in split "
                     f"{code(split_counts.index[0])}).")
else:
    shared = int((manifest.groupby("patient_id")["split"].nunique() > 1).sum())
    sentences.append(
        "Splits: " + ", ".join(f"{code(s)} {r['size']:,} images ({r['nunique']:,} patients)"
                               for s, r in split_counts.iterrows())
        + ("; no patient has images in more than one split." if shared == 0 else
           f"; **{shared:,} patient{'s have' if shared != 1 else ' has'} images in more than one split**.")
    )
if "label" in given.columns:
    label_counts = manifest["label"].dropna().astype(str).value_counts()
    shown = ", ".join(f"{code(v)} {c:,}" for v, c in label_counts.head(8).items())
    sentences.append(f"`label` has {len(label_counts)} value{'s' if len(label_counts) != 1 else ''} "
                     f"(images: {shown}{', ...' if len(label_counts) > 8 else ''}).")
if finding_columns:
    prevalence = manifest[finding_columns].apply(pd.to_numeric, errors="coerce").mean().sort_values()
    sentences.append(f"{len(finding_columns)} `finding_*` columns, from {prevalence.iloc[0]:.0%} of images "
                     f"({code(prevalence.index[0])}) to {prevalence.iloc[-1]:.0%} ({code(prevalence.index[-1])}).")
if "label" not in given.columns and not finding_columns:
    sentences.append("There is no `label` and no `finding_*` column, so the views by label are skipped below.")
display(Markdown(" ".join(sentences)))
summary

# %% [markdown]
# ### Files left out
#
# A file of the data that holds no readable image (a DICOM object without
# pixel data, such as a structured report; a file no decoder can read; a
# broken file) is left out of every chapter and listed here with its reason;
# the full list is `skipped_files.csv` among this chapter's downloads. With
# `strict=True` (`crs book --strict`) the first such file stops the run
# instead.

# %% tags=["hide-input"]
unreadable.to_csv(results / "skipped_files.csv", index=False)
found = n_images + len(unreadable)
skips.files_left_out(unreadable, found=found)
if unreadable.empty:
    display(Markdown(f"All {found:,} files of the data are readable images; none was left out."))
else:
    reasons = crs_data.skip_summary(unreadable, top=10)
    display(Markdown(
        f"**{len(unreadable):,} of the {found:,} files were left out**, so every chapter works on the other "
        f"{n_images:,}. The most common reason ({reasons['files'].iloc[0]:,} files): {code(reasons['reason'].iloc[0])}."
        + (f" The table shows the {len(reasons)} most common of {unreadable['reason'].nunique()} reasons."
           if unreadable["reason"].nunique() > len(reasons) else "")))
    display(reasons)

# %% [markdown]
# ## Sample images
#
# The grid below draws a few images for each value of each grouping the
# manifest has: the acquisition site (`source`), the view, and each finding
# (or each `label` value when there are no `finding_*` columns). In the
# phantom, the sites differ in intensity curve, noise, blur, collimation
# border and the position of the laterality marker, the kind of signature by
# which real hospitals' images differ.

# %% tags=["hide-input"]
# which groupings the data has (a skipped one is said here: the figure cell below shows only the figure)
def titles(values):
    """Short image titles; a dollar sign would start matplotlib's mathtext."""
    return [str(v)[:18].replace("$", r"\$") for v in values]


panels = []  # (title, images, image titles, columns): one panel of the figure each
for column in ["source", "view"]:
    if skips.check(f"the example images by {column}", levels_need(column, max_levels=MAX_LEVELS)):
        rows = crs_data.select_examples(manifest, by=column, n_per_group=examples_per_group, random_state=seed)
        images = [crs_data.read_image(path) for path in rows["path"]]
        panels.append((f"Examples by {column}", images, titles(rows[column].astype(str)), examples_per_group * 2))

if skips.check("the example images with each finding",
               unmet_need(given, columns=finding_columns) if finding_columns else
               "the manifest has no finding columns (0/1 columns named finding_NAME, one per finding); "
               "add them to run it"):
    positives = crs_data.select_examples(manifest, by=finding_columns, n_per_group=2, random_state=seed)
    images = [crs_data.read_image(path) for path in positives["path"]]
    panels.append(("Examples with each finding", images,
                   titles(positives["group"].str.removeprefix("finding_")), 8))
elif skips.check("the example images by label", levels_need("label", max_levels=MAX_LEVELS)):
    rows = crs_data.select_examples(manifest, by="label", n_per_group=examples_per_group, random_state=seed)
    images = [crs_data.read_image(path) for path in rows["path"]]
    panels.append(("Examples by label", images, titles(rows["label"].astype(str)), examples_per_group * 2))

if not panels:  # no grouping at all: a few images drawn at random
    rows = manifest.sample(n=min(2 * examples_per_group, len(manifest)), random_state=seed)
    images = [crs_data.read_image(path) for path in rows["path"]]
    panels.append(("Examples drawn at random", images, titles(rows["image_id"]), examples_per_group * 2))

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Sample images grouped by source (site), view and finding (or label): one panel per grouping the data has, each image titled with its group.", "name": "fig-01-6"}, "image": {"alt": "Stacked grids of small example images: examples by source, by view and with each finding or label"}}
plots.image_panels(panels)
plt.show()

# %% [markdown]
# ## How embeddings are extracted
#
# A model spec string names the encoder: by default a timm architecture,
# randomly initialised with a fixed seed. Its own data configuration decides
# the normalisation; grayscale images are repeated to three channels. The
# extraction is batched and cached by content: the cache key covers the model
# spec, its weights, its preprocessing and the bytes of every image, so a
# second run reuses the result and a changed image or weight file is
# recomputed.

# %% tags=["hide-input"]
encoder = load_encoder(model)
first = extract_embeddings(manifest, encoder, device=device)
again = extract_embeddings(manifest, encoder, device=device)
X = first.X
# a public: spec resolves to a weight file in the cache; the text names such a model by the spec as given
model_name = model if "weights=" in encoder.name and "weights=" not in model else encoder.name
pd.DataFrame(
    {
        "model": [encoder.name],
        "embedding dimension": [encoder.embedding_dim],
        "input size": [str(encoder.preprocessing.input_size)],
        "images": [X.shape[0]],
        "first call": [f"{first.seconds:.2f} s ({'cache hit' if first.cache_hit else 'computed'})"],
        "second call": [f"{again.seconds:.2f} s ({'cache hit' if again.cache_hit else 'computed'})"],
        "cache key": [first.key[:16]],
    }
).T.rename(columns={0: ""})

# %% [markdown]
# ## A map of the embeddings
#
# PCA keeps the largest linear directions of variation; t-SNE keeps local
# neighbourhoods. Colouring the same map by site and by label (or finding)
# shows what the encoder's geometry is organised by.

# %% tags=["hide-input"]
# the second colouring: the label, else the first finding, else the view; the first of them that varies
candidates = ["label", *finding_columns[:1], "view"]
colour_by = next((c for c in candidates if levels_need(c, max_levels=MAX_LEVELS) is None), None)
hues = []
if skips.check("the map coloured by source", levels_need("source", max_levels=MAX_LEVELS)):
    hues.append("source")
if skips.check("the map coloured by label", None if colour_by else levels_need("label", max_levels=MAX_LEVELS)):
    hues.append(colour_by)
has_map = skips.check("the map of the embeddings", unmet_need(manifest, min_rows=3))
if has_map:
    subset = manifest.sample(n=min(max_map_points, len(manifest)), random_state=seed).index
    positions = manifest.index.get_indexer(subset)
    maps = {
        "PCA": project_2d(X[positions], method="pca", random_state=seed),
        "t-SNE": project_2d(X[positions], method="tsne", perplexity=tsne_perplexity, random_state=seed),
    }
    coordinates = pd.DataFrame(
        {"image_id": manifest.loc[subset, "image_id"].to_numpy(),
         "pca_x": maps["PCA"][:, 0], "pca_y": maps["PCA"][:, 1],
         "tsne_x": maps["t-SNE"][:, 0], "tsne_y": maps["t-SNE"][:, 1]}
    )
    coordinates.to_csv(results / "embedding_map.csv", index=False)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Two-dimensional maps (PCA and t-SNE) of the embeddings, coloured by source and by label where the data has them.", "name": "fig-01-10"}, "image": {"alt": "Scatter plots of image embeddings coloured by source and by label"}}
if has_map:
    columns = hues or [None]
    fig, axes = plt.subplots(2, len(columns), figsize=(4.5 * len(columns), 8), squeeze=False)
    for row, (method, coords) in enumerate(maps.items()):
        for col, hue in enumerate(columns):
            values = manifest.loc[subset, hue].astype(str) if hue else ["all images"] * len(subset)
            plots.embedding_map(coords, values, ax=axes[row, col],
                                title=f"{method}, by {hue}" if hue else method, hue_name=hue or "images")
    fig.tight_layout()
    plt.show()

# %% [markdown]
# How cleanly does each variable separate in the embedding space? The
# silhouette score (cosine, from -1 to 1; 0 means no separation) measures it
# on the full embeddings (at most 2,000 images drawn at random), not on the
# 2-D map. Each variable needs at least two values with at least two images
# each.


# %% tags=["hide-input"]
def silhouette_need(column):
    """Why the silhouette by `column` cannot be computed (None when it can), and the rows it uses."""
    reason = levels_need(column, min_per_level=2)
    if reason is not None:
        return reason, None
    valid = np.flatnonzero(manifest[column].notna().to_numpy())
    # the draw silhouette_score(sample_size=...) makes, taken here so that its levels can be checked
    rows = valid[np.random.RandomState(seed).permutation(len(valid))[:min(2000, len(valid))]]
    sample = manifest.iloc[rows][column].astype(str).value_counts()
    if len(sample) < 2 or sample.min() < 2 or len(sample) > len(rows) - 1:
        reason = (f"the {len(rows):,} images drawn for it hold {len(sample)} value(s) of `{column}`, "
                  f"the rarest on {sample.min()} image(s); it needs at least 2 values of at least 2 images")
    return reason, rows


variables = list(dict.fromkeys(["source", "view", colour_by or "label"]))
scores = []
for column in variables:
    reason, rows = silhouette_need(column)
    if skips.check(f"the silhouette by {column}", reason):
        scores.append((column, silhouette_score(X[rows], manifest[column].iloc[rows].astype(str), metric="cosine")))
separation = pd.DataFrame(scores, columns=["variable", "silhouette (cosine)"]).round(3)
separation.to_csv(results / "separation.csv", index=False)
if len(separation):
    best = separation.sort_values("silhouette (cosine)", ascending=False).iloc[0]
    display(Markdown(
        f"In this run the embeddings of {code(model_name)} separate **{best['variable']}** most "
        f"(silhouette {best['silhouette (cosine)']:.3f})." if len(separation) > 1 else
        f"In this run the embeddings of {code(model_name)} separate **{best['variable']}**, the only "
        f"variable this data allows measuring, with silhouette {best['silhouette (cosine)']:.3f}."
    ))
else:
    display(Markdown("No variable of this data could be measured (see the skips above); add a `label`, "
                     "`source` or `view` column with at least two values to the manifest."))
separation if len(separation) else None

# %% [markdown]
# The next notebooks ask whether two encoders organise the same images the
# same way (agreement), how much a reported score depends on the evaluation
# protocol, and how much the choice of encoder changes a study's conclusions.

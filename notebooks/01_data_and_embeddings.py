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
# what the analyses compare. This notebook shows that first step on the
# book's embedded default, the **phantom**: procedural chest-radiograph-like
# images with known anatomy, findings, acquisition sites and file encodings,
# so every later analysis has a ground truth to recover. The phantom is not
# real data and does not reproduce any study's numbers; it makes the methods
# checkable.
#
# To run it on your own images or model, change the parameters below (see
# [Run it on your own data and models](../own_data.md)).

# %% tags=["parameters"]
data = "phantom?patients=300&size=64&seed=0"
model = "timm:resnet18?size=64"
seed = 0
tsne_perplexity = 30.0
max_map_points = 2000
examples_per_group = 4
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
from crslib.projection import project_2d

results = Path(results_dir)
results.mkdir(parents=True, exist_ok=True)
manifest = crs_data.load_data(data)
finding_columns = [c for c in manifest.columns if c.startswith("finding_")]

# %% [markdown]
# ## What the data is
#
# The manifest is a table with one row per image: its file, its patient, its
# split, the acquisition site (`source`), the view, and its labels. Splits are
# made at patient level, so no patient's images fall on both sides of a split.

# %% tags=["hide-input"]
summary = crs_data.summarize_manifest(manifest)
summary.to_csv(results / "manifest_summary.csv")
display(Markdown(
    f"**{len(manifest):,} images** of **{manifest['patient_id'].nunique():,} patients** "
    f"from **{manifest['source'].nunique()} sources**; data: `{data}`."
))
summary

# %% [markdown]
# ## Sample images
#
# Rows of the grid below are drawn from each acquisition site, each view and
# each finding. The sites differ in intensity curve, noise, blur, collimation
# border and the position of the laterality marker, the kind of signature by
# which real hospitals' images differ.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Sample phantom images grouped by source (site), view and finding: one panel per grouping, each image titled with its group.", "name": "fig-01-6"}, "image": {"alt": "Three stacked grids of small synthetic chest-radiograph-like images: examples by source, by view and with each finding"}}
panels = []  # (title, images, image titles, columns): one panel of the figure each
for column in ["source", "view"]:
    rows = crs_data.select_examples(manifest, by=column, n_per_group=examples_per_group, random_state=seed)
    images = [crs_data.read_image(path) for path in rows["path"]]
    panels.append((f"Examples by {column}", images, rows[column].astype(str).tolist(), examples_per_group * 2))

if finding_columns:
    positives = crs_data.select_examples(manifest, by=finding_columns, n_per_group=2, random_state=seed)
    images = [crs_data.read_image(path) for path in positives["path"]]
    panels.append(("Examples with each finding", images,
                   positives["group"].str.removeprefix("finding_").tolist(), 8))

plots.image_panels(panels)
plt.show()

# %% [markdown]
# ## How embeddings are extracted
#
# A model spec string names the encoder: here a timm architecture, by default
# randomly initialised with a fixed seed. Its own data configuration decides
# the normalisation; grayscale images are repeated to three channels. The
# extraction is batched and cached by content: the cache key covers the model
# spec, its weights, its preprocessing and the bytes of every image, so a
# second run reuses the result and a changed image or weight file is
# recomputed.

# %% tags=["hide-input"]
encoder = load_encoder(model)
first = extract_embeddings(manifest, encoder)
again = extract_embeddings(manifest, encoder)
X = first.X
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
# neighbourhoods. Colouring the same map by site and by finding shows what
# the encoder's geometry is organised by.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Two-dimensional maps (PCA and t-SNE) of the embeddings, coloured by source and by label.", "name": "fig-01-10"}, "image": {"alt": "Scatter plots of image embeddings coloured by source and by label"}}
subset = manifest.sample(n=min(max_map_points, len(manifest)), random_state=seed).index
positions = manifest.index.get_indexer(subset)
maps = {
    "PCA": project_2d(X[positions], method="pca", random_state=seed),
    "t-SNE": project_2d(X[positions], method="tsne", perplexity=tsne_perplexity, random_state=seed),
}
colour_by = "label" if "label" in manifest.columns else (finding_columns[0] if finding_columns else "view")
fig, axes = plt.subplots(2, 2, figsize=(9, 8))
for row, (method, coords) in enumerate(maps.items()):
    plots.embedding_map(coords, manifest.loc[subset, "source"], ax=axes[row, 0],
                        title=f"{method}, by source", hue_name="source")
    plots.embedding_map(coords, manifest.loc[subset, colour_by].astype(str), ax=axes[row, 1],
                        title=f"{method}, by {colour_by}", hue_name=colour_by)
fig.tight_layout()
plt.show()

coordinates = pd.DataFrame(
    {"image_id": manifest.loc[subset, "image_id"].to_numpy(),
     "pca_x": maps["PCA"][:, 0], "pca_y": maps["PCA"][:, 1],
     "tsne_x": maps["t-SNE"][:, 0], "tsne_y": maps["t-SNE"][:, 1]}
)
coordinates.to_csv(results / "embedding_map.csv", index=False)

# %% [markdown]
# How cleanly does each variable separate in the embedding space? The
# silhouette score (cosine, from -1 to 1; 0 means no separation) measures it
# on the full embeddings, not on the 2-D map.

# %% tags=["hide-input"]
separation = pd.DataFrame(
    {
        "variable": ["source", "view", colour_by],
        "silhouette (cosine)": [
            silhouette_score(X, manifest[column].astype(str), metric="cosine", random_state=seed,
                             sample_size=min(2000, len(manifest)))
            for column in ["source", "view", colour_by]
        ],
    }
).round(3)
separation.to_csv(results / "separation.csv", index=False)
best = separation.sort_values("silhouette (cosine)", ascending=False).iloc[0]
display(Markdown(
    f"In this run the embeddings of `{encoder.name}` separate **{best['variable']}** most "
    f"(silhouette {best['silhouette (cosine)']:.3f})."
))
separation

# %% [markdown]
# The next notebooks ask whether two encoders organise the same images the
# same way (agreement), how much a reported score depends on the evaluation
# protocol, and how much the choice of encoder changes a study's conclusions.

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
# information, arranged differently. CRS-Bench tests this with a **linear
# map** between two models' embedding spaces, fitted on unlabelled images:
# classifiers trained on the old model are applied to the new model's
# embeddings mapped into the old space. The share of AUROC kept (retention
# = transferred / original) measures how much survives the change of
# encoder; the paper reports **0.987** over 14 findings with a map fitted on
# 4,096 unlabelled images (the paper's number, on real chest radiographs).
#
# Here the old model is a zoo encoder and the candidates are another seed of
# the same objective, another objective and a public ImageNet network, on the
# phantom. The map images, the classifiers' training images and their test
# images are disjoint sets of patients.

# %% tags=["parameters"]
data = "phantom?patients=300&size=64&seed=0"
zoo_preset = "quick"
public_size = 64
old_model = "zoo:supervised_multilabel-cnn_small-seed0"
new_models = "zoo:supervised_multilabel-cnn_small-seed1,zoo:contrastive-cnn_small-seed0,public:efficientnet_lite0"
seed = 0
n_resamples = 500
results_dir = "results/03_transfer"

# %% tags=["hide-input"]
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

import crslib
from crslib import paper, plots
from crslib.data import load_data
from crslib.embed import embed_models
from crslib.splits import grouped_partition
from crslib.transfer import classifier_transfer, fit_linear_map, held_out_r2, transfer_sweep
from crslib.models import train_zoo, with_image_size

results = Path(results_dir)
results.mkdir(parents=True, exist_ok=True)
manifest = load_data(data)
train_zoo(manifest, preset=zoo_preset)



candidates = [s.strip() for s in new_models.split(",") if s.strip()]
embeddings = embed_models(manifest, {spec: with_image_size(spec, public_size) for spec in [old_model, *candidates]})
finding_columns = [c for c in manifest.columns if c.startswith("finding_")]
labels = manifest[finding_columns].reset_index(drop=True)
groups = manifest["patient_id"].to_numpy()
map_idx, train_idx, test_idx = grouped_partition(groups, (0.5, 0.25, 0.25), random_state=seed)
display(Markdown(
    f"Old model `{old_model}`; {len(map_idx):,} images for the map, {len(train_idx):,} to train the "
    f"classifiers, {len(test_idx):,} to test them ({len(finding_columns)} findings)."
))

# %% [markdown]
# ## Retention per finding
#
# For each finding a logistic regression is trained on the old model's
# embeddings; a ridge map (regularisation chosen by cross-validation) from
# each new model's space to the old one is fitted on the map images; the old
# classifier then scores the mapped test images. CIs are bootstrap
# intervals over test patients.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "AUROC retention per finding when the old model's classifiers score the new model's embeddings mapped into the old space.", "name": "fig-03-4"}, "image": {"alt": "Bar charts of AUROC retention per finding for each new model"}}
tables = []
for spec in candidates:
    table = classifier_transfer(
        embeddings[old_model], embeddings[spec], labels, map_idx=map_idx, train_idx=train_idx,
        test_idx=test_idx, groups=groups, n_resamples=n_resamples, random_state=seed,
    ).table
    tables.append(table.assign(new_model=spec))
transfer = pd.concat(tables, ignore_index=True)
transfer.to_csv(results / "retention_by_finding.csv", index=False)
fig, axes = plt.subplots(1, len(candidates), figsize=(4.2 * len(candidates), 3.6), sharex=True, squeeze=False)
for ax, spec in zip(axes[0], candidates):
    plots.retention_bars(transfer[transfer["new_model"] == spec], ax=ax)
    ax.set_title(spec.split(":", 1)[1], fontsize=9)
fig.tight_layout()
plt.show()

# %% tags=["hide-input"]
summary = transfer.groupby("new_model").agg(
    mean_original_auroc=("auroc_original", "mean"),
    mean_transferred_auroc=("auroc_transferred", "mean"),
    mean_retention=("retention", "mean"),
    map_r2=("map_r2", "first"),
).reindex(candidates)
summary.to_csv(results / "retention_summary.csv")
display(Markdown(
    "Mean retention over findings, this run: "
    + "; ".join(f"`{name}` {row.mean_retention:.3f}" for name, row in summary.iterrows())
    + f". The paper reports {paper.value('transfer_auroc_retention'):.3f} over 14 findings on real radiographs."
))
summary.round(3)

# %% [markdown]
# ## How many unlabelled images does the map need?
#
# The paper fits its map on 4,096 images. Retention as a function of the
# number of map images n, for the first candidate (the phantom has fewer
# images than the paper's largest n, so the sweep stops at what the data
# allows).

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Mean retention and the map's held-out R² as the number of unlabelled map images grows; the paper's 0.987 at n = 4,096 for reference.", "name": "fig-03-6"}, "image": {"alt": "Line plot of retention and R² against the number of map images"}}
sweep = transfer_sweep(embeddings[old_model], embeddings[candidates[0]], labels, groups=groups,
                       n_resamples=min(n_resamples, 200), random_state=seed).table
sweep.to_csv(results / "retention_by_n.csv", index=False)
by_n = sweep.groupby("n_map", as_index=False)[["retention", "map_r2"]].mean()
fig, ax = plt.subplots(figsize=(5.5, 3.6))
ax.plot(by_n["n_map"], by_n["retention"], marker="o", label="mean retention over findings")
ax.plot(by_n["n_map"], by_n["map_r2"], marker="s", linestyle="--", label="map held-out R²")
ax.axhline(paper.value("transfer_auroc_retention"), color="grey", linestyle=":",
           label=f"paper: {paper.value('transfer_auroc_retention'):.3f} at n = {paper.value('map_fit_images'):,.0f}")
ax.set(xscale="log", xlabel="unlabelled images used to fit the map (n)", ylim=(0, 1.05))
ax.minorticks_off()
ax.set_xticks(by_n["n_map"], labels=[f"{int(n):,}" for n in by_n["n_map"]])
ax.legend(frameon=False, fontsize=8)
plt.show()

# %% tags=["hide-input"]
by_n.round(3)

# %% [markdown]
# ## Which map?
#
# Ridge regression, plain least squares and an orthogonal Procrustes map
# (rotation and one scale) compared by held-out R² of the mapped
# embeddings. Least squares overfits when the map images are few relative
# to the dimensions; Procrustes keeps only rotations, so it measures how
# much of the relation is a rigid change of basis.

# %% tags=["hide-input"]
rows = []
for spec in candidates:
    for method in ["ridge", "lstsq", "procrustes"]:
        linear = fit_linear_map(embeddings[spec][map_idx], embeddings[old_model][map_idx], method=method,
                                random_state=seed)
        rows.append({"new model": spec, "method": method,
                     "held-out R²": held_out_r2(linear, embeddings[spec][test_idx], embeddings[old_model][test_idx])})
maps = pd.DataFrame(rows)
maps.to_csv(results / "map_methods.csv", index=False)
maps.pivot(index="new model", columns="method", values="held-out R²").round(3)

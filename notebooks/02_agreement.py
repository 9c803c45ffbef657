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
# # Do two encoders see images alike?
#
# Two encoders agree when they return the same nearest neighbours for the
# same image. CRS-Bench measures this as the **mutual k-nearest-neighbour
# overlap**: for each image, the share of its k = 10 nearest neighbours
# (cosine) that two models have in common, averaged over images. Chance is
# k/(N-1); a randomly initialised network is the floor a trained one should
# clear.
#
# This notebook runs the study's analyses on the phantom with a **model zoo**:
# small encoders trained here on the phantom's training pool that differ in
# one factor at a time (objective, seed, width), plus two real pretrained
# ImageNet networks that ship in Python packages (EfficientNet-Lite0 and the
# ResNet-50-thin of Yahoo's Open-NSFW) as the "public" pair. The phantom and
# the small models are not the study's data and models: the numbers below
# are this run's, set beside the paper's for orientation only.

# %% tags=["parameters"]
data = "phantom?patients=300&size=64&seed=0"
zoo_preset = "quick"
public_size = 64
k = 10
seed = 0
n_resamples = 500
results_dir = "results/02_agreement"
scheduler = None  # None: this process; "local:2" or "tcp://HOST:8786": zoo, embeddings and searches on Dask

# %% tags=["hide-input"]
from itertools import combinations
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import Markdown, display

import crslib
from crslib import agreement, ann, paper, plots, probes, similarity, subgroups
from crslib.data import load_data
from crslib.embed import embed_models
from crslib.models import train_zoo

results = Path(results_dir)
results.mkdir(parents=True, exist_ok=True)
manifest = load_data(data)
cards = train_zoo(manifest, preset=zoo_preset, scheduler=scheduler)
specs = {name: f"zoo:{name}" for name in cards["name"]}
specs["public:efficientnet_lite0"] = f"public:efficientnet_lite0?size={public_size}"
specs["public:open_nsfw"] = f"public:open_nsfw?size={public_size}"
specs["random:efficientnet_lite0"] = f"timm:tf_efficientnet_lite0?size={public_size}&seed=0"
embeddings = embed_models(manifest, specs, scheduler=scheduler)
groups = manifest["patient_id"].to_numpy()
info = pd.DataFrame({"name": list(specs)})
info = info.merge(cards[["name", "objective", "architecture", "seed"]], on="name", how="left")
info["objective"] = info["objective"].fillna(info["name"].str.split(":").str[0])
info["architecture"] = info["architecture"].fillna(info["name"].str.split(":").str[1])
info["seed"] = info["seed"].fillna(0).astype(int)
display(Markdown(f"**{len(specs)} models** on **{len(manifest):,} images**; zoo preset `{zoo_preset}`."))
cards[["name", "objective", "architecture", "seed", "epochs", "final_loss"]]

# %% [markdown]
# ## The agreement matrix
#
# Each model's neighbours are searched once (exact search with faiss), and
# every pair's overlap is computed from those neighbour lists. Same-patient
# images are excluded as neighbours, so a patient's second image does not
# count as agreement.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Mutual k-NN overlap between every pair of models in this run; chance is k/(N-1).", "name": "fig-02-4"}, "image": {"alt": "Heatmap of the pairwise mutual nearest-neighbour overlap between models"}}
agreement_result, per_image = agreement.agreement_matrix(embeddings, k=k, exclude_groups=groups,
                                                         return_per_image=True, scheduler=scheduler)
matrix = agreement_result.overlap
matrix.to_csv(results / "agreement_matrix.csv")
chance = agreement.chance_overlap(len(manifest), k)
fig, ax = plt.subplots(figsize=(0.45 * len(matrix) + 3, 0.45 * len(matrix) + 2))
plots.agreement_heatmap(matrix, ax=ax)
ax.set_title(f"Mutual {k}-NN overlap (chance {chance:.3f})")
plt.show()

# %% tags=["hide-input"]
approximate = {name: info for name, info in agreement_result.search.items() if info["index"] != "exact"}
if approximate:
    worst = min(info["recall"] for info in approximate.values())
    bound = agreement_result.max_error_bound
    display(Markdown(f"Neighbours of {len(approximate)} model(s) come from an approximate index; the lowest "
                     f"recall@{k} against exact search is {worst:.3f}, so an overlap above may be off by at most "
                     f"{bound:.3f}."))
else:
    display(Markdown(f"Neighbours: exact search for every model ({len(manifest):,} images, below the "
                     f"{ann.APPROX_THRESHOLD:,}-image threshold of the approximate index)."))

# %% [markdown]
# Each model's mean agreement with every other model, against the random
# networks' level and chance:

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Each model's mean agreement with the other models, beside the random-init reference.", "name": "fig-02-6"}, "image": {"alt": "Bar chart of each model's mean mutual k-NN overlap with the other models"}}
off_diagonal = matrix.where(~np.eye(len(matrix), dtype=bool))
mean_agreement = off_diagonal.mean(axis=1).rename("mean overlap with the others")
random_names = [n for n in matrix.index if n.startswith("random")]
random_pairs = [matrix.loc[a, b] for a, b in combinations(random_names, 2)]
random_level = float(np.mean(random_pairs)) if random_pairs else float("nan")
fig, ax = plt.subplots(figsize=(7, 0.3 * len(matrix) + 1))
order = mean_agreement.sort_values()
ax.barh(order.index, order.values, color=["#c44e52" if n in random_names else "#4c72b0" for n in order.index])
ax.axvline(chance, color="grey", linestyle=":", label=f"chance {chance:.3f}")
if random_pairs:
    ax.axvline(random_level, color="#c44e52", linestyle="--", label=f"random-init pairs {random_level:.3f}")
ax.set(xlabel=f"mean mutual {k}-NN overlap with the other models")
ax.legend(frameon=False)
plt.show()

# %% [markdown]
# ## This run beside the paper
#
# The paper's headline numbers (quoted as the paper's: real chest
# radiographs, public models) beside the same quantities in this run.

# %% tags=["hide-input"]
zoo_info = info[~info["name"].str.contains(":")]
zoo_pairs = agreement.convergence_pairs(matrix.loc[zoo_info["name"], zoo_info["name"]], zoo_info)


def within_objective(objective, architecture="cnn_small"):
    rows = zoo_pairs[(zoo_pairs["objective_a"] == objective) & (zoo_pairs["objective_b"] == objective)
                     & (zoo_pairs["architecture"] == architecture)]
    return rows["overlap"].tolist()


def first_pair(objective, architecture="cnn_small"):
    rows = zoo_pairs[(zoo_pairs["objective_a"] == objective) & (zoo_pairs["objective_b"] == objective)
                     & (zoo_pairs["architecture"] == architecture)]
    return rows.iloc[0]["model_a"], rows.iloc[0]["model_b"]


def value_range(values):
    return f"{min(values):.3f}-{max(values):.3f}" if values else "n/a"


public_pair = ("public:efficientnet_lite0", "public:open_nsfw")
public_ci = agreement.overlap_ci(
    agreement.mutual_knn_overlap_per_image(embeddings[public_pair[0]], embeddings[public_pair[1]],
                                           k=k, exclude_groups=groups),
    groups=groups, n_resamples=n_resamples, random_state=seed)
random_public = matrix.loc["public:efficientnet_lite0", "random:efficientnet_lite0"]
ssl_values = within_objective("contrastive") + within_objective("self_distillation")
headline = pd.DataFrame(
    [
        ("public models share, of 10 neighbours", f"{paper.value('public_pair_overlap'):.3f}",
         f"{public_ci.estimate:.3f} ({public_ci.low:.3f}-{public_ci.high:.3f})"),
        ("a randomly initialised network", f"{paper.value('random_init_overlap'):.3f}",
         f"{random_public:.3f} (EfficientNet-Lite0 vs its random init); random pairs {random_level:.3f}"),
        ("label-supervised models differing only in seed",
         f"{paper.value('supervised_seed_overlap_low'):.3f}-{paper.value('supervised_seed_overlap_high'):.3f}",
         value_range(within_objective("supervised_multilabel"))),
        ("self-supervised pairs (same objective, other seed)",
         f"{paper.value('ssl_pair_overlap_low'):.3f}-{paper.value('ssl_pair_overlap_high'):.3f}", value_range(ssl_values)),
        ("chance k/(N-1)", "", f"{chance:.4f}"),
    ],
    columns=["quantity", "paper (CRS-Bench)", "this run (phantom)"],
)
headline.to_csv(results / "headline.csv", index=False)
headline

# %% [markdown]
# ## What agreement follows: source, view, findings
#
# For the public pair, how much of the per-image overlap does each factor
# explain? The variance share is the R² of the per-image overlap on that
# factor alone (one-hot), with a bootstrap CI over images; the table below
# it gives the mean overlap per level.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Share of the per-image overlap variance explained by source, view and findings (R², 95% CI).", "name": "fig-02-10"}, "image": {"alt": "Bar charts of the overlap variance explained by image attributes"}}
public_per_image = per_image[public_pair]
finding_columns = [c for c in manifest.columns if c.startswith("finding_")]
factors = ["source", "view"] + finding_columns
shares = subgroups.overlap_variance_shares(public_per_image.to_numpy(), manifest, columns=factors,
                                           n_resamples=min(n_resamples, 200), random_state=seed)
shares.to_csv(results / "variance_shares.csv", index=False)
by_level = subgroups.overlap_by_subgroup(public_per_image.to_numpy(), manifest, columns=["source", "view"],
                                         groups=groups, n_resamples=n_resamples, random_state=seed)
by_level.to_csv(results / "overlap_by_subgroup.csv", index=False)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
plot_shares = shares[shares["factor"] != "(all factors)"].sort_values("share_alone")
axes[0].barh(plot_shares["factor"].str.removeprefix("finding_"), plot_shares["share_alone"],
             xerr=[plot_shares["share_alone"] - plot_shares["share_alone_low"],
                   plot_shares["share_alone_high"] - plot_shares["share_alone"]], color="#4c72b0")
axes[0].set(xlabel="share of per-image overlap variance explained (R², 95% CI)",
            title="Public pair: what agreement follows")
plots.subgroup_overlap(by_level, chance=chance, ax=axes[1])
axes[1].set_title("Public pair: overlap by source and view")
fig.tight_layout()
plt.show()

# %% tags=["hide-input"]
shares.round(4)

# %% [markdown]
# ## Is agreement tied to accuracy?
#
# Each model's linear-probe AUROC per finding (logistic regression on a
# patient-level split), and the association between the agreement matrix
# and the matrix of accuracy differences. Pairs of models are not
# independent observations (each model appears in M-1 pairs), so the
# association is tested with a Mantel test that permutes models, not pairs;
# the Spearman correlation over pairs is shown beside it for reference.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Agreement of each pair of models against the difference of their linear-probe AUROCs.", "name": "fig-02-12"}, "image": {"alt": "Scatter plot of pairwise overlap against the difference in probe accuracy"}}
probe = pd.DataFrame({
    name: probes.linear_probe_auroc(X, manifest[finding_columns], groups=groups, random_state=seed).auroc
    for name, X in embeddings.items()
}).T
probe["mean AUROC"] = probe.mean(axis=1)
probe.to_csv(results / "linear_probe_auroc.csv")
association = agreement.accuracy_agreement_association(agreement_result, probe["mean AUROC"], random_state=seed)
pd.Series(association, dtype=object).to_frame("value").to_csv(results / "accuracy_association.csv")
fig, ax = plt.subplots(figsize=(5, 4))
accuracy_gap = np.abs(probe["mean AUROC"].to_numpy()[:, None] - probe["mean AUROC"].to_numpy()[None, :])
upper = np.triu_indices(len(matrix), 1)
ax.scatter(accuracy_gap[upper], matrix.to_numpy()[upper], s=12, alpha=0.7)
ax.set(xlabel="|difference in mean linear-probe AUROC|", ylabel=f"mutual {k}-NN overlap")
plt.show()

# %% tags=["hide-input"]
display(Markdown(
    f"Mantel test over {association['n_models']} models: r = {association['mantel_r']:.3f}, "
    f"p = {association['mantel_p']:.3f} ({association['n_permutations']} permutations); "
    f"Spearman over the {association['n_pairs']} pairs, for reference only: {association['spearman_r']:.3f}. "
    "The paper reports that agreement is not tied to accuracy."
))
random_auroc = probe.loc[[n for n in probe.index if n.startswith("random")], "mean AUROC"].max()
below_random = [n for n in probe.index if not n.startswith("random") and probe.loc[n, "mean AUROC"] < random_auroc]
if below_random:
    display(Markdown(
        f"Trained models whose probe AUROC is below the best random network's ({random_auroc:.3f}) in this run: "
        + ", ".join(f"`{n}`" for n in below_random)
        + ". Their objective did not learn the findings on this small phantom; their agreement numbers "
        "describe what they did learn, not what the objective learns at scale."
    ))
probe[["mean AUROC"]].sort_values("mean AUROC", ascending=False).round(3).T

# %% [markdown]
# ## Convergence by objective and seed
#
# Do models trained with the same objective but different seeds converge on
# the same neighbours, more than models trained with different objectives?

# %% tags=["hide-input"]
convergence = agreement.convergence_table(matrix.loc[zoo_info["name"], zoo_info["name"]], zoo_info)
convergence.to_csv(results / "convergence.csv", index=False)
convergence.round(3)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Agreement of models that differ only in seed, and of models that differ in objective.", "name": "fig-02-15"}, "image": {"alt": "Strip plot of overlaps within and across training objectives"}}
same_objective = zoo_pairs["objective_a"] == zoo_pairs["objective_b"]
first_seeds = (zoo_pairs["seed_a"] == 0) & (zoo_pairs["seed_b"] == 0)
pairs = pd.concat([
    zoo_pairs[same_objective].sort_values(["objective_a", "architecture"], kind="stable")
    .assign(objective=lambda t: t["objective_a"], pair="same objective, other seed"),
    zoo_pairs[~same_objective & first_seeds].assign(objective=lambda t: t["objective_a"], pair="other objective"),
])
fig, ax = plt.subplots(figsize=(8, 3.8))
sns.stripplot(data=pairs, y="objective", x="overlap", hue="pair", dodge=True, ax=ax, size=5)
ax.axvline(chance, color="grey", linestyle=":")
ax.set(xlabel=f"mutual {k}-NN overlap", ylabel="")
ax.legend(frameon=False, fontsize=8)
plt.show()

# %% [markdown]
# ## Other views of similarity
#
# The mutual kNN overlap is a local measure. Debiased linear CKA (global,
# Kornblith et al. 2019), CKNNA (CKA restricted to mutual neighbours, Huh et
# al. 2024) and the Jaccard index of neighbour sets give complementary views;
# and the overlap depends on k.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Other similarity measures (debiased CKA, CKNNA, Jaccard) and the overlap as k grows.", "name": "fig-02-17"}, "image": {"alt": "Heatmaps of other similarity measures and a line plot of overlap against k"}}
rows = []
for a, b in [public_pair, first_pair("supervised_multilabel"), first_pair("contrastive")]:
    rows.append({
        "pair": f"{a} vs {b}",
        "mutual kNN overlap": matrix.loc[a, b],
        "Jaccard kNN": similarity.jaccard_knn(embeddings[a], embeddings[b], k=k),
        "debiased linear CKA": similarity.linear_cka(embeddings[a], embeddings[b]),
        "CKNNA": similarity.cknna(embeddings[a], embeddings[b], k=k),
    })
metrics = pd.DataFrame(rows)
metrics.to_csv(results / "similarity_metrics.csv", index=False)
sweep = agreement.k_sweep(embeddings[public_pair[0]], embeddings[public_pair[1]]).table
sweep.to_csv(results / "k_sweep.csv", index=False)
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(sweep["k"], sweep["overlap"], marker="o", label="public pair")
ax.plot(sweep["k"], sweep["chance"], linestyle=":", color="grey", label="chance")
ax.set(xscale="log", xlabel="k", ylabel="mutual kNN overlap")
ax.legend(frameon=False)
plt.show()

# %% tags=["hide-input"]
metrics.round(3)

# %% [markdown]
# **Reading this run.** The phantom's images differ by construction in
# acquisition site and view, and the small zoo models were trained on a few
# hundred to a thousand images, so the absolute numbers are not comparable
# with the study's; what carries over is the method and the reference
# points: compare every pair with chance and with random networks, look at
# what agreement follows, and never read a pair correlation over models as
# if the pairs were independent.

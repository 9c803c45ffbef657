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
# same image. CRS-Bench measures this as the
# **{ref}`mutual k-nearest-neighbour overlap <glossary-mutual-knn-overlap>`**:
# for each image, the share of its k = 10 nearest neighbours (cosine) that two models have in common, averaged over images. {ref}`Chance <glossary-chance-overlap>` is
# k/(N-1), a little more here because a patient's other images are left out as
# neighbours; a randomly initialised network is the floor a trained one should
# clear.
#
# By default this notebook runs the study's analyses on the phantom with a
# **model zoo**: small encoders trained here on the phantom's training pool
# that differ in one factor at a time (objective, seed, width), plus two real
# pretrained networks that ship in Python packages as the "public" pair
# ({ref}`public models <glossary-public-models>`): ImageNet EfficientNet-Lite0,
# and Yahoo's Open-NSFW, an ImageNet ResNet-50-thin fine-tuned to detect NSFW
# images (used for its features, as a second network of another family). The `data` and `models` parameters (`crs book --data DIR
# --models A,B,C`) run it on other images and encoders; each analysis says
# what it needs and is skipped, with the reason, when the data or the models
# lack it. The phantom and the small models are not the study's data and
# models: the numbers below are this run's, set beside the paper's for
# orientation only.
#
# *Terms used in this chapter*, defined in the {doc}`glossary <../glossary>`: {ref}`mutual kNN overlap <glossary-mutual-knn-overlap>`, {ref}`chance level <glossary-chance-overlap>`, {ref}`CKA <glossary-cka>`, {ref}`CKNNA <glossary-cknna>`, {ref}`Jaccard kNN <glossary-jaccard-knn>`, {ref}`Mantel test <glossary-mantel-test>`, {ref}`AUROC <glossary-auroc>`, {ref}`approximate neighbour index <glossary-approximate-index>`, {ref}`recall@k <glossary-recall-at-k>`.

# %% tags=["parameters"]
data = "phantom?patients=300&size=64&seed=1"  # other patients than the zoo trained on (zoo_data, seed 0)
strict = False  # True: stop at the first file that is not a readable image (default: leave it out, list it)
zoo_data = "phantom?patients=600&size=64&seed=0"  # what zoo: models train on (only when one is listed)
models = "zoo:*,public:efficientnet_lite0,public:open_nsfw"  # comma-separated model specs; zoo:* = the whole zoo
zoo_preset = "default"
zoo_weights = "shipped"  # shipped: the zoo trained once and shipped with crslib; retrain: trained anew here
public_size = 64
k = 10
target_recall = 0.95  # above 200,000 images: the approximate search is tuned to this recall@k (lower 95% bound)
seed = 0
n_resamples = 500
device = "auto"  # where models compute: auto (a GPU when torch sees one), cpu, cuda, mps
results_dir = "results/02_agreement"
scheduler = None  # None: this process; "local:2" or "tcp://HOST:8786": zoo, embeddings and searches on Dask

# %% tags=["hide-input"]
import html
from itertools import combinations
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import HTML, Markdown, display

import crslib
from crslib import agreement, ann, claims, neighbors, paper, plots, probes, similarity, subgroups
from crslib import factors as model_factors
from crslib.data import drop_unreadable, load_data, read_images
from crslib.embed import embed_models
from crslib.models import is_random_init, random_init_spec, zoo_specs
from crslib.models.lineup import parse_model_list, resolve_models
from crslib.needs import unmet_need
from crslib.runner import SkipLog


def code(text):
    """A model name, spec or column value, shown literally."""
    return f"<code>{html.escape(str(text))}</code>"


def names_list(names):
    return ", ".join(code(n) for n in names)


results = Path(results_dir)
plots.set_reader_display()
results.mkdir(parents=True, exist_ok=True)
skips = SkipLog(results)
manifest, _ = drop_unreadable(load_data(data), strict=strict)  # chapter 01 lists the files left out
on_phantom = str(data).startswith("phantom")
requested = parse_model_list(models)
# A zoo model listed on its own brings the zoo's random network of its architecture (zoo:* holds them all).
zoo_singles = [s for s in requested if s.startswith("zoo:") and s != "zoo:*"]
zoo_names = {s.name for s in zoo_specs(zoo_preset)} if zoo_singles else set()
zoo_references = [r for r in dict.fromkeys(random_init_spec(s) for s in zoo_singles)
                  if r and r[4:] in zoo_names and r not in requested and "zoo:*" not in requested]
lineup = resolve_models(requested + zoo_references, zoo_data=zoo_data, zoo_preset=zoo_preset,
                        zoo_weights=zoo_weights, public_size=public_size, scheduler=scheduler, device=device)
cards = lineup.cards
specs = dict(lineup.specs)
info = lineup.info[["name", "objective", "architecture", "seed"]].copy()
reference_names = [r[4:] for r in zoo_references]  # models added as random-init references, not asked for
# Every other requested model gets a random-init network of its architecture (none for ONNX files).
random_of, added = {}, []
for row in lineup.info.itertuples():
    if is_random_init(row.spec):
        continue
    reference = random_init_spec(row.spec)
    # a zoo reference is in the lineup already when its preset trains one; otherwise there is none to load
    if reference is None or (reference.startswith("zoo:") and reference not in specs.values()):
        continue
    existing = [n for n, s in specs.items() if s == reference]
    if existing:
        random_of[row.name] = existing[0]
        continue
    name = f"random:{row.architecture}"
    name = name if name not in specs else f"random:{row.name}"
    specs[name] = reference
    reference_names.append(name)
    random_of[row.name] = name
    added.append({"name": name, "objective": "random", "architecture": row.architecture, "seed": 0})
info = pd.concat([info, pd.DataFrame(added, columns=info.columns)], ignore_index=True)
info["seed"] = info["seed"].astype(int)
random_names = [n for n, s in specs.items() if is_random_init(s)]
zoo_model_names = lineup.info.loc[lineup.info["backend"] == "zoo", "name"].tolist()
# the factor variants of the full preset (ImageNet start, patient halves, other recipe) are compared in their
# own section; the convergence by objective and seed uses the preset's own models
zoo_factors = lineup.info.loc[lineup.info["backend"] == "zoo"]
zoo_info = info[info["name"].isin(zoo_factors.loc[~zoo_factors["variant"].astype(bool), "name"])]
embeddings = embed_models(manifest, specs, scheduler=scheduler, device=device)
groups = manifest["patient_id"].to_numpy()
zoo_note = f"; zoo preset `{zoo_preset}`" if not cards.empty else "; no zoo model"
display(Markdown(f"**{len(specs)} model{'s' if len(specs) != 1 else ''}** on **{len(manifest):,} images**{zoo_note}."))
other_models = [n for n in lineup.names if n not in zoo_model_names]
notes = []
if other_models:
    notes.append(("Models besides the zoo: " if zoo_model_names else "Models: ") + ", ".join(
        f"{code(n)}" + (f" (loaded as {code(specs[n])})" if specs[n] != n else "") for n in other_models) + ".")
own_random = [n for n in other_models if n in random_names]
if own_random:
    one = len(own_random) == 1
    notes.append(f"{names_list(own_random)} {'has' if one else 'have'} no trained weights (randomly initialised) "
                 f"and {'serves' if one else 'serve'} as a random-init reference {'itself' if one else 'themselves'}.")
if reference_names:
    notes.append("Random-init references added (same architecture, no training): " + ", ".join(
        f"{code(n)} for {names_list([m for m, r in random_of.items() if r == n])}" for n in reference_names) + ".")
if notes:
    display(Markdown(" ".join(notes)))
has_random = skips.check(
    "the comparisons against a random-init network",
    None if random_names else "no model in this run has a random-init counterpart (ONNX files and Open-NSFW have "
    "no separable architecture to re-initialise); add a timm, public:efficientnet_lite0 or zoo: model to run them")
plots.reader_table(cards[["name", "objective", "architecture", "seed", "epochs", "final_loss"]] if not cards.empty
                   else lineup.info[["name", "spec", "backend", "architecture"]])

# %% [markdown]
# ## Did each zoo model learn?
#
# A model says something about its objective only if training added to what
# its architecture gives untrained. Each zoo model's card records a linear
# probe on the zoo data's held-out images (no model trained on them), beside
# the same network at its initial weights, and the paired difference with a
# patient-grouped 95% interval. A model whose interval does not clear 0 is
# flagged, here and wherever its objective is compared.
#
# The probe asks whether a model learned what it was asked to learn: a
# supervised model is probed on the labels it trained on, a self-supervised
# one on every finding. The single-label model is therefore probed on its one
# label; a model taught one label may give up what separates the others, and
# the mean over every finding would flag it for learning exactly its task.

# %% tags=["hide-input"]
flagged = []
probed = cards[cards["probe_difference"].notna()] if "probe_difference" in cards.columns else cards.iloc[:0]
if skips.check("the zoo's probe against the initial weights",
               "there are no zoo models in this run" if cards.empty else
               "no zoo model could be probed: " + str(cards.attrs.get("probe_skipped", "the zoo data has no "
                                                                     "held-out images with findings or a label"))
               if probed.empty else None):
    margins = probed[["name", "objective", "architecture", "probe_target", "probe_auroc", "probe_difference",
                      "probe_low", "probe_high", "probe_learned"]].sort_values("probe_difference", ascending=False)
    margins.to_csv(results / "zoo_probe_margins.csv", index=False)
    display(plots.reader_table(margins, labels={
        "probe_target": "probed on", "probe_auroc": "probe AUROC", "probe_difference": "minus initial weights",
        "probe_low": "95% CI low", "probe_high": "95% CI high", "probe_learned": "learned"}).reset_index(drop=True))
    flagged = margins.loc[~margins["probe_learned"].astype(bool), "name"].tolist()
    by_objective = margins.groupby("objective", sort=False)["probe_learned"].agg(["sum", "size"])
    display(Markdown(
        f"{int(margins['probe_learned'].sum())} of {len(margins)} trained zoo models clear their initial weights "
        "(the interval's lower end above 0): " + "; ".join(
            f"{code(objective)} {int(row['sum'])} of {int(row['size'])}" for objective, row in by_objective.iterrows())
        + ". " + (f"Flagged, and so no evidence about their objective: {names_list(flagged)}; "
                  "their rows below show what an objective that did not learn here looks like, not what it "
                  "does when it learns." if flagged else "None is flagged.")
        + " What each model was probed on: " + "; ".join(
            f"{code(target)}, "
            + (f"{len(group)} models, margins {group['probe_difference'].min():+.3f} to "
               f"{group['probe_difference'].max():+.3f}" if len(group) > 1
               else f"{names_list(group['name'])}, margin {group['probe_difference'].iloc[0]:+.3f}")
            for target, group in margins.groupby("probe_target", sort=True)) + "."))

# %% [markdown]
# ## The agreement matrix
#
# Each model's neighbours are searched once (exact search with faiss), and
# every pair's overlap is computed from those neighbour lists. Same-patient
# images are excluded as neighbours, so a patient's second image does not
# count as agreement; chance is then k over the images outside the query's
# patient, averaged over images.

# %% tags=["hide-input"]
largest_patient = int(manifest.groupby("patient_id").size().max())
agreement_need = (
    f"they need at least 2 models; this run has {len(specs)} ({', '.join(specs)})" if len(specs) < 2
    else f"k = {k} neighbours outside each image's patient need more than {k} such images; the largest patient "
         f"has {largest_patient} of the {len(manifest)} images" if len(manifest) - largest_patient <= k
    else None)
has_agreement = skips.check("the agreement analyses", agreement_need)
# the overlaps leave out each query's own patient, so chance is k over the images outside it, averaged
chance = (agreement.chance_overlap(len(manifest), k, exclude_groups=groups)
          if len(manifest) - largest_patient >= k else float("nan"))
no_chance = "not computed (too few images outside each patient)"

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Mutual k-NN overlap between every pair of models in this run; chance is k over the images outside the query's patient.", "name": "fig-02-4"}, "image": {"alt": "Heatmap of the pairwise mutual nearest-neighbour overlap between models"}}
if has_agreement:
    agreement_result, per_image = agreement.agreement_matrix(embeddings, k=k, exclude_groups=groups,
                                                             return_per_image=True, scheduler=scheduler,
                                                             target_recall=target_recall)
    matrix = agreement_result.overlap
    matrix.to_csv(results / "agreement_matrix.csv")
    # short labels keep a large matrix readable at page width (the zoo's names spell out objective and size)
    abbreviations = {"supervised_multilabel": "sup", "supervised_single": "sup1", "contrastive": "con",
                     "self_distillation": "sd", "masked_image_modelling": "mim", "autoencoder": "ae",
                     "random_init": "rand", "-cnn_small": "", "-cnn_wide": " wide", "-effnet_lite0": " eff",
                     "-imagenet": " IN", "-half": " h", "-strong": " str", "-weak": " wk", "-long": " lg", "-seed": " s"}

    def short_label(name):
        for long, brief in abbreviations.items():
            name = name.replace(long, brief)
        return name.removeprefix("zoo:")

    size = min(0.32 * len(matrix) + 3, 11)
    fig, ax = plt.subplots(figsize=(size, size * 0.85))
    plots.agreement_heatmap(matrix.rename(index=short_label, columns=short_label), ax=ax)
    ax.set_title(f"Mutual {k}-NN overlap (chance {chance:.3f})")
    ax.tick_params(labelsize=9)
    plt.show()


def pair_overlap(a, b):
    """Per-image overlap of two models (per_image holds each pair once, in the matrix's order)."""
    return per_image[(a, b)] if (a, b) in per_image.columns else per_image[(b, a)]


# %% tags=["hide-input"]
if has_agreement and any(short_label(n) != n for n in matrix.index):
    used = [f"{brief.strip()} = {long.strip('-').replace('_', ' ')}" for long, brief in abbreviations.items()
            if brief.strip() and any(long in n for n in matrix.index)]
    display(Markdown("Labels of the heatmap: " + "; ".join(used) + "; models without a size are cnn_small."))
if has_agreement:
    approximate = {name: info for name, info in agreement_result.search.items() if info["index"] != "exact"}
    if approximate:
        worst = min(info["recall"] for info in approximate.values())
        bound = agreement_result.max_error_bound
        unmet = [name for name, info in approximate.items() if info.get("target_met") is False]
        target_text = ("" if target_recall is None else
                       f" Each search was tuned to a recall@{k} of at least {target_recall:.2f} (the lower end of "
                       "its 95% interval, measured on queries set aside for tuning) " +
                       ("and met it." if not unmet else
                        f"and {len(unmet)} did not meet it within the probe budget: " + names_list(unmet) + "."))
        display(Markdown(f"Neighbours of {len(approximate)} model(s) come from an approximate index; the lowest "
                         f"recall@{k} against exact search is {worst:.3f}, so an overlap above may be off by at most "
                         f"{bound:.3f}." + target_text))
    elif any(info.get("fallback") for info in agreement_result.search.values()):
        display(Markdown(f"Neighbours: exact search for every model on the cluster; for some, the approximate "
                         f"index could not reach a recall@{k} of {target_recall} within its probe budget."))
    else:
        display(Markdown(f"Neighbours: exact search for every model ({len(manifest):,} images, below the "
                         f"{ann.APPROX_THRESHOLD:,}-image threshold of the approximate index)."))
    upper = np.triu_indices(len(matrix), 1)
    pair_values = pd.Series(matrix.to_numpy()[upper],
                            index=[(matrix.index[i], matrix.index[j]) for i, j in zip(*upper)])
    low_pair, high_pair = pair_values.idxmin(), pair_values.idxmax()
    display(Markdown(
        f"Over the {len(pair_values)} pairs of models the overlap runs from {pair_values.min():.3f} "
        f"({code(low_pair[0])} vs {code(low_pair[1])}) to {pair_values.max():.3f} ({code(high_pair[0])} vs "
        f"{code(high_pair[1])}), {pair_values.max() / chance:.1f} times chance ({chance:.3f})." if len(pair_values) > 1
        else f"The one pair, {code(low_pair[0])} vs {code(low_pair[1])}, shares {pair_values.iloc[0]:.3f} of its "
             f"{k} neighbours, {pair_values.iloc[0] / chance:.1f} times chance ({chance:.3f})."))

# %% [markdown]
# Each model's mean agreement with every other model, against the random
# networks' level and chance:

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Each model's mean agreement with the other models, beside the random-init reference.", "name": "fig-02-6"}, "image": {"alt": "Bar chart of each model's mean mutual k-NN overlap with the other models"}}
if has_agreement:
    off_diagonal = matrix.where(~np.eye(len(matrix), dtype=bool))
    mean_agreement = off_diagonal.mean(axis=1).rename("mean overlap with the others")
    random_pairs = [matrix.loc[a, b] for a, b in combinations(random_names, 2)]
    random_level = float(np.mean(random_pairs)) if random_pairs else float("nan")
    fig, ax = plt.subplots(figsize=(7, max(0.3 * len(matrix) + 1, 2.8)))
    order = mean_agreement.sort_values()
    ax.barh(order.index, order.values, color=["#c44e52" if n in random_names else "#4c72b0" for n in order.index])
    ax.axvline(chance, color="grey", linestyle=":", label=f"chance {chance:.3f}")
    if random_pairs:
        ax.axvline(random_level, color="#c44e52", linestyle="--", label=f"random-init pairs {random_level:.3f}")
    ax.set(xlabel=f"mean mutual {k}-NN overlap with the other models")
    ax.legend(frameon=False)
    plt.show()

# %% tags=["hide-input"]
if has_agreement:
    trained = order.drop(random_names)
    floor = (f"{len(random_pairs)} pair(s) of random-init networks share {random_level:.3f} on average"
             if random_pairs else f"{names_list(random_names)} is the only random-init network"
             if random_names else "there is no random-init network in this run")
    display(Markdown(
        (f"Among the trained models, {code(trained.index[-1])} agrees most with the others (mean "
         f"{trained.iloc[-1]:.3f}) and {code(trained.index[0])} least ({trained.iloc[0]:.3f}); " if len(trained) > 1
         else f"The one trained model, {code(trained.index[0])}, shares {trained.iloc[0]:.3f} of its neighbours "
              "with the others on average; " if len(trained)
         else "Every model in this run is randomly initialised; ")
        + f"{floor}, and chance is {chance:.3f}."
        + (f" **Every trained model agrees with the others less than random-init networks agree with each other "
           f"({random_level:.3f}).** Random networks of one architecture keep much of the input's own pixel "
           "geometry, so they share neighbours with each other; training moves each model away from that shared "
           "starting point in its own direction. High agreement alone is therefore no sign of a good encoder: "
           "compare it with the random-init level, as the study does."
           if random_pairs and len(trained) and trained.iloc[-1] < random_level else
           f" {int((trained > random_level).sum())} of {len(trained)} trained models agree with the others more "
           f"than random-init networks agree with each other ({random_level:.3f})."
           if random_pairs and len(trained) else "")))

# %% [markdown]
# ## This run beside the paper
#
# The paper's headline numbers (quoted as the paper's: real chest
# radiographs, public models) beside the same quantities in this run.

# %% tags=["hide-input"]
no_matrix = "not computed ({} in this run)".format(
    "fewer than 2 models" if len(specs) < 2 else "too few images outside each patient")


def within_objective(objective, architecture="cnn_small"):
    rows = zoo_pairs[(zoo_pairs["objective_a"] == objective) & (zoo_pairs["objective_b"] == objective)
                     & (zoo_pairs["architecture"] == architecture)]
    return rows["overlap"].tolist()


def first_pair(objective, architecture="cnn_small"):
    rows = zoo_pairs[(zoo_pairs["objective_a"] == objective) & (zoo_pairs["objective_b"] == objective)
                     & (zoo_pairs["architecture"] == architecture)]
    return (rows.iloc[0]["model_a"], rows.iloc[0]["model_b"]) if len(rows) else None


def value_range(values, what):
    if not has_agreement:
        return no_matrix
    if zoo_info.empty:
        return "not computed (no zoo models in this run)"
    return f"{min(values):.3f}-{max(values):.3f}" if values else f"not computed (no zoo {what} pairs in this run)"


zoo_pairs = (agreement.convergence_pairs(matrix.loc[zoo_info["name"], zoo_info["name"]], zoo_info)
             if has_agreement and len(zoo_info) else pd.DataFrame(columns=["model_a", "model_b", "architecture",
                                                                              "objective_a", "objective_b",
                                                                              "seed_a", "seed_b", "overlap"]))
# The pair the single-pair analyses study: requested models before the added references, other models before
# the zoo, trained before random (by default the two public networks).
candidates = [n for n in lineup.names if n not in reference_names]
candidates = sorted(candidates, key=lambda n: (n in zoo_model_names, n in random_names))
focus_pair = tuple(candidates[:2]) if len(candidates) >= 2 else None
pretrained = [n for n in candidates if n not in zoo_model_names and n not in random_names]
public_pair = tuple(pretrained[:2]) if len(pretrained) >= 2 else None
if has_agreement and public_pair:
    public_ci = agreement.overlap_ci(
        agreement.mutual_knn_overlap_per_image(embeddings[public_pair[0]], embeddings[public_pair[1]],
                                               k=k, exclude_groups=groups),
        groups=groups, n_resamples=n_resamples, random_state=seed)
    public_value = f"{public_ci.estimate:.3f} ({public_ci.low:.3f}-{public_ci.high:.3f})"
else:
    public_value = (no_matrix if not has_agreement
                    else "not computed (fewer than two pretrained models besides the zoo in this run)")
short_names = {"public:efficientnet_lite0": "EfficientNet-Lite0", "public:open_nsfw": "Open-NSFW"}
with_reference = sorted((n for n in candidates if n in random_of), key=lambda n: n in zoo_model_names)
if has_agreement and with_reference:
    random_model = with_reference[0]
    random_value = (f"{matrix.loc[random_model, random_of[random_model]]:.3f} "
                    f"({short_names.get(random_model, random_model)} vs its random init)")
    if random_pairs:
        random_value += f"; random pairs {random_level:.3f}"
else:
    random_model = None
    random_value = (no_matrix if not has_agreement
                    else "not computed (no random-init reference in this run)" if not random_names
                    else "not computed (no trained model with a random-init counterpart in this run)")
ssl_values = within_objective("contrastive") + within_objective("self_distillation")
headline = pd.DataFrame(
    [
        ("public models share, of 10 neighbours", f"{paper.value('public_pair_overlap'):.3f}", public_value),
        ("a randomly initialised network", f"{paper.value('random_init_overlap'):.3f}", random_value),
        ("label-supervised models differing only in seed",
         f"{paper.value('supervised_seed_overlap_low'):.3f}-{paper.value('supervised_seed_overlap_high'):.3f}",
         value_range(within_objective("supervised_multilabel"), "supervised seed")),
        ("self-supervised pairs (same objective, other seed)",
         f"{paper.value('ssl_pair_overlap_low'):.3f}-{paper.value('ssl_pair_overlap_high'):.3f}",
         value_range(ssl_values, "self-supervised seed")),
        ("chance k/(N - images of the query's patient)", "", f"{chance:.4f}" if np.isfinite(chance) else no_chance),
    ],
    columns=["quantity", "paper (CRS-Bench)", f"this run ({'phantom' if on_phantom else 'your data'})"],
)
headline.to_csv(results / "headline.csv", index=False)
# The same quantities as numbers, for the claims ledger (crslib.claims)
measured = has_agreement and public_pair
claims.measures_frame([
    ("public_pair_overlap", public_ci.estimate if measured else np.nan, public_ci.low if measured else np.nan,
     public_ci.high if measured else np.nan, "" if measured else public_value),
    ("random_init_overlap", matrix.loc[random_model, random_of[random_model]] if random_model else np.nan,
     np.nan, np.nan, "" if random_model else random_value),
    ("chance", chance, np.nan, np.nan,
     f"mean over images of k/(N - images of its patient) with k = {k}" if np.isfinite(chance) else no_chance),
]).to_csv(results / "measures.csv", index=False)
display(headline)
read = []
if has_agreement and public_pair:
    read.append(f"The public-models row of this run compares {code(public_pair[0])} with {code(public_pair[1])} (95% "
                f"interval from {n_resamples} bootstrap resamples of patients).")
if random_model:
    read.append(f"The random-init row compares {code(random_model)} with its random-init counterpart "
                f"{code(random_of[random_model])}.")
if read:
    display(Markdown(" ".join(read)))

# %% [markdown]
# ## What agreement follows: source, view, findings
#
# For one pair of models (the two public networks by default), how much of
# the per-image overlap does each factor explain? The variance share is the
# R² of the per-image overlap on that factor alone (one-hot), with a
# bootstrap CI over patients (*alone*). The *unique* share is what the factor
# adds to all the others together: the R² of all factors minus the R² of
# all factors but this one, so a factor that only repeats another (a view
# that always comes from one source) has a small unique share. The right
# panel gives the mean overlap per level of source and view.

# %% tags=["hide-input"]
targets, targets_left_out = probes.probe_targets(manifest, random_state=seed)
has_pair = has_agreement and skips.check(
    "the analyses of one pair of models (what agreement follows, other similarity measures)",
    None if focus_pair else f"they need two requested models; this run asked for {len(candidates)} "
    f"({', '.join(candidates)}) besides the random-init references; list another one in `models`")
shares = by_level = None
if has_pair:
    focus_per_image = pair_overlap(*focus_pair).to_numpy()
    level_columns = [c for c in ("source", "view")
                     if skips.check(f"the overlap by {c}", unmet_need(manifest, varying=[c]))]
    finding_columns = [c for c in manifest.columns if c.startswith("finding_")]
    target_factors = ([c for c in finding_columns if unmet_need(manifest, varying=[c]) is None] if finding_columns
                      else ["label"] if unmet_need(manifest, varying=["label"]) is None else [])
    factors = level_columns + target_factors
    if skips.check("the variance shares of the per-image overlap",
                   None if factors else "no `source`, `view`, finding_* or `label` column of the manifest has two "
                   "different values; add one to run it"):
        shares = subgroups.overlap_variance_shares(focus_per_image, manifest, columns=factors, groups=groups,
                                                   n_resamples=min(n_resamples, 200), random_state=seed)
        shares.to_csv(results / "variance_shares.csv", index=False)
    if level_columns:
        by_level = subgroups.overlap_by_subgroup(focus_per_image, manifest, columns=level_columns,
                                                 groups=groups, n_resamples=n_resamples, random_state=seed)
        by_level.to_csv(results / "overlap_by_subgroup.csv", index=False)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Share of the per-image overlap variance explained by source, view and findings (R², 95% CI).", "name": "fig-02-10"}, "image": {"alt": "Bar charts of the overlap variance explained by image attributes"}}
panels = [p for p in (shares, by_level) if p is not None]
if panels:
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    axes = list(axes[0])
    public_focus = focus_pair == ("public:efficientnet_lite0", "public:open_nsfw")
    if not public_focus:
        fig.suptitle(f"{focus_pair[0]} vs {focus_pair[1]}")
    if shares is not None:
        ax = axes.pop(0)
        plot_shares = shares[shares["factor"] != "(all factors)"].sort_values("share_alone")
        ax.barh(plot_shares["factor"].astype(str).str.removeprefix("finding_"), plot_shares["share_alone"],
                xerr=[plot_shares["share_alone"] - plot_shares["share_alone_low"],
                      plot_shares["share_alone_high"] - plot_shares["share_alone"]], color="#4c72b0")
        ax.set(xlabel="share of per-image overlap variance explained (R², 95% CI)",
               title="Public pair: what agreement follows" if public_focus else "What agreement follows")
    if by_level is not None:
        ax = axes.pop(0)
        plots.subgroup_overlap(by_level, chance=chance, ax=ax)
        by_what = f"overlap by {' and '.join(level_columns)}"
        ax.set_title(f"Public pair: {by_what}" if public_focus else by_what.capitalize())
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if shares is not None:
    display(plots.reader_table(shares))
    factor_rows = shares[shares["factor"] != "(all factors)"].set_index("factor")
    top = factor_rows["share_alone"].idxmax()
    joint = shares.set_index("factor").loc["(all factors)"]
    top_share = (f"{factor_rows.loc[top, 'share_alone']:.3f} (95% CI {factor_rows.loc[top, 'share_alone_low']:.3f}-"
                 f"{factor_rows.loc[top, 'share_alone_high']:.3f})")
    display(Markdown(
        f"For {code(focus_pair[0])} vs {code(focus_pair[1])}, "
        + (f"{code(top)} alone explains the largest share of the per-image overlap variance, {top_share}; the "
           f"{len(factor_rows)} factors together explain {joint['share_alone']:.3f}." if len(factor_rows) > 1
           else f"{code(top)} explains {top_share} of the per-image overlap variance.")))
if by_level is not None:
    spread = by_level.groupby("column")["mean"].agg(["min", "max", "size"])
    display(Markdown("Mean overlap per level: " + "; ".join(
        f"{code(column)} {row['min']:.3f}-{row['max']:.3f} over {int(row['size'])} levels"
        for column, row in spread.iterrows()) + f" (chance {chance:.3f})."))

# %% [markdown]
# ### An image and its neighbours
#
# The overlap is an average over images. Here are three images of this run, each beside its 10 nearest
# neighbours under each encoder of the pair above: the image whose two encoders agree most, the median
# one, and the one whose encoders agree least. A red outline marks a neighbour that both encoders return.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Three images and their nearest neighbours under the two encoders of the pair above (a patient's own images left out); red outlines: neighbours both return.", "name": "fig-02-11"}, "image": {"alt": "Rows of small images: each query image followed by its ten nearest neighbours under one encoder, then under the other"}}
if has_pair:
    order = np.argsort(focus_per_image, kind="stable")
    strip_rows = [int(order[-1]), int(order[len(order) // 2]), int(order[0])]
    strips = neighbors.shared_neighbours(embeddings[focus_pair[0]], embeddings[focus_pair[1]], strip_rows, k=k,
                                         exclude_groups=groups)
    needed = sorted(set(strips["query"]) | set(strips["neighbour_a"]) | set(strips["neighbour_b"]))
    pictures, _ = read_images(manifest["path"].iloc[needed])
    plots.neighbour_strips(strips, dict(zip(needed, pictures)), focus_pair)
    plt.show()

# %% tags=["hide-input"]
if has_pair:
    shared = strips.groupby("query", sort=False)["overlap"].first()
    display(Markdown(
        f"Of their {k} nearest neighbours, {code(focus_pair[0])} and {code(focus_pair[1])} share "
        + ", ".join(str(round(v * k)) for v in shared) + " for these three images (the most, the median and the "
        f"fewest of this run's {len(focus_per_image)} images); on average they share {focus_per_image.mean() * k:.1f}, "
        f"the pair's overlap of {focus_per_image.mean():.3f}."
    ))

# %% [markdown]
# ## Is agreement tied to accuracy?
#
# Each model's linear-probe {ref}`AUROC <glossary-auroc>` per finding (or for a two-class `label`
# when the manifest has no `finding_*` columns; logistic regression on a
# patient-level split), and the association between the agreement matrix
# and the matrix of accuracy differences. Pairs of models are not
# independent observations (each model appears in M-1 pairs), so the
# association is tested with a {ref}`Mantel <glossary-mantel-test>` test that permutes models, not pairs;
# the Spearman correlation over pairs is shown beside it for reference.

# %% tags=["hide-input"]
probe = association = None
for column, reason in targets_left_out.items():
    if not targets.empty:
        skips.check(f"the linear probe of {column}", reason)
if skips.check("the linear probe", None if not targets.empty else next(iter(targets_left_out.values()))):
    probe = pd.DataFrame({
        name: probes.linear_probe_auroc(X, targets, groups=groups, random_state=seed).auroc
        for name, X in embeddings.items()
    }).T
    probe["mean AUROC"] = probe.mean(axis=1)
    probe.to_csv(results / "linear_probe_auroc.csv")
    scored = probe["mean AUROC"].dropna()
    association_need = (
        "the agreement matrix was not computed" if not has_agreement
        else f"it needs at least 3 models with a probe AUROC; this run has {len(scored)}" if len(scored) < 3
        else None)
    if skips.check("the association of agreement with accuracy", association_need):
        association = agreement.accuracy_agreement_association(matrix.loc[scored.index, scored.index], scored,
                                                               random_state=seed)
        pd.Series(association, dtype=object).to_frame("value").to_csv(results / "accuracy_association.csv")

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Agreement of each pair of models against the difference of their linear-probe AUROCs.", "name": "fig-02-12"}, "image": {"alt": "Scatter plot of pairwise overlap against the difference in probe accuracy"}}
if association is not None:
    fig, ax = plt.subplots(figsize=(5, 4))
    accuracy_gap = np.abs(scored.to_numpy()[:, None] - scored.to_numpy()[None, :])
    upper = np.triu_indices(len(scored), 1)
    ax.scatter(accuracy_gap[upper], matrix.loc[scored.index, scored.index].to_numpy()[upper], s=12, alpha=0.7)
    ax.set(xlabel="|difference in mean linear-probe AUROC|", ylabel=f"mutual {k}-NN overlap")
    plt.show()

# %% tags=["hide-input"]
if association is not None:
    display(Markdown(
        f"Mantel test over {association['n_models']} models: r = {association['mantel_r']:.3f}, "
        f"p = {association['mantel_p']:.3f} ({association['n_permutations']} permutations); "
        f"Spearman over the {association['n_pairs']} pairs, for reference only: {association['spearman_r']:.3f}. "
        + (f"With {association['n_models']} models there are only {association['n_permutations']} orderings "
           f"to permute, so no p-value below {1 / association['n_permutations']:.3f} is possible. "
           if association["exact"] else "")
        + ("The paper reports that agreement is not significantly associated with accuracy; this run agrees "
           "(p ≥ 0.05)." if association["mantel_p"] >= 0.05 else
           f"The paper reports that agreement is not significantly associated with accuracy; **this run "
           f"contradicts it**: models with more similar probe AUROCs agree "
           f"{'more' if association['mantel_r'] < 0 else 'less'} here (r {association['mantel_r']:+.3f}). "
           f"A likely reason is the spread of accuracy: the models' mean probe AUROC runs from "
           f"{scored.min():.3f} ({code(scored.idxmin())}) to {scored.max():.3f} ({code(scored.idxmax())})"
           + (", random-init references included" if set(scored.index) & set(random_names) else "")
           + " (see the probe table below), so agreement partly tracks how much a model learned, where the "
           "study's public models were all trained to do well.")
    ))
if probe is not None:
    probed = ", ".join(code(c) for c in targets.columns)
    random_scored = [n for n in probe.index if n in random_names and np.isfinite(probe.loc[n, "mean AUROC"])]
    if random_scored:
        random_auroc = probe.loc[random_scored, "mean AUROC"].max()
        below_random = [n for n in probe.index if n not in random_names and probe.loc[n, "mean AUROC"] < random_auroc]
        if below_random:
            display(Markdown(
                f"Trained models whose probe AUROC is below the best random network's ({random_auroc:.3f}) in this "
                "run: " + names_list(below_random) + ". "
                + ("Their objective did not learn the findings on this small phantom; their agreement numbers "
                   "describe what they did learn, not what the objective learns at scale." if on_phantom else
                   f"On these images their features separate {probed} no better than a random network's; their "
                   "agreement numbers describe what they did learn, not what they were trained for.")
            ))
    display(probe[["mean AUROC"]].sort_values("mean AUROC", ascending=False).round(3))
    best, worst = probe["mean AUROC"].idxmax(), probe["mean AUROC"].idxmin()
    display(Markdown(
        f"Mean test AUROC over {probed} ({len(targets.columns)} target(s)): highest {code(best)} "
        f"{probe.loc[best, 'mean AUROC']:.3f}, lowest {code(worst)} {probe.loc[worst, 'mean AUROC']:.3f}."))

# %% [markdown]
# ## Convergence by objective and seed
#
# Do models trained with the same objective but different seeds converge on
# the same neighbours, more than models trained with different objectives?
# (This needs zoo models: encoders trained here that differ in one factor at
# a time.)

# %% tags=["hide-input"]
def convergence_ranking(table: pd.DataFrame) -> str:
    """The objectives' seed-pair agreement in this run, most first; the ledger below judges the paper's claim."""
    seeded = table[(table["n_within"] > 0) & (table["objective"] != "(all)")]
    if seeded.empty:
        return "No objective has two seeds of one architecture in this run, so none can be ranked."
    parts = []
    for arch, t in seeded.sort_values("within_mean", ascending=False).groupby("architecture", sort=False):
        parts.append(f"{code(arch)}: " + ", ".join(
            o.replace("_", " ") + (" (untrained)" if o == "random_init" else "") + f" {m:.3f}"
            + (" (flagged)" if nf else "")
            for o, m, nf in zip(t["objective"], t["within_mean"], t["n_flagged"])))
    return ("Seed pairs of the same objective, from most to least agreement: " + "; ".join(parts) + ". "
            f"The paper found label-supervised seeds converge least ({paper.value('supervised_seed_overlap_low'):.3f}-"
            f"{paper.value('supervised_seed_overlap_high'):.3f} against {paper.value('ssl_pair_overlap_low'):.3f}-"
            f"{paper.value('ssl_pair_overlap_high'):.3f} for self-supervised pairs); the claims at the end of this "
            "chapter test that on the objectives whose models learned, leaving flagged ones out.")

convergence = None
if has_agreement and skips.check(
        "the convergence by objective and seed",
        "there are no zoo models in this run; add zoo:* (or several zoo: models) to `models` to run it"
        if zoo_info.empty else "no two zoo models of this run share an architecture" if zoo_pairs.empty else None):
    convergence = agreement.convergence_table(matrix.loc[zoo_info["name"], zoo_info["name"]], zoo_info)
    flagged_info = zoo_info[zoo_info["name"].isin(flagged)]
    convergence["n_flagged"] = [
        int(((flagged_info["architecture"] == row.architecture)
             & ((flagged_info["objective"] == row.objective) | (row.objective == "(all)"))).sum())
        for row in convergence.itertuples()]
    convergence.to_csv(results / "convergence.csv", index=False)
    display(plots.reader_table(convergence, labels={"n_flagged": "models flagged (not above initial weights)"}))
    if flagged:
        display(Markdown("Objectives with flagged models: " + ", ".join(sorted(
            {code(o) for o in flagged_info["objective"]})) + ". Their seeds' agreement measures networks that "
            "did not learn beyond their initial weights here, so it is no evidence about the objective itself."))
    display(Markdown(convergence_ranking(convergence)))
    pooled = convergence[convergence["objective"] == "(all)"].set_index("architecture")
    display(Markdown("Pooled over objectives: " + "; ".join(
        f"{code(arch)}: same objective, other seed {row['within_mean']:.3f} over {int(row['n_within'])} pair(s) "
        f"vs other objective {row['across_mean']:.3f} over {int(row['n_across'])}"
        if row["n_within"] else f"{code(arch)}: no two seeds of one objective; other objectives "
        f"{row['across_mean']:.3f} over {int(row['n_across'])} pair(s)"
        for arch, row in pooled.iterrows()) + "."))

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Agreement of models that differ only in seed, and of models that differ in objective.", "name": "fig-02-15"}, "image": {"alt": "Strip plot of overlaps within and across training objectives"}}
if convergence is not None:
    same_objective = zoo_pairs["objective_a"] == zoo_pairs["objective_b"]
    first_seeds = (zoo_pairs["seed_a"] == 0) & (zoo_pairs["seed_b"] == 0)
    pairs = pd.concat([
        zoo_pairs[same_objective].sort_values(["objective_a", "architecture"], kind="stable")
        .assign(objective=lambda t: t["objective_a"], pair="same objective, other seed"),
        zoo_pairs[~same_objective & first_seeds].assign(objective=lambda t: t["objective_a"], pair="other objective"),
    ])
    if len(pairs):
        fig, ax = plt.subplots(figsize=(8, 3.8))
        sns.stripplot(data=pairs, y="objective", x="overlap", hue="pair", dodge=True, ax=ax, size=5)
        ax.axvline(chance, color="grey", linestyle=":")
        ax.set(xlabel=f"mutual {k}-NN overlap", ylabel="")
        ax.legend(frameon=False, fontsize=8)
        plt.show()

# %% tags=["hide-input"]
if convergence is not None and len(pairs):
    kinds = pairs.groupby("pair", sort=False)["overlap"].agg(["mean", "size"])
    display(Markdown("In the plot: " + "; ".join(
        f"{kind}: mean {row['mean']:.3f} over {int(row['size'])} pair(s)" for kind, row in kinds.iterrows())
        + f" (chance {chance:.3f})."))

# %% [markdown]
# ## Convergence by factor
#
# The study's trained models differ in objective, label type, size, seed,
# initialisation, training patients and training recipe. Two zoo models that
# differ in exactly one of these show how far that factor alone moves the
# neighbours. The default zoo varies objective, seed and size; the `full`
# preset adds pairs that start from random vs ImageNet weights
# (EfficientNet-Lite0), train on two disjoint patient halves, or train twice as
# long. Untrained random-init references are left out.

# %% tags=["hide-input"]
def factor_text(table: pd.DataFrame, left_out: bool) -> str:
    """The factors from most to least agreement, and how the objective ranks among them."""
    ranked = table.sort_values("mean", ascending=False)
    text = (("Leaving out the pairs with a flagged model, pairs" if left_out else "Pairs")
            + " that differ in one factor alone, from most to least agreement: " + "; ".join(
        f"{row.factor} {row.mean:.3f} ({row.n_pairs} pair{'s' if row.n_pairs != 1 else ''})"
        for row in ranked.itertuples()) + f" (chance {chance:.3f}). ")
    absent = [f for f in model_factors.FACTORS if f not in set(table["factor"])]
    if absent:
        text += (f"No pair {'of models that learned ' if left_out else ''}in this run isolates "
                 f"{', '.join(absent)}. ")
    if "objective" in set(table["factor"]) and len(table) > 1:
        lowest, n_lowest = ranked.iloc[-1]["factor"], int(ranked.iloc[-1]["n_pairs"])
        evidence = f" (on {n_lowest} pair{'s' if n_lowest != 1 else ''})"
        text += ("Changing the objective moved the neighbours more than any other single factor here" + evidence
                 + ". Whether that bears out the paper's finding that the objective decides convergence is the "
                 "claims ledger's verdict (objective-drives-convergence, in the box at the end of this chapter), "
                 "which needs two seeds of each objective."
                 if lowest == "objective" else
                 f"Changing {lowest} moved the neighbours most here{evidence}, more than changing the objective; "
                 "the paper found the objective decisive across its 101 models, which this small phantom zoo need "
                 "not reproduce.")
    return text


factor_summary = None
factor_models = zoo_factors[zoo_factors["objective"] != "random_init"]
if has_agreement and skips.check(
        "the convergence by factor",
        "fewer than two trained zoo models in this run; add zoo:* to `models` to run it"
        if len(factor_models) < 2 else None):
    factor_names = factor_models["name"].tolist()
    factor_pair_table = model_factors.factor_pairs(matrix.loc[factor_names, factor_names], factor_models)
    factor_pair_table["flagged"] = factor_pair_table["model_a"].isin(flagged) | factor_pair_table["model_b"].isin(flagged)
    factor_summary = model_factors.factor_table(factor_pair_table)
    factor_summary["n_flagged"] = factor_summary["factor"].map(factor_pair_table.groupby("factor")["flagged"].sum())
    factor_pair_table.to_csv(results / "factor_pairs.csv", index=False)
    if factor_summary.empty:
        display(Markdown("No two trained zoo models of this run differ in exactly one factor."))
    else:
        display(plots.reader_table(factor_summary.set_index("factor"), labels={
            "n_pairs": "pairs", "mean": "mean overlap", "min": "lowest", "max": "highest",
            "n_flagged": "pairs with a flagged model"}))
        flagged_pairs = factor_pair_table[factor_pair_table["flagged"]]
        learned_summary = model_factors.factor_table(factor_pair_table[~factor_pair_table["flagged"]])
        display(Markdown(factor_text(learned_summary, True) if len(flagged_pairs) and len(learned_summary)
                         else factor_text(factor_summary, False)))
        if len(flagged_pairs):
            involved = sorted((set(flagged_pairs["model_a"]) | set(flagged_pairs["model_b"])) & set(flagged))
            display(Markdown(
                f"{len(flagged_pairs)} of the {len(factor_pair_table)} pairs include a model that did not beat its "
                f"initial weights on the probe ({names_list(involved)}). Such a pair "
                "compares networks of which at least one learned nothing the probe can see, so its agreement says "
                "little about the factor it isolates."))

# %% [markdown]
# ## Other views of similarity
#
# The mutual kNN overlap is a local measure. Debiased {ref}`linear CKA <glossary-cka>` (global,
# Kornblith et al. 2019), {ref}`CKNNA <glossary-cknna>` (CKA restricted to mutual neighbours, Huh et
# al. 2024) and the {ref}`Jaccard <glossary-jaccard-knn>` index of neighbour sets give complementary views;
# and the overlap depends on k.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "The mutual kNN overlap of the focus pair as k grows (a patient's own images left out), against the patient-aware chance; the table below compares it with debiased CKA, CKNNA and Jaccard.", "name": "fig-02-17"}, "image": {"alt": "Line plot of the overlap and of chance against k"}}
metrics = sweep = None
if has_pair:
    rows = []
    for pair in dict.fromkeys([focus_pair, first_pair("supervised_multilabel"), first_pair("contrastive")]):
        if pair is None:
            continue
        a, b = pair
        rows.append({
            "pair": f"{a} vs {b}",
            "mutual kNN overlap": matrix.loc[a, b],
            "Jaccard kNN": similarity.jaccard_knn(embeddings[a], embeddings[b], k=k, exclude_groups=groups),
            "debiased linear CKA": similarity.linear_cka(embeddings[a], embeddings[b]),
            "CKNNA": similarity.cknna(embeddings[a], embeddings[b], k=k),
        })
    metrics = pd.DataFrame(rows)
    metrics.to_csv(results / "similarity_metrics.csv", index=False)
    sweep = agreement.k_sweep(embeddings[focus_pair[0]], embeddings[focus_pair[1]], exclude_groups=groups).table
    sweep.to_csv(results / "k_sweep.csv", index=False)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(sweep["k"], sweep["overlap"], marker="o",
            label="public pair" if focus_pair == public_pair else f"{focus_pair[0]} vs {focus_pair[1]}")
    ax.plot(sweep["k"], sweep["chance"], linestyle=":", color="grey", label="chance")
    ax.set(xscale="log", xlabel="k", ylabel="mutual kNN overlap")
    ax.legend(frameon=False)
    plt.show()

# %% tags=["hide-input"]
if metrics is not None:
    display(plots.reader_table(metrics))
    first, last = sweep.iloc[0], sweep.iloc[-1]
    cka, overlap = metrics["debiased linear CKA"], metrics["mutual kNN overlap"]
    display(Markdown(
        (f"Over {len(metrics)} pairs, debiased CKA runs {cka.min():.3f}-{cka.max():.3f} while the mutual {k}-NN "
         f"overlap runs {overlap.min():.3f}-{overlap.max():.3f}. " if len(metrics) > 1 else
         f"Debiased CKA is {cka.iloc[0]:.3f} and the mutual {k}-NN overlap {overlap.iloc[0]:.3f}. ")
        + f"For {code(focus_pair[0])} vs {code(focus_pair[1])} the overlap goes from {first['overlap']:.3f} at k = "
        f"{int(first['k'])} to {last['overlap']:.3f} at k = {int(last['k'])}, {last['overlap_over_chance']:.1f} "
        f"times chance there ({last['chance']:.3f})."))

# %% tags=["hide-input"]
if on_phantom:
    display(Markdown(
        "**Reading this run.** The phantom's images differ by construction in acquisition site and view, and the "
        "small zoo models were trained on a few hundred to a thousand images, so the absolute numbers are not "
        "comparable with the study's; what carries over is the method and the reference points: compare every "
        "pair with chance and with random networks, look at what agreement follows, and never read a pair "
        "correlation over models as if the pairs were independent."))
else:
    ran = [name for name, done in [("the agreement matrix", has_agreement), ("the single-pair analyses", has_pair),
                                   ("the linear probe", probe is not None),
                                   ("the accuracy association", association is not None),
                                   ("the convergence by objective", convergence is not None)] if done]
    display(Markdown(
        f"**Reading this run.** {len(specs)} model(s) on {len(manifest):,} of your images"
        + (f" ({len(zoo_model_names)} of them zoo models trained on the phantom, not on these images)"
           if zoo_model_names else "")
        + "; this run computed " + (", ".join(ran[:-1]) + " and " + ran[-1] if len(ran) > 1 else ran[0] if ran
                                     else "no agreement analysis")
        + (f"; it skipped {len(skips.records)} analysis(es), each with its reason above" if skips.records else "")
        + ". The numbers are this data's and these models'; what carries over from the study is the method and "
        "the reference points: compare every pair with chance and with random networks, look at what agreement "
        "follows, and never read a pair correlation over models as if the pairs were independent."))

# %% [markdown]
# ## What this run shows
#
# Each claim of the study that this chapter measures, with this run's number
# and the verdict of a decision rule fixed before the run (`crslib.claims`;
# the [claims at a glance](claims.md) page has the whole run's ledger).

# %% tags=["hide-input"]
display(HTML(claims.build_ledger(results.parent).chapter_html("02")))

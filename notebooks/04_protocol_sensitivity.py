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
# # How much does the protocol move the number?
#
# A paper reports "{ref}`AUROC <glossary-auroc>` 0.95 on Kermany". Behind that one number sit
# choices: which pretrained backbone, whether it was frozen (a linear probe
# on its embeddings) or fine-tuned, which decision threshold turned
# probabilities into diagnoses and where that threshold was fitted, which
# metric, whether the probabilities were calibrated. On the Kermany
# pediatric chest radiographs the study measured (the paper's numbers):
#
# | choice | effect reported by the paper |
# |---|---|
# | backbone (8 pretrained) | 0.026 AUROC spread |
# | frozen vs fine-tuned | 0.044 AUROC |
# | decision threshold | 0.090 {ref}`balanced accuracy <glossary-balanced-accuracy>` |
#
# In the paper, then, the backbone, which papers compare most, moved the
# headline least. Whether it does in this run is what the effect table
# below measures; the box at the end of the chapter gives the verdict.
#
# This notebook runs the same grid on the data it is given. By default that
# is the **Kermany-like phantom**: a single normal / pneumonia label, the
# folder layout `chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}`, a tiny
# official validation split, a later acquisition batch in the official test
# split and file encodings coupled to the label in the training pool; the
# phantom is not Kermany and does not reproduce the paper's values. With
# `crs book --data` it runs on your images, which need a two-class `label`,
# patient ids and a `split` column with train and test rows (a Kermany
# `chest_xray/` folder has all three). The default backbones are zoo
# encoders trained on the standard phantom (their "pretraining" data, never
# the data studied here), the two {ref}`public models <glossary-public-models>`
# (ImageNet EfficientNet-Lite0, and Open-NSFW: an ImageNet ResNet-50 fine-tuned
# to detect NSFW images) and a randomly initialised network; `--models`
# replaces them.
# Numbers below are this run's.
#
# *Terms used in this chapter*, defined in the {doc}`glossary <../glossary>`: {ref}`AUROC <glossary-auroc>`, {ref}`DeLong test <glossary-delong-test>`, {ref}`balanced accuracy <glossary-balanced-accuracy>`, {ref}`Youden's J <glossary-youden>`, {ref}`ECE <glossary-ece>`, {ref}`temperature and Platt scaling <glossary-temperature-scaling>`.

# %% tags=["parameters"]
data = "phantom?patients=400&size=64&seed=1&kermany=1&shortcut=0.9&shift=0.5"
strict = False  # True: stop at the first file that is not a readable image (default: leave it out, list it)
zoo_data = "phantom?patients=600&size=64&seed=0"
zoo_preset = "default"
zoo_weights = "shipped"  # shipped: the zoo trained once and shipped with crslib; retrain: trained anew here
public_size = 64
backbones = ("zoo:supervised_multilabel-cnn_small-seed0,zoo:contrastive-cnn_small-seed0,"
             "zoo:masked_image_modelling-cnn_small-seed0,zoo:supervised_multilabel-cnn_wide-seed0,"
             "public:efficientnet_lite0,public:open_nsfw,zoo:random_init-cnn_small-seed0")
finetune_epochs = 3
seeds = "0,1"
reported_backbone = "public:efficientnet_lite0"
reported_policy = "frozen"
reported_rule = "youden"
calibration_method = "temperature"
n_resamples = 500
n_partitions = 5
seed = 0
device = "auto"  # where models compute: auto (a GPU when torch sees one), cpu, cuda, mps
results_dir = "results/04_protocol_sensitivity"

# %% tags=["hide-input"]
import html
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import HTML, Markdown, display

import crslib
from crslib import claims, metrics, paper, plots, protocol
from crslib.data import drop_unreadable, load_data
from crslib.embed import embed_models
from crslib.errors import DataError, ModelError
from crslib.models import finetune_classifier
from crslib.models.lineup import resolve_models
from crslib.needs import unmet_need
from crslib.probes import class_codes
from crslib.runner import SkipLog
from crslib.stats import delong_test

results = Path(results_dir)
plots.set_reader_display()
results.mkdir(parents=True, exist_ok=True)
skips = SkipLog(results)
seed_list = [int(s) for s in str(seeds).split(",") if s.strip()]
is_phantom = str(data).startswith("phantom")
on_data = "the Kermany-like phantom" if is_phantom else "this data"


def short(spec: str) -> str:
    return spec.split(":", 1)[1].replace("-cnn_", " cnn_").replace("-seed0", "")


def esc(text) -> str:
    return html.escape(str(text))


def code(text) -> str:
    """User-given text (a spec, a file name, a class) shown literally in Markdown."""
    return f"<code>{html.escape(str(text))}</code>"


# the backbones: the zoo is trained (or reused) only for zoo: specs, on zoo_data, never on `data`
lineup = resolve_models(backbones, zoo_data=zoo_data, zoo_preset=zoo_preset,
                        zoo_weights=zoo_weights, public_size=int(public_size),
                        device=device)
loadable = {("zoo:" + r.name if r.backend == "zoo" else r.name): r.spec for r in lineup.info.itertuples()}
backbone_list = list(loadable)
if reported_backbone not in loadable:
    display(Markdown(f"The reported backbone {code(reported_backbone)} is not among this run's backbones; "
                     f"the first one, {code(backbone_list[0])}, is reported instead."))
    reported_backbone = backbone_list[0]
manifest, _ = drop_unreadable(load_data(data), strict=strict)  # chapter 01 lists the files left out
groups = manifest["patient_id"].to_numpy()
display(Markdown(
    f"**Data.** {code(data)}: {len(manifest):,} images of {manifest['patient_id'].nunique():,} patients. "
    f"**Backbones** ({len(backbone_list)}): " + ", ".join(f"{code(b)}" for b in backbone_list) + "."
))

# what the analyses need: a two-class label (several patients per class) and, for the grid, train and test rows
# (a column the loader filled in, such as split 'unspecified', counts as missing)
observed = manifest.drop(columns=manifest.attrs.get("filled_columns") or [])
label_need = unmet_need(observed, binary="label", min_per_class=5, groups="patient_id")
grid_need = label_need or unmet_need(observed, splits=["train", "test"])
if label_need is None:
    classes, y = class_codes(manifest["label"].to_numpy(dtype=object))
    names = ["normal", "pneumonia"] if is_phantom and classes == [0, 1] else [str(c) for c in classes]
    display(Markdown(f"**Label.** Positive class (1): {code(names[1])}; negative (0): {code(names[0])}."))
if grid_need is None:
    try:
        assignment, provenance = protocol.protocol_splits(manifest["split"], y, groups=groups, random_state=seed)
    except DataError as exc:  # a split name other than train/val/test, or one class in a partition
        grid_need = str(exc)
run_grid, run_partitions = grid_need is None, label_need is None
if run_grid:
    manifest_p = manifest.assign(split=assignment, label=y)
    counts = pd.crosstab(pd.Series(assignment, name="partition"),
                         pd.Series(np.asarray(names, dtype=object)[y], name="label"))
    display(Markdown(f"**Partitions.** {provenance}."))
    display(counts)

# %% [markdown]
# ## The grid
#
# Each backbone is used two ways. **Frozen**: its embeddings are cached and
# a logistic-regression probe is fitted on the training rows (regularisation
# chosen by patient-grouped cross-validation inside them). **Fine-tuned**:
# the whole network plus a linear head is trained on the same rows with a
# short CPU schedule (a few epochs at the images' size). An ONNX network
# can only be used frozen. Each model is run with each seed (the probe's
# inner folds; the fine-tuning's initialisation of the head and data order).
#
# Every threshold rule is then fitted on the **validation** rows: a fixed
# 0.5; {ref}`Youden's J <glossary-youden>`; the F1 maximum; the largest threshold with sensitivity
# ≥ 0.9; and the threshold whose positive rate matches the training
# prevalence. Every metric is computed on the **official test split** with
# a 95 % patient-grouped bootstrap interval.

# %% tags=["hide-input"]
embedded = backbone_list if run_grid else [reported_backbone] if run_partitions else []
embeddings = embed_models(manifest, {spec: loadable[spec] for spec in embedded}, device=device) if embedded else {}
if skips.check("the protocol grid (backbones x training policies x threshold rules)", grid_need):
    frames, tuned_from = [], []
    for spec in backbone_list:
        for s in seed_list:
            prob, C = protocol.linear_probe(embeddings[spec], y, assignment, groups=groups, random_state=s)
            frames.append(pd.DataFrame({"backbone": spec, "policy": "frozen", "seed": s,
                                        "image_id": manifest["image_id"].astype(str), "patient_id": groups,
                                        "split": assignment, "y_true": y, "prob": prob}))
        for s in seed_list:
            try:
                tuned = finetune_classifier(manifest_p, loadable[spec], epochs=int(finetune_epochs), random_state=s,
                                            device=device)
            except ModelError as exc:  # an ONNX graph cannot be trained: frozen only
                skips.check(f"the fine-tuned policy of {spec}", str(exc))
                break
            frames.append(tuned.assign(backbone=spec, policy="finetuned", seed=s, patient_id=groups)[frames[0].columns])
            tuned_from.append(tuned.attrs.get("source", "trained"))
    predictions = pd.concat(frames, ignore_index=True)
    predictions.to_csv(results / "predictions.csv", index=False)
    grid = protocol.protocol_grid(predictions, n_resamples=int(n_resamples), random_state=seed)
    grid.to_csv(results / "grid.csv", index=False)
    policies = [p for p in ("frozen", "finetuned") if p in set(predictions["policy"])]
    frozen_only = [b for b in backbone_list if not (predictions[predictions.backbone == b].policy == "finetuned").any()]
    display(Markdown(
        f"{predictions.groupby(['backbone', 'policy', 'seed']).ngroups} models, {len(grid):,} grid cells "
        f"({grid['rule'].nunique()} threshold rules x {grid['metric'].nunique()} metrics per model). "
        + "".join(f"Frozen only: {code(spec)}. " for spec in frozen_only)
        + (f"Of the {len(tuned_from)} fine-tuned models, {tuned_from.count('shipped')} were read from the "
           "fine-tuning results that ship with crslib (a recorded run of this chapter with the same backbone "
           f"weights, images, labels and schedule), {tuned_from.count('cache')} from this machine's cache, and "
           f"{tuned_from.count('trained')} were trained in this run." if tuned_from else "")
    ))
    if reported_policy not in set(predictions[predictions.backbone == reported_backbone].policy):
        display(Markdown(f"The reported backbone {code(reported_backbone)} has no {esc(reported_policy)} model; "
                         "its frozen one is reported instead."))
        reported_policy = "frozen"

# %% [markdown]
# ## Frozen vs fine-tuned, backbone by backbone
#
# Test AUROC with its 95 % interval (mean over seeds). The order of the
# backbones and the gap between the two policies are the two effects the
# paper compares.

# %% tags=["hide-input"]
show_policies = skips.check("the comparison of frozen and fine-tuned backbones", grid_need)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Test AUROC (95% patient-grouped bootstrap CI) of each backbone, frozen and fine-tuned, on the chapter's data (by default the Kermany-like phantom).", "name": "fig-04-6"}, "image": {"alt": "Dot plot with intervals of test AUROC per backbone and training policy"}}
if show_policies:
    head = protocol.headline_table(grid, rule=reported_rule).reset_index()
    head["backbone"] = head["backbone"].map(short)
    order = head[head.policy == "frozen"].sort_values("auroc")["backbone"].tolist()
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(order) + 1.2))
    for offset, (policy, colour) in zip((-0.15, 0.15), (("frozen", "#4c72b0"), ("finetuned", "#dd8452"))):
        part = head[head.policy == policy].set_index("backbone").reindex(order).dropna(subset=["auroc"])
        if part.empty:
            continue
        ypos = np.array([order.index(b) for b in part.index]) + offset
        plots.interval_dots(part["auroc"], part["auroc_low"], part["auroc_high"], positions=ypos, ax=ax, color=colour,
                            label=policy)
    ax.set_yticks(range(len(order)), order)
    ax.set_xlabel("test AUROC (95% patient-grouped bootstrap CI)")
    ax.legend(frameon=False, loc="lower right")
    ax.set_title(f"Backbone x training policy on {on_data}", fontsize=10)
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if run_grid:
    table = head.set_index(["backbone", "policy"])[list(metrics.METRICS)].round(3)
    table.to_csv(results / "headline_by_backbone.csv")
    display(plots.reader_table(table))
    frozen_auc = head[head.policy == "frozen"].set_index("backbone")["auroc"]
    tuned_auc = head[head.policy == "finetuned"].set_index("backbone")["auroc"]
    change = (tuned_auc - frozen_auc.reindex(tuned_auc.index)).dropna()
    display(Markdown(
        f"Frozen test AUROC ({reported_rule} rule, mean over seeds) runs from {frozen_auc.min():.3f} "
        f"({code(frozen_auc.idxmin())}) to {frozen_auc.max():.3f} ({code(frozen_auc.idxmax())}). "
        + (f"Fine-tuning changed it by {change.mean():+.3f} on average over {len(change)} backbone(s) "
           f"({change.min():+.3f} to {change.max():+.3f}); higher after fine-tuning for {int((change > 0).sum())} "
           f"of {len(change)}."
           if len(change) else "No backbone was fine-tuned.")
    ))

# %% [markdown]
# ## The decision threshold
#
# The same probabilities, five thresholds fitted on validation: balanced
# accuracy on test for each backbone (first seed). AUROC does not change
# with the threshold; everything a clinician would act on does.

# %% tags=["hide-input"]
show_rules = skips.check("the comparison of threshold rules", grid_need)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Test balanced accuracy of each backbone under five threshold rules fitted on validation.", "name": "fig-04-8"}, "image": {"alt": "Dot plots of balanced accuracy per backbone and threshold rule, frozen and fine-tuned"}}
if show_rules:
    ba = grid[(grid.metric == "balanced_accuracy") & (grid.seed == seed_list[0])].copy()
    ba["backbone"] = ba["backbone"].map(short)
    fig, axes = plt.subplots(1, len(policies), figsize=(5.5 * len(policies), 0.45 * len(order) + 1.6), sharey=True,
                             squeeze=False)
    for ax, policy in zip(axes[0], policies):
        part = ba[ba.policy == policy]
        sns.pointplot(data=part, x="value", y="backbone", hue="rule", order=order, dodge=0.5, linestyle="none",
                      markers="o", ax=ax, legend=(policy == policies[-1]))
        ax.set(xlabel="test balanced accuracy", ylabel="", title=policy)
        ax.set_xlim(min(0.4, ba["value"].min() - 0.02), 1.0)
    axes[0][-1].legend(title="threshold rule (fitted on validation)", fontsize=8, title_fontsize=8, frameon=False,
                       bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if show_rules:
    rule_effect = protocol.effect_summary(grid, factors=("rule",)).iloc[0]
    spread = ba.groupby(["backbone", "policy"])["value"].agg(lambda v: v.max() - v.min())
    widest = spread.idxmax()
    display(Markdown(
        f"Changing the threshold rule moves test balanced accuracy by **{rule_effect.mean_abs_change:.3f}** on "
        "average: the mean absolute change between two rules at one model, the number of the effect summary "
        "below and of the claims page. The widest gap between a model's best and worst rule is "
        f"{spread.max():.3f} ({code(widest[0])}, {esc(widest[1])}, first seed)."
    ))

# %% [markdown]
# ## Effect summary: which choice moves the number most?
#
# For each factor: the mean absolute change of the headline metric when only
# that factor changes and everything else is held fixed (backbone pairs at
# one policy, seed and rule; frozen vs fine-tuned at one backbone, seed and
# rule; threshold rules at one model; seeds at one backbone, policy and
# rule), with the mean range (max - min) within those groups. AUROC for
# backbone, policy and seed; balanced accuracy for the threshold, which
# cannot move AUROC.

# %% tags=["hide-input"]
show_effects = skips.check("the effect summary", grid_need)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Mean absolute change of the headline metric per factor in this run; diamonds: the paper's Kermany values.", "name": "fig-04-10"}, "image": {"alt": "Bar chart of the effect of backbone, policy, threshold rule and seed"}}
if show_effects:
    effects = protocol.effect_summary(grid)
    effects.to_csv(results / "effect_summary.csv", index=False)
    fig, ax = plt.subplots(figsize=(6.5, 3.0))
    labels_ = [f"{r.factor}\n({r.metric.replace('_', ' ')})" for r in effects.itertuples()]
    ax.barh(labels_, effects["mean_abs_change"], color="#4c72b0", label="this run: mean |change|")
    paper_values = effects["paper_value"].astype(float)
    ax.scatter(paper_values, labels_, color="black", marker="D", zorder=3, label="paper (Kermany)")
    ax.set_xlabel("mean absolute change of the headline metric")
    ax.invert_yaxis()
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if run_grid:
    unmeasured = [r.factor for r in effects.itertuples() if not np.isfinite(r.mean_abs_change)]
    display(Markdown(
        "This run: " + "; ".join(
            f"**{r.factor}** {r.mean_abs_change:.3f} {r.metric.replace('_', ' ')} (range {r.mean_range:.3f})"
            for r in effects.itertuples() if np.isfinite(r.mean_abs_change))
        + (f" (not measured, a single level: {', '.join(unmeasured)})" if unmeasured else "")
        + f". The paper's: backbone {paper.value('backbone_spread'):.3f} AUROC, frozen vs fine-tuned "
        f"{paper.value('policy_effect'):.3f} AUROC, threshold {paper.value('threshold_effect'):.3f} balanced accuracy."
    ))
    display(plots.reader_table(effects.drop(columns="paper_text")))

# %% [markdown]
# ## Is fine-tuning's gain real? DeLong's test per backbone
#
# {ref}`DeLong <glossary-delong-test>`'s test compares two correlated AUROCs on the same test images
# (frozen vs fine-tuned, first seed). Images of one patient are not
# independent, so these p-values are optimistic; the grouped bootstrap
# intervals above are the primary uncertainty.

# %% tags=["hide-input"]
if skips.check("DeLong's test of fine-tuned against frozen", grid_need):
    rows = []
    first = predictions[(predictions.seed == seed_list[0]) & (predictions.split == "test")]
    for spec in backbone_list:
        a = first[(first.backbone == spec) & (first.policy == "finetuned")]
        b = first[(first.backbone == spec) & (first.policy == "frozen")]
        if a.empty:
            continue
        test = delong_test(b["y_true"].to_numpy(), a["prob"].to_numpy(), b["prob"].to_numpy())
        rows.append({"backbone": short(spec), "AUROC fine-tuned": test.auc_a, "AUROC frozen": test.auc_b,
                     "difference": test.difference, "95% CI": f"[{test.low:.3f}, {test.high:.3f}]",
                     "p (DeLong)": test.p_value})
    delong = pd.DataFrame(rows, columns=["backbone", "AUROC fine-tuned", "AUROC frozen", "difference", "95% CI",
                                         "p (DeLong)"])
    delong.to_csv(results / "delong_frozen_vs_finetuned.csv", index=False)
    display(plots.reader_table(delong))
    display(Markdown(
        f"Fine-tuned against frozen, first seed, {len(delong)} backbone(s): fine-tuning raised test AUROC for "
        f"{int((delong['difference'] > 0).sum())} and lowered it for {int((delong['difference'] < 0).sum())}; "
        f"DeLong p < 0.05 for {int((delong['p (DeLong)'] < 0.05).sum())}."
        if len(delong) else "No backbone was fine-tuned, so there is nothing to compare."
    ))

# %% [markdown]
# ## Thresholds fitted on validation, evaluated on test
#
# A threshold fitted on validation is a promise about the test data. The
# gap (test - validation) for each rule, averaged over every model:
# sensitivity promised at ≥ 0.9 on validation is the clearest case.

# %% tags=["hide-input"]
show_transfer = skips.check("the validation-to-test transfer of thresholds", grid_need)
if show_transfer:
    transfers = protocol.validation_to_test(predictions, what="threshold")
    transfers.to_csv(results / "threshold_transfer.csv", index=False)
    gap = transfers.pivot_table(index="rule", columns="metric", values="gap", aggfunc="mean").reindex(
        metrics.THRESHOLD_RULES)
    display(plots.reader_table(gap))

# %% tags=["hide-input"]
if show_transfer:
    worst = gap.stack().idxmin()
    fitted_gaps = protocol.transfer_gaps(transfers)
    display(Markdown(
        f"Mean gap (test - validation) over every model: the sensitivity promised by the sensitivity ≥ 0.9 rule "
        f"changes by {gap.loc['sensitivity_0.9', 'sensitivity']:+.3f} on test; the most negative gap is "
        f"{worst[1].replace('_', ' ')} under the {worst[0]} rule ({gap.loc[worst]:+.3f}). Over the "
        f"{len(fitted_gaps)} thresholds fitted on validation (every model and rule but the fixed 0.5), test "
        f"balanced accuracy differs from validation by **{fitted_gaps.mean():.3f}** on average in absolute terms: "
        "the validation-to-test gap the claims page tests."
    ))

# %% [markdown]
# ## Calibration, fitted on validation, applied to test
#
# {ref}`Expected calibration error <glossary-ece>` (10 equal-width and 10 equal-mass bins) and
# the Brier score on the test split, before and after {ref}`temperature <glossary-temperature-scaling>` and {ref}`Platt <glossary-platt-scaling>`
# scaling fitted on the validation rows.

# %% tags=["hide-input"]
show_calibration = skips.check("the validation-to-test transfer of calibration", grid_need)
if show_calibration:
    calibration = protocol.validation_to_test(predictions, what="calibration")
    calibration.to_csv(results / "calibration_transfer.csv", index=False)
    cal_summary = calibration.groupby(["policy", "method"])[
        ["ece_uniform_before", "ece_uniform_after", "ece_quantile_before", "ece_quantile_after", "brier_before",
         "brier_after"]
    ].mean()
    display(plots.reader_table(cal_summary, labels={
        "ece_uniform_before": "ECE before (equal-width bins)", "ece_uniform_after": "ECE after (equal-width bins)",
        "ece_quantile_before": "ECE before (equal-mass bins)", "ece_quantile_after": "ECE after (equal-mass bins)",
        "brier_before": "Brier before", "brier_after": "Brier after"}))
    cal_method = cal_summary.xs(calibration_method, level="method")
    worse = [policy for policy, r in cal_method.iterrows() if r.ece_uniform_after > r.ece_uniform_before]
    n_models = max(predictions.groupby(["backbone", "policy", "seed"]).ngroups, 1)
    n_val = int((predictions["split"] == "val").sum() / n_models)
    display(Markdown(
        "Mean ECE (equal-width bins) on test before → after validation-fitted "
        f"{esc(calibration_method)} scaling: " + "; ".join(
            f"{policy} {r.ece_uniform_before:.3f} → {r.ece_uniform_after:.3f}" for policy, r in cal_method.iterrows())
        + ". " + (f"For the {' and '.join(esc(w) for w in worse)} model(s) calibration made the test ECE **worse**: "
                  f"the scaling was fitted on {n_val} validation images per model, and what it learned there does "
                  "not hold on a test split drawn differently. This is the study's point that a calibration "
                  "fitted on validation transfers imperfectly; report where it was fitted and check it on test."
                  if worse else "Here the validation-fitted scaling lowered the test ECE for every policy.")))

# %% tags=["hide-input"]
if show_calibration:
    fits = protocol.calibration_excess(calibration)
    display(Markdown(
        f"Over all {len(fits)} validation-fitted calibrations (both methods, every model), test ECE is "
        f"**{fits['before'].mean():.3f}** before and **{fits['after'].mean():.3f}** after; a perfectly calibrated "
        f"model would show up to {fits['floor'].mean():.3f} on a test set of this size (95th percentile of "
        f"simulated labels), so calibration leaves an excess of **{fits['excess'].mean():+.3f}**: the numbers the "
        "claims page tests."
    ))

# %% tags=["hide-input"]
show_reliability = skips.check("the reliability diagram of the reported model", grid_need)

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Reliability diagram of the reported model on the test split before and after validation-fitted scaling, with bootstrap bands.", "name": "fig-04-16"}, "image": {"alt": "Reliability diagram: observed against predicted probability"}}
if show_reliability:
    rep = predictions[(predictions.backbone == reported_backbone) & (predictions.policy == reported_policy)
                      & (predictions.seed == seed_list[0])]
    val, test = rep[rep.split == "val"], rep[rep.split == "test"]
    calibrator = metrics.fit_calibrator(val["y_true"], val["prob"], method=calibration_method)
    curves = pd.concat([
        metrics.reliability_curve(test["y_true"], test["prob"], groups=test["patient_id"], n_resamples=200,
                                  random_state=seed).assign(curve="before"),
        metrics.reliability_curve(test["y_true"], calibrator.transform(test["prob"]), groups=test["patient_id"],
                                  n_resamples=200, random_state=seed).assign(curve=f"after {calibration_method} scaling"),
    ])
    fig, ax = plt.subplots(figsize=(4.6, 4.4))
    plots.reliability_diagram(curves, ax=ax, label_col="curve")
    ax.set_title(f"{short(reported_backbone)}, {reported_policy}: test split", fontsize=10)
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if show_reliability:
    rep_cal = calibration[(calibration.backbone == reported_backbone) & (calibration.policy == reported_policy)
                          & (calibration.seed == seed_list[0])].set_index("method")
    display(Markdown(
        f"{code(reported_backbone)}, {esc(reported_policy)}, seed {seed_list[0]}: test ECE "
        f"{rep_cal.loc[calibration_method, 'ece_uniform_before']:.3f} before and "
        f"{rep_cal.loc[calibration_method, 'ece_uniform_after']:.3f} after {esc(calibration_method)} scaling."
    ))

# %% [markdown]
# ## One split hides another source of uncertainty
#
# The official test split is one draw. Re-partitioning all patients
# (train / validation / test, grouped by patient) several times and
# repeating the frozen probe of the reported backbone shows how much the
# number moves with the split alone.

# %% tags=["hide-input"]
parts = None
if skips.check("the repeated partitions", label_need):
    try:
        parts = protocol.repeated_partitions(embeddings[reported_backbone], y, groups=groups,
                                             n_partitions=int(n_partitions), rule=reported_rule, random_state=seed)
    except DataError as exc:  # too few patients of a class for every partition to hold both
        skips.check("the repeated partitions", str(exc))
if parts is not None:
    parts.to_csv(results / "repeated_partitions.csv", index=False)
    official_auc = (float(head.set_index(['backbone', 'policy']).loc[(short(reported_backbone), 'frozen'), 'auroc'])
                    if run_grid else None)
    official = (f" On the official split (frozen): {official_auc:.3f}." if official_auc is not None
                else " There is no official split to compare with.")
    if official_auc is not None and official_auc < parts["auroc"].min():
        official += (f" The official test split scores {parts['auroc'].min() - official_auc:.3f} below the lowest "
                     "re-drawn partition: it is harder than a random draw of the same patients, which is what "
                     "a test split from another acquisition batch looks like (chapter 05 measures that shift "
                     "directly). A headline from the official split and one from a random split are not the "
                     "same number.")
    elif official_auc is not None and official_auc > parts["auroc"].max():
        official += (" The official split scores above every re-drawn partition: it is easier than a random "
                     "draw of the same patients.")
    elif official_auc is not None:
        official += " It lies within the range of the re-drawn partitions: here the official draw is a typical one."
    display(Markdown(
        f"{code(reported_backbone)}, frozen. AUROC over {len(parts)} partitions: {parts['auroc'].min():.3f}-"
        f"{parts['auroc'].max():.3f} (SD {parts['auroc'].std():.3f}); balanced accuracy "
        f"{parts['balanced_accuracy'].min():.3f}-{parts['balanced_accuracy'].max():.3f}." + official
    ))
    display(plots.reader_table(parts))

# %% [markdown]
# ## What this run records for the reporting checklist
#
# The checklist notebook reads these fields; an item this notebook did not
# measure stays missing there.

# %% tags=["hide-input"]
evidence_need = grid_need or (None if parts is not None else "the repeated partitions did not run")
if skips.check("the checklist evidence of the protocol study", evidence_need):
    evidence = protocol.checklist_evidence(
        grid, effects, predictions=predictions, calibration=calibration, transfers=transfers, partitions=parts,
        reported={"backbone": reported_backbone, "policy": reported_policy, "seed": seed_list[0], "rule": reported_rule,
                  "backbones": backbone_list, "seeds": seed_list},
        calibration_method=calibration_method, finetune_epochs=finetune_epochs, provenance=provenance,
        n_resamples=n_resamples, source="04_protocol_sensitivity")
    (results / "evidence.json").write_text(json.dumps(evidence, indent=2))
    display(Markdown(f"Recorded checklist evidence for: {', '.join(evidence)}."))

# %% [markdown]
# ## What this run shows
#
# Each claim of the study that this chapter measures, with this run's number
# and the verdict of a decision rule fixed before the run (`crslib.claims`;
# the [claims at a glance](claims.md) page has the whole run's ledger).

# %% tags=["hide-input"]
display(HTML(claims.build_ledger(results.parent).chapter_html("04")))

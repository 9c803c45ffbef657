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
# # Does the choice of encoder change the conclusion?
#
# Studies that build on a pretrained image encoder usually pick one and
# treat it as an implementation detail. Study 3 treats it as a source of
# model uncertainty: plausible encoders map the same images into different
# spaces, no encoder is best on every task, and a gain measured on one fixed
# split can vanish on another. The workflow it recommends, which the public
# LOOKAGAIN-ML software implements for ten frozen encoders (the study's
# settings: PCA to 128 dimensions fitted on the outer training set, 2,000
# bootstrap repetitions, {ref}`feature union <glossary-feature-union>` only through nested validation
# selection):
#
# 1. benchmark several plausible encoders under **common dimension control**
#    (standardise, then PCA to a shared dimension, fitted on training rows
#    only) with several heads (linear, k-nearest neighbours, a small MLP);
# 2. add candidates that **combine encoders**: three at the level of their
#    predictions ({ref}`average, greedy average, stack <glossary-stack>`),
#    built from each encoder's linear head (the *average* of all encoders'
#    predictions; a *greedy* average that adds encoders one at
#    a time while the validation loss falls; a linear *stack* fitted on
#    out-of-fold predictions for the training rows, so validation rows never
#    reach it), and the {ref}`feature union <glossary-feature-union>` of the
#    best encoders' features;
# 3. **select on a {ref}`locked validation <glossary-locked-validation>` partition**, never on test, by a
#    {ref}`proper score <glossary-proper-score>` (log loss for classification, mean squared or absolute
#    error for regression), with a stated tie rule: candidates whose loss is
#    within the bootstrap noise of the best single encoder's count as tied,
#    and of those the simplest is kept (a single encoder before a
#    combination, a linear head before kNN before the MLP);
# 4. accept a combination only with **evidence**: its paired,
#    patient-grouped bootstrap gain over the best single encoder on
#    validation must have a lower confidence bound above 0. This guard is
#    crslib's own: the study's software selects the lowest validation loss,
#    and the study reports that repeated partitions revealed an unstable
#    feature union (for the racehorse task);
# 5. **refit** the selected candidate on train + validation before it meets
#    the test partition (as the study's software does), and report it beside
#    the same candidate fitted on the training rows only;
# 6. report **paired** uncertainty (every candidate against the selected one
#    on the same test resamples) and **split-level** uncertainty (the whole
#    workflow repeated on re-drawn patient-grouped partitions; the study's
#    software uses 12 repeated partitions, and so does this notebook's
#    `n_partitions` default; the setup line gives this run's number).
#
# With the default parameters the workflow runs on the phantom with the
# model zoo, the two {ref}`public models <glossary-public-models>` (ImageNet
# EfficientNet-Lite0, and Open-NSFW: an ImageNet ResNet-50 fine-tuned to detect
# NSFW images) and a randomly initialised network, for two classification tasks and one
# regression task; the line below the setup says which data, encoders and
# tasks this run used. Each task is a manifest column: a two-class column
# (numbers or text) is a binary classification task, scored by
# {ref}`AUROC <glossary-auroc>`; a text column with more classes, or an
# integer column with 3 to 20 values, a multi-class task, scored by the
# macro one-vs-rest AUROC (each class against the rest, averaged over the
# classes) and the {ref}`balanced accuracy <glossary-balanced-accuracy>`; any other numeric column a
# regression task, scored by R². These scores are reported; the selection
# itself uses the loss named in the setup line. The numbers are this run's.
#
# *Terms used in this chapter*, defined in the {doc}`glossary <../glossary>`: {ref}`locked validation <glossary-locked-validation>`, {ref}`feature union <glossary-feature-union>`, {ref}`average, greedy average and stack <glossary-stack>`, {ref}`proper score <glossary-proper-score>`, {ref}`AUROC <glossary-auroc>`, {ref}`balanced accuracy <glossary-balanced-accuracy>`, {ref}`ECE <glossary-ece>`.

# %% tags=["parameters"]
data = "phantom?patients=300&size=64&seed=1"  # other patients than the zoo trained on (zoo_data, seed 0)
strict = False  # True: stop at the first file that is not a readable image (default: leave it out, list it)
zoo_data = "phantom?patients=600&size=64&seed=0"
zoo_preset = "default"
zoo_weights = "shipped"  # shipped: the zoo trained once and shipped with crslib; retrain: trained anew here
public_size = 64
encoders = ("zoo:supervised_multilabel-cnn_small-seed0,zoo:contrastive-cnn_small-seed0,"
            "zoo:masked_image_modelling-cnn_small-seed0,zoo:autoencoder-cnn_small-seed0,"
            "zoo:supervised_multilabel-cnn_wide-seed0,public:efficientnet_lite0,public:open_nsfw,"
            "zoo:random_init-cnn_small-seed0")
tasks = "label,finding_cardiomegaly,age"
n_components = 128
n_partitions = 12
n_resamples = 2000
loss = "auto"  # selection loss: auto (log loss for classes, mse for regression), or mse / mae (regression tasks only)
seed = 0
device = "auto"  # where models compute: auto (a GPU when torch sees one), cpu, cuda, mps
results_dir = "results/06_representation_risk"

# %% tags=["hide-input"]
import html
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import HTML, Markdown, display

import crslib  # noqa: F401 - its import sets up torch and timm once, before any encoder
from crslib import claims, paper, plots, risk, risk_results, risk_select
from crslib.data import drop_unreadable, load_data
from crslib.embed import embed_models
from crslib.errors import InputError
from crslib.models.lineup import resolve_models
from crslib.needs import unmet_need
from crslib.reports import render_risk_html
from crslib.risk_needs import task_need
from crslib.runner import SkipLog

results = Path(results_dir)
plots.set_reader_display()
results.mkdir(parents=True, exist_ok=True)
skips = SkipLog(results)
requested_tasks = list(dict.fromkeys(t.strip() for t in tasks.split(",") if t.strip()))


def short(spec: str) -> str:
    return spec.split(":", 1)[-1].replace("-cnn_", " cnn_").replace("-seed0", "")


def code(text):
    """A task, encoder or class name, shown literally."""
    return f"<code>{html.escape(str(text))}</code>"


manifest, _ = drop_unreadable(load_data(data), strict=strict)  # chapter 01 lists the files left out
on_phantom = str(data).startswith("phantom")
# the zoo is trained (or reused) only when a zoo: encoder is listed, on zoo_data, never on data
lineup = resolve_models(encoders, zoo_data=zoo_data, zoo_preset=zoo_preset,
                        zoo_weights=zoo_weights, public_size=int(public_size),
                        device=device)
names = {name: short(name) for name in lineup.names}
if len(set(names.values())) < len(names):  # two encoders with the same short name keep their full names
    names = {name: name for name in lineup.names}
groups = manifest["patient_id"].to_numpy()
task_list = []
if skips.check(
    "the encoder selection",
    None if len(names) >= 2 else (f"it chooses between encoders, and one is listed ({lineup.names[0]}); list at "
                                  "least two (`crs book --models A,B`, or the encoders parameter)"),
):
    for task in requested_tasks:
        reason = unmet_need(manifest, columns=[task]) or task_need(
            manifest[task], groups=groups, n_partitions=int(n_partitions), random_state=seed, name=task)
        if skips.check(f"the {task} task", reason):
            task_list.append(task)
    skips.check("the rest of this chapter",
                None if task_list else f"none of the tasks ({', '.join(requested_tasks) or 'none given'}) can "
                                       "run on this data (see above); name a usable column in the tasks parameter")
outcomes, known = {}, {}
if task_list:
    embeddings = {names[name]: X for name, X in
                  embed_models(manifest, {name: lineup.specs[name] for name in lineup.names}, device=device).items()}
    for task in list(task_list):
        known[task] = manifest[task].notna().to_numpy()  # images without a value for the task are left out
        try:
            outcomes[task] = risk.representation_risk(
                {name: X[known[task]] for name, X in embeddings.items()}, manifest[task].to_numpy()[known[task]],
                groups=groups[known[task]], n_components=int(n_components), n_partitions=int(n_partitions),
                n_resamples=int(n_resamples), loss=loss, random_state=seed,
            )
        except InputError as exc:
            if loss == "auto":  # with the default loss an input error is not the loss's: let it surface
                raise
            # as with `crs risk --loss`, the loss applies to every task: one it cannot score is skipped
            skips.check(f"the {task} task", str(exc))
            task_list.remove(task)
            continue
        outcomes[task].save(results, name=task)  # risk_<task>.json and the tables, as `crs risk` writes them
    if outcomes:
        (results / "risk.html").write_text(render_risk_html(outcomes), encoding="utf-8")  # as `crs risk` writes it


def metric_name(name):
    """A metric as readers see it (e.g. macro_auroc -> macro AUROC, one-vs-rest)."""
    return plots.COLUMN_LABELS.get(name, name)


def describe(task):
    outcome = outcomes[task]
    classes = outcome.settings["classes"]
    parts = [outcome.task]
    if outcome.task_type == "multiclass":
        shown = ", ".join(code(c) for c in classes[:6]) + (", ..." if len(classes) > 6 else "")
        parts.append(f"{len(classes)} classes: {shown}")
    elif classes and classes != ["0", "1"]:
        parts.append(f"positive class {code(classes[1])} against {code(classes[0])}")
    parts.append(f"{metric_name(outcome.metric)}, selected by {metric_name(outcome.settings['loss'])}")
    missing = int((~known[task]).sum())
    if missing:
        parts.append(f"{missing:,} images without a value left out")
    return f"{code(task)} ({', '.join(parts)})"


if task_list:
    display(Markdown(
        f"{len(manifest):,} images of {manifest['patient_id'].nunique():,} patients; {len(embeddings)} encoders x "
        f"{len(outcomes[task_list[0]].settings['heads'])} heads, the prediction-level combinations "
        + ", ".join(outcomes[task_list[0]].settings["combinations"])
        + " of the encoders' linear heads and a feature union; tasks: "
        + ", ".join(describe(t) for t in task_list)
        + f"; {int(n_partitions)} patient-grouped partitions (60/20/20 % of patients), {int(n_resamples):,} "
        "bootstrap resamples."
    ))

# %% [markdown]
# ## Selection on the locked validation partition
#
# For the first partition, every candidate on the validation rows (test
# labels play no part here): its selection loss (lower is better) with a
# 95 % patient-grouped bootstrap interval; its gap to the best single
# encoder, paired on the same resamples (an interval that reaches 0 means
# *within noise*, a tie that goes to the simpler candidate); for a
# combination, its paired gain over the single encoder with the lowest
# loss, which must have a lower bound above 0 (the evidence rule); and
# why it was or was not chosen.

# %% tags=["hide-input"]
if task_list:
    tables = []
    for task in task_list:
        c = outcomes[task].primary.candidates.copy()
        c["task"] = task
        tables.append(c)
    candidates = pd.concat(tables, ignore_index=True)


def num(v, fmt=".3f"):
    """A number as the page shows it. 'loss' and 'gap' (signed) keep 4 significant digits, never e-notation."""
    if fmt not in ("loss", "gap"):
        return f"{v:{fmt}}"
    sign = "+" if fmt == "gap" else ""
    return f"{v:{sign},.0f}" if abs(v) >= 1000 else f"{v:{sign}.4g}"


def with_ci(v, lo, hi, fmt=".3f"):
    """A value with its interval; an undefined one (every resample lacked a class) as 'undefined'."""
    if not np.isfinite(v):
        return "undefined"
    bounds = f" [{num(lo, fmt)}, {num(hi, fmt)}]" if np.isfinite(lo) and np.isfinite(hi) else ""
    return f"{num(v, fmt)}{bounds}"


def kind_label(kind, members):
    """'single', or the kind of combination with its encoders."""
    return kind if kind == "single" else f"{kind} of {str(members).replace('+', ' + ')}"


def selection_view(selection):
    """The selection table as readers see it: single candidates by loss, then the combinations."""
    order = {k: i for i, k in enumerate(risk_select.KINDS)}
    s = selection.assign(_order=selection["kind"].map(order)).sort_values(["_order", "val_loss"])
    return pd.DataFrame({
        "candidate": s["candidate"],
        "kind": [kind_label(k, m) for k, m in s[["kind", "members"]].to_numpy()],
        "validation loss": [with_ci(*r, fmt="loss")
                            for r in s[["val_loss", "val_loss_low", "val_loss_high"]].to_numpy()],
        "gap to best single": ["best single" if g == lo == hi == 0 else with_ci(g, lo, hi, fmt="gap")
                               for g, lo, hi in s[["gap", "gap_low", "gap_high"]].to_numpy()],
        "gain of the combination": ["" if k == "single" else f"[{num(lo, 'gap')}, {num(hi, 'gap')}]"
                                    for k, lo, hi in s[["kind", "gain_low", "gain_high"]].to_numpy()],
        "chosen": np.where(s["chosen"], "chosen", ""),
        "why": s["why"],
    })


def selection_sentence(task):
    p = outcomes[task].primary
    s = p.selection
    row = s[s["chosen"]].iloc[0]
    combos = s[s["kind"] != "single"]
    near = int(s.loc[s["kind"] == "single", "within_noise"].sum())
    kind = ("a single encoder" if row["kind"] == "single"
            else f"a combination ({html.escape(kind_label(row['kind'], row['members']))})")
    backed = combos.loc[combos["evidence"], "candidate"]
    return (f"**{code(task)}**: selected {code(p.selected)}, {kind}, validation {metric_name(p.loss)} "
            f"{with_ci(row['val_loss'], row['val_loss_low'], row['val_loss_high'], fmt='loss')}: "
            f"{html.escape(str(row['why']))}. {near} of {int((s['kind'] == 'single').sum())} single candidates "
            f"are within the bootstrap noise of the best one; {int(combos['evidence'].sum())} of {len(combos)} "
            f"combinations have evidence (a validation gain whose lower bound is above 0)"
            + (f": {', '.join(code(c) for c in backed)}" if len(backed) else "") + ".")


for task in task_list:
    selection = outcomes[task].primary.selection
    display(Markdown(f"**{code(task)}** ({outcomes[task].task}): all {len(selection)} candidates of the first "
                     f"partition, selected by validation {metric_name(outcomes[task].primary.loss)}."))
    display(selection_view(selection).style.hide(axis="index").format(escape="html"))
    display(Markdown(selection_sentence(task)))

# %% [markdown]
# ## The selected candidate on test: fitted on train, refitted on train + validation
#
# Only now are test labels read. The selected candidate is scored twice on
# the same test partition: as fitted on the training rows (the fit the
# validation partition judged) and refitted on train + validation (what
# the study's software reports: the locked choice, refitted on all
# non-test rows). Below, the study's metric panel for both fits, each with
# a 95 % patient-grouped bootstrap interval.

# %% tags=["hide-input"]
FITS = {"train": "fitted on train", "train+validation": "refitted on train + validation"}


def panel_view(metrics):
    """Metric rows x fit columns, each cell 'value [low, high]'."""
    cells = metrics.assign(cell=[with_ci(*r) for r in metrics[["value", "low", "high"]].to_numpy()],
                           metric=metrics["metric"].map(metric_name))
    table = cells.pivot(index="metric", columns="fit", values="cell")
    table = table.reindex(index=list(dict.fromkeys(cells["metric"])), columns=[f for f in FITS if f in table.columns])
    return table.rename(columns=FITS).rename_axis(index=None, columns=None)


def refit_sentence(task):
    p = outcomes[task].primary
    fits = p.refit.set_index("fit")
    metric = metric_name(p.metric)
    parts = [f"{metric} {with_ci(*fits.loc[f, ['test_score', 'test_low', 'test_high']])} {FITS[f]} "
             f"({int(fits.loc[f, 'n_fit']):,} images)" for f in FITS if f in fits.index]
    change = ""
    if set(FITS) <= set(fits.index):
        delta = fits.loc["train+validation", "test_score"] - fits.loc["train", "test_score"]
        change = f"; the refit changes it by {delta:+.3f}"
    return (f"**{code(task)}**, {code(p.selected)} on {p.test_idx.size:,} test images: " + ", ".join(parts)
            + change + ".")


for task in task_list:
    display(Markdown(f"**{code(task)}**: the study's metrics of {code(outcomes[task].primary.selected)} on test."))
    display(panel_view(outcomes[task].primary.metrics).style.format(escape="html"))
    display(Markdown(refit_sentence(task)))

# %% tags=["hide-input"]
if task_list:
    def refitted(task, metric):
        m = outcomes[task].primary.metrics
        row = m[(m["fit"] == "train+validation") & (m["metric"] == metric)]
        return float(row["value"].iloc[0]) if len(row) else float("nan")

    study = {"regression": ("r2", paper.value("houses_selected_r2"), "house prices"),
             "binary": ("accuracy", paper.value("pneumonia_selected_accuracy"), "pneumonia")}
    compared = []
    for task in task_list:
        if outcomes[task].task_type in study:
            metric, reported, where = study[outcomes[task].task_type]
            ours = refitted(task, metric)
            if np.isfinite(ours):
                side = "above" if ours > reported else "below" if ours < reported else "equal to"
                compared.append(f"{code(task)} {metric_name(metric)} {ours:.3f}, {side} the study's {reported:.3f} "
                                f"({where})")
    display(Markdown(
        "The study reports, for the procedure it selected on locked validation data and refitted, test "
        f"{metric_name('r2')} {paper.value('houses_selected_r2'):.3f} on house prices (a linear stack of encoders' "
        f"predictions) and accuracy {paper.value('pneumonia_selected_accuracy'):.3f} on pneumonia. "
        + (f"This run's refitted choice: {'; '.join(compared)}. " if compared else "")
        + "The levels are not expected to agree: the study used large pretrained encoders on photographs and "
        "radiographs, this run uses the encoders and images named in the setup line, so only the procedure is "
        "the same. What carries over is the comparison of the two fits and the width of the intervals."
    ))

# %% [markdown]
# ## What was left out
#
# Nothing is dropped silently. A bootstrap resample of validation or test
# patients that lacks a class leaves a classification metric undefined; it
# is left out of that interval and counted here. A combination that cannot
# be built in a partition (a greedy average that keeps one encoder is that
# encoder; a stack needs inner folds) is not a candidate there, with the reason.

# %% tags=["hide-input"]
def dropped_sentence(task):
    d = outcomes[task].dropped
    n_parts = len(outcomes[task].partitions)
    parts, resamples = [], []
    for part in ("validation", "test"):
        rows = d[d["part"] == part]
        n, total = int(rows["n_dropped"].sum()), int(rows["n_resamples"].sum())
        if n:
            resamples.append(f"{n:,} of {total:,} {part} resamples ({n / total:.1%})")
    if resamples:
        parts.append(" and ".join(resamples) + " lacked a class and were left out of the "
                     f"{metric_name(outcomes[task].metric)} intervals")
    fit = d[d["part"] == "fit"]
    for candidate, rows in fit.groupby("candidate", sort=False):
        reasons = list(dict.fromkeys(rows["reason"]))
        parts.append(f"{code(candidate)} was not built in {rows['partition'].nunique()} of {n_parts} partitions ("
                     + "; ".join(html.escape(r) for r in reasons[:3]) + ("; ..." if len(reasons) > 3 else "") + ")")
    where = f"over the {n_parts} partitions" if n_parts > 1 else "in the one partition"
    return f"**{code(task)}**, {where}: " + ("; ".join(parts) if parts else "nothing was dropped") + "."


if task_list:
    display(Markdown("\n\n".join(dropped_sentence(t) for t in task_list)))

# %% [markdown]
# ## Is the best encoder the same for every task?
#
# Each encoder's test score with its validation-best head (the head with
# the lowest validation loss), on the first partition, fitted on the
# training rows, ranked within each task (1 = best). If one encoder were
# best everywhere, its column would be all ones. The combinations are left
# out here: the question is about the encoders.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Test score and rank of each encoder (its validation-best head) for each task, first partition.", "name": "fig-06-6"}, "image": {"alt": "Heatmap of encoder ranks per task"}}
if task_list:
    best = (candidates[candidates["kind"] == "single"]  # the combinations are not an encoder's
            .sort_values(["val_loss", "candidate"])
            .groupby(["task", "encoder"], as_index=False).first())
    scores = best.pivot(index="task", columns="encoder", values="test_score").reindex(task_list)
    ranks = scores.rank(axis=1, ascending=False).astype(int)
    fig, ax = plt.subplots(figsize=(1.1 * len(scores.columns) + 2.5, 0.6 * len(task_list) + 1.6))
    sns.heatmap(ranks, annot=scores.round(2).astype(str) + "\n#" + ranks.astype(str), fmt="", cmap="viridis_r",
                cbar_kws={"label": "rank on test (1 = best)"}, ax=ax, annot_kws={"fontsize": 8})
    ax.set(xlabel="", ylabel="")
    ax.set_xticklabels(ax.get_xticklabels(), rotation=35, ha="right", fontsize=8)
    ax.set_title("Test score (AUROC, macro AUROC or R²) and rank per task, first partition", fontsize=10)
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if task_list:
    winners = ranks.idxmin(axis=1)
    scores.to_csv(results / "best_head_test_scores.csv")
    where = "the phantom" if on_phantom else "this data"
    if len(task_list) == 1:
        task = task_list[0]
        verdict = (f"On {code(task)}, the only task of this run, {code(winners[task])} ranks first (test "
                   f"{metric_name(outcomes[task].metric)} {scores.loc[task, winners[task]]:.3f}, then "
                   + ", ".join(f"{code(e)} {v:.3f}" for e, v in scores.loc[task].drop(winners[task])
                               .sort_values(ascending=False).head(3).items())
                   + "). Whether the best encoder changes with the task needs a second task.")
    elif winners.nunique() > 1:
        verdict = ("The best encoder differs between tasks: "
                   + "; ".join(f"{code(t)}: {html.escape(str(w))}" for t, w in winners.items()) + ".")
    else:
        verdict = (f"On this run the same encoder ({html.escape(str(winners.iloc[0]))}) is best on every task; "
                   f"{where} does not show the study's 'no encoder is best everywhere' on this split. The repeated "
                   "partitions below show how stable that is.")
    display(Markdown(verdict))

# %% [markdown]
# ## Paired comparisons against the selected candidate
#
# On the same test bootstrap resamples: the difference of each candidate's
# score from the selected one's, its 95 % interval and the share of
# resamples in which the candidate is better. An interval that covers 0
# means the data cannot tell the two apart.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Paired test differences of each linear-head candidate (single encoders and combinations) from the selected candidate, with 95% CIs.", "name": "fig-06-8"}, "image": {"alt": "Dot plots with intervals of score differences from the selected candidate"}}
if task_list:
    rows = []
    for task in task_list:
        comp = outcomes[task].primary.comparisons.copy()
        comp["task"] = task
        comp["selected"] = outcomes[task].primary.selected
        rows.append(comp)
    comparisons = pd.concat(rows, ignore_index=True)
    comparisons.to_csv(results / "paired_comparisons.csv", index=False)
    fig, axes = plt.subplots(1, len(task_list), figsize=(4.2 * len(task_list), 4.2), sharey=False, squeeze=False)
    for ax, task in zip(axes[0], task_list):
        comp = comparisons[(comparisons["task"] == task) & (comparisons["head"] == "linear")].sort_values("difference")
        plots.interval_dots(comp["difference"], comp["low"], comp["high"], ax=ax)
        ax.axvline(0, color="grey", linestyle=":")
        ax.set_yticks(range(len(comp)), comp["encoder"], fontsize=7)
        ax.set_xlabel(f"{metric_name(outcomes[task].metric)}: candidate - selected")
        ax.set_title(f"{task}\n(selected: {outcomes[task].primary.selected})", fontsize=9)
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if task_list:
    paired = comparisons.groupby("task", sort=False).apply(
        lambda c: pd.Series({"candidates": len(c), "CI covers 0": int(((c["low"] <= 0) & (c["high"] >= 0)).sum()),
                             "clearly worse": int((c["high"] < 0).sum())}), include_groups=False)
    display(plots.reader_table(paired.sort_index()))
    display(Markdown(
        "Against the selected candidate on the same test resamples: "
        + "; ".join(f"{code(t)} (selected {code(outcomes[t].primary.selected)}): {row['CI covers 0']} of "
                    f"{row['candidates']} candidates cannot be told apart from it (interval covers 0), "
                    f"{row['clearly worse']} {'is' if row['clearly worse'] == 1 else 'are'} clearly worse"
                    for t, row in paired.iterrows())
        + "."
    ))

# %% [markdown]
# ## Split-level uncertainty: repeated partitions
#
# The whole workflow (reduction, heads, combinations, selection with the
# tie and evidence rules) repeated on re-drawn patient-grouped partitions:
# how often each encoder or kind of combination is selected, and how much
# the selected candidate's test score (as fitted on the training rows)
# moves.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "How often each encoder or combination was selected over repeated partitions, and the selected candidate's test score in each partition.", "name": "fig-06-10"}, "image": {"alt": "Bar chart of selection shares and strip plot of test scores"}}
if task_list:
    counts = pd.concat([outcomes[t].selection_counts.assign(task=t) for t in task_list], ignore_index=True)
    counts.to_csv(results / "selection_counts.csv", index=False)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.3, 1]})
    order = list(dict.fromkeys(counts["encoder"]))[::-1]  # encoders, then the combinations, top down
    pivot = (counts.pivot(index="encoder", columns="task", values="share")
             .reindex(index=order, columns=task_list).fillna(0))
    pivot.plot.barh(ax=axes[0], width=0.8)
    axes[0].set(xlabel=f"share of {int(n_partitions)} partitions in which it was selected", ylabel="")
    axes[0].legend(frameon=False, fontsize=8)
    axes[0].tick_params(axis="y", labelsize=8)
    spread = pd.concat([outcomes[t].selected_test_scores.rename("score").reset_index().assign(task=t) for t in task_list])
    sns.stripplot(data=spread, x="task", y="score", ax=axes[1], size=6, jitter=0.1)
    axes[1].set(ylabel="selected candidate's test score", xlabel="", title="one dot per partition")
    fig.tight_layout()
    plt.show()

# %% tags=["hide-input"]
if task_list:
    stability = risk_results.stability_table({t: outcomes[t] for t in task_list})
    stability.to_csv(results / "stability.csv")
    display(plots.reader_table(stability, labels={
        "distinct encoders selected": "distinct choices (encoders or combinations)"}))

    def most_often(task):
        c = counts[counts["task"] == task]
        top = c[c["count"] == c["count"].max()]
        return (" and ".join(code(e) for e in top["encoder"])
                + f" ({int(top['count'].iloc[0])} of {len(outcomes[task].partitions)})")

    def kinds_selected(task):
        chosen = outcomes[task].all_partitions.loc[lambda a: a["selected"], "kind"].value_counts()
        return ", ".join(f"{'a single encoder' if k == 'single' else k} in {int(chosen[k])}"
                         for k in risk_select.KINDS if k in chosen.index)

    def refit_mean(task):
        scores = [float(p.refit.loc[p.refit["fit"] == "train+validation", "test_score"].iloc[0])
                  for p in outcomes[task].partitions if (p.refit["fit"] == "train+validation").any()]
        return np.mean(scores) if scores else float("nan")

    display(Markdown(
        f"Over {int(n_partitions)} partitions: "
        + "; ".join(
            f"{code(t)}: selected most often {most_often(t)}; the choice was {kinds_selected(t)} partitions; "
            f"{row['distinct encoders selected']} distinct "
            f"{'choice' if row['distinct encoders selected'] == 1 else 'choices'}; the selected "
            f"candidate's test {metric_name(outcomes[t].metric)} {row['test score mean']:.3f} on average"
            + (f" (SD {row['test score SD']:.3f}, range {row['test score range']:.3f})"
               if np.isfinite(row["test score SD"]) else "")
            + (f", {refit_mean(t):.3f} on average refitted on train + validation" if np.isfinite(refit_mean(t)) else "")
            for t, row in stability.iterrows())
        + "."
    ))

# %% [markdown]
# ## What to take away
#
# The selected encoder, its test score and even which encoder wins depend on
# the task and on the partition. A study that reports one encoder on one
# split reports one draw of these tables. The workflow above (common
# dimension control; single encoders, prediction-level combinations and a
# feature union as candidates; selection on locked validation data by a
# proper score with a tie rule that prefers the simpler candidate; a
# combination only on validation evidence; refit on train + validation;
# paired and split-level intervals) is one function:
# `crslib.risk.representation_risk`, and one command for your own data and
# encoders: `crs risk --data DATA --models SPEC,SPEC,... --task COLUMN` (add
# `--task-type multiclass`, `binary` or `regression` to override the guess,
# `--loss mae` to select a regression task by mean absolute error). Both
# write the same tables.

# %% [markdown]
# ## What this run shows
#
# Each claim of the study that this chapter measures, with this run's number
# and the verdict of a decision rule fixed before the run (`crslib.claims`;
# the [claims at a glance](claims.md) page has the whole run's ledger).

# %% tags=["hide-input"]
display(HTML(claims.build_ledger(results.parent).chapter_html("06")))

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
# 2. **select on a {ref}`locked validation <glossary-locked-validation>` partition**, never on test;
# 3. **combine encoders** (feature union) only when a paired bootstrap on
#    validation shows a gain whose lower confidence bound is above 0;
# 4. report **paired** uncertainty (every candidate against the selected one
#    on the same test resamples) and **split-level** uncertainty (the whole
#    workflow repeated on re-drawn patient-grouped partitions).
#
# With the default parameters the workflow runs on the phantom with the
# model zoo, two ImageNet networks that ship in Python packages and a
# randomly initialised network, for two classification tasks and one
# regression task; the line below the setup says which data, encoders and
# tasks this run used. Each task is a manifest column: a two-class column
# (numbers or text) is a binary classification task, scored by
# {ref}`AUROC <glossary-auroc>`; a text column with more classes, or an
# integer column with 3 to 20 values, a multi-class task, scored by the
# macro one-vs-rest AUROC (each class against the rest, averaged over the
# classes) and the {ref}`balanced accuracy <glossary-balanced-accuracy>`; any other numeric column a
# regression task, scored by R². The numbers are this run's.
#
# *Terms used in this chapter*, defined in the {doc}`glossary <../glossary>`: {ref}`locked validation <glossary-locked-validation>`, {ref}`feature union <glossary-feature-union>`, {ref}`AUROC <glossary-auroc>`, {ref}`balanced accuracy <glossary-balanced-accuracy>`.

# %% tags=["parameters"]
data = "phantom?patients=300&size=64&seed=0"
zoo_data = "phantom?patients=300&size=64&seed=0"
zoo_preset = "quick"
public_size = 64
encoders = ("zoo:supervised_multilabel-cnn_small-seed0,zoo:contrastive-cnn_small-seed0,"
            "zoo:masked_image_modelling-cnn_small-seed0,zoo:autoencoder-cnn_small-seed0,"
            "zoo:supervised_multilabel-cnn_wide-seed0,public:efficientnet_lite0,public:open_nsfw,"
            "zoo:random_init-cnn_small-seed0")
tasks = "label,finding_cardiomegaly,age"
n_components = 128
n_partitions = 10
n_resamples = 2000
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

import crslib
from crslib import claims, plots, risk, risk_results
from crslib.data import load_data
from crslib.embed import embed_models
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


manifest = load_data(data)
on_phantom = str(data).startswith("phantom")
# the zoo is trained (or reused) only when a zoo: encoder is listed, on zoo_data, never on data
lineup = resolve_models(encoders, zoo_data=zoo_data, zoo_preset=zoo_preset, public_size=int(public_size),
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
    for task in task_list:
        known[task] = manifest[task].notna().to_numpy()  # images without a value for the task are left out
        outcomes[task] = risk.representation_risk(
            {name: X[known[task]] for name, X in embeddings.items()}, manifest[task].to_numpy()[known[task]],
            groups=groups[known[task]], n_components=int(n_components), n_partitions=int(n_partitions),
            n_resamples=int(n_resamples), random_state=seed,
        )
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
    parts.append(metric_name(outcome.metric))
    missing = int((~known[task]).sum())
    if missing:
        parts.append(f"{missing:,} images without a value left out")
    return f"{code(task)} ({', '.join(parts)})"


if task_list:
    display(Markdown(
        f"{len(manifest):,} images of {manifest['patient_id'].nunique():,} patients; {len(embeddings)} encoders x "
        f"{len(risk.HEADS)} heads + a feature-union candidate; tasks: "
        + ", ".join(describe(t) for t in task_list)
        + f"; {int(n_partitions)} patient-grouped partitions (60/20/20 % of patients), {int(n_resamples):,} "
        "bootstrap resamples."
    ))

# %% [markdown]
# ## One partition, every candidate
#
# For the first partition: each candidate's validation score (used to
# select) and test score (reported once, after selection), with 95 %
# patient-grouped bootstrap intervals. The selected candidate is marked.

# %% tags=["hide-input"]
if task_list:
    tables = []
    for task in task_list:
        c = outcomes[task].primary.candidates.copy()
        c["task"] = task
        tables.append(c)
    candidates = pd.concat(tables, ignore_index=True)


def with_ci(v, lo, hi):
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def undefined_note(c, n_resamples):
    """Bootstrap resamples without every class leave the metric undefined: say how many were left out."""
    val, test = int(c["val_undefined"].max()), int(c["test_undefined"].max())
    if not val and not test:
        return ""
    return (f" Of {n_resamples:,} patient-grouped resamples, {val:,} (validation) and {test:,} (test) lack a class; "
            "the metric is undefined on them and they are left out of the intervals (nan when all are).")


for task in task_list:
    c = candidates[candidates.task == task].sort_values("val_rank")
    shown = pd.DataFrame({
        "candidate": c["candidate"] + np.where(c["selected"], "  ← selected", ""),
        f"validation {metric_name(outcomes[task].metric)}": [with_ci(*r) for r in c[["val_score", "val_low", "val_high"]].to_numpy()],
        f"test {metric_name(outcomes[task].metric)}": [with_ci(*r) for r in c[["test_score", "test_low", "test_high"]].to_numpy()],
        f"test {metric_name(outcomes[task].secondary_metric)}": c["test_secondary"].round(3),
    }).head(10)
    union = outcomes[task].primary.union
    display(Markdown(
        f"**{code(task)}** ({outcomes[task].task}); top {len(shown)} of {len(c)} candidates by validation score. "
        f"Feature union of {', '.join(code(m) for m in union.get('members') or [])}: validation gain "
        f"{union.get('gain', float('nan')):.3f} [{union.get('low', float('nan')):.3f}, "
        f"{union.get('high', float('nan')):.3f}]; **{'chosen' if union.get('chosen') else 'not chosen'}** "
        f"({html.escape(str(union.get('reason', '')))})."
        + undefined_note(c, outcomes[task].primary.n_resamples)
    ))
    display(shown.style.hide(axis="index").format(escape="html", precision=3))

# %% [markdown]
# ## Is the best encoder the same for every task?
#
# Each encoder's test score with its validation-best head, on the first
# partition, ranked within each task (1 = best). If one encoder were best
# everywhere, its column would be all ones.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Test score and rank of each encoder (its validation-best head) for each task, first partition.", "name": "fig-06-6"}, "image": {"alt": "Heatmap of encoder ranks per task"}}
if task_list:
    best = (candidates[candidates.encoder != risk.UNION]
            .sort_values("val_score", ascending=False)
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

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Paired test differences of each linear-head candidate from the selected candidate, with 95% CIs.", "name": "fig-06-8"}, "image": {"alt": "Dot plots with intervals of score differences from the selected candidate"}}
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
# The whole workflow (reduction, heads, selection, union decision) repeated
# on re-drawn patient-grouped partitions: how often each encoder is
# selected, and how much the selected candidate's test score moves.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "How often each encoder was selected over repeated partitions, and the selected candidate's test score in each partition.", "name": "fig-06-10"}, "image": {"alt": "Bar chart of selection shares and strip plot of test scores"}}
if task_list:
    counts = pd.concat([outcomes[t].selection_counts.assign(task=t) for t in task_list], ignore_index=True)
    counts.to_csv(results / "selection_counts.csv", index=False)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.3, 1]})
    pivot = counts.pivot(index="encoder", columns="task", values="share").reindex(columns=task_list).fillna(0)
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
    display(plots.reader_table(stability))
    display(Markdown(
        f"Over {int(n_partitions)} partitions: "
        + "; ".join(
            f"{code(t)}: {html.escape(str(row['selected most often']))} selected most often, "
            f"{row['distinct encoders selected']} distinct "
            f"{'encoder' if row['distinct encoders selected'] == 1 else 'encoders'} selected, the selected "
            f"candidate's test {metric_name(outcomes[t].metric)} {row['test score mean']:.3f} on average"
            + (f" (SD {row['test score SD']:.3f}, range {row['test score range']:.3f})"
               if np.isfinite(row["test score SD"]) else "")
            for t, row in stability.iterrows())
        + "."
    ))

# %% [markdown]
# ## What to take away
#
# The selected encoder, its test score and even which encoder wins depend on
# the task and on the partition. A study that reports one encoder on one
# split reports one draw of these tables. The workflow above (common
# dimension control, selection on locked validation data, union only on
# validation evidence, paired and split-level intervals) is one function:
# `crslib.risk.representation_risk`, and one command for your own data and
# encoders: `crs risk --data DATA --models SPEC,SPEC,... --task COLUMN` (add
# `--task-type multiclass`, `binary` or `regression` to override the guess).

# %% [markdown]
# ## What this run shows
#
# Each claim of the study that this chapter measures, with this run's number
# and the verdict of a decision rule fixed before the run (`crslib.claims`;
# the [claims at a glance](claims.md) page has the whole run's ledger).

# %% tags=["hide-input"]
display(HTML(claims.build_ledger(results.parent).chapter_html("06")))

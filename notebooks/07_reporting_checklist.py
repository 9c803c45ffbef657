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
# # The reporting checklist, filled in by this run
#
# Study 2 ends in seven reporting recommendations, each tied to an effect it
# measured on Kermany (the paper's numbers):
#
# 1. **Split provenance and a shift audit**: a {ref}`partition classifier <glossary-partition-classifier>` told the
#    official test split from the training pool at AUC 0.697 (0.898 for
#    normal images).
# 2. **Training policy**: frozen vs fine-tuned moved {ref}`AUROC <glossary-auroc>` by 0.044, more
#    than the 0.026 between eight backbones.
# 3. **Threshold rule and where it was fitted**: the threshold moved
#    {ref}`balanced accuracy <glossary-balanced-accuracy>` by 0.090.
# 4. **Metrics beyond AUROC**, balanced accuracy included.
# 5. **Calibration and where it was fitted**: validation-fitted
#    calibration transferred imperfectly to test.
# 6. **Uncertainty**: CIs, seeds and split-level variation.
# 7. **{ref}`Shortcut <glossary-shortcut>` checks**: a classifier on file properties alone reached
#    0.992 balanced accuracy in the training pool and 0.496 on the test split.
#
# This notebook does not measure anything itself. It reads what the other
# notebooks of this run recorded (`results/*/evidence.json` in the run
# folder), marks each item **complete** only when the run recorded
# everything the item needs, and otherwise **missing** with the reason. Run
# outside a book run (no evidence files), every item is missing, which is
# the honest answer. When a chapter skipped the analyses behind an item
# because the run's data lacked what they need (no train/validation/test
# split, no two-class label...), the page says which items that left
# without evidence and lists the run's skipped analyses. The same checklist
# comes from the command line: `crs checklist runs/<run>`.

# %% tags=["parameters"]
run_dir = "."
results_dir = "results/07_reporting_checklist"

# %% tags=["hide-input"]
import html
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

import crslib
from crslib import plots
from crslib.checklist import build_checklist, crosswalk_frame
from crslib.checklist_items import ITEMS
from crslib.runner import SkipLog, read_run_evidence, read_skips

results = Path(results_dir)
plots.set_reader_display()
results.mkdir(parents=True, exist_ok=True)
skips = SkipLog(results)
evidence, run_id = read_run_evidence(run_dir)
# where the chapters of the run wrote their results (a run folder's results/, or a folder of result folders)
run_results = Path(run_dir) / "results" if (Path(run_dir) / "results").is_dir() else Path(run_dir)
# the chapter that records each item's evidence: the audit items 1 and 7, the protocol study items 2-6
RECORDED_BY = {"split": "05_split_and_shortcut_audit", "shortcut": "05_split_and_shortcut_audit",
               **{item: "04_protocol_sensitivity"
                  for item in ("training_policy", "threshold", "metrics", "calibration", "uncertainty")}}
run_skips = [{"chapter": folder.name, **skip} for folder in sorted(run_results.iterdir())
             if folder.is_dir() and folder.name != results.name for skip in read_skips(folder)]


def cell(text):
    """User-provided text (a skip's analysis or reason) shown literally in a Markdown table cell.

    `code spans` stay code (their text is shown as is); outside them HTML and Markdown are escaped.
    """
    parts = " ".join(str(text).split()).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans
        parts = ["'".join(parts)]
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append("`" + part.replace("|", "\\|") + "`")
        else:
            part = html.escape(part, quote=False)
            for char in "\\*_[]|":
                part = part.replace(char, "\\" + char)
            out.append(part)
    return "".join(out)


checklist = build_checklist(evidence, run_id=run_id)
concerns = [entry for entry in checklist.items if entry.concern]
(results / "checklist.md").write_text(checklist.to_markdown(), encoding="utf-8")
(results / "checklist.json").write_text(checklist.to_json(), encoding="utf-8")
display(Markdown(
    f"Run `{run_id}`: **{checklist.n_complete} of {len(checklist.items)} items complete**"
    + (f" ({len(concerns)} of them with a concern the evidence shows: "
       + "; ".join(f"item {e.number}, {cell(e.concern)}" for e in concerns) + ")" if concerns else "")
    + (f"; evidence recorded for {', '.join(f'`{k}`' for k in evidence)}." if evidence
       else "; no evidence files were found" + (
           "." if any((run_results / chapter).is_dir() for chapter in RECORDED_BY.values())
           else " (run the protocol and audit notebooks in the same run folder)."))
))
frame = checklist.to_frame()

# the items nothing in the run recorded, and why: their chapter skipped its analyses, ran without them, or did not run
unrecorded = [entry for entry in checklist.items if evidence.get(entry.item_id) is None]
reasons = []
for chapter in dict.fromkeys(RECORDED_BY[entry.item_id] for entry in unrecorded):
    entries = [e for e in unrecorded if RECORDED_BY[e.item_id] == chapter]
    items = (f"**{'; '.join(e.title for e in entries)}** (item{'s' if len(entries) > 1 else ''} "
             f"{', '.join(str(e.number) for e in entries)})")
    chapter_skips = [skip for skip in run_skips if skip["chapter"] == chapter]
    if not (run_results / chapter).is_dir():
        why = f"chapter `{chapter}` is not part of this run"
    elif chapter_skips:
        names = [cell(skip["analysis"]) for skip in chapter_skips]
        why = (f"chapter `{chapter}` skipped {len(names)} analys{'es' if len(names) > 1 else 'is'} in this run "
               f"({'; '.join(names[:3])}{f'; and {len(names) - 3} more' if len(names) > 3 else ''}; "
               "the table below gives the reasons)")
    else:
        why = f"chapter `{chapter}` ran but recorded no evidence for {'them' if len(entries) > 1 else 'it'}"
    reasons.append(f"- {items}: {why}.")
if reasons:
    display(Markdown(f"**{len(unrecorded)} of {len(checklist.items)} items have no evidence in this run**, "
                     "so the checklist marks them missing:\n\n" + "\n".join(reasons)))
if run_skips:
    display(Markdown(
        f"**The run skipped {len(run_skips)} analys{'es' if len(run_skips) > 1 else 'is'}** because its data or "
        "models lacked what they need; each chapter's page says so where it happened, and a book run's "
        "`run.json` lists them:"))
    display(pd.DataFrame(run_skips, columns=["chapter", "analysis", "reason"]).style.hide(axis="index")
            .format(escape="html"))
# reported (evidence present), reported with a concern (the evidence shows a problem), or missing
shown_frame = pd.DataFrame({
    "item": frame["number"].astype(str) + ". " + frame["title"],
    "status": ["missing" if s != "complete" else "reported, with a concern" if c else "reported"
               for s, c in zip(frame["status"], frame["concern"])],
    "this run's effect": frame["effect_value"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}"),
    "unit": frame["effect_unit"].fillna(""),
    "paper's value": frame["paper_value"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}"),
    "concern or what is missing": [c or p for c, p in zip(frame["concern"], frame["problems"])],
})
display(shown_frame.style.hide(axis="index").format(escape="html"))

# %% [markdown]
# ## This run's effects beside the paper's
#
# Each item's motivating effect as measured in this run, next to the
# paper's Kermany value where the paper gives one number. The book's default
# data, the phantom, is built to contain these effects, with knobs that set
# their size; matching the paper's values is not the point, finding the
# effects and reporting them is. On your own data the bars are your data's
# effects.

# %% tags=["hide-input"]
# the items with a measured effect (a skipped chart is said here: the figure cell below shows only the figure)
shown = frame[np.isfinite(frame["effect_value"].astype(float))].copy()
has_chart = skips.check("the chart of this run's effects",
                        None if len(shown) else "no chapter of this run recorded a measured effect (chapters "
                        "04_protocol_sensitivity and 05_split_and_shortcut_audit record them)")

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Each checklist item's effect measured in this run, beside the paper's Kermany value.", "name": "fig-07-4"}, "image": {"alt": "One bar chart per checklist item, each on its own scale, with the paper's value as a diamond"}}
if has_chart:
    # one panel per item: the items measure different quantities in different units, so they share no axis
    fig, axes = plt.subplots(len(shown), 1, figsize=(7.0, 1.05 * len(shown) + 0.6), squeeze=False)
    for ax, r in zip(axes[:, 0], shown.itertuples()):
        colour = "#c44e52" if r.status != "complete" else "#dd8452" if r.concern else "#55a868"
        ax.barh([0], [float(r.effect_value)], color=colour, height=0.5)
        if np.isfinite(float(r.paper_value)):
            ax.scatter([float(r.paper_value)], [0], color="black", marker="D", zorder=3, label="paper (Kermany)")
            ax.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.set_yticks([])
        ax.set_title(f"{r.number}. {r.item.replace('_', ' ')} ({r.effect_unit})", fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
    fig.suptitle("Green: reported; orange: reported, with a concern; red: recorded but incomplete", fontsize=9)
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ## The checklist
#
# Each item with what the run recorded, the effect it measured and the
# paper's, and the nearest items of other reporting guidelines.

# %% tags=["hide-input"]
display(Markdown(checklist.to_markdown()))

# %% [markdown]
# ## Crosswalk to other guidelines
#
# The nearest items of CLAIM 2024, TRIPOD+AI, MI-CLAIM (which names parts,
# not numbered items) and DOME (its sections) for each of the seven items.
# The sources each identifier was checked against are listed in
# `crslib.checklist_items.CROSSWALK_SOURCES`.

# %% tags=["hide-input"]
crosswalk_frame()

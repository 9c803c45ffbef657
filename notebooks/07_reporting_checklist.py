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
# 1. **Split provenance and a shift audit**: a partition classifier told the
#    official test split from the training pool at AUC 0.697 (0.898 for
#    normal images).
# 2. **Training policy**: frozen vs fine-tuned moved AUROC by 0.044, more
#    than the 0.026 between eight backbones.
# 3. **Threshold rule and where it was fitted**: the threshold moved
#    balanced accuracy by 0.090.
# 4. **Metrics beyond AUROC**, balanced accuracy included.
# 5. **Calibration and where it was fitted**: validation-fitted
#    calibration transferred imperfectly to test.
# 6. **Uncertainty**: CIs, seeds and split-level variation.
# 7. **Shortcut checks**: a classifier on file properties alone reached
#    0.992 balanced accuracy in the training pool and 0.496 on the test split.
#
# This notebook does not measure anything itself. It reads what the other
# notebooks of this run recorded (`results/*/evidence.json` in the run
# folder), marks each item **complete** only when the run recorded
# everything the item needs, and otherwise **missing** with the reason. Run
# outside a book run (no evidence files), every item is missing, which is
# the honest answer. The same checklist comes from the command line:
# `crs checklist runs/<run>`.

# %% tags=["parameters"]
run_dir = "."
results_dir = "results/07_reporting_checklist"

# %% tags=["hide-input"]
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

import crslib
from crslib.checklist import build_checklist, crosswalk_frame
from crslib.checklist_items import ITEMS
from crslib.runner import read_run_evidence

results = Path(results_dir)
results.mkdir(parents=True, exist_ok=True)
evidence, run_id = read_run_evidence(run_dir)
checklist = build_checklist(evidence, run_id=run_id)
(results / "checklist.md").write_text(checklist.to_markdown(), encoding="utf-8")
(results / "checklist.json").write_text(checklist.to_json(), encoding="utf-8")
display(Markdown(
    f"Run `{run_id}`: **{checklist.n_complete} of {len(checklist.items)} items complete**"
    + (f"; evidence recorded for {', '.join(f'`{k}`' for k in evidence)}." if evidence
       else "; no evidence files were found (run the protocol and audit notebooks in the same run folder).")
))
frame = checklist.to_frame()
frame

# %% [markdown]
# ## This run's effects beside the paper's
#
# Each item's motivating effect as measured on this run's phantom, next to
# the paper's Kermany value where the paper gives one number. The phantom is
# built to contain these effects, with knobs that set their size; matching
# the paper's values is not the point, finding the effects and reporting
# them is.

# %% tags=["hide-input"] mystnb={"figure": {"caption": "Each checklist item's effect measured in this run, beside the paper's Kermany value.", "name": "fig-07-4"}, "image": {"alt": "Bar chart of the effect per checklist item with the paper's values as diamonds"}}
shown = frame[np.isfinite(frame["effect_value"].astype(float))].copy()
fig, ax = plt.subplots(figsize=(7.5, 0.55 * max(len(shown), 1) + 1.2))
if len(shown):
    labels = [f"{r.number}. {r.item}\n({r.effect_unit})" for r in shown.itertuples()]
    colours = ["#55a868" if s == "complete" else "#c44e52" for s in shown["status"]]
    ax.barh(labels, shown["effect_value"].astype(float), color=colours, label="this run")
    paper = shown["paper_value"].astype(float)
    ax.scatter(paper, labels, color="black", marker="D", zorder=3, label="paper (Kermany)")
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.invert_yaxis()
    ax.legend(frameon=False, fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set_xlabel("effect (unit per item)")
    ax.set_title("Green: item complete; red: recorded but incomplete", fontsize=9)
else:
    ax.text(0.5, 0.5, "no effects recorded in this run", ha="center", va="center")
    ax.set_axis_off()
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

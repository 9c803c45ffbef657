"""Chapters 03 (transfer) and 06 (representation risk) on a researcher's own images and models.

The fast tests read the notebooks' sources: both take their models as
parameters and resolve them with :func:`crslib.models.lineup.resolve_models`
(the zoo trains only for a ``zoo:`` spec, on ``zoo_data``). The slow tests
execute the two notebooks on real tiles (``tests/realdata.py``) with two
seeded random timm networks, no zoo, and check what ran and what was
skipped, with the sentence saying why.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from realdata import write_labelled, write_paths_only

from crslib.runner import execute_notebook, notebook_parameters, read_skips

NOTEBOOKS = {"03": "03_transfer", "06": "06_representation_risk"}
#: Two cheap encoders of different seeds: random networks, nothing to download or train.
TWO_MODELS = ("timm:resnet18?size=32&seed=0", "timm:resnet18?size=32&seed=1")


def _source(repo_root: Path, key: str) -> str:
    return (repo_root / "notebooks" / f"{NOTEBOOKS[key]}.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("key", sorted(NOTEBOOKS))
def test_models_are_parameters_and_the_zoo_trains_only_on_zoo_data(repo_root: Path, key: str) -> None:
    params = notebook_parameters(repo_root / "notebooks" / f"{NOTEBOOKS[key]}.py")
    # the shipped zoo trained on the default phantom (seed 0); the chapter studies other patients (seed 1)
    assert params["zoo_data"] == "phantom?patients=600&size=64&seed=0"
    assert params["data"] == "phantom?patients=300&size=64&seed=1"
    assert params["zoo_preset"] == "default" and params["zoo_weights"] == "shipped"
    source = _source(repo_root, key)
    assert "resolve_models(" in source and "zoo_data=zoo_data" in source
    assert not re.search(r"\btrain_zoo\(", source), "the zoo is trained by resolve_models only, never on `data`"
    assert "SkipLog(" in source


def _run(repo_root: Path, tmp_path: Path, key: str, **params) -> tuple[list[dict], Path, str]:
    results = tmp_path / "results" / NOTEBOOKS[key]
    output = tmp_path / f"{NOTEBOOKS[key]}.ipynb"
    execute_notebook(repo_root / "notebooks" / f"{NOTEBOOKS[key]}.py", output,
                     {**params, "results_dir": str(results)}, cwd=tmp_path)
    notebook = json.loads(output.read_text(encoding="utf-8"))
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    text = "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    return read_skips(results), results, text


@pytest.mark.slow
def test_chapter06_runs_the_usable_tasks_including_a_multiclass_one_and_skips_the_others(repo_root: Path, tmp_path: Path) -> None:
    data = write_labelled(tmp_path / "labelled")
    skips, results, text = _run(repo_root, tmp_path, "06", data=str(data), encoders=",".join(TWO_MODELS),
                                tasks="label,source,age", n_partitions=1, n_resamples=50, n_components=16)
    reasons = {s["analysis"]: s["reason"] for s in skips}
    assert set(reasons) == {"the age task"}
    assert reasons["the age task"] == "the manifest has no `age` column; add one to run it"
    risk = json.loads((results / "risk_label.json").read_text(encoding="utf-8"))
    assert risk["task"] == "classification" and risk["settings"]["classes"] == ["microscopy", "photograph"]
    assert "positive class <code>photograph</code>" in text
    source = json.loads((results / "risk_source.json").read_text(encoding="utf-8"))
    assert source["task_type"] == "multiclass" and len(source["settings"]["classes"]) == 16
    assert "(multiclass, 16 classes:" in text
    # the selection, refit and dropped sections are written from the tables the run saved
    import pandas as pd

    selected = html.escape(risk["primary"]["selected"])  # encoder names are user text: shown escaped
    assert f"**<code>label</code>**: selected <code>{selected}</code>" in text
    table = pd.read_csv(results / "selection_table_label.csv")
    combos = table[table["kind"] != "single"]
    assert f"{int(combos['evidence'].sum())} of {len(combos)} combinations have evidence" in text
    refit = pd.read_csv(results / "refit_label.csv").set_index("fit")
    for fit, words in (("train", "fitted on train"), ("train+validation", "refitted on train + validation")):
        r = refit.loc[fit]
        assert (f"AUROC {r['test_score']:.3f} [{r['test_low']:.3f}, {r['test_high']:.3f}] {words} "
                f"({int(r['n_fit']):,} images)") in text
    dropped = pd.read_csv(results / "dropped_label.csv")
    if not dropped["n_dropped"].any() and not (dropped["part"] == "fit").any():
        assert "**<code>label</code>**, in the one partition: nothing was dropped." in text
    else:
        assert "**<code>label</code>**, in the one partition: nothing was dropped." not in text


@pytest.mark.slow
def test_chapter06_skips_a_task_its_regression_loss_cannot_score(repo_root: Path, tmp_path: Path) -> None:
    data = write_labelled(tmp_path / "labelled")
    skips, results, _ = _run(repo_root, tmp_path, "06", data=str(data), encoders=",".join(TWO_MODELS),
                             tasks="label", loss="mae", n_partitions=1, n_resamples=50, n_components=16)
    assert skips == [{"analysis": "the label task",
                      "reason": "loss 'mae' does not score a classification task; choose auto or log_loss"}]
    assert not list(results.glob("*.csv"))


@pytest.mark.slow
def test_chapter06_ends_cleanly_without_a_task_or_with_one_encoder(repo_root: Path, tmp_path: Path) -> None:
    data = write_paths_only(tmp_path / "paths")
    skips, results, _ = _run(repo_root, tmp_path, "06", data=str(data), encoders=",".join(TWO_MODELS),
                             tasks="label,age")
    assert [s["analysis"] for s in skips] == ["the label task", "the age task", "the rest of this chapter"]
    assert not list(results.glob("*.csv"))
    skips, results, _ = _run(repo_root, tmp_path / "one", "06", data=str(data), encoders=TWO_MODELS[0])
    assert [s["analysis"] for s in skips] == ["the encoder selection"]


@pytest.mark.slow
def test_chapter03_maps_without_labels_and_needs_a_new_model(repo_root: Path, tmp_path: Path) -> None:
    data = write_paths_only(tmp_path / "paths")
    skips, results, text = _run(repo_root, tmp_path, "03", data=str(data), old_model=TWO_MODELS[0],
                                new_models=TWO_MODELS[1], n_resamples=50)
    assert [s["analysis"] for s in skips] == ["the classifier transfer"]
    assert "no finding_* columns and no `label` column" in skips[0]["reason"]
    assert (results / "map_methods.csv").is_file() and not (results / "retention_by_finding.csv").exists()
    assert "Best map by held-out R²" in text
    skips, results, _ = _run(repo_root, tmp_path / "one", "03", data=str(data), old_model=TWO_MODELS[0],
                             new_models="")
    assert [s["analysis"] for s in skips] == ["the comparison of the old model with new models"]
    assert not list(results.glob("*.csv"))

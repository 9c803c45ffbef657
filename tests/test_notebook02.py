"""Chapter 02 (agreement) on a researcher's own images and models: the random-init references and its skips
(probe_targets is tested in test_probes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from crslib.models import is_random_init, random_init_spec


# --------------------------------------------------------------------------- random-init references


@pytest.mark.parametrize(("spec", "random"), [
    ("timm:resnet18?size=64", True),
    ("timm:resnet18?seed=3", True),
    ("timm:resnet18?weights=/w/r18.pth&size=64", False),
    ("timm:convnext_tiny?pretrained=hf", False),
    ("zoo:random_init-cnn_small-seed2", True),
    ("zoo:contrastive-cnn_small-seed0", False),
    ("public:efficientnet_lite0?size=64", False),
    ("public:open_nsfw", False),
    ("onnx:/m/model.onnx#features", False),
])
def test_is_random_init(spec, random):
    assert is_random_init(spec) is random


def test_the_default_random_reference_is_unchanged():
    # chapter 02 names it random:efficientnet_lite0; its results depend on this exact spec
    assert random_init_spec("public:efficientnet_lite0?size=64") == "timm:tf_efficientnet_lite0?size=64&seed=0"
    assert random_init_spec("public:open_nsfw?size=64") is None
    assert is_random_init(random_init_spec("timm:resnet18?weights=/w/r18.pth&size=64"))


# --------------------------------------------------------------------------- the chapter on real images


def _results(record, name="02_agreement") -> Path:
    return Path(record.run_dir) / "results" / name


@pytest.mark.slow
def test_chapter_02_studies_the_given_models_and_labels(own_books):
    from realdata import OWN_MODELS

    _, record, _ = own_books["labelled"]
    results = _results(record)
    matrix = pd.read_csv(results / "agreement_matrix.csv", index_col=0)
    # the two requested models and EfficientNet-Lite0's random-init reference (resnet18 without weights is random)
    assert list(matrix.index) == [*OWN_MODELS.split(","), "random:efficientnet_lite0"]
    probe = pd.read_csv(results / "linear_probe_auroc.csv", index_col=0)
    assert list(probe.columns) == ["label=photograph", "mean AUROC"]
    assert probe.loc[OWN_MODELS.split(",")[0], "mean AUROC"] > 0.8
    headline = pd.read_csv(results / "headline.csv")
    assert headline.columns[-1] == "this run (your data)"
    assert headline.iloc[2, -1] == "not computed (no zoo models in this run)"
    skipped = [s["analysis"] for s in json.loads((results / "skips.json").read_text())]
    assert skipped == ["the zoo's probe against the initial weights", "the overlap by view",
                       "the convergence by objective and seed", "the convergence by factor"]


@pytest.mark.slow
def test_chapter_02_on_paths_only_skips_what_needs_labels_or_sources(own_books):
    _, record, _ = own_books["paths"]
    skipped = {s["analysis"]: s["reason"] for s in json.loads((_results(record) / "skips.json").read_text())}
    assert set(skipped) == {"the overlap by source", "the overlap by view",
                            "the variance shares of the per-image overlap", "the linear probe",
                            "the convergence by objective and seed", "the convergence by factor",
                            "the zoo's probe against the initial weights"}
    assert skipped["the zoo's probe against the initial weights"] == "there are no zoo models in this run"
    assert "no `label` column" in skipped["the linear probe"]
    assert skipped["the convergence by factor"].startswith("fewer than two trained zoo models in this run")


@pytest.mark.slow
def test_chapter_02_with_one_model_and_no_random_reference(tmp_path, repo_root):
    from realdata import write_layout

    from crslib.runner import execute_notebook, read_skips

    data = write_layout("paths", tmp_path / "images")
    results = tmp_path / "results"
    execute_notebook(repo_root / "notebooks" / "02_agreement.py", tmp_path / "02.ipynb",
                     {"data": str(data), "models": "public:open_nsfw", "results_dir": str(results),
                      "n_resamples": 50}, cwd=tmp_path)
    skipped = [s["analysis"] for s in read_skips(results)]
    assert skipped[:3] == ["the comparisons against a random-init network",
                           "the zoo's probe against the initial weights", "the agreement analyses"]
    headline = pd.read_csv(results / "headline.csv")
    assert headline.iloc[0, -1] == "not computed (fewer than 2 models in this run)"
    cells = json.loads((tmp_path / "02.ipynb").read_text())["cells"]
    assert not [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]

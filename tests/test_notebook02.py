"""Chapter 02 (agreement) on a researcher's own images and models: its library helpers and its skips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crslib.errors import InputError
from crslib.models import is_random_init, random_init_spec
from crslib.probes import linear_probe_auroc, probe_targets


def _patients(n: int, per_patient: int = 2) -> list[str]:
    return [f"p{i // per_patient:03d}" for i in range(n)]


# --------------------------------------------------------------------------- probe_targets


def test_probe_targets_prefers_findings_and_leaves_out_rare_ones():
    n = 80
    m = pd.DataFrame({
        "patient_id": _patients(n),
        "label": ["a", "b"] * (n // 2),
        "finding_common": [0, 0, 1, 1] * (n // 4),
        "finding_rare": [1, 1] + [0] * (n - 2),  # one patient
    })
    targets, left_out = probe_targets(m)
    assert list(targets.columns) == ["finding_common"]  # findings win over the label
    assert targets["finding_common"].dtype == float and list(targets.index) == list(m.index)
    assert left_out == {"finding_rare": "`finding_rare` needs at least 5 patients of each of its two classes; "
                                        "it has 0: 39, 1: 1"}


def test_probe_targets_codes_a_two_class_text_label():
    n = 60
    m = pd.DataFrame({"patient_id": _patients(n),
                      "label": ["photograph", "photograph", "microscopy", "microscopy"] * 15})
    m.loc[5, "label"] = None  # unknown stays unknown
    targets, left_out = probe_targets(m)
    assert left_out == {} and list(targets.columns) == ["label=photograph"]
    column = targets["label=photograph"]
    assert column.iloc[:4].tolist() == [1.0, 1.0, 0.0, 0.0] and np.isnan(column.iloc[5])
    # numbers sort as numbers: 2 < 10, so 10 is the positive class
    numeric = m.assign(label=[2, 10] * (n // 2))
    assert list(probe_targets(numeric)[0].columns) == ["label=10"]


@pytest.mark.parametrize(("label", "reason"), [
    (None, "the manifest has no finding_* columns and no `label` column; add 0/1 finding_* columns or a "
           "two-class `label` to run it"),
    (["a", "b", "c"] * 20, "`label` needs exactly two classes; it has 3 ('a', 'b', 'c')"),
    (["a"] * 60, "`label` needs exactly two classes; it has 1 ('a')"),
])
def test_probe_targets_says_why_there_is_nothing_to_probe(label, reason):
    m = pd.DataFrame({"patient_id": _patients(60)})
    if label is not None:
        m["label"] = label
    targets, left_out = probe_targets(m)
    assert targets.shape == (60, 0) and left_out == {"label": reason}


def test_probe_targets_leaves_out_what_the_probe_split_cannot_score():
    # 5 positive patients out of 40: some seeds put all of them in the training part (or all in the test part)
    n = 80
    patients = _patients(n)
    positive = {"p000", "p001", "p002", "p003", "p004"}
    m = pd.DataFrame({"patient_id": patients, "label": [int(p in positive) for p in patients]})
    seeds = []
    for seed in range(40):
        targets, left_out = probe_targets(m, random_state=seed)
        if left_out:
            assert targets.shape[1] == 0
            assert left_out["label"].startswith("the probe's patient-grouped train/test split does not allow it: "
                                                "single class in the")
            seeds.append(seed)
        else:  # what probe_targets keeps, the probe fits (no NaN, no warning)
            res = linear_probe_auroc(np.random.default_rng(0).normal(size=(n, 3)), targets,
                                     groups=m["patient_id"].to_numpy(), random_state=seed)
            assert res.reasons == {} and np.isfinite(res.auroc).all()
    assert seeds, "no seed put every positive patient in the training part"


def test_probe_targets_refuses_a_non_frame():
    with pytest.raises(InputError, match="DataFrame"):
        probe_targets([1, 2, 3])


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
    assert probe.loc["public:efficientnet_lite0", "mean AUROC"] > 0.8
    headline = pd.read_csv(results / "headline.csv")
    assert headline.columns[-1] == "this run (your data)"
    assert headline.iloc[2, -1] == "not computed (no zoo models in this run)"
    skipped = [s["analysis"] for s in json.loads((results / "skips.json").read_text())]
    assert skipped == ["the zoo's probe against the initial weights", "the overlap by view",
                       "the convergence by objective and seed"]


@pytest.mark.slow
def test_chapter_02_on_paths_only_skips_what_needs_labels_or_sources(own_books):
    _, record, _ = own_books["paths"]
    skipped = {s["analysis"]: s["reason"] for s in json.loads((_results(record) / "skips.json").read_text())}
    assert set(skipped) == {"the overlap by source", "the overlap by view",
                            "the variance shares of the per-image overlap", "the linear probe",
                            "the convergence by objective and seed", "the zoo's probe against the initial weights"}
    assert skipped["the zoo's probe against the initial weights"] == "there are no zoo models in this run"
    assert "no `label` column" in skipped["the linear probe"]


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

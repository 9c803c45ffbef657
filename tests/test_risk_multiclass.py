"""Multi-class tasks in the representation-risk workflow (crslib.risk, risk_scores, risk_multiclass, risk_needs, crs risk)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crslib.errors import DataError, InputError
from crslib.risk import _check_target, evaluate_partition, outer_partition, representation_risk
from crslib.risk_needs import task_need
from crslib.risk_scores import weighted_macro_auroc

FAST = {"n_components": 8, "n_resamples": 200}


# --------------------------------------------------------------------------- weighted macro one-vs-rest AUROC


def test_weighted_macro_auroc_equals_sklearn_with_integer_sample_weights():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    for k in (3, 4, 6):
        y = np.r_[np.arange(k), rng.integers(0, k, size=60)]
        # rounded scores make ties, which both count half
        proba = np.round(rng.dirichlet(np.ones(k), size=y.size) + 0.3 * np.eye(k)[y], 1)
        proba /= proba.sum(axis=1, keepdims=True)
        counts = rng.integers(0, 4, size=(5, y.size)).astype(float)
        counts[:, :k] += 1  # every class drawn in every resample
        got = weighted_macro_auroc(y, proba, counts)
        expected = [roc_auc_score(y, proba, multi_class="ovr", average="macro", sample_weight=c) for c in counts]
        np.testing.assert_allclose(got, expected, atol=1e-12)
        # counts of ones: the plain metric
        np.testing.assert_allclose(weighted_macro_auroc(y, proba, np.ones((1, y.size)))[0],
                                   roc_auc_score(y, proba, multi_class="ovr", average="macro"), atol=1e-12)


def test_weighted_macro_auroc_perfect_random_and_absent_class():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, size=4000)
    assert weighted_macro_auroc(y, np.eye(4)[y], np.ones((1, y.size))).tolist() == [1.0]
    chance = weighted_macro_auroc(y, rng.dirichlet(np.ones(4), size=y.size), np.ones((1, y.size)))[0]
    assert abs(chance - 0.5) < 0.02
    # a resample without class 3 is undefined (NaN), as a one-class resample is for a binary AUROC
    counts = np.ones((2, y.size))
    counts[1, y == 3] = 0
    out = weighted_macro_auroc(y, np.eye(4)[y], counts)
    assert out[0] == 1.0 and np.isnan(out[1])


# --------------------------------------------------------------------------- task types


def test_auto_detects_binary_multiclass_and_regression_and_the_override():
    codes, task, classes = _check_target(np.array(["b", "a", "c", "a"]), 4, "auto")
    assert task == "multiclass" and classes == ["a", "b", "c"] and codes.tolist() == [1, 0, 2, 0]
    assert _check_target(["no", "yes", "no"], 3, "auto")[1] == "classification"  # binary, recorded as before
    assert _check_target(np.arange(40) % 5, 40, "auto")[1] == "multiclass"  # integers, 5 values
    assert _check_target(np.arange(40) % 21, 40, "auto")[1] == "regression"  # integers above MAX_CLASSES = 20
    assert _check_target(np.arange(40) % 5 * 1.0, 40, "auto")[1] == "regression"  # floats are numbers
    # the override and the backward-compatible alias
    assert _check_target(np.arange(40) % 5, 40, "regression")[1] == "regression"
    assert _check_target(np.arange(40) % 5 * 1.0, 40, "multiclass")[1] == "multiclass"
    assert _check_target(np.arange(40) % 5, 40, "classification")[1] == "multiclass"
    assert _check_target([0, 1, 0], 3, "classification")[1] == "classification"
    with pytest.raises(InputError, match=r"^task='multiclass' needs at least 3 classes, but y has 2; use task='binary'$"):
        _check_target([0, 1, 0], 3, "multiclass")
    with pytest.raises(InputError, match="task='binary' needs a binary target, but y has 5 distinct values"):
        _check_target(np.arange(40) % 5, 40, "binary")


def test_partitions_hold_every_class_and_stay_patient_disjoint():
    groups = np.repeat(np.arange(45), 2)
    y = np.array(["x", "y", "z"])[np.arange(45) % 3][np.arange(90) // 2]
    for seed in range(5):
        parts = outer_partition(y, groups=groups, random_state=seed)
        for p in parts:
            assert sorted(set(y[p])) == ["x", "y", "z"]
        assert not set(groups[parts[0]]) & set(groups[parts[1]])
        assert sum(p.size for p in parts) == 90


# --------------------------------------------------------------------------- the workflow on a 3-class task


def _three_class_data(seed: int = 0):
    """60 patients x 2 images; encoder `signal` carries the class (patient-level), `noise_a`/`noise_b` do not."""
    rng = np.random.default_rng(seed)
    n_patients = 60
    groups = np.repeat(np.arange(n_patients), 2)
    cls = rng.permutation(np.arange(n_patients) % 3)[groups]
    centres = rng.normal(size=(3, 12)) * 2.0
    emb = {"signal": centres[cls] + rng.normal(size=(cls.size, 12)),
           "noise_a": rng.normal(size=(cls.size, 12)), "noise_b": rng.normal(size=(cls.size, 12))}
    return emb, np.array(["cat", "dog", "fox"])[cls], groups


def test_three_class_task_selects_the_signal_encoder():
    emb, y, groups = _three_class_data()
    res = representation_risk(emb, y, groups=groups, n_partitions=4, **FAST)
    assert res.task == "multiclass" and res.task_type == "multiclass"
    assert (res.metric, res.secondary_metric) == ("macro_auroc", "balanced_accuracy")
    assert res.settings["classes"] == ["cat", "dog", "fox"]
    counts = dict(zip(res.selection_counts["encoder"], res.selection_counts["count"]))
    assert counts["signal"] + counts.get("union", 0) >= 3 and counts["noise_a"] + counts["noise_b"] == 0
    spread = res.spread.set_index("candidate")
    assert spread.loc["signal/linear", "mean"] > 0.85 and abs(spread.loc["noise_a/linear", "mean"] - 0.5) < 0.2
    c = res.primary.candidates.set_index("candidate")
    assert c.loc["signal/linear", "test_secondary"] > 0.6  # balanced accuracy, chance 1/3
    # class probabilities per row, one column per class
    assert res.primary.predictions["signal/knn"].shape == (y.size, 3)
    np.testing.assert_allclose(res.primary.predictions["signal/mlp"].sum(axis=1), 1.0)
    # the primary score on test equals sklearn's macro OvR AUROC of the predictions
    from sklearn.metrics import roc_auc_score

    te = res.primary.test_idx
    codes = np.searchsorted(["cat", "dog", "fox"], y)
    assert c.loc["signal/linear", "test_score"] == pytest.approx(
        roc_auc_score(codes[te], res.primary.predictions["signal/linear"][te], multi_class="ovr"), abs=1e-12)
    assert json.loads(json.dumps(res.to_dict()))["task_type"] == "multiclass"


def test_resamples_missing_a_class_are_counted_and_left_out():
    # class 2 has 4 patients: 1 lands in validation, and about 1 resample in e (~37 %) leaves it out
    rng = np.random.default_rng(2)
    groups = np.arange(60)
    y = np.r_[np.zeros(28, int), np.ones(28, int), np.full(4, 2)]
    emb = {"a": rng.normal(size=(60, 4)) + np.eye(3, 4)[y] * 2, "b": rng.normal(size=(60, 4))}
    res = evaluate_partition(emb, y, groups=groups, heads=["linear"], union_size=0, n_components=4, n_resamples=400)
    c = res.candidates
    assert (c["val_undefined"] > 50).all() and (c["val_undefined"] < 350).all()
    assert np.isfinite(c["val_low"]).all()
    # a binary task on the same data has none
    binary = evaluate_partition(emb, (y == 0).astype(int), groups=groups, heads=["linear"], union_size=0,
                                n_components=4, n_resamples=100)
    assert (binary.candidates["val_undefined"] == 0).all()


def test_a_partition_without_a_class_is_refused():
    emb, y, groups = _three_class_data()
    tr, va, te = outer_partition(y, groups=groups)
    va_without_fox = va[y[va] != "fox"]
    with pytest.raises(DataError, match=r"^the validation partition lacks class code\(s\) \[2\]"):
        evaluate_partition(emb, y, groups=groups, partition=(tr, va_without_fox, te), **FAST)


# --------------------------------------------------------------------------- task_need


def test_task_need_names_a_class_with_too_few_patients():
    groups = np.arange(40)
    y = np.array(["mild"] * 18 + ["moderate"] * 19 + ["severe"] * 3, dtype=object)
    assert task_need(y, groups=groups, name="grade") == (
        "`grade` needs at least 4 patients of each class so that train, validation and test (60/20/20 % of "
        "patients) all hold every class; it has mild: 18, moderate: 19, severe: 3")
    y[-4] = "severe"
    assert task_need(y, groups=groups, name="grade") is None
    # the override: the same integer codes as a regression target need no class counts
    codes = np.r_[np.zeros(18), np.ones(19), np.full(3, 2)].astype(int)
    assert task_need(codes, groups=groups, name="grade").endswith("it has 0: 18, 1: 19, 2: 3")
    assert task_need(codes, groups=groups, name="grade", task="regression") is None
    with pytest.raises(InputError, match="unknown task 'ordinal'"):
        task_need(codes, groups=groups, task="ordinal")


# --------------------------------------------------------------------------- crs risk


def _four_class_folder(root: Path) -> Path:
    """48 patients x 2 grayscale PNGs, a 4-class text label that sets the image's brightness, and manifest.csv."""
    from PIL import Image

    rng = np.random.default_rng(0)
    names = ["calcified", "clear", "nodular", "patchy"]
    rows = []
    (root / "img").mkdir(parents=True)
    for p in range(48):
        label = names[p % 4]
        for j in range(2):
            pixels = np.clip(rng.normal(40 + 50 * (p % 4), 20, size=(32, 32)), 0, 255).astype(np.uint8)
            path = f"img/p{p:02d}_{j}.png"
            Image.fromarray(pixels).save(root / path)
            rows.append({"image_id": f"p{p:02d}_{j}", "path": path, "patient_id": f"P{p:02d}", "label": label})
    pd.DataFrame(rows).to_csv(root / "manifest.csv", index=False)
    return root


def test_crs_risk_runs_a_four_class_text_label(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from crslib.cli import main

    data = _four_class_folder(tmp_path / "data")
    out = tmp_path / "risk"
    models = "timm:resnet10t?size=32&seed=0,timm:resnet10t?size=32&seed=1"
    status = main(["risk", "--data", str(data), "--models", models, "--task", "label", "--partitions", "2",
                   "--resamples", "100", "--components", "8", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0
    assert printed.startswith("label (multiclass): selected ") and "test macro_auroc " in printed
    saved = json.loads((out / "risk_label.json").read_text())
    assert saved["task_type"] == "multiclass" and saved["settings"]["classes"] == [
        "calcified", "clear", "nodular", "patchy"]
    assert "(multiclass, macro_auroc)" in (out / "risk.html").read_text()
    # --task-type overrides the guess; a text label cannot be a regression target (one line, exit 2)
    status = main(["risk", "--data", str(data), "--models", models, "--task", "label", "--task-type", "regression",
                   "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("crs risk: error: --task `label` cannot be used: task='regression' needs "
                                          "a numeric target") and len(err.strip().splitlines()) == 1


def test_crs_risk_stops_on_a_class_with_too_few_patients(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from crslib.cli import main

    data = _four_class_folder(tmp_path / "data")
    manifest = pd.read_csv(data / "manifest.csv")
    manifest.loc[(manifest["label"] == "patchy") & (manifest["patient_id"] >= "P12"), "label"] = "clear"
    manifest.to_csv(data / "manifest.csv", index=False)
    status = main(["risk", "--data", str(data), "--models", "timm:resnet10t?size=32", "--task", "label",
                   "--out", str(tmp_path / "risk")])
    err = capsys.readouterr().err
    assert status == 2 and "`label` needs at least 4 patients of each class" in err and "patchy: 3" in err

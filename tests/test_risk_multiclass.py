"""Multi-class tasks in the representation-risk workflow (crslib.risk, risk_scores, risk_multiclass, risk_needs, crs risk)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from assertions import error_message

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



def test_auto_detection_at_its_bounds_and_the_codes_of_a_binary_task():
    # exactly MAX_CLASSES = 20 integer values are still classes; 21 are a number
    assert _check_target(np.arange(40) % 20, 40, "auto")[1] == "multiclass"
    assert _check_target(np.arange(42) % 21, 42, "auto")[1] == "regression"
    # integers and floats mixed in one column (as read from a manifest) are a number
    mixed = np.array([1, 2.5, 3] * 10, dtype=object)
    assert _check_target(mixed, 30, "auto")[1] == "regression"
    # task="binary" is recorded as "classification"; its codes are int64 0/1, 1 for the class that sorts last
    codes, task, classes = _check_target(np.array(["yes", "no", "yes"]), 3, "binary")
    assert task == "classification" and classes == ["no", "yes"]
    assert codes.dtype == np.int64 and codes.tolist() == [1, 0, 1]
    assert _check_target(np.array([2.0, 5.0, 5.0]), 3, "auto")[0].dtype == np.int64


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


# --------------------------------------------------------------------------- risk_multiclass: known answers


def test_class_patients_is_a_boolean_patient_by_class_table_and_each_rows_patient():
    from crslib.risk_multiclass import class_patients, patient_classes

    y = np.array([2, 1, 1, 0, 1, 0, 2])
    groups = np.array(["b", "a", "a", "c", "b", "c", "d"])
    has, inverse = class_patients(y, groups)
    assert has.dtype == np.bool_ and has.shape == (4, 3)
    assert has.tolist() == [[False, True, False], [False, True, True], [True, False, False], [False, False, True]]
    assert inverse.tolist() == [1, 0, 0, 2, 1, 2, 3]
    # class 2 has 2 patients, classes 0 and 1 have 1 and 2: patient b's rarest is class 1 (tie to the lower code)
    assert patient_classes(y, groups)[0].tolist() == [1, 1, 0, 2]


def _ten_patients():
    """10 patients: 0-2 class 0, 3-5 class 1, 6-9 class 2 (8 and 9 also with a class 0 and a class 1 image)."""
    per_patient = [[0], [0], [0], [1], [1], [1], [2], [2], [2, 0, 1], [2, 0, 1]]
    y = np.array([c for classes in per_patient for c in classes])
    groups = np.array([f"p{p}" for p, classes in enumerate(per_patient) for _ in classes])
    return y, groups


def test_multiclass_partition_needs_min_patients_and_at_least_ten():
    from crslib.risk_multiclass import partition
    from crslib.splits import MIN_PATIENTS, min_patients

    fractions = (0.6, 0.2, 0.2)
    assert max(min_patients(fractions), MIN_PATIENTS) == 10
    y, groups = _ten_patients()
    tr, va, te = partition(y, groups, "multiclass", fractions, 3)
    assert np.sort(np.r_[tr, va, te]).tolist() == list(range(y.size))
    for part in (tr, va, te):
        assert sorted(set(y[part].tolist())) == [0, 1, 2]
    keep = groups != "p0"  # 9 patients, classes 0, 1, 2 still held by 4, 5, 4 of them
    assert error_message(partition, y[keep], groups[keep], "multiclass", fractions, 3, error=DataError) == (
        "9 patients are too few for patient-grouped train / validation / test partitions (fractions (0.6, 0.2, "
        "0.2)); at least 10 patients are needed")
    # fractions that need more than MIN_PATIENTS patients: the bound is min_patients
    small_train = (0.1, 0.45, 0.45)
    assert min_patients(small_train) == 15
    assert error_message(partition, np.arange(14) % 3, np.arange(14), "multiclass", small_train, 3,
                         error=DataError) == (
        "14 patients are too few for patient-grouped train / validation / test partitions (fractions (0.1, 0.45, "
        "0.45)); at least 15 patients are needed")


def test_multiclass_partition_names_the_class_with_too_few_patients():
    from crslib.risk_multiclass import partition

    # 2 images per patient; class 2 in 3 patients (6 images), classes 0 and 1 in 6 patients each
    groups = np.repeat(np.arange(15), 2)
    y = np.repeat([0, 1, 2, 0, 1] * 3, 2)
    assert error_message(partition, y, groups, "multiclass", (0.6, 0.2, 0.2), 0, error=DataError) == (
        "only 3 patient(s) have an image of class 2; at least 4 patients of each class are needed so that train, "
        "validation and test (fractions (0.6, 0.2, 0.2)) all hold every class; add patients or change the fractions")


def test_multiclass_partition_names_the_partition_that_lacks_the_highest_class():
    from crslib.risk_multiclass import partition

    # 12 patients in strata 0, 1, 2 of 4 each; class 3 is in 2 patients of stratum 0 and 2 of stratum 1 (its
    # patients' rarest class is 0 or 1, ties to the lower code), so a partition can be left without it
    per_patient = [[0, 3], [0, 3], [0], [0], [1, 3], [1, 3], [1], [1], [2], [2], [2], [2]]
    y = np.array([c for classes in per_patient for c in classes])
    groups = np.array([p for p, classes in enumerate(per_patient) for _ in classes])
    for seed, name in ((2, "train"), (1, "validation"), (4, "test")):
        assert error_message(partition, y, groups, "multiclass", (0.6, 0.2, 0.2), seed, error=DataError) == (
            f"the {name} partition lacks class code(s) [3] with seed {seed} (their images are in too few patients); "
            "add patients of those classes or use other fractions")


def test_multiclass_partition_splits_each_stratum_with_the_seed():
    from crslib.risk_multiclass import partition, patient_classes
    from crslib.splits import grouped_partition

    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(30), 2)
    y = np.repeat(np.arange(30) % 3, 2)
    y[rng.choice(60, size=8, replace=False)] = 2  # some patients of class 0 or 1 also have a class 2 image
    fractions = (0.6, 0.2, 0.2)
    label, inverse = patient_classes(y, groups)

    def expected(seed):
        parts = [[], [], []]
        for c in np.unique(label):
            rows = np.flatnonzero(label[inverse] == c)
            for k, part in enumerate(grouped_partition(groups[rows], fractions, random_state=seed)):
                parts[k].append(rows[part])
        return [np.sort(np.concatenate(p)).tolist() for p in parts]

    five, six = partition(y, groups, "multiclass", fractions, 5), partition(y, groups, "multiclass", fractions, 6)
    assert [p.tolist() for p in five] == expected(5) and [p.tolist() for p in six] == expected(6)
    assert expected(5) != expected(6) and expected(5) != expected(0)
    assert [p.tolist() for p in partition(y, groups, "multiclass", fractions, 5)] == expected(5)


def _weak_three_class(seed: int = 4):
    """48 rows (24 patients x 2), 3 classes, 8 features with a weak class signal; training rows 0-35 and their folds."""
    from crslib.risk_multiclass import folds

    rng = np.random.default_rng(seed)
    y = np.arange(48) % 3
    Z = rng.normal(size=(48, 8)) + 0.4 * np.eye(3, 8)[y]
    groups = np.arange(48) // 2
    tr = np.arange(36)
    inner = folds(y[tr], groups[tr], "multiclass", 3, seed)
    assert len(inner) == 3
    return Z, y, groups, tr, inner


def _linear_by_hand(Z, y, tr, inner, fold_features=None, score=None):
    """Per C of the grid, out-of-fold class probabilities of the multinomial head scored by ``score``."""
    import warnings

    from crslib.probes import _C_GRID, class_proba, linear_head
    from crslib.risk_scores import primary_score

    score = score or (lambda truth, pred: primary_score("multiclass", truth, pred))
    yt, scores = y[tr], []
    for C in _C_GRID:
        oof = np.zeros((yt.size, 3))
        for i, (fit, val) in enumerate(inner):
            Zt = Z[tr] if fold_features is None else fold_features[i]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                oof[val] = class_proba(linear_head("classification", C).fit(Zt[fit], yt[fit]), Zt[val], 3)
        scores.append(score(yt, oof))
    return scores


def _linear_fit(Z, y, tr, C):
    from crslib.probes import class_proba, linear_head

    return class_proba(linear_head("classification", C).fit(Z[tr], y[tr]), Z, 3)


def test_multiclass_linear_head_chooses_c_by_inner_macro_auroc():
    from crslib.probes import _C_GRID
    from crslib.risk_multiclass import head

    Z, y, _, tr, inner = _weak_three_class()
    scores = _linear_by_hand(Z, y, tr, inner)
    assert len(set(scores)) == 4 and int(np.argmax(scores)) == 0  # C=0.01, not the default C=1
    pred, param, inner_score = head("linear", Z, y, tr, inner, "multiclass", 4)
    assert param == "C=0.01" and inner_score == scores[0]
    np.testing.assert_allclose(pred, _linear_fit(Z, y, tr, _C_GRID[0]), rtol=0, atol=1e-12)


def test_multiclass_linear_head_scores_the_fold_features():
    from crslib.probes import _C_GRID
    from crslib.risk_multiclass import head

    Z, y, _, tr, inner = _weak_three_class()
    rng = np.random.default_rng(104)
    fold_features = [Z[tr] @ rng.normal(size=(8, 8)) for _ in inner]
    scores = _linear_by_hand(Z, y, tr, inner, fold_features=fold_features)
    assert len(set(scores)) == 4 and int(np.argmax(scores)) == 1  # C=0.1 (on Z[tr] itself: C=0.01)
    pred, param, inner_score = head("linear", Z, y, tr, inner, "multiclass", 4, fold_features=fold_features)
    assert param == "C=0.1" and inner_score == scores[1]
    # the final fit is on Z[tr], not on the fold features
    np.testing.assert_allclose(pred, _linear_fit(Z, y, tr, _C_GRID[1]), rtol=0, atol=1e-12)


def test_multiclass_linear_head_ranks_c_by_a_given_score_or_takes_a_fixed_c():
    from crslib.risk_multiclass import head
    from crslib.risk_scores import primary_score

    Z, y, _, tr, inner = _weak_three_class()

    def worst(truth, pred):
        return -primary_score("multiclass", truth, pred)

    scores = _linear_by_hand(Z, y, tr, inner, score=worst)
    assert int(np.argmax(scores)) == 3  # the lowest macro AUROC: C=10
    pred, param, inner_score = head("linear", Z, y, tr, inner, "multiclass", 4, score=worst)
    assert param == "C=10" and inner_score == scores[3]
    np.testing.assert_allclose(pred, _linear_fit(Z, y, tr, 10.0), rtol=0, atol=1e-12)
    # a fixed C: no inner CV, NaN score
    pred, param, inner_score = head("linear", Z, y, tr, inner, "multiclass", 4, param=0.1)
    assert param == "C=0.1" and np.isnan(inner_score)
    np.testing.assert_allclose(pred, _linear_fit(Z, y, tr, 0.1), rtol=0, atol=1e-12)


def test_multiclass_linear_head_silences_only_its_convergence_warning(monkeypatch):
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    from crslib import risk_multiclass
    from crslib.probes import class_proba, linear_head
    from crslib.risk_multiclass import head

    # heavy-tailed features and a nearly unpenalised fit need hundreds to thousands of lbfgs iterations,
    # how many depends on the CPU (1,216 on one machine, about 2,600 on another, against the head's 2,000):
    # the head is stopped after 20, so that it fails to converge on every machine
    def short_head(task, value):
        model = linear_head(task, value)
        model[-1].max_iter = 20
        return model

    monkeypatch.setattr(risk_multiclass, "_probe_linear_head", short_head)
    y = np.arange(60) % 3
    Z = np.exp(12 * np.random.default_rng([68, 30, 12]).normal(size=(60, 30))) * (1 + np.eye(3, 30)[y])
    with pytest.warns(ConvergenceWarning):
        expected = class_proba(short_head("classification", 1e8).fit(Z, y), Z, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pred, param, inner_score = head("linear", Z, y, np.arange(60), [], "multiclass", 0, param=1e8)
    assert param == "C=1e+08" and np.isnan(inner_score)
    np.testing.assert_allclose(pred, expected, rtol=0, atol=1e-12)
    # any other warning, a UserWarning like ConvergenceWarning among them, still reaches the caller
    from sklearn.exceptions import DataConversionWarning

    with pytest.warns(DataConversionWarning):  # a column vector where a 1-D y is expected
        risk_multiclass._linear_proba(1e8, Z, y[:, None], Z, 3)


def _knn_by_hand(Z, y, tr, inner, fold_features=None):
    """Per k of the grid, the macro AUROC of the out-of-fold class shares among the k nearest fitting rows."""
    from crslib.probes import _K_GRID, knn_means
    from crslib.risk_scores import primary_score

    onehot = np.eye(3)[y[tr]]
    oof = {k: np.zeros(onehot.shape) for k in _K_GRID}
    for i, (fit, val) in enumerate(inner):
        Zf = Z[tr] if fold_features is None else fold_features[i]
        for k, shares in knn_means(Zf[fit], onehot[fit], Zf[val], _K_GRID).items():
            oof[k][val] = shares
    return [primary_score("multiclass", y[tr], oof[k]) for k in _K_GRID]


def test_multiclass_knn_head_chooses_k_by_inner_macro_auroc_on_the_fold_features():
    from crslib.probes import knn_means
    from crslib.risk_multiclass import head

    Z, y, _, tr, inner = _weak_three_class()
    onehot = np.eye(3)[y]
    scores = _knn_by_hand(Z, y, tr, inner)
    assert len(set(scores)) == 3 and int(np.argmax(scores)) == 0  # k=5
    pred, param, inner_score = head("knn", Z, y, tr, inner, "multiclass", 4)
    assert param == "k=5" and inner_score == scores[0]
    np.testing.assert_allclose(pred, knn_means(Z[tr], onehot[tr], Z, [5])[5], rtol=0, atol=1e-12)
    # per-fold features that rank the k otherwise; the final neighbours are searched in Z[tr]
    rng = np.random.default_rng(104)
    fold_features = [Z[tr] * rng.uniform(0.2, 3, size=8) for _ in inner]
    scores = _knn_by_hand(Z, y, tr, inner, fold_features=fold_features)
    assert len(set(scores)) == 3 and int(np.argmax(scores)) == 1  # k=15
    pred, param, inner_score = head("knn", Z, y, tr, inner, "multiclass", 4, fold_features=fold_features)
    assert param == "k=15" and inner_score == scores[1]
    np.testing.assert_allclose(pred, knn_means(Z[tr], onehot[tr], Z, [15])[15], rtol=0, atol=1e-12)


def test_multiclass_knn_head_takes_a_fixed_k():
    from crslib.probes import knn_means
    from crslib.risk_multiclass import head

    Z, y, _, tr, inner = _weak_three_class()
    onehot = np.eye(3)[y]
    for k in (5, 31):
        pred, param, inner_score = head("knn", Z, y, tr, inner, "multiclass", 4, param=k)
        assert param == f"k={k}" and np.isnan(inner_score)
        np.testing.assert_allclose(pred, knn_means(Z[tr], onehot[tr], Z, [k])[k], rtol=0, atol=1e-12)
    assert pred.shape == (48, 3) and np.allclose(pred.sum(axis=1), 1.0)


def test_multiclass_mlp_head_is_the_seeded_scaled_mlp_and_silences_its_convergence_warning():
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from crslib.probes import _MLP_OPTIONS, class_proba
    from crslib.risk_multiclass import head

    # 3 features on very different scales, classes without signal: lbfgs stops at max_iter=200
    rng = np.random.default_rng(0)
    y = np.arange(60) % 3
    Z = rng.normal(size=(60, 3)) * [1.0, 10.0, 100.0] + 50.0
    tr = np.arange(45)
    preds = {}
    for seed in (3, 4):
        with pytest.warns(ConvergenceWarning):
            model = make_pipeline(StandardScaler(), MLPClassifier(**_MLP_OPTIONS, random_state=seed)).fit(Z[tr], y[tr])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pred, param, inner_score = head("mlp", Z, y, tr, [], "multiclass", seed)
        assert param == "hidden=64" and np.isnan(inner_score)
        np.testing.assert_allclose(pred, class_proba(model, Z, 3), rtol=0, atol=1e-12)
        preds[seed] = pred
    assert np.abs(preds[3] - preds[4]).max() > 0.05
    # any other warning still reaches the caller
    from sklearn.exceptions import DataConversionWarning

    with pytest.warns(DataConversionWarning):  # a column vector where a 1-D y is expected
        head("mlp", Z, y[:, None], tr, [], "multiclass", 3)


def test_a_stratum_too_small_to_split_is_pooled_instead_of_failing_the_partition():
    from crslib.risk_multiclass import _pooled_strata, partition
    from crslib.splits import grouped_partition

    # class 2 is in 5 patients, 3 of whom also have class 1 (5 patients: the tie goes to the lower code), so
    # only patients 13 and 14 are stratified as class 2: too few for three parts; they join stratum 1
    per_patient = [[0]] * 8 + [[1], [1], [1, 2], [1, 2], [1, 2], [2], [2]] + [[0]] * 5
    y = np.array([c for classes in per_patient for c in classes])
    groups = np.array([p for p, classes in enumerate(per_patient) for _ in classes])
    fractions = (0.6, 0.2, 0.2)
    strata = [np.r_[0:8, 15:20], np.r_[8:15]]
    for seed in range(6):
        expected = [[], [], []]
        for patients in strata:
            rows = np.flatnonzero(np.isin(groups, patients))
            for k, part in enumerate(grouped_partition(groups[rows], fractions, random_state=seed)):
                expected[k] += rows[part].tolist()
        absent = [sorted({0, 1, 2} - set(y[p].tolist())) for p in expected]
        if any(absent):  # the pooled strata can still leave a class out of a part: the documented DataError
            with pytest.raises(DataError, match="partition lacks class code"):
                partition(y, groups, "multiclass", fractions, seed)
        else:
            assert [p.tolist() for p in partition(y, groups, "multiclass", fractions, seed)] == [
                sorted(p) for p in expected]
    assert task_need(y, groups=groups, n_partitions=1, random_state=1) is None
    assert task_need(y, groups=groups).startswith("`y` does not fill partition 1 of 1: the test partition lacks")
    # the rule: classes of fewer than `need` patients are pooled; a pool still too small joins the smallest
    # large stratum; a pool large enough stays a stratum of its own
    assert _pooled_strata(np.array([0, 0, 0, 1, 1, 1, 1, 2, 3]), 3).tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0]
    assert _pooled_strata(np.array([1, 1, 1, 1, 0, 0, 0, 3]), 3).tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert _pooled_strata(np.array([0, 0, 0, 1, 1, 2, 3, 3]), 3).tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert _pooled_strata(np.array([0, 0, 1, 1, 1]), 2).tolist() == [0, 0, 1, 1, 1]


def test_inner_folds_pool_bounds_zero_variance_and_unknown_heads():
    from assertions import error_message

    from crslib.risk_multiclass import _pooled_strata, folds, head

    # a pool of exactly the minimum stays a stratum of its own
    assert _pooled_strata(np.array([0, 0, 0, 0, 1, 2, 3]), 3).tolist() == [0, 0, 0, 0, 1, 1, 1]
    # as many inner folds as the rarest class has patients, when that is fewer than asked; two are enough
    y = np.r_[np.zeros(10, int), np.ones(10, int), np.full(3, 2)]
    groups = np.arange(23)
    assert len(folds(y, groups, "multiclass", 5, 0)) == 3
    two = folds(y[:-1], groups[:-1], "multiclass", 5, 0)
    assert len(two) == 2 and sorted(np.concatenate([val for _, val in two]).tolist()) == list(range(22))
    assert folds(y[:-2], groups[:-2], "multiclass", 5, 0) == []
    # a regression target whose distinct values are the same number has no variance
    assert error_message(_check_target, np.array(["1", "1.0", "1"]), 3, "regression") == (
        "y has zero variance: there is nothing to predict")
    assert _check_target([0.0, 0.5, 0.25], 3, "regression")[0].tolist() == [0.0, 0.5, 0.25]
    Z = np.zeros((4, 2))
    assert error_message(head, "svm", Z, np.array([0, 1, 2, 0]), np.arange(4), [], "multiclass", 0) == (
        "unknown head 'svm'; choose linear, knn, mlp")

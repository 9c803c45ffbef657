"""Tests of crslib.audit: partition and shortcut classifiers, provenance, report.

The phantom gives the ground truth: ``shortcut_strength`` couples the label
with the file encoding in the training pool only, ``split_shift`` makes the
official test split a later acquisition batch. The audit must find injected
effects and must not invent absent ones.

Null phantoms are generated with the same label prevalence at every site:
with the default (site-dependent) prevalences a site's file encoding carries
a little label information by itself, which is a real, if weak, association
rather than the absence of one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from test_leakage import folders  # noqa: F401 - the Kermany folders of real tiles, with and without planted copies

from crslib import audit as A
from crslib import shortcut as S
from crslib.checklist import build_checklist
from crslib.data import file_properties, read_image
from crslib.data.phantom import generate_phantom
from crslib.duplicates import image_fingerprints
from crslib.errors import CRSError, DataError, InputError
from crslib.leakage import leakage_audit, leakage_effect
from crslib.probes import logistic_probe
from crslib.reports import render_audit_html
from crslib.splits import grouped_folds
from crslib.stats import auroc, group_permuter
from assertions import error_message

N_PATIENTS = 200
SIZE = 40
N_RESAMPLES = 300
N_PERMUTATIONS = 29  # smallest attainable p-value 1/30 < 0.05


def _equal_prevalence(kermany: bool) -> dict[str, float]:
    return {f"site{j}": (0.73 if kermany else 0.35) for j in range(4)}


def _pixel_embeddings(manifest: pd.DataFrame, side: int = 16) -> np.ndarray:
    rows = []
    for path in manifest["path"]:
        gray = read_image(path).mean(axis=2)
        rows.append(np.asarray(Image.fromarray(gray).resize((side, side), Image.BILINEAR)).ravel())
    return np.asarray(rows, dtype=np.float64)


PHANTOMS = {
    "std_shortcut": dict(shortcut_strength=1.0, kermany_layout=False),
    "kermany_shortcut": dict(shortcut_strength=1.0, kermany_layout=True),
    "std_null": dict(kermany_layout=False),
    "kermany_null": dict(kermany_layout=True),
    "std_shift": dict(split_shift=1.0, kermany_layout=False),
}


class _Phantoms(dict):
    """The PHANTOMS by name, each generated when a test first asks for it (a test of bad input needs one)."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self._tmp_path_factory = tmp_path_factory

    def __missing__(self, name: str) -> dict:
        kwargs = PHANTOMS[name]
        manifest = generate_phantom(self._tmp_path_factory.mktemp(name), n_patients=N_PATIENTS, image_size=SIZE,
                                    random_state=0, prevalence=_equal_prevalence(kwargs["kermany_layout"]), **kwargs)
        props = file_properties(manifest)
        self[name] = {"manifest": manifest, "props": props, "X": S.property_matrix(props)}
        return self[name]


@pytest.fixture(scope="module")
def phantoms(tmp_path_factory):
    return _Phantoms(tmp_path_factory)


@pytest.fixture(scope="module")
def shortcut_results(phantoms):
    out = {}
    for name in ("std_shortcut", "kermany_shortcut", "std_null", "kermany_null"):
        d = phantoms[name]
        m = d["manifest"]
        out[name] = S.shortcut_audit(d["X"], m["label"], m["split"], groups=m["patient_id"],
                                     n_resamples=N_RESAMPLES, n_repeats=3, n_permutations=N_PERMUTATIONS)
    return out


@pytest.fixture(scope="module")
def partition_results(phantoms):
    out = {}
    for name in ("std_shift", "std_null"):
        m = phantoms[name]["manifest"]
        emb = _pixel_embeddings(m)
        out[name] = {
            "embeddings": A.partition_audit(emb, m["split"], groups=m["patient_id"], labels=m["label"],
                                            n_resamples=N_RESAMPLES, n_permutations=N_PERMUTATIONS),
            "properties": A.partition_audit(phantoms[name]["X"], m["split"], groups=m["patient_id"],
                                            labels=m["label"], n_resamples=N_RESAMPLES,
                                            n_permutations=N_PERMUTATIONS),
        }
    return out


def _near_half(row: pd.Series, column: str) -> bool:
    return bool(row["low"] <= 0.5 <= row["high"] or abs(row[column] - 0.5) < 0.1)


# --------------------------------------------------------------------------- injected effects


@pytest.mark.parametrize("name", ["std_shortcut", "kermany_shortcut"])
def test_shortcut_found_in_pool_and_absent_on_test(shortcut_results, name):
    table = shortcut_results[name].table.set_index("scope")
    assert table.loc["pool", "balanced_accuracy"] >= 0.9
    assert table.loc["pool", "low"] >= 0.85
    assert table.loc["pool", "p_value"] < 0.05
    assert _near_half(table.loc["test"], "balanced_accuracy"), table
    assert table.loc["test", "p_value"] >= 0.05
    assert table["evidence"].tolist() == ["yes", "no"]


@pytest.mark.parametrize("name", ["std_null", "kermany_null"])
def test_no_shortcut_is_invented(shortcut_results, name):
    table = shortcut_results[name].table.set_index("scope")
    assert _near_half(table.loc["pool"], "balanced_accuracy"), table
    assert _near_half(table.loc["test"], "balanced_accuracy"), table
    assert (table["p_value"] >= 0.05).all(), table
    assert (table["evidence"] == "no").all(), table


def test_shortcut_properties_predict_label_alone(shortcut_results):
    imp = shortcut_results["std_shortcut"].importances
    assert list(imp.columns) == ["feature", "importance_mean", "importance_std", "alone"]
    alone = imp.set_index("feature")["alone"]
    # the shortcut encodings differ in container, bit depth and dimensions
    assert alone["format"] >= 0.95 and alone["bit_depth"] >= 0.95
    # the null phantom: no property predicts the label by itself
    null_alone = shortcut_results["std_null"].importances["alone"].dropna()
    assert null_alone.max() < 0.7


def test_partition_finds_split_shift(partition_results):
    row = partition_results["std_shift"]["embeddings"].table.iloc[0]
    assert row["scope"] == "all"
    assert row["low"] > 0.6 and row["p_value"] < 0.05, row
    # file properties see the shift only through the site mix and content-dependent file sizes
    row = partition_results["std_shift"]["properties"].table.iloc[0]
    assert row["low"] > 0.5 and row["p_value"] < 0.05, row
    assert row["evidence"] == "yes"


def test_partition_null_interval_covers_half(partition_results):
    for source in ("embeddings", "properties"):
        row = partition_results["std_null"][source].table.iloc[0]
        assert row["low"] <= 0.5 <= row["high"], (source, row)
        assert row["p_value"] >= 0.05, (source, row)
        assert row["evidence"] == "no", (source, row)


def test_partition_per_class_rows(partition_results, phantoms):
    result = partition_results["std_shift"]["embeddings"]
    table = result.table
    assert list(table["scope"]) == ["all", "class=0", "class=1"]
    assert np.isfinite(table[["auc", "low", "high"]].to_numpy()).all()
    assert (table["low"] <= table["auc"]).all() and (table["auc"] <= table["high"]).all()
    m = phantoms["std_shift"]["manifest"]
    assert table.loc[0, "n_test"] == int((m["split"] == "test").sum())
    assert table.loc[1:, "n_test"].sum() == table.loc[0, "n_test"]
    assert table.loc[1:, "n_pool"].sum() == table.loc[0, "n_pool"]


def test_no_patient_in_two_folds(partition_results, shortcut_results, phantoms):
    for result, name in ((partition_results["std_shift"]["embeddings"], "std_shift"),
                         (shortcut_results["kermany_shortcut"], "kermany_shortcut")):
        m = phantoms[name]["manifest"]
        folds = pd.Series(result.folds, index=m.index)
        used = folds >= 0
        per_patient = folds[used].groupby(m.loc[used, "patient_id"]).nunique()
        assert (per_patient == 1).all()
        assert folds[used].nunique() == 5


def test_fold_assignment_matches_scikit_learn():
    from sklearn.model_selection import StratifiedGroupKFold

    for seed in range(20):
        rng = np.random.default_rng(seed)
        sizes = rng.integers(1, 5, 60)
        groups = np.repeat(np.array([f"p{i}" for i in range(60)], dtype=object), sizes)
        y = np.repeat(rng.integers(0, 2, 60), sizes) if seed % 2 else rng.integers(0, 3, len(groups))
        expected = np.full(len(y), -1)
        splits = StratifiedGroupKFold(5, shuffle=True, random_state=seed).split(y, y, groups)
        for fold, (_, held) in enumerate(splits):
            expected[held] = fold
        assert np.array_equal(grouped_folds(y, groups, 5, seed, "test"), expected)


def test_shortcut_folds_cover_the_pool_only(shortcut_results, phantoms):
    m = phantoms["std_null"]["manifest"]
    folds = shortcut_results["std_null"].folds
    assert ((folds >= 0) == (m["split"] != "test").to_numpy()).all()


# --------------------------------------------------------------------------- known answers


def _synthetic(n_patients=120, seed=0):
    rng = np.random.default_rng(seed)
    patients = np.repeat(np.arange(n_patients), 2)
    split = np.where(patients % 4 == 0, "test", np.where(patients % 9 == 1, "val", "train"))
    labels = np.repeat(rng.integers(0, 2, n_patients), 2)
    return rng, patients, split, labels


def test_feature_equal_to_split_gives_auc_one():
    rng, patients, split, labels = _synthetic()
    X = np.c_[(split == "test").astype(float), rng.normal(size=(len(split), 3))]
    result = A.partition_audit(X, split, groups=patients, labels=labels, n_resamples=200, n_permutations=9)
    assert result.table["auc"].tolist() == [1.0, 1.0, 1.0]
    assert result.table.loc[0, "low"] == 1.0
    assert result.table["p_value"].tolist() == [0.1, 0.1, 0.1]  # 1 / (1 + 9): nothing beats it
    assert result.null.shape == (9, 3) and (result.null < 1.0).all()


def test_random_features_interval_covers_half():
    rng, patients, split, labels = _synthetic(n_patients=200, seed=0)
    X = rng.normal(size=(len(split), 8))
    result = A.partition_audit(X, split, groups=patients, n_resamples=300, n_permutations=N_PERMUTATIONS)
    row = result.table.iloc[0]
    assert row["low"] <= 0.5 <= row["high"]
    assert abs(row["auc"] - 0.5) < 0.1
    assert row["p_value"] >= 0.05


def test_rows_in_neither_pool_nor_test_are_left_out_logged_and_given_no_score(caplog):
    rng, patients, split, labels = _synthetic(n_patients=40, seed=1)
    split = split.astype(object)
    split[:6] = "external"  # patients 0, 1 and 2
    X = np.c_[(split == "test") + rng.normal(size=len(split)), rng.normal(size=(len(split), 2))]  # AUC < 1
    with caplog.at_level(logging.INFO, logger="crslib.audit"):
        result = A.partition_audit(X, split, groups=patients)
    assert [r.getMessage() for r in caplog.records] == [
        "partition audit: 6 row(s) in neither the pool ['train', 'val'] nor 'test' are left out"]
    assert result.used.tolist() == [False] * 6 + [True] * (len(split) - 6)
    assert np.isnan(result.scores[:6]).all() and not np.isnan(result.scores[6:]).any()
    assert (result.folds[:6] == -1).all() and (result.folds[6:] >= 0).all()
    in_pool, in_test = np.isin(split, ["train", "val"]), split == "test"
    assert result.table.loc[0, ["n_pool", "n_test", "n_pool_patients", "n_test_patients"]].tolist() == [
        in_pool.sum(), in_test.sum(), len(set(patients[in_pool])), len(set(patients[in_test]))]
    # the defaults: 1,000 resamples and no permutation test
    explicit = A.partition_audit(X, split, groups=patients, n_resamples=1000, n_permutations=0)
    pd.testing.assert_frame_equal(result.table, explicit.table)
    assert result.null.shape == (0, 1) and result.null.dtype == np.float64 and np.isnan(result.table.loc[0, "p_value"])
    assert 0.5 < result.table.loc[0, "auc"] < 0.95
    assert result.table.loc[0, "low"] != A.partition_audit(X, split, groups=patients, n_resamples=999).table.loc[0, "low"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="crslib.audit"):
        every_row = A.partition_audit(X[6:], split[6:], groups=patients[6:], n_resamples=20, n_splits=3)
    assert caplog.records == []  # every row used: nothing to say
    assert (result.n_splits, every_row.n_splits) == (5, 3) and set(every_row.folds.tolist()) == {0, 1, 2}


def test_partition_intervals_are_the_patient_bootstrap_of_the_out_of_fold_scores():
    from crslib.stats import auroc, bootstrap_ci

    rng, patients, split, labels = _synthetic(n_patients=60, seed=3)
    labels = labels.astype(object)
    labels[np.isin(patients, [1, 2, 3])] = "pool only"  # a class with no test image: no AUC
    X = np.c_[(split == "test") + rng.normal(size=len(split)), rng.normal(size=len(split))]
    result = A.partition_audit(X, split, groups=patients, labels=labels, n_resamples=200, confidence=0.8,
                               random_state=5, n_permutations=3)
    y, g = result.is_test.astype(int), np.array([str(p) for p in patients], dtype=object)
    assert result.table["scope"].tolist() == ["all", "class=0", "class=1", "class=pool only"]
    for scope, mask in [("all", np.ones(len(y), bool)), ("class=0", labels == 0), ("class=1", labels == 1)]:
        ci = bootstrap_ci(auroc, y[mask], result.scores[mask], groups=g[mask], n_resamples=200, confidence=0.8,
                          random_state=5)
        row = result.table.set_index("scope").loc[scope]
        assert [row["auc"], row["low"], row["high"]] == [ci.estimate, ci.low, ci.high], scope
    # the permutation columns summarise each scope's null at the same confidence
    for j, row in result.table.iterrows():
        assert row[["p_value", "null_mean", "null_low", "null_high", "evidence"]].to_dict() == pytest.approx(
            S.permutation_summary(row["auc"], result.null[:, j], confidence=0.8), nan_ok=True)
    assert result.table.loc[0, "null_high"] - result.table.loc[0, "null_low"] < np.ptp(result.null[:, 0])
    pool_only = result.table.set_index("scope").loc["class=pool only"]
    assert pool_only[["n_pool", "n_test", "n_pool_patients", "n_test_patients"]].tolist() == [6, 0, 3, 0]
    assert pool_only[["auc", "low", "high"]].isna().all()


def test_patients_in_both_the_pool_and_the_test_split_are_named_and_warned_about(caplog):
    rng, patients, split, labels = _synthetic(n_patients=40, seed=2)
    split = split.astype(object)
    split[[9, 17, 25, 33]] = "train"  # one image each of test patients 4, 8, 12 and 16 moves to the pool
    X = rng.normal(size=(len(split), 2))
    with caplog.at_level(logging.WARNING, logger="crslib.audit"):
        result = A.partition_audit(X, split, groups=patients, n_resamples=20)
    assert result.shared_patients == ["12", "16", "4", "8"]  # ids compared as text
    assert [r.getMessage() for r in caplog.records] == [
        "4 patient(s) have images in both the pool and the 'test' split (first: ['12', '16', '4'])"]


@pytest.mark.parametrize("audit", ["partition", "shortcut"])
def test_the_audits_name_the_argument_and_what_to_pass_in_their_errors(audit):
    rng, patients, split, labels = _synthetic(n_patients=20)
    X = rng.normal(size=(len(split), 2))
    bad_X = X.copy()
    bad_X[3] = np.nan
    call, x_name = (A.partition_audit, "X") if audit == "partition" else (S.shortcut_audit, "properties_X")
    cases = [
        ({x_name: bad_X}, f"{x_name} has NaN or infinite values in 1 row(s) (first: [3])"),
        (dict(split=None), "split is required: pass the split name of each row"),
        (dict(groups=None), "groups is required: pass patient ids (groups=manifest['patient_id'])"),
        (dict(n_splits=1), "n_splits must be an integer >= 2, got 1"),
        (dict(n_resamples=0), "n_resamples must be an integer >= 1, got 0"),
        (dict(n_permutations=-1), "n_permutations must be an integer >= 0, got -1"),
    ]
    if audit == "partition":
        cases += [(dict(labels=labels[:-1]), f"labels has {len(X) - 1} values but X has {len(X)} rows"),
                  (dict(n_splits=6), "partition audit: class 1 has only 5 patient(s), fewer than n_splits=6")]
    else:
        cases += [(dict(labels=None), "labels is required: pass the class of each row"),
                  (dict(n_repeats=0), "n_repeats must be an integer >= 1, got 0")]
    for change, message in cases:
        with pytest.raises(InputError) as error:
            call(**({x_name: X, "split": split, "groups": patients, "labels": labels} | change))
        assert str(error.value).startswith(message), (change, str(error.value))


def test_group_permutation_moves_whole_patients():
    groups = np.array(["a", "a", "b", "c", "c", "d", "e", "e"])
    values = np.arange(8)
    permute = group_permuter(groups)
    rng = np.random.default_rng(0)
    for _ in range(20):
        out = permute(values, rng)
        assert sorted(out.tolist()) == values.tolist()
        for g in np.unique(groups):  # a patient's rows receive one patient's consecutive rows
            block = out[groups == g]
            assert len(set(groups[block])) == 1 and list(block) == sorted(block)


def test_permutation_importance_points_at_the_informative_property():
    rng, patients, split, labels = _synthetic(n_patients=200, seed=1)
    X = pd.DataFrame({
        "noise_a": rng.normal(size=len(split)),
        "signal": labels + 0.3 * rng.normal(size=len(split)),
        "noise_b": rng.normal(size=len(split)),
    })
    result = S.shortcut_audit(X, labels, split, groups=patients, n_resamples=100, n_repeats=5)
    assert result.importances.loc[0, "feature"] == "signal"
    assert result.importances.loc[0, "importance_mean"] > 0.3
    assert result.pool_balanced_accuracy > 0.9 and result.test_balanced_accuracy > 0.9


class _SignOf:
    """A fitted classifier that predicts class 1 where column ``col`` is positive (``flip`` inverts it)."""

    classes_ = np.array([0, 1])

    def __init__(self, col: int, flip: bool = False):
        self.col, self.flip = col, flip

    def predict_proba(self, X):
        p = ((X[:, self.col] > 0) != self.flip).astype(float)
        return np.column_stack([1 - p, p])


def test_permutation_importance_known_answer_each_fold_model_on_its_own_rows_draws_in_order():
    # fold 0 (6 rows) has a model that reads column 0, fold 1 (4 rows) one that reads it inverted: every
    # held-out row predicted by its own fold's model is right, by the other fold's model wrong
    y = np.array([0, 1, 0, 1, 1, 0, 0, 1, 1, 0])
    folds = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    signal = np.where(y == 1, 1.0, -1.0) * np.where(folds == 1, -1, 1)
    X = np.column_stack([signal, np.linspace(-1, 1, 10)])
    fitted = [_SignOf(0), _SignOf(0, flip=True)]
    groups = {"signal": [0], "unused": [1]}
    assert S._balanced_accuracy(y, np.concatenate([m.predict_proba(X[folds == k])[:, 1] > 0.5
                                                   for k, m in enumerate(fitted)]).astype(int)) == 1.0

    def expected_drops(n_repeats):
        # drawing the permutations in the documented order: fold, property, repeat
        rng = np.random.default_rng(1)
        permuted = np.zeros((2, n_repeats, len(y)), dtype=int)
        for k, model in enumerate(fitted):
            held = np.flatnonzero(folds == k)
            for j, cols in enumerate(groups.values()):
                for r in range(n_repeats):
                    block = X[held].copy()
                    block[:, cols] = X[held][rng.permutation(len(held))][:, cols]
                    permuted[j, r, held] = model.predict_proba(block)[:, 1] > 0.5
        return np.array([[1.0 - S._balanced_accuracy(y, permuted[j, r]) for r in range(n_repeats)] for j in range(2)])

    for n_repeats in (2, 3):
        out = S._permutation_importance(fitted, X, y, folds, groups, n_classes=2, n_repeats=n_repeats, random_state=1)
        drops = expected_drops(n_repeats)
        assert len(set(drops[0].round(9))) > 1  # the repeats differ, so the spread is not 0 by accident
        assert out["feature"].tolist() == ["signal", "unused"]
        np.testing.assert_allclose(out["importance_mean"], drops.mean(axis=1))
        np.testing.assert_allclose(out["importance_std"], drops.std(axis=1, ddof=1))
        assert out.loc[1, "importance_mean"] == 0.0 and out.loc[1, "importance_std"] == 0.0
    one = S._permutation_importance(fitted, X, y, folds, groups, n_classes=2, n_repeats=1, random_state=1)
    assert one["importance_std"].tolist() == [0.0, 0.0]


def test_alone_scores_leave_a_property_that_is_constant_in_every_column_unscored():
    # two columns, each constant but not equal to each other (a one-hot property with one value in the pool):
    # nothing to learn from, so no score, though the block as a whole is not constant
    y = np.array([0, 1] * 10)
    folds = np.repeat([0, 1], 10)
    X = np.column_stack([np.ones(20), np.zeros(20), np.where(y == 1, 1.0, -1.0)])
    scores = S._alone_scores("logistic", X, y, folds, {"one_value": [0, 1], "signal": [2]}, 2, 0)
    assert np.isnan(scores[0]) and scores[1] == 1.0

def test_shortcut_audit_defaults_seeds_and_grouped_intervals_are_what_it_documents():
    """Defaults as documented; every random step follows random_state; the intervals resample patients."""
    from crslib.stats import bootstrap_ci

    rng, patients, split, labels = _synthetic(n_patients=60, seed=4)
    X = np.c_[labels + rng.normal(scale=1.5, size=len(labels)), rng.normal(size=len(labels))]
    documented = S.shortcut_audit(X, labels, split, groups=patients, n_splits=5, n_resamples=1000, n_repeats=10,
                                  n_permutations=0, random_state=0, model="logistic")
    by_default = S.shortcut_audit(X, labels, split, groups=patients)
    pd.testing.assert_frame_equal(by_default.table, documented.table)
    pd.testing.assert_frame_equal(by_default.importances, documented.importances)
    assert (by_default.n_splits, by_default.n_repeats, by_default.n_permutations) == (5, 10, 0)
    assert by_default.model == "logistic" and by_default.null.shape == (0, 2)
    # the pool and test intervals are the patient-grouped bootstrap of the balanced accuracy
    in_pool, in_test = np.isin(split, ["train", "val"]), split == "test"
    for scope, rows, predicted in (("pool", in_pool, by_default.pool_predictions),
                                   ("test", in_test, by_default.test_predictions)):
        ci = bootstrap_ci(S._balanced_accuracy, labels[rows], predicted.astype(int), groups=patients[rows].astype(str),
                          n_resamples=1000, confidence=0.95, random_state=0)
        row = by_default.table.set_index("scope").loc[scope]
        assert (row["balanced_accuracy"], row["low"], row["high"]) == (ci.estimate, ci.low, ci.high)
    # ... and follow n_resamples, confidence and random_state when they are not the defaults
    narrow = S.shortcut_audit(X, labels, split, groups=patients, n_resamples=200, confidence=0.8, random_state=5,
                              n_repeats=1)
    test_ci = bootstrap_ci(S._balanced_accuracy, labels[in_test], narrow.test_predictions.astype(int),
                           groups=patients[in_test].astype(str), n_resamples=200, confidence=0.8, random_state=5)
    row = narrow.table.set_index("scope").loc["test"]
    assert (row["low"], row["high"]) == (test_ci.low, test_ci.high)
    assert row["high"] - row["low"] < by_default.table.set_index("scope").loc["test", "high"] - \
        by_default.table.set_index("scope").loc["test", "low"]
    # each scope counts its own images and patients; chance is one over the number of classes
    counts = by_default.table.set_index("scope")[["chance", "n_images", "n_patients"]]
    assert counts.loc["pool"].tolist() == [0.5, in_pool.sum(), len(set(patients[in_pool]))]
    assert counts.loc["test"].tolist() == [0.5, in_test.sum(), len(set(patients[in_test]))]
    assert by_default.null.dtype == np.float64
    # the permutation null draws from random_state as well
    nulls = [S.shortcut_audit(X, labels, split, groups=patients, n_permutations=2, n_resamples=20, n_repeats=1,
                              random_state=7).null for _ in range(2)]
    assert nulls[0].shape == (2, 2) and np.array_equal(nulls[0], nulls[1]) and np.isfinite(nulls[0]).all()
    # a forest draws from random_state too: the same seed repeats every number, folds included
    runs = [S.shortcut_audit(X, labels, split, groups=patients, model="forest", n_resamples=50, n_repeats=2,
                             n_permutations=2, random_state=3) for _ in range(2)]
    pd.testing.assert_frame_equal(runs[0].table, runs[1].table)
    np.testing.assert_array_equal(runs[0].null, runs[1].null)
    pd.testing.assert_frame_equal(runs[0].importances, runs[1].importances)
    assert np.array_equal(runs[0].folds, runs[1].folds) and runs[0].model == "forest"
    # ... and the final forest, fitted on the whole pool: on features with no signal its test predictions
    # follow the seed alone, so they repeat with the seed and change with another
    noise = np.random.default_rng(11).normal(size=(len(labels), 3))
    final = [S.shortcut_audit(noise, labels, split, groups=patients, model="forest", n_resamples=20, n_repeats=1,
                              random_state=seed).test_predictions for seed in (3, 3, 4)]
    assert np.array_equal(final[0], final[1]) and not np.array_equal(final[0], final[2])


def test_shortcut_audit_permutation_null_reruns_the_pool_cross_validation_on_patient_shuffled_labels():
    """A known answer: permutation b shuffles pool then test labels between patients (one generator seeded with
    random_state), reruns the pool's grouped cross-validation with fold seed random_state + 1 + b, and scores the
    test split's shuffled labels against the fixed pool-fit predictions."""
    from crslib.probes import out_of_fold_proba
    from crslib.splits import grouped_folds
    from crslib.stats import group_permuter

    rng, patients, split, labels = _synthetic(n_patients=60, seed=4)
    X = np.c_[labels + rng.normal(scale=1.5, size=len(labels)), rng.normal(size=len(labels))]
    result = S.shortcut_audit(X, labels, split, groups=patients, n_permutations=3, n_resamples=20, n_repeats=1,
                              random_state=2)
    in_pool, in_test = np.isin(split, ["train", "val"]), split == "test"
    g = np.array([str(v) for v in patients], dtype=object)
    pool_patients, test_patients = g[in_pool], g[in_test]
    permute_pool, permute_test = group_permuter(pool_patients), group_permuter(test_patients)
    draw = np.random.default_rng(2)
    expected = np.empty((3, 2))
    for b in range(3):
        shuffled = permute_pool(labels[in_pool], draw)
        folds = grouped_folds(shuffled, pool_patients, 5, 2 + 1 + b, "check")
        proba = out_of_fold_proba("logistic", X[in_pool], shuffled, folds, 2, 2)[0]
        expected[b, 0] = S._balanced_accuracy(shuffled, np.argmax(proba, axis=1))
        expected[b, 1] = S._balanced_accuracy(permute_test(labels[in_test], draw),
                                              result.test_predictions.astype(int))
    np.testing.assert_array_equal(result.null, expected)
    # the null's central range follows confidence
    narrow = S.shortcut_audit(X, labels, split, groups=patients, n_permutations=3, n_resamples=20, n_repeats=1,
                              random_state=2, confidence=0.5).table.set_index("scope")
    for j, scope in enumerate(("pool", "test")):
        summary = S.permutation_summary(narrow.loc[scope, "balanced_accuracy"], expected[:, j], confidence=0.5)
        assert (narrow.loc[scope, "null_low"], narrow.loc[scope, "null_high"]) == (summary["null_low"],
                                                                                   summary["null_high"])
        assert summary["null_high"] - summary["null_low"] < np.ptp(expected[:, j])


@pytest.mark.parametrize("audit", ["partition", "shortcut"])
def test_the_audits_say_when_a_permutation_fold_loses_a_class(monkeypatch, audit):
    """Shuffled labels keep each class's patient count, but their folds can still leave a class out of training:
    the error then names the permutation step, not the pool's cross-validation."""
    import crslib.splits as splits

    assign, calls = splits.stratified_group_kfold, []

    def all_of_class_one_in_fold_zero_after_the_first(y, groups, n_splits, random_state):
        calls.append(random_state)
        folds = assign(y, groups, n_splits, random_state)
        return folds if len(calls) == 1 else np.where(np.asarray(y) == 1, 0, folds)

    monkeypatch.setattr(splits, "stratified_group_kfold", all_of_class_one_in_fold_zero_after_the_first)
    rng, patients, split, labels = _synthetic(n_patients=60, seed=4)
    X = rng.normal(size=(len(labels), 2))
    with pytest.raises(InputError) as error:
        if audit == "shortcut":
            S.shortcut_audit(X, labels, split, groups=patients, n_permutations=1, n_resamples=5, n_repeats=1)
        else:  # class 1 is the test split here
            A.partition_audit(X, split, groups=patients, n_permutations=1, n_resamples=5)
    assert str(error.value) == (f"{audit} audit (permutation): fold 0 leaves a class out of its training rows "
                                "(too few patients per class); pass a smaller n_splits")
    assert calls == [0, 1]  # the observed folds, then permutation 0's


def test_shortcut_audit_orders_importances_by_drop_then_alone_score_then_name():
    """A classifier that reads only the first column: every other property has importance exactly 0, so the
    alone score breaks the tie (higher first), then the name (constant properties have no alone score)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    rng, patients, split, labels = _synthetic(n_patients=60, seed=4)
    n = len(labels)
    X = np.c_[labels + rng.normal(scale=0.5, size=n), rng.normal(size=n), labels + rng.normal(scale=1.0, size=n),
              np.ones(n), np.ones(n)]
    first_column_only = make_pipeline(ColumnTransformer([("first", "passthrough", [0])]), LogisticRegression())
    result = S.shortcut_audit(X, labels, split, groups=patients, model=first_column_only, n_resamples=20,
                              n_repeats=2)
    table = result.importances
    assert table.columns.tolist() == ["feature", "importance_mean", "importance_std", "alone"]
    assert table.index.tolist() == [0, 1, 2, 3, 4]
    assert table["feature"].tolist() == ["x0", "x2", "x1", "x3", "x4"]
    assert table["importance_mean"].iloc[0] > 0 and (table["importance_mean"].iloc[1:] == 0).all()
    assert table["alone"].iloc[1] > table["alone"].iloc[2] and table["alone"].iloc[3:].isna().all()


def test_shortcut_audit_names_the_argument_in_each_error():
    rng, patients, split, labels = _synthetic(n_patients=60, seed=4)
    X = rng.normal(size=(len(labels), 2))
    run = dict(groups=patients, n_resamples=20, n_repeats=1)

    def message(**changes):
        args = {"properties_X": X, "labels": labels, "split": split, **run, **changes}
        with pytest.raises(InputError) as error:
            S.shortcut_audit(args.pop("properties_X"), args.pop("labels"), args.pop("split"), **args)
        return str(error.value)

    assert message(properties_X=np.r_[np.full((1, 2), np.nan), X[1:]]).startswith(
        "properties_X has NaN or infinite values in 1 row(s) (first: [0]);")
    assert message(labels=None) == "labels is required: pass the class of each row"
    assert message(split=None) == "split is required: pass the split name of each row"
    assert message(groups=None) == "groups is required: pass patient ids (groups=manifest['patient_id'])"
    assert message(n_splits=1) == "n_splits must be an integer >= 2, got 1"
    assert message(n_resamples=0) == "n_resamples must be an integer >= 1, got 0"
    assert message(n_repeats=0) == "n_repeats must be an integer >= 1, got 0"
    assert message(n_permutations=-1) == "n_permutations must be an integer >= 0, got -1"
    keep = ~np.isin(patients, np.unique(patients[labels == 1])[3:])  # three patients of class 1 in all
    n_pool_positive = len(set(patients[keep & (labels == 1) & (split != "test")]))
    assert message(properties_X=X[keep], labels=labels[keep], split=split[keep], groups=patients[keep]) == (
        f"shortcut audit (pool): class 1 has only {n_pool_positive} patient(s), fewer than n_splits=5; "
        "pass a smaller n_splits (at least 2) or audit more images")
    assert message(labels=np.where(split == "test", labels, 0)) == (
        "the pool ['train', 'val'] holds a single class (0); balanced accuracy needs at least two classes in both "
        "the pool and the test split")
    three = np.where((split == "test") & (np.arange(len(labels)) < 8), 2, labels)
    assert message(labels=three) == ("class(es) [2] occur in the 'test' split but never in the pool; a classifier "
                                     "fitted on the pool cannot predict them")
    # the smallest counts each check allows still run
    smallest = S.shortcut_audit(X, labels, split, groups=patients, n_splits=2, n_resamples=1, n_repeats=1)
    assert smallest.n_splits == 2 and sorted(set(smallest.folds[split != "test"].tolist())) == [0, 1]
    assert smallest.n_repeats == 1 and (smallest.folds[split == "test"] == -1).all()  # test rows are in no fold
    # predictions are the label values themselves, as classes lists them (text labels stay Python str)
    named = S.shortcut_audit(X, np.where(labels == 1, "pneumonia", "normal").astype(object), split, groups=patients,
                             n_resamples=1, n_repeats=1, n_permutations=2)
    assert named.classes == ["normal", "pneumonia"] and named.n_permutations == 2 and named.null.shape == (2, 2)
    for predicted in (named.pool_predictions, named.test_predictions):
        assert {type(v) for v in predicted} == {str} and set(predicted) <= {"normal", "pneumonia"}


def test_results_are_deterministic():
    rng, patients, split, labels = _synthetic(seed=2)
    X = rng.normal(size=(len(split), 4))
    a = A.partition_audit(X, split, groups=patients, labels=labels, n_resamples=100, random_state=7)
    b = A.partition_audit(X, split, groups=patients, labels=labels, n_resamples=100, random_state=7)
    pd.testing.assert_frame_equal(a.table, b.table)
    assert np.array_equal(a.folds, b.folds)


def test_forest_model_and_estimator_are_accepted():
    from sklearn.linear_model import LogisticRegression

    rng, patients, split, labels = _synthetic()
    X = np.c_[(split == "test") + 0.5 * rng.normal(size=len(split))]
    forest = A.partition_audit(X, split, groups=patients, model="forest", n_resamples=50)
    custom = A.partition_audit(X, split, groups=patients, model=LogisticRegression(), n_resamples=50)
    assert forest.model == "forest" and custom.model == "LogisticRegression"
    assert forest.auc > 0.8 and custom.auc > 0.8
    # the seed reaches the forests: the same seed repeats the scores, another changes them
    again = A.partition_audit(X, split, groups=patients, model="forest", n_resamples=50)
    other = A.partition_audit(X, split, groups=patients, model="forest", n_resamples=50, random_state=1)
    assert np.array_equal(forest.scores, again.scores) and not np.allclose(forest.scores, other.scores)
    # and the forests of the permutation test: the same null again
    nulls = [A.partition_audit(X, split, groups=patients, model="forest", n_splits=2, n_resamples=20,
                               n_permutations=2).null for _ in range(2)]
    assert np.array_equal(nulls[0], nulls[1]) and np.isfinite(nulls[0]).all()


# --------------------------------------------------------------------------- property_matrix


def test_property_matrix_encodes_and_is_deterministic():
    props = pd.DataFrame({
        "image_id": ["a", "b", "c", "d"],
        "file_size": [100.0, 200.0, np.nan, 400.0],
        "format": ["PNG", "JPEG", None, "PNG"],
        "png_chunks": ["pHYs|tEXt", np.nan, np.nan, ""],
        "jpeg_progressive": [np.nan, True, np.nan, np.nan],
        "readable": [True, True, False, True],
        "constant": [1, 1, 1, 1],
    })
    pm = S.property_matrix(props)
    assert isinstance(pm, S.PropertyMatrix)
    X = pm.features
    assert list(X.columns) == [
        "file_size", "file_size_missing", "format=JPEG", "format=PNG", "format_missing",
        "png_chunks:pHYs", "png_chunks:tEXt", "png_chunks_missing", "jpeg_progressive",
        "jpeg_progressive_missing", "readable",
    ]
    assert X["file_size"].tolist() == [100.0, 200.0, S.MISSING_SENTINEL, 400.0]
    assert X["png_chunks:tEXt"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert X["png_chunks_missing"].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert X["jpeg_progressive"].tolist() == [-1.0, 1.0, -1.0, -1.0]
    assert X["readable"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert "constant" not in X and "image_id" not in X
    assert pm.feature_groups["format=PNG"] == "format"
    assert list(pm.feature_groups) == list(X.columns)
    assert pm.feature_groups["file_size_missing"] == "file_size" and pm.feature_groups["png_chunks:tEXt"] == "png_chunks"
    shuffled = S.property_matrix(props.iloc[::-1])
    assert list(shuffled.features.columns) == list(X.columns)
    assert shuffled.features.index.tolist() == [3, 2, 1, 0]  # the properties' index, row for row
    pd.testing.assert_frame_equal(shuffled.features.loc[X.index], X)
    assert X.dtypes.map(lambda d: d.kind == "f").all()


def test_property_matrix_from_file_properties_has_no_identifiers(phantoms):
    X = phantoms["kermany_shortcut"]["X"].features
    assert not any(c.startswith("image_id") for c in X.columns)
    assert np.isfinite(X.to_numpy()).all()
    assert {"jpeg_quality", "file_size", "width"} <= set(X.columns)


def test_property_matrix_result_copies_serialises_and_groups_the_audit():
    rng, patients, split, labels = _synthetic(n_patients=120, seed=3)
    n = len(split)
    props = pd.DataFrame({
        "image_id": [f"i{j}" for j in range(n)],
        "format": np.where(labels == 1, "PNG", np.where(rng.random(n) < 0.5, "JPEG", "BMP")),
        "file_size": rng.normal(1000, 50, n),
    })
    pm = S.property_matrix(props)
    assert pm.feature_groups == {"format=BMP": "format", "format=JPEG": "format", "format=PNG": "format",
                                 "file_size": "file_size"}
    frame = pm.to_frame()
    pd.testing.assert_frame_equal(frame, pm.features)
    frame.iloc[0, 0] = 99.0
    frame["extra"] = 1.0
    assert pm.features.iloc[0, 0] != 99.0 and "extra" not in pm.features
    d = json.loads(pm.to_json())
    assert d == {"features": list(pm.features.columns), "feature_groups": pm.feature_groups, "n_rows": n}
    # the result's groups permute a property's columns together; a plain frame has one feature per column
    options = dict(groups=patients, n_resamples=20, n_repeats=2)
    grouped = S.shortcut_audit(pm, labels, split, **options)
    plain = S.shortcut_audit(pm.features, labels, split, **options)
    assert sorted(grouped.importances["feature"]) == ["file_size", "format"]
    assert sorted(plain.importances["feature"]) == sorted(pm.features.columns)
    pd.testing.assert_frame_equal(grouped.table, plain.table)
    part = A.partition_audit(pm, split, groups=patients, n_resamples=20)
    pd.testing.assert_frame_equal(part.table, A.partition_audit(pm.features, split, groups=patients,
                                                                n_resamples=20).table)


def test_property_matrix_rejects_constant_input():
    message = (r"^no file property varies across these images, so there is nothing to classify with; "
               r"pass the output of crslib\.data\.file_properties for the whole data set$")
    with pytest.raises(InputError, match=message):
        S.property_matrix(pd.DataFrame({"image_id": ["a", "b"], "format": ["PNG", "PNG"]}))
    with pytest.raises(InputError, match=message):  # no images at all: the same error, not numpy's
        S.property_matrix(pd.DataFrame({"image_id": pd.Series([], dtype=object), "size": pd.Series([], dtype=float)}))


# --------------------------------------------------------------------------- provenance and run_audit


def test_split_provenance_counts_and_leaks():
    m = pd.DataFrame({
        "image_id": [f"i{k}" for k in range(6)],
        "patient_id": ["p1", "p1", "p2", "p3", "p3", "p4"],
        "split": ["train", "test", "train", "val", "val", "test"],
        "label": ["A", "B", "A", "B", "B", "A"],
    })
    facts = A.split_provenance(m)
    by_split = {s["split"]: s for s in facts["splits"]}
    assert [s["split"] for s in facts["splits"]] == ["train", "val", "test"]
    assert by_split["train"] == {"split": "train", "images": 2, "patients": 2, "classes": {"A": 2}}
    assert by_split["val"]["patients"] == 1
    assert facts["n_patients_in_several_splits"] == 1
    assert facts["patients_in_several_splits"] == [{"patient_id": "p1", "splits": ["test", "train"]}]


def test_split_provenance_reads_rows_by_label_and_falls_back_to_image_ids():
    m = pd.DataFrame({
        "image_id": [f"i{k}" for k in range(8)],
        "patient_id": ["p1", "p1", "p2", "p2", "p3", "p3", "p4", "p4"],
        "split": ["train", "test", "train", "train", "val", "val", "test", "test"],
        "label": ["A", "B", "A", "B", "B", "A", "A", "A"],
    })
    # a filtered manifest keeps its row labels: its facts are those of the same rows renumbered
    subset = m.iloc[[1, 2, 3, 4, 6, 7]]
    assert list(subset.index) != list(range(len(subset)))
    assert A.split_provenance(subset) == A.split_provenance(subset.reset_index(drop=True))
    facts = A.split_provenance(subset)
    assert [(s["split"], s["images"], s["patients"]) for s in facts["splits"]] == [
        ("train", 2, 1), ("val", 1, 1), ("test", 3, 2)]
    # without patient ids every image is its own patient
    by_image = A.split_provenance(m.drop(columns="patient_id"))
    assert [s["patients"] for s in by_image["splits"]] == [3, 2, 3] and by_image["n_patients"] == 8
    assert by_image["n_patients_in_several_splits"] == 0
    with pytest.raises(DataError) as info:
        A.split_provenance(m.drop(columns="split"))
    assert str(info.value) == "manifest has no 'split' column; columns present: ['image_id', 'patient_id', 'label']"


def test_split_provenance_labels_groups_and_the_listed_patients():
    m = pd.DataFrame({"image_id": [f"i{k}" for k in range(5)], "split": ["train", "test", "train", "train", "test"],
                      "label": [1, "unknown", 1, 0, 1]})
    # labels of mixed types: numbers first, by value, then text
    facts = A.split_provenance(m, groups=[7, 7, 2.5, 3, 3])
    assert list(facts["splits"][0]["classes"]) == ["0", "1"]
    assert list(facts["splits"][1]["classes"]) == ["1", "unknown"]
    # patient ids keep their own text: 7 is "7", not "7.0" as in an all-float array
    assert facts["patients_in_several_splits"] == [{"patient_id": "3", "splits": ["test", "train"]},
                                                   {"patient_id": "7", "splits": ["test", "train"]}]
    assert "classes" not in A.split_provenance(m, label_column="grade")["splits"][0]
    # at most 20 patients are listed, all are counted
    many = pd.DataFrame({"image_id": [f"i{k}" for k in range(50)], "patient_id": [f"p{k // 2:02d}" for k in range(50)],
                         "split": ["train", "test"] * 25})
    facts = A.split_provenance(many)
    assert facts["n_patients_in_several_splits"] == 25
    assert [p["patient_id"] for p in facts["patients_in_several_splits"]] == [f"p{k:02d}" for k in range(20)]


def test_patient_groups_treat_a_loader_filled_patient_id_as_absent(caplog):
    m = pd.DataFrame({"image_id": ["a", "b"], "patient_id": ["a", "b"]})
    notes: list[str] = []
    assert list(A._patient_groups(m.assign(patient_id=["p", "p"]), notes)) == ["p", "p"] and notes == []
    m.attrs["filled_columns"] = ["patient_id"]  # the loader copied the image ids: no patient is known
    with caplog.at_level(logging.WARNING, logger="crslib.audit"):
        assert list(A._patient_groups(m.assign(patient_id=["p", "p"]), notes)) == ["a", "b"]
    assert notes == [caplog.records[-1].getMessage()] == [
        "the manifest has no patient_id: every image is treated as its own patient, so images of one patient may "
        "sit in different CV folds and the numbers can be optimistic"]
    # neither patient nor image ids: each row is its own patient
    assert list(A._patient_groups(pd.DataFrame({"split": ["train", "test", "test"]}), [])) == ["0", "1", "2"]


def test_embeddings_are_one_finite_row_per_manifest_row():
    assert A._check_embeddings(None, 2) is None
    checked = A._check_embeddings([[1, 2], [3, 4]], 2)
    assert checked.dtype.kind == "f" and checked.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(InputError) as info:
        A._check_embeddings(np.zeros((3, 2)), 2)
    assert str(info.value) == ("embeddings have shape (3, 2) but the manifest has 2 rows; pass one embedding row "
                               "per manifest row, in the same order")
    with pytest.raises(InputError) as info:
        A._check_embeddings(np.array([[1.0, np.nan], [0.0, 0.0]]), 2)
    assert str(info.value).startswith("embeddings has NaN or infinite values in 1 row(s) (first: [0])")


def test_permutation_counts_default_to_none_for_embeddings_too_large_to_refit():
    limit, default = A.EMBEDDING_PERMUTATION_LIMIT, A.DEFAULT_PERMUTATIONS
    notes: list[str] = []
    assert A._permutation_counts(None, None, 5, notes) == (default, default)
    assert A._permutation_counts(None, np.zeros((limit // 4, 4)), 5, notes) == (default, default)  # at the limit
    assert notes == []
    assert A._permutation_counts(None, np.zeros((limit // 4 + 1, 4)), 5, notes) == (default, 0)
    assert notes == [f"no permutation test for the embeddings ({limit // 4 + 1} x 4 values would need "
                     f"{default * 5} refits); pass n_permutations to run one"]
    # a count that is given applies to both, however large the embeddings
    notes.clear()
    assert A._permutation_counts(30, np.zeros((limit // 4 + 1, 4)), 5, notes) == (30, 30) and notes == []
    assert A._permutation_counts(0, None, 5, notes) == (0, 0) and notes == []
    assert A._permutation_counts(9, None, 5, notes) == (9, 9)
    assert notes == ["with 9 permutations the smallest possible p is 0.100: too few to decide; use at least 20"]
    with pytest.raises(InputError) as info:
        A._permutation_counts(-1, None, 5, [])
    assert str(info.value) == "n_permutations must be an integer >= 0, got -1"


@pytest.fixture(scope="module")
def audit_result(phantoms):
    d = phantoms["kermany_shortcut"]
    emb = _pixel_embeddings(d["manifest"])
    return A.run_audit(d["manifest"], d["props"], embeddings=emb, embedding_name="pixels 16x16",
                       n_resamples=200, n_repeats=2, n_permutations=9)


def test_run_audit_combines_the_audits(audit_result, phantoms):
    m = phantoms["kermany_shortcut"]["manifest"]
    r = audit_result
    assert r.n_images == len(m)
    assert r.embedding_name == "pixels 16x16"
    # the embeddings' partition audit is partition_audit of those embeddings with the audit's settings
    emb = r.partition_embeddings
    expected = A.partition_audit(_pixel_embeddings(m), m["split"], groups=m["patient_id"], labels=m["label"],
                                 n_resamples=200, n_permutations=9)
    pd.testing.assert_frame_equal(emb.table, expected.table)
    n_test = int((m["split"] == "test").sum())
    assert emb.table["scope"].tolist() == ["all", "class=0", "class=1"]
    assert emb.table.loc[0, ["n_pool", "n_test"]].tolist() == [len(m) - n_test, n_test]
    assert int(emb.is_test.sum()) == n_test and bool(emb.used.all())
    assert emb.n_permutations == 9 and emb.null.shape == (9, 3) and emb.shared_patients == []
    # the shortcut's file encodings change the pixels too, so the pixel embeddings also find the test split
    assert emb.auc > 0.9
    # the shortcut lives in the pool's files only, so file properties also give the test split away
    assert r.partition_properties.auc > 0.9
    assert r.shortcut.pool_balanced_accuracy >= 0.9
    splits = {s["split"]: s for s in r.provenance["splits"]}
    assert splits["test"]["images"] == int((m["split"] == "test").sum())
    assert splits["test"]["patients"] == m.loc[m["split"] == "test", "patient_id"].nunique()
    assert r.provenance["n_patients_in_several_splits"] == 0
    # 9 permutations cannot reach p < 0.05, and the result says so; without fingerprints, no leakage audit
    assert r.notes == ["with 9 permutations the smallest possible p is 0.100: too few to decide; use at least 20",
                       A.NO_FINGERPRINTS]
    assert r.leakage is None and r.to_dict()["leakage"] is None


def test_audit_to_dict_is_json_ready(audit_result):
    d = audit_result.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text)["paper"] == {"partition_auc": 0.697, "partition_auc_normal": 0.898,
                                         "shortcut_pool": 0.992, "shortcut_test": 0.496}
    auc = d["partition_properties"]["table"][0]["auc"]
    assert auc == round(auc, 4)
    assert [row["scope"] for row in d["shortcut"]["table"]] == ["pool", "test"]
    assert json.loads(audit_result.to_json()) == d


def test_checklist_evidence_fills_the_split_and_shortcut_items(audit_result, phantoms):
    from crslib.checklist import build_checklist

    m = phantoms["kermany_shortcut"]["manifest"]
    evidence = audit_result.checklist_evidence(data="phantom<kermany>", source="test")
    assert set(evidence) == {"split", "shortcut"}
    json.dumps(evidence, allow_nan=False)  # plain values, ready for evidence.json
    checklist = build_checklist(evidence)
    status = {item.item_id: item.status for item in checklist.items}
    assert status["split"] == "complete" and status["shortcut"] == "complete"
    assert [k for k, v in status.items() if v == "complete"] == ["split", "shortcut"]

    split = evidence["split"]
    emb = audit_result.partition_embeddings.table.set_index("scope")
    props = audit_result.partition_properties.table.set_index("scope")
    assert split["partition_auc"] == {"estimate": emb.loc["all", "auc"], "low": emb.loc["all", "low"],
                                      "high": emb.loc["all", "high"]}
    assert split["partition_auc_file_properties"]["estimate"] == props.loc["all", "auc"]
    assert split["partition_auc_by_class"] == {scope: emb.loc[scope, "auc"] for scope in emb.index}
    assert split["partition_model"] == "logistic regression on pixels 16x16 embeddings"
    assert split["patients_disjoint"] is True
    counts = m["split"].value_counts()
    assert split["provenance"] == ("official split of the data set (phantom<kermany>): "
                                   + ", ".join(f"{k} {v}" for k, v in counts.items()) + " images")
    assert split["effect"]["value"] == emb.loc["all", "auc"] and split["effect"]["unit"] == "AUC"
    assert split["effect"]["paper"] == A.PAPER_NUMBERS["partition_auc"] and split["effect"]["source"] == "test"

    shortcut = evidence["shortcut"]
    table = audit_result.shortcut.table.set_index("scope")
    assert shortcut["pool_balanced_accuracy"]["estimate"] == table.loc["pool", "balanced_accuracy"]
    assert shortcut["test_balanced_accuracy"] == {"estimate": table.loc["test", "balanced_accuracy"],
                                                  "low": table.loc["test", "low"], "high": table.loc["test", "high"]}
    assert shortcut["features"] == sorted(c for c in phantoms["kermany_shortcut"]["props"].columns if c != "image_id")
    alone = audit_result.shortcut.importances.sort_values("alone", ascending=False)
    assert shortcut["top_features"] == alone["feature"].head(5).tolist()
    assert shortcut["effect"]["paper"] == A.PAPER_NUMBERS["shortcut_pool"]
    assert f"on the test split it is {table.loc['test', 'balanced_accuracy']:.3f}" in shortcut["effect"]["description"]


def test_checklist_evidence_without_embeddings_uses_file_properties(phantoms):
    d = phantoms["kermany_null"]
    result = A.run_audit(d["manifest"], d["props"], n_resamples=50, n_repeats=1, n_splits=3, n_permutations=0,
                         model="forest")
    split = result.checklist_evidence(data="null")["split"]
    props = result.partition_properties.table.set_index("scope")
    assert split["partition_auc"]["estimate"] == props.loc["all", "auc"] == split["partition_auc_file_properties"][
        "estimate"]
    assert split["partition_model"] == "random forest on file properties"
    assert split["effect"]["description"].endswith("file properties")
    assert split["effect"]["source"] == "crs audit"


def test_render_audit_html_is_self_contained(audit_result):
    page = render_audit_html(audit_result)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for number in ("0.697", "0.898", "0.992", "0.496"):
        assert number in page
    assert "the paper's numbers, not this data's" in page
    assert "pixels 16x16" in page
    assert page.count("<table>") >= 5
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<script" not in page and "@import" not in page
    pool = audit_result.shortcut.table.set_index("scope").loc["pool", "balanced_accuracy"]
    assert f"{pool:.3f}" in page


# --------------------------------------------------------------------------- verdicts and their wording


def _section(page: str, heading: str) -> str:
    """The text of the report's <h2> section that starts with ``heading``."""
    start = page.index(f"<h2>{heading}")
    end = page.find("<h2>", start + 1)
    return page[start:] if end == -1 else page[start:end]


def _audit_of(parts: dict, shortcut: S.ShortcutAuditResult, manifest: pd.DataFrame) -> A.AuditResult:
    """An AuditResult assembled from separately computed audits (the report reads nothing else)."""
    return A.AuditResult(n_images=len(manifest), label_column="label", pool=("train", "val"), test="test",
                         provenance=A.split_provenance(manifest), partition_properties=parts["properties"],
                         shortcut=shortcut, partition_embeddings=parts["embeddings"], embedding_name="pixels")


def test_too_few_permutations_give_no_verdict(audit_result):
    # 9 permutations: the smallest possible p is 1/10, so p < 0.05 is out of reach whatever the data
    assert audit_result.shortcut.pool_balanced_accuracy >= 0.9
    note = "with 9 permutations the smallest possible p is 0.100: too few to decide; use at least 20"
    d = audit_result.to_dict()
    for part in ("shortcut", "partition_properties", "partition_embeddings"):
        assert d[part]["permutation_note"] == note, part
        assert {row["evidence"] for row in d[part]["table"]} == {"too few permutations"}, part
    page = render_audit_html(audit_result)
    assert "indistinguishable from chance" not in page
    assert "no evidence" not in page and "not evidence" not in page
    for heading in ("Partition classifier on file properties", "Partition classifier on embeddings",
                    "Shortcut classifier"):
        assert "smallest possible p is 0.100: too few to decide" in _section(page, heading), heading


def test_enough_permutations_decide_and_report_the_null(partition_results):
    for name, verdict in (("std_null", "no"), ("std_shift", "yes")):
        res = partition_results[name]["embeddings"]
        row = res.table.iloc[0]
        null = res.null[:, 0]
        assert row["null_mean"] == pytest.approx(null.mean())
        assert [row["null_low"], row["null_high"]] == pytest.approx(np.quantile(null, [0.025, 0.975]).tolist())
        assert row["evidence"] == verdict
        record = res.to_dict()["table"][0]
        assert record["null_mean"] == round(row["null_mean"], 4) and record["null_high"] == round(row["null_high"], 4)
        assert res.to_dict()["permutation_note"] == ""


def test_report_reads_the_partition_auc_against_its_null(partition_results, shortcut_results, phantoms):
    pages = {name: render_audit_html(_audit_of(partition_results[name], shortcut_results["std_null"],
                                               phantoms[name]["manifest"]))
             for name in ("std_null", "std_shift")}
    null = _section(pages["std_null"], "Partition classifier on embeddings")
    row = partition_results["std_null"]["embeddings"].table.iloc[0]
    assert f"mean {row['null_mean']:.3f}" in null and f"{row['null_low']:.3f} to {row['null_high']:.3f}" in null
    assert "not evidence of a difference" in null
    assert "evidence that the test split differs" not in null
    shift = _section(pages["std_shift"], "Partition classifier on embeddings")
    assert "evidence that the test split differs" in shift
    assert "not evidence" not in shift


def test_report_without_permutations_reads_an_auc_below_half_as_no_evidence(partition_results, shortcut_results,
                                                                            phantoms):
    # the review's case: a null data set's cross-validated AUC of 0.330 (0.262-0.411), no permutation test
    parts = dict(partition_results["std_null"])
    table = parts["embeddings"].table.copy()
    table.loc[0, ["auc", "low", "high", "p_value", "null_mean", "null_low", "null_high"]] = [
        0.330, 0.262, 0.411, np.nan, np.nan, np.nan, np.nan]
    table["evidence"] = "no permutation test"
    parts["embeddings"] = dataclasses.replace(parts["embeddings"], table=table, n_permutations=0,
                                              null=np.empty((0, len(table))))
    page = render_audit_html(_audit_of(parts, shortcut_results["std_null"], phantoms["std_null"]["manifest"]))
    text = _section(page, "Partition classifier on embeddings")
    assert "0.330" in text and "not evidence of a difference" in text
    assert "includes 0.5" not in text and "evidence that the test split differs" not in text


def test_report_labels_intervals_with_the_audits_confidence(phantoms):
    d = phantoms["std_null"]
    r = A.run_audit(d["manifest"], d["props"], n_resamples=50, n_repeats=1, n_splits=3, n_permutations=0,
                    confidence=0.9)
    assert r.partition_properties.confidence == r.shortcut.confidence == 0.9
    page = render_audit_html(r)
    assert "90% CI" in page and "Every interval is a 90%\npercentile bootstrap" in page
    assert "95%" not in page


def test_render_audit_html_rejects_other_objects():
    with pytest.raises(InputError, match="AuditResult"):
        render_audit_html({"not": "a result"})


def test_run_audit_without_patient_ids_warns(phantoms, caplog):
    d = phantoms["std_null"]
    m = d["manifest"].drop(columns=["patient_id"])
    with caplog.at_level(logging.WARNING, logger="crslib.audit"):
        r = A.run_audit(m, d["props"], n_resamples=50, n_repeats=1, n_splits=3, n_permutations=0)
    assert "no patient_id" in caplog.text
    assert any("treated as its own patient" in note for note in r.notes)


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def small(phantoms):
    d = phantoms["std_null"]
    return d["manifest"], d["props"]


def test_run_audit_resamples_a_thousand_times_and_repeats_ten_times_by_default(small):
    m, props = small
    by_default = A.run_audit(m, props, n_permutations=0)
    explicit = A.run_audit(m, props, n_repeats=10, n_permutations=0, n_resamples=1000)
    fewer = A.run_audit(m, props, n_repeats=1, n_permutations=0, n_resamples=999)
    pd.testing.assert_frame_equal(by_default.partition_properties.table, explicit.partition_properties.table)
    pd.testing.assert_frame_equal(by_default.shortcut.table, explicit.shortcut.table)
    pd.testing.assert_frame_equal(by_default.shortcut.importances, explicit.shortcut.importances)
    assert (by_default.shortcut.n_repeats, fewer.shortcut.n_repeats) == (10, 1)
    assert not by_default.shortcut.table[["low", "high"]].equals(fewer.shortcut.table[["low", "high"]])


def test_run_audit_requires_a_split_column(small):
    m, props = small
    assert error_message(A.run_audit, m.drop(columns=["split"]), props, error=DataError) == (
        "manifest has no 'split' column (or it was filled with 'unspecified'): the audit compares the official "
        "test split with the training pool. Add a 'split' column with train/val/test, or load a folder laid out "
        "as {train,val,test}/{CLASS}/ (e.g. Kermany's chest_xray)")


def test_run_audit_rejects_a_filled_split_column(small):
    m, props = small
    m = m.copy()
    m.attrs["filled_columns"] = ["split"]
    with pytest.raises(DataError, match="no 'split' column"):
        A.run_audit(m, props)


def test_no_official_test_split_is_explained(small):
    m, props = small
    no_test = m.assign(split=m["split"].replace({"test": "train"}))
    with pytest.raises(DataError, match=r"no row has split == 'test'.*split='test'"):
        A.run_audit(no_test, props)
    X = np.zeros((len(m), 2)) + np.arange(len(m))[:, None]
    with pytest.raises(DataError, match="no row has split == 'test'"):
        A.partition_audit(X, no_test["split"], groups=m["patient_id"])
    with pytest.raises(DataError, match="no row is in the training pool"):
        A.partition_audit(X, np.full(len(m), "test"), groups=m["patient_id"])


def test_single_class_in_a_split_is_rejected(small):
    m, props = small
    one_class = m.assign(label=np.where(m["split"] == "test", 1, m["label"]))
    assert error_message(A.run_audit, one_class, props, error=DataError) == (
        "the 'test' split holds a single class ('1') in 'label'; the shortcut audit needs both classes in the pool "
        "and in the test split")
    one_class_pool = m.assign(label=np.where(m["split"] != "test", 1, m["label"]))
    assert error_message(A.run_audit, one_class_pool, props, error=DataError).startswith(
        "the pool ['train', 'val'] holds a single class ('1') in 'label';")
    # the message names the label column it read
    with pytest.raises(DataError, match=r"the 'test' split holds a single class \('1'\) in 'diagnosis'"):
        A.run_audit(one_class.rename(columns={"label": "diagnosis"}), props, label_column="diagnosis")
    X = S.property_matrix(props)
    with pytest.raises(InputError, match=r"'test' split holds a single class"):
        S.shortcut_audit(X, one_class["label"], m["split"], groups=m["patient_id"])


def test_label_with_nan_is_rejected(small):
    m, props = small
    labels = m["label"].astype(float)
    labels.iloc[3] = np.nan
    assert error_message(A.run_audit, m.assign(label=labels), props, error=DataError) == (
        "label column 'label' is missing in 1 row(s) (first rows: [3]); fill in the labels or drop those rows")
    labels.iloc[[5, 8, 13, 21, 34, 55]] = np.nan  # seven in all: the message names the first five
    assert error_message(A.run_audit, m.assign(label=labels), props, error=DataError) == (
        "label column 'label' is missing in 7 row(s) (first rows: [3, 5, 8, 13, 21]); fill in the labels or drop "
        "those rows")
    with pytest.raises(InputError, match="labels is missing"):
        S.shortcut_audit(S.property_matrix(props), labels, m["split"], groups=m["patient_id"])
    assert error_message(A.run_audit, m, props, label_column="finding", error=DataError) == (
        f"manifest has no label column 'finding'; columns present: {list(map(str, m.columns))}. "
        "Pass label_column=<name>")


def test_misaligned_inputs_are_rejected(small):
    m, props = small
    assert error_message(A.run_audit, m.to_dict("list"), props, error=DataError) == (
        "manifest must be a pandas DataFrame, got dict")
    assert error_message(A.run_audit, m, props.to_numpy(), error=DataError) == (
        "properties must be a DataFrame from crslib.data.file_properties(manifest), got ndarray")
    X = S.property_matrix(props)
    with pytest.raises(InputError, match=r"split has \d+ values but X has \d+ rows"):
        A.partition_audit(X, m["split"].iloc[:-1], groups=m["patient_id"])
    with pytest.raises(InputError, match="groups has"):
        S.shortcut_audit(X, m["label"], m["split"], groups=m["patient_id"].iloc[:10])
    n = len(m)
    assert error_message(A.run_audit, m, props.iloc[:-1], error=DataError) == (
        f"properties have {n - 1} rows but the manifest has {n}; compute them with "
        "crslib.data.file_properties(manifest) for the same manifest")
    assert error_message(A.run_audit, m, props.iloc[::-1].reset_index(drop=True), error=DataError) == (
        f"properties are not aligned with the manifest: row 0 has image_id {props['image_id'].iloc[-1]!r} vs "
        f"{m['image_id'].iloc[0]!r}; compute them with crslib.data.file_properties(manifest) and keep the row order")
    assert error_message(A.run_audit, m, props, embeddings=np.zeros((3, 4)), n_resamples=20, n_repeats=1) == (
        f"embeddings have shape (3, 4) but the manifest has {n} rows; pass one embedding row per manifest row, in "
        "the same order")


def test_bad_arguments_are_rejected(small):
    m, props = small
    X = S.property_matrix(props)
    split, groups = m["split"], m["patient_id"]
    with pytest.raises(InputError, match="groups is required"):
        A.partition_audit(X, split, groups=None)
    with pytest.raises(InputError, match="NaN"):
        A.partition_audit(np.full((len(m), 2), np.nan), split, groups=groups)
    with pytest.raises(InputError, match="non-numeric"):
        A.partition_audit(props, split, groups=groups)
    with pytest.raises(InputError, match="model must be"):
        A.partition_audit(X, split, groups=groups, model="svm")
    with pytest.raises(InputError, match="also in pool"):
        A.partition_audit(X, split, groups=groups, pool=("train", "test"))
    with pytest.raises(InputError, match="fewer than n_splits=500"):
        A.partition_audit(X, split, groups=groups, n_splits=500)
    with pytest.raises(InputError, match="n_resamples"):
        A.partition_audit(X, split, groups=groups, n_resamples=0)
    with pytest.raises(InputError, match="never in the pool"):
        labels = np.where(split == "test", np.where(np.arange(len(m)) % 2, "new", "old"), "old")
        labels = np.where((split != "test") & (np.arange(len(m)) % 3 == 0), "other", labels)
        S.shortcut_audit(X, labels, split, groups=groups)
    assert issubclass(InputError, CRSError) and issubclass(DataError, CRSError)


def test_shortcut_test_score_comes_from_a_pool_only_fit():
    """A property that carries the label only on the test split must not help there.

    Column 0 equals the label in the pool and is 0 on the test split; column 1 is
    0 in the pool and equals the label on the test split. A model fitted on the
    pool has no weight on column 1 and calls every test row class 0 (balanced
    accuracy exactly 0.5); one that also saw the test rows would score 1.0.
    """
    rng = np.random.default_rng(11)
    n = 400
    split = np.where(np.arange(n) % 4 == 0, "test", "train")
    y = rng.integers(0, 2, n)
    in_test = split == "test"
    X = np.zeros((n, 2))
    X[:, 0] = np.where(in_test, 0.0, y)
    X[:, 1] = np.where(in_test, y, 0.0)
    res = S.shortcut_audit(X, y, split, groups=np.arange(n), n_resamples=50, n_repeats=1)
    assert res.pool_balanced_accuracy > 0.95
    assert res.test_balanced_accuracy == pytest.approx(0.5)


# --------------------------------------------------------------------------- leakage: duplicates and shared patients


def _leakage_audit_of(folder: tuple[pd.DataFrame, object], **options) -> A.AuditResult:
    manifest, fingerprints = folder
    return A.run_audit(manifest, file_properties(manifest), fingerprints=fingerprints, n_resamples=20, n_repeats=1,
                       n_splits=3, n_permutations=0, **options)


@pytest.fixture(scope="module")
def leaky_audits(folders):  # noqa: F811 - the fixture imported from test_leakage
    return {name: _leakage_audit_of(folders[name]) for name in ("leaky", "distinct")}


def test_run_audit_with_fingerprints_reports_the_planted_duplicates(leaky_audits, folders):  # noqa: F811
    result = leaky_audits["leaky"]
    manifest, fingerprints = folders["leaky"]
    expected = leakage_audit(manifest, fingerprints)
    assert result.leakage is not None and result.leakage.embedding is None
    d = json.loads(result.to_json())["leakage"]
    assert d == json.loads(expected.to_json())
    # the planted copies: three exact copies across pool and test, one between train and val
    assert d["exact"]["pairs"] == {"across": 3, "within": 0, "between_pool": 1, "other": 0}
    counts = {row["kind"]: row for row in d["counts"]}
    assert counts["exact"]["across"] == 3 and counts["exact"]["test_images"] == 3
    assert counts["near"]["counted"] == "yes" and counts["patient"]["across"] == 0
    assert d["n_leaked_test_images"] == len(expected.leaked_test_ids()) > 3
    assert len(d["exact"]["clusters"]) == 4 and d["exact"]["clusters"][0]["scope"] == "across"
    assert A.NO_FINGERPRINTS not in result.notes


def test_run_audit_passes_its_embeddings_and_pool_to_the_leakage_audit(folders):  # noqa: F811
    manifest, fingerprints = folders["leaky"]
    manifest = manifest.assign(split=manifest["split"].replace("test", "holdout"))
    emb = np.random.default_rng(4).normal(size=(len(manifest), 8))
    result = _leakage_audit_of((manifest, fingerprints), embeddings=emb, pool=("train",), test="holdout")
    expected = leakage_audit(manifest, fingerprints, emb, pool=("train",), test="holdout")
    assert result.leakage.embedding is not None
    assert json.loads(result.to_json())["leakage"] == json.loads(expected.to_json())
    assert json.loads(expected.to_json()) != json.loads(
        leakage_audit(manifest, fingerprints, emb, test="holdout").to_json())


def test_run_audit_records_the_provenance_of_its_label_column_and_patients(small):
    m, props = small
    m = m.rename(columns={"label": "diagnosis"})
    test_patient = m.loc[m["split"] == "test", "patient_id"].iloc[0]
    m.loc[m.index[(m["patient_id"] == test_patient).to_numpy()][0], "split"] = "train"  # one image moves to the pool
    result = A.run_audit(m, props, label_column="diagnosis", n_resamples=20, n_repeats=1, n_splits=3,
                         n_permutations=0)
    expected = A.split_provenance(m, label_column="diagnosis", groups=m["patient_id"].astype(str).to_numpy())
    assert json.dumps(result.provenance, sort_keys=True, default=str) == json.dumps(expected, sort_keys=True,
                                                                                    default=str)
    assert expected["n_patients_in_several_splits"] == 1
    assert "1 patient(s) have images in more than one split" in result.notes
    assert result.label_column == "diagnosis"
    assert json.dumps(expected, default=str) != json.dumps(A.split_provenance(m, label_column=None), default=str)


def test_run_audit_records_its_inputs_and_notes_the_files_that_could_not_be_read(small):
    m, props = small
    options = dict(n_resamples=20, n_repeats=1, n_splits=3, n_permutations=0)
    readable = A.run_audit(m, props, embedding_name="a model whose embeddings were not given", **options)
    assert not any("could not be read" in note for note in readable.notes)
    assert readable.partition_embeddings is None and readable.embedding_name is None  # no embeddings were given
    # the report lists the file properties read and the columns the classifiers saw
    assert readable.file_properties == [str(c) for c in props.columns] and "image_id" in readable.file_properties
    assert readable.property_columns == list(S.property_matrix(props).features.columns)
    assert "image_id" not in readable.property_columns
    unreadable = props.assign(readable=np.arange(len(props)) >= 2)
    notes = A.run_audit(m, unreadable, **options).notes
    assert "2 file(s) could not be read; their properties are missing (kept as rows)" in notes


def test_run_audit_passes_its_options_to_each_audit_it_combines(small):
    """Each part equals the direct call with the same non-default options, and differs from the defaults'."""
    m, props = small
    from sklearn.ensemble import RandomForestClassifier

    # a small forest: not the default model, so dropping it changes the result ("forest"'s 200 trees cost
    # 40 s here; the name is tested in test_forest_model_and_estimator_are_accepted)
    forest = RandomForestClassifier(n_estimators=15, min_samples_leaf=2, class_weight="balanced", random_state=0)
    options = dict(pool=("train",), n_splits=3, n_resamples=40, confidence=0.8, random_state=3, model=forest)
    emb = np.random.default_rng(0).normal(size=(len(m), 3))
    result = A.run_audit(m, props, embeddings=emb, n_repeats=1, n_permutations=2, **options)
    X = S.property_matrix(props)
    split, groups, labels = m["split"], m["patient_id"].astype(str), m["label"].to_numpy(dtype=object)
    for part, features in ((result.partition_properties, X), (result.partition_embeddings, emb)):
        expected = A.partition_audit(features, split, groups=groups, labels=labels, n_permutations=2, **options)
        pd.testing.assert_frame_equal(part.table, expected.table)
        np.testing.assert_array_equal(part.null, expected.null)
        assert part.table["scope"].tolist() == ["all", "class=0", "class=1"]
        assert part.table.loc[0, "n_pool"] == int((split == "train").sum())  # val rows are outside this pool
    shortcut = S.shortcut_audit(X, labels, split, groups=groups, n_repeats=1, n_permutations=2, **options)
    pd.testing.assert_frame_equal(result.shortcut.table, shortcut.table)
    pd.testing.assert_frame_equal(result.shortcut.importances, shortcut.importances)
    # each option changes the result here, so a part that dropped one would not equal its direct call
    for dropped in options:
        other = A.partition_audit(X, split, groups=groups, labels=labels, n_permutations=2,
                                  **{k: v for k, v in options.items() if k != dropped})
        assert not other.table.equals(result.partition_properties.table), dropped


def test_run_audit_without_any_id_counts_images_as_patients_and_skips_permutations_of_large_embeddings(
        small, monkeypatch):
    m, props = small
    m = m.drop(columns=["patient_id", "image_id"])
    monkeypatch.setattr(A, "EMBEDDING_PERMUTATION_LIMIT", 10)
    monkeypatch.setattr(A, "DEFAULT_PERMUTATIONS", 3)
    emb = np.random.default_rng(1).normal(size=(len(m), 2))
    result = A.run_audit(m, props, embeddings=emb, n_resamples=20, n_repeats=1, n_splits=4)
    assert all(s["patients"] == s["images"] for s in result.provenance["splits"])
    assert result.provenance["n_patients_in_several_splits"] == 0
    expected = A.split_provenance(m, groups=np.arange(len(m)).astype(str))
    assert json.dumps(result.provenance, default=str) == json.dumps(expected, default=str)
    assert (result.partition_properties.n_permutations, result.shortcut.n_permutations) == (3, 3)
    assert result.partition_embeddings.n_permutations == 0
    assert (f"no permutation test for the embeddings ({len(m)} x 2 values would need 12 refits); pass "
            "n_permutations to run one") in result.notes


def test_fingerprints_of_another_manifest_are_refused_by_run_audit(folders):  # noqa: F811
    manifest, _ = folders["leaky"]
    _, other = folders["distinct"]
    with pytest.raises(InputError, match="recompute them with image_fingerprints"):
        A.run_audit(manifest, file_properties(manifest), fingerprints=other, n_resamples=20, n_repeats=1,
                    n_splits=3, n_permutations=0)


def test_checklist_item_1_is_a_concern_with_a_cross_split_exact_duplicate(leaky_audits):
    leaky = leaky_audits["leaky"].checklist_evidence(data="leaky")["split"]
    distinct = leaky_audits["distinct"].checklist_evidence(data="distinct")["split"]
    assert leaky["leakage"]["exact_duplicates_across"] == 3 and leaky["leakage"]["exact_test_images"] == 3
    assert distinct["leakage"]["exact_duplicates_across"] == 0
    assert distinct["leakage"]["possible_same_patients_across"] == 0
    assert leaky["confidence"] == 0.95
    # patients_disjoint is the manifest's ids; the unscoped person numbers of every file name were compared too
    n_images = leaky_audits["leaky"].n_images
    assert leaky["patients_disjoint"] is True
    basis = leaky["patients_disjoint_basis"]
    assert f"the raw person numbers of {n_images} Kermany file name(s) were compared" in basis
    concern = build_checklist({"split": leaky})["split"].concern
    assert "exact duplicate images cross the split (3 clusters, 3 test images)" in concern
    item = build_checklist({"split": distinct})["split"]
    assert item.complete and "duplicate" not in item.concern and "patient" not in item.concern


def test_checklist_reports_an_audit_without_fingerprints_as_not_measured(phantoms):
    d = phantoms["kermany_null"]
    result = A.run_audit(d["manifest"], d["props"], n_resamples=20, n_repeats=1, n_splits=3, n_permutations=0,
                         confidence=0.9)
    split = result.checklist_evidence(data="null")["split"]
    assert split["leakage"] == "not measured: " + A.NO_FINGERPRINTS
    assert split["confidence"] == 0.9 and result.checklist_evidence(data="null")["shortcut"]["confidence"] == 0.9
    markdown = build_checklist({"split": split}).to_markdown()
    assert "leakage: not measured: no image fingerprints" in markdown


def _noise_png(path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (24, 24), dtype=np.uint8)).save(path)


def test_audit_html_shows_the_clusters_across_the_split_escaped_with_thumbnails(audit_result, tmp_path):
    """14 images of the pool copied into the test split: 12 clusters shown (with thumbnails), 2 counted."""
    rows = []
    for k in range(14):
        name = "<b>x</b>.png" if k == 0 else f"pool{k}.png"  # "<b>x<" is a folder, "b>.png" its file
        _noise_png(tmp_path / "train" / name, k)
        _noise_png(tmp_path / "test" / f"copy{k}.png", k)
        rows += [("train", tmp_path / "train" / name), ("test", tmp_path / "test" / f"copy{k}.png")]
    _noise_png(tmp_path / "test" / "alone.png", 99)
    rows.append(("test", tmp_path / "test" / "alone.png"))
    manifest = pd.DataFrame({"image_id": [f"{s}/{p.name}" for s, p in rows], "path": [str(p) for _, p in rows],
                             "split": [s for s, _ in rows]})
    leakage = leakage_audit(manifest, image_fingerprints(manifest))
    assert leakage.exact.counts()["clusters"]["across"] == 14
    page = render_audit_html(dataclasses.replace(audit_result, leakage=leakage))
    section = _section(page, "Duplicates and shared patients")
    assert "&lt;b&gt;x&lt;/b&gt;.png" in section and "<b>x</b>" not in page
    assert section.count('<tr class="cluster">') == 12 and "2 more clusters across the split" in section
    assert section.count('src="data:image/png;base64,') == 24  # two thumbnails per cluster shown
    assert "exact duplicates across pool and test: 14 clusters (14 test images)" in section
    assert "possible" in section
    counts = _section(page, "Duplicates and shared patients").split("<table>")[1]
    assert "<td>exact</td>" in counts and ">14</td>" in counts


def test_audit_html_says_when_duplicates_were_not_audited(audit_result):
    page = render_audit_html(audit_result)
    section = _section(page, "Duplicates and shared patients")
    assert "not measured" in section and "image_fingerprints" in section


def test_audit_html_calls_an_uninformative_near_kind_not_informative(audit_result):
    n = 20
    manifest = pd.DataFrame({"image_id": [f"i{k}" for k in range(n)], "path": [f"i{k}.png" for k in range(n)],
                             "split": ["train"] * 12 + ["test"] * 8})
    from crslib.duplicates import ImageFingerprints

    fingerprints = ImageFingerprints(image_ids=manifest["image_id"].to_numpy(dtype=object),
                                     digests=np.array([f"d{k}" for k in range(n)], dtype=object),
                                     hashes=np.full((n, 1), 7, dtype=np.uint64), identity=0,
                                     stable=np.ones(n, dtype=bool), crop_fractions=(0.0,))
    page = render_audit_html(dataclasses.replace(audit_result, leakage=leakage_audit(manifest, fingerprints)))
    section = _section(page, "Duplicates and shared patients")
    assert "not informative on this data" in section
    assert '<tr class="cluster">' not in section  # the near kind's clusters are not shown as leaks


# --------------------------------------------------------------------------- leakage_effect


def _leaky_probe_data(seed: int = 0):
    """Pool: the label is in feature 0. Test: 40 clean patients (noise only) and 20 leaked ones (signal)."""
    rng = np.random.default_rng(seed)
    n_pool, n_clean, n_leak = 200, 80, 40
    y = np.r_[rng.integers(0, 2, n_pool), np.tile([0, 1], (n_clean + n_leak) // 2)]
    X = rng.normal(size=(len(y), 5))
    X[:n_pool, 0] += 3 * y[:n_pool]
    X[n_pool + n_clean:, 0] += 3 * y[n_pool + n_clean:]
    split = np.array(["train"] * n_pool + ["test"] * (n_clean + n_leak), dtype=object)
    groups = np.r_[np.arange(n_pool), n_pool + np.arange(n_clean + n_leak) // 2]
    leaked = np.r_[np.zeros(n_pool + n_clean, dtype=bool), np.ones(n_leak, dtype=bool)]
    return X, y, split, groups, leaked


def test_leakage_effect_is_the_probe_auroc_with_and_without_the_leaked_test_images():
    X, y, split, groups, leaked = _leaky_probe_data()
    table = leakage_effect(X, y, split, groups=groups, drop={"leaked": leaked, "every test image": split == "test"},
                             n_resamples=200)
    assert table["test_images"].tolist() == ["all", "leaked", "every test image"]
    pool, test = split != "test", split == "test"
    score = logistic_probe(1.0, 2000, 0).fit(X[pool], y[pool]).decision_function(X[test])
    everything, kept = auroc(y[test], score), auroc(y[test][~leaked[test]], score[~leaked[test]])
    rows = table.set_index("test_images")
    assert rows.loc["all", "auroc"] == pytest.approx(everything)
    assert rows.loc["leaked", "auroc"] == pytest.approx(kept)
    assert rows.loc["leaked", "change"] == pytest.approx(kept - everything) and kept < everything - 0.1
    assert rows.loc["leaked", ["n_images", "n_dropped", "n_patients"]].tolist() == [80, 40, 40]
    assert rows.loc["all", ["n_images", "n_dropped", "n_patients"]].tolist() == [120, 0, 60]
    assert rows.loc["leaked", "change_low"] <= kept - everything <= rows.loc["leaked", "change_high"] < 0
    assert rows.loc["all", "low"] <= everything <= rows.loc["all", "high"]
    assert np.isnan(rows.loc["every test image", "auroc"])
    assert rows.loc["every test image", "reason"] == "no test image left"
    assert rows.loc["leaked", "reason"] == "" and rows.loc["all", "reason"] == ""


def test_leakage_effect_refuses_bad_input():
    X, y, split, groups, leaked = _leaky_probe_data()
    with pytest.raises(InputError, match="drop mask 'leaked' has 10 values"):
        leakage_effect(X, y, split, groups=groups, drop={"leaked": leaked[:10]})
    with pytest.raises(InputError, match="two classes"):
        leakage_effect(X, np.arange(len(y)) % 3, split, groups=groups, drop={"leaked": leaked})
    with pytest.raises(InputError, match="only rows of the 'test' split"):
        leakage_effect(X, y, split, groups=groups, drop={"pool rows": split != "test"})


# --------------------------------------------------------------------------- shortcut contracts


def test_permutation_note_at_its_boundaries():
    """A note for 1 to 19 permutations, none for 0 (no test ran) or 20 and more."""
    assert S.permutation_note(1) == ("with 1 permutations the smallest possible p is 0.500: too few to decide; "
                                     "use at least 20")
    assert S.permutation_note(19).startswith("with 19 permutations the smallest possible p is 0.050")
    assert S.permutation_note(0) == S.permutation_note(20) == S.permutation_note(-3) == ""


def test_shortcut_result_to_dict_names_every_field_and_rounds_to_four_digits():
    table = pd.DataFrame({"scope": ["pool", "test"], "balanced_accuracy": [0.123456789, 0.5]})
    importances = pd.DataFrame({"feature": [f"f{i}" for i in range(25)], "importance_mean": np.linspace(1, 0, 25)})
    result = S.ShortcutAuditResult(table=table, importances=importances, classes=[0, 1],
                                   pool_predictions=np.zeros(2), test_predictions=np.zeros(2), folds=np.zeros(2),
                                   model="forest", n_splits=4, n_repeats=3, confidence=0.9, n_permutations=7)
    out = result.to_dict()
    assert out == {
        "model": "forest", "n_splits": 4, "n_repeats": 3, "n_permutations": 7,
        "permutation_note": S.permutation_note(7), "confidence": 0.9, "classes": ["0", "1"],
        "table": [{"scope": "pool", "balanced_accuracy": 0.1235}, {"scope": "test", "balanced_accuracy": 0.5}],
        "importances": [{"feature": f"f{i}", "importance_mean": round(float(v), 4)}
                        for i, v in enumerate(np.linspace(1, 0, 25)[:20])],
    }
    assert len(result.to_dict(top=3)["importances"]) == 3


def test_property_matrix_option_checks_and_the_category_cap():
    with pytest.raises(InputError, match=re.escape(
            "properties must be a DataFrame (see crslib.data.file_properties), got list")):
        S.property_matrix([1, 2])
    props = pd.DataFrame({"format": ["PNG", "JPEG", "PNG", "TIFF"]})
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(InputError, match=re.escape(f"max_categories must be an integer >= 1, got {bad!r}")):
            S.property_matrix(props, max_categories=bad)
    one = S.property_matrix(props, max_categories=1)  # the most frequent value, then the rest together
    assert list(one.features.columns) == ["format=PNG", "format=<other>"]
    # the default keeps 50 values of a text column; the 51st and beyond share <other>
    values = [f"v{i:02d}" for i in range(51) for _ in range(51 - i)]
    wide = S.property_matrix(pd.DataFrame({"maker": values}))
    assert len(wide.features.columns) == 51 and wide.features.columns[-1] == "maker=<other>"
    assert wide.features["maker=<other>"].sum() == 1  # v50 appears once
    assert set(wide.feature_groups.values()) == {"maker"}


def test_property_matrix_bool_column_with_missing_values_keeps_its_group():
    props = pd.DataFrame({"has_exif": pd.Series([True, None, False, True], dtype=object),
                          "size": [1.0, 2.0, 3.0, 4.0]})
    pm = S.property_matrix(props)
    assert pm.features["has_exif"].tolist() == [1.0, -1.0, 0.0, 1.0]
    assert pm.features["has_exif_missing"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert pm.feature_groups == {"has_exif": "has_exif", "has_exif_missing": "has_exif", "size": "size"}


def test_property_matrix_numbers_in_text_columns_infinities_and_missing_set_members():
    props = pd.DataFrame({
        "series_number": ["1", "2", "10", "2"],  # digits as text stay categories
        "window": pd.Series([1, None, pd.NaT, 4], dtype=object),  # numbers in an object column, NaT among them
        "file_size": [1.0, np.inf, 3.0, 4.0],  # an infinite size is as good as missing
        "png_chunks": ["a|nan", np.nan, "a", "b"],  # a member spelled like a missing value
    })
    pm = S.property_matrix(props)
    X = pm.features
    assert list(X.columns) == [
        "series_number=1", "series_number=10", "series_number=2", "window", "window_missing", "file_size",
        "file_size_missing", "png_chunks:a", "png_chunks:b", "png_chunks:nan", "png_chunks_missing"]
    assert X["series_number=10"].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert X["window"].tolist() == [1.0, -1.0, -1.0, 4.0] and X["window_missing"].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert X["file_size"].tolist() == [1.0, -1.0, 3.0, 4.0]
    assert X["file_size_missing"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert X["png_chunks:nan"].tolist() == [1.0, 0.0, 0.0, 0.0]  # the missing row holds no member
    assert X["png_chunks:a"].tolist() == [1.0, 0.0, 1.0, 0.0]


# --------------------------------------------------------------------------- result serialisation


def _partition_result(*, n_permutations: int = 5, shared: int = 25) -> A.PartitionAuditResult:
    table = pd.DataFrame({"scope": ["all", "class=1"], "auc": [0.123456789, float("nan")]})
    used = np.array([True, False, True, False, False])
    return A.PartitionAuditResult(table=table, scores=np.zeros(5), folds=np.zeros(5), is_test=np.zeros(5, bool),
                                  used=used, model="forest", n_splits=3,
                                  shared_patients=[f"p{i:02d}" for i in range(shared)], confidence=0.9,
                                  n_permutations=n_permutations)


def _shortcut_result() -> S.ShortcutAuditResult:
    table = pd.DataFrame({"scope": ["pool", "test"], "balanced_accuracy": [0.987654321, 0.5]})
    importances = pd.DataFrame({"feature": ["size"], "importance_mean": [0.333333333]})
    return S.ShortcutAuditResult(table=table, importances=importances, classes=["a", "b"],
                                 pool_predictions=np.zeros(2), test_predictions=np.zeros(2), folds=np.zeros(2))


def test_partition_result_to_dict_names_every_field_rounds_and_caps_the_patients():
    out = _partition_result().to_dict()
    assert out == {
        "model": "forest", "n_splits": 3, "confidence": 0.9, "n_permutations": 5,
        "permutation_note": S.permutation_note(5), "n_excluded": 3, "n_shared_patients": 25,
        "shared_patients": [f"p{i:02d}" for i in range(20)],
        "table": [{"scope": "all", "auc": 0.1235}, {"scope": "class=1", "auc": None}],
    }
    assert _partition_result(n_permutations=0, shared=0).to_dict()["permutation_note"] == ""


class _Leakage:
    """Stands in for a LeakageResult: what AuditResult.to_dict must pass through unrounded."""

    def to_dict(self):
        return {"similarity": 0.123456789}


def test_audit_result_to_dict_nests_every_part_and_keeps_the_leakage_precision():
    partition, shortcut = _partition_result(), _shortcut_result()
    result = A.AuditResult(n_images=7, label_column="diagnosis", pool=("train", "val"), test="test",
                           provenance={"share": 0.123456789}, partition_properties=partition, shortcut=shortcut,
                           partition_embeddings=_partition_result(n_permutations=30, shared=1),
                           embedding_name="resnet", property_columns=["size", "width"], notes=["no patient ids"],
                           file_properties=["size"], leakage=_Leakage())
    out = result.to_dict()
    assert out == {
        "n_images": 7, "label_column": "diagnosis", "pool": ["train", "val"], "test": "test",
        "provenance": {"share": 0.1235},
        "partition_properties": partition.to_dict(),
        "partition_embeddings": _partition_result(n_permutations=30, shared=1).to_dict(),
        "embedding_name": "resnet", "shortcut": shortcut.to_dict(), "leakage": {"similarity": 0.123456789},
        "property_columns": ["size", "width"], "notes": ["no patient ids"], "paper": A.PAPER_NUMBERS,
    }
    assert list(out) == ["n_images", "label_column", "pool", "test", "provenance", "partition_properties",
                         "partition_embeddings", "embedding_name", "shortcut", "leakage", "property_columns",
                         "notes", "paper"]
    bare = A.AuditResult(n_images=7, label_column="label", pool=("train",), test="test", provenance={},
                         partition_properties=partition, shortcut=shortcut).to_dict()
    assert bare["partition_embeddings"] is None and bare["leakage"] is None and bare["embedding_name"] is None
    assert bare["property_columns"] == [] and bare["notes"] == []


def _scored_partition(model: str, aucs: tuple[float, float]) -> A.PartitionAuditResult:
    table = pd.DataFrame({"scope": ["all", "class=1"], "auc": list(aucs), "low": [aucs[0] - 0.1, 0.0],
                          "high": [aucs[0] + 0.1, 1.0]})
    return A.PartitionAuditResult(table=table, scores=np.zeros(2), folds=np.zeros(2), is_test=np.zeros(2, bool),
                                  used=np.ones(2, bool), model=model, confidence=0.8)


def test_checklist_evidence_reads_every_number_from_the_results():
    shortcut = S.ShortcutAuditResult(
        table=pd.DataFrame({"scope": ["pool", "test"], "balanced_accuracy": [0.9, 0.51234], "low": [0.85, 0.45],
                            "high": [0.95, 0.57]}),
        importances=pd.DataFrame({"feature": [f"f{i}" for i in range(7)], "alone": [0.5, 0.9, 0.6, 0.8, 0.7, 0.1,
                                                                                     0.2]}),
        classes=[0, 1], pool_predictions=np.zeros(2), test_predictions=np.zeros(2), folds=np.zeros(2),
        confidence=0.9)
    provenance = {"splits": [{"split": "train", "images": 10}, {"split": "test", "images": 30}],
                  "n_patients_in_several_splits": 0}
    result = A.AuditResult(n_images=40, label_column="label", pool=("train",), test="test", provenance=provenance,
                           partition_properties=_scored_partition("logistic", (0.6, 0.55)), shortcut=shortcut,
                           partition_embeddings=_scored_partition("my-svm", (0.7, 0.65)), embedding_name="resnet",
                           file_properties=["width", "image_id", "bytes"])
    evidence = result.checklist_evidence(data="xray/", source="nb05")
    split = evidence["split"]
    assert split["provenance"] == "official split of the data set (xray/): test 30, train 10 images"
    assert split["patients_disjoint"] is True
    assert split["leakage"] == "not measured: " + A.NO_FINGERPRINTS
    assert split["patients_disjoint_basis"].endswith("raw person numbers not compared (no leakage audit)")
    assert split["confidence"] == 0.8
    assert split["partition_auc"] == {"estimate": 0.7, "low": pytest.approx(0.6), "high": pytest.approx(0.8)}
    assert split["partition_auc_file_properties"] == {"estimate": 0.6, "low": 0.5, "high": 0.7}
    assert split["partition_auc_by_class"] == {"all": 0.7, "class=1": 0.65}
    assert split["partition_model"] == "my-svm on resnet embeddings"  # a name the map does not know is kept
    assert split["effect"] == {
        "description": "partition classifier AUC (training pool vs official test split), resnet embeddings",
        "value": 0.7, "low": pytest.approx(0.6), "high": pytest.approx(0.8), "unit": "AUC",
        "paper": A.PAPER_NUMBERS["partition_auc"], "source": "nb05"}
    cut = evidence["shortcut"]
    assert cut["pool_balanced_accuracy"] == {"estimate": 0.9, "low": 0.85, "high": 0.95}
    assert cut["test_balanced_accuracy"] == {"estimate": 0.51234, "low": 0.45, "high": 0.57}
    assert cut["confidence"] == 0.9
    assert cut["features"] == ["bytes", "width"]
    assert cut["top_features"] == ["f1", "f3", "f4", "f2", "f0"]
    assert cut["effect"] == {
        "description": "balanced accuracy of a file-property classifier in the training pool (patient-grouped "
                       "CV); on the test split it is 0.512",
        "value": 0.9, "low": 0.85, "high": 0.95, "unit": "balanced accuracy",
        "paper": A.PAPER_NUMBERS["shortcut_pool"], "source": "nb05"}
    # without embeddings: the file properties' partition, under the map's names
    result.partition_embeddings, result.provenance = None, {**provenance, "n_patients_in_several_splits": 2}
    evidence = result.checklist_evidence(data="xray/")
    assert evidence["split"]["partition_model"] == "logistic regression on file properties"
    assert evidence["split"]["partition_auc"] == {"estimate": 0.6, "low": 0.5, "high": 0.7}
    assert evidence["split"]["patients_disjoint"] is False
    assert evidence["split"]["effect"]["source"] == evidence["shortcut"]["effect"]["source"] == "crs audit"


class _Counts:
    """Stands in for a LeakageResult: the attributes _leakage_evidence and _patients_basis read."""

    near_informative = False
    splits = np.array(["train", "test", "val", "val"])
    test = "test"

    class patients:  # noqa: N801  (mirrors LeakageResult.patients)
        id_sources = {"kermany_file_name": 12}

    def counts_table(self):
        return pd.DataFrame({"kind": ["exact", "embedding", "near", "patient"], "across": [3, np.nan, 5, 7],
                             "test_images": [2, np.nan, 4, 6]})


def test_leakage_evidence_reads_each_kind_and_says_what_was_not_measured():
    assert A._leakage_evidence(_Counts()) == {
        "exact_duplicates_across": 3, "exact_test_images": 2,
        "embedding_duplicates_across": None, "embedding_test_images": None,  # NaN: not measured
        "near_duplicates_across": 5, "near_test_images": 4, "near_informative": False,
        "possible_same_patients_across": 7, "possible_same_patient_test_images": 6, "n_test_images": 1}
    assert A._leakage_evidence(None) == "not measured: " + A.NO_FINGERPRINTS
    assert A._patients_basis(_Counts()).endswith(
        "; the raw person numbers of 12 Kermany file name(s) were compared across splits "
        "(leakage.possible_same_patients_across)")
    assert A._patients_basis(_Counts()).startswith("the manifest's patient_id (the Kermany loader scopes")


def test_patients_basis_says_exactly_what_was_compared():
    manifest_ids = "the manifest's patient_id (the Kermany loader scopes its person numbers by split)"
    assert A._patients_basis(None) == manifest_ids + "; raw person numbers not compared (no leakage audit)"

    class NoKermanyNames(_Counts):
        class patients:  # noqa: N801
            id_sources = {"manifest": 40}

    assert A._patients_basis(NoKermanyNames()) == (
        manifest_ids + "; the raw person numbers of 0 Kermany file name(s) were compared across splits "
        "(leakage.possible_same_patients_across)")


# --------------------------------------------------------------------------- shortcut helpers, known answers


def test_permutation_summary_against_counts_by_hand():
    null = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, np.nan] * 3)  # 27 valid values
    out = S.permutation_summary(0.75, null, confidence=0.8)
    assert out["p_value"] == pytest.approx((1 + 6) / (1 + 27))  # 0.8 and 0.9, three times each
    assert out["null_mean"] == pytest.approx(0.5)
    low, high = np.quantile(null[np.isfinite(null)], [0.1, 0.9])
    assert (out["null_low"], out["null_high"]) == (pytest.approx(low), pytest.approx(high))
    assert out["evidence"] == "no"  # p = 0.25 with 27 >= 20 valid permutations
    assert S.permutation_summary(0.95, null)["evidence"] == "yes"  # p = 1/28 < 0.05
    # the default confidence is 95%: the 2.5% and 97.5% quantiles
    default = S.permutation_summary(0.95, null)
    assert default["null_low"] == pytest.approx(np.quantile(null[np.isfinite(null)], 0.025))
    # 19 valid permutations cannot reach p < 0.05: no verdict either way
    assert S.permutation_summary(0.0, np.linspace(0, 1, 19))["evidence"] == "too few permutations"
    assert S.permutation_summary(0.0, np.linspace(0, 1, 20))["evidence"] == "no"
    none = S.permutation_summary(0.9, np.array([np.nan, np.nan]))
    assert none["evidence"] == "no permutation test" and np.isnan(none["p_value"])
    assert np.isnan(none["null_mean"]) and np.isnan(none["null_low"]) and np.isnan(none["null_high"])
    assert S.permutation_summary(0.9, [])["evidence"] == "no permutation test"
    # p exactly 0.05 (19 permutations, none as high) is not below ALPHA
    assert S.permutation_summary(1.0, np.zeros(19))["p_value"] == pytest.approx(0.05)
    assert S.permutation_summary(1.0, np.zeros(19))["evidence"] == "too few permutations"
    # None among the permutations counts as a missing value
    assert S.permutation_summary(0.9, [0.1, None, 0.2])["null_mean"] == pytest.approx(0.15)


def test_balanced_accuracy_is_the_mean_recall_of_the_classes_present():
    y_true = np.array([0, 0, 0, 0, 2, 2])
    y_pred = np.array([0, 0, 0, 1, 2, 0])
    assert S._balanced_accuracy(y_true, y_pred) == pytest.approx((3 / 4 + 1 / 2) / 2)  # class 1 is absent
    assert S._balanced_accuracy(np.array([1, 1, 0]), np.array([3, 1, 0])) == pytest.approx((1 + 1 / 2) / 2)
    assert np.isnan(S._balanced_accuracy(np.array([1, 1]), np.array([0, 1])))  # one class: undefined
    assert S._balanced_accuracy(np.array([0, 1]), np.array([1, 0])) == 0.0
    assert S._balanced_accuracy(np.array([0, 1, 1]), np.array([0, 0, 0])) == 0.5  # no hit in the last class
    assert S._balanced_accuracy(np.array([0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0])) == 0.75  # float codes
    assert np.isnan(S._balanced_accuracy(np.array([], dtype=int), np.array([], dtype=int)))


def test_feature_groups_of_each_input_kind():
    pm = S.property_matrix(pd.DataFrame({"format": ["PNG", "JPEG", "PNG"], "width": [1, 2, 3]}))
    assert S._feature_groups(pm, 3) == {"format": [0, 1], "width": [2]}
    frame = pd.DataFrame({"a": [1, 2], 5: [3, 4]})
    assert S._feature_groups(frame, 2) == {"a": [0], "5": [1]}
    assert S._feature_groups(np.zeros((2, 3)), 3) == {"x0": [0], "x1": [1], "x2": [2]}

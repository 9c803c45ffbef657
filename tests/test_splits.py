"""Known-answer tests of crslib.splits (its own tests under `make mutation`)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

from crslib.errors import DataError, InputError
from crslib.splits import (
    MIN_PATIENTS,
    check_pool_and_test,
    grouped_folds,
    grouped_partition,
    grouped_split,
    inner_folds,
    min_patients,
    patient_partition,
    pool_test_masks,
    stratified_group_kfold,
)

FRACTIONS = (0.6, 0.2, 0.2)


def _sklearn_folds(
    y: np.ndarray, groups: np.ndarray, n_splits: int, seed: int
) -> np.ndarray:
    """Fold of each row as scikit-learn's StratifiedGroupKFold(shuffle=True) assigns them."""
    fold = np.full(len(y), -1)
    cv = StratifiedGroupKFold(n_splits, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        # scikit-learn warns "least populated class" on tiny designs
        warnings.simplefilter("ignore", UserWarning)
        for k, (_, held) in enumerate(cv.split(np.zeros(len(y)), y, groups)):
            fold[held] = k
    return fold


def _patients_of(groups: np.ndarray, idx: np.ndarray) -> set:
    return set(groups[idx].tolist())


def _assert_partition_of_rows(parts, groups: np.ndarray) -> None:
    """Parts are sorted, cover every row exactly once, and no patient is in two parts."""
    for p in parts:
        assert p.dtype == np.int64 and np.array_equal(p, np.sort(p))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(groups)))
    seen = [_patients_of(groups, p) for p in parts]
    for i in range(len(seen)):
        for j in range(i + 1, len(seen)):
            assert not seen[i] & seen[j]


# --------------------------------------------------------------------------- grouped_partition


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_partition_refuses_missing_patient_ids_that_would_empty_a_part(seed):
    # NaN ids count as one patient for the guard but match no row, so their part came out empty
    groups = np.array([np.nan, 1.0, 2.0])
    with pytest.raises(InputError) as info:
        grouped_partition(groups, FRACTIONS, random_state=seed)
    assert str(info.value) == (
        "groups has 1 missing patient id(s) (NaN or None) among 3 rows; give every row its patient id, "
        "or drop those rows before splitting"
    )
    with pytest.raises(InputError, match=r"groups has 2 missing patient id\(s\)"):
        grouped_partition(np.array([None, "a", "b", None], dtype=object), (1, 1))


def test_grouped_partition_messages_name_the_fractions_and_the_patient_count():
    with pytest.raises(InputError) as info:
        grouped_partition([0, 0, 1], (0.4, 0.3, 0.3))
    assert str(info.value) == (
        "fractions (0.4, 0.3, 0.3) need at least 3 patients (one per part), found 2; "
        "add patients or pass fewer fractions"
    )
    # a missing share (None) and all-zero shares are refused like a negative or NaN one
    for bad in ((0.5, -0.1, 0.6), (1.0, -1.0), (0.5, float("nan")), (0.5, None), (0.0, 0.0)):
        with pytest.raises(InputError) as info:
            grouped_partition(np.arange(10), bad)
        assert str(info.value) == (
            f"fractions must be non-negative numbers with a positive sum, got {bad!r} (10 patients); "
            "pass relative shares such as (0.6, 0.2, 0.2)"
        )


def test_grouped_partition_parts_are_never_empty_and_cover_every_row():
    for n in range(3, 30):
        for fractions in (FRACTIONS, (0.98, 0.01, 0.01), (0.01, 0.01, 0.98), (1, 0, 0)):
            groups = np.repeat(np.arange(n), 2)
            parts = grouped_partition(groups, fractions, random_state=n)
            assert all(p.size > 0 for p in parts)
            _assert_partition_of_rows(parts, groups)


# --------------------------------------------------------------------------- patient_partition


def _regression_design(
    n_patients: int, images: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    groups = np.repeat(np.arange(n_patients), images)
    return np.arange(groups.size, dtype=float), groups


@pytest.mark.parametrize(
    ("fractions", "needed"),
    [(FRACTIONS, MIN_PATIENTS), ((0.1, 0.45, 0.45), 15)],
    ids=["MIN_PATIENTS-binds", "min_patients-binds"],
)
def test_patient_partition_enforces_the_patient_minimum_exactly_at_its_boundary(
    fractions, needed
):
    assert max(min_patients(fractions), MIN_PATIENTS) == needed
    y, groups = _regression_design(needed - 1)
    msg = (
        f"{needed - 1} patients are too few for patient-grouped train / validation / test partitions "
        f"(fractions {fractions}); at least {needed} patients are needed"
    )
    with pytest.raises(DataError, match=re.escape(msg)):
        patient_partition(y, groups, "regression", fractions, 0)
    y, groups = _regression_design(needed)
    parts = patient_partition(y, groups, "regression", fractions, 0)
    _assert_partition_of_rows(parts, groups)


def _classification_design(
    n_neg: int, n_pos: int, images: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Patients 0..n_neg-1 have only negative images; the others one positive image among negatives."""
    groups = np.repeat(np.arange(n_neg + n_pos), images)
    y = np.zeros(groups.size, dtype=np.int64)
    y[n_neg * images :: images] = 1  # first image of each positive patient
    return y, groups


@pytest.mark.parametrize("rare_class", [0, 1])
def test_patient_partition_needs_min_patients_of_each_class_exactly(rare_class):
    need = min_patients(FRACTIONS)  # 4
    counts = {rare_class: need - 1, 1 - rare_class: MIN_PATIENTS}
    y, groups = _classification_design(counts[0], counts[1])
    msg = (
        f"only {need - 1} patient(s) have class {rare_class} (patient label: 1 if any image is positive); "
        f"at least {need} patients of each class are needed so that train, validation and test "
        f"(fractions {FRACTIONS}) all hold both classes; add patients or change the fractions"
    )
    with pytest.raises(DataError, match=re.escape(msg)):
        patient_partition(y, groups, "classification", FRACTIONS, 0)
    counts[rare_class] = need
    y, groups = _classification_design(counts[0], counts[1])
    parts = patient_partition(y, groups, "classification", FRACTIONS, 0)
    _assert_partition_of_rows(parts, groups)
    for p in parts:
        assert sorted(set(y[p].tolist())) == [0, 1]


def test_patient_partition_stratifies_patients_by_any_positive_image():
    y, groups = _classification_design(20, 10)
    tr, va, te = patient_partition(y, groups, "classification", FRACTIONS, 3)
    _assert_partition_of_rows((tr, va, te), groups)
    positive = set(range(20, 30))
    # each stratum is cut at 60 / 20 / 20 % of its patients
    assert [len(_patients_of(groups, p) - positive) for p in (tr, va, te)] == [12, 4, 4]
    assert [len(_patients_of(groups, p) & positive) for p in (tr, va, te)] == [6, 2, 2]
    # the same seed gives the same partition, another seed another one
    again = patient_partition(y, groups, "classification", FRACTIONS, 3)
    assert all(np.array_equal(a, b) for a, b in zip((tr, va, te), again))
    other = patient_partition(y, groups, "classification", FRACTIONS, 4)
    assert not all(np.array_equal(a, b) for a, b in zip((tr, va, te), other))


def test_patient_partition_regression_is_grouped_partition_with_the_given_seed():
    y, groups = _regression_design(30, images=3)
    for seed in (0, 1, 7):
        parts = patient_partition(y, groups, "regression", FRACTIONS, seed)
        _assert_partition_of_rows(parts, groups)
        expected = grouped_partition(groups, FRACTIONS, random_state=seed)
        assert all(np.array_equal(a, b) for a, b in zip(parts, expected))
        assert [len(_patients_of(groups, p)) for p in parts] == [18, 6, 6]
    seed0 = patient_partition(y, groups, "regression", FRACTIONS, 0)
    seed1 = patient_partition(y, groups, "regression", FRACTIONS, 1)
    assert not all(np.array_equal(a, b) for a, b in zip(seed0, seed1))


@pytest.mark.parametrize(("k", "name"), [(0, "train"), (1, "validation"), (2, "test")])
def test_patient_partition_rejects_a_partition_with_a_constant_target(k, name):
    y, groups = _regression_design(20)
    # the regression split does not depend on y: make one partition's target constant
    parts = patient_partition(y, groups, "regression", FRACTIONS, 5)
    y[parts[k]] = 7.5
    msg = (
        f"the {name} partition holds a constant target (7.5) with seed 5; "
        "the metrics are undefined there: add patients or use other fractions"
    )
    with pytest.raises(DataError, match=re.escape(msg)):
        patient_partition(y, groups, "regression", FRACTIONS, 5)


def test_patient_partition_reports_the_value_of_a_single_image_partition():
    # one image per patient and 1 in 10 patients for validation: that partition holds one image
    y, groups = _regression_design(10, images=1)
    y = y * 1.5
    val = grouped_partition(groups, (0.8, 0.1, 0.1), random_state=2)[1]
    assert val.size == 1
    assert y[val[0]] == 12.0
    msg = "the validation partition holds a constant target (12.0) with seed 2;"
    with pytest.raises(DataError, match=re.escape(msg)):
        patient_partition(y, groups, "regression", (0.8, 0.1, 0.1), 2)


# --------------------------------------------------------------------------- stratified_group_kfold


def _tie_heavy_design(design: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    # every group has the same counts: every choice is a near-tie
    if design == "one-image-patients":
        groups = np.arange(24)
        y = np.tile([0, 1], 12)
    elif design == "equal-size-patients":
        groups = np.repeat(np.arange(18), 2)
        y = rng.integers(0, 2, 36)
    elif design == "three-classes":
        groups = np.repeat(np.arange(30), rng.integers(1, 4, 30))
        y = rng.integers(0, 3, groups.size)
    else:  # string ids, sizes 1..6
        sizes = rng.integers(1, 7, 25)
        groups = np.repeat(
            np.array([f"id-{i:02d}" for i in range(25)], dtype=object), sizes
        )
        y = np.repeat(rng.integers(0, 2, 25), sizes)
    return y, groups


@pytest.mark.parametrize(
    "design",
    ["one-image-patients", "equal-size-patients", "three-classes", "string-ids"],
)
@pytest.mark.parametrize("n_splits", [2, 3, 4])
def test_stratified_group_kfold_matches_scikit_learn_on_tie_heavy_designs(
    design, n_splits
):
    y, groups = _tie_heavy_design(design)
    for seed in (0, 1, 2):
        folds = stratified_group_kfold(y, groups, n_splits, seed)
        assert folds.dtype == np.int64
        assert np.array_equal(folds, _sklearn_folds(y, groups, n_splits, seed))
        assert set(folds.tolist()) == set(range(n_splits))


def test_stratified_group_kfold_known_answer_and_whole_patients():
    y = np.tile([0, 1], 10)
    groups = np.arange(20) // 2
    folds = stratified_group_kfold(y, groups, 2, 0)
    assert folds.dtype == np.int64
    assert folds.tolist() == _sklearn_folds(y, groups, 2, 0).tolist()
    assert np.bincount(folds).tolist() == [10, 10]
    for g in np.unique(groups):
        assert np.unique(folds[groups == g]).size == 1


def test_stratified_group_kfold_breaks_near_ties_with_numpy_isclose_tolerance():
    # Groups A, B, C (processed in that order: decreasing class imbalance). A goes to fold 0 and
    # B to fold 1; putting C into the smaller fold 1 scores worse than fold 0 by ~3.2058e-06,
    # inside np.isclose's 1e-8 + 1e-5 * score (3.2034e-06 .. 3.2084e-06) but outside half its
    # absolute part: scikit-learn (and so crslib) counts it as a tie and takes the smaller fold.
    counts = [(90000, 0), (30000, 45000), (129776, 142327)]
    groups = np.concatenate([np.full(n0 + n1, i) for i, (n0, n1) in enumerate(counts)])
    y = np.concatenate([np.repeat([0, 1], [n0, n1]) for n0, n1 in counts])
    folds = stratified_group_kfold(y, groups, 2, 0)
    assert [np.unique(folds[groups == i]).tolist() for i in range(3)] == [[0], [1], [1]]
    assert np.array_equal(folds, _sklearn_folds(y, groups, 2, 0))


# --------------------------------------------------------------------------- grouped_folds


def test_grouped_folds_needs_n_splits_patients_per_class_exactly():
    # class 1: 3 patients (one image each), class 0: 8 patients
    y = np.array([1, 1, 1] + [0] * 8)
    groups = np.array([f"p{i}" for i in range(11)])
    folds = grouped_folds(y, groups, 3, 0, "audit x")
    assert set(folds.tolist()) == {0, 1, 2}
    assert [sorted(set(y[folds == k].tolist())) for k in range(3)] == [[0, 1]] * 3
    # the class is shown as the user wrote it, not as a numpy repr (np.int64(1))
    msg = (
        r"audit x: class 1 has only 3 patient\(s\), fewer than n_splits=4; "
        r"pass a smaller n_splits \(at least 2\) or audit more images"
    )
    with pytest.raises(InputError, match=msg):
        grouped_folds(y, groups, 4, 0, "audit x")
    with pytest.raises(InputError, match=r"audit x: class 'yes' has only 3 patient\(s\)"):
        grouped_folds(np.where(y == 1, "yes", "no"), groups, 4, 0, "audit x")


def test_patient_partition_refuses_labels_other_than_0_1():
    # a label 2 would fall in neither stratum and its patients would vanish from every partition
    y = np.tile([0, 1, 2], 20)
    with pytest.raises(InputError, match=re.escape("classification labels must be 0/1 here, got values [0, 1, 2]")):
        patient_partition(y, np.arange(60), "classification", (0.6, 0.2, 0.2), 0)


def test_grouped_folds_rejects_a_fold_whose_training_rows_lack_a_class():
    # both class-0 patients (p0, p1) land in fold 0, so fold 0 trains without class 0
    y = np.array([0, 1, 1, 0, 0, 1, 1])
    groups = np.array(["p0", "p0", "p0", "p1", "p1", "p2", "p2"])
    assert stratified_group_kfold(y, groups.astype(object), 2, 4).tolist() == [
        0,
        0,
        0,
        0,
        0,
        1,
        1,
    ]
    msg = "audit x: fold 0 leaves a class out of its training rows (too few patients per class); pass a smaller n_splits"
    with pytest.raises(InputError, match=re.escape(msg)):
        grouped_folds(y, groups, 2, 4, "audit x")


def test_grouped_folds_accepts_a_held_out_fold_with_one_class():
    # only the training rows of each fold need every class; fold 1 holds out class-0 rows only
    y = np.array([1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0])
    groups = np.array([0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    folds = grouped_folds(y, groups, 3, 2, "audit x")
    assert folds.tolist() == [2, 2, 2, 0, 0, 0, 0, 0, 1, 1, 1]
    assert np.array_equal(folds, _sklearn_folds(y, groups.astype(str), 3, 2))
    assert [sorted(set(y[folds != k].tolist())) for k in range(3)] == [[0, 1]] * 3
    assert set(y[folds == 1].tolist()) == {0}


def test_grouped_folds_compares_patient_ids_as_exact_text():
    # "p1" and "p1\x00" are two patients (fixed-width text arrays would strip the NUL and merge them)
    y = np.array([0, 0, 1, 1, 0, 1])
    groups = ["p1", "p1\x00", "p2", "p3", "p4", "p5"]
    folds = grouped_folds(y, groups, 3, 0, "audit x")
    assert folds[0] != folds[1]
    assert np.array_equal(
        folds, _sklearn_folds(y, np.array(groups, dtype=object), 3, 0)
    )


# --------------------------------------------------------------------------- inner_folds


def _binary_design(n_neg: int, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """Patients of one class each, two images per patient."""
    groups = np.repeat(np.arange(n_neg + n_pos), 2)
    y = (groups >= n_neg).astype(np.int64)
    return y, groups


def _assert_folds_partition_rows(folds, groups: np.ndarray) -> None:
    n = len(groups)
    for fit, val in folds:
        assert np.array_equal(np.sort(np.concatenate([fit, val])), np.arange(n))
        assert not _patients_of(groups, fit) & _patients_of(groups, val)
    assert np.array_equal(
        np.sort(np.concatenate([val for _, val in folds])), np.arange(n)
    )


@pytest.mark.parametrize(
    ("n_splits", "n_neg", "n_pos", "k"),
    [
        (3, 10, 10, 3),
        (5, 8, 2, 2),
        (5, 2, 8, 2),
        (4, 3, 9, 3),
        (2, 2, 2, 2),
        (4, 1, 9, 0),
        (4, 9, 1, 0),
    ],
)
def test_inner_folds_classification_uses_at_most_the_rarer_class_patients(
    n_splits, n_neg, n_pos, k
):
    y, groups = _binary_design(n_neg, n_pos)
    folds = inner_folds(y, groups, "classification", n_splits, 3)
    assert len(folds) == k
    if k:
        _assert_folds_partition_rows(folds, groups)
        expected = _sklearn_folds(y, groups, k, 3)
        for i, (fit, val) in enumerate(folds):
            assert np.array_equal(val, np.flatnonzero(expected == i))
            assert np.array_equal(fit, np.flatnonzero(expected != i))
            assert sorted(set(y[fit].tolist())) == [0, 1]


def test_inner_folds_classification_counts_patients_with_mixed_images_in_both_classes():
    # patients 0..2 have a negative and a positive image, 3..8 only negatives: class 1 has 3 patients
    groups = np.repeat(np.arange(9), 2)
    y = np.zeros(18, dtype=np.int64)
    y[[1, 3, 5]] = 1
    folds = inner_folds(y, groups, "classification", 5, 0)
    assert len(folds) == 3
    _assert_folds_partition_rows(folds, groups)


@pytest.mark.parametrize(
    ("n_splits", "n_patients", "k"),
    [(3, 10, 3), (5, 4, 4), (5, 2, 2), (4, 1, 0), (3, 3, 3)],
)
def test_inner_folds_regression_is_shuffled_group_kfold(n_splits, n_patients, k):
    y, groups = _regression_design(n_patients, images=3)
    folds = inner_folds(y, groups, "regression", n_splits, 4)
    assert len(folds) == k
    if k:
        _assert_folds_partition_rows(folds, groups)
        cv = GroupKFold(n_splits=k, shuffle=True, random_state=4)
        for (fit, val), (fit_e, val_e) in zip(
            folds, cv.split(np.zeros(y.size), y, groups)
        ):
            assert np.array_equal(fit, fit_e) and np.array_equal(val, val_e)
        # the same seed gives the same folds, another seed other folds
        again = inner_folds(y, groups, "regression", n_splits, 4)
        assert all(np.array_equal(a[1], b[1]) for a, b in zip(folds, again))
        if n_patients > 3:
            other = inner_folds(y, groups, "regression", n_splits, 5)
            assert not all(np.array_equal(a[1], b[1]) for a, b in zip(folds, other))


def test_inner_folds_task_selects_the_splitter():
    # the same binary target: stratified folds for classification, plain group folds for regression
    y, groups = _binary_design(6, 6)
    clf = inner_folds(y, groups, "classification", 3, 0)
    reg = inner_folds(y.astype(float), groups, "regression", 3, 0)
    expected_clf = _sklearn_folds(y, groups, 3, 0)
    assert [val.tolist() for _, val in clf] == [
        np.flatnonzero(expected_clf == i).tolist() for i in range(3)
    ]
    expected_reg = GroupKFold(n_splits=3, shuffle=True, random_state=0).split(
        np.zeros(y.size), y, groups
    )
    assert [val.tolist() for _, val in reg] == [val.tolist() for _, val in expected_reg]
    assert [val.tolist() for _, val in clf] != [val.tolist() for _, val in reg]
    # stratified: every validation fold holds 2 patients of each class
    assert [np.bincount(y[val]).tolist() for _, val in clf] == [[4, 4]] * 3


def test_inner_folds_regression_silences_only_user_warnings(monkeypatch):
    import sklearn.model_selection

    class NoisyGroupKFold(GroupKFold):
        def split(self, X, y=None, groups=None):
            warnings.warn("the groups parameter is ignored", UserWarning)
            warnings.warn("numerical trouble", RuntimeWarning)
            yield from super().split(X, y, groups)

    monkeypatch.setattr(sklearn.model_selection, "GroupKFold", NoisyGroupKFold)
    y, groups = _regression_design(6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folds = inner_folds(y, groups, "regression", 3, 0)
    assert len(folds) == 3
    assert [(w.category, str(w.message)) for w in caught] == [
        (RuntimeWarning, "numerical trouble")
    ]


# --------------------------------------------------------------------------- official splits


@pytest.mark.parametrize(
    ("pool", "test", "expected"),
    [
        ("train", "test", (("train",), "test")),
        (["train", "val"], "test", (("train", "val"), "test")),
        (("a",), "b", (("a",), "b")),
    ],
)
def test_check_pool_and_test_normalises_the_pool_to_a_tuple(pool, test, expected):
    assert check_pool_and_test(pool, test) == expected


@pytest.mark.parametrize(
    ("pool", "test", "msg"),
    [
        ([], "test", "pool must be a split name or a sequence of split names, got []"),
        (
            ["train", 3],
            "test",
            "pool must be a split name or a sequence of split names, got ['train', 3]",
        ),
        ("train", None, "test must be a split name, got None"),
        ("train", ["test"], "test must be a split name, got ['test']"),
        (
            ["train", "test"],
            "test",
            "the test split 'test' is also in pool=('train', 'test'); the pool must exclude it",
        ),
        (
            "test",
            "test",
            "the test split 'test' is also in pool=('test',); the pool must exclude it",
        ),
    ],
)
def test_check_pool_and_test_rejects_bad_names(pool, test, msg):
    with pytest.raises(InputError, match=re.escape(msg)):
        check_pool_and_test(pool, test)


def test_pool_test_masks_known_answer():
    split = ["train", "val", "test", "extra", "train", 7]
    in_pool, in_test = pool_test_masks(split, ("train", "7"), "test")
    assert in_pool.dtype == bool and in_test.dtype == bool
    assert in_pool.tolist() == [True, False, False, False, True, True]
    assert in_test.tolist() == [False, False, True, False, False, False]


def test_pool_test_masks_without_test_rows_names_the_splits_present():
    msg = (
        "no row has split == 'holdout' (splits present: ['test', 'train', 'val']): the audit compares the official "
        "test split with the training pool. Mark the official test images with split='holdout' "
        "(e.g. the test/ folder of a Kermany-style layout), or pass test=<name> if it is named differently"
    )
    with pytest.raises(DataError, match=re.escape(msg)):
        pool_test_masks(
            np.array(["val", "train", "test", "train"]), ("train",), "holdout"
        )


def test_pool_test_masks_without_pool_rows_names_the_splits_present():
    msg = (
        "no row is in the training pool ['train', 'val'] (splits present: ['dev', 'test']); mark training images "
        "with split='train' (and 'val'), or pass pool=<names>"
    )
    with pytest.raises(DataError, match=re.escape(msg)):
        pool_test_masks(["test", "dev", "dev"], ("train", "val"), "test")


def test_pool_test_masks_compares_split_names_as_exact_text():
    # a trailing NUL makes another name (fixed-width text arrays would strip it)
    split = ["train", "test\x00", "test"]
    in_pool, in_test = pool_test_masks(split, ("train",), "test")
    assert in_pool.tolist() == [True, False, False]
    assert in_test.tolist() == [False, False, True]
    with pytest.raises(
        DataError,
        match=re.escape(
            "no row has split == 'test' (splits present: ['test\\x00', 'train'])"
        ),
    ):
        pool_test_masks(split[:2], ("train",), "test")


def test_grouped_split_gives_a_group_whose_middle_is_on_a_boundary_to_the_later_part():
    """Parts hold the half-open share ranges [0, 0.5) and [0.5, 1]: sizes 1, 2, 1 in that shuffled order
    put the middle of the 2-row group exactly on 0.5."""
    groups = np.array(["a", "b", "b", "c"])
    seed = next(s for s in range(100) if np.random.default_rng(s).permutation(3)[1] == 1)  # "b" drawn second
    first, second = grouped_split(groups, (0.5, 0.5), np.random.default_rng(seed))
    assert sorted(groups[second]).count("b") == 2 and "b" not in groups[first]
    assert len(first) == 1 and len(second) == 3

"""Tests of crslib.risk: the representation-risk workflow."""

from __future__ import annotations

import io
import json
import re
import warnings

import numpy as np
import pandas as pd
import pytest

from assertions import error_message
from crslib.errors import DataError, InputError
from crslib._validation import check_fractions, check_groups
from crslib.probes import r2 as _r2
from crslib.risk import (
    HEADS,
    _weighted_auroc,
    _weighted_r2,
    evaluate_partition,
    outer_partition,
    reduce_dimensions,
    representation_risk,
)
from crslib.stats import auroc, resample_indices

FAST = {"n_components": 8, "n_resamples": 200}


def _embed(latent: np.ndarray, rng: np.random.Generator, *, d: int = 16, strength: float = 3.0) -> np.ndarray:
    """Embeddings whose leading direction carries ``latent`` (survives the PCA), plus isotropic noise."""
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    return strength * latent[:, None] * u[None, :] + rng.normal(size=(latent.size, d))


def _data(task: str = "classification", *, n_patients: int = 150, per_patient: int = 2, seed: int = 0):
    """One encoder sees the latent variable that drives y; the other is pure noise."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_patients), per_patient)
    n = groups.size
    latent = rng.normal(size=n_patients)[groups] + 0.3 * rng.normal(size=n)
    if task == "classification":
        y = (latent + 0.4 * rng.normal(size=n) > 0).astype(int)
    else:
        y = 50.0 + 10.0 * latent + 3.0 * rng.normal(size=n)
    emb = {"signal": _embed(latent, rng), "noise": rng.normal(size=(n, 16))}
    return emb, y, groups


def _complementary(seed: int = 0, n_patients: int = 300):
    """y depends on a + b; encoder A sees only a, encoder B only b."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_patients), 2)
    n = groups.size
    a = rng.normal(size=n_patients)[groups] + 0.2 * rng.normal(size=n)
    b = rng.normal(size=n_patients)[groups] + 0.2 * rng.normal(size=n)
    y = (a + b + 0.3 * rng.normal(size=n) > 0).astype(int)
    return {"A": _embed(a, rng), "B": _embed(b, rng)}, y, groups


# --------------------------------------------------------------------------- partitions


def test_no_patient_crosses_partitions_in_any_repeat():
    emb, y, groups = _data(per_patient=3, n_patients=60)
    res = representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=4, **FAST)
    drawn = []
    for part in res.partitions:
        sets = [set(groups[idx].tolist()) for idx in (part.train_idx, part.val_idx, part.test_idx)]
        assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
        rows = np.concatenate([part.train_idx, part.val_idx, part.test_idx])
        assert np.array_equal(np.sort(rows), np.arange(y.size))  # every image in exactly one partition
        for idx in (part.train_idx, part.val_idx, part.test_idx):
            assert set(y[idx].tolist()) == {0, 1}  # stratified by patient label: both classes everywhere
        drawn.append(tuple(part.test_idx.tolist()))
    assert len(set(drawn)) == 4  # each repeat re-draws the partition
    # regression partitions are patient-disjoint too
    y_reg = np.random.default_rng(1).normal(size=y.size)
    tr, va, te = outer_partition(y_reg, groups=groups, random_state=3)
    assert not set(groups[tr]) & set(groups[va]) and not set(groups[va]) & set(groups[te])
    assert not set(groups[tr]) & set(groups[te])


def test_outer_partition_stratifies_binary_patients_and_draws_with_seed_0_by_default():
    # 10 positive and 40 negative patients, two images each: each stratum is split 6:2:2 by patient
    # (an unstratified draw of 30:10:10 patients gives 7:1:2, 5:3:2, 4:2:4 positives for seeds 0, 3, 4)
    groups = np.repeat(np.arange(50), 2)
    y = np.repeat((np.arange(50) < 10).astype(int), 2)
    for seed in range(5):
        parts = outer_partition(y, groups=groups, random_state=seed)
        assert [int(y[idx].sum()) // 2 for idx in parts] == [6, 2, 2], seed
        assert [idx.size // 2 for idx in parts] == [30, 10, 10], seed
    for by_default, seeded in zip(outer_partition(y, groups=groups), outer_partition(y, groups=groups, random_state=0)):
        np.testing.assert_array_equal(by_default, seeded)
    assert error_message(outer_partition, 1, groups=[0]) == (
        "y must be a 1-D array with one value per image, got shape ()")
    assert error_message(outer_partition, y[:, None], groups=groups) == (
        "y must be a 1-D array with one value per image, got shape (100, 1)")


def test_the_workflows_run_with_the_study_softwares_settings_by_default():
    from crslib.risk_results import LOOKAGAIN_FACTS

    rng = np.random.default_rng(0)
    y, groups = np.tile([0, 1], 150), np.arange(300)
    # 130 features and 180 training rows: more than the 128 components the study keeps
    emb = {name: rng.normal(size=(300, 130)) + shift * y[:, None] for name, shift in (("a", 0.3), ("b", 0.1), ("c", 0.0))}
    one = evaluate_partition(emb, y, groups=groups, heads=["linear"])
    assert one.reduction["n_components"].tolist() == [LOOKAGAIN_FACTS["pca_components"]] * 3 == [128] * 3
    assert len(one.union["members"]) == 2  # the union of the best two of three encoders
    assert (one.n_resamples, one.random_state) == (LOOKAGAIN_FACTS["n_bootstrap"], 0) == (2000, 0)
    small = {name: X[:60, :3] for name, X in emb.items()}
    repeated = representation_risk(small, y[:60], groups=groups[:60], heads=["linear"])
    assert len(repeated.partitions) == LOOKAGAIN_FACTS["n_partitions"] == 12
    assert repeated.settings == {
        "heads": ["linear"], "n_components": 128, "union_size": 2, "combinations": ["average", "greedy", "stack"],
        "loss": "log_loss", "fractions": [0.6, 0.2, 0.2], "n_partitions": 12, "inner_splits": 3, "n_resamples": 2000,
        "confidence": 0.95, "random_state": 0, "n_images": 60, "n_patients": 60, "encoders": ["a", "b", "c"],
        "classes": ["0", "1"]}


def test_representation_risk_numbers_its_partitions_and_shows_its_progress_only_when_asked(capsys, caplog):
    emb, y, groups = _data(n_patients=40)
    assert error_message(representation_risk, emb, y, groups=groups, n_partitions=0) == (
        "n_partitions must be an integer >= 1, got 0")
    with caplog.at_level("INFO", logger="crslib.risk"):
        res = representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=2, progress=True, **FAST)
    assert [p.partition for p in res.partitions] == [0, 1]
    # the validation part of 40 patients is small: some resamples lack a class, counted per candidate
    first = res.partitions[0]
    dropped = first.dropped.set_index("part")["n_dropped"]
    assert dropped["validation"] > 0
    for part, label in (("val", "validation"), ("test", "test")):
        column = first.candidates[f"{part}_undefined"]
        assert column.dtype == np.int64 and column.tolist() == [dropped[label]] * len(column)
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("partition")] == [
        f"partition {i}: selected {p.selected}" for i, p in enumerate(res.partitions)]
    shown = capsys.readouterr().err
    assert "representation risk: " in shown and "partition/s]" in shown and "2/2" in shown
    # leave=False: the finished bar is wiped from the line, not left above the next output
    assert shown.endswith("\r") and not shown.rstrip("\r ").endswith("]\n")
    representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=1, progress=False, **FAST)
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- no test leakage


def test_selection_never_reads_test_labels():
    emb, y, groups = _data()
    first = evaluate_partition(emb, y, groups=groups, **FAST)
    parts = (first.train_idx, first.val_idx, first.test_idx)
    val_cols = ["candidate", "param", "inner_loss", "val_loss", "val_score", "val_low", "val_high", "val_secondary", "val_rank"]
    rng = np.random.default_rng(5)
    flipped, shuffled = y.copy(), y.copy()
    flipped[first.test_idx] = 1 - y[first.test_idx]
    shuffled[first.test_idx] = rng.permutation(y[first.test_idx])
    assert first.selected.startswith("signal/")
    for poisoned in (flipped, shuffled):
        again = evaluate_partition(emb, poisoned, groups=groups, partition=parts, **FAST)
        assert again.selected == first.selected
        pd.testing.assert_frame_equal(again.candidates[val_cols], first.candidates[val_cols])
        pd.testing.assert_frame_equal(again.selection, first.selection)
        assert again.union == first.union
        # ... while the test scores did see the poison
        assert not np.allclose(again.candidates["test_score"], first.candidates["test_score"])
    flipped_res = evaluate_partition(emb, flipped, groups=groups, partition=parts, **FAST)
    assert flipped_res.selected_row["test_score"] == pytest.approx(1 - first.selected_row["test_score"])


def test_regression_selection_never_reads_test_labels():
    emb, y, groups = _data("regression")
    first = evaluate_partition(emb, y, groups=groups, **FAST)
    poisoned = y.copy()
    poisoned[first.test_idx] = np.random.default_rng(2).permutation(y[first.test_idx])
    again = evaluate_partition(emb, poisoned, groups=groups, **FAST)  # the regression partition ignores y
    assert np.array_equal(again.test_idx, first.test_idx)
    assert again.selected == first.selected
    pd.testing.assert_frame_equal(again.candidates[["val_score", "val_low", "param"]],
                                  first.candidates[["val_score", "val_low", "param"]])
    assert again.selected_row["test_score"] < first.selected_row["test_score"] - 0.5


# --------------------------------------------------------------------------- known answers


def test_the_encoder_that_carries_the_signal_is_selected():
    emb, y, groups = _data()
    res = representation_risk(emb, y, groups=groups, n_partitions=5, **FAST)
    assert res.task == "classification" and res.metric == "auroc"
    assert res.primary.selected.startswith("signal/")
    counts = res.selection_counts.set_index("encoder")["count"]
    assert counts["signal"] >= 4 and counts["noise"] == 0
    table = res.primary.candidates.set_index("candidate")
    assert table.loc[res.primary.selected, "test_score"] > 0.85
    noise = table[table["encoder"] == "noise"]["test_score"]
    assert noise.between(0.3, 0.7).all() and abs(noise.mean() - 0.5) < 0.12
    stab = res.rank_stability.set_index("encoder")
    assert stab.loc["signal", "share_first_val"] == 1.0 and stab.loc["signal", "mean_test_rank"] == 1.0
    # paired comparisons: every noise candidate is worse than the selected one, with an interval below 0
    comp = res.primary.comparisons.set_index("candidate")
    assert res.primary.selected not in comp.index
    assert (comp.loc[comp["encoder"] == "noise", "high"] < 0).all()
    assert (comp.loc[comp["encoder"] == "noise", "share_positive"] < 0.05).all()
    spread = res.spread.set_index("candidate")
    # the greedy average exists only where forward selection kept two encoders
    assert spread.drop(index="greedy/linear", errors="ignore")["n_partitions"].eq(5).all()
    assert spread["times_selected"].sum() == 5
    assert (spread["min"] <= spread["mean"]).all() and (spread["mean"] <= spread["max"]).all()


def test_regression_known_answer_with_r2():
    emb, y, groups = _data("regression")
    res = representation_risk(emb, y, groups=groups, n_partitions=3, **FAST)
    assert res.task == "regression" and (res.metric, res.secondary_metric) == ("r2", "mae")
    counts = res.selection_counts.set_index("encoder")["count"]
    assert counts["noise"] == 0 and counts.sum() == 3
    # a combination is selected only with paired validation evidence, and then it holds the signal encoder
    for p in res.partitions:
        row = p.selection.set_index("candidate").loc[p.selected]
        assert "signal" in row["members"].split("+") and (row["kind"] == "single" or row["gain_low"] > 0)
    table = res.primary.candidates.set_index("candidate")
    assert table.loc[res.primary.selected, "test_score"] > 0.7
    assert table.loc[res.primary.selected, "test_secondary"] < 6.0  # MAE in target units (sd ~ 10.8)
    assert (table.loc[table["encoder"] == "noise", "test_score"] < 0.15).all()
    # a regression has no classes: its summaries say so instead of failing
    assert res.primary.to_dict()["classes"] is None and res.to_dict()["primary"]["classes"] is None


# --------------------------------------------------------------------------- feature union


def test_union_rejected_when_it_adds_nothing():
    emb, y, groups = _data()
    res = evaluate_partition(emb, y, groups=groups, **FAST)
    union = res.union
    assert union["evaluated"] and len(union["members"]) == 2
    assert not union["chosen"] and union["low"] <= 0
    assert res.selected != "union/linear" and res.selected.split("/")[0] == "signal"
    assert "not selected" in union["reason"] and union["best_single"] == res.selected


def test_union_accepted_for_complementary_encoders():
    emb, y, groups = _complementary()
    res = evaluate_partition(emb, y, groups=groups, combinations=(), **FAST)
    union = res.union
    assert sorted(union["members"]) == ["A", "B"]
    assert union["chosen"] and union["low"] > 0 and union["gain"] > 0.05
    assert res.selected == "union/linear"
    row = res.selected_row
    assert row["members"] in ("A+B", "B+A") and row["n_features"] == 16
    assert row["test_score"] > res.candidates.loc[res.candidates["encoder"] != "union", "test_score"].max()


def test_union_decision_in_a_partition_follows_the_rule():
    for seed in range(3):
        emb, y, groups = _data(seed=seed)
        res = evaluate_partition(emb, y, groups=groups, random_state=seed, **FAST)
        union = res.union
        assert union["chosen"] == (union["low"] > 0)
        assert (res.selected == "union/linear") == union["chosen"]


def test_union_can_be_switched_off():
    emb, y, groups = _data()
    res = evaluate_partition(emb, y, groups=groups, union_size=0, combinations=(), heads=["linear"], **FAST)
    assert res.candidates["candidate"].tolist() == ["signal/linear", "noise/linear"]
    assert not res.union["evaluated"] and "union_size" in res.union["reason"]
    single = evaluate_partition({"signal": emb["signal"]}, y, groups=groups, heads=["knn"], **FAST)
    assert single.candidates["candidate"].tolist() == ["signal/knn"] and not single.union["evaluated"]


# --------------------------------------------------------------------------- dimension control


def test_pca_is_fitted_on_training_rows_only():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 40)) @ rng.normal(size=(40, 40))
    train = np.arange(0, 120, 2)
    Z, info = reduce_dimensions(X, train, n_components=10)
    changed = X.copy()
    others = np.setdiff1d(np.arange(120), train)
    changed[others] = 100.0 * rng.normal(size=(others.size, 40)) + 7.0
    Z2, info2 = reduce_dimensions(changed, train, n_components=10)
    np.testing.assert_allclose(Z2[train], Z[train], rtol=0, atol=1e-10)
    np.testing.assert_allclose(info2["components"], info["components"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(info2["mean"], info["mean"])
    assert not np.allclose(Z2[others], Z[others])
    # the shared dimension is capped by the training rows and the encoder's width
    assert reduce_dimensions(X[:, :5], train, n_components=128)[1]["n_components"] == 5
    assert reduce_dimensions(X, np.arange(7), n_components=128)[1]["n_components"] == 6
    # mask and index give the same result
    mask = np.zeros(120, dtype=bool)
    mask[train] = True
    np.testing.assert_allclose(reduce_dimensions(X, mask, n_components=10)[0], Z)


def test_reduce_dimensions_defaults_scale_and_messages():
    from assertions import error_message

    # 400 training rows of 600 features: the randomised SVD, so the default seed shows
    X = np.random.default_rng(1).normal(size=(500, 600)) * np.linspace(0.5, 3.0, 600)
    train = np.arange(400)
    Z, info = reduce_dimensions(X, train)
    assert Z.shape == (500, 128) and info["n_components"] == 128  # the study's 128 dimensions
    np.testing.assert_array_equal(Z, reduce_dimensions(X, train, n_components=128, random_state=0)[0])
    assert not np.array_equal(Z, reduce_dimensions(X, train, random_state=1)[0])
    # the standardisation's scale is the training rows' own (population) standard deviation
    np.testing.assert_allclose(info["scale"], X[train].std(axis=0), rtol=1e-12)
    np.testing.assert_allclose(info["mean"], X[train].mean(axis=0), rtol=1e-12)
    # the fitted scaler and PCA map new rows as the reduction did
    assert set(info) == {"n_components", "n_features", "n_train", "explained_variance", "mean", "scale",
                         "components", "scaler", "pca"}
    np.testing.assert_allclose(info["pca"].transform(info["scaler"].transform(X[::7])), Z[::7], atol=1e-10)

    small = X[:10, :4]
    assert error_message(reduce_dimensions, small, np.ones(9, bool)) == (
        "a boolean train_idx needs one entry per row (10), got shape (9,)")
    for bad in ([0, 10], [-1, 3], [[0, 1]], [0.0, 1.0]):
        assert error_message(reduce_dimensions, small, np.array(bad)) == (
            "train_idx must be a 1-D array of row indices in [0, 10)")
    assert reduce_dimensions(small, [0, 9])[1]["n_train"] == 2  # the last row and the fewest rows pass
    for few in ([3], [3, 3], []):
        assert error_message(reduce_dimensions, small, np.array(few, dtype=int)) == (
            f"PCA needs at least 2 training rows, got {len(set(few))}")
    assert error_message(reduce_dimensions, small, [0, 1], n_components=0) == (
        "n_components must be an integer >= 1, got 0")


def test_the_inner_folds_are_reduced_with_the_partitions_seed():
    from crslib.risk import _reduce_folds

    # 400 fitting rows of 600 features: scikit-learn's PCA takes the randomised SVD, whose seed matters
    X = np.random.default_rng(0).normal(size=(700, 600))
    train = np.arange(600)
    folds = [(np.arange(0, 400), np.arange(400, 600)), (np.arange(200, 600), np.arange(0, 200))]
    seeded = _reduce_folds(X, train, folds, 8, 5)
    for (fit, _), Z in zip(folds, seeded):
        np.testing.assert_array_equal(Z, reduce_dimensions(X[train], fit, n_components=8, random_state=5)[0])
    assert not np.allclose(seeded[0], _reduce_folds(X, train, folds, 8, 0)[0])


def test_the_reduction_table_reports_each_encoders_pca_on_the_training_rows():
    rng = np.random.default_rng(3)
    y, groups = np.tile([0, 1], 350), np.arange(700)
    # 420 training rows of 600 features: the randomised SVD, so the seed shows in the variance kept
    emb = {"wide": rng.normal(size=(700, 600)) + 0.5 * y[:, None], "narrow": rng.normal(size=(700, 5)) + y[:, None]}
    res = evaluate_partition(emb, y, groups=groups, heads=["linear"], n_components=8, n_resamples=100, random_state=5)
    # the models' seed is the second of four the partition's random_state spawns (folds, models, validation, test)
    seed = int(np.random.SeedSequence(5).generate_state(4)[1])
    expected = [{"encoder": name, "n_features": X.shape[1], "n_components": min(8, X.shape[1]),
                 "explained_variance": reduce_dimensions(X, res.train_idx, n_components=8,
                                                         random_state=seed)[1]["explained_variance"],
                 "n_train": res.train_idx.size} for name, X in emb.items()]
    got = res.reduction.to_dict("records")
    assert [{k: v for k, v in row.items() if k != "explained_variance"} for row in got] == [
        {k: v for k, v in row.items() if k != "explained_variance"} for row in expected]
    assert [row["explained_variance"] for row in got] == pytest.approx(
        [row["explained_variance"] for row in expected], rel=1e-12)
    assert expected[0]["explained_variance"] != pytest.approx(reduce_dimensions(
        emb["wide"], res.train_idx, n_components=8, random_state=0)[1]["explained_variance"], rel=1e-6)


def test_heads_fitted_on_training_rows_only():
    """Changing only validation/test features leaves every inner-CV choice unchanged."""
    emb, y, groups = _data()
    first = evaluate_partition(emb, y, groups=groups, **FAST)
    held_out = np.concatenate([first.val_idx, first.test_idx])
    changed = {k: v.copy() for k, v in emb.items()}
    for v in changed.values():
        v[held_out] = np.random.default_rng(9).normal(size=(held_out.size, v.shape[1]))
    again = evaluate_partition(changed, y, groups=groups, **FAST)
    assert np.array_equal(again.train_idx, first.train_idx)
    single = first.candidates.loc[first.candidates["kind"] == "single", "candidate"]
    pd.testing.assert_frame_equal(again.candidates.set_index("candidate").loc[single, ["param", "inner_loss"]],
                                  first.candidates.set_index("candidate").loc[single, ["param", "inner_loss"]])
    # the greedy average picks its members on validation rows; every other candidate sees training rows only
    for cand in first.candidates.loc[first.candidates["kind"] != "greedy", "candidate"]:
        np.testing.assert_allclose(again.predictions[cand][first.train_idx],
                                   first.predictions[cand][first.train_idx], atol=1e-10)
    assert again.reduction.equals(first.reduction)


def _stable_knn_means(Z_fit, y_fit, Z_query, ks):
    """Brute force: sort the fitting rows by (squared distance, row index) for each query."""
    out = {}
    for k in ks:
        means = []
        for q in Z_query:
            d2 = ((Z_fit - q) ** 2).sum(axis=1)
            near = sorted(range(len(y_fit)), key=lambda j: (d2[j], j))[: min(k, len(y_fit))]
            means.append(float(np.mean(y_fit[near])))
        out[k] = np.array(means)
    return out


def test_knn_means_breaks_distance_ties_by_row_order_as_documented():
    from crslib.probes import knn_means

    rng = np.random.default_rng(0)
    differing = 0
    for case in range(60):
        # integer points on a small grid: many exactly tied distances, computed exactly
        n_fit = int(rng.integers(5, 40))
        Z_fit = rng.integers(0, 3, size=(n_fit, 2)).astype(float)
        y_fit = rng.integers(0, 2, n_fit)
        Z_query = rng.integers(0, 3, size=(10, 2)).astype(float)
        ks = sorted({1, 2, 3, int(rng.integers(1, n_fit + 2))})
        got = knn_means(Z_fit, y_fit, Z_query, ks)
        want = _stable_knn_means(Z_fit, y_fit, Z_query, ks)
        for k in ks:
            differing += int((got[k] != want[k]).sum())
    assert differing == 0
    # a known answer: rows 1, 2 and 3 are all at distance 1 from the query; k=2 takes rows 1 and 2
    Z_fit = np.array([[5.0], [1.0], [-1.0], [1.0], [9.0]])
    means = knn_means(Z_fit, np.array([0, 1, 0, 0, 1]), np.array([[0.0]]), [1, 2, 3])
    assert (means[1].tolist(), means[2].tolist(), means[3].tolist()) == ([1.0], [0.5], [1 / 3])



def test_knn_means_of_one_hot_targets_are_class_shares_even_with_k_above_the_rows():
    from crslib.probes import knn_means

    # 6 fitting rows of 3 classes, k up to 31: the shares count rows, not rows x classes
    Z_fit = np.arange(6.0)[:, None]
    y = np.array([0, 0, 1, 1, 2, 2])
    onehot = np.eye(3)[y]
    means = knn_means(Z_fit, onehot, np.array([[0.2], [5.1]]), [1, 4, 31])
    assert means[1].tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    assert means[4].tolist() == [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]]
    np.testing.assert_allclose(means[31], np.full((2, 3), 1 / 3))
    for k in (1, 4, 31):  # the same as the binary indicator of each class, column by column
        for c in range(3):
            np.testing.assert_allclose(means[k][:, c], knn_means(Z_fit, (y == c).astype(int), np.array([[0.2], [5.1]]),
                                                                 [k])[k])


# --------------------------------------------------------------------------- bootstrap


def test_vectorised_bootstrap_equals_the_statistic_on_resampled_rows():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(40), 3)
    y = rng.integers(0, 2, 120)
    score = np.round(rng.normal(size=120) + y, 1)  # ties included
    draws = list(resample_indices(120, n_resamples=25, groups=groups, random_state=1))
    counts = np.stack([np.bincount(idx, minlength=120) for idx in draws]).astype(float)
    expected = [auroc(y[idx], score[idx]) for idx in draws]
    np.testing.assert_allclose(_weighted_auroc(y, score, counts), expected, atol=1e-12)
    target = rng.normal(size=120)
    pred = target + rng.normal(size=120)
    np.testing.assert_allclose(_weighted_r2(target, pred, counts), [_r2(target[i], pred[i]) for i in draws],
                               atol=1e-10)
    one_class = np.zeros((1, 120))
    one_class[0, np.flatnonzero(y == 1)[:5]] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN without a 0/0 warning
        assert np.isnan(_weighted_auroc(y, score, one_class)[0])


# --------------------------------------------------------------------------- reproducibility


def test_same_seed_identical_tables_other_seed_other_partitions():
    emb, y, groups = _data(n_patients=80)
    a = representation_risk(emb, y, groups=groups, heads=HEADS, n_partitions=2, random_state=3, **FAST)
    b = representation_risk(emb, y, groups=groups, heads=HEADS, n_partitions=2, random_state=3, **FAST)
    pd.testing.assert_frame_equal(a.all_partitions, b.all_partitions)
    pd.testing.assert_frame_equal(a.primary.comparisons, b.primary.comparisons)
    pd.testing.assert_frame_equal(a.spread, b.spread)
    assert a.to_dict() == b.to_dict()
    c = representation_risk(emb, y, groups=groups, heads=HEADS, n_partitions=2, random_state=4, **FAST)
    assert not np.array_equal(c.primary.test_idx, a.primary.test_idx)
    # partition i of seed s is partition 0 of seed s + i
    assert np.array_equal(a.partitions[1].test_idx, c.primary.test_idx)
    pd.testing.assert_frame_equal(a.partitions[1].candidates, c.primary.candidates)


def test_random_state_none_draws_a_seed_that_is_recorded_and_repeats_the_run(caplog, monkeypatch):
    from crslib import risk

    emb, y, groups = _data(n_patients=60)
    drawn = {risk._check_seed(None) for _ in range(5)}
    assert len(drawn) == 5 and all(isinstance(s, int) and 0 <= s < 2**31 for s in drawn)
    with monkeypatch.context() as patch:  # entropy past 2**32: the seed is its remainder below 2**31
        patch.setattr(np.random, "SeedSequence", lambda: type("Drawn", (), {"entropy": 3 * 2**31 + 7})())
        assert risk._check_seed(None) == 7
    with caplog.at_level("INFO", logger="crslib.risk"):
        a = representation_risk(emb, y, groups=groups, heads=HEADS, n_partitions=2, random_state=None, **FAST)
    seed = a.settings["random_state"]
    # the log says which seed was drawn and how to repeat the run
    assert [r.getMessage() for r in caplog.records if r.name == "crslib.risk" and "drew seed" in r.getMessage()] == [
        f"random_state=None: drew seed {seed} (pass it as random_state to repeat this run)"]
    assert isinstance(seed, int) and [p.random_state for p in a.partitions] == [seed, seed + 1]
    b = representation_risk(emb, y, groups=groups, heads=HEADS, n_partitions=2, random_state=seed, **FAST)
    pd.testing.assert_frame_equal(a.all_partitions, b.all_partitions)
    assert a.to_dict() == b.to_dict()


def test_to_dict_is_json_ready():
    emb, y, groups = _data(n_patients=60)
    res = representation_risk(emb, y, groups=groups, heads=["linear", "knn"], n_partitions=2, **FAST)
    out = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert out["primary"]["selected"] == res.primary.selected
    assert out["settings"]["n_partitions"] == 2 and out["lookagain_facts"]["pca_components"] == 128
    assert {"validation", "test"} == set(out["rank_correlation"])
    kinds = [c["kind"] for c in out["primary"]["candidates"]]
    assert kinds.count("single") == 4 and kinds.count("union") == 1 and out["primary"]["classes"] == ["0", "1"]
    assert [r["candidate"] for r in out["primary"]["selection"]] == [c["candidate"] for c in out["primary"]["candidates"]]
    assert [r["fit"] for r in out["primary"]["refit"]] == ["train", "train+validation"]


def test_save_writes_the_tables_of_crs_risk_and_the_notebook(tmp_path):
    from crslib.risk_results import stability_table

    emb, y, groups = _data(n_patients=60)
    res = representation_risk(emb, y, groups=groups, heads=["linear", "knn"], n_partitions=3, **FAST)
    written = res.save(tmp_path / "out", name="label")
    names = sorted(p.name for p in written)
    assert names == sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "candidates_label.csv", "comparisons_label.csv", "dropped_label.csv", "metrics_label.csv",
        "partitions_label.csv", "refit_label.csv", "risk_label.json", "selection_label.csv",
        "selection_table_label.csv", "spread_label.csv", "stability_label.csv"]
    assert json.loads((tmp_path / "out" / "risk_label.json").read_text()) == json.loads(json.dumps(res.to_dict()))
    for stem, frame in (("candidates", res.primary.candidates), ("comparisons", res.primary.comparisons),
                        ("partitions", res.all_partitions), ("spread", res.spread),
                        ("selection", res.selection_counts), ("selection_table", res.primary.selection),
                        ("refit", res.primary.refit), ("metrics", res.primary.metrics), ("dropped", res.dropped)):
        saved = pd.read_csv(tmp_path / "out" / f"{stem}_label.csv")
        pd.testing.assert_frame_equal(saved, pd.read_csv(io.StringIO(frame.to_csv(index=False))))
        assert len(saved) == len(frame) and list(saved.columns) == list(frame.columns)
    # the stability row, as notebook 06 computed it by hand before it moved here
    scores = res.selected_test_scores
    expected = {
        "selected most often": " / ".join(res.selection_counts.loc[
            res.selection_counts["count"] == res.selection_counts["count"].max(), "encoder"]),
        "distinct encoders selected": int((res.selection_counts["count"] > 0).sum()),
        "test score mean": scores.mean(), "test score SD": scores.std(ddof=1),
        "test score range": scores.max() - scores.min(),
        "rank correlation between partitions (validation)": res.rank_correlation["validation"],
        "rank correlation between partitions (test)": res.rank_correlation["test"],
        "union chosen (partitions)": int(sum(p.union.get("chosen", False) for p in res.partitions)),
        "combination chosen (partitions)": int(sum(p.selected_row["kind"] != "single" for p in res.partitions)),
    }
    assert res.stability() == expected
    assert res.stability()["distinct encoders selected"] >= 1 and len(scores) == 3
    stability = pd.read_csv(tmp_path / "out" / "stability_label.csv", index_col=0)
    assert list(stability.index) == ["label"] and list(stability.columns) == list(expected)
    assert stability.loc["label", "test score mean"] == pytest.approx(expected["test score mean"])
    both = stability_table({"a": res, "b": res})
    assert list(both.index) == ["a", "b"] and both.loc["b", "selected most often"] == expected["selected most often"]
    assert (tmp_path / "out" / "risk_label.json").read_text() == json.dumps(res.to_dict(), indent=2)
    for bad in ("../x", "a/b", "", 5, None):
        with pytest.raises(InputError, match=re.escape(
                f"name must be a non-empty file-name part (e.g. the target column), got {bad!r}")):
            res.save(tmp_path / "bad", name=bad)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(InputError, match="RiskResult"):
        stability_table({"a": res.primary})


def test_stability_counts_encoders_selected_and_partitions_that_chose_the_union():
    from dataclasses import replace

    emb, y, groups = _data(n_patients=60)
    res = representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=3, **FAST)
    # a constructed outcome: encoder "good" selected twice, "noise" once, the union never;
    # the union rule accepted the union in partitions 0 and 2 (one partition records no decision)
    counts = pd.DataFrame({"encoder": ["good", "noise", "union"], "count": [2, 1, 0]})
    unions = [{"chosen": True}, {}, {"chosen": True}]
    made = replace(res, selection_counts=counts,
                   partitions=[replace(p, union=u) for p, u in zip(res.partitions, unions)])
    row = made.stability()
    assert row["selected most often"] == "good"
    assert row["distinct encoders selected"] == 2  # an encoder chosen once counts, one never chosen does not
    assert row["union chosen (partitions)"] == 2
    none_chosen = replace(made, partitions=[replace(p, union={"chosen": False}) for p in res.partitions])
    assert none_chosen.stability()["union chosen (partitions)"] == 0
    # a tie names every encoder selected most often, in the order of the counts
    tied = replace(res, selection_counts=pd.DataFrame({"encoder": ["noise", "good", "union"], "count": [1, 1, 1]}))
    assert tied.stability()["selected most often"] == "noise / good / union"


def test_task_type_records_a_binary_task_as_binary():
    from crslib.risk_results import task_type

    assert [task_type(t) for t in ("classification", "multiclass", "regression")] == [
        "binary", "multiclass", "regression"]
    emb, y, groups = _data(n_patients=60)
    res = representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=1, union_size=0, **FAST)
    assert (res.task, res.task_type, res.primary.task_type) == ("classification", "binary", "binary")


def test_a_partition_summary_rounds_its_floats_to_four_digits():
    emb, y, groups = _data(n_patients=60)
    res = representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=1, union_size=0, **FAST)
    raw = res.primary.candidates["val_score"].to_numpy()
    assert any(v != round(v, 4) for v in raw)  # the scores have more digits than the summary keeps
    out = res.primary.to_dict()
    assert [c["val_score"] for c in out["candidates"]] == [round(float(v), 4) for v in raw]

    def floats(obj):
        if isinstance(obj, dict):
            return [v for x in obj.values() for v in floats(x)]
        if isinstance(obj, list):
            return [v for x in obj for v in floats(x)]
        return [obj] if isinstance(obj, float) else []

    assert all(v == round(v, 4) for v in floats(out)) and len(floats(out)) > 20
    # every field under its documented name, each as the partition holds it
    from crslib._io import json_ready

    p = res.primary
    assert list(out) == ["partition", "random_state", "task", "task_type", "metric", "secondary_metric", "classes",
                         "n_train", "n_val", "n_test", "n_resamples", "confidence", "selected", "loss", "union",
                         "selection", "refit", "metrics", "dropped", "not_fitted", "candidates", "comparisons",
                         "reduction"]
    assert [out[k] for k in ("partition", "random_state", "task", "task_type", "metric", "secondary_metric")] == [
        p.partition, p.random_state, "classification", "binary", p.metric, p.secondary_metric]
    assert (out["n_train"], out["n_val"], out["n_test"]) == (p.train_idx.size, p.val_idx.size, p.test_idx.size)
    assert (out["n_resamples"], out["confidence"], out["selected"]) == (200, p.confidence, p.selected)
    for key in ("loss", "union", "selection", "refit", "metrics", "dropped", "not_fitted", "candidates",
                "comparisons", "reduction"):
        assert out[key] == json_ready(getattr(p, key), digits=4), key
    assert out["classes"] == ["0", "1"] and out["confidence"] == 0.95
    # the whole result's summary rounds the same way, its own numbers too
    whole = res.to_dict()
    mean = float(res.selected_test_scores.mean())
    assert mean != round(mean, 4) and whole["selected_test_score"]["mean"] == round(mean, 4)
    assert all(v == round(v, 4) for v in floats(whole))



def test_a_risk_summary_holds_each_field_under_its_name():
    from crslib._io import json_ready
    from crslib.risk_results import LOOKAGAIN_FACTS

    emb, y, groups = _data(n_patients=60)
    res = representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=2, union_size=0, **FAST)
    out = res.to_dict()
    assert list(out) == ["task", "task_type", "metric", "secondary_metric", "settings", "primary",
                         "selected_per_partition", "selected_test_score", "spread", "selection_counts",
                         "rank_stability", "rank_correlation", "lookagain_facts"]
    assert [out[k] for k in ("task", "task_type", "metric", "secondary_metric")] == [
        "classification", "binary", "auroc", res.secondary_metric]
    assert out["primary"] == res.primary.to_dict() and out["lookagain_facts"] == LOOKAGAIN_FACTS
    assert out["selected_per_partition"] == [p.selected for p in res.partitions]
    scores = np.array([p.candidates.set_index("candidate").loc[p.selected, "test_score"] for p in res.partitions])
    assert out["selected_test_score"] == {
        "mean": round(float(scores.mean()), 4), "sd": round(float(scores.std(ddof=1)), 4),
        "min": round(float(scores.min()), 4), "max": round(float(scores.max()), 4)}
    for key in ("settings", "spread", "selection_counts", "rank_stability", "rank_correlation"):
        assert out[key] == json_ready(getattr(res, key), digits=4), key
    one = representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=1, union_size=0, **FAST)
    assert one.to_dict()["selected_test_score"]["sd"] is None  # one partition has no spread


def test_stability_table_refuses_what_is_not_a_mapping_of_results():
    from assertions import error_message

    from crslib.risk_results import stability_table

    needs = "stability_table needs a non-empty mapping of name -> RiskResult"
    assert error_message(stability_table, {}) == needs
    assert error_message(stability_table, [("age", 3)]) == needs
    assert error_message(stability_table, {"age": 3}) == "outcome 'age' is a int, not a RiskResult"


def test_risk_report_escapes_task_and_encoder_names():
    from dataclasses import replace

    from crslib.reports import CSS, render_risk_html

    emb, y, groups = _data(n_patients=60)
    emb = {"<img src=x>": emb["signal"], "a&b": emb["noise"]}
    res = representation_risk(emb, y, groups=groups, heads=["linear"], n_partitions=2, **FAST)
    page = render_risk_html({"<task>": res})
    assert page.startswith("<!DOCTYPE html>") and f"<style>{CSS}</style>" in page
    assert "<img" not in page and "<task>" not in page
    assert "&lt;img src=x&gt;/linear" in page and "&lt;task&gt;" in page and "a&amp;b" in page
    # a cell without a value (the spread of a candidate seen in one partition) reads n/a, not NaN
    one_partition = replace(res, spread=res.spread.assign(sd=np.nan))
    spread = render_risk_html({"t": one_partition}).split("Test score spread over partitions")[1]
    assert "NaN" not in spread and spread.count('<td class="num">n/a</td>') == len(res.spread)
    with pytest.raises(InputError, match="RiskResult"):
        render_risk_html({"y": res.primary})


def test_labels_other_than_0_1_and_auto_task():
    emb, y, groups = _data(n_patients=60)
    names = np.where(y == 1, "PNEUMONIA", "NORMAL")
    res = evaluate_partition(emb, names, groups=groups, heads=["linear"], **FAST)
    assert res.task == "classification" and res.classes == ["NORMAL", "PNEUMONIA"]
    direct = evaluate_partition(emb, y, groups=groups, heads=["linear"], **FAST)
    pd.testing.assert_frame_equal(res.candidates, direct.candidates)


# --------------------------------------------------------------------------- bad input


def test_too_few_patients():
    emb, y, groups = _data(n_patients=8)
    with pytest.raises(DataError, match=r"8 patients are too few.*at least 10 patients"):
        evaluate_partition(emb, y, groups=groups, **FAST)
    emb, y, groups = _data(n_patients=60)
    y = np.zeros_like(y)
    y[groups < 3] = 1  # three positive patients
    with pytest.raises(DataError, match=r"only 3 patient\(s\) have class 1.*at least 4 patients of each class"):
        representation_risk(emb, y, groups=groups, **FAST)


def test_constant_target_nan_embeddings_mismatched_rows():
    emb, y, groups = _data(n_patients=40)
    with pytest.raises(InputError, match="constant"):
        evaluate_partition(emb, np.ones_like(y), groups=groups, **FAST)
    with pytest.raises(InputError, match="constant"):
        evaluate_partition(emb, np.full(y.size, 3.5), groups=groups, task="regression", **FAST)
    broken = dict(emb, noise=emb["noise"].copy())
    broken["noise"][[3, 7], 0] = np.nan
    with pytest.raises(InputError, match=r"embeddings of 'noise' hold NaN.*2 row\(s\)"):
        evaluate_partition(broken, y, groups=groups, **FAST)
    with pytest.raises(InputError, match="different numbers of rows.*row-aligned"):
        evaluate_partition(dict(emb, noise=emb["noise"][:-1]), y, groups=groups, **FAST)
    with pytest.raises(InputError, match="y has 79 values but the embeddings have 80 rows"):
        evaluate_partition(emb, y[:-1], groups=groups, **FAST)
    with pytest.raises(InputError, match="y has 1 missing"):
        evaluate_partition(emb, np.where(np.arange(y.size) == 4, np.nan, y), groups=groups, task="regression", **FAST)


def test_option_errors():
    emb, y, groups = _data(n_patients=40)
    with pytest.raises(InputError, match="non-empty mapping"):
        evaluate_partition({}, y, groups=groups)
    with pytest.raises(InputError, match="non-empty mapping"):
        evaluate_partition([emb["signal"]], y, groups=groups)
    with pytest.raises(InputError, match="heads must be"):
        evaluate_partition(emb, y, groups=groups, heads=["svm"])
    with pytest.raises(InputError, match="union_size"):
        evaluate_partition(emb, y, groups=groups, union_size=1)
    with pytest.raises(InputError, match="binary target.*3 distinct"):
        evaluate_partition(emb, np.arange(y.size) % 3, groups=groups, task="binary")
    with pytest.raises(InputError, match="reserved"):
        evaluate_partition({"union": emb["signal"]}, y, groups=groups)
    with pytest.raises(InputError, match="fractions"):
        evaluate_partition(emb, y, groups=groups, fractions=(0.8, 0.2))
    tr, va, te = outer_partition(y, groups=groups)
    with pytest.raises(InputError, match="both the train and the test partition"):
        evaluate_partition(emb, y, groups=groups, partition=(tr, va, np.r_[te, tr[:1]]))


# --------------------------------------------------------------------------- exact validation messages


def _risk_message(fn, *args, **kwargs) -> str:
    from crslib.errors import CRSError

    with pytest.raises(CRSError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_embedding_checks_exact_messages():
    from crslib import risk

    X = np.ones((4, 2))
    assert _risk_message(risk._check_embeddings, {}) == (
        "embeddings must be a non-empty mapping of encoder name -> array of shape (n_images, n_features), "
        "e.g. {'resnet50': X1, 'vit_b16': X2}; got dict with no encoders")
    assert _risk_message(risk._check_embeddings, [X]).endswith("; got list")
    assert _risk_message(risk._check_embeddings, {"": X}) == "encoder names must be non-empty strings, got ''"
    assert _risk_message(risk._check_embeddings, {3: X}) == "encoder names must be non-empty strings, got 3"
    assert _risk_message(risk._check_embeddings, {"union": X}) == (
        "the encoder name 'union' is reserved for the feature union; rename that encoder")
    assert _risk_message(risk._check_embeddings, {"a": [["x", "y"]]}).startswith(
        "embeddings of 'a' are not numeric (could not convert")
    for bad, shape in ((np.ones(4), "(4,)"), (np.ones((0, 2)), "(0, 2)"), (np.ones((4, 0)), "(4, 0)")):
        assert _risk_message(risk._check_embeddings, {"a": bad}) == (
            f"embeddings of 'a' must be a 2-D array (n_images, n_features), got shape {shape}")
    broken = np.ones((8, 2))
    broken[[1, 6], 1] = np.inf
    broken[6, 0] = np.nan
    assert _risk_message(risk._check_embeddings, {"a": broken}) == (
        "embeddings of 'a' hold NaN or infinite values in 2 row(s) (first: [1, 6]); re-extract them or drop those "
        "images from every encoder, y and groups")
    many = np.ones((9, 2))
    many[[0, 2, 3, 5, 7, 8], 0] = np.nan  # six bad rows: the message lists the first five
    assert _risk_message(risk._check_embeddings, {"a": many}) == (
        "embeddings of 'a' hold NaN or infinite values in 6 row(s) (first: [0, 2, 3, 5, 7]); re-extract them or drop "
        "those images from every encoder, y and groups")
    assert _risk_message(risk._check_embeddings, {"a": X, "b": np.ones((3, 2))}) == (
        "encoders have different numbers of rows (a: 4, b: 3); the embeddings must be row-aligned: one row per "
        "image, in the same order for every encoder")
    out, n = risk._check_embeddings({"a": [[1, 2], [3, 4]]})
    assert n == 2 and out["a"].dtype == np.float64


def test_target_checks_exact_messages_and_encoding():
    from crslib import risk

    assert _risk_message(risk._check_target, [0, 1], 2, "ranking") == (
        "unknown task 'ranking'; choose 'auto', 'binary', 'multiclass', 'regression' (or 'classification': binary "
        "or multi-class by the number of classes)")
    assert _risk_message(risk._check_target, np.ones((2, 2)), 2, "auto") == (
        "y must be a 1-D array with one value per image, got shape (2, 2)")
    assert _risk_message(risk._check_target, [0, 1, 1], 2, "auto") == (
        "y has 3 values but the embeddings have 2 rows; pass one target per image")
    assert _risk_message(risk._check_target, [0, None, 1, np.nan], 4, "auto") == (
        "y has 2 missing value(s) (first at row 1); drop those images from y, groups and every encoder's embeddings")
    assert _risk_message(risk._check_target, np.array([1, "a"], dtype=object), 2, "auto").startswith(
        "y mixes values that cannot be compared (")
    assert _risk_message(risk._check_target, ["b", "b"], 2, "auto") == (
        "y is constant (every value is 'b'): there is nothing to predict")
    assert _risk_message(risk._check_target, [0, 1, 2], 3, "binary") == (
        "task='binary' needs a binary target, but y has 3 distinct values; use task='multiclass' for a label with "
        "more classes or task='regression' for a continuous target")
    assert _risk_message(risk._check_target, ["a", "b", "c"], 3, "regression").startswith(
        "task='regression' needs a numeric target; y cannot be read as numbers (")
    assert _risk_message(risk._check_target, [0.0, np.inf, 1.0], 3, "regression") == (
        "y holds infinite values; a regression target must be finite")
    y, task, classes = risk._check_target(["no", "yes", "no"], 3, "auto")
    assert y.tolist() == [0, 1, 0] and task == "classification" and classes == ["no", "yes"]
    y, task, classes = risk._check_target([1.0, 2.0, 3.0], 3, "auto")
    assert y.dtype == np.float64 and task == "regression" and classes is None
    y, task, _ = risk._check_target([2, 5], 2, "regression")
    assert y.tolist() == [2.0, 5.0] and task == "regression"


def test_option_checks_exact_messages():
    from crslib import risk

    assert check_groups(None, 3).tolist() == [0, 1, 2]
    assert _risk_message(check_groups, [1, 2], 3) == "groups must hold one patient id per image (3), got shape (2,)"
    assert _risk_message(check_groups, [1, None, np.nan], 3) == (
        "groups has 2 missing patient id(s); every image needs its patient id")
    assert check_groups(np.array([3, "3b", 3], dtype=object), 3).tolist() == ["3", "3b", "3"]
    assert risk._check_heads("knn") == ("knn",) and risk._check_heads(["knn", "knn"]) == ("knn",)
    assert _risk_message(risk._check_heads, []) == f"heads must be a non-empty subset of {', '.join(HEADS)}, got []"
    assert _risk_message(check_fractions, "abc") == (
        "fractions must be three numbers (train, validation, test), got 'abc'")
    for bad in [(0.5, 0.5), (0.6, 0.4, 0.0), (0.6, 0.2, float("inf"))]:
        assert _risk_message(check_fractions, bad) == (
            f"fractions must be three positive numbers (train, validation, test), e.g. (0.6, 0.2, 0.2); got {bad!r}")
    assert check_fractions([3, 1, 1]) == (3.0, 1.0, 1.0)
    for bad in (-1, True, 1.5):
        assert _risk_message(risk._check_seed, bad) == (
            f"random_state must be a non-negative integer or None, got {bad!r}")
    assert risk._check_seed(np.int64(0)) == 0
    for bad in (1, -1, True, 2.0):
        assert _risk_message(risk._check_union_size, bad) == (
            f"union_size must be 0 (no feature union) or an integer >= 2, got {bad!r}")
    assert risk._check_union_size(0) == 0 and risk._check_union_size(np.int64(3)) == 3


# --------------------------------------------------------------------------- task_need


def test_task_need_accepts_text_binary_numeric_and_regression_targets():
    from crslib.risk_needs import task_need

    groups = np.repeat(np.arange(40), 2)
    text = pd.Series(np.repeat(np.tile(["microscopy", "photograph"], 20), 2), dtype="string")
    assert task_need(text, groups=groups, name="label") is None
    assert task_need(np.repeat(np.tile([0, 1], 20), 2), groups=groups) is None
    assert task_need(np.linspace(20, 80, 80), groups=groups, name="age") is None
    # integer codes with 3 to MAX_CLASSES values are a multi-class task, as task="auto" decides
    assert task_need(np.arange(80) % 5, groups=groups) is None
    # a text target that passes is one representation_risk runs on, text classes included
    rng = np.random.default_rng(0)
    y = np.where(rng.random(80) < 0.5, "a", "b")
    assert task_need(y, groups=np.arange(80), n_partitions=2) is None
    res = representation_risk({"e": rng.normal(size=(80, 4))}, y, groups=np.arange(80), heads=["linear"],
                              n_partitions=2, union_size=0, **FAST)
    assert res.task == "classification" and res.settings["classes"] == ["a", "b"]


def test_task_need_sentences_for_unusable_targets():
    from crslib.risk_needs import task_need

    groups = np.arange(30)
    many = np.array([f"s{i % 16:02d}" for i in range(30)], dtype=object)
    assert task_need(many, groups=groups, name="source").startswith(
        "`source` needs at least 4 patients of each class so that train, validation and test (60/20/20 % of "
        "patients) all hold every class; it has s00: 2, s01: 2,")
    assert task_need(np.full(30, 1.0), groups=groups, name="label") == (
        "`label` has a single value (1); it needs two classes or a varying number")
    assert task_need(np.full(30, "x", dtype=object), groups=groups, name="label") == (
        "`label` has a single value ('x'); it needs two classes or a varying number")
    assert task_need([None] * 30, groups=groups, name="age") == (
        "`age` has no values (every row is empty); fill it to run it")
    assert task_need(np.array([1, "a"] * 15, dtype=object), groups=groups, name="mixed") == (
        "`mixed` mixes numbers and text; use one type to run it")
    assert task_need(np.tile([0, 1], 4), groups=np.arange(8), name="label") == (
        "`label` is known for 8 patients; the train, validation and test partitions (60/20/20 % of patients) "
        "need at least 10")
    with pytest.raises(InputError, match="one patient id per image"):
        task_need([0, 1, 0], groups=[1, 2], name="label")


def test_task_need_counts_patients_as_the_partitions_do():
    from crslib.risk_needs import task_need

    # 12 patients of 2 images each: 3 have one negative and one positive image (class 1 as a patient), so
    # class 1 has 3 patients although class 0 images belong to 12 patients
    y = np.array(["neg", "neg"] * 9 + ["neg", "pos"] * 3, dtype=object)
    groups = np.repeat(np.arange(12), 2)
    assert task_need(y, groups=groups, name="label") == (
        "`label` needs at least 4 patients of each class so that train, validation and test "
        "(60/20/20 % of patients) all hold both; it has neg: 9, pos: 3 (a patient counts as 'pos' when any of "
        "their images is)")
    # missing values are not counted: 10 known patients with 5 of each class pass
    y = np.array([0, 1] * 5 + [None] * 6, dtype=object)
    assert task_need(y, groups=np.arange(16), name="label") is None


def test_task_need_agrees_with_the_partitions_representation_risk_draws():
    from crslib.risk_needs import task_need
    from crslib.splits import patient_partition

    rng = np.random.default_rng(3)
    for trial in range(60):
        n_patients = int(rng.integers(8, 20))
        per_patient = rng.integers(1, 3, size=n_patients)
        groups = np.repeat(np.arange(n_patients), per_patient)
        if trial % 2:
            y = (rng.random(groups.size) < rng.uniform(0.05, 0.5)).astype(int)
            task = "classification"
        else:
            y = rng.integers(0, 3, size=groups.size).astype(float)
            task = "regression"
        fits = True
        if np.unique(y).size < 2:
            continue
        for seed in range(3):
            try:
                patient_partition(y, groups, task, (0.6, 0.2, 0.2), seed)
            except DataError:
                fits = False
        assert (task_need(y, groups=groups, n_partitions=3) is None) == fits, (trial, y.tolist())


def test_task_need_sentences_name_what_the_target_lacks():
    import decimal

    from crslib.risk_needs import task_need

    g = np.arange(40)
    assert task_need([1, "a"] * 20, groups=g) == "`y` mixes numbers and text; use one type to run it"  # default name
    assert task_need(list(np.tile([1, 2.5, 3], 14)[:40]), groups=g) is None  # ints and floats: a regression
    assert task_need([decimal.Decimal(i) for i in range(40)], groups=g) is None
    assert task_need(np.tile(list("abcde"), 8), groups=g) is None  # a multi-class task, 8 patients per class
    six = np.r_[np.tile(list("abcde"), 7), ["f"] * 5]  # the five f images belong to 2 patients
    assert task_need(six, groups=np.r_[np.arange(35), [35, 35, 36, 36, 36]]).endswith(
        "it has a: 7, b: 7, c: 7, d: 7, e: 7, f: 2 (a patient counts for every class among their images)")
    assert task_need(np.r_[np.zeros(37), np.ones(3)], groups=g, fractions=(0.5, 0.25, 0.25)) == (
        "`y` needs at least 4 patients of each class so that train, validation and test (50/25/25 % of patients) "
        "all hold both; it has 0: 37, 1: 3")
    assert task_need(np.r_[np.zeros(37), np.ones(3)], groups=g // 2).endswith(
        "it has 0: 18, 1: 2 (a patient counts as 1 when any of their images is)")
    assert task_need(pd.Series([np.str_("a")] * 40, dtype=object), groups=g) == (
        "`y` has a single value ('a'); it needs two classes or a varying number")
    with pytest.raises(InputError, match="y must be a non-empty 1-D array with one value per image, got 0 values"):
        task_need([], groups=[])
    with pytest.raises(InputError, match="n_partitions"):
        task_need(np.tile([0, 1], 20), groups=g, n_partitions=0)


def test_task_need_checks_every_partition_it_will_draw():
    from crslib.risk_needs import task_need

    y = np.r_[np.full(36, 1.0), np.arange(2.0, 6.0)]  # four patients carry all the variation
    g = np.arange(40)
    assert task_need(y, groups=g) is None and task_need(y, groups=g, n_partitions=2) is None
    assert task_need(y, groups=g, n_partitions=20).startswith(
        "`y` does not fill partition 3 of 20: the validation partition holds a constant target (1.0) with seed 2")
    assert task_need(y, groups=g, n_partitions=20, random_state=2).startswith(
        "`y` does not fill partition 1 of 20")



def test_task_need_checks_one_partition_by_default_and_names_its_arguments_in_errors():
    from assertions import error_message

    from crslib.risk_needs import task_need

    y = np.r_[np.full(36, 1.0), np.arange(2.0, 6.0)]  # seed 1's partition fills, seed 2's does not
    g = np.arange(40)
    assert task_need(y, groups=g, random_state=1) is None
    assert task_need(y, groups=g, random_state=1, n_partitions=2).startswith("`y` does not fill partition 2 of 2:")
    assert error_message(task_need, y, groups=g, n_partitions=0) == "n_partitions must be an integer >= 1, got 0"
    assert error_message(task_need, y, groups=g, task="ordinal") == (
        "unknown task 'ordinal'; choose 'auto', 'binary', 'multiclass', 'regression' (or 'classification': binary "
        "or multi-class by the number of classes)")
    # "classification" is accepted, as representation_risk takes it (binary or multi-class by the classes)
    assert task_need(np.tile(list("abc"), 10), groups=np.arange(30), task="classification") is None
    assert task_need(np.tile([0, 1], 3), groups=np.arange(6), task="classification").startswith(
        "`y` is known for 6 patients")


def test_task_need_writes_shares_of_unnormalised_fractions_and_numpy_scalars_as_the_manifest_does():
    from crslib.risk_needs import task_need

    g = np.arange(40)
    # fractions need not sum to 1: (3, 1, 1) are 60/20/20 % of the patients
    assert task_need(np.r_[np.zeros(37), np.ones(3)], groups=g, fractions=(3, 1, 1)) == (
        "`y` needs at least 4 patients of each class so that train, validation and test (60/20/20 % of patients) "
        "all hold both; it has 0: 37, 1: 3")
    # a numpy float32 that is a whole number reads as an integer, as a Python float does
    assert task_need([np.float32(2.0)] * 40, groups=g) == (
        "`y` has a single value (2); it needs two classes or a varying number")
    assert task_need([np.float32(2.5)] * 40, groups=g) == (
        "`y` has a single value (2.5); it needs two classes or a varying number")
    # a nullable integer column with a missing value stays a multi-class label (its classes are
    # integers, not the floats pandas turns them into when it fills the gap with NaN)
    grade = pd.Series([0] * 18 + [1] * 18 + [2] * 3 + [None], dtype="Int64")
    assert task_need(grade, groups=g, name="grade") == (
        "`grade` needs at least 4 patients of each class so that train, validation and test (60/20/20 % of "
        "patients) all hold every class; it has 0: 18, 1: 18, 2: 3")


# --------------------------------------------------------------------------- explicit partitions and scores


def _check(partition, n=8, task="classification", y=None, g=None):
    from crslib.risk_inputs import _check_partition

    y = np.array([0, 1] * (n // 2)) if y is None else np.asarray(y)
    g = np.arange(n) if g is None else np.asarray(g)
    return _check_partition(partition, n, g, y, task)


def test_an_explicit_partition_is_sorted_and_masks_become_indices():
    train, val, test = _check(([3, 0, 1, 2], np.array([False] * 4 + [True, True] + [False] * 2), [7, 6]))
    assert train.tolist() == [0, 1, 2, 3] and val.tolist() == [4, 5] and test.tolist() == [6, 7]
    assert train.dtype == np.int64


@pytest.mark.parametrize("partition, message", [
    (5, r"^partition must be three arrays of row indices \(train, validation, test\)$"),
    (([0, 1], [2, 3]), r"^partition must be three arrays of row indices \(train, validation, test\), got 2$"),
    (([0, 1], [], [4, 5]), r"^the validation partition must be a non-empty 1-D array of row indices in \[0, 8\)$"),
    (([0, 8], [2, 3], [4, 5]), r"^the train partition must be a non-empty 1-D array of row indices in \[0, 8\)$"),
    (([0, 1], [2, 3], [4, -1]), r"^the test partition must be a non-empty 1-D array"),
    (([0, 1], [2.0, 3.0], [4, 5]), r"^the validation partition must be a non-empty 1-D array"),
    (([[0, 1]], [2, 3], [4, 5]), r"^the train partition must be a non-empty 1-D array"),
])
def test_a_malformed_explicit_partition_is_an_input_error(partition, message):
    with pytest.raises(InputError, match=message):
        _check(partition)


def test_a_single_row_partition_is_well_formed_but_has_a_constant_target():
    with pytest.raises(DataError, match=r"^the test partition holds a constant target"):
        _check(([0, 1, 2, 3], [4, 5], [7]), task="regression")


@pytest.mark.parametrize("groups, pair", [
    ([0, 1, 2, 3, 0, 5, 6, 7], "train and the validation"),
    ([0, 1, 2, 3, 4, 5, 4, 7], "validation and the test"),
    ([7, 1, 2, 3, 4, 5, 6, 7], "train and the test"),
])
def test_a_patient_in_two_partitions_is_named(groups, pair):
    with pytest.raises(InputError, match=rf"^1 patient\(s\) are in both the {pair} partition \(e\.g\. "
                                         r"\['\d'\]\); partitions must be patient-disjoint$"):
        _check(([0, 1, 2, 3], [4, 5], [6, 7]), g=groups)


def test_the_shared_patients_example_lists_three():
    groups = ["a", "b", "c", "d", "a", "b", "c", "d"]
    with pytest.raises(InputError, match=r"^4 patient\(s\) are in both the train and the validation partition "
                                         r"\(e\.g\. \['a', 'b', 'c'\]\)"):
        _check(([0, 1, 2, 3], [4, 5, 6, 7], [0]), g=groups)


@pytest.mark.parametrize("y, name", [([0, 0, 0, 0, 0, 1, 0, 1], "train"), ([0, 1, 0, 1, 1, 1, 0, 1], "validation"),
                                     ([0, 1, 0, 1, 0, 1, 1, 1], "test")])
def test_a_constant_target_in_a_partition_is_a_data_error(y, name):
    with pytest.raises(DataError, match=rf"^the {name} partition holds a constant target; the metrics are undefined"):
        _check(([0, 1, 2, 3], [4, 5], [6, 7]), y=y)


def test_a_multiclass_partition_lacking_a_class_names_it():
    y = [0, 1, 2, 0, 1, 2, 0, 1, 2]
    with pytest.raises(DataError, match=r"^the test partition lacks class code\(s\) \[2\]; a multi-class task needs "
                                        r"every class in every partition \(its macro AUROC is undefined otherwise\)$"):
        _check(([0, 1, 2], [3, 4, 5], [6, 7]), n=9, y=y, task="multiclass")


def test_primary_and_secondary_scores_are_the_studys_metrics():
    from sklearn.metrics import balanced_accuracy_score, r2_score, roc_auc_score

    from crslib.risk_scores import balanced_accuracy, partition_scores, primary_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60)
    p = np.clip(0.3 * y + 0.7 * rng.random(60), 0, 1)
    assert primary_score("classification", y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    yr = rng.normal(size=60)
    pr = yr + rng.normal(scale=0.5, size=60)
    assert primary_score("regression", yr, pr) == pytest.approx(r2_score(yr, pr), abs=1e-12)
    ym = np.repeat([0, 1, 2], 20)
    logits = rng.normal(size=(60, 3)) + np.eye(3)[ym]
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert primary_score("multiclass", ym, proba) == pytest.approx(
        roc_auc_score(ym, proba, multi_class="ovr", average="macro"), abs=1e-12)
    unbalanced = np.array([0] * 4 + [1] * 4 + [2] * 2)
    guess = np.eye(3)[[0, 0, 0, 0, 1, 1, 0, 0, 1, 1]] * 0.8 + 0.2 / 3  # recalls 1, 1/2 and 0
    assert balanced_accuracy(unbalanced, guess) == pytest.approx(
        balanced_accuracy_score(unbalanced, guess.argmax(axis=1))) == pytest.approx(0.5)
    assert partition_scores("multiclass", ym, proba)[1] == pytest.approx(
        balanced_accuracy_score(ym, proba.argmax(axis=1)))


def test_the_workflow_names_each_bad_count_and_takes_one_combination_as_text():
    from assertions import error_message

    emb, y, groups = _data(n_patients=60)
    run = {"groups": groups, "heads": ["linear"], "union_size": 0}
    for option, bad, minimum in (("n_components", 0, 1), ("inner_splits", 1, 2), ("n_resamples", 0, 1)):
        settings = {**FAST, **run, option: bad}
        assert error_message(evaluate_partition, emb, y, **settings) == (
            f"{option} must be an integer >= {minimum}, got {bad}")
    two = evaluate_partition(emb, y, inner_splits=2, **FAST, **run)  # two inner folds are enough
    assert two.selected in set(two.candidates["candidate"])
    # one combination given as a string is that combination, not its letters
    res = evaluate_partition(emb, y, combinations="stack", **FAST, **run)
    assert sorted(set(res.candidates["kind"])) == ["single", "stack"]

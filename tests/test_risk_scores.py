"""Known answers for the representation-risk scores on resamples (crslib.risk_scores): R^2 on resamples that
draw one target value or carry a large offset, the spread of candidates and the encoders' ranks over partitions,
and the mean rank correlation between partitions."""

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import r2_score

from crslib.risk_scores import (_mean_spearman, count_matrix, partition_scores, rank_stability, resampled_loss,
                                resampled_primary, row_losses, spread_and_selection, weighted_auroc, weighted_macro_auroc,
                                weighted_r2)
from crslib.stats import resample_indices


def test_weighted_r2_is_undefined_on_a_resample_of_one_target_value():
    y = np.array([0.1, 0.1, 0.1, 0.7, 1.3, 2.9])
    pred = np.array([0.2, 0.5, 0.9, 0.4, 0.4, 0.4])
    counts = np.array([[1.0, 2.0, 4.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0, 0.0, 2.0]])
    out = weighted_r2(y, pred, counts)
    rows = np.repeat(np.arange(6), counts[1].astype(int))
    assert np.isnan(out[0]) and out[1] == pytest.approx(r2_score(y[rows], pred[rows]), rel=1e-12)


@pytest.mark.parametrize("scale, offset", [(1.0, 1e8), (1e-7, 0.0), (1e-7, 1.0)])
def test_weighted_r2_keeps_its_value_under_a_large_offset_or_a_tiny_scale(scale, offset):
    rng = np.random.default_rng(3)
    y = rng.normal(size=40)
    pred = 0.6 * y + rng.normal(scale=0.5, size=40)
    counts = rng.integers(0, 3, size=(5, 40)).astype(float)
    expected = weighted_r2(y, pred, counts)
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(weighted_r2(offset + scale * y, offset + scale * pred, counts), expected, rtol=1e-6)
    assert partition_scores("regression", offset + scale * y, offset + scale * pred)[0] == pytest.approx(
        r2_score(y, pred), rel=1e-6)


def test_mean_spearman_known_answers():
    same_order = np.array([[0.9, 0.8, 0.7], [0.6, 0.5, 0.1]])
    assert _mean_spearman(same_order) == pytest.approx(1.0)
    assert _mean_spearman(np.array([[0.9, 0.8], [0.1, 0.5]])) == pytest.approx(-1.0)  # two encoders swap
    # three partitions: pairs (1, 2) agree, (1, 3) and (2, 3) reverse -> (1 - 1 - 1) / 3
    assert _mean_spearman(np.array([[3.0, 2.0, 1.0], [0.3, 0.2, 0.1], [1.0, 2.0, 3.0]])) == pytest.approx(-1 / 3)
    # ranks are taken within each partition, not over the whole matrix
    assert _mean_spearman(np.array([[10.0, 20.0, 30.0], [1.0, 3.0, 2.0]])) == pytest.approx(0.5)
    # a partition whose encoders all tie has no ranking to compare; fewer than two of either: undefined
    assert _mean_spearman(np.array([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3], [0.2, 0.3, 0.4]])) == pytest.approx(1.0)
    assert _mean_spearman(np.array([[0.1, 0.2, 0.3], [0.2, 0.3, 0.4], [0.5, 0.5, 0.5]])) == pytest.approx(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN without numpy's "Mean of empty slice" warning
        assert np.isnan(_mean_spearman(np.array([[0.5, 0.5], [0.2, 0.2]])))
    assert np.isnan(_mean_spearman(np.array([[0.1, 0.2, 0.3]]))) and np.isnan(_mean_spearman(np.ones((3, 1))))


def _partition(index, rows, selected):
    """A PartitionResult with hand-made candidates (the columns spread_and_selection and rank_stability read)."""
    from crslib.risk_results import PartitionResult

    columns = ["candidate", "encoder", "head", "kind", "val_score", "test_score", "val_loss", "test_loss"]
    candidates = pd.DataFrame(rows, columns=columns)
    candidates["selected"] = candidates["candidate"] == selected
    empty = np.array([], dtype=np.int64)
    return PartitionResult(candidates=candidates, selected=selected, union={}, comparisons=pd.DataFrame(),
                           reduction=pd.DataFrame(), train_idx=empty, val_idx=empty, test_idx=empty, partition=index)


def _two_partitions():
    first = _partition(0, [("zeta/linear", "zeta", "linear", "single", 0.70, 0.60, 0.50, 0.42),
                           ("alpha/linear", "alpha", "linear", "single", 0.80, 0.75, 0.40, 0.45),
                           ("alpha/knn", "alpha", "knn", "single", 0.78, 0.65, 0.42, 0.40),
                           ("average/linear", "average", "linear", "average", 0.82, 0.70, 0.38, 0.44)],
                       selected="average/linear")
    second = _partition(1, [("zeta/linear", "zeta", "linear", "single", 0.90, 0.80, 0.30, 0.35),
                            ("alpha/linear", "alpha", "linear", "single", 0.60, 0.55, 0.60, 0.65),
                            ("alpha/knn", "alpha", "knn", "single", 0.62, 0.61, 0.28, 0.60),
                            ("average/linear", "average", "linear", "average", 0.85, 0.72, 0.35, 0.50),
                            ("greedy/linear", "greedy", "linear", "greedy", 0.88, 0.74, 0.33, 0.48)],
                        selected="greedy/linear")
    return [first, second]


def test_spread_and_selection_known_answers():
    all_partitions, spread, counts = spread_and_selection(_two_partitions(), ["zeta", "alpha"])
    assert all_partitions.columns[0] == "partition" and all_partitions["partition"].tolist() == [0] * 4 + [1] * 5
    assert all_partitions.index.tolist() == list(range(9))
    # one row per candidate, in the order the candidates come (not sorted by name)
    assert spread.columns.tolist() == ["candidate", "encoder", "head", "val_mean", "mean", "sd", "min", "max",
                                       "n_partitions", "times_selected"]
    assert spread["candidate"].tolist() == ["zeta/linear", "alpha/linear", "alpha/knn", "average/linear",
                                            "greedy/linear"]
    assert spread["encoder"].tolist() == ["zeta", "alpha", "alpha", "average", "greedy"]
    assert spread["head"].tolist() == ["linear", "linear", "knn", "linear", "linear"]
    zeta = spread.iloc[0]
    assert (zeta["val_mean"], zeta["mean"], zeta["min"], zeta["max"]) == pytest.approx((0.80, 0.70, 0.60, 0.80))
    assert zeta["sd"] == pytest.approx(np.std([0.60, 0.80], ddof=1)) and zeta["n_partitions"] == 2
    assert spread["n_partitions"].tolist() == [2, 2, 2, 2, 1]
    assert spread["times_selected"].tolist() == [0, 0, 0, 1, 1] and spread["times_selected"].dtype == np.int64
    # the combinations present join the encoders, in crslib's order
    assert counts["encoder"].tolist() == ["zeta", "alpha", "average", "greedy"]
    assert counts["count"].tolist() == [0, 0, 1, 1] and counts["share"].tolist() == [0.0, 0.0, 0.5, 0.5]


def test_rank_stability_ranks_each_encoder_by_its_best_validation_head():
    table, correlation = rank_stability(_two_partitions(), ["zeta", "alpha"])
    # partition 0: alpha's lowest validation loss is alpha/linear's (0.40 < zeta's 0.50), so alpha ranks first on
    # validation; on test alpha keeps that head's loss (0.45, not alpha/knn's 0.40), and zeta's 0.42 ranks first.
    # partition 1: alpha's best head is its second row, alpha/knn (0.28 < zeta's 0.30); its test loss 0.60 ranks second
    assert table["encoder"].tolist() == ["zeta", "alpha"]
    assert table["mean_val_rank"].tolist() == [2.0, 1.0] and table["mean_test_rank"].tolist() == [1.0, 2.0]
    assert table["share_first_val"].tolist() == [0.0, 1.0] and table["share_first_test"].tolist() == [1.0, 0.0]
    assert correlation == {"validation": pytest.approx(1.0), "test": pytest.approx(1.0)}
    # tied losses share the better rank
    tied = [_partition(i, [("zeta/linear", "zeta", "linear", "single", 0.7, 0.7, 0.5, 0.5),
                           ("alpha/linear", "alpha", "linear", "single", 0.7, 0.7, 0.5, 0.5),
                           ("beta/linear", "beta", "linear", "single", 0.6, 0.6, 0.9, 0.9 - 0.1 * i)],
                       selected="zeta/linear") for i in range(2)]
    table, correlation = rank_stability(tied, ["zeta", "alpha", "beta"])
    assert table["mean_val_rank"].tolist() == [1.0, 1.0, 3.0] and table["share_first_test"].tolist() == [1.0, 1.0, 0.0]
    assert correlation["validation"] == pytest.approx(1.0)


def test_row_losses_known_answers():
    y = np.array([1, 0, 1, 0])
    p = np.array([0.8, 0.3, 0.0, 1.0])  # the last two are sure and wrong: clipped to 1e-15, finite
    np.testing.assert_allclose(row_losses("classification", y, p, "log_loss"),
                               [-np.log(0.8), -np.log(0.7), -np.log(1e-15), -np.log(1e-15)], rtol=1e-12)
    sure = row_losses("classification", np.array([1, 0]), np.array([1.0, 0.0]), "log_loss")
    np.testing.assert_allclose(sure, -np.log(1 - 1e-15), rtol=1e-6)  # about 1.1e-15, not 0
    proba = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.0, 1.0, 0.0]])
    np.testing.assert_allclose(row_losses("multiclass", np.array([0, 2, 0]), proba, "log_loss"),
                               [-np.log(0.7), -np.log(0.6), -np.log(1e-15)], rtol=1e-12)
    target, pred = np.array([1.0, 2.0, -1.0]), np.array([0.5, 4.0, -1.0])
    assert row_losses("regression", target, pred, "mse").tolist() == [0.25, 4.0, 0.0]
    assert row_losses("regression", target, pred, "mae").tolist() == [0.5, 2.0, 0.0]


def test_resampled_loss_is_the_mean_over_the_resampled_rows():
    loss = np.array([0.5, 2.0, 1.0, 4.0])
    counts = np.array([[1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 3.0]])
    assert resampled_loss(loss, counts).tolist() == [1.875, 2.0 / 3.0, 4.0]


def test_count_matrix_draws_whole_patients_as_resample_indices_does():
    groups = np.array(["a", "a", "b", "c", "c", "c", "d"])
    counts = count_matrix(groups, 50, 3)
    assert counts.shape == (50, 7)
    draws = resample_indices(7, n_resamples=50, groups=groups, random_state=3)
    for r, idx in enumerate(draws):
        assert counts[r].tolist() == np.bincount(idx, minlength=7).tolist()
    # a patient's images are drawn together, and every resample draws 4 patients
    assert (counts[:, 0] == counts[:, 1]).all() and (counts[:, 3] == counts[:, 5]).all()
    patients_drawn = counts[:, 0] + counts[:, 2] + counts[:, 3] + counts[:, 6]
    assert (patients_drawn == 4).all()
    assert not np.array_equal(count_matrix(groups, 50, 4), counts)


def test_resampled_primary_is_the_tasks_primary_metric():
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 3, size=(4, 30)).astype(float)
    y = np.r_[np.zeros(15), np.ones(15)].astype(np.int64)
    p = rng.random(30)
    np.testing.assert_array_equal(resampled_primary("classification", y, p, counts), weighted_auroc(y, p, counts))
    codes = np.arange(30) % 3
    proba = rng.dirichlet(np.ones(3), size=30)
    np.testing.assert_array_equal(resampled_primary("multiclass", codes, proba, counts),
                                  weighted_macro_auroc(codes, proba, counts))
    target = rng.normal(size=30)
    np.testing.assert_array_equal(resampled_primary("regression", target, p, counts), weighted_r2(target, p, counts))


def test_weighted_auroc_of_one_positive_and_one_negative_is_defined():
    y = np.array([1, 0, 1, 0])
    score = np.array([0.9, 0.2, 0.1, 0.4])
    counts = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]])
    out = weighted_auroc(y, score, counts)
    assert out[:3].tolist() == [1.0, 0.0, 1.0] and np.isnan(out[3])  # the last draws negatives only


def test_binary_partition_scores_predict_class_1_from_one_half():
    y = np.array([1, 1, 0, 0])
    primary, accuracy = partition_scores("classification", y, np.array([0.5, 0.7, 0.2, 0.4]))
    assert primary == 1.0 and accuracy == 1.0

"""Scores of the representation-risk workflow, on a partition and on every bootstrap resample at once.

:mod:`crslib.risk` selects and compares candidates by a primary metric and
reports a secondary one, per task type:

========== ====================================== ===============================
task       primary (selection) metric             secondary metric
========== ====================================== ===============================
binary     AUROC of the positive-class score      accuracy at 0.5
multiclass macro one-vs-rest AUROC                balanced accuracy of the argmax
regression R^2                                    mean absolute error
========== ====================================== ===============================

The bootstrap of a partition is a matrix of counts (:func:`count_matrix`:
row r says how often each image was drawn in resample r), and every metric
here is computed on all resamples at once from those counts, with exactly
the value the metric has on the resampled rows. A resample on which the
primary metric is undefined (one class only; for a multi-class task, any
class missing) gives NaN: the intervals of :func:`crslib.stats.percentile_interval`
leave it out and count it.

Across the repeated partitions of :func:`crslib.risk.representation_risk`,
:func:`spread_and_selection` and :func:`rank_stability` summarise the test
scores, the selections and the encoders' ranks.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from crslib.metrics import metric_score
from crslib.probes import r2
from crslib.risk_results import PartitionResult
from crslib.stats import resample_indices, sum_of_squares

__all__ = ["UNION", "MULTICLASS", "LOSSES", "DEFAULT_LOSS", "LOG_LOSS_EPS", "row_losses", "resampled_loss",
           "spread_and_selection", "rank_stability", "count_matrix", "weighted_auroc", "weighted_macro_auroc",
           "weighted_r2", "partition_scores", "primary_score", "resampled_primary"]

#: Name of the feature-union candidate's ``encoder`` column.
UNION = "union"

#: Name of the multi-class task (the binary one is ``"classification"``, as before multi-class tasks existed).
MULTICLASS = "multiclass"


#: Proper scores (lower is better) that select among candidates, by task.
LOSSES = {"classification": ("log_loss",), MULTICLASS: ("log_loss",), "regression": ("mse", "mae")}

#: The selection loss of each task when none is chosen.
DEFAULT_LOSS = {"classification": "log_loss", MULTICLASS: "log_loss", "regression": "mse"}

#: The log loss clips the probability of the true class to ``[LOG_LOSS_EPS, 1 - LOG_LOSS_EPS]``
#: (a 0 would give infinity), as scikit-learn did; the selection's score and the metric panel share it.
LOG_LOSS_EPS = 1e-15


def row_losses(task: str, y: np.ndarray, pred: np.ndarray, loss: str) -> np.ndarray:
    """Each row's contribution to a proper score; their (weighted) mean is the score.

    ``log_loss``: minus the log of the probability given to the true class
    (binary: ``pred`` is P(class 1); multi-class: one column per class code),
    probabilities clipped to [1e-15, 1 - 1e-15]; ``mse``: squared error;
    ``mae``: absolute error.

    Examples
    --------
    >>> row_losses("classification", np.array([1, 0]), np.array([0.5, 0.5]), "log_loss").round(4).tolist()
    [0.6931, 0.6931]
    >>> row_losses("regression", np.array([1.0, 2.0]), np.array([0.0, 4.0]), "mae").tolist()
    [1.0, 2.0]
    """
    if loss == "log_loss":
        if task == MULTICLASS:
            p = pred[np.arange(y.size), y.astype(np.int64)]
        else:
            p = np.where(y == 1, pred, 1.0 - pred)
        return -np.log(np.clip(p, LOG_LOSS_EPS, 1.0 - LOG_LOSS_EPS))
    if loss == "mse":
        return (y - pred) ** 2
    return np.abs(y - pred)


def resampled_loss(row_loss: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """A proper score (mean of ``row_loss``) on every resample of ``counts`` at once; always defined."""
    return counts @ row_loss / counts.sum(axis=1)


def count_matrix(groups: np.ndarray, n_resamples: int, random_state: int) -> np.ndarray:
    """Patient-grouped bootstrap resamples as counts: row r = how often each image was drawn."""
    n = groups.shape[0]
    counts = np.zeros((n_resamples, n))
    draws = resample_indices(n, n_resamples=n_resamples, groups=groups, random_state=random_state)
    for r, idx in enumerate(draws):
        counts[r] = np.bincount(idx, minlength=n)
    return counts


def weighted_auroc(y: np.ndarray, score: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """AUROC on every resample at once (Mann-Whitney with ties counted half).

    Equals :func:`crslib.stats.auroc` on the resampled rows: a row drawn c
    times counts c times in every pair. NaN where a resample has one class.
    """
    order = np.argsort(score, kind="stable")
    s, pos_mask = score[order], y[order] == 1
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    c = counts[:, order]
    pos = np.add.reduceat(np.where(pos_mask, c, 0.0), starts, axis=1)
    neg = np.add.reduceat(np.where(pos_mask, 0.0, c), starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg
    num = np.einsum("ru,ru->r", pos, below + 0.5 * neg)
    den = pos.sum(axis=1) * neg.sum(axis=1)
    out = np.full(counts.shape[0], np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def weighted_macro_auroc(y: np.ndarray, proba: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Macro one-vs-rest AUROC on every resample at once.

    The mean over classes c of the AUROC of ``proba[:, c]`` for class c
    against the rest, each computed as :func:`weighted_auroc` does: with
    ``counts`` of ones it equals ``sklearn.metrics.roc_auc_score(y, proba,
    multi_class="ovr", average="macro")``, and with integer counts the same
    on the rows repeated that often (``sample_weight=counts``).

    Parameters
    ----------
    y : ndarray of int, shape (n_rows,)
        Class codes 0 .. k-1.
    proba : ndarray of shape (n_rows, k)
        Class scores (probabilities), one column per class code.
    counts : ndarray of shape (n_resamples, n_rows)
        How often each row is drawn in each resample.

    Returns
    -------
    ndarray of shape (n_resamples,)
        NaN for a resample in which a class is absent (its one-vs-rest AUROC,
        and so the macro mean, is undefined), as the binary AUROC is NaN on a
        one-class resample.

    Examples
    --------
    >>> y = np.array([0, 1, 2, 0, 1, 2])
    >>> weighted_macro_auroc(y, np.eye(3)[y], np.ones((1, 6))).tolist()
    [1.0]
    """
    per_class = np.stack([weighted_auroc((y == c).astype(np.int64), proba[:, c], counts)
                          for c in range(proba.shape[1])])
    return per_class.mean(axis=0)  # NaN as soon as one class is undefined


def weighted_r2(y: np.ndarray, pred: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """R^2 on every resample at once (equals R^2 on the resampled rows); NaN where y is constant."""
    ss_tot, varies = sum_of_squares(y, counts)
    ss_res = counts @ ((y - pred) ** 2)
    out = np.full(counts.shape[0], np.nan)
    out[varies] = 1.0 - ss_res[varies] / ss_tot[varies]
    return out


def resampled_primary(task: str, y: np.ndarray, pred: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The primary metric of ``task`` on every resample of ``counts``."""
    if task == MULTICLASS:
        return weighted_macro_auroc(y, pred, counts)
    if task == "classification":
        return weighted_auroc(y, pred, counts)
    return weighted_r2(y, pred, counts)


def balanced_accuracy(y: np.ndarray, proba: np.ndarray) -> float:
    """Mean recall over the classes present in ``y`` of the argmax prediction (ties to the lower class)."""
    hit = proba.argmax(axis=1) == y
    return float(np.mean([hit[y == c].mean() for c in np.unique(y)]))


def primary_score(task: str, y: np.ndarray, pred: np.ndarray) -> float:
    """The selection metric on one set of rows: AUROC, macro one-vs-rest AUROC or R^2."""
    if task == MULTICLASS:
        return float(weighted_macro_auroc(y, pred, np.ones((1, y.size)))[0])
    if task == "classification":
        return metric_score(y, pred, metric="auroc")
    return r2(y, pred)


def partition_scores(task: str, y: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """(primary, secondary) metric on one partition."""
    if task == MULTICLASS:
        return primary_score(task, y, pred), balanced_accuracy(y, pred)
    if task == "classification":
        return metric_score(y, pred, metric="auroc"), float(np.mean((pred >= 0.5) == (y == 1)))
    return r2(y, pred), float(np.mean(np.abs(y - pred)))


# --------------------------------------------------------------------------- across partitions


def _mean_spearman(matrix: np.ndarray) -> float:
    """Mean Spearman correlation between the rows of a (partitions x encoders) score matrix."""
    from scipy.stats import rankdata

    if matrix.shape[0] < 2 or matrix.shape[1] < 2:
        return float("nan")
    ranks = rankdata(matrix, axis=1)
    values = []
    for a, b in combinations(range(ranks.shape[0]), 2):
        if np.ptp(ranks[a]) > 0 and np.ptp(ranks[b]) > 0:
            values.append(float(np.corrcoef(ranks[a], ranks[b])[0, 1]))
    return float(np.mean(values)) if values else float("nan")


def spread_and_selection(results: list[PartitionResult],
                          encoders: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every partition's candidates, each candidate's test-score spread, and how often each encoder was selected."""
    n_partitions = len(results)
    all_partitions = pd.concat([r.candidates.assign(partition=r.partition) for r in results], ignore_index=True)
    all_partitions = all_partitions[["partition"] + [c for c in all_partitions.columns if c != "partition"]]
    spread = all_partitions.groupby("candidate", sort=False).agg(
        encoder=("encoder", "first"), head=("head", "first"), val_mean=("val_score", "mean"),
        mean=("test_score", "mean"), sd=("test_score", "std"), min=("test_score", "min"),
        max=("test_score", "max"), n_partitions=("test_score", "size"), times_selected=("selected", "sum"),
    ).reset_index()
    spread["times_selected"] = spread["times_selected"].astype(int)

    kinds = set().union(*(set(r.candidates["kind"]) for r in results))
    encoders = encoders + [k for k in ("average", "greedy", "stack", UNION) if k in kinds]
    chosen = pd.Series([r.selected_row["encoder"] for r in results])
    counts = [int((chosen == e).sum()) for e in encoders]
    selection_counts = pd.DataFrame({"encoder": encoders, "count": counts,
                                     "share": [c / n_partitions for c in counts]})
    return all_partitions, spread, selection_counts


def rank_stability(results: list[PartitionResult], encoders: list[str]) -> tuple[pd.DataFrame, dict[str, float]]:
    """The encoders' ranks over partitions, and the mean rank correlation between partitions.

    Each encoder is represented in a partition by its head with the lowest
    validation loss (its test loss is that head's: no test-based choice) and
    ranked by the selection loss, so encoders tied on AUROC are still told
    apart; tied losses share the better rank.
    """
    from scipy.stats import rankdata

    val_m = np.empty((len(results), len(encoders)))
    test_m = np.empty((len(results), len(encoders)))
    for i, r in enumerate(results):
        single = r.candidates[r.candidates["kind"] == "single"]
        for j, name in enumerate(encoders):
            rows = single[single["encoder"] == name]
            best = rows.iloc[int(np.argmin(rows["val_loss"].to_numpy()))]
            val_m[i, j], test_m[i, j] = best["val_loss"], best["test_loss"]
    val_rank = rankdata(val_m, axis=1, method="min")
    test_rank = rankdata(test_m, axis=1, method="min")
    rank_stability = pd.DataFrame({
        "encoder": encoders,
        "mean_val_rank": val_rank.mean(axis=0),
        "mean_test_rank": test_rank.mean(axis=0),
        "share_first_val": (val_rank == 1).mean(axis=0),
        "share_first_test": (test_rank == 1).mean(axis=0),
    })
    return rank_stability, {"validation": _mean_spearman(-val_m), "test": _mean_spearman(-test_m)}

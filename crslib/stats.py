"""Resampling statistics: bootstrap (row, grouped, stratified, paired),
permutation and Mantel tests, and a fast AUROC.

Everything here is pure and seeded: the same inputs and ``random_state`` give
the same numbers. Confidence intervals are percentile intervals of the
bootstrap distribution; resamples on which the statistic is undefined (it
returns NaN, e.g. an AUROC on a resample with one class) are left out of the
percentiles and counted in ``n_invalid``.

Grouped resampling draws whole groups (e.g. patients) with replacement and
takes all of their rows, so rows of one patient, which are not independent,
move together; stratified resampling draws within each stratum so that the
stratum sizes (or group counts) stay fixed.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from itertools import permutations
from typing import Any, Callable

import numpy as np

from crslib._resample import Resampler as _Resampler
from crslib._resample import as_arrays as _as_arrays
from crslib._resample import check_no_missing
from crslib._resample import sum_of_squares  # noqa: F401  (public here)
from crslib._validation import check_confidence, check_count
from crslib.errors import InputError

__all__ = [
    "BootstrapResult",
    "PairedBootstrapResult",
    "PermutationResult",
    "MantelResult",
    "auroc",
    "bootstrap_ci",
    "paired_bootstrap",
    "permutation_test",
    "mantel_test",
    "pairwise_spearman",
    "resample_indices",
    "group_permuter",
    "permutation_p_value",
    "percentile_interval",
    "share_positive",
    "sum_of_squares",
    "DeLongResult",
    "delong_test",
]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class BootstrapResult:
    """A statistic with its percentile bootstrap confidence interval.

    Attributes
    ----------
    estimate : float or ndarray
        The statistic on the original data (an array when the statistic
        returns several values).
    low, high : float or ndarray
        Percentile interval bounds at ``confidence``.
    samples : ndarray of shape (n_resamples,) or (n_resamples, n_values)
        The statistic on each resample (NaN where it was undefined).
    confidence : float
    n_invalid : int or ndarray
        Resamples on which the statistic was NaN (excluded from the interval).
    """

    estimate: Any
    low: Any
    high: Any
    samples: np.ndarray = field(repr=False)
    confidence: float = 0.95
    n_invalid: Any = 0


@dataclass(frozen=True)
class PairedBootstrapResult:
    """Difference ``statistic(a) - statistic(b)`` on the same resampled rows.

    Attributes
    ----------
    estimate : float
        Difference on the original data.
    low, high : float
        Percentile interval of the difference.
    share_positive : float
        Share of valid resamples with a difference > 0 (a bootstrap
        probability that ``a`` beats ``b``; not a p-value).
    estimate_a, estimate_b : float
        The statistic of each input on the original data.
    samples : ndarray of shape (n_resamples,)
        Differences on each resample.
    confidence : float
    n_invalid : int
    """

    estimate: float
    low: float
    high: float
    share_positive: float
    estimate_a: float
    estimate_b: float
    samples: np.ndarray = field(repr=False)
    confidence: float = 0.95
    n_invalid: int = 0


@dataclass(frozen=True)
class PermutationResult:
    """A permutation test: observed statistic, p-value and null samples."""

    statistic: float
    p_value: float
    n_permutations: int
    null: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class MantelResult:
    """A Mantel test between two distance or similarity matrices.

    Attributes
    ----------
    r : float
        Correlation (Spearman or Pearson) between the upper triangles.
    p_value : float
        Permutation p-value.
    n_permutations : int
        Permutations used (all ``M!`` when that is not more than requested;
        then the p-value is exact).
    exact : bool
        Whether every permutation was enumerated.
    """

    r: float
    p_value: float
    n_permutations: int
    exact: bool = False
    method: str = "spearman"
    alternative: str = "two-sided"


# --------------------------------------------------------------------------- helpers


def resample_indices(
    n: int,
    *,
    n_resamples: int = 1000,
    groups: Any = None,
    strata: Any = None,
    random_state: int | None = 0,
):
    """Yield bootstrap row-index arrays (rows, whole groups, within strata).

    Parameters
    ----------
    n : int
        Number of rows.
    n_resamples : int
        Number of index arrays to yield.
    groups : array-like of shape (n,), optional
        Group label per row; whole groups are drawn with replacement, so the
        resample size varies.
    strata : array-like of shape (n,), optional
        Stratum per row; rows (or groups) are drawn within each stratum.
    random_state : int
        Seed.

    Yields
    ------
    ndarray of int64

    Examples
    --------
    >>> [len(i) for i in resample_indices(4, n_resamples=2)]
    [4, 4]
    """
    n = check_count(n, "n")
    n_resamples = check_count(n_resamples, "n_resamples")
    sampler = _Resampler(n, groups, strata)
    rng = np.random.default_rng(random_state)
    for _ in range(n_resamples):
        yield sampler.draw(rng)


def percentile_interval(samples: Any, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Percentile interval of resampled statistics, column by column.

    Cuts ``(1 - confidence) / 2`` from each tail. NaN resamples (a statistic
    undefined on a resample) are ignored; an all-NaN column gives NaN bounds.
    The one home of the interval rule: the bootstrap functions here and the
    resampling intervals of :mod:`crslib.metrics` and :mod:`crslib.risk` use it.

    Parameters
    ----------
    samples : array-like of shape (n_resamples,) or (n_resamples, n_statistics)
    confidence : float
        Between 0 and 1 (e.g. 0.95).

    Returns
    -------
    low, high : ndarray (0-d for 1-D ``samples``)
    n_invalid : ndarray
        NaN resamples per column.

    Examples
    --------
    >>> low, high, n_invalid = percentile_interval(np.arange(101.0), 0.9)
    >>> round(float(low), 6), round(float(high), 6), int(n_invalid)
    (5.0, 95.0, 0)
    """
    samples = np.asarray(samples, dtype=float)
    confidence = check_confidence(confidence)
    alpha = (1.0 - confidence) / 2.0
    n_invalid = np.isnan(samples).sum(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "All-NaN slice"
        low = np.nanpercentile(samples, 100 * alpha, axis=0)
        high = np.nanpercentile(samples, 100 * (1 - alpha), axis=0)
    return low, high, n_invalid


def share_positive(differences: Any) -> float:
    """Share of the defined (non-NaN) paired differences above zero; NaN, quietly, when none is defined.

    The one home of the share reported next to a paired interval
    (:func:`paired_bootstrap`, the test comparisons of :mod:`crslib.risk`).

    Examples
    --------
    >>> share_positive([0.2, -0.1, 0.0, np.nan]), share_positive([np.nan])
    (0.3333333333333333, nan)
    """
    differences = np.asarray(differences, dtype=float)
    valid = differences[~np.isnan(differences)]
    return float(np.mean(valid > 0)) if valid.size else float("nan")


def _scalarise(x):
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


# --------------------------------------------------------------------------- bootstrap


def bootstrap_ci(
    statistic: Callable[..., Any],
    *arrays: Any,
    n_resamples: int = 1000,
    groups: Any = None,
    strata: Any = None,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> BootstrapResult:
    """Percentile bootstrap confidence interval of a statistic.

    Each resample draws one index array and applies it to every array, so
    rows stay paired (e.g. labels with scores).

    Parameters
    ----------
    statistic : callable
        ``statistic(*resampled_arrays) -> float or 1-D array``. Return NaN
        where it is undefined; such resamples are excluded and counted.
    *arrays : array-like
        Arrays with the same number of rows (first axis).
    n_resamples : int
        Number of bootstrap resamples.
    groups : array-like, optional
        Group label per row (e.g. patient id). Whole groups are drawn with
        replacement and all their rows taken, which respects within-group
        correlation; the interval is then usually wider than a row bootstrap.
    strata : array-like, optional
        Stratum per row; resampling happens within each stratum, keeping the
        stratum sizes (or their group counts, with ``groups``).
    confidence : float
        Coverage of the percentile interval.
    random_state : int
        Seed; the same seed gives the same interval.

    Returns
    -------
    BootstrapResult

    Examples
    --------
    >>> import numpy as np
    >>> x = np.arange(100.0)
    >>> res = bootstrap_ci(np.mean, x, n_resamples=200, random_state=0)
    >>> res.low < 49.5 < res.high
    True
    """
    n_resamples = check_count(n_resamples, "n_resamples")
    confidence = check_confidence(confidence)
    if not callable(statistic):
        raise InputError("statistic must be a callable taking the resampled arrays")
    arrays_, n = _as_arrays(arrays)
    estimate = _scalarise(statistic(*arrays_))
    sampler = _Resampler(n, groups, strata)
    rng = np.random.default_rng(random_state)
    first = np.asarray(estimate, dtype=float)
    samples = np.empty((n_resamples,) + first.shape, dtype=float)
    for b in range(n_resamples):
        idx = sampler.draw(rng)
        samples[b] = np.asarray(statistic(*(a[idx] for a in arrays_)), dtype=float)
    low, high, n_invalid = percentile_interval(samples, confidence)
    return BootstrapResult(
        estimate=estimate,
        low=_scalarise(low),
        high=_scalarise(high),
        samples=samples,
        confidence=confidence,
        n_invalid=int(n_invalid) if np.ndim(n_invalid) == 0 else n_invalid,
    )


def paired_bootstrap(
    statistic: Callable[..., float],
    inputs_a: Any,
    inputs_b: Any,
    *,
    n_resamples: int = 1000,
    groups: Any = None,
    strata: Any = None,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> PairedBootstrapResult:
    """Bootstrap the difference of a statistic between two paired inputs.

    Both inputs are resampled with the SAME row indices in every resample
    (e.g. two models' scores on the same test images), so the interval of
    the difference accounts for their correlation.

    Parameters
    ----------
    statistic : callable
        ``statistic(*arrays) -> float``.
    inputs_a, inputs_b : array or tuple of arrays
        The arguments of ``statistic`` for each side; all arrays of both
        sides share the row axis.
    n_resamples, groups, strata, confidence, random_state
        As in :func:`bootstrap_ci`.

    Returns
    -------
    PairedBootstrapResult
        ``estimate = statistic(*inputs_a) - statistic(*inputs_b)``.

    Examples
    --------
    >>> import numpy as np
    >>> y = np.r_[np.zeros(50), np.ones(50)]
    >>> good, bad = y + np.linspace(0, 1.5, 100), np.linspace(0, 1, 100)[::-1]
    >>> res = paired_bootstrap(auroc, (y, good), (y, bad), n_resamples=200)
    >>> res.estimate > 0 and res.share_positive == 1.0
    True
    """
    n_resamples = check_count(n_resamples, "n_resamples")
    confidence = check_confidence(confidence)
    a = tuple(inputs_a) if isinstance(inputs_a, (tuple, list)) else (inputs_a,)
    b = tuple(inputs_b) if isinstance(inputs_b, (tuple, list)) else (inputs_b,)
    arrays_, n = _as_arrays(a + b, "inputs")
    aa, bb = arrays_[: len(a)], arrays_[len(a):]
    est_a = float(statistic(*aa))
    est_b = float(statistic(*bb))
    sampler = _Resampler(n, groups, strata)
    rng = np.random.default_rng(random_state)
    diffs = np.empty(n_resamples)
    for r in range(n_resamples):
        idx = sampler.draw(rng)
        diffs[r] = float(statistic(*(x[idx] for x in aa))) - float(statistic(*(x[idx] for x in bb)))
    low, high, n_invalid = percentile_interval(diffs, confidence)
    share = share_positive(diffs)
    return PairedBootstrapResult(
        estimate=est_a - est_b,
        low=float(low),
        high=float(high),
        share_positive=share,
        estimate_a=est_a,
        estimate_b=est_b,
        samples=diffs,
        confidence=confidence,
        n_invalid=int(n_invalid),
    )


# --------------------------------------------------------------------------- AUROC


def _binary_labels(y: np.ndarray) -> np.ndarray:
    """0/1 (or bool) labels as bool; a cast to bool would read -1/1 or NaN labels as one class."""
    if y.dtype == bool:
        return y
    check_no_missing(y, "y_true")
    try:
        yf = y.astype(float)
    except (TypeError, ValueError):
        raise InputError("y_true must hold 0/1 (or bool) labels; map them to 0 (negative) and 1 (positive)") from None
    bad = (yf != 0.0) & (yf != 1.0)
    if bad.any():
        raise InputError(
            f"y_true must hold 0/1 (or bool) labels, but {int(bad.sum())} labels are not "
            f"(e.g. {np.unique(y[bad])[:3].tolist()}); map them to 0 (negative) and 1 (positive)"
        )
    return yf == 1.0


def auroc(y_true: Any, y_score: Any) -> float:
    """Area under the ROC curve (Mann-Whitney form, ties counted half).

    Fast enough to call inside a bootstrap loop. Returns NaN, instead of
    raising, when ``y_true`` holds one class only (the AUROC is undefined).

    Parameters
    ----------
    y_true : array-like of 0/1 (or bool)
        Any other value (e.g. -1/1 labels) or a missing label raises.
    y_score : array-like of float, higher = more likely positive
        Finite; NaN or infinite scores raise.

    Returns
    -------
    float

    Raises
    ------
    InputError
        Different lengths, labels other than 0/1, missing labels or scores.

    Examples
    --------
    >>> auroc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    """
    from scipy.stats import rankdata

    y = _binary_labels(np.asarray(y_true).ravel())
    s = np.asarray(y_score, dtype=float).ravel()
    if y.shape != s.shape:
        raise InputError(f"y_true and y_score must have the same length, got {y.size} and {s.size}")
    bad = ~np.isfinite(s)
    if bad.any():
        raise InputError(f"y_score has {int(bad.sum())} NaN or infinite value(s); drop those cases")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(s)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# --------------------------------------------------------------------------- permutation


def permutation_test(
    statistic: Callable[[np.ndarray, np.ndarray], float],
    x: Any,
    y: Any,
    *,
    n_permutations: int = 999,
    alternative: str = "two-sided",
    random_state: int | None = 0,
) -> PermutationResult:
    """Generic permutation test of association between paired ``x`` and ``y``.

    The rows of ``y`` are shuffled relative to ``x``; the p-value is
    ``(1 + #{null as extreme as observed}) / (1 + n_permutations)``.

    Parameters
    ----------
    statistic : callable
        ``statistic(x, y) -> float``.
    x, y : array-like with the same number of rows
    n_permutations : int
    alternative : {"two-sided", "greater", "less"}
    random_state : int

    Returns
    -------
    PermutationResult

    Examples
    --------
    >>> import numpy as np
    >>> x = np.arange(30.0)
    >>> res = permutation_test(lambda a, b: np.corrcoef(a, b)[0, 1], x, x, n_permutations=99)
    >>> res.p_value
    0.01
    """
    n_permutations = check_count(n_permutations, "n_permutations")
    (x, y), n = _as_arrays((x, y))
    observed = float(statistic(x, y))
    rng = np.random.default_rng(random_state)
    null = np.array([float(statistic(x, y[rng.permutation(n)])) for _ in range(n_permutations)])
    p = _perm_p(observed, null, alternative, include_observed=True)
    return PermutationResult(statistic=observed, p_value=p, n_permutations=n_permutations, null=null)


def _perm_p(observed: float, null: np.ndarray, alternative: str, *, include_observed: bool) -> float:
    if alternative not in ("two-sided", "greater", "less"):
        raise InputError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")
    tol = 1e-12 * max(1.0, abs(observed))
    if alternative == "greater":
        hits = np.sum(null >= observed - tol)
    elif alternative == "less":
        hits = np.sum(null <= observed + tol)
    else:
        hits = np.sum(np.abs(null) >= abs(observed) - tol)
    if include_observed:
        return float((1 + hits) / (1 + null.size))
    return float(hits / null.size)


def group_permuter(groups: Any) -> Callable[[np.ndarray, np.random.Generator], np.ndarray]:
    """A function ``permute(values, rng)`` that shuffles whole groups' values between groups.

    The value sequence of each group (rows in their original order) moves,
    as a block, to another group of the same size: rows of one patient move
    together, so a permutation test built on it respects the patient
    structure (the audits shuffle the test/pool assignment or the labels
    this way).

    Parameters
    ----------
    groups : array-like of shape (n_rows,)
        Group (patient) per row, compared as text.

    Returns
    -------
    callable
        ``permute(values, rng) -> ndarray``: a permuted copy of ``values``
        (one per row), drawing from the ``numpy.random.Generator`` ``rng``.

    Examples
    --------
    >>> permute = group_permuter(["a", "a", "b", "b", "c"])
    >>> out = permute(np.array([1, 1, 2, 2, 3]), np.random.default_rng(0))
    >>> int(out[4]), bool(out[0] == out[1] and out[2] == out[3])
    (3, True)
    """
    # as text, NaN ids would all read "nan" and move as one patient
    check_no_missing(np.asarray(groups, dtype=object), "groups")
    _, inverse = np.unique(np.array([str(g) for g in groups], dtype=object), return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    by_size = [np.flatnonzero(sizes == size) for size in np.unique(sizes)]

    def permute(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = values.copy()
        for members in by_size:
            shuffled = rng.permutation(members)
            for offset in range(int(sizes[members[0]])):
                out[order[starts[members] + offset]] = values[order[starts[shuffled] + offset]]
        return out

    return permute


def permutation_p_value(observed: float, null: np.ndarray) -> float:
    """One-sided permutation p-value, ``(1 + #{null >= observed}) / (1 + #valid)``.

    NaN entries of ``null`` are left out; NaN when ``observed`` is NaN or no
    null value is valid.

    Examples
    --------
    >>> permutation_p_value(0.9, np.array([0.5, 0.6, 0.95, np.nan]))
    0.5
    """
    valid = null[np.isfinite(null)]
    if not math.isfinite(observed) or valid.size == 0:
        return float("nan")
    return float((1 + np.sum(valid >= observed - 1e-12)) / (1 + valid.size))


# --------------------------------------------------------------------------- Mantel


def _check_square_pair(A: Any, B: Any) -> tuple[np.ndarray, np.ndarray]:
    A = np.asarray(A, dtype=float)
    B = np.asarray(B, dtype=float)
    for name, m in (("A", A), ("B", B)):
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise InputError(f"{name} must be a square matrix (models x models), got shape {m.shape}")
    if A.shape != B.shape:
        raise InputError(f"A and B must have the same shape, got {A.shape} and {B.shape}")
    if A.shape[0] < 3:
        raise InputError(f"need at least 3 models (3 pairs) for a matrix correlation, got {A.shape[0]}")
    iu = np.triu_indices(A.shape[0], 1)
    for name, m in (("A", A), ("B", B)):
        if not np.isfinite(m[iu]).all() or not np.isfinite(m.T[iu]).all():
            raise InputError(f"{name} has NaN or infinite off-diagonal entries; fill or drop those models")
        if not np.allclose(m, m.T, rtol=1e-6, atol=1e-9, equal_nan=True):
            raise InputError(f"{name} must be symmetric; symmetrise it, e.g. (A + A.T) / 2")
    return A, B


def pairwise_spearman(A: Any, B: Any) -> float:
    """Spearman correlation between the upper triangles of two square matrices.

    A descriptive number only: its textbook p-value assumes the M(M-1)/2
    pairs are independent, which they are not (see :func:`mantel_test`).

    Examples
    --------
    >>> import numpy as np
    >>> A = np.array([[0, 1, 2], [1, 0, 3], [2, 3, 0.]])
    >>> pairwise_spearman(A, 2 * A)
    1.0
    """
    from scipy.stats import spearmanr

    A, B = _check_square_pair(A, B)
    iu = np.triu_indices(A.shape[0], 1)
    return float(spearmanr(A[iu], B[iu]).statistic)


def mantel_test(
    A: Any,
    B: Any,
    *,
    n_permutations: int = 999,
    method: str = "spearman",
    alternative: str = "two-sided",
    random_state: int | None = 0,
) -> MantelResult:
    """Mantel test: correlation between two model-by-model matrices.

    The statistic is the correlation between the upper triangles of ``A``
    and ``B``. Its null distribution comes from relabelling the models of
    one matrix: rows AND columns of ``A`` are permuted together.

    Why not the p-value of a plain correlation over pairs? The M(M-1)/2
    entries are not independent observations: each model appears in M-1
    pairs, so one unusual model moves M-1 entries at once. Treating pairs as
    independent overstates the sample size and gives anti-conservative
    (too small) p-values. Permuting model labels keeps this dependence
    intact under the null.

    Parameters
    ----------
    A, B : array-like of shape (M, M)
        Symmetric matrices (agreement, distance, absolute accuracy difference, ...).
        The diagonal is ignored.
    n_permutations : int
        Number of random permutations. When ``M!`` is not larger, all ``M!``
        relabellings are enumerated (identity included) and the p-value is
        exact; note that with few models the smallest attainable p-value is
        ``1 / M!`` (e.g. 1/24 for 4 models).
    method : {"spearman", "pearson"}
    alternative : {"two-sided", "greater", "less"}
    random_state : int

    Returns
    -------
    MantelResult

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> P = rng.random((6, 6)); A = P + P.T
    >>> res = mantel_test(A, A)
    >>> round(res.r, 6), res.p_value < 0.01
    (1.0, True)
    """
    from scipy.stats import rankdata

    if method not in ("spearman", "pearson"):
        raise InputError(f"method must be 'spearman' or 'pearson', got {method!r}")
    if alternative not in ("two-sided", "greater", "less"):
        raise InputError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")
    n_permutations = check_count(n_permutations, "n_permutations")
    A, B = _check_square_pair(A, B)
    m = A.shape[0]
    iu0, iu1 = np.triu_indices(m, 1)
    a_vals = A[iu0, iu1]
    b_vals = B[iu0, iu1]
    if method == "spearman":
        a_vals = rankdata(a_vals)
        b_vals = rankdata(b_vals)
    if np.ptp(a_vals) == 0 or np.ptp(b_vals) == 0:
        raise InputError("one matrix is constant over its off-diagonal entries; the correlation is undefined")
    # The permuted upper triangle of A holds the same multiset of values, so
    # ranks can be computed once and permuted along with the matrix.
    RA = np.zeros((m, m))
    RA[iu0, iu1] = a_vals
    RA[iu1, iu0] = a_vals
    b_c = b_vals - b_vals.mean()
    b_c /= np.linalg.norm(b_c)
    a_mean = a_vals.mean()
    a_norm = np.linalg.norm(a_vals - a_mean)

    def corr(perms: np.ndarray) -> np.ndarray:
        vals = RA[perms[:, iu0], perms[:, iu1]] - a_mean
        return vals @ b_c / a_norm

    observed = float(corr(np.arange(m)[None, :])[0])
    n_all = math.factorial(m) if m <= 10 else None
    if n_all is not None and n_all <= n_permutations:
        perms = np.array(list(permutations(range(m))), dtype=np.int64)
        null = np.concatenate([corr(perms[i : i + 4096]) for i in range(0, len(perms), 4096)])
        p = _perm_p(observed, null, alternative, include_observed=False)
        return MantelResult(observed, p, int(n_all), True, method, alternative)
    rng = np.random.default_rng(random_state)
    null = np.empty(n_permutations)
    for s in range(0, n_permutations, 1024):
        cnt = min(1024, n_permutations - s)
        perms = np.argsort(rng.random((cnt, m)), axis=1)
        null[s : s + cnt] = corr(perms)
    p = _perm_p(observed, null, alternative, include_observed=True)
    return MantelResult(observed, p, n_permutations, False, method, alternative)


# --------------------------------------------------------------------------- DeLong


@dataclass(frozen=True)
class DeLongResult:
    """DeLong test of two correlated AUROCs measured on the same cases.

    Attributes
    ----------
    auc_a, auc_b : float
        AUROC of each score.
    difference : float
        ``auc_a - auc_b``.
    se : float
        Standard error of the difference.
    z : float
        ``difference / se``.
    p_value : float
        Two-sided normal p-value.
    low, high : float
        Wald confidence interval of the difference at ``confidence``.
    confidence : float
    """

    auc_a: float
    auc_b: float
    difference: float
    se: float
    z: float
    p_value: float
    low: float
    high: float
    confidence: float = 0.95


def _midranks(x: np.ndarray) -> np.ndarray:
    """Midranks (1-based, ties get the mean of their ranks) along the last axis."""
    from scipy.stats import rankdata

    return rankdata(x, method="average", axis=-1)


def delong_test(
    y_true: Any,
    score_a: Any,
    score_b: Any,
    *,
    confidence: float = 0.95,
) -> DeLongResult:
    """DeLong test comparing two AUROCs computed on the same cases.

    Implements DeLong, DeLong & Clarke-Pearson (1988) with the fast midrank
    algorithm of Sun & Xu (2014): for ``m`` positives and ``n`` negatives,
    the structural components are ``V10_i = (Z_i - X_i) / n`` for each
    positive (``Z`` = midrank among all cases, ``X`` = midrank among the
    positives) and ``V01_j = 1 - (Z_j - Y_j) / m`` for each negative, so
    that ties count one half, as in the Mann-Whitney AUROC. The covariance
    of the two AUROCs is ``S10 / m + S01 / n`` with ``S10``, ``S01`` the
    sample covariance matrices (divisor ``m - 1``, ``n - 1``) of the
    components; the test statistic is ``z = (auc_a - auc_b) / se``.

    Because both scores are judged on the same cases, their AUROCs are
    correlated; this test accounts for it (two independent-sample CIs would
    be too wide and a naive z-test too conservative).

    When the standard error is 0 (e.g. ``score_b`` equals ``score_a``, or a
    monotone transform of it), the difference is 0 and ``z = 0``,
    ``p_value = 1.0``; in the degenerate case of a non-zero difference with a
    zero standard error, ``z = +-inf`` and ``p_value = 0.0``.

    Parameters
    ----------
    y_true : array-like of 0/1 (or bool)
        Both classes must be present.
    score_a, score_b : array-like of float
        Scores of the two models, higher = more likely positive (any scale:
        only their order matters).
    confidence : float
        Coverage of the interval of the difference.

    Returns
    -------
    DeLongResult

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 2, 300)
    >>> res = delong_test(y, y + rng.normal(0, 0.5, 300), y + rng.normal(0, 2.0, 300))
    >>> res.difference > 0 and res.p_value < 0.01 and res.low < res.difference < res.high
    True
    """
    from scipy.stats import norm

    confidence = check_confidence(confidence)
    y = np.asarray(y_true)
    if y.ndim != 1:
        raise InputError(f"y_true must be a 1-D array with one label per case, got shape {y.shape}")
    scores = []
    for name, s in (("score_a", score_a), ("score_b", score_b)):
        s = np.asarray(s, dtype=float)
        if s.ndim != 1 or s.shape[0] != y.shape[0]:
            raise InputError(
                f"y_true and {name} must have the same length (one score per case), got "
                f"{y.shape[0]} labels and {s.size} scores"
            )
        if not np.isfinite(s).all():
            raise InputError(f"{name} has {int((~np.isfinite(s)).sum())} NaN or infinite values; drop those cases")
        scores.append(s)
    if y.dtype != bool:
        try:
            yf = y.astype(float)
        except (TypeError, ValueError):
            raise InputError("y_true must hold 0/1 (or bool) labels") from None
        if not np.isin(yf, (0.0, 1.0)).all():
            raise InputError("y_true must hold 0/1 (or bool) labels without missing values")
        y = yf == 1.0
    m = int(y.sum())
    n = y.size - m
    if m < 2 or n < 2:
        raise InputError(
            f"need at least 2 positive and 2 negative cases for the DeLong test, got {m} positive "
            f"and {n} negative; a single class has no AUROC"
        )
    S = np.vstack(scores)  # (2, N)
    pos, neg = S[:, y], S[:, ~y]
    tz = _midranks(np.hstack([pos, neg]))
    tx = _midranks(pos)
    ty = _midranks(neg)
    v10 = (tz[:, :m] - tx) / n  # share of negatives below each positive
    v01 = 1.0 - (tz[:, m:] - ty) / m  # share of positives above each negative
    aucs = v10.mean(axis=1)
    cov = np.cov(v10) / m + np.cov(v01) / n
    var = float(cov[0, 0] + cov[1, 1] - 2.0 * cov[0, 1])
    diff = float(aucs[0] - aucs[1])
    se = math.sqrt(max(var, 0.0))
    if se <= 1e-15:
        se = 0.0
        z = 0.0 if abs(diff) <= 1e-15 else math.copysign(math.inf, diff)
        p = 1.0 if z == 0.0 else 0.0
    else:
        z = diff / se
        p = float(2.0 * norm.sf(abs(z)))
    half = float(norm.ppf(0.5 + confidence / 2.0)) * se
    return DeLongResult(
        auc_a=float(aucs[0]),
        auc_b=float(aucs[1]),
        difference=diff,
        se=se,
        z=float(z),
        p_value=p,
        low=diff - half,
        high=diff + half,
        confidence=confidence,
    )

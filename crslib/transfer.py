"""Linear maps between embedding spaces and classifier transfer.

A linear map fitted on unlabelled images carries a classifier trained on
one model's embeddings over to another model: embed new images with the new
model, map them into the old model's space, apply the old classifier. The
share of AUROC kept (retention = transferred / original) measures how much
of what the old classifier used survives a linear change of encoder
(CRS-Bench: 0.987 over 14 findings).

Everything is pure: arrays and DataFrames in, fitted maps and tables out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from crslib import stats
from crslib._compat import one_blas_thread
from crslib._io import JsonResult, json_ready
from crslib._validation import as_embeddings, check_count
from crslib.errors import InputError
from crslib.probes import check_labels, class_codes, degenerate_reason, logistic_probe
from crslib.splits import grouped_split

log = logging.getLogger(__name__)

__all__ = [
    "LinearMap",
    "ClassifierTransfer",
    "TransferSweep",
    "fit_linear_map",
    "held_out_r2",
    "classifier_transfer",
    "transfer_sweep",
    "transfer_targets",
]

MAP_METHODS = ("ridge", "lstsq", "procrustes")
DEFAULT_ALPHAS = tuple(np.logspace(-3, 3, 13))


@dataclass
class LinearMap:
    """An affine map ``Y ~ (X - mean_src_) @ coef_ + mean_dst_``.

    Attributes
    ----------
    method : str
        "ridge", "lstsq" or "procrustes".
    coef_ : ndarray of shape (d_src, d_dst)
    mean_src_, mean_dst_ : ndarray
        Centring means estimated on the fitting images.
    alpha_ : float or None
        Ridge penalty chosen by cross-validation (ridge only).
    scale_ : float
        Isotropic scale (procrustes only; 1.0 otherwise).
    cv_errors_ : dict
        Mean squared validation error per alpha (ridge only).
    n_fit_ : int
        Number of images the map was fitted on.
    """

    method: str
    coef_: np.ndarray = field(repr=False)
    mean_src_: np.ndarray = field(repr=False)
    mean_dst_: np.ndarray = field(repr=False)
    alpha_: float | None = None
    scale_: float = 1.0
    cv_errors_: dict = field(default_factory=dict, repr=False)
    n_fit_: int = 0

    @property
    def n_features_in_(self) -> int:
        return int(self.coef_.shape[0])

    @property
    def n_features_out_(self) -> int:
        return int(self.coef_.shape[1])

    def predict(self, X: Any) -> np.ndarray:
        """Map source embeddings to the destination space.

        Parameters
        ----------
        X : array-like of shape (n, d_src)

        Returns
        -------
        ndarray of shape (n, d_dst), float64
        """
        Xf = as_embeddings(X, "X", np.float64)
        if Xf.shape[1] != self.n_features_in_:
            raise InputError(
                f"X has {Xf.shape[1]} features but the map was fitted on {self.n_features_in_}; "
                "pass embeddings of the source model"
            )
        return (Xf - self.mean_src_) @ self.coef_ + self.mean_dst_


def _pair(X_src: Any, X_dst: Any, src: str = "X_src", dst: str = "X_dst") -> tuple[np.ndarray, np.ndarray]:
    A = as_embeddings(X_src, src, np.float64)
    B = as_embeddings(X_dst, dst, np.float64)
    if A.shape[0] != B.shape[0]:
        raise InputError(
            f"{src} and {dst} must hold the same images in the same order; they have {A.shape[0]} and {B.shape[0]} rows"
        )
    return A, B


def _ridge_coef(U: np.ndarray, s: np.ndarray, Vt: np.ndarray, Y: np.ndarray, alpha: float) -> np.ndarray:
    f = s / (s * s + alpha)
    return Vt.T @ (f[:, None] * (U.T @ Y))


def _ridge_cv(X: np.ndarray, Y: np.ndarray, alphas: np.ndarray, cv: int, random_state) -> tuple[float, dict]:
    from sklearn.model_selection import KFold

    errors = np.zeros(alphas.size)
    count = 0
    for tr, va in KFold(n_splits=cv, shuffle=True, random_state=random_state).split(X):
        mx, my = X[tr].mean(axis=0), Y[tr].mean(axis=0)
        U, s, Vt = np.linalg.svd(X[tr] - mx, full_matrices=False)
        UtY = U.T @ (Y[tr] - my)
        P = (X[va] - mx) @ Vt.T  # validation rows in the singular basis
        R = Y[va] - my
        for a, alpha in enumerate(alphas):
            f = s / (s * s + alpha)
            pred = (P * f) @ UtY
            errors[a] += float(((R - pred) ** 2).sum())
        count += va.size * Y.shape[1]
    errors /= count
    best = int(np.argmin(errors))
    return float(alphas[best]), {float(a): float(e) for a, e in zip(alphas, errors)}


def fit_linear_map(
    X_src: Any,
    X_dst: Any,
    *,
    method: str = "ridge",
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    cv: int = 5,
    random_state: int | None = 0,
) -> LinearMap:
    """Fit a linear map from one embedding space to another.

    Both sides are centred on the fitting images; the map is affine.

    Parameters
    ----------
    X_src : array-like of shape (n, d_src)
        Source-model embeddings of the fitting images.
    X_dst : array-like of shape (n, d_dst)
        Destination-model embeddings of the same images, same order.
    method : {"ridge", "lstsq", "procrustes"}
        * "ridge": L2-penalised least squares; the penalty (on centred, not
          standardised, data) is chosen from ``alphas`` by ``cv``-fold
          cross-validation of the mean squared error (ties: smallest).
        * "lstsq": ordinary least squares, minimum-norm solution
          (``numpy.linalg.lstsq``); interpolates when n <= d_src.
        * "procrustes": an orthogonal map times one isotropic scale (the
          scale absorbs the arbitrary norms of different encoders). When the
          dimensions differ, the smaller side is zero-padded, which keeps the
          map an isometry of the source space (no PCA: nothing is discarded
          before fitting); only the first d_dst outputs are kept.
    alphas : sequence of float
        Candidate ridge penalties (default ``logspace(-3, 3, 13)``).
    cv : int
        Folds for choosing alpha (lowered to n when n < cv).
    random_state : int
        Seed of the fold assignment.

    Returns
    -------
    LinearMap

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 6)); Y = X @ rng.normal(size=(6, 4)) + 1.0
    >>> m = fit_linear_map(X, Y)
    >>> round(held_out_r2(m, X, Y), 4)
    1.0
    """
    if method not in MAP_METHODS:
        raise InputError(f"method must be one of {MAP_METHODS}, got {method!r}")
    X, Y = _pair(X_src, X_dst)  # at least 2 images each
    n = X.shape[0]
    mx, my = X.mean(axis=0), Y.mean(axis=0)
    Xc, Yc = X - mx, Y - my
    if method == "lstsq":
        coef = np.linalg.lstsq(Xc, Yc, rcond=None)[0]
        return LinearMap("lstsq", coef, mx, my, n_fit_=n)
    if method == "procrustes":
        U, s, Vt = np.linalg.svd(Xc.T @ Yc, full_matrices=False)
        W = U @ Vt  # (d_src, d_dst) semi-orthogonal: the zero-padded solution's relevant block
        P = Xc @ W
        pp = float((P * P).sum())
        scale = float((P * Yc).sum() / pp) if pp > 0 else 1.0
        return LinearMap("procrustes", scale * W, mx, my, scale_=scale, n_fit_=n)
    a = np.asarray(alphas, dtype=float).ravel()
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise InputError(f"alphas must be positive finite numbers, got {list(alphas)}")
    if isinstance(cv, bool) or not isinstance(cv, (int, np.integer)) or cv < 2:
        raise InputError(f"cv must be an integer >= 2, got {cv!r}")
    folds = min(int(cv), n)
    if a.size == 1:
        alpha, errors = float(a[0]), {}
    else:
        alpha, errors = _ridge_cv(X, Y, np.sort(a), folds, random_state)
        if alpha in (float(a.min()), float(a.max())):
            log.info("ridge alpha %.3g chosen at the edge of the grid; consider widening alphas", alpha)
    U, s, Vt = np.linalg.svd(Xc, full_matrices=False)
    coef = _ridge_coef(U, s, Vt, Yc, alpha)
    return LinearMap("ridge", coef, mx, my, alpha_=alpha, cv_errors_=errors, n_fit_=n)


def held_out_r2(map: LinearMap, X_src_test: Any, X_dst_test: Any) -> float:
    """Variance-weighted R^2 of a map on images it was not fitted on.

    ``1 - sum ||Y - Y_hat||^2 / sum ||Y - mean(Y)||^2`` over all output
    dimensions (scikit-learn's ``multioutput="variance_weighted"``).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(100, 3))
    >>> m = fit_linear_map(X[:50], 2 * X[:50], method="lstsq")
    >>> round(held_out_r2(m, X[50:], 2 * X[50:]), 6)
    1.0
    """
    if not isinstance(map, LinearMap):
        raise InputError("map must be a LinearMap from fit_linear_map")
    X, Y = _pair(X_src_test, X_dst_test, "X_src_test", "X_dst_test")
    if Y.shape[1] != map.n_features_out_:
        raise InputError(f"X_dst_test has {Y.shape[1]} features but the map outputs {map.n_features_out_}")
    pred = map.predict(X)
    sst = float(((Y - Y.mean(axis=0)) ** 2).sum())
    if sst == 0:
        raise InputError("X_dst_test is constant over the test images; R^2 is undefined")
    return float(1.0 - ((Y - pred) ** 2).sum() / sst)


# --------------------------------------------------------------------------- classifier transfer


def _index_array(idx: Any, n: int, name: str) -> np.ndarray:
    arr = np.asarray(idx)
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise InputError(f"{name} as a boolean mask must have one entry per image ({n}), got shape {arr.shape}")
        arr = np.flatnonzero(arr)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InputError(f"{name} must be a 1-D array of integer row indices, got {arr.dtype} {arr.shape}")
    arr = arr.astype(np.int64)
    if arr.size == 0:
        raise InputError(f"{name} is empty")
    if arr.min() < 0 or arr.max() >= n:
        raise InputError(f"{name} has indices outside 0..{n - 1}")
    if np.unique(arr).size != arr.size:
        raise InputError(f"{name} repeats some images; pass each index once")
    return arr


def _check_disjoint(sets: dict[str, np.ndarray], groups: np.ndarray | None) -> None:
    names = list(sets)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            a, b = names[i], names[j]
            shared = np.intersect1d(sets[a], sets[b])
            if shared.size:
                raise InputError(
                    f"{a} and {b} share {shared.size} image(s) (e.g. rows {shared[:5].tolist()}); "
                    "the map, training and test images must be disjoint"
                )
            if groups is not None:
                sg = np.intersect1d(groups[sets[a]], groups[sets[b]])
                if sg.size:
                    raise InputError(
                        f"{a} and {b} share {sg.size} patient(s) (e.g. {sg[:3].tolist()}); "
                        "split by patient so that no patient is in two parts"
                    )


def _fit_probes(X_train: np.ndarray, lab_train: pd.DataFrame, C: float, max_iter: int, random_state):
    probes, reasons = {}, {}
    with one_blas_thread():  # one small fit per finding
        for col in lab_train.columns:
            y = lab_train[col].to_numpy()
            keep = ~np.isnan(y)
            reason = degenerate_reason(y[keep].astype(int), "training")
            if reason:
                reasons[col] = reason
                continue
            probes[col] = (logistic_probe(C, max_iter, random_state).fit(X_train[keep], y[keep].astype(int)), int(keep.sum()))
    return probes, reasons


def _auc3(y: np.ndarray, s_orig: np.ndarray, s_trans: np.ndarray) -> np.ndarray:
    a = stats.auroc(y, s_orig)
    b = stats.auroc(y, s_trans)
    return np.array([a, b, b / a if a > 0 else np.nan])


_COLUMNS = [
    "finding",
    "n_train",
    "n_test",
    "n_test_positive",
    "auroc_original",
    "auroc_original_low",
    "auroc_original_high",
    "auroc_transferred",
    "auroc_transferred_low",
    "auroc_transferred_high",
    "retention",
    "retention_low",
    "retention_high",
    "map_r2",
    "reason",
]


@dataclass(frozen=True, eq=False)
class ClassifierTransfer(JsonResult):
    """Per-finding AUROC retention of classifiers carried to a new encoder (:func:`classifier_transfer`).

    Attributes
    ----------
    table : DataFrame
        One row per finding, with columns finding, n_train, n_test,
        n_test_positive, auroc_original(+_low/_high),
        auroc_transferred(+_low/_high), retention(+_low/_high), map_r2,
        reason (see :func:`classifier_transfer`).
    method : str
        The map's method ("ridge", "lstsq" or "procrustes").
    alpha : float or None
        Ridge penalty chosen by cross-validation (None for the other methods).
    n_map : int
        Images the map was fitted on.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> old = rng.normal(size=(300, 4)); y = pd.DataFrame({"edema": (old[:, 0] > 0).astype(int)})
    >>> res = classifier_transfer(old, 2 * old, y, map_idx=np.arange(100), train_idx=np.arange(100, 200),
    ...                           test_idx=np.arange(200, 300), method="lstsq", n_resamples=20)
    >>> d = res.to_dict()
    >>> d["method"], d["alpha"], d["n_map"], d["table"][0]["finding"]
    ('lstsq', None, 100, 'edema')
    """

    table: pd.DataFrame
    method: str
    alpha: float | None
    n_map: int

    def to_frame(self) -> pd.DataFrame:
        """A copy of :attr:`table` (changing it leaves this result as it is)."""
        return self.table.copy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: method, alpha, n_map and ``table`` (a list of row records; NaN as None)."""
        return json_ready({"method": self.method, "alpha": self.alpha, "n_map": self.n_map, "table": self.table})


@dataclass(frozen=True, eq=False)
class TransferSweep(JsonResult):
    """AUROC retention against the number of map images (:func:`transfer_sweep`).

    Attributes
    ----------
    table : DataFrame
        One row per (n_map, finding): columns n_map, alpha (the ridge
        penalty of that map; None for other methods) and the columns of
        :attr:`ClassifierTransfer.table`.
    dropped_n : list of int
        Requested map sizes larger than the map pool (replaced by the pool
        size); empty when none was.
    n_pool : int
        Images in the map pool.
    n_train, n_test : int
        Images in the probe training and probe test parts.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> old = rng.normal(size=(200, 4)); y = pd.DataFrame({"edema": (old[:, 0] > 0).astype(int)})
    >>> res = transfer_sweep(old, 2 * old, y, groups=np.arange(200), n_values=(8, 1000), n_resamples=10)
    >>> res.dropped_n, res.n_pool, res.n_train + res.n_test, res.to_frame()["n_map"].tolist()
    ([1000], 100, 100, [8, 100])
    """

    table: pd.DataFrame
    dropped_n: list[int] = field(default_factory=list)
    n_pool: int = 0
    n_train: int = 0
    n_test: int = 0

    def to_frame(self) -> pd.DataFrame:
        """A copy of :attr:`table` (changing it leaves this result as it is)."""
        return self.table.copy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: dropped_n, n_pool, n_train, n_test and ``table`` (a list of row records)."""
        return json_ready({"dropped_n": self.dropped_n, "n_pool": self.n_pool, "n_train": self.n_train,
                           "n_test": self.n_test, "table": self.table})


def _evaluate(
    probes: dict,
    reasons: dict,
    findings: list,
    lab_test: pd.DataFrame,
    X_old_test: np.ndarray,
    X_mapped_test: np.ndarray,
    groups_test: np.ndarray | None,
    map_r2: float,
    n_resamples: int,
    confidence: float,
    random_state,
) -> pd.DataFrame:
    rows = []
    for col in findings:
        y_all = lab_test[col].to_numpy()
        keep = ~np.isnan(y_all)
        y = y_all[keep].astype(int)
        row = dict.fromkeys(_COLUMNS, np.nan)
        row.update(finding=col, n_test=int(keep.sum()), n_test_positive=int(y.sum()), map_r2=map_r2, reason="")
        reason = reasons.get(col) or degenerate_reason(y, "test")
        if col in probes:
            row["n_train"] = probes[col][1]
        if reason:
            row["reason"] = reason
            # recorded in the table's reason column; a finding rare in one split is expected, not a fault
            log.info("classifier_transfer: finding %r skipped: %s", col, reason)
            rows.append(row)
            continue
        clf = probes[col][0]
        s_o = clf.decision_function(X_old_test[keep])
        s_t = clf.decision_function(X_mapped_test[keep])
        res = stats.bootstrap_ci(
            _auc3,
            y,
            s_o,
            s_t,
            n_resamples=n_resamples,
            groups=None if groups_test is None else groups_test[keep],
            confidence=confidence,
            random_state=random_state,
        )
        est, lo, hi = np.atleast_1d(res.estimate), np.atleast_1d(res.low), np.atleast_1d(res.high)
        for i, name in enumerate(("auroc_original", "auroc_transferred", "retention")):
            row[name], row[f"{name}_low"], row[f"{name}_high"] = float(est[i]), float(lo[i]), float(hi[i])
        rows.append(row)
    return pd.DataFrame(rows, columns=_COLUMNS)


def classifier_transfer(
    X_old: Any,
    X_new: Any,
    labels: pd.DataFrame,
    *,
    map_idx: Any,
    train_idx: Any,
    test_idx: Any,
    method: str = "ridge",
    groups: Any = None,
    C: float = 1.0,
    max_iter: int = 2000,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> ClassifierTransfer:
    """Carry per-finding classifiers from an old encoder to a new one.

    1. Per finding, a logistic regression (standardised, L2) is trained on
       the OLD model's embeddings of ``train_idx``.
    2. A linear map new -> old is fitted on ``map_idx`` (unlabelled images,
       disjoint from training and test images).
    3. The old classifier scores the mapped new-model embeddings of
       ``test_idx`` (transferred AUROC) and the old-model embeddings of the
       same images (original AUROC). Retention = transferred / original.

    Intervals come from a paired bootstrap of the test images (the same
    resampled images for both AUROCs and their ratio; by patient when
    ``groups`` is given).

    Parameters
    ----------
    X_old, X_new : array-like of shape (N, d_old) and (N, d_new)
        Embeddings of the same N images by the old and new model.
    labels : DataFrame of shape (N, n_findings)
        0/1 per finding, NaN for unknown (left out for that finding).
    map_idx, train_idx, test_idx : array-like of int (or boolean masks)
        Pairwise disjoint row sets; overlap raises InputError.
    method : {"ridge", "lstsq", "procrustes"}
        See :func:`fit_linear_map`.
    groups : array-like of shape (N,), optional
        Patient ids: the three sets must then also be patient-disjoint, and
        the bootstrap resamples patients.
    C, max_iter : float, int
        Logistic regression settings.
    n_resamples, confidence, random_state
        Bootstrap settings and seed (also seeds the map's CV folds).

    Returns
    -------
    ClassifierTransfer
        ``table``: one row per finding, with columns finding, n_train,
        n_test, n_test_positive, auroc_original(+_low/_high),
        auroc_transferred(+_low/_high), retention(+_low/_high), map_r2
        (held-out R^2 of the map on the test images), reason (why a finding
        was skipped; empty otherwise). A finding with a single class in the
        training or test images gets NaN values and a reason instead of an
        error. ``method``, ``alpha`` (the ridge penalty chosen; None for
        other methods) and ``n_map`` describe the map.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> old = rng.normal(size=(600, 8)); new = old @ rng.normal(size=(8, 8))
    >>> y = pd.DataFrame({"nodule": (old[:, 0] + rng.normal(0, .5, 600) > 0).astype(int)})
    >>> t = classifier_transfer(old, new, y, map_idx=np.arange(200), train_idx=np.arange(200, 400),
    ...                         test_idx=np.arange(400, 600), n_resamples=50)
    >>> float(t.table.retention.iloc[0]) > 0.97, t.method, t.n_map
    (True, 'ridge', 200)
    """
    A, B = _pair(X_old, X_new, "X_old", "X_new")
    n = A.shape[0]
    lab = check_labels(labels, n)
    sets = {
        "map_idx": _index_array(map_idx, n, "map_idx"),
        "train_idx": _index_array(train_idx, n, "train_idx"),
        "test_idx": _index_array(test_idx, n, "test_idx"),
    }
    g = None
    if groups is not None:
        g = np.asarray(groups)
        if g.shape != (n,):
            raise InputError(f"groups must have one patient id per image ({n}), got shape {g.shape}")
    _check_disjoint(sets, g)
    check_count(n_resamples, "n_resamples")
    mp, tr, te = sets["map_idx"], sets["train_idx"], sets["test_idx"]
    lin = fit_linear_map(B[mp], A[mp], method=method, random_state=random_state)
    mapped = lin.predict(B[te])
    r2 = held_out_r2(lin, B[te], A[te])  # mapped above: at least 2 test images
    probes, reasons = _fit_probes(A[tr], lab.iloc[tr], C, max_iter, random_state)
    out = _evaluate(
        probes,
        reasons,
        list(lab.columns),
        lab.iloc[te],
        A[te],
        mapped,
        None if g is None else g[te],
        r2,
        n_resamples,
        confidence,
        random_state,
    )
    if out["reason"].ne("").all():  # the table's reason column says why, finding by finding
        log.info("classifier_transfer: no finding could be evaluated")
    return ClassifierTransfer(table=out, method=method, alpha=lin.alpha_, n_map=int(mp.size))


def transfer_sweep(
    X_old: Any,
    X_new: Any,
    labels: pd.DataFrame,
    *,
    groups: Any,
    n_values: Sequence[int] = (64, 128, 256, 512, 1024, 2048, 4096),
    fractions: tuple[float, float, float] = (0.5, 0.25, 0.25),
    method: str = "ridge",
    C: float = 1.0,
    max_iter: int = 2000,
    n_resamples: int = 200,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> TransferSweep:
    """AUROC retention as a function of the number of unlabelled map images.

    Patients are split (by ``fractions`` of images) into a map pool, a probe
    training part and a probe test part, with no patient in two parts. The
    classifiers are trained once; for each n in ``n_values`` the map is
    fitted on the first n images of a fixed shuffle of the pool (nested
    subsets, so the curve is smooth), then evaluated as in
    :func:`classifier_transfer`.

    Values of n larger than the pool are dropped (listed in ``dropped_n``
    of the result) and replaced by the pool size itself.

    Parameters
    ----------
    X_old, X_new : array-like of shape (N, d_old), (N, d_new)
    labels : DataFrame (N, n_findings), 0/1
    groups : array-like of shape (N,)
        Patient ids.
    n_values : sequence of int
    fractions : (map, train, test) shares of images, summing to 1
    method, C, max_iter, n_resamples, confidence, random_state
        As in :func:`classifier_transfer`.

    Returns
    -------
    TransferSweep
        ``table``: columns n_map and alpha plus the columns of the table of
        :func:`classifier_transfer`, one row per (n_map, finding) (mean
        retention per n: ``res.table.groupby("n_map").retention.mean()``);
        ``dropped_n``, ``n_pool``, ``n_train``, ``n_test``.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> old = rng.normal(size=(800, 8)); new = old @ rng.normal(size=(8, 8))
    >>> y = pd.DataFrame({"edema": (old[:, 1] > 0).astype(int)})
    >>> t = transfer_sweep(old, new, y, groups=np.arange(800) // 2, n_values=(16, 64), n_resamples=20)
    >>> t.table.n_map.tolist(), t.dropped_n
    ([16, 64], [])
    """
    A, B = _pair(X_old, X_new, "X_old", "X_new")
    n = A.shape[0]
    lab = check_labels(labels, n)
    g = np.asarray(groups)
    if g.shape != (n,):
        raise InputError(f"groups must have one patient id per image ({n}), got shape {g.shape}")
    fr = np.asarray(fractions, dtype=float)
    if fr.shape != (3,) or np.any(fr <= 0) or not np.isclose(fr.sum(), 1.0):
        raise InputError(f"fractions must be three positive shares (map, train, test) summing to 1, got {fractions}")
    vals = []
    for v in n_values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 2:
            raise InputError(f"n_values must hold integers >= 2, got {v!r}")
        vals.append(int(v))
    rng = np.random.default_rng(random_state)
    pool, train, test = grouped_split(g, fr, rng)
    for name, part in (("map pool", pool), ("probe training", train), ("probe test", test)):
        if part.size < 2:
            raise InputError(
                f"the {name} part has {part.size} image(s); need more patients (got {len(pd.unique(g))}) "
                "or different fractions"
            )
    pool = pool[rng.permutation(pool.size)]
    keep = sorted({v for v in vals if v <= pool.size})
    dropped = sorted({v for v in vals if v > pool.size})
    if dropped:
        keep = sorted(set(keep) | {int(pool.size)})
        log.info(
            "transfer_sweep: n_values %s exceed the map pool (%d images); using %d instead",
            dropped, pool.size, pool.size,
        )
    probes, reasons = _fit_probes(A[train], lab.iloc[train], C, max_iter, random_state)
    lab_test = lab.iloc[test]
    tables = []
    for nv in keep:
        mp = pool[:nv]
        lin = fit_linear_map(B[mp], A[mp], method=method, random_state=random_state)
        r2 = held_out_r2(lin, B[test], A[test])
        t = _evaluate(
            probes, reasons, list(lab.columns), lab_test, A[test], lin.predict(B[test]), g[test],
            r2, n_resamples, confidence, random_state,
        )
        t.insert(0, "n_map", nv)
        t.insert(1, "alpha", lin.alpha_)
        tables.append(t)
    return TransferSweep(
        table=pd.concat(tables, ignore_index=True), dropped_n=dropped, n_pool=int(pool.size),
        n_train=int(train.size), n_test=int(test.size),
    )


def transfer_targets(
    manifest: pd.DataFrame, *, min_per_class: int = 5, groups: str = "patient_id"
) -> tuple[pd.DataFrame, dict[str, str]]:
    """The 0/1 targets of a manifest that classifiers can be carried across encoders on.

    The ``finding_*`` columns when the manifest has any, otherwise
    ``label``. A column with two classes is used when each class has at
    least ``min_per_class`` patients (:func:`crslib.needs.unmet_need`): 0/1
    columns as they are, any other pair of classes (text included) coded 0
    for the first and 1 for the second in sorted order, the column then
    named ``<column>=<second class>`` (the positive class). Unlike a linear
    probe's targets, no split is checked here: :func:`classifier_transfer`
    records a target with a single class in its training or test images in
    its table.

    Parameters
    ----------
    manifest : DataFrame
    min_per_class : int
        Fewest patients of each class.
    groups : str
        The patient column classes are counted in.

    Returns
    -------
    targets : DataFrame
        Same index as ``manifest``; one float column of 0/1 (NaN where the
        value is missing) per usable target; no column when none is usable.
    left_out : dict
        Column -> the sentence saying why it cannot be used; with neither
        ``finding_*`` columns nor ``label``, one entry ``"label"`` saying
        what to add.

    Examples
    --------
    >>> m = pd.DataFrame({"label": ["NORMAL", "PNEUMONIA"] * 5, "patient_id": [f"p{i}" for i in range(10)]})
    >>> targets, left_out = transfer_targets(m)
    >>> list(targets), targets.iloc[:3, 0].tolist(), left_out
    (['label=PNEUMONIA'], [0.0, 1.0, 0.0], {})
    >>> transfer_targets(m, min_per_class=6)[1]
    {'label': '`label` needs at least 6 patients of each of its two classes; it has NORMAL: 5, PNEUMONIA: 5'}
    """
    from crslib.needs import unmet_need

    if not isinstance(manifest, pd.DataFrame):
        raise InputError(f"manifest must be a DataFrame, got {type(manifest).__name__}")
    findings = [c for c in manifest.columns if str(c).startswith("finding_")]
    targets = pd.DataFrame(index=manifest.index)
    left_out: dict[str, str] = {}
    if not findings and "label" not in manifest.columns:
        left_out["label"] = ("the manifest has no finding_* columns and no `label` column; add 0/1 "
                             "finding_* columns or a two-class `label` to run it")
        return targets, left_out
    for column in findings or ["label"]:
        reason = unmet_need(manifest, binary=column, min_per_class=min_per_class, groups=groups)
        if reason:
            left_out[column] = reason
            continue
        values = manifest[column]
        known = values.notna().to_numpy()
        classes, codes = class_codes(values.to_numpy()[known])
        coded = np.full(len(manifest), np.nan)
        coded[known] = codes
        binary01 = all(isinstance(c, (int, float, np.integer, np.floating)) and not isinstance(c, bool)
                       for c in classes) and [float(c) for c in classes] == [0.0, 1.0]
        targets[column if binary01 else f"{column}={classes[1]}"] = coded
    return targets, left_out

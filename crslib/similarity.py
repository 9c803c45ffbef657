"""Representational similarity indices that complement the mutual kNN overlap.

Linear CKA (global, kernel alignment of the whole Gram matrices), CKNNA
(CKA restricted to mutual neighbours) and the Jaccard index of the kNN
sets; the book reports them next to the overlap so a reader can see where
the measures agree.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from crslib._validation import as_embeddings, check_k, check_same_rows
from crslib.errors import InputError
from crslib.neighbors import _intersections, _prepare, knn_indices

log = logging.getLogger(__name__)

__all__ = [
    "linear_cka",
    "cknna",
    "jaccard_knn",
]



# =========================================================================== complementary metrics


def _paired_dense(X: Any, Y: Any) -> tuple[np.ndarray, np.ndarray]:
    check_same_rows({"X": X, "Y": Y})
    Xf = as_embeddings(X, "X", np.float64).copy()
    Yf = as_embeddings(Y, "Y", np.float64).copy()
    return Xf, Yf


def linear_cka(X: Any, Y: Any, *, debiased: bool = True) -> float:
    """Linear centred kernel alignment (CKA) between two representations.

    ``CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` with linear
    kernels ``K = X X^T``, ``L = Y Y^T`` (Kornblith, Norouzi, Lee & Hinton,
    2019, "Similarity of Neural Network Representations Revisited", ICML).
    It is invariant to orthogonal transforms and isotropic scaling, not to
    general invertible linear maps.

    With ``debiased=True`` each HSIC is the unbiased estimator of Song,
    Smola, Gretton, Bedo & Borgwardt (2012, JMLR 13, "Feature Selection via
    Dependence Maximization"), as used for CKA by Nguyen, Raghu & Kornblith
    (2021, ICLR) and Davari et al. (2023, ICLR, "Reliability of CKA as a
    similarity measure"): the biased estimator is inflated when the
    dimension is large relative to N (independent data give CKA well above
    0); the debiased one is close to 0 for independent data and may be
    slightly negative. Computed in feature space (``d x d`` matrices; no
    ``N x N`` Gram matrix), following Kornblith et al.'s reference code.

    Parameters
    ----------
    X, Y : array-like of shape (N, d_x) and (N, d_y)
        Same images, same order. ``N >= 4`` for the debiased estimator.
    debiased : bool

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(100, 5))
    >>> round(linear_cka(X, 2 * X), 6)
    1.0
    """
    Xf, Yf = _paired_dense(X, Y)
    n = Xf.shape[0]
    if debiased and n < 4:
        raise InputError(f"the debiased CKA needs at least 4 images, got N={n}; use debiased=False")
    Xf -= Xf.mean(axis=0)
    Yf -= Yf.mean(axis=0)
    xty = np.linalg.norm(Xf.T @ Yf) ** 2
    xtx = np.linalg.norm(Xf.T @ Xf) ** 2
    yty = np.linalg.norm(Yf.T @ Yf) ** 2
    if debiased:
        rx = np.einsum("ij,ij->i", Xf, Xf)
        ry = np.einsum("ij,ij->i", Yf, Yf)
        nx, ny = rx.sum(), ry.sum()

        def unbiased(dot: float, ra: np.ndarray, rb: np.ndarray, na: float, nb: float) -> float:
            # tr(K~ L~) + 1'K~1 1'L~1/((n-1)(n-2)) - 2/(n-2) 1'K~L~1, with centred features
            return dot - n / (n - 2.0) * float(ra @ rb) + na * nb / ((n - 1.0) * (n - 2.0))

        xty = unbiased(xty, rx, ry, nx, ny)
        xtx = unbiased(xtx, rx, rx, nx, nx)
        yty = unbiased(yty, ry, ry, ny, ny)
    for name, v in (("X", xtx), ("Y", yty)):
        if not v > 0:
            raise InputError(f"{name} has no variance across images (constant embeddings); CKA is undefined")
    return float(xty / np.sqrt(xtx * yty))


def _pair_dots(X: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    out = np.empty(rows.size)
    step = max(1, (32 * 2**20) // max(1, X.shape[1] * 16))
    for s in range(0, rows.size, step):
        a = X[rows[s : s + step]].astype(np.float64)
        b = X[cols[s : s + step]].astype(np.float64)
        out[s : s + step] = np.einsum("ij,ij->i", a, b)
    return out


def _hsic_unbiased_sparse(A, B, m: int) -> float:
    """Song et al. (2012) unbiased HSIC of sparse zero-diagonal kernels."""
    t1 = float(A.multiply(B.T).sum())
    t2 = float(A.sum()) * float(B.sum()) / ((m - 1) * (m - 2))
    t3 = 2.0 * float(np.asarray(A.sum(axis=0)).ravel() @ np.asarray(B.sum(axis=1)).ravel()) / (m - 2)
    return (t1 + t2 - t3) / (m * (m - 3))


def cknna(X: Any, Y: Any, *, k: int = 10, normalize: bool = True) -> float:
    """Centred kernel nearest-neighbour alignment (CKNNA).

    Huh, Cheung, Wang & Isola (2024), "The Platonic Representation
    Hypothesis", ICML: CKA restricted to mutual nearest neighbours. With
    linear kernels ``K = X X^T``, ``L = Y Y^T`` (rows L2-normalised first,
    as in the authors' scoring code), let ``M_ij = 1`` when ``j`` is among
    the k nearest neighbours of ``i`` in BOTH spaces (self excluded). Then::

        CKNNA = HSIC_u(M*K, M*L) / sqrt(HSIC_u(M_K*K, M_K*K) HSIC_u(M_L*L, M_L*L))

    where ``*`` is elementwise, ``M_K`` / ``M_L`` are the kNN masks of each
    space alone, and ``HSIC_u`` is the unbiased estimator of Song et al.
    (2012) applied to the masked kernels, exactly as in the reference
    implementation (github.com/minyoungg/platonic-rep, ``metrics.py``).
    Here the masked kernels are sparse (k entries per row), so no ``N x N``
    matrix is formed, and neighbours come from :func:`knn_indices` (exact,
    ties to the lower index; the reference uses ``torch.topk``).

    Deviation: the reference adds 1e-6 to the denominator as a numerical
    guard, which shrinks values when HSIC is small (it scales with 1/N);
    it is omitted here, and NaN is returned when the denominator is not
    positive.

    Parameters
    ----------
    X, Y : array-like of shape (N, d_x) and (N, d_y)
    k : int
        Neighbours per image, ``2 <= k < N`` (the reference requires >= 2).
    normalize : bool
        L2-normalise rows first (cosine kernel and cosine neighbours).

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(100, 8))
    >>> round(cknna(X, X, k=5), 6)
    1.0
    """
    from scipy import sparse

    n = check_same_rows({"X": X, "Y": Y})
    k = check_k(k, n)
    if k < 2:
        raise InputError(f"CKNNA needs k >= 2, got k={k}")
    if n < 4:
        raise InputError(f"CKNNA (unbiased HSIC) needs at least 4 images, got N={n}")
    metric = "cosine" if normalize else "ip"
    Xw, _ = _prepare(X, metric, "X")
    Yw, _ = _prepare(Y, metric, "Y")
    I_k = knn_indices(Xw, k=k, metric="ip")
    I_l = knn_indices(Yw, k=k, metric="ip")
    rows = np.repeat(np.arange(n), k)

    def mask(I: np.ndarray):
        return sparse.csr_matrix((np.ones(n * k), (rows, I.ravel())), shape=(n, n))

    MK, ML = mask(I_k), mask(I_l)

    def masked(M, W: np.ndarray):
        M = M.tocoo()
        vals = _pair_dots(W, M.row.astype(np.int64), M.col.astype(np.int64))
        return sparse.csr_matrix((vals, (M.row, M.col)), shape=(n, n))

    both = MK.multiply(ML).tocsr()
    both.eliminate_zeros()
    kl = _hsic_unbiased_sparse(masked(both, Xw), masked(both, Yw), n)
    KK = masked(MK, Xw)
    LL = masked(ML, Yw)
    kk = _hsic_unbiased_sparse(KK, KK, n)
    ll = _hsic_unbiased_sparse(LL, LL, n)
    denom = kk * ll
    if not denom > 0:
        log.warning("CKNNA undefined: self-alignment HSIC terms are %.3g and %.3g", kk, ll)
        return float("nan")
    return float(kl / np.sqrt(denom))


def jaccard_knn(X_a: Any, X_b: Any, *, k: int = 10, exclude_groups: Any = None, metric: str = "cosine") -> float:
    """Mean Jaccard index of the two models' kNN sets.

    ``mean_i |A_i & B_i| / |A_i | B_i|`` with ``A_i``, ``B_i`` the k nearest
    neighbours of image i under each model; for sets of equal size k this is
    ``o / (2k - o)`` with ``o`` the intersection size, a monotone transform
    of the per-image overlap (Jaccard, 1912; used for neighbourhood
    agreement e.g. by Huh et al., 2024).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 4))
    >>> jaccard_knn(X, X, k=5)
    1.0
    """
    check_same_rows({"X_a": X_a, "X_b": X_b})
    I_a = knn_indices(X_a, k=k, exclude_groups=exclude_groups, metric=metric)
    I_b = knn_indices(X_b, k=k, exclude_groups=exclude_groups, metric=metric)
    inter = _intersections(I_a, I_b)
    return float(np.mean(inter / (2 * k - inter)))

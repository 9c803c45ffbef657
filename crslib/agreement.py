"""Agreement between encoders: exact kNN and mutual k-nearest-neighbour overlap.

The headline measure of CRS-Bench: for each image, the share of its k
nearest neighbours (cosine) that two models have in common,
``|kNN_a(i) & kNN_b(i)| / k``, averaged over images. Around it: reference
points (chance ``k / (N - 1)``, a permutation null), bootstrap intervals over
images or patients, complementary similarity indices (linear CKA, CKNNA,
Jaccard), a k sweep, subgroup breakdowns and variance shares, the
association of agreement with accuracy (Mantel test), and convergence by
objective and seed.

Exact neighbours
----------------
:func:`knn_indices` is exact and deterministic:

* the query itself is excluded by index, never by rank, so an exact
  duplicate of the query is a valid (first) neighbour;
* neighbours sharing the query's group (e.g. the same patient) can be
  excluded;
* ties are broken by index: candidates are ranked by (-similarity rounded to
  float32, index). Search back-ends (faiss, torch) order ties arbitrarily
  and their float32 scores carry rounding error of up to ~``d * 2**-24``;
  candidates whose scores lie within that error of each other are re-scored
  in float64 before ranking, and the candidate list is widened until the
  k-th neighbour is certain. The result does not depend on the back-end or
  the batch size;
* memory stays linear in N: queries are searched in batches, and no N x N
  matrix is formed.

Large N
-------
Exact search costs O(N^2 d). :func:`knn_search` (used by
:func:`agreement_matrix`) stays exact up to :data:`APPROX_THRESHOLD` images
and switches to an approximate faiss index (IVF-PQ with exact re-ranking;
IVF-Flat or HNSW on request) above it, with the same conventions (self and group excluded by index, ties by
index). An approximate search always comes with its measured recall
(:func:`knn_recall`: exact neighbours of a sample of queries, via
``knn_indices(queries=...)``), and :func:`overlap_error_bound` turns the
recalls of two models into a guaranteed bound on the error of their mean
overlap. With a Dask client (:mod:`crslib.cluster`) the exact search runs as
query-block tasks and an approximate one as one task per model; the result
is the same as in-process.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from crslib import stats
from crslib._compat import one_blas_thread
from crslib.cluster import open_client, run_tasks, worker_count
from crslib.errors import InputError

log = logging.getLogger(__name__)

__all__ = [
    "METRICS",
    "NullResult",
    "knn_indices",
    "APPROX_THRESHOLD",
    "RecallResult",
    "approximate_knn_indices",
    "knn_recall",
    "overlap_error_bound",
    "knn_search",
    "overlap_from_indices",
    "mutual_knn_overlap_per_image",
    "mutual_knn_overlap",
    "agreement_matrix",
    "chance_overlap",
    "permutation_null",
    "overlap_ci",
    "linear_cka",
    "cknna",
    "jaccard_knn",
    "k_sweep",
    "overlap_by_subgroup",
    "overlap_variance_shares",
    "linear_probe_auroc",
    "accuracy_agreement_association",
    "convergence_table",
]

METRICS = ("cosine", "ip", "euclidean")
BACKENDS = ("auto", "faiss", "torch")

_EPS32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff 2**-24
_SEARCH_BUDGET = 256 * 2**20  # bytes for one batch of search results / scores
_RESCORE_BUDGET = 16 * 2**20  # bytes for one chunk of gathered float64 candidates
_FAISS_QUERY_BATCH = 16384


# =========================================================================== validation


def _as_embeddings(X: Any, name: str = "X", dtype: Any = np.float32) -> np.ndarray:
    """Validated C-contiguous view or copy (float32 by default) of a 2-D embedding array."""
    try:
        arr = np.asarray(X)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise InputError(f"{name} cannot be converted to an array: {exc}") from exc
    if arr.ndim != 2:
        raise InputError(
            f"{name} must be a 2-D array (images x features), got shape {arr.shape}; "
            "reshape it, e.g. X.reshape(len(X), -1)"
        )
    if arr.dtype.kind not in "fiub":
        raise InputError(f"{name} must hold numbers, got dtype {arr.dtype}")
    n, d = arr.shape
    if n < 2 or d < 1:
        raise InputError(f"{name} needs at least 2 rows and 1 column, got shape {arr.shape}")
    arr32 = np.ascontiguousarray(arr, dtype=dtype)
    finite = np.empty(n, dtype=bool)
    step = max(1, (8 * 2**20) // max(1, d))
    for s in range(0, n, step):
        finite[s : s + step] = np.isfinite(arr32[s : s + step]).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise InputError(
            f"{name} has NaN or infinite values in {bad.size} row(s), first rows {bad[:5].tolist()}; "
            "drop or re-extract those images"
        )
    return arr32


def _check_k(k: Any, n: int, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InputError(f"{name} must be an integer >= 1, got {k!r}")
    k = int(k)
    if k < 1:
        raise InputError(f"{name}={k} must be at least 1")
    if k >= n:
        raise InputError(
            f"{name}={k} must be smaller than the number of images N={n} "
            f"(each image has at most N-1={n - 1} neighbours); lower {name} or add images"
        )
    return k


def _check_queries(queries: Any, n: int) -> np.ndarray:
    """Validated 1-D int64 array of unique row indices in ``[0, n)``."""
    q = np.asarray(queries)
    if q.ndim != 1:
        raise InputError(f"queries must be a 1-D array of row indices, got shape {q.shape}")
    if q.size and q.dtype.kind not in "iu":  # an empty list arrives as float64
        raise InputError(f"queries must hold integer row indices, got dtype {q.dtype}")
    q = q.astype(np.int64, copy=False)
    bad = (q < 0) | (q >= n)
    if bad.any():
        raise InputError(
            f"queries must be row indices 0 <= i < N={n}; {int(bad.sum())} are out of range, "
            f"first {q[bad][:5].tolist()}"
        )
    srt = np.sort(q)
    dup = srt[1:][srt[1:] == srt[:-1]]
    if dup.size:
        raise InputError(f"queries must be unique; repeated rows {np.unique(dup)[:5].tolist()}")
    return q


def _group_codes(groups: Any, n: int, k: int) -> np.ndarray | None:
    """Integer codes of ``exclude_groups``; checks every query keeps >= k candidates."""
    if groups is None:
        return None
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != n:
        raise InputError(f"exclude_groups must be 1-D with one label per image ({n}), got shape {g.shape}")
    codes, uniques = pd.factorize(pd.Series(g), sort=False)
    if (codes < 0).any():
        bad = np.flatnonzero(codes < 0)
        raise InputError(f"exclude_groups has missing labels in rows {bad[:5].tolist()}; give every image a group")
    counts = np.bincount(codes)
    worst = int(np.argmax(counts))
    if n - counts[worst] < k:
        label = uniques[worst]
        label = label.item() if isinstance(label, np.generic) else label
        raise InputError(
            f"excluding the query's group leaves too few candidates: group {label!r} has "
            f"{counts[worst]} of N={n} images, leaving {n - counts[worst]} < k={k}; lower k"
        )
    return codes.astype(np.int64)


def _row_norms(X: np.ndarray) -> np.ndarray:
    out = np.empty(X.shape[0])
    step = max(1, (16 * 2**20) // max(1, X.shape[1] * 8))
    for s in range(0, X.shape[0], step):
        blk = X[s : s + step].astype(np.float64)
        out[s : s + step] = np.sqrt(np.einsum("ij,ij->i", blk, blk))
    return out


def _prepare(X: Any, metric: str, name: str = "X") -> tuple[np.ndarray, np.ndarray]:
    """Validated working copy (normalised for cosine) and row norms of it."""
    if metric not in METRICS:
        raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
    arr = _as_embeddings(X, name)
    norms = _row_norms(arr)
    if metric == "cosine":
        zero = norms == 0
        if zero.any():
            bad = np.flatnonzero(zero)
            raise InputError(
                f"{name} has {bad.size} all-zero row(s) (first {bad[:5].tolist()}), whose cosine "
                "similarity is undefined; check the encoder output (constant zero embeddings) or use metric='ip'"
            )
        work = arr / norms[:, None].astype(np.float32)  # a new array: the input is never modified
        norms = _row_norms(work)
    else:
        work = arr  # never written to: faiss copies it into its index, torch only reads it
    return np.ascontiguousarray(work, dtype=np.float32), norms


# =========================================================================== search back-ends


_AVX512_SKX = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def _openblas_coretype_hint() -> str | None:
    """An OpenBLAS core type this CPU certainly supports, from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
            else:
                return None
    except OSError:
        return None
    if _AVX512_SKX <= flags:
        return "SKYLAKEX"
    if {"avx2", "fma"} <= flags:
        return "HASWELL"
    return None


def _import_faiss():
    """Import faiss; None when it is not installed.

    The OpenBLAS bundled with the faiss-cpu wheels (0.3.15) does not know
    recent Intel CPUs (e.g. Sapphire/Emerald Rapids) and falls back to its
    generic "Prescott" kernels, which makes IndexFlat searches ~3x slower
    (measured here: 10,000 x 512 search 5.7 s vs 1.8 s). Unless the user set
    ``OPENBLAS_CORETYPE``, it is set, for the duration of the first import
    only, to a core type the CPU's flags guarantee (SkylakeX with AVX-512,
    else Haswell with AVX2+FMA). Libraries already loaded (numpy's OpenBLAS)
    are unaffected.
    """
    if "faiss" in sys.modules:
        return sys.modules["faiss"]
    hint = None if "OPENBLAS_CORETYPE" in os.environ else _openblas_coretype_hint()
    if hint:
        os.environ["OPENBLAS_CORETYPE"] = hint
    try:
        import faiss
    except Exception:  # pragma: no cover - depends on the environment
        return None
    finally:
        if hint:
            os.environ.pop("OPENBLAS_CORETYPE", None)
    return faiss


def _faiss_available() -> bool:
    return _import_faiss() is not None


class _Searcher:
    """Approximate-score candidate search (exact set, float32 scores)."""

    def __init__(self, X: np.ndarray, metric: str, backend: str, batch_size: int | None):
        if backend not in BACKENDS:
            raise InputError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "auto":
            backend = "faiss" if _faiss_available() else "torch"
        if backend == "faiss" and not _faiss_available():
            raise InputError("backend='faiss' needs the faiss-cpu package; install it or use backend='torch'")
        self.X, self.metric, self.backend, self.batch_size = X, metric, backend, batch_size
        self.n = X.shape[0]
        if backend == "faiss":
            faiss = _import_faiss()
            d = X.shape[1]
            self.index = faiss.IndexFlatL2(d) if metric == "euclidean" else faiss.IndexFlatIP(d)
            self.index.add(X)
        else:
            import torch

            self._torch = torch
            self.Xt = torch.from_numpy(X)
            if metric == "euclidean":
                self.sq = (self.Xt * self.Xt).sum(dim=1)

    def query_batch(self, kk: int) -> int:
        if self.batch_size is not None:
            return self.batch_size
        per_query = kk * 12 + (self.n * 4 if self.backend == "torch" else 0)
        cap = _FAISS_QUERY_BATCH if self.backend == "faiss" else 1 << 30
        return int(max(1, min(cap, _SEARCH_BUDGET // per_query)))

    def search(self, qids: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (scores float32 (b, kk), ids int64 (b, kk)); higher score = closer."""
        if qids.size and qids[-1] - qids[0] + 1 == qids.size and (np.diff(qids) == 1).all():
            Q = self.X[qids[0] : qids[-1] + 1]  # a contiguous run: a view, no copy
        else:
            Q = self.X[qids]
        if self.backend == "faiss":
            D, I = self.index.search(Q, kk)
            return (-D if self.metric == "euclidean" else D), I.astype(np.int64, copy=False)
        torch = self._torch
        precision = torch.get_float32_matmul_precision()
        if precision != "highest":  # reduced-precision matmul would break the error bound
            torch.set_float32_matmul_precision("highest")
        try:
            return self._torch_search(Q, kk)
        finally:
            if precision != "highest":
                torch.set_float32_matmul_precision(precision)

    def _torch_search(self, Q: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
        torch = self._torch
        with torch.no_grad():
            q = torch.from_numpy(Q)
            S = q @ self.Xt.T
            if self.metric == "euclidean":
                S.mul_(2).sub_(self.sq[None, :]).sub_((q * q).sum(dim=1, keepdim=True))
            vals, ids = torch.topk(S, kk, dim=1, largest=True, sorted=True)
        return vals.numpy(), ids.numpy().astype(np.int64, copy=False)


def _rescore(X: np.ndarray, qids: np.ndarray, ids: np.ndarray, metric: str) -> np.ndarray:
    """Float64 scores of candidate ids for each query (row-wise, deterministic)."""
    b, kk = ids.shape
    d = X.shape[1]
    out = np.empty((b, kk))
    step = max(1, _RESCORE_BUDGET // max(1, kk * d * 8))
    for s in range(0, b, step):
        C = X[ids[s : s + step]].astype(np.float64)  # (c, kk, d)
        q = X[qids[s : s + step]].astype(np.float64)  # (c, d)
        if metric == "euclidean":
            C -= q[:, None, :]
            out[s : s + step] = -np.einsum("ikj,ikj->ik", C, C)
        else:
            out[s : s + step] = np.einsum("ikj,ij->ik", C, q)
    return out


def _select(
    X: np.ndarray,
    qids: np.ndarray,
    raw: np.ndarray,
    ids: np.ndarray,
    *,
    k: int,
    full: bool,
    tol: np.ndarray,
    gcodes: np.ndarray | None,
    metric: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pick the exact top-k per query from a candidate list.

    Returns (done mask (b,), ids (b, k), scores float32 (b, k)).
    """
    b, kk = ids.shape
    valid = (ids >= 0) & (ids != qids[:, None])
    if gcodes is not None:
        valid &= gcodes[np.maximum(ids, 0)] != gcodes[qids][:, None]
    n_valid = valid.sum(axis=1)
    raw = raw.astype(np.float32, copy=False)
    last_raw = np.where(ids >= 0, raw, np.inf).min(axis=1).astype(np.float64)
    neg_inf = np.float32(-np.inf)
    rv = np.where(valid, raw, neg_inf)
    order = np.lexsort((ids, -rv), axis=-1)
    ids_s = np.take_along_axis(ids, order, axis=1)
    raw_s = np.take_along_axis(rv, order, axis=1).astype(np.float64)

    out_ids = ids_s[:, :k].copy()
    out_sc = raw_s[:, :k].astype(np.float32)
    done = np.zeros(b, dtype=bool)

    enough = n_valid >= k
    # Fast path: every consecutive gap among the first k(+1) valid candidates
    # exceeds twice the score error, and the k-th is clearly above anything
    # not returned. Then the raw order is the exact order.
    m = min(k + 1, kk)
    head = raw_s[:, :m]
    with np.errstate(invalid="ignore"):
        gaps = head[:, :-1] - head[:, 1:]
        gap_ok = np.where(np.isnan(gaps), True, gaps > 2 * tol[:, None]).all(axis=1) if m > 1 else np.ones(b, bool)
        kth = raw_s[:, k - 1]
        bound_ok = full | (kth - last_raw > 2 * tol)
    fast = enough & gap_ok & bound_ok
    done |= fast

    slow = np.flatnonzero(enough & ~fast)
    if slow.size:
        s64 = _rescore(X, qids[slow], ids[slow], metric)
        s64 = np.where(valid[slow], s64, -np.inf)
        s32 = s64.astype(np.float32)
        order2 = np.lexsort((ids[slow], -s32), axis=-1)
        ids2 = np.take_along_axis(ids[slow], order2, axis=1)
        s64s = np.take_along_axis(s64, order2, axis=1)
        kth64 = s64s[:, k - 1]
        spacing = np.spacing(np.abs(kth64).astype(np.float32)).astype(np.float64)
        ok = full | (last_raw[slow] + tol[slow] + spacing < kth64)
        out_ids[slow] = ids2[:, :k]
        out_sc[slow] = s64s[:, :k].astype(np.float32)
        done[slow[ok]] = True
    return done, out_ids, out_sc


def _candidate_count(k: int, n: int, gcodes: np.ndarray | None) -> int:
    """Candidates to ask a search back-end for first: k, the query itself, a margin."""
    # A few candidates beyond k + 1 make it rare that the k-th neighbour is
    # too close to the last candidate to be certain (measured: 0.005% of
    # queries at N=20,000, d=512 with 3 extra), while adding little to the
    # search cost (faiss: +7% for 10 extra).
    margin = max(3, k // 4)
    extra_group = 0
    if gcodes is not None:
        extra_group = min(int(np.bincount(gcodes).max()) - 1, 4 * margin)
    return min(n, k + 1 + margin + extra_group)


def knn_indices(
    X: Any,
    *,
    k: int = 10,
    metric: str = "cosine",
    exclude_groups: Any = None,
    batch_size: int | None = None,
    backend: str = "auto",
    return_similarity: bool = False,
    queries: Any = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Exact k nearest neighbours of every row (or of some rows) among the other rows.

    Parameters
    ----------
    X : array-like of shape (N, d)
        Embeddings, one row per image; searched in float32. Not modified
        (cosine works on a normalised copy).
    k : int
        Neighbours per image, ``1 <= k <= N - 1``.
    metric : {"cosine", "ip", "euclidean"}
        Cosine similarity (the CRS-Bench default), raw inner product, or
        Euclidean distance.
    exclude_groups : array-like of shape (N,), optional
        Group label per image (e.g. patient id). Neighbours in the query's
        own group are excluded; the search widens until k others are found.
    batch_size : int, optional
        Queries per search call; by default chosen so one batch of scores
        stays within ~256 MB (torch) or 16,384 queries (faiss).
    backend : {"auto", "faiss", "torch"}
        faiss ``IndexFlatIP`` / ``IndexFlatL2`` (exact), or torch matmul +
        topk; "auto" uses faiss when installed. Both give identical results.
    return_similarity : bool
        Also return the scores of the neighbours (cosine similarity, inner
        product, or Euclidean distance), float32.
    queries : array-like of int, shape (Q,), optional
        Row indices (unique, ``0 <= i < N``, any order) whose neighbours to
        return; they are still searched among all N rows, and row ``j`` of
        the result equals row ``queries[j]`` of the full result. Costs
        ``Q x N`` instead of ``N x N`` (e.g. a sample for
        :func:`knn_recall`, or one shard of a distributed search). Default:
        all rows.

    Returns
    -------
    indices : ndarray of shape (N, k) or (Q, k), int64
        Row ``i`` lists the neighbours of image ``i`` (of ``queries[i]``),
        closest first; ties in similarity (after rounding to float32) go to
        the lower index.
    similarity : ndarray of shape (N, k) or (Q, k), float32
        Only with ``return_similarity=True``.

    Raises
    ------
    InputError
        Non-2-D input, NaN/inf rows, all-zero rows under cosine, ``k >= N``,
        a group exclusion that leaves fewer than k candidates, or
        ``queries`` that are not unique 1-D row indices in range.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[1, 0], [1, 0], [0, 1], [1, 0.1]])
    >>> knn_indices(X, k=2)
    array([[1, 3],
           [0, 3],
           [3, 0],
           [0, 1]])
    """
    if metric not in METRICS:
        raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1
    ):
        raise InputError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    Xw, norms = _prepare(X, metric)
    n, d = Xw.shape
    k = _check_k(k, n)
    gcodes = _group_codes(exclude_groups, n, k)
    qrows = np.arange(n, dtype=np.int64) if queries is None else _check_queries(queries, n)
    searcher = _Searcher(Xw, metric, backend, batch_size)

    # Per-query bound on the float32 error of the back-end's scores: a float32
    # dot product of length d errs by at most ~d * 2**-24 * |q| |x| in any
    # summation order (a few more roundings for the L2 expansion).
    max_norm = float(norms.max())
    if metric == "euclidean":
        tol = (d + 8) * _EPS32 * (norms + max_norm) ** 2
    else:
        tol = (d + 2) * _EPS32 * norms * max_norm
    tol = tol * 1.01 + 1e-30

    kk = _candidate_count(k, n, gcodes)

    out_ids = np.empty((qrows.size, k), dtype=np.int64)
    out_sc = np.empty((qrows.size, k), dtype=np.float32)
    # Positions into qrows, searched in ascending row order so that runs of
    # consecutive rows are views of X (no gather copy).
    pending = np.argsort(qrows, kind="stable")
    while pending.size:
        full = kk >= n
        step = searcher.query_batch(kk)
        unresolved = []
        for s in range(0, pending.size, step):
            pos = pending[s : s + step]
            qids = qrows[pos]
            raw, ids = searcher.search(qids, kk)
            done, bi, bs = _select(
                Xw, qids, raw, ids, k=k, full=full, tol=tol[qids], gcodes=gcodes, metric=metric
            )
            out_ids[pos[done]] = bi[done]
            out_sc[pos[done]] = bs[done]
            if not done.all():
                unresolved.append(pos[~done])
        pending = np.concatenate(unresolved) if unresolved else pending[:0]
        if pending.size:
            if full:  # pragma: no cover - cannot happen: a full candidate list always resolves
                raise RuntimeError("kNN search did not resolve with all candidates")
            log.debug("widening kNN search for %d queries from %d to %d candidates", pending.size, kk, min(n, 4 * kk))
            kk = min(n, 4 * kk)
    if return_similarity:
        if metric == "euclidean":
            out_sc = np.sqrt(np.maximum(-out_sc, 0)).astype(np.float32)
        return out_ids, out_sc
    return out_ids


# =========================================================================== large N: approximate search


#: Images above which ``index="auto"`` switches from the exact to an
#: approximate (IVF-PQ) search. Exact flat search costs O(N^2 d): measured on
#: 2 cores (faiss IndexFlatIP, k=10, d=512), 2.0 s at N=10,000 and 7.0 s at
#: N=20,000, which extrapolates to ~12 minutes per model at N=200,000 and
#: ~47 minutes at 400,000. Up to this size the exact answer costs minutes
#: per model and needs no recall caveat; beyond it the quadratic cost
#: dominates a run with many models.
APPROX_THRESHOLD = 200_000

APPROX_METHODS = ("ivf", "ivfpq", "hnsw")
INDEX_CHOICES = ("auto", "exact") + APPROX_METHODS

_Z95 = 1.959963984540054  # two-sided 95% standard normal quantile


def _check_positive_int(value: Any, name: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def _check_seed(random_state: Any) -> int | None:
    if random_state is None:
        return None
    if isinstance(random_state, bool) or not isinstance(random_state, (int, np.integer)) or random_state < 0:
        raise InputError(f"random_state must be a non-negative integer or None, got {random_state!r}")
    return int(random_state)


def _ivf_params(n: int, nlist: Any, nprobe: Any) -> tuple[int, int]:
    """Resolved (nlist, nprobe) of an IVF index over n rows."""
    if nlist is None:
        # ~4 sqrt(N) lists (the faiss guideline), but at most N / 39: faiss'
        # k-means wants at least 39 training points per centroid.
        nlist = int(np.clip(round(4 * np.sqrt(n)), 16, 65536))
        nlist = max(1, min(nlist, n // 39))
    else:
        nlist = _check_positive_int(nlist, "nlist")
        if nlist > n:
            raise InputError(f"nlist={nlist} must not exceed the number of images N={n}")
    if nprobe is None:
        # Probe a fixed share (1/16) of the lists, at least 16. Measured on
        # the clustered synthetic data of tests/test_agreement_scale.py
        # (200 Gaussian clusters, spread 1.5, d=64, cosine, k=10; 2 cores):
        # at N=100,000 (nlist=1265) recall@10 on 2,000 sampled queries was
        # 0.844 / 0.921 / 0.950 / 0.959 / 0.965 with nprobe 8 / 32 / 64 /
        # 80 / 96; the default nlist // 16 = 79 gave 0.960 (95% CI 0.954 to
        # 0.965, 5,000 queries) in 18 s including the recall check, against
        # ~2 min for the exact search. At N=20,000 (nlist=512, nprobe=32):
        # 0.919 on all rows. A share rather than a count, because recall at
        # a fixed share did not fall as N grew (it rose from 20k to 100k),
        # while a fixed count would let it fall as the lists multiply.
        # knn_search measures the recall it got anyway.
        # Capped at 64 probes: a fixed share keeps the search O(N^2) (1/16 of
        # exact, ~20 min per model at N=1,000,000, d=512 on 2 cores); with
        # the cap the lists scanned per query stay fixed while the lists
        # shrink, so the cost grows like N^1.5. The cap binds above N ~ 65,000;
        # the recall it costs is measured and reported with every result.
        nprobe = max(16, min(nlist // 16, 64))
    else:
        nprobe = _check_positive_int(nprobe, "nprobe")
    return nlist, min(nprobe, nlist)


#: Training rows an 8-bit product quantizer needs: faiss' k-means wants 39
#: per centroid, and each sub-quantizer has 256.
PQ_MIN_ROWS = 39 * 256


def _pq_subquantizers(d: int) -> int:
    """Sub-quantizers of an IVF-PQ code for d dimensions: about one per 8
    dimensions (64 bytes per row at d=512, 1/32 of the float32 row), rounded
    up to a divisor of d, which faiss requires."""
    target = max(1, -(-d // 8))
    return next(m for m in range(target, d + 1) if d % m == 0)


def _build_approx_index(Xw: np.ndarray, metric: str, method: str, *, nlist: int, hnsw_m: int, seed: int | None):
    faiss = _import_faiss()
    if faiss is None:
        raise InputError("approximate kNN search needs the faiss-cpu package; install it or use index='exact'")
    n, d = Xw.shape
    faiss_metric = faiss.METRIC_L2 if metric == "euclidean" else faiss.METRIC_INNER_PRODUCT
    rng = np.random.default_rng(seed)
    if method == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss_metric)
        index.add(Xw)
        return index, None
    quantizer = faiss.IndexFlatL2(d) if metric == "euclidean" else faiss.IndexFlatIP(d)
    if method == "ivfpq":
        if n < PQ_MIN_ROWS:
            raise InputError(f"index 'ivfpq' needs at least {PQ_MIN_ROWS:,} images to train its product quantizer "
                             f"(39 per code), got {n:,}; use 'ivf' or 'exact'")
        index = faiss.IndexIVFPQ(quantizer, d, nlist, _pq_subquantizers(d), 8, faiss_metric)
        index.pq.cp.seed = int(rng.integers(2**31 - 1))
    else:
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss_metric)
    # k-means (the list centroids) is seeded from random_state, and so is the
    # training sample: enough rows for faiss' 39..256 points per centroid,
    # and never fewer than 50,000 (or all rows), so small nlist still sees a
    # representative sample.
    index.cp.seed = int(rng.integers(2**31 - 1))
    m = min(n, max(nlist * 40, 50_000))
    train = Xw if m >= n else Xw[np.sort(rng.choice(n, size=m, replace=False))]
    index.train(train)
    index.add(Xw)
    return index, quantizer  # the quantizer must outlive the index


def _approximate_knn(
    Xw: np.ndarray,
    *,
    k: int,
    metric: str,
    gcodes: np.ndarray | None,
    method: str,
    nlist: Any,
    nprobe: Any,
    hnsw_m: Any,
    ef_search: Any,
    seed: int | None,
    refine_factor: Any = 8,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Approximate top-k on a prepared array: (ids, float32 scores, resolved parameters)."""
    n, d = Xw.shape
    hnsw_m = _check_positive_int(hnsw_m, "hnsw_m")
    ef_search = _check_positive_int(ef_search, "ef_search", allow_none=True)
    refine = _check_positive_int(refine_factor, "refine_factor")
    if method in ("ivf", "ivfpq"):
        nlist, probe = _ivf_params(n, nlist, nprobe)
        params = {"nlist": nlist, "nprobe": probe}
        if method == "ivfpq":
            params.update(pq_m=_pq_subquantizers(d), pq_bits=8, refine_factor=refine)
    else:
        params = {"hnsw_m": hnsw_m}
    index, _quantizer = _build_approx_index(Xw, metric, method, nlist=nlist, hnsw_m=hnsw_m, seed=seed)
    kk = _candidate_count(k, n, gcodes)
    if method == "hnsw":
        # efSearch is the HNSW candidate pool; below 64 recall drops sharply
        ef = ef_search if ef_search is not None else max(64, 2 * kk)
        params["ef_search"] = ef

    out_ids = np.empty((n, k), dtype=np.int64)
    out_sc = np.empty((n, k), dtype=np.float32)
    pending = np.arange(n, dtype=np.int64)
    while pending.size:
        if method != "hnsw":
            index.nprobe = probe
            exhaustive = kk >= n and probe >= nlist
        else:
            index.hnsw.efSearch = max(ef, kk)  # HNSW returns at most efSearch results
            exhaustive = kk >= n
        # IVF-PQ ranks by compressed codes: it returns refine_factor x the
        # candidates, re-ranked here by their exact scores on the full rows
        fetch = min(n, kk * refine) if method == "ivfpq" else kk
        step = int(max(1, min(_FAISS_QUERY_BATCH, _SEARCH_BUDGET // (fetch * 12))))
        unresolved = []
        for s in range(0, pending.size, step):
            qids = pending[s : s + step]
            D, ids = index.search(Xw[qids], fetch)
            ids = ids.astype(np.int64, copy=False)
            if method == "ivfpq":
                raw = _rescore(Xw, qids, ids, metric).astype(np.float32)
            else:
                raw = -D if metric == "euclidean" else D
            # the query and its group are dropped by index, as in the exact path;
            # -1 marks a slot the index could not fill
            valid = (ids >= 0) & (ids != qids[:, None])
            if gcodes is not None:
                valid &= gcodes[np.maximum(ids, 0)] != gcodes[qids][:, None]
            rv = np.where(valid, raw, np.float32(-np.inf)).astype(np.float32, copy=False)
            # (-score, id) order makes ties independent of faiss' thread order
            order = np.lexsort((ids, -rv), axis=-1)[:, :k]
            done = valid.sum(axis=1) >= k
            out_ids[qids[done]] = np.take_along_axis(ids, order, axis=1)[done]
            out_sc[qids[done]] = np.take_along_axis(rv, order, axis=1)[done]
            if not done.all():
                unresolved.append(qids[~done])
        pending = np.concatenate(unresolved) if unresolved else pending[:0]
        if pending.size:
            if exhaustive:
                break
            # as in the exact path: too few valid candidates (same-group
            # neighbours, or lists the probe did not reach) -> ask for more
            log.debug("widening approximate kNN search for %d queries from %d candidates", pending.size, kk)
            kk = min(n, 4 * kk)
            if method != "hnsw":
                probe = min(nlist, 4 * probe)
    if pending.size:
        # Only HNSW can get here (an exhaustive IVF search sees every row, and
        # _group_codes guaranteed k candidates outside each group): its graph
        # walk did not reach k valid rows. Those few rows get exact neighbours
        # rather than an error after the whole index was built.
        log.info("approximate kNN: %d rows fell back to the exact search", pending.size)
        ids, sc = knn_indices(Xw, k=k, metric=metric, exclude_groups=gcodes, queries=pending, return_similarity=True)
        out_ids[pending] = ids
        out_sc[pending] = -(sc**2) if metric == "euclidean" else sc
    params["exact_fallback_rows"] = int(pending.size)
    return out_ids, out_sc, params


def approximate_knn_indices(
    X: Any,
    *,
    k: int = 10,
    metric: str = "cosine",
    exclude_groups: Any = None,
    method: str = "ivf",
    nlist: int | None = None,
    nprobe: int | None = None,
    hnsw_m: int = 32,
    ef_search: int | None = None,
    refine_factor: int = 8,
    random_state: int | None = 0,
    return_similarity: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Approximate k nearest neighbours of every row (faiss IVF, IVF-PQ or HNSW).

    Same conventions as :func:`knn_indices`: the query itself is excluded by
    index, neighbours in the query's group can be excluded, and candidates
    are ranked by (-score in float32, index). Unlike the exact search, a
    true neighbour may be missed; measure how often with :func:`knn_recall`
    (:func:`knn_search` does so for you).

    Parameters
    ----------
    X : array-like of shape (N, d)
        Embeddings; not modified (cosine works on a normalised copy).
    k : int
        Neighbours per image, ``1 <= k <= N - 1``.
    metric : {"cosine", "ip", "euclidean"}
        Inner product on the normalised copy for cosine, raw inner product,
        or L2.
    exclude_groups : array-like of shape (N,), optional
        Group label per image (e.g. patient id); neighbours of the query's
        own group are excluded.
    method : {"ivf", "ivfpq", "hnsw"}
        ``"ivf"``: ``faiss.IndexIVFFlat``, an inverted file of ``nlist``
        k-means cells of which ``nprobe`` are scanned per query.
        ``"ivfpq"``: the same cells holding product-quantized codes
        (``faiss.IndexIVFPQ``, one 8-bit sub-quantizer per ~8 dimensions:
        64 bytes per row at d=512 instead of 2 KB); each query takes
        ``refine_factor`` x the candidates from the codes and re-ranks them
        by their exact scores. Scanning codes rather than full rows is what
        makes N=1,000,000 affordable on a small machine (IVF-Flat's scan is
        bound by memory bandwidth); needs at least :data:`PQ_MIN_ROWS` rows.
        ``"hnsw"``: ``faiss.IndexHNSWFlat``, a navigable small-world graph.
    nlist : int, optional
        IVF cells; default ``4 * sqrt(N)`` clipped to [16, 65536] and to at
        most ``N / 39`` (k-means needs ~39 training points per cell). The
        cells are trained on a random sample of at most
        ``max(40 * nlist, 50,000)`` rows.
    nprobe : int, optional
        IVF cells scanned per query; default ``max(16, nlist // 16)``
        (recall@10 >= 0.95 at N=100,000 on clustered synthetic data).
    hnsw_m : int
        HNSW graph degree.
    ef_search : int, optional
        HNSW search pool; default ``max(64, 2 * candidates)``.
    refine_factor : int
        IVF-PQ candidates per wanted candidate that are re-ranked exactly.
        On overlapping Gaussian clusters (N=20,000, d=64, 8-byte codes)
        recall@10 was 0.84 / 0.90 / 0.92 with 4 / 8 / 16, against 0.92 for
        IVF-Flat with the same lists; on the d=512 data of
        ``bench/bench_scale.py`` 4 already matched IVF-Flat.
    random_state : int or None
        Seeds the IVF training sample and k-means: a fixed seed gives the
        same result on every call. HNSW graphs are built in parallel by
        faiss and can differ slightly between runs with several threads.
    return_similarity : bool
        Also return the scores (cosine similarity, inner product, or
        Euclidean distance), float32.

    Returns
    -------
    indices : ndarray of shape (N, k), int64
    similarity : ndarray of shape (N, k), float32
        Only with ``return_similarity=True``.

    Raises
    ------
    InputError
        As :func:`knn_indices`, an unknown ``method``, bad index parameters,
        too few rows for ``"ivfpq"``, or faiss not installed.

    Notes
    -----
    Each query first asks for ``k + 1 + margin`` candidates (plus room for
    its group); a query left with fewer than k valid ones is searched again
    with 4x the candidates (and 4x ``nprobe``), up to an exhaustive search.
    Should an HNSW walk still find fewer than k, those rows get their exact
    neighbours (counted in ``knn_search``'s ``params["exact_fallback_rows"]``).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(2000, 8))
    >>> I = approximate_knn_indices(X, k=5)
    >>> I.shape, bool((I != np.arange(2000)[:, None]).all())
    ((2000, 5), True)
    """
    if method not in APPROX_METHODS:
        raise InputError(f"method must be one of {APPROX_METHODS}, got {method!r}")
    seed = _check_seed(random_state)
    Xw, _ = _prepare(X, metric)
    n = Xw.shape[0]
    k = _check_k(k, n)
    gcodes = _group_codes(exclude_groups, n, k)
    ids, sc, _ = _approximate_knn(
        Xw, k=k, metric=metric, gcodes=gcodes, method=method, nlist=nlist, nprobe=nprobe,
        hnsw_m=hnsw_m, ef_search=ef_search, seed=seed, refine_factor=refine_factor,
    )
    if return_similarity:
        if metric == "euclidean":
            sc = np.sqrt(np.maximum(-sc, 0)).astype(np.float32)
        return ids, sc
    return ids


@dataclass(frozen=True)
class RecallResult:
    """Share of the exact k nearest neighbours an approximate search found.

    Attributes
    ----------
    recall : float
        Mean over the sampled queries of ``|approx(i) & exact(i)| / k``.
    ci_low, ci_high : float
        Interval for the recall over all N rows at ``confidence`` (see
        :func:`knn_recall`); ``[recall, recall]`` when every row was sampled.
    n_sample : int
        Queries compared.
    k : int
    per_query : ndarray of shape (n_sample,)
        Recall of each sampled query.
    rows : ndarray of shape (n_sample,)
        The sampled row indices (ascending).
    n : int
        Rows in the data.
    confidence : float
    """

    recall: float
    ci_low: float
    ci_high: float
    n_sample: int
    k: int
    per_query: np.ndarray = field(repr=False)
    rows: np.ndarray = field(repr=False)
    n: int = 0
    confidence: float = 0.95


def _recall_interval(p: float, n_sample: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval for a mean of [0, 1] values, finite-population corrected."""
    if n_sample >= n:
        return p, p  # every row compared: no sampling error
    # Sampling without replacement: the variance shrinks by (N - n)/(N - 1),
    # i.e. the sample counts as n (N - 1)/(N - n) draws with replacement.
    m = n_sample * (n - 1) / (n - n_sample)
    z2 = _Z95**2
    centre = (p + z2 / (2 * m)) / (1 + z2 / m)
    half = _Z95 * np.sqrt(p * (1 - p) / m + z2 / (4 * m * m)) / (1 + z2 / m)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def knn_recall(
    X: Any,
    approx_indices: Any,
    *,
    k: int | None = None,
    metric: str = "cosine",
    exclude_groups: Any = None,
    sample: int = 20_000,
    random_state: int | None = 0,
) -> RecallResult:
    """Recall@k of approximate neighbours against the exact ones, on a sample of queries.

    The exact neighbours of the sampled rows come from
    :func:`knn_indices` with ``queries=``: the cost is ``sample x N``, not
    ``N x N``. Use the same ``metric`` and ``exclude_groups`` as the
    approximate search, or correct neighbours count as misses.

    Parameters
    ----------
    X : array-like of shape (N, d)
        The embeddings that were searched.
    approx_indices : array-like of shape (N, k_approx), integer
        Approximate neighbours, closest first (e.g. from
        :func:`approximate_knn_indices`).
    k : int, optional
        Compare the first k columns; default all of them.
    metric : {"cosine", "ip", "euclidean"}
    exclude_groups : array-like of shape (N,), optional
    sample : int
        Queries to compare, drawn without replacement; all rows when
        ``sample >= N``.
    random_state : int or None
        Seed of the query sample.

    Returns
    -------
    RecallResult
        ``recall`` is the mean over sampled queries of
        ``|approx(i) & exact(i)| / k``. The 95% interval is a Wilson score
        interval: the per-query recalls lie in [0, 1], so their variance is
        at most ``p (1 - p)``, which the interval uses in place of the
        sample variance. That is conservative, and a sample in which every
        query happens to be perfect does not claim a zero-width interval. A
        finite-population correction applies (sampling without replacement),
        so when all rows are compared the interval is the recall itself.

    Raises
    ------
    InputError
        Shapes that do not match, ``k`` larger than the columns given, or
        the errors of :func:`knn_indices`.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(500, 8))
    >>> knn_recall(X, knn_indices(X, k=5)).recall
    1.0
    """
    A = _check_index_array(approx_indices, "approx_indices")
    n = _check_same_rows({"X": X, "approx_indices": A})
    k = A.shape[1] if k is None else _check_positive_int(k, "k")
    if k > A.shape[1]:
        raise InputError(f"k={k} exceeds the {A.shape[1]} neighbour columns of approx_indices")
    sample = _check_positive_int(sample, "sample")
    seed = _check_seed(random_state)
    if sample >= n:
        rows = np.arange(n, dtype=np.int64)
    else:
        rows = np.sort(np.random.default_rng(seed).choice(n, size=sample, replace=False)).astype(np.int64)
    exact = knn_indices(X, k=k, metric=metric, exclude_groups=exclude_groups, queries=rows)
    per_query = _intersections(A[rows, :k], exact) / k
    recall = float(per_query.mean())
    low, high = _recall_interval(recall, rows.size, n)
    return RecallResult(
        recall=recall, ci_low=low, ci_high=high, n_sample=int(rows.size), k=k,
        per_query=per_query, rows=rows, n=n,
    )


def _recall_value(recall: Any, name: str) -> float:
    if isinstance(recall, RecallResult):
        return float(recall.ci_low)
    if isinstance(recall, bool) or not isinstance(recall, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a recall in [0, 1] or a RecallResult, got {recall!r}")
    value = float(recall)
    if not 0.0 <= value <= 1.0:
        raise InputError(f"{name}={value} must lie in [0, 1]")
    return value


def overlap_error_bound(recall_a: float | RecallResult, recall_b: float | RecallResult) -> float:
    """Largest possible error of a mean kNN overlap computed from approximate neighbours.

    ``|mean approximate overlap - mean exact overlap| <= (1 - recall_a) + (1 - recall_b)``,
    capped at 1 (an overlap lies in [0, 1]).

    Why: for one image let A, B be the exact neighbour lists of models a and
    b and A', B' the approximate ones, all of size k, and
    ``miss_a = k - |A' & A|``, ``miss_b = k - |B' & B|``. An element of
    ``A' & B'`` is in ``A & B``, or in ``A' - A`` (at most miss_a of them), or
    in ``A - B`` and so in ``B' - B`` (at most miss_b). Hence
    ``|A' & B'| <= |A & B| + miss_a + miss_b``, and by the same argument the
    other way round ``|A & B| <= |A' & B'| + miss_a + miss_b``. The
    per-image overlap (divided by k) thus changes by at most
    ``(miss_a + miss_b) / k``, and averaging over images gives the bound,
    since the mean of ``miss / k`` is one minus the recall. It holds for any
    data, with no assumption on which neighbours are missed; it is tight
    only when every miss changes the overlap.

    Parameters
    ----------
    recall_a, recall_b : float or RecallResult
        Recall@k of each model's neighbours over all images (1.0 for an
        exact search). For a :class:`RecallResult`, measured on a sample,
        the lower end of its 95% interval is used (a 97.5% one-sided lower
        bound of the recall), which makes the result a conservative upper
        bound of the error rather than an estimate: it holds with at least
        95% confidence even when both recalls were sampled.

    Returns
    -------
    float

    Examples
    --------
    >>> round(overlap_error_bound(0.97, 0.95), 6)
    0.08
    >>> overlap_error_bound(1.0, 1.0)
    0.0
    """
    a = _recall_value(recall_a, "recall_a")
    b = _recall_value(recall_b, "recall_b")
    return float(min(1.0, (1.0 - a) + (1.0 - b)))


def _knn_block_task(
    start: int, stop: int, *, X: np.ndarray, k: int, metric: str, exclude_groups: np.ndarray | None
) -> np.ndarray:
    """Exact neighbours of rows ``start:stop`` (one shard task of :func:`knn_search`)."""
    return knn_indices(X, k=k, metric=metric, exclude_groups=exclude_groups,
                       queries=np.arange(start, stop, dtype=np.int64))


def _approx_knn_task(
    *,
    X: np.ndarray,
    k: int,
    metric: str,
    exclude_groups: np.ndarray | None,
    method: str,
    recall_sample: int,
    random_state: int | None,
    nprobe: int | None = None,
) -> tuple[np.ndarray, RecallResult, dict]:
    """Approximate neighbours of one model and their measured recall (one shard task)."""
    Xw, _ = _prepare(X, metric)
    ids, _, params = _approximate_knn(
        Xw, k=k, metric=metric, gcodes=exclude_groups, method=method, nlist=None, nprobe=nprobe,
        hnsw_m=32, ef_search=None, seed=random_state,
    )
    recall = knn_recall(X, ids, k=k, metric=metric, exclude_groups=exclude_groups,
                        sample=recall_sample, random_state=random_state)
    return ids, recall, params


def _check_search_options(index: Any, threshold: Any, recall_sample: Any, nprobe: Any = None) -> None:
    if index not in INDEX_CHOICES:
        raise InputError(f"index must be one of {INDEX_CHOICES}, got {index!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)) or threshold < 0:
        raise InputError(f"threshold must be a non-negative integer (images), got {threshold!r}")
    _check_positive_int(recall_sample, "recall_sample")
    _check_positive_int(nprobe, "nprobe", allow_none=True)


def _search(
    X: Any,
    *,
    k: int,
    metric: str,
    exclude_groups: Any,
    index: str,
    threshold: int,
    recall_sample: int,
    random_state: int | None,
    client: Any,
    query_block: int | None,
    nprobe: int | None = None,
) -> tuple[np.ndarray, dict, RecallResult | None]:
    start_time = time.perf_counter()
    _check_search_options(index, threshold, recall_sample, nprobe)
    query_block = _check_positive_int(query_block, "query_block", allow_none=True)
    seed = _check_seed(random_state)
    if metric not in METRICS:
        raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
    # Validated float32 rows, so every task (and the in-process path) searches
    # bit-identical input; knn_indices converts to exactly this array anyway.
    Xw = _as_embeddings(X, "X")
    n = Xw.shape[0]
    k = _check_k(k, n)
    gcodes = _group_codes(exclude_groups, n, k)  # fails here, not in a task on a worker
    if index == "auto":
        # IVF-PQ above the threshold: at N=100,000, d=512 (bench_scale's data,
        # one thread, same process) it took 129 s where IVF-Flat with the same
        # cells and probes took 228 s, at the same recall@10 (0.941 vs 0.936);
        # IVF-Flat streams full rows from memory, so the gap widens with N.
        method = "exact" if n <= threshold else ("ivfpq" if n >= PQ_MIN_ROWS else "ivf")
    else:
        method = index
    shared = {"X": Xw, "k": k, "metric": metric, "exclude_groups": gcodes}
    recall = None
    params = None
    if method == "exact":
        if client is None:
            ids = knn_indices(Xw, k=k, metric=metric, exclude_groups=gcodes)
        else:
            # ~4 blocks per worker balance the load; blocks below 1,000 rows
            # would spend more on task overhead (each task rebuilds the flat
            # index over all N rows) than on searching
            block = query_block or max(1000, -(-n // (4 * worker_count(client))))
            tasks = [(s, min(n, s + block)) for s in range(0, n, block)]
            ids = np.concatenate(run_tasks(client, _knn_block_task, tasks, shared=shared))
    else:
        shared.update(method=method, recall_sample=recall_sample, random_state=seed, nprobe=nprobe)
        ((ids, recall, params),) = run_tasks(client, _approx_knn_task, [()], shared=shared)
    info = {
        "index": method,
        "n": n,
        "k": k,
        "recall": None if recall is None else recall.recall,
        "recall_ci": None if recall is None else [recall.ci_low, recall.ci_high],
        "recall_sample": None if recall is None else recall.n_sample,
        "params": params,
        "seconds": round(time.perf_counter() - start_time, 3),
    }
    return ids, info, recall


def knn_search(
    X: Any,
    *,
    k: int = 10,
    metric: str = "cosine",
    exclude_groups: Any = None,
    index: str = "auto",
    threshold: int = APPROX_THRESHOLD,
    recall_sample: int = 20_000,
    random_state: int | None = 0,
    client: Any = None,
    query_block: int | None = None,
    nprobe: int | None = None,
) -> tuple[np.ndarray, dict]:
    """k nearest neighbours of every row: exact up to a size, approximate (with measured recall) beyond.

    Parameters
    ----------
    X : array-like of shape (N, d)
    k : int
    metric : {"cosine", "ip", "euclidean"}
    exclude_groups : array-like of shape (N,), optional
        See :func:`knn_indices`.
    index : {"auto", "exact", "ivf", "ivfpq", "hnsw"}
        ``"exact"``: :func:`knn_indices`. ``"ivf"``, ``"ivfpq"``, ``"hnsw"``:
        :func:`approximate_knn_indices` with its defaults. ``"auto"``: exact
        when ``N <= threshold``, else ``"ivfpq"`` (``"ivf"`` below
        :data:`PQ_MIN_ROWS` rows).
    threshold : int
        Rows above which ``"auto"`` goes approximate
        (:data:`APPROX_THRESHOLD`).
    recall_sample : int
        Queries on which an approximate search is checked against the exact
        neighbours (:func:`knn_recall`); the check costs
        ``recall_sample x N``.
    random_state : int or None
        Seeds the IVF training and the recall sample.
    client : distributed.Client, optional
        From :func:`crslib.cluster.open_client`; None searches in this
        process. With a client, the exact search is cut into blocks of
        ``query_block`` query rows, one Dask task each (X is sent to each
        worker once); an approximate search, index build and recall check
        included, is one task. The result is identical either way.
    query_block : int, optional
        Query rows per exact-search task; default
        ``max(1000, ceil(N / (4 * workers)))``.
    nprobe : int, optional
        IVF / IVF-PQ cells scanned per query (see
        :func:`approximate_knn_indices`); raise it when the measured recall
        is too low. The search time grows about in proportion. Ignored by
        the exact and HNSW searches.

    Returns
    -------
    indices : ndarray of shape (N, k), int64
    info : dict
        ``index`` (the search used: "exact", "ivf", "ivfpq" or "hnsw"), ``n``,
        ``k``, ``recall`` (None for exact), ``recall_ci`` ([low, high] of
        the 95% interval, or None), ``recall_sample`` (queries checked, or
        None), ``params`` (the approximate index's parameters, e.g. nlist
        and nprobe, or None) and ``seconds`` (wall time).

    Raises
    ------
    InputError
        Bad options, or the errors of :func:`knn_indices` /
        :func:`approximate_knn_indices`.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(300, 8))
    >>> I, info = knn_search(X, k=5)
    >>> info["index"], info["recall"], bool((I == knn_indices(X, k=5)).all())
    ('exact', None, True)
    """
    ids, info, _ = _search(
        X, k=k, metric=metric, exclude_groups=exclude_groups, index=index, threshold=threshold,
        recall_sample=recall_sample, random_state=random_state, client=client, query_block=query_block,
        nprobe=nprobe,
    )
    return ids, info


# =========================================================================== overlap


def _check_index_array(I: Any, name: str) -> np.ndarray:
    arr = np.asarray(I)
    if arr.ndim != 2 or arr.dtype.kind not in "iu":
        raise InputError(f"{name} must be a 2-D integer array of neighbour indices (N, k), got {arr.dtype} {arr.shape}")
    if arr.shape[1] < 1:
        raise InputError(f"{name} has no neighbour columns")
    srt = np.sort(arr, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
    if dup.any():
        raise InputError(f"{name} repeats a neighbour within row(s) {np.flatnonzero(dup)[:5].tolist()}")
    return arr.astype(np.int64, copy=False)


def overlap_from_indices(I_a: Any, I_b: Any) -> np.ndarray:
    """Per-image mutual kNN overlap from precomputed neighbour index arrays.

    Parameters
    ----------
    I_a, I_b : array-like of shape (N, k), integer
        Neighbour indices of the same N images under two models (rows
        without repeated entries), e.g. from :func:`knn_indices`.

    Returns
    -------
    ndarray of shape (N,)
        ``|I_a[i] & I_b[i]| / k``.

    Examples
    --------
    >>> overlap_from_indices([[1, 2], [0, 2]], [[2, 3], [3, 1]])
    array([0.5, 0. ])
    """
    A = _check_index_array(I_a, "I_a")
    B = _check_index_array(I_b, "I_b")
    if A.shape != B.shape:
        raise InputError(f"I_a and I_b must have the same shape (N, k), got {A.shape} and {B.shape}")
    both = np.sort(np.concatenate([A, B], axis=1), axis=1)
    inter = (both[:, 1:] == both[:, :-1]).sum(axis=1)
    return inter / A.shape[1]


def _intersections(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    both = np.sort(np.concatenate([A, B], axis=1), axis=1)
    return (both[:, 1:] == both[:, :-1]).sum(axis=1)


def _check_same_rows(arrays: Mapping[str, Any]) -> int:
    sizes = {name: np.shape(x)[0] if np.ndim(x) >= 1 else None for name, x in arrays.items()}
    distinct = set(sizes.values())
    if len(distinct) != 1:
        desc = ", ".join(f"{name}: {size}" for name, size in sizes.items())
        raise InputError(
            f"embeddings must have one row per image, in the same order, for every model; row counts differ ({desc})"
        )
    return distinct.pop()


def mutual_knn_overlap_per_image(
    X_a: Any,
    X_b: Any,
    *,
    k: int = 10,
    exclude_groups: Any = None,
    metric: str = "cosine",
) -> np.ndarray:
    """Per-image share of the k nearest neighbours two models have in common.

    Parameters
    ----------
    X_a, X_b : array-like of shape (N, d_a) and (N, d_b)
        Embeddings of the same N images (same row order) by two models;
        dimensions may differ.
    k : int
        Neighbours per image (CRS-Bench: 10).
    exclude_groups : array-like of shape (N,), optional
        E.g. patient ids: a patient's other images are not counted as
        neighbours (see :func:`knn_indices`).
    metric : {"cosine", "ip", "euclidean"}

    Returns
    -------
    ndarray of shape (N,)
        ``|kNN_a(i) & kNN_b(i)| / k``, values in {0, 1/k, ..., 1}.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 8))
    >>> float(mutual_knn_overlap_per_image(X, 3 * X, k=5).mean())
    1.0
    """
    _check_same_rows({"X_a": X_a, "X_b": X_b})
    I_a = knn_indices(X_a, k=k, exclude_groups=exclude_groups, metric=metric)
    I_b = knn_indices(X_b, k=k, exclude_groups=exclude_groups, metric=metric)
    return _intersections(I_a, I_b) / k


def mutual_knn_overlap(
    X_a: Any,
    X_b: Any,
    *,
    k: int = 10,
    exclude_groups: Any = None,
    metric: str = "cosine",
) -> float:
    """Mutual kNN overlap: mean over images of the shared-neighbour share.

    See :func:`mutual_knn_overlap_per_image` for the parameters. Chance
    level is ``k / (N - 1)`` (:func:`chance_overlap`).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 8))
    >>> mutual_knn_overlap(X, X, k=5)
    1.0
    """
    return float(np.mean(mutual_knn_overlap_per_image(X_a, X_b, k=k, exclude_groups=exclude_groups, metric=metric)))


def agreement_matrix(
    embeddings: Mapping[str, Any],
    *,
    k: int = 10,
    exclude_groups: Any = None,
    metric: str = "cosine",
    return_per_image: bool = False,
    index: str = "auto",
    threshold: int = APPROX_THRESHOLD,
    recall_sample: int = 20_000,
    scheduler: Any = None,
    nprobe: int | None = None,
) -> pd.DataFrame | tuple[pd.DataFrame, pd.DataFrame]:
    """Mutual kNN overlap between every pair of models.

    Each model is searched once (M searches for M models); pair overlaps
    are then computed from the neighbour index arrays, which costs almost
    nothing next to the searches. Up to ``threshold`` images the searches
    are exact; beyond it (or on request) they are approximate, their recall
    is measured, and the agreement carries a bound on the error that the
    approximation can cause.

    Parameters
    ----------
    embeddings : mapping of model name -> array of shape (N, d_model)
        Embeddings of the same N images, same row order, for each model.
    k : int
    exclude_groups : array-like of shape (N,), optional
        Patient (or other) labels whose members are not counted as
        neighbours of each other.
    metric : {"cosine", "ip", "euclidean"}
    return_per_image : bool
        Also return the per-image overlaps of every pair.
    index : {"auto", "exact", "ivf", "ivfpq", "hnsw"}
        Neighbour search per model (:func:`knn_search`): ``"auto"`` is
        exact up to ``threshold`` images and IVF-PQ above.
    threshold : int
        See :data:`APPROX_THRESHOLD`.
    recall_sample : int
        Queries on which each approximate search is checked against the
        exact neighbours (:func:`knn_recall`).
    scheduler : None, "local[:N]", an address, or a distributed.Client
        Where the searches run (:func:`crslib.cluster.open_client`, opened
        once for all models): None in this process; otherwise as Dask
        tasks, several models at a time (up to one per worker). The result
        does not depend on it.
    nprobe : int, optional
        Cells scanned per query by an IVF or IVF-PQ search (:func:`knn_search`);
        default ``max(16, min(nlist // 16, 64))``. At N=1,000,000 the default
        (64 of 4,000 cells) measured recall@10 0.725 on the synthetic data of
        ``bench/bench_scale.py``; raise it when the reported bound is too wide.

    Returns
    -------
    agreement : DataFrame of shape (M, M)
        Symmetric, labelled by model name, diagonal 1.0. ``attrs`` holds
        ``k``, ``n_images``, ``search`` (per model, the ``info`` dict of
        :func:`knn_search`: index used, recall and its interval, seconds)
        and, when any model was searched approximately,
        ``overlap_error_bound``: per pair ``"model_a|model_b"``, the largest
        possible difference between the reported and the exact mean overlap
        (:func:`overlap_error_bound` of the two models' recalls, from the
        lower ends of their 95% intervals; an exact search has recall 1).
    per_image : DataFrame of shape (N, M(M-1)/2)
        Only with ``return_per_image=True``; columns are a MultiIndex
        (model_a, model_b).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> Z = rng.normal(size=(100, 8))
    >>> A = agreement_matrix({"a": Z, "b": 2 * Z, "c": rng.normal(size=(100, 8))}, k=5)
    >>> float(A.loc["a", "b"]), A.attrs["search"]["a"]["index"]
    (1.0, 'exact')
    """
    if not isinstance(embeddings, Mapping) or len(embeddings) < 2:
        raise InputError("embeddings must be a mapping {model name: array} with at least 2 models")
    names = [str(n) for n in embeddings]
    if len(set(names)) != len(names):
        raise InputError(f"model names must be unique as strings, got {names}")
    _check_same_rows(embeddings)
    _check_search_options(index, threshold, recall_sample, nprobe)  # before a cluster is started

    def search(name: str, X: Any, client: Any) -> tuple[np.ndarray, dict, RecallResult | None]:
        try:
            return _search(
                X, k=k, metric=metric, exclude_groups=exclude_groups, index=index, threshold=threshold,
                recall_sample=recall_sample, random_state=0, client=client, query_block=None, nprobe=nprobe,
            )
        except InputError as exc:
            raise InputError(f"model {name!r}: {exc}") from exc

    with open_client(scheduler) as client:
        workers = worker_count(client)
        if client is None or workers < 2:
            found = [search(name, X, client) for name, X in zip(names, embeddings.values())]
        else:
            # Models in parallel, one per worker at most: an approximate
            # search is a single task, so one model at a time would leave
            # the other workers idle. (Each model's X is sent to every worker,
            # so more at once would only multiply worker memory.)
            with ThreadPoolExecutor(max_workers=min(len(names), workers)) as pool:
                futures = [pool.submit(search, name, X, client) for name, X in zip(names, embeddings.values())]
                found = [f.result() for f in futures]
    index_of = {name: f[0] for name, f in zip(names, found)}
    infos = {name: f[1] for name, f in zip(names, found)}
    recalls = {name: f[2] for name, f in zip(names, found)}
    m = len(names)
    mat = np.eye(m)
    per_image = {}
    for i in range(m):
        for j in range(i + 1, m):
            ov = _intersections(index_of[names[i]], index_of[names[j]]) / k
            mat[i, j] = mat[j, i] = float(ov.mean())
            if return_per_image:
                per_image[(names[i], names[j])] = ov
    agreement = pd.DataFrame(mat, index=pd.Index(names, name="model"), columns=pd.Index(names, name="model"))
    agreement.attrs.update({"k": k, "n_images": len(next(iter(index_of.values()))), "search": infos})
    if any(r is not None for r in recalls.values()):
        agreement.attrs["overlap_error_bound"] = {
            f"{names[i]}|{names[j]}": overlap_error_bound(
                1.0 if recalls[names[i]] is None else recalls[names[i]],
                1.0 if recalls[names[j]] is None else recalls[names[j]],
            )
            for i in range(m)
            for j in range(i + 1, m)
        }
    if return_per_image:
        cols = pd.MultiIndex.from_tuples(list(per_image), names=["model_a", "model_b"])
        return agreement, pd.DataFrame(np.column_stack(list(per_image.values())), columns=cols)
    return agreement


# =========================================================================== reference points


def chance_overlap(n: int, k: int) -> float:
    """Expected mutual kNN overlap of two unrelated models: ``k / (n - 1)``.

    If model b's neighbour set of an image is a uniformly random k-subset of
    the other n - 1 images, each of model a's k neighbours is in it with
    probability k / (n - 1). (With a group exclusion the pool shrinks to the
    images outside the query's group.)

    Examples
    --------
    >>> round(chance_overlap(1001, 10), 4)
    0.01
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise InputError(f"n must be an integer >= 2 (number of images), got {n!r}")
    k = _check_k(k, int(n))
    return k / (int(n) - 1)


@dataclass(frozen=True)
class NullResult:
    """Overlap expected without any relation between two models.

    Attributes
    ----------
    mean : float
        Mean overlap over permutations.
    low, high : float
        Percentile interval of the permutation overlaps.
    values : ndarray of shape (n_permutations,)
        Overlap (mean over images) of each permutation.
    chance : float
        The analytic reference ``k / (N - 1)``.
    """

    mean: float
    low: float
    high: float
    values: np.ndarray = field(repr=False)
    chance: float = float("nan")
    confidence: float = 0.95


def permutation_null(
    X_a: Any,
    X_b: Any,
    *,
    k: int = 10,
    n_permutations: int = 20,
    metric: str = "cosine",
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> NullResult:
    """Overlap after shuffling the rows of one model relative to the other.

    Shuffling breaks the image correspondence while keeping each model's
    neighbourhood structure (hubs, clusters), a more faithful null than the
    uniform chance ``k / (N - 1)`` when a space has hubs. Each model is
    searched once; the neighbours of the shuffled model follow from the
    permutation (``I_b'[i] = inv[I_b[perm[i]]]``) without a new search.

    Parameters
    ----------
    X_a, X_b : array-like of shape (N, d)
    k : int
    n_permutations : int
    metric : {"cosine", "ip", "euclidean"}
    confidence : float
        Coverage of the percentile interval of the permutation overlaps.
    random_state : int

    Returns
    -------
    NullResult

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(200, 8))
    >>> res = permutation_null(X, X, k=5, n_permutations=10)
    >>> res.mean < 0.1
    True
    """
    n_permutations = stats._check_count(n_permutations, "n_permutations")
    confidence = stats._check_confidence(confidence)
    n = _check_same_rows({"X_a": X_a, "X_b": X_b})
    I_a = knn_indices(X_a, k=k, metric=metric)
    I_b = knn_indices(X_b, k=k, metric=metric)
    rng = np.random.default_rng(random_state)
    values = np.empty(n_permutations)
    for p in range(n_permutations):
        perm = rng.permutation(n)
        inv = np.empty_like(perm)
        inv[perm] = np.arange(n)
        values[p] = _intersections(I_a, inv[I_b[perm]]).mean() / k
    alpha = (1 - confidence) / 2
    return NullResult(
        mean=float(values.mean()),
        low=float(np.percentile(values, 100 * alpha)),
        high=float(np.percentile(values, 100 * (1 - alpha))),
        values=values,
        chance=k / (n - 1),
        confidence=confidence,
    )


def overlap_ci(
    per_image: Any,
    *,
    groups: Any = None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> stats.BootstrapResult:
    """Bootstrap interval of the mean overlap, over images or over patients.

    Parameters
    ----------
    per_image : array-like of shape (N,)
        Per-image overlaps (:func:`mutual_knn_overlap_per_image`).
    groups : array-like of shape (N,), optional
        Patient ids: resample whole patients (their images are correlated),
        which gives the honest, usually wider, interval.
    n_resamples, confidence, random_state
        See :func:`crslib.stats.bootstrap_ci`.

    Returns
    -------
    crslib.stats.BootstrapResult

    Examples
    --------
    >>> import numpy as np
    >>> res = overlap_ci(np.full(100, 0.3), n_resamples=50)
    >>> round(res.estimate, 3), round(res.low, 3), round(res.high, 3)
    (0.3, 0.3, 0.3)
    """
    x = _per_image_array(per_image)
    return stats.bootstrap_ci(
        np.mean, x, n_resamples=n_resamples, groups=groups, confidence=confidence, random_state=random_state
    )


def _per_image_array(per_image: Any, n: int | None = None) -> np.ndarray:
    x = np.asarray(per_image, dtype=float)
    if x.ndim != 1:
        raise InputError(f"per_image must be 1-D (one overlap per image), got shape {x.shape}")
    if n is not None and x.shape[0] != n:
        raise InputError(f"per_image has {x.shape[0]} values but metadata has {n} rows; they must match row by row")
    if not np.isfinite(x).all():
        raise InputError(f"per_image has NaN values at rows {np.flatnonzero(~np.isfinite(x))[:5].tolist()}")
    return x


# =========================================================================== complementary metrics


def _paired_dense(X: Any, Y: Any) -> tuple[np.ndarray, np.ndarray]:
    _check_same_rows({"X": X, "Y": Y})
    Xf = _as_embeddings(X, "X", np.float64).copy()
    Yf = _as_embeddings(Y, "Y", np.float64).copy()
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

    n = _check_same_rows({"X": X, "Y": Y})
    k = _check_k(k, n)
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
    _check_same_rows({"X_a": X_a, "X_b": X_b})
    I_a = knn_indices(X_a, k=k, exclude_groups=exclude_groups, metric=metric)
    I_b = knn_indices(X_b, k=k, exclude_groups=exclude_groups, metric=metric)
    inter = _intersections(I_a, I_b)
    return float(np.mean(inter / (2 * k - inter)))


def k_sweep(
    X_a: Any,
    X_b: Any,
    *,
    ks: Sequence[int] = (1, 5, 10, 20, 50, 100),
    exclude_groups: Any = None,
    metric: str = "cosine",
) -> pd.DataFrame:
    """Mutual kNN overlap and chance level for several k.

    Each model is searched once with the largest k; smaller k use the first
    neighbours (the ranking is exact, so prefixes are the smaller-k sets).
    Values of k that are not below N (or not below the candidates left by
    the group exclusion) are dropped and listed in ``attrs["dropped_k"]``.

    Returns
    -------
    DataFrame with columns k, overlap, chance, overlap_over_chance
        Chance is ``k / (N - 1)``, or with ``exclude_groups`` the mean over
        images of ``k / (N - own group size)``.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(30, 4))
    >>> k_sweep(X, X, ks=(1, 5, 50))["k"].tolist()
    [1, 5]
    """
    n = _check_same_rows({"X_a": X_a, "X_b": X_b})
    ks_list = []
    for kv in ks:
        if isinstance(kv, bool) or not isinstance(kv, (int, np.integer)) or kv < 1:
            raise InputError(f"ks must hold integers >= 1, got {kv!r}")
        ks_list.append(int(kv))
    ks_list = sorted(set(ks_list))
    if exclude_groups is not None:
        g = np.asarray(exclude_groups)
        if g.ndim != 1 or g.shape[0] != n:
            raise InputError(f"exclude_groups must be 1-D with one label per image ({n}), got shape {g.shape}")
        codes, _ = pd.factorize(pd.Series(g))
        own = np.bincount(codes[codes >= 0])[codes] if (codes >= 0).all() else None
        if own is None:
            raise InputError("exclude_groups has missing labels; give every image a group")
        limit = n - int(own.max())
        pool = (n - own).astype(float)
    else:
        limit = n - 1
        pool = None
    keep = [kv for kv in ks_list if kv <= limit]
    dropped = [kv for kv in ks_list if kv > limit]
    if dropped:
        log.info("k_sweep: dropped k=%s (need k <= %d candidates for N=%d)", dropped, limit, n)
    if not keep:
        raise InputError(f"no k in {list(ks)} is below the number of candidate neighbours ({limit}); use smaller k")
    kmax = keep[-1]
    I_a = knn_indices(X_a, k=kmax, exclude_groups=exclude_groups, metric=metric)
    I_b = knn_indices(X_b, k=kmax, exclude_groups=exclude_groups, metric=metric)
    rows = []
    for kv in keep:
        ov = _intersections(I_a[:, :kv], I_b[:, :kv]).mean() / kv
        chance = kv / (n - 1) if pool is None else float(np.mean(kv / pool))
        rows.append({"k": kv, "overlap": float(ov), "chance": chance, "overlap_over_chance": float(ov) / chance})
    out = pd.DataFrame(rows)
    out.attrs["dropped_k"] = dropped
    return out


# =========================================================================== subgroups


def _check_metadata(metadata: Any, n: int, columns: Any) -> tuple[pd.DataFrame, list[str]]:
    if not isinstance(metadata, pd.DataFrame):
        raise InputError("metadata must be a pandas DataFrame with one row per image")
    if len(metadata) != n:
        raise InputError(f"metadata has {len(metadata)} rows but per_image has {n}; they must match row by row")
    if isinstance(columns, str):
        columns = [columns]
    columns = list(columns)
    if not columns:
        raise InputError("columns is empty; name at least one metadata column (e.g. 'source')")
    missing = [c for c in columns if c not in metadata.columns]
    if missing:
        raise InputError(f"metadata has no column(s) {missing}; available: {list(metadata.columns)}")
    return metadata.reset_index(drop=True), columns


def overlap_by_subgroup(
    per_image: Any,
    metadata: pd.DataFrame,
    *,
    columns: Sequence[str] | str,
    groups: Any = None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> pd.DataFrame:
    """Mean per-image overlap, count and bootstrap interval per subgroup.

    Parameters
    ----------
    per_image : array-like of shape (N,)
    metadata : DataFrame with N rows (same order)
    columns : str or list of str
        Each column is treated as categorical; every level gets a row
        (missing values form their own level "NaN").
    groups : array-like of shape (N,), optional
        Patient ids for a patient-level bootstrap within each level.
    n_resamples, confidence, random_state
        See :func:`crslib.stats.bootstrap_ci`.

    Returns
    -------
    DataFrame with columns column, level, n, mean, low, high

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> meta = pd.DataFrame({"view": ["PA", "AP"] * 50})
    >>> ov = np.where(meta.view == "PA", 0.2, 0.1)
    >>> t = overlap_by_subgroup(ov, meta, columns="view", n_resamples=50)
    >>> t[["level", "n"]].values.tolist(), t["mean"].round(3).tolist()
    ([['AP', 50], ['PA', 50]], [0.1, 0.2])
    """
    x = _per_image_array(per_image)
    meta, columns = _check_metadata(metadata, x.shape[0], columns)
    g = None if groups is None else np.asarray(groups)
    if g is not None and g.shape != (x.shape[0],):
        raise InputError(f"groups must have one label per image ({x.shape[0]}), got shape {g.shape}")
    rows = []
    for col in columns:
        levels = meta[col].astype(object).where(meta[col].notna(), "NaN")
        for level in sorted(levels.unique(), key=lambda v: (str(type(v)), str(v))):
            sel = (levels == level).to_numpy()
            res = stats.bootstrap_ci(
                np.mean,
                x[sel],
                n_resamples=n_resamples,
                groups=None if g is None else g[sel],
                confidence=confidence,
                random_state=random_state,
            )
            rows.append(
                {
                    "column": col,
                    "level": level,
                    "n": int(sel.sum()),
                    "mean": float(res.estimate),
                    "low": res.low,
                    "high": res.high,
                }
            )
    return pd.DataFrame(rows, columns=["column", "level", "n", "mean", "low", "high"])


def _one_hot_blocks(meta: pd.DataFrame, columns: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Design matrix [intercept | one-hot(level != first) per column] and each column's block."""
    parts = [np.ones((len(meta), 1))]
    blocks = {}
    start = 1
    for col in columns:
        codes, uniques = pd.factorize(meta[col].astype(object).where(meta[col].notna(), "NaN"), sort=True)
        L = len(uniques)
        if L > 1:
            D = np.zeros((len(meta), L - 1))
            nz = codes > 0
            D[np.flatnonzero(nz), codes[nz] - 1] = 1.0
            parts.append(D)
        blocks[col] = np.arange(start, start + L - 1)
        start += L - 1
    return np.hstack(parts), blocks


def _r2_from_gram(G: np.ndarray, gy: np.ndarray, yy: float, ybar_sum: float, wsum: float, cols: np.ndarray) -> float:
    """R^2 of a weighted OLS on a subset of design columns, from X'WX, X'Wy."""
    sst = yy - ybar_sum**2 / wsum
    if sst <= 0:
        return float("nan")
    Gs = G[np.ix_(cols, cols)]
    gs = gy[cols]
    beta = np.linalg.lstsq(Gs, gs, rcond=None)[0]
    ssr_fit = float(beta @ gs)  # = y'WX beta = explained + mean part
    sse = yy - ssr_fit
    return float(np.clip(1.0 - sse / sst, 0.0, 1.0))


def overlap_variance_shares(
    per_image: Any,
    metadata: pd.DataFrame,
    *,
    columns: Sequence[str] | str,
    n_resamples: int = 200,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> pd.DataFrame:
    """How much of the per-image overlap variance each factor explains.

    For each factor (a categorical metadata column: source, view, a finding)
    two shares of the total variance of the per-image overlap:

    * ``share_alone``: eta-squared, the R^2 of an OLS on that factor's
      one-hot coding alone (between-level sum of squares / total);
    * ``share_unique``: the drop in R^2 when the factor is removed from the
      joint OLS on all factors (its unique contribution; shares overlap
      when factors are confounded, e.g. a view used mostly at one source).

    A last row ``(all factors)`` gives the joint R^2. Intervals come from a
    bootstrap over images (weights from resampling counts).

    Parameters
    ----------
    per_image : array-like of shape (N,)
    metadata : DataFrame with N rows
    columns : str or list of str
        Categorical factors; bin continuous variables first.
    n_resamples : int
    confidence : float
    random_state : int

    Returns
    -------
    DataFrame with columns factor, n_levels, share_alone, share_alone_low,
    share_alone_high, share_unique, share_unique_low, share_unique_high

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> meta = pd.DataFrame({"source": rng.integers(0, 3, 300), "view": rng.integers(0, 2, 300)})
    >>> ov = meta.source.to_numpy() * 0.1 + rng.normal(0, 0.001, 300)
    >>> t = overlap_variance_shares(ov, meta, columns=["source", "view"], n_resamples=20)
    >>> t.set_index("factor").share_alone.round(1).to_dict()
    {'source': 1.0, 'view': 0.0, '(all factors)': 1.0}
    """
    x = _per_image_array(per_image)
    n = x.shape[0]
    meta, columns = _check_metadata(metadata, n, columns)
    n_resamples = stats._check_count(n_resamples, "n_resamples")
    confidence = stats._check_confidence(confidence)
    if np.ptp(x) == 0:
        raise InputError("per_image overlap is constant: there is no variance to explain")
    D, blocks = _one_hot_blocks(meta, columns)
    p = D.shape[1]
    all_cols = np.arange(p)
    sub = {c: np.concatenate([[0], b]) for c, b in blocks.items()}
    without = {c: np.setdiff1d(all_cols, b) for c, b in blocks.items()}

    def shares(w: np.ndarray) -> np.ndarray:
        Dw = D * w[:, None]
        G = Dw.T @ D
        gy = Dw.T @ x
        yy = float(w @ (x * x))
        ys = float(w @ x)
        ws = float(w.sum())
        full = _r2_from_gram(G, gy, yy, ys, ws, all_cols)
        vals = []
        for c in columns:
            vals.append(_r2_from_gram(G, gy, yy, ys, ws, sub[c]))
            vals.append(full - _r2_from_gram(G, gy, yy, ys, ws, without[c]))
        vals.append(full)
        return np.array(vals)

    est = shares(np.ones(n))
    rng = np.random.default_rng(random_state)
    samples = np.empty((n_resamples, est.size))
    for b in range(n_resamples):
        w = np.bincount(rng.integers(0, n, n), minlength=n).astype(float)
        samples[b] = shares(w)
    alpha = (1 - confidence) / 2
    lo = np.nanpercentile(samples, 100 * alpha, axis=0)
    hi = np.nanpercentile(samples, 100 * (1 - alpha), axis=0)
    rows = []
    for i, c in enumerate(columns):
        a, u = 2 * i, 2 * i + 1
        rows.append(
            {
                "factor": c,
                "n_levels": int(blocks[c].size + 1),
                "share_alone": est[a],
                "share_alone_low": lo[a],
                "share_alone_high": hi[a],
                "share_unique": est[u],
                "share_unique_low": lo[u],
                "share_unique_high": hi[u],
            }
        )
    rows.append(
        {
            "factor": "(all factors)",
            "n_levels": int(p),
            "share_alone": est[-1],
            "share_alone_low": lo[-1],
            "share_alone_high": hi[-1],
            "share_unique": np.nan,
            "share_unique_low": np.nan,
            "share_unique_high": np.nan,
        }
    )
    return pd.DataFrame(rows)


# =========================================================================== accuracy


def _check_labels(labels: Any, n: int) -> pd.DataFrame:
    if isinstance(labels, pd.Series):
        labels = labels.to_frame()
    if not isinstance(labels, pd.DataFrame):
        raise InputError("labels must be a DataFrame with one 0/1 column per finding")
    if len(labels) != n:
        raise InputError(f"labels has {len(labels)} rows but the embeddings have {n}; they must match row by row")
    if labels.shape[1] == 0:
        raise InputError("labels has no finding columns")
    out = labels.reset_index(drop=True).apply(pd.to_numeric, errors="coerce")
    for col in out.columns:
        vals = out[col].dropna().unique()
        bad = [v for v in vals if v not in (0, 1)]
        if bad or (labels[col].notna() & out[col].isna()).any():
            raise InputError(
                f"label column {col!r} must hold 0/1 (or empty for unknown), found values like "
                f"{(bad or list(labels[col][out[col].isna() & labels[col].notna()]))[:3]}"
            )
    return out


def linear_probe_auroc(
    X: Any,
    labels: pd.DataFrame,
    *,
    groups: Any,
    test_size: float = 0.3,
    C: float = 1.0,
    max_iter: int = 2000,
    random_state: int | None = 0,
) -> pd.Series:
    """Test AUROC of a linear probe per finding on a patient-grouped split.

    A standardised, L2-regularised logistic regression per finding is
    trained on the embeddings of the training patients and scored on the
    held-out patients (``GroupShuffleSplit``: no patient in both parts).
    Rows with an empty label for a finding are left out for that finding.

    A finding with one class in the training or test part is not fitted: its
    AUROC is NaN and the reason is recorded in ``result.attrs["reasons"]``
    (and logged). If every finding is degenerate, InputError.

    Parameters
    ----------
    X : array-like of shape (N, d)
    labels : DataFrame of shape (N, n_findings), values 0/1 (NaN = unknown)
    groups : array-like of shape (N,)
        Patient ids.
    test_size : float
        Share of patients held out.
    C : float
        Inverse L2 strength of the logistic regression.
    max_iter : int
    random_state : int

    Returns
    -------
    Series of test AUROC, indexed by finding (name "auroc")

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 5))
    >>> y = pd.DataFrame({"effusion": (X[:, 0] > 0).astype(int)})
    >>> float(linear_probe_auroc(X, y, groups=np.arange(200))["effusion"]) > 0.9
    True
    """
    from sklearn.model_selection import GroupShuffleSplit

    Xf = _as_embeddings(X, "X")
    n = Xf.shape[0]
    lab = _check_labels(labels, n)
    g = np.asarray(groups)
    if g.shape != (n,):
        raise InputError(f"groups must have one patient id per image ({n}), got shape {g.shape}")
    if not 0 < test_size < 1:
        raise InputError(f"test_size must be between 0 and 1, got {test_size}")
    if len(pd.unique(g)) < 2:
        raise InputError("groups has a single patient; a patient-grouped split needs at least 2")
    split = GroupShuffleSplit(n_splits=1, test_size=test_size, random_state=random_state)
    train, test = next(split.split(Xf, groups=g))
    out = {}
    reasons = {}
    with one_blas_thread():  # one small fit per finding
        for col in lab.columns:
            y = lab[col].to_numpy()
            tr = train[~np.isnan(y[train])]
            te = test[~np.isnan(y[test])]
            reason = _degenerate_reason(y[tr].astype(int), "training") or _degenerate_reason(y[te].astype(int), "test")
            if reason:
                out[col] = np.nan
                reasons[col] = reason
                log.warning("linear_probe_auroc: finding %r skipped: %s", col, reason)
                continue
            clf = _probe(C, max_iter, random_state).fit(Xf[tr], y[tr].astype(int))
            out[col] = stats.auroc(y[te], clf.decision_function(Xf[te]))
    if reasons and len(reasons) == len(lab.columns):
        raise InputError(
            "no finding could be evaluated: " + "; ".join(f"{c}: {r}" for c, r in reasons.items())
        )
    res = pd.Series(out, name="auroc", dtype=float)
    res.index.name = "finding"
    res.attrs["reasons"] = reasons
    res.attrs["n_train"] = int(train.size)
    res.attrs["n_test"] = int(test.size)
    return res


def _degenerate_reason(y: np.ndarray, part: str) -> str | None:
    if y.size == 0:
        return f"no labelled images in the {part} split"
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.size:
        return f"single class in the {part} split ({n_pos} positive of {y.size})"
    return None


def _probe(C: float, max_iter: int, random_state):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter, random_state=random_state))


def _check_agreement_frame(agreement: Any) -> pd.DataFrame:
    if not isinstance(agreement, pd.DataFrame):
        raise InputError("agreement must be a square DataFrame labelled by model name (see agreement_matrix)")
    if agreement.shape[0] != agreement.shape[1] or list(agreement.index) != list(agreement.columns):
        raise InputError("agreement must be square with the same model names, in the same order, on rows and columns")
    return agreement


def accuracy_agreement_association(
    agreement: pd.DataFrame,
    accuracy: pd.Series,
    *,
    n_permutations: int = 999,
    method: str = "spearman",
    random_state: int | None = 0,
) -> dict:
    """Do models that agree more also perform more alike?

    Correlates the agreement matrix with the matrix of absolute accuracy
    differences ``|acc_i - acc_j|`` over model pairs. The p-value comes from
    a Mantel test (:func:`crslib.stats.mantel_test`), because pairs sharing a
    model are not independent; the plain Spearman correlation over pairs is
    reported beside it as a descriptive number. A negative correlation means
    that pairs with similar accuracy agree more.

    Parameters
    ----------
    agreement : DataFrame (M x M), symmetric, labelled by model
    accuracy : Series indexed by model name (e.g. mean AUROC)
    n_permutations : int
    method : {"spearman", "pearson"}
    random_state : int

    Returns
    -------
    dict with keys mantel_r, mantel_p, n_permutations, exact, spearman_r,
    n_models, n_pairs, method

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> acc = pd.Series({"a": 0.70, "b": 0.72, "c": 0.80, "d": 0.90})
    >>> d = np.abs(acc.values[:, None] - acc.values[None, :])
    >>> agr = pd.DataFrame(1 - d, index=acc.index, columns=acc.index)
    >>> round(accuracy_agreement_association(agr, acc)["spearman_r"], 3)
    -1.0
    """
    agreement = _check_agreement_frame(agreement)
    if not isinstance(accuracy, pd.Series):
        raise InputError("accuracy must be a pandas Series indexed by model name")
    names = list(agreement.index)
    missing = [m for m in names if m not in accuracy.index]
    if missing:
        raise InputError(f"accuracy has no value for model(s) {missing}; index it by the agreement matrix's names")
    acc = pd.to_numeric(accuracy.loc[names], errors="coerce").to_numpy(dtype=float)
    if not np.isfinite(acc).all():
        bad = [names[i] for i in np.flatnonzero(~np.isfinite(acc))]
        raise InputError(f"accuracy is NaN for model(s) {bad}; drop them from both inputs")
    A = agreement.to_numpy(dtype=float)
    D = np.abs(acc[:, None] - acc[None, :])
    res = stats.mantel_test(A, D, n_permutations=n_permutations, method=method, random_state=random_state)
    m = len(names)
    return {
        "mantel_r": res.r,
        "mantel_p": res.p_value,
        "n_permutations": res.n_permutations,
        "exact": res.exact,
        "spearman_r": stats.pairwise_spearman(A, D),
        "n_models": m,
        "n_pairs": m * (m - 1) // 2,
        "method": method,
    }


# =========================================================================== convergence


def convergence_table(agreement: pd.DataFrame, model_info: pd.DataFrame) -> pd.DataFrame:
    """Agreement within an objective across seeds vs across objectives.

    For each model size and objective: the overlap of pairs with the same
    objective and size but different seeds ("within"), and of pairs of that
    objective with models of another objective at the same size ("across").
    A row with objective ``(all)`` per size pools all within-objective and
    all across-objective pairs. Pairs of different sizes are not used.

    Parameters
    ----------
    agreement : DataFrame (M x M)
        From :func:`agreement_matrix`.
    model_info : DataFrame with columns name, objective, seed, size
        One row per model of ``agreement``.

    Returns
    -------
    DataFrame with columns size, objective, n_models, within_mean, within_min,
    within_max, n_within, across_mean, n_across, within_minus_across

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> info = pd.DataFrame({"name": list("abcd"), "objective": ["sup", "sup", "ssl", "ssl"],
    ...                      "seed": [0, 1, 0, 1], "size": "small"})
    >>> A = pd.DataFrame(np.full((4, 4), 0.1), index=info.name, columns=info.name)
    >>> A.loc["c", "d"] = A.loc["d", "c"] = 0.5
    >>> convergence_table(A, info).set_index("objective").within_mean.to_dict()
    {'ssl': 0.5, 'sup': 0.1, '(all)': 0.3}
    """
    agreement = _check_agreement_frame(agreement)
    if not isinstance(model_info, pd.DataFrame):
        raise InputError("model_info must be a DataFrame with columns name, objective, seed, size")
    need = ["name", "objective", "seed", "size"]
    missing = [c for c in need if c not in model_info.columns]
    if missing:
        raise InputError(f"model_info lacks column(s) {missing}; it needs {need}")
    if model_info["name"].duplicated().any():
        dup = model_info["name"][model_info["name"].duplicated()].tolist()
        raise InputError(f"model_info lists model(s) {dup} more than once")
    info = model_info.set_index("name")
    names = list(agreement.index)
    absent = [m for m in names if m not in info.index]
    if absent:
        raise InputError(f"model_info has no row for model(s) {absent}")
    info = info.loc[names]
    A = agreement.to_numpy(dtype=float)
    pairs = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            a, b = info.iloc[i], info.iloc[j]
            if a["size"] != b["size"]:
                continue
            pairs.append((a["size"], a["objective"], b["objective"], a["seed"] != b["seed"], A[i, j]))
    rows = []
    for size in pd.unique(info["size"]):
        sp = [p for p in pairs if p[0] == size]
        objectives = sorted(pd.unique(info.loc[info["size"] == size, "objective"]), key=str)
        for obj in objectives + ["(all)"]:
            if obj == "(all)":
                within = [p[4] for p in sp if p[1] == p[2] and p[3]]
                across = [p[4] for p in sp if p[1] != p[2]]
                n_models = int((info["size"] == size).sum())
            else:
                within = [p[4] for p in sp if p[1] == obj and p[2] == obj and p[3]]
                across = [p[4] for p in sp if (p[1] == obj) != (p[2] == obj)]
                n_models = int(((info["size"] == size) & (info["objective"] == obj)).sum())
            wm = float(np.mean(within)) if within else np.nan
            am = float(np.mean(across)) if across else np.nan
            rows.append(
                {
                    "size": size,
                    "objective": obj,
                    "n_models": n_models,
                    "within_mean": wm,
                    "within_min": float(np.min(within)) if within else np.nan,
                    "within_max": float(np.max(within)) if within else np.nan,
                    "n_within": len(within),
                    "across_mean": am,
                    "n_across": len(across),
                    "within_minus_across": wm - am,
                }
            )
    return pd.DataFrame(rows)

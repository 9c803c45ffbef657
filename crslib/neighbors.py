"""Exact k-nearest-neighbour search: deterministic, back-end independent, linear memory.

:func:`knn_indices` is exact and deterministic:

* the query itself is excluded by index, never by rank, so an exact
  duplicate of the query is a valid (first) neighbour;
* neighbours sharing the query's group (e.g. the same patient) can be
  excluded;
* ties are broken by index: candidates are ranked by (-similarity rounded to
  float32, index). Search back-ends (faiss, torch) order ties arbitrarily
  and their float32 scores carry rounding error of up to about ``d * 2**-24``;
  candidates whose scores lie within that error of each other are re-scored
  in float64 before ranking, and the candidate list is widened until the
  k-th neighbour is certain. The result does not depend on the back-end or
  the batch size;
* memory stays linear in N: queries are searched in batches, and no N x N
  matrix is formed.

Large N is handled by :mod:`crslib.ann`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import numpy as np
import pandas as pd

from crslib._validation import as_embeddings, check_k
from crslib.errors import InputError

log = logging.getLogger(__name__)

__all__ = [
    "METRICS",
    "knn_indices",
    "shared_neighbours",
    "BACKENDS",
]


METRICS = ("cosine", "ip", "euclidean")
BACKENDS = ("auto", "faiss", "torch")

_EPS32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff 2**-24
_SEARCH_BUDGET = 256 * 2**20  # bytes for one batch of search results / scores
_RESCORE_BUDGET = 16 * 2**20  # bytes for one chunk of gathered float64 candidates
_FAISS_QUERY_BATCH = 16384


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
    """Validated float32 working array (normalised for cosine) and row norms of it.

    A float32 C-contiguous input (a memory-mapped ``.npy`` included) is used as it
    is for "ip" and "euclidean"; cosine builds its normalised copy block by block
    from the input's own dtype (a float16 file becomes one float32 array, not two),
    so that copy is the only full array this makes."""
    if metric not in METRICS:
        raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
    if metric != "cosine":
        work = as_embeddings(X, name)  # never written to: faiss copies it into its index, torch only reads it
        return work, _row_norms(work)
    arr = as_embeddings(X, name, dtype=None)
    n, d = arr.shape
    step = max(1, (16 * 2**20) // max(1, d * 8))
    with np.errstate(over="ignore"):  # values past float32's range are reported below, not warned
        norms = np.concatenate([_row_norms(arr[s : s + step].astype(np.float32)) for s in range(0, n, step)])
        scale = norms.astype(np.float32)[:, None]
    zero = norms == 0
    if zero.any():
        bad = np.flatnonzero(zero)
        raise InputError(
            f"{name} has {bad.size} all-zero row(s) (first {bad[:5].tolist()}), whose cosine "
            "similarity is undefined; check the encoder output (constant zero embeddings) or use metric='ip'"
        )
    # the input was checked in its own dtype: a float64 value, or a row's norm, past float32's
    # largest number becomes inf here and would turn the row into NaN or zeros
    beyond = np.flatnonzero(np.isinf(scale[:, 0]))
    if beyond.size:
        raise InputError(
            f"{name} has values beyond float32's range ({np.finfo(np.float32).max:g}) in {beyond.size} row(s) "
            f"(first {beyond[:5].tolist()}), counting each row's norm; rescale the embeddings"
        )
    work = np.empty((n, d), dtype=np.float32)  # a new array: the input is never modified
    for s in range(0, n, step):
        work[s : s + step] = arr[s : s + step].astype(np.float32) / scale[s : s + step]
    return work, _row_norms(work)


# =========================================================================== search back-ends


_AVX512_SKX = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def _openblas_coretype_hint(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str | None:
    """An OpenBLAS core type this CPU certainly supports, from the first ``flags`` line of ``cpuinfo``."""
    try:
        with open(cpuinfo, encoding="ascii", errors="ignore") as fh:
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

    def __init__(self, X: np.ndarray, metric: str, backend: str, batch_size: int | None, device: str = "cpu"):
        if backend not in BACKENDS:
            raise InputError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if device != "cpu":
            if backend == "faiss":
                raise InputError(
                    f"backend='faiss' searches on the CPU; with device={device!r} use backend='torch' or 'auto'"
                )
            backend = "torch"  # matmul + top-k on the GPU
        self.device = device
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
            self.Xt = torch.from_numpy(X).to(device)
            if metric == "euclidean":
                self.sq = (self.Xt * self.Xt).sum(dim=1)

    def query_batch(self, kk: int) -> int:
        if self.batch_size is not None:
            return self.batch_size
        per_query = kk * 12 + (self.n * 4 if self.backend == "torch" else 0)
        batch = _SEARCH_BUDGET // per_query
        if self.backend == "faiss":
            batch = min(batch, _FAISS_QUERY_BATCH)
        return max(1, batch)

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
            q = torch.from_numpy(Q).to(self.device)
            S = q @ self.Xt.T
            if self.metric == "euclidean":
                S.mul_(2).sub_(self.sq[None, :]).sub_((q * q).sum(dim=1, keepdim=True))
            vals, ids = torch.topk(S, kk, dim=1, largest=True, sorted=True)
        return vals.cpu().numpy(), ids.cpu().numpy().astype(np.int64, copy=False)


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


def top_k_order(scores: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """Column order of each row's top ``k`` candidates, ranked by (-score, id): ``np.lexsort((ids,
    -scores))[:, :k]`` without sorting whole rows (a long candidate list: IVF-PQ's re-ranked pool).

    ``scores`` is float32 without NaN (``-inf`` marks a dropped candidate; -0.0 ties with 0.0) and
    ids lie in ``[-1, 2**32 - 2]`` (``-1``, a slot faiss could not fill, ranks first among equal
    scores, as in the lexsort). Each (score, id) pair is packed into one uint64 whose ascending
    order is the ranking, so a partial sort finds the top ``k``.

    Examples
    --------
    >>> s = np.array([[0.5, 0.9, 0.5, -np.inf]], dtype=np.float32)
    >>> top_k_order(s, np.array([[7, 3, 2, 1]]), 3)
    array([[1, 2, 0]])
    """
    bits = (np.asarray(scores, dtype=np.float32) + np.float32(0.0)).view(np.uint32)  # -0.0 + 0.0 is 0.0
    # IEEE floats as unsigned integers in the floats' order, then inverted: a higher score, a smaller key
    ordered = np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))
    key = ((~ordered).astype(np.uint64) << np.uint64(32)) | (ids + 1).astype(np.uint64)
    k = min(k, key.shape[1])
    top = np.argpartition(key, k - 1, axis=1)[:, :k]
    return np.take_along_axis(top, np.argsort(np.take_along_axis(key, top, axis=1), axis=1), axis=1)


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

    enough = n_valid >= k
    # Fast path: every consecutive gap among the first k + 1 valid candidates
    # exceeds twice the score error, and the k-th is clearly above anything
    # not returned. Then the raw order is the exact order. There are k + 1
    # candidates (kk > k always); a gap to a missing (k + 1)-th is infinite,
    # and the NaN gaps between two missing ones occur only in rows without k.
    with np.errstate(invalid="ignore"):
        gap_ok = (raw_s[:, :k] - raw_s[:, 1 : k + 1] > 2 * tol[:, None]).all(axis=1)
        bound_ok = full | (raw_s[:, k - 1] - last_raw > 2 * tol)
    done = enough & gap_ok & bound_ok

    slow = np.flatnonzero(enough & ~done)
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
    device: str | None = None,
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
        topk; "auto" uses faiss when installed, except for ``queries`` of at
        most a quarter of rows that take more than 256 MB, where faiss'
        index would copy them all and torch needs no copy. Both give
        identical results.
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
    device : {"auto", "cpu", "cuda", "mps"}, optional
        Where the candidate search runs (:func:`crslib.device.resolve_device`).
        ``None`` or a device that resolves to the CPU: the CPU path above,
        unchanged. A GPU: torch matmul + top-k on it (float32 matmul at
        "highest" precision, no TF32), then the same float64 re-scoring and
        tie rule on the CPU, so the neighbours are exactly those of the CPU
        path (ties included). ``backend="faiss"`` with a GPU is an error.

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
    k = check_k(k, n)
    gcodes = _group_codes(exclude_groups, n, k)
    qrows = np.arange(n, dtype=np.int64) if queries is None else _check_queries(queries, n)
    if backend == "auto" and queries is not None and 4 * qrows.size <= n and Xw.nbytes > _SEARCH_BUDGET:
        # a few queries (a recall check, a tuning sample) of many rows: faiss' flat index would copy all
        # N rows, torch multiplies against them where they are, its scores within the batch budget
        backend = "torch"
    searcher = _Searcher(Xw, metric, backend, batch_size, _search_device(device))

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


def _search_device(device: str | None) -> str:
    if device is None:
        return "cpu"
    from crslib.device import resolve_device

    return resolve_device(device)


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


def _intersections(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    both = np.sort(np.concatenate([A, B], axis=1), axis=1)
    return (both[:, 1:] == both[:, :-1]).sum(axis=1)


def shared_neighbours(X_a: Any, X_b: Any, rows: Any, *, k: int = 10, exclude_groups: Any = None) -> pd.DataFrame:
    """The ``k`` nearest neighbours of some images under two encoders, and which of them both return.

    What the mutual kNN overlap averages, for a few images a reader can look
    at: for each query row, its neighbours under encoder ``a`` and under
    encoder ``b`` (cosine, the query's own group left out), rank by rank.

    Parameters
    ----------
    X_a, X_b : array-like of shape (N, d_a) and (N, d_b)
        The two encoders' embeddings of the same N images, in the same order.
    rows : array-like of int
        The query images (row numbers).
    k : int
    exclude_groups : array-like of shape (N,), optional
        Patient ids: a query's own patient's other images are not neighbours.

    Returns
    -------
    pandas.DataFrame
        One row per query and rank: ``query``, ``rank`` (1 = nearest),
        ``neighbour_a``, ``neighbour_b``, ``shared_a`` (``neighbour_a`` is
        among ``b``'s k too), ``shared_b``; ``overlap`` (the query's share of
        shared neighbours) repeats on each of its rows.

    Examples
    --------
    >>> X = np.array([[1, 0], [1, 0.1], [1, 0.3], [0, 1], [0.1, 1], [0.3, 1]])
    >>> t = shared_neighbours(X, X, [0], k=2)
    >>> t[["rank", "neighbour_a", "shared_a"]].values.tolist(), float(t["overlap"].iloc[0])
    ([[1, 1, True], [2, 2, True]], 1.0)
    """
    rows = np.asarray(rows, dtype=np.int64)
    a = knn_indices(X_a, k=k, exclude_groups=exclude_groups, queries=rows)
    b = knn_indices(X_b, k=k, exclude_groups=exclude_groups, queries=rows)
    records = []
    for query, near_a, near_b in zip(rows.tolist(), a, b):
        in_a, in_b = set(near_a.tolist()), set(near_b.tolist())
        overlap = len(in_a & in_b) / k
        records += [{"query": query, "rank": rank + 1, "neighbour_a": int(na), "neighbour_b": int(nb_),
                     "shared_a": int(na) in in_b, "shared_b": int(nb_) in in_a, "overlap": overlap}
                    for rank, (na, nb_) in enumerate(zip(near_a, near_b))]
    return pd.DataFrame(records)

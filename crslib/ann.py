"""Nearest neighbours at large N: approximate search, its measured recall, and the search entry point.

Exact search (:mod:`crslib.neighbors`) costs O(N^2 d). :func:`knn_search`
(used by :func:`crslib.agreement.agreement_matrix`) stays exact up to
:data:`APPROX_THRESHOLD` images and switches to an approximate faiss index
(IVF-PQ with exact re-ranking; IVF-Flat or HNSW on request) above it, with
the same conventions (self and group excluded by index, ties by index). An
approximate search always comes with its measured recall (:func:`knn_recall`:
exact neighbours of a sample of queries, via ``knn_indices(queries=...)``),
and :func:`overlap_error_bound` turns the recalls of two models into a
guaranteed bound on the error of their mean overlap. With a Dask client
(:mod:`crslib.cluster`) the exact search runs as query-block tasks and an
approximate one as one task per model; the result is the same as
in-process.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crslib._validation import (
    as_embeddings,
    check_k,
    check_positive_int,
    check_random_state,
    check_same_rows,
)
from crslib.cluster import run_tasks, worker_count
from crslib.errors import InputError
from crslib.neighbors import (
    _FAISS_QUERY_BATCH,
    _SEARCH_BUDGET,
    METRICS,
    _candidate_count,
    _check_index_array,
    _group_codes,
    _import_faiss,
    _intersections,
    _prepare,
    _rescore,
    knn_indices,
)

log = logging.getLogger(__name__)

__all__ = [
    "APPROX_THRESHOLD",
    "RecallResult",
    "approximate_knn_indices",
    "knn_recall",
    "overlap_error_bound",
    "knn_search",
    "APPROX_METHODS",
    "INDEX_CHOICES",
    "PQ_MIN_ROWS",
]



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


def _ivf_params(n: int, nlist: Any, nprobe: Any) -> tuple[int, int]:
    """Resolved (nlist, nprobe) of an IVF index over n rows."""
    if nlist is None:
        # ~4 sqrt(N) lists (the faiss guideline), but at most N / 39: faiss'
        # k-means wants at least 39 training points per centroid.
        nlist = int(np.clip(round(4 * np.sqrt(n)), 16, 65536))
        nlist = max(1, min(nlist, n // 39))
    else:
        nlist = check_positive_int(nlist, "nlist")
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
        nprobe = check_positive_int(nprobe, "nprobe")
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
    hnsw_m = check_positive_int(hnsw_m, "hnsw_m")
    ef_search = check_positive_int(ef_search, "ef_search", allow_none=True)
    refine = check_positive_int(refine_factor, "refine_factor")
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
        (``recall@10`` >= 0.95 at N=100,000 on clustered synthetic data).
    hnsw_m : int
        HNSW graph degree.
    ef_search : int, optional
        HNSW search pool; default ``max(64, 2 * candidates)``.
    refine_factor : int
        IVF-PQ candidates per wanted candidate that are re-ranked exactly.
        On overlapping Gaussian clusters (N=20,000, d=64, 8-byte codes)
        ``recall@10`` was 0.84 / 0.90 / 0.92 with 4 / 8 / 16, against 0.92 for
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
    seed = check_random_state(random_state)
    Xw, _ = _prepare(X, metric)
    n = Xw.shape[0]
    k = check_k(k, n)
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
    n = check_same_rows({"X": X, "approx_indices": A})
    k = A.shape[1] if k is None else check_positive_int(k, "k")
    if k > A.shape[1]:
        raise InputError(f"k={k} exceeds the {A.shape[1]} neighbour columns of approx_indices")
    sample = check_positive_int(sample, "sample")
    seed = check_random_state(random_state)
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
    check_positive_int(recall_sample, "recall_sample")
    check_positive_int(nprobe, "nprobe", allow_none=True)


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
    device: str | None = None,
) -> tuple[np.ndarray, dict, RecallResult | None]:
    start_time = time.perf_counter()
    _check_search_options(index, threshold, recall_sample, nprobe)
    query_block = check_positive_int(query_block, "query_block", allow_none=True)
    seed = check_random_state(random_state)
    if metric not in METRICS:
        raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
    # Validated float32 rows, so every task (and the in-process path) searches
    # bit-identical input; knn_indices converts to exactly this array anyway.
    Xw = as_embeddings(X, "X")
    n = Xw.shape[0]
    k = check_k(k, n)
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
            ids = knn_indices(Xw, k=k, metric=metric, exclude_groups=gcodes, device=device)
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
    device: str | None = None,
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
    device : str, optional
        Where the exact search runs in this process (see :func:`knn_indices`:
        a GPU gives the same neighbours as the CPU); None or "cpu" keeps the
        CPU search. The approximate searches and the blocks sent to a
        ``client`` run on the CPU.

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
        nprobe=nprobe, device=device,
    )
    return ids, info

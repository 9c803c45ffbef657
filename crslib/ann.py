"""Nearest neighbours at large N: approximate search tuned to a target recall, and the search entry point.

Exact search (:mod:`crslib.neighbors`) costs O(N^2 d). :func:`knn_search`
(used by :func:`crslib.agreement.agreement_matrix`) stays exact up to
:data:`APPROX_THRESHOLD` images and switches to an approximate faiss index
(an HNSW graph over 8-bit codes with exact re-ranking; IVF-Flat, IVF-PQ or
HNSW on full rows on request) above it, with
the same conventions (self and group excluded by index, ties by index).
A fixed search depth loses recall as N grows, so :func:`knn_search` first
tunes the depth (the graph's search pool, cells probed, candidates
re-ranked) on held-out queries
until the lower end of the recall's interval reaches ``target_recall``,
then measures the recall it got on other queries (:mod:`crslib.recall`),
which bounds the error of every overlap computed from it. With a Dask
client (:mod:`crslib.cluster`) the exact search runs as query-block tasks
and an approximate one as one task per model; the result is the same as
in-process, except that a target out of reach turns into the exact search
on the cluster.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from crslib._validation import (
    check_k,
    check_positive_int,
    check_random_state,
)
from crslib.cluster import run_tasks, worker_count
from crslib.errors import InputError
from crslib.neighbors import (
    _FAISS_QUERY_BATCH,
    _SEARCH_BUDGET,
    METRICS,
    _candidate_count,
    _group_codes,
    _import_faiss,
    _intersections,
    _prepare,
    _rescore,
    knn_indices,
    top_k_order,
)
from crslib.recall import RecallResult, _recall_interval, knn_recall, overlap_error_bound  # noqa: F401

log = logging.getLogger(__name__)

# RecallResult, knn_recall and overlap_error_bound live in crslib.recall and are importable from here
__all__ = [
    "APPROX_THRESHOLD",
    "approximate_knn_indices",
    "knn_search",
    "APPROX_METHODS",
    "INDEX_CHOICES",
    "PQ_MIN_ROWS",
    "TUNE_QUERIES",
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

APPROX_METHODS = ("ivf", "ivfpq", "hnsw", "hnswsq")
#: Graph searches (depth: ``ef_search``), and searches whose candidates are re-ranked by exact scores.
_GRAPHS = ("hnsw", "hnswsq")
_RERANKED = ("ivfpq", "hnswsq")
INDEX_CHOICES = ("auto", "exact") + APPROX_METHODS


def _ivf_params(n: int, nlist: Any, nprobe: Any) -> tuple[int, int]:
    """Resolved (nlist, nprobe) of an IVF index over n rows."""
    if nlist is None:
        # ~4 sqrt(N) lists (the faiss guideline), at most 65,536, and at most N / 39:
        # faiss' k-means wants at least 39 training points per centroid.
        nlist = max(1, min(int(round(4 * np.sqrt(n))), 65536, n // 39))
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


#: Rows added to an index at a time.
_ADD_BLOCK = 65_536


def _build_approx_index(Xw: np.ndarray, metric: str, method: str, *, nlist: int, hnsw_m: int, seed: int | None):
    faiss = _import_faiss()
    if faiss is None:
        raise InputError("approximate kNN search needs the faiss-cpu package; install it or use index='exact'")
    n, d = Xw.shape
    faiss_metric = faiss.METRIC_L2 if metric == "euclidean" else faiss.METRIC_INNER_PRODUCT
    rng = np.random.default_rng(seed)
    if method in _GRAPHS:
        if method == "hnsw":
            index = faiss.IndexHNSWFlat(d, hnsw_m, faiss_metric)
        else:
            # 8-bit scalar codes (a quarter of the float32 row) trained on a sample: the
            # graph walk ranks by them and the candidates are re-ranked on the full rows
            index = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_8bit, hnsw_m, faiss_metric)
            m = min(n, _SQ_TRAIN_ROWS)
            index.train(Xw if m >= n else Xw[np.sort(rng.choice(n, size=m, replace=False))])
        _add_graph_rows(faiss, index, Xw, seed)
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
    m = min(n, max(nlist * 40, _IVF_TRAIN_ROWS))
    train = Xw if m >= n else Xw[np.sort(rng.choice(n, size=m, replace=False))]
    index.train(train)
    del train  # the sample is a copy: gone before the codes are added
    for s in range(0, n, _ADD_BLOCK):  # blocks bound the temporaries (residuals) of adding
        index.add(np.ascontiguousarray(Xw[s : s + _ADD_BLOCK]))
    return index, quantizer  # the quantizer must outlive the index


#: Rows that train the 8-bit scalar quantizer of ``"hnswsq"`` (per-dimension ranges).
_SQ_TRAIN_ROWS = 50_000
#: Rows that train an IVF index's centroids at the least (40 per list when the lists are many).
_IVF_TRAIN_ROWS = 50_000


def _add_graph_rows(faiss: Any, index: Any, Xw: np.ndarray, seed: int | None) -> None:
    """Insert the rows into an HNSW graph, in blocks. Threads insert rows concurrently, so the
    graph depends on their timing; with a seed the graph is built on one thread and a seed gives
    the same graph, and so the same neighbours, on every run (about 2x the build time on 2 cores)."""
    threads = faiss.omp_get_max_threads()
    if seed is not None:
        faiss.omp_set_num_threads(1)
    try:
        for s in range(0, Xw.shape[0], _ADD_BLOCK):
            index.add(np.ascontiguousarray(Xw[s : s + _ADD_BLOCK]))
    finally:
        faiss.omp_set_num_threads(threads)


def _index_mb(index: Any, method: str, n: int, d: int) -> float:
    """Memory of a built index: its codes or rows, ids, list centroids, product-quantizer
    codebook and graph links (within 0.5% of the serialised index; tested)."""
    if method in _GRAPHS:
        hnsw = index.hnsw
        links = hnsw.neighbors.size() * 4 + hnsw.offsets.size() * 8 + hnsw.levels.size() * 4
        return (links + n * d * (4 if method == "hnsw" else 1)) / 2**20
    if method == "ivfpq":
        # the codes and ids, and the codebook: 2**nbits centroids of d / M dimensions per sub-quantizer
        stored = n * (index.pq.M * index.pq.nbits // 8 + 8) + 2**index.pq.nbits * d * 4
    else:
        stored = n * (4 * d + 8)  # the float32 rows and their ids
    return (stored + index.nlist * d * 4) / 2**20


def _on_prepared(metric: str) -> str:
    """The metric that searches a prepared array as ``metric`` searches the raw one: its cosine rows
    are already normalised, so the inner product gives the same neighbours without a second copy."""
    return "ip" if metric == "cosine" else metric


def _fetch_count(method: str, kk: int, refine: int, n: int, ef: int) -> int:
    """Candidates asked of the index per query: IVF-PQ ranks by compressed
    codes, so it returns ``refine`` x the candidates, re-ranked exactly;
    HNSW-SQ returns its whole search pool (``ef``), re-ranked exactly."""
    if method == "ivfpq":
        return min(n, kk * refine)
    return min(n, max(kk, ef)) if method == "hnswsq" else kk


def _set_depth(index: Any, method: str, probe: int, ef: int, kk: int) -> None:
    if method in _GRAPHS:
        index.hnsw.efSearch = max(ef, kk)  # HNSW returns at most efSearch results
    else:
        index.nprobe = probe


def _search_rows(
    index: Any, Xw: np.ndarray, qids: np.ndarray, *, k: int, fetch: int, metric: str,
    gcodes: np.ndarray | None, method: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k (ids, float32 scores, done) of the queries ``qids`` at the index's current depth;
    ``done`` is False where fewer than k valid candidates came back."""
    D, ids = index.search(Xw[qids], fetch)
    ids = ids.astype(np.int64, copy=False)
    if method in _RERANKED:
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
    order = top_k_order(rv, ids, k)
    done = valid.sum(axis=1) >= k
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(rv, order, axis=1), done


def _query_step(fetch: int) -> int:
    return max(1, min(_FAISS_QUERY_BATCH, _SEARCH_BUDGET // (fetch * 12)))


#: Queries on which ``target_recall`` tunes the search depth (their exact
#: neighbours cost ``2,000 x N``); the reported recall is measured on others.
TUNE_QUERIES = 2_000
_MAX_REFINE = 64
_MAX_EF = 4_096


def _cell_ranks(quantizer: Any, Xw: np.ndarray, rows: np.ndarray, exact: np.ndarray, max_probe: int) -> np.ndarray:
    """Sorted ranks, among each query's cells closest first, of the cells holding its exact
    neighbours (``max_probe`` when farther): the share below p is the recall an IVF search
    probing p cells could reach at best."""
    _, cells = quantizer.search(Xw[rows], max_probe)
    _, home = quantizer.search(Xw[exact.ravel()], 1)
    home = home.reshape(exact.shape)
    ranks = np.full(exact.shape, max_probe, dtype=np.int64)
    for s in range(0, len(rows), 256):
        hit = cells[s : s + 256, :, None] == home[s : s + 256, None, :]  # (queries, cells, k)
        found = hit.any(axis=1)
        ranks[s : s + 256][found] = hit.argmax(axis=1)[found]
    return np.sort(ranks.ravel())


def _tune_depth(
    index: Any, quantizer: Any, Xw: np.ndarray, rows: np.ndarray, *, k: int, kk: int, metric: str,
    gcodes: np.ndarray | None, method: str, depth: dict, target: float, max_probe: int, deadline: float,
) -> tuple[dict, list[dict], bool]:
    """Deepen the search (``depth``: nprobe, refine_factor, ef_search) until the lower 95% bound of
    recall@k on the queries ``rows`` reaches ``target``, or the budget ends. Returns the depth,
    the trials and whether the target was met."""
    n = Xw.shape[0]
    exact = knn_indices(Xw, k=k, metric=_on_prepared(metric), exclude_groups=gcodes, queries=rows)
    ranks = None if method in _GRAPHS else _cell_ranks(quantizer, Xw, rows, exact, max_probe)

    def reachable(probe: int) -> float:
        return _recall_interval(np.searchsorted(ranks, probe) / ranks.size, len(rows), n)[0]

    depth, trials = dict(depth), []
    while True:
        _set_depth(index, method, depth.get("nprobe", 0), depth.get("ef_search", 0), kk)
        fetch = _fetch_count(method, kk, depth.get("refine_factor", 1), n, depth.get("ef_search", 0))
        step = _query_step(fetch)
        ids = np.concatenate([_search_rows(index, Xw, rows[s : s + step], k=k, fetch=fetch, metric=metric,
                                           gcodes=gcodes, method=method)[0] for s in range(0, len(rows), step)])
        recall = float(_intersections(ids, exact).mean() / k)
        low = _recall_interval(recall, len(rows), n)[0]
        trials.append({**depth, "recall": round(recall, 4), "ci_low": round(low, 4)})
        if low >= target:
            return depth, trials, True
        if time.perf_counter() > deadline:
            return depth, trials, False
        if method in _GRAPHS:
            if depth["ef_search"] >= _MAX_EF:
                return depth, trials, False
            depth["ef_search"] = min(_MAX_EF, 2 * depth["ef_search"])
            continue
        probe, refine = depth["nprobe"], depth.get("refine_factor", 1)
        if method == "ivfpq" and refine < _MAX_REFINE and reachable(probe) >= target:
            depth["refine_factor"] = 2 * refine  # the probed cells hold the neighbours; the codes lose them
        elif probe < max_probe:
            # the fewest cells that hold enough of the exact neighbours (at least one more), or the budget
            enough = [p for p in range(probe + 1, max_probe + 1) if reachable(p) >= target]
            depth["nprobe"] = enough[0] if enough else max_probe
        else:
            # a search cannot find more than the probed cells hold, whatever it re-ranks
            return depth, trials, False


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
    target_recall: float | None = None,
    max_probe_share: float = 0.25,
    tune_seconds: float = 600.0,
    stop_if_unmet: bool = False,
) -> tuple[np.ndarray | None, np.ndarray | None, dict]:
    """Approximate top-k on a prepared array: (ids, float32 scores, resolved parameters).

    With ``target_recall`` (and no explicit ``nprobe`` / ``ef_search``) the search depth is
    tuned first (:func:`_tune_depth`) on :data:`TUNE_QUERIES` sampled rows, recorded in
    ``params["tune_rows"]``; with ``stop_if_unmet`` an unmet target returns ``(None, None, params)``
    before the full search."""
    n, d = Xw.shape
    hnsw_m = check_positive_int(hnsw_m, "hnsw_m")
    ef_search = check_positive_int(ef_search, "ef_search", allow_none=True)
    refine = check_positive_int(refine_factor, "refine_factor")
    tuned = target_recall is not None and (nprobe if method not in _GRAPHS else ef_search) is None
    if method in ("ivf", "ivfpq"):
        nlist, probe = _ivf_params(n, nlist, nprobe)
        params = {"nlist": nlist, "nprobe": probe}
        if method == "ivfpq":
            params.update(pq_m=_pq_subquantizers(d), pq_bits=8, refine_factor=refine)
    else:
        params = {"hnsw_m": hnsw_m} if method == "hnsw" else {"hnsw_m": hnsw_m, "storage": "sq8", "reranked": True}
    index, quantizer = _build_approx_index(Xw, metric, method, nlist=nlist, hnsw_m=hnsw_m, seed=seed)
    params["index_mb"] = round(_index_mb(index, method, n, d), 3)
    kk = _candidate_count(k, n, gcodes)
    if method in _GRAPHS:
        # efSearch is the HNSW candidate pool; below 64 recall drops sharply. HNSW-SQ re-ranks
        # its whole pool exactly: on bench_scale's data at N=1,000,000 (d=512, M=32) the codes
        # alone found 0.977 of the exact neighbours with a pool of 32, and 0.983 with 64
        default_ef = 64 if method == "hnsw" else 32
        params["ef_search"] = ef_search if ef_search is not None else max(default_ef, 2 * kk)
    if tuned:
        rng = np.random.default_rng(None if seed is None else seed + 1)  # not the recall sample's stream
        rows = np.sort(rng.choice(n, size=min(TUNE_QUERIES, max(1, n // 4)), replace=False)).astype(np.int64)
        max_probe = max(params.get("nprobe", 1), min(nlist, int(max_probe_share * nlist))) if method not in _GRAPHS else 0
        depth = {key: params[key] for key in ("nprobe", "refine_factor", "ef_search") if key in params}
        depth, trials, met = _tune_depth(
            index, quantizer, Xw, rows, k=k, kk=kk, metric=metric, gcodes=gcodes, method=method, depth=depth,
            target=target_recall, max_probe=max_probe, deadline=time.perf_counter() + tune_seconds)
        params.update(depth, target_recall=target_recall, target_met=met, tuning=trials, tune_rows=rows)
        if method not in _GRAPHS:
            params["max_nprobe"] = max_probe
        if not met:
            log.warning("approximate kNN: recall@%d target %.3f not met (lower bound %.3f at %s)", k, target_recall,
                        trials[-1]["ci_low"], {key: trials[-1][key] for key in depth})
            if stop_if_unmet:
                return None, None, params
    probe, refine = params.get("nprobe", 0), params.get("refine_factor", 1)
    ef = params.get("ef_search", 0)
    nlist = params.get("nlist", 0)

    out_ids = np.empty((n, k), dtype=np.int64)
    out_sc = np.empty((n, k), dtype=np.float32)
    pending = np.arange(n, dtype=np.int64)
    while pending.size:
        _set_depth(index, method, probe, ef, kk)
        exhaustive = kk >= n and (method in _GRAPHS or probe >= nlist)
        fetch = _fetch_count(method, kk, refine, n, ef)
        step = _query_step(fetch)
        unresolved = []
        for s in range(0, pending.size, step):
            qids = pending[s : s + step]
            ids, rv, done = _search_rows(index, Xw, qids, k=k, fetch=fetch, metric=metric, gcodes=gcodes,
                                         method=method)
            out_ids[qids[done]] = ids[done]
            out_sc[qids[done]] = rv[done]
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
            if method not in _GRAPHS:
                probe = min(nlist, 4 * probe)
    if pending.size:
        # Only HNSW can get here (an exhaustive IVF search sees every row, and
        # _group_codes guaranteed k candidates outside each group): its graph
        # walk did not reach k valid rows. Those few rows get exact neighbours
        # rather than an error after the whole index was built.
        log.info("approximate kNN: %d rows fell back to the exact search", pending.size)
        ids, sc = knn_indices(Xw, k=k, metric=_on_prepared(metric), exclude_groups=gcodes, queries=pending,
                              return_similarity=True)
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
    method : {"ivf", "ivfpq", "hnsw", "hnswsq"}
        ``"ivf"``: ``faiss.IndexIVFFlat``, an inverted file of ``nlist``
        k-means cells of which ``nprobe`` are scanned per query.
        ``"ivfpq"``: the same cells holding product-quantized codes
        (``faiss.IndexIVFPQ``, one 8-bit sub-quantizer per ~8 dimensions:
        64 bytes per row at d=512 instead of 2 KB); each query takes
        ``refine_factor`` x the candidates from the codes and re-ranks them
        by their exact scores. Scanning codes rather than full rows is what
        makes N=1,000,000 affordable on a small machine (IVF-Flat's scan is
        bound by memory bandwidth); needs at least :data:`PQ_MIN_ROWS` rows.
        ``"hnsw"``: ``faiss.IndexHNSWFlat``, a navigable small-world graph
        over a float32 copy of the rows. ``"hnswsq"``: the same graph over
        8-bit scalar codes (``faiss.IndexHNSWSQ``, a quarter of the float32
        row, the ranges trained on a sample of 50,000 rows); each query's
        whole search pool (``ef_search``) is re-ranked by its exact scores.
        :func:`knn_search`'s choice above its threshold.
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
        HNSW search pool; default ``max(64, 2 * candidates)`` (``"hnsw"``) or
        ``max(32, 2 * candidates)`` (``"hnswsq"``, which re-ranks it).
    refine_factor : int
        IVF-PQ candidates per wanted candidate that are re-ranked exactly.
        On overlapping Gaussian clusters (N=20,000, d=64, 8-byte codes)
        ``recall@10`` was 0.84 / 0.90 / 0.92 with 4 / 8 / 16, against 0.92 for
        IVF-Flat with the same lists; on the d=512 data of
        ``bench/bench_scale.py`` 4 already matched IVF-Flat.
    random_state : int or None
        Seeds the IVF training sample and k-means (and the HNSW-SQ
        training sample): a fixed seed gives the same result on every call.
        With a seed an HNSW graph is built on one thread (rows inserted
        concurrently make the graph depend on the threads' timing); None
        builds it on all threads, about twice as fast on 2 cores, and it
        can differ slightly between runs.
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
    target_recall: float | None = None,
    max_probe_share: float = 0.25,
    tune_seconds: float = 600.0,
    stop_if_unmet: bool = False,
) -> tuple[np.ndarray | None, RecallResult | None, dict]:
    """Approximate neighbours of one model and their recall, measured on queries other than
    those the depth was tuned on (one shard task). ``(None, None, params)`` when the target
    was not met and ``stop_if_unmet``."""
    Xw, _ = _prepare(X, metric)
    ids, _, params = _approximate_knn(
        Xw, k=k, metric=metric, gcodes=exclude_groups, method=method, nlist=None, nprobe=nprobe,
        hnsw_m=32, ef_search=None, seed=random_state, target_recall=target_recall,
        max_probe_share=max_probe_share, tune_seconds=tune_seconds, stop_if_unmet=stop_if_unmet,
    )
    tune_rows = params.pop("tune_rows", None)
    if tune_rows is not None:
        params["tune_queries"] = int(tune_rows.size)
    if ids is None:
        return None, None, params
    # on the prepared rows: the raw ones would be normalised into a second full copy
    recall = knn_recall(Xw, ids, k=k, metric=_on_prepared(metric), exclude_groups=exclude_groups,
                        sample=recall_sample, random_state=random_state, exclude_rows=tune_rows)
    return ids, recall, params


def _check_share(value: Any, name: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not 0.0 < float(value) <= 1.0:
        raise InputError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


def _check_search_options(
    index: Any, threshold: Any, recall_sample: Any, nprobe: Any = None, *, target_recall: Any = None,
    max_probe_share: Any = 0.25, tune_seconds: Any = 600.0,
) -> None:
    if index not in INDEX_CHOICES:
        raise InputError(f"index must be one of {INDEX_CHOICES}, got {index!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)) or threshold < 0:
        raise InputError(f"threshold must be a non-negative integer (images), got {threshold!r}")
    check_positive_int(recall_sample, "recall_sample")
    check_positive_int(nprobe, "nprobe", allow_none=True)
    _check_share(target_recall, "target_recall", allow_none=True)
    _check_share(max_probe_share, "max_probe_share")
    if isinstance(tune_seconds, bool) or not isinstance(tune_seconds, (int, float, np.integer, np.floating)) \
            or not tune_seconds > 0:
        raise InputError(f"tune_seconds must be a positive number of seconds, got {tune_seconds!r}")


def _exact_on_client(client: Any, shared: dict, n: int, query_block: int | None) -> np.ndarray:
    """Exact neighbours as query-block tasks, concatenated in row order: each task searches
    all N rows, so the result equals one in-process exact search, ties included."""
    # ~4 blocks per worker balance the load; blocks below 1,000 rows
    # would spend more on task overhead (each task rebuilds the flat
    # index over all N rows) than on searching
    block = query_block or max(1000, -(-n // (4 * worker_count(client))))
    tasks = [(s, min(n, s + block)) for s in range(0, n, block)]
    return np.concatenate(run_tasks(client, _knn_block_task, tasks, shared=shared))


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
    target_recall: float | None = None,
    max_probe_share: float = 0.25,
    tune_seconds: float = 600.0,
) -> tuple[np.ndarray, dict, RecallResult | None]:
    start_time = time.perf_counter()
    _check_search_options(index, threshold, recall_sample, nprobe, target_recall=target_recall,
                          max_probe_share=max_probe_share, tune_seconds=tune_seconds)
    query_block = check_positive_int(query_block, "query_block", allow_none=True)
    seed = check_random_state(random_state)
    if metric not in METRICS:
        raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
    # The prepared rows once, here: every task (and the in-process path) then
    # searches bit-identical input, and a memory-mapped or float16 X becomes one
    # float32 working array (cosine rows, normalised, search as inner products).
    Xw, _ = _prepare(X, metric)
    metric = _on_prepared(metric)
    n = Xw.shape[0]
    k = check_k(k, n)
    gcodes = _group_codes(exclude_groups, n, k)  # fails here, not in a task on a worker
    if index == "auto":
        # HNSW-SQ above the threshold. On bench_scale's data at N=1,000,000, d=512 (2 cores)
        # the IVF cells a query must probe to hold 0.95 of its exact neighbours were ~500 of
        # 4,000 (0.72 with the 64 that took 2,144 s for two models), an IVF-PQ search of
        # hours; the HNSW graph over 8-bit codes was built in 258 s (2 threads) and its pool
        # of 32 held 0.977 of the exact neighbours before re-ranking, in 145 s per 1,000,000
        # queries, with a quarter of the float32 rows in codes. bench_scale's two models there
        # met the default target at once: recall@10 0.979 (from 0.977), 3,077 s, +3.2 GB.
        method = "exact" if n <= threshold else "hnswsq"
    else:
        method = index
    shared = {"X": Xw, "k": k, "metric": metric, "exclude_groups": gcodes}  # what the exact tasks take
    recall = None
    params = None
    fallback = None
    if method != "exact":
        approx = dict(shared, method=method, recall_sample=recall_sample, random_state=seed, nprobe=nprobe,
                      target_recall=target_recall, max_probe_share=max_probe_share, tune_seconds=tune_seconds,
                      stop_if_unmet=client is not None)
        ((ids, recall, params),) = run_tasks(client, _approx_knn_task, [()], shared=approx)
        if ids is None:
            # the target was out of reach within the budget, and there are workers: exact instead
            fallback = (f"recall@{k} target {target_recall} not met by {method} within the budget "
                        f"(lower bound {params['tuning'][-1]['ci_low']:.3f}); exact search on the cluster instead")
            log.warning("approximate kNN: %s", fallback)
            method = "exact"
    if method == "exact":
        if client is None:
            ids = knn_indices(Xw, k=k, metric=metric, exclude_groups=gcodes, device=device)
        else:
            ids = _exact_on_client(client, shared, n, query_block)
    low = 1.0 if recall is None else recall.ci_low
    info = {
        "index": method,
        "n": n,
        "k": k,
        "recall": None if recall is None else recall.recall,
        "recall_ci": None if recall is None else [recall.ci_low, recall.ci_high],
        "recall_sample": None if recall is None else recall.n_sample,
        "target_recall": target_recall if params is not None and "target_recall" in params else None,
        "target_met": None if params is None else params.get("target_met"),
        "error_bound": 1.0 - low,
        "fallback": fallback,
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
    target_recall: float | None = 0.95,
    max_probe_share: float = 0.25,
    tune_seconds: float = 600.0,
) -> tuple[np.ndarray, dict]:
    """k nearest neighbours of every row: exact up to a size, approximate (with measured recall) beyond.

    Parameters
    ----------
    X : array-like of shape (N, d)
    k : int
    metric : {"cosine", "ip", "euclidean"}
    exclude_groups : array-like of shape (N,), optional
        See :func:`knn_indices`.
    index : {"auto", "exact", "ivf", "ivfpq", "hnsw", "hnswsq"}
        ``"exact"``: :func:`knn_indices`. ``"ivf"``, ``"ivfpq"``, ``"hnsw"``, ``"hnswsq"``:
        :func:`approximate_knn_indices` with its defaults. ``"auto"``: exact
        when ``N <= threshold``, else ``"hnswsq"`` (an HNSW graph over 8-bit
        codes, its candidates re-ranked exactly).
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
        included, is one task. The result is identical either way, except
        that an approximate search whose ``target_recall`` is out of reach
        becomes the exact search on the cluster.
    query_block : int, optional
        Query rows per exact-search task; default
        ``max(1000, ceil(N / (4 * workers)))``.
    nprobe : int, optional
        IVF / IVF-PQ cells scanned per query: an explicit override of the
        depth that ``target_recall`` would choose (no tuning). The search
        time grows about in proportion. Ignored by the exact and HNSW
        searches.
    device : str, optional
        Where the exact search runs in this process (see :func:`knn_indices`:
        a GPU gives the same neighbours as the CPU); None or "cpu" keeps the
        CPU search. The approximate searches and the blocks sent to a
        ``client`` run on the CPU.
    target_recall : float or None
        Recall@k an approximate search must reach, as the lower end of its
        95% interval (default 0.95). Before searching all rows, the depth is
        tuned on :data:`TUNE_QUERIES` sampled queries against their exact
        neighbours: IVF probes more cells while the cells probed cannot hold
        enough of the exact neighbours (measured from the cells the
        neighbours live in), IVF-PQ re-ranks more candidates when they can
        but the compressed codes lose them, HNSW and HNSW-SQ double ``ef_search``. The
        reported ``recall`` is then measured on other queries. If the target
        is out of reach within the budget, a ``client`` runs the exact
        search instead (``info["fallback"]`` says why); without one the
        search runs at the deepest setting tried, with a warning, and
        reports the recall and bound it reached. None: the fixed default
        depth of :func:`approximate_knn_indices`, as before.
    max_probe_share : float
        Probe budget of the tuning: at most this share of the IVF cells
        (default a quarter; beyond that an exact search costs little more).
    tune_seconds : float
        Time budget of the tuning (the full search is not counted).

    Returns
    -------
    indices : ndarray of shape (N, k), int64
    info : dict
        ``index`` (the search used: "exact", "ivf", "ivfpq", "hnsw" or "hnswsq"), ``n``,
        ``k``, ``recall`` (None for exact), ``recall_ci`` ([low, high] of
        the 95% interval, or None), ``recall_sample`` (queries checked, or
        None), ``target_recall`` and ``target_met`` (None when nothing was
        tuned), ``error_bound`` (the largest error of a mean overlap with an
        exactly searched model that this search can cause,
        :func:`overlap_error_bound` of its recall and 1; 0 for exact),
        ``fallback`` (why an approximate search became exact, or None),
        ``params`` (the approximate index's parameters: nlist, the chosen
        nprobe and refine_factor or ef_search, ``index_mb`` (the index's
        memory), ``tuning`` with every setting
        tried and its recall on the tuning queries, or None) and
        ``seconds`` (wall time).

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
        nprobe=nprobe, device=device, target_recall=target_recall, max_probe_share=max_probe_share,
        tune_seconds=tune_seconds,
    )
    return ids, info

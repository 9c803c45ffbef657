"""crslib.agreement at large N: query subsets, approximate search, recall, error bound, Dask shards."""

from __future__ import annotations

import json
import time
from pathlib import Path

import faiss
import numpy as np
import pytest
from distributed import get_task_stream

from crslib import agreement as ag
from crslib import ann
from crslib import neighbors as nb
from crslib.cluster import open_client
from crslib.errors import InputError
from assertions import error_message


def _rng(seed=0):
    return np.random.default_rng(seed)


def _clustered(n, d=64, n_centres=200, spread=1.5, seed=0):
    """Gaussian clusters that overlap (spread 1.5 in d=64): neighbours are mostly,
    not only, cluster mates. The data behind the default ``nprobe`` (see
    ``crslib.ann._ivf_params``)."""
    rng = _rng(seed)
    centres = rng.normal(size=(n_centres, d))
    labels = rng.integers(0, n_centres, n)
    return (centres[labels] + spread * rng.normal(size=(n, d))).astype(np.float32)


def _recall(I, E):
    return float(np.mean(ag.overlap_from_indices(I, E)))


@pytest.fixture(scope="module")
def big():
    """N=20,000 x 64 clustered data, patient-like groups, and its exact neighbours."""
    X = _clustered(20_000)
    groups = _rng(5).integers(0, 5_000, len(X))  # ~4 images per "patient"
    return {
        "X": X,
        "groups": groups,
        "exact": nb.knn_indices(X, k=10),
        "exact_groups": nb.knn_indices(X, k=10, exclude_groups=groups),
    }


@pytest.fixture(scope="module")
def client():
    # started once: worker processes are spawned and import crslib (seconds)
    with open_client("local:2") as c:
        yield c


# --------------------------------------------------------------------------- knn_indices(queries=...)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_queries_give_the_rows_of_the_full_result(metric):
    rng = _rng(1)
    X = rng.normal(size=(3000, 16))
    groups = rng.integers(0, 400, 3000)
    for exclude in (None, groups):
        full, sim = nb.knn_indices(X, k=10, metric=metric, exclude_groups=exclude, return_similarity=True)
        q = rng.permutation(3000)[:700]  # unsorted, with consecutive runs by chance
        part, part_sim = nb.knn_indices(
            X, k=10, metric=metric, exclude_groups=exclude, queries=q, return_similarity=True
        )
        np.testing.assert_array_equal(part, full[q])
        np.testing.assert_array_equal(part_sim, sim[q])
    # a shuffled contiguous block (first - last + 1 == size, yet not in order)
    q = np.array([4, 6, 5, 7])
    np.testing.assert_array_equal(nb.knn_indices(X, k=5, queries=q), nb.knn_indices(X, k=5)[q])
    assert nb.knn_indices(X, k=5, queries=[]).shape == (0, 5)
    np.testing.assert_array_equal(nb.knn_indices(X, k=5, queries=range(3000)), nb.knn_indices(X, k=5))


def test_bad_queries_raise():
    X = _rng(2).normal(size=(50, 4))
    with pytest.raises(InputError, match=r"out of range, first \[50\]"):
        nb.knn_indices(X, k=3, queries=[0, 50])
    with pytest.raises(InputError, match=r"out of range, first \[-1\]"):
        nb.knn_indices(X, k=3, queries=[-1, 2])
    with pytest.raises(InputError, match=r"unique; repeated rows \[3\]"):
        nb.knn_indices(X, k=3, queries=[3, 1, 3])
    with pytest.raises(InputError, match="1-D"):
        nb.knn_indices(X, k=3, queries=[[0, 1], [2, 3]])
    with pytest.raises(InputError, match="integer"):
        nb.knn_indices(X, k=3, queries=[0.0, 1.0])
    # many bad rows: the message counts them all and shows the first five
    assert error_message(nb.knn_indices, X, k=3, queries=[60, 61, 62, 63, 64, 65, 66, 1]) == (
        "queries must be row indices 0 <= i < N=50; 7 are out of range, first [60, 61, 62, 63, 64]")
    assert error_message(nb.knn_indices, X, k=3, queries=[9, 8, 7, 6, 5, 4, 9, 8, 7, 6, 5, 4]) == (
        "queries must be unique; repeated rows [4, 5, 6, 7, 8]")


# --------------------------------------------------------------------------- recall


def _known_neighbours(k=10, n_clusters=100, d=32, seed=3):
    """Clusters of k + 1 points tightly around far-apart centres: each point's k
    nearest neighbours are exactly its cluster mates."""
    rng = _rng(seed)
    centres = rng.normal(size=(n_clusters, d))
    labels = np.repeat(np.arange(n_clusters), k + 1)
    X = centres[labels] + 1e-3 * rng.normal(size=(len(labels), d))
    return X, labels


def test_recall_with_known_neighbours():
    k = 10
    X, labels = _known_neighbours(k)
    n = len(X)
    exact = nb.knn_indices(X, k=k)
    assert (labels[exact] == labels[:, None]).all()  # the construction holds
    res = ann.knn_recall(X, exact)
    assert res.recall == 1.0 and (res.ci_low, res.ci_high) == (1.0, 1.0)
    assert res.n_sample == n and res.k == k and res.per_query.shape == (n,)

    # In every other row, swap 3 of the 10 neighbours for points of other
    # clusters: recall = 1 - 0.5 * 3/10 = 0.85.
    wrong = exact.copy()
    rng = _rng(4)
    for i in range(0, n, 2):
        others = np.flatnonzero(labels != labels[i])
        wrong[i, rng.choice(k, 3, replace=False)] = rng.choice(others, 3, replace=False)
    res = ann.knn_recall(X, wrong)
    assert res.recall == pytest.approx(0.85, abs=1e-12)
    np.testing.assert_array_equal(np.round(res.per_query * k), np.where(np.arange(n) % 2 == 0, 7, 10))
    assert res.ci_low == res.ci_high == res.recall  # every row compared: no sampling error

    # a sample: the estimate varies, its interval covers the truth
    part = ann.knn_recall(X, wrong, sample=300, random_state=1)
    assert part.n_sample == 300 and np.all(np.diff(part.rows) > 0)
    assert part.ci_low < part.recall < part.ci_high and part.ci_low <= 0.85 <= part.ci_high
    np.testing.assert_array_equal(part.per_query, res.per_query[part.rows])
    # a perfect sample still has an interval below 1
    perfect = ann.knn_recall(X, exact, sample=300)
    assert perfect.recall == 1.0 and 0.98 < perfect.ci_low < 1.0

    # k: compare the first k columns only
    wide = nb.knn_indices(X, k=15)
    assert ann.knn_recall(X, wide, k=10).recall == 1.0
    with pytest.raises(InputError, match="exceeds"):
        ann.knn_recall(X, exact, k=11)
    with pytest.raises(InputError, match="row counts differ"):
        ann.knn_recall(X, exact[:-1])


# --------------------------------------------------------------------------- approximate search


def _check_valid(I, n, k, groups=None):
    assert I.shape == (n, k) and I.dtype == np.int64
    assert ((I >= 0) & (I < n)).all()
    assert (I != np.arange(n)[:, None]).all()  # never the query itself
    srt = np.sort(I, axis=1)
    assert (srt[:, 1:] != srt[:, :-1]).all()  # no repeats
    if groups is not None:
        assert (groups[I] != groups[:, None]).all()


def test_ivf_recall_determinism_and_groups(big):
    X, groups = big["X"], big["groups"]
    n = len(X)
    I, sim = ann.approximate_knn_indices(X, k=10, method="ivf", return_similarity=True)
    _check_valid(I, n, 10)
    assert _recall(I, big["exact"]) >= 0.9
    assert (np.diff(sim, axis=1) <= 0).all()  # closest first
    np.testing.assert_array_equal(I, ann.approximate_knn_indices(X, k=10, method="ivf"))
    G = ann.approximate_knn_indices(X, k=10, method="ivf", exclude_groups=groups)
    _check_valid(G, n, 10, groups)
    assert _recall(G, big["exact_groups"]) >= 0.9


def test_hnsw_recall_and_groups(big):
    X, groups = big["X"], big["groups"]
    n = len(X)
    I = ann.approximate_knn_indices(X, k=10, method="hnsw")
    _check_valid(I, n, 10)
    assert _recall(I, big["exact"]) >= 0.9
    G = ann.approximate_knn_indices(X, k=10, method="hnsw", exclude_groups=groups)
    _check_valid(G, n, 10, groups)
    assert _recall(G, big["exact_groups"]) >= 0.9


def test_hnswsq_reranks_its_pool_exactly_and_finds_the_neighbours(big):
    X, groups = big["X"], big["groups"]
    n = len(X)
    threads = faiss.omp_get_max_threads()
    I, sim = ann.approximate_knn_indices(X, k=10, method="hnswsq", return_similarity=True)
    assert faiss.omp_get_max_threads() == threads  # the one-thread build gives the threads back
    _check_valid(I, n, 10)
    assert _recall(I, big["exact"]) >= 0.95
    # the 8-bit codes only pick candidates: the scores are the exact cosines, closest first
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
    np.testing.assert_allclose(sim, np.einsum("ikj,ij->ik", Xn[I], Xn), atol=1e-5)
    assert (np.diff(sim, axis=1) <= 0).all()
    # a seeded graph is built on one thread: the same neighbours on every call
    np.testing.assert_array_equal(I, ann.approximate_knn_indices(X, k=10, method="hnswsq"))
    G = ann.approximate_knn_indices(X, k=10, method="hnswsq", exclude_groups=groups)
    _check_valid(G, n, 10, groups)
    assert _recall(G, big["exact_groups"]) >= 0.95
    # a pool as large as the data re-ranks every row: nothing is approximate
    small = X[:300]
    full = ann.approximate_knn_indices(small, k=10, method="hnswsq", ef_search=300)
    np.testing.assert_array_equal(full, nb.knn_indices(small, k=10))


def test_index_memory_is_reported_and_the_codes_are_a_quarter_of_the_rows(big):
    X = big["X"]
    n, d = X.shape
    _, sq = ann.knn_search(X, k=10, index="hnswsq", recall_sample=500, target_recall=None)
    _, flat = ann.knn_search(X, k=10, index="hnsw", recall_sample=500, target_recall=None)
    _, pq = ann.knn_search(X, k=10, index="ivfpq", recall_sample=500, target_recall=None)
    links = flat["params"]["index_mb"] - n * d * 4 / 2**20  # the same graph degree: the same links
    assert links > 0 and flat["params"]["index_mb"] > sq["params"]["index_mb"]
    assert sq["params"]["index_mb"] == pytest.approx(n * d / 2**20 + links, rel=0.05)
    p = pq["params"]
    assert p["index_mb"] == pytest.approx((n * (p["pq_m"] + 8) + (p["nlist"] + 256) * d * 4) / 2**20, rel=1e-3)


def test_search_rows_drop_the_query_its_group_and_unfilled_slots():
    """A candidate is the query itself, one of its group, or a slot faiss could not fill (id -1, which
    indexes row 0 when groups are looked up): none may be returned, and a row short of k says so."""

    class Fixed:  # an IVF "index" that returns the same candidates, closest first, for every query
        def search(self, Q, fetch):
            ids = np.array([[2, 3, -1, 0, 4]] * len(Q), dtype=np.int64)[:, :fetch]
            scores = np.array([[1.0, 0.9, -3.4e38, 0.5, 0.4]] * len(Q), dtype=np.float32)[:, :fetch]
            return scores, ids

    X = np.eye(6, dtype=np.float32)
    qids = np.array([2])
    groups = np.array([0, 0, 1, 1, 2, 2])  # row 2's group holds row 3; row 0 is in another group
    ids, scores, done = ann._search_rows(Fixed(), X, qids, k=2, fetch=5, metric="ip", gcodes=groups, method="ivf")
    assert ids.tolist() == [[0, 4]] and scores.tolist() == [[0.5, pytest.approx(0.4)]] and done.tolist() == [True]
    assert scores.dtype == np.float32
    # two candidates are left for k=3: the empty slot stays empty, though row 0's group is not the query's
    ids, scores, done = ann._search_rows(Fixed(), X, qids, k=3, fetch=5, metric="ip", gcodes=groups, method="ivf")
    assert ids[0, :2].tolist() == [0, 4] and scores[0, 2] == -np.inf and done.tolist() == [False]
    # without groups, three candidates are short of k=4: the row is not done and its last slot is empty
    ids, scores, done = ann._search_rows(Fixed(), X, qids, k=4, fetch=5, metric="ip", gcodes=None, method="ivf")
    assert ids[0, :3].tolist() == [3, 0, 4] and done.tolist() == [False]
    assert scores[0, 3] == -np.inf and scores.dtype == np.float32


def test_each_index_is_built_for_its_metric_and_holds_every_row(monkeypatch):
    seeds = []
    add_graph_rows = ann._add_graph_rows
    monkeypatch.setattr(ann, "_add_graph_rows", lambda faiss, index, X, seed: seeds.append(seed)
                        or add_graph_rows(faiss, index, X, seed))
    X = _rng(21).normal(size=(PQ_ROWS, 8)).astype(np.float32)
    for method in ("hnsw", "hnswsq", "ivf", "ivfpq"):
        rows = X if method == "ivfpq" else X[:600]
        for metric, faiss_metric in (("ip", faiss.METRIC_INNER_PRODUCT), ("euclidean", faiss.METRIC_L2)):
            index, quantizer = ann._build_approx_index(rows, metric, method, nlist=4, hnsw_m=8, seed=3)
            assert (index.metric_type, index.ntotal, index.is_trained) == (faiss_metric, len(rows), True)
            if method.startswith("ivf"):  # the list centroids are found by the same metric
                assert (quantizer.metric_type, quantizer.ntotal, index.nlist) == (faiss_metric, 4, 4)
                # k-means seeds drawn from the caller's seed: the product quantizer's first, then the lists'
                draws = np.random.default_rng(3).integers(2**31 - 1, size=2).tolist()
                seeds_set = [index.pq.cp.seed, index.cp.seed] if method == "ivfpq" else [index.cp.seed]
                assert seeds_set == draws[: len(seeds_set)]
            else:
                assert quantizer is None and index.hnsw.nb_neighbors(0) == 2 * 8  # the base layer's 2M links
    assert seeds == [3, 3, 3, 3]  # each graph is built with the seed, so on one thread


def test_quantizers_train_on_a_seeded_sorted_sample_when_the_rows_are_many(monkeypatch):
    trained = []
    for cls in (faiss.IndexHNSWSQ, faiss.IndexIVFFlat):
        monkeypatch.setattr(cls, "train", lambda self, x, _train=cls.train: trained.append(x.copy()) or _train(self, x))
    X = _rng(22).normal(size=(600, 8)).astype(np.float32)
    for rows, sq_rows, ivf_rows in ((600, 100, 150), (90, 100, 150)):  # sampled; all 90 rows in their order
        monkeypatch.setattr(ann, "_SQ_TRAIN_ROWS", sq_rows)
        monkeypatch.setattr(ann, "_IVF_TRAIN_ROWS", ivf_rows)
        trained.clear()
        ann._build_approx_index(X[:rows], "ip", "hnswsq", nlist=4, hnsw_m=8, seed=5)
        index, _ = ann._build_approx_index(X[:rows], "ip", "ivf", nlist=4, hnsw_m=8, seed=5)
        rng = np.random.default_rng(5)
        sample = X[np.sort(rng.choice(600, size=100, replace=False))] if rows == 600 else X[:90]
        np.testing.assert_array_equal(trained[0], sample)
        rng = np.random.default_rng(5)
        assert index.cp.seed == int(rng.integers(2**31 - 1))  # k-means' seed first, then the sample
        # the larger of 40 rows per list (160) and the floor (150), from the same generator
        sample = X[np.sort(rng.choice(600, size=160, replace=False))] if rows == 600 else X[:90]
        np.testing.assert_array_equal(trained[1], sample)


def test_tuning_measures_recall_against_the_exact_neighbours_outside_the_querys_patient():
    # patients of four nearby images, rows of unequal norms, Euclidean distance, k=5, one probed list of 8
    rng = _rng(23)
    centres = rng.normal(size=(100, 8)) * 3
    X = (np.repeat(centres, 4, axis=0) + rng.normal(size=(400, 8)) * 0.3).astype(np.float32)
    groups = np.repeat(np.arange(100), 4)
    index, quantizer = ann._build_approx_index(X, "euclidean", "ivf", nlist=8, hnsw_m=8, seed=0)
    rows = np.arange(0, 400, 7)
    depth, trials, met = ann._tune_depth(
        index, quantizer, X, rows, k=5, kk=9, metric="euclidean", gcodes=groups, method="ivf",
        depth={"nprobe": 1}, target=0.0, max_probe=8, deadline=time.perf_counter() + 600)
    index.nprobe = 1
    found = ann._search_rows(index, X, rows, k=5, fetch=9, metric="euclidean", gcodes=groups, method="ivf")[0]

    def recall(exact):
        return float(nb._intersections(found, exact).mean() / 5)

    exact = nb.knn_indices(X, k=5, metric="euclidean", exclude_groups=groups, queries=rows)
    expected = recall(exact)
    low = ann._recall_interval(expected, len(rows), 400)[0]
    assert (depth, met) == ({"nprobe": 1}, True)
    assert trials == [{"nprobe": 1, "recall": round(expected, 4), "ci_low": round(low, 4)}]
    # towards 0.9 the search deepens to the fewest lists whose neighbours' lower bound reaches it
    ranks = ann._cell_ranks(quantizer, X, rows, exact, 8)
    _, trials, _ = ann._tune_depth(
        index, quantizer, X, rows, k=5, kk=9, metric="euclidean", gcodes=groups, method="ivf",
        depth={"nprobe": 1}, target=0.9, max_probe=8, deadline=time.perf_counter() + 600)
    lows = [ann._recall_interval(np.searchsorted(ranks, p) / ranks.size, len(rows), 400)[0] for p in range(2, 9)]
    uppers = [ann._recall_interval(np.searchsorted(ranks, p) / ranks.size, len(rows), 400)[1] for p in range(2, 9)]
    assert trials[1]["nprobe"] == 2 + next(i for i, low in enumerate(lows) if low >= 0.9)
    assert trials[1]["nprobe"] != 2 + next(i for i, up in enumerate(uppers) if up >= 0.9)  # not the upper bound
    # the reference matters: without the groups, at k=10, or by cosine, the recall would read otherwise
    assert expected < 1 and expected not in (
        recall(nb.knn_indices(X, k=5, metric="euclidean", queries=rows)),
        float(nb._intersections(found, nb.knn_indices(X, k=10, metric="euclidean", exclude_groups=groups,
                                                      queries=rows)).mean() / 5),
        recall(nb.knn_indices(X, k=5, metric="cosine", exclude_groups=groups, queries=rows)))


def test_tuning_takes_a_reachable_bound_equal_to_the_target_as_reached(monkeypatch):
    def bound(ranks, probe, queries, n):
        return ann._recall_interval(np.searchsorted(ranks, probe) / ranks.size, queries, n)[0]

    # IVF: the target is exactly the bound that some number of lists reaches; the search goes there
    rng = _rng(23)
    X = (np.repeat(rng.normal(size=(100, 8)) * 3, 4, axis=0) + rng.normal(size=(400, 8)) * 0.3).astype(np.float32)
    index, quantizer = ann._build_approx_index(X, "euclidean", "ivf", nlist=8, hnsw_m=8, seed=0)
    rows = np.arange(0, 400, 7)
    ranks = ann._cell_ranks(quantizer, X, rows, nb.knn_indices(X, k=5, metric="euclidean", queries=rows), 8)
    lows = {p: bound(ranks, p, len(rows), 400) for p in range(1, 9)}
    probe = next(p for p in range(2, 9) if lows[p] > lows[p - 1])
    _, trials, _ = ann._tune_depth(
        index, quantizer, X, rows, k=5, kk=6, metric="euclidean", gcodes=None, method="ivf",
        depth={"nprobe": probe - 1}, target=lows[probe], max_probe=min(probe + 1, 8),
        deadline=time.perf_counter() + 600)
    assert trials[0]["ci_low"] < lows[probe] and trials[1]["nprobe"] == probe  # the next list, not one beyond
    # IVF-PQ: the probed lists already hold as many neighbours as the target asks, so the codes lost
    # them: the search re-ranks more candidates of the same lists
    X = _rng(8).normal(size=(PQ_ROWS, 16)).astype(np.float32)
    index, quantizer = ann._build_approx_index(X, "ip", "ivfpq", nlist=16, hnsw_m=8, seed=0)
    rows = np.arange(0, PQ_ROWS, 50)
    ranks = ann._cell_ranks(quantizer, X, rows, nb.knn_indices(X, k=5, metric="ip", queries=rows), 16)
    target = bound(ranks, 4, len(rows), PQ_ROWS)

    def second_trial(refine):
        _, trials, _ = ann._tune_depth(
            index, quantizer, X, rows, k=5, kk=6, metric="ip", gcodes=None, method="ivfpq",
            depth={"nprobe": 4, "refine_factor": refine}, target=target, max_probe=16,
            deadline=time.perf_counter() + 60)  # a search that never deepens stops there
        assert trials[0]["ci_low"] < target
        return trials[1]["nprobe"], trials[1]["refine_factor"]

    assert second_trial(1) == (4, 2)
    # at the most re-ranking allowed, it probes the next list instead (never fewer lists, nor more re-ranking)
    monkeypatch.setattr(ann, "_MAX_REFINE", 2)
    assert second_trial(2) == (5, 2)


class _RecordingGraph:
    """A stand-in HNSW index over brute-force Euclidean search that records each search's
    (efSearch, candidates asked); ``farthest`` returns the worst candidates instead (recall 0)."""

    def __init__(self, X, farthest=False):
        self.X, self.farthest, self.asked = X, farthest, []
        self.hnsw = type("Hnsw", (), {"efSearch": 0})()

    def search(self, Q, n):
        self.asked.append((self.hnsw.efSearch, n))
        D = ((Q[:, None, :] - self.X[None, :, :]) ** 2).sum(axis=-1)
        order = np.argsort(-D if self.farthest else D, axis=1, kind="stable")[:, :n]
        return np.take_along_axis(D, order, axis=1), order


def test_graph_tuning_reranks_its_whole_pool_and_doubles_ef_up_to_the_cap():
    X = _rng(5).normal(size=(120, 6)).astype(np.float32)
    rows = np.arange(0, 120, 3)

    def tune(method, ef, target, farthest=False):
        index = _RecordingGraph(X, farthest)
        result = ann._tune_depth(index, None, X, rows, k=5, kk=6, metric="euclidean", gcodes=None, method=method,
                                 depth={"ef_search": ef}, target=target, max_probe=0,
                                 deadline=time.perf_counter() + 600)
        return (*result, sorted(set(index.asked)))

    # HNSW-SQ re-ranks its whole search pool (ef candidates), not only the kk its codes rank first
    depth, trials, met, asked = tune("hnswsq", 40, 0.0)
    assert (depth, met, asked) == ({"ef_search": 40}, True, [(40, 40)])
    assert trials[0]["recall"] == 1.0
    # a target equal to the lower bound of the recall reached is met: the search stops there
    low = ann._recall_interval(1.0, len(rows), 120)[0]
    depth, trials, met, asked = tune("hnsw", 16, low)
    assert (depth, met, asked, trials[0]["ci_low"]) == ({"ef_search": 16}, True, [(16, 6)], round(low, 4))
    # a plain graph asks for kk; a search that never finds the neighbours doubles ef up to the cap, unmet
    depth, trials, met, asked = tune("hnsw", ann._MAX_EF // 4, 0.5, farthest=True)
    assert (depth, met) == ({"ef_search": ann._MAX_EF}, False)
    assert [trial["ef_search"] for trial in trials] == [ann._MAX_EF // 4, ann._MAX_EF // 2, ann._MAX_EF]
    assert asked == [(ann._MAX_EF // 4, 6), (ann._MAX_EF // 2, 6), (ann._MAX_EF, 6)]
    assert {trial["recall"] for trial in trials} == {0.0}


def test_graph_rows_are_added_in_blocks_on_one_thread_when_seeded():
    """Threads insert rows concurrently, so only a one-thread build gives a seed's graph every time."""

    class Recording:
        def __init__(self):
            self.calls = []

        def add(self, block):
            self.calls.append((block.shape, block.flags["C_CONTIGUOUS"], faiss.omp_get_max_threads()))

    X = np.zeros((ann._ADD_BLOCK + 10, 4), dtype=np.float32)[:, ::2]  # a strided view: copied per block
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        for seed, used in ((0, 1), (None, 2)):
            index = Recording()
            ann._add_graph_rows(faiss, index, X, seed)
            assert index.calls == [((ann._ADD_BLOCK, 2), True, used), ((10, 2), True, used)]
            assert faiss.omp_get_max_threads() == 2  # given back
    finally:
        faiss.omp_set_num_threads(threads)


def test_cell_ranks_are_where_each_neighbours_cell_comes_in_its_querys_probe_order():
    """The tuning's bound on what probing p cells can find: for every query and exact neighbour, the
    position of the neighbour's cell among the query's cells (closest first), max_probe when farther."""
    rng = _rng(15)
    X = rng.normal(size=(700, 8)).astype(np.float32)
    centroids = rng.normal(size=(40, 8)).astype(np.float32)
    quantizer = faiss.IndexFlatIP(8)
    quantizer.add(centroids)
    rows = np.arange(0, 700, 2)  # 350 queries: more than one block of 256, the first row included
    exact = nb.knn_indices(X, k=5, metric="ip", queries=rows)
    order = np.argsort(-(X[rows] @ centroids.T), axis=1)
    home = np.argmax(X @ centroids.T, axis=1)
    expected = [list(order[i]).index(home[j]) for i in range(len(rows)) for j in exact[i]]
    expected = np.sort(np.minimum(expected, 10))
    ranks = ann._cell_ranks(quantizer, X, rows, exact, 10)
    assert ranks.dtype == np.int64 and (expected == 10).any() and (expected == 0).any()
    np.testing.assert_array_equal(ranks, expected)


@pytest.mark.parametrize("method", ["hnsw", "hnswsq", "ivf", "ivfpq"])
def test_index_memory_is_that_of_the_serialised_index(method):
    # faiss writes each index's arrays (rows or codes, ids, centroids, codebook, links) as they are held
    X = _rng(4).normal(size=(PQ_ROWS if method == "ivfpq" else 3000, 16)).astype(np.float32)
    index, _ = ann._build_approx_index(X, "ip", method, nlist=32, hnsw_m=32, seed=0)
    # the serialised index is larger by its headers alone (218 to 436 bytes here), not by a row's worth
    headers = faiss.serialize_index(index).nbytes - ann._index_mb(index, method, *X.shape) * 2**20
    assert 0 < headers < 512


def test_ivfpq_reranks_exactly_and_finds_the_neighbours(big):
    X, groups = big["X"], big["groups"]
    n = len(X)
    I, sim = ann.approximate_knn_indices(X, k=10, method="ivfpq", return_similarity=True)
    _check_valid(I, n, 10)
    # these overlapping clusters are hard for 8-byte codes: more re-ranking helps
    assert _recall(I, big["exact"]) >= 0.85
    assert _recall(ann.approximate_knn_indices(X, k=10, method="ivfpq", refine_factor=16), big["exact"]) >= 0.9
    # the codes only pick candidates: the scores returned are the exact cosines
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
    np.testing.assert_allclose(sim, np.einsum("ikj,ij->ik", Xn[I], Xn), atol=1e-5)
    assert (np.diff(sim, axis=1) <= 0).all()
    np.testing.assert_array_equal(I, ann.approximate_knn_indices(X, k=10, method="ivfpq"))
    G = ann.approximate_knn_indices(X, k=10, method="ivfpq", exclude_groups=groups)
    _check_valid(G, n, 10, groups)
    assert _recall(G, big["exact_groups"]) >= 0.85
    # with every list probed and every row a candidate, nothing is approximate
    small = X[:PQ_ROWS]
    full = ann.approximate_knn_indices(small, k=10, method="ivfpq", nlist=16, nprobe=16, refine_factor=PQ_ROWS)
    np.testing.assert_array_equal(full, nb.knn_indices(small, k=10))


PQ_ROWS = ann.PQ_MIN_ROWS


def test_ivfpq_euclidean_and_too_few_rows():
    X = _clustered(PQ_ROWS, d=32, n_centres=500, spread=0.5, seed=12)  # ~20 per cluster, as in images
    I, dist = ann.approximate_knn_indices(X, k=10, metric="euclidean", method="ivfpq", return_similarity=True)
    _check_valid(I, len(X), 10)
    np.testing.assert_allclose(dist, np.linalg.norm(X[I] - X[:, None, :], axis=2), rtol=1e-4)
    assert _recall(I, nb.knn_indices(X, k=10, metric="euclidean")) >= 0.98
    with pytest.raises(InputError, match="at least 9,984 images"):
        ann.approximate_knn_indices(X[:-1], method="ivfpq")
    with pytest.raises(InputError, match="refine_factor"):
        ann.approximate_knn_indices(X, method="ivfpq", refine_factor=0)


@pytest.mark.parametrize(("d", "m"), [(512, 64), (768, 96), (64, 8), (100, 20), (7, 1), (24, 3), (72, 9), (13, 13)])
def test_pq_subquantizers_divide_the_dimension(d, m):
    assert ann._pq_subquantizers(d) == m and d % m == 0


@pytest.mark.parametrize(("n", "lists", "probes"), [
    (20_000, 512, 32),          # 4 sqrt(N) = 566 lists, but at most N // 39 = 512; 512 // 16 probes
    (100_000, 1265, 64),        # 4 sqrt(N); 1265 // 16 = 79 probes, capped at 64
    (1_000_000, 4000, 64),
    (5_000, 128, 16),           # N // 39; 128 // 16 = 8, at least 16
    (2_000, 51, 16),
    (700, 17, 16),              # 4 sqrt(N) = 106, N // 39 = 17
    (100, 2, 2),                # at most N // 39 lists, and never more probes than lists
    (30, 1, 1),                 # N // 39 = 0: one list
    (10**10, 65536, 64),        # 4 sqrt(N) = 400,000, at most 65,536 lists
])
def test_ivf_lists_and_probes_follow_the_documented_rule(n, lists, probes):
    assert ann._ivf_params(n, None, None) == (lists, probes)


def test_ivf_lists_and_probes_given_are_kept_and_checked():
    assert ann._ivf_params(1000, 40, 7) == (40, 7)
    assert ann._ivf_params(1000, 1000, None) == (1000, 62)  # as many lists as rows is allowed
    assert ann._ivf_params(1000, 5, 10) == (5, 5)  # never more probes than lists
    assert ann._ivf_params(1000, None, 3) == (25, 3)
    assert ann._ivf_params(10_000, np.int64(300), np.int32(20)) == (300, 20)
    assert error_message(ann._ivf_params, 1000, 1001, None) == (
        "nlist=1001 must not exceed the number of images N=1000")
    assert error_message(ann._ivf_params, 1000, 0, None) == "nlist must be a positive integer, got 0"
    assert error_message(ann._ivf_params, 1000, None, 2.5) == "nprobe must be a positive integer, got 2.5"


def test_candidates_fetched_and_queries_per_batch():
    # IVF-PQ fetches refine x the candidates, HNSW-SQ its whole pool, the others k + 1; never more than N
    assert ann._fetch_count("ivfpq", 11, 8, 10_000, 64) == 88
    assert ann._fetch_count("ivfpq", 11, 8, 50, 0) == 50
    assert ann._fetch_count("hnswsq", 11, 8, 10_000, 64) == 64
    assert ann._fetch_count("hnswsq", 11, 8, 10_000, 5) == 11
    assert ann._fetch_count("hnswsq", 11, 8, 40, 64) == 40
    assert ann._fetch_count("ivf", 11, 8, 10_000, 64) == 11
    assert ann._fetch_count("hnsw", 11, 8, 10_000, 64) == 11
    # a batch's ids and scores (12 bytes a candidate) stay within the search budget, up to faiss' batch
    from crslib.neighbors import _FAISS_QUERY_BATCH, _SEARCH_BUDGET
    assert ann._query_step(11) == _FAISS_QUERY_BATCH and type(ann._query_step(10_000)) is int
    assert ann._query_step(10_000) == _SEARCH_BUDGET // 120_000 == 2236
    assert ann._query_step(_SEARCH_BUDGET) == 1  # one query at a time, never none
    assert ann._on_prepared("cosine") == "ip"
    assert ann._on_prepared("euclidean") == "euclidean" and ann._on_prepared("ip") == "ip"


def test_search_options_are_refused_with_their_whole_message():
    def check(**options):
        settings = {"index": "ivf", "threshold": 10, "recall_sample": 5, **options}
        return error_message(ann._check_search_options, settings.pop("index"), settings.pop("threshold"),
                             settings.pop("recall_sample"), **settings)

    assert check(index="lsh") == (
        "index must be one of ('auto', 'exact', 'ivf', 'ivfpq', 'hnsw', 'hnswsq'), got 'lsh'")
    for bad in (-1, 2.0, True, "10"):
        assert check(threshold=bad) == f"threshold must be a non-negative integer (images), got {bad!r}"
    assert check(recall_sample=0) == "recall_sample must be a positive integer, got 0"
    assert check(nprobe=0) == "nprobe must be a positive integer or None, got 0"
    for bad in (0, 1.01, -0.5, "0.9", True, None):
        assert check(max_probe_share=bad) == f"max_probe_share must be a number in (0, 1], got {bad!r}"
    assert check(target_recall=0.0) == "target_recall must be a number in (0, 1], got 0.0"
    for bad in (0, -1.0, "60", False):
        assert check(tune_seconds=bad) == f"tune_seconds must be a positive number of seconds, got {bad!r}"
    # the bounds themselves and numpy numbers pass
    for good in ({"threshold": 0}, {"threshold": np.int64(3)}, {"max_probe_share": 1}, {"target_recall": 1.0},
                 {"target_recall": None}, {"max_probe_share": np.float32(0.5)}, {"tune_seconds": 1e-9},
                 {"tune_seconds": np.int64(2)}, {"nprobe": None}, {"index": "exact"}, {"index": "auto"}):
        settings = {"index": "ivf", "threshold": 10, "recall_sample": 5, **good}
        assert ann._check_search_options(settings.pop("index"), settings.pop("threshold"),
                                         settings.pop("recall_sample"), **settings) is None
    assert ann._check_share(np.float64(0.25), "x") == 0.25 and type(ann._check_share(1, "x")) is float
    assert ann._check_share(None, "x", allow_none=True) is None


@pytest.mark.parametrize("metric", ["euclidean", "ip"])
def test_approximate_other_metrics_and_whole_cluster_groups(metric):
    # The group is the cluster: every near candidate is excluded, so the
    # search must widen (candidates and probes) well beyond the first round.
    rng = _rng(6)
    labels = rng.integers(0, 30, 3000)
    X = 3 * rng.normal(size=(30, 16))[labels] + rng.normal(size=(3000, 16))
    for method in ("ivf", "hnsw"):
        I, dist = ann.approximate_knn_indices(
            X, k=10, metric=metric, exclude_groups=labels, method=method, return_similarity=True
        )
        _check_valid(I, 3000, 10, labels)
        assert I.dtype == np.int64 and dist.dtype == np.float32  # as documented, whatever the metric
        if metric == "euclidean":
            assert (np.diff(dist, axis=1) >= 0).all()
        E = nb.knn_indices(X, k=10, metric=metric, exclude_groups=labels)
        assert _recall(I, E) >= 0.8


def test_hnsw_short_rows_fall_back_to_exact(monkeypatch):
    """A graph walk that finds too few valid neighbours ends in the exact search, not short rows."""

    class Blind:  # an "index" that never finds anything
        class hnsw:
            efSearch = 0

        def search(self, Q, kk):
            return np.full((len(Q), kk), -np.inf, np.float32), np.full((len(Q), kk), -1, np.int64)

    monkeypatch.setattr(ann, "_build_approx_index", lambda *a, **kw: (Blind(), None))
    monkeypatch.setattr(ann, "_index_mb", lambda *a: 0.0)  # Blind has no graph to measure
    X = _rng(7).normal(size=(200, 8))
    I, info = ann.knn_search(X, k=5, index="hnsw")
    np.testing.assert_array_equal(I, nb.knn_indices(X, k=5))
    assert info["params"]["exact_fallback_rows"] == 200 and info["recall"] == 1.0


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_only_the_rows_a_graph_walk_left_short_get_exact_neighbours(monkeypatch, caplog, metric):
    """An "index" that finds the true neighbours of half the queries and nothing for the others: the
    search widens its candidates fourfold until it has asked for every row, then gives those others
    (and only those) their exact neighbours and scores, outside their group, and says how many."""
    from types import SimpleNamespace

    X = _rng(16).normal(size=(200, 8)) * _rng(17).uniform(0.5, 2.0, size=(200, 1))
    groups = np.arange(200) // 3
    prepared = ann._prepare(X, metric)[0]
    flat = faiss.IndexFlatL2(8) if metric == "euclidean" else faiss.IndexFlatIP(8)
    flat.add(prepared)
    blind = prepared[:, 0] < 0

    class HalfBlind:
        hnsw = SimpleNamespace(efSearch=0)

        def search(self, Q, kk):
            D, ids = flat.search(Q, kk)
            missing = Q[:, 0] < 0
            D[missing], ids[missing] = np.inf if metric == "euclidean" else -np.inf, -1
            return D, ids

    monkeypatch.setattr(ann, "_build_approx_index", lambda *a, **kw: (HalfBlind(), None))
    monkeypatch.setattr(ann, "_index_mb", lambda *a: 0.0)  # HalfBlind has no graph to measure
    with caplog.at_level("DEBUG", logger="crslib.ann"):
        ids, scores = ann.approximate_knn_indices(X, k=5, metric=metric, exclude_groups=groups, method="hnsw",
                                                  return_similarity=True)
    exact, exact_scores = nb.knn_indices(X, k=5, metric=metric, exclude_groups=groups, return_similarity=True)
    np.testing.assert_array_equal(ids, exact)
    np.testing.assert_allclose(scores, exact_scores, rtol=1e-5, atol=1e-5)
    # candidates: k, the query, a margin of 3 and the 2 other images of its group; then 4x, up to all 200
    assert [r.getMessage() for r in caplog.records] == [
        *(f"widening approximate kNN search for {blind.sum()} queries from {kk} candidates" for kk in (11, 44, 176)),
        f"approximate kNN: {blind.sum()} rows fell back to the exact search"]
    assert 50 < blind.sum() < 150
    _, info = ann.knn_search(X, k=5, metric=metric, exclude_groups=groups, index="hnsw", target_recall=None)
    assert info["params"]["exact_fallback_rows"] == blind.sum()


def test_an_ivf_query_short_of_candidates_probes_four_times_the_cells(monkeypatch):
    """Whole clusters excluded as groups: a query's own cell holds no valid candidate, so it is searched
    again with four times the candidates and the cells, up to every cell."""
    rng = _rng(18)
    labels = np.repeat(np.arange(20), 30)
    X = 4 * rng.normal(size=(20, 8))[labels] + rng.normal(size=(600, 8))
    depths = []
    set_depth = ann._set_depth
    monkeypatch.setattr(ann, "_set_depth", lambda index, method, probe, ef, kk: (depths.append((probe, kk)),
                                                                                set_depth(index, method, probe, ef, kk)))
    ids = ann.approximate_knn_indices(X, k=5, exclude_groups=labels, method="ivf", nlist=15, nprobe=1)
    _check_valid(ids, 600, 5, labels)
    # k, the query, a margin of 3 and 12 more for the group (capped at four margins); then fourfold
    assert depths[:2] == [(1, 21), (4, 84)]
    assert all(later == (min(15, 4 * probe), min(600, 4 * kk)) for (probe, kk), later in zip(depths, depths[1:]))
    # 100 neighbours outside a group of 20 among 400 rows: every row is asked for in the second round, but the
    # 4 cells probed do not hold 100 valid ones yet; the cells keep widening rather than leaving it to exact search
    depths.clear()
    rng = _rng(18)
    labels = np.repeat(np.arange(20), 20)
    X = 4 * rng.normal(size=(20, 8))[labels] + rng.normal(size=(400, 8))
    ids = ann.approximate_knn_indices(X, k=100, exclude_groups=labels, method="ivf", nlist=40, nprobe=1)
    _check_valid(ids, 400, 100, labels)
    assert depths == [(1, 100 + 1 + 25 + 19), (4, 400), (16, 400)]


def test_approximate_knn_indices_passes_its_documented_defaults_to_the_search(monkeypatch):
    """k=10, cosine, IVF with its own nlist and nprobe, a graph degree of 32, IVF-PQ re-ranking 8x the
    candidates, seed 0; the raw options reach the search as given."""
    calls = []
    search = ann._approximate_knn

    def recording(Xw, **options):
        calls.append(options)
        return search(Xw, **options)

    monkeypatch.setattr(ann, "_approximate_knn", recording)
    X = _rng(20).normal(size=(400, 8))
    ids = ann.approximate_knn_indices(X)
    assert isinstance(ids, np.ndarray) and ids.shape == (400, 10)
    assert calls[-1] == {"k": 10, "metric": "cosine", "gcodes": None, "method": "ivf", "nlist": None, "nprobe": None,
                         "hnsw_m": 32, "ef_search": None, "seed": 0, "refine_factor": 8}
    groups = np.arange(400) // 4
    ann.approximate_knn_indices(X, k=3, metric="euclidean", exclude_groups=groups, method="hnsw", nlist=5, nprobe=2,
                                hnsw_m=8, ef_search=20, refine_factor=4, random_state=3)
    options = calls[-1]
    np.testing.assert_array_equal(options.pop("gcodes"), groups)  # groups 0..99 are their own codes
    assert options == {"k": 3, "metric": "euclidean", "method": "hnsw", "nlist": 5, "nprobe": 2, "hnsw_m": 8,
                       "ef_search": 20, "seed": 3, "refine_factor": 4}


def test_approximate_bad_input(monkeypatch):
    X = _rng(8).normal(size=(100, 4))
    expected = {
        (("method", "lsh"),): "method must be one of ('ivf', 'ivfpq', 'hnsw', 'hnswsq'), got 'lsh'",
        (("nprobe", 0),): "nprobe must be a positive integer, got 0",
        (("nlist", 0),): "nlist must be a positive integer, got 0",
        (("nlist", 500),): "nlist=500 must not exceed the number of images N=100",
        (("hnsw_m", 0),): "hnsw_m must be a positive integer, got 0",
        (("ef_search", 0),): "ef_search must be a positive integer or None, got 0",
        (("refine_factor", 0),): "refine_factor must be a positive integer, got 0",
        (("k", 100),): ("k=100 must be smaller than the number of images N=100 (each image has at most N-1=99 "
                        "neighbours); lower k or add images"),
        (("method", "ivfpq"),): ("index 'ivfpq' needs at least 9,984 images to train its product quantizer "
                                 "(39 per code), got 100; use 'ivf' or 'exact'"),
    }
    for options, message in expected.items():
        assert error_message(ann.approximate_knn_indices, X, **dict(options)) == message
    monkeypatch.setattr(ann, "_import_faiss", lambda: None)  # as without the faiss-cpu package
    for method in ("ivf", "hnsw"):
        assert error_message(ann.approximate_knn_indices, X, method=method) == (
            "approximate kNN search needs the faiss-cpu package; install it or use index='exact'")


def test_an_explicit_ef_search_sets_the_graph_search_pool():
    """A pool as large as the data finds the exact neighbours; a pool of one candidate misses some."""
    X = _rng(5).normal(size=(600, 128))
    exact = nb.knn_indices(X, k=10)
    for method in ("hnsw", "hnswsq"):
        np.testing.assert_array_equal(ann.approximate_knn_indices(X, k=10, method=method, ef_search=600), exact)
        narrow = ann.approximate_knn_indices(X, k=10, method=method, ef_search=1)
        assert (narrow != exact).any(axis=1).sum() >= 5, method


def test_knn_search_reports_the_parameters_of_each_graph_index():
    X = _rng(4).normal(size=(2000, 16))
    expected = {"hnsw": {"hnsw_m": 32, "ef_search": 64, "exact_fallback_rows": 0},
                "hnswsq": {"hnsw_m": 32, "storage": "sq8", "reranked": True, "ef_search": 32,
                           "exact_fallback_rows": 0}}
    for index, params in expected.items():
        _, info = ann.knn_search(X, k=10, index=index, recall_sample=200, target_recall=None)
        reported = dict(info["params"])
        # the graph's links come on top of the vectors: 4 bytes a value, or 1 as 8-bit codes
        megabytes = reported.pop("index_mb")
        assert megabytes > 2000 * 16 * (4 if index == "hnsw" else 1) / 2**20, index
        assert megabytes == round(megabytes, 3) and 0 < megabytes < 1, index  # under a megabyte, to the kilobyte
        assert reported == params


def test_an_unseeded_search_tunes_its_depth_too():
    """random_state=None draws the tuning rows from fresh entropy instead of failing on the seed."""
    X = _rng(2).normal(size=(2000, 16))
    ids, info = ann.knn_search(X, k=10, index="hnsw", recall_sample=200, random_state=None)
    assert info["params"]["tune_queries"] == 500 and info["params"]["target_met"]
    assert ids.shape == (2000, 10) and bool((ids != np.arange(2000)[:, None]).all())


def test_nprobe_leaves_a_graph_index_to_tune_its_pool():
    """nprobe counts IVF lists: a graph index ignores it and still tunes its candidate pool to the target."""
    X = _rng(2).normal(size=(2000, 16))
    plain, info = ann.knn_search(X, k=10, index="hnsw", recall_sample=200)
    with_nprobe, info_nprobe = ann.knn_search(X, k=10, index="hnsw", recall_sample=200, nprobe=5)
    assert info["params"]["tuning"] == [{"ef_search": 64, "recall": 1.0, "ci_low": 0.9943}]
    assert json.dumps(info_nprobe["params"], sort_keys=True, default=str) == json.dumps(info["params"],
                                                                                    sort_keys=True, default=str)
    np.testing.assert_array_equal(with_nprobe, plain)


# --------------------------------------------------------------------------- overlap error bound


def test_overlap_error_bound_formula():
    assert ann.overlap_error_bound(0.9, 0.8) == pytest.approx(0.3)
    assert ann.overlap_error_bound(1.0, 1) == 0.0
    assert ann.overlap_error_bound(0.2, 0.3) == 1.0  # an overlap cannot move by more than 1
    res = ann.RecallResult(recall=0.95, ci_low=0.93, ci_high=0.97, n_sample=100, k=10,
                          per_query=np.zeros(0), rows=np.zeros(0, int), n=1000)
    assert ann.overlap_error_bound(res, 1.0) == pytest.approx(0.07)  # the conservative lower end
    for bad in (1.5, -0.1, "0.9", True, None):
        with pytest.raises(InputError):
            ann.overlap_error_bound(bad, 1.0)
    assert ann.overlap_error_bound(0.0, 1.0) == 1.0  # a recall of 0 is a recall
    # the message names the argument and the value
    with pytest.raises(InputError, match=r"^recall_b=1.5 must lie in \[0, 1\]$"):
        ann.overlap_error_bound(1.0, 1.5)
    with pytest.raises(InputError, match=r"^recall_a must be a recall in \[0, 1\] or a RecallResult, got '0.9'$"):
        ann.overlap_error_bound("0.9", 1.0)
    with pytest.raises(InputError, match=r"^recall_b must be a recall"):
        ann.overlap_error_bound(1.0, None)


def test_overlap_error_bound_holds_empirically():
    rng = _rng(9)
    Xa = _clustered(5000, d=32, n_centres=50, seed=9)
    Xb = Xa + 1.5 * rng.normal(size=Xa.shape).astype(np.float32)
    k = 10
    Ea, Eb = nb.knn_indices(Xa, k=k), nb.knn_indices(Xb, k=k)
    # a deliberately poor IVF (few probes) so the bound is not trivially 0
    Aa = ann.approximate_knn_indices(Xa, k=k, nlist=64, nprobe=1)
    Ab = ann.approximate_knn_indices(Xb, k=k, nlist=64, nprobe=1)
    ra, rb = ann.knn_recall(Xa, Aa), ann.knn_recall(Xb, Ab)  # all rows: the true recall
    assert ra.recall < 0.98 and rb.recall < 0.98
    exact_ov = ag.overlap_from_indices(Ea, Eb)
    approx_ov = ag.overlap_from_indices(Aa, Ab)
    bound = ann.overlap_error_bound(ra.recall, rb.recall)
    assert abs(approx_ov.mean() - exact_ov.mean()) <= bound
    # and per image: the change is at most (miss_a + miss_b) / k
    assert (np.abs(approx_ov - exact_ov) <= (1 - ra.per_query) + (1 - rb.per_query) + 1e-12).all()
    # one approximate model, one exact
    assert abs(ag.overlap_from_indices(Aa, Eb).mean() - exact_ov.mean()) <= ann.overlap_error_bound(ra, 1.0)


# --------------------------------------------------------------------------- knn_search and agreement_matrix


def test_knn_search_auto_threshold():
    X = _clustered(5000, d=32, n_centres=50, seed=10)
    I, info = ann.knn_search(X, k=10)
    assert info["index"] == "exact" and info["recall"] is None and info["recall_ci"] is None
    assert info["n"] == 5000 and info["k"] == 10 and info["seconds"] >= 0
    np.testing.assert_array_equal(I, nb.knn_indices(X, k=10))

    # target_recall=None: the fixed default depth, the same search as approximate_knn_indices'
    J, info = ann.knn_search(X, k=10, index="ivf", recall_sample=1000, target_recall=None)
    assert info["index"] == "ivf" and info["recall_sample"] == 1000
    assert info["target_recall"] is None and info["target_met"] is None and "tuning" not in info["params"]
    lo, hi = info["recall_ci"]
    assert 0 <= lo <= info["recall"] <= hi <= 1 and lo < hi
    assert info["params"]["nlist"] == 128 and info["params"]["nprobe"] == 16  # 5000 // 39, max(16, 128 // 16)
    np.testing.assert_array_equal(J, ann.approximate_knn_indices(X, k=10))  # same defaults, same seed
    assert info["recall"] == ann.knn_recall(X, J, sample=1000).recall

    # above the threshold "auto" takes the graph over 8-bit codes, re-ranked
    K, info = ann.knn_search(X, k=10, threshold=1000, recall_sample=500, target_recall=None)
    assert info["index"] == "hnswsq" and info["recall"] >= 0.95
    assert info["params"]["storage"] == "sq8" and info["params"]["ef_search"] == 32
    np.testing.assert_array_equal(K, ann.approximate_knn_indices(X, k=10, method="hnswsq"))
    Y = _clustered(PQ_ROWS, d=32, n_centres=500, spread=0.5, seed=10)
    _, info = ann.knn_search(Y, k=10, index="ivfpq", recall_sample=500, target_recall=None)
    assert info["index"] == "ivfpq" and info["recall"] >= 0.9
    assert info["params"]["pq_m"] == 4 and info["params"]["refine_factor"] == 8 and info["params"]["pq_bits"] == 8

    _, info = ann.knn_search(X, k=10, index="hnsw", recall_sample=50_000, target_recall=None)
    assert info["index"] == "hnsw" and info["recall_sample"] == 5000
    assert info["recall_ci"] == [info["recall"], info["recall"]]
    assert info["error_bound"] == pytest.approx(1 - info["recall"])
    # tuned (the default): the recall is measured on the rows the tuning did not use, so it keeps an interval
    _, info = ann.knn_search(X, k=10, index="hnsw", recall_sample=50_000)
    assert info["recall_sample"] == 5000 - info["params"]["tune_queries"] == 3750
    assert info["recall_ci"][0] < info["recall"] <= info["recall_ci"][1]
    assert info["target_recall"] == 0.95 and info["target_met"] is True
    assert info["params"]["tuning"][0]["ef_search"] == 64  # the default pool met the target at once
    with pytest.raises(InputError, match="index must be one of"):
        ann.knn_search(X, index="annoy")
    with pytest.raises(InputError, match="threshold"):
        ann.knn_search(X, threshold=-1)
    with pytest.raises(InputError, match="recall_sample"):
        ann.knn_search(X, index="ivf", recall_sample=0)


def test_knn_search_defaults_are_what_it_documents():
    X = _clustered(3000, d=16, n_centres=30, seed=16)
    ids, info = ann.knn_search(X)
    assert ids.shape == (3000, 10) and info["k"] == 10 and info["index"] == "exact"  # below 200,000 images
    np.testing.assert_array_equal(ids, nb.knn_indices(X, k=10, metric="cosine"))
    assert not np.array_equal(ids, nb.knn_indices(X, k=10, metric="euclidean"))
    groups = np.arange(3000) // 3
    grouped, _ = ann.knn_search(X, exclude_groups=groups)
    np.testing.assert_array_equal(grouped, nb.knn_indices(X, k=10, exclude_groups=groups))
    assert (groups[grouped] != groups[:, None]).all() and not np.array_equal(grouped, ids)
    # the exact search runs on the device asked for: one that cannot be used is refused, not ignored
    assert error_message(ann.knn_search, X, device="tpu") == (
        "device must be one of auto, cpu, cuda, mps (or cuda:N), got 'tpu'")
    # the approximate search's defaults: a seeded, tuned search checked on up to 20,000 queries
    explicit = {"k": 10, "metric": "cosine", "recall_sample": 20_000, "random_state": 0, "target_recall": 0.95,
                "max_probe_share": 0.25, "tune_seconds": 600.0}
    for index in ("ivf", "hnsw"):
        ids, info = ann.knn_search(X, index=index)
        same, same_info = ann.knn_search(X, index=index, **explicit)
        np.testing.assert_array_equal(ids, same)
        assert {**info, "seconds": 0} == {**same_info, "seconds": 0}
        assert info["target_recall"] == 0.95 and info["params"]["tune_queries"] == 750
        if index == "ivf":
            assert info["params"]["max_nprobe"] == 19 and info["params"]["nprobe"] <= 19  # a quarter of 76 lists
    big = _clustered(20_500, d=8, n_centres=50, seed=16)
    _, info = ann.knn_search(big, index="hnsw", target_recall=None)
    assert info["recall_sample"] == 20_000


def test_nprobe_reaches_the_search_and_trades_recall():
    X = _clustered(5000, d=32, n_centres=50, seed=13)
    _, few = ann.knn_search(X, k=10, index="ivf", nprobe=1, recall_sample=1000)
    _, many = ann.knn_search(X, k=10, index="ivf", nprobe=64, recall_sample=1000)
    assert few["params"]["nprobe"] == 1 and many["params"]["nprobe"] == 64
    assert few["recall"] < many["recall"]
    A = ag.agreement_matrix({"a": X, "b": X[:, ::-1].copy()}, k=10, index="ivf", nprobe=2, recall_sample=500)
    assert {s["params"]["nprobe"] for s in A.search.values()} == {2}
    _, exact = ann.knn_search(X, k=10, nprobe=2)  # below the threshold: exact, nprobe unused
    assert exact["index"] == "exact" and exact["params"] is None
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match="nprobe"):
            ag.agreement_matrix({"a": X, "b": X}, index="ivf", nprobe=bad)


def _hard(n=ann.PQ_MIN_ROWS):
    """Clustered data on which the fixed default depth (16 probes) finds about 0.86 of the neighbours."""
    return _clustered(n, d=32, n_centres=500, spread=1.0, seed=3)


def test_target_recall_deepens_the_search_until_met_and_the_bound_holds():
    X = _hard()
    exact = nb.knn_indices(X, k=10)
    fixed, fixed_info = ann.knn_search(X, k=10, index="ivf", recall_sample=1000, target_recall=None)
    assert _recall(fixed, exact) < 0.9  # the default depth alone misses the target
    I, info = ann.knn_search(X, k=10, index="ivf", recall_sample=1000)
    params = info["params"]
    assert info["target_recall"] == 0.95 and info["target_met"] is True
    trials = params["tuning"]
    assert trials[0]["nprobe"] == fixed_info["params"]["nprobe"] == 16 and trials[-1]["nprobe"] == params["nprobe"]
    assert trials[0]["ci_low"] < 0.95 <= trials[-1]["ci_low"] and params["nprobe"] > 16
    assert params["tune_queries"] == 2000 and params["max_nprobe"] == 256 // 4
    # the recall met on the tuning queries holds on all rows, and so does the reported bound
    assert _recall(I, exact) >= 0.95
    assert abs(info["recall"] - _recall(I, exact)) < 0.01
    other = nb.knn_indices(X + _rng(4).normal(scale=0.8, size=X.shape).astype(np.float32), k=10)
    error = abs(ag.overlap_from_indices(I, other).mean() - ag.overlap_from_indices(exact, other).mean())
    assert error <= info["error_bound"] == pytest.approx(1 - info["recall_ci"][0])
    # the probes are the fewest whose cells hold enough neighbours: one fewer would not have been chosen
    assert params["nprobe"] < 2 * 16 * 2


def test_target_recall_reranks_more_when_the_codes_lose_neighbours():
    X = _hard()
    I, info = ann.knn_search(X, k=10, index="ivfpq", recall_sample=1000)
    trials = info["params"]["tuning"]
    assert info["target_met"] is True and _recall(I, nb.knn_indices(X, k=10)) >= 0.95
    # first more cells, then (the cells hold the neighbours, 4-byte codes lose them) a deeper re-ranking
    assert trials[1]["nprobe"] > trials[0]["nprobe"] and trials[1]["refine_factor"] == 8
    assert trials[-1]["refine_factor"] > 8 and trials[-1]["nprobe"] == trials[1]["nprobe"]


def test_target_recall_widens_the_graph_pool_until_met():
    X = _hard()
    exact = nb.knn_indices(X, k=10)
    I, info = ann.knn_search(X, k=10, index="hnswsq", recall_sample=2000, target_recall=0.995)
    trials = info["params"]["tuning"]
    # the default pool of 32 falls short of so high a target; one doubling reaches it
    assert [t["ef_search"] for t in trials] == [32, 64] and info["params"]["ef_search"] == 64
    assert trials[0]["ci_low"] < 0.995 <= trials[-1]["ci_low"] and info["target_met"] is True
    assert _recall(I, exact) >= 0.995
    assert info["recall_ci"][0] <= _recall(I, exact) <= info["recall_ci"][1]


def test_target_recall_budgets_and_bad_options(caplog):
    X = _hard(4000)
    with caplog.at_level("WARNING", logger="crslib.ann"):
        _, info = ann.knn_search(X, k=10, index="ivf", recall_sample=500, tune_seconds=1e-9)
    trials = info["params"]["tuning"]
    assert len(trials) == 1 and info["target_met"] is False  # the time budget: one trial
    assert info["params"]["target_recall"] == 0.95 and info["params"]["target_met"] is False
    # the warning says what was asked, what was reached and at which depth
    assert [r.getMessage() for r in caplog.records if r.name == "crslib.ann"] == [
        f"approximate kNN: recall@10 target 0.950 not met (lower bound {trials[0]['ci_low']:.3f} at "
        f"{{'nprobe': {trials[0]['nprobe']}}})"]
    _, info = ann.knn_search(X, k=10, index="ivf", recall_sample=500, nprobe=3)
    assert info["params"]["nprobe"] == 3 and info["target_met"] is None  # an explicit depth is not tuned
    assert info["target_recall"] is None
    for bad in (0, 1.5, -0.1, "0.9", True):
        with pytest.raises(InputError, match="target_recall"):
            ann.knn_search(X, index="ivf", target_recall=bad)
        with pytest.raises(InputError, match="target_recall"):
            ag.agreement_matrix({"a": X, "b": X}, target_recall=bad)
    with pytest.raises(InputError, match="max_probe_share"):
        ann.knn_search(X, index="ivf", max_probe_share=0)
    with pytest.raises(InputError, match="tune_seconds"):
        ann.knn_search(X, index="ivf", tune_seconds=0)


def test_knn_search_goes_approximate_only_above_its_threshold_and_names_a_bad_option():
    X = _rng(19).normal(size=(300, 8))
    ids, info = ann.knn_search(X, k=5, threshold=300)
    assert info["index"] == "exact"  # N equal to the threshold: exact
    assert info["target_recall"] is None and info["target_met"] is None  # nothing was tuned
    for metric in ("euclidean", "ip"):  # rows of varied length: each metric has its own neighbours
        varied = X * _rng(21).uniform(0.2, 5.0, size=(300, 1))
        ids, _ = ann.knn_search(varied, k=5, metric=metric)
        np.testing.assert_array_equal(ids, nb.knn_indices(varied, k=5, metric=metric))
        assert not np.array_equal(ids, nb.knn_indices(varied, k=5, metric="cosine"))
    assert ann.knn_search(X, k=5, threshold=299, recall_sample=50)[1]["index"] == "hnswsq"
    assert error_message(ann.knn_search, X, query_block=0) == "query_block must be a positive integer or None, got 0"
    # refused even where the exact search would not use it
    assert error_message(ann.knn_search, X, nprobe=0) == "nprobe must be a positive integer or None, got 0"
    assert error_message(ann.knn_search, X, metric="hamming") == (
        "metric must be one of ('cosine', 'ip', 'euclidean'), got 'hamming'")


def test_the_probe_budget_never_falls_below_the_starting_probe():
    """max_probe_share caps the cells a tuning may probe, but never below the 16 it starts from:
    with 32 lists a quarter is 8, so the budget stays 16; with 128 lists it is 32."""
    X = _clustered(5000, d=8, n_centres=50, seed=9)
    for nlist, budget in ((32, 16), (128, 32)):
        _, _, params = ann._approximate_knn(
            ann._prepare(X, "cosine")[0], k=5, metric="ip", gcodes=None, method="ivf", nlist=nlist, nprobe=None,
            hnsw_m=32, ef_search=None, seed=0, target_recall=0.5)
        assert params["max_nprobe"] == budget and params["nprobe"] == 16, nlist
        assert params["target_recall"] == 0.5 and params["target_met"] is True


def test_the_graph_pool_holds_twice_the_candidates_a_query_needs():
    """The default ef_search is twice the candidates asked for (k, the query, a margin of max(3, k // 4),
    and one more per other image of the largest excluded group, up to four margins) when that beats
    the floor of 64 (HNSW) or 32 (HNSW-SQ)."""
    X = _rng(3).normal(size=(600, 8))
    _, info = ann.knn_search(X, k=40, index="hnsw", recall_sample=50, target_recall=None)
    assert info["params"]["ef_search"] == 2 * (40 + 1 + 10)
    groups = np.arange(600) // 10
    _, info = ann.knn_search(X, k=5, index="hnswsq", exclude_groups=groups, recall_sample=50, target_recall=None)
    assert info["params"]["ef_search"] == 2 * (5 + 1 + 3 + 9)
    _, info = ann.knn_search(X, k=5, index="hnswsq", recall_sample=50, target_recall=None)
    assert info["params"]["ef_search"] == 32


def test_a_tuned_search_meets_its_target_on_the_neighbours_outside_the_group():
    """Images of one patient lie close together, and an IVF cell holds several patients: the first
    depth finds the neighbours in the cell, but the neighbours outside the group lie in other cells.
    The tuning must measure recall against those, and so probe deeper until the target holds."""
    rng = _rng(10)
    groups = np.repeat(np.arange(400), 10)
    X = (rng.normal(size=(400, 64))[groups] + 0.5 * rng.normal(size=(4000, 64))).astype(np.float32)
    ids, info = ann.knn_search(X, k=5, index="ivf", exclude_groups=groups, recall_sample=500, max_probe_share=1.0)
    trials = info["params"]["tuning"]
    assert trials[0]["recall"] < 0.9 and info["target_met"] is True and info["params"]["nprobe"] > 16
    # and the recall reported, measured on other queries, is the recall against those neighbours
    recall = _recall(ids, nb.knn_indices(X, k=5, exclude_groups=groups))
    assert recall >= 0.95 and info["recall_ci"][0] <= recall <= info["recall_ci"][1]


def test_a_tiny_dataset_tunes_on_a_quarter_of_its_rows_and_at_least_one():
    for n, tuned in ((7, 1), (3, 1), (12, 3)):
        X = _rng(n).normal(size=(n, 4))
        _, info = ann.knn_search(X, k=1, index="hnsw", recall_sample=5)
        assert info["params"]["tune_queries"] == tuned, n


def test_the_tuning_budget_is_600_seconds_by_default(monkeypatch):
    """The default budget, read off a clock that jumps: ann's first two readings (the search's start
    and the tuning's deadline) say 100 s, every later one 700.5004 s. A 600 s budget is then spent after
    the first trial; a 700 s budget is not, and the tuning deepens as far as it does on the real clock."""
    from types import SimpleNamespace

    def jumping_clock():
        readings = iter([100.0, 100.0])
        return SimpleNamespace(perf_counter=lambda: next(readings, 700.5004))

    X = _hard(4000)
    monkeypatch.setattr(ann, "time", jumping_clock())
    _, info = ann.knn_search(X, k=10, index="ivf", recall_sample=500)
    assert len(info["params"]["tuning"]) == 1 and info["target_met"] is False
    assert info["seconds"] == 600.5  # from the start, to the millisecond
    untimed = ann.knn_search(X, k=10, index="ivf", recall_sample=500)[1]["params"]["tuning"]
    monkeypatch.setattr(ann, "time", jumping_clock())
    _, longer = ann.knn_search(X, k=10, index="ivf", recall_sample=500, tune_seconds=700)
    assert len(untimed) > 1 and longer["params"]["tuning"] == untimed  # every trial the real clock allows
    # agreement_matrix tunes each model within the same default budget: its first model's is spent the same way
    monkeypatch.setattr(ann, "time", jumping_clock())
    matrix = ag.agreement_matrix({"a": X, "b": X[:, ::-1].copy()}, k=10, index="ivf", recall_sample=500)
    assert len(matrix.search["a"]["params"]["tuning"]) == 1 and matrix.search["a"]["target_met"] is False


def test_knn_recall_on_held_out_rows():
    X = _clustered(600, d=8, n_centres=20, seed=2)
    exact = nb.knn_indices(X, k=5)
    held = np.arange(0, 600, 3)
    res = ann.knn_recall(X, exact, sample=10_000, exclude_rows=held)
    assert res.n_sample == 400 and not np.isin(res.rows, held).any() and res.recall == 1.0
    assert res.ci_low < 1.0 == pytest.approx(res.ci_high)  # 400 of 600 rows: a sample, not every row
    wrong = np.roll(exact, 1, axis=0)
    part = ann.knn_recall(X, wrong, sample=50, exclude_rows=held, random_state=3)
    assert part.n_sample == 50 and not np.isin(part.rows, held).any()
    assert part.recall == pytest.approx(np.mean(ag.overlap_from_indices(wrong[part.rows], exact[part.rows])))
    for bad, match in [(np.arange(600), "leaves no row"), ([600], "lie in"), ([-1], "lie in"), ([[1]], "1-D"),
                       ([0.5], "1-D")]:
        with pytest.raises(InputError, match=match):
            ann.knn_recall(X, exact, exclude_rows=bad)


def _models(n=3000, seed=11):
    rng = _rng(seed)
    Z = _clustered(n, d=16, n_centres=40, seed=seed)
    return {
        "a": Z @ rng.normal(size=(16, 24)) + rng.normal(size=(n, 24)),
        "b": Z @ rng.normal(size=(16, 20)) + rng.normal(size=(n, 20)),
        "c": rng.normal(size=(n, 12)),
    }


def test_agreement_matrix_checks_recall_on_20000_sampled_queries_by_default():
    X = np.random.default_rng(0).normal(size=(20_100, 4)).astype(np.float32)
    res = ag.agreement_matrix({"a": X, "b": X[:, ::-1].copy()}, k=5, index="ivf", nprobe=4, target_recall=None)
    assert res.search["a"]["recall_sample"] == res.search["b"]["recall_sample"] == 20_000
    assert res.overlap.loc["a", "b"] > 0.95  # reversed columns: the same geometry


def test_agreement_matrix_approximate_reports_search_and_bound():
    emb = _models()
    exact = ag.agreement_matrix(emb, k=10)
    # the exact default is what it was: pairwise exact overlaps
    for a, b in [("a", "b"), ("a", "c"), ("b", "c")]:
        assert exact.overlap.loc[a, b] == ag.mutual_knn_overlap(emb[a], emb[b], k=10)
    assert set(exact.search) == {"a", "b", "c"}
    assert all(s["index"] == "exact" for s in exact.search.values())
    assert exact.overlap_error_bound == {} and exact.max_error_bound == 0.0
    assert (exact.k, exact.n_images) == (10, 3000)
    assert ag.agreement_matrix(emb, k=10, index="exact").overlap.equals(exact.overlap)

    A = ag.agreement_matrix(emb, k=10, index="ivf", recall_sample=1000)
    search = A.search
    assert all(s["index"] == "ivf" and 0 <= s["recall_ci"][0] <= s["recall"] <= 1 for s in search.values())
    bounds = A.overlap_error_bound
    assert set(bounds) == {"a|b", "a|c", "b|c"}
    for pair, bound in bounds.items():
        a, b = pair.split("|")
        assert bound == pytest.approx((1 - search[a]["recall_ci"][0]) + (1 - search[b]["recall_ci"][0]))
        assert abs(A.overlap.loc[a, b] - exact.overlap.loc[a, b]) <= bound
    assert A.max_error_bound == max(bounds.values())
    d = json.loads(A.to_json())
    assert d["overlap_error_bound"] == pytest.approx(bounds) and d["search"]["a"]["index"] == "ivf"
    assert d["search"]["a"]["recall"] == search["a"]["recall"]

    # "auto" above a (low) threshold goes approximate too: the graph over 8-bit codes
    auto = ag.agreement_matrix(emb, k=10, threshold=1000, recall_sample=1000)
    assert {s["index"] for s in auto.search.values()} == {"hnswsq"}
    assert auto.overlap.equals(ag.agreement_matrix(emb, k=10, index="hnswsq", recall_sample=1000).overlap)
    for pair, bound in auto.overlap_error_bound.items():
        a, b = pair.split("|")
        assert abs(auto.overlap.loc[a, b] - exact.overlap.loc[a, b]) <= bound
    with pytest.raises(InputError, match="index must be one of"):
        ag.agreement_matrix(emb, index="flat")


# --------------------------------------------------------------------------- Dask


def test_knn_search_on_dask_equals_in_process(client, caplog):
    rng = _rng(12)
    X = rng.normal(size=(3000, 16))
    groups = rng.integers(0, 600, 3000)
    local, info = ann.knn_search(X, k=10, exclude_groups=groups)
    for block in (700, None):  # uneven blocks; the default size
        shards, dinfo = ann.knn_search(X, k=10, exclude_groups=groups, client=client, query_block=block)
        np.testing.assert_array_equal(shards, local)
        assert dinfo["index"] == "exact"
    # ties: every row three times, so neighbours tie in score and only the index rule orders them
    tied = np.repeat(rng.normal(size=(700, 8)), 3, axis=0)
    local_tied, _ = ann.knn_search(tied, k=10)
    shards, _ = ann.knn_search(tied, k=10, client=client, query_block=333)
    np.testing.assert_array_equal(shards, local_tied)
    assert (local_tied[0, :2] == [1, 2]).all()  # the two copies of row 0 first, in index order
    local, info = ann.knn_search(X, k=10, index="ivf", recall_sample=500, target_recall=0.5)
    remote, rinfo = ann.knn_search(X, k=10, index="ivf", recall_sample=500, target_recall=0.5, client=client)
    np.testing.assert_array_equal(remote, local)
    assert rinfo["recall"] == info["recall"] and rinfo["recall_ci"] == info["recall_ci"]
    assert info["target_met"] is True and rinfo["params"] == info["params"]
    # A target out of reach (16-d Gaussian noise has no near neighbours for cells to hold): in process the
    # search runs at the deepest setting tried and says so; with workers it becomes the exact search
    local, info = ann.knn_search(X, k=10, index="ivf", recall_sample=500, target_recall=0.99, max_probe_share=0.3)
    assert info["index"] == "ivf" and info["target_met"] is False and info["fallback"] is None
    assert info["params"]["nprobe"] == info["params"]["max_nprobe"] == 22  # 0.3 of 76 cells
    assert info["error_bound"] == pytest.approx(1 - info["recall_ci"][0]) and info["error_bound"] > 0.01
    with caplog.at_level("WARNING", logger="crslib.ann"):
        remote, rinfo = ann.knn_search(X, k=10, index="ivf", recall_sample=500, target_recall=0.99,
                                       max_probe_share=0.3, client=client)
    np.testing.assert_array_equal(remote, nb.knn_indices(X, k=10))
    assert rinfo["index"] == "exact" and rinfo["recall"] is None and rinfo["error_bound"] == 0.0
    assert rinfo["params"]["target_met"] is False and rinfo["target_recall"] == 0.99
    # the bound quoted is the deepest setting's (the last of the two tried), and the log says the same
    low = rinfo["params"]["tuning"][-1]["ci_low"]
    assert low > rinfo["params"]["tuning"][0]["ci_low"]
    assert rinfo["fallback"] == (f"recall@10 target 0.99 not met by ivf within the budget (lower bound {low:.3f}); "
                                 "exact search on the cluster instead")
    assert f"approximate kNN: {rinfo['fallback']}" in [r.getMessage() for r in caplog.records]


def test_a_graph_search_on_workers_falls_back_after_its_deepest_pool(client):
    """A recall of 1 cannot be proven on a sample, so that target is never met: the pool doubles up to its
    cap of 4,096, and the fallback quotes the bound of that last pool, not of an earlier one."""
    X = _rng(1).normal(size=(1000, 128)).astype(np.float32)
    ids, info = ann.knn_search(X, k=10, index="hnswsq", recall_sample=200, target_recall=1.0, client=client)
    trials = info["params"]["tuning"]
    assert [t["ef_search"] for t in trials] == [32 * 2**i for i in range(8)]
    assert trials[1]["ci_low"] < trials[-1]["ci_low"] < 1.0
    assert info["fallback"] == (f"recall@10 target 1.0 not met by hnswsq within the budget (lower bound "
                                f"{trials[-1]['ci_low']:.3f}); exact search on the cluster instead")
    assert info["index"] == "exact" and info["target_met"] is False
    np.testing.assert_array_equal(ids, nb.knn_indices(X, k=10))


def test_agreement_matrix_bounds_a_pair_of_one_exact_and_one_approximate_search(client):
    """With workers, a model whose recall target is out of reach is searched exactly (recall 1) while its
    partner keeps its approximate neighbours: the pair's bound counts the partner's recall alone."""
    hard = _rng(12).normal(size=(3000, 64))  # Gaussian noise: no cells hold its neighbours
    easy = _clustered(3000, d=16, n_centres=40, spread=0.2, seed=11)  # tight clusters, one per cell
    res = ag.agreement_matrix({"hard": hard, "easy": easy}, k=10, index="ivf", recall_sample=500,
                              target_recall=0.9, scheduler=client)
    assert res.search["hard"]["index"] == "exact" and res.search["hard"]["recall"] is None
    assert res.search["easy"]["index"] == "ivf" and res.search["easy"]["recall"] is not None
    low = res.search["easy"]["recall_ci"][0]
    assert res.overlap_error_bound == {"hard|easy": pytest.approx(1.0 - low)} and 1.0 - low > 0
    swapped = ag.agreement_matrix({"easy": easy, "hard": hard}, k=10, index="ivf", recall_sample=500,
                                  target_recall=0.9, scheduler=client)
    assert swapped.overlap_error_bound == {"easy|hard": pytest.approx(1.0 - low)}


def test_an_approximate_search_task_checks_its_recall_with_its_own_metric_and_seed():
    """Rows of varied length: Euclidean, inner-product and cosine neighbours differ. The task's recall is
    knn_recall's on its metric, over the rows its seed samples."""
    rng = _rng(15)
    X = (rng.normal(size=(1000, 8)) * rng.uniform(0.2, 5.0, size=(1000, 1))).astype(np.float32)
    for metric in ("euclidean", "ip"):
        ids, recall, params = ann._approx_knn_task(X=X, k=5, metric=metric, exclude_groups=None, method="ivf",
                                                    recall_sample=50, random_state=7, nprobe=2)
        expected = ann.knn_recall(X, ids, k=5, metric=metric, sample=50, random_state=7)
        np.testing.assert_array_equal(recall.rows, expected.rows)
        assert recall.recall == expected.recall < 1 and params["nprobe"] == 2, metric
        assert ann.knn_recall(X, ids, k=5, metric="cosine", sample=50, random_state=7).recall != recall.recall
        assert not np.array_equal(ann.knn_recall(X, ids, k=5, metric=metric, sample=50, random_state=0).rows,
                                  recall.rows)


def test_an_exact_search_task_returns_the_neighbours_of_its_own_block_of_rows():
    """One worker's task, run here: the rows start:stop of the whole search, groups excluded."""
    X = _rng(14).normal(size=(300, 8))
    groups = np.arange(300) // 3
    for metric in ("cosine", "euclidean"):
        whole = nb.knn_indices(X, k=4, metric=metric, exclude_groups=groups)
        block = ann._knn_block_task(100, 160, X=X, k=4, metric=metric, exclude_groups=groups)
        np.testing.assert_array_equal(block, whole[100:160])
    # the groups matter here: without them the block's neighbours differ
    assert not np.array_equal(ann._knn_block_task(100, 160, X=X, k=4, metric="euclidean", exclude_groups=None), block)


def test_exact_search_on_workers_splits_the_queries_into_four_blocks_per_worker(client, monkeypatch):
    """Each task searches all N rows for a block of queries: about 4 blocks per worker, of at least 1,000
    queries (so a task's rebuilt index is worth it), or the blocks asked for; the result is one search's."""
    import crslib.cluster

    sent = []

    def recording(client, function, tasks, **kwargs):
        sent.append((function.__name__, list(tasks)))
        return crslib.cluster.run_tasks(client, function, tasks, **kwargs)

    monkeypatch.setattr(ann, "run_tasks", recording)
    X = _rng(14).normal(size=(9000, 4))
    ids, _ = ann.knn_search(X, k=3, client=client)
    assert sent == [("_knn_block_task", [(s, s + 1125) for s in range(0, 9000, 1125)])]  # 9,000 / (4 x 2)
    np.testing.assert_array_equal(ids, nb.knn_indices(X, k=3))
    sent.clear()
    ann.knn_search(X[:3003], k=3, client=client)
    assert sent == [("_knn_block_task", [(0, 1000), (1000, 2000), (2000, 3000), (3000, 3003)])]
    sent.clear()
    ids, _ = ann.knn_search(X[:1500], k=3, client=client, query_block=700, metric="euclidean")
    assert sent == [("_knn_block_task", [(0, 700), (700, 1400), (1400, 1500)])]
    np.testing.assert_array_equal(ids, nb.knn_indices(X[:1500], k=3, metric="euclidean"))
    assert not np.array_equal(ids, nb.knn_indices(X[:1500], k=3))  # the tasks search with the metric asked for


def test_agreement_matrix_on_a_single_worker_searches_there():
    """One worker: the models are searched one after the other, each on the cluster (not in this process)."""
    emb = _models(600, seed=3)
    with open_client("local:1") as one, get_task_stream(one) as stream:
        res = ag.agreement_matrix(emb, k=5, scheduler=one)
    assert len(stream.data) >= len(emb)
    assert res.overlap.equals(ag.agreement_matrix(emb, k=5).overlap)


def test_agreement_matrix_on_dask_equals_in_process(client):
    emb = _models(2000, seed=13)
    groups = _rng(13).integers(0, 500, 2000)
    A, per = ag.agreement_matrix(emb, k=10, exclude_groups=groups, return_per_image=True)
    B, per_b = ag.agreement_matrix(emb, k=10, exclude_groups=groups, return_per_image=True, scheduler=client)
    assert A.overlap.equals(B.overlap) and per.equals(per_b)
    A = ag.agreement_matrix(emb, k=10, index="ivf", recall_sample=500)
    with get_task_stream(client) as stream:
        B = ag.agreement_matrix(emb, k=10, index="ivf", recall_sample=500, scheduler=client)
    assert A.overlap.equals(B.overlap) and A.overlap_error_bound == B.overlap_error_bound
    assert len(stream.data) >= len(emb)  # one search task per model at least ran on the workers
    with pytest.raises(InputError, match="model 'c'"):
        ag.agreement_matrix({**emb, "c": np.zeros((2000, 3))}, k=10, scheduler=client)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu sse2 avx avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl", "SKYLAKEX"),
        ("fpu sse2 avx avx2 fma avx512f avx512cd avx512bw avx512dq", "HASWELL"),  # no avx512vl: not SkylakeX
        ("fpu sse2 avx avx2 fma", "HASWELL"),
        ("avx2 fma", "HASWELL"),  # exactly the two flags Haswell needs, no more
        ("fpu sse2 avx avx2", None),  # AVX2 without FMA is not Haswell
        ("fpu sse2 avx fma", None),
    ],
)
def test_openblas_coretype_hint_reads_the_first_flags_line(tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    # the second processor's flags must not matter: the first flags line decides
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\n"
                       "processor\t: 1\nflags\t\t: fpu avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl\n")
    assert nb._openblas_coretype_hint(cpuinfo) == expected


def test_openblas_coretype_hint_without_flags_or_file_is_none(tmp_path):
    no_flags = tmp_path / "cpuinfo"
    no_flags.write_text("processor\t: 0\nFeatures\t: fp asimd\n")  # an ARM cpuinfo has no flags line
    assert nb._openblas_coretype_hint(no_flags) is None
    assert nb._openblas_coretype_hint(tmp_path / "missing") is None
    # a flag that merely contains another's name is not that flag
    lookalike = tmp_path / "lookalike"
    lookalike.write_text("flags\t: avx2x fmax avx512fx\n")
    assert nb._openblas_coretype_hint(lookalike) is None


def test_openblas_coretype_hint_reads_this_machines_cpuinfo_by_default():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo on this system")
    assert nb._openblas_coretype_hint() == nb._openblas_coretype_hint(cpuinfo)


def test_openblas_coretype_hint_reads_past_non_ascii_text_and_needs_only_the_avx512_set(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    # a model name in UTF-8 (bytes that are not ASCII) must not stop the reading; the flags are exactly
    # the five AVX-512 flags SkylakeX needs, no more
    cpuinfo.write_bytes("model name\t: Xeon\u00ae Platinum \u2122\n".encode("utf-8")
                        + b"flags\t\t: avx512f avx512cd avx512bw avx512dq avx512vl\n")
    assert nb._openblas_coretype_hint(cpuinfo) == "SKYLAKEX"


# --------------------------------------------------------------------------- embeddings on disk, float16


def test_prepare_reads_float16_and_mapped_files_into_one_float32_array(tmp_path):
    from crslib.embed import load_embeddings, save_embeddings

    X = _clustered(3000, d=48, seed=7)
    X[5] *= 1e-3  # a short row: normalised by its own norm, not by a neighbour's
    mapped = load_embeddings(save_embeddings(tmp_path / "x32.npy", X))
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    # cosine: the normalised rows are bit-identical to those of the array in memory
    work, norms = nb._prepare(X, "cosine")
    work_mapped, norms_mapped = nb._prepare(mapped, "cosine")
    assert np.array_equal(work, work_mapped) and np.array_equal(norms, norms_mapped)
    assert np.allclose(np.linalg.norm(work, axis=1), 1, atol=1e-6)
    # ip and euclidean search the mapped file itself: no copy of it in memory
    for metric in ("ip", "euclidean"):
        assert np.shares_memory(nb._prepare(mapped, metric)[0], mapped)
    # float16 becomes float32 rows equal to converting first (one array, not two)
    half = load_embeddings(save_embeddings(tmp_path / "x16.npy", X, dtype="float16"))
    assert half.dtype == np.float16 and (tmp_path / "x16.npy").stat().st_size < 0.55 * (tmp_path / "x32.npy").stat().st_size
    work_half, _ = nb._prepare(half, "cosine")
    assert work_half.dtype == np.float32
    assert np.array_equal(work_half, nb._prepare(np.asarray(half, dtype=np.float32), "cosine")[0])
    # zero rows are refused whatever the storage
    Z = X.copy()
    Z[[3, 9]] = 0
    with pytest.raises(InputError, match=r"2 all-zero row\(s\) \(first \[3, 9\]\)"):
        nb._prepare(load_embeddings(save_embeddings(tmp_path / "z.npy", Z, dtype="float16")), "cosine")


def test_search_and_agreement_on_mapped_files_equal_the_arrays_in_memory(tmp_path):
    from crslib.embed import load_embeddings, save_embeddings

    models = {"a": _hard(), "b": _hard() + _rng(2).normal(scale=0.5, size=_hard().shape).astype(np.float32)}
    mapped = {name: load_embeddings(save_embeddings(tmp_path / f"{name}.npy", X)) for name, X in models.items()}
    for index in ("exact", "ivfpq", "hnswsq"):
        ids, info = ann.knn_search(models["a"], k=10, index=index, recall_sample=500)
        ids_mapped, info_mapped = ann.knn_search(mapped["a"], k=10, index=index, recall_sample=500)
        assert np.array_equal(ids, ids_mapped)
        assert info["recall"] == info_mapped["recall"]
    in_memory = ag.agreement_matrix(models, k=10, threshold=0, recall_sample=500)
    on_disk = ag.agreement_matrix(mapped, k=10, threshold=0, recall_sample=500)
    assert on_disk.overlap.equals(in_memory.overlap)
    assert on_disk.search["a"]["params"]["ef_search"] == in_memory.search["a"]["params"]["ef_search"]
    for X in mapped.values():  # read, never written
        assert not X.flags.writeable


def test_float16_storage_keeps_the_neighbours_of_clustered_embeddings(tmp_path):
    from crslib.embed import save_embeddings, load_embeddings

    X = _clustered(4000, d=128, seed=9)
    exact = nb.knn_indices(X, k=10)
    half = load_embeddings(save_embeddings(tmp_path / "h.npy", X, dtype="float16"))
    kept = _recall(ann.knn_search(half, k=10, index="exact")[0], exact)
    # rounding to 11 significant bits moves only near-tied neighbours
    assert 0.97 <= kept < 1.0


def test_top_k_order_equals_a_full_lexsort_with_ties_dropped_slots_and_negative_scores():
    rng = _rng(21)
    scores = rng.choice(np.float32([-0.75, -0.0, 0.0, 0.25, 0.5, 1.0, -np.inf]), size=(50, 40))
    ids = np.stack([rng.permutation(1000)[:40] for _ in range(50)])
    ids[:, -3:] = -1  # slots faiss could not fill
    scores[:, -3:] = -np.inf
    for k in (1, 5, 40):
        expected = np.lexsort((ids, -scores), axis=-1)[:, :k]
        order = nb.top_k_order(scores, ids, k)
        # the same candidates in the same order (among the identical unfilled slots, any column will do)
        np.testing.assert_array_equal(np.take_along_axis(ids, order, 1), np.take_along_axis(ids, expected, 1))
        np.testing.assert_array_equal(np.take_along_axis(scores, order, 1), np.take_along_axis(scores, expected, 1))
        assert (np.sort(order, axis=1)[:, 1:] != np.sort(order, axis=1)[:, :-1]).all()  # each column once

"""crslib.agreement: exact kNN, mutual kNN overlap and the analyses around it."""

from __future__ import annotations

import json
import os
import sys
import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pytest

from crslib import agreement as ag
from crslib import ann, probes
from crslib import neighbors as nb
from crslib import similarity as sim
from crslib import subgroups as sg
from crslib.errors import InputError
from assertions import error_message


def _rng(seed=0):
    return np.random.default_rng(seed)


def _brute_knn(X, k, metric="cosine", groups=None):
    """Reference: full similarity matrix, ranked by (-float32 score, index)."""
    X = np.asarray(X, dtype=np.float32)
    if metric == "cosine":
        X = X / np.linalg.norm(X.astype(np.float64), axis=1, keepdims=True).astype(np.float32)
    X64 = X.astype(np.float64)
    if metric == "euclidean":
        S = -((X64[:, None, :] - X64[None]) ** 2).sum(-1)
    else:
        S = X64 @ X64.T
    S = S.astype(np.float32)
    out = []
    for i in range(len(X)):
        ok = np.ones(len(X), bool)
        ok[i] = False
        if groups is not None:
            ok &= groups != groups[i]
        idx = np.flatnonzero(ok)
        out.append(idx[np.lexsort((idx, -S[i, idx]))[:k]])
    return np.array(out)


# --------------------------------------------------------------------------- overlap known answers


def test_identical_embeddings_overlap_one():
    X = _rng().normal(size=(300, 16))
    per = ag.mutual_knn_overlap_per_image(X, X.copy(), k=10)
    assert per.shape == (300,) and np.all(per == 1.0)
    assert ag.mutual_knn_overlap(X, X, k=10) == 1.0


@pytest.mark.parametrize("scale", [0.01, 1.0, 37.5])
def test_rotation_times_positive_scale_overlap_one(scale):
    rng = _rng(1)
    X = rng.normal(size=(400, 24))
    Q, _ = np.linalg.qr(rng.normal(size=(24, 24)))
    assert ag.mutual_knn_overlap(X, scale * X @ Q, k=10) == 1.0


def test_independent_embeddings_at_chance():
    rng = _rng(2)
    n, k = 2000, 10
    Xa, Xb = rng.normal(size=(n, 64)), rng.normal(size=(n, 64))
    observed = ag.mutual_knn_overlap(Xa, Xb, k=k)
    null = ag.permutation_null(Xa, Xb, k=k, n_permutations=20, random_state=0)
    chance = ag.chance_overlap(n, k)
    assert null.chance == pytest.approx(chance) == pytest.approx(k / (n - 1))
    assert abs(null.mean - chance) < 4 * null.values.std() + 1e-3
    assert abs(observed - null.mean) < 4 * null.values.std() + 1e-3
    assert null.low <= null.mean <= null.high
    again = ag.permutation_null(Xa, Xb, k=k, n_permutations=20, random_state=0)
    assert np.array_equal(null.values, again.values)
    # a related pair sits far above the null
    related = ag.mutual_knn_overlap(Xa, Xa + 0.3 * Xb, k=k)
    assert related > null.high + 0.3


def test_duplicate_rows_twin_first_self_never():
    Y = _rng(3).normal(size=(150, 12))
    X = np.vstack([Y, Y])  # row i and row i + 150 are exact twins
    n = len(X)
    twin = np.r_[np.arange(150, 300), np.arange(150)]
    for backend in ("faiss", "torch"):
        I = nb.knn_indices(X, k=5, backend=backend)
        assert np.array_equal(I[:, 0], twin)
        assert not (I == np.arange(n)[:, None]).any()


def test_same_group_neighbours_excluded():
    rng = _rng(4)
    n = 500
    groups = np.repeat(np.arange(300), rng.integers(1, 5, 300))[:n]
    X = rng.normal(size=(n, 8))
    X[1::2] = X[::2] + 0.01 * rng.normal(size=(n // 2, 8))  # near-duplicates, often same patient
    I = nb.knn_indices(X, k=10, exclude_groups=groups)
    assert not (groups[I] == groups[:, None]).any()
    assert np.array_equal(I, _brute_knn(X, 10, groups=groups))
    # without exclusion the same-patient near-duplicates come first
    I0 = nb.knn_indices(X, k=10)
    assert (groups[I0[:, 0]] == groups).mean() > 0.4


def test_group_exclusion_widens_for_large_groups():
    rng = _rng(5)
    X = rng.normal(size=(120, 4))
    groups = np.r_[np.zeros(100), np.arange(1, 21)]  # one group of 100 rows
    I = nb.knn_indices(X, k=15, exclude_groups=groups)
    assert np.array_equal(I, _brute_knn(X, 15, groups=groups))
    with pytest.raises(InputError, match="group 0.0 has 100 of N=120 images, leaving 20 < k=25"):
        nb.knn_indices(X, k=25, exclude_groups=groups)


def test_group_errors_name_the_largest_group_seen_first_and_the_unlabelled_rows():
    # "b" and "a" tie as the largest group (3 images) behind a first row of their own: the
    # message names "b", the one that comes first in the rows, not "a" (first in sorted order)
    X = _rng(6).normal(size=(7, 3))
    groups = np.array(["c", "b", "a", "b", "a", "b", "a"])
    assert error_message(nb.knn_indices, X, k=5, exclude_groups=groups) == (
        "excluding the query's group leaves too few candidates: group 'b' has 3 of N=7 images, "
        "leaving 4 < k=5; lower k"
    )
    unlabelled = np.array(["a", None, "b", None, None, "a", None, None, None], dtype=object)
    assert error_message(nb.knn_indices, _rng(7).normal(size=(9, 3)), k=2, exclude_groups=unlabelled) == (
        "exclude_groups has missing labels in rows [1, 3, 4, 6, 7]; give every image a group"
    )


def test_row_norms_over_several_blocks_equal_the_direct_norms():
    # 16 MiB of float64 per block: 1,024 rows of 2,048 dimensions, so 2,100 rows take three blocks
    # (more rows than dimensions: a loop over the columns instead of the rows would miss the last)
    X = _rng(8).normal(size=(2100, 2048)).astype(np.float32)
    expected = np.sqrt((X.astype(np.float64) ** 2).sum(axis=1))
    np.testing.assert_allclose(nb._row_norms(X), expected, rtol=1e-12)


def test_cosine_rows_are_normalised_in_float32_block_by_block_from_any_input_dtype():
    # float64 rows of 2,048 dimensions: blocks of 1,024 rows, so 2,100 rows take three. Each row
    # is cast to float32 first and divided by the float32 of its float64 norm, bit for bit, as the
    # docstring of _prepare says, so a float64 input gives the same array as its float32 copy
    X = _rng(9).normal(size=(2100, 2048)) * _rng(10).uniform(0.5, 3.0, size=(2100, 1))
    X32 = X.astype(np.float32)
    scale = np.sqrt((X32.astype(np.float64) ** 2).sum(axis=1)).astype(np.float32)[:, None]
    work, norms = nb._prepare(X, "cosine")
    assert work.dtype == np.float32 and np.array_equal(work, X32 / scale)
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)
    assert np.array_equal(nb._prepare(X32, "cosine")[0], work)


def test_values_beyond_float32_are_refused_by_name_without_a_warning():
    # float64 rows are searched in float32: row 2 holds a value float32 cannot hold, and row 5's
    # values fit but its norm (4.2e38) does not, which only matters once the rows are normalised
    X = _rng(13).normal(size=(8, 3))
    X[2, 1] = 1e300
    X[5] = [3e38, 3e38, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflowing casts are reported, not warned about
        assert error_message(nb._prepare, X, "cosine", "Y") == (
            "Y has values beyond float32's range (3.40282e+38) in 2 row(s) (first [2, 5]), counting each "
            "row's norm; rescale the embeddings")
        for metric in ("ip", "euclidean"):
            assert error_message(nb._prepare, X, metric, "Y") == (
                "Y has values beyond float32's range (3.40282e+38) in 1 row(s), first rows [2]; rescale the "
                "embeddings")
        assert error_message(nb.knn_indices, X, k=2).startswith("X has values beyond float32's range")
        assert error_message(nb._prepare, np.full((7, 2), 1e39), "cosine") == (
            "X has values beyond float32's range (3.40282e+38) in 7 row(s) (first [0, 1, 2, 3, 4]), counting "
            "each row's norm; rescale the embeddings")
    X[2, 1] = np.nan  # a NaN is not a range problem, whatever the other rows hold
    for metric in ("cosine", "euclidean"):
        assert error_message(nb._prepare, X, metric, "Y") == (
            "Y has NaN or infinite values in 1 row(s), first rows [2]; drop or re-extract those images")
    X[2, 1] = 0.5
    work, norms = nb._prepare(X[[0, 1, 2, 3]], "euclidean")  # without the large rows, float64 input is fine
    assert work.dtype == np.float32 and np.array_equal(work, X[:4].astype(np.float32))


def test_faiss_is_imported_once_with_a_core_type_hint_only_for_that_import(monkeypatch, tmp_path):
    # a stand-in faiss records the OpenBLAS core type it was imported under
    (tmp_path / "faiss.py").write_text("import os\nCORETYPE = os.environ.get('OPENBLAS_CORETYPE')\n")
    nb._import_faiss()  # the real faiss, which the test's end puts back in sys.modules
    monkeypatch.delitem(sys.modules, "faiss")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.setattr(nb, "_openblas_coretype_hint", lambda: "HASWELL")
    stand_in = nb._import_faiss()
    assert stand_in.__file__ == str(tmp_path / "faiss.py") and stand_in.CORETYPE == "HASWELL"
    assert "OPENBLAS_CORETYPE" not in os.environ  # the hint is gone after the import

    def no_hint():
        raise AssertionError("an imported faiss needs no core-type hint")

    monkeypatch.setattr(nb, "_openblas_coretype_hint", no_hint)
    assert nb._import_faiss() is stand_in  # already imported: returned as it is
    # a core type the user chose is the one faiss loads with, and it stays set
    monkeypatch.delitem(sys.modules, "faiss")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "ZEN")
    assert nb._import_faiss().CORETYPE == "ZEN" and os.environ["OPENBLAS_CORETYPE"] == "ZEN"


def test_a_search_off_the_cpu_is_torchs_and_faiss_is_refused_there():
    X = np.eye(4, dtype=np.float32)
    for backend in ("auto", "torch"):
        searcher = nb._Searcher(X, "ip", backend, None, "meta")  # torch's meta device needs no GPU
        assert searcher.backend == "torch" and searcher.device == "meta" and searcher.Xt.device.type == "meta"
    assert error_message(nb._Searcher, X, "ip", "faiss", None, "meta") == (
        "backend='faiss' searches on the CPU; with device='meta' use backend='torch' or 'auto'")
    assert error_message(nb._Searcher, X, "ip", "annoy", None) == (
        "backend must be one of ('auto', 'faiss', 'torch'), got 'annoy'")


def test_auto_searches_with_faiss_when_it_is_installed_and_torch_otherwise(monkeypatch):
    X = _rng(14).normal(size=(6, 3)).astype(np.float32)
    searcher = nb._Searcher(X, "euclidean", "auto", None)
    assert searcher.backend == "faiss" and searcher.device == "cpu" and searcher.n == 6
    assert searcher.index.ntotal == 6 and searcher.index.metric_type == nb._import_faiss().METRIC_L2
    assert nb._Searcher(X, "cosine", "faiss", 3).index.metric_type == nb._import_faiss().METRIC_INNER_PRODUCT
    monkeypatch.setattr(nb, "_faiss_available", lambda: False)
    searcher = nb._Searcher(X, "euclidean", "auto", None)
    assert searcher.backend == "torch" and not hasattr(searcher, "index")
    np.testing.assert_allclose(searcher.sq.numpy(), (X.astype(np.float64) ** 2).sum(axis=1), rtol=1e-6)
    assert not hasattr(nb._Searcher(X, "ip", "torch", None), "sq")  # squared norms only for euclidean
    assert error_message(nb._Searcher, X, "ip", "faiss", None) == (
        "backend='faiss' needs the faiss-cpu package; install it or use backend='torch'")


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_a_contiguous_run_of_queries_is_searched_as_a_view_of_the_rows(backend):
    import torch

    X = _rng(15).normal(size=(12, 4)).astype(np.float32)
    searcher = nb._Searcher(X, "ip", backend, None)
    seen = []  # each block of query rows the back-end gets, and the matmul precision it runs under
    if backend == "faiss":
        index = searcher.index

        class Spy:
            def search(self, Q, kk):
                seen.append(Q)
                return index.search(Q, kk)

        searcher.index = Spy()
    else:
        search = searcher._torch_search

        def spy(Q, kk):
            seen.append(Q)
            seen.append(torch.get_float32_matmul_precision())
            return search(Q, kk)

        searcher._torch_search = spy
    cases = [([3, 4, 5, 6], True), ([7], True), ([0, 1, 2], True), ([3, 5, 6, 7], False),
             ([3, 3, 5, 6], False), ([4, 3], False), ([], False)]  # [3, 3, 5, 6] spans 4 rows but repeats one
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # the search still runs at full float32 precision
        for qids, view in cases:
            scores, ids = searcher.search(np.array(qids, dtype=np.int64), 3)
            Q = seen[0]
            np.testing.assert_array_equal(Q, X[qids])
            assert np.shares_memory(Q, X) == view, qids
            if backend == "torch":
                assert seen[1] == "highest" and torch.get_float32_matmul_precision() == "medium"
            expected = np.argsort(-(X[qids].astype(np.float64) @ X.T.astype(np.float64)), axis=1, kind="stable")[:, :3]
            assert ids.dtype == np.int64 and np.array_equal(ids, expected)
            np.testing.assert_allclose(scores, np.take_along_axis(X[qids] @ X.T, expected, axis=1), rtol=1e-5)
            seen.clear()
    finally:
        torch.set_float32_matmul_precision(before)


def test_rescore_gives_float64_scores_of_every_candidate_over_several_blocks(monkeypatch):
    rng = _rng(16)
    X = rng.normal(size=(40, 5)).astype(np.float32)
    qids = np.arange(0, 40, 4)  # ten queries
    ids = rng.integers(0, 40, size=(10, 6))
    monkeypatch.setattr(nb, "_RESCORE_BUDGET", 6 * 5 * 8 * 3)  # three queries' candidates per block: four blocks
    X64 = X.astype(np.float64)
    inner = (X64[ids] * X64[qids][:, None, :]).sum(axis=2)
    squared = ((X64[ids] - X64[qids][:, None, :]) ** 2).sum(axis=2)
    for metric, expected in (("ip", inner), ("cosine", inner), ("euclidean", -squared)):
        scores = nb._rescore(X, qids, ids, metric)
        assert scores.dtype == np.float64 and scores.shape == (10, 6)
        np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-12)  # float32 products would miss this
    assert not np.allclose(inner, (X[ids] * X[qids][:, None, :]).sum(axis=2), rtol=1e-12, atol=1e-12)


def _select_watched(monkeypatch, X, qids, ids, raw, tol, **kwargs):
    """_select's (done, ids, scores) and the candidate rows it rescored in float64, warnings as errors."""
    rescored = []
    rescore = nb._rescore

    def spy(X, qids, ids, metric):
        rescored.extend(ids.tolist())
        return rescore(X, qids, ids, metric)

    monkeypatch.setattr(nb, "_rescore", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        done, out_ids, out_sc = nb._select(X, np.asarray(qids), np.asarray(raw, dtype=np.float32), np.asarray(ids),
                                           tol=np.asarray(tol, dtype=np.float64), **kwargs)
    assert out_sc.dtype == np.float32
    return done.tolist(), out_ids.tolist(), out_sc.tolist(), rescored


def test_select_keeps_the_raw_order_only_when_gaps_and_bound_exceed_twice_the_error(monkeypatch):
    # one feature; the queries (rows 6, 8 and 9) hold 1, so a candidate's score is its own value
    X = np.array([0.5, 8, 7, 6, 5, 6.9, 1, 7, 1, 1, 5.98, 7.95, 8.5], dtype=np.float32)[:, None]
    ids = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 7, 5, 8], [2, 7, 1, -1], [1, 2, 8, 0], [1, 2, 3, 10], [1, 7, 5, 9],
           [1, 11, 5, 9]]
    raw = [[8, 7, 6, 5], [8, 7, 6, 5], [8, 7, 6.9, 1], [7, 7, 8, 0], [8, 7, 6.95, 0.5], [8, 7, 6, 5.98],
           [8, 7, 6.9, 1], [8, 7.95, 6.9, 1]]
    done, out_ids, out_sc, rescored = _select_watched(
        monkeypatch, X, [9, 6, 8, 9, 8, 9, 9, 9], ids, raw, [0.4, 0.5, 0.04, 0.1, 0.04, 0.1, 0.1, 0.1],
        k=2, full=False, gcodes=None, metric="ip")
    # kept as searched: gaps of 1 above 2 x 0.4 (row 0); gaps 1 and 0.1 above 2 x 0.04, the query's
    # own score the last (2); the k-th far above the lowest candidate (0.5, id 0) though the query's
    # own (invalid) score is close (4); a gap beyond the (k + 1)-th does not count (5). Rescored: a
    # gap of exactly 2 x 0.5 (1); a tie at the k-th place, ids 2 and 7 both 7, with the last candidate
    # also 7, ordered by id and left for a wider search (3); a gap of 0.1 after the k-th (6) or of
    # 0.05 before it (7) under 2 x 0.1
    assert rescored == [ids[1], ids[3], ids[6], ids[7]]
    assert done == [True, True, True, False, True, True, True, True]
    assert out_ids == [[1, 2], [1, 2], [1, 7], [1, 2], [1, 2], [1, 2], [1, 7], [1, 11]]
    assert out_sc == [[8, 7]] * 7 + [[8, np.float32(7.95)]]


def test_select_leaves_out_the_querys_group_and_is_certain_of_a_full_list(monkeypatch):
    X = np.array([0.5, 8, 7, 6, 5, 6.9, 1, 7, 1, 1, 5.98, 7.95, 8.5], dtype=np.float32)[:, None]
    groups = np.array([0, 1, 2, 1, 3, 3, 4, 4, 5, 1, 6, 6, 7])  # query 9 shares group 1 with rows 1 and 3
    ids = [[7, 0, -1], [1, 0, 2], [12, 2, 3], [12, 2, 3]]
    raw = [[7, 0.5, 0], [8, 0.5, 7], [8.5, 7, 6], [8.5, 7, 6]]
    for full, expected_done, expected_rescored in ((False, [False, False, True, True], [ids[1], ids[2]]),
                                                   (True, [False, True, True, True], [])):
        done, out_ids, out_sc, rescored = _select_watched(
            monkeypatch, X, [6, 9, 9, 9], ids, raw, [0.1, 0.1, 0.5, 0.4], k=2, full=full, gcodes=groups,
            metric="ip")
        # query 6 keeps one candidate of another group (id 0; id 7 is its own group's, -1 is none):
        # fewer than k. Query 9 leaves out ids 1 and 3 of its group; its k-th (id 0, 0.5) is the lowest
        # candidate, certain only when every row is a candidate (full). Rows 2 and 3: the k-th (7) is
        # exactly 2 x 0.5 above the lowest candidate (6, its own group's): rescored, and certain then;
        # 1 above it is more than 2 x 0.4: kept as searched
        assert done == expected_done and rescored == expected_rescored
        assert out_ids[1:] == [[2, 0], [12, 2], [12, 2]] and out_sc[1:] == [[7, 0.5], [8.5, 7], [8.5, 7]]


def test_select_is_certain_of_a_rescored_kth_only_beyond_one_float32_spacing(monkeypatch):
    # rescored scores 8, 7, 6: the 7 is certain when the lowest candidate (6) plus the error bound plus
    # one float32 spacing of 7 (2**-21) stays below it
    X = np.array([0.5, 8, 7, 6, 5, 6.9, 1, 7, 1, 1], dtype=np.float32)[:, None]
    tol = [1 - 2**-22, 1 - 2**-21, 1 - 2**-20]  # 6 + tol + 2**-21 = 7 + 2**-22, 7, 7 - 2**-21
    done, out_ids, _, rescored = _select_watched(monkeypatch, X, [9, 9, 9], [[1, 2, 3]] * 3, [[8, 7, 6]] * 3,
                                                 tol, k=2, full=False, gcodes=None, metric="ip")
    assert done == [False, False, True] and out_ids == [[1, 2]] * 3 and len(rescored) == 3


def test_select_rescores_by_the_metric_and_breaks_float32_ties_by_id(monkeypatch):
    # euclidean: scores are minus squared distances from the query (row 0) at the origin
    X = np.array([[0, 0], [1, 0], [0, 2], [3, 0]], dtype=np.float32)
    done, out_ids, out_sc, rescored = _select_watched(monkeypatch, X, [0], [[1, 2, 3]], [[-1, -4, -9]], [2.0],
                                                      k=2, full=False, gcodes=None, metric="euclidean")
    assert rescored == [[1, 2, 3]] and done == [True] and out_ids == [[1, 2]] and out_sc == [[-1, -4]]
    # inner products 3 + 2**-30 (row 2) and 3 (row 1) are one float32 number: the lower id comes first
    X = np.array([[1, 1], [3, 0], [3, 2**-30], [1, 0]], dtype=np.float32)
    done, out_ids, out_sc, rescored = _select_watched(monkeypatch, X, [0], [[2, 1, 3]], [[3, 3, 1]], [0.1],
                                                      k=2, full=False, gcodes=None, metric="ip")
    assert rescored == [[2, 1, 3]] and done == [True] and out_ids == [[1, 2]] and out_sc == [[3, 3]]


def test_knn_indices_takes_ten_neighbours_by_default_and_any_positive_integer_batch():
    X = _rng(17).normal(size=(30, 4))
    reference = _brute_knn(X, 10)
    np.testing.assert_array_equal(nb.knn_indices(X), reference)
    for batch_size in (1, 7, np.int64(30)):  # one query per search call, several calls, all at once
        np.testing.assert_array_equal(nb.knn_indices(X, batch_size=batch_size), reference)
    for bad in (0, -3, True, 2.0, "4"):
        assert error_message(nb.knn_indices, X, batch_size=bad) == (
            f"batch_size must be a positive integer or None, got {bad!r}")


def test_each_querys_error_bound_is_the_float32_dot_product_bound(monkeypatch):
    rng = _rng(18)
    X = rng.normal(size=(50, 6)) * rng.uniform(0.5, 4.0, size=(50, 1))
    X[7] = 0  # a zero row (allowed for ip and euclidean) has the floor of 1e-30
    seen = []
    select = nb._select

    def spy(Xw, qids, raw, ids, *, tol, **kwargs):
        seen.append((qids.copy(), tol.copy()))
        return select(Xw, qids, raw, ids, tol=tol, **kwargs)

    monkeypatch.setattr(nb, "_select", spy)
    u, d = 2.0**-24, 6  # float32's unit roundoff; the dimension
    for metric in ("ip", "euclidean", "cosine"):
        rows = X if metric != "cosine" else np.delete(X, 7, axis=0)
        _, norms = nb._prepare(rows, metric)
        if metric == "euclidean":  # |q - x|^2 = |q|^2 + |x|^2 - 2 q.x: a few more roundings
            expected = (d + 8) * u * (norms + norms.max()) ** 2 * 1.01 + 1e-30
        else:
            expected = (d + 2) * u * norms * norms.max() * 1.01 + 1e-30
        seen.clear()
        nb.knn_indices(rows, k=3, metric=metric)
        qids = np.concatenate([q for q, _ in seen])
        tol = np.concatenate([t for _, t in seen])
        assert set(qids.tolist()) == set(range(len(rows)))  # the zero row's ties take a second, wider search
        np.testing.assert_allclose(tol, expected[qids], rtol=1e-12, atol=0)
        if metric == "ip":
            assert set(tol[qids == 7].tolist()) == {1e-30}


def test_a_query_of_tied_candidates_widens_its_search_to_every_row_and_says_so(caplog):
    X = _rng(20).normal(size=(50, 6))
    X[7] = 0  # under ip its 49 candidates all score 0: only the full list settles the order
    with caplog.at_level("DEBUG", logger="crslib.neighbors"):
        found = nb.knn_indices(X, k=3, metric="ip", queries=[7, 8])
    assert found[0].tolist() == [0, 1, 2]  # ties go to the lowest ids
    # 3 + 1 + 3 candidates first, then four times as many, then all 50
    assert [r.getMessage() for r in caplog.records if r.name == "crslib.neighbors"] == [
        "widening kNN search for 1 queries from 7 to 28 candidates",
        "widening kNN search for 1 queries from 28 to 50 candidates"]


def test_a_quarter_of_the_rows_or_fewer_as_queries_of_large_rows_search_with_torch(monkeypatch):
    """knn_indices(queries=...) of at most a quarter of rows larger than the search budget takes the torch
    back-end (no copy of the rows into a faiss index) and finds the same neighbours."""
    X = _rng(19).normal(size=(40, 4)).astype(np.float32)
    chosen = []
    searcher = nb._Searcher

    class Spy(searcher):
        def __init__(self, X, metric, backend, *args, **kwargs):
            chosen.append(backend)
            super().__init__(X, metric, backend, *args, **kwargs)

    monkeypatch.setattr(nb, "_Searcher", Spy)
    reference = _brute_knn(X, 5)
    for budget, queries in ((X.nbytes - 1, 10), (X.nbytes - 1, 11), (X.nbytes, 10), (X.nbytes - 1, None)):
        monkeypatch.setattr(nb, "_SEARCH_BUDGET", budget)
        rows = np.arange(40) if queries is None else np.arange(queries)
        found = nb.knn_indices(X, k=5, queries=None if queries is None else rows)
        np.testing.assert_array_equal(found, reference[rows])
    # ten queries are a quarter of 40 rows larger than the budget; eleven are more; rows within
    # the budget, or every row as a query, stay with faiss
    assert chosen == ["torch", "auto", "auto", "auto"]


def test_the_search_runs_on_the_cpu_unless_a_device_is_named(monkeypatch):
    import crslib.device

    # a stand-in resolver, as if a GPU were there: "auto" would pick it, None must not ask
    monkeypatch.setattr(crslib.device, "resolve_device", lambda device="auto": f"resolved {device}")
    assert nb._search_device(None) == "cpu"
    assert nb._search_device("auto") == "resolved auto"
    assert nb._search_device("cuda:1") == "resolved cuda:1"


def test_knn_indices_hands_the_searcher_its_options_and_starts_wide_enough_for_the_groups(monkeypatch):
    import crslib.device

    built, widths = [], []

    class Recorder(nb._Searcher):
        def __init__(self, X, metric, backend, batch_size, device="cpu"):
            built.append((metric, backend, batch_size, device))
            super().__init__(X, metric, backend, batch_size)  # searched on the CPU whatever was named

        def search(self, qids, kk):
            widths.append(kk)
            return super().search(qids, kk)

    monkeypatch.setattr(nb, "_Searcher", Recorder)
    monkeypatch.setattr(crslib.device, "resolve_device", lambda device="auto": f"resolved {device}")
    X = _rng(19).normal(size=(40, 5))
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    for metric in ("cosine", "euclidean"):
        ids, scores = nb.knn_indices(
            X, k=4, metric=metric, backend="torch", batch_size=6, device="cuda:1", return_similarity=True)
        np.testing.assert_array_equal(ids, _brute_knn(X, 4, metric))
        # cosine similarity, and the Euclidean distance itself (not its negated square), in float32
        expected = ((unit[:, None, :] * unit[ids]).sum(-1) if metric == "cosine"
                    else np.sqrt(((X[:, None, :] - X[ids]) ** 2).sum(-1)))
        assert scores.dtype == np.float32
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    assert built == [("cosine", "torch", 6, "resolved cuda:1"), ("euclidean", "torch", 6, "resolved cuda:1")]

    # four patients of ten images, each patient's images nearest each other: the first search asks
    # for k + 1 + a margin of 3 + the 9 other images of the largest patient, and nothing widens
    groups = np.repeat(np.arange(4), 10)
    Xg = _rng(20).normal(size=(40, 5)) + 20.0 * np.eye(5)[groups]
    built.clear(), widths.clear()
    ids = nb.knn_indices(Xg, k=3, metric="euclidean", exclude_groups=groups)
    np.testing.assert_array_equal(ids, _brute_knn(Xg, 3, "euclidean", groups))
    assert built == [("euclidean", "auto", None, "cpu")] and set(widths) == {16}


def test_query_batch_keeps_one_batch_of_results_within_256_mib():
    # per query: kk candidates of a float32 score and an int64 id (12 bytes), and for torch the
    # query's float32 scores against all N rows; faiss at most 16,384 queries per call
    X = _rng(11).normal(size=(100, 4)).astype(np.float32)
    faiss_searcher, torch_searcher = nb._Searcher(X, "ip", "faiss", None), nb._Searcher(X, "ip", "torch", None)
    budget = 256 * 2**20
    assert faiss_searcher.query_batch(14) == 16384
    assert faiss_searcher.query_batch(200_000) == budget // (200_000 * 12) == 111
    # 1,400 candidates: the budget is not a multiple of 16,800 bytes, and the faiss index holds
    # the N rows (the query's scores against them are not counted)
    assert faiss_searcher.query_batch(1400) == budget // (1400 * 12) == 15_978
    assert torch_searcher.query_batch(14) == budget // (14 * 12 + 100 * 4) == 472_597
    assert faiss_searcher.query_batch(30_000_000) == torch_searcher.query_batch(30_000_000) == 1
    assert nb._Searcher(X, "ip", "torch", 7).query_batch(14) == 7
    assert isinstance(torch_searcher.query_batch(14), int)


def test_first_candidate_count_is_k_the_query_a_margin_and_the_largest_group():
    # k + 1 (the query finds itself) + a margin of max(3, k // 4); with groups, room for the largest
    # group's other images, at most 4 margins; never more than the N rows. Only the first search's
    # width: too few candidates widen the search, so the neighbours would not show a wrong count.
    assert nb._candidate_count(10, 1000, None) == 10 + 1 + 3
    assert nb._candidate_count(40, 1000, None) == 40 + 1 + 10
    assert nb._candidate_count(10, 12, None) == 12
    five = np.r_[np.zeros(5, int), np.arange(1, 50)]  # largest group: 5 images
    assert nb._candidate_count(10, 1000, five) == 10 + 1 + 3 + 4
    hundred = np.r_[np.zeros(100, int), np.arange(1, 50)]
    assert nb._candidate_count(10, 1000, hundred) == 10 + 1 + 3 + 4 * 3
    assert nb._candidate_count(10, 20, hundred) == 20


# --------------------------------------------------------------------------- kNN engine


@pytest.mark.parametrize("metric", ["cosine", "ip", "euclidean"])
def test_faiss_and_torch_agree_with_brute_force(metric):
    rng = _rng(6)
    X = rng.normal(size=(350, 20))
    X[10:20] = X[9]  # a block of duplicates
    X[40] = X[41]
    ref = _brute_knn(X, 12, metric)
    for backend in ("faiss", "torch"):
        for batch_size in (None, 13):
            I = nb.knn_indices(X, k=12, metric=metric, backend=backend, batch_size=batch_size)
            assert I.dtype == np.int64 and I.shape == (350, 12)
            assert np.array_equal(I, ref), (backend, batch_size)


def test_faiss_and_torch_agree_on_clustered_data_with_groups():
    rng = _rng(7)
    centers = rng.normal(size=(20, 32))
    X = centers[rng.integers(0, 20, 3000)] + 0.3 * rng.normal(size=(3000, 32))
    groups = rng.integers(0, 1000, 3000)
    a, sa = nb.knn_indices(X, k=10, exclude_groups=groups, backend="faiss", return_similarity=True)
    b, sb = nb.knn_indices(X, k=10, exclude_groups=groups, backend="torch", return_similarity=True)
    assert np.array_equal(a, b)
    np.testing.assert_allclose(sa, sb, atol=1e-5)
    assert np.all(np.diff(sa, axis=1) <= 1e-6)  # closest first


def test_tie_breaking_constant_blocks():
    rng = _rng(8)
    sizes = [6, 40, 3, 25]  # blocks of identical rows; 40 exceeds the first candidate list
    X = np.vstack([np.repeat(rng.normal(size=(1, 10)), s, axis=0) for s in sizes])
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    k = 2
    expected = []
    for start, size in zip(starts, sizes):
        block = np.arange(start, start + size)
        for q in block:
            expected.append(block[block != q][:k])
    expected = np.array(expected)
    for backend in ("faiss", "torch"):
        for batch_size in (None, 5):
            I = nb.knn_indices(X, k=k, backend=backend, batch_size=batch_size)
            assert np.array_equal(I, expected), (backend, batch_size)
    Xp = X[rng.permutation(len(X))]
    assert np.array_equal(nb.knn_indices(Xp, k=k), nb.knn_indices(Xp, k=k, backend="torch"))


def test_input_not_modified_and_memory_linear():
    X = _rng(9).normal(size=(5000, 16)).astype(np.float32)
    before = X.copy()
    tracemalloc.start()
    nb.knn_indices(X, k=10, backend="faiss")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(X, before)
    assert peak < 5000 * 5000 * 4 / 10  # far below an N x N float32 matrix (100 MB)


def test_bad_input_messages():
    X = _rng(10).normal(size=(5, 3))
    with pytest.raises(InputError, match=r"k=5 must be smaller than the number of images N=5"):
        nb.knn_indices(X, k=5)
    with pytest.raises(InputError, match="k=0 must be at least 1"):
        nb.knn_indices(X, k=0)
    bad = X.copy()
    bad[[1, 3], 0] = np.nan
    bad[4, 2] = np.inf
    with pytest.raises(InputError, match=r"NaN or infinite values in 3 row\(s\), first rows \[1, 3, 4\]"):
        nb.knn_indices(bad, k=2)
    zero = X.copy()
    zero[2] = 0
    with pytest.raises(InputError, match=r"all-zero row\(s\) \(first \[2\]\)"):
        nb.knn_indices(zero, k=2)
    zeros = zero.copy()
    zeros[4] = 0
    assert error_message(nb.knn_indices, zeros, k=2) == (
        "X has 2 all-zero row(s) (first [2, 4]), whose cosine similarity is undefined; check the encoder "
        "output (constant zero embeddings) or use metric='ip'")
    many_zeros = _rng(12).normal(size=(9, 3))
    many_zeros[[0, 1, 3, 4, 6, 7, 8]] = 0  # seven rows: the message lists the first five
    assert error_message(nb.knn_indices, many_zeros, k=1) == (
        "X has 7 all-zero row(s) (first [0, 1, 3, 4, 6]), whose cosine similarity is undefined; check the "
        "encoder output (constant zero embeddings) or use metric='ip'")
    for metric in ("cosine", "euclidean"):  # the name X whether or not the rows are normalised
        assert error_message(nb.knn_indices, bad[:2], k=1, metric=metric) == (
            "X has NaN or infinite values in 1 row(s), first rows [1]; drop or re-extract those images")
    assert nb.knn_indices(zero, k=2, metric="ip").shape == (5, 2)  # fine without normalisation
    with pytest.raises(InputError, match="row counts differ"):
        ag.mutual_knn_overlap(X, X[:4], k=2)
    with pytest.raises(InputError, match="2-D"):
        nb.knn_indices(X[0], k=1)
    with pytest.raises(InputError, match="metric"):
        nb.knn_indices(X, k=1, metric="manhattan")
    # the approximate search leaves the check to the preparation of the rows
    assert error_message(ann.approximate_knn_indices, X, k=1, metric="manhattan") == (
        "metric must be one of ('cosine', 'ip', 'euclidean'), got 'manhattan'")
    with pytest.raises(InputError, match="model 'b'"):
        ag.agreement_matrix({"a": X, "b": zero}, k=2)
    assert error_message(ag.overlap_from_indices, [[1, 1]], [[1, 2]]) == "I_a repeats a neighbour within row(s) [0]"
    assert error_message(ag.overlap_from_indices, [[1, 2]], [[0, 0]]) == "I_b repeats a neighbour within row(s) [0]"
    assert error_message(ag.overlap_from_indices, [[1, 2]], [[0, 1, 2]]) == (
        "I_a and I_b must have the same shape (N, k), got (1, 2) and (1, 3)")
    # positions are not indices: a float array or a single row of indices is refused, whatever its shape
    assert error_message(ag.overlap_from_indices, [[1.0, 2.0]], [[0, 1]]) == (
        "I_a must be a 2-D integer array of neighbour indices (N, k), got float64 (1, 2)")
    assert error_message(ag.overlap_from_indices, [[1, 2]], np.array([0, 1])) == (
        "I_b must be a 2-D integer array of neighbour indices (N, k), got int64 (2,)")
    # a repeat anywhere in any row is found and its row named; no columns is refused; one column is k = 1
    assert error_message(ag.overlap_from_indices, [[0, 1, 2], [1, 3, 3]], [[0, 1, 2], [0, 1, 2]]) == (
        "I_a repeats a neighbour within row(s) [1]")
    repeats = np.array([[0, 1]] * 8)
    repeats[[1, 2, 4, 5, 6, 7], 1] = 0  # six rows repeat a neighbour: the first five are named
    assert error_message(ag.overlap_from_indices, [[0, 1]] * 8, repeats) == (
        "I_b repeats a neighbour within row(s) [1, 2, 4, 5, 6]")
    assert error_message(ag.overlap_from_indices, np.zeros((2, 0), dtype=int), np.zeros((2, 0), dtype=int)) == (
        "I_a has no neighbour columns")
    np.testing.assert_array_equal(ag.overlap_from_indices([[1], [0]], [[1], [2]]), [1.0, 0.0])


# --------------------------------------------------------------------------- agreement matrix


def test_agreement_matrix_matches_pairs_and_searches_once_per_model(monkeypatch):
    rng = _rng(11)
    Z = rng.normal(size=(400, 8))
    emb = {
        "sup_s0": Z @ rng.normal(size=(8, 30)) + rng.normal(size=(400, 30)),
        "sup_s1": Z @ rng.normal(size=(8, 20)) + rng.normal(size=(400, 20)),
        "dino": Z @ rng.normal(size=(8, 16)) + 2 * rng.normal(size=(400, 16)),
        "random": rng.normal(size=(400, 12)),
    }
    calls = []
    real = nb.knn_indices

    def counting(X, **kw):
        calls.append(kw.get("k"))
        return real(X, **kw)

    monkeypatch.setattr(ann, "knn_indices", counting)
    res, per = ag.agreement_matrix(emb, k=10, return_per_image=True)
    assert len(calls) == 4
    monkeypatch.setattr(ann, "knn_indices", real)
    assert isinstance(res, ag.AgreementMatrix)
    assert (res.k, res.n_images, res.models, res.overlap_error_bound) == (10, 400, list(emb), {})
    assert res.max_error_bound == 0.0
    A = res.overlap
    names = list(emb)
    assert list(A.index) == names and list(A.columns) == names
    assert A.index.name == A.columns.name == "model"  # the CSV's header cell
    assert np.allclose(np.diag(A), 1.0) and np.allclose(A, A.T)
    assert per.shape == (400, 6) and per.columns.names == ["model_a", "model_b"]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert A.loc[a, b] == pytest.approx(ag.mutual_knn_overlap(emb[a], emb[b], k=10))
            np.testing.assert_array_equal(per[(a, b)], ag.mutual_knn_overlap_per_image(emb[a], emb[b], k=10))
    assert A.loc["sup_s0", "sup_s1"] > A.loc["sup_s0", "random"]


def test_overlap_from_indices_and_jaccard():
    I_a = np.array([[1, 2, 3], [0, 2, 3]])
    I_b = np.array([[3, 2, 9], [7, 8, 9]])
    np.testing.assert_allclose(ag.overlap_from_indices(I_a, I_b), [2 / 3, 0])
    X = _rng(12).normal(size=(200, 6))
    assert sim.jaccard_knn(X, 2 * X, k=5) == 1.0
    Y = X + _rng(13).normal(size=(200, 6))
    per = ag.mutual_knn_overlap_per_image(X, Y, k=5)
    assert sim.jaccard_knn(X, Y, k=5) == pytest.approx(np.mean(5 * per / (10 - 5 * per)))


def test_k_sweep_and_chance():
    rng = _rng(14)
    X = rng.normal(size=(60, 5))
    res = ag.k_sweep(X, X + 0.5 * rng.normal(size=(60, 5)), ks=(1, 5, 10, 100))
    t = res.table
    assert t["k"].tolist() == [1, 5, 10] and res.dropped_k == [100]
    np.testing.assert_allclose(t["chance"], np.array([1, 5, 10]) / 59)
    assert (t["overlap"] > t["chance"]).all()
    assert ag.chance_overlap(11, 10) == 1.0
    with pytest.raises(InputError):
        ag.chance_overlap(10, 10)
    # prefixes equal separate searches
    for kv in (1, 5):
        Ia = nb.knn_indices(X, k=10)[:, :kv]
        assert np.array_equal(Ia, nb.knn_indices(X, k=kv))


def test_overlap_ci_over_patients_wider():
    rng = _rng(15)
    patients = np.repeat(np.arange(100), 5)
    per = np.repeat(rng.random(100), 5)
    by_image = ag.overlap_ci(per, n_resamples=300)
    by_patient = ag.overlap_ci(per, groups=patients, n_resamples=300)
    assert by_image.estimate == by_patient.estimate == pytest.approx(per.mean())
    assert (by_patient.high - by_patient.low) > 1.5 * (by_image.high - by_image.low)


# --------------------------------------------------------------------------- CKA, CKNNA


def _hsic_u(K, L):
    m = len(K)
    K, L = K.copy(), L.copy()
    np.fill_diagonal(K, 0)
    np.fill_diagonal(L, 0)
    return (np.sum(K * L.T) + K.sum() * L.sum() / ((m - 1) * (m - 2)) - 2 * np.sum(K @ L) / (m - 2)) / (m * (m - 3))


def test_linear_cka_invariances_and_independence():
    rng = _rng(16)
    X = rng.normal(size=(500, 20))
    Q, _ = np.linalg.qr(rng.normal(size=(20, 20)))
    assert sim.linear_cka(X, 3.0 * X @ Q) == pytest.approx(1.0, abs=1e-9)
    assert sim.linear_cka(X, 3.0 * X @ Q, debiased=False) == pytest.approx(1.0, abs=1e-9)
    Xi, Yi = rng.normal(size=(1000, 64)), rng.normal(size=(1000, 64))
    assert abs(sim.linear_cka(Xi, Yi)) < 0.02
    assert sim.linear_cka(Xi, Yi, debiased=False) > 0.03  # the bias the debiased estimator removes


def test_linear_cka_matches_gram_formula():
    rng = _rng(17)
    X = rng.normal(size=(60, 7))
    Y = X @ rng.normal(size=(7, 5)) + rng.normal(size=(60, 5))
    K, L = X @ X.T, Y @ Y.T
    expected = _hsic_u(K, L) / np.sqrt(_hsic_u(K, K) * _hsic_u(L, L))
    assert sim.linear_cka(X, Y) == pytest.approx(expected, rel=1e-9)


def _cknna_dense(A, B, k):
    """Dense port of Huh et al. (2024)'s reference cknna (unbiased, no 1e-6 guard)."""
    A = A / np.linalg.norm(A, axis=1, keepdims=True)
    B = B / np.linalg.norm(B, axis=1, keepdims=True)
    n = len(A)
    K, L = A @ A.T, B @ B.T

    def sim(K, L):
        masks = []
        for M in (K, L):
            Mh = M.copy()
            np.fill_diagonal(Mh, -np.inf)
            idx = np.argsort(-Mh, axis=1, kind="stable")[:, :k]
            mask = np.zeros((n, n))
            np.put_along_axis(mask, idx, 1, axis=1)
            masks.append(mask)
        m = masks[0] * masks[1]
        return _hsic_u(m * K, m * L)

    return sim(K, L) / np.sqrt(sim(K, K) * sim(L, L))


def test_cknna_identical_and_reference():
    rng = _rng(18)
    X = rng.normal(size=(300, 10))
    assert sim.cknna(X, X, k=10) == pytest.approx(1.0, abs=1e-12)
    Y = X + 0.8 * rng.normal(size=(300, 10))
    assert sim.cknna(X, Y, k=10) == pytest.approx(_cknna_dense(X, Y, 10), rel=1e-6)
    with pytest.raises(InputError, match="k >= 2"):
        sim.cknna(X, Y, k=1)


# --------------------------------------------------------------------------- subgroups


def _meta(n, seed=0):
    rng = _rng(seed)
    return pd.DataFrame(
        {
            "source": rng.choice(["siteA", "siteB", "siteC", "siteD"], n),
            "view": rng.choice(["PA", "AP"], n),
            "effusion": rng.integers(0, 2, n),
        }
    )


def test_variance_share_source_only():
    n = 2000
    meta = _meta(n)
    effect = meta["source"].map({"siteA": 0.05, "siteB": 0.10, "siteC": 0.20, "siteD": 0.30}).to_numpy()
    per = effect + _rng(1).normal(0, 0.005, n)
    t = sg.overlap_variance_shares(per, meta, columns=["source", "view", "effusion"], n_resamples=100).set_index("factor")
    assert t.loc["source", "share_alone"] > 0.98
    assert t.loc["source", "share_unique"] > 0.97
    assert t.loc["view", "share_alone"] < 0.01 and t.loc["view", "share_unique"] < 0.01
    assert t.loc["effusion", "share_alone"] < 0.01
    assert t.loc["source", "share_alone_low"] <= t.loc["source", "share_alone"] <= t.loc["source", "share_alone_high"]
    assert t.loc["(all factors)", "share_alone"] > 0.98
    assert t.loc["source", "n_levels"] == 4


def test_overlap_by_subgroup():
    meta = _meta(400, seed=2)
    per = np.where(meta["view"] == "PA", 0.3, 0.1)
    t = sg.overlap_by_subgroup(per, meta, columns=["view", "source"], n_resamples=100)
    view = t[t.column == "view"].set_index("level")
    assert view.loc["PA", "mean"] == pytest.approx(0.3) and view.loc["AP", "mean"] == pytest.approx(0.1)
    assert view["n"].sum() == 400
    assert set(t[t.column == "source"].level) == {"siteA", "siteB", "siteC", "siteD"}
    with pytest.raises(InputError, match="no column"):
        sg.overlap_by_subgroup(per, meta, columns=["sex"])
    with pytest.raises(InputError, match="rows"):
        sg.overlap_by_subgroup(per[:10], meta, columns=["view"])


# --------------------------------------------------------------------------- accuracy, convergence


def test_linear_probe_auroc_handles_degenerate_findings():
    rng = _rng(19)
    n = 600
    X = rng.normal(size=(n, 10))
    patients = np.repeat(np.arange(200), 3)
    labels = pd.DataFrame(
        {
            "effusion": (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int),
            "never": np.zeros(n, int),
            "noise": rng.integers(0, 2, n),
        }
    )
    res = probes.linear_probe_auroc(X, labels, groups=patients, random_state=0)
    auc = res.auroc
    assert auc.name == "auroc" and auc.index.name == "finding" and list(auc.index) == list(labels.columns)
    assert auc["effusion"] > 0.9
    assert np.isnan(auc["never"]) and "single class" in res.reasons["never"]
    assert set(res.reasons) == {"never"}
    assert res.n_train + res.n_test == n and res.n_test > 0
    assert 0.35 < auc["noise"] < 0.65
    with pytest.raises(InputError, match="no finding could be evaluated"):
        probes.linear_probe_auroc(X, labels[["never"]], groups=patients)
    with pytest.raises(InputError, match="0/1"):
        probes.linear_probe_auroc(X, labels.assign(effusion=2), groups=patients)


def test_accuracy_agreement_association():
    acc = pd.Series({"m1": 0.70, "m2": 0.74, "m3": 0.78, "m4": 0.81, "m5": 0.86, "m6": 0.90})
    d = np.abs(acc.values[:, None] - acc.values[None, :])
    agreement = pd.DataFrame(1 - d, index=acc.index, columns=acc.index)
    res = ag.accuracy_agreement_association(agreement, acc)
    assert res["spearman_r"] == pytest.approx(-1.0) and res["mantel_r"] == pytest.approx(-1.0)
    assert res["exact"] and res["n_permutations"] == 720 and res["mantel_p"] < 0.01
    assert res["n_pairs"] == 15
    with pytest.raises(InputError, match="no value for model"):
        ag.accuracy_agreement_association(agreement, acc.drop("m3"))


def test_convergence_table():
    info = pd.DataFrame(
        {
            "name": ["sup0", "sup1", "sup2", "dino0", "dino1", "big_sup0"],
            "objective": ["supervised"] * 3 + ["dino"] * 2 + ["supervised"],
            "seed": [0, 1, 2, 0, 1, 0],
            "architecture": ["small"] * 5 + ["large"],
        }
    )
    names = info["name"].tolist()
    vals = np.full((6, 6), 0.05)
    np.fill_diagonal(vals, 1.0)
    A = pd.DataFrame(vals, index=names, columns=names)
    for a, b, v in [("sup0", "sup1", 0.08), ("sup0", "sup2", 0.10), ("sup1", "sup2", 0.06), ("dino0", "dino1", 0.6)]:
        A.loc[a, b] = A.loc[b, a] = v
    t = ag.convergence_table(A, info).set_index(["architecture", "objective"])
    assert t.loc[("small", "supervised"), "within_mean"] == pytest.approx(0.08)
    assert t.loc[("small", "supervised"), "within_min"] == pytest.approx(0.06)
    assert t.loc[("small", "supervised"), "n_across"] == 6
    assert t.loc[("small", "dino"), "within_mean"] == pytest.approx(0.6)
    assert t.loc[("small", "(all)"), "n_within"] == 4 and t.loc[("small", "(all)"), "across_mean"] == pytest.approx(0.05)
    assert t.loc[("large", "supervised"), "n_within"] == 0
    with pytest.raises(InputError, match="lacks column"):
        ag.convergence_table(A, info.drop(columns="seed"))
    pairs = ag.convergence_pairs(A, info)
    assert len(pairs) == 10  # C(5, 2) small pairs; big_sup0 has no partner of its architecture
    assert "big_sup0" not in set(pairs["model_a"]) | set(pairs["model_b"])
    row = pairs[(pairs.model_a == "sup0") & (pairs.model_b == "sup2")].iloc[0]
    assert row["overlap"] == pytest.approx(0.10) and (row["seed_a"], row["seed_b"]) == (0, 2)
    assert row["objective_a"] == row["objective_b"] == "supervised"
    # the table is the pairs, aggregated
    sup = pairs[(pairs.objective_a == "supervised") & (pairs.objective_b == "supervised")]
    assert t.loc[("small", "supervised"), "within_max"] == sup["overlap"].max()
    with pytest.raises(InputError, match="no row for model"):
        ag.convergence_pairs(A, info.iloc[1:])


# --------------------------------------------------------------------------- result objects


def _zoo_result():
    rng = _rng(41)
    Z = rng.normal(size=(150, 6))
    emb = {
        "sup0": Z @ rng.normal(size=(6, 12)) + 0.5 * rng.normal(size=(150, 12)),
        "sup1": Z @ rng.normal(size=(6, 10)) + 0.5 * rng.normal(size=(150, 10)),
        "dino0": Z @ rng.normal(size=(6, 8)) + 2.0 * rng.normal(size=(150, 8)),
        "dino1": Z @ rng.normal(size=(6, 8)) + 2.0 * rng.normal(size=(150, 8)),
        "random": rng.normal(size=(150, 9)),
    }
    return emb, ag.agreement_matrix(emb, k=5)


def test_agreement_matrix_result_copies_and_serialises():
    emb, res = _zoo_result()
    assert res.models == list(emb) and res.k == 5 and res.n_images == 150
    assert set(res.search) == set(emb) and all(s["index"] == "exact" for s in res.search.values())
    assert res.overlap_error_bound == {} and res.max_error_bound == 0.0
    frame = res.to_frame()
    pd.testing.assert_frame_equal(frame, res.overlap)
    before = res.overlap.copy()
    frame.iloc[0, 1] = -1.0
    frame["extra"] = 0.0
    pd.testing.assert_frame_equal(res.overlap, before)
    text = res.to_json()
    d = json.loads(text)
    assert text.endswith("}\n") and d == res.to_dict()
    assert d["models"] == list(emb) and d["k"] == 5 and d["n_images"] == 150
    np.testing.assert_array_equal(np.array(d["overlap"]), res.overlap.to_numpy())
    assert d["overlap_error_bound"] == {}
    assert d["search"]["sup0"]["index"] == "exact" and set(d["search"]) == set(emb)
    with pytest.raises(AttributeError):
        res.k = 10  # frozen
    # a bound makes max_error_bound its largest value
    bounded = ag.AgreementMatrix(res.overlap, k=5, n_images=150, overlap_error_bound={"sup0|sup1": 0.1, "a|b": 0.3})
    assert bounded.max_error_bound == 0.3 and bounded.to_dict()["overlap_error_bound"]["a|b"] == 0.3


def test_functions_taking_an_agreement_matrix_accept_the_result_or_its_frame():
    _, res = _zoo_result()
    acc = pd.Series({"sup0": 0.80, "sup1": 0.82, "dino0": 0.70, "dino1": 0.72, "random": 0.55})
    by_result = ag.accuracy_agreement_association(res, acc, n_permutations=99)
    assert by_result == ag.accuracy_agreement_association(res.overlap, acc, n_permutations=99)
    assert by_result["n_models"] == 5
    info = pd.DataFrame({"name": ["sup0", "sup1", "dino0", "dino1", "random"],
                         "objective": ["sup", "sup", "dino", "dino", "random"], "seed": [0, 1, 0, 1, 0],
                         "architecture": "small"})
    pairs = ag.convergence_pairs(res, info)
    pd.testing.assert_frame_equal(pairs, ag.convergence_pairs(res.overlap, info))
    assert len(pairs) == 10
    table = ag.convergence_table(res, info)
    pd.testing.assert_frame_equal(table, ag.convergence_table(res.overlap, info))
    assert table.set_index("objective").loc["dino", "within_mean"] == pytest.approx(res.overlap.loc["dino0", "dino1"])
    with pytest.raises(InputError, match="AgreementMatrix"):
        ag.accuracy_agreement_association(res.overlap.to_numpy(), acc)
    with pytest.raises(InputError, match="AgreementMatrix"):
        ag.convergence_table({"not": "a matrix"}, info)


def test_k_sweep_result_copies_and_serialises():
    X = _rng(42).normal(size=(40, 4))
    res = ag.k_sweep(X, X + 0.3 * _rng(43).normal(size=(40, 4)), ks=(2, 5, 39, 50))
    assert isinstance(res, ag.KSweep) and res.dropped_k == [50]
    assert list(res.table.columns) == ["k", "overlap", "chance", "overlap_over_chance"]
    frame = res.to_frame()
    pd.testing.assert_frame_equal(frame, res.table)
    frame.loc[0, "overlap"] = -1.0
    assert res.table.loc[0, "overlap"] != -1.0
    d = json.loads(res.to_json())
    assert d["dropped_k"] == [50]
    assert [row["k"] for row in d["table"]] == [2, 5, 39]
    assert [row["overlap"] for row in d["table"]] == res.table["overlap"].tolist()
    assert ag.k_sweep(X, X, ks=(1, 2)).dropped_k == []


def test_probe_auroc_result_copies_and_serialises():
    rng = _rng(44)
    X = rng.normal(size=(300, 6))
    labels = pd.DataFrame({"effusion": (X[:, 0] > 0).astype(int), "never": np.zeros(300, int)})
    res = probes.linear_probe_auroc(X, labels, groups=np.arange(300) // 3, random_state=0)
    assert isinstance(res, probes.ProbeAUROC)
    frame = res.to_frame()
    assert frame.columns.tolist() == ["finding", "auroc", "reason", "n_train", "n_test"]
    assert frame["finding"].tolist() == ["effusion", "never"]
    assert frame["auroc"].iloc[0] == res.auroc["effusion"] and np.isnan(frame["auroc"].iloc[1])
    assert frame["reason"].tolist() == ["", res.reasons["never"]]
    assert (frame["n_train"] == res.n_train).all() and (frame["n_test"] == res.n_test).all()
    before = res.auroc.copy()
    frame.loc[0, "auroc"] = -1.0
    pd.testing.assert_series_equal(res.auroc, before)
    d = json.loads(res.to_json())
    assert d["auroc"] == {"effusion": res.auroc["effusion"], "never": None}
    assert d["reasons"] == {"never": res.reasons["never"]}
    assert (d["n_train"], d["n_test"]) == (res.n_train, res.n_test) and res.n_train + res.n_test == 300


# --------------------------------------------------------------------------- known answers that kill mutants


def test_group_exclusion_applies_to_both_models():
    """X against itself stays 1.0 with groups; each side excludes its own group."""
    rng = _rng(21)
    n = 240
    groups = np.repeat(np.arange(80), 3)
    X = rng.normal(size=(n, 12))
    X[1::3] = X[::3] + 0.01 * rng.normal(size=(n // 3, 12))  # same-patient near-twins rank first
    per = ag.mutual_knn_overlap_per_image(X, X.copy(), k=5, exclude_groups=groups)
    assert np.all(per == 1.0)
    assert ag.mutual_knn_overlap(X, X, k=5, exclude_groups=groups) == 1.0
    # against brute force on two different models
    Y = X @ rng.normal(size=(12, 12)) + 0.5 * rng.normal(size=(n, 12))
    A, B = _brute_knn(X, 5, groups=groups), _brute_knn(Y, 5, groups=groups)
    expected = np.array([len(set(a) & set(b)) / 5 for a, b in zip(A, B)])
    got = ag.mutual_knn_overlap_per_image(X, Y, k=5, exclude_groups=groups)
    assert np.allclose(got, expected)
    assert sim.jaccard_knn(X, X, k=5, exclude_groups=groups) == 1.0


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_permutation_null_equals_overlap_with_shuffled_rows(metric):
    """Each null value is the overlap of A with B's rows permuted, computed from scratch."""
    rng = _rng(22)
    n, k = 150, 5
    Xa = rng.normal(size=(n, 8)) * rng.uniform(0.2, 5.0, size=(n, 1))  # row norms vary: the metrics differ
    Xb = Xa @ rng.normal(size=(8, 8)) + 0.3 * rng.normal(size=(n, 8))  # related: the null must break it
    res = ag.permutation_null(Xa, Xb, k=k, n_permutations=6, random_state=3, metric=metric)
    perm_rng = np.random.default_rng(3)
    direct = [ag.mutual_knn_overlap(Xa, Xb[perm_rng.permutation(n)], k=k, metric=metric) for _ in range(6)]
    assert np.allclose(res.values, direct)
    assert res.mean == pytest.approx(np.mean(direct))
    assert ag.mutual_knn_overlap(Xa, Xb, k=k, metric=metric) > res.high


def test_permutation_null_interval_is_two_sided():
    rng = _rng(23)
    X = rng.normal(size=(120, 6))
    res = ag.permutation_null(X, rng.normal(size=(120, 6)), k=5, n_permutations=40, confidence=0.8)
    assert res.low == pytest.approx(np.percentile(res.values, 10))
    assert res.high == pytest.approx(np.percentile(res.values, 90))


def test_k_sweep_equals_separate_overlaps_with_and_without_groups():
    rng = _rng(50)
    X = rng.normal(size=(48, 6))
    Y = X + 0.8 * rng.normal(size=(48, 6))
    groups = np.repeat(np.arange(16), 3)
    for exclude in (None, groups):
        res = ag.k_sweep(X, Y, ks=(5, 1, 5, 3), exclude_groups=exclude, metric="euclidean")
        assert res.table["k"].tolist() == [1, 3, 5] and res.dropped_k == []
        for row in res.table.itertuples():
            separate = ag.mutual_knn_overlap(X, Y, k=row.k, exclude_groups=exclude, metric="euclidean")
            assert row.overlap == pytest.approx(separate)
            assert row.overlap_over_chance == pytest.approx(row.overlap / row.chance)
    # the metric reaches the search: rows rescaled differently keep cosine neighbours, not euclidean ones
    scaled = X * rng.uniform(0.2, 5.0, size=(48, 1))
    assert ag.k_sweep(X, scaled, ks=(5,)).table["overlap"].iloc[0] == 1.0
    assert ag.k_sweep(X, scaled, ks=(5,), metric="euclidean").table["overlap"].iloc[0] < 0.9


def test_k_sweep_chance_and_limit_follow_the_groups():
    rng = _rng(51)
    X, Y = rng.normal(size=(48, 6)), rng.normal(size=(48, 6))
    groups = np.repeat(np.arange(16), 3)
    t = ag.k_sweep(X, Y, ks=(3,), exclude_groups=groups).table
    assert t["chance"].iloc[0] == pytest.approx(3 / 45)  # k / (N - own group of 3)
    res = ag.k_sweep(X, Y, ks=(45, 46), exclude_groups=groups)  # 45 candidates left per image
    assert res.table["k"].tolist() == [45] and res.dropped_k == [46]
    res = ag.k_sweep(X, Y, ks=(47, 48))  # no groups: N - 1 = 47 candidates
    assert res.table["k"].tolist() == [47] and res.dropped_k == [48]
    uneven = np.array([0] * 8 + list(range(1, 41)))
    t = ag.k_sweep(X, Y, ks=(2,), exclude_groups=uneven).table
    assert t["chance"].iloc[0] == pytest.approx(np.mean(2 / (48 - np.array([8] * 8 + [1] * 40))))
    assert ag.k_sweep(X, Y, ks=(40, 41), exclude_groups=uneven).dropped_k == [41]  # the largest group sets it


@pytest.mark.parametrize("kwargs, message", [
    ({"ks": (0,)}, "ks must hold integers >= 1, got 0"),
    ({"ks": (True,)}, "ks must hold integers >= 1, got True"),
    ({"ks": (2.0,)}, "ks must hold integers >= 1, got 2.0"),
    ({"ks": (100,)}, r"no k in \[100\] is below the number of candidate neighbours \(29\)"),
    ({"ks": (2,), "exclude_groups": np.arange(29)}, r"exclude_groups must be 1-D with one label per image \(30\)"),
    ({"ks": (2,), "exclude_groups": np.arange(30).reshape(15, 2)}, "exclude_groups must be 1-D"),
    ({"ks": (2,), "exclude_groups": np.array([1.0] * 29 + [np.nan])}, "exclude_groups has missing labels"),
])
def test_k_sweep_refuses_bad_input(kwargs, message):
    X = _rng(52).normal(size=(30, 4))
    with pytest.raises(InputError, match=message):
        ag.k_sweep(X, X, **kwargs)


def test_permutation_null_defaults_metric_and_messages():
    rng = _rng(53)
    Xa = rng.normal(size=(40, 5))
    Xb = Xa * rng.uniform(0.2, 5.0, size=(40, 1)) + 0.3 * rng.normal(size=(40, 5))
    default = ag.permutation_null(Xa, Xb)
    explicit = ag.permutation_null(Xa, Xb, k=10, n_permutations=20, random_state=0, confidence=0.95,
                                   metric="cosine")
    np.testing.assert_array_equal(default.values, explicit.values)
    assert default.values.shape == (20,) and default.chance == pytest.approx(10 / 39)
    assert default.confidence == 0.95 and ag.permutation_null(Xa, Xb, confidence=0.8).confidence == 0.8
    euclidean = ag.permutation_null(Xa, Xb, metric="euclidean")
    assert not np.array_equal(euclidean.values, default.values)  # the metric reaches both searches
    with pytest.raises(InputError, match="n_permutations"):
        ag.permutation_null(Xa, Xb, n_permutations=0)
    with pytest.raises(InputError, match="X_a.*X_b|X_b.*X_a"):
        ag.permutation_null(Xa, Xb[:-1])


def test_k_sweep_default_ks():
    X = _rng(54).normal(size=(60, 4))
    res = ag.k_sweep(X, X + 0.5 * _rng(55).normal(size=(60, 4)))
    assert res.table["k"].tolist() == [1, 5, 10, 20, 50] and res.dropped_k == [100]


def test_accuracy_association_is_the_mantel_test_of_accuracy_gaps():
    from crslib import stats

    rng = _rng(56)
    names = [f"m{i}" for i in range(8)]  # 8! orderings: the permutations are drawn, not enumerated
    acc = pd.Series(rng.uniform(0.6, 0.9, size=8), index=names)
    gaps = np.abs(acc.to_numpy()[:, None] - acc.to_numpy()[None, :])
    noise = rng.normal(scale=0.05, size=(8, 8))
    agreement = pd.DataFrame(0.5 - gaps + (noise + noise.T) / 2, index=names, columns=names)
    res = ag.accuracy_agreement_association(agreement, acc)
    mantel = stats.mantel_test(agreement.to_numpy(), gaps, n_permutations=999, method="spearman", random_state=0)
    assert (res["mantel_r"], res["mantel_p"], res["n_permutations"]) == (mantel.r, mantel.p_value, 999)
    assert res["n_pairs"] == 28 and isinstance(res["n_pairs"], int) and res["n_models"] == 8
    assert res["method"] == "spearman" and not res["exact"]
    pearson = ag.accuracy_agreement_association(agreement, acc, method="pearson", n_permutations=50, random_state=3)
    reference = stats.mantel_test(agreement.to_numpy(), gaps, n_permutations=50, method="pearson", random_state=3)
    assert (pearson["mantel_r"], pearson["mantel_p"], pearson["method"]) == (reference.r, reference.p_value,
                                                                              "pearson")
    with pytest.raises(InputError, match="accuracy must be a pandas Series indexed by model name"):
        ag.accuracy_agreement_association(agreement, acc.to_numpy())
    with pytest.raises(InputError, match=r"accuracy is NaN for model\(s\) \['m2'\]; drop them"):
        ag.accuracy_agreement_association(agreement, acc.astype(object).where(acc.index != "m2", "n/a"))


def test_convergence_table_counts_seed_pairs_only_and_every_column():
    info = pd.DataFrame({
        "name": ["a0", "a1", "a0_recipe", "b0", "b1", "c0"],
        "objective": ["sup", "sup", "sup", "dino", "dino", 7],  # a non-string objective sorts by its text
        "seed": [0, 1, 0, 0, 1, 0],
        "architecture": "small",
    })
    names = info["name"].tolist()
    A = pd.DataFrame(0.2, index=names, columns=names)
    for a, b, v in [("a0", "a1", 0.0), ("a0", "a0_recipe", 0.9), ("a1", "a0_recipe", 0.4), ("b0", "b1", 0.6)]:
        A.loc[a, b] = A.loc[b, a] = v
    t = ag.convergence_table(A, info)
    assert list(t.columns) == ["architecture", "objective", "n_models", "within_mean", "within_min", "within_max",
                               "n_within", "across_mean", "n_across", "within_minus_across"]
    assert t["objective"].tolist() == [7, "dino", "sup", "(all)"]
    t = t.set_index("objective")
    # a0 vs a0_recipe share the seed: not a seed pair; a0 vs a1 agree 0.0 and still count
    assert t.loc["sup", "n_within"] == 2 and t.loc["sup", "within_mean"] == pytest.approx(0.2)
    assert t.loc["sup", "within_min"] == 0.0 and t.loc["sup", "n_models"] == 3
    assert t.loc["sup", "n_across"] == 9 and t.loc["sup", "across_mean"] == pytest.approx(0.2)
    assert t.loc["dino", "within_minus_across"] == pytest.approx(0.6 - 0.2)
    assert t.loc[7, "n_within"] == 0 and np.isnan(t.loc[7, "within_mean"]) and t.loc[7, "n_models"] == 1
    assert t.loc["(all)", "n_models"] == 6 and t.loc["(all)", "n_within"] == 3
    assert t.loc["(all)", "within_mean"] == pytest.approx((0.0 + 0.4 + 0.6) / 3)
    assert t.loc["(all)", "within_minus_across"] == pytest.approx((1.0 / 3) - 0.2)


def test_agreement_matrix_to_dict_holds_every_field():
    rng = _rng(57)
    X = rng.normal(size=(30, 4))
    res = ag.agreement_matrix({"a": X, "b": X + 0.5 * rng.normal(size=(30, 4)), "c": rng.normal(size=(30, 4))}, k=4)
    d = res.to_dict()
    assert set(d) == {"models", "k", "n_images", "overlap", "search", "overlap_error_bound"}
    assert d["models"] == ["a", "b", "c"] and d["k"] == 4 and d["n_images"] == 30
    assert d["overlap"] == res.overlap.to_numpy().tolist() and d["overlap"][0][0] == 1.0
    assert d["search"] == json.loads(json.dumps(res.search)) and set(d["search"]) == {"a", "b", "c"}
    assert d["overlap_error_bound"] == {}  # exact search everywhere
    assert json.loads(res.to_json()) == d


def test_overlap_ci_defaults_and_arguments_reach_the_bootstrap():
    from crslib import stats

    rng = _rng(58)
    per = rng.random(200)
    patients = np.repeat(np.arange(40), 5)
    default = ag.overlap_ci(per)
    explicit = stats.bootstrap_ci(np.mean, per, n_resamples=1000, confidence=0.95, random_state=0)
    assert (default.low, default.high) == (explicit.low, explicit.high)
    given = ag.overlap_ci(per, groups=patients, n_resamples=150, confidence=0.8, random_state=5)
    reference = stats.bootstrap_ci(np.mean, per, groups=patients, n_resamples=150, confidence=0.8, random_state=5)
    assert (given.low, given.high) == (reference.low, reference.high)


def test_agreement_frames_must_be_square_in_one_order():
    acc = pd.Series({"a": 0.7, "b": 0.8, "c": 0.9})
    square = pd.DataFrame(np.eye(3), index=list("abc"), columns=list("abc"))
    message = "agreement must be square with the same model names, in the same order, on rows and columns"
    with pytest.raises(InputError, match=message):
        ag.accuracy_agreement_association(square[["b", "a", "c"]], acc)
    with pytest.raises(InputError, match=message):
        ag.accuracy_agreement_association(square.iloc[:, :2], acc)
    with pytest.raises(InputError, match="or a square DataFrame labelled by model name"):
        ag.accuracy_agreement_association(np.eye(3), acc)


def test_chance_overlap_bounds_and_the_default_k():
    assert ag.chance_overlap(2, 1) == 1.0  # the smallest data set: one candidate, always shared
    assert ag.chance_overlap(np.int64(101), 10) == pytest.approx(0.1)
    for bad in (1, True, 2.0, "3"):
        with pytest.raises(InputError, match=r"n must be an integer >= 2 \(number of images\), got"):
            ag.chance_overlap(bad, 1)
    X = _rng(59).normal(size=(40, 4))
    Y = X + _rng(60).normal(size=(40, 4))
    assert ag.mutual_knn_overlap(X, Y) == ag.mutual_knn_overlap(X, Y, k=10)
    assert ag.mutual_knn_overlap(X, Y) != ag.mutual_knn_overlap(X, Y, k=11)


def test_convergence_pairs_skip_other_architectures_and_check_model_info():
    info = pd.DataFrame({"name": ["wide0", "s0", "s1", "s2"], "objective": ["sup", "sup", "sup", "ssl"],
                         "seed": [0, 0, 1, 0], "architecture": ["wide", "small", "small", "small"]})
    names = info["name"].tolist()
    A = pd.DataFrame(0.3, index=names, columns=names)
    pairs = ag.convergence_pairs(A, info)
    # wide0 comes first and has no partner: the small pairs after it are all kept
    assert sorted(zip(pairs["model_a"], pairs["model_b"])) == [("s0", "s1"), ("s0", "s2"), ("s1", "s2")]
    alone = ag.convergence_pairs(A.loc[["wide0", "s0"], ["wide0", "s0"]], info)
    assert alone.empty and list(alone.columns) == ["model_a", "model_b", "architecture", "objective_a",
                                                   "objective_b", "seed_a", "seed_b", "overlap"]
    assert error_message(ag.convergence_pairs, A, info.to_dict()) == (
        "model_info must be a DataFrame with columns name, objective, seed, architecture")
    with pytest.raises(InputError, match=r"model_info lists model\(s\) \['s1'\] more than once"):
        ag.convergence_pairs(A, pd.concat([info, info.iloc[[2]]]))
    with pytest.raises(InputError, match=r"model_info has no row for model\(s\) \['s2'\]"):
        ag.convergence_pairs(A, info.iloc[:3])


# --------------------------------------------------------------------------- chance and null with a group exclusion


def test_chance_overlap_with_groups_is_k_over_the_candidates_outside_the_patient():
    pairs = np.repeat(np.arange(50), 2)  # 2 images per patient, N = 100
    assert ag.chance_overlap(100, 10, exclude_groups=pairs) == pytest.approx(10 / 98, rel=1e-14)
    assert ag.chance_overlap(100, 10, exclude_groups=np.arange(100)) == pytest.approx(10 / 99, rel=1e-14)
    uneven = np.array([0] * 20 + list(range(1, 81)))  # one patient of 20, 80 of one image
    expected = (20 * 10 / 80 + 80 * 10 / 99) / 100
    assert ag.chance_overlap(100, 10, exclude_groups=uneven) == pytest.approx(expected, rel=1e-12)
    # the same rule as k_sweep's chance column
    X = _rng(70).normal(size=(100, 4))
    assert ag.k_sweep(X, X, ks=(10,), exclude_groups=uneven).table["chance"].iloc[0] == pytest.approx(expected)
    with pytest.raises(InputError, match=r"exclude_groups must be 1-D with one label per image \(100\)"):
        ag.chance_overlap(100, 10, exclude_groups=pairs[:-1])
    with pytest.raises(InputError, match="leaves too few candidates"):
        ag.chance_overlap(100, 10, exclude_groups=np.repeat([0, 1], [91, 9]))


def test_permutation_null_with_groups_excludes_the_querys_patient():
    """Each null value is the overlap of A with B's rows permuted, the patient exclusion by row position."""
    rng = _rng(71)
    n, k = 120, 5
    groups = np.repeat(np.arange(30), 4)
    Xa = rng.normal(size=(n, 8)) + 2.0 * np.repeat(rng.normal(size=(30, 8)), 4, axis=0)  # patients cluster
    Xb = Xa @ rng.normal(size=(8, 8)) + 0.3 * rng.normal(size=(n, 8))
    res = ag.permutation_null(Xa, Xb, k=k, n_permutations=6, random_state=3, exclude_groups=groups)
    perm_rng = np.random.default_rng(3)
    direct = [ag.mutual_knn_overlap(Xa, Xb[perm_rng.permutation(n)], k=k, exclude_groups=groups) for _ in range(6)]
    assert np.allclose(res.values, direct)
    assert res.chance == pytest.approx(k / (n - 4))


def test_permutation_null_with_large_groups_sits_at_the_group_aware_chance():
    rng = _rng(72)
    n, k = 100, 10
    groups = np.repeat(np.arange(5), 20)  # 20 images per patient
    Xa, Xb = rng.normal(size=(n, 16)), rng.normal(size=(n, 16))
    null = ag.permutation_null(Xa, Xb, k=k, n_permutations=400, random_state=0, exclude_groups=groups)
    group_chance = ag.chance_overlap(n, k, exclude_groups=groups)
    assert group_chance == pytest.approx(10 / 80) and null.chance == pytest.approx(group_chance)
    se = null.values.std(ddof=1) / np.sqrt(null.values.size)
    assert abs(null.mean - group_chance) < 4 * se
    assert abs(null.mean - k / (n - 1)) > 10 * se  # 0.101: the chance that ignores the exclusion is too low


# --------------------------------------------------------------------------- contracts the mutation run found unchecked


def test_row_count_errors_name_both_embeddings():
    X, Y = _rng(1).normal(size=(30, 4)), _rng(2).normal(size=(31, 4))
    expected = r"row counts differ \(X_a: 30, X_b: 31\)"
    with pytest.raises(InputError, match=expected):
        ag.mutual_knn_overlap_per_image(X, Y, k=3)
    with pytest.raises(InputError, match=expected):
        ag.k_sweep(X, Y, ks=(3,))
    with pytest.raises(InputError, match=expected):
        ag.permutation_null(X, Y, k=3, n_permutations=5)
    with pytest.raises(InputError, match=r"^n_permutations must be"):
        ag.permutation_null(X, X, k=3, n_permutations=0)


def test_default_k_is_ten():
    X, Y = _rng(3).normal(size=(60, 5)), _rng(4).normal(size=(60, 5))
    per_image = ag.mutual_knn_overlap_per_image(X, Y)
    np.testing.assert_array_equal(per_image, ag.mutual_knn_overlap_per_image(X, Y, k=10))
    assert not np.array_equal(per_image, ag.mutual_knn_overlap_per_image(X, Y, k=11))
    res = ag.agreement_matrix({"a": X, "b": Y})
    assert res.overlap.loc["a", "b"] == pytest.approx(per_image.mean())


def test_k_sweep_searches_to_the_largest_k_beyond_ten():
    # ks above 10 need the search itself to go that deep: a prefix of 10 neighbours cannot hold 20
    X, Y = _rng(5).normal(size=(60, 5)), _rng(6).normal(size=(60, 5))
    table = ag.k_sweep(X, Y, ks=(5, 20)).table.set_index("k")
    for k in (5, 20):
        assert table.loc[k, "overlap"] == pytest.approx(ag.mutual_knn_overlap(X, Y, k=k))
    assert ag.k_sweep(X, X, ks=(20,)).table["overlap"].iloc[0] == 1.0


def test_k_sweep_logs_what_it_dropped_and_refuses_when_nothing_is_left(caplog):
    X = _rng(7).normal(size=(30, 4))
    with caplog.at_level("INFO", logger="crslib.agreement"):
        ag.k_sweep(X, X, ks=(2, 50))
    assert "k_sweep: dropped k=[50] (need k <= 29 candidates for N=30)" in caplog.messages
    # one group holds every image: no candidate is left after the exclusion, whatever k
    with pytest.raises(InputError, match=r"no k in \[1, 2\] is below the number of candidate neighbours \(0\)"):
        ag.k_sweep(X, X, ks=(1, 2), exclude_groups=np.zeros(30))


def test_k_sweep_to_dict_holds_the_table_and_the_dropped_k():
    X = _rng(8).normal(size=(30, 4))
    res = ag.k_sweep(X, X, ks=(1, 3, 40))
    d = res.to_dict()
    assert set(d) == {"table", "dropped_k"} and d["dropped_k"] == [40]
    assert [row["k"] for row in d["table"]] == [1, 3] and [row["overlap"] for row in d["table"]] == [1.0, 1.0]


def test_agreement_matrix_input_errors_are_exact():
    X = _rng(9).normal(size=(20, 3))
    message = r"^embeddings must be a mapping \{model name: array\} with at least 2 models$"
    for bad in ([X, X, X], {"a": X}):
        with pytest.raises(InputError, match=message):
            ag.agreement_matrix(bad, k=3)
    with pytest.raises(InputError, match=r"^model names must be unique as strings, got \['1', '1'\]"):
        ag.agreement_matrix({1: X, "1": X}, k=3)
    with pytest.raises(InputError, match="nprobe"):
        ag.agreement_matrix({"a": X, "b": X}, k=3, nprobe=0)


def test_agreement_matrix_excludes_the_groups_it_is_given():
    X, Y = _rng(10).normal(size=(40, 4)), _rng(11).normal(size=(40, 4))
    groups = np.repeat(np.arange(10), 4)
    res = ag.agreement_matrix({"a": X, "b": Y}, k=5, exclude_groups=groups)
    expected = ag.mutual_knn_overlap(X, Y, k=5, exclude_groups=groups)
    assert res.overlap.loc["a", "b"] == pytest.approx(expected)
    assert expected != pytest.approx(ag.mutual_knn_overlap(X, Y, k=5))


def test_agreement_frame_and_association_input_errors_are_exact():
    acc = pd.Series({"a": 0.7, "b": 0.8, "c": 0.9})
    with pytest.raises(InputError, match=r"^agreement must be an AgreementMatrix \(see agreement_matrix\) or a "
                                         r"square DataFrame labelled by model name$"):
        ag.accuracy_agreement_association(np.eye(3), acc)
    rect = pd.DataFrame(np.eye(3)[:2], index=["a", "b"], columns=["a", "b", "c"])
    with pytest.raises(InputError, match=r"^agreement must be square with the same model names, in the same order, "
                                         r"on rows and columns$"):
        ag.accuracy_agreement_association(rect, acc)
    square = pd.DataFrame(np.eye(3), index=list("abc"), columns=list("abc"))
    with pytest.raises(InputError, match=r"^accuracy must be a pandas Series indexed by model name$"):
        ag.accuracy_agreement_association(square, acc.to_dict())


def test_association_default_seed_is_zero_and_reaches_the_mantel_test():
    rng = _rng(12)
    names = [f"m{i}" for i in range(8)]  # 8! orderings: sampled, not enumerated
    acc = pd.Series(rng.uniform(0.6, 0.9, size=8), index=names)
    A = rng.uniform(0.1, 0.5, size=(8, 8))
    A = pd.DataFrame((A + A.T) / 2, index=names, columns=names)
    default = ag.accuracy_agreement_association(A, acc, n_permutations=99)
    assert not default["exact"]
    assert default == ag.accuracy_agreement_association(A, acc, n_permutations=99, random_state=0)
    other = ag.accuracy_agreement_association(A, acc, n_permutations=99, random_state=1)
    assert other["mantel_p"] != default["mantel_p"] and other["mantel_r"] == default["mantel_r"]


def test_convergence_pairs_keep_a_pair_listed_after_another_architecture():
    info = pd.DataFrame({"name": ["s0", "wide0", "s1"], "objective": ["sup"] * 3, "seed": [0, 0, 1],
                         "architecture": ["small", "wide", "small"]})
    A = pd.DataFrame(0.25, index=info["name"], columns=info["name"])
    pairs = ag.convergence_pairs(A, info)
    assert list(zip(pairs["model_a"], pairs["model_b"])) == [("s0", "s1")]


def test_convergence_table_with_no_pair_of_a_kind_warns_nothing():
    import warnings

    # one seed per objective: no within-objective pair; one objective per architecture elsewhere: no across pair
    info = pd.DataFrame({"name": ["a", "b", "c", "d"], "objective": ["sup", "ssl", "mim", "mim"],
                         "seed": [0, 0, 0, 1], "architecture": ["small", "small", "wide", "wide"]})
    A = pd.DataFrame(0.3, index=info["name"], columns=info["name"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = ag.convergence_table(A, info)
    small = table[(table["architecture"] == "small") & (table["objective"] == "sup")].iloc[0]
    assert small["n_within"] == 0 and np.isnan(small["within_mean"]) and small["across_mean"] == pytest.approx(0.3)
    wide = table[(table["architecture"] == "wide") & (table["objective"] == "mim")].iloc[0]
    assert wide["n_across"] == 0 and np.isnan(wide["across_mean"]) and wide["within_mean"] == pytest.approx(0.3)


def test_agreement_matrix_searches_like_knn_search_with_its_defaults():
    import inspect

    matrix, search = inspect.signature(ag.agreement_matrix).parameters, inspect.signature(ann.knn_search).parameters
    for name in ("threshold", "recall_sample", "index", "metric"):
        assert matrix[name].default == search[name].default, name
    # above a (lowered) threshold: the same approximate search, the same measured recall (seed 0)
    # (2,000 rows in 16-d: 16 of 51 cells probed, so the recall is below 1 and depends on the seed)
    X = _rng(13).normal(size=(2000, 16))
    res = ag.agreement_matrix({"a": X, "b": X[:, ::-1]}, k=5, index="ivf", threshold=100, recall_sample=60)
    _, info = ann.knn_search(X, k=5, index="ivf", threshold=100, recall_sample=60, random_state=0)
    _, other = ann.knn_search(X, k=5, index="ivf", threshold=100, recall_sample=60, random_state=1)
    assert res.search["a"]["recall"] == info["recall"] != other["recall"]
    assert res.search["a"]["recall_sample"] == 60


def test_convergence_pairs_report_the_overlap_as_a_float_from_an_integer_frame():
    info = pd.DataFrame({"name": ["a", "b"], "objective": ["sup", "sup"], "seed": [0, 1],
                         "architecture": ["small", "small"]})
    A = pd.DataFrame(1, index=["a", "b"], columns=["a", "b"])  # identical models: exact overlap 1
    pairs = ag.convergence_pairs(A, info)
    assert pairs["overlap"].dtype == np.float64 and pairs["overlap"].tolist() == [1.0]


def test_grouped_permutation_null_searches_deep_enough_for_a_large_group():
    # 25 of 30 images share a group, k = 5: a row of that group keeps only the 5 images outside it, so the
    # relabelled list must go k + 24 = 29 deep (every other image). Reference: the full ranking, filtered.
    rng = _rng(14)
    X_a, X_b = rng.normal(size=(30, 4)), rng.normal(size=(30, 4))
    groups = np.array([0] * 25 + [1, 2, 3, 4, 5])
    res = ag.permutation_null(X_a, X_b, k=5, n_permutations=8, exclude_groups=groups, random_state=3)
    I_a = nb.knn_indices(X_a, k=5, exclude_groups=groups)
    full_b = nb.knn_indices(X_b, k=29)
    draws = np.random.default_rng(3)
    expected = []
    for _ in range(8):
        perm = draws.permutation(30)
        inv = np.empty_like(perm)
        inv[perm] = np.arange(30)
        shared = 0
        for i in range(30):
            ranked = [j for j in inv[full_b[perm[i]]] if groups[j] != groups[i]][:5]
            shared += len(set(ranked) & set(I_a[i].tolist()))
        expected.append(shared / (30 * 5))
    np.testing.assert_allclose(res.values, expected)


# --------------------------------------------------------------------------- factors


def _factor_info():
    # "noseed" lacks only its seed: it would pair with sup0 by seed if missing values were compared
    return pd.DataFrame({
        "name": ["sup0", "sup1", "con0", "sup0h", "sup0wide", "pub", "noseed"],
        "objective": ["sup", "sup", "con", "sup", "sup", None, "sup"],
        "seed": [0, 1, 0, 0, 0, None, None],
        "architecture": ["small", "small", "small", "small", "wide", "resnet", "small"],
        "patients": ["all", "all", "all", "half1", "all", None, "all"],
    })


def test_factor_pairs_keep_exactly_the_pairs_that_differ_in_one_factor():
    from crslib.factors import factor_pairs

    info = _factor_info()
    names = info["name"].tolist()
    values = np.arange(49, dtype=float).reshape(7, 7) / 100
    A = pd.DataFrame((values + values.T) / 2, index=names, columns=names)
    pairs = factor_pairs(A, info)
    got = {(a, b): (f, va, vb) for a, b, f, va, vb in pairs[["model_a", "model_b", "factor", "value_a", "value_b"]]
           .itertuples(index=False)}
    # sup1-con0 differ in seed and objective; sup0h-sup1 in seed and patients; the public model has no factors;
    # sup0-sup0h differ in patients alone, but all patients include the half: not a disjoint pair
    assert got == {("sup0", "sup1"): ("seed", 0, 1), ("sup0", "con0"): ("objective", "sup", "con"),
                   ("sup0", "sup0wide"): ("architecture", "small", "wide")}
    half0 = pd.concat([info, pd.DataFrame({"name": ["sup0g"], "objective": ["sup"], "seed": [0],
                                           "architecture": ["small"], "patients": ["half0"]})], ignore_index=True)
    B = pd.DataFrame(np.full((8, 8), 0.25), index=half0["name"], columns=half0["name"])
    halves = factor_pairs(B, half0).query("factor == 'patients'")
    assert halves[["model_a", "model_b", "value_a", "value_b"]].values.tolist() == [["sup0h", "sup0g", "half1", "half0"]]
    everything = factor_pairs(B, half0, supersets={}).query("factor == 'patients'")
    assert len(everything) == 3
    overlap = dict(zip(zip(pairs["model_a"], pairs["model_b"]), pairs["overlap"]))
    assert overlap[("sup0", "sup0wide")] == pytest.approx(A.loc["sup0", "sup0wide"])
    assert overlap[("sup0", "con0")] == pytest.approx(A.loc["con0", "sup0"])
    # a factor that is not a column counts as equal for every model
    assert set(factor_pairs(A, info.drop(columns="patients"))["factor"]) == {"seed", "objective", "architecture"}
    # the matrix's order decides a and b
    reordered = factor_pairs(A.loc[names[::-1], names[::-1]], info)
    assert ("sup1", "sup0") in set(zip(reordered["model_a"], reordered["model_b"]))
    with pytest.raises(InputError, match="no row"):
        factor_pairs(A, info.iloc[1:])
    with pytest.raises(InputError, match="more than once"):
        factor_pairs(A, pd.concat([info, info.iloc[:1]]))
    with pytest.raises(InputError, match="at least one factor"):
        factor_pairs(A, info, factors=[])
    with pytest.raises(InputError, match="'name'"):
        factor_pairs(A, info.drop(columns="name"))


def test_factor_pairs_cover_every_default_factor_and_read_the_overlap_from_row_a_column_b():
    from crslib.factors import FACTORS, factor_pairs, factor_table

    assert FACTORS == ("objective", "seed", "architecture", "init", "patients", "recipe")
    base = {"objective": "sup", "seed": 0, "architecture": "small", "init": "random", "patients": "half0",
            "recipe": "base"}
    changed = {f: v for f, v in zip(FACTORS, ("con", 1, "wide", "imagenet", "half1", "long"))}
    rows = [{"name": "ref", **base}, {"name": "twin", **base}]  # the twin differs in no factor: not a pair
    rows += [{"name": f"other_{f}", **{**base, f: v}} for f, v in changed.items()]
    info = pd.DataFrame(rows)
    names = info["name"].tolist()
    A = pd.DataFrame(np.arange(len(names) ** 2, dtype=float).reshape(len(names), -1) / 100, index=names,
                     columns=names)  # not symmetric: the overlap is read at (model_a, model_b)
    pairs = factor_pairs(A, info)
    assert pairs["factor"].tolist() == list(FACTORS) * 2  # the matrix's order: ref's pairs, then the twin's
    for f in FACTORS:
        for first in ("ref", "twin"):
            row = pairs[(pairs["factor"] == f) & (pairs["model_a"] == first)].iloc[0]
            assert (row["model_b"], row["value_a"], row["value_b"]) == (f"other_{f}", base[f], changed[f])
            assert row["overlap"] == A.loc[first, f"other_{f}"]
    assert len(pairs) == 2 * len(FACTORS)
    assert factor_table(pairs)["factor"].tolist() == list(FACTORS)
    assert factor_table(pairs, factors=["recipe", "seed"])["factor"].tolist() == ["recipe", "seed"]
    # a model with an unknown factor, listed second, is skipped without ending the search for later pairs
    unknown = pd.concat([info.iloc[:1], pd.DataFrame([{"name": "public", **base, "seed": None}]), info.iloc[1:]],
                        ignore_index=True)
    names = unknown["name"].tolist()
    B = pd.DataFrame(np.full((len(names), len(names)), 0.5), index=names, columns=names)
    assert len(factor_pairs(B, unknown)) == 2 * len(FACTORS)
    # no pair: the columns are still there
    alone = factor_pairs(B.iloc[:2, :2], unknown.iloc[:2])
    assert alone.empty and alone.columns.tolist() == ["model_a", "model_b", "factor", "value_a", "value_b", "overlap"]
    assert factor_table(alone).columns.tolist() == ["factor", "n_pairs", "mean", "min", "max"]


def test_factor_errors_read_whole():
    from crslib.factors import factor_pairs, factor_table

    info = _factor_info()
    A = pd.DataFrame(np.eye(7), index=info["name"], columns=info["name"])
    cases = [
        (lambda: factor_pairs(A, info, factors=()),
         "factor_pairs needs at least one factor, e.g. ('objective', 'seed')"),
        (lambda: factor_pairs(A, info.drop(columns="name")),
         "model_info needs a 'name' column naming the models of the agreement matrix"),
        (lambda: factor_pairs(A, pd.concat([info, info.iloc[[2, 0]]])),
         "model_info lists model(s) ['con0', 'sup0'] more than once"),
        (lambda: factor_pairs(A, info.iloc[2:]), "model_info has no row for model(s) ['sup0', 'sup1']"),
        (lambda: factor_table(pd.DataFrame({"model_a": ["a"]})),
         "pairs lacks column(s) ['factor', 'overlap']; pass the result of factor_pairs"),
    ]
    for call, expected in cases:
        with pytest.raises(InputError) as error:
            call()
        assert str(error.value) == expected


def test_factor_table_on_real_embeddings_finds_the_injected_factor():
    from crslib.factors import factor_pairs, factor_table

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 16))
    rotation = np.linalg.qr(rng.normal(size=(16, 16)))[0]
    embeddings = {"a0": X, "a1": X @ rotation * 3.0, "b0": rng.normal(size=(300, 16))}
    info = pd.DataFrame({"name": ["a0", "a1", "b0"], "objective": ["a", "a", "b"], "seed": [0, 1, 0]})
    A = ag.agreement_matrix(embeddings, k=10).overlap
    table = factor_table(factor_pairs(A, info)).set_index("factor")
    assert table.loc["seed", "mean"] == pytest.approx(1.0)  # a rotation keeps every neighbour
    assert table.loc["objective", "mean"] < 0.15  # unrelated embeddings: near chance (10/299)
    assert list(table.index) == ["objective", "seed"] and table["n_pairs"].tolist() == [1, 1]
    pairs = pd.DataFrame({"factor": ["seed", "seed", "init"], "overlap": [0.5, 0.3, 0.1]})
    summary = factor_table(pairs)
    assert summary.values.tolist() == [["seed", 2, 0.4, 0.3, 0.5], ["init", 1, 0.1, 0.1, 0.1]]
    with pytest.raises(InputError, match="factor_pairs"):
        factor_table(pairs.drop(columns="overlap"))


def test_agreement_matrix_checks_search_options_before_any_search():
    """A bad nprobe or target_recall is refused up front, with its bare message (a search would prefix the
    model's name, and with a scheduler the cluster would already be running)."""
    X = np.random.default_rng(0).normal(size=(50, 4))
    pair = {"a": X, "b": X[:, ::-1].copy()}
    assert error_message(ag.agreement_matrix, pair, k=5, nprobe=0) == (
        "nprobe must be a positive integer or None, got 0")
    assert error_message(ag.agreement_matrix, pair, k=5, target_recall=1.5) == (
        "target_recall must be a number in (0, 1], got 1.5")


def test_shared_neighbours_are_what_the_per_image_overlap_counts():
    from crslib.neighbors import knn_indices, shared_neighbours

    rng = np.random.default_rng(4)
    X_a = rng.normal(size=(120, 8))
    X_b = X_a + rng.normal(scale=0.8, size=X_a.shape)  # a second encoder that mostly, not always, agrees
    groups = np.repeat(np.arange(40), 3)
    rows = [0, 17, 119]
    table = shared_neighbours(X_a, X_b, rows, k=5, exclude_groups=groups)
    assert len(table) == 15 and table["rank"].tolist() == [1, 2, 3, 4, 5] * 3
    per_image = ag.mutual_knn_overlap_per_image(X_a, X_b, k=5, exclude_groups=groups)
    for query, rows_q in table.groupby("query", sort=False):
        assert rows_q["overlap"].iloc[0] == pytest.approx(per_image[query])
        assert rows_q["neighbour_a"].tolist() == knn_indices(X_a, k=5, exclude_groups=groups)[query].tolist()
        assert rows_q["shared_a"].sum() == rows_q["shared_b"].sum() == round(5 * per_image[query])
        assert not set(rows_q["neighbour_a"]) & set(np.flatnonzero(groups == groups[query]))  # no same patient
        assert all(s == (n in set(rows_q["neighbour_b"])) for n, s in zip(rows_q["neighbour_a"], rows_q["shared_a"]))
    assert 0 < table["overlap"].mean() < 1

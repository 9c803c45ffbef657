"""Known-answer tests of crslib.similarity (its own tests under `make mutation`)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from scipy import sparse

from crslib import similarity as sim
from crslib.errors import InputError
from crslib.neighbors import knn_indices


def _rng(seed=0):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- independent references


def _hsic_unbiased(K, L):
    """Song et al. (2012, eq. 5) unbiased HSIC, dense, with the diagonals zeroed."""
    m = len(K)
    K, L = K.astype(float).copy(), L.astype(float).copy()
    np.fill_diagonal(K, 0)
    np.fill_diagonal(L, 0)
    one = np.ones(m)
    trace = np.trace(K @ L)
    return (
        trace
        + (one @ K @ one) * (one @ L @ one) / ((m - 1) * (m - 2))
        - 2 / (m - 2) * (one @ K @ L @ one)
    ) / (m * (m - 3))


def _hsic_biased(K, L):
    """Gretton et al. (2005) biased HSIC: tr(K H L H) / (n - 1)^2."""
    n = len(K)
    H = np.eye(n) - 1.0 / n
    return np.trace(K @ H @ L @ H) / (n - 1) ** 2


def _cka_gram(X, Y, debiased):
    X, Y = np.asarray(X, float), np.asarray(Y, float)
    K, L = X @ X.T, Y @ Y.T
    h = _hsic_unbiased if debiased else _hsic_biased
    return h(K, L) / np.sqrt(h(K, K) * h(L, L))


def _knn_masks(S, k):
    """0/1 mask of the k highest-scoring other rows per row; ties to the lower index."""
    n = len(S)
    S = S.copy()
    np.fill_diagonal(S, -np.inf)
    idx = np.argsort(-S, axis=1, kind="stable")[:, :k]
    mask = np.zeros((n, n))
    np.put_along_axis(mask, idx, 1.0, axis=1)
    return mask


def _cknna_dense(A, B, k, normalize=True):
    """Dense CKNNA of Huh et al. (2024): kernels and kNN masks as N x N matrices."""
    A, B = np.asarray(A, float), np.asarray(B, float)
    if normalize:
        A = A / np.linalg.norm(A, axis=1, keepdims=True)
        B = B / np.linalg.norm(B, axis=1, keepdims=True)
    K, L = A @ A.T, B @ B.T
    MK, ML = _knn_masks(K, k), _knn_masks(L, k)
    M = MK * ML
    kl = _hsic_unbiased(M * K, M * L)
    kk = _hsic_unbiased(MK * K, MK * K)
    ll = _hsic_unbiased(ML * L, ML * L)
    with np.errstate(invalid="ignore", divide="ignore"):
        return kl / np.sqrt(kk * ll), kk, ll


def _jaccard_brute(A, B, k, metric):
    def neighbours(X):
        X = np.asarray(X, float)
        if metric == "cosine":
            X = X / np.linalg.norm(X, axis=1, keepdims=True)
        S = (
            X @ X.T
            if metric != "euclidean"
            else -((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
        )
        return _knn_masks(S, k).astype(bool)

    Ma, Mb = neighbours(A), neighbours(B)
    return np.mean([(a & b).sum() / (a | b).sum() for a, b in zip(Ma, Mb)])


def _unequal_norms(n, d, seed):
    """Random rows with very different lengths: inner-product and cosine neighbours differ."""
    rng = _rng(seed)
    return rng.normal(size=(n, d)) * rng.lognormal(sigma=1.5, size=(n, 1))


# --------------------------------------------------------------------------- linear CKA


@pytest.mark.parametrize("debiased", [True, False])
@pytest.mark.parametrize("n", [4, 5, 40])
def test_linear_cka_matches_gram_formula_down_to_small_n(n, debiased):
    rng = _rng(n)
    X = rng.normal(size=(n, 3))
    Y = X @ rng.normal(size=(3, 4)) + 0.5 * rng.normal(size=(n, 4))
    expected = _cka_gram(X - X.mean(0), Y - Y.mean(0), debiased)
    assert np.isfinite(expected)
    assert sim.linear_cka(X, Y, debiased=debiased) == pytest.approx(expected, rel=1e-9)


def test_linear_cka_biased_allows_three_images_debiased_refuses_them():
    X = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, 2.0]])
    Y = np.array([[1.0], [0.0], [4.0]])
    assert sim.linear_cka(X, Y, debiased=False) == pytest.approx(
        _cka_gram(X - X.mean(0), Y - Y.mean(0), False)
    )
    with pytest.raises(
        InputError,
        match=r"^the debiased CKA needs at least 4 images, got N=3; use debiased=False$",
    ):
        sim.linear_cka(X, Y)


@pytest.mark.parametrize("scale", [1e-4, 1e-2, 1e3])
@pytest.mark.parametrize("debiased", [True, False])
def test_linear_cka_isotropic_scaling_invariant_at_any_magnitude(scale, debiased):
    rng = _rng(3)
    X = rng.normal(size=(30, 4))
    Y = np.tanh(X @ rng.normal(size=(4, 3))) + 0.3 * rng.normal(size=(30, 3))
    ref = sim.linear_cka(X, Y, debiased=debiased)
    assert 0.2 < ref < 0.99
    assert sim.linear_cka(scale * X, scale * Y, debiased=debiased) == pytest.approx(
        ref, rel=1e-9
    )


def test_linear_cka_integer_and_float32_inputs_give_the_float64_answer():
    rng = _rng(4)
    Xi = rng.integers(-5, 6, size=(25, 3))
    Yi = rng.integers(-5, 6, size=(25, 2))
    ref = sim.linear_cka(Xi.astype(np.float64), Yi.astype(np.float64))
    assert sim.linear_cka(Xi, Yi) == pytest.approx(ref, rel=1e-12)
    assert sim.linear_cka(
        Xi.astype(np.float32), Yi.astype(np.float32)
    ) == pytest.approx(ref, rel=1e-12)
    # the inputs are not centred in place
    Xf = Xi.astype(np.float64)
    before = Xf.copy()
    sim.linear_cka(Xf, Yi)
    assert np.array_equal(Xf, before)


@pytest.mark.parametrize("debiased", [True, False])
@pytest.mark.parametrize("which", ["X", "Y"])
def test_linear_cka_constant_embeddings_named_in_error(which, debiased):
    rng = _rng(5)
    good = rng.normal(size=(10, 3))
    const = np.full((10, 2), 2.0)
    X, Y = (const, good) if which == "X" else (good, const)
    with pytest.raises(
        InputError,
        match=rf"^{which} has no variance across images \(constant embeddings\); CKA is undefined$",
    ):
        sim.linear_cka(X, Y, debiased=debiased)


def test_linear_cka_bad_input_messages_name_the_argument():
    rng = _rng(6)
    X, Y = rng.normal(size=(6, 2)), rng.normal(size=(7, 2))
    with pytest.raises(InputError, match=r"row counts differ \(X: 6, Y: 7\)$"):
        sim.linear_cka(X, Y)
    Y = rng.normal(size=(6, 2))
    bad = X.copy()
    bad[2, 1] = np.nan
    with pytest.raises(
        InputError,
        match=r"^X has NaN or infinite values in 1 row\(s\), first rows \[2\]",
    ):
        sim.linear_cka(bad, Y)
    with pytest.raises(
        InputError,
        match=r"^Y has NaN or infinite values in 1 row\(s\), first rows \[2\]",
    ):
        sim.linear_cka(X, bad)
    with pytest.raises(
        InputError,
        match=r"^X must be a 2-D array \(images x features\), got shape \(6,\)",
    ):
        sim.linear_cka(X[:, 0], Y)
    with pytest.raises(
        InputError,
        match=r"^Y must be a 2-D array \(images x features\), got shape \(6,\)",
    ):
        sim.linear_cka(X, Y[:, 0])


# --------------------------------------------------------------------------- HSIC helpers of CKNNA


def test_hsic_unbiased_sparse_matches_song_formula():
    rng = _rng(7)
    for m in (4, 5, 12):
        K = rng.normal(size=(m, m)) * (rng.random((m, m)) < 0.5)
        L = rng.normal(size=(m, m)) * (rng.random((m, m)) < 0.5)
        np.fill_diagonal(K, 0)
        np.fill_diagonal(L, 0)
        got = sim._hsic_unbiased_sparse(sparse.csr_matrix(K), sparse.csr_matrix(L), m)
        assert got == pytest.approx(_hsic_unbiased(K, L), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("d", [3, 17, 2**16])
def test_pair_dots_match_brute_force_across_chunks(d):
    # with d = 2**16 one chunk holds 32 pairs, so 100 pairs need several chunks
    rng = _rng(8)
    X = rng.normal(size=(6, d)).astype(np.float32)
    rows, cols = rng.integers(0, 6, 100), rng.integers(0, 6, 100)
    expected = np.array(
        [X[r].astype(np.float64) @ X[c].astype(np.float64) for r, c in zip(rows, cols)]
    )
    got = sim._pair_dots(X, rows, cols)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12)


# --------------------------------------------------------------------------- CKNNA


@pytest.mark.parametrize(
    ("n", "d", "k", "normalize"),
    [
        (4, 3, 2, True),
        (4, 3, 3, True),
        (30, 5, 2, True),
        (40, 20, 5, True),
        (40, 6, 5, False),
        (40, 20, 12, False),
    ],
)
def test_cknna_matches_dense_reference(n, d, k, normalize):
    rng = _rng(100 + n + k)
    X = _unequal_norms(n, d, seed=n + k)
    Y = X @ rng.normal(size=(d, d)) + 0.7 * rng.normal(size=(n, d))
    expected, kk, ll = _cknna_dense(X, Y, k, normalize)
    assert kk > 0 and ll > 0
    assert sim.cknna(X, Y, k=k, normalize=normalize) == pytest.approx(
        expected, rel=1e-6
    )


def test_cknna_normalize_false_uses_inner_product_neighbours():
    X = _unequal_norms(40, 6, seed=9)
    Y = X + 0.5 * _rng(10).normal(size=X.shape)
    raw, cos = sim.cknna(X, Y, k=5, normalize=False), sim.cknna(X, Y, k=5)
    assert raw == pytest.approx(_cknna_dense(X, Y, 5, normalize=False)[0], rel=1e-6)
    assert abs(raw - cos) > 1e-3


def test_cknna_default_k_is_ten():
    rng = _rng(11)
    X = rng.normal(size=(60, 8))
    Y = X + rng.normal(size=(60, 8))
    default = sim.cknna(X, Y)
    assert default == sim.cknna(X, Y, k=10)
    assert default != pytest.approx(sim.cknna(X, Y, k=11), rel=1e-6)


def test_cknna_image_that_is_nobodys_neighbour():
    # the last image points away from all others in X, so no one lists it as a neighbour there
    rng = _rng(12)
    n, d, k = 25, 4, 4
    X = rng.normal(size=(n, d)) + np.array([4.0, 0, 0, 0])
    X[-1] = [-1.0, 0.1, 0.0, 0.0]
    Y = rng.normal(size=(n, d))
    assert (n - 1) not in knn_indices(X, k=k)
    assert (n - 1) in knn_indices(Y, k=k)
    assert sim.cknna(X, Y, k=k) == pytest.approx(_cknna_dense(X, Y, k)[0], rel=1e-6)
    assert sim.cknna(Y, X, k=k) == pytest.approx(_cknna_dense(Y, X, k)[0], rel=1e-6)


def test_cknna_constant_kernel_is_nan_with_warning(caplog):
    # all X rows point the same way: the cosine kernel is constant, its unbiased HSIC is exactly 0
    X = np.tile([2.0, 0.0], (4, 1))
    Y = _rng(13).normal(size=(4, 3))
    _, kk, ll = _cknna_dense(X, Y, 3)
    assert kk == pytest.approx(0, abs=1e-12) and ll > 0
    with caplog.at_level(logging.WARNING, logger="crslib.similarity"):
        assert np.isnan(sim.cknna(X, Y, k=3))
    assert caplog.messages == [
        f"CKNNA undefined: self-alignment HSIC terms are 0 and {ll:.3g}"
    ]


def test_cknna_bad_input_messages():
    rng = _rng(14)
    X = rng.normal(size=(20, 3))
    with pytest.raises(InputError, match=r"row counts differ \(X: 20, Y: 21\)$"):
        sim.cknna(X, rng.normal(size=(21, 3)))
    with pytest.raises(InputError, match=r"^CKNNA needs k >= 2, got k=1$"):
        sim.cknna(X, X, k=1)
    with pytest.raises(
        InputError, match=r"^CKNNA \(unbiased HSIC\) needs at least 4 images, got N=3$"
    ):
        sim.cknna(X[:3], X[:3], k=2)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("which", ["X", "Y"])
def test_cknna_bad_rows_named_by_argument(which, normalize):
    rng = _rng(15)
    good = rng.normal(size=(12, 3))
    bad = rng.normal(size=(12, 3))
    if normalize:
        bad[3] = 0.0
        msg = rf"^{which} has 1 all-zero row\(s\) \(first \[3\]\), whose cosine similarity is undefined"
    else:
        bad[3, 0] = np.inf
        msg = rf"^{which} has NaN or infinite values in 1 row\(s\), first rows \[3\]"
    X, Y = (bad, good) if which == "X" else (good, bad)
    with pytest.raises(InputError, match=msg):
        sim.cknna(X, Y, k=3, normalize=normalize)


# --------------------------------------------------------------------------- Jaccard


@pytest.mark.parametrize("metric", ["cosine", "ip", "euclidean"])
def test_jaccard_knn_matches_set_definition(metric):
    X = _unequal_norms(40, 5, seed=16)
    Y = X + 0.6 * _rng(17).normal(size=X.shape)
    expected = _jaccard_brute(X, Y, 4, metric)
    assert 0.1 < expected < 0.9
    assert sim.jaccard_knn(X, Y, k=4, metric=metric) == pytest.approx(
        expected, rel=1e-12
    )
    assert sim.jaccard_knn(X, X, k=4, metric=metric) == 1.0


def test_jaccard_knn_metric_reaches_both_searches():
    # per-row rescaling keeps cosine neighbours but changes inner-product neighbours
    X = _unequal_norms(40, 5, seed=18)
    D = _rng(19).lognormal(sigma=1.5, size=(40, 1))
    assert sim.jaccard_knn(X, D * X, k=4) == 1.0
    assert sim.jaccard_knn(X, D * X, k=4, metric="ip") == pytest.approx(
        _jaccard_brute(X, D * X, 4, "ip"), rel=1e-12
    )
    assert sim.jaccard_knn(D * X, X, k=4, metric="ip") < 0.9


def test_jaccard_knn_default_k_is_ten():
    rng = _rng(20)
    X = rng.normal(size=(60, 6))
    Y = X + rng.normal(size=(60, 6))
    default = sim.jaccard_knn(X, Y)
    assert default == sim.jaccard_knn(X, Y, k=10)
    assert default == pytest.approx(_jaccard_brute(X, Y, 10, "cosine"), rel=1e-12)
    assert default != pytest.approx(sim.jaccard_knn(X, Y, k=11), rel=1e-6)


def test_jaccard_knn_row_mismatch_names_both_arguments():
    rng = _rng(21)
    with pytest.raises(InputError, match=r"row counts differ \(X_a: 30, X_b: 31\)$"):
        sim.jaccard_knn(rng.normal(size=(30, 3)), rng.normal(size=(31, 3)), k=3)

"""crslib.transfer: exact input errors and brute-force references for the linear maps.

The ridge penalty is checked against a plain cross-validation with
scikit-learn's Ridge on the same folds, Procrustes against a known rotation and
scale, and each user error against its whole message, so that a changed
bound, default or message in ``crslib.transfer`` fails a test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold

from crslib import transfer as T
from crslib.splits import grouped_split
from crslib.errors import InputError
from assertions import error_message


def _data(n=80, d_src=6, d_dst=4, noise=0.5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d_src))
    Y = X @ rng.normal(size=(d_src, d_dst)) + 3.0 + noise * rng.normal(size=(n, d_dst))
    return X, Y


# --------------------------------------------------------------------------- linear maps


def test_ridge_alpha_and_errors_equal_a_plain_cross_validation():
    X, Y = _data(noise=2.0)
    alphas = np.logspace(-2, 3, 6)
    m = T.fit_linear_map(X, Y, alphas=alphas, cv=4, random_state=3)
    errors = {}
    for alpha in alphas:
        sq, count = 0.0, 0
        for tr, va in KFold(n_splits=4, shuffle=True, random_state=3).split(X):
            pred = Ridge(alpha=alpha).fit(X[tr], Y[tr]).predict(X[va])
            sq += float(((Y[va] - pred) ** 2).sum())
            count += va.size * Y.shape[1]
        errors[float(alpha)] = sq / count
    assert m.cv_errors_ == pytest.approx(errors)
    assert m.alpha_ == min(errors, key=errors.get)
    full = Ridge(alpha=m.alpha_).fit(X, Y)
    assert m.coef_ == pytest.approx(full.coef_.T)
    assert m.predict(X) == pytest.approx(full.predict(X))
    assert (m.method, m.n_fit_, m.n_features_in_, m.n_features_out_) == ("ridge", 80, 6, 4)


def test_ridge_defaults_single_alpha_and_few_images():
    X, Y = _data()
    default = T.fit_linear_map(X, Y)
    explicit = T.fit_linear_map(X, Y, method="ridge", alphas=np.logspace(-3, 3, 13), cv=5, random_state=0)
    assert default.alpha_ == explicit.alpha_ and default.cv_errors_ == explicit.cv_errors_
    assert sorted(default.cv_errors_) == pytest.approx(np.logspace(-3, 3, 13))
    one = T.fit_linear_map(X, Y, alphas=[2.5])
    assert one.alpha_ == 2.5 and one.cv_errors_ == {}
    assert one.coef_ == pytest.approx(Ridge(alpha=2.5).fit(X, Y).coef_.T)
    # fewer images than folds: leave-one-out
    few = T.fit_linear_map(X[:3], Y[:3], alphas=[0.1, 1.0], cv=5)
    loo = T.fit_linear_map(X[:3], Y[:3], alphas=[0.1, 1.0], cv=3)
    assert few.cv_errors_ == loo.cv_errors_
    # ties in the CV error: the smallest alpha
    flat = T.fit_linear_map(np.ones((6, 2)) * np.arange(6)[:, None], np.zeros((6, 1)) + 1.0, alphas=[1.0, 0.5, 2.0])
    assert flat.alpha_ == 0.5


def test_lstsq_and_procrustes_known_answers():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 5))
    Q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    Y = 2.5 * X @ Q - 1.0
    pro = T.fit_linear_map(X, Y, method="procrustes")
    assert pro.scale_ == pytest.approx(2.5) and pro.coef_ == pytest.approx(2.5 * Q)
    assert T.held_out_r2(pro, X, Y) == pytest.approx(1.0)
    assert (pro.method, pro.alpha_, pro.n_fit_) == ("procrustes", None, 50)
    # dimensions differ: the map keeps the first outputs of an isometry
    narrow = T.fit_linear_map(X, Y[:, :3], method="procrustes")
    W = narrow.coef_ / narrow.scale_
    assert W.shape == (5, 3) and W.T @ W == pytest.approx(np.eye(3))
    # constant source: no scale to fit
    flat = T.fit_linear_map(np.ones((10, 3)), rng.normal(size=(10, 3)), method="procrustes")
    assert flat.scale_ == 1.0
    # lstsq: the exact affine map, and the minimum-norm one when n <= d
    B = rng.normal(size=(5, 2))
    ls = T.fit_linear_map(X, X @ B + 4.0, method="lstsq")
    assert ls.coef_ == pytest.approx(B) and ls.mean_dst_ == pytest.approx((X @ B + 4.0).mean(axis=0))
    assert (ls.method, ls.alpha_, ls.n_fit_) == ("lstsq", None, 50)
    wide = T.fit_linear_map(X[:3], (X @ B)[:3], method="lstsq")
    Xc = X[:3] - X[:3].mean(axis=0)
    assert wide.coef_ == pytest.approx(np.linalg.pinv(Xc) @ ((X @ B)[:3] - (X @ B)[:3].mean(axis=0)))
    assert T.fit_linear_map(X[:2], Y[:2], method="lstsq").n_fit_ == 2  # two images are enough


def test_held_out_r2_formula():
    X, Y = _data(noise=1.0, seed=4)
    m = T.fit_linear_map(X[:40], Y[:40], method="lstsq")
    pred = m.predict(X[40:])
    expected = 1 - ((Y[40:] - pred) ** 2).sum() / ((Y[40:] - Y[40:].mean(axis=0)) ** 2).sum()
    assert T.held_out_r2(m, X[40:], Y[40:]) == pytest.approx(expected)
    assert 0 < expected < 1


def test_linear_map_messages():
    X, Y = _data()
    assert error_message(T.fit_linear_map, X, Y, method="cca") == (
        f"method must be one of {T.MAP_METHODS}, got 'cca'")
    assert error_message(T.fit_linear_map, X[:1], Y[:1]) == "X_src needs at least 2 rows and 1 column, got shape (1, 6)"
    assert error_message(T.fit_linear_map, X, Y[:10]) == (
        "X_src and X_dst must hold the same images in the same order; they have 80 and 10 rows")
    assert error_message(T.fit_linear_map, X, Y, alphas=[1.0, 0.0]) == (
        "alphas must be positive finite numbers, got [1.0, 0.0]")
    assert error_message(T.fit_linear_map, X, Y, alphas=[]) == "alphas must be positive finite numbers, got []"
    assert error_message(T.fit_linear_map, X, Y, alphas=[np.inf]) == "alphas must be positive finite numbers, got [inf]"
    assert error_message(T.fit_linear_map, X, Y, alphas=[1.0, None]) == (
        "alphas must be positive finite numbers, got [1.0, None]")
    assert error_message(T.fit_linear_map, X, Y, cv=1) == "cv must be an integer >= 2, got 1"
    assert error_message(T.fit_linear_map, X, Y, cv=True) == "cv must be an integer >= 2, got True"
    assert error_message(T.fit_linear_map, X, Y, cv=2.0) == "cv must be an integer >= 2, got 2.0"
    assert T.fit_linear_map(X, Y, cv=2).alpha_ is not None
    m = T.fit_linear_map(X, Y)
    assert error_message(T.held_out_r2, "map", X, Y) == "map must be a LinearMap from fit_linear_map"
    assert error_message(T.held_out_r2, m, X, Y[:, :3]) == "X_dst_test has 3 features but the map outputs 4"
    assert error_message(T.held_out_r2, m, X, Y[:5]) == (
        "X_src_test and X_dst_test must hold the same images in the same order; they have 80 and 5 rows")
    assert error_message(T.held_out_r2, m, X, np.ones_like(Y)) == (
        "X_dst_test is constant over the test images; R^2 is undefined")
    assert error_message(m.predict, X[:, :5]) == (
        "X has 5 features but the map was fitted on 6; pass embeddings of the source model")
    Y_bad = Y.copy()
    Y_bad[3, 1] = np.nan
    assert error_message(T.fit_linear_map, X, Y_bad) == (
        "X_dst has NaN or infinite values in 1 row(s), first rows [3]; drop or re-extract those images")


def test_float32_embeddings_are_mapped_in_float64():
    """Both sides are widened before any arithmetic: a float32 pair gives the map of its exact float64 copy."""
    X, Y = _data(noise=1.0)
    X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
    for method in T.MAP_METHODS:
        single = T.fit_linear_map(X32, Y32, method=method)
        double = T.fit_linear_map(X32.astype(np.float64), Y32.astype(np.float64), method=method)
        for name in ("coef_", "mean_src_", "mean_dst_"):
            assert getattr(single, name).dtype == np.float64, (method, name)
            np.testing.assert_array_equal(getattr(single, name), getattr(double, name), err_msg=f"{method} {name}")
        assert single.alpha_ == double.alpha_


def test_retention_is_undefined_when_the_original_auroc_is_zero():
    y = np.array([0, 0, 1, 1])
    flipped, perfect, half = np.array([1.0, 1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0, 1.0]), np.array([0.0, 1.0, 0.0, 1.0])
    auc = T._auc3(y, flipped, perfect)
    assert auc[:2].tolist() == [0.0, 1.0] and np.isnan(auc[2])
    np.testing.assert_array_equal(T._auc3(y, half, perfect), [0.5, 1.0, 2.0])


# --------------------------------------------------------------------------- classifier transfer


def _transfer_data(n=300, seed=5):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(n, 6))
    new = old @ rng.normal(size=(6, 6))
    labels = pd.DataFrame({"nodule": (old[:, 0] + rng.normal(0, 0.5, n) > 0).astype(int)})
    return old, new, labels


def test_classifier_transfer_index_messages():
    old, new, labels = _transfer_data()
    sets = {"map_idx": np.arange(100), "train_idx": np.arange(100, 200), "test_idx": np.arange(200, 300)}

    def call(**changes):
        return T.classifier_transfer(old, new, labels, **{"n_resamples": 20, **sets, **changes})

    assert error_message(call, map_idx=np.ones(5, bool)) == (
        "map_idx as a boolean mask must have one entry per image (300), got shape (5,)")
    assert error_message(call, train_idx=np.arange(4.0)) == (
        "train_idx must be a 1-D array of integer row indices, got float64 (4,)")
    assert error_message(call, test_idx=np.arange(4).reshape(2, 2)) == (
        "test_idx must be a 1-D array of integer row indices, got int64 (2, 2)")
    assert error_message(call, test_idx=np.array([], dtype=int)) == "test_idx is empty"
    assert error_message(call, test_idx=[]) == "test_idx is empty"
    assert error_message(call, test_idx=[299, 300]) == "test_idx has indices outside 0..299"
    assert error_message(call, test_idx=[-1, 250]) == "test_idx has indices outside 0..299"
    assert error_message(call, test_idx=[250, 250]) == "test_idx repeats some images; pass each index once"
    assert error_message(call, test_idx=np.arange(190, 300)) == (
        "train_idx and test_idx share 10 image(s) (e.g. rows [190, 191, 192, 193, 194]); "
        "the map, training and test images must be disjoint")
    assert error_message(call, train_idx=np.arange(99, 200)) == (
        "map_idx and train_idx share 1 image(s) (e.g. rows [99]); "
        "the map, training and test images must be disjoint")
    patients = np.arange(300) // 2
    patients[250] = 0  # patient 0 also in the map images
    assert error_message(call, groups=patients) == (
        "map_idx and test_idx share 1 patient(s) (e.g. [0]); split by patient so that no patient is in two parts")
    assert error_message(call, groups=patients[:10]) == "groups must have one patient id per image (300), got shape (10,)"
    assert error_message(call, n_resamples=0) == "n_resamples must be an integer >= 1, got 0"
    mask = np.zeros(300, bool)
    mask[:100] = True
    by_mask = call(map_idx=mask)
    by_index = call()
    pd.testing.assert_frame_equal(by_mask.table, by_index.table)
    assert (by_index.method, by_index.alpha, by_index.n_map) == ("ridge", by_mask.alpha, 100)
    assert by_mask.alpha is not None and by_mask.n_map == 100


# --------------------------------------------------------------------------- transfer sweep


def test_transfer_sweep_messages_and_limits():
    old, new, labels = _transfer_data(n=40)
    groups = np.arange(40) // 2

    def sweep(**changes):
        options = {"groups": groups, "n_values": (4,), "n_resamples": 10, **changes}
        return T.transfer_sweep(options.pop("X_old", old), options.pop("X_new", new), labels, **options)

    assert error_message(sweep, X_new=new[:39]) == (
        "X_old and X_new must hold the same images in the same order; they have 40 and 39 rows")
    assert error_message(sweep, groups=groups[:5]) == "groups must have one patient id per image (40), got shape (5,)"
    # a missing share (None) is refused like the others, not a TypeError from comparing None
    for bad in [(0.5, 0.5), (0.5, 0.5, 0.0), (0.6, 0.5, -0.1), (0.5, 0.25, 0.2), (0.5, None, 0.5)]:
        assert error_message(sweep, fractions=bad) == (
            f"fractions must be three positive shares (map, train, test) summing to 1, got {bad}")
    for bad in (1, True, 2.5):
        assert error_message(sweep, n_values=(4, bad)) == f"n_values must hold integers >= 2, got {bad!r}"
    assert sweep(n_values=(2,)).table["n_map"].tolist() == [2]
    few = np.array([0, 0, 0, 0, 0, 0, 1, 1, 2, 3] * 4)
    assert error_message(sweep, groups=few, fractions=(0.9, 0.05, 0.05)) == (
        "the probe test part has 0 image(s); need more patients (got 4) or different fractions")
    missing = groups.astype(object)
    missing[3] = None
    assert error_message(sweep, groups=missing) == "groups has missing patient ids; give every image a patient"


def test_transfer_sweep_split_defaults_and_pool():
    old, new, labels = _transfer_data(n=200)
    groups = np.arange(200) // 2  # 100 patients of 2 images
    res = T.transfer_sweep(old, new, labels, groups=groups, n_values=(8, 32, 500), n_resamples=20)
    table = res.table
    # a patient's images sit in the part where the middle of its share of the shuffled images falls
    assert (res.dropped_n, res.n_pool, res.n_train, res.n_test) == ([500], 100, 50, 50)
    assert table["n_map"].tolist() == [8, 32, 100]
    explicit = T.transfer_sweep(old, new, labels, groups=groups, n_values=(8, 32, 500), n_resamples=20,
                                fractions=(0.5, 0.25, 0.25), method="ridge", C=1.0, max_iter=2000,
                                confidence=0.95, random_state=0)
    pd.testing.assert_frame_equal(table, explicit.table)
    assert (explicit.dropped_n, explicit.n_pool, explicit.n_train, explicit.n_test) == ([500], 100, 50, 50)
    defaults = T.transfer_sweep(old, new, labels, groups=groups, n_values=(8,))
    assert defaults.table.equals(
        T.transfer_sweep(old, new, labels, groups=groups, n_values=(8,), n_resamples=200).table)
    assert defaults.dropped_n == []
    other = T.transfer_sweep(old, new, labels, groups=groups, n_values=(8,), n_resamples=20, random_state=1).table
    assert not other["auroc_transferred"].equals(table["auroc_transferred"].iloc[:1])
    # the same split in a direct call: patients are shuffled, not taken in order
    rng = np.random.default_rng(0)
    pool, train, test = grouped_split(groups, np.array([0.5, 0.25, 0.25]), rng)
    assert (pool.size, train.size, test.size) == (100, 50, 50)
    assert not np.array_equal(np.unique(groups[pool]), np.arange(50))
    assert not set(groups[pool]) & set(groups[train]) and not set(groups[train]) & set(groups[test])
    assert sorted(np.concatenate([pool, train, test]).tolist()) == list(range(200))


def _reference_transfer(old, new, labels, mp, tr, te, groups, n_resamples, C=1.0, seed=0):
    """classifier_transfer written out: probes, map, AUROCs and a grouped bootstrap of the three."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from crslib import stats

    lin = T.fit_linear_map(new[mp], old[mp], random_state=seed)
    rows = {}
    for col in labels.columns:
        y_tr, y_te = labels[col].to_numpy()[tr], labels[col].to_numpy()[te]
        fit, ev = ~np.isnan(y_tr), ~np.isnan(y_te)
        if len(np.unique(y_tr[fit])) < 2:
            continue
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000, random_state=seed))
        clf.fit(old[tr][fit], y_tr[fit].astype(int))
        s_o = clf.decision_function(old[te][ev])
        s_t = clf.decision_function(lin.predict(new[te][ev]))
        y = y_te[ev].astype(int)

        def three(yy, a, b):
            ao, at = stats.auroc(yy, a), stats.auroc(yy, b)
            return np.array([ao, at, at / ao])

        res = stats.bootstrap_ci(three, y, s_o, s_t, n_resamples=n_resamples,
                                 groups=None if groups is None else groups[te][ev], random_state=seed)
        rows[col] = (int(fit.sum()), int(ev.sum()), int(y.sum()), res)
    return rows, T.held_out_r2(lin, new[te], old[te])


@pytest.mark.parametrize("grouped, seed", [(False, 0), (True, 0), (True, 6)])
def test_classifier_transfer_equals_the_procedure_written_out(grouped, seed):
    rng = np.random.default_rng(31)
    n = 240
    old = rng.normal(size=(n, 6))
    new = old @ rng.normal(size=(6, 6)) + 0.3 * rng.normal(size=(n, 6))
    labels = pd.DataFrame({
        "always": np.zeros(n),  # one class: skipped with a reason, the findings after it still run
        "nodule": (old[:, 0] + rng.normal(0, 0.7, n) > 0).astype(float),
        "edema": (old[:, 1] - old[:, 2] + rng.normal(0, 0.7, n) > 0).astype(float),
    })
    labels.loc[rng.choice(n, 30, replace=False), "edema"] = np.nan
    groups = np.arange(n) // 3 if grouped else None
    mp, tr, te = np.arange(0, 90), np.arange(90, 180), np.arange(180, 240)
    if seed:  # the seed reaches the map's cross-validation folds: seed 6 picks another ridge penalty here
        assert T.fit_linear_map(new[mp], old[mp], random_state=seed).alpha_ != T.fit_linear_map(new[mp], old[mp]).alpha_
    out = T.classifier_transfer(old, new, labels, map_idx=mp, train_idx=tr, test_idx=te, groups=groups,
                                n_resamples=60, random_state=seed).table
    reference, r2 = _reference_transfer(old, new, labels, mp, tr, te, groups, 60, seed=seed)
    assert out["finding"].tolist() == ["always", "nodule", "edema"]
    skipped = out.iloc[0]
    assert skipped["reason"] == "single class in the training split (0 positive of 90)"
    assert skipped["n_test"] == 60 and np.isnan(skipped["n_train"]) and np.isnan(skipped["retention"])
    for row in out.iloc[1:].itertuples():
        n_train, n_test, n_pos, res = reference[row.finding]
        assert (row.n_train, row.n_test, row.n_test_positive, row.reason) == (n_train, n_test, n_pos, "")
        got = [row.auroc_original, row.auroc_transferred, row.retention]
        assert got == pytest.approx(res.estimate.tolist())
        assert [row.auroc_original_low, row.auroc_transferred_low, row.retention_low] == pytest.approx(res.low.tolist())
        assert [row.auroc_original_high, row.auroc_transferred_high, row.retention_high] == pytest.approx(
            res.high.tolist())
        assert row.map_r2 == pytest.approx(r2)
    assert out.loc[2, "n_test"] < 60  # unlabelled test images are left out of that finding


def test_classifier_transfer_defaults_and_degenerate_cases(caplog):
    old, new, labels = _transfer_data(n=120)
    sets = {"map_idx": np.arange(40), "train_idx": np.arange(40, 80), "test_idx": np.arange(80, 120)}
    default = T.classifier_transfer(old, new, labels, **sets)
    explicit = T.classifier_transfer(old, new, labels, **sets, method="ridge", C=1.0, max_iter=2000,
                                     n_resamples=1000, confidence=0.95, random_state=0)
    pd.testing.assert_frame_equal(default.table, explicit.table)
    assert (default.method, default.alpha, default.n_map) == (explicit.method, explicit.alpha, 40)
    other = T.classifier_transfer(old, new, labels, **sets, C=0.01, random_state=3, n_resamples=50).table
    assert other.loc[0, "auroc_transferred"] != default.table.loc[0, "auroc_transferred"]
    lstsq = T.classifier_transfer(old, new, labels, **sets, method="lstsq", n_resamples=20)
    assert lstsq.method == "lstsq" and lstsq.alpha is None
    # a single class in the test split is a reason in the table and an INFO log line, not an error or a warning
    negatives = np.flatnonzero(labels["nodule"].to_numpy()[80:] == 0)[:2] + 80
    with caplog.at_level("INFO", logger="crslib.transfer"):
        one = T.classifier_transfer(old, new, labels, map_idx=np.arange(40), train_idx=np.arange(40, 80),
                                    test_idx=negatives, n_resamples=20).table
    assert one.loc[0, "reason"] == "single class in the test split (0 positive of 2)"
    assert np.isfinite(one.loc[0, "map_r2"]) and one.loc[0, "n_train"] == 40
    assert "classifier_transfer: finding 'nodule' skipped: single class in the test split" in caplog.text
    assert "classifier_transfer: no finding could be evaluated" in caplog.text
    assert {r.levelname for r in caplog.records if r.name == "crslib.transfer"} == {"INFO"}


def test_transfer_sweep_rows_equal_classifier_transfer_on_the_same_split():
    old, new, labels = _transfer_data(n=160, seed=8)
    groups = np.arange(160) // 2
    sweep = T.transfer_sweep(old, new, labels, groups=groups, n_values=(10, 40), n_resamples=30,
                             random_state=4).table
    assert list(sweep.columns[:3]) == ["n_map", "alpha", "finding"]
    rng = np.random.default_rng(4)
    pool, train, test = grouped_split(groups, np.array([0.5, 0.25, 0.25]), rng)
    pool = pool[rng.permutation(pool.size)]
    for nv in (10, 40):
        direct = T.classifier_transfer(old, new, labels, map_idx=pool[:nv], train_idx=train, test_idx=test,
                                       groups=groups, n_resamples=30, random_state=4)
        rows = sweep[sweep["n_map"] == nv].drop(columns=["n_map", "alpha"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, direct.table, check_like=False)
        assert sweep.loc[sweep["n_map"] == nv, "alpha"].iloc[0] == direct.alpha
        assert direct.n_map == nv
    assert sweep.index.tolist() == list(range(len(sweep)))
    assert error_message(T.classifier_transfer, old, new[:5], labels, map_idx=[0, 1], train_idx=[2, 3],
                    test_idx=[4, 5]) == (
        "X_old and X_new must hold the same images in the same order; they have 160 and 5 rows")


def test_transfer_sweep_keeps_the_pool_size_logs_what_it_drops_and_fits_each_finding(caplog):
    old, new, labels = _transfer_data(n=200)
    labels = labels.assign(effusion=(old[:, 1] > 0).astype(int))
    groups = np.arange(200) // 2
    with caplog.at_level("INFO", logger="crslib.transfer"):
        res = T.transfer_sweep(old, new, labels, groups=groups, n_values=(8, 100, 101, 300), n_resamples=10)
    assert res.table["n_map"].unique().tolist() == [8, 100] and res.dropped_n == [101, 300]  # 100 = the pool
    assert ("transfer_sweep: n_values [101, 300] exceed the map pool (100 images); using 100 instead"
            in caplog.messages)
    assert sorted(res.table["finding"].unique()) == ["effusion", "nodule"]  # no stray index column as a target
    procrustes = T.transfer_sweep(old, new, labels, groups=groups, n_values=(8, 100), n_resamples=10,
                                  method="procrustes")
    assert procrustes.table["alpha"].isna().all() and res.table["alpha"].notna().all()
    assert not np.allclose(procrustes.table["map_r2"], res.table["map_r2"])


def test_transfer_sweep_fits_each_map_with_its_random_state():
    rng = np.random.default_rng(31)
    old = rng.normal(size=(240, 6))
    new = old @ rng.normal(size=(6, 6)) + 0.3 * rng.normal(size=(240, 6))  # noisy: the penalty depends on the folds
    labels = pd.DataFrame({"nodule": (old[:, 0] > 0).astype(int)})
    groups = np.arange(240) // 3
    sweep = T.transfer_sweep(old, new, labels, groups=groups, n_values=(30, 60), n_resamples=10, random_state=3)
    rng = np.random.default_rng(3)
    pool, _, _ = grouped_split(groups, np.array([0.5, 0.25, 0.25]), rng)
    pool = pool[rng.permutation(pool.size)]
    expected = [T.fit_linear_map(new[pool[:nv]], old[pool[:nv]], random_state=3).alpha_ for nv in (30, 60)]
    assert sweep.table["alpha"].tolist() == expected
    assert expected != [T.fit_linear_map(new[pool[:nv]], old[pool[:nv]]).alpha_ for nv in (30, 60)]


def test_transfer_sweep_names_the_part_that_is_too_small():
    old, new, labels = _transfer_data(n=40)
    one_each = np.arange(40)  # one image per patient: parts hold 40 x their share
    for fractions, part in [((0.02, 0.49, 0.49), "map pool"), ((0.49, 0.02, 0.49), "probe training")]:
        with pytest.raises(InputError, match=fr"the {part} part has [01] image\(s\); need more patients \(got 40\)"):
            T.transfer_sweep(old, new, labels, groups=one_each, fractions=fractions, n_values=(2,), n_resamples=5)
    two = T.transfer_sweep(old, new, labels, groups=one_each, fractions=(0.05, 0.475, 0.475), n_values=(2,),
                           n_resamples=5)
    assert two.n_pool == 2 and two.table["n_map"].tolist() == [2]  # two images are enough for a part


def test_classifier_transfer_table_findings_confidence_and_log(caplog):
    old, new, labels = _transfer_data()
    labels = labels.assign(effusion=(old[:, 1] > 0).astype(int), never=0)
    labels.index = np.arange(1000, 1300)  # a manifest's index: not carried in as a target
    sets = {"map_idx": np.arange(100), "train_idx": np.arange(100, 200), "test_idx": np.arange(200, 300)}
    with caplog.at_level("INFO", logger="crslib.transfer"):
        res = T.classifier_transfer(old, new, labels, n_resamples=60, confidence=0.95, random_state=3, **sets)
    table = res.table
    assert list(table.columns) == T._COLUMNS and table["finding"].tolist() == ["nodule", "effusion", "never"]
    skipped = table.set_index("finding").loc["never"]
    assert skipped["reason"] != "" and np.isnan(float(skipped["auroc_original"]))  # NaN, not None
    assert table["auroc_original"].dtype == float
    again = T.classifier_transfer(old, new, labels, n_resamples=60, confidence=0.95, random_state=3, **sets)
    pd.testing.assert_frame_equal(table, again.table)
    narrow = T.classifier_transfer(old, new, labels, n_resamples=60, confidence=0.5, random_state=3, **sets).table
    width = (table["auroc_transferred_high"] - table["auroc_transferred_low"]).iloc[:2].to_numpy()
    assert (narrow["auroc_transferred_high"] - narrow["auroc_transferred_low"]).iloc[:2].lt(width).all()
    assert "classifier_transfer: no finding could be evaluated" not in caplog.messages
    with caplog.at_level("INFO", logger="crslib.transfer"):
        none = T.classifier_transfer(old, new, labels[["never"]], n_resamples=10, **sets).table
    assert "classifier_transfer: no finding could be evaluated" in caplog.messages
    scores = [c for c in T._COLUMNS if c.startswith(("auroc", "retention"))]
    assert len(scores) == 9 and (none[scores].dtypes == float).all() and none[scores].isna().all(axis=None)
    assert "classifier_transfer: finding 'never' skipped: single class in the training split (0 positive of 100)" \
        in caplog.messages


def test_linear_map_predict_checks_its_input_and_returns_float64():
    X, Y = _data()
    lin = T.fit_linear_map(X, Y)
    out = lin.predict(X[:5].astype(np.float32))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, lin.predict(X[:5]), rtol=1e-5)
    assert error_message(lin.predict, X[:, :3]).startswith("X ")
    assert error_message(lin.predict, np.array([["a"] * 6] * 3)).startswith("X must hold numbers")


def test_transfer_results_serialise_every_field():
    import json

    old, new, labels = _transfer_data(n=120)
    sets = {"map_idx": np.arange(40), "train_idx": np.arange(40, 80), "test_idx": np.arange(80, 120)}
    res = T.classifier_transfer(old, new, labels, n_resamples=10, **sets)
    d = res.to_dict()
    assert set(d) == {"method", "alpha", "n_map", "table"}
    assert (d["method"], d["alpha"], d["n_map"]) == ("ridge", res.alpha, 40)
    assert [row["finding"] for row in d["table"]] == ["nodule"] and json.loads(res.to_json()) == d
    sweep = T.transfer_sweep(old, new, labels, groups=np.arange(120) // 2, n_values=(4, 500), n_resamples=10)
    s = sweep.to_dict()
    assert set(s) == {"dropped_n", "n_pool", "n_train", "n_test", "table"}
    assert (s["dropped_n"], s["n_pool"], s["n_train"], s["n_test"]) == (
        [500], sweep.n_pool, sweep.n_train, sweep.n_test)
    assert [row["n_map"] for row in s["table"]] == sweep.table["n_map"].tolist() and json.loads(sweep.to_json()) == s

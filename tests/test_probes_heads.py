"""crslib.probes: the heads of the representation-risk workflow (linear, kNN, MLP) on small inputs.

Each head is checked against a computation by hand with scikit-learn or
brute force, so a wrong grid value, a wrong fold, a swapped argument or a
dropped option changes a number here (``crslib.risk``'s workflows cover the
heads only end to end).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import roc_auc_score
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from crslib import probes
from crslib.errors import InputError


def _task(task="classification", n=60, seed=0):
    """Three features, the first carrying the target; two inner folds inside the first 40 rows."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, 3))
    if task == "classification":
        y = (Z[:, 0] + rng.normal(0, 0.8, n) > 0).astype(np.int64)
    else:
        y = 2.0 * Z[:, 0] + rng.normal(0, 0.5, n)
    tr = np.arange(40)
    folds = [(np.arange(0, 20), np.arange(20, 40)), (np.arange(20, 40), np.arange(0, 20))]
    return Z, y, tr, folds


def _inner_scores_by_hand(make, Z, y, tr, folds, grid, score, fold_features=None):
    """Inner-CV score of every grid value, each fold's model fitted on its fitting rows only."""
    yt = y[tr]
    out = []
    for value in grid:
        oof = np.zeros(yt.size)
        for i, (fit, val) in enumerate(folds):
            Zt = Z[tr] if fold_features is None else fold_features[i]
            oof[val] = make(value, Zt[fit], yt[fit], Zt[val])
        out.append(score(yt, oof))
    return np.array(out)


def _linear_by_hand(task):
    def fit_predict(value, Z_fit, y_fit, Z_val):
        if task == "classification":
            model = make_pipeline(StandardScaler(), LogisticRegression(C=value, max_iter=2000)).fit(Z_fit, y_fit)
            return model.predict_proba(Z_val)[:, 1]
        return make_pipeline(StandardScaler(), Ridge(alpha=value)).fit(Z_fit, y_fit).predict(Z_val)

    return fit_predict


def _brute_knn_means(Z_fit, y_fit, Z_query, k):
    """Mean target of the k nearest rows by a full stable sort (ties: the earlier row is nearer)."""
    d2 = ((Z_query[:, None, :] - Z_fit[None, :, :]) ** 2).sum(axis=2)
    ind = np.argsort(d2, axis=1, kind="stable")[:, :k]
    return y_fit[ind].astype(float).mean(axis=1)


# --------------------------------------------------------------------------- small helpers


def test_classifier_name_is_the_string_or_the_class_name():
    assert probes.classifier_name("logistic") == "logistic"
    assert probes.classifier_name(LogisticRegression()) == "LogisticRegression"


def test_class_proba_puts_each_fitted_class_in_its_own_column():
    X = np.arange(6.0)[:, None]
    y = np.array([0, 0, 0, 2, 2, 2])  # class 1 was never seen in training
    model = LogisticRegression().fit(X, y)
    out = probes.class_proba(model, X[:4], 4)
    assert out.shape == (4, 4)
    np.testing.assert_array_equal(out[:, [1, 3]], 0.0)
    np.testing.assert_allclose(out[:, [0, 2]], model.predict_proba(X[:4]))
    np.testing.assert_allclose(out.sum(axis=1), 1.0)


def test_head_predict_is_the_positive_class_probability_or_the_value():
    Z, y, tr, _ = _task()
    model = LogisticRegression().fit(Z, y)
    np.testing.assert_allclose(probes.head_predict(model, "classification", Z), model.predict_proba(Z)[:, 1])
    Zr, yr, _, _ = _task("regression")
    ridge = Ridge().fit(Zr, yr)
    np.testing.assert_allclose(probes.head_predict(ridge, "regression", Zr), ridge.predict(Zr))


def test_linear_head_standardises_then_fits_the_penalised_model():
    clf = probes.linear_head("classification", 0.1)
    assert [type(step).__name__ for step in clf] == ["StandardScaler", "LogisticRegression"]
    assert clf[-1].C == 0.1 and clf[-1].max_iter == 2000
    reg = probes.linear_head("regression", 100.0)
    assert [type(step).__name__ for step in reg] == ["StandardScaler", "Ridge"]
    assert reg[-1].alpha == 100.0
    # the scaler matters: a feature scaled by 1000 gives the same prediction
    Z, y, _, _ = _task()
    scaled = Z * np.array([1000.0, 1.0, 1.0])
    np.testing.assert_allclose(
        probes.linear_head("classification", 1.0).fit(scaled, y).predict_proba(scaled),
        probes.linear_head("classification", 1.0).fit(Z, y).predict_proba(Z), atol=1e-6,
    )


class _WarnsOnFit(ClassifierMixin, BaseEstimator):
    """A classifier whose fit raises a warning that is not about convergence."""

    def fit(self, X, y):
        warnings.warn("this classifier has something to say", UserWarning)
        self.classes_ = np.unique(y)
        return self

    def predict_proba(self, X):
        return np.full((len(X), len(self.classes_)), 1.0 / len(self.classes_))


def test_fit_classifier_lets_other_warnings_through():
    X, y = np.zeros((4, 1)), np.array([0, 1, 0, 1])
    with pytest.warns(UserWarning, match="something to say"):
        probes.fit_classifier(_WarnsOnFit(), X, y, 0)


# --------------------------------------------------------------------------- linear head


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_fit_linear_head_picks_the_penalty_of_the_best_inner_score(task):
    Z, y, tr, folds = _task(task)
    grid = probes._C_GRID if task == "classification" else probes._ALPHA_GRID
    default_score = roc_auc_score if task == "classification" else probes.r2
    scores = _inner_scores_by_hand(_linear_by_hand(task), Z, y, tr, folds, grid, default_score)
    best = int(np.argmax(scores))
    pred, param, inner = probes.fit_linear_head(Z, y, tr, folds, task)
    name = "C" if task == "classification" else "alpha"
    assert param == f"{name}={grid[best]:g}"
    assert inner == pytest.approx(scores[best])
    # the final model is refitted on all training rows and predicts every row, test rows included
    final = _linear_by_hand(task)(grid[best], Z[tr], y[tr], Z)
    assert pred.shape == (len(y),)
    np.testing.assert_allclose(pred, final, rtol=1e-6, atol=1e-8)
    # a score that rewards the flattest prediction picks the largest penalty of the task's grid
    _, param, _ = probes.fit_linear_head(Z, y, tr, folds, task, score=lambda t, p: -float(np.var(p)))
    assert param == (f"C={min(grid):g}" if task == "classification" else f"alpha={max(grid):g}")


def test_fit_linear_head_ranks_by_the_given_score_and_uses_each_folds_features():
    Z, y, tr, folds = _task()

    def closest_to_half(truth, pred):  # rewards the strongest penalty: probabilities shrink to 1/2
        return -float(np.abs(pred - 0.5).mean())

    _, param, inner = probes.fit_linear_head(Z, y, tr, folds, "classification", score=closest_to_half)
    assert param == "C=0.01"
    scores = _inner_scores_by_hand(_linear_by_hand("classification"), Z, y, tr, folds, probes._C_GRID, closest_to_half)
    assert inner == pytest.approx(scores[0]) and scores[0] == scores.max()
    # fold features: each inner fold is scored on its own features (here fold 1's are noise), so
    # the inner score is the one computed on those, not on Z
    rng = np.random.default_rng(5)
    fold_features = [Z[tr], rng.normal(size=Z[tr].shape)]
    expected = _inner_scores_by_hand(_linear_by_hand("classification"), Z, y, tr, folds, probes._C_GRID, roc_auc_score,
                                     fold_features=fold_features)
    plain = _inner_scores_by_hand(_linear_by_hand("classification"), Z, y, tr, folds, probes._C_GRID, roc_auc_score)
    _, param, inner = probes.fit_linear_head(Z, y, tr, folds, "classification", fold_features=fold_features)
    assert inner == pytest.approx(expected.max())
    assert not np.isclose(expected.max(), plain.max())
    assert param == f"C={probes._C_GRID[int(np.argmax(expected))]:g}"


@pytest.mark.parametrize("task, default", [("classification", "C=1"), ("regression", "alpha=10")])
def test_fit_linear_head_without_folds_or_with_a_fixed_penalty_skips_the_search(task, default):
    Z, y, tr, folds = _task(task)
    pred, param, inner = probes.fit_linear_head(Z, y, tr, [], task)
    assert param == default and np.isnan(inner)
    value = float(default.split("=")[1])
    np.testing.assert_allclose(pred, _linear_by_hand(task)(value, Z[tr], y[tr], Z), rtol=1e-6, atol=1e-8)
    fixed = 0.1 if task == "classification" else 1000.0
    pred, param, inner = probes.fit_linear_head(Z, y, tr, folds, task, param=fixed)
    assert param.endswith(f"={fixed:g}") and np.isnan(inner)
    np.testing.assert_allclose(pred, _linear_by_hand(task)(fixed, Z[tr], y[tr], Z), rtol=1e-6, atol=1e-8)


def test_fit_linear_head_keeps_the_default_when_no_inner_score_is_finite():
    Z, y, tr, folds = _task()
    _, param, inner = probes.fit_linear_head(Z, y, tr, folds, "classification", score=lambda t, p: float("nan"))
    assert param == "C=1" and np.isnan(inner)
    # one finite score is enough, whatever its place in the grid
    calls = iter(range(len(probes._C_GRID)))
    _, param, inner = probes.fit_linear_head(
        Z, y, tr, folds, "classification", score=lambda t, p: 0.3 if next(calls) == 2 else float("nan"))
    assert param == f"C={probes._C_GRID[2]:g}" and inner == 0.3


# --------------------------------------------------------------------------- kNN


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_knn_means_equal_a_brute_force_search_with_ties(seed):
    rng = np.random.default_rng(seed)
    Z_fit = rng.integers(0, 3, size=(25, 2)).astype(float)  # a 3x3 grid: many rows at equal distance
    Z_query = rng.integers(0, 3, size=(7, 2)).astype(float)
    y_fit = rng.integers(0, 2, size=25)
    ks = [1, 2, 5, 13, 25]
    means = probes.knn_means(Z_fit, y_fit, Z_query, ks)
    assert sorted(means) == ks
    for k in ks:
        np.testing.assert_allclose(means[k], _brute_knn_means(Z_fit, y_fit, Z_query, k), err_msg=f"k={k}")


def test_knn_means_clip_k_to_the_fitting_rows_and_average_one_hot_targets():
    Z_fit = np.array([[0.0], [1.0], [5.0]])
    onehot = np.array([[1, 0], [0, 1], [0, 1]])
    means = probes.knn_means(Z_fit, onehot, np.array([[0.2], [4.0]]), [1, 2, 10])
    np.testing.assert_allclose(means[1], [[1, 0], [0, 1]])
    np.testing.assert_allclose(means[2], [[0.5, 0.5], [0, 1]])
    np.testing.assert_allclose(means[10], np.tile([1 / 3, 2 / 3], (2, 1)))  # all three rows
    # continuous features: the matrix-product distance agrees with the direct one
    rng = np.random.default_rng(3)
    Z_fit, Z_query, y = rng.normal(size=(40, 5)), rng.normal(size=(9, 5)), rng.normal(size=40)
    np.testing.assert_allclose(probes.knn_means(Z_fit, y, Z_query, [7])[7], _brute_knn_means(Z_fit, y, Z_query, 7))


def test_knn_means_equal_a_brute_force_search_for_large_k_on_a_large_fitting_set():
    # np.partition guarantees only the position asked for; on a few hundred rows and a large k its
    # neighbour is sometimes wrong (not on small inputs), so the k-th distance must be read from there
    rng = np.random.default_rng(3)
    Z_fit, Z_query, y_fit = rng.normal(size=(300, 2)), rng.normal(size=(200, 2)), rng.normal(size=300)
    ks = [60, 90, 100]
    means = probes.knn_means(Z_fit, y_fit, Z_query, ks)
    for k in ks:
        np.testing.assert_allclose(means[k], _brute_knn_means(Z_fit, y_fit, Z_query, k), err_msg=f"k={k}")


def test_fit_knn_head_picks_k_by_inner_score_and_predicts_every_row_from_the_training_rows():
    Z, y, tr, folds = _task(n=120)
    tr = np.arange(80)
    folds = [(np.arange(0, 40), np.arange(40, 80)), (np.arange(40, 80), np.arange(0, 40))]
    scores = _inner_scores_by_hand(
        lambda k, Zf, yf, Zv: _brute_knn_means(Zf, yf, Zv, k), Z, y, tr, folds, probes._K_GRID,
        roc_auc_score)
    best = int(np.argmax(scores))
    pred, param, inner = probes.fit_knn_head(Z, y, tr, folds, "classification")
    k = probes._K_GRID[best]
    assert param == f"k={k}" and inner == pytest.approx(scores[best])
    np.testing.assert_allclose(pred, _brute_knn_means(Z[tr], y[tr], Z, k))
    # a score that prefers the smoothest prediction picks the largest k
    _, param, _ = probes.fit_knn_head(Z, y, tr, folds, "classification", score=lambda t, p: -float(np.var(p)))
    assert param == f"k={max(probes._K_GRID)}"


def test_fit_knn_head_with_fixed_k_targets_and_fold_features():
    Z, y, tr, folds = _task()
    pred, param, inner = probes.fit_knn_head(Z, y, tr, folds, "classification", param=5.0)
    assert param == "k=5" and np.isnan(inner)
    np.testing.assert_allclose(pred, _brute_knn_means(Z[tr], y[tr], Z, 5))
    # no folds: the default k, clipped to the training rows
    pred, param, inner = probes.fit_knn_head(Z, y, np.arange(10), [], "classification")
    assert param == "k=10" and np.isnan(inner)
    np.testing.assert_allclose(pred, np.full(len(y), y[:10].mean()))
    # targets: the neighbours average the targets, the score still compares with y
    onehot = np.eye(2)[y]
    pred, _, _ = probes.fit_knn_head(Z, y, tr, [], "classification", targets=onehot, param=5)
    assert pred.shape == (len(y), 2)
    np.testing.assert_allclose(pred[:, 1], _brute_knn_means(Z[tr], y[tr], Z, 5))
    # fold features shape the inner score
    flipped = [-Z[tr][:, ::-1] * np.array([1.0, 1.0, 50.0]), Z[tr]]
    expected = _inner_scores_by_hand(
        lambda k, Zf, yf, Zv: _brute_knn_means(Zf, yf, Zv, k), Z, y, tr, folds, probes._K_GRID,
        roc_auc_score, fold_features=flipped)
    _, param, inner = probes.fit_knn_head(Z, y, tr, folds, "classification", fold_features=flipped)
    assert inner == pytest.approx(expected.max()) and param == f"k={probes._K_GRID[int(np.argmax(expected))]}"


def test_fit_knn_head_keeps_the_default_k_when_no_inner_score_is_finite():
    Z, y, tr, folds = _task()
    _, param, inner = probes.fit_knn_head(Z, y, tr, folds, "classification", score=lambda t, p: float("nan"))
    assert param == "k=15" and np.isnan(inner)


# --------------------------------------------------------------------------- MLP and dispatch


def test_fit_mlp_head_is_the_documented_mlp_seeded():
    Z, y, tr, folds = _task()
    pred, param, inner = probes.fit_mlp_head(Z, y, tr, folds, "classification", 3)
    assert param == "hidden=64" and np.isnan(inner)
    options = {"hidden_layer_sizes": (64,), "solver": "lbfgs", "alpha": 1e-3, "max_iter": 200}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_hand = make_pipeline(StandardScaler(), MLPClassifier(**options, random_state=3)).fit(Z[tr], y[tr])
    np.testing.assert_allclose(pred, by_hand.predict_proba(Z)[:, 1])
    other_seed, _, _ = probes.fit_mlp_head(Z, y, tr, folds, "classification", 4)
    assert not np.allclose(pred, other_seed)


def test_fit_mlp_head_regresses_on_the_standardised_target_and_silences_convergence():
    Z, y, tr, folds = _task("regression")
    y = 100.0 + 30.0 * y  # far from standard
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a convergence warning would fail here
        pred, param, _ = probes.fit_mlp_head(Z, y, tr, folds, "regression", 0)
    options = {"hidden_layer_sizes": (64,), "solver": "lbfgs", "alpha": 1e-3, "max_iter": 200}
    mu, sd = y[tr].mean(), y[tr].std()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_hand = make_pipeline(StandardScaler(), MLPRegressor(**options, random_state=0)).fit(Z[tr], (y[tr] - mu) / sd)
    np.testing.assert_allclose(pred, by_hand.predict(Z) * sd + mu, rtol=1e-6)
    assert param == "hidden=64"
    # a constant target is predicted as that constant, not divided by a zero spread
    constant, _, _ = probes.fit_mlp_head(Z, np.full(len(y), 7.0), tr, folds, "regression", 0)
    np.testing.assert_allclose(constant, 7.0, atol=0.1)


def _inner_auroc(head, param, Z, y, tr, folds):
    value = float(param.split("=")[1])
    if head == "linear":
        make = _linear_by_hand("classification")
    else:
        def make(k, Zf, yf, Zv):
            return _brute_knn_means(Zf, yf, Zv, int(k))
    return _inner_scores_by_hand(make, Z, y, tr, folds, [value], roc_auc_score)[0]


def test_fit_head_hands_every_argument_to_the_named_head():
    Z, y, tr, folds = _task()
    fold_features = [Z[tr], np.random.default_rng(9).normal(size=Z[tr].shape)]  # fold 1: noise

    def score(t, p):  # an AUROC with its own sign: the given score, not the default, ranks the settings
        return -roc_auc_score(t, p)

    for head, fit in [("linear", probes.fit_linear_head), ("knn", probes.fit_knn_head)]:
        got = probes.fit_head(head, Z, y, tr, folds, "classification", 0, fold_features=fold_features, score=score)
        want = fit(Z, y, tr, folds, "classification", fold_features=fold_features, score=score)
        np.testing.assert_allclose(got[0], want[0])
        assert got[1] == want[1] and got[2] == pytest.approx(want[2])
        fixed = probes.fit_head(head, Z, y, tr, folds, "classification", 0, param=5)
        assert fixed[1] in ("C=5", "k=5") and np.isnan(fixed[2])
        # the fold features reach the head: without them the (default) inner score differs
        with_features = probes.fit_head(head, Z, y, tr, folds, "classification", 0, fold_features=fold_features)
        assert with_features[2] == pytest.approx(fit(Z, y, tr, folds, "classification",
                                                     fold_features=fold_features)[2])
        assert with_features[2] != pytest.approx(fit(Z, y, tr, folds, "classification")[2])
    # without score and features, the task's default inner score (AUROC here)
    for head, fit in [("linear", probes.fit_linear_head), ("knn", probes.fit_knn_head)]:
        got = probes.fit_head(head, Z, y, tr, folds, "classification", 0)
        assert got[1:] == fit(Z, y, tr, folds, "classification")[1:]
        assert got[2] == pytest.approx(_inner_auroc(head, got[1], Z, y, tr, folds))
    mlp = probes.fit_head("mlp", Z, y, tr, folds, "classification", 2)
    np.testing.assert_allclose(mlp[0], probes.fit_mlp_head(Z, y, tr, folds, "classification", 2)[0])
    assert mlp[1] == "hidden=64"
    assert not np.allclose(mlp[0], probes.fit_head("mlp", Z, y, tr, folds, "classification", 3)[0])


def test_knn_means_find_the_kth_distance_among_many_rows():
    # np.partition guarantees only the k-th value's place: the one after it is in order only when no
    # split of the selection fell between them, which depends on the CPU's sort kernel (AVX2 here
    # misplaced it on 3 of 1,300 random rows), so 1,000 queries give many chances
    rng = np.random.default_rng(7)
    Z_fit, Z_query, y = rng.normal(size=(1000, 3)), rng.normal(size=(1000, 3)), rng.normal(size=1000)
    means = probes.knn_means(Z_fit, y, Z_query, [2, 9, 40])
    for k in (2, 9, 40):
        np.testing.assert_allclose(means[k], _brute_knn_means(Z_fit, y, Z_query, k), err_msg=f"k={k}")


def test_fit_mlp_head_lets_other_warnings_through():
    from sklearn.exceptions import DataConversionWarning

    Z, y, tr, folds = _task()
    with pytest.warns(DataConversionWarning):  # a column vector where a 1-D y is expected
        probes.fit_mlp_head(Z, y[:, None], tr, folds, "classification", 0)


def test_make_classifier_names_what_it_was_given_instead_of_a_classifier():
    class NoProba:
        def fit(self, X, y):
            return self

    for model in (object(), NoProba()):
        with pytest.raises(InputError) as info:
            probes.make_classifier(model, 0)
        assert str(info.value) == ("model must be 'logistic', 'forest' or a scikit-learn classifier with "
                                   f"predict_proba, got {type(model).__name__}")

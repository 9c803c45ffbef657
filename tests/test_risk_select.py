"""Selection by a proper score, prediction-level combinations and the refit of crslib.risk (issue 20)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crslib.errors import InputError
from crslib.risk import evaluate_partition, refit_prediction, representation_risk
from crslib.risk_scores import MULTICLASS, count_matrix, row_losses
from crslib.risk_select import fit_stack, greedy_members, select_candidate

FAST = {"n_components": 8, "n_resamples": 300}


def _latent_embedding(latent: np.ndarray, rng: np.random.Generator, *, d: int = 12, strength: float = 3.0):
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    return strength * latent[:, None] * u[None, :] + rng.normal(size=(latent.size, d))


def _table(names, kinds, heads=None, members=None):
    heads = heads or ["linear"] * len(names)
    members = members or [n.split("/")[0] for n in names]
    return pd.DataFrame({"candidate": names, "kind": kinds, "head": heads, "members": members,
                         "n_members": [m.count("+") + 1 for m in members]})


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# --------------------------------------------------------------------------- the selection rule


def test_same_auroc_different_calibration_the_better_log_loss_wins_in_either_order():
    """(a) Same ranking of the rows (same AUROC), one calibrated and one overconfident: order never decides."""
    rng = np.random.default_rng(0)
    groups = np.arange(200)
    z = rng.normal(size=200)
    y = (rng.random(200) < _sigmoid(z)).astype(int)
    preds = {"calibrated/linear": _sigmoid(z), "overconfident/linear": _sigmoid(4 * z)}
    losses = {c: row_losses("classification", y, p, "log_loss") for c, p in preds.items()}
    counts = count_matrix(groups, 500, 0)
    for order in (list(preds), list(preds)[::-1]):
        selected, table = select_candidate(_table(order, ["single", "single"]), losses, counts, loss="log_loss",
                                           confidence=0.95)
        assert selected == "calibrated/linear"
        assert table.set_index("candidate").loc["calibrated/linear", "why"].startswith("lowest validation log_loss")
    # ...while the old criterion could not tell them apart
    from crslib.stats import auroc
    assert auroc(y, preds["calibrated/linear"]) == auroc(y, preds["overconfident/linear"])


def test_two_encoders_at_validation_auroc_one_are_told_apart_by_log_loss_in_either_order():
    """The issue's case end to end: two separable encoders, AUROC 1.000 both; listing order must not decide."""
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(80), 2)
    y = np.repeat(np.tile([0, 1], 40), 2)
    latent = np.where(y == 1, 1.0, -1.0)
    emb = {"wide": _latent_embedding(latent, rng, strength=12.0), "narrow": _latent_embedding(latent, rng,
                                                                                             strength=6.0)}
    selections = []
    for names in (["wide", "narrow"], ["narrow", "wide"]):
        res = evaluate_partition({n: emb[n] for n in names}, y, groups=groups, heads=["linear"], union_size=0,
                                 combinations=(), **FAST)
        assert (res.candidates["val_score"] == 1.0).all()
        selections.append(res.selected)
        best = res.candidates.loc[res.candidates["val_loss"].idxmin(), "candidate"]
        assert res.selected == best
    assert selections[0] == selections[1]


def test_within_noise_the_simpler_head_is_kept_and_the_reason_says_so():
    rng = np.random.default_rng(2)
    groups = np.arange(60)
    base = rng.exponential(0.5, size=60)
    losses = {"a/knn": base, "a/linear": base + rng.normal(0.01, 0.2, size=60)}  # knn lower, but within noise
    counts = count_matrix(groups, 400, 0)
    selected, table = select_candidate(_table(list(losses), ["single", "single"], heads=["knn", "linear"]), losses,
                                       counts, loss="log_loss", confidence=0.95)
    rows = table.set_index("candidate")
    assert rows.loc["a/knn", "val_loss"] < rows.loc["a/linear", "val_loss"]
    assert selected == "a/linear" and rows.loc["a/linear", "within_noise"]
    assert "within the bootstrap noise of a/knn" in rows.loc["a/linear", "why"]
    assert rows.loc["a/knn", "why"] == (
        "lowest validation log_loss of the single encoders, but a/linear is within its noise and simpler")
    # a clear gap: the lower loss wins although its head is not the simpler one
    losses["a/linear"] = base + 0.5
    assert select_candidate(_table(list(losses), ["single", "single"], heads=["knn", "linear"]), losses, counts,
                            loss="log_loss", confidence=0.95)[0] == "a/knn"


def test_gaps_are_measured_from_the_lowest_single_loss_and_a_head_outside_the_order_comes_last():
    rng = np.random.default_rng(5)
    groups = np.arange(60)
    base = rng.exponential(0.5, size=60)
    noise = rng.normal(0, 0.2, size=60)
    # a/svm has the lowest loss; a/linear is 0.02 above it, well within the noise; b/linear clearly above
    losses = {"a/svm": base, "a/linear": base + 0.02 + noise - noise.mean(), "b/linear": base + 0.8}
    counts = count_matrix(groups, 400, 0)
    selected, table = select_candidate(_table(list(losses), ["single"] * 3, heads=["svm", "linear", "linear"]),
                                       losses, counts, loss="log_loss", confidence=0.95)
    rows = table.set_index("candidate")
    best = float(np.mean(base))
    np.testing.assert_allclose(rows["gap"], [np.mean(v) - best for v in losses.values()], rtol=0, atol=1e-12)
    # the lowest-loss candidate's gap to itself is exactly 0: within the noise, as is the linear head near it
    assert (rows.loc["a/svm", "gap_low"], rows.loc["a/svm", "gap_high"]) == (0.0, 0.0)
    assert rows.loc["a/svm", "within_noise"] and rows.loc["a/linear", "within_noise"]
    assert not rows.loc["b/linear", "within_noise"]
    # a head crslib does not order (a researcher's own table) is less simple than linear, knn and mlp
    assert selected == "a/linear" and rows.loc["a/linear", "kept"]


def test_every_candidate_gets_its_reason_and_the_kept_single_is_marked():
    rng = np.random.default_rng(2)
    groups = np.arange(60)
    base = rng.exponential(0.5, size=60)
    noise = rng.normal(0, 0.2, size=60)
    losses = {"a/knn": base, "a/linear": base + 0.01 + noise - noise.mean(), "b/linear": base + 0.8,
              "average/linear": base.copy(), "union/linear": base - 0.3, "stack/linear": base - 0.3}
    table = _table(list(losses), ["single", "single", "single", "average", "union", "stack"],
                   heads=["knn"] + ["linear"] * 5, members=["a", "a", "b", "a+b", "a+b", "a+b"])
    counts = count_matrix(groups, 400, 0)
    selected, sel = select_candidate(table, losses, counts, loss="log_loss", confidence=0.95)
    rows = sel.set_index("candidate")

    def gap(c):
        r = rows.loc[c]
        return f"{r.gap:+.4f} [{r.gap_low:+.4f}, {r.gap_high:+.4f}]"

    def gain(c):
        return f"gain over a/knn {rows.loc[c, 'gain_low']:+.4f} to {rows.loc[c, 'gain_high']:+.4f}"

    # the union and the stack both gain 0.3 on every row; the stack is the simpler kind (KINDS order)
    assert selected == "stack/linear"
    assert rows["kept"].tolist() == [False, True, False, False, False, False]
    assert rows["chosen"].tolist() == [False, False, False, False, False, True]
    # gains are measured for the combinations only
    assert rows.loc[["a/knn", "a/linear", "b/linear"], ["gain_low", "gain_high"]].isna().all().all()
    assert rows.loc[["union/linear", "stack/linear"], "gain_low"].tolist() == pytest.approx([0.3, 0.3])
    # an average identical to the best single gains exactly 0: no evidence (the bound must be above 0)
    assert (rows.loc["average/linear", "gain_low"], rows.loc["average/linear", "evidence"]) == (0.0, False)
    assert rows["why"].to_dict() == {
        "a/knn": "lowest validation log_loss of the single encoders, but a/linear is within its noise and simpler",
        "a/linear": f"within the bootstrap noise of a/knn (log_loss gap {gap('a/linear')}) and simpler, so preferred; "
                    "replaced by stack/linear",
        "b/linear": f"validation log_loss higher than a/knn's by {gap('b/linear')}",
        "average/linear": f"{gain('average/linear')}: interval reaches 0 or below, not selected (crslib's evidence "
                          "rule)",
        "union/linear": f"{gain('union/linear')}: lower bound > 0, but stack/linear is simpler or lower",
        "stack/linear": f"{gain('stack/linear')}: lower bound > 0, selected",
    }
    # without the combinations the kept single is selected, and its reason ends there
    singles = table[table["kind"] == "single"]
    alone, sel_alone = select_candidate(singles, losses, counts, loss="log_loss", confidence=0.95)
    assert alone == "a/linear" and sel_alone.set_index("candidate").loc["a/linear", "why"] == (
        f"within the bootstrap noise of a/knn (log_loss gap {gap('a/linear')}) and simpler, so preferred")


def test_combination_needs_a_lower_bound_above_zero_not_a_positive_point_gain():
    """The union rule, direct: positive point gain with an interval including 0 is rejected."""
    rng = np.random.default_rng(3)
    groups = np.arange(100)
    single = rng.exponential(0.6, size=100)
    counts = count_matrix(groups, 1000, 0)
    names = ["a/linear", "union/linear"]
    table = _table(names, ["single", "union"], members=["a", "a+b"])
    jitter = rng.normal(0, 0.4, size=100)
    noisy = {"a/linear": single, "union/linear": single - 0.02 + jitter - jitter.mean()}
    selected, sel = select_candidate(table, noisy, counts, loss="log_loss", confidence=0.95)
    union = sel.set_index("candidate").loc["union/linear"]
    assert np.mean(noisy["a/linear"]) > np.mean(noisy["union/linear"])  # a positive point gain
    assert union["gain_low"] < 0 < union["gain_high"] and not union["evidence"]
    assert selected == "a/linear" and "not selected" in union["why"]
    clear = {"a/linear": single, "union/linear": single - 0.1}
    selected, sel = select_candidate(table, clear, counts, loss="log_loss", confidence=0.95)
    clear_union = sel.set_index("candidate").loc["union/linear"]
    assert selected == "union/linear" and clear_union["gain_low"] > 0
    # clearly below the single's loss is not "within the noise" of it
    assert clear_union["gap_high"] < 0 and not clear_union["within_noise"]


def test_greedy_forward_selection_stops_when_nothing_lowers_the_loss():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    base = {"a": y + [0.5, -0.5, 0.5, -0.5], "b": y - [0.5, -0.5, 0.5, -0.5], "c": y + 3.0}
    assert greedy_members(base, y, "regression", "mse") == ["a", "b"]
    assert greedy_members({"c": base["c"], "a": base["a"]}, y, "regression", "mse") == ["a"]



def test_greedy_selection_starts_from_the_lowest_loss_encoder_and_adds_only_a_strict_improvement():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    wiggle = np.array([0.1, -0.1, 0.1, -0.1])
    # "b" has the lowest loss although "a" sorts first; adding "a" would raise the loss, so "b" stays alone
    assert greedy_members({"a": y + 3.0, "b": y + wiggle}, y, "regression", "mse") == ["b"]
    # an identical copy leaves the average's loss equal: not an improvement, so it is not added
    assert greedy_members({"a": y + wiggle, "b": y + wiggle}, y, "regression", "mse") == ["a"]


def test_the_stacks_inputs_are_logits_of_clipped_probabilities():
    from crslib.risk_select import _CLIP, _stack_inputs

    p = np.array([0.0, 1e-9, 0.25, 0.5, 0.8, 1.0 - 1e-9, 1.0])
    edge = np.log(_CLIP / (1.0 - _CLIP))
    expected = [edge, edge, np.log(1 / 3), 0.0, np.log(4.0), -edge, -edge]
    got = _stack_inputs([p, 1.0 - p], "classification")
    assert got.shape == (7, 2)
    np.testing.assert_allclose(got[:, 0], expected, rtol=1e-9, atol=0)
    np.testing.assert_allclose(got[:, 1], -np.array(expected), rtol=1e-9, atol=0)
    # class probabilities: the log of each, a zero clipped to the same floor; one column per class and encoder
    P = np.array([[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]])
    got = _stack_inputs([P, P[:, ::-1]], MULTICLASS)
    assert got.shape == (2, 6)
    np.testing.assert_allclose(got[:, :3], np.log(np.maximum(P, _CLIP)), rtol=1e-12)
    np.testing.assert_allclose(got[:, 3:], np.log(np.maximum(P[:, ::-1], _CLIP)), rtol=1e-12)
    np.testing.assert_array_equal(_stack_inputs([p, 2 * p], "regression"), np.column_stack([p, 2 * p]))


def test_a_classification_stack_is_a_unit_penalty_logistic_regression_on_the_logits():
    from sklearn.linear_model import LogisticRegression

    from crslib.risk_select import _stack_inputs

    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, size=80)
    oof = {"A": np.clip(0.5 + 0.3 * (y - 0.5) + 0.2 * rng.normal(size=80), 0, 1),
           "B": np.clip(0.5 + 0.1 * (y - 0.5) + 0.2 * rng.normal(size=80), 0, 1)}
    stack = fit_stack(oof, y, "classification")
    A = _stack_inputs([oof["A"], oof["B"]], "classification")
    reference = LogisticRegression(C=1.0).fit(A, y)
    np.testing.assert_allclose(stack.coef, np.r_[reference.intercept_, reference.coef_.ravel()], atol=1e-6)
    assert stack.coef.shape == (3,) and stack.coef[1] > stack.coef[2] > 0  # the stronger encoder weighs more
    new = {"A": rng.random(5), "B": rng.random(5)}
    np.testing.assert_allclose(stack(new), reference.predict_proba(_stack_inputs([new["A"], new["B"]],
                                                                                 "classification"))[:, 1], atol=1e-6)
    # three classes: an intercept and a coefficient per (class, input column), class probabilities out
    y3 = np.arange(60) % 3
    P = {name: rng.dirichlet(np.ones(3), size=60) + 0.5 * np.eye(3)[y3] for name in ("A", "B")}
    P = {name: v / v.sum(axis=1, keepdims=True) for name, v in P.items()}
    stack3 = fit_stack(P, y3, MULTICLASS)
    ref3 = LogisticRegression(C=1.0).fit(_stack_inputs([P["A"], P["B"]], MULTICLASS), y3)
    np.testing.assert_allclose(stack3.coef, np.r_[ref3.intercept_, ref3.coef_.ravel()], atol=1e-6)
    assert stack3.coef.shape == (3 + 3 * 6,) and stack3(P).shape == (60, 3)


# --------------------------------------------------------------------------- end to end


def _complementary(seed=0, n_patients=200, task="classification"):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_patients), 2)
    a = rng.normal(size=n_patients)[groups] + 0.2 * rng.normal(size=groups.size)
    b = rng.normal(size=n_patients)[groups] + 0.2 * rng.normal(size=groups.size)
    signal = a + b + 0.3 * rng.normal(size=groups.size)
    y = (signal > 0).astype(int) if task == "classification" else 10 * signal
    return {"A": _latent_embedding(a, rng), "B": _latent_embedding(b, rng)}, y, groups


def test_complementary_encoders_a_combination_wins_with_evidence():
    """(b) Each encoder carries half of the signal: a stack or union is selected, and only with evidence."""
    emb, y, groups = _complementary()
    res = evaluate_partition(emb, y, groups=groups, **FAST)
    sel = res.selection.set_index("candidate")
    assert sel.loc[res.selected, "kind"] in ("stack", "union")
    assert sel.loc[res.selected, "gain_low"] > 0 and sel.loc[res.selected, "evidence"]
    singles = res.candidates[res.candidates["kind"] == "single"]
    assert res.selected_row["test_score"] > singles["test_score"].max() + 0.05
    # every combination was scored against the lowest-loss single candidate on the same resamples
    singles_sel = sel[sel["kind"] == "single"]
    best = singles_sel["val_loss"].idxmin()
    assert best.startswith(("A/", "B/")) and sel.loc[res.selected, "why"].startswith(f"gain over {best} ")


def test_noise_encoders_never_accept_a_combination():
    """(c) Three noise encoders: no combination is selected in any partition."""
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(90), 2)
    y = np.repeat(rng.integers(0, 2, size=90), 2)
    emb = {f"noise{i}": rng.normal(size=(180, 10)) for i in range(3)}
    res = representation_risk(emb, y, groups=groups, n_partitions=4, **FAST)
    for p in res.partitions:
        assert p.selection.set_index("candidate").loc[p.selected, "kind"] == "single"
        assert not p.selection.loc[p.selection["kind"] != "single", "evidence"].any()
    counts = res.selection_counts.set_index("encoder")["count"]
    assert counts[[k for k in ("average", "greedy", "stack", "union") if k in counts.index]].sum() == 0


def test_the_stack_never_sees_validation_rows():
    """(d) Poisoning the validation labels leaves the stack's fit, and so its predictions, unchanged."""
    emb, y, groups = _complementary(task="regression")
    first = evaluate_partition(emb, y, groups=groups, **FAST)
    parts = (first.train_idx, first.val_idx, first.test_idx)
    poisoned = y.copy()
    poisoned[first.val_idx] = np.random.default_rng(5).permutation(y[first.val_idx]) * 3 - 50
    again = evaluate_partition(emb, poisoned, groups=groups, partition=parts, **FAST)
    np.testing.assert_array_equal(again.predictions["stack/linear"], first.predictions["stack/linear"])
    # fit_stack itself: its coefficients come from the out-of-fold predictions it is given, nothing else
    oof = {"A": y[:50] * 0.5, "B": y[:50] * 0.5 + 1.0}
    stack = fit_stack(oof, y[:50], "regression")
    np.testing.assert_allclose(stack.coef, [-1.0, 1.0, 1.0], atol=1e-6)


def test_refit_on_train_and_validation_ignores_the_test_partition():
    """(e) The refitted model: the test partition's labels and features cannot change it."""
    emb, y, groups = _complementary(task="regression")
    first = evaluate_partition(emb, y, groups=groups, **FAST)
    parts = (first.train_idx, first.val_idx, first.test_idx)
    fit_rows = np.sort(np.concatenate(parts[:2]))
    poisoned = y.copy()
    poisoned[first.test_idx] = -y[first.test_idx]
    changed = {k: v.copy() for k, v in emb.items()}
    for v in changed.values():
        v[first.test_idx] = np.random.default_rng(6).normal(size=(first.test_idx.size, v.shape[1]))
    again = evaluate_partition(changed, poisoned, groups=groups, partition=parts, **FAST)
    assert again.selected == first.selected
    np.testing.assert_allclose(again.refit_prediction[fit_rows], first.refit_prediction[fit_rows], atol=1e-9)
    refit = first.refit.set_index("fit")
    assert refit.loc["train", "n_fit"] == first.train_idx.size
    assert refit.loc["train+validation", "n_fit"] == fit_rows.size
    assert refit.loc["train", "test_score"] == first.selected_row["test_score"]
    # the refit differs from the train-only fit (it saw more rows), and the test labels were read only after
    assert not np.allclose(first.refit_prediction, first.predictions[first.selected])


def test_refit_prediction_of_every_kind_uses_only_its_rows():
    emb, y, groups = _complementary(task="regression", n_patients=80)
    res = evaluate_partition(emb, y, groups=groups, **FAST)
    rows = np.sort(np.concatenate([res.train_idx, res.val_idx]))
    recipe_single = {"kind": "single", "members": ["A"], "head": "linear", "param": 10.0}
    pred = refit_prediction(recipe_single, emb, y, rows, "regression", n_components=8, seed=0)
    changed = y.copy()
    changed[res.test_idx] += 100.0
    np.testing.assert_allclose(refit_prediction(recipe_single, emb, changed, rows, "regression", n_components=8,
                                                seed=0), pred)
    union = {"kind": "union", "members": ["A", "B"], "head": "linear", "param": 1.0}
    avg = {"kind": "average", "members": ["A", "B"], "head": "linear", "base_params": {"A": 1.0, "B": 1.0}}
    both = [refit_prediction(r, emb, y, rows, "regression", n_components=8, seed=0) for r in (union, avg)]
    assert np.corrcoef(both[0][rows], y[rows])[0, 1] > np.corrcoef(both[1][rows], y[rows])[0, 1] - 0.01


# --------------------------------------------------------------------------- what is reported


def test_dropped_resamples_and_unfitted_candidates_are_reported():
    rng = np.random.default_rng(7)
    groups = np.repeat(np.arange(40), 2)
    y = np.repeat(np.tile([0, 1], 20), 2)
    emb = {"A": _latent_embedding(np.where(y == 1, 1.0, -1.0), rng, strength=1.0)}
    res = evaluate_partition(emb, y, groups=groups, fractions=(0.6, 0.2, 0.2), **FAST)
    dropped = res.dropped.set_index("part")
    assert dropped.loc["validation", "n_dropped"] == res.candidates["val_undefined"].max() > 0
    assert dropped.loc["validation", "share"] == pytest.approx(dropped.loc["validation", "n_dropped"] / 300)
    reasons = res.not_fitted.set_index("candidate")["reason"]
    assert set(reasons.index) == {"average", "greedy", "stack", "union"}
    assert reasons["stack"] == "a combination needs at least 2 encoders, got 1"
    assert reasons["union"] == "a feature union needs at least 2 encoders, got 1"
    # a training partition with one patient of class 1: no inner folds, so no out-of-fold predictions to stack
    two = {"A": emb["A"], "B": rng.normal(size=emb["A"].shape)}
    patient_class = y[::2]
    train = np.flatnonzero(np.isin(groups, np.r_[np.flatnonzero(patient_class == 0)[:12], 1]))
    rest = np.setdiff1d(np.arange(y.size), train)
    val, test = rest[np.isin(groups[rest] % 4, (0, 1))], rest[np.isin(groups[rest] % 4, (2, 3))]
    few = evaluate_partition(two, y, groups=groups, partition=(train, val, test), **FAST)
    assert few.not_fitted.set_index("candidate").loc["stack", "reason"] == (
        "no inner folds (too few training patients per class): no out-of-fold predictions to stack")


def test_metric_panel_of_both_fits_and_the_loss_option():
    emb, y, groups = _complementary(task="regression", n_patients=80)
    res = evaluate_partition(emb, y, groups=groups, loss="mae", **FAST)
    assert res.loss == "mae"
    assert set(res.metrics["fit"]) == {"train", "train+validation"}
    panel = res.metrics[res.metrics["fit"] == "train"].set_index("metric")
    assert list(panel.index) == ["r2", "mse", "mae", "correlation", "calibration_slope"]
    assert panel.loc["r2", "value"] == pytest.approx(res.selected_row["test_score"])
    mae = np.mean(np.abs(y[res.test_idx] - res.predictions[res.selected][res.test_idx]))
    assert panel.loc["mae", "value"] == pytest.approx(mae)
    assert res.selection["val_loss"].tolist() == pytest.approx(
        [np.mean(np.abs(y[res.val_idx] - res.predictions[c][res.val_idx])) for c in res.selection["candidate"]])
    with pytest.raises(InputError, match="loss 'log_loss' does not score a regression task; choose auto or mse, mae"):
        evaluate_partition(emb, y, groups=groups, loss="log_loss", **FAST)
    with pytest.raises(InputError, match="combinations must be a subset of average, greedy, stack, got"):
        evaluate_partition(emb, y, groups=groups, combinations=["vote"], **FAST)


# --------------------------------------------------------------------------- crs risk


def _half_brightness_folder(root: Path) -> Path:
    """Images whose left and right halves have independent brightness; the target is their sum."""
    from PIL import Image

    rng = np.random.default_rng(8)
    (root / "img").mkdir(parents=True)
    rows = []
    for p in range(60):
        for j in range(2):
            left, right = rng.uniform(30, 220, size=2)
            pixels = np.empty((32, 32))
            pixels[:, :16] = left
            pixels[:, 16:] = right
            pixels = np.clip(pixels + rng.normal(0, 3, size=(32, 32)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"img/p{p:02d}_{j}.png")
            rows.append({"image_id": f"p{p:02d}_{j}", "path": f"img/p{p:02d}_{j}.png", "patient_id": f"P{p:02d}",
                         "brightness": round(float(left + right) / 10.0, 3)})
    pd.DataFrame(rows).to_csv(root / "manifest.csv", index=False)
    return root


def _half_encoder(path: Path, half: str) -> str:
    """An ONNX encoder that sees one half of the image only: four mean-pooled bands of it."""
    import torch

    class Half(torch.nn.Module):
        def forward(self, x):
            part = x[..., :16] if half == "left" else x[..., 16:]
            return torch.stack([part[:, :, 8 * i:8 * (i + 1)].mean(dim=(1, 2, 3)) for i in range(4)], dim=1)

    torch.onnx.export(Half().eval(), (torch.rand(1, 3, 32, 32),), str(path), input_names=["image"],
                      output_names=["f"], dynamic_axes={"image": {0: "b"}}, dynamo=False)
    return f"onnx:{path}?size=32"


def test_crs_risk_selects_a_stack_that_beats_each_encoder_by_a_clear_margin(tmp_path, capsys):
    """Each ONNX encoder sees one half of the image; the target is the sum of both halves' brightness.

    A linear stack of the two encoders' predictions recovers it (R^2 near 1) while each alone explains about
    half. The feature union, linear in the same features, fits it as well and wins by a hair on validation;
    so the first run checks that a combination is selected, and the second, without the union, that
    ``crs risk`` selects the stack and its report shows why.
    """
    from crslib.cli import main

    data = _half_brightness_folder(tmp_path / "data")
    models = ",".join(_half_encoder(tmp_path / f"{h}.onnx", h) for h in ("left", "right"))
    base = ["risk", "--data", str(data), "--models", models, "--task", "brightness", "--partitions", "3",
            "--resamples", "300", "--components", "4"]
    assert main(base + ["--out", str(tmp_path / "with-union")]) == 0
    saved = json.loads((tmp_path / "with-union" / "risk_brightness.json").read_text())
    cands = {c["candidate"]: c for c in saved["primary"]["candidates"]}
    singles = [c["test_score"] for c in cands.values() if c["kind"] == "single"]
    assert cands[saved["primary"]["selected"]]["kind"] in ("stack", "union") and max(singles) < 0.7
    assert cands["stack/linear"]["test_score"] > 0.95 and saved["settings"]["loss"] == "mse"
    capsys.readouterr()

    out = tmp_path / "risk"
    status = main(base + ["--union-size", "0", "--out", str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.startswith("brightness (regression): selected stack/linear")
    saved = json.loads((out / "risk_brightness.json").read_text())
    assert saved["primary"]["selected"] == "stack/linear" and saved["settings"]["union_size"] == 0
    html = (out / "risk.html").read_text()
    assert "stack/linear" in html and "lower bound &gt; 0, selected" in html
    selection = pd.read_csv(out / "selection_table_brightness.csv")
    assert selection.loc[selection["chosen"], "candidate"].tolist() == ["stack/linear"]


def _inner_losses_by_hand(blocks: list[np.ndarray], y, groups, train, random_state: int) -> list[float]:
    """Inner-CV log losses of the linear head over its C grid, with one PCA per inner fold and per block."""
    from crslib.probes import _C_GRID, head_predict, linear_head
    from crslib.risk import reduce_dimensions
    from crslib.risk_multiclass import folds

    seed_cv, seed_model = (int(s) for s in np.random.SeedSequence(random_state).generate_state(4)[:2])
    inner = folds(y[train], groups[train], "classification", 3, seed_cv)
    losses = []
    for C in _C_GRID:
        oof = np.zeros(train.size)
        for fit, val in inner:
            Z = np.hstack([reduce_dimensions(X[train], fit, n_components=8, random_state=seed_model)[0]
                           for X in blocks])
            oof[val] = head_predict(linear_head("classification", C).fit(Z[fit], y[train][fit]), "classification",
                                    Z[val])
        losses.append(float(np.mean(row_losses("classification", y[train], oof, "log_loss"))))
    return losses


def test_inner_folds_see_a_pca_fitted_on_their_own_fitting_rows_only():
    """The inner-CV loss of the linear head equals a brute-force reference with one PCA per inner fold."""
    from crslib.probes import _C_GRID

    rng = np.random.default_rng(9)
    groups = np.repeat(np.arange(60), 2)
    y = np.repeat(rng.integers(0, 2, size=60), 2)
    X = _latent_embedding(np.where(y == 1, 0.6, -0.6), rng, d=20)
    res = evaluate_partition({"A": X}, y, groups=groups, heads=["linear"], union_size=0, combinations=(),
                             random_state=3, **FAST)
    losses = _inner_losses_by_hand([X], y, groups, res.train_idx, 3)
    row = res.candidates.set_index("candidate").loc["A/linear"]
    assert row["inner_loss"] == pytest.approx(min(losses), rel=1e-9)
    assert row["param"] == f"C={_C_GRID[int(np.argmin(losses))]:g}"


def test_the_union_inner_folds_join_each_members_own_fold_pca():
    """The union's penalty is chosen on inner folds whose features are each member's PCA fitted on that fold's
    fitting rows, not on the outer reduction (which has seen the fold's validation rows)."""
    from crslib.probes import _C_GRID

    rng = np.random.default_rng(11)
    groups = np.repeat(np.arange(60), 2)
    y = np.repeat(rng.integers(0, 2, size=60), 2)
    signal = np.where(y == 1, 0.5, -0.5)
    emb = {"A": _latent_embedding(signal, rng, d=20), "B": _latent_embedding(signal, rng, d=20)}
    res = evaluate_partition(emb, y, groups=groups, heads=["linear"], union_size=2, combinations=(),
                             random_state=3, **FAST)
    row = res.candidates.set_index("candidate").loc["union/linear"]
    members = row["members"].split("+")
    losses = _inner_losses_by_hand([emb[m] for m in members], y, groups, res.train_idx, 3)
    assert sorted(members) == ["A", "B"]
    assert row["inner_loss"] == pytest.approx(min(losses), rel=1e-9)
    assert row["param"] == f"C={_C_GRID[int(np.argmin(losses))]:g}"


def test_the_combination_rows_say_what_they_combine_and_why_one_is_missing():
    # regression: averaging the two half-signal encoders halves the error, so forward selection keeps both
    emb, y, groups = _complementary(task="regression")
    rng = np.random.default_rng(9)
    emb["noise"] = rng.normal(size=emb["A"].shape)
    res = evaluate_partition(emb, y, groups=groups, heads=["linear"], **FAST)
    assert res.candidates.columns.tolist() == [
        "candidate", "encoder", "head", "kind", "members", "n_members", "n_features", "param", "inner_loss",
        "val_score", "val_low", "val_high", "val_secondary", "val_undefined", "val_rank", "val_loss",
        "test_score", "test_low", "test_high", "test_secondary", "test_undefined", "test_loss", "selected"]
    rows = res.candidates.set_index("candidate")
    combined = ["average/linear", "greedy/linear", "stack/linear"]
    assert rows.loc[combined, ["kind", "members", "n_members", "n_features", "param"]].to_dict("index") == {
        "average/linear": {"kind": "average", "members": "A+B+noise", "n_members": 3, "n_features": 3,
                           "param": "equal weights"},
        "greedy/linear": {"kind": "greedy", "members": "B+A", "n_members": 2, "n_features": 2,
                          "param": "forward selection"},
        "stack/linear": {"kind": "stack", "members": "A+B+noise", "n_members": 3, "n_features": 3,
                         "param": "linear stack"},
    }
    assert rows.loc[combined, "inner_loss"].isna().all()  # a combination has no inner cross-validation
    assert res.not_fitted.empty
    # one informative encoder among noise: forward selection keeps it alone, so there is no greedy average
    alone = {"A": emb["A"], "n1": rng.normal(size=emb["A"].shape), "n2": rng.normal(size=emb["A"].shape)}
    one = evaluate_partition(alone, y, groups=groups, heads=["linear"], **FAST)
    assert one.not_fitted.to_dict("records") == [
        {"candidate": "greedy", "reason": "forward selection on validation kept one encoder (A): no combination"}]
    assert "greedy/linear" not in set(one.candidates["candidate"])


def test_the_combinations_build_on_the_linear_head_wherever_it_is_listed_and_the_union_on_the_best_two():
    emb, y, groups = _complementary(task="regression")
    emb["noise"] = np.random.default_rng(9).normal(size=emb["A"].shape)
    res = evaluate_partition(emb, y, groups=groups, heads=["knn", "linear"], **FAST)
    rows = res.candidates.set_index("candidate")
    assert rows.loc[rows["kind"] != "single", "head"].eq("linear").all()
    assert {"average/linear", "greedy/linear", "stack/linear", "union/linear"} <= set(rows.index)
    singles = rows[rows["kind"] == "single"]
    assert singles["n_members"].eq(1).all() and singles["n_features"].eq(FAST["n_components"]).all()
    # the union joins the two encoders whose best head has the lowest validation loss, the lowest first
    best = {name: min(rows.loc[f"{name}/{head}", "val_loss"] for head in ("knn", "linear")) for name in emb}
    assert rows.loc["union/linear", "members"] == "+".join(sorted(emb, key=best.get)[:2]) == "B+A"
    # its ridge penalty is chosen by inner cross-validation on the selection loss (here the MSE), like a
    # single encoder's: a positive squared error below the target's variance, not a negated R^2
    inner = rows.loc["union/linear", "inner_loss"]
    assert 0 < inner < np.var(y[res.train_idx]) and rows.loc["union/linear", "param"].startswith("alpha=")


def test_a_stack_of_mlp_heads_is_seeded():
    emb, y, groups = _complementary(n_patients=100)
    runs = [evaluate_partition(emb, y, groups=groups, heads=["mlp"], combinations=("stack",), **FAST)
            for _ in range(2)]
    stacks = [run.candidates.set_index("candidate").loc["stack/mlp", ["val_loss", "test_score"]] for run in runs]
    assert stacks[0].tolist() == stacks[1].tolist()


def test_refit_prediction_repeats_the_locked_recipe_on_its_rows_with_its_width_penalty_and_seed():
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from crslib.risk import reduce_dimensions

    rng = np.random.default_rng(4)
    # 600 features and 550 refit rows: the PCA takes the randomised SVD, so the seed is visible
    X = {"A": rng.normal(size=(700, 600))}
    y = X["A"][:, :5].sum(axis=1) + rng.normal(size=700)
    rows = np.arange(550)
    single = {"kind": "single", "members": ["A"], "head": "linear", "param": 1000.0}
    pred = refit_prediction(single, X, y, rows, "regression", n_components=4, seed=7)
    Z = reduce_dimensions(X["A"], rows, n_components=4, random_state=7)[0]
    ridge = make_pipeline(StandardScaler(), Ridge(alpha=1000.0)).fit(Z[rows], y[rows])
    np.testing.assert_allclose(pred, ridge.predict(Z), rtol=1e-10, atol=1e-10)
    other_seed = refit_prediction(single, X, y, rows, "regression", n_components=4, seed=0)
    assert not np.allclose(pred, other_seed)
    # the union's and the average's locked penalties are used too (the defaults would be alpha=1)
    two = {"A": X["A"][:, :300], "B": X["A"][:, 300:]}
    scores = {m: reduce_dimensions(two[m], rows, n_components=4, random_state=7)[0] for m in two}
    union = {"kind": "union", "members": ["A", "B"], "head": "linear", "param": 1000.0}
    Zu = np.hstack([scores["A"], scores["B"]])
    by_hand = make_pipeline(StandardScaler(), Ridge(alpha=1000.0)).fit(Zu[rows], y[rows]).predict(Zu)
    np.testing.assert_allclose(refit_prediction(union, two, y, rows, "regression", n_components=4, seed=7), by_hand,
                               rtol=1e-10, atol=1e-10)
    base = {m: make_pipeline(StandardScaler(), Ridge(alpha=1000.0)).fit(scores[m][rows], y[rows]).predict(scores[m])
            for m in two}
    average = {"kind": "average", "members": ["A", "B"], "head": "linear", "base_params": {"A": 1000.0, "B": 1000.0}}
    np.testing.assert_allclose(refit_prediction(average, two, y, rows, "regression", n_components=4, seed=7),
                               (base["A"] + base["B"]) / 2, rtol=1e-10, atol=1e-10)
    # a stack applies its locked combiner to the refitted base predictions
    stack = {**average, "kind": "stack", "stack": lambda preds: 2.0 * preds["A"] - preds["B"]}
    np.testing.assert_allclose(refit_prediction(stack, two, y, rows, "regression", n_components=4, seed=7),
                               2.0 * base["A"] - base["B"], rtol=1e-10, atol=1e-10)
    # an MLP head is refitted with the recipe's seed: the same call gives the same prediction
    mlp = {"kind": "single", "members": ["A"], "head": "mlp", "param": None}
    small = {"A": X["A"][:200, :10]}
    first, again = (refit_prediction(mlp, small, y[:200], rows[:150], "regression", n_components=4, seed=3)
                    for _ in range(2))
    np.testing.assert_array_equal(first, again)
    mlp_average = {"kind": "average", "members": ["A", "B"], "head": "mlp", "base_params": {"A": None, "B": None}}
    pair = {"A": small["A"][:, :5], "B": small["A"][:, 5:]}
    first, again = (refit_prediction(mlp_average, pair, y[:200], rows[:150], "regression", n_components=4, seed=3)
                    for _ in range(2))
    np.testing.assert_array_equal(first, again)


def test_the_union_summary_says_why_no_union_was_evaluated():
    emb, y, groups = _complementary(task="regression")
    none = evaluate_partition(emb, y, groups=groups, heads=["linear"], union_size=0, **FAST)
    one = evaluate_partition({"A": emb["A"]}, y, groups=groups, heads=["linear"], **FAST)
    for res, reason in ((none, "union_size is 0"), (one, "only 1 encoder(s): a feature union needs at least 2")):
        summary = dict(res.union)
        assert all(np.isnan(summary.pop(key)) for key in ("gain", "low", "high"))
        assert summary == {"evaluated": False, "members": [], "candidate": None,
                           "best_single": summary["best_single"], "chosen": False, "reason": reason}
        assert summary["best_single"] == res.candidates.set_index("candidate").query("kind == 'single'")[
            "val_loss"].idxmin()
    # one candidate: nothing to compare on the test rows, but the table keeps its columns
    assert one.comparisons.empty and one.comparisons.columns.tolist() == [
        "candidate", "encoder", "head", "difference", "low", "high", "share_positive"]
    # without a union asked for, one encoder is not a reason to report a missing union
    alone = evaluate_partition({"A": emb["A"]}, y, groups=groups, heads=["linear"], union_size=0, **FAST)
    assert "union" not in set(alone.not_fitted["candidate"]) and alone.union["reason"] == "union_size is 0"


def test_the_union_summary_reads_the_unions_row_of_the_selection_table():
    emb, y, groups = _complementary(task="regression")
    res = evaluate_partition(emb, y, groups=groups, heads=["linear"], combinations=(), **FAST)
    sel = res.selection.set_index("candidate")
    row, best = sel.loc["union/linear"], sel.loc[["A/linear", "B/linear"], "val_loss"].idxmin()
    # the gain is the best single encoder's validation loss minus the union's: positive when the union is better
    assert res.union == {"evaluated": True, "members": row["members"].split("+"), "candidate": "union/linear",
                         "best_single": best, "gain": pytest.approx(sel.loc[best, "val_loss"] - row["val_loss"]),
                         "low": row["gain_low"], "high": row["gain_high"], "chosen": res.selected == "union/linear",
                         "reason": row["why"]}
    assert res.union["gain"] > 0 and res.union["low"] < res.union["gain"] < res.union["high"]


def test_the_test_comparisons_pair_every_other_candidate_with_the_selected_one_on_the_same_resamples():
    """Each row: the candidate's test score minus the selected one's, the percentile interval and the share
    of positive differences over the test resamples both share (recomputed here from the predictions)."""
    from crslib import stats
    from crslib.risk_scores import resampled_primary

    rng = np.random.default_rng(24)
    groups = np.repeat(np.arange(150), 2)
    latent = rng.normal(size=150)[groups] + 0.3 * rng.normal(size=groups.size)
    y = (latent > 0).astype(int)
    # two encoders of the same latent (the other one wins about half the resamples) and noise
    emb = {"S1": _latent_embedding(latent, rng), "S2": _latent_embedding(latent, rng),
           "noise": rng.normal(size=(groups.size, 12))}
    options = dict(groups=groups, heads=["linear"], union_size=0, combinations=(), random_state=4, **FAST)
    res = evaluate_partition(emb, y, **options)
    comp, table = res.comparisons, res.candidates.set_index("candidate")
    assert comp.columns.tolist() == ["candidate", "encoder", "head", "difference", "low", "high", "share_positive"]
    others = res.candidates.loc[~res.candidates["selected"], ["candidate", "encoder", "head"]]
    assert len(others) == 2
    pd.testing.assert_frame_equal(comp[["candidate", "encoder", "head"]], others.reset_index(drop=True))

    te, selected = res.test_idx, res.selected
    counts = count_matrix(groups[te], res.n_resamples, int(np.random.SeedSequence(4).generate_state(4)[3]))
    samples = {c: resampled_primary("classification", y[te], res.predictions[c][te], counts) for c in table.index}
    for row in comp.to_dict("records"):
        diffs = samples[row["candidate"]] - samples[selected]
        low, high, _ = stats.percentile_interval(diffs, 0.95)
        assert row["difference"] == pytest.approx(table.loc[row["candidate"], "test_score"]
                                                  - table.loc[selected, "test_score"])
        assert (row["low"], row["high"]) == pytest.approx((low, high))
        assert row["share_positive"] == pytest.approx(np.mean(diffs[np.isfinite(diffs)] > 0))
    rows = comp.set_index("candidate")
    twin = rows.loc[rows["encoder"] != "noise"].iloc[0]
    assert 0.2 < twin["share_positive"] < 0.8 and twin["low"] < 0 < twin["high"]
    assert rows.loc["noise/linear", "share_positive"] == 0 and rows.loc["noise/linear", "difference"] < -0.3

    # a copy of the selected encoder ties it on every resample: a difference of 0, none of them positive
    chosen = selected.split("/")[0]
    tied = evaluate_partition({**emb, "copy": emb[chosen].copy()}, y, **options)
    pair = {f"{chosen}/linear", "copy/linear"}
    assert tied.selected in pair
    same = tied.comparisons.set_index("candidate").loc[(pair - {tied.selected}).pop()]
    assert same[["difference", "low", "high", "share_positive"]].tolist() == [0.0, 0.0, 0.0, 0.0]


def _one_resample_without_the_rare_class():
    """5 positive patients of 40, one bootstrap resample: with seed 0 the test resample draws no positive."""
    groups = np.repeat(np.arange(40), 2)
    y = np.repeat((np.arange(40) < 5).astype(int), 2)
    rng = np.random.default_rng(0)
    emb = {"A": _latent_embedding(np.where(y == 1, 1.0, -1.0), rng), "B": rng.normal(size=(80, 12))}
    return evaluate_partition(emb, y, groups=groups, heads=["linear"], union_size=0, combinations=(),
                              random_state=0, n_components=4, n_resamples=1)


def test_a_test_comparison_without_a_defined_resample_is_nan_and_quiet():
    """One test resample that lacks the rare class: no paired difference is defined, so the interval and
    the share of positive differences are NaN, without a warning (a book page shows none)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = _one_resample_without_the_rare_class()
    assert res.candidates["test_undefined"].tolist() == [1, 1]
    row = res.comparisons.iloc[0]
    assert np.isfinite(row["difference"]) and np.isnan(row[["low", "high", "share_positive"]].astype(float)).all()


def test_a_partitions_result_ranks_names_refits_and_panels_what_it_was_given(caplog):
    """One partition's result: validation ranks 1..n (the best score first, ties in table order), the task's
    metric names, the refit table of the selected candidate, the selection's reasons naming its loss, and
    the metric panel of both fits as metric_panel gives it on the test patients with the run's settings."""
    import logging

    from crslib import stats
    from crslib.risk import METRIC_NAMES
    from crslib.risk_metrics import metric_panel
    from crslib.risk_scores import partition_scores, resampled_primary

    emb, y, groups = _complementary(n_patients=120)
    emb["A_copy"] = emb["A"].copy()  # ties A on validation: ranks stay distinct, in table order
    with caplog.at_level(logging.INFO, logger="crslib.risk"):
        res = evaluate_partition(emb, y, groups=groups, heads=["linear"], union_size=0, combinations=(),
                                 n_components=8, n_resamples=300, confidence=0.9, random_state=6)
    table = res.candidates.set_index("candidate")
    assert res.partition == 0 and (res.metric, res.secondary_metric) == METRIC_NAMES["classification"]
    assert table["val_rank"].dtype.kind == "i" and sorted(table["val_rank"]) == [1, 2, 3]
    assert table.loc["A/linear", "val_score"] == table.loc["A_copy/linear", "val_score"]
    assert table.loc["A/linear", "val_rank"] < table.loc["A_copy/linear", "val_rank"]
    assert table["val_rank"].idxmin() == table["val_score"].idxmax()
    best_single = res.selection.set_index("candidate")["why"].str.startswith("lowest validation log_loss")
    assert best_single.sum() == 1
    assert res.refit["candidate"].tolist() == [res.selected] * 2
    assert res.refit["fit"].tolist() == ["train", "train+validation"]

    te, pred = res.test_idx, res.predictions[res.selected]
    seed_test = int(np.random.SeedSequence(6).generate_state(4)[3])
    expected = pd.concat([metric_panel("classification", y[te], p[te], groups[te], n_resamples=300, confidence=0.9,
                                       random_state=seed_test).assign(fit=fit)
                          for fit, p in (("train", pred), ("train+validation", res.refit_prediction))],
                         ignore_index=True)
    pd.testing.assert_frame_equal(res.metrics, expected[["fit"] + list(expected.columns[:-1])])
    assert not any("left out" in r.getMessage() for r in caplog.records)  # every resample held both classes
    assert res.dropped["metric"].tolist() == ["auroc", "auroc"] and res.dropped["n_dropped"].eq(0).all()
    assert res.not_fitted.empty and res.not_fitted.columns.tolist() == ["candidate", "reason"]
    assert (res.n_resamples, res.confidence, res.random_state, res.loss) == (300, 0.9, 6, "log_loss")

    # the refit table: the selected row as fitted on the training rows, then its refit scored the same way
    counts = count_matrix(groups[te], 300, seed_test)
    refit = res.refit.set_index("fit")
    columns = ["test_score", "test_low", "test_high", "test_secondary", "test_loss"]
    assert refit.loc["train", columns].tolist() == table.loc[res.selected, columns].tolist()
    low, high, _ = stats.percentile_interval(
        resampled_primary("classification", y[te], res.refit_prediction[te], counts), 0.9)
    score, secondary = partition_scores("classification", y[te], res.refit_prediction[te])
    loss = np.mean(row_losses("classification", y[te], res.refit_prediction[te], "log_loss"))
    assert refit.loc["train+validation", columns].tolist() == pytest.approx([score, low, high, secondary, loss])
    assert refit["n_fit"].tolist() == [res.train_idx.size, res.train_idx.size + res.val_idx.size]

    # a regression partition names its own metrics and loss
    emb, target, groups = _complementary(n_patients=120, task="regression")
    reg = evaluate_partition(emb, target, groups=groups, heads=["linear"], union_size=0, combinations=(), **FAST)
    assert (reg.task, reg.metric, reg.secondary_metric, reg.loss) == ("regression", *METRIC_NAMES["regression"],
                                                                       "mse")


def test_resamples_left_out_of_an_interval_are_logged_by_part_and_metric(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="crslib.risk"):
        res = _one_resample_without_the_rare_class()
    assert res.dropped.set_index("part")["n_dropped"].to_dict() == {"validation": 0, "test": 1}
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == [
        "test: 1 of 1 bootstrap resamples lacked a class and were left out of the auroc intervals"]

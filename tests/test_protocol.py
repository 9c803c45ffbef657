"""crslib.protocol (grid, effects, splits, probe) and zoo.finetune_classifier."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from crslib import metrics, protocol, splits
from crslib.errors import CRSError, DataError, InputError, ModelError
from assertions import error_message


def _predictions(rng, *, n_patients=300, backbones=("a", "b"), policy_gain=1.5, seeds=(0,)):
    """Synthetic predictions where fine-tuning adds `policy_gain` logit units of signal
    and the backbones differ by little."""
    patients = np.arange(n_patients)
    y_pat = rng.integers(0, 2, n_patients)
    split_pat = rng.choice(["train", "val", "test"], size=n_patients, p=[0.6, 0.2, 0.2])
    rows = []
    noise = rng.normal(size=n_patients)
    for b_i, backbone in enumerate(backbones):
        for policy in protocol.POLICIES:
            for seed in seeds:
                strength = 1.0 + 0.05 * b_i + (policy_gain if policy == "finetuned" else 0.0)
                extra = np.random.default_rng(seed + 10 * b_i).normal(scale=0.1, size=n_patients)
                logit = strength * (y_pat - 0.5) * 2 + noise + extra - 1.0  # shifted: 0.5 is a poor threshold
                rows.append(pd.DataFrame({
                    "backbone": backbone, "policy": policy, "seed": seed, "image_id": patients.astype(str),
                    "patient_id": patients, "split": split_pat, "y_true": y_pat,
                    "prob": 1 / (1 + np.exp(-logit)),
                }))
    return pd.concat(rows, ignore_index=True)


def test_grid_values_equal_metrics_at_validation_fitted_thresholds():
    preds = _predictions(np.random.default_rng(0))
    grid = protocol.protocol_grid(preds, n_resamples=100)
    assert set(grid["rule"]) == set(metrics.THRESHOLD_RULES)
    assert set(grid["metric"]) == set(metrics.METRICS)
    assert len(grid) == 2 * 2 * 1 * len(metrics.THRESHOLD_RULES) * len(metrics.METRICS)
    model = preds[(preds.backbone == "a") & (preds.policy == "frozen")]
    val, test = model[model.split == "val"], model[model.split == "test"]
    t = metrics.fit_threshold(val.y_true, val.prob, rule="youden")
    cell = grid[(grid.backbone == "a") & (grid.policy == "frozen") & (grid.rule == "youden")]
    ba = cell.set_index("metric").loc["balanced_accuracy"]
    assert ba["threshold"] == pytest.approx(t)
    assert ba["value"] == pytest.approx(metrics.metric_score(test.y_true, test.prob, metric="balanced_accuracy", threshold=t))
    assert ba["fit_value"] == pytest.approx(metrics.metric_score(val.y_true, val.prob, metric="balanced_accuracy", threshold=t))
    assert (grid["low"] <= grid["value"] + 1e-12).all() and (grid["value"] <= grid["high"] + 1e-12).all()
    # AUROC does not depend on the rule
    auc = grid[(grid.backbone == "a") & (grid.policy == "frozen") & (grid.metric == "auroc")]["value"]
    assert auc.nunique() == 1


def test_thresholds_never_read_test_labels():
    preds = _predictions(np.random.default_rng(1))
    poisoned = preds.copy()
    test = poisoned["split"] == "test"
    poisoned.loc[test, "y_true"] = 1 - poisoned.loc[test, "y_true"]
    a = protocol.protocol_grid(preds, n_resamples=20)
    b = protocol.protocol_grid(poisoned, n_resamples=20)
    assert np.allclose(a["threshold"], b["threshold"])
    assert not np.allclose(a["value"], b["value"])


def test_effect_summary_finds_the_injected_policy_effect_and_not_a_backbone_one():
    preds = _predictions(np.random.default_rng(2), backbones=("a", "b", "c"), policy_gain=2.0)
    effects = protocol.effect_summary(protocol.protocol_grid(preds, n_resamples=20)).set_index("factor")
    assert effects.loc["policy", "metric"] == "auroc"
    assert effects.loc["rule", "metric"] == "balanced_accuracy"
    assert effects.loc["policy", "mean_abs_change"] > 0.05
    assert effects.loc["backbone", "mean_abs_change"] < 0.03
    assert effects.loc["policy", "mean_abs_change"] > 4 * effects.loc["backbone", "mean_abs_change"]
    # the shifted logits make 0.5 a poor threshold: the rule matters for balanced accuracy
    assert effects.loc["rule", "mean_abs_change"] > 0.02
    assert effects.loc["policy", "paper_value"] == pytest.approx(0.044)
    assert effects.loc["rule", "paper_value"] == pytest.approx(0.090)
    # one seed only: no pair, no invented effect
    assert effects.loc["seed", "n_pairs"] == 0 and np.isnan(effects.loc["seed", "mean_abs_change"])


def test_effect_summary_known_answer():
    grid = pd.DataFrame({
        "backbone": ["a", "a", "b", "b", "c"], "policy": ["frozen", "finetuned", "frozen", "finetuned", "frozen"],
        "seed": 0, "rule": "youden", "metric": "auroc", "value": [0.80, 0.90, 0.70, 0.76, 0.60],
    })
    out = protocol.effect_summary(grid, factors=["policy", "backbone"]).set_index("factor")
    # c has no fine-tuned cell and contributes nothing to the policy effect
    assert out.loc["policy", "mean_abs_change"] == pytest.approx((0.10 + 0.06) / 2)
    assert out.loc["policy", "n_pairs"] == 2
    # frozen: |0.8-0.7|, |0.8-0.6|, |0.7-0.6|; finetuned: |0.9-0.76|
    assert out.loc["backbone", "mean_abs_change"] == pytest.approx((0.1 + 0.2 + 0.1 + 0.14) / 4)
    assert out.loc["backbone", "mean_range"] == pytest.approx((0.2 + 0.14) / 2)
    with pytest.raises(InputError, match="unknown factor"):
        protocol.effect_summary(grid, factors=["colour"])


def test_grid_bad_input_is_a_clear_error():
    preds = _predictions(np.random.default_rng(3))
    with pytest.raises(InputError, match="lack column"):
        protocol.protocol_grid(preds.drop(columns="patient_id"))
    bad = preds.copy()
    bad.loc[0, "prob"] = 1.2
    with pytest.raises(InputError, match=r"\[0, 1\]|outside"):
        protocol.protocol_grid(bad)
    bad = preds.copy()
    bad.loc[3, "y_true"] = np.nan
    with pytest.raises(InputError, match="missing"):
        protocol.protocol_grid(bad)
    one_class = preds.copy()
    one_class.loc[one_class.split == "val", "y_true"] = 1
    with pytest.raises(InputError, match="single class|one class|both classes"):
        protocol.protocol_grid(one_class)
    with pytest.raises(InputError, match="unknown threshold rule"):
        protocol.protocol_grid(preds, rules=["magic"])
    with pytest.raises(InputError, match="unknown training policy"):
        protocol.protocol_grid(preds.assign(policy="half-frozen"))
    assert issubclass(InputError, CRSError)


def test_protocol_splits_keeps_patients_together_and_says_where_validation_came_from():
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(200), 2)
    labels = np.repeat(rng.integers(0, 2, 200), 2)
    split = np.repeat(rng.choice(["train", "test"], 200, p=[0.8, 0.2]), 2).astype(object)
    split[np.flatnonzero(split == "train")[:6]] = "val"  # a tiny official val, like Kermany's
    assignment, how = protocol.protocol_splits(split, labels, groups=groups)
    assert "carved" in how and "6 images" in how
    assert (assignment[split == "test"] == "test").all()
    assert not (assignment[split != "test"] == "test").any()
    for g in np.unique(groups):
        assert len(set(assignment[groups == g])) == 1
    assert 0.10 < (assignment == "val").sum() / (split != "test").sum() < 0.20
    # a big official val is used as it is
    split2 = np.repeat(rng.choice(["train", "val", "test"], 200, p=[0.6, 0.2, 0.2]), 2)
    assignment2, how2 = protocol.protocol_splits(split2, labels, groups=groups)
    assert "official validation" in how2
    assert np.array_equal(assignment2, split2)
    with pytest.raises(DataError, match="no rows with split == 'test'"):
        protocol.protocol_splits(np.where(split2 == "test", "train", split2), labels, groups=groups)
    with pytest.raises(DataError, match="single class"):
        protocol.protocol_splits(split2, np.where(split2 == "test", 1, labels), groups=groups)


def test_linear_probe_fits_on_training_rows_only():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 300)
    X = rng.normal(size=(300, 5)) + 1.5 * y[:, None] * np.array([1, 0, 0, 0, 0])
    split = np.array(["train"] * 200 + ["test"] * 100)
    prob, C = protocol.linear_probe(X, y, split, groups=np.arange(300))
    assert C in (0.01, 0.1, 1.0, 10.0)
    assert metrics.metric_score(y[200:], prob[200:], metric="auroc") > 0.8
    X2, y2 = X.copy(), y.copy()
    X2[200:] = rng.normal(size=(100, 5)) * 100  # change every test row
    y2[200:] = 1 - y2[200:]
    prob2, C2 = protocol.linear_probe(X2, y2, split, groups=np.arange(300))
    assert C2 == C and np.allclose(prob[:200], prob2[:200])
    with pytest.raises(InputError, match="NaN"):
        protocol.linear_probe(np.where(np.eye(300, 5) > 0, np.nan, X), y, split)
    with pytest.raises(InputError, match="single class|one class|both classes"):
        protocol.linear_probe(X, np.zeros(300), split)


def test_repeated_partitions_give_a_spread_on_weak_signal():
    rng = np.random.default_rng(6)
    y = rng.integers(0, 2, 400)
    X = rng.normal(size=(400, 3)) + 0.5 * y[:, None]
    out = protocol.repeated_partitions(X, y, groups=np.arange(400), n_partitions=4)
    assert list(out["partition"]) == [0, 1, 2, 3]
    assert out["auroc"].between(0.55, 0.9).all()
    assert out["auroc"].std() > 0.005  # different test patients, different numbers
    with pytest.raises(InputError):
        protocol.repeated_partitions(X, y, groups=np.arange(400), n_partitions=1)


# --------------------------------------------------------------------------- fine-tuning


@pytest.fixture(scope="module")
def tiny_phantom(tmp_path_factory):
    from crslib.data.phantom import generate_phantom

    return generate_phantom(tmp_path_factory.mktemp("ph"), n_patients=60, image_size=32, random_state=3)


@pytest.mark.training  # trains three networks from scratch (make test fine-tunes in the Kermany-layout book)
def test_finetune_is_deterministic_cached_and_learns(tiny_phantom, tmp_path):
    from crslib.models import finetune_classifier

    m = tiny_phantom
    a = finetune_classifier(m, "timm:resnet10t?size=32&seed=0", epochs=2, random_state=0, batch_size=32, cache_root=tmp_path)
    assert not a.attrs["cache_hit"]
    assert list(a["image_id"]) == list(m["image_id"].astype(str))
    assert a["prob"].between(0, 1).all() and a["prob"].std() > 0
    b = finetune_classifier(m, "timm:resnet10t?size=32&seed=0", epochs=2, random_state=0, batch_size=32, cache_root=tmp_path)
    assert b.attrs["cache_hit"] and np.array_equal(a["prob"].to_numpy(), b["prob"].to_numpy())
    c = finetune_classifier(m, "timm:resnet10t?size=32&seed=0", epochs=2, random_state=0, batch_size=32,
                            cache_root=tmp_path / "other")
    assert np.array_equal(a["prob"].to_numpy(), c["prob"].to_numpy()), "same seed must give the same model"
    d = finetune_classifier(m, "timm:resnet10t?size=32&seed=0", epochs=2, random_state=1, batch_size=32, cache_root=tmp_path)
    assert not np.array_equal(a["prob"].to_numpy(), d["prob"].to_numpy())
    # the whole network trains: the training rows are fitted better than by chance
    train = a[a.split == "train"]
    assert metrics.metric_score(train.y_true, train.prob, metric="auroc") > 0.7


def test_finetune_refuses_onnx_and_bad_labels(tiny_phantom, tmp_path):
    from crslib.models import finetune_classifier, open_nsfw_onnx_path

    onnx = open_nsfw_onnx_path(size=32, cache_root=tmp_path)
    with pytest.raises(ModelError, match="cannot fine-tune"):
        finetune_classifier(tiny_phantom, f"onnx:{onnx}#/ReduceMean_output_0?size=32", epochs=1, cache_root=tmp_path)
    with pytest.raises(DataError, match="no 'nolabel' column"):
        finetune_classifier(tiny_phantom, "timm:resnet18?size=32", label_column="nolabel", cache_root=tmp_path)
    one = tiny_phantom.assign(label=1)
    with pytest.raises(DataError, match="both classes"):
        finetune_classifier(one, "timm:resnet18?size=32", epochs=1, cache_root=tmp_path)


def test_validation_to_test_fits_on_validation_and_reports_the_gap():
    preds = _predictions(np.random.default_rng(7))
    table = protocol.validation_to_test(preds, what="threshold")
    assert len(table) == 4 * len(metrics.THRESHOLD_RULES) * 4  # models x rules x metrics
    row = table[(table.backbone == "a") & (table.policy == "frozen") & (table.rule == "youden")
                & (table.metric == "balanced_accuracy")].iloc[0]
    model = preds[(preds.backbone == "a") & (preds.policy == "frozen")]
    val, test = model[model.split == "val"], model[model.split == "test"]
    t = metrics.fit_threshold(val.y_true, val.prob, rule="youden")
    assert row["threshold"] == pytest.approx(t)
    assert row["eval_value"] == pytest.approx(metrics.metric_score(test.y_true, test.prob, metric="balanced_accuracy", threshold=t))
    assert row["gap"] == pytest.approx(row["eval_value"] - row["fit_value"])
    calibration = protocol.validation_to_test(preds, what="calibration")
    assert set(calibration["method"]) == {"none", "temperature", "platt"} and "params" not in calibration
    # probabilities shifted by -1 logit: validation-fitted scaling must help on test
    fitted = calibration[calibration.method == "platt"]
    assert (fitted["ece_uniform_after"] < fitted["ece_uniform_before"]).all()
    with pytest.raises(InputError, match="threshold' or 'calibration"):
        protocol.validation_to_test(preds, what="both")


# --------------------------------------------------------------------------- known answers and messages


def _three_models(seed: int = 0, n: int = 120) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frames = []
    for backbone, policy in (("a", "frozen"), ("a", "finetuned"), ("b", "frozen")):
        y = np.tile([0, 1], n // 2)
        prob = np.clip(0.5 + 0.25 * (y - 0.5) + rng.normal(0, 0.2, n), 0, 1)
        frames.append(pd.DataFrame({
            "backbone": backbone, "policy": policy, "seed": 0, "image_id": range(n),
            "patient_id": np.arange(n) // 2, "split": ["train"] * 40 + ["val"] * 40 + ["test"] * 40,
            "y_true": y, "prob": prob}))
    return pd.concat(frames, ignore_index=True)


def test_protocol_grid_cells_equal_a_direct_computation():
    from crslib.metrics import fit_threshold, metric_score
    from crslib.stats import resample_indices

    preds = _three_models()
    grid = protocol.protocol_grid(preds, rules=["youden", "prevalence"], metrics=["auroc", "sensitivity"],
                                  n_resamples=40, confidence=0.9, random_state=2)
    assert len(grid) == 3 * 2 * 2
    for row in grid.itertuples():
        model = preds[(preds["backbone"] == row.backbone) & (preds["policy"] == row.policy)]
        val, test, train = (model[model["split"] == s] for s in ("val", "test", "train"))
        t = fit_threshold(val["y_true"], val["prob"], rule=row.rule, prevalence=train["y_true"].mean())
        assert row.threshold == t and row.n_test == 40
        assert row.value == pytest.approx(metric_score(test["y_true"], test["prob"], metric=row.metric, threshold=t))
        assert row.fit_value == pytest.approx(metric_score(val["y_true"], val["prob"], metric=row.metric, threshold=t))
        y, p = test["y_true"].to_numpy(), test["prob"].to_numpy()
        samples = [metric_score(y[i], p[i], metric=row.metric, threshold=t)
                   for i in resample_indices(40, n_resamples=40, groups=test["patient_id"].to_numpy(), random_state=2)]
        assert (row.low, row.high) == pytest.approx(tuple(np.nanpercentile(samples, [5, 95])))
    default = protocol.protocol_grid(preds, rules=["youden"], metrics=["f1"])
    explicit = protocol.protocol_grid(preds, rules=["youden"], metrics=["f1"], fit_on="val", evaluate_on="test",
                                      n_resamples=1000, confidence=0.95, random_state=0)
    pd.testing.assert_frame_equal(default, explicit)


def _prevalence_shift(seed: int = 3) -> pd.DataFrame:
    """One model whose training rows are 20 % positive while validation and test are 50 %."""
    rng = np.random.default_rng(seed)
    y = np.r_[(np.arange(200) < 40).astype(int), np.tile([0, 1], 50), np.tile([0, 1], 50)]
    prob = np.clip(0.35 + 0.3 * y + rng.normal(0, 0.15, y.size), 0, 1)
    return pd.DataFrame({"backbone": "a", "policy": "frozen", "seed": 0, "image_id": range(y.size),
                         "patient_id": range(y.size), "split": ["train"] * 200 + ["val"] * 100 + ["test"] * 100,
                         "y_true": y, "prob": prob})


def test_prevalence_rule_is_the_training_prevalence_in_the_grid_and_the_transfer_table():
    preds = _prevalence_shift()
    val, test = preds[preds.split == "val"], preds[preds.split == "test"]
    expected = metrics.fit_threshold(val.y_true, val.prob, rule="prevalence", prevalence=0.2)
    assert expected != metrics.fit_threshold(val.y_true, val.prob, rule="prevalence")  # 0.5 would differ
    grid = protocol.protocol_grid(preds, metrics=["balanced_accuracy"], n_resamples=5)
    table = protocol.validation_to_test(preds, what="threshold")
    g = grid.set_index("rule").loc["prevalence"]
    t = table[(table.rule == "prevalence") & (table.metric == "balanced_accuracy")].iloc[0]
    assert g["threshold"] == t["threshold"] == expected
    assert g["value"] == t["eval_value"] == metrics.metric_score(test.y_true, test.prob, metric="balanced_accuracy",
                                                                 threshold=expected)
    # the tables say which prevalence the rule used, and only for that rule
    assert g["prevalence"] == t["prevalence"] == 0.2
    assert grid[grid.rule != "prevalence"]["prevalence"].isna().all()
    assert table[table.rule != "prevalence"]["prevalence"].isna().all()
    # without training rows both fall back to the fitting rows' prevalence
    no_train = preds[preds.split != "train"]
    g0 = protocol.protocol_grid(no_train, rules=["prevalence"], metrics=["f1"], n_resamples=5).iloc[0]
    t0 = protocol.validation_to_test(no_train).set_index("rule").loc["prevalence"].iloc[0]
    assert g0["threshold"] == t0["threshold"] and g0["prevalence"] == t0["prevalence"] == 0.5


def test_protocol_grid_and_summary_messages():
    preds = _three_models()
    assert error_message(protocol.protocol_grid, preds.drop(columns="prob")) == (
        f"predictions lack column(s) prob; need {', '.join(protocol.PREDICTION_COLUMNS)}")
    assert error_message(protocol.protocol_grid, preds.to_dict()) == (
        f"predictions must be a DataFrame with columns {', '.join(protocol.PREDICTION_COLUMNS)}")
    bad = preds.assign(policy="distilled")
    assert error_message(protocol.protocol_grid, bad) == (
        f"unknown training policy ['distilled']; use {', '.join(protocol.POLICIES)}")
    assert error_message(protocol.protocol_grid, preds, rules=["otsu"]).startswith("unknown threshold rule(s) ['otsu']; use")
    assert error_message(protocol.protocol_grid, preds, metrics=["kappa"]).startswith("unknown metric(s) ['kappa']; use")
    grid = protocol.protocol_grid(preds, rules=["youden"], metrics=["auroc"], n_resamples=20)
    assert error_message(protocol.effect_summary, grid.drop(columns="value")) == (
        "grid lacks column(s) value; pass the output of protocol_grid")
    assert error_message(protocol.effect_summary, grid, factors=["dataset"]) == (
        "unknown factor 'dataset'; use backbone, policy, seed, rule")
    assert error_message(protocol.headline_table, grid, rule="f1_max", metrics=["auroc"]) == (
        "the grid has no cells for rule 'f1_max' and metrics ['auroc']")


def test_effect_summary_drops_nan_cells_and_reports_levels():
    grid = pd.DataFrame({
        "backbone": ["a", "a", "b", "b", "c", "c"], "policy": ["frozen", "finetuned"] * 3, "seed": 0,
        "rule": "youden", "metric": "auroc", "value": [0.80, 0.90, 0.70, 0.75, 0.60, np.nan]})
    out = protocol.effect_summary(grid, factors=["policy", "backbone"]).set_index("factor")
    assert out.loc["policy", "mean_abs_change"] == pytest.approx(0.075)  # |0.8-0.9| and |0.7-0.75|; c has one
    assert out.loc["policy", "max_abs_change"] == pytest.approx(0.1) and out.loc["policy", "n_pairs"] == 2
    # backbone within frozen: 0.8, 0.7, 0.6 -> pairs 0.1, 0.2, 0.1; within finetuned: 0.9, 0.75 -> 0.15
    assert out.loc["backbone", "mean_abs_change"] == pytest.approx((0.1 + 0.2 + 0.1 + 0.15) / 4)
    assert out.loc["backbone", "mean_range"] == pytest.approx((0.2 + 0.15) / 2)
    assert out.loc["backbone", "n_levels"] == 3 and out.loc["policy", "metric"] == "auroc"


def test_linear_probe_equals_its_cross_validation_written_out(monkeypatch):
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedGroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(41)
    n = 160
    y = np.tile([0, 1], n // 2)
    X = rng.normal(size=(n, 6)) + 0.6 * y[:, None] * np.r_[1.0, 0.5, 0, 0, 0, 0]
    X[:, 2] *= 50  # scales differ: the probe standardises
    split = np.array(["train"] * 120 + ["test"] * 40)
    groups = np.arange(n) // 4
    seen = []

    class Recording(StratifiedGroupKFold):
        def split(self, X, y=None, groups=None):
            seen.append((self.n_splits, np.asarray(groups).copy()))
            return super().split(X, y, groups)

    monkeypatch.setattr("sklearn.model_selection.StratifiedGroupKFold", Recording)
    prob, C = protocol.linear_probe(X, y, split, groups=groups, Cs=(0.001, 0.1, 10.0))
    assert all(k == 5 for k, _ in seen) and all(np.array_equal(g, groups[:120]) for _, g in seen)
    tr = split == "train"
    scores = []
    for c in (0.001, 0.1, 10.0):
        oof = np.zeros(120)
        cv = StratifiedGroupKFold(n_splits=5, shuffle=True, random_state=0)
        for fit, val in cv.split(X[tr], y[tr], groups[tr]):
            model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))
            oof[val] = model.fit(X[tr][fit], y[tr][fit]).predict_proba(X[tr][val])[:, 1]
        scores.append(metrics.metric_score(y[tr], oof, metric="auroc"))
    best = (0.001, 0.1, 10.0)[int(np.nanargmax(scores))]
    assert C == best
    model = make_pipeline(StandardScaler(), LogisticRegression(C=best, max_iter=5000)).fit(X[tr], y[tr])
    assert prob == pytest.approx(model.predict_proba(X)[:, 1])
    # defaults: rows as groups, Cs (0.01, 0.1, 1, 10), 5 folds, seed 0; a single C skips the search
    seen.clear()
    default_prob, default_C = protocol.linear_probe(X, y, split)
    explicit_prob, explicit_C = protocol.linear_probe(X, y, split, groups=np.arange(n), Cs=(0.01, 0.1, 1.0, 10.0),
                                                      n_splits=5, random_state=0)
    assert default_C == explicit_C and np.array_equal(default_prob, explicit_prob)
    assert np.array_equal(seen[0][1], np.arange(120)) and seen[0][0] == 5
    seen.clear()
    prob1, C1 = protocol.linear_probe(X, y, split, Cs=(0.5,))
    assert C1 == 0.5 and seen == []
    # fewer positives than folds: the folds shrink to the smallest class
    few = y.copy()
    few[:120][few[:120] == 1] = 0
    few[[1, 3, 5]] = 1
    seen.clear()
    protocol.linear_probe(X, few, split, Cs=(0.1, 1.0))
    assert seen[0][0] == 3


def test_linear_probe_messages():
    X, y = np.ones((4, 2)), np.array([0, 1, 0, 1])
    split = ["train"] * 4
    assert error_message(protocol.linear_probe, X[:3], y, split) == (
        "X must be (n_samples, n_features) with one row per split entry, got (3, 2) and 4")
    assert error_message(protocol.linear_probe, np.ones(4), y, split) == (
        "X must be (n_samples, n_features) with one row per split entry, got (4,) and 4")
    bad = X.copy()
    bad[1, 1] = np.nan
    assert error_message(protocol.linear_probe, bad, y, split) == (
        "X holds 1 NaN or infinite values; the embeddings are broken")
    # an embedding table with a missing value given as None (object rows) reads it as NaN
    assert error_message(protocol.linear_probe, [[1.0, 1.0], [1.0, None], [1.0, 1.0], [1.0, 1.0]], y, split) == (
        "X holds 1 NaN or infinite values; the embeddings are broken")
    assert error_message(protocol.linear_probe, X, [1, 1, 1, 1], split) == (
        "y_true holds only the positive (1) class (4 cases); a split needs both classes to compute these metrics, "
        "so use a larger or stratified split")


def test_protocol_splits_provenance_and_boundaries():
    n = 200
    labels = np.tile([0, 1], n // 2)
    groups = np.arange(n) // 2
    split = np.array(["train"] * 100 + ["val"] * 50 + ["test"] * 50)
    assignment, how = protocol.protocol_splits(split, labels, groups=groups)  # 50 validation images: used as they are
    assert (assignment == split).all()
    assert how == ("official test split (50 images); official validation split (50 images); "
                   "training pool (100 images)")
    fewer = split.copy()
    fewer[100] = "train"  # 49 validation images: too few, a validation part is carved from the pool
    assignment, how = protocol.protocol_splits(fewer, labels, groups=groups)
    n_val = int((assignment == "val").sum())
    assert how == (f"official test split (50 images); validation carved from the training pool by patient ({n_val} "
                   f"images, 15% of the pool's patients, seed 0) because the official validation split has 49 "
                   f"images; training rows: the rest of the pool ({int((assignment == 'train').sum())} images)")
    # patients are never split, each class reaches the carved validation part, and the seed matters
    assert not set(groups[assignment == "val"]) & set(groups[assignment == "train"])
    assert set(labels[assignment == "val"]) == {0, 1}
    other, _ = protocol.protocol_splits(fewer, labels, groups=groups, random_state=1)
    assert not np.array_equal(other, assignment)
    big, how_big = protocol.protocol_splits(fewer, labels, groups=groups, validation_fraction=0.5)
    assert (big == "val").sum() > 2 * n_val and "50% of the pool's patients" in how_big
    assert error_message(protocol.protocol_splits, split, labels, groups=groups, validation_fraction=0.0) == (
        "validation_fraction must be in (0, 1), got 0.0")
    assert error_message(protocol.protocol_splits, split, labels, groups=groups, validation_fraction=1.0) == (
        "validation_fraction must be in (0, 1), got 1.0")
    assert error_message(protocol.protocol_splits, split[:10], labels, groups=groups) == (
        "split, groups and labels must have one entry per row, got 10, 200, 200")
    assert error_message(protocol.protocol_splits, np.where(split == "test", "train", split), labels, groups=groups,
                         error=DataError) == (
        "no rows with split == 'test': the protocol evaluates on the official test split; add a split column "
        "with train/val/test values (patients must not cross splits)")
    one_class = labels.copy()
    one_class[split == "test"] = 1
    assert error_message(protocol.protocol_splits, split, one_class, groups=groups, error=DataError) == (
        "the test partition holds a single class ([1]); the protocol needs both classes in train, validation "
        "and test")
    custom = np.where(split == "train", "pool", np.where(split == "val", "dev", "holdout"))
    renamed, _ = protocol.protocol_splits(custom, labels, groups=groups, train="pool", validation="dev", test="holdout")
    assert (renamed == split).all()


def test_headline_table_means_over_seeds():
    rows = []
    for backbone, policy, seed, auroc, f1 in [("b", "frozen", 0, 0.80, 0.6), ("b", "frozen", 1, 0.90, 0.7),
                                              ("a", "finetuned", 0, 0.70, 0.5), ("a", "finetuned", 1, 0.72, 0.55)]:
        for metric, value in (("auroc", auroc), ("f1", f1)):
            rows.append({"backbone": backbone, "policy": policy, "seed": seed, "rule": "youden", "metric": metric,
                         "value": value, "low": value - 0.1, "high": value + 0.05})
            rows.append({"backbone": backbone, "policy": policy, "seed": seed, "rule": "f1_max", "metric": metric,
                         "value": 0.0, "low": 0.0, "high": 0.0})
    table = protocol.headline_table(pd.DataFrame(rows), metrics=["f1", "auroc", "sensitivity"])
    assert table.index.names == ["backbone", "policy"]
    assert table.index.tolist() == [("a", "finetuned"), ("b", "frozen")]
    assert list(table.columns) == ["f1", "f1_low", "f1_high", "auroc", "auroc_low", "auroc_high"]
    assert table.loc[("b", "frozen")].tolist() == pytest.approx([0.65, 0.55, 0.70, 0.85, 0.75, 0.90])
    assert table.loc[("a", "finetuned"), "auroc"] == pytest.approx(0.71)
    assert protocol.headline_table(pd.DataFrame(rows), rule="f1_max", metrics=["auroc"])["auroc"].tolist() == [0, 0]


def test_effect_summary_defaults_and_paper_columns():
    grid = pd.DataFrame({
        "backbone": "a", "policy": "frozen", "seed": 0, "rule": ["youden", "f1_max", "youden", "f1_max"],
        "metric": ["balanced_accuracy", "balanced_accuracy", "auroc", "auroc"], "value": [0.70, 0.80, 0.9, 0.9]})
    out = protocol.effect_summary(grid).set_index("factor")
    assert out.index.tolist() == ["backbone", "policy", "rule", "seed"]
    assert out.loc["rule", "metric"] == "balanced_accuracy" and out.loc["rule", "mean_abs_change"] == pytest.approx(0.1)
    assert out.loc["backbone", "metric"] == "auroc" and np.isnan(out.loc["backbone", "mean_abs_change"])
    assert np.isnan(out.loc["backbone", "mean_range"]) and out.loc["backbone", "n_pairs"] == 0
    assert out.loc["rule", "paper_value"] == protocol.PAPER_EFFECTS["rule"]["value"]
    assert out.loc["rule", "paper_text"] == protocol.PAPER_EFFECTS["rule"]["text"]
    assert out.loc["seed", "paper_text"] == "not reported as a single number" and pd.isna(out.loc["seed", "paper_value"])
    custom = protocol.effect_summary(grid, factors=["rule"], headline={"rule": "auroc"}).iloc[0]
    assert custom["metric"] == "auroc" and custom["mean_abs_change"] == 0.0 and custom["paper_value"] is None
    assert protocol.effect_summary(grid, factors=["rule"], headline={}).iloc[0]["metric"] == "auroc"
    missing = error_message(protocol.effect_summary, grid.drop(columns=["seed", "value"]))
    assert missing == "grid lacks column(s) seed, value; pass the output of protocol_grid"


def test_validation_to_test_per_model_and_repeated_partition_defaults():
    preds = _three_models()
    table = protocol.validation_to_test(preds)
    assert table[["backbone", "policy"]].drop_duplicates().values.tolist() == [
        ["a", "finetuned"], ["a", "frozen"], ["b", "frozen"]]
    assert table.index.tolist() == list(range(len(table))) and (table["seed"] == 0).all()
    assert set(table["rule"]) == set(metrics.THRESHOLD_RULES)
    cal = protocol.validation_to_test(preds, what="calibration")
    assert "params" not in cal.columns and set(cal["method"]) == {"none", "temperature", "platt"}
    assert error_message(protocol.validation_to_test, preds, what="both") == (
        "what must be 'threshold' or 'calibration', got 'both'")
    rng = np.random.default_rng(5)
    y = np.tile([0, 1], 100)
    X = rng.normal(size=(200, 3)) + y[:, None]
    groups = np.arange(200) // 2
    parts = protocol.repeated_partitions(X, y, groups=groups)
    assert parts["partition"].tolist() == [0, 1, 2, 3, 4] and (parts["n_test"] == 40).all()
    again = protocol.repeated_partitions(X, y, groups=groups, n_partitions=5, test_fraction=0.2, rule="youden",
                                         validation_fraction=0.15, random_state=0)
    pd.testing.assert_frame_equal(parts, again)
    shifted = protocol.repeated_partitions(X, y, groups=groups, n_partitions=2, random_state=1)
    pd.testing.assert_frame_equal(shifted, parts.iloc[1:3].reset_index(drop=True).assign(partition=[0, 1]))
    assert protocol.repeated_partitions(X, y, groups=groups, n_partitions=2).shape == (2, 4)
    wide = protocol.repeated_partitions(X, y, groups=groups, n_partitions=2, test_fraction=0.4, validation_fraction=0.3)
    assert (wide["n_test"] == 80).all()
    for bad in (1, True):
        assert error_message(protocol.repeated_partitions, X, y, groups=groups, n_partitions=bad) == (
            f"n_partitions must be at least 2, got {bad!r}")


def _evidence_inputs(seed: int = 0):
    preds = _predictions(np.random.default_rng(seed), seeds=(0, 1))
    grid = protocol.protocol_grid(preds, n_resamples=50)
    effects = protocol.effect_summary(grid)
    calibration = protocol.validation_to_test(preds, what="calibration")
    transfers = protocol.validation_to_test(preds, what="threshold")
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 240)
    X = (y[:, None] + rng.normal(scale=1.5, size=(240, 4))).astype(float)
    parts = protocol.repeated_partitions(X, y, groups=np.arange(240), n_partitions=3)
    reported = {"backbone": "b", "policy": "finetuned", "seed": 1, "rule": "youden",
                "backbones": ["a", "b"], "seeds": [0, 1]}
    return preds, grid, effects, calibration, transfers, parts, reported


def test_checklist_evidence_reads_the_reported_model_and_the_papers_numbers():
    from crslib import checklist, paper

    preds, grid, effects, calibration, transfers, parts, reported = _evidence_inputs()
    ev = protocol.checklist_evidence(grid, effects, predictions=preds, calibration=calibration, transfers=transfers,
                                     partitions=parts, reported=reported, calibration_method="platt",
                                     finetune_epochs=3, provenance="official", n_resamples=50, source="here")
    assert list(ev) == ["training_policy", "threshold", "metrics", "calibration", "uncertainty"]
    by = effects.set_index("factor")
    assert ev["training_policy"]["effect"]["value"] == by.loc["policy", "mean_abs_change"]
    assert ev["training_policy"]["effect"]["paper"] == paper.value("policy_effect") == 0.044
    assert ev["threshold"]["effect"]["value"] == by.loc["rule", "mean_abs_change"]
    assert ev["threshold"]["effect"]["paper"] == paper.value("threshold_effect")
    cell = grid[(grid.backbone == "b") & (grid.policy == "finetuned") & (grid.seed == 1) & (grid.rule == "youden")
                & (grid.metric == "balanced_accuracy")].iloc[0]
    assert ev["threshold"]["reported_threshold"] == cell["threshold"]  # seed 1, not seed 0
    assert ev["metrics"]["reported_values"]["balanced_accuracy"] == cell["value"]
    cal = calibration[(calibration.backbone == "b") & (calibration.policy == "finetuned") & (calibration.seed == 1)
                      ].set_index("method").loc["platt"]
    assert ev["calibration"]["ece_before"] == cal["ece_uniform_before"]
    assert ev["calibration"]["effect"]["value"] == pytest.approx(cal["ece_uniform_after"] - cal["ece_uniform_before"])
    assert ev["uncertainty"]["split_level"]["n_partitions"] == 3
    assert ev["uncertainty"]["effect"]["value"] == pytest.approx(parts["auroc"].max() - parts["auroc"].min())
    assert ev["uncertainty"]["seeds"] == [0, 1] and ev["training_policy"]["policies_compared"] == ["finetuned", "frozen"]
    assert {item["effect"]["source"] for item in ev.values()} == {"here"}
    # the checklist accepts every item as complete
    entries = {e.item_id: e for e in checklist.build_checklist(ev).items}
    assert all(entries[i].status == "complete" for i in ev), {i: entries[i].problems for i in ev}


def test_checklist_evidence_refuses_a_model_the_tables_do_not_hold():
    preds, grid, effects, calibration, transfers, parts, reported = _evidence_inputs()
    with pytest.raises(InputError, match="grid has no rows for the reported model"):
        protocol.checklist_evidence(grid, effects, predictions=preds, calibration=calibration, transfers=transfers,
                                    partitions=parts, reported={**reported, "backbone": "zzz"},
                                    calibration_method="platt", finetune_epochs=3, provenance="official",
                                    n_resamples=50)


def test_protocol_splits_carve_out_is_grouped_partition_per_first_label_class():
    # 60 patients of class 0 and 40 of class 1, two images each; an official val split too small to use
    groups = np.repeat(np.arange(100), 2)
    labels = np.repeat((np.arange(100) >= 60).astype(int), 2)
    split = np.array(["train"] * 150 + ["val"] * 10 + ["test"] * 40)
    split[groups >= 95] = "test"
    split[np.isin(groups, [55, 56, 57, 58, 59])] = "test"  # both classes in test
    for seed, fraction in [(0, 0.15), (3, 0.15), (0, 0.3)]:
        assignment, how = protocol.protocol_splits(split, labels, groups=groups, validation_fraction=fraction,
                                                   random_state=seed)
        pool = np.flatnonzero(split != "test")
        expected = []
        for value in (0, 1):  # each class's patients of the pool, cut like grouped_partition cuts them
            members = pool[labels[pool] == value]
            _, part = splits.grouped_partition(groups[members], (1.0 - fraction, fraction), random_state=seed)
            expected += members[part].tolist()
        assert sorted(np.flatnonzero(assignment == "val").tolist()) == sorted(expected)
        assert (assignment[split == "test"] == "test").all()
        n_train = int((assignment == "train").sum())
        assert how.endswith(f"training rows: the rest of the pool ({n_train} images)")
        again, _ = protocol.protocol_splits(split, labels, groups=groups, validation_fraction=fraction,
                                            random_state=seed)
        assert np.array_equal(again, assignment)


def test_protocol_splits_official_validation_counts_and_unknown_split_names():
    n = 240
    labels = np.tile([0, 1], n // 2)
    groups = np.arange(n) // 2
    split = np.array(["train"] * 130 + ["val"] * 60 + ["test"] * 50)
    assignment, how = protocol.protocol_splits(split, labels, groups=groups)
    assert how == ("official test split (50 images); official validation split (60 images); "
                   "training pool (130 images)")
    # a manifest that says "validation" where the protocol expects "val" is refused, not trained on
    renamed = np.where(split == "val", "validation", split)
    assert error_message(protocol.protocol_splits, renamed, labels, groups=groups, error=DataError) == (
        "split has values ['validation'] that are none of train='train', validation='val', test='test'; "
        "rename them in the manifest or pass the split names")
    assert error_message(protocol.protocol_splits, np.where(split == "train", "TRAIN", split), labels, groups=groups,
                         error=DataError) == (
        "split has values ['TRAIN'] that are none of train='train', validation='val', test='test'; "
        "rename them in the manifest or pass the split names")
    same, _ = protocol.protocol_splits(renamed, labels, groups=groups, validation="validation")
    assert np.array_equal(same, assignment)


def test_protocol_splits_class_with_one_pool_patient_is_not_carved_but_the_other_class_is():
    # class 0 has a single patient in the pool (it cannot be cut), class 1 has two (one goes to validation)
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 4])
    labels = np.array([0, 0, 1, 1, 1, 1, 0, 1])
    split = np.array(["train"] * 6 + ["test"] * 2)
    assert error_message(protocol.protocol_splits, split, labels, groups=groups, min_validation=1, error=DataError) == (
        "the val partition holds a single class ([1]); the protocol needs both classes in train, validation "
        "and test")


def test_checklist_evidence_fields_descriptions_and_derived_numbers():
    """The exact record the checklist reads: field names, descriptions and units, and the numbers derived here."""
    from scipy.stats import spearmanr

    preds, grid, effects, calibration, transfers, parts, reported = _evidence_inputs(2)
    ev = protocol.checklist_evidence(grid, effects, predictions=preds, calibration=calibration, transfers=transfers,
                                     partitions=parts, reported=reported, calibration_method="platt",
                                     finetune_epochs=3, provenance="official", n_resamples=50)
    assert {item: list(fields) for item, fields in ev.items()} == {
        "training_policy": ["policies_compared", "reported_policy", "backbones", "finetune_epochs",
                            "backbone_effect_auroc", "effect"],
        "threshold": ["rule", "fitted_on", "validation_provenance", "rules_compared", "reported_threshold",
                      "validation_to_test_gap_balanced_accuracy", "effect"],
        "metrics": ["reported", "reported_values", "effect"],
        "calibration": ["method", "fitted_on", "ece_before", "ece_after", "effect"],
        "uncertainty": ["confidence", "n_resamples", "resampling", "seeds", "split_level",
                        "median_auroc_ci_half_width", "effect"],
    }
    assert {item: (fields["effect"]["description"], fields["effect"]["unit"], fields["effect"]["source"])
            for item, fields in ev.items()} == {
        "training_policy": ("mean |change| of test AUROC, frozen vs fine-tuned (same backbone, seed, rule)", "AUROC",
                            "04_protocol_sensitivity"),
        "threshold": ("mean |change| of test balanced accuracy between threshold rules (same model)",
                      "balanced accuracy", "04_protocol_sensitivity"),
        "metrics": ("Spearman correlation of the models' ranking by AUROC and by balanced accuracy (youden "
                    "threshold); below 1 means the metrics order models differently", "Spearman rho",
                    "04_protocol_sensitivity"),
        "calibration": ("test ECE (10 equal-width bins) of the reported model after validation-fitted platt scaling "
                        "minus before", "ECE", "04_protocol_sensitivity"),
        "uncertainty": ("range of the reported backbone's frozen test AUROC over repeated patient-grouped "
                        "partitions", "AUROC", "04_protocol_sensitivity"),
    }
    assert ev["threshold"]["fitted_on"] == ev["calibration"]["fitted_on"] == "validation"
    assert ev["threshold"]["validation_provenance"] == "official"
    assert ev["training_policy"]["finetune_epochs"] == 3 and ev["training_policy"]["backbones"] == ["a", "b"]
    assert ev["training_policy"]["backbone_effect_auroc"] == effects.set_index("factor").loc[
        "backbone", "mean_abs_change"]
    assert ev["threshold"]["rules_compared"] == list(protocol.THRESHOLD_RULES)
    assert ev["uncertainty"]["resampling"] == "patient-grouped bootstrap of the official test split"
    youden = grid[grid.rule == "youden"]
    auc = youden[youden.metric == "auroc"].groupby(["backbone", "policy"])["value"].mean()
    ba = youden[youden.metric == "balanced_accuracy"].groupby(["backbone", "policy"])["value"].mean()
    rho = spearmanr(auc, ba.loc[auc.index]).statistic
    assert rho == pytest.approx(7 / 9) and ev["metrics"]["effect"]["value"] == pytest.approx(rho)
    half = ((grid["high"] - grid["low"]) / 2)[grid.metric == "auroc"].median()
    assert ev["uncertainty"]["median_auroc_ci_half_width"] == pytest.approx(half)
    assert ev["uncertainty"]["split_level"] == {"n_partitions": 3, "auroc_sd": pytest.approx(parts["auroc"].std()),
                                                "auroc_range": pytest.approx(np.ptp(parts["auroc"]))}


@pytest.mark.parametrize("rule", ["prevalence", "youden"])
def test_repeated_partitions_equal_each_partition_computed_by_hand(rule):
    rng = np.random.default_rng(8)
    patients = np.repeat(np.arange(90), 2)
    y = np.repeat(rng.random(90) < 0.3, 2).astype(int)  # unbalanced: the prevalence rule's threshold moves
    X = y[:, None] * 0.8 + rng.normal(size=(180, 5))
    got = protocol.repeated_partitions(X, y, groups=patients, n_partitions=3, rule=rule, random_state=4)
    for i in range(3):
        tr, va, te = splits.grouped_partition(patients, (0.65, 0.15, 0.2), random_state=4 + i)  # the defaults
        split = np.empty(180, dtype=object)
        split[tr], split[va], split[te] = "train", "val", "test"
        prob, _ = protocol.linear_probe(X, y, split.astype(str), groups=patients, Cs=(1.0,))
        t = metrics.fit_threshold(y[va], prob[va], rule=rule, prevalence=float(y[tr].mean()))
        row = got.iloc[i]
        assert (row["partition"], row["n_test"]) == (i, len(te))
        assert row["auroc"] == pytest.approx(metrics.metric_score(y[te], prob[te], metric="auroc"))
        assert row["balanced_accuracy"] == pytest.approx(
            metrics.metric_score(y[te], prob[te], metric="balanced_accuracy", threshold=t))
    with pytest.raises(DataError, match="partition 0 has a single class in one part; use more patients"):
        protocol.repeated_partitions(X, np.r_[np.ones(2), np.zeros(178)].astype(int), groups=patients,
                                     n_partitions=2)


def test_effect_summary_skips_groups_with_one_level_without_stopping_or_warning():
    import warnings

    rows = []
    # backbone "a" was only frozen (sorted first: one level of policy), "b" and "c" were both
    for backbone, policies in [("a", {"frozen": 0.7}), ("b", {"frozen": 0.7, "finetuned": 0.8}),
                               ("c", {"frozen": 0.6, "finetuned": 0.9})]:
        for policy, value in policies.items():
            rows.append({"backbone": backbone, "policy": policy, "seed": 0, "rule": "youden", "metric": "auroc",
                         "value": value})
    grid = pd.DataFrame(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "mean of empty slice" for the factors with a single level
        out = protocol.effect_summary(grid, factors=["policy", "seed"]).set_index("factor")
    assert out.loc["policy", "n_pairs"] == 2  # b and c, after a
    assert out.loc["policy", "mean_abs_change"] == pytest.approx((0.1 + 0.3) / 2)
    assert out.loc["policy", "max_abs_change"] == pytest.approx(0.3)
    assert out.loc["seed", "n_pairs"] == 0 and np.isnan(out.loc["seed", "mean_abs_change"])
    assert np.isnan(out.loc["seed", "mean_range"]) and np.isnan(out.loc["seed", "max_abs_change"])


def test_protocol_tools_refuse_a_multiclass_label_naming_its_classes():
    y = np.tile(["a", "b", "c", "d"], 25)
    X = np.random.default_rng(0).normal(size=(100, 3))
    with pytest.raises(InputError, match=r"has 4 classes"):
        protocol.linear_probe(X, y, ["train"] * 80 + ["test"] * 20)
    with pytest.raises(InputError, match=r"has 4 classes"):
        protocol.repeated_partitions(X, y, groups=np.arange(100))
    with pytest.raises(InputError, match=r"has 4 classes"):
        protocol.protocol_splits(np.array(["train"] * 60 + ["val"] * 20 + ["test"] * 20), y, groups=np.arange(100))
    # a missing label is not counted as a class
    with pytest.raises(InputError, match="has 3 classes"):
        protocol.linear_probe(X, np.tile(["a", "b", "c", None], 25), ["train"] * 80 + ["test"] * 20)


_BINARY_ADVICE = ("the protocol tools are binary: map it to 0 (negative) and 1 (positive), e.g. one class "
                  "against the rest")


def test_multiclass_refusal_reads_whole_naming_up_to_five_classes_sorted_by_their_text():
    X = np.random.default_rng(0).normal(size=(120, 3))
    split = ["train"] * 100 + ["test"] * 20
    # a plain list of mixed values: the integers stay integers in the message, sorted with the text by its text
    mixed = [0, 1, 2, "x", "y"] * 24
    five = f"has 5 classes (0, 1, 2, 'x', 'y'); {_BINARY_ADVICE}"
    assert error_message(protocol.linear_probe, X, mixed, split) == f"y {five}"
    assert error_message(protocol.repeated_partitions, X, mixed, groups=np.arange(120)) == f"y {five}"
    # six integer classes: the first five by their text (10 before 5), then an ellipsis
    six = np.repeat([5, 6, 7, 8, 9, 10], 20)
    shown = f"has 6 classes (10, 5, 6, 7, 8, ...); {_BINARY_ADVICE}"
    assert error_message(protocol.linear_probe, X, six, split) == f"y {shown}"
    assert error_message(protocol.repeated_partitions, X, six, groups=np.arange(120)) == f"y {shown}"
    assert error_message(protocol.protocol_splits, np.array(["train"] * 80 + ["val"] * 20 + ["test"] * 20), six,
                    groups=np.arange(120)) == f"labels {shown}"


def test_grid_and_transfers_aim_the_prevalence_rule_at_the_fitting_rows_when_there_are_no_train_rows():
    rng = np.random.default_rng(4)
    y = np.r_[np.repeat([1, 0], [30, 70]), np.repeat([1, 0], [70, 30])]  # val 30 % positive, test 70 %
    prob = np.clip(0.35 + 0.3 * y + rng.normal(0, 0.15, 200), 0.01, 0.99)
    preds = pd.DataFrame({"backbone": "b", "policy": "frozen", "seed": 0, "image_id": np.arange(200).astype(str),
                          "patient_id": np.arange(200), "split": ["val"] * 100 + ["test"] * 100,
                          "y_true": y, "prob": prob})
    expected = metrics.fit_threshold(y[:100], prob[:100], rule="prevalence", prevalence=0.3)
    grid = protocol.protocol_grid(preds, rules=["prevalence"], metrics=["balanced_accuracy"], n_resamples=20)
    assert grid["prevalence"].tolist() == [pytest.approx(0.3)]
    assert grid["threshold"].tolist() == [pytest.approx(expected)]
    table = protocol.validation_to_test(preds, what="threshold")
    row = table[table["rule"] == "prevalence"].iloc[0]
    assert row["prevalence"] == pytest.approx(0.3) and row["threshold"] == pytest.approx(expected)


def test_grid_and_transfers_list_models_sorted_whatever_the_row_order():
    preds = _predictions(np.random.default_rng(5), backbones=("b", "a"), seeds=(1, 0))
    order = [("a", "finetuned", 0), ("a", "finetuned", 1), ("a", "frozen", 0), ("a", "frozen", 1),
             ("b", "finetuned", 0), ("b", "finetuned", 1), ("b", "frozen", 0), ("b", "frozen", 1)]
    grid = protocol.protocol_grid(preds, rules=["youden"], metrics=["auroc"], n_resamples=10)
    assert list(zip(grid.backbone, grid.policy, grid.seed)) == order
    table = protocol.validation_to_test(preds, what="calibration")
    assert list(dict.fromkeys(zip(table.backbone, table.policy, table.seed))) == order


def test_grid_defaults_to_1000_resamples_and_names_the_model_and_the_choices_in_its_errors():
    preds = _predictions(np.random.default_rng(6), backbones=("a",))
    one = preds[preds.policy == "frozen"]
    kwargs = {"rules": ["youden"], "metrics": ["balanced_accuracy"]}
    pd.testing.assert_frame_equal(protocol.protocol_grid(one, **kwargs),
                                  protocol.protocol_grid(one, n_resamples=1000, **kwargs))
    assert not protocol.protocol_grid(one, **kwargs).equals(protocol.protocol_grid(one, n_resamples=999, **kwargs))
    assert error_message(protocol.protocol_grid, one, rules=["magic"]) == (
        f"unknown threshold rule(s) ['magic']; use {', '.join(metrics.THRESHOLD_RULES)}")
    assert error_message(protocol.protocol_grid, one, metrics=["speed"]) == (
        f"unknown metric(s) ['speed']; use {', '.join(metrics.METRICS)}")
    assert error_message(protocol.protocol_grid, one[one.split != "val"], **kwargs) == (
        "y_true and probabilities of a / frozen / seed 0 on 'val' are empty: there are no cases to evaluate")


def test_linear_probe_fits_to_convergence_and_caps_inner_folds_at_patients_and_minority_count(monkeypatch):
    import warnings

    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # nearly collinear features and a large C: scikit-learn's default 100 iterations stop far from the optimum
    rng = np.random.default_rng(0)
    z = rng.normal(size=(100, 2))
    y = (z[:, 0] + rng.normal(size=100) > 0).astype(int)
    X = z @ rng.normal(size=(2, 400)) + 0.01 * rng.normal(size=(100, 400))
    prob, _ = protocol.linear_probe(X, y, ["train"] * 100, Cs=(1e4,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converged = make_pipeline(StandardScaler(), LogisticRegression(C=1e4, max_iter=100_000)).fit(X, y)
    np.testing.assert_allclose(prob, converged.predict_proba(X)[:, 1], atol=1e-3)

    # three training patients: five inner folds cannot be drawn, three are (the same as asking for three)
    rng = np.random.default_rng(1)
    y = np.tile([0, 1], 60)
    X = rng.normal(size=(120, 4)) + 0.7 * y[:, None]
    groups = np.repeat([0, 1, 2, 3], 30)
    split = np.where(groups < 3, "train", "test")
    five = protocol.linear_probe(X, y, split, groups=groups, n_splits=5)
    three = protocol.linear_probe(X, y, split, groups=groups, n_splits=3)
    np.testing.assert_array_equal(five[0], three[0])
    assert five[1] == three[1]

    # two positives among the training rows: the inner CV still runs, on two folds
    import sklearn.model_selection

    drawn = []
    real = sklearn.model_selection.StratifiedGroupKFold

    def recording(n_splits, **kwargs):
        drawn.append(n_splits)
        return real(n_splits=n_splits, **kwargs)

    monkeypatch.setattr(sklearn.model_selection, "StratifiedGroupKFold", recording)
    y = np.r_[np.zeros(40, int), [1, 1], np.tile([0, 1], 10)]
    X = rng.normal(size=(62, 3)) + y[:, None]
    protocol.linear_probe(X, y, ["train"] * 42 + ["test"] * 20)
    assert drawn == [2]


def test_checklist_evidence_names_the_table_that_lacks_the_reported_model():
    preds, grid, effects, calibration, transfers, parts, reported = _evidence_inputs()
    where = "{'backbone': 'b', 'policy': 'finetuned', 'seed': 1}"
    kwargs = dict(predictions=preds, calibration=calibration, transfers=transfers, partitions=parts,
                  reported=reported, calibration_method="platt", finetune_epochs=3, provenance="official",
                  n_resamples=50)
    assert error_message(protocol.checklist_evidence, grid, effects, **{**kwargs, "calibration": calibration[
        calibration.seed != 1]}) == f"calibration has no rows for the reported model {where}"
    assert error_message(protocol.checklist_evidence, grid, effects, **{**kwargs, "transfers": transfers[
        transfers.seed != 1]}) == (
        f"transfers has no rows for the reported model {where[:-1]}, 'rule': 'youden'}}")


def test_grid_table_checks_read_whole_and_a_split_without_a_class_is_named_by_its_own_count():
    preds = _predictions(np.random.default_rng(7), backbones=("a",))
    assert error_message(protocol.protocol_grid, preds.drop(columns=["split", "patient_id"])) == (
        f"predictions lack column(s) patient_id, split; need {', '.join(protocol.PREDICTION_COLUMNS)}")
    # the whole table is checked without asking for both classes: the first model's validation rows are
    n_val = int((preds[(preds.policy == "finetuned")].split == "val").sum())
    assert error_message(protocol.protocol_grid, preds.assign(y_true=1)) == (
        f"y_true holds only the positive (1) class ({n_val} cases); a split needs both classes to compute these "
        "metrics, so use a larger or stratified split")


def test_grid_interval_is_nan_without_a_warning_when_no_resample_can_be_scored():
    import warnings

    # two test patients; the one resample (seed 0) draws the positive patient twice: no AUROC to take
    preds = pd.DataFrame({"backbone": "a", "policy": "frozen", "seed": 0, "image_id": [str(i) for i in range(22)],
                          "patient_id": np.arange(22), "split": ["val"] * 20 + ["test"] * 2,
                          "y_true": np.r_[np.tile([0, 1], 10), [0, 1]],
                          "prob": np.r_[np.tile([0.3, 0.7], 10), [0.4, 0.6]]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grid = protocol.protocol_grid(preds, rules=["youden"], metrics=["auroc"], n_resamples=1, random_state=0)
    cell = grid.iloc[0]
    assert cell["value"] == 1.0 and np.isnan(cell["low"]) and np.isnan(cell["high"])

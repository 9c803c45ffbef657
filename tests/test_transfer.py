"""crslib.transfer: linear maps between embedding spaces and classifier transfer."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import r2_score

from crslib import transfer as tr
from crslib.splits import grouped_split
from crslib.errors import InputError


def _data(n=1500, d=24, n_findings=4, seed=0):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(n, d))
    W = rng.normal(size=(d, n_findings))
    logits = old @ W / np.sqrt(d) * 2 + 0.5 * rng.normal(size=(n, n_findings))
    labels = pd.DataFrame((logits > 0).astype(int), columns=[f"finding_{i}" for i in range(n_findings)])
    return rng, old, labels


def test_ridge_recovers_exact_affine_map():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 10))
    A = rng.normal(size=(10, 6))
    Y = X @ A + 3.0
    m = tr.fit_linear_map(X[:300], Y[:300])
    assert m.method == "ridge" and m.alpha_ == pytest.approx(1e-3)
    assert m.coef_.shape == (10, 6) and m.n_features_in_ == 10 and m.n_features_out_ == 6
    assert tr.held_out_r2(m, X[300:], Y[300:]) > 0.9999
    lst = tr.fit_linear_map(X[:300], Y[:300], method="lstsq")
    np.testing.assert_allclose(lst.predict(X[300:]), Y[300:], atol=1e-8)


def test_ridge_picks_larger_alpha_for_noisy_targets():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 40))
    Y = X[:, :1] + 3 * rng.normal(size=(60, 1))
    m = tr.fit_linear_map(X, Y)
    assert m.alpha_ > 1.0
    assert set(m.cv_errors_) == set(float(a) for a in tr.DEFAULT_ALPHAS)


def test_procrustes_rotation_and_padding():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 8))
    Q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    Y = 2.5 * X @ Q + 1.0
    m = tr.fit_linear_map(X, Y, method="procrustes")
    assert m.scale_ == pytest.approx(2.5)
    np.testing.assert_allclose(m.predict(X), Y, atol=1e-8)
    W = m.coef_ / m.scale_
    np.testing.assert_allclose(W.T @ W, np.eye(8), atol=1e-10)
    # different dimensions: zero padding, semi-orthogonal map
    Ysmall = Y[:, :5]
    m2 = tr.fit_linear_map(X, Ysmall, method="procrustes")
    assert m2.coef_.shape == (8, 5)
    W2 = m2.coef_ / m2.scale_
    np.testing.assert_allclose(W2.T @ W2, np.eye(5), atol=1e-10)
    m3 = tr.fit_linear_map(Ysmall, X, method="procrustes")
    assert m3.predict(Ysmall).shape == (300, 8)


def test_held_out_r2_matches_sklearn_variance_weighted():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 5))
    Y = X @ rng.normal(size=(5, 3)) * [1, 5, 0.2] + rng.normal(size=(200, 3))
    m = tr.fit_linear_map(X[:100], Y[:100])
    expected = r2_score(Y[100:], m.predict(X[100:]), multioutput="variance_weighted")
    assert tr.held_out_r2(m, X[100:], Y[100:]) == pytest.approx(expected)


def test_map_bad_input():
    X = np.random.default_rng(4).normal(size=(20, 3))
    with pytest.raises(InputError, match="same images"):
        tr.fit_linear_map(X, X[:10])
    with pytest.raises(InputError, match="method"):
        tr.fit_linear_map(X, X, method="cca")
    m = tr.fit_linear_map(X, X)
    with pytest.raises(InputError, match="fitted on 3"):
        m.predict(np.ones((2, 4)))
    with pytest.raises(InputError, match="alphas"):
        tr.fit_linear_map(X, X, alphas=[0.0, 1.0])


def _split(n):
    idx = np.arange(n)
    return idx[: n // 3], idx[n // 3 : 2 * n // 3], idx[2 * n // 3 :]


def test_invertible_map_keeps_auroc():
    rng, old, labels = _data()
    new = old @ rng.normal(size=(24, 24))  # invertible with probability 1
    mp, trn, tst = _split(len(old))
    res = tr.classifier_transfer(old, new, labels, map_idx=mp, train_idx=trn, test_idx=tst, n_resamples=200)
    assert isinstance(res, tr.ClassifierTransfer)
    assert res.method == "ridge" and res.n_map == len(mp) and res.alpha > 0
    t = res.table
    assert list(t.finding) == list(labels.columns)
    assert (t.reason == "").all()
    assert (t.auroc_original > 0.8).all()
    assert (t.retention > 0.97).all()
    assert (t.map_r2 > 0.999).all()
    assert (t.retention_low <= t.retention).all() and (t.retention <= t.retention_high).all()
    assert (t.auroc_transferred_low <= t.auroc_transferred_high).all()
    again = tr.classifier_transfer(old, new, labels, map_idx=mp, train_idx=trn, test_idx=tst, n_resamples=200)
    pd.testing.assert_frame_equal(t, again.table)
    assert again.alpha == res.alpha


def test_unrelated_embeddings_transfer_at_chance():
    rng, old, labels = _data(seed=1)
    new = rng.normal(size=(len(old), 16))
    mp, trn, tst = _split(len(old))
    t = tr.classifier_transfer(old, new, labels, map_idx=mp, train_idx=trn, test_idx=tst, n_resamples=100).table
    assert (t.auroc_original > 0.8).all()
    assert (abs(t.auroc_transferred - 0.5) < 0.1).all()
    assert (t.map_r2 < 0.05).all()


def test_disjointness_violations_raise():
    rng, old, labels = _data(n=300)
    mp, trn, tst = _split(300)
    with pytest.raises(InputError, match="map_idx and test_idx share 5 image"):
        tr.classifier_transfer(old, old, labels, map_idx=np.r_[mp, tst[:5]], train_idx=trn, test_idx=tst)
    with pytest.raises(InputError, match="train_idx and test_idx share"):
        tr.classifier_transfer(old, old, labels, map_idx=mp, train_idx=np.r_[trn, tst[:1]], test_idx=tst)
    patients = np.arange(300) // 2
    patients[tst[0]] = patients[trn[0]]  # one patient in train and test
    with pytest.raises(InputError, match="share 1 patient"):
        tr.classifier_transfer(old, old, labels, map_idx=mp, train_idx=trn, test_idx=tst, groups=patients)
    with pytest.raises(InputError, match="outside"):
        tr.classifier_transfer(old, old, labels, map_idx=[0, 400], train_idx=trn, test_idx=tst)


def test_single_class_finding_recorded_not_raised():
    rng, old, labels = _data(n=600)
    mp, trn, tst = _split(600)
    labels = labels.copy()
    labels["absent_in_test"] = 0
    labels.loc[trn[:40], "absent_in_test"] = 1
    labels["never"] = 0
    t = tr.classifier_transfer(old, old @ np.eye(24) * 2, labels, map_idx=mp, train_idx=trn, test_idx=tst,
                               n_resamples=50).table
    row = t.set_index("finding")
    assert np.isnan(row.loc["absent_in_test", "retention"])
    assert "single class in the test split" in row.loc["absent_in_test", "reason"]
    assert "training" in row.loc["never", "reason"]
    assert row.loc["finding_0", "reason"] == "" and row.loc["finding_0", "retention"] > 0.97


def test_skipped_finding_is_recorded_in_the_table_not_warned(caplog):
    # a finding with one class in a split is expected (rare findings); the table records why, the log only at
    # INFO, so that a notebook page shows no stderr for it (the caller reads the reasons from the table)
    rng, old, labels = _data(n=600)
    mp, trn, tst = _split(600)
    labels = labels.copy()
    labels["never"] = 0
    with caplog.at_level("INFO", logger="crslib.transfer"):
        t = tr.classifier_transfer(old, old, labels, map_idx=mp, train_idx=trn, test_idx=tst, n_resamples=20).table
    assert t.set_index("finding").loc["never", "reason"].startswith("single class in the training split")
    skipped = [r for r in caplog.records if "'never' skipped" in r.getMessage()]
    assert [r.levelname for r in skipped] == ["INFO"]
    caplog.clear()
    with caplog.at_level("INFO", logger="crslib.transfer"):
        tr.classifier_transfer(old, old, labels[["never"]], map_idx=mp, train_idx=trn, test_idx=tst, n_resamples=20)
    assert [r.levelname for r in caplog.records if "no finding" in r.getMessage()] == ["INFO"]


def test_transfer_targets_findings_label_and_reasons():
    patients = [f"p{i}" for i in range(12)]
    m = pd.DataFrame({"patient_id": patients, "finding_a": [0, 1] * 6, "finding_rare": [1] + [0] * 11,
                      "finding_text": ["no", "yes"] * 6, "label": ["x", "y", "z"] * 4})
    targets, left_out = tr.transfer_targets(m, min_per_class=3)
    assert list(targets) == ["finding_a", "finding_text=yes"]  # findings win over label; text coded 0/1
    assert targets["finding_a"].tolist() == [0.0, 1.0] * 6 and targets["finding_text=yes"].tolist() == [0.0, 1.0] * 6
    assert left_out == {"finding_rare": "`finding_rare` needs at least 3 patients of each of its two classes; "
                                        "it has 0: 11, 1: 1"}
    # without findings: a two-class text label, missing values kept as NaN
    m = pd.DataFrame({"patient_id": patients, "label": ["NORMAL", "PNEUMONIA", None] * 4})
    targets, left_out = tr.transfer_targets(m, min_per_class=4)
    assert list(targets) == ["label=PNEUMONIA"] and left_out == {}
    assert targets["label=PNEUMONIA"].tolist()[:3] == [0.0, 1.0, pytest.approx(np.nan, nan_ok=True)]
    # counted in patients, not images
    m3 = pd.DataFrame({"patient_id": ["p1"] * 6 + ["p2"] * 6, "label": ["a", "b"] * 6})
    assert tr.transfer_targets(m3, min_per_class=3)[1]["label"].endswith("it has a: 2, b: 2")
    # a multi-class label, and neither findings nor label
    m = pd.DataFrame({"patient_id": patients, "label": ["x", "y", "z"] * 4})
    targets, left_out = tr.transfer_targets(m)
    assert targets.shape[1] == 0 and left_out["label"].startswith("`label` needs exactly two classes; it has 3")
    targets, left_out = tr.transfer_targets(m.drop(columns="label"))
    assert targets.shape == (12, 0) and left_out == {"label": (
        "the manifest has no finding_* columns and no `label` column; add 0/1 finding_* columns or a two-class "
        "`label` to run it")}
    with pytest.raises(InputError, match="must be a DataFrame"):
        tr.transfer_targets([1, 2])


def test_transfer_sweep_patient_disjoint_and_capped():
    rng, old, labels = _data(n=1200, d=16, n_findings=2, seed=5)
    new = old @ rng.normal(size=(16, 16)) + 0.05 * rng.normal(size=(1200, 16))
    patients = np.arange(1200) // 3
    res = tr.transfer_sweep(old, new, labels, groups=patients, n_values=(8, 64, 256, 100000), n_resamples=50)
    assert isinstance(res, tr.TransferSweep)
    t = res.table
    assert res.dropped_n == [100000]
    pool = res.n_pool
    assert pool + res.n_train + res.n_test == 1200
    assert sorted(t.n_map.unique()) == [8, 64, 256, pool]
    assert 500 <= pool <= 700  # about half of the images
    by_n = t.groupby("n_map").retention.mean()
    assert by_n.loc[pool] > 0.97 and by_n.loc[256] > 0.97
    assert by_n.loc[8] < by_n.loc[pool]  # 8 images cannot pin down a 16-d map
    parts = grouped_split(patients, (0.5, 0.25, 0.25), np.random.default_rng(0))
    sets = [set(patients[p]) for p in parts]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert sum(len(p) for p in parts) == 1200


def test_transfer_results_copy_and_serialise():
    rng, old, labels = _data(n=300, d=8, n_findings=2, seed=7)
    new = old @ rng.normal(size=(8, 8))
    mp, trn, tst = _split(300)
    res = tr.classifier_transfer(old, new, labels, map_idx=mp, train_idx=trn, test_idx=tst, method="lstsq",
                                 n_resamples=20)
    frame = res.to_frame()
    pd.testing.assert_frame_equal(frame, res.table)
    frame.loc[0, "retention"] = -1.0
    assert res.table.loc[0, "retention"] != -1.0
    d = json.loads(res.to_json())
    assert (d["method"], d["alpha"], d["n_map"]) == ("lstsq", None, len(mp))
    assert [row["finding"] for row in d["table"]] == list(labels.columns)
    assert [row["retention"] for row in d["table"]] == res.table["retention"].tolist()

    sweep = tr.transfer_sweep(old, new, labels, groups=np.arange(300) // 2, n_values=(16, 5000), n_resamples=10)
    frame = sweep.to_frame()
    pd.testing.assert_frame_equal(frame, sweep.table)
    frame["n_map"] = 0
    assert sweep.table["n_map"].tolist()[0] == 16
    d = json.loads(sweep.to_json())
    assert d["dropped_n"] == [5000] and (d["n_pool"], d["n_train"], d["n_test"]) == (
        sweep.n_pool, sweep.n_train, sweep.n_test)
    assert [row["n_map"] for row in d["table"]] == sweep.table["n_map"].tolist()
    assert len(d["table"]) == 2 * len(labels.columns)


def test_procrustes_scale_is_fitted_on_embeddings_of_any_magnitude():
    rng = np.random.default_rng(3)
    X = 0.01 * rng.normal(size=(30, 3))  # a sum of squares far below 1
    Q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    m = tr.fit_linear_map(X, 0.5 * X @ Q, method="procrustes")
    assert m.scale_ == pytest.approx(0.5)
    np.testing.assert_allclose(m.predict(X), 0.5 * X @ Q, atol=1e-12)


def test_ridge_logs_only_an_alpha_at_the_edge_of_the_grid(caplog):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 40))
    with caplog.at_level("INFO", logger="crslib.transfer"):
        assert tr.fit_linear_map(X, rng.normal(size=(60, 2))).alpha_ == 1000.0  # pure noise: the largest
    assert [r.getMessage() for r in caplog.records] == [
        "ridge alpha 1e+03 chosen at the edge of the grid; consider widening alphas"]
    caplog.clear()
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 40))
    with caplog.at_level("INFO", logger="crslib.transfer"):
        assert tr.fit_linear_map(X, X[:, :1] + 0.3 * rng.normal(size=(60, 1))).alpha_ == pytest.approx(10 ** 0.5)
    assert caplog.records == []


def test_shared_patients_message_reads_whole_with_three_examples():
    rng, old, labels = _data(n=300)
    mp, trn, tst = _split(300)
    patients = np.arange(300)
    patients[tst[:4]] = patients[trn[:4]]  # four patients in train and test
    shared = sorted(patients[trn[:4]].tolist())
    with pytest.raises(InputError) as info:
        tr.classifier_transfer(old, old, labels, map_idx=mp, train_idx=trn, test_idx=tst, groups=patients)
    assert str(info.value) == (f"train_idx and test_idx share 4 patient(s) (e.g. {shared[:3]}); split by patient "
                               "so that no patient is in two parts")


def test_transfer_targets_default_needs_five_patients_per_class():
    five = pd.DataFrame({"patient_id": [f"p{i}" for i in range(10)], "label": ["a", "b"] * 5})
    assert list(tr.transfer_targets(five)[0]) == ["label=b"]
    four = five.iloc[:8]
    assert tr.transfer_targets(four)[1] == {
        "label": "`label` needs at least 5 patients of each of its two classes; it has a: 4, b: 4"}
    with pytest.raises(InputError) as info:
        tr.transfer_targets([1, 2])
    assert str(info.value) == "manifest must be a DataFrame, got list"

"""crslib.probes: what a probe can score (probe_targets), the paired out-of-fold probe margin of an encoder
over a reference (probe_margin), and the scores the heads share."""

from __future__ import annotations

import warnings
from unittest import mock

import numpy as np
import pandas as pd
import pytest

from crslib import probes, stats
from crslib.errors import InputError


def _data(n_patients=120, per_patient=2, seed=0):
    """Two findings; the signal encoder carries only the first, the noise encoder neither."""
    rng = np.random.default_rng(seed)
    groups = np.repeat([f"p{i:03d}" for i in range(n_patients)], per_patient)
    n = len(groups)
    # a finding belongs to the patient: all of a patient's images share it
    first = np.repeat(rng.integers(0, 2, n_patients), per_patient)
    second = np.repeat(rng.integers(0, 2, n_patients), per_patient)
    labels = pd.DataFrame({"first": first, "second": second})
    noise = rng.normal(size=(n, 6))
    signal = np.hstack([first[:, None] + rng.normal(0, 0.3, size=(n, 1)), noise])
    return signal, noise, labels, groups


def test_an_encoder_against_itself_gains_exactly_nothing():
    _, noise, labels, groups = _data()
    m = probes.probe_margin(noise, noise, labels, groups=groups, n_resamples=200)
    assert m.difference == 0.0 and m.low == 0.0 and m.high == 0.0
    assert m.auroc == m.reference_auroc and not m.learned
    assert m.findings == ["first", "second"] and m.n_test == 240 and m.n_test_patients == 120


def test_the_margin_is_the_mean_over_findings_of_out_of_fold_aurocs():
    signal, noise, labels, groups = _data()
    m = probes.probe_margin(signal, noise, labels, groups=groups, n_resamples=300)
    alone = {c: probes.probe_margin(signal, noise, labels[[c]], groups=groups, n_resamples=50) for c in labels}
    # each finding's folds depend on that finding only: the margin's scores are the mean of the single ones
    assert m.auroc == pytest.approx(np.mean([a.auroc for a in alone.values()]), abs=1e-12)
    assert m.reference_auroc == pytest.approx(np.mean([a.reference_auroc for a in alone.values()]), abs=1e-12)
    # the first finding is separable, the second is not; noise is near chance out of fold
    assert alone["first"].auroc > 0.95 and abs(alone["second"].auroc - 0.5) < 0.15
    assert abs(m.reference_auroc - 0.5) < 0.1
    assert m.learned and 0 < m.low < m.difference < m.high
    assert m.difference == pytest.approx(m.auroc - m.reference_auroc)
    assert m.to_dict()["learned"] is True


def test_scores_are_out_of_fold_so_wide_noise_cannot_learn_the_labels():
    # 200 noise dimensions for 240 images: a probe scored on the rows it was fitted on
    # separates them perfectly; scored out of fold it is at chance
    rng = np.random.default_rng(3)
    _, _, labels, groups = _data(seed=3)
    wide = rng.normal(size=(len(groups), 200))
    m = probes.probe_margin(wide, rng.normal(size=(len(groups), 3)), labels, groups=groups, n_resamples=200)
    assert m.auroc == pytest.approx(0.5, abs=0.1)
    assert not m.learned and m.low < 0 < m.high


def test_folds_keep_a_patients_images_together():
    # each patient's two images are copies: a fold that split a patient would let the probe
    # recognise the copy and score near 1 on pure noise
    rng = np.random.default_rng(4)
    _, _, labels, groups = _data(seed=4)
    per_patient = rng.normal(size=(120, 150))
    copies = np.repeat(per_patient, 2, axis=0)
    m = probes.probe_margin(copies, copies[:, :3], labels, groups=groups, n_resamples=200)
    assert m.auroc == pytest.approx(0.5, abs=0.12)


def test_the_interval_resamples_patients():
    signal, noise, labels, groups = _data()
    with mock.patch.object(stats, "paired_bootstrap", wraps=stats.paired_bootstrap) as bootstrap:
        m = probes.probe_margin(signal, noise, labels, groups=groups, n_resamples=300, random_state=1)
    # the bootstrap draws patients, the same ones for both sides
    np.testing.assert_array_equal(bootstrap.call_args.kwargs["groups"], groups)
    assert bootstrap.call_args.kwargs["n_resamples"] == 300 and m.n_resamples == 300
    # the seed reaches the bootstrap, not only the folds
    assert bootstrap.call_args.kwargs["random_state"] == 1
    # one row per image but the same patients: resampling images instead would narrow the interval
    by_image = probes.probe_margin(signal, noise, labels, groups=np.arange(len(groups)), n_resamples=300,
                                   random_state=1)
    assert (m.high - m.low) > (by_image.high - by_image.low)


def test_a_constant_embedding_scores_exactly_chance():
    # every image gets the same features: whatever the folds' class balance, no image ranks above another
    _, noise, labels, groups = _data()
    constant = np.ones((len(groups), 4))
    m = probes.probe_margin(constant, noise, labels, groups=groups, n_resamples=100)
    assert m.auroc == 0.5


def test_a_finding_that_cannot_be_scored_is_left_out_with_its_reason():
    signal, noise, labels, groups = _data()
    labels = labels.assign(rare=0)
    labels.loc[0:1, "rare"] = 1  # one patient (p000) has it
    m = probes.probe_margin(signal, noise, labels, groups=groups, n_resamples=100)
    assert m.findings == ["first", "second"] and "rare" in m.reasons and "1 patient" in m.reasons["rare"]
    unknown = labels.astype(float)
    unknown.loc[:99, "first"] = np.nan  # unknown labels are left out of that finding only
    m2 = probes.probe_margin(signal, noise, unknown, groups=groups, n_resamples=100)
    assert m2.n_test == 240 and m2.findings == ["first", "second"]


def test_bad_input_is_refused():
    signal, noise, labels, groups = _data()
    with pytest.raises(InputError, match="must embed the same images"):
        probes.probe_margin(signal, noise[:-1], labels, groups=groups)
    with pytest.raises(InputError, match="groups"):
        probes.probe_margin(signal, noise, labels, groups=groups[:-1])
    with pytest.raises(InputError, match="n_splits"):
        probes.probe_margin(signal, noise, labels, groups=groups, n_splits=1)
    with pytest.raises(InputError, match="no finding could be evaluated"):
        probes.probe_margin(signal, noise, pd.DataFrame({"none": np.zeros(len(groups))}), groups=groups)


def test_mean_auroc_is_nan_when_a_resample_has_one_class():
    y = np.array([[1], [1], [1]])
    assert np.isnan(probes._mean_auroc(y, np.array([[0.2], [0.5], [0.9]])))
    y = np.array([[0, 1], [1, 0], [1, -1], [0, 1]])
    scores = np.array([[0.1, 0.9], [0.9, 0.1], [0.8, 0.0], [0.2, 0.7]])
    assert probes._mean_auroc(y, scores) == pytest.approx(
        np.mean([stats.auroc(y[:, 0], scores[:, 0]), stats.auroc(np.array([1, 0, 1]), np.array([0.9, 0.1, 0.7]))]))


def _patients(n: int, per_patient: int = 2) -> list[str]:
    return [f"p{i // per_patient:03d}" for i in range(n)]


# --------------------------------------------------------------------------- probe_targets


def test_probe_targets_prefers_findings_and_leaves_out_rare_ones():
    n = 80
    m = pd.DataFrame({
        "patient_id": _patients(n),
        "label": ["a", "b"] * (n // 2),
        "finding_common": [0, 0, 1, 1] * (n // 4),
        "finding_rare": [1, 1] + [0] * (n - 2),  # one patient
    })
    targets, left_out = probes.probe_targets(m)
    assert list(targets.columns) == ["finding_common"]  # findings win over the label
    assert targets["finding_common"].dtype == float and list(targets.index) == list(m.index)
    assert left_out == {"finding_rare": "`finding_rare` needs at least 5 patients of each of its two classes; "
                                        "it has 0: 39, 1: 1"}


def test_probe_targets_codes_a_two_class_text_label():
    n = 60
    m = pd.DataFrame({"patient_id": _patients(n),
                      "label": ["photograph", "photograph", "microscopy", "microscopy"] * 15})
    m.loc[5, "label"] = None  # unknown stays unknown
    targets, left_out = probes.probe_targets(m)
    assert left_out == {} and list(targets.columns) == ["label=photograph"]
    column = targets["label=photograph"]
    assert column.iloc[:4].tolist() == [1.0, 1.0, 0.0, 0.0] and np.isnan(column.iloc[5])
    # numbers sort as numbers: 2 < 10, so 10 is the positive class
    numeric = m.assign(label=[2, 10] * (n // 2))
    assert list(probes.probe_targets(numeric)[0].columns) == ["label=10"]


@pytest.mark.parametrize(("label", "reason"), [
    (None, "the manifest has no finding_* columns and no `label` column; add 0/1 finding_* columns or a "
           "two-class `label` to run it"),
    (["a", "b", "c"] * 20, "`label` needs exactly two classes; it has 3 ('a', 'b', 'c')"),
    (["a"] * 60, "`label` needs exactly two classes; it has 1 ('a')"),
])
def test_probe_targets_says_why_there_is_nothing_to_probe(label, reason):
    m = pd.DataFrame({"patient_id": _patients(60)})
    if label is not None:
        m["label"] = label
    targets, left_out = probes.probe_targets(m)
    assert targets.shape == (60, 0) and left_out == {"label": reason}


def test_probe_targets_leaves_out_what_the_probe_split_cannot_score():
    # 5 positive patients out of 40: some seeds put all of them in the training part (or all in the test part)
    n = 80
    patients = _patients(n)
    positive = {"p000", "p001", "p002", "p003", "p004"}
    m = pd.DataFrame({"patient_id": patients, "label": [int(p in positive) for p in patients]})
    seeds = []
    for seed in range(40):
        targets, left_out = probes.probe_targets(m, random_state=seed)
        if left_out:
            assert targets.shape[1] == 0
            assert left_out["label"].startswith("the probe's patient-grouped train/test split does not allow it: "
                                                "single class in the")
            seeds.append(seed)
        else:  # what probe_targets keeps, the probe fits (no NaN, no warning)
            res = probes.linear_probe_auroc(np.random.default_rng(0).normal(size=(n, 3)), targets,
                                     groups=m["patient_id"].to_numpy(), random_state=seed)
            assert res.reasons == {} and np.isfinite(res.auroc).all()
    assert seeds, "no seed put every positive patient in the training part"


# --------------------------------------------------------------------------- probe_margin: contracts


def test_the_documented_defaults():
    # every card's margin and chapter 02's probe table are computed with these values: a call that
    # leaves them out equals one that spells them out, and differs from one that changes them
    signal, noise, labels, groups = _data(n_patients=60)
    m = probes.probe_margin(signal, noise, labels, groups=groups)
    spelled = probes.probe_margin(signal, noise, labels, groups=groups, n_splits=5, C=1.0, max_iter=2000,
                                  n_resamples=1000, confidence=0.95, random_state=0)
    assert m.to_dict() == spelled.to_dict() and m.n_resamples == 1000
    other_c = probes.probe_margin(signal, noise, labels, groups=groups, C=2.0, n_resamples=1000)
    assert other_c.reference_auroc != m.reference_auroc  # C changes the scores: the first check can fail
    # linear_probe_auroc's C rarely changes a ranking: the probe it fits is checked instead
    X, y, split_groups = _split_data()
    with mock.patch.object(probes, "logistic_probe", wraps=probes.logistic_probe) as probe:
        res = probes.linear_probe_auroc(X, pd.DataFrame({"a": y}), groups=split_groups)
    assert probe.call_args.args == (1.0, 2000, 0) and (res.n_train, res.n_test) == (84, 36)


def test_probe_margin_names_the_bad_argument():
    signal, noise, labels, groups = _data()
    with pytest.raises(InputError, match=r"^X must be a 2-D array"):
        probes.probe_margin(signal[:, 0], noise, labels, groups=groups)
    with pytest.raises(InputError, match=r"^X_reference must be a 2-D array"):
        probes.probe_margin(signal, noise[:, 0], labels, groups=groups)
    with pytest.raises(InputError, match=r"^X has 240 rows and X_reference 239; they must embed the same images$"):
        probes.probe_margin(signal, noise[:-1], labels, groups=groups)
    for bad in (True, 1, 2.5, "3"):
        with pytest.raises(InputError, match=rf"^n_splits must be an integer >= 2, got {bad!r}$"):
            probes.probe_margin(signal, noise, labels, groups=groups, n_splits=bad)
    two = probes.probe_margin(signal, noise, labels, groups=groups, n_splits=2, n_resamples=50)
    assert two.learned and two.findings == ["first", "second"]
    empty = pd.DataFrame({"none": np.zeros(len(groups)), "one": np.r_[1, 1, np.zeros(len(groups) - 2)]})
    with pytest.raises(InputError, match=r"^no finding could be evaluated: none: 0 patient\(s\) of its rarer "
                                         r"class; out-of-fold scores need 2; one: 1 patient\(s\) of its rarer"):
        probes.probe_margin(signal, noise, empty, groups=groups)


def test_two_patients_of_the_rarer_class_are_enough_and_an_unscorable_finding_stops_nothing():
    signal, noise, labels, groups = _data()
    rare = np.zeros(len(groups))
    rare[[0, 1, 2, 3]] = 1  # patients p000 and p001
    frame = pd.DataFrame({"rare1": np.r_[1, 1, np.zeros(len(groups) - 2)], "rare2": rare, "first": labels["first"]})
    m = probes.probe_margin(signal, noise, frame, groups=groups, n_resamples=50)
    # the finding left out comes first: the ones after it are still scored
    assert m.findings == ["rare2", "first"] and list(m.reasons) == ["rare1"]
    # rare2's two patients are missing from some patient resamples: those are counted, not scored
    assert 0 < m.n_invalid < 50
    # the rarer class may be the negative one
    mostly = probes.probe_margin(signal, noise, frame.assign(rare1=1 - frame["rare1"]), groups=groups,
                                 n_resamples=20)
    assert mostly.reasons == {"rare1": "1 patient(s) of its rarer class; out-of-fold scores need 2"}


def test_the_folds_are_stratified_by_the_finding():
    from crslib import splits

    signal, noise, labels, groups = _data()
    with mock.patch.object(splits, "stratified_group_kfold", wraps=splits.stratified_group_kfold) as kfold:
        probes.probe_margin(signal, noise, labels[["first"]], groups=groups, n_resamples=20, random_state=3)
    y, g, n_splits, seed = kfold.call_args.args
    np.testing.assert_array_equal(y, labels["first"].to_numpy())
    np.testing.assert_array_equal(g, groups)
    assert (n_splits, seed) == (5, 3)


def test_unknown_labels_leave_their_images_out_of_that_finding():
    signal, noise, labels, groups = _data()
    unknown = labels[["first"]].astype(float)
    unknown.loc[:59, "first"] = np.nan  # patients p000-p029
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NaN is cast to an integer label on the way (a warning on the page)
        m = probes.probe_margin(signal, noise, unknown, groups=groups, n_resamples=50)
    known = slice(60, None)
    alone = probes.probe_margin(signal[known], noise[known], labels[["first"]].iloc[known], groups=groups[known],
                                n_resamples=50)
    # the same folds and fits as without those images: an unknown label is neither class
    assert m.auroc == alone.auroc and m.reference_auroc == alone.reference_auroc
    assert m.n_test == 180 and m.n_test_patients == 90


def test_the_interval_follows_confidence_and_seed():
    signal, noise, labels, groups = _data()
    wide = probes.probe_margin(signal, noise, labels, groups=groups, n_resamples=300, random_state=5)
    again = probes.probe_margin(signal, noise, labels, groups=groups, n_resamples=300, random_state=5)
    narrow = probes.probe_margin(signal, noise, labels, groups=groups, n_resamples=300, confidence=0.5,
                                 random_state=5)
    assert (again.low, again.high) == (wide.low, wide.high)
    other_seed = probes.probe_margin(signal, noise, labels, groups=groups, n_resamples=300, random_state=6)
    assert (other_seed.low, other_seed.high) != (wide.low, wide.high)
    assert narrow.confidence == 0.5 and wide.confidence == 0.95
    assert wide.low < narrow.low <= narrow.high < wide.high


# --------------------------------------------------------------------------- linear_probe_auroc


def _split_data(n_patients=40, per_patient=3, seed=0):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_patients), per_patient)
    y = rng.integers(0, 2, groups.size)
    X = np.column_stack([y + rng.normal(0, 0.5, groups.size), rng.normal(size=(groups.size, 3))])
    return X, y, groups


def test_linear_probe_auroc_refuses_bad_input_with_its_reason():
    X, y, groups = _split_data()
    labels = pd.DataFrame({"a": y})
    with pytest.raises(InputError, match=r"^X must be a 2-D array"):
        probes.linear_probe_auroc(X[:, 0], labels, groups=groups)
    with pytest.raises(InputError, match=r"^groups must have one patient id per image \(120\), got shape \(119,\)$"):
        probes.linear_probe_auroc(X, labels, groups=groups[:-1])
    for bad in (0, 1, 1.5, -0.2):
        with pytest.raises(InputError, match=rf"^test_size must be between 0 and 1, got {bad}$"):
            probes.linear_probe_auroc(X, labels, groups=groups, test_size=bad)
    with pytest.raises(InputError, match=r"^groups has a single patient; a patient-grouped split needs at least 2$"):
        probes.linear_probe_auroc(X, labels, groups=np.zeros(len(groups)))


def test_linear_probe_auroc_works_with_two_patients():
    X, y, _ = _split_data()
    groups = np.repeat([0, 1], 60)
    y = np.tile([0, 1], 60)
    res = probes.linear_probe_auroc(X, pd.DataFrame({"a": y}), groups=groups, test_size=0.5)
    assert (res.n_train, res.n_test) == (60, 60) and np.isfinite(res.auroc["a"])


def test_linear_probe_auroc_splits_by_test_size_and_seed():
    X, y, groups = _split_data()
    labels = pd.DataFrame({"a": y})
    half = probes.linear_probe_auroc(X, labels, groups=groups, test_size=0.5)
    assert (half.n_train, half.n_test) == (60, 60)
    same = [probes.linear_probe_auroc(X, labels, groups=groups, random_state=7).auroc["a"] for _ in range(2)]
    others = {probes.linear_probe_auroc(X, labels, groups=groups, random_state=s).auroc["a"] for s in range(8, 12)}
    assert same[0] == same[1] and len(others) > 1


def test_a_finding_degenerate_in_one_part_only_is_skipped_with_that_part_named(caplog):
    X, y, groups = _split_data()
    train, test = probes._probe_split(groups, 0.3, 0)
    only_train = np.zeros(len(groups))
    only_train[train[:5]] = 1  # positives in the training part only
    only_test = np.zeros(len(groups))
    only_test[test[:5]] = 1
    labels = pd.DataFrame({"a": y, "train_pos": only_train, "test_pos": only_test})
    with caplog.at_level("WARNING", logger="crslib"):
        res = probes.linear_probe_auroc(X, labels, groups=groups)
    assert res.reasons == {"train_pos": f"single class in the test split (0 positive of {test.size})",
                           "test_pos": f"single class in the training split (0 positive of {train.size})"}
    assert np.isnan(res.auroc["train_pos"]) and np.isnan(res.auroc["test_pos"]) and np.isfinite(res.auroc["a"])
    assert (f"linear_probe_auroc: finding 'test_pos' skipped: single class in the training split "
            f"(0 positive of {train.size})") in caplog.messages
    with pytest.raises(InputError, match=r"^no finding could be evaluated: train_pos: single class in the test "
                                         r"split \(0 positive of \d+\); test_pos: single class in the training"):
        probes.linear_probe_auroc(X, labels[["train_pos", "test_pos"]], groups=groups)


def test_to_frame_is_a_new_frame():
    X, y, groups = _split_data()
    res = probes.linear_probe_auroc(X, pd.DataFrame({"a": y}), groups=groups)
    frame = res.to_frame()
    frame.loc[0, "auroc"] = -1.0
    assert res.auroc["a"] > 0.5


# --------------------------------------------------------------------------- scores the heads share


def test_primary_score_is_auroc_or_r2():
    from sklearn.metrics import r2_score, roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 50)
    p = rng.random(50)
    assert probes.primary_score("classification", y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    yr, pr = rng.normal(size=50), rng.normal(size=50)
    assert probes.primary_score("regression", yr, pr) == pytest.approx(r2_score(yr, pr), abs=1e-12)
    assert probes.r2(yr, yr) == 1.0 and np.isnan(probes.r2(np.ones(4), np.arange(4.0)))
    tiny = np.array([0.0, 0.1])  # total sum of squares 0.005: still a defined R^2
    assert probes.r2(tiny, tiny) == 1.0
    # 0.1s: their computed mean is not 0.1, and the rounding noise left is not variation (it gave R^2 -5e29)
    assert np.isnan(probes.r2(np.full(7, 0.1), np.full(7, 0.2)))
    assert probes.r2(1e8 + yr, 1e8 + pr) == pytest.approx(r2_score(yr, pr), rel=1e-6)  # a large offset


def test_degenerate_reason_names_the_part_and_its_counts():
    assert probes.degenerate_reason(np.array([], dtype=int), "test") == "no labelled images in the test split"
    assert probes.degenerate_reason(np.array([1]), "test") == "single class in the test split (1 positive of 1)"
    assert probes.degenerate_reason(np.array([0, 0, 0]), "training") == \
        "single class in the training split (0 positive of 3)"
    assert probes.degenerate_reason(np.array([0, 1]), "test") is None


# --------------------------------------------------------------------------- labels and classifiers the audits share


def test_check_labels_accepts_a_series_and_refuses_what_is_not_a_label_frame():
    frame = probes.check_labels(pd.Series([0, 1, None], name="edema", index=[7, 8, 9]), 3)
    assert list(frame.columns) == ["edema"] and list(frame.index) == [0, 1, 2]
    assert frame["edema"].tolist()[:2] == [0, 1] and np.isnan(frame["edema"].iloc[2])
    with pytest.raises(InputError, match=r"^labels must be a DataFrame with one 0/1 column per finding$"):
        probes.check_labels([0, 1], 2)
    with pytest.raises(InputError, match=r"^labels has 2 rows but the embeddings have 3; they must match row by row$"):
        probes.check_labels(pd.DataFrame({"a": [0, 1]}), 3)
    with pytest.raises(InputError, match=r"^labels has no finding columns$"):
        probes.check_labels(pd.DataFrame(index=range(3)), 3)
    with pytest.raises(InputError, match=r"^label column 'a' must hold 0/1 \(or empty for unknown\), found values "
                                         r"like \[2\]$"):
        probes.check_labels(pd.DataFrame({"a": [0, 1, 2, 2]}), 4)
    # text is not coerced to a number silently: the first three such values are named
    with pytest.raises(InputError, match=r"found values like \['yes', 'no', 'maybe'\]$"):
        probes.check_labels(pd.DataFrame({"a": [1, 0, "yes", "no", "maybe", "never", None]}), 7)


def test_make_classifier_is_the_documented_audit_classifier():
    def solver(n_features):
        return probes.make_classifier("logistic", 0, n_features)[-1].solver

    assert [solver(n) for n in (0, 1, 1024, 1025)] == ["lbfgs", "newton-cholesky", "newton-cholesky", "lbfgs"]
    assert probes.make_classifier("logistic", 0)[-1].solver == "lbfgs"  # width unknown
    pipe = probes.make_classifier("logistic", 0, 8)
    assert type(pipe[0]).__name__ == "StandardScaler" and len(pipe) == 2
    params = pipe[-1].get_params()
    assert (params["C"], params["max_iter"], params["class_weight"]) == (0.1, 2000, "balanced")
    forest = probes.make_classifier("forest", 9).get_params()
    assert {k: forest[k] for k in ("n_estimators", "min_samples_leaf", "class_weight", "random_state", "n_jobs")} \
        == {"n_estimators": 200, "min_samples_leaf": 2, "class_weight": "balanced", "random_state": 9, "n_jobs": 1}
    logistic = probes.logistic_probe(2.0, 7, 3)[-1].get_params()
    assert (logistic["C"], logistic["max_iter"], logistic["random_state"]) == (2.0, 7, 3)


def test_fit_classifier_picks_the_solver_of_the_input_width_and_seeds_the_forest():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 10)), np.tile([0, 1], 30)
    assert probes.fit_classifier("logistic", X, y, 5)[-1].solver == "newton-cholesky"
    forests = [probes.fit_classifier("forest", X, y, 5).predict_proba(X) for _ in range(2)]
    other = probes.fit_classifier("forest", X, y, 6).predict_proba(X)
    np.testing.assert_array_equal(forests[0], forests[1])
    assert not np.array_equal(forests[0], other)


def test_out_of_fold_proba_scores_each_fold_with_the_model_fitted_on_the_others():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(60, 3)), rng.integers(0, 2, 60)
    folds = np.arange(60) % 3
    proba, fitted = probes.out_of_fold_proba("forest", X, y, folds, 2, 4)
    assert proba.dtype == float and not np.isnan(proba).any() and len(fitted) == 3
    for k in range(3):
        by_hand = probes.fit_classifier("forest", X[folds != k], y[folds != k], 4)
        np.testing.assert_array_equal(proba[folds == k], probes.class_proba(by_hand, X[folds == k], 2))


def test_labels_sort_numbers_by_value_before_text():
    values = [10, "b", 2.5, True, "a", np.int64(-1)]
    assert sorted(values, key=probes.label_sort_key) == [np.int64(-1), 2.5, 10, True, "a", "b"]
    assert probes.label_sort_key(True) == (1, "True") and probes.label_sort_key(3) == (0, 3.0)
    classes, codes = probes.class_codes(np.array([2, 10, 2, 10, 1], dtype=object))
    assert classes == [1, 2, 10] and codes.tolist() == [1, 2, 1, 2, 0] and codes.dtype == np.int64
    classes, codes = probes.class_codes(np.array(["b", "c", "a"], dtype=object))
    assert classes == ["a", "b", "c"] and codes.tolist() == [1, 2, 0]


def test_probe_targets_uses_linear_probe_aurocs_split_and_names_the_part_it_fails_in():
    n_patients = 40
    patients = np.repeat([f"p{i:03d}" for i in range(n_patients)], 2)
    train, test = probes._probe_split(patients, 0.3, 0)
    test_patients = sorted(set(patients[test]))
    train_patients = sorted(set(patients[train]))
    # positives only among the test patients (6 of them), or only among the training patients
    m = pd.DataFrame({
        "patient_id": patients,
        "finding_test_only": np.isin(patients, test_patients[:6]).astype(int),
        "finding_train_only": np.isin(patients, train_patients[:6]).astype(int),
        "finding_both": np.isin(patients, test_patients[:6] + train_patients[:6]).astype(int),
    })
    with mock.patch.object(probes, "_probe_split", wraps=probes._probe_split) as split:
        targets, left_out = probes.probe_targets(m)
    np.testing.assert_array_equal(split.call_args.args[0], patients)
    assert split.call_args.args[1:] == (0.3, 0)
    assert list(targets.columns) == ["finding_both"]
    prefix = "the probe's patient-grouped train/test split does not allow it: single class in the "
    assert left_out == {"finding_test_only": prefix + f"training split (0 positive of {train.size})",
                        "finding_train_only": prefix + f"test split (0 positive of {test.size})"}


def test_probe_targets_leaves_out_a_finding_that_is_not_0_1():
    n = 80
    m = pd.DataFrame({"patient_id": _patients(n), "finding_text": ["yes", "no", "no", "yes"] * (n // 4),
                      "finding_codes": [0, 2, 1, 2] * (n // 4), "finding_ok": ["0", "1", "1", "0"] * (n // 4)})
    targets, left_out = probes.probe_targets(m)
    assert list(targets.columns) == ["finding_ok"] and targets["finding_ok"].tolist()[:4] == [0.0, 1.0, 1.0, 0.0]
    assert left_out == {"finding_text": "label column 'finding_text' must hold 0/1 (or empty for unknown), found "
                                        "values like ['yes', 'no']",
                        "finding_codes": "`finding_codes` needs exactly two classes; it has 3 ('0', '1', '2')"}


def test_probe_targets_names_what_it_was_given():
    with pytest.raises(InputError, match=r"^manifest must be a DataFrame, got list$"):
        probes.probe_targets([1, 2, 3])


def test_fit_classifier_silences_convergence_warnings_only():
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(80, 5)), np.tile([0, 1], 40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LogisticRegression(max_iter=1).fit(X, y)  # this fit does warn
        assert any(issubclass(w.category, ConvergenceWarning) for w in caught)
        caught.clear()
        probes.fit_classifier(LogisticRegression(max_iter=1), X, y, 0)
    assert caught == []

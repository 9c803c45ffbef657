"""crslib.probes.probe_margin: the paired, out-of-fold probe margin of an encoder over a reference."""

from __future__ import annotations

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

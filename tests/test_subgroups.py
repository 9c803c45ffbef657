"""Known-answer tests of crslib.subgroups (its own tests under `make mutation`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from crslib import agreement as ag
from crslib import stats
from crslib import subgroups as sg
from crslib.errors import InputError

BY_SUBGROUP_COLUMNS = ["column", "level", "n", "mean", "low", "high"]
SHARES_COLUMNS = [
    "factor",
    "n_levels",
    "share_alone",
    "share_alone_low",
    "share_alone_high",
    "share_unique",
    "share_unique_low",
    "share_unique_high",
]


def _rng(seed=0):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- independent references


def _brute_overlap_per_image(Xa, Xb, k):
    """|kNN_a(i) & kNN_b(i)| / k with cosine neighbours from the full similarity matrix."""

    def knn(X):
        X = X / np.linalg.norm(X, axis=1, keepdims=True)
        S = X @ X.T
        np.fill_diagonal(S, -np.inf)
        return np.argsort(-S, axis=1, kind="stable")[:, :k]

    A, B = knn(Xa), knn(Xb)
    return np.array([len(set(a) & set(b)) / k for a, b in zip(A, B)])


def _design(meta, cols):
    """Intercept plus one-hot dummies (first level dropped) for each column, via pandas."""
    parts = [np.ones((len(meta), 1))]
    for c in cols:
        parts.append(
            pd.get_dummies(meta[c].astype(str), drop_first=True).to_numpy(float)
        )
    return np.hstack(parts)


def _weighted_r2(y, w, X):
    """R^2 of a weighted least-squares fit, from residuals (not from a Gram matrix)."""
    sw = np.sqrt(w)
    beta = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)[0]
    sse = np.sum(w * (y - X @ beta) ** 2)
    ybar = np.sum(w * y) / np.sum(w)
    sst = np.sum(w * (y - ybar) ** 2)
    if sst <= 1e-12 * np.sum(w):
        return np.nan
    return float(np.clip(1 - sse / sst, 0, 1))


def _reference_shares(y, meta, cols, w):
    full = _weighted_r2(y, w, _design(meta, cols))
    out = []
    for c in cols:
        out.append(_weighted_r2(y, w, _design(meta, [c])))
        out.append(
            full - _weighted_r2(y, w, _design(meta, [o for o in cols if o != c]))
        )
    out.append(full)
    return np.array(out)


def _reference_table(y, meta, cols, n_resamples, confidence, seed):
    """The documented estimator: shares on the data, percentile interval over count-weight bootstraps."""
    n = len(y)
    est = _reference_shares(y, meta, cols, np.ones(n))
    rng = np.random.default_rng(seed)
    samples = np.array(
        [
            _reference_shares(
                y,
                meta,
                cols,
                np.bincount(rng.integers(0, n, n), minlength=n).astype(float),
            )
            for _ in range(n_resamples)
        ]
    )
    alpha = (1 - confidence) / 2
    lo = np.nanpercentile(samples, 100 * alpha, axis=0)
    hi = np.nanpercentile(samples, 100 * (1 - alpha), axis=0)
    return est, lo, hi


def _meta(n, seed=0):
    rng = _rng(seed)
    return pd.DataFrame(
        {
            "source": rng.choice(["siteA", "siteB", "siteC"], n),
            "view": rng.choice(["PA", "AP"], n),
            "sex": rng.choice(["F", "M"], n),
        }
    )


# --------------------------------------------------------------------------- an injected subgroup effect, end to end


def _scrambled_site_pair(n=240, seed=0):
    """Model B is a rotated, slightly noisy model A, except siteB whose embeddings B scrambles."""
    rng = _rng(seed)
    meta = _meta(n, seed)
    Xa = rng.normal(size=(n, 16))
    Q, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    Xb = Xa @ Q + 0.05 * rng.normal(size=(n, 16))
    scrambled = (meta["source"] == "siteB").to_numpy()
    Xb[scrambled] = rng.normal(size=(scrambled.sum(), 16))
    return Xa, Xb, meta


def test_identical_embeddings_give_overlap_one_in_every_subgroup():
    Xa, _, meta = _scrambled_site_pair()
    per = ag.mutual_knn_overlap_per_image(Xa, Xa.copy(), k=8)
    t = sg.overlap_by_subgroup(per, meta, columns=["source", "view"], n_resamples=30)
    assert (
        (t["mean"] == 1.0).all()
        and (t["low"] == 1.0).all()
        and (t["high"] == 1.0).all()
    )
    assert t["n"].tolist() == [
        (meta.source == s).sum() for s in ("siteA", "siteB", "siteC")
    ] + [(meta.view == v).sum() for v in ("AP", "PA")]


def test_scrambled_subgroup_has_low_overlap_and_explains_the_variance():
    Xa, Xb, meta = _scrambled_site_pair()
    k = 8
    per = ag.mutual_knn_overlap_per_image(Xa, Xb, k=k)
    np.testing.assert_allclose(per, _brute_overlap_per_image(Xa, Xb, k))

    t = sg.overlap_by_subgroup(per, meta, columns=["source", "view"], n_resamples=200)
    assert list(t.columns) == BY_SUBGROUP_COLUMNS
    assert t[["column", "level"]].values.tolist() == [
        ["source", "siteA"],
        ["source", "siteB"],
        ["source", "siteC"],
        ["view", "AP"],
        ["view", "PA"],
    ]
    expected_means = [per[meta.source == s].mean() for s in ("siteA", "siteB", "siteC")]
    expected_means += [per[meta.view == v].mean() for v in ("AP", "PA")]
    np.testing.assert_allclose(t["mean"], expected_means, rtol=1e-12)
    src = t[t.column == "source"].set_index("level")
    assert src.loc["siteB", "mean"] < 0.2
    assert src.loc["siteA", "mean"] > 0.6 and src.loc["siteC", "mean"] > 0.6
    assert src.loc["siteB", "high"] < min(
        src.loc["siteA", "low"], src.loc["siteC", "low"]
    )

    v = sg.overlap_variance_shares(
        per, meta, columns=["source", "view"], n_resamples=50
    ).set_index("factor")
    assert (
        v.loc["source", "share_alone"] > 0.8 and v.loc["source", "share_unique"] > 0.8
    )
    assert (
        v.loc["view", "share_alone"] < 0.02
        and abs(v.loc["view", "share_unique"]) < 0.02
    )
    assert v.loc["(all factors)", "share_alone"] >= v.loc["source", "share_alone"]


# --------------------------------------------------------------------------- overlap_by_subgroup


def _per_and_meta(n=60, seed=3):
    rng = _rng(seed)
    meta = _meta(n, seed)
    per = rng.random(n) * 0.4 + 0.3 * (meta["view"] == "PA").to_numpy()
    return per, meta


@pytest.mark.parametrize(
    "kwargs, boot",
    [
        ({}, {"n_resamples": 1000, "confidence": 0.95, "random_state": 0}),
        (
            {"n_resamples": 40, "confidence": 0.8, "random_state": 7},
            {"n_resamples": 40, "confidence": 0.8, "random_state": 7},
        ),
    ],
    ids=["documented-defaults", "explicit-options"],
)
def test_subgroup_interval_is_the_bootstrap_of_each_level(kwargs, boot):
    per, meta = _per_and_meta()
    t = sg.overlap_by_subgroup(per, meta, columns=["view"], **kwargs)
    assert list(t.columns) == BY_SUBGROUP_COLUMNS
    for _, row in t.iterrows():
        x = per[(meta["view"] == row["level"]).to_numpy()]
        ref = stats.bootstrap_ci(np.mean, x, **boot)
        assert row["n"] == x.size and row["mean"] == pytest.approx(x.mean())
        assert (row["low"], row["high"]) == pytest.approx(
            (ref.low, ref.high), rel=1e-12
        )


def test_subgroup_defaults_are_1000_resamples_and_seed_0():
    per, meta = _per_and_meta()
    default = sg.overlap_by_subgroup(per, meta, columns="view")
    pd.testing.assert_frame_equal(
        default,
        sg.overlap_by_subgroup(
            per, meta, columns="view", n_resamples=1000, random_state=0
        ),
    )
    for other in ({"n_resamples": 1001}, {"random_state": 1}):
        changed = sg.overlap_by_subgroup(per, meta, columns="view", **other)
        assert not np.allclose(changed[["low", "high"]], default[["low", "high"]])


def test_patient_groups_give_the_grouped_bootstrap_within_each_level():
    rng = _rng(4)
    patients = np.repeat(np.arange(30), 4)
    meta = pd.DataFrame({"view": np.tile(["PA", "AP"], 60)})
    per = np.repeat(rng.random(30), 4) + 0.01 * rng.random(
        120
    )  # patients' images move together
    t = sg.overlap_by_subgroup(
        per, meta, columns="view", groups=patients, n_resamples=100
    ).set_index("level")
    plain = sg.overlap_by_subgroup(
        per, meta, columns="view", n_resamples=100
    ).set_index("level")
    for level in ("AP", "PA"):
        sel = (meta["view"] == level).to_numpy()
        ref = stats.bootstrap_ci(
            np.mean, per[sel], groups=patients[sel], n_resamples=100
        )
        assert (t.loc[level, "low"], t.loc[level, "high"]) == pytest.approx(
            (ref.low, ref.high), rel=1e-12
        )
        width, plain_width = (
            t.loc[level, "high"] - t.loc[level, "low"],
            plain.loc[level, "high"] - plain.loc[level, "low"],
        )
        assert (
            width > 1.3 * plain_width
        )  # two images per patient and level: the patient bootstrap is wider
    # a list of ids works like an array
    t_list = sg.overlap_by_subgroup(
        per, meta, columns="view", groups=patients.tolist(), n_resamples=100
    )
    pd.testing.assert_frame_equal(t_list.set_index("level"), t)


@pytest.mark.parametrize(
    "bad", [np.arange(119), np.arange(240).reshape(120, 2)], ids=["too-short", "2-D"]
)
def test_groups_of_the_wrong_shape_are_refused(bad):
    per, meta = np.linspace(0, 1, 120), pd.DataFrame({"view": ["PA", "AP"] * 60})
    shape = str(bad.shape).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(
        InputError,
        match=rf"^groups must have one label per image \(120\), got shape {shape}$",
    ):
        sg.overlap_by_subgroup(per, meta, columns="view", groups=bad)


def test_missing_values_form_a_level_named_NaN_sorted_after_numbers():
    meta = pd.DataFrame(
        {
            "n_findings": [2, 1, "10+", np.nan, 1, 2, np.nan, "10+", 1, 2],
            "view": ["PA", "AP", None, "PA", "AP", "PA", "AP", None, "PA", "PA"],
        }
    )
    per = np.array([0.2, 0.1, 0.9, 0.5, 0.1, 0.2, 0.5, 0.9, 0.1, 0.2])
    t = sg.overlap_by_subgroup(
        per, meta, columns=["n_findings", "view"], n_resamples=20
    )
    # numbers first (in order), then strings (in order); missing is the string level "NaN"
    assert t["level"].tolist() == [1, 2, "10+", "NaN", "AP", "NaN", "PA"]
    assert t["n"].tolist() == [3, 3, 2, 2, 3, 2, 5]
    np.testing.assert_allclose(t["mean"], [0.1, 0.2, 0.9, 0.5, 0.7 / 3, 0.9, 0.24])


def test_levels_sorted_regardless_of_first_appearance():
    meta = pd.DataFrame(
        {"source": ["siteC", "siteA", "siteB", "siteC", "siteA", "siteB"]}
    )
    t = sg.overlap_by_subgroup(np.arange(6.0), meta, columns="source", n_resamples=10)
    assert t["level"].tolist() == ["siteA", "siteB", "siteC"]
    assert t["mean"].tolist() == [2.5, 3.5, 1.5]


def test_numeric_levels_sort_by_value_not_as_text():
    # as text "10" < "2"; an age-decade table must read 2, 3, 10 (ints and floats together)
    meta = pd.DataFrame({"age_decade": [2, 10, 3, 10, 2.5, 3]}, dtype=object)
    t = sg.overlap_by_subgroup(np.arange(6.0), meta, columns="age_decade", n_resamples=10)
    assert t["level"].tolist() == [2, 2.5, 3, 10]
    assert t["mean"].tolist() == [0.0, 4.0, 3.5, 2.0]


def test_row_order_not_index_labels_pairs_metadata_with_overlap():
    per, meta = _per_and_meta()
    meta = meta.assign(image_id=[f"img{i}" for i in range(len(meta))])
    shuffled_index = meta.set_index(pd.Index(_rng(5).permutation(len(meta))))
    keyed = meta.set_index("image_id", drop=False)  # index named like a column
    base = sg.overlap_by_subgroup(per, meta, columns=["view", "source"], n_resamples=20)
    for m in (shuffled_index, keyed):
        pd.testing.assert_frame_equal(
            sg.overlap_by_subgroup(per, m, columns=["view", "source"], n_resamples=20),
            base,
        )
    shares = sg.overlap_variance_shares(
        per, keyed, columns=["view", "source"], n_resamples=10
    )
    pd.testing.assert_frame_equal(
        shares,
        sg.overlap_variance_shares(
            per, meta, columns=["view", "source"], n_resamples=10
        ),
    )


def test_no_images_give_an_empty_table_with_the_documented_columns():
    t = sg.overlap_by_subgroup(np.array([]), pd.DataFrame({"view": []}), columns="view")
    assert t.empty and list(t.columns) == BY_SUBGROUP_COLUMNS


def test_a_single_column_name_equals_a_one_item_list():
    per, meta = _per_and_meta()
    pd.testing.assert_frame_equal(
        sg.overlap_by_subgroup(per, meta, columns="source", n_resamples=20),
        sg.overlap_by_subgroup(per, meta, columns=["source"], n_resamples=20),
    )
    pd.testing.assert_frame_equal(
        sg.overlap_variance_shares(per, meta, columns="source", n_resamples=10),
        sg.overlap_variance_shares(per, meta, columns=["source"], n_resamples=10),
    )


@pytest.mark.parametrize("func", [sg.overlap_by_subgroup, sg.overlap_variance_shares])
@pytest.mark.parametrize(
    "metadata, columns, message",
    [
        (
            {"view": ["PA"] * 6},
            "view",
            "metadata must be a pandas DataFrame with one row per image",
        ),
        (
            pd.DataFrame({"view": ["PA"] * 5}),
            "view",
            r"metadata has 5 rows but per_image has 6; they must match row by row",
        ),
        (
            pd.DataFrame({"view": ["PA"] * 6}),
            [],
            r"columns is empty; name at least one metadata column \(e\.g\. 'source'\)",
        ),
        (
            pd.DataFrame({"view": ["PA"] * 6}),
            ["view", "sex"],
            r"metadata has no column\(s\) \['sex'\]; available: \['view'\]",
        ),
    ],
    ids=["not-a-frame", "row-count", "no-columns", "unknown-column"],
)
def test_bad_metadata_messages(func, metadata, columns, message):
    with pytest.raises(InputError, match=f"^{message}$"):  # the whole message
        func(np.linspace(0, 1, 6), metadata, columns=columns)


# --------------------------------------------------------------------------- overlap_variance_shares


def _shares_data(n=60, seed=8):
    """Overlap driven by a 3-level source and a weaker, confounded view; sex unrelated."""
    rng = _rng(seed)
    meta = _meta(n, seed)
    meta.loc[meta.source == "siteC", "view"] = "AP"  # confounding: siteC only uses AP
    effect = meta["source"].map({"siteA": 0.1, "siteB": 0.3, "siteC": 0.2}).to_numpy()
    per = effect + 0.05 * (meta["view"] == "PA").to_numpy() + 0.03 * rng.normal(size=n)
    return per, meta


@pytest.mark.parametrize(
    "kwargs, n_resamples, confidence, seed",
    [
        ({}, 200, 0.95, 0),
        ({"n_resamples": 30, "confidence": 0.8, "random_state": 3}, 30, 0.8, 3),
    ],
    ids=["documented-defaults", "explicit-options"],
)
def test_variance_shares_match_a_weighted_least_squares_reference(
    kwargs, n_resamples, confidence, seed
):
    per, meta = _shares_data()
    cols = ["source", "view", "sex"]
    t = sg.overlap_variance_shares(per, meta, columns=cols, **kwargs)
    assert list(t.columns) == SHARES_COLUMNS
    assert t["factor"].tolist() == cols + ["(all factors)"]
    assert t["n_levels"].tolist() == [
        3,
        2,
        2,
        1 + 2 + 1 + 1,
    ]  # the last is the joint design's column count
    est, lo, hi = _reference_table(per, meta, cols, n_resamples, confidence, seed)
    alone, unique = t.iloc[:3], t.iloc[:3]
    np.testing.assert_allclose(alone["share_alone"], est[0:6:2], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(
        unique["share_unique"], est[1:6:2], rtol=1e-8, atol=1e-10
    )
    np.testing.assert_allclose(
        alone["share_alone_low"], lo[0:6:2], rtol=1e-8, atol=1e-10
    )
    np.testing.assert_allclose(
        alone["share_alone_high"], hi[0:6:2], rtol=1e-8, atol=1e-10
    )
    np.testing.assert_allclose(
        unique["share_unique_low"], lo[1:6:2], rtol=1e-8, atol=1e-10
    )
    np.testing.assert_allclose(
        unique["share_unique_high"], hi[1:6:2], rtol=1e-8, atol=1e-10
    )
    last = t.iloc[-1]
    assert (
        last["share_alone"],
        last["share_alone_low"],
        last["share_alone_high"],
    ) == pytest.approx((est[-1], lo[-1], hi[-1]), rel=1e-8)
    assert last[["share_unique", "share_unique_low", "share_unique_high"]].isna().all()
    # the known structure: source dominates, sex explains nothing, view's share shrinks once source is in
    s = t.set_index("factor")
    assert s.loc["source", "share_alone"] > 0.6 and s.loc["sex", "share_alone"] < 0.1
    assert s.loc["view", "share_unique"] < s.loc["view", "share_alone"]
    assert (t["share_alone_low"] <= t["share_alone"]).all() and (
        t["share_alone"] <= t["share_alone_high"]
    ).all()


def test_variance_share_defaults_are_200_resamples_and_seed_0():
    per, meta = _shares_data()
    default = sg.overlap_variance_shares(per, meta, columns=["source", "view"])
    pd.testing.assert_frame_equal(
        default,
        sg.overlap_variance_shares(
            per, meta, columns=["source", "view"], n_resamples=200, random_state=0
        ),
    )
    bounds = [
        "share_alone_low",
        "share_alone_high",
        "share_unique_low",
        "share_unique_high",
    ]
    for other in ({"n_resamples": 201}, {"random_state": 1}):
        changed = sg.overlap_variance_shares(
            per, meta, columns=["source", "view"], **other
        )
        assert not np.allclose(changed[bounds].iloc[:2], default[bounds].iloc[:2])


def test_second_factor_with_three_levels_is_credited():
    """A factor after another in `columns`, with three levels each of its own mean."""
    rng = _rng(9)
    n = 90
    meta = pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], n),
            "source": np.repeat(["siteA", "siteB", "siteC"], 30),
        }
    )
    per = meta["source"].map(
        {"siteA": 0.1, "siteB": 0.5, "siteC": 0.3}
    ).to_numpy() + 0.01 * rng.normal(size=n)
    t = sg.overlap_variance_shares(
        per, meta, columns=["sex", "source"], n_resamples=20
    ).set_index("factor")
    between = sum(
        30 * (per[meta.source == s].mean() - per.mean()) ** 2
        for s in ("siteA", "siteB", "siteC")
    )
    eta2 = between / np.sum((per - per.mean()) ** 2)
    assert (
        t.loc["source", "share_alone"] == pytest.approx(eta2, rel=1e-9) and eta2 > 0.99
    )
    assert t.loc["source", "share_unique"] > 0.98
    assert t.loc["sex", "share_alone"] < 0.02
    assert t.loc["source", "n_levels"] == 3 and t.loc["(all factors)", "n_levels"] == 4


def test_missing_values_are_a_level_of_their_own_in_the_shares():
    rng = _rng(10)
    n = 60
    view = np.array(["PA", "AP", None] * 20, dtype=object)
    per = np.select([view == "PA", view == "AP"], [0.2, 0.2], 0.6) + 0.01 * rng.normal(
        size=n
    )
    t = sg.overlap_variance_shares(
        per, pd.DataFrame({"view": view}), columns="view", n_resamples=10
    )
    assert t.loc[0, "n_levels"] == 3
    assert (
        t.loc[0, "share_alone"] > 0.99
    )  # only with the missing level separated from PA and AP


def test_a_factor_that_fixes_the_overlap_explains_exactly_all_of_it():
    rng = _rng(2)
    levels = rng.integers(0, 3, 30)
    per = rng.random(3)[
        levels
    ]  # overlap is a function of the level: R^2 is 1 up to rounding
    t = sg.overlap_variance_shares(
        per, pd.DataFrame({"f": levels}), columns="f", n_resamples=20
    )
    assert t.loc[0, "share_alone"] == 1.0 and t.loc[0, "share_alone_high"] == 1.0
    assert t.loc[1, "share_alone"] == 1.0 and t.loc[1, "share_alone_high"] == 1.0


def test_binary_overlap_at_k_1_is_accepted():
    """At k=1 the per-image overlap is 0 or 1: a range of exactly 1 is not 'constant'."""
    rng = _rng(11)
    meta = pd.DataFrame({"view": np.repeat(["AP", "PA"], 20)})
    per = np.r_[rng.random(20) < 0.2, rng.random(20) < 0.8].astype(float)
    t = sg.overlap_variance_shares(per, meta, columns="view", n_resamples=10)
    p_ap, p_pa = per[:20].mean(), per[20:].mean()
    eta2 = (
        20
        * ((p_ap - per.mean()) ** 2 + (p_pa - per.mean()) ** 2)
        / np.sum((per - per.mean()) ** 2)
    )
    assert t.loc[0, "share_alone"] == pytest.approx(eta2, rel=1e-9)


@pytest.mark.parametrize(
    "per, kwargs, message",
    [
        (
            np.full(6, 0.3),
            {},
            "per_image overlap is constant: there is no variance to explain",
        ),
        (
            np.linspace(0, 1, 6),
            {"n_resamples": 0},
            "n_resamples must be an integer >= 1, got 0",
        ),
        (
            np.linspace(0, 1, 6),
            {"confidence": 1.5},
            r"confidence must be between 0 and 1 \(e\.g\. 0\.95\), got 1\.5",
        ),
    ],
    ids=["constant", "no-resamples", "bad-confidence"],
)
def test_variance_share_input_errors(per, kwargs, message):
    meta = pd.DataFrame({"view": ["PA", "AP"] * 3})
    with pytest.raises(InputError, match=f"^{message}$"):  # the whole message
        sg.overlap_variance_shares(per, meta, columns="view", **kwargs)


def _duplicated_patients(copies=3):
    """Each of 60 patients contributes `copies` identical images (same overlap, same metadata)."""
    per, meta = _shares_data()
    patients = np.array([f"p{i:03d}" for i in range(len(per))])  # sorted: group codes follow row order
    return per, meta, np.repeat(per, copies), meta.loc[meta.index.repeat(copies)], np.repeat(patients, copies)


def test_variance_shares_with_groups_resample_whole_patients():
    per, meta, per_rep, meta_rep, patients = _duplicated_patients()
    cols = ["source", "view", "sex"]
    single = sg.overlap_variance_shares(per, meta, columns=cols, n_resamples=80, random_state=4)
    grouped = sg.overlap_variance_shares(per_rep, meta_rep, columns=cols, groups=patients, n_resamples=80,
                                         random_state=4)
    # a drawn patient brings all 3 copies: the weights are 3x one image's and R^2 ignores the scale, so a
    # bootstrap that never splits a patient equals the image bootstrap of one copy per patient
    pd.testing.assert_frame_equal(grouped, single, rtol=1e-9, atol=1e-12)


def test_variance_share_intervals_over_images_are_too_narrow_for_clustered_data():
    _, _, per_rep, meta_rep, patients = _duplicated_patients()
    kwargs = {"columns": ["source", "view", "sex"], "n_resamples": 400, "random_state": 5}
    images = sg.overlap_variance_shares(per_rep, meta_rep, **kwargs).iloc[:3]
    grouped = sg.overlap_variance_shares(per_rep, meta_rep, groups=patients, **kwargs).iloc[:3]
    width = grouped["share_alone_high"] - grouped["share_alone_low"]
    image_width = images["share_alone_high"] - images["share_alone_low"]
    # 3 copies per patient: the image bootstrap sees 3x the information, its interval is ~sqrt(3) too narrow
    ratio = (width / image_width).to_numpy()
    assert np.all((ratio > 1.35) & (ratio < 2.2)), ratio


def test_variance_share_groups_need_one_label_per_image():
    per, meta = _shares_data()
    with pytest.raises(InputError, match=r"^groups must have one label per image \(60\), got shape \(59,\)$"):
        sg.overlap_variance_shares(per, meta, columns="view", groups=np.arange(59), n_resamples=5)


# --------------------------------------------------------------------------- design matrix and R^2 helpers


def test_one_hot_blocks_code_sorted_levels_with_missing_as_NaN():
    meta = pd.DataFrame(
        {
            "site": [
                "NY",
                "CA",
                None,
                "OH",
                "CA",
                "NY",
            ],  # first seen: NY; sorted: CA, NY, NaN, OH
            "view": ["PA", "PA", "AP", "AP", "PA", "AP"],
            "scanner": ["x"] * 6,  # one level: no dummy
        }
    )
    D, blocks = sg._one_hot_blocks(meta, ["site", "scanner", "view"])
    expected = np.array(
        # 1  NY NaN OH  PA
        [
            [1, 1, 0, 0, 1],
            [1, 0, 0, 0, 1],
            [1, 0, 1, 0, 0],
            [1, 0, 0, 1, 0],
            [1, 0, 0, 0, 1],
            [1, 1, 0, 0, 0],
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(D, expected)
    assert {c: b.tolist() for c, b in blocks.items()} == {
        "site": [1, 2, 3],
        "scanner": [],
        "view": [4],
    }


def _gram(D, y, w):
    Dw = D * w[:, None]
    return Dw.T @ D, Dw.T @ y, float(w @ (y * y)), float(w @ y), float(w.sum())


def test_r2_from_gram_equals_weighted_least_squares():
    rng = _rng(12)
    meta = pd.DataFrame(
        {"a": rng.choice(list("xyz"), 40), "b": rng.choice(list("uv"), 40)}
    )
    y = (
        0.05 * rng.normal(size=40) + (meta.a == "y").to_numpy() * 0.04
    )  # small total variance (SS < 1)
    D, blocks = sg._one_hot_blocks(meta, ["a", "b"])
    for w in (np.ones(40), rng.integers(0, 3, 40).astype(float)):
        G, gy, yy, ys, ws = _gram(D, y, w)
        assert yy - ys**2 / ws < 1
        for cols in (
            np.arange(D.shape[1]),
            np.r_[0, blocks["a"]],
            np.r_[0, blocks["b"]],
        ):
            assert sg._r2_from_gram(G, gy, yy, ys, ws, cols) == pytest.approx(
                _weighted_r2(y, w, D[:, cols]), rel=1e-9, abs=1e-12
            )


def test_r2_from_gram_is_nan_without_variance():
    D, _ = sg._one_hot_blocks(pd.DataFrame({"a": list("xyxy")}), ["a"])
    G, gy, yy, ys, ws = _gram(D, np.full(4, 0.25), np.ones(4))
    assert yy - ys**2 / ws == 0.0
    assert np.isnan(sg._r2_from_gram(G, gy, yy, ys, ws, np.arange(2)))


def test_r2_from_gram_is_clipped_at_zero_for_a_fit_worse_than_the_mean():
    D = np.c_[np.ones(4), [0, 0, 1, 1]]
    y = np.array([1.0, 1.0, 0.0, 0.0])
    G, gy, yy, ys, ws = _gram(D, y, np.ones(4))
    # the dummy alone, without intercept, predicts 0 for every row: worse than the mean
    assert 1 - np.sum(y**2) / np.sum((y - y.mean()) ** 2) < 0
    assert sg._r2_from_gram(G, gy, yy, ys, ws, np.array([1])) == 0.0
    assert sg._r2_from_gram(G, gy, yy, ys, ws, np.array([0, 1])) == pytest.approx(1.0)

"""The decision rules of the claims ledger (:mod:`crslib.claims`), one function per claim.

Each rule reads a run's result tables through :class:`Tables`, applies a rule
fixed here before any run, and returns an :class:`Outcome` whose reason is a
sentence built from the run's numbers. A rule that lacks what it needs raises
:class:`NotEvaluated` with the reason; the ledger turns that into a
``not evaluated`` verdict. The papers' numbers come from :mod:`crslib.paper`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib import paper
from crslib.data import is_phantom_spec, phantom_parameters
from crslib.protocol import calibration_excess, transfer_gaps
from crslib.stats import bootstrap_ci

#: Columns of a chapter's ``measures.csv``: quantities a notebook computed that no other table holds as numbers.
MEASURE_COLUMNS = ["quantity", "value", "low", "high", "detail"]
#: Bound of the "moves a number" rules: smaller changes are within what a small test set's noise gives.
MEANINGFUL_CHANGE = 0.02
#: Equivalence margin of the "at chance" rules (two one-sided tests): the whole 95% interval within
#: chance +- this margin shows a classifier at chance; an interval that merely includes chance shows nothing.
EQUIVALENCE_MARGIN = 0.05
#: A fine-tuned backbone whose test AUROC is below this (chance plus the equivalence margin) did not learn;
#: a comparison of frozen and fine-tuned backbones that rests on it is not evaluated.
FAILED_FIT_AUROC = 0.5 + EQUIVALENCE_MARGIN
#: Largest shortfall, in the task's score, of the validation-selected candidate from the best candidate on
#: test for the selection to count as doing well.
SELECTION_REGRET = 0.05
#: An AUC at or above this leaves no room above it: a claim that a subgroup's AUC is higher is then untestable.
AUC_CEILING = 0.99
SSL_OBJECTIVES = ("contrastive", "self_distillation", "masked_image_modelling")
_SMALL_RUN = ("this run is small: phantom or user images in the hundreds, small CNNs trained for minutes, "
              "where the study used tens of thousands of real images and large pretrained models.")


class NotEvaluated(Exception):
    """A rule lacks what it needs; the message is the reason."""


@dataclass(frozen=True)
class Outcome:
    """What a rule found: the run's number, its interval, the verdict and the reason.

    ``interval_kind`` says what the interval is: ``"95% CI"`` (a bootstrap
    interval) or a range over several models or pairs (``"range over model pairs"``).
    """

    value: float | None
    interval: tuple[float, float] | None
    verdict: str
    reason: str
    interval_kind: str = "95% CI"


#: What each claim's "this run" number is, with its unit: the ledger prints it before the number.
STATISTICS: dict[str, str] = {
    "public-pair-low": "mean overlap@10 of the public pair",
    "public-pair-above-chance": "mean overlap@10 of the public pair",
    "random-init-below-public": "overlap@10 of a random-init network with its trained counterpart",
    "other-modalities-higher": "",
    "source-view-over-findings": "largest source or view share of the per-image overlap's variance",
    "no-accuracy-association": "Mantel r (agreement vs probe-AUROC difference)",
    "transfer-retention": "mean share of the AUROC kept",
    "supervised-converge-least": "mean overlap@10 of label-supervised seed pairs",
    "ssl-converge-more": "mean overlap@10 of self-supervised seed pairs",
    "objective-drives-convergence": "spread of the mean seed-pair overlap@10 between objectives",
    "backbone-below-policy": "mean |AUROC change| between backbones",
    "policy-moves-auroc": "mean |AUROC change|, frozen vs fine-tuned",
    "threshold-moves-balanced-accuracy": "mean |balanced-accuracy change| between threshold rules",
    "partition-auc-above-chance": "partition AUC",
    "partition-auc-normal-higher": "partition AUC among normal images",
    "shortcut-pool-high": "file-property balanced accuracy in the pool",
    "shortcut-test-chance": "file-property balanced accuracy on test",
    "threshold-transfer-imperfect": "mean |test - validation| balanced accuracy",
    "calibration-transfer-imperfect": "mean excess of test ECE after calibration over a calibrated model's",
    "encoder-changes-results": "widest test-score gap between encoders",
    "no-encoder-best-everywhere": "encoders best in some task",
    "validation-selects-well": "largest shortfall of the selected candidate from the best on test",
    "partitions-reveal-instability": "tasks whose choice of encoder or combination changes between partitions",
}


#: The phantom parameter that builds each planted effect into the data (every other claim's effect, where the
#: run shows one, emerged from the models and the analysis; the phantom's split shift touches both classes
#: alike, so it plants no difference between normal and abnormal images).
PLANTED: dict[str, str] = {
    "partition-auc-above-chance": "shift",
    "shortcut-pool-high": "shortcut",
    "shortcut-test-chance": "shortcut",
}


def effect_origin(claim_id: str, data: str) -> str:
    """Whether a claim's effect was planted in the data the chapter studied: ``"planted (shift=0.5)"``,
    ``"not planted (shift=0)"``, ``"emerged"``, ``"your data"``, or "" when ``data`` is unknown.

    Examples
    --------
    >>> effect_origin("shortcut-pool-high", "phantom?shortcut=0.9"), effect_origin("public-pair-low", "/d")
    ('planted (shortcut=0.9)', 'your data')
    """
    if not data:
        return ""
    if not is_phantom_spec(data):
        return "your data"
    key = PLANTED.get(claim_id)
    if key is None:
        return "emerged"
    value = phantom_parameters(data)[key]
    return f"planted ({key}={value:g})" if value > 0 else f"not planted ({key}=0)"


class Tables:
    """Reads a run's result tables; a missing or malformed table becomes a *not evaluated* reason.

    ``data_index`` picks which of a chapter's data sets the rules read where a table holds several
    (chapter 05: the studied data first, then its null-phantom control).
    """

    def __init__(self, results: Path, *, data_index: int = 0) -> None:
        self.results = results
        self.data_index = data_index
        self._cache: dict[tuple[str, str], pd.DataFrame] = {}

    def csv(self, chapter: str, name: str, *, columns: tuple[str, ...] = ()) -> pd.DataFrame:
        """The table ``results/<chapter>/<name>``, with the columns a rule needs."""
        key = (chapter, name)
        if key not in self._cache:
            path = self.results / chapter / name
            if not path.is_file():
                raise NotEvaluated(f"the run has no {chapter}/{name} (chapter {chapter[:2]} did not write it)")
            try:
                self._cache[key] = pd.read_csv(path)
            except (ValueError, OSError) as exc:
                raise NotEvaluated(f"{chapter}/{name} could not be read ({exc})") from None
        frame = self._cache[key]
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise NotEvaluated(f"{chapter}/{name} has no column {', '.join(missing)}")
        return frame

    def measure(self, chapter: str, quantity: str) -> tuple[float, float, float]:
        """(value, low, high) of one quantity of a chapter's ``measures.csv``."""
        frame = self.csv(chapter, "measures.csv", columns=tuple(MEASURE_COLUMNS))
        rows = frame[frame["quantity"] == quantity]
        value = pd.to_numeric(rows["value"], errors="coerce")
        if rows.empty or not np.isfinite(value.iloc[0]):
            detail = rows["detail"].iloc[0] if len(rows) and isinstance(rows["detail"].iloc[0], str) else ""
            raise NotEvaluated(f"this run did not measure the {quantity.replace('_', ' ')}"
                               + (f": {detail}" if detail else ""))
        row = rows.iloc[0]
        return float(row["value"]), float(row["low"]), float(row["high"])


def _f(x: float) -> str:
    return f"{x:.3f}"


def _against(value: float, low: float, high: float, bound: float, *, above: str, below: str,
             held_if_above: bool = True, below_verdict: str | None = None) -> Outcome:
    """A bound rule: the interval clears the bound, falls short of it, or straddles it."""
    where = f"This run: {_f(value)} (95% interval {_f(low)} to {_f(high)})"
    if low > bound:
        verdict, text = ("held" if held_if_above else "not held"), f"{where}, {above} {_f(bound)}."
    elif high < bound:
        verdict = below_verdict or ("reversed" if held_if_above else "held")
        text = f"{where}, {below} {_f(bound)}."
    elif value != bound and (value < bound) == held_if_above:
        # a directional claim whose estimate points the other way is not held, whatever the interval
        verdict = "not held"
        text = (f"{where}: the estimate lies on the other side of {_f(bound)} from the claim (the interval "
                "includes it).")
    else:
        verdict, text = "inconclusive", f"{where}: the interval includes {_f(bound)}."
    return Outcome(value, (low, high), verdict, text)


def _mean_interval(values: Any, *, n_resamples: int = 2000) -> tuple[float, float, float]:
    """Mean and 95% bootstrap interval over rows (fixed seed: the ledger is a pure function of the tables)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size < 2:
        raise NotEvaluated("fewer than two rows to average")
    result = bootstrap_ci(np.mean, values, n_resamples=n_resamples, random_state=0)
    return float(values.mean()), float(result.low), float(result.high)


# ---------------------------------------------------------------- CRS-Bench (chapters 02 and 03)

def public_pair_low(t: Tables) -> Outcome:
    value, low, high = t.measure("02_agreement", "public_pair_overlap")
    return _against(value, low, high, 0.5, above="at or above half of the 10 neighbours, above",
                    below="below", held_if_above=False)


def public_pair_above_chance(t: Tables) -> Outcome:
    value, low, high = t.measure("02_agreement", "public_pair_overlap")
    chance = t.measure("02_agreement", "chance")[0]
    return _against(value, low, high, chance, above="above chance =", below="below chance =",
                    below_verdict="not held")


def random_init_below_public(t: Tables) -> Outcome:
    random_value = t.measure("02_agreement", "random_init_overlap")[0]
    value, low, high = t.measure("02_agreement", "public_pair_overlap")
    where = (f"A random-init network shares {_f(random_value)} with its trained counterpart; the public pair "
             f"shares {_f(value)} (95% interval {_f(low)} to {_f(high)})")
    if random_value < low:
        return Outcome(random_value, None, "held", f"{where}: below the whole interval.")
    if random_value > high:
        return Outcome(random_value, None, "reversed", f"{where}: above the whole interval.")
    return Outcome(random_value, None, "inconclusive", f"{where}: inside the interval.")


def other_modalities(t: Tables) -> Outcome:
    raise NotEvaluated("a run studies one image collection; the claim compares five imaging modalities")


def source_view_over_findings(t: Tables) -> Outcome:
    shares = t.csv("02_agreement", "variance_shares.csv",
                   columns=("factor", "share_alone", "share_alone_low", "share_alone_high"))
    acquisition = shares[shares["factor"].isin(["source", "view"])]
    findings = shares[shares["factor"].astype(str).str.startswith("finding_")]
    if acquisition.empty or findings.empty:
        raise NotEvaluated("the data need a source or view column and at least one finding column")
    a = acquisition.loc[acquisition["share_alone"].idxmax()]
    f = findings.loc[findings["share_alone"].idxmax()]
    where = (f"The largest acquisition share is {a['factor']} {_f(a['share_alone'])} (95% interval "
             f"{_f(a['share_alone_low'])} to {_f(a['share_alone_high'])}); the largest finding share is "
             f"{f['factor'].removeprefix('finding_')} {_f(f['share_alone'])} (95% interval "
             f"{_f(f['share_alone_low'])} to {_f(f['share_alone_high'])})")
    interval = (float(a["share_alone_low"]), float(a["share_alone_high"]))
    if a["share_alone_low"] > f["share_alone_high"]:
        return Outcome(float(a["share_alone"]), interval, "held", f"{where}: the intervals do not overlap.")
    if f["share_alone_low"] > a["share_alone_high"]:
        return Outcome(float(a["share_alone"]), interval, "reversed",
                       f"{where}: a finding explains more, beyond both intervals.")
    return Outcome(float(a["share_alone"]), interval, "inconclusive", f"{where}: the intervals overlap.")


def no_accuracy_association(t: Tables) -> Outcome:
    table = t.csv("02_agreement", "accuracy_association.csv")
    values = dict(zip(table.iloc[:, 0].astype(str), pd.to_numeric(table.iloc[:, 1], errors="coerce")))
    r, p = values.get("mantel_r", np.nan), values.get("mantel_p", np.nan)
    if not (np.isfinite(r) and np.isfinite(p)):
        raise NotEvaluated("the Mantel test was not computed (it needs at least three models with probe AUROCs)")
    where = f"Mantel r = {r:+.3f}, permutation p = {p:.3f}"
    if p >= 0.05:
        return Outcome(float(r), None, "held", f"{where}: no significant association at the 5% level.")
    return Outcome(float(r), None, "not held", f"{where}: agreement and accuracy are associated in this run.")


def transfer_retention(t: Tables) -> Outcome:
    table = t.csv("03_transfer", "retention_summary.csv", columns=("new_model", "mean_retention"))
    retention = pd.to_numeric(table["mean_retention"], errors="coerce").dropna()
    if retention.empty:
        raise NotEvaluated("no classifier was transferred")
    low, high = float(retention.min()), float(retention.max())
    where = (f"Mean retention {_f(retention.mean())} over {len(retention)} model pair(s), range "
             f"{_f(low)} to {_f(high)}")
    verdict = "held" if low >= 0.95 else "not held" if high < 0.95 else "inconclusive"
    text = {"held": "every pair keeps at least 0.950", "not held": "no pair keeps 0.950",
            "inconclusive": "some pairs keep 0.950 and some do not"}[verdict]
    return Outcome(float(retention.mean()), (low, high), verdict, f"{where}: {text}.",
                   interval_kind=f"range over {len(retention)} model pairs")


def _within_objective(t: Tables) -> pd.DataFrame:
    table = t.csv("02_agreement", "convergence.csv",
                  columns=("architecture", "objective", "within_mean", "within_min", "within_max", "n_within"))
    seeded = table[(table["n_within"] > 0) & (table["objective"] != "(all)") & (table["objective"] != "random_init")]
    # an objective whose models did not clear their initial weights on the probe is no evidence about it
    n_flagged = seeded["n_flagged"] if "n_flagged" in seeded.columns else pd.Series(0, index=seeded.index)
    flagged = seeded[pd.to_numeric(n_flagged, errors="coerce").fillna(0) > 0]
    seeded = seeded.drop(index=flagged.index)
    if seeded.empty:
        raise NotEvaluated("no objective has two seeds in this run's zoo" if flagged.empty else
                           "every objective with two seeds has models that did not learn beyond their initial "
                           "weights (" + ", ".join(sorted(set(flagged["objective"]))) + ")")
    # one architecture: the one with the most objectives that have seed pairs
    arch = seeded.groupby("architecture")["objective"].count().idxmax()
    within = seeded[seeded["architecture"] == arch].set_index("objective")
    within.attrs["flagged"] = sorted(set(flagged.loc[flagged["architecture"] == arch, "objective"]))
    return within


def _flagged_note(within: pd.DataFrame) -> str:
    left = within.attrs.get("flagged") or []
    return (" (left out: " + ", ".join(o.replace("_", " ") for o in left)
            + ", whose models did not clear their initial weights)") if left else ""


def supervised_converge_least(t: Tables) -> Outcome:
    within = _within_objective(t)
    if "supervised_multilabel" not in within.index or len(within) < 2:
        raise NotEvaluated("needs at least two label-supervised seeds and one other objective with two seeds"
                           + _flagged_note(within))
    sup = float(within.loc["supervised_multilabel", "within_mean"])
    others = within.drop("supervised_multilabel")["within_mean"]
    where = (f"Label-supervised seed pairs share {_f(sup)}; other objectives' seed pairs "
             + ", ".join(f"{k.replace('_', ' ')} {_f(v)}" for k, v in others.items()) + _flagged_note(within))
    if sup < others.min():
        return Outcome(sup, None, "held", f"{where}: the supervised pairs agree least.")
    if sup > others.max():
        return Outcome(sup, None, "reversed", f"{where}: the supervised pairs agree most.")
    return Outcome(sup, None, "not held", f"{where}: the supervised pairs are not the lowest.")


def ssl_converge_more(t: Tables) -> Outcome:
    within = _within_objective(t)
    ssl = within[within.index.isin(SSL_OBJECTIVES)]
    if "supervised_multilabel" not in within.index or ssl.empty:
        raise NotEvaluated("needs two seeds of a label-supervised and of a self-supervised objective"
                           + _flagged_note(within))
    sup = within.loc["supervised_multilabel"]
    low, high = float(ssl["within_min"].min()), float(ssl["within_max"].max())
    where = (f"Self-supervised seed pairs share {_f(low)} to {_f(high)}; label-supervised pairs "
             f"{_f(sup['within_min'])} to {_f(sup['within_max'])}{_flagged_note(within)}")
    kind = "range over seed pairs"
    if low > sup["within_max"]:
        return Outcome(float(ssl["within_mean"].mean()), (low, high), "held", f"{where}: no overlap, SSL higher.",
                       kind)
    if high < sup["within_min"]:
        return Outcome(float(ssl["within_mean"].mean()), (low, high), "reversed",
                       f"{where}: no overlap, supervised higher.", kind)
    return Outcome(float(ssl["within_mean"].mean()), (low, high), "inconclusive", f"{where}: the ranges overlap.",
                   kind)


def objective_drives_convergence(t: Tables) -> Outcome:
    within = _within_objective(t)
    if len(within) < 2:
        raise NotEvaluated("needs two objectives with at least two seeds each" + _flagged_note(within))
    spread = float(within["within_mean"].max() - within["within_mean"].min())
    seed_range = float((within["within_max"] - within["within_min"]).max())
    where = (f"Mean seed-pair agreement differs by {_f(spread)} between objectives; within one objective seed "
             f"pairs differ by up to {_f(seed_range)}{_flagged_note(within)}")
    if spread > seed_range:
        return Outcome(spread, None, "held", f"{where}: the objective moves agreement more than the seed.")
    return Outcome(spread, None, "not held", f"{where}: the seed moves agreement as much as the objective.")


# ---------------------------------------------------------------- Kermany protocol study (chapters 04 and 05)

def _effects(t: Tables) -> pd.DataFrame:
    table = t.csv("04_protocol_sensitivity", "effect_summary.csv", columns=("factor", "mean_abs_change"))
    return table.set_index("factor")


def _fine_tuning_learned(t: Tables) -> None:
    """Raise :class:`NotEvaluated` when a fine-tuned backbone's test AUROC is at chance or below."""
    table = t.csv("04_protocol_sensitivity", "delong_frozen_vs_finetuned.csv", columns=("backbone",))
    if "AUROC fine-tuned" not in table.columns:
        return
    auroc = pd.to_numeric(table["AUROC fine-tuned"], errors="coerce")
    failed = table[auroc < FAILED_FIT_AUROC]
    if len(failed):
        listed = ", ".join(f"{b} {_f(a)}" for b, a in zip(failed["backbone"], auroc[failed.index]))
        raise NotEvaluated(f"the fine-tuning did not learn for {len(failed)} of {len(table)} backbone(s) (test "
                           f"AUROC below {_f(FAILED_FIT_AUROC)}: {listed}), so frozen vs fine-tuned compares a "
                           "failed training")


def backbone_below_policy(t: Tables) -> Outcome:
    effects = _effects(t)
    _fine_tuning_learned(t)
    if not {"backbone", "policy"} <= set(effects.index):
        raise NotEvaluated("needs at least two backbones and both the frozen and fine-tuned policies")
    backbone = float(effects.loc["backbone", "mean_abs_change"])
    policy = float(effects.loc["policy", "mean_abs_change"])
    where = f"Changing the backbone moves AUROC by {_f(backbone)} on average, frozen vs fine-tuned by {_f(policy)}"
    if backbone < policy:
        return Outcome(backbone, None, "held", f"{where}: the backbone matters less.")
    return Outcome(backbone, None, "reversed", f"{where}: the backbone matters more.")


def policy_moves_auroc(t: Tables) -> Outcome:
    table = t.csv("04_protocol_sensitivity", "delong_frozen_vs_finetuned.csv", columns=("backbone", "p (DeLong)"))
    p = pd.to_numeric(table["p (DeLong)"], errors="coerce").dropna()
    if p.empty:
        raise NotEvaluated("no backbone was both frozen and fine-tuned")
    _fine_tuning_learned(t)
    significant = int((p < 0.05).sum())
    effect = float(_effects(t).loc["policy", "mean_abs_change"]) if "policy" in _effects(t).index else np.nan
    where = (f"Frozen vs fine-tuned changes AUROC by {_f(effect)} on average; DeLong p < 0.05 for {significant} of "
             f"{len(p)} backbone(s)")
    verdict = "held" if 2 * significant >= len(p) else "not held" if significant == 0 else "inconclusive"
    return Outcome(effect, None, verdict, f"{where}.")


def threshold_moves_balanced_accuracy(t: Tables) -> Outcome:
    effects = _effects(t)
    if "rule" not in effects.index:
        raise NotEvaluated("needs at least two threshold rules")
    effect = float(effects.loc["rule", "mean_abs_change"])
    try:
        grid = t.csv("04_protocol_sensitivity", "grid.csv", columns=("rule", "metric", "value"))
    except NotEvaluated:
        grid = pd.DataFrame(columns=["rule", "metric", "value"])
    grid = grid[grid["metric"] == "balanced_accuracy"]
    keys = [c for c in ("backbone", "policy", "seed") if c in grid.columns]
    # per model: the mean |difference| between every two rules, as effect_summary counts it
    per_model = (grid.groupby(keys)["value"].agg(lambda v: np.abs(np.subtract.outer(v.to_numpy(), v.to_numpy()))
                                                .sum() / max(len(v) * (len(v) - 1), 1))
                 if keys and grid["rule"].nunique() > 1 else pd.Series(dtype=float))
    if len(per_model) < 2:
        verdict = "held" if effect >= MEANINGFUL_CHANGE else "not held"
        return Outcome(effect, None, verdict, f"Changing the threshold rule moves balanced accuracy by {_f(effect)} "
                       "on average (one model: no interval).")
    value, low, high = _mean_interval(per_model)
    outcome = _against(value, low, high, MEANINGFUL_CHANGE, above="more than", below="less than",
                       below_verdict="not held")
    return Outcome(value, outcome.interval, outcome.verdict, outcome.reason.replace(
        "This run:", f"Changing the threshold rule moves balanced accuracy on average (over {len(per_model)} "
        "models, resampled) by"))


def _first_data(table: pd.DataFrame, index: int = 0) -> pd.DataFrame:
    """Rows of the data the chapter studies (``index`` 0, the first listed); later ones are controls (e.g. the
    null phantom, ``index`` 1)."""
    if "data" not in table.columns or not len(table):
        if index:
            raise NotEvaluated("the chapter ran no control data")
        return table
    names = list(dict.fromkeys(table["data"]))
    if index >= len(names):
        raise NotEvaluated("the chapter ran no control data")
    return table[table["data"] == names[index]]


def _partition_rows(t: Tables) -> pd.DataFrame:
    table = t.csv("05_split_and_shortcut_audit", "partition_auc.csv", columns=("scope", "auc", "low", "high"))
    if "source" in table.columns:
        table = table[table["source"] == "embeddings"]
    table = _first_data(table, t.data_index)
    if table.empty:
        raise NotEvaluated("no partition classifier on embeddings was fitted")
    return table


def partition_auc_above_chance(t: Tables) -> Outcome:
    rows = _partition_rows(t)
    every = rows[rows["scope"] == "all"]
    if every.empty:
        raise NotEvaluated("no partition AUC over all images")
    r = every.iloc[0]
    return _against(float(r["auc"]), float(r["low"]), float(r["high"]), 0.5,
                    above="the split is told apart above chance",
                    below="at or below chance, which is not evidence of a difference: cross-validated AUCs of "
                          "splits that do not differ scatter around, and often below,", below_verdict="not held")


def partition_auc_normal_higher(t: Tables) -> Outcome:
    rows = _partition_rows(t)
    every = rows[rows["scope"] == "all"]
    normal = rows[rows["scope"].astype(str).str.lower() == "normal"]
    if every.empty or normal.empty:
        raise NotEvaluated("the labels have no class named 'normal'")
    a, n = every.iloc[0], normal.iloc[0]
    if a["auc"] >= AUC_CEILING:
        raise NotEvaluated(f"over all images the split is told apart almost perfectly (AUC {_f(a['auc'])}), so the "
                           "normal images' AUC has no room to be higher")
    where = (f"Among normal images {_f(n['auc'])} (95% interval {_f(n['low'])} to {_f(n['high'])}); over all "
             f"images {_f(a['auc'])}")
    interval = (float(n["low"]), float(n["high"]))
    if n["low"] > a["auc"]:
        return Outcome(float(n["auc"]), interval, "held", f"{where}: higher, beyond the interval.")
    if n["high"] < a["auc"]:
        return Outcome(float(n["auc"]), interval, "reversed", f"{where}: lower, beyond the interval.")
    if n["auc"] < a["auc"]:
        return Outcome(float(n["auc"]), interval, "not held",
                       f"{where}: lower, the other way from the claim (the interval includes the overall AUC).")
    return Outcome(float(n["auc"]), interval, "inconclusive", f"{where}: the interval includes the overall AUC.")


def _shortcut_row(t: Tables, scope: str) -> pd.Series:
    table = t.csv("05_split_and_shortcut_audit", "shortcut_balanced_accuracy.csv",
                  columns=("scope", "balanced_accuracy", "low", "high"))
    rows = _first_data(table, t.data_index)
    rows = rows[rows["scope"] == scope]
    if rows.empty:
        raise NotEvaluated(f"the shortcut audit has no {scope} row (the run has no official test split?)")
    return rows.iloc[0]


def shortcut_pool_high(t: Tables) -> Outcome:
    r = _shortcut_row(t, "pool")
    chance = float(r.get("chance", 0.5))
    return _against(float(r["balanced_accuracy"]), float(r["low"]), float(r["high"]), chance,
                    above="file properties predict the label above chance", below="below chance",
                    below_verdict="not held")


def shortcut_test_chance(t: Tables) -> Outcome:
    r = _shortcut_row(t, "test")
    chance = float(r.get("chance", 0.5))
    value, low, high = float(r["balanced_accuracy"]), float(r["low"]), float(r["high"])
    where = f"This run: {_f(value)} (95% interval {_f(low)} to {_f(high)})"
    if low > chance:
        return Outcome(value, (low, high), "not held",
                       f"{where}: the file-property classifier still works on test, above chance {_f(chance)}.")
    if high < chance:
        return Outcome(value, (low, high), "not held",
                       f"{where}: below chance {_f(chance)}, as if the file properties related to the label the "
                       "other way round on test.")
    if chance - EQUIVALENCE_MARGIN <= low and high <= chance + EQUIVALENCE_MARGIN:
        return Outcome(value, (low, high), "held",
                       f"{where}: the whole interval lies within chance {_f(chance)} +- {EQUIVALENCE_MARGIN:.2f}.")
    return Outcome(value, (low, high), "inconclusive",
                   f"{where}: the interval includes chance {_f(chance)} but reaches beyond chance +- "
                   f"{EQUIVALENCE_MARGIN:.2f}, so it does not show the classifier at chance either.")


def threshold_transfer_imperfect(t: Tables) -> Outcome:
    table = t.csv("04_protocol_sensitivity", "threshold_transfer.csv", columns=("rule", "metric", "gap"))
    rows = transfer_gaps(table)  # chapter 04 states the mean of the same gaps
    value, low, high = _mean_interval(rows)
    outcome = _against(value, low, high, MEANINGFUL_CHANGE,
                       above="balanced accuracy on test differs from validation by more than",
                       below="validation-fitted thresholds carry over within", below_verdict="not held")
    return Outcome(value, outcome.interval, outcome.verdict,
                   outcome.reason.replace("This run:", f"Mean |test - validation| balanced accuracy over {len(rows)} "
                                                       "validation-fitted thresholds:"))


def calibration_transfer_imperfect(t: Tables) -> Outcome:
    table = t.csv("04_protocol_sensitivity", "calibration_transfer.csv", columns=("method",))
    if "ece_uniform_floor_after" not in table.columns:
        raise NotEvaluated("04_protocol_sensitivity/calibration_transfer.csv has no ece_uniform_floor_after "
                           "(the ECE a calibrated model shows on this test set): rerun chapter 04")
    fits = calibration_excess(table)  # chapter 04 states the same means
    value, low, high = _mean_interval(fits["excess"])
    outcome = _against(value, low, high, 0.0,
                       above="so calibration fitted on validation leaves test ECE beyond what a calibrated model "
                             "shows: the excess is above",
                       below="so calibration fitted on validation leaves test ECE within what a calibrated model "
                             "shows: the excess is below", below_verdict="not held")
    return Outcome(value, outcome.interval, outcome.verdict, outcome.reason.replace(
        "This run:", f"Test ECE {_f(fits['before'].mean())} before and {_f(fits['after'].mean())} after "
        f"calibration, where a perfectly calibrated model would show up to {_f(fits['floor'].mean())} on this test "
        f"set (95th percentile); mean excess over that ({len(fits)} fits):"))


# ---------------------------------------------------------------- Representation risk (chapter 06)

def _best_scores(t: Tables) -> pd.DataFrame:
    table = t.csv("06_representation_risk", "best_head_test_scores.csv")
    table = table.set_index(table.columns[0]).apply(pd.to_numeric, errors="coerce")
    if table.shape[1] < 2:
        raise NotEvaluated("needs at least two encoders")
    return table


def encoder_changes_results(t: Tables) -> Outcome:
    scores = _best_scores(t)
    spans = scores.max(axis=1) - scores.min(axis=1)
    task = spans.idxmax()
    where = (f"The widest gap between encoders is {_f(spans.max())} on task {task} (best "
             f"{scores.loc[task].idxmax()} {_f(scores.loc[task].max())}, worst {scores.loc[task].idxmin()} "
             f"{_f(scores.loc[task].min())})")
    verdict = "held" if spans.max() >= 0.05 else "not held"
    return Outcome(float(spans.max()), None, verdict, f"{where}.")


def no_encoder_best_everywhere(t: Tables) -> Outcome:
    scores = _best_scores(t)
    if len(scores) < 2:
        raise NotEvaluated("needs at least two tasks")
    best = scores.idxmax(axis=1)
    where = "Best on test: " + "; ".join(f"{task}: {enc}" for task, enc in best.items())
    if best.nunique() > 1:
        return Outcome(float(best.nunique()), None, "held", f"{where}.")
    return Outcome(1.0, None, "not held", f"{where}: one encoder is best in every task.")


def _spreads(t: Tables) -> dict[str, pd.DataFrame]:
    folder = t.results / "06_representation_risk"
    names = sorted(p.name for p in folder.glob("spread_*.csv")) if folder.is_dir() else []
    if not names:
        raise NotEvaluated("the run has no 06_representation_risk/spread_<task>.csv")
    need = ("candidate", "mean", "times_selected", "n_partitions")
    return {n.removeprefix("spread_").removesuffix(".csv"): t.csv("06_representation_risk", n, columns=need)
            for n in names}


def validation_selects_well(t: Tables) -> Outcome:
    good, parts, regrets = 0, [], []
    spreads = _spreads(t)
    for task, spread in spreads.items():
        chosen = spread.loc[spread["times_selected"].idxmax()]
        best = spread.loc[spread["mean"].idxmax()]
        regret = float(best["mean"] - chosen["mean"])
        regrets.append(regret)
        good += regret <= SELECTION_REGRET
        parts.append(f"{task}: selected {chosen['candidate']} {_f(chosen['mean'])}, best {best['candidate']} "
                     f"{_f(best['mean'])}")
    where = ("Mean test score of the candidate selected most often on validation against the best candidate's "
             "on test: " + "; ".join(parts))
    return Outcome(max(regrets), None, "held" if good == len(spreads) else "not held",
                   f"{where} ({good} of {len(spreads)} task(s) within {SELECTION_REGRET:.2f} of the best).")


def partitions_reveal_instability(t: Tables) -> Outcome:
    spreads = _spreads(t)
    if max(int(s["n_partitions"].max()) for s in spreads.values()) < 2:
        raise NotEvaluated("needs at least two partitions")
    # the chapter's stability table: the same number chapter 06 shows ("distinct choices")
    table = t.csv("06_representation_risk", "stability.csv", columns=("distinct encoders selected",))
    distinct = pd.to_numeric(table.set_index(table.columns[0])["distinct encoders selected"], errors="coerce")
    where = ("Distinct choices (encoders or combinations) selected across partitions: "
             + ", ".join(f"{k} {int(v)}" for k, v in distinct.items() if np.isfinite(v)))
    unstable = int((distinct > 1).sum())
    return Outcome(float(unstable), None, "held" if unstable else "not held",
                   f"{where} ({unstable} of {len(distinct)} task(s) whose choice changes with the partition).")


def _pair(low: str, high: str) -> str:
    return f"{paper.value(low):.3f} to {paper.value(high):.3f}"


#: The claims, in ledger order: id, study, chapter, claim, paper value, rule, evaluate, differs.
RULES: tuple[dict[str, Any], ...] = tuple(dict(zip(("id", "study", "chapter", "claim", "paper_value", "rule",
                                                      "evaluate", "differs"), row)) for row in (
    ("public-pair-low", "crs-bench", "02_agreement",
     "Two pretrained models share well under half of an image's 10 nearest neighbours",
     f"{paper.value('public_pair_overlap'):.3f}", "held if the 95% patient-bootstrap interval of the public pair's "
     "overlap lies below 0.5; not held if above; inconclusive if it includes 0.5", public_pair_low,
     "the two public models of this run were trained on natural images, not chest radiographs; " + _SMALL_RUN),
    ("public-pair-above-chance", "crs-bench", "02_agreement",
     "Yet two pretrained models share more neighbours than chance", f"{paper.value('public_pair_overlap'):.3f}",
     "held if the interval lies above chance (k over the images outside the query's patient)",
     public_pair_above_chance, _SMALL_RUN),
    ("random-init-below-public", "crs-bench", "02_agreement",
     "A randomly initialised network agrees with trained models less than two trained models agree",
     f"{paper.value('random_init_overlap'):.3f} vs {paper.value('public_pair_overlap'):.3f}",
     "held if the random-init overlap lies below the public pair's interval; reversed if above",
     random_init_below_public, "small images and shallow networks keep much of the input's own geometry, so a "
     "random network's neighbours resemble a trained one's; " + _SMALL_RUN),
    ("other-modalities-higher", "crs-bench", "02_agreement",
     "In four other imaging modalities public models agree more, at most",
     f"{paper.value('other_modalities_max'):.3f}", "needs runs on several modalities", other_modalities, ""),
    ("source-view-over-findings", "crs-bench", "02_agreement",
     "Agreement depends more on the source data set and the view than on the findings", "no single number",
     "held if the largest source/view variance share's interval lies above the largest "
     "finding's; reversed if below", source_view_over_findings, _SMALL_RUN),
    ("no-accuracy-association", "crs-bench", "02_agreement",
     "Agreement is not significantly associated with accuracy", "not significant",
     "held if the Mantel test of agreement against probe-AUROC differences gives p >= 0.05",
     no_accuracy_association, "the run's models (random-init references among them) differ far more in "
     "accuracy than the study's public models, so agreement can follow accuracy here; " + _SMALL_RUN),
    ("transfer-retention", "crs-bench", "03_transfer",
     "A linear map between two models' embeddings carries classifiers over and keeps nearly all their AUROC",
     f"{paper.value('transfer_auroc_retention'):.3f} of the AUROC ({paper.value('map_fit_images'):,.0f} images)",
     "held if every model pair keeps at least 0.950 of the AUROC; not held if none does", transfer_retention,
     "the map is fitted on far fewer images than the study's 4,096; " + _SMALL_RUN),
    ("supervised-converge-least", "crs-bench", "02_agreement",
     "Label-supervised models that differ only in their seed agree least",
     _pair("supervised_seed_overlap_low", "supervised_seed_overlap_high"),
     "held if the supervised seed pairs' mean overlap is the lowest of the objectives with two seeds; reversed if "
     "the highest", supervised_converge_least, "if the zoo's self-supervised models learned little (compare their "
     "probe AUROC with the random-init networks' in chapter 02), their seeds stay close to their shared random "
     "start; " + _SMALL_RUN),
    ("ssl-converge-more", "crs-bench", "02_agreement",
     "Self-distillation, masked-image and contrastive seed pairs agree more than label-supervised ones",
     f"{_pair('ssl_pair_overlap_low', 'ssl_pair_overlap_high')} vs "
     f"{_pair('supervised_seed_overlap_low', 'supervised_seed_overlap_high')}",
     "held if the self-supervised seed pairs' range lies above the supervised range; reversed if below; "
     "inconclusive if they overlap", ssl_converge_more, "if the zoo's self-supervised models learned little (chapter 02's probe "
     "table), their seeds stay close to their shared random start; " + _SMALL_RUN),
    ("objective-drives-convergence", "crs-bench", "02_agreement",
     "The pretraining objective decides how much models converge",
     f"{_pair('supervised_seed_overlap_low', 'supervised_seed_overlap_high')} vs "
     f"{_pair('ssl_pair_overlap_low', 'ssl_pair_overlap_high')}",
     "held if mean seed-pair agreement differs more between objectives than between seeds of one objective",
     objective_drives_convergence, _SMALL_RUN),
    ("backbone-below-policy", "kermany", "04_protocol_sensitivity",
     "Under one protocol the backbone moves AUROC less than frozen vs fine-tuned does",
     f"{paper.value('backbone_spread'):.3f} vs {paper.value('policy_effect'):.3f}",
     "held if the mean AUROC change between backbones is below the mean change between policies; reversed "
     f"otherwise (no interval: the effect table has none); not evaluated if a fine-tuned AUROC is below "
     f"{FAILED_FIT_AUROC:.2f}", backbone_below_policy,
     "where the run's backbones include random-init or small zoo networks (the default's do), they differ far "
     "more than the study's eight pretrained ImageNet backbones; " + _SMALL_RUN),
    ("policy-moves-auroc", "kermany", "04_protocol_sensitivity",
     "Frozen vs fine-tuned changes AUROC", f"{paper.value('policy_effect'):.3f} on average",
     "held if DeLong p < 0.05 for at least half of the backbones; not held if for none; not evaluated if "
     f"a fine-tuned AUROC is below {FAILED_FIT_AUROC:.2f}", policy_moves_auroc,
     _SMALL_RUN),
    ("threshold-moves-balanced-accuracy", "kermany", "04_protocol_sensitivity",
     "The decision threshold moves balanced accuracy", f"{paper.value('threshold_effect'):.3f} on average",
     f"held if the mean change lies above {MEANINGFUL_CHANGE}", threshold_moves_balanced_accuracy, _SMALL_RUN),
    ("partition-auc-above-chance", "kermany", "05_split_and_shortcut_audit",
     "A classifier tells the official test split from the training pool", f"AUC {paper.value('partition_auc'):.3f}",
     "held if the partition AUC's interval lies above 0.5", partition_auc_above_chance,
     "the run's test split may be drawn like its pool (no acquisition shift)"),
    ("partition-auc-normal-higher", "kermany", "05_split_and_shortcut_audit",
     "The split is easier to tell apart among normal images",
     f"{paper.value('partition_auc_normal'):.3f} vs {paper.value('partition_auc'):.3f}",
     "held if the normal images' interval lies above the overall AUC; reversed if below; not held if "
     f"the estimate is below it; not evaluated if the overall AUC is {AUC_CEILING} or more (no room above it)",
     partition_auc_normal_higher, "a shift that affects both classes alike (as the phantom's does) gives no class a higher AUC; " + _SMALL_RUN),
    ("shortcut-pool-high", "kermany", "05_split_and_shortcut_audit",
     "File properties alone predict the label inside the training pool",
     f"{paper.value('shortcut_pool'):.3f} balanced accuracy", "held if the interval lies above chance",
     shortcut_pool_high, "the run's files may not carry label-linked properties"),
    ("shortcut-test-chance", "kermany", "05_split_and_shortcut_audit",
     "The same file-property classifier falls to chance on the official test split",
     f"{paper.value('shortcut_test'):.3f} balanced accuracy", f"held if the whole 95% interval lies within chance +- "
     f"{EQUIVALENCE_MARGIN:.2f} (equivalence); not held if it lies above or below chance; inconclusive otherwise",
     shortcut_test_chance, "the run's test files may share the pool's file properties"),
    ("threshold-transfer-imperfect", "kermany", "04_protocol_sensitivity",
     "Thresholds fitted on validation transfer imperfectly to test", "no single number",
     f"held if the mean |test - validation| balanced accuracy of validation-fitted rules lies above "
     f"{MEANINGFUL_CHANGE} (bootstrap over the rows)", threshold_transfer_imperfect, _SMALL_RUN),
    ("calibration-transfer-imperfect", "kermany", "04_protocol_sensitivity",
     "Calibration fitted on validation transfers imperfectly to test", "no single number",
     "held if test ECE after temperature or Platt scaling exceeds the ECE a perfectly calibrated model shows on "
     "the same test set (95th percentile of simulations) on average, with the 95% interval over the fits above 0; "
     "not held if the excess is below 0", calibration_transfer_imperfect, _SMALL_RUN),
    ("encoder-changes-results", "risk", "06_representation_risk",
     "The choice of encoder changes the test result",
     f"R² {paper.value('houses_r2_resnet50'):.3f} vs {paper.value('houses_r2_siglip2'):.3f} (houses)",
     "held if the best and worst encoder differ by at least 0.05 in the test score of some task",
     encoder_changes_results, _SMALL_RUN),
    ("no-encoder-best-everywhere", "risk", "06_representation_risk", "No encoder is best in every task",
     "no encoder best everywhere", "held if the best encoder on test differs between tasks",
     no_encoder_best_everywhere, "the run's tasks may all favour one well-trained encoder; " + _SMALL_RUN),
    ("validation-selects-well", "risk", "06_representation_risk",
     "Selecting on locked validation data picks a procedure that does well on test",
     f"R² {paper.value('houses_selected_r2'):.3f} (houses), accuracy "
     f"{paper.value('pneumonia_selected_accuracy'):.3f} (pneumonia)",
     "held if, in every task, the candidate selected most often on validation scores on test within "
     f"{SELECTION_REGRET:.2f} of the best candidate; not held otherwise", validation_selects_well,
     "small validation partitions make the selection noisy; " + _SMALL_RUN),
    ("partitions-reveal-instability", "risk", "06_representation_risk",
     "Repeated partitions reveal that a selection can be unstable", "instability in horse feature union",
     "held if the encoder or combination selected changes between partitions in at least one task (chapter 06's "
     "distinct choices)",
     partitions_reveal_instability, "a clearly best encoder is selected in every partition"),
))

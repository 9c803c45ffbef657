"""The claims ledger gives known verdicts on constructed result tables, and never crashes on missing ones."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from crslib import claims
from crslib.claim_rules import MEANINGFUL_CHANGE
from crslib.cli import main
from crslib.errors import InputError


def write(root, chapter, name, frame, index=False):
    folder = root / "results" / chapter
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / name, index=index)


def measures(root, public=(0.1, 0.08, 0.12), random_init=0.04, chance=0.01):
    write(root, "02_agreement", "measures.csv", claims.measures_frame([
        ("public_pair_overlap", *public, ""), ("random_init_overlap", random_init, np.nan, np.nan, ""),
        ("chance", chance, np.nan, np.nan, "k/(N-1)")]))


def verdicts(root):
    return {v.id: v for v in claims.build_ledger(root).verdicts}


def test_empty_run_folder_is_all_not_evaluated_with_reasons(tmp_path):
    ledger = claims.build_ledger(tmp_path)
    assert [v.id for v in ledger.verdicts] == list(claims.CLAIM_IDS)
    assert len(ledger.verdicts) >= 20
    assert all(v.verdict == "not evaluated" and v.reason for v in ledger.verdicts)
    assert "02_agreement/measures.csv" in verdicts(tmp_path)["public-pair-low"].reason


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        claims.build_ledger(tmp_path / "nope")


@pytest.mark.parametrize("public, low_verdict, chance_verdict", [
    ((0.1, 0.08, 0.12), "held", "held"),          # low and above chance
    ((0.7, 0.6, 0.8), "not held", "held"),        # most neighbours shared
    ((0.5, 0.4, 0.6), "inconclusive", "held"),    # interval includes 0.5, estimate on it
    ((0.55, 0.4, 0.7), "not held", "held"),       # interval includes 0.5, estimate above it: the other way
    ((0.45, 0.3, 0.6), "inconclusive", "held"),   # interval includes 0.5, estimate on the claim's side
    ((0.008, 0.005, 0.02), "held", "not held"),   # interval includes chance 0.01, estimate below it
    ((0.01, 0.005, 0.02), "held", "inconclusive"),  # interval includes chance 0.01
])
def test_public_pair_rules(tmp_path, public, low_verdict, chance_verdict):
    measures(tmp_path, public=public)
    got = verdicts(tmp_path)
    assert got["public-pair-low"].verdict == low_verdict
    assert got["public-pair-above-chance"].verdict == chance_verdict
    assert got["public-pair-low"].interval == (public[1], public[2])
    assert f"{public[0]:.3f}" in got["public-pair-low"].reason


@pytest.mark.parametrize("random_init, expected", [(0.04, "held"), (0.2, "reversed"), (0.1, "inconclusive")])
def test_random_init_against_the_public_interval(tmp_path, random_init, expected):
    measures(tmp_path, random_init=random_init)
    assert verdicts(tmp_path)["random-init-below-public"].verdict == expected


def test_unmeasured_quantity_gives_the_notebooks_reason(tmp_path):
    write(tmp_path, "02_agreement", "measures.csv", claims.measures_frame([
        ("public_pair_overlap", np.nan, np.nan, np.nan, "fewer than two pretrained models"),
        ("chance", 0.01, np.nan, np.nan, "")]))
    got = verdicts(tmp_path)["public-pair-low"]
    assert got.verdict == "not evaluated" and "fewer than two pretrained models" in got.reason


def convergence(root, sup, ssl, other=None):
    rows = [("cnn_small", "supervised_multilabel", 3, np.mean(sup), min(sup), max(sup), 3),
            ("cnn_small", "contrastive", 3, np.mean(ssl), min(ssl), max(ssl), 3),
            ("cnn_small", "random_init", 3, 0.99, 0.98, 1.0, 3),  # ignored: not an objective
            ("cnn_small", "(all)", 9, 0.5, 0.0, 1.0, 9)]
    if other:
        rows.append(("cnn_small", "self_distillation", 3, np.mean(other), min(other), max(other), 3))
    write(root, "02_agreement", "convergence.csv", pd.DataFrame(
        rows, columns=["architecture", "objective", "n_models", "within_mean", "within_min", "within_max",
                       "n_within"]))


def test_convergence_rules_follow_the_seed_pairs(tmp_path):
    convergence(tmp_path, sup=[0.06, 0.08, 0.1], ssl=[0.41, 0.6, 0.8])
    got = verdicts(tmp_path)
    assert got["supervised-converge-least"].verdict == "held"
    assert got["ssl-converge-more"].verdict == "held"
    assert got["objective-drives-convergence"].verdict == "held"  # 0.54 between objectives > 0.39 within


def test_convergence_rules_reverse_and_straddle(tmp_path):
    convergence(tmp_path, sup=[0.5, 0.55, 0.6], ssl=[0.2, 0.25, 0.3])
    got = verdicts(tmp_path)
    assert got["supervised-converge-least"].verdict == "reversed"
    assert got["ssl-converge-more"].verdict == "reversed"
    convergence(tmp_path, sup=[0.3, 0.4, 0.5], ssl=[0.35, 0.45, 0.55], other=[0.2, 0.25, 0.3])
    got = verdicts(tmp_path)
    assert got["supervised-converge-least"].verdict == "not held"  # self-distillation is lower
    assert got["ssl-converge-more"].verdict == "inconclusive"
    assert got["objective-drives-convergence"].verdict == "not held"  # 0.17 between < 0.2 within


def test_convergence_rules_leave_out_objectives_whose_models_did_not_learn(tmp_path):
    """Self-distillation agrees least but did not clear its initial weights: no evidence about its objective."""
    convergence(tmp_path, sup=[0.3, 0.4, 0.5], ssl=[0.35, 0.45, 0.55], other=[0.2, 0.25, 0.3])
    table = pd.read_csv(tmp_path / "results" / "02_agreement" / "convergence.csv")
    table["n_flagged"] = np.where(table["objective"] == "self_distillation", 3, 0)
    write(tmp_path, "02_agreement", "convergence.csv", table)
    got = verdicts(tmp_path)["supervised-converge-least"]
    assert got.verdict == "held"  # without self-distillation, the supervised pairs are the lowest
    assert "left out: self distillation" in got.reason and "self distillation 0.25" not in got.reason
    table["n_flagged"] = np.where(table["objective"] == "random_init", 0, 3)
    write(tmp_path, "02_agreement", "convergence.csv", table)
    got = verdicts(tmp_path)["supervised-converge-least"]
    assert got.verdict == "not evaluated" and "did not learn beyond their initial weights" in got.reason
    # only the supervised seeds learned: nothing to compare them with, and the ledger says why
    table["n_flagged"] = np.where(table["objective"] == "supervised_multilabel", 0, 3)
    write(tmp_path, "02_agreement", "convergence.csv", table)
    got = verdicts(tmp_path)
    for claim in ("supervised-converge-least", "ssl-converge-more"):
        assert got[claim].verdict == "not evaluated" and "left out: " in got[claim].reason


def test_convergence_needs_two_seeds(tmp_path):
    write(tmp_path, "02_agreement", "convergence.csv", pd.DataFrame(
        [("cnn_small", "supervised_multilabel", 1, np.nan, np.nan, np.nan, 0)],
        columns=["architecture", "objective", "n_models", "within_mean", "within_min", "within_max", "n_within"]))
    got = verdicts(tmp_path)["supervised-converge-least"]
    assert got.verdict == "not evaluated" and "two seeds" in got.reason


def test_variance_shares_and_accuracy_association(tmp_path):
    write(tmp_path, "02_agreement", "variance_shares.csv", pd.DataFrame(
        [("source", 0.3, 0.2, 0.4), ("view", 0.1, 0.05, 0.15), ("finding_a", 0.05, 0.01, 0.1)],
        columns=["factor", "share_alone", "share_alone_low", "share_alone_high"]))
    write(tmp_path, "02_agreement", "accuracy_association.csv",
          pd.Series({"mantel_r": 0.7, "mantel_p": 0.002}).to_frame("value"), index=True)
    got = verdicts(tmp_path)
    assert got["source-view-over-findings"].verdict == "held"
    assert got["source-view-over-findings"].run_value == pytest.approx(0.3)
    assert got["no-accuracy-association"].verdict == "not held"
    assert "p = 0.002" in got["no-accuracy-association"].reason
    write(tmp_path, "02_agreement", "variance_shares.csv", pd.DataFrame(
        [("source", 0.05, 0.01, 0.1), ("finding_a", 0.3, 0.2, 0.4)],
        columns=["factor", "share_alone", "share_alone_low", "share_alone_high"]))
    write(tmp_path, "02_agreement", "accuracy_association.csv",
          pd.Series({"mantel_r": 0.1, "mantel_p": 0.4}).to_frame("value"), index=True)
    got = verdicts(tmp_path)
    assert got["source-view-over-findings"].verdict == "reversed"
    assert got["no-accuracy-association"].verdict == "held"


@pytest.mark.parametrize("retention, expected", [([0.97, 0.99], "held"), ([0.5, 0.9], "not held"),
                                                 ([0.9, 0.99], "inconclusive")])
def test_transfer_retention(tmp_path, retention, expected):
    write(tmp_path, "03_transfer", "retention_summary.csv",
          pd.DataFrame({"new_model": ["a", "b"], "mean_retention": retention}))
    got = verdicts(tmp_path)["transfer-retention"]
    assert got.verdict == expected and got.interval == (min(retention), max(retention))


def protocol_tables(root, backbone, policy, p_values):
    write(root, "04_protocol_sensitivity", "effect_summary.csv", pd.DataFrame(
        {"factor": ["backbone", "policy", "rule"], "mean_abs_change": [backbone, policy, 0.05]}))
    write(root, "04_protocol_sensitivity", "delong_frozen_vs_finetuned.csv", pd.DataFrame(
        {"backbone": [f"b{i}" for i in range(len(p_values))], "p (DeLong)": p_values}))


def test_a_fine_tuning_at_chance_leaves_both_policy_claims_not_evaluated(tmp_path):
    """The issue's case: fine-tuned AUROCs 0.497, 0.515, 0.495 against frozen 0.810, 0.767, 0.705."""
    protocol_tables(tmp_path, 0.101, 0.155, [0.001, 0.001, 0.002])
    write(tmp_path, "04_protocol_sensitivity", "delong_frozen_vs_finetuned.csv", pd.DataFrame(
        {"backbone": ["a", "b", "c"], "AUROC fine-tuned": [0.497, 0.515, 0.495],
         "AUROC frozen": [0.810, 0.767, 0.705], "p (DeLong)": [0.001, 0.001, 0.002]}))
    got = verdicts(tmp_path)
    for cid in ("backbone-below-policy", "policy-moves-auroc"):
        assert got[cid].verdict == "not evaluated", (cid, got[cid].reason)
        assert "did not learn for 3 of 3 backbone(s)" in got[cid].reason and "a 0.497" in got[cid].reason
    # one backbone learned too little (0.54): still a failed training under the comparison
    write(tmp_path, "04_protocol_sensitivity", "delong_frozen_vs_finetuned.csv", pd.DataFrame(
        {"backbone": ["a", "b"], "AUROC fine-tuned": [0.9, 0.54], "p (DeLong)": [0.01, 0.02]}))
    assert verdicts(tmp_path)["backbone-below-policy"].verdict == "not evaluated"
    write(tmp_path, "04_protocol_sensitivity", "delong_frozen_vs_finetuned.csv", pd.DataFrame(
        {"backbone": ["a", "b"], "AUROC fine-tuned": [0.9, 0.56], "p (DeLong)": [0.01, 0.02]}))
    got = verdicts(tmp_path)
    assert got["backbone-below-policy"].verdict == "held" and got["policy-moves-auroc"].verdict == "held"


def test_protocol_rules(tmp_path):
    protocol_tables(tmp_path, 0.026, 0.044, [0.01, 0.02, 0.5])
    got = verdicts(tmp_path)
    assert got["backbone-below-policy"].verdict == "held"
    assert got["policy-moves-auroc"].verdict == "held"
    protocol_tables(tmp_path, 0.2, 0.04, [0.3, 0.5])
    got = verdicts(tmp_path)
    assert got["backbone-below-policy"].verdict == "reversed"
    assert got["policy-moves-auroc"].verdict == "not held"
    protocol_tables(tmp_path, 0.2, 0.04, [0.01, 0.5, 0.6])
    assert verdicts(tmp_path)["policy-moves-auroc"].verdict == "inconclusive"


def test_threshold_effect_interval_from_the_grid(tmp_path):
    protocol_tables(tmp_path, 0.02, 0.04, [0.01])
    rng = np.random.default_rng(0)
    rows = [(b, r, m, 0.7 + (0.1 if r == "youden" else 0.0) + rng.normal(0, 0.005))
            for b in range(8) for r in ("fixed_0.5", "youden") for m in ("balanced_accuracy", "auroc")]
    grid = pd.DataFrame(rows, columns=["backbone", "rule", "metric", "value"])
    grid.loc[grid["metric"] == "auroc", "value"] = 0.5  # another metric: not the claim's
    write(tmp_path, "04_protocol_sensitivity", "grid.csv", grid)
    got = verdicts(tmp_path)["threshold-moves-balanced-accuracy"]
    assert got.verdict == "held" and got.run_value == pytest.approx(0.1, abs=0.005)
    assert got.interval[0] > MEANINGFUL_CHANGE
    write(tmp_path, "04_protocol_sensitivity", "grid.csv", grid.assign(value=0.7))
    got = verdicts(tmp_path)["threshold-moves-balanced-accuracy"]
    assert got.verdict == "not held" and got.run_value == 0


def test_threshold_and_calibration_transfer(tmp_path):
    write(tmp_path, "04_protocol_sensitivity", "threshold_transfer.csv", pd.DataFrame({
        "rule": ["fixed_0.5"] * 4 + ["youden"] * 4, "metric": ["balanced_accuracy"] * 8,
        "gap": [0.9, 0.9, 0.9, 0.9, 0.001, -0.002, 0.0, 0.001]}))  # the fixed rule is not fitted: ignored
    write(tmp_path, "04_protocol_sensitivity", "calibration_transfer.csv", pd.DataFrame({
        "method": ["none", "temperature", "temperature", "platt", "platt"],
        "ece_uniform_before": [0.2] * 5, "ece_uniform_after": [0.2, 0.15, 0.16, 0.14, 0.17],
        "ece_uniform_floor_after": [0.08, 0.08, 0.09, 0.07, 0.08]}))
    got = verdicts(tmp_path)
    assert got["threshold-transfer-imperfect"].run_value == pytest.approx(0.001)
    assert got["threshold-transfer-imperfect"].verdict == "not held"
    assert got["calibration-transfer-imperfect"].verdict == "held"
    assert got["calibration-transfer-imperfect"].run_value == pytest.approx(0.075)  # 0.155 above a floor of 0.08


def test_calibration_within_what_a_calibrated_model_shows_is_not_imperfect(tmp_path):
    """The issue's case: a test ECE above 0.020 is no evidence when a calibrated model shows 0.08 on this test set."""
    table = pd.DataFrame({"method": ["temperature", "platt", "temperature", "platt"],
                          "ece_uniform_before": [0.17] * 4, "ece_uniform_after": [0.06, 0.07, 0.05, 0.065],
                          "ece_uniform_floor_after": [0.08, 0.085, 0.08, 0.09]})
    write(tmp_path, "04_protocol_sensitivity", "calibration_transfer.csv", table)
    got = verdicts(tmp_path)["calibration-transfer-imperfect"]
    assert got.verdict == "not held" and got.run_value < 0, got.reason
    assert "a perfectly calibrated model would show up to 0.084" in got.reason
    write(tmp_path, "04_protocol_sensitivity", "calibration_transfer.csv", table.drop(columns="ece_uniform_floor_after"))
    got = verdicts(tmp_path)["calibration-transfer-imperfect"]
    assert got.verdict == "not evaluated" and "rerun chapter 04" in got.reason


def audit_tables(root, partition, normal, pool, test):
    cols = ["scope", "auc", "low", "high", "source", "data"]
    write(root, "05_split_and_shortcut_audit", "partition_auc.csv", pd.DataFrame(
        [("all", *partition, "embeddings", "yours"), ("NORMAL", *normal, "embeddings", "yours"),
         ("all", 0.5, 0.4, 0.6, "file properties", "yours"),
         ("all", 0.99, 0.98, 1.0, "embeddings", "control")], columns=cols))  # controls are not the claim
    write(root, "05_split_and_shortcut_audit", "shortcut_balanced_accuracy.csv", pd.DataFrame(
        [("pool", *pool, 0.5, "yours"), ("test", *test, 0.5, "yours"), ("pool", 0.5, 0.4, 0.6, 0.5, "control")],
        columns=["scope", "balanced_accuracy", "low", "high", "chance", "data"]))


def test_audit_rules_as_in_the_paper(tmp_path):
    audit_tables(tmp_path, (0.697, 0.65, 0.74), (0.898, 0.85, 0.94), (0.992, 0.98, 1.0), (0.496, 0.46, 0.53))
    got = verdicts(tmp_path)
    for cid in ("partition-auc-above-chance", "partition-auc-normal-higher", "shortcut-pool-high",
                "shortcut-test-chance"):
        assert got[cid].verdict == "held", (cid, got[cid].reason)
    assert got["partition-auc-above-chance"].run_value == pytest.approx(0.697)


def test_audit_rules_when_nothing_is_found(tmp_path):
    audit_tables(tmp_path, (0.52, 0.45, 0.6), (0.4, 0.3, 0.45), (0.5, 0.44, 0.56), (0.8, 0.7, 0.9))
    got = verdicts(tmp_path)
    assert got["partition-auc-above-chance"].verdict == "inconclusive"
    assert got["partition-auc-normal-higher"].verdict == "reversed"
    assert got["shortcut-pool-high"].verdict == "inconclusive"
    assert got["shortcut-test-chance"].verdict == "not held"


@pytest.mark.parametrize("test, expected", [
    ((0.496, 0.46, 0.53), "held"),          # the whole interval within 0.5 +- 0.05: equivalent to chance
    ((0.496, 0.44, 0.55), "inconclusive"),  # includes chance, reaches below 0.45
    ((0.464, 0.302, 0.626), "inconclusive"),  # the case: 81 images, an interval too wide to say
    ((0.7, 0.6, 0.8), "not held"),          # still works on test
    ((0.3, 0.2, 0.4), "not held"),          # below chance
])
def test_shortcut_at_chance_on_test_needs_equivalence_not_a_wide_interval(tmp_path, test, expected):
    audit_tables(tmp_path, (0.697, 0.65, 0.74), (0.898, 0.85, 0.94), (0.992, 0.98, 1.0), test)
    got = verdicts(tmp_path)["shortcut-test-chance"]
    assert got.verdict == expected, got.reason
    if expected == "inconclusive":
        assert "does not show the classifier at chance" in got.reason


@pytest.mark.parametrize("overall, normal, expected", [
    ((0.85, 0.8, 0.9), (0.95, 0.9, 0.99), "held"),            # above the overall AUC, beyond the interval
    ((0.85, 0.8, 0.9), (0.90, 0.80, 0.99), "inconclusive"),   # above it, the interval includes it
    ((0.946, 0.872, 1.0), (0.883, 0.656, 1.0), "not held"),   # the case: below it, the other way
    ((0.85, 0.8, 0.9), (0.6, 0.5, 0.7), "reversed"),          # below it, beyond the interval
    ((0.9997, 0.999, 1.0), (0.9986, 0.995, 1.0), "not evaluated"),  # the default build: no room above 1.000
])
def test_normal_partition_auc_pointing_the_other_way_is_not_inconclusive(tmp_path, overall, normal, expected):
    audit_tables(tmp_path, overall, normal, (0.9, 0.8, 1.0), (0.5, 0.46, 0.54))
    got = verdicts(tmp_path)["partition-auc-normal-higher"]
    assert got.verdict == expected, got.reason


def risk_tables(root, scores, selected):
    write(root, "06_representation_risk", "best_head_test_scores.csv", pd.DataFrame(scores), index=True)
    for task, picks in selected.items():
        encoders = list(scores)
        write(root, "06_representation_risk", f"spread_{task}.csv", pd.DataFrame({
            "candidate": [f"{e}/linear" for e in encoders], "mean": [scores[e][task] for e in encoders],
            "times_selected": [picks.get(e, 0) for e in encoders], "n_partitions": 3}))
    write(root, "06_representation_risk", "stability.csv", pd.DataFrame(
        {"distinct encoders selected": {task: sum(n > 0 for n in picks.values()) for task, picks in selected.items()}}),
        index=True)


def test_risk_rules(tmp_path):
    scores = {"a": {"houses": 0.6, "horses": 0.02}, "b": {"houses": 0.4, "horses": 0.1},
              "c": {"houses": 0.3, "horses": 0.05}}
    risk_tables(tmp_path, scores, {"houses": {"a": 3}, "horses": {"b": 2, "c": 1}})
    got = verdicts(tmp_path)
    assert got["encoder-changes-results"].verdict == "held"
    assert got["encoder-changes-results"].run_value == pytest.approx(0.3)
    assert got["no-encoder-best-everywhere"].verdict == "held"
    assert got["validation-selects-well"].verdict == "held"
    assert got["partitions-reveal-instability"].verdict == "held"
    assert got["partitions-reveal-instability"].run_value == 1


def test_risk_rules_one_best_encoder(tmp_path):
    scores = {"a": {"houses": 0.61, "horses": 0.2}, "b": {"houses": 0.6, "horses": 0.19}}
    risk_tables(tmp_path, scores, {"houses": {"b": 3}, "horses": {"a": 3}})
    got = verdicts(tmp_path)
    assert got["encoder-changes-results"].verdict == "not held"
    assert got["no-encoder-best-everywhere"].verdict == "not held"
    assert got["validation-selects-well"].verdict == "held"  # houses picks b, 0.01 below the best
    assert got["validation-selects-well"].run_value == pytest.approx(0.01)
    assert got["partitions-reveal-instability"].verdict == "not held"


def test_a_selection_far_below_the_best_does_not_select_well_even_above_the_median(tmp_path):
    """The issue's case: R^2 0.119 clears a median of 0.002 but not the best candidate's 0.248."""
    scores = {"a": {"t": 0.119}, "b": {"t": 0.002}, "c": {"t": -0.3}, "d": {"t": 0.248}, "e": {"t": -1.6}}
    risk_tables(tmp_path, scores, {"t": {"a": 2, "d": 1}})
    got = verdicts(tmp_path)["validation-selects-well"]
    assert got.verdict == "not held" and got.run_value == pytest.approx(0.129)
    assert "selected a/linear 0.119, best d/linear 0.248" in got.reason


def test_malformed_table_is_not_evaluated(tmp_path):
    write(tmp_path, "03_transfer", "retention_summary.csv", pd.DataFrame({"other": [1]}))
    got = verdicts(tmp_path)["transfer-retention"]
    assert got.verdict == "not evaluated" and "mean_retention" in got.reason


def test_json_markdown_and_box_escape_user_strings(tmp_path):
    scores = {"<script>x</script>": {"t1": 0.9, "t2": 0.1}, "b": {"t1": 0.1, "t2": 0.9}}
    risk_tables(tmp_path, scores, {})
    ledger = claims.build_ledger(tmp_path)
    data = json.loads(ledger.to_json())
    assert [c["id"] for c in data["claims"]] == list(claims.CLAIM_IDS)
    assert set(data["claims"][0]) >= {"id", "study", "claim", "paper_value", "run_value", "interval", "rule",
                                      "verdict", "reason"}
    box = ledger.chapter_html("06")
    assert "<script>" not in box and "&lt;script&gt;" in box
    assert box.count("<li>") == len(ledger.chapter("06")) == 4
    page = claims.render_claims_page(ledger, run_id="r1")
    assert "<script>" not in page
    for cid in claims.CLAIM_IDS:
        assert f"| {cid} |" in page
    assert "02_agreement.ipynb#what-this-run-shows" in page


def test_cli_prints_and_writes_the_ledger(tmp_path, capsys):
    measures(tmp_path)
    out = tmp_path / "ledger.json"
    assert main(["claims", str(tmp_path), "--json", str(out), "--markdown", str(tmp_path / "l.md")]) == 0
    printed = capsys.readouterr().out
    assert "| `public-pair-low` | crs-bench |" in printed and "| held |" in printed
    claims_json = json.loads(out.read_text())["claims"]
    assert {c["id"]: c["verdict"] for c in claims_json}["public-pair-low"] == "held"
    assert (tmp_path / "l.md").read_text().startswith("| id |")
    assert main(["claims", str(tmp_path / "missing")]) == 2


def test_the_this_run_column_names_its_statistic_and_says_a_range_is_a_range(tmp_path):
    from crslib.claim_rules import STATISTICS

    assert set(STATISTICS) == set(claims.CLAIM_IDS)
    measures(tmp_path, public=(0.333, 0.310, 0.358))
    write(tmp_path, "03_transfer", "retention_summary.csv",
          pd.DataFrame({"new_model": ["a", "b", "c"], "mean_retention": [0.939, 0.98, 1.031]}))
    scores = {"a": {"houses": 0.6, "horses": 0.02}, "b": {"houses": 0.4, "horses": 0.1}}
    risk_tables(tmp_path, scores, {"houses": {"a": 3}, "horses": {"b": 2}})
    table = claims.build_ledger(tmp_path).to_markdown()
    assert "mean overlap@10 of the public pair 0.333 (95% CI 0.310 to 0.358)" in table
    assert "mean share of the AUROC kept 0.983 (range over 3 model pairs 0.939 to 1.031)" in table
    assert "encoders best in some task 2" in table
    assert "R^2" not in table
    row = json.loads(claims.build_ledger(tmp_path).to_json())["claims"][0]
    assert row["statistic"] == "mean overlap@10 of the public pair" and row["interval_kind"] == "95% CI"


def _run_json(root, data):
    (root / "run.json").write_text(json.dumps({"notebooks": [
        {"name": "05_split_and_shortcut_audit", "parameters": {"data": data}},
        {"name": "02_agreement", "parameters": {"data": data}}]}))


def test_each_row_says_whether_its_effect_was_planted_and_shows_the_null_phantom_beside_it(tmp_path):
    audit_tables(tmp_path, (0.946, 0.872, 1.0), (0.883, 0.656, 1.0), (0.936, 0.905, 0.958), (0.5, 0.46, 0.54))
    table = pd.read_csv(tmp_path / "results" / "05_split_and_shortcut_audit" / "partition_auc.csv")
    table.loc[table["data"] == "control", "auc"] = 0.509  # the null phantom: the split is not told apart
    table.loc[table["data"] == "control", ["low", "high"]] = (0.43, 0.58)
    write(tmp_path, "05_split_and_shortcut_audit", "partition_auc.csv", table)
    measures(tmp_path)
    _run_json(tmp_path, "phantom?patients=250&size=64&seed=1&kermany=1&shortcut=0.9&shift=0.5")
    got = verdicts(tmp_path)
    assert got["partition-auc-above-chance"].origin == "planted (shift=0.5)"
    assert got["partition-auc-above-chance"].control == "null phantom: 0.509, inconclusive"
    assert got["shortcut-pool-high"].origin == "planted (shortcut=0.9)"
    assert got["shortcut-pool-high"].control == "null phantom: 0.500, inconclusive"
    assert got["partition-auc-normal-higher"].origin == "emerged"
    assert got["partition-auc-normal-higher"].control == ""
    assert got["public-pair-low"].origin == "emerged"
    page = claims.build_ledger(tmp_path).to_markdown()
    assert "planted (shift=0.5); null phantom: 0.509, inconclusive" in page
    assert "In the data: planted (shift=0.5)" in claims.build_ledger(tmp_path).chapter_html("05")
    # a phantom without the shift: the same claim's effect is not planted
    _run_json(tmp_path, "phantom?patients=250&kermany=1")
    assert verdicts(tmp_path)["partition-auc-above-chance"].origin == "not planted (shift=0)"
    # a researcher's own folder; and a results folder without run.json says nothing
    _run_json(tmp_path, "/data/my_images")
    assert {v.origin for v in verdicts(tmp_path).values()} == {"your data", ""}
    (tmp_path / "run.json").unlink()
    assert {v.origin for v in verdicts(tmp_path).values()} == {""}


def test_instability_counts_the_choices_chapter_06_shows_not_the_heads(tmp_path):
    """The issue's case: chapter 06 showed 2 distinct choices, the claim counted 3 candidates (one encoder, two
    heads). Both now read the stability table."""
    scores = {"a": {"t": 0.6}, "b": {"t": 0.5}}
    risk_tables(tmp_path, scores, {"t": {"a": 2, "b": 1}})
    spread = pd.read_csv(tmp_path / "results" / "06_representation_risk" / "spread_t.csv")
    spread = pd.concat([spread, spread.assign(candidate=["a/knn", "b/knn"], times_selected=[1, 0])])
    write(tmp_path, "06_representation_risk", "spread_t.csv", spread)  # 3 candidates selected, 2 encoders
    got = verdicts(tmp_path)["partitions-reveal-instability"]
    assert got.verdict == "held" and "t 2" in got.reason and "1 of 1 task(s)" in got.reason
    write(tmp_path, "06_representation_risk", "stability.csv",
          pd.DataFrame({"distinct encoders selected": {"t": 1}}), index=True)
    assert verdicts(tmp_path)["partitions-reveal-instability"].verdict == "not held"

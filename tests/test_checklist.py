"""Tests for crslib.checklist: the seven-item reporting checklist of study 2."""

from __future__ import annotations

import copy
import json
import logging
import math

import numpy as np
import pandas as pd
import pytest

from crslib import checklist
from crslib.checklist import build_checklist, crosswalk_frame
from crslib.checklist_items import CROSSWALK_SOURCES, GUIDELINES, ITEM_IDS, ITEMS, REFERENCES
from crslib.errors import InputError

NAN = float("nan")


def _effect(description, value, unit, **extra):
    return {"description": description, "value": value, "unit": unit, "source": "nb/02_protocol", **extra}


def _full() -> dict:
    """Evidence that fills every item."""
    return {
        "split": {
            "provenance": "Kermany official train/test folders; validation carved from train by patient",
            "patients_disjoint": True,
            "partition_auc": {"estimate": 0.71, "low": 0.68, "high": 0.74},
            "partition_auc_normal": {"estimate": 0.88, "low": 0.85, "high": 0.91},
            "effect": _effect("partition classifier, test split vs pool", 0.71, "AUC", low=0.68, high=0.74, paper=0.697),
        },
        "training_policy": {
            "policies_compared": ["frozen", "fine-tuned"],
            "reported_policy": "frozen",
            "effect": _effect("AUROC, fine-tuned minus frozen", 0.041, "AUROC"),
        },
        "threshold": {
            "rule": "Youden J",
            "fitted_on": "validation",
            "effect": _effect("balanced accuracy range over threshold rules", 0.087, "balanced accuracy"),
        },
        "metrics": {
            "reported": ["auroc", "balanced_accuracy", "sensitivity", "specificity"],
            "effect": _effect("balanced accuracy at the validation threshold", 0.83, "balanced accuracy"),
        },
        "calibration": {
            "method": "temperature scaling",
            "fitted_on": "validation",
            "ece_before": 0.12,
            "ece_after": 0.05,
            "effect": _effect("ECE on the test split after calibration", 0.05, "ECE"),
        },
        "uncertainty": {
            "confidence": 0.95,
            "n_resamples": 2000,
            "resampling": "patient-grouped bootstrap",
            "seeds": [0, 1, 2],
            "split_level": {"n_partitions": 5, "spread": 0.03},
            "effect": _effect("AUROC spread over splits", 0.03, "AUROC"),
        },
        "shortcut": {
            "pool_balanced_accuracy": {"estimate": 0.98, "low": 0.97, "high": 0.99},
            "test_balanced_accuracy": {"estimate": 0.51, "low": 0.47, "high": 0.55},
            "features": ["file_size", "bit_depth", "width", "height"],
            "effect": _effect("file-property classifier, pool minus test", 0.47, "balanced accuracy"),
        },
    }


def _with(item_id: str, **changes) -> dict:
    ev = _full()
    for key, value in changes.items():
        if value is _DROP:
            ev[item_id].pop(key)
        else:
            ev[item_id][key] = value
    return ev


_DROP = object()


# --------------------------------------------------------------------------- specs


def test_items_are_seven_in_order():
    assert tuple(s.item_id for s in ITEMS) == ITEM_IDS
    assert [s.number for s in ITEMS] == [1, 2, 3, 4, 5, 6, 7]
    for spec in ITEMS:
        assert "effect" in spec.required
        assert spec.paper_effect.startswith("Paper:")


def test_paper_numbers_are_the_papers():
    quoted = " ".join(s.paper_effect for s in ITEMS)
    for number in ("0.697", "0.898", "0.044", "0.026", "0.090", "0.992", "0.496"):
        assert number in quoted


def test_crosswalk_covers_all_four_guidelines_for_every_item():
    for spec in ITEMS:
        assert tuple(spec.crosswalk) == GUIDELINES
        for guideline, ids in spec.crosswalk.items():
            assert ids, f"{spec.item_id} has no {guideline} identifiers"
            assert all(isinstance(i, str) and i.strip() for i in ids)


def test_crosswalk_identifiers_are_in_range():
    for spec in ITEMS:
        assert all(1 <= int(i) <= 44 for i in spec.crosswalk["CLAIM 2024"])
        assert all(1 <= int(i.rstrip("abcdefg")) <= 27 for i in spec.crosswalk["TRIPOD+AI"])
        assert all(i.startswith("Part") for i in spec.crosswalk["MI-CLAIM"])
        assert all(i.split()[0] in {f"{p}.{k}" for p in range(1, 5) for k in range(1, 9)} for i in spec.crosswalk["DOME"])
    # spot checks against the verified item texts
    assert "15" in checklist._SPECS["threshold"].crosswalk["TRIPOD+AI"]  # thresholds
    assert "20" in checklist._SPECS["split"].crosswalk["CLAIM 2024"]  # partitions disjoint
    assert "4.4 Confidence" in checklist._SPECS["uncertainty"].crosswalk["DOME"]


def test_sources_and_references_document_every_guideline():
    assert set(CROSSWALK_SOURCES) == set(GUIDELINES) == set(REFERENCES)
    for guideline in GUIDELINES:
        src = CROSSWALK_SOURCES[guideline]
        assert src["reference"] and src["verified"] and "identifiers" in src
        ref = REFERENCES[guideline]
        assert ref["doi"].startswith("10.") and ref["title"] and ref["authors"] and ref["year"]
    assert CROSSWALK_SOURCES["MI-CLAIM"]["section_level_only"]


def test_crosswalk_frame():
    frame = crosswalk_frame()
    assert list(frame.index) == list(ITEM_IDS)
    assert list(frame.columns) == list(GUIDELINES)
    assert (frame != "").all().all()
    assert frame.loc["split", "CLAIM 2024"] == "7, 19, 20, 36"


# --------------------------------------------------------------------------- complete / missing


def test_full_evidence_is_complete():
    cl = build_checklist(_full(), run_id="run-1")
    assert cl.n_complete == 7 and cl.n_missing == 0
    assert all(e.status == "complete" and e.problems == [] for e in cl.items)
    assert cl["split"].fields["partition_auc_normal"]["estimate"] == 0.88  # extra field kept
    assert "effect" not in cl["split"].fields
    assert cl["split"].effect_value == pytest.approx(0.71)


def test_empty_evidence_is_all_missing():
    cl = build_checklist({})
    assert cl.n_complete == 0 and cl.n_missing == 7
    for entry in cl.items:
        assert entry.status == "missing"
        assert entry.problems and all("not recorded" in p for p in entry.problems)
        assert entry.effect is None and entry.fields == {}


def test_none_item_is_not_recorded():
    ev = _full()
    ev["calibration"] = None
    cl = build_checklist(ev)
    assert cl["calibration"].status == "missing"
    assert "not recorded" in cl["calibration"].problems[0]
    assert cl.n_complete == 6


@pytest.mark.parametrize(
    "item_id, changes, reason",
    [
        ("threshold", {"fitted_on": "test"}, "threshold fitted on the test split"),
        ("threshold", {"fitted_on": "Official test split"}, "threshold fitted on the test split"),
        ("calibration", {"fitted_on": "test"}, "calibration fitted on the test split"),
        ("split", {"patients_disjoint": False}, "a patient appears in more than one split"),
        ("split", {"patients_disjoint": "yes"}, "patients_disjoint must be True or False"),
        ("metrics", {"reported": ["auroc", "sensitivity"]}, "balanced_accuracy"),
        ("metrics", {"reported": "balanced_accuracy"}, "must be a list"),
        ("uncertainty", {"seeds": [0]}, "at least 2 seeds"),
        ("uncertainty", {"seeds": [3, 3]}, "at least 2 seeds"),
        ("uncertainty", {"split_level": {}}, "split_level is empty"),
        ("uncertainty", {"confidence": 1.0}, "confidence must be between 0 and 1"),
        ("uncertainty", {"n_resamples": 0}, "n_resamples must be an integer > 0"),
        ("uncertainty", {"n_resamples": True}, "n_resamples must be an integer > 0"),
        ("training_policy", {"policies_compared": ["frozen"]}, "'finetuned'"),
        ("shortcut", {"features": []}, "features is empty"),
        ("shortcut", {"pool_balanced_accuracy": {"estimate": 0.9, "low": 0.95, "high": 0.85}}, "is above"),
        ("shortcut", {"test_balanced_accuracy": {"estimate": 0.5}}, "lacks low, high"),
        ("split", {"partition_auc": 0.7}, "must be a mapping with estimate, low and high"),
        ("calibration", {"ece_after": -0.1}, "between 0.0 and 1.0"),
        ("split", {"provenance": "  "}, "non-empty string"),
    ],
)
def test_each_check_makes_the_item_missing(item_id, changes, reason):
    cl = build_checklist(_with(item_id, **changes))
    entry = cl[item_id]
    assert entry.status == "missing"
    assert any(reason in p for p in entry.problems), entry.problems
    assert cl.n_complete == 6  # the others stay complete


@pytest.mark.parametrize(
    "item_id, field_name",
    [(spec.item_id, name) for spec in ITEMS for name in spec.required if name != "effect"],
)
def test_each_required_field_when_absent_makes_the_item_missing(item_id, field_name):
    entry = build_checklist(_with(item_id, **{field_name: _DROP}))[item_id]
    assert entry.status == "missing"
    assert f"{field_name} not recorded" in entry.problems


@pytest.mark.parametrize(
    "item_id, changes",
    [
        ("calibration", {"ece_before": NAN}),
        ("uncertainty", {"confidence": NAN}),
        ("threshold", {"fitted_on": NAN}),
        ("split", {"partition_auc": {"estimate": NAN, "low": 0.6, "high": 0.8}}),
        ("uncertainty", {"split_level": {"n_partitions": 5, "spread": NAN}}),
        ("uncertainty", {"seeds": [0, NAN]}),
        ("shortcut", {"test_balanced_accuracy": {"estimate": 0.5, "low": np.float64("nan"), "high": 0.6}}),
        ("metrics", {"effect": _effect("balanced accuracy", NAN, "balanced accuracy")}),
    ],
)
def test_nan_in_a_required_field_is_never_complete(item_id, changes):
    entry = build_checklist(_with(item_id, **changes))[item_id]
    assert entry.status == "missing"
    assert any("NaN" in p for p in entry.problems), entry.problems


def test_missing_effect_makes_the_item_missing():
    for spec in ITEMS:
        entry = build_checklist(_with(spec.item_id, effect=_DROP))[spec.item_id]
        assert entry.status == "missing"
        assert entry.problems == ["no measured effect recorded"]


def test_incomplete_effect_is_missing():
    effect = {"description": "x", "value": 0.1}  # no unit, no source
    entry = build_checklist(_with("threshold", effect=effect))["threshold"]
    assert entry.status == "missing"
    assert "effect.unit not recorded" in entry.problems and "effect.source not recorded" in entry.problems
    entry = build_checklist(_with("threshold", effect=_effect("x", 0.1, "AUROC", low=0.2)))["threshold"]
    assert any("low and high" in p for p in entry.problems)


def test_accepts_numpy_values_and_name_variants():
    ev = _full()
    ev["split"]["patients_disjoint"] = np.bool_(True)
    ev["uncertainty"]["n_resamples"] = np.int64(500)
    ev["uncertainty"]["confidence"] = np.float32(0.9)
    ev["metrics"]["reported"] = ["AUROC", "Balanced accuracy"]
    ev["training_policy"]["policies_compared"] = ("Frozen", "FINETUNED")
    assert build_checklist(ev).n_complete == 7


def test_unknown_ids_are_kept_with_a_warning(caplog):
    ev = _full()
    ev["notes"] = {"anything": 1}
    with caplog.at_level(logging.WARNING, logger="crslib.checklist"):
        cl = build_checklist(ev)
    assert cl.extra == {"notes": {"anything": 1}}
    assert cl.n_complete == 7
    assert any("notes" in r.getMessage() for r in caplog.records)
    assert "notes" in cl.to_markdown() and cl.to_dict()["extra"] == {"notes": {"anything": 1}}


def test_input_is_not_mutated():
    ev = _full()
    before = copy.deepcopy(ev)
    build_checklist(ev)
    assert ev == before


@pytest.mark.parametrize(
    "evidence, match",
    [
        ([("split", {})], "evidence must be a mapping"),
        ("split", "evidence must be a mapping"),
        ({"split": ["provenance"]}, r"evidence\['split'\] must be a mapping"),
        ({"threshold": "Youden"}, r"evidence\['threshold'\] must be a mapping"),
        ({1: {}}, "keys must be item ids"),
    ],
)
def test_bad_input_raises_input_error(evidence, match):
    with pytest.raises(InputError, match=match):
        build_checklist(evidence)


def test_bad_run_id_raises_input_error():
    with pytest.raises(InputError, match="run_id"):
        build_checklist({}, run_id=3)


# --------------------------------------------------------------------------- renderings


def test_to_json_round_trips_with_items_in_order():
    ev = _with("calibration", ece_before=NAN)
    ev["split"]["note_value"] = float("inf")
    cl = build_checklist(ev, run_id="r1")
    data = json.loads(cl.to_json())
    assert data["run_id"] == "r1"
    assert [i["number"] for i in data["items"]] == [1, 2, 3, 4, 5, 6, 7]
    assert [i["item_id"] for i in data["items"]] == list(ITEM_IDS)
    assert data["n_complete"] == 6 and data["n_missing"] == 1
    calib = data["items"][4]
    assert calib["status"] == "missing" and calib["fields"]["ece_before"] is None  # NaN -> null
    assert data["items"][0]["fields"]["note_value"] is None
    assert data["items"][0]["crosswalk"]["CLAIM 2024"] == ["7", "19", "20", "36"]
    assert json.loads(cl.to_json(indent=None)) == data


def test_to_dict_handles_numpy_scalars():
    ev = _full()
    ev["uncertainty"]["n_resamples"] = np.int64(500)
    ev["uncertainty"]["seeds"] = np.array([1, 2])
    data = build_checklist(ev).to_dict()
    json.dumps(data, allow_nan=False)
    unc = data["items"][5]["fields"]
    assert unc["n_resamples"] == 500 and unc["seeds"] == [1, 2]


def test_to_markdown_shows_titles_statuses_and_papers_numbers():
    ev = _with("threshold", fitted_on="test")
    md = build_checklist(ev, run_id="r2").to_markdown()
    assert md.startswith("# Reporting checklist (run r2)")
    for spec in ITEMS:
        assert f"## {spec.number}. {spec.title}" in md
    assert md.count("✅ reported") + md.count("⚠️ reported, with a concern") == 6
    assert "⚠️ reported, with a concern: a classifier tells the test split from the training pool (AUC 0.710" in md
    assert md.count("❌ missing") == 1
    assert "❌ missing: threshold fitted on the test split" in md
    for line in [ln for ln in md.splitlines() if any(n in ln for n in ("0.697", "0.044", "0.090", "0.992"))]:
        assert "paper" in line.lower()
    assert "0.697" in md and "0.992" in md and "0.496" in md
    # this run's measured effect with its CI, beside the paper's
    assert "0.710 AUC (CI 0.680 to 0.740)" in md
    assert "Youden J" in md  # recorded fields are shown
    for guideline in GUIDELINES:
        assert md.count(f"{guideline}: ") >= 7


def test_to_markdown_of_empty_run():
    md = build_checklist({}).to_markdown()
    assert md.startswith("# Reporting checklist\n")
    assert md.count("❌ missing") == 7 and "✅" not in md
    assert md.count("nothing recorded") == 7


def test_to_frame():
    cl = build_checklist(_with("uncertainty", seeds=[1]))
    frame = cl.to_frame()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame["number"]) == [1, 2, 3, 4, 5, 6, 7]
    assert list(frame["item"]) == list(ITEM_IDS)
    assert {"number", "item", "status", "effect_value", "paper_value", "problems"} <= set(frame.columns)
    row = frame.set_index("item").loc["uncertainty"]
    assert row["status"] == "missing" and "at least 2 seeds" in row["problems"]
    assert frame.set_index("item").loc["split", "effect_value"] == pytest.approx(0.71)
    assert frame.set_index("item").loc["split", "paper_value"] == pytest.approx(0.697)
    assert math.isnan(frame.set_index("item").loc["calibration", "paper_value"])
    empty = build_checklist({}).to_frame()
    assert empty["effect_value"].isna().all() and (empty["status"] == "missing").all()


def test_getitem_unknown_item():
    with pytest.raises(KeyError, match="no checklist item"):
        build_checklist({})["nope"]


def test_paper_values_match_the_quoted_numbers():
    for spec in ITEMS:
        if spec.paper_value is not None:
            assert f"{spec.paper_value:.3f}" in spec.paper_effect
            assert spec.paper_unit


# --------------------------------------------------------------------------- exact problem texts


@pytest.mark.parametrize(
    "item_id, changes, problem",
    [
        ("split", {"provenance": 3}, "provenance must be a non-empty string, got 3"),
        ("split", {"patients_disjoint": "yes"}, "patients_disjoint must be True or False, got 'yes'"),
        ("split", {"patients_disjoint": np.bool_(False)}, "a patient appears in more than one split"),
        ("split", {"partition_auc": [0.7]}, "partition_auc must be a mapping with estimate, low and high, got [0.7]"),
        ("split", {"partition_auc": {"estimate": 0.7}}, "partition_auc lacks low, high; record estimate, low and high"),
        ("split", {"partition_auc": {"estimate": 0.7, "low": 0.8, "high": 0.75}},
         "partition_auc.low (0.8) is above partition_auc.high (0.75)"),
        ("split", {"partition_auc": {"estimate": "high", "low": 0.6, "high": 0.8}},
         "partition_auc.estimate must be a number, got 'high'"),
        ("split", {"partition_auc": {"estimate": 1.5, "low": 0.6, "high": 0.8}},
         "partition_auc.estimate must be between 0.0 and 1.0, got 1.5"),
        ("split", {"partition_auc": {"estimate": 0.7, "low": -0.1, "high": 0.8}},
         "partition_auc.low must be between 0.0 and 1.0, got -0.1"),
        ("split", {"partition_auc": {"estimate": 0.7, "low": 0.6, "high": float("inf")}},
         "partition_auc.high is infinite; record a finite value"),
        ("split", {"partition_auc": {"estimate": 0.7, "low": NAN, "high": 0.8}},
         "partition_auc.low is NaN; record a finite value"),
        ("training_policy", {"policies_compared": ["frozen"]},
         "policies_compared lacks 'finetuned'; compare frozen and finetuned"),
        ("training_policy", {"policies_compared": ["linear probe"]},
         "policies_compared lacks 'frozen' and 'finetuned'; compare frozen and finetuned"),
        ("training_policy", {"policies_compared": "frozen"}, "policies_compared must be a list of strings, got 'frozen'"),
        ("training_policy", {"policies_compared": []}, "policies_compared is empty; list at least one entry"),
        ("training_policy", {"policies_compared": ["frozen", " "]},
         "policies_compared must contain only non-empty strings, got ' '"),
        ("threshold", {"fitted_on": "Test set"}, "threshold fitted on the test split"),
        ("metrics", {"reported": ["AUROC", "sensitivity"]}, "reported metrics lack 'balanced_accuracy'"),
        ("uncertainty", {"seeds": "0, 1"}, "seeds must be a list of seeds, got '0, 1'"),
        ("uncertainty", {"seeds": [0]}, "only 1 distinct seed recorded; run at least 2 seeds"),
        ("uncertainty", {"seeds": [0, NAN]}, "seeds[1] is NaN; record the seeds used"),
        ("uncertainty", {"split_level": 0.03},
         "split_level must be a mapping such as {'n_partitions': 5, 'spread': 0.03}, got 0.03"),
        ("uncertainty", {"split_level": {}}, "split_level is empty; record the spread over several splits"),
        ("uncertainty", {"split_level": {"spread": [0.1, NAN]}}, "split_level.spread[1] is NaN; record a finite value"),
        ("uncertainty", {"confidence": 0.0}, "confidence must be between 0 and 1 exclusive (e.g. 0.95), got 0.0"),
        ("uncertainty", {"confidence": "95%"}, "confidence must be a number, got '95%'"),
        ("uncertainty", {"n_resamples": 2.0}, "n_resamples must be an integer > 0, got 2.0"),
        ("calibration", {"ece_after": 1.2}, "ece_after must be between 0.0 and 1.0, got 1.2"),
        ("calibration", {"ece_before": True}, "ece_before must be a number, got True"),
        ("shortcut", {"features": ["format", 7]}, "features must contain only non-empty strings, got 7"),
        ("calibration", {"method": "x" * 80},
         None),  # a long but valid string is fine: no problem
    ],
)
def test_problem_texts_are_exact(item_id, changes, problem):
    entry = build_checklist(_with(item_id, **changes))[item_id]
    if problem is None:
        assert entry.status == "complete" and list(entry.problems) == []
    else:
        assert problem in list(entry.problems), entry.problems


def test_long_values_are_cut_in_problem_texts():
    entry = build_checklist(_with("split", provenance=["p" * 100]))["split"]
    # repr cut to 57 characters and "...": "['" and 55 letters
    assert list(entry.problems) == ["provenance must be a non-empty string, got ['" + "p" * 55 + "..."]


@pytest.mark.parametrize(
    "effect, problems",
    [
        ("big", ["effect must be a mapping with description, value, unit and source, got 'big'"]),
        ({"value": 0.1, "unit": "AUROC", "source": "grid"}, ["effect.description not recorded"]),
        ({"description": "d", "value": "x", "unit": "AUROC", "source": "grid"}, ["effect.value must be a number, got 'x'"]),
        ({"description": "d", "value": 0.1, "unit": "", "source": "grid"}, ["effect.unit must be a non-empty string, got ''"]),
        ({"description": "d", "value": 0.1, "unit": "u", "source": "grid", "paper": "n/a"},
         ["effect.paper must be a number, got 'n/a'"]),
        ({"description": "d", "value": 0.1, "unit": "u", "source": "grid", "low": 0.0},
         ["effect has only one of low and high; record both or neither"]),
        ({"description": "d", "value": 0.1, "unit": "u", "source": "grid", "high": 0.3},
         ["effect has only one of low and high; record both or neither"]),
        ({"description": "d", "value": 0.1, "unit": "u", "source": "grid", "low": 0.3, "high": 0.2},
         ["effect.low (0.3) is above effect.high (0.2)"]),
        ({"description": "d", "value": 0.1, "unit": "u", "source": "grid", "low": 0.2, "high": 0.2}, []),
    ],
)
def test_effect_problem_texts_are_exact(effect, problems):
    entry = build_checklist(_with("metrics", effect=effect))["metrics"]
    assert list(entry.problems) == problems
    assert entry.status == ("complete" if not problems else "missing")


@pytest.mark.parametrize(
    "item_id, changes, problem",
    [
        ("metrics", {"reported": ["AUROC", "roc_auc", "AUC", "balanced_accuracy"]}, None),
        ("metrics", {"reported": ["balanced-accuracy", "ROC AUC", "auc"]}, None),
        ("metrics", {"reported": "balanced_accuracy"}, "reported must be a list of strings, got 'balanced_accuracy'"),
        ("metrics", {"effect": _effect("", 0.8, "BA")}, "effect.description must be a non-empty string, got ''"),
        ("metrics", {"effect": {"description": "d", "value": 0.8, "unit": "BA", "source": " "}},
         "effect.source must be a non-empty string, got ' '"),
        ("metrics", {"effect": _effect("d", 0.8, "BA", low="a", high=0.9)}, "effect.low must be a number, got 'a'"),
        ("metrics", {"effect": _effect("d", 0.8, "BA", low=0.7, high="b")}, "effect.high must be a number, got 'b'"),
    ],
)
def test_metric_names_and_effect_texts(item_id, changes, problem):
    entry = build_checklist(_with(item_id, **changes))[item_id]
    assert list(entry.problems) == ([] if problem is None else [problem])


def test_auroc_alone_lacks_balanced_accuracy():
    with pytest.raises(checklist._Bad) as info:
        checklist._check_reported_metrics(["auroc", "AUC", "roc-auc"])
    assert str(info.value) == "reported metrics lack 'balanced_accuracy'"


def test_markdown_lines_are_exact():
    ev = _full()
    ev["notes"] = {"machine": "2 cores", "ratio": 0.12345}
    md = build_checklist(ev, run_id="r1").to_markdown()
    lines = md.splitlines()
    assert lines[0] == "# Reporting checklist (run r1)"
    assert lines[2] == ("7 of 7 items complete. Numbers marked *Paper* are the paper's (study 2), not this run's.")
    assert "## 1. " + ITEMS[0].title in lines
    assert "**Status:** ✅ reported" in lines
    # no confidence recorded: the interval's level is not claimed
    assert ("**Status:** ⚠️ reported, with a concern: a classifier tells the test split from the training pool "
            "(AUC 0.710, interval 0.680-0.740)") in lines
    assert ("- **Measured in this run:** partition classifier, test split vs pool: 0.710 AUC (CI 0.680 to 0.740) "
            "(paper: 0.697) — source: nb/02_protocol") in lines
    assert ("- **Recorded:** provenance: Kermany official train/test folders; validation carved from train by "
            "patient; patients_disjoint: True; partition_auc: 0.710 [0.680, 0.740]; partition_auc_normal: 0.880 "
            "[0.850, 0.910]") in lines
    assert ("- **Recorded:** confidence: 0.950; n_resamples: 2000; resampling: patient-grouped bootstrap; "
            "seeds: 0, 1, 2; split_level: {n_partitions: 5, spread: 0.030}") in lines
    assert lines[-3:] == ["## Other evidence", "", "- **notes:** {machine: 2 cores, ratio: 0.123}"]
    walk = [line for line in lines if line.startswith("- **Crosswalk:**")]
    assert len(walk) == 7 and " · " in walk[0]
    missing = build_checklist(_with("threshold", fitted_on="test")).to_markdown()
    assert "**Status:** ❌ missing: threshold fitted on the test split" in missing.splitlines()
    assert "6 of 7 items complete." in missing and build_checklist({}).to_markdown().startswith(
        "# Reporting checklist\n")


def test_numbers_and_values_as_shown():
    assert checklist._num(0.5) == "0.500" and checklist._num(1234.5) == "1.23e+03"
    assert checklist._num(0.0004) == "0.0004" and checklist._num(0) == "0.000" and checklist._num(-0.5) == "-0.500"
    assert checklist._num(1000) == "1e+03" and checklist._num(0.001) == "0.001"
    assert checklist._num(NAN) == "NaN" and checklist._num(True) == "True" and checklist._num("a\n b") == "a b"
    assert checklist._num(None) == "None"
    assert checklist._show({"estimate": 0.5, "low": 0.25, "high": 0.75}) == "0.500 [0.250, 0.750]"
    assert checklist._show({"a": [1, 2.5], "b": "x  y"}) == "{a: 1, 2.500, b: x y}"
    assert checklist._show(3) == "3" and checklist._show(np.float64(0.25)) == "0.250" and checklist._show(True) == "True"
    assert checklist._describe_effect(None) == "nothing recorded"
    assert checklist._describe_effect({"value": 0.5}) == "0.500"
    assert checklist._describe_effect({"value": 0.5, "low": 0.4}) == "0.500"
    assert checklist._describe_effect({"description": "gap", "value": 0.5, "unit": "AUROC", "low": 0.4,
                                       "high": 0.6, "paper": 0.044, "source": "nb 04"}) == (
        "gap: 0.500 AUROC (CI 0.400 to 0.600) (paper: 0.044) — source: nb 04")
    assert checklist._paper_line("Paper: 0.697 AUC") == "**Paper:** 0.697 AUC"
    assert checklist._paper_line("0.697 AUC") == "**Paper:** 0.697 AUC"
    assert checklist._paper_line("paper : x") == "**Paper:** x"
    assert checklist._join_ids(("1a", "2b")) == "1a, 2b" and checklist._join_ids(("Item 1", "2")) == "Item 1; 2"


def test_frame_dict_and_json_values():
    cl = build_checklist(_with("calibration", effect=_effect("ECE", float("inf"), "ECE")), run_id="x")
    frame = cl.to_frame()
    assert list(frame.columns) == ["number", "item", "title", "status", "effect_value", "effect_unit",
                                   "paper_value", "problems", "concern"]
    row = frame.set_index("item").loc["split"]
    assert (row["number"], row["status"], row["effect_value"], row["effect_unit"], row["problems"]) == (
        1, "complete", 0.71, "AUC", "")
    assert np.isnan(frame.set_index("item").loc["calibration", "effect_value"])  # infinite: not a value
    assert frame["effect_value"].dtype == float and frame["paper_value"].dtype == float
    assert frame.set_index("item").loc["split", "paper_value"] == cl["split"].paper_value
    empty = build_checklist({}).to_frame()
    assert empty["effect_unit"].isna().all() and empty["effect_value"].isna().all()
    assert empty.loc[0, "problems"].startswith("not recorded in this run (needs ")
    entry = cl["split"].to_dict()
    assert list(entry) == ["number", "item_id", "title", "status", "problems", "fields", "effect", "paper_effect",
                           "paper_value", "paper_unit", "what_to_report", "concern", "crosswalk"]
    assert entry["number"] == 1 and entry["status"] == "complete" and entry["problems"] == []
    assert entry["fields"]["partition_auc"] == {"estimate": 0.71, "low": 0.68, "high": 0.74}
    assert entry["effect"]["paper"] == 0.697 and isinstance(entry["crosswalk"]["CLAIM 2024"], list)
    text = cl.to_json()
    assert json.loads(text)["items"][4]["effect"]["value"] is None  # infinity becomes null
    assert text == json.dumps(cl.to_dict(), indent=2, ensure_ascii=False, allow_nan=False)  # two-space indent
    assert "\n" not in cl.to_json(indent=None)
    assert "✅" not in text
    with pytest.raises(KeyError, match="no checklist item 'seed'; items are split, training_policy"):
        cl["seed"]


# --------------------------------------------------------------------------- boundaries and texts, exactly


@pytest.mark.parametrize(
    "item_id, changes",
    [
        ("calibration", {"ece_after": 0.0, "ece_before": 1.0}),  # both ends of [0, 1] are allowed
        ("split", {"partition_auc": {"estimate": 0.7, "low": 0.7, "high": 0.7}}),  # a zero-width interval
        ("uncertainty", {"n_resamples": 1, "seeds": [0, 1]}),
        ("uncertainty", {"seeds": [object(), object()]}),  # seeds that are not JSON still count
    ],
)
def test_edge_values_are_complete(item_id, changes):
    entry = build_checklist(_with(item_id, **changes))[item_id]
    assert entry.status == "complete", entry.problems


@pytest.mark.parametrize(
    "item_id, changes, problems",
    [
        ("training_policy", {"policies_compared": {"frozen": 1}},
         ["policies_compared must be a list of strings, got {'frozen': 1}"]),
        ("uncertainty", {"seeds": {"a": 0, "b": 1}}, ["seeds must be a list of seeds, got {'a': 0, 'b': 1}"]),
        ("threshold", {"fitted_on": ""}, ["fitted_on must be a non-empty string, got ''"]),
        ("calibration", {"method": None, "ece_before": NAN, "ece_after": 2.0},
         ["method not recorded", "ece_before is NaN; record a finite value", "ece_after must be between 0.0 and 1.0, got 2.0"]),
        ("split", {"provenance": "x" * 58}, []),
        ("split", {"provenance": ["a" * 56]}, ["provenance must be a non-empty string, got ['" + "a" * 56 + "']"]),
        ("split", {"provenance": ["a" * 57]}, ["provenance must be a non-empty string, got ['" + "a" * 55 + "..."]),
    ],
)
def test_all_problems_of_an_item_in_order(item_id, changes, problems):
    assert list(build_checklist(_with(item_id, **changes))[item_id].problems) == problems


def test_texts_of_missing_items_badges_and_frames():
    empty = build_checklist({})
    spec = ITEMS[0]
    assert list(empty["split"].problems) == [f"not recorded in this run (needs {', '.join(spec.required)})"]
    assert empty["split"].what_to_report == spec.what_to_report and empty["split"].paper_unit == spec.paper_unit
    full = build_checklist(_full())
    assert full["split"].what_to_report == spec.what_to_report and full["split"].paper_unit == spec.paper_unit
    two = build_checklist(_with("calibration", method=None, ece_after=2.0))
    assert two.to_frame().set_index("item").loc["calibration", "problems"] == (
        "method not recorded; ece_after must be between 0.0 and 1.0, got 2.0")
    lines = two.to_markdown().splitlines()
    assert "**Status:** ❌ missing: method not recorded; ece_after must be between 0.0 and 1.0, got 2.0" in lines
    assert lines[1] == "" and lines[3] == ""
    for i, line in enumerate(lines):
        if line.startswith("## "):
            assert lines[i - 1] == "" and lines[i + 1] == ""
        if line.startswith("**Status:**"):
            assert lines[i - 1] == "" and lines[i + 1] == ""
    walk = next(line for line in lines if line.startswith("- **Crosswalk:**"))
    ids = full["split"].crosswalk
    assert walk == "- **Crosswalk:** " + " · ".join(f"{g}: {checklist._join_ids(v)}" for g, v in ids.items())
    with_extra = build_checklist({**_full(), "notes": {"a": 1}}).to_markdown().splitlines()
    assert with_extra[-4:] == ["", "## Other evidence", "", "- **notes:** {a: 1}"]
    frame = crosswalk_frame()
    assert frame.index.name == "item" and frame.columns.name == "guideline"


def test_paper_lines_json_text_and_effect_copy():
    assert checklist._paper_line("Paper: 0.697 AUC: pool vs test") == "**Paper:** 0.697 AUC: pool vs test"
    assert checklist._paper_line("AUC: 0.697") == "**Paper:** AUC: 0.697"
    assert "é" in build_checklist({}, run_id="é").to_json()
    ev = _full()
    cl = build_checklist(ev)
    ev["split"]["effect"]["value"] = 0.0  # changing the evidence afterwards does not change the checklist
    assert cl["split"].effect["value"] == 0.71


def test_evidence_type_messages_and_extra_ids(caplog):
    ids = ", ".join(ITEM_IDS)
    with pytest.raises(InputError) as info:
        build_checklist([("split", {})])
    assert str(info.value) == (
        f"evidence must be a mapping of item id to recorded fields, got list; pass a dict such as "
        f"{{'split': {{...}}}} with ids from {ids}")
    with pytest.raises(InputError) as info:
        build_checklist({}, run_id=7)
    assert str(info.value) == "run_id must be a string or None, got int"
    with pytest.raises(InputError) as info:
        build_checklist({3: {}})
    assert str(info.value) == f"evidence keys must be item ids (strings), got 3; ids are {ids}"
    with pytest.raises(InputError) as info:
        build_checklist({"split": [1]})
    assert str(info.value) == (
        "evidence['split'] must be a mapping of field name to value, got list; record the item as a dict with "
        f"fields {', '.join(ITEMS[0].required)}")
    with caplog.at_level(logging.WARNING, logger="crslib.checklist"):
        build_checklist({"zeta": {}, "alpha": {}})
    assert [r.getMessage() for r in caplog.records] == [
        f"evidence has ids that are not checklist items, kept under 'extra': alpha, zeta (items are {ids})"]


def test_paper_numbers_have_one_home_and_the_checklist_quotes_them():
    from crslib import paper, protocol

    assert paper.value("shortcut_test") == 0.496 and paper.claim("shortcut_test").study == "kermany"
    assert paper.value("public_pair_overlap") == 0.091 and paper.value("map_fit_images") == 4096
    items = {spec.item_id: spec for spec in ITEMS}
    assert items["split"].paper_value == paper.value("partition_auc")
    assert items["training_policy"].paper_value == paper.value("policy_effect")
    assert items["threshold"].paper_value == paper.value("threshold_effect")
    assert items["uncertainty"].paper_value is None  # its effect is a split-level range, not a backbone spread
    assert items["shortcut"].paper_value == paper.value("shortcut_pool")
    assert "0.992" in items["shortcut"].paper_effect and "0.496" in items["shortcut"].paper_effect
    assert "0.044" in items["training_policy"].paper_effect and "0.026" in items["training_policy"].paper_effect
    assert protocol.PAPER_EFFECTS["rule"]["value"] == paper.value("threshold_effect")
    assert protocol.PAPER_EFFECTS["rule"]["text"].endswith("by 0.090")
    frame = paper.claims_frame("risk")
    assert set(frame["study"]) == {"risk"} and frame.loc["age_mae_siglip2", "value"] == 4.786
    assert len(paper.claims_frame()) == len(paper.CLAIMS)
    with pytest.raises(InputError, match="no paper number 'nope'"):
        paper.value("nope")
    with pytest.raises(InputError, match="study must be one of"):
        paper.claims_frame("mnist")


def test_concern_is_the_evidence_showing_a_problem_not_its_absence():
    from crslib.checklist import item_concern

    found = {"pool_balanced_accuracy": {"estimate": 0.95, "low": 0.9, "high": 0.98}}
    at_chance = {"pool_balanced_accuracy": {"estimate": 0.52, "low": 0.45, "high": 0.6}}
    assert item_concern("shortcut", found, None).startswith("file properties alone predict the label")
    assert item_concern("shortcut", at_chance, None) == ""
    assert item_concern("split", {}, {"value": 0.7, "low": 0.51, "high": 0.8}).startswith("a classifier tells")
    assert item_concern("split", {}, {"value": 0.7, "low": 0.5, "high": 0.8}) == ""  # the bound itself: no
    assert item_concern("calibration", {}, {"value": 0.01}) == "calibration fitted on validation made the test ECE worse (by 0.010)"
    assert item_concern("calibration", {}, {"value": -0.05}) == ""
    assert item_concern("threshold", found, {"value": 0.9, "low": 0.8, "high": 1.0}) == ""  # no rule for it
    ev = _full()
    cl = build_checklist(ev)
    assert cl["split"].concern and cl["split"].complete
    assert not cl["metrics"].concern
    ev["split"]["effect"]["low"] = 0.4
    assert build_checklist(ev)["split"].concern == ""
    missing = build_checklist(_with("split", patients_disjoint=None))
    assert not missing["split"].complete and missing["split"].concern == ""  # a missing item is not a concern


# --------------------------------------------------------------------------- item 1: duplicates and shared patients


def _leakage(**counts) -> dict:
    base = {"exact_duplicates_across": 0, "exact_test_images": 0, "embedding_duplicates_across": 0,
            "embedding_test_images": 0, "near_duplicates_across": 0, "near_test_images": 0, "near_informative": True,
            "possible_same_patients_across": 0, "possible_same_patient_test_images": 0, "n_test_images": 150}
    return {**base, **counts}


def test_split_concern_from_duplicates_and_possible_same_patients_across_the_split():
    from crslib.checklist import item_concern

    at_chance = {"value": 0.52, "low": 0.45, "high": 0.6}
    assert item_concern("split", {"leakage": _leakage()}, at_chance) == ""
    assert item_concern("split", {"leakage": _leakage(exact_duplicates_across=3, exact_test_images=4)}, at_chance) == (
        "exact duplicate images cross the split (3 clusters, 4 test images)")
    assert item_concern("split", {"leakage": _leakage(embedding_duplicates_across=2, embedding_test_images=2)},
                        at_chance) == "embedding near duplicates cross the split (2 clusters, 2 test images)"
    patients = item_concern("split", {"leakage": _leakage(possible_same_patients_across=60,
                                                          possible_same_patient_test_images=150)}, at_chance)
    assert patients == ("possibly the same patients in the training pool and the test split (60 person numbers in "
                        "both, 150 test images)")
    # a near-duplicate measure that does not tell the images apart is no concern; an informative one is
    near = dict(near_duplicates_across=2, near_test_images=140)
    assert item_concern("split", {"leakage": _leakage(near_informative=False, **near)}, at_chance) == ""
    assert item_concern("split", {"leakage": _leakage(**near)}, at_chance).startswith("near duplicate images (pHash)")
    leak = _leakage(exact_duplicates_across=1, exact_test_images=1)
    both = item_concern("split", {"leakage": leak, "confidence": 0.9}, {"value": 0.7, "low": 0.6, "high": 0.8})
    assert both == ("a classifier tells the test split from the training pool (AUC 0.700, 90% interval 0.600-0.800); "
                    "exact duplicate images cross the split (1 clusters, 1 test images)")
    # not measured: reported as such among the recorded fields, no concern of its own
    ev = _with("split", leakage="not measured: no image fingerprints were given")
    ev["split"]["effect"]["low"] = 0.4
    entry = build_checklist(ev)["split"]
    assert entry.complete and entry.concern == ""
    assert "leakage: not measured: no image fingerprints were given" in build_checklist(ev).to_markdown()


def test_concern_labels_intervals_with_the_recorded_confidence():
    from crslib.checklist import item_concern

    found = {"pool_balanced_accuracy": {"estimate": 0.95, "low": 0.9, "high": 0.98}}
    assert item_concern("shortcut", {**found, "confidence": 0.9}, None).endswith("(balanced accuracy 0.950, 90% "
                                                                                 "interval 0.900-0.980)")
    assert item_concern("shortcut", found, None).endswith("(balanced accuracy 0.950, interval 0.900-0.980)")
    assert "95%" not in item_concern("split", {}, {"value": 0.7, "low": 0.51, "high": 0.8})


def test_concern_rules_are_strict_at_their_bounds_and_read_only_finite_numbers():
    from crslib.checklist import item_concern

    def shortcut(low, **fields):
        return item_concern("shortcut", {"pool_balanced_accuracy": {"estimate": 0.9, "low": low, "high": 0.95},
                                         **fields}, None)

    assert shortcut(0.5) == ""  # an interval that reaches chance shows nothing
    assert shortcut(0.51).startswith("file properties alone predict the label")
    # a bound that is not a finite number is no evidence of a shortcut
    for low in (None, True, math.inf, NAN, "0.8"):
        assert shortcut(low) == "", low
    assert item_concern("calibration", {}, {"value": 0.0}) == ""  # no change is not worse
    assert item_concern("calibration", {}, {"value": True}) == ""
    # only a confidence strictly between 0 and 1 labels the interval
    for confidence, label in ((0.9, "90% interval"), (0, "interval"), (1, "interval"), (1.5, "interval"),
                              (True, "interval"), ("0.9", "interval")):
        assert shortcut(0.6, confidence=confidence).endswith(f", {label} 0.600-0.950)"), confidence


def test_leakage_counts_that_are_absent_or_not_integers_count_as_zero():
    from crslib.checklist import item_concern

    at_chance = {"value": 0.52, "low": 0.45, "high": 0.6}
    # only the exact counts recorded: the other kinds are absent, not crossing
    only_exact = {"exact_duplicates_across": 2, "exact_test_images": 3}
    assert item_concern("split", {"leakage": only_exact}, at_chance) == (
        "exact duplicate images cross the split (2 clusters, 3 test images)")
    assert item_concern("split", {"leakage": {}}, at_chance) == ""
    for count in (True, 2.5, "2", None):
        assert item_concern("split", {"leakage": {"exact_duplicates_across": count}}, at_chance) == "", count


def test_a_missing_field_is_found_wherever_the_effect_comes_in_the_item():
    import dataclasses

    from crslib.checklist import _assess

    spec = next(s for s in ITEMS if s.item_id == "threshold")
    assert spec.required[-1] == "effect"
    effect_first = dataclasses.replace(spec, required=("effect", *spec.required[:-1]))
    recorded = {"effect": _full()["threshold"]["effect"], "fitted_on": "validation"}
    assert _assess(effect_first, recorded) == _assess(spec, recorded) == ["rule not recorded"]

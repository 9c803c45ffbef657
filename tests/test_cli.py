"""The `crs` command: help, exit statuses, one-line user errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

SUBCOMMANDS = ["phantom", "embed", "zoo", "compare", "audit", "risk", "checklist", "claims", "diff", "book"]


def crs(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crslib", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env=None if env is None else {**os.environ, **env})


def test_help_lists_every_subcommand() -> None:
    result = crs("--help")
    assert result.returncode == 0
    for name in SUBCOMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help(name: str) -> None:
    result = crs(name, "--help")
    assert result.returncode == 0
    assert f"usage: crs {name}" in result.stdout


@pytest.mark.parametrize("name", ["zoo", "book"])
def test_zoo_and_book_take_every_preset(name: str) -> None:
    # the full preset's factor zoo (initialisation, patient halves, recipe) is trained by `crs zoo` too
    result = crs(name, "--help")
    assert "--preset {quick,default,full}" in result.stdout


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_missing_config_file_is_one_line(tmp_path: Path) -> None:
    result = crs("book", "--config", str(tmp_path / "nope.yaml"))
    assert_one_line_error(result, "nope.yaml")


def test_missing_data_is_one_line(tmp_path: Path) -> None:
    result = crs("embed", "--data", str(tmp_path / "absent"), "--model", "timm:resnet18")
    assert_one_line_error(result, "absent")


def test_bad_model_spec_is_one_line(tmp_path: Path) -> None:
    crs("phantom", str(tmp_path / "p"), "--patients", "4", "--image-size", "32")
    result = crs("embed", "--data", str(tmp_path / "p"), "--model", "nonsense:thing")
    assert_one_line_error(result, "nonsense:thing")


def test_debug_shows_traceback(tmp_path: Path) -> None:
    result = crs("--debug", "book", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_phantom_then_embed_then_cache_hit(tmp_path: Path) -> None:
    out = tmp_path / "p"
    made = crs("phantom", str(out), "--patients", "12", "--image-size", "32", "--seed", "3")
    assert made.returncode == 0, made.stderr
    assert (out / "manifest.csv").is_file()
    spec = "timm:resnet18?size=32"
    own_cache = {"CRS_CACHE_DIR": str(tmp_path / "cache")}  # an earlier run's cache must not answer the first call
    first = crs("embed", "--data", str(out), "--model", spec, "--out", str(tmp_path / "X.npy"), env=own_cache)
    assert first.returncode == 0, first.stderr
    assert "computed" in first.stdout
    second = crs("embed", "--data", str(out), "--model", spec, "--out", str(tmp_path / "H.npy"), "--store",
                 "float16", env=own_cache)
    assert second.returncode == 0, second.stderr
    assert "cache hit" in second.stdout
    import numpy as np
    X = np.load(tmp_path / "X.npy")
    ids = np.load(tmp_path / "X_image_ids.npy")
    assert X.shape[0] == len(ids) > 0 and X.dtype == np.float32
    # the cache hit (its shards read from disk at assembly) gives the same rows, stored as float16
    half = np.load(tmp_path / "H.npy")
    assert half.dtype == np.float16 and np.array_equal(half, X.astype(np.float16))


def test_truncated_jpeg_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for index in range(3):
        Image.new("L", (40, 40), color=40 * index).save(folder / f"ok{index}.jpg", quality=90)
    good = (folder / "ok0.jpg").read_bytes()
    (folder / "broken.jpg").write_bytes(good[: len(good) // 2])
    result = crs("embed", "--data", str(folder), "--model", "timm:resnet18?size=32")
    assert_one_line_error(result, "broken.jpg")
    skipped = crs("embed", "--data", str(folder), "--model", "timm:resnet18?size=32", "--skip-unreadable")
    assert skipped.returncode == 0, skipped.stderr
    assert "broken.jpg" in skipped.stderr and "3 embeddings" in skipped.stdout


def test_audit_finds_the_injected_shortcut_in_a_kermany_layout_folder(tmp_path: Path) -> None:
    import json

    out = tmp_path / "kermany"
    made = crs("phantom", str(out), "--patients", "160", "--image-size", "32", "--seed", "1",
               "--kermany-layout", "--shortcut-strength", "1.0")
    assert made.returncode == 0, made.stderr
    assert (out / "chest_xray" / "test" / "PNEUMONIA").is_dir()
    # the folder in its own layout, as a user's Kermany copy would be given (no manifest)
    result = crs("audit", "--data", str(out / "chest_xray"), "--model", "none", "--resamples", "100",
                 "--out", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report" / "audit.json").read_text())
    table = {row["scope"]: row for row in report["shortcut"]["table"]}
    assert table["pool"]["balanced_accuracy"] >= 0.9
    assert abs(table["test"]["balanced_accuracy"] - 0.5) < 0.15
    assert "shortcut balanced accuracy (pool)" in result.stdout and "(95% CI " in result.stdout
    html = (tmp_path / "report" / "audit.html").read_text()
    assert "<table" in html and "0.992" in html and "src=\"http" not in html
    # the leakage audit ran by default: the phantom numbers the children of each split from 1, so every test
    # image's person number also occurs in the larger training pool (possible, here not actual, same patients)
    leakage = report["leakage"]
    counts = {row["kind"]: row for row in leakage["counts"]}
    assert list(counts) == ["exact", "near", "embedding", "patient"] and counts["embedding"]["counted"] == "not run"
    n_test = {s["split"]: s["images"] for s in report["provenance"]["splits"]}["test"]
    assert counts["patient"]["test_images"] == n_test and counts["patient"]["across"] > 0
    assert f"leakage: exact duplicates across pool and test: {counts['exact']['across']} clusters" in result.stdout
    assert "<h2>Duplicates and shared patients across the split</h2>" in html


def test_audit_writes_evidence_that_crs_checklist_reads(tmp_path: Path) -> None:
    import json

    data = tmp_path / "kermany"
    made = crs("phantom", str(data), "--patients", "80", "--image-size", "32", "--seed", "3",
               "--kermany-layout", "--shortcut-strength", "1.0")
    assert made.returncode == 0, made.stderr
    run = tmp_path / "run"
    result = crs("audit", "--data", str(data / "chest_xray"), "--model", "none", "--resamples", "50",
                 "--out", str(run / "audit"))
    assert result.returncode == 0, result.stderr
    assert "checklist evidence:" in result.stdout
    evidence = json.loads((run / "audit" / "evidence.json").read_text())
    report = json.loads((run / "audit" / "audit.json").read_text())
    assert set(evidence) == {"split", "shortcut"}
    pool = {row["scope"]: row for row in report["shortcut"]["table"]}["pool"]
    assert evidence["shortcut"]["pool_balanced_accuracy"]["estimate"] == pytest.approx(pool["balanced_accuracy"],
                                                                                      abs=1e-4)
    assert evidence["split"]["effect"]["source"] == "crs audit" and str(data / "chest_xray") in (
        evidence["split"]["provenance"])
    assert evidence["split"]["partition_model"] == "logistic regression on file properties"
    assert evidence["split"]["leakage"]["possible_same_patients_across"] == report["leakage"]["summary"]["patient"][
        "across_ids"] > 0
    # the folder holding the audit's report is a run folder for crs checklist
    checked = crs("checklist", str(run))
    assert checked.returncode == 0, checked.stderr
    assert "2 of 7 items complete" in checked.stdout
    saved = json.loads((run / "checklist.json").read_text())
    status = {item["item_id"]: item["status"] for item in saved["items"]}
    assert status["split"] == "complete" and status["shortcut"] == "complete"
    assert [k for k, v in status.items() if v == "missing"] == ["training_policy", "threshold", "metrics",
                                                                "calibration", "uncertainty"]


def test_audit_without_a_test_split_is_one_line(tmp_path: Path) -> None:
    import pandas as pd

    crs("phantom", str(tmp_path / "p"), "--patients", "10", "--image-size", "32")
    manifest = pd.read_csv(tmp_path / "p" / "manifest.csv")
    manifest["split"] = "train"
    manifest.to_csv(tmp_path / "p" / "manifest.csv", index=False)
    result = crs("audit", "--data", str(tmp_path / "p"), "--model", "none")
    assert_one_line_error(result, "test")


def test_checklist_marks_unrecorded_items_missing(tmp_path: Path) -> None:
    import json

    run = tmp_path / "run"
    (run / "results" / "05_audit").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "20261130T000000Z-quick"}))
    effect = {"description": "partition AUC", "value": 0.71, "unit": "AUC", "paper": 0.697, "source": "05"}
    (run / "results" / "05_audit" / "evidence.json").write_text(json.dumps({"split": {
        "provenance": "official split", "patients_disjoint": True,
        "partition_auc": {"estimate": 0.71, "low": 0.65, "high": 0.77}, "effect": effect}}))
    result = crs("checklist", str(run))
    assert result.returncode == 0, result.stderr
    assert "1 of 7 items complete" in result.stdout
    saved = json.loads((run / "checklist.json").read_text())
    status = {item["item_id"]: item["status"] for item in saved["items"]}
    assert status["split"] == "complete"
    assert [s for k, s in status.items() if k != "split"] == ["missing"] * 6
    strict = crs("checklist", str(run), "--strict")
    assert strict.returncode == 1
    assert_one_line_error(crs("checklist", str(tmp_path / "nowhere")), "nowhere")


def test_risk_on_a_phantom_folder_selects_on_validation_and_reports(tmp_path: Path) -> None:
    import pandas as pd

    out = tmp_path / "p"
    made = crs("phantom", str(out), "--patients", "60", "--image-size", "32", "--seed", "4")
    assert made.returncode == 0, made.stderr
    result = crs("risk", "--data", str(out), "--models", "timm:resnet10t?size=32&seed=0,timm:resnet10t?size=32&seed=1",
                 "--task", "label,age", "--partitions", "2", "--resamples", "100", "--out", str(tmp_path / "risk"))
    assert result.returncode == 0, result.stderr
    assert "label (classification): selected" in result.stdout and "age (regression): selected" in result.stdout
    candidates = pd.read_csv(tmp_path / "risk" / "candidates_label.csv")
    assert candidates["selected"].sum() == 1
    chosen = candidates[candidates["selected"]].iloc[0]
    selection = pd.read_csv(tmp_path / "risk" / "selection_table_label.csv").set_index("candidate")
    assert selection["chosen"].sum() == 1 and selection.loc[chosen["candidate"], "chosen"]
    # a single candidate within the noise of the lowest validation loss, or a combination with evidence
    row = selection.loc[chosen["candidate"]]
    assert (row["kind"] == "single" and row["gap_low"] <= 0) or (row["kind"] != "single" and row["gain_low"] > 0)
    assert (tmp_path / "risk" / "risk.html").read_text().startswith("<!DOCTYPE html>")
    # the tables RiskResult.save writes (as notebook 06 does), and the stability of both tasks
    for task in ("label", "age"):
        for stem in ("risk", "candidates", "comparisons", "partitions", "spread", "selection", "stability",
                     "selection_table", "refit", "metrics", "dropped"):
            assert (tmp_path / "risk" / f"{stem}_{task}.{'json' if stem == 'risk' else 'csv'}").is_file()
    stability = pd.read_csv(tmp_path / "risk" / "stability.csv", index_col=0)
    assert list(stability.index) == ["label", "age"]
    bad = crs("risk", "--data", str(out), "--models", "timm:resnet10t?size=32", "--task", "nosuchcolumn")
    assert_one_line_error(bad, "nosuchcolumn")


def test_compare_names_models_as_written_and_shows_the_changed_images(tmp_path: Path) -> None:
    import html
    import json

    made = crs("phantom", str(tmp_path / "p"), "--patients", "30", "--image-size", "32", "--seed", "2")
    assert made.returncode == 0, made.stderr
    old, new = "timm:resnet18?size=32", "timm:resnet18?size=32&seed=1"
    result = crs("compare", "--old", old, "--new", new, "--data", str(tmp_path / "p"), "--k", "5",
                 "--min-overlap", "0.9", "--resamples", "100", "--permutations", "19", "--out", str(tmp_path / "c"))
    # two differently seeded random networks share most neighbours at 32 px, but not 90%
    assert result.returncode == 1, result.stderr
    report = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert f"FAIL: lower 95% bound {report['overlap_low']:.3f} < minimum 0.900: fail" in result.stderr
    assert (report["old"], report["new"], report["reference"]) == (old, new, "timm:resnet18?seed=0&size=32")
    assert report["models"]["old"]["spec"] == old
    assert report["models"]["old"]["resolved"] == "timm:resnet18?seed=0&size=32"
    assert report["models"]["new"]["resolved"] == "timm:resnet18?seed=1&size=32"
    assert report["models"]["new"]["weights_sha256"] is None and len(report["models"]["new"]["fingerprint"]) >= 16
    assert report["decision"] == "lower" and report["null"]["n_permutations"] == 19
    assert len(report["largest_changes"]) == min(100, report["n_images"])
    page = (tmp_path / "c" / "report.html").read_text()
    assert f"<title>crs compare: {html.escape(old)} vs {html.escape(new)}</title>" in page
    section = page[page.index('<section id="changed-neighbours">'):]
    assert section[:section.index("</section>")].count("<img") == 12 * (1 + 2 * 5)


def test_audit_no_leakage_reads_no_image_twice(monkeypatch, tmp_path: Path) -> None:
    """--no-leakage: no fingerprints are computed and run_audit gets none (in process, the audit stubbed out)."""
    import pandas as pd

    import crslib.audit
    import crslib.data
    import crslib.duplicates
    from crslib.cli import main

    seen = {}

    class Stop(Exception):
        pass

    def fake_run_audit(manifest, properties, **options):
        seen.update(options)
        raise Stop

    manifest = pd.DataFrame({"image_id": ["a"], "path": ["a.png"], "split": ["train"], "label": [0]})
    monkeypatch.setattr(crslib.data, "load_data", lambda data: manifest)
    monkeypatch.setattr(crslib.data, "file_properties", lambda m, progress=None: m[["image_id"]])
    monkeypatch.setattr(crslib.duplicates, "image_fingerprints", lambda m: "fingerprints of " + m["image_id"][0])
    monkeypatch.setattr(crslib.audit, "run_audit", fake_run_audit)
    for flags, expected in (([], "fingerprints of a"), (["--no-leakage"], None)):
        seen.clear()
        with pytest.raises(Stop):
            main(["audit", "--data", "x", "--model", "none", "--out", str(tmp_path), *flags])
        assert seen["fingerprints"] == expected

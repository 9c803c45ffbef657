"""The model-replacement check: known answers, the gate, the report, the CLI exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crslib.compare import binary_label_frame, compare_embeddings
from crslib.errors import InputError
from crslib.reports import render_report_html


@pytest.fixture()
def case():
    rng = np.random.default_rng(0)
    n = 300
    X = rng.normal(size=(n, 12))
    metadata = pd.DataFrame({"patient_id": np.arange(n) // 2, "source": rng.choice(["s0", "s1"], n),
                             "view": rng.choice(["PA", "AP"], n)})
    labels = pd.DataFrame({"finding_a": (X[:, 0] > 0).astype(int), "finding_b": (X[:, 1] > 0.3).astype(int)})
    return X, metadata, labels, rng


def test_rotated_successor_passes_and_keeps_auroc(case) -> None:
    X, metadata, labels, rng = case
    rotation, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    result = compare_embeddings(X, 3.0 * X @ rotation, metadata, X_reference=rng.normal(size=X.shape),
                                labels=labels, min_overlap=0.9, n_resamples=100)
    assert result.overlap == pytest.approx(1.0)
    assert result.passed is True
    assert result.reference_overlap < 0.2
    assert result.map_r2 > 0.99
    assert all(row["retention"] == pytest.approx(1.0, abs=0.01) for row in result.transfer)
    assert {row["column"] for row in result.subgroups} == {"source", "view"}


def test_unrelated_successor_fails_the_gate(case) -> None:
    X, metadata, _, rng = case
    result = compare_embeddings(X, rng.normal(size=X.shape), metadata, min_overlap=0.2, n_resamples=100)
    assert result.overlap_high < 0.2 and result.passed is False
    assert abs(result.overlap - result.chance) < 0.02
    assert result.map_r2 < 0.1
    page = render_report_html(result)
    assert page.count("data:image/png;base64,") >= 2 and "FAIL" in page
    # the JSON crs compare writes: the inputs' sizes, the numbers and the verdict of the gate
    report = json.loads(result.to_json())
    assert "per_image" not in report
    assert (report["old"], report["new"], report["n_images"], report["k"]) == ("old", "new", len(X), 10)
    assert report["chance"] == pytest.approx(10 / (len(X) - 1))
    assert report["overlap"] == pytest.approx(result.overlap)
    assert report["overlap"] == pytest.approx(np.mean(result.per_image))
    assert report["overlap_low"] <= report["overlap"] <= report["overlap_high"] < 0.2
    assert report["min_overlap"] == 0.2 and report["passed"] is False
    assert report["reference"] is None and report["reference_overlap"] is None and report["transfer"] == []
    assert {row["column"] for row in report["subgroups"]} == {"source", "view"}
    assert {role: info["index"] for role, info in report["search"].items()} == {"old": "exact", "new": "exact"}
    assert report["overlap_error_bound"] == 0.0


def test_report_escapes_model_names_and_subgroup_values(case) -> None:
    from crslib.reports import CSS

    X, metadata, _, rng = case
    metadata = metadata.assign(source=np.where(metadata["source"] == "s0", "<b>site</b>", "a&b"))
    result = compare_embeddings(X, X + 0.1 * rng.normal(size=X.shape), metadata, old="<script>old",
                                new='new"&<x>', n_resamples=50)
    page = render_report_html(result)
    assert page.startswith("<!DOCTYPE html>") and f"<style>{CSS}</style>" in page
    assert "<script" not in page and "<b>site</b>" not in page and '"&<x>' not in page
    assert "&lt;script&gt;old" in page and "new&quot;&amp;&lt;x&gt;" in page
    assert "&lt;b&gt;site&lt;/b&gt;" in page and "a&amp;b" in page


def test_cli_writes_the_json_and_exits_by_the_gate(tmp_path: Path, monkeypatch, capsys) -> None:
    """crs compare in-process, with stand-in encoders: compare.json holds what the inputs imply and the
    exit status follows --min-overlap."""
    from types import SimpleNamespace

    import crslib.data
    import crslib.embed
    import crslib.models
    from crslib.cli import main

    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 8))
    embeddings = {"old-model": X, "scaled": 2.0 * X, "unrelated": rng.normal(size=X.shape)}
    manifest = pd.DataFrame({"image_id": [f"i{i}" for i in range(120)], "patient_id": np.arange(120) // 2})
    monkeypatch.setattr(crslib.data, "load_data", lambda spec: manifest)
    monkeypatch.setattr(crslib.models, "load_encoder", lambda spec: SimpleNamespace(name=spec))
    monkeypatch.setattr(crslib.embed, "extract_embeddings",
                        lambda m, encoder, **kw: SimpleNamespace(X=embeddings[encoder.name]))

    def compare(new: str, *gate: str) -> tuple[int, dict, str]:
        out = tmp_path / new
        status = main(["compare", "--old", "old-model", "--new", new, "--data", "stub", "--no-reference",
                       "--resamples", "50", "--out", str(out), *gate])
        return status, json.loads((out / "compare.json").read_text()), capsys.readouterr().err

    status, report, err = compare("scaled", "--min-overlap", "0.9")
    assert status == 0 and err == ""
    assert (report["old"], report["new"], report["n_images"], report["k"]) == ("old-model", "scaled", 120, 10)
    assert report["overlap"] == pytest.approx(1.0) and report["min_overlap"] == 0.9 and report["passed"] is True
    assert report["reference"] is None and report["chance"] == pytest.approx(10 / 119)

    status, report, err = compare("unrelated", "--min-overlap", "0.5")
    assert status == 1
    assert report["overlap_high"] < 0.5 and report["min_overlap"] == 0.5 and report["passed"] is False
    assert f"FAIL: the overlap's upper CI bound {report['overlap_high']:.3f} is below --min-overlap 0.500" in err

    status, report, err = compare("unrelated")  # no gate: no verdict, exit 0
    assert status == 0 and report["min_overlap"] is None and report["passed"] is None


def test_label_frame_binarises_named_classes() -> None:
    frame = binary_label_frame(pd.DataFrame({"label": ["NORMAL", "PNEUMONIA", "NORMAL"]}), ["label"])
    assert frame.columns.tolist() == ["label=PNEUMONIA"] and frame.iloc[:, 0].tolist() == [0, 1, 0]
    with pytest.raises(InputError, match="single value"):
        binary_label_frame(pd.DataFrame({"label": [1, 1]}), ["label"])
    with pytest.raises(InputError, match="not in the manifest"):
        binary_label_frame(pd.DataFrame({"label": [1, 0]}), ["finding_x"])


def test_mismatched_rows_are_an_error(case) -> None:
    X, metadata, _, _ = case
    with pytest.raises(InputError, match="row counts differ"):
        compare_embeddings(X, X[:-1], metadata)


@pytest.mark.slow
def test_cli_exit_status_gates_an_upgrade(tmp_path: Path) -> None:
    data = "phantom?patients=40&size=32&seed=1"

    def compare(new: str, minimum: str, out: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "crslib", "compare", "--old", "timm:resnet18?size=32", "--new", new,
             "--data", data, "--min-overlap", minimum, "--resamples", "100", "--out", str(tmp_path / out),
             "--labels", "finding_opacity"],
            capture_output=True, text=True, timeout=600)

    same = compare("timm:resnet18?size=32", "0.9", "same")
    assert same.returncode == 0, same.stderr
    report = json.loads((tmp_path / "same" / "compare.json").read_text())
    assert report["overlap"] == pytest.approx(1.0) and report["passed"] is True
    assert (tmp_path / "same" / "report.html").read_text().count("<img") >= 2
    other = compare("timm:resnet18?seed=1&size=32", "0.95", "other")
    assert other.returncode == 1, other.stderr
    assert "FAIL" in other.stderr
    assert json.loads((tmp_path / "other" / "compare.json").read_text())["passed"] is False

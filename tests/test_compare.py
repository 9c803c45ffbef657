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
    # as load_encoder does, the encoder's name is the resolved spec, not the one the user wrote
    monkeypatch.setattr(crslib.models, "load_encoder", lambda spec: SimpleNamespace(
        name=f"resolved:{spec}?weights=/cache/x.safetensors", spec=spec, fingerprint=lambda: f"fp-{spec}"))
    monkeypatch.setattr(crslib.embed, "extract_embeddings",
                        lambda m, encoder, **kw: SimpleNamespace(X=embeddings[encoder.spec]))

    def compare(new: str, *gate: str) -> tuple[int, dict, str]:
        out = tmp_path / new
        status = main(["compare", "--old", "old-model", "--new", new, "--data", "stub", "--no-reference",
                       "--resamples", "50", "--out", str(out), *gate])
        return status, json.loads((out / "compare.json").read_text()), capsys.readouterr().err

    status, report, err = compare("scaled", "--min-overlap", "0.9")
    assert status == 0 and err == ""
    assert (report["old"], report["new"], report["n_images"], report["k"]) == ("old-model", "scaled", 120, 10)
    assert report["models"]["old"] == {"spec": "old-model", "weights_sha256": None, "fingerprint": "fp-old-model",
                                       "resolved": "resolved:old-model?weights=/cache/x.safetensors"}
    assert report["models"]["new"]["spec"] == "scaled"
    page = (tmp_path / "scaled" / "report.html").read_text()
    assert "<title>crs compare: old-model vs scaled</title>" in page
    assert report["overlap"] == pytest.approx(1.0) and report["min_overlap"] == 0.9 and report["passed"] is True
    assert report["decision"] == "lower" and report["null"]["p_value"] == pytest.approx(1 / 200)
    assert report["reference"] is None and report["chance"] == pytest.approx(10 / 119)

    status, report, err = compare("unrelated", "--min-overlap", "0.5")
    assert status == 1
    assert report["overlap_high"] < 0.5 and report["min_overlap"] == 0.5 and report["passed"] is False
    assert f"FAIL: lower 95% bound {report['overlap_low']:.3f} < minimum 0.500: fail" in err

    status, report, err = compare("unrelated", "--min-overlap", "0.05", "--decision", "upper", "--permutations", "9")
    assert status == 0 and report["decision"] == "upper" and report["null"]["n_permutations"] == 9
    assert report["gate"] == f"upper 95% bound {report['overlap_high']:.3f} >= minimum 0.050: pass"

    status, report, err = compare("unrelated")  # no gate: no verdict, exit 0
    assert status == 0 and report["min_overlap"] is None and report["passed"] is None

    # the recall target of an approximate search is checked even where the search stays exact
    status = main(["compare", "--old", "old-model", "--new", "scaled", "--data", "stub", "--no-reference",
                   "--target-recall", "1.5", "--out", str(tmp_path / "bad")])
    assert status == 2 and "target_recall must be a number in (0, 1], got 1.5" in capsys.readouterr().err


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


# --------------------------------------------------------------------------- the decision rule and the null


@pytest.mark.parametrize("decision", ["lower", "upper"])
def test_a_model_against_itself_passes_under_both_rules_with_the_smallest_p(case, decision: str) -> None:
    X, metadata, _, _ = case
    result = compare_embeddings(X, X, metadata, min_overlap=0.9, decision=decision, n_resamples=100,
                                n_permutations=49)
    assert result.overlap == result.overlap_low == 1.0 and result.passed is True
    assert result.decision == decision
    assert result.gate == f"{decision} 95% bound 1.000 >= minimum 0.900: pass"
    null = result.null
    assert null["n_permutations"] == 49 and null["p_value"] == pytest.approx(1 / 50)
    # relabelled neighbours share about what chance predicts
    assert abs(null["mean"] - result.chance) < 0.01 and null["low"] <= null["mean"] <= null["high"] < 0.1


def test_a_random_network_fails_under_the_lower_rule(case) -> None:
    X, metadata, _, rng = case
    result = compare_embeddings(X, rng.normal(size=X.shape), metadata, min_overlap=0.5, n_resamples=100,
                                n_permutations=99)
    assert result.decision == "lower" and result.passed is False
    assert result.gate == f"lower 95% bound {result.overlap_low:.3f} < minimum 0.500: fail"
    # independent embeddings are as close as relabelled ones: the null does not reject
    assert result.null["p_value"] > 0.01
    assert result.null["low"] <= result.overlap <= result.null["high"] + 0.02


def wide_case() -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """8 patients of 20 tight images each; the new model keeps the within-patient neighbours of every
    other patient and redraws the rest, so the patient bootstrap gives a wide interval."""
    rng = np.random.default_rng(0)
    n_patients, per = 8, 20
    centres = np.repeat(5 * rng.normal(size=(n_patients, 16)), per, axis=0)
    X_old = centres + rng.normal(size=centres.shape)
    X_new = X_old.copy()
    changed = np.repeat(np.arange(n_patients) % 2 == 1, per)
    X_new[changed] = centres[changed] + rng.normal(size=(int(changed.sum()), 16))
    return X_old, X_new, pd.DataFrame({"patient_id": np.repeat(np.arange(n_patients), per)})


def test_a_wide_interval_straddling_the_minimum_passes_only_the_upper_rule() -> None:
    X_old, X_new, metadata = wide_case()
    lenient = compare_embeddings(X_old, X_new, metadata, k=5, min_overlap=0.6, decision="upper", n_resamples=500)
    strict = compare_embeddings(X_old, X_new, metadata, k=5, min_overlap=0.6, n_resamples=500)
    assert strict.overlap_low < 0.6 < strict.overlap_high  # the construction: the interval straddles 0.6
    assert lenient.passed is True and strict.passed is False
    assert strict.decision == "lower"
    page = render_report_html(strict)
    assert f"lower 95% bound {strict.overlap_low:.3f} &lt; minimum 0.600: fail" in page


def test_the_decision_is_validated(case) -> None:
    X, metadata, _, _ = case
    with pytest.raises(InputError, match="decision.*'lower'.*'upper'.*'median'"):
        compare_embeddings(X, X, metadata, decision="median")


# --------------------------------------------------------------------------- the images that changed most


def strip_section(page: str) -> str:
    start = page.index('<section id="changed-neighbours">')
    return page[start:page.index("</section>", start)]


@pytest.fixture()
def tiles_case(tmp_path: Path):
    """Real image tiles (scikit-image's bundled images) with a manifest of absolute paths; one file is
    named like markup. The new model agrees with the old one except on the first 40 images."""
    from realdata import write_labelled

    from crslib.data import read_manifest

    manifest = read_manifest(write_labelled(tmp_path / "tiles") / "manifest.csv")
    hostile = tmp_path / "<script>x</script>.png"
    hostile.parent.mkdir(parents=True, exist_ok=True)
    Path(manifest.loc[0, "path"]).rename(hostile)
    manifest.loc[0, "path"] = str(hostile)
    rng = np.random.default_rng(1)
    X_old = rng.normal(size=(len(manifest), 16))
    X_new = X_old.copy()
    X_new[:40] = rng.normal(size=(40, 16))
    return manifest, X_old, X_new


def test_report_shows_thumbnail_strips_of_the_most_changed_images(tiles_case) -> None:
    manifest, X_old, X_new = tiles_case
    result = compare_embeddings(X_old, X_new, manifest, k=5, n_resamples=50, n_permutations=19)
    page = render_report_html(result)
    section = strip_section(page)
    # 12 queries, each with itself, 5 old and 5 new neighbours
    assert section.count("<img") == 12 * (1 + 2 * 5)
    assert section.count('src="data:image/png;base64,') == 12 * 11
    order = np.argsort(np.asarray(result.per_image), kind="stable")
    shown = [manifest.loc[i, "image_id"] for i in order[:12]]
    assert [s["image_id"] for s in result.strips] == shown
    assert all(image_id in section for image_id in shown)
    # the file named like markup is shown escaped and never as markup
    assert "<script" not in page and "&lt;script&gt;x&lt;/script&gt;.png" in page
    report = json.loads(result.to_json())
    assert "strips" not in report
    changes = report["largest_changes"]
    assert len(changes) == 100
    assert [c["image_id"] for c in changes] == [manifest.loc[i, "image_id"] for i in order[:100]]
    assert [c["overlap"] for c in changes] == pytest.approx(np.sort(result.per_image)[:100])
    assert changes[0]["path"] == manifest.loc[order[0], "path"]
    assert set(changes[0]) >= {"image_id", "path", "overlap", "old_neighbours", "new_neighbours"}


def test_report_says_why_there_are_no_thumbnails(tiles_case) -> None:
    manifest, X_old, X_new = tiles_case
    no_paths = compare_embeddings(X_old, X_new, manifest.drop(columns="path"), k=5, n_resamples=50,
                                  n_permutations=9)
    section = strip_section(render_report_html(no_paths))
    assert "<img" not in section and "no thumbnails: the manifest has no path column" in section
    gone = manifest.assign(path=[f"/nonexistent/{i}.png" for i in manifest["image_id"]])
    section = strip_section(render_report_html(compare_embeddings(X_old, X_new, gone, k=5, n_resamples=50,
                                                                  n_permutations=9)))
    assert "<img" not in section and "no thumbnails: none of the 12 query images could be read" in section


def test_report_and_json_name_models_as_the_user_wrote_them(case) -> None:
    X, metadata, _, _ = case
    models = {"old": {"spec": "public:efficientnet_lite0",
                      "resolved": "timm:tf_efficientnet_lite0?weights=/cache/tf_efficientnet_lite0-43de.safetensors",
                      "weights_sha256": "43dee5e6", "fingerprint": "abc"}}
    result = compare_embeddings(X, X, metadata, old="public:efficientnet_lite0", new="zoo:simclr-seed1",
                                models=models, n_resamples=50, n_permutations=9)
    page = render_report_html(result)
    assert "<title>crs compare: public:efficientnet_lite0 vs zoo:simclr-seed1</title>" in page
    assert "timm:tf_efficientnet_lite0?weights=/cache/tf_efficientnet_lite0-43de.safetensors" in page
    assert "43dee5e6" in page
    assert json.loads(result.to_json())["models"] == models


def test_report_tables_show_missing_values_as_n_a_and_escape_text():
    from crslib.reports import _html_table

    table = pd.DataFrame({"retention": [0.12345, np.nan], "finding": [None, "<x>"], "n": [3, 4]})
    assert _html_table(table, digits=4) == (
        '<table><thead><tr><th>retention</th><th>finding</th><th>n</th></tr></thead><tbody>'
        '<tr><td class="num">0.1235</td><td class="num">n/a</td><td class="num">3</td></tr>'
        '<tr><td class="num">n/a</td><td>&lt;x&gt;</td><td class="num">4</td></tr></tbody></table>')
    assert _html_table(pd.DataFrame({"when": [pd.NaT], "label": pd.array([pd.NA], dtype="string")})) == (
        "<table><thead><tr><th>when</th><th>label</th></tr></thead><tbody><tr><td>n/a</td><td>n/a</td></tr>"
        "</tbody></table>")

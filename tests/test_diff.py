"""`crs diff`: what changed between two run folders (tables, intervals, claim verdicts)."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

import pandas as pd
import pytest

from crslib.claims import build_ledger
from crslib.cli import main
from crslib.diff import compare_ledgers, compare_tables, diff_runs, interval_columns

PARTITION = "05_split_and_shortcut_audit/partition_auc.csv"
HEADLINE = "02_agreement/headline.csv"


def write_run(root: Path, tables: dict[str, pd.DataFrame]) -> Path:
    """A minimal run folder: run.json and results/<chapter>/<table>.csv."""
    root.mkdir(parents=True)
    (root / "run.json").write_text(json.dumps({"run_id": root.name, "notebooks": []}))
    for name, frame in tables.items():
        path = root / "results" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(path, index=False)
    return root


def partition(auc: float, low: float, high: float) -> pd.DataFrame:
    """The chapter 05 table that drives the ledger's partition-AUC claim (held above 0.5)."""
    return pd.DataFrame({"data": ["phantom"], "source": ["embeddings"], "scope": ["all"], "auc": [auc],
                         "low": [low], "high": [high], "p_value": [0.01]})


def headline(overlap: float = 0.40, n_images: int = 379) -> pd.DataFrame:
    """A table with an interval column (overlap) and a column without one (n_images)."""
    return pd.DataFrame({"model_a": ["m1", "m1"], "model_b": ["m2", "m3"], "overlap": [overlap, 0.30],
                         "overlap_low": [overlap - 0.02, 0.28], "overlap_high": [overlap + 0.02, 0.32],
                         "n_images": [n_images, 379]})


def run_diff(tmp_path: Path, a: Path, b: Path, *flags: str) -> tuple[int, dict, str]:
    out = tmp_path / "out"
    status = main(["diff", str(a), str(b), "--out", str(out), *flags])
    return status, json.loads((out / "diff.json").read_text()), (out / "diff.html").read_text()


def table(report: dict, name: str) -> dict:
    return next(t for t in report["tables"] if t["table"] == name)


def test_identical_runs_report_no_change_and_exit_0_even_with_fail_on_flip(tmp_path: Path, capsys) -> None:
    tables = {PARTITION: partition(0.70, 0.65, 0.75), HEADLINE: headline()}
    a, b = write_run(tmp_path / "a", tables), write_run(tmp_path / "b", tables)
    status, report, page = run_diff(tmp_path, a, b, "--fail-on-flip")
    assert status == 0
    counts = report["counts"]
    assert counts["tables_compared"] == 2 and counts["tables_changed"] == 0 and counts["numbers_changed"] == 0
    assert counts["flips"] == 0 and report["flips"] == []
    assert {t["status"] for t in report["tables"]} == {"same"}
    assert "none changed" in capsys.readouterr().out and "none changed" in page
    # the same folder twice is fine
    assert main(["diff", str(a), str(a), "--out", str(tmp_path / "self"), "--fail-on-flip"]) == 0


def test_a_value_moved_outside_both_intervals_is_a_real_change(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", {HEADLINE: headline(0.40)})
    b = write_run(tmp_path / "b", {HEADLINE: headline(0.50)})
    _, report, page = run_diff(tmp_path, a, b)
    entry = table(report, HEADLINE)
    assert entry["status"] == "changed" and entry["counts"]["real"] == 1 and entry["counts"]["changed"] == 1
    (cell,) = entry["cells"]
    assert cell["column"] == "overlap" and cell["kind"] == "real" and cell["row"] == "model_a=m1, model_b=m2"
    assert (cell["a_low"], cell["b_low"]) == (pytest.approx(0.38), pytest.approx(0.48))
    assert report["summary"] == ("Of 1 result table in both runs, 1 changed: 1 number moved beyond both runs' "
                                 "intervals (real); no claim verdict flipped.")
    assert html.escape(report["summary"]) in page


def test_a_value_moved_within_overlapping_intervals_is_not_real(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", {HEADLINE: headline(0.40)})
    b = write_run(tmp_path / "b", {HEADLINE: headline(0.41)})  # intervals 0.38-0.42 and 0.39-0.43 overlap
    _, report, _ = run_diff(tmp_path, a, b)
    counts = table(report, HEADLINE)["counts"]
    assert counts == {"changed": 1, "real": 0, "within_interval": 1, "no_interval": 0, "text_changed": 0}
    assert report["counts"]["real"] == 0


def test_a_column_without_interval_is_reported_as_changed_without_interval(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", {HEADLINE: headline(n_images=379)})
    b = write_run(tmp_path / "b", {HEADLINE: headline(n_images=380)})
    _, report, page = run_diff(tmp_path, a, b)
    entry = table(report, HEADLINE)
    assert entry["counts"] == {"changed": 1, "real": 0, "within_interval": 0, "no_interval": 1, "text_changed": 0}
    assert entry["columns"] == [{"column": "n_images", "changed": 1, "real": 0, "within_interval": 0,
                                 "no_interval": 1, "max_abs_change": 1.0}]
    assert "n_images" in page


def test_tiny_differences_are_no_change() -> None:
    a = headline(0.40)
    b = a.assign(overlap=a["overlap"] * (1 + 1e-12))
    assert compare_tables(a, b).status == "same"


def test_tables_and_rows_present_in_one_run_only(tmp_path: Path) -> None:
    extra = pd.concat([headline(), pd.DataFrame({"model_a": ["m9"], "model_b": ["m1"], "overlap": [0.1],
                                                 "overlap_low": [0.0], "overlap_high": [0.2], "n_images": [1]})])
    a = write_run(tmp_path / "a", {HEADLINE: extra, "01_data/only_a.csv": pd.DataFrame({"x": [1]})})
    b = write_run(tmp_path / "b", {HEADLINE: headline(), "03_transfer/only_b.csv": pd.DataFrame({"x": [1]})})
    _, report, page = run_diff(tmp_path, a, b)
    assert table(report, "01_data/only_a.csv")["status"] == "only in A"
    assert table(report, "03_transfer/only_b.csv")["status"] == "only in B"
    entry = table(report, HEADLINE)
    assert entry["status"] == "changed" and entry["counts"]["changed"] == 0
    assert entry["rows_only_a"] == [{"model_a": "m9", "model_b": "m1"}] and entry["rows_only_b"] == []
    counts = report["counts"]
    assert (counts["tables_only_a"], counts["tables_only_b"], counts["rows_only_a"]) == (1, 1, 1)
    assert "1 row only in A; 1 table only in A and 1 table only in B" in report["summary"] and "only in A" in page


def test_columns_only_in_one_run_are_reported() -> None:
    a = headline()
    diff = compare_tables(a, a.drop(columns="n_images").assign(k=10))
    assert diff.status == "changed" and diff.columns_only_a == ("n_images",) and diff.columns_only_b == ("k",)


def test_rows_with_repeated_keys_are_paired_in_order() -> None:
    a = pd.DataFrame({"scope": ["all", "all", "pool"], "auc": [0.6, 0.7, 0.8]})
    b = pd.DataFrame({"scope": ["all", "all", "pool"], "auc": [0.6, 0.75, 0.8]})
    cells = compare_tables(a, b).cells
    assert cells[["row", "a", "b"]].values.tolist() == [["scope=all #2", 0.7, 0.75]]
    # no text column at all: rows by order
    diff = compare_tables(pd.DataFrame({"x": [1.0, 2.0]}), pd.DataFrame({"x": [1.0, 2.0, 3.0]}))
    assert diff.rows_only_b["row"].tolist() == [3] and diff.cells.empty


def test_keys_are_the_first_text_columns_that_tell_rows_apart_and_other_text_is_compared() -> None:
    a = pd.DataFrame({"quantity": ["chance", "overlap"], "value": [0.02, 0.4], "detail": ["k/(N-1)", ""]})
    b = a.assign(detail=["k/(N-2)", ""])
    diff = compare_tables(a, b)
    assert diff.keys == ("quantity",) and diff.status == "changed" and diff.rows_only_a.empty
    assert diff.text_cells.values.tolist() == [["quantity=chance", "detail", "k/(N-1)", "k/(N-2)"]]
    assert diff.counts()["text_changed"] == 1 and diff.counts()["changed"] == 0


def test_interval_conventions_of_the_result_tables() -> None:
    columns = ["scope", "auc", "low", "high", "p_value", "null_mean", "null_low", "null_high", "retention",
               "retention_low", "retention_high", "n"]
    assert interval_columns(columns) == {"auc": ("low", "high"), "null_mean": ("null_low", "null_high"),
                                         "retention": ("retention_low", "retention_high")}


def test_a_flipped_verdict_exits_1_with_fail_on_flip_and_0_without(tmp_path: Path, capsys) -> None:
    a = write_run(tmp_path / "a", {PARTITION: partition(0.70, 0.65, 0.75)})  # held: interval above 0.5
    b = write_run(tmp_path / "b", {PARTITION: partition(0.52, 0.45, 0.58)})  # inconclusive: includes 0.5
    flips = compare_ledgers(build_ledger(a), build_ledger(b))
    assert len(flips) == 1 and flips.iloc[0][["verdict_a", "verdict_b"]].tolist() == ["held", "inconclusive"]
    status, report, page = run_diff(tmp_path, a, b, "--fail-on-flip")
    assert status == 1
    assert report["counts"]["flips"] == 1 and report["flips"][0]["id"] == flips.iloc[0]["id"]
    assert "1 claim verdict flipped" in report["summary"] and "held -> inconclusive" in capsys.readouterr().out
    assert "inconclusive" in page and "No claim verdict flipped" not in page
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "plain")]) == 0


def test_a_table_named_like_a_script_is_escaped_in_the_page(tmp_path: Path) -> None:
    name = "02_agreement/<script>alert(1)</script>.csv"
    a = write_run(tmp_path / "a", {name: pd.DataFrame({"<b>key</b>": ["<i>x</i>"], "v": [1.0]})})
    b = write_run(tmp_path / "b", {name: pd.DataFrame({"<b>key</b>": ["<i>x</i>"], "v": [2.0]})})
    _, report, page = run_diff(tmp_path, a, b)
    assert table(report, name)["counts"]["no_interval"] == 1
    assert "<script>" not in page and "<b>key" not in page and "<i>x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.csv" in page and "&lt;i&gt;x&lt;/i&gt;" in page


@pytest.mark.parametrize("make", ["missing", "file", "empty"])
def test_not_a_run_folder_is_a_one_line_error_with_exit_2(tmp_path: Path, capsys, make: str) -> None:
    good = write_run(tmp_path / "good", {HEADLINE: headline()})
    bad = tmp_path / "bad"
    if make == "file":
        bad.write_text("x")
    elif make == "empty":
        bad.mkdir()
    assert main(["diff", str(good), str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("crs diff: error:") and "bad" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_quick_runs_same_parameters_no_change_other_model_changes(tmp_path: Path, capsys) -> None:
    from crslib.runner import run_notebooks

    runs = tmp_path / "runs"
    began = time.perf_counter()
    first = run_notebooks("quick", only=["01"], run_root=runs)
    # executed again (no reuse of the cached execution): the same parameters must give the same tables
    again = run_notebooks("quick", only=["01"], run_root=runs, reuse=False)
    other = run_notebooks("quick", only=["01"], run_root=runs, overrides=[("01.model", "timm:resnet10t?size=64")])
    print(f"three runs of notebook 01 took {time.perf_counter() - began:.0f} s")
    assert other.notebooks[0].parameters["model"] == "timm:resnet10t?size=64"

    same = diff_runs(first.run_dir, again.run_dir)
    assert {t.status for t in same.tables} == {"same"} and len(same.tables) >= 3
    assert same.counts()["numbers_changed"] == 0 and not same.flipped

    status, report, _ = run_diff(tmp_path, Path(first.run_dir), Path(other.run_dir), "--fail-on-flip")
    assert status == 0 and report["counts"]["flips"] == 0
    statuses = {t["table"]: t["status"] for t in report["tables"]}
    # the embeddings (and so their map and the separation of groups) changed; the data summary did not
    assert statuses["01_data_and_embeddings/embedding_map.csv"] == "changed"
    assert statuses["01_data_and_embeddings/separation.csv"] == "changed"
    assert statuses["01_data_and_embeddings/manifest_summary.csv"] == "same"
    assert "01_data_and_embeddings/embedding_map.csv" in capsys.readouterr().out


def test_help_describes_the_command(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["diff", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: crs diff" in text and "--fail-on-flip" in text and "crs-diff" in text

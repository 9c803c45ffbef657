"""Chapter 05 on a Kermany-layout folder of real images gives the numbers `crs audit` gives on it.

The chapter and the command share :func:`crslib.audit.run_audit`; this test
checks the plumbing around it (loading the folder, the file properties, the
embeddings of the same model at the same input size, the seed, the resamples
and the permutations), so that a reader of the book and a user of the command
get the same audit of the same data.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import pytest
from realdata import write_kermany

from crslib.cli import main
from crslib.data import load_data
from crslib.duplicates import image_fingerprints
from crslib.leakage import leakage_audit
from crslib.runner import execute_notebook, read_skips

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "05_split_and_shortcut_audit.py"
MODEL = "public:efficientnet_lite0"
PUBLIC_SIZE = 64
RESAMPLES = 50
PERMUTATIONS = 5
SEED = 0


@pytest.fixture(scope="module")
def audits(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    """(the chapter's audit.json, crs audit's audit.json, the chapter's results folder) on one Kermany folder."""
    root = tmp_path_factory.mktemp("chapter05")
    folder = write_kermany(root / "chest_xray")
    results = root / "results"
    execute_notebook(NOTEBOOK, root / "05.ipynb", {
        "data": str(folder), "model": MODEL, "public_size": PUBLIC_SIZE, "n_resamples": RESAMPLES,
        "n_permutations": PERMUTATIONS, "seed": SEED, "results_dir": str(results),
    }, cwd=root)
    status = main(["audit", "--data", str(folder), "--model", f"{MODEL}?size={PUBLIC_SIZE}",
                   "--resamples", str(RESAMPLES), "--seed", str(SEED), "--permutations", str(PERMUTATIONS),
                   "--out", str(root / "crs-audit")])
    assert status == 0
    chapter = json.loads((results / "audit.json").read_text(encoding="utf-8"))
    command = json.loads((root / "crs-audit" / "audit.json").read_text(encoding="utf-8"))
    return chapter, command, results


def test_chapter_runs_the_audits_on_a_kermany_folder(audits) -> None:
    chapter, _, results = audits
    assert read_skips(results) == []
    assert chapter["partition_embeddings"] is not None
    assert chapter["partition_properties"]["n_permutations"] == PERMUTATIONS
    assert {"partition_auc.csv", "shortcut_balanced_accuracy.csv", "evidence.json", "audit.html"} <= {
        p.name for p in results.iterdir()}
    # no phantom without shortcut is audited next to the user's data
    assert not (results / "audit_null.json").exists()


@pytest.mark.parametrize("part", ["partition_properties", "partition_embeddings", "shortcut"])
def test_chapter_numbers_equal_crs_audit(audits, part: str) -> None:
    chapter, command, _ = audits
    assert chapter[part] == command[part]


def test_chapter_split_and_images_equal_crs_audit(audits) -> None:
    chapter, command, _ = audits
    for key in ("n_images", "label_column", "pool", "test", "provenance", "property_columns", "notes"):
        assert chapter[key] == command[key], key
    scopes = {row["scope"] for row in chapter["partition_properties"]["table"]}
    assert scopes == {"all", "class=NORMAL", "class=PNEUMONIA"}


def test_chapter_gives_no_verdict_with_too_few_permutations(audits) -> None:
    """5 permutations cannot reach p < 0.05 (the smallest possible p is 1/6): the chapter and its report say so."""
    chapter, _, results = audits
    notebook = json.loads((results.parent / "05.ipynb").read_text(encoding="utf-8"))
    shown = "\n".join("".join(output.get("data", {}).get("text/markdown", ""))
                      for cell in notebook["cells"] for output in cell.get("outputs", []))
    reason = "with 5 permutations the smallest possible p is 0.167: too few to decide; use at least 20"
    assert reason in chapter["notes"]
    assert chapter["partition_properties"]["permutation_note"] == reason
    assert "too few permutations to decide" in shown and reason[1:] in shown
    assert "finds no difference" not in shown and "no evidence above chance" not in shown
    report = (results / "audit.html").read_text(encoding="utf-8")
    assert reason in report and "indistinguishable from chance" not in report


def _shown(results: Path) -> str:
    notebook = json.loads((results.parent / "05.ipynb").read_text(encoding="utf-8"))
    return "\n".join("".join(output.get("data", {}).get("text/markdown", ""))
                     for cell in notebook["cells"] for output in cell.get("outputs", []))


def test_chapter_finds_the_identical_tiles_that_cross_the_split(audits) -> None:
    """The folder holds identical tiles (flat shepp-logan corners, retina tiles) in the pool and the test split:
    the chapter, its leakage.json and crs audit report the exact duplicates that the images alone give."""
    chapter, command, results = audits
    manifest = load_data(str(results.parent / "chest_xray"))
    expected = leakage_audit(manifest, image_fingerprints(manifest))
    exact = expected.exact.counts()
    assert exact["clusters"]["across"] > 0  # else the test has nothing to find
    saved = json.loads((results / "leakage.json").read_text(encoding="utf-8"))
    assert saved == chapter["leakage"] == command["leakage"]
    assert saved["exact"]["clusters"] == json.loads(expected.to_json())["exact"]["clusters"]
    counts = pd.read_csv(results / "leakage_counts.csv").set_index("kind")
    assert counts.loc["exact", "across"] == exact["clusters"]["across"]
    shown = _shown(results)
    n_across, n_leaked = exact["clusters"]["across"], exact["n_test_images_leaked"]
    assert (f"exact duplicates: **{n_across}** cluster(s) across the split ({n_leaked} test images)") in shown
    assert "person numbers in both the training pool and the test split: **0** (0 test images)" in shown
    test_path = next(p for c in expected.exact.clusters() if c["scope"] == "across"
                     for p, split in zip(c["paths"], c["splits"]) if split == "test")
    relative = Path(test_path).relative_to(results.parent / "chest_xray")  # shown within the data folder
    assert f"test <code>{html.escape(str(relative))}</code>" in shown
    # the effect on a test number: the probe's AUROC with and without the leaked test images
    effect = pd.read_csv(results / "leakage_effect.csv").set_index("test_images")
    n_test = int((manifest["split"] == "test").sum())
    assert effect.loc["all", "n_images"] == n_test
    dropped = saved["n_leaked_test_images"]  # exact, and embedding duplicates the encoder adds
    assert dropped >= n_leaked
    assert effect.loc["without duplicates", ["n_dropped", "n_images"]].tolist() == [dropped, n_test - dropped]
    assert "without duplicates or possible same patients" not in effect.index  # no shared person number
    assert (f"On all {n_test} test images the probe's AUROC is **{effect.loc['all', 'auroc']:.3f}**") in shown
    assert (f"Without duplicates ({dropped} dropped, {n_test - dropped} left) it is "
            f"**{effect.loc['without duplicates', 'auroc']:.3f}**") in shown
    report = (results / "audit.html").read_text(encoding="utf-8")
    section = report[report.index("<h2>Duplicates and shared patients"):]
    assert section.count('<tr class="cluster">') >= n_across and "data:image/png;base64," in section

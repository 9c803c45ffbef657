"""Chapters 01 and 07 on data that is not the phantom: they skip what the data cannot support and go on.

Chapter 01 stopped on a researcher's manifest with scikit-learn's "Number of
labels is 1" (a silhouette by a column with one value). It now declares what
each analysis needs and skips, with one sentence on the page and a record in
``skips.json``, what the data lacks, while everything the data supports still
runs on it. Chapter 07 reads a run whose chapters skipped their checklist
evidence and says which items that left without evidence and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from realdata import write_labelled

from crslib.runner import execute_notebook, read_skips

pytestmark = pytest.mark.slow

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _outputs(notebook: Path) -> tuple[str, list[dict]]:
    """(all Markdown the executed notebook displayed, joined; its error outputs)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    outputs = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
    markdown = "\n".join("".join(o["data"]["text/markdown"]) for o in outputs
                         if "text/markdown" in o.get("data", {}))
    return markdown, [o for o in outputs if o["output_type"] == "error"]


def test_chapter01_skips_a_single_valued_source_and_studies_the_label(tmp_path: Path) -> None:
    folder = write_labelled(tmp_path / "tiles")
    manifest = pd.read_csv(folder / "manifest.csv")
    manifest["source"] = "clinic"  # one acquisition site: the silhouette by source used to crash here
    manifest.to_csv(folder / "manifest.csv", index=False)
    results = tmp_path / "results"
    output = tmp_path / "01.ipynb"
    execute_notebook(NOTEBOOKS / "01_data_and_embeddings.py", output, {
        "data": str(folder), "model": "timm:resnet18?size=32", "tsne_perplexity": 10.0,
        "results_dir": str(results)}, cwd=tmp_path)

    skips = {s["analysis"]: s["reason"] for s in read_skips(results)}
    assert "single value ('clinic')" in skips["the silhouette by source"]
    assert {"the example images by source", "the map coloured by source", "the silhouette by view",
            "the example images with each finding"} <= set(skips)
    # what the data supports runs on it: the label (two text classes) is measured and drawn
    assert not {"the silhouette by label", "the map coloured by label", "the example images by label",
                "the map of the embeddings"} & set(skips)
    separation = pd.read_csv(results / "separation.csv")
    assert separation["variable"].tolist() == ["label"]
    assert -1 <= separation["silhouette (cosine)"].iloc[0] <= 1
    assert len(pd.read_csv(results / "embedding_map.csv")) == len(manifest)

    markdown, errors = _outputs(output)
    assert errors == []
    # the overview describes this manifest, from its numbers
    assert f"**{len(manifest):,} images** of **{manifest['patient_id'].nunique():,} patients**" in markdown
    assert "from **1 source**" in markdown and "`label` has 2 values" in markdown
    assert "There is no train/validation/test split" in markdown
    assert "**Skipped: the silhouette by source.**" in markdown
    assert "the only variable this data allows measuring" in markdown


def test_chapter07_says_which_items_have_no_evidence_and_lists_the_skips(tmp_path: Path) -> None:
    run = tmp_path / "run"
    protocol = run / "results" / "04_protocol_sensitivity"
    protocol.mkdir(parents=True)
    (protocol / "skips.json").write_text(json.dumps([
        {"analysis": "the protocol grid", "reason": "no row has split 'train' <b>here</b> | see `a|b`"}]))
    # chapter 05 is not part of the run; chapter 01 ran and skipped nothing
    (run / "results" / "01_data_and_embeddings").mkdir()
    (run / "results" / "01_data_and_embeddings" / "skips.json").write_text("[]")
    results = run / "results" / "07_reporting_checklist"
    output = tmp_path / "07.ipynb"
    execute_notebook(NOTEBOOKS / "07_reporting_checklist.py", output,
                     {"run_dir": str(run), "results_dir": str(results)}, cwd=tmp_path)

    checklist = json.loads((results / "checklist.json").read_text(encoding="utf-8"))
    assert checklist["n_complete"] == 0
    markdown, errors = _outputs(output)
    assert errors == []
    assert "**7 of 7 items have no evidence in this run**" in markdown
    assert "(items 2, 3, 4, 5, 6): chapter `04_protocol_sensitivity` skipped 1 analysis in this run" in markdown
    assert "(items 1, 7): chapter `05_split_and_shortcut_audit` is not part of this run" in markdown
    # the table of skipped analyses: a real HTML table, its user text escaped
    assert "**The run skipped 1 analysis**" in markdown
    cells = json.loads(output.read_text(encoding="utf-8"))["cells"]
    tables = "\n".join("".join(o["data"]["text/html"]) for c in cells if c["cell_type"] == "code"
                       for o in c.get("outputs", []) if "text/html" in o.get("data", {}))
    assert "04_protocol_sensitivity" in tables and "the protocol grid" in tables
    assert "no row has split &#39;train&#39; &lt;b&gt;here&lt;/b&gt; | see `a|b`" in tables
    assert "<b>here" not in tables and "<b>" not in markdown
    # nothing recorded an effect, so the chart is skipped, and said so
    assert [s["analysis"] for s in read_skips(results)] == ["the chart of this run's effects"]

"""Notebook 01 executed by papermill with the quick preset, and the book built from it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest

pytestmark = pytest.mark.slow


def test_every_notebook_ran_without_errors(quick_book) -> None:
    _, record = quick_book
    assert record.notebooks, "no notebook was executed"
    for entry in record.notebooks:
        notebook = nbformat.read(entry.output, as_version=4)
        code = [c for c in notebook.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), f"{entry.name}: a cell did not run"
        errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{entry.name}: {errors[0]['ename']}"
        # the quick preset's phantom; chapters 04 and 05 study their Kermany-like one; the zoo trained on another
        kermany_like = entry.name.startswith(("04_", "05_"))
        if "data" in entry.parameters:
            assert entry.parameters["data"].startswith("phantom?patients=250" if kermany_like else "phantom?patients=150")
        if "zoo_data" in entry.parameters:  # the shipped zoo's data: the default phantom
            assert entry.parameters["zoo_data"] == "phantom?patients=600&size=64&seed=0"


def test_notebook_01_shows_figures_and_tables(quick_book) -> None:
    _, record = quick_book
    entry = next(e for e in record.notebooks if e.name == "01_data_and_embeddings")
    notebook = nbformat.read(entry.output, as_version=4)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    tables = [o for o in outputs if "<table" in str(o.get("data", {}).get("text/html", ""))]
    # one image for the sample grids (by source, by view, with each finding) and one for the embedding maps
    assert len(images) >= 2, "expected the sample grids and the embedding maps"
    assert len(tables) >= 2, "expected the manifest summary and the separation table as HTML tables"
    results = Path(record.run_dir) / "results" / "01_data_and_embeddings"
    assert {"manifest_summary.csv", "embedding_map.csv", "separation.csv"} <= {p.name for p in results.iterdir()}


def test_every_study_notebook_draws_figures(quick_book) -> None:
    _, record = quick_book
    names = {e.name for e in record.notebooks}
    assert {"01_data_and_embeddings", "02_agreement", "03_transfer", "04_protocol_sensitivity",
            "05_split_and_shortcut_audit", "06_representation_risk", "07_reporting_checklist"} <= names
    for entry in record.notebooks:
        notebook = nbformat.read(entry.output, as_version=4)
        images = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if "image/png" in o.get("data", {})]
        # the checklist page is a table of the run's evidence with one summary figure
        expected = 1 if entry.name == "07_reporting_checklist" else 2
        assert len(images) >= expected, f"{entry.name} shows {len(images)} figures"


FIGURE_MIMES = ("image/png", "image/svg+xml")


def figure_cell_problems(notebook_path: Path) -> tuple[list[str], list[str]]:
    """Problems of the code cells with ``mystnb.figure`` metadata in one executed notebook, and their names.

    myst-nb wraps every rich output of such a cell in a figure with the cell's caption and name, so the
    cell must show exactly one rich output (display_data or execute_result), and that output an image.
    """
    notebook = nbformat.read(notebook_path, as_version=4)
    problems, names = [], []
    for cell in notebook.cells:
        figure = cell.get("metadata", {}).get("mystnb", {}).get("figure")
        if cell.cell_type != "code" or not figure:
            continue
        name = figure.get("name", "<unnamed>")
        names.append(name)
        rich = [o for o in cell.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")]
        kinds = [sorted(o.get("data", {})) for o in rich]
        if len(rich) != 1:
            problems.append(f"{notebook_path.name}: figure {name} has {len(rich)} rich outputs {kinds}, expected 1")
        elif not any(mime in rich[0].get("data", {}) for mime in FIGURE_MIMES):
            problems.append(f"{notebook_path.name}: figure {name}'s one output is not an image: {kinds[0]}")
    return problems, names


def test_every_figure_cell_shows_exactly_one_image(quick_book) -> None:
    root, _ = quick_book
    notebooks = sorted((root / "book" / "generated").glob("*.ipynb"))
    assert notebooks, "no executed notebook was staged in book/generated"
    problems, names = [], []
    for path in notebooks:
        found, named = figure_cell_problems(path)
        problems += found
        names += [(path.name, name) for name in named]
    assert names, "no figure cell found"
    assert not problems, "\n".join(problems)
    seen: dict[str, str] = {}
    duplicates = []
    for notebook, name in names:
        if name in seen:
            duplicates.append(f"{name} in {seen[name]} and {notebook}")
        seen.setdefault(name, notebook)
    assert not duplicates, "figure names must be unique in the book: " + "; ".join(duplicates)


def test_agreement_headline_is_beside_the_paper(quick_book) -> None:
    import pandas as pd

    _, record = quick_book
    headline = pd.read_csv(Path(record.run_dir) / "results" / "02_agreement" / "headline.csv")
    assert headline["paper (CRS-Bench)"].astype(str).str.contains("0.091").any()
    matrix = pd.read_csv(Path(record.run_dir) / "results" / "02_agreement" / "agreement_matrix.csv", index_col=0)
    assert (matrix.to_numpy().diagonal() == 1.0).all()
    assert ((matrix.to_numpy() >= 0) & (matrix.to_numpy() <= 1)).all()


def test_book_pages_render_with_figures(quick_book) -> None:
    root, record = quick_book
    html = Path(record.html_index)
    assert html == root / "_build" / "html" / "index.html" and html.is_file()
    pages = {
        "intro": root / "_build/html/book/intro.html",
        "notebook": root / "_build/html/book/generated/01_data_and_embeddings.html",
        "own data": root / "_build/html/book/own_data.html",
        "agreement": root / "_build/html/book/generated/02_agreement.html",
        "transfer": root / "_build/html/book/generated/03_transfer.html",
        "compare gate": root / "_build/html/book/compare_gate.html",
        "protocol": root / "_build/html/book/generated/04_protocol_sensitivity.html",
        "audit": root / "_build/html/book/generated/05_split_and_shortcut_audit.html",
        "risk": root / "_build/html/book/generated/06_representation_risk.html",
        "checklist": root / "_build/html/book/generated/07_reporting_checklist.html",
        "audit guide": root / "_build/html/book/audit_guide.html",
    }
    for name, page in pages.items():
        assert page.is_file(), f"{name} page missing: {page}"
    notebook_html = pages["notebook"].read_text(encoding="utf-8")
    assert notebook_html.count("<img") >= 2
    assert "0.091" in pages["intro"].read_text(encoding="utf-8")
    run = json.loads((root / "book" / "generated" / "run.json").read_text())
    assert run["preset"] == "quick"


def test_protocol_and_audit_results_sit_beside_the_papers(quick_book) -> None:
    import pandas as pd

    _, record = quick_book
    results = Path(record.run_dir) / "results"
    effects = pd.read_csv(results / "04_protocol_sensitivity" / "effect_summary.csv").set_index("factor")
    assert effects.loc["policy", "paper_value"] == 0.044 and effects.loc["rule", "paper_value"] == 0.09
    assert (effects.loc[["backbone", "policy", "rule", "seed"], "n_pairs"] > 0).all()
    grid = pd.read_csv(results / "04_protocol_sensitivity" / "grid.csv")
    assert grid["backbone"].nunique() >= 6 and set(grid["policy"]) == {"frozen", "finetuned"}
    assert ((grid["low"] <= grid["value"] + 1e-9) & (grid["value"] <= grid["high"] + 1e-9)).all()
    shortcut = pd.read_csv(results / "05_split_and_shortcut_audit" / "shortcut_balanced_accuracy.csv")
    injected = shortcut[shortcut["data"] == "phantom with shortcut"].set_index("scope")
    null = shortcut[shortcut["data"] == "phantom without"].set_index("scope")
    assert injected.loc["pool", "balanced_accuracy"] >= 0.9
    assert injected.loc["test", "low"] < 0.6 and null.loc["pool", "low"] < 0.6


def test_checklist_of_the_run_is_filled_from_its_evidence(quick_book) -> None:
    _, record = quick_book
    checklist = json.loads((Path(record.run_dir) / "results" / "07_reporting_checklist" / "checklist.json").read_text())
    status = {item["item_id"]: item["status"] for item in checklist["items"]}
    assert list(status) == ["split", "training_policy", "threshold", "metrics", "calibration", "uncertainty",
                            "shortcut"]
    assert all(s == "complete" for s in status.values()), status
    html = (Path(record.html_index).parent / "book/generated/07_reporting_checklist.html").read_text(encoding="utf-8")
    assert "0.697" in html and "0.992" in html and "CLAIM" in html


def test_representation_risk_tables_cover_three_tasks(quick_book) -> None:
    import pandas as pd

    _, record = quick_book
    results = Path(record.run_dir) / "results" / "06_representation_risk"
    for task in ("label", "finding_cardiomegaly", "age"):
        candidates = pd.read_csv(results / f"candidates_{task}.csv")
        assert candidates["encoder"].nunique() >= 7  # >= 6 encoders plus the union
        assert candidates["selected"].sum() == 1
    stability = pd.read_csv(results / "stability.csv", index_col=0)
    assert set(stability.index) == {"label", "finding_cardiomegaly", "age"}


def test_reproducibility_page_names_the_run_and_its_hashes(quick_book) -> None:
    root, record = quick_book
    page = root / "_build/html/book/generated/reproducibility.html"
    text = page.read_text(encoding="utf-8")
    assert record.run_id in text and f"runs/{record.run_id}/" in text and "config.yaml" in text
    assert "content SHA-256" in text and "numpy" in text
    # a rebuild command a reader can run from a clone (the highlighter wraps each word in a span)
    assert "make book PRESET=quick" in re.sub(r"<[^>]+>", "", text)
    saved = json.loads((Path(record.run_dir) / "run.json").read_text())
    assert saved["provenance"]["data"], "the run records a content hash of each data set"
    assert all(len(v["content_sha256"]) == 64 for v in saved["provenance"]["data"].values())
    assert all(v["content_sha256"] in text for v in saved["provenance"]["data"].values())  # in full
    assert saved["provenance"]["commit"] is None or saved["provenance"]["commit"] in text
    for entry in record.notebooks:
        assert entry.name in text
    # the zoo the quick book used: the shipped weights, named with their hash and the commit that trained them
    zoo = {m["name"]: m for m in saved["provenance"]["zoo"]}
    from crslib.models.zoo_shipped import shipped_cards

    for name, card in shipped_cards().items():
        assert zoo[name]["weights"] == "shipped" and zoo[name]["checkpoint_sha256"] == card["checkpoint_sha256"]
        assert card["checkpoint_sha256"][:16] in text
    assert "shipped" in text


def test_the_quick_book_trains_nothing(quick_book) -> None:
    """Every zoo model is the shipped one and every fine-tuned backbone a shipped result (nothing trained)."""
    root, record = quick_book
    assert record.trained_during_build == [], "the quick book trained a zoo model or fine-tuned a backbone"
    entry = next(e for e in record.notebooks if e.name == "04_protocol_sensitivity")
    text = re.sub(r"<[^>]+>", "", Path(entry.output).read_text(encoding="utf-8"))
    assert "0 from this machine's cache, and 0 were trained in this run" in text
    margins = pd.read_csv(Path(record.run_dir) / "results" / "02_agreement" / "zoo_probe_margins.csv")
    assert len(margins) == 14 and (margins["probe_low"] > 0).all() and margins["probe_learned"].all()


def test_reference_pages_document_the_library_and_the_command(quick_book) -> None:
    root, _ = quick_book
    api = (root / "_build/html/book/reference/api.html").read_text(encoding="utf-8")
    for name in ("mutual_knn_overlap", "protocol_grid", "run_audit", "representation_risk", "build_checklist"):
        assert name in api, name
    cli = (root / "_build/html/book/reference/cli.html").read_text(encoding="utf-8")
    for command in ("crs phantom", "crs audit", "crs risk", "crs checklist", "--min-overlap"):
        assert command in cli, command
    bibliography = (root / "_build/html/book/reference/bibliography.html").read_text(encoding="utf-8")
    assert "TRIPOD+AI" in bibliography and "Kermany" in bibliography


def test_readme_map_names_every_module_of_crslib() -> None:
    """The README's "Where things live" map stays true: every module is on it, and nothing else."""
    import re

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    named: set[str] = set()
    package = ""
    for line in block.splitlines():
        path = re.split(r"\s{2,}", line.strip())[0]
        if path.startswith("crslib/") and path.endswith("/"):
            package = path
            continue
        if not line.startswith(" "):
            package = ""
        for name in re.findall(r"[\w.]+\.py", path):
            named.add(name if name.startswith("crslib/") else (package or "crslib/") + name.removeprefix("crslib/"))
    modules = {p.relative_to(root).as_posix() for p in (root / "crslib").rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")}
    assert modules - named == set(), "modules missing from the README map"
    assert named - modules == set(), "the README map names modules that do not exist"

"""What publishing and citing rely on: valid workflows, valid citation metadata, a licence.

actionlint (a binary shipped in a wheel, see requirements.lock) checks the GitHub Actions
workflows' syntax and expressions; CITATION.cff is checked against the Citation File Format
1.2.0 JSON schema (tests/data, from cffconvert 2.0.0, whose own pins would downgrade the
jsonschema the notebook stack needs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"


def _actionlint() -> str:
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert found, "actionlint is not installed: run `make install` (requirements.lock pins it)"
    return found


def _lint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_actionlint(), "-no-color", *map(str, paths)], capture_output=True, text=True,
                          timeout=120)


def test_the_workflows_pass_actionlint() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {p.name for p in files} >= {"book.yml", "test.yml", "weekly.yml"}
    result = _lint(*files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_broken_expression(tmp_path) -> None:
    broken = (WORKFLOWS / "test.yml").read_text().replace("runs-on: ubuntu-latest",
                                                          "runs-on: ${{ matrix.os }")
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    path = tmp_path / ".github" / "workflows" / "test.yml"
    path.write_text(broken)
    result = _lint(path)
    assert result.returncode == 1 and "test.yml" in result.stdout, result.stdout + result.stderr


def test_the_book_workflow_builds_with_the_readme_command_and_publishes_the_html() -> None:
    book = yaml.safe_load((WORKFLOWS / "book.yml").read_text())
    steps = book["jobs"]["build"]["steps"]
    assert any(step.get("run", "").startswith("make book") for step in steps)
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html"
    assert "github.repository" in book["jobs"]["build"]["env"]["CRS_REPOSITORY_URL"]
    cache = next(step for step in steps if step.get("uses", "").startswith("actions/cache"))
    assert "requirements.lock" in cache["with"]["key"] and "crslib/**" in cache["with"]["key"]
    assert book["jobs"]["deploy"]["steps"][0]["uses"].startswith("actions/deploy-pages")


def _citation() -> dict:
    # dates and versions stay strings, as the schema expects (YAML would read 0.1.0 as a string anyway)
    return yaml.safe_load((ROOT / "CITATION.cff").read_text())


def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads((ROOT / "tests" / "data" / "cff-schema-1.2.0.json").read_text())
    return jsonschema.Draft7Validator(schema)


def test_citation_cff_is_valid_and_matches_the_package() -> None:
    citation = _citation()
    errors = [e.message for e in _validator().iter_errors(citation)]
    assert not errors, errors
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert str(citation["version"]) == project["version"]
    assert citation["license"] == project["license"]["text"]
    titles = [ref["title"] for ref in citation["references"]]
    assert len(titles) == 3 and titles[0].startswith("CRS-Bench: A Reference-Relative Reliability Benchmark")


@pytest.mark.parametrize("damage", ["no authors", "bad licence", "unknown key"])
def test_the_schema_check_rejects_a_damaged_citation(damage) -> None:
    citation = _citation()
    if damage == "no authors":
        del citation["authors"]
    elif damage == "bad licence":
        citation["license"] = "MIT-ish"
    else:
        citation["doi-ish"] = "10.0/none"
    assert list(_validator().iter_errors(citation))


def test_the_licence_file_is_the_one_pyproject_names() -> None:
    licence = (ROOT / "LICENSE").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"]["text"] == "MIT" and licence.startswith("MIT License")
    assert "Permission is hereby granted, free of charge" in licence


def test_binder_installs_the_locked_versions_with_cpu_torch() -> None:
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(dep["pip"] for dep in environment["dependencies"] if isinstance(dep, dict))
    assert pip[0] == "--extra-index-url https://download.pytorch.org/whl/cpu"
    assert "-r requirements.lock" in pip and "-e ." in pip
    assert "python=3.11" in environment["dependencies"]


def test_the_weekly_rebuild_starts_from_an_empty_cache_and_fails_on_a_flipped_verdict() -> None:
    weekly = yaml.safe_load((WORKFLOWS / "weekly.yml").read_text())
    book = yaml.safe_load((WORKFLOWS / "book.yml").read_text())
    assert weekly[True]["schedule"][0]["cron"].split()[-1] == "1"  # YAML reads the key `on` as True
    steps = weekly["jobs"]["rebuild"]["steps"]
    assert not any(step.get("uses", "").startswith("actions/cache") for step in steps)
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "make book PRESET=default" in runs and "crs diff" in runs and "--fail-on-flip" in runs
    published = next(step for step in book["jobs"]["build"]["steps"]
                     if step.get("uses", "").startswith("actions/upload-artifact"))["with"]["name"]
    assert f"--name {published}" in runs  # the artifact the book workflow publishes
    report = steps[-1]
    assert report["uses"].startswith("actions/upload-artifact") and report["if"] == "always()"

"""Site features: repository and launch buttons, the Performance page and the
bench results file it renders."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from crslib.errors import ConfigError
from crslib.runner import build_book

REPO_ROOT = Path(__file__).resolve().parent.parent
from conftest import REPOSITORY_URL as REPOSITORY  # noqa: E402  (the URL quick_book_with_url is built with)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def crs_book():
    return _load("crs_book_ext", REPO_ROOT / "book" / "_ext" / "crs_book.py")


def _hrefs(page: Path) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'href="([^"]+)"', page.read_text(encoding="utf-8"))]


# ---------------------------------------------------------------- bench results


def test_bench_record_replaces_only_its_own_entry(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CRS_BENCH_RESULTS", str(tmp_path / "results.json"))
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    results = _load("bench_results", REPO_ROOT / "bench" / "_results.py")
    results.record("phantom", [results.row("rate", "100 images/s")], title="Phantom", seconds=1.0)
    results.record("book", [results.row("cold", "4.0 min", "<= 5 min", True)], title="Book", seconds=2.0)
    results.record("phantom", [results.row("rate", "120 images/s")], title="Phantom", seconds=1.0)
    data = json.loads((tmp_path / "results.json").read_text())
    assert list(data["benchmarks"]) == ["book", "phantom"]
    assert data["benchmarks"]["phantom"]["rows"][0]["value"] == "120 images/s"
    assert data["benchmarks"]["book"]["rows"][0]["passed"] is True
    assert data["benchmarks"]["book"]["machine"]["cpus"] >= 1


def test_bench_commit_says_when_the_measured_code_is_not_committed(tmp_path, monkeypatch) -> None:
    import subprocess

    results = _load("bench_results", REPO_ROOT / "bench" / "_results.py")
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "bench_x.py").write_text("print(1)\n")
    (repo / "bench" / "results.json").write_text("{}\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(results, "REPO_ROOT", repo)
    (repo / "bench" / "results.json").write_text('{"benchmarks": {}}\n')  # the results alone: still HEAD's code
    (repo / "notes.txt").write_text("untracked\n")
    assert results._commit() == head
    (repo / "bench" / "bench_x.py").write_text("print(2)\n")
    assert results._commit() == head + "+changes"


def test_bench_directive_renders_rows_and_says_when_nothing_is_recorded(crs_book, tmp_path) -> None:
    missing = crs_book._bench_nodes(tmp_path / "absent.json")
    assert len(missing) == 1 and "make bench" in missing[0].astext()

    path = tmp_path / "results.json"
    path.write_text(json.dumps({"benchmarks": {"book": {
        "title": "Whole book builds", "recorded_utc": "2026-11-30T00:00:00+00:00", "commit": "abc1234",
        "seconds": 10.0, "command": "python bench/bench_book.py", "machine": {"cpus": 2},
        "rows": [{"measure": "book build, preset quick, cold", "value": "4.2 min", "target": "<= 5 min",
                  "passed": True, "note": "ratio 0.84"},
                 {"measure": "book build, preset quick, warm", "value": "2.5 min", "target": "<= 2 min",
                  "passed": False, "note": ""}]}}}))
    (section,) = crs_book._bench_nodes(path)
    text = section.astext()
    assert "Whole book builds" in text and "abc1234" in text and "2 CPUs" in text
    for cell in ("book build, preset quick, cold", "4.2 min", "<= 5 min", "ratio 0.84", "2.5 min"):
        assert cell in text
    rows = list(section.findall(lambda node: node.tagname == "row"))
    assert len(rows) == 3  # header and two measures
    assert rows[1].astext().split("\n\n")[3] == "yes" and rows[2].astext().split("\n\n")[3] == "no"
    assert "GPU" not in text

    entry = json.loads(path.read_text())["benchmarks"]["book"]
    entry["machine"] = {"cpus": 16, "platform": "Linux", "python": "3.12.3", "gpu": "NVIDIA H200"}
    path.write_text(json.dumps({"benchmarks": {"zoo-cuda": entry}}))
    (section,) = crs_book._bench_nodes(path)
    assert "on 16 CPUs (Linux, Python 3.12.3) and one GPU (NVIDIA H200); load average" in section.astext()


def test_committed_bench_results_are_well_formed() -> None:
    """bench/results.json, as make bench last wrote it: one entry per bench
    script that has run (none stale), each saying where and when it was measured;
    a run on a GPU (``bench_zoo.py --device cuda``) is its script's ``<name>-<device>`` entry."""
    data = json.loads((REPO_ROOT / "bench" / "results.json").read_text())
    scripts = {p.stem.removeprefix("bench_") for p in (REPO_ROOT / "bench").glob("bench_*.py")}
    assert data["benchmarks"] and {name.split("-")[0] for name in data["benchmarks"]} <= scripts
    for name, entry in data["benchmarks"].items():
        script = name.split("-")[0]
        assert entry["machine"]["cpus"] >= 1 and entry["recorded_utc"] and entry["commit"], name
        assert entry["command"].startswith(f"python bench/bench_{script}.py"), entry["command"]
        assert (name != script) == ("--device cuda" in entry["command"]), name
        assert entry["rows"] and all(r["measure"] and r["value"] for r in entry["rows"]), name
        assert all(r["passed"] in (True, False, None) for r in entry["rows"]), name


# ---------------------------------------------------------------- buttons


class _Config:
    def __init__(self, options):
        self.html_theme_options = options
        self.crs_published_branch = "gh-pages"


class _App:
    def __init__(self, options):
        self.config = _Config(options)


def test_without_a_repository_url_no_button_points_nowhere(crs_book, monkeypatch) -> None:
    monkeypatch.delenv("CRS_REPOSITORY_URL", raising=False)
    config = _Config({"repository_url": "", "launch_buttons": {"binderhub_url": "https://mybinder.org"}})
    crs_book._repository_from_environment(None, config)
    options = config.html_theme_options
    assert options["launch_buttons"] == {} and options["use_repository_button"] is False

    monkeypatch.setenv("CRS_REPOSITORY_URL", REPOSITORY)
    config = _Config({"repository_url": "", "launch_buttons": {"binderhub_url": "https://mybinder.org"}})
    crs_book._repository_from_environment(None, config)
    options = config.html_theme_options
    assert options["repository_url"] == REPOSITORY and options["use_repository_button"] is True
    assert options["launch_buttons"]["binderhub_url"] == "https://mybinder.org"


def test_study_launch_buttons_open_what_exists_in_git(crs_book) -> None:
    page = "book/generated/02_agreement"
    context = {"header_buttons": [{"label": "launch-buttons", "buttons": [
        {"text": "Binder", "url": f"https://mybinder.org/v2/gh/o/r/main?urlpath=lab/tree/{page}.ipynb"},
        {"text": "Colab", "url": f"https://colab.research.google.com/github/o/r/blob/main/{page}.ipynb"},
    ]}]}
    app = _App({"repository_url": "https://github.com/o/r", "repository_branch": "main"})
    crs_book._launch_targets(app, page, "page.html", context, None)
    binder, colab = context["header_buttons"][0]["buttons"]
    assert binder["url"] == "https://mybinder.org/v2/gh/o/r/main?urlpath=lab/tree/notebooks/02_agreement.py"
    assert colab["url"] == f"https://colab.research.google.com/github/o/r/blob/gh-pages/_sources/{page}.ipynb"
    # a page that is not a study notebook keeps the theme's links
    context = {"header_buttons": [{"label": "launch-buttons", "buttons": [{"text": "Binder", "url": "u"}]}]}
    crs_book._launch_targets(app, "book/intro", "page.html", context, None)
    assert context["header_buttons"][0]["buttons"][0]["url"] == "u"


def test_a_bad_repository_url_is_refused_before_anything_runs(tmp_path) -> None:
    with pytest.raises(ConfigError, match="https://"):
        build_book("quick", run_root=tmp_path / "runs", book_root=tmp_path, repository_url="github.com/o/r")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_built_site_has_launch_repository_and_download_buttons(quick_book, quick_book_with_url) -> None:
    """The quick book rebuilt with a repository URL: every study page can be
    launched on Binder and Colab, and the targets are files that exist."""
    root, record = quick_book
    html_dir = quick_book_with_url

    for entry in record.notebooks:
        page = html_dir / "book" / "generated" / f"{entry.name}.html"
        hrefs = _hrefs(page)
        binder = [h for h in hrefs if h.startswith("https://mybinder.org/v2/gh/example-org/crs-companion/main")]
        colab = [h for h in hrefs if h.startswith("https://colab.research.google.com/github/example-org/")]
        assert binder == [f"https://mybinder.org/v2/gh/example-org/crs-companion/main"
                          f"?urlpath=lab/tree/notebooks/{entry.name}.py"], entry.name
        assert (REPO_ROOT / "notebooks" / f"{entry.name}.py").is_file()
        assert colab == [f"https://colab.research.google.com/github/example-org/crs-companion/blob/gh-pages/"
                         f"_sources/book/generated/{entry.name}.ipynb"], entry.name
        # the executed notebook the Colab link opens is what the published site carries
        assert (html_dir / "_sources" / "book" / "generated" / f"{entry.name}.ipynb").is_file()
        assert any(h.endswith(f"_sources/book/generated/{entry.name}.ipynb") for h in hrefs), "download .ipynb"
    intro = _hrefs(html_dir / "book" / "intro.html")
    assert REPOSITORY in intro, "repository button"
    assert any(h.startswith(REPOSITORY + "/issues") for h in intro), "issues button"
    assert not any("mybinder.org" in h for h in intro), "a page that is not a notebook has no launch button"

    # the default build (no URL) has neither launch nor repository links
    default_hrefs = _hrefs(root / "_build" / "html" / "book" / "generated" / "02_agreement.html")
    assert not any("mybinder.org" in h or "colab.research" in h for h in default_hrefs)


@pytest.mark.slow
def test_performance_page_renders_the_bench_results(quick_book) -> None:
    root, _ = quick_book
    page = (root / "_build" / "html" / "book" / "performance.html").read_text(encoding="utf-8")
    data = json.loads((REPO_ROOT / "bench" / "results.json").read_text())
    assert page.count("<table") == len(data["benchmarks"])
    for entry in data["benchmarks"].values():
        assert html.escape(entry["title"]) in page
        for row in entry["rows"]:
            assert html.escape(row["value"]) in page, row["measure"]


@pytest.mark.slow
def test_the_root_redirect_page_finds_a_favicon(quick_book) -> None:
    """The root index.html links no icon, so browsers fetch /favicon.ico; it must exist."""
    from PIL import Image

    root, _ = quick_book
    html_dir = root / "_build" / "html"
    assert "favicon" not in (html_dir / "index.html").read_text(encoding="utf-8")
    with Image.open(html_dir / "favicon.ico") as icon:
        assert icon.format == "ICO" and icon.size == (64, 64)


def test_binder_opens_text_notebooks_as_notebooks() -> None:
    post_build = REPO_ROOT / "postBuild"
    assert post_build.stat().st_mode & 0o111, "repo2docker runs postBuild only when it is executable"
    assert "jupytext-config set-default-viewer" in post_build.read_text()
    done = subprocess.run([str(Path(sys.executable).parent / "jupytext-config"), "set-default-viewer", "--help"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

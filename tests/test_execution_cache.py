"""A warm rebuild reuses identical notebook executions, and only those."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crslib.runner import _names_external_input, run_notebooks

NOTEBOOK = '''# %% tags=["parameters"]
data = "phantom?patients=10"
draws = 3
results_dir = "results/x"

# %%
import json, pathlib, random
pathlib.Path(results_dir).mkdir(parents=True, exist_ok=True)
value = [random.random() for _ in range(draws)]  # unseeded: a new execution gives new numbers
pathlib.Path(results_dir, "value.json").write_text(json.dumps(value))
print(value)
'''

# reads the notebook before it, so it declares run_dir (as chapter 07 does) and runs after it
READER = '''# %% tags=["parameters"]
run_dir = "."
results_dir = "results/y"

# %%
import json, pathlib
upstream = json.loads((pathlib.Path(run_dir) / "results" / "01_draw" / "value.json").read_text())
pathlib.Path(results_dir).mkdir(parents=True, exist_ok=True)
pathlib.Path(results_dir, "sum.json").write_text(json.dumps(sum(upstream)))
'''


@pytest.fixture()
def book(tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "01_draw.py").write_text(NOTEBOOK)
    (notebooks / "02_read.py").write_text(READER)

    def run(config: dict, **kwargs):
        path = tmp_path / f"config{len(list(tmp_path.glob('config*.yaml')))}.yaml"
        path.write_text(json.dumps({"name": "t", **config}))
        record = run_notebooks(str(path), run_root=tmp_path / "runs", notebook_dir=notebooks, **kwargs)
        values = json.loads((Path(record.run_dir) / "results" / "01_draw" / "value.json").read_text())
        return record, values

    return run, notebooks


def test_identical_execution_is_reused_and_anything_else_executes(book) -> None:
    run, notebooks = book
    first, a = run({"parameters": {"draws": 3}})
    assert [n.reused_from for n in first.notebooks] == [None, None]
    second, b = run({"parameters": {"draws": 3}})
    assert b == a and [n.reused_from for n in second.notebooks] == [first.run_id] * 2
    assert second.run_dir != first.run_dir  # a new run folder all the same
    # the copied notebook names its own run's results folder, not the earlier run's
    text = Path(second.notebooks[0].output).read_text()
    assert second.run_dir in text and first.run_dir not in text
    reader = json.loads((Path(second.run_dir) / "results" / "02_read" / "sum.json").read_text())
    assert reader == pytest.approx(sum(a))

    third, c = run({"parameters": {"draws": 4}})  # other parameters: executes
    assert len(c) == 4 and third.notebooks[0].reused_from is None
    forced, d = run({"parameters": {"draws": 3}}, reuse=False)
    assert d != a and forced.notebooks[0].reused_from is None

    (notebooks / "01_draw.py").write_text(NOTEBOOK.replace("print(value)", "print(len(value))"))
    edited, e = run({"parameters": {"draws": 3}})  # changed source: executes, and so does what reads it
    assert e != a and [n.reused_from for n in edited.notebooks] == [None, None]


def test_runs_on_the_users_own_files_always_execute(book, tmp_path) -> None:
    run, _ = book
    own = tmp_path / "my_images"
    own.mkdir()
    from PIL import Image
    from skimage import data

    Image.fromarray(data.camera()[:64, :64]).save(own / "tile.png")  # a real image: the run checks its data first
    _, a = run({"parameters": {"data": str(own)}})
    again, b = run({"parameters": {"data": str(own)}})
    assert b != a and again.notebooks[0].reused_from is None
    # and the notebook after one that executed is not reused either
    assert again.notebooks[1].reused_from is None


@pytest.mark.parametrize("value, external", [
    ("phantom?patients=150&size=64&seed=0", False), ("timm:resnet18?size=64", False), (3, False),
    ("timm:resnet50?weights=/w.pth", True), ("timm:vit?pretrained=hf", True), ("onnx:/m.onnx#out", True),
    (".", True),
])
def test_what_counts_as_the_users_own_input(value, external) -> None:
    assert _names_external_input(value) is external


def test_code_digest_covers_the_subpackages(monkeypatch):
    """A change in crslib/models/ or crslib/data/ must invalidate cached executions."""
    from crslib import runner

    before = runner._code_digest()
    real = runner.file_sha256
    for changed in ("models/zoo.py", "data/phantom.py", "agreement.py"):
        monkeypatch.setattr(runner, "file_sha256",
                            lambda p, changed=changed: "edited" if p.as_posix().endswith("crslib/" + changed) else real(p))
        assert runner._code_digest() != before, changed
    monkeypatch.setattr(runner, "file_sha256", real)
    assert runner._code_digest() == before


def _record(run_id: str, reused_from: str | None, parameters: dict | None = None):
    from crslib.records import NotebookRecord, RunRecord

    record = RunRecord(run_id, f"runs/{run_id}", "quick", {}, "2026-01-01T00:00:00+00:00")
    for name in ("01_a", "02_b"):
        record.notebooks.append(NotebookRecord(name, dict(parameters or {"data": "phantom"}), 1.0, f"{name}.ipynb",
                                               reused_from=reused_from))
    return record


def test_a_warm_rebuild_with_nothing_changed_keeps_the_last_html_and_anything_else_rebuilds(tmp_path) -> None:
    from crslib._io import atomic_write_json
    from crslib.runner import BUILD_STAMP, _build_key, _unchanged_build

    (tmp_path / "book").mkdir()
    for name in ("_config.yml", "_toc.yml", "book/intro.md"):
        (tmp_path / name).write_text(name)
    (tmp_path / "book" / "generated").mkdir()
    (tmp_path / "_build" / "html").mkdir(parents=True)
    (tmp_path / "_build" / "html" / "index.html").write_text("<html></html>")
    cold = _record("cold", None)  # executed every notebook
    atomic_write_json(tmp_path / "_build" / BUILD_STAMP,
                      {"key": _build_key(cold, tmp_path, None), "run_id": "cold", "run_dir": cold.run_dir})
    warm = _record("warm", "cold")
    stamp = _unchanged_build(warm, tmp_path, None)
    assert stamp["run_id"] == "cold" and stamp["html_index"] == str(tmp_path / "_build" / "html" / "index.html")
    (tmp_path / "book" / "generated" / "page.md").write_text("staged pages are not sources")
    assert _unchanged_build(warm, tmp_path, None) is not None
    assert _unchanged_build(warm, tmp_path, "https://example.org/o/r") is None  # another repository URL
    assert _unchanged_build(_record("warm2", None), tmp_path, None) is None  # a notebook executed again
    assert _unchanged_build(_record("warm3", "other"), tmp_path, None) is None  # other executions
    (tmp_path / "book" / "intro.md").write_text("edited")
    assert _unchanged_build(warm, tmp_path, None) is None  # a hand-written page changed
    # a run on the user's own files has no key: its book is always built
    assert _build_key(_record("own", None, {"data": str(tmp_path)}), tmp_path, None) is None


def test_chapter_07_reading_its_own_run_folder_is_reusable_and_another_folder_is_not(tmp_path) -> None:
    """``run_dir="."`` is the run folder itself, whose results the upstream keys cover; another folder is the user's."""
    from crslib.runner import execution_key

    source = tmp_path / "07_x.py"
    source.write_text("# %%\nx = 1\n")
    assert execution_key(source, {"run_dir": ".", "results_dir": "results/07"}, "up", {}) is not None
    assert execution_key(source, {"run_dir": str(tmp_path), "results_dir": "r"}, "up", {}) is None
    assert execution_key(source, {"run_dir": ".", "results_dir": "r"}, "up", {}) != \
        execution_key(source, {"run_dir": ".", "results_dir": "r"}, "other upstream", {})

"""`crs book -p NAME VALUE`, the book's progress lines, and a quiet kernel."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from crslib import runner
from crslib.cli import main
from crslib.errors import ConfigError, NotebookError
from crslib.overrides import apply_overrides
from crslib.runner import execution_key, notebook_parameters, run_notebooks

DECLARED = {
    "01_data": {"data": "phantom", "model": "timm:a", "seed": 0, "perplexity": 30.0, "flag": False,
                "n_permutations": None, "seeds": "0,1"},
    "02_agreement": {"data": "phantom", "models": "zoo:*", "k": 10, "seed": 0},
    "07_report": {"run_dir": "."},
}

DRAW = '''# %% tags=["parameters"]
draws = 3
label = "a"
results_dir = "results/x"

# %%
import json, pathlib, random
pathlib.Path(results_dir).mkdir(parents=True, exist_ok=True)
if draws < 0:
    raise ValueError(f"negative draws {draws}")
value = [random.random() for _ in range(draws)]  # unseeded: a new execution gives new numbers
pathlib.Path(results_dir, "value.json").write_text(json.dumps(value))
'''

READ = '''# %% tags=["parameters"]
label = "b"
results_dir = "results/y"

# %%
import pathlib
pathlib.Path(results_dir).mkdir(parents=True, exist_ok=True)
pathlib.Path(results_dir, "label.txt").write_text(label)
'''


def overridden(pairs, config=None, declared=DECLARED):
    return apply_overrides(config or {"name": "quick"}, declared, pairs)["notebooks"]


# --- apply_overrides: known answers -------------------------------------------------------------

def test_a_name_sets_every_notebook_that_declares_it_and_a_prefix_one_notebook() -> None:
    assert overridden([("seed", "3")]) == {"01_data": {"seed": 3}, "02_agreement": {"seed": 3}}
    assert overridden([("02_agreement.seed", "4")]) == {"02_agreement": {"seed": 4}}
    assert overridden([("02.seed", "4")]) == {"02_agreement": {"seed": 4}}  # the number prefix, as --only takes
    # the notebook-specific value wins whatever the order
    for pairs in ([("02.seed", "4"), ("seed", "3")], [("seed", "3"), ("02.seed", "4")]):
        assert overridden(pairs) == {"01_data": {"seed": 3}, "02_agreement": {"seed": 4}}
    assert overridden([("k", "5"), ("k", "20")]) == {"02_agreement": {"k": 20}}  # otherwise the later wins


def test_an_override_beats_the_presets_own_notebook_section_and_leaves_the_input_alone() -> None:
    config = {"name": "quick", "parameters": {"data": "phantom?size=64"},
              "notebooks": {"02_agreement": {"data": "phantom?kermany=1", "k": 7}, "05_other": {"x": 1}}}
    out = apply_overrides(config, DECLARED, [("data", "/my/images")])
    assert out["notebooks"] == {"02_agreement": {"data": "/my/images", "k": 7}, "05_other": {"x": 1},
                                "01_data": {"data": "/my/images"}}
    assert out["parameters"] == {"data": "phantom?size=64"} and out["name"] == "quick"
    assert config["notebooks"]["02_agreement"] == {"data": "phantom?kermany=1", "k": 7}


@pytest.mark.parametrize("name, value, expected", [
    ("seed", "20", 20), ("perplexity", "0.5", 0.5), ("perplexity", "20", 20.0), ("perplexity", "1e-3", 0.001),
    ("flag", "true", True), ("model", "timm:resnet18?size=32", "timm:resnet18?size=32"),
    ("model", "hf:facebook/dinov2-small?pooling=cls", "hf:facebook/dinov2-small?pooling=cls"),
    ("seeds", "0", "0"), ("seeds", "01", "01"), ("model", "no", "no"),  # text defaults keep the text as typed
    ("n_permutations", "50", 50), ("n_permutations", "null", None), ("n_permutations", "abc", "abc"),
])
def test_values_are_read_as_yaml_and_fit_the_defaults_type(name, value, expected) -> None:
    got = overridden([(f"01.{name}", value)])["01_data"][name]
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("name, value, message", [
    ("seed", "0.5", "-p seed 0.5: the notebook's default is int 0, this value is float"),
    ("seed", "true", "-p seed true: the notebook's default is int 0, this value is bool"),
    ("seed", "ten", "-p seed ten: the notebook's default is int 0, this value is str"),
    ("flag", "1", "-p flag 1: the notebook's default is bool False, this value is int"),
    ("perplexity", "high", "-p perplexity high: the notebook's default is float 30.0, this value is str"),
])
def test_a_value_of_the_wrong_type_is_one_line(name, value, message) -> None:
    with pytest.raises(ConfigError) as error:
        overridden([(name, value)])
    assert str(error.value) == message


def test_an_unknown_name_or_notebook_is_an_error_with_suggestions() -> None:
    with pytest.raises(ConfigError) as error:
        overridden([("modl", "x")])
    assert str(error.value) == ("-p modl: no selected notebook (01_data, 02_agreement, 07_report) has a "
                                "parameter 'modl'; did you mean model, models?")
    with pytest.raises(ConfigError) as error:
        overridden([("07.k", "3")])  # k exists, but not in the notebook named
    assert str(error.value) == ("-p 07.k: no selected notebook (07_report) has a parameter 'k'; "
                                "their parameters are run_dir")
    with pytest.raises(ConfigError) as error:
        overridden([("03.k", "3")])
    assert str(error.value) == "-p 03.k: '03' names no selected notebook (selected: 01_data, 02_agreement, 07_report)"


# --- run_notebooks: overrides in run.json and the cache key, progress, the kernel's stderr --------

@pytest.fixture()
def notebooks(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CRS_BOOK_WORKERS", "1")  # one after the other: the events' order is known (see test_notebook_pool)
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "01_draw.py").write_text(DRAW)
    (folder / "02_read.py").write_text(READ)
    (tmp_path / "config.yaml").write_text("name: t\nparameters:\n  draws: 2\n")
    return folder


def run(tmp_path, notebooks, **kwargs):
    events = []
    record = run_notebooks(str(tmp_path / "config.yaml"), run_root=tmp_path / "runs", notebook_dir=notebooks,
                           progress=events.append, **kwargs)
    return record, [(e.event, e.index, e.total, e.name, e.reused_from) for e in events]


def test_overrides_reach_the_notebooks_run_json_and_the_execution_key(tmp_path, notebooks, capfd) -> None:
    plain, _ = run(tmp_path, notebooks)
    record, events = run(tmp_path, notebooks, overrides=[("draws", "4"), ("02.label", "c")])
    run_json = json.loads((Path(record.run_dir) / "run.json").read_text())
    assert run_json["overrides"] == [["draws", "4"], ["02.label", "c"]]
    assert [(n["name"], n["parameters"]["draws"] if "draws" in n["parameters"] else None, n["parameters"]["label"])
            for n in run_json["notebooks"]] == [("01_draw", 4, "a"), ("02_read", None, "c")]
    assert len(json.loads((Path(record.run_dir) / "results" / "01_draw" / "value.json").read_text())) == 4
    assert (Path(record.run_dir) / "results" / "02_read" / "label.txt").read_text() == "c"
    assert "draws: 4" in (Path(record.run_dir) / "config.yaml").read_text()
    # an override is a new execution (not the cached plain one); the same override again is reused
    assert [n.reused_from for n in record.notebooks] == [None, None]
    again, events = run(tmp_path, notebooks, overrides=[("draws", "4"), ("02.label", "c")])
    assert [n.reused_from for n in again.notebooks] == [record.run_id] * 2
    assert events == [("start", 1, 2, "01_draw", None), ("done", 1, 2, "01_draw", record.run_id),
                      ("start", 2, 2, "02_read", None), ("done", 2, 2, "02_read", record.run_id)]
    source = notebooks / "01_draw.py"
    keys = {execution_key(source, n.parameters, "", record.versions) for n in (plain.notebooks[0], record.notebooks[0])}
    assert len(keys) == 2
    assert "Kernel is running over TCP" not in capfd.readouterr().err


def test_progress_reports_each_notebook_in_order_and_a_failure(tmp_path, notebooks) -> None:
    _, events = run(tmp_path, notebooks)
    assert events == [("start", 1, 2, "01_draw", None), ("done", 1, 2, "01_draw", None),
                      ("start", 2, 2, "02_read", None), ("done", 2, 2, "02_read", None)]
    events = []
    with pytest.raises(NotebookError, match="notebook 01_draw failed"):
        run_notebooks(str(tmp_path / "config.yaml"), run_root=tmp_path / "runs", notebook_dir=notebooks,
                      overrides=[("draws", "-1")], progress=events.append)
    assert [(e.event, e.name) for e in events] == [("start", "01_draw"), ("failed", "01_draw")]
    assert events[-1].seconds > 0 and events[-1].elapsed >= events[-1].seconds


def test_the_kernel_filter_drops_only_the_tcp_warning_and_the_stop_signal() -> None:
    noise = runner._KernelTransportNoise()

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("IPKernelApp", logging.WARNING, __file__, 1, message, None, None)

    assert not noise.filter(record("Kernel is running over TCP without encryption. All communication ..."))
    assert not noise.filter(record("KeyboardInterrupt caught in kernel."))  # a slow kernel stopped after its notebook
    assert noise.filter(record("Error in cell: KeyboardInterrupt caught in kernel."))  # only at the start
    assert noise.filter(record("Config file not found, skipping: x.json"))
    # the kernel resolves the filter by this dotted path
    assert runner._KERNEL_CONFIG["IPKernelApp"]["logging_config"]["filters"]["crs_kernel_transport"]["()"] \
        == "crslib.runner._KernelTransportNoise"


# --- the crs book command -------------------------------------------------------------------------

@pytest.fixture()
def repository(tmp_path, notebooks, monkeypatch) -> Path:
    """A repository root holding the two tiny notebooks, so `crs book` runs and stages them in tmp_path."""
    monkeypatch.setattr(runner, "REPO_ROOT", tmp_path)
    return tmp_path


def test_crs_book_prints_progress_in_order_and_no_kernel_warning(repository, capfd) -> None:
    status = main(["book", "--config", str(repository / "config.yaml"), "--no-build", "-p", "draws", "5"])
    out, err = capfd.readouterr()
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "[1/2] 01_draw: running..."
    assert lines[1].startswith("[1/2] 01_draw: done in ") and lines[1].endswith(" s")
    assert "  [##########..........] 1/2, elapsed " in lines[1]
    assert lines[2] == "[2/2] 02_read: running..."
    assert "  [####################] 2/2, elapsed " in lines[3]
    assert lines[4].startswith("run folder: ") and len(lines) == 5
    # the filtered message only: a kernel slow to stop on a loaded machine may still log its shutdown
    assert "Kernel is running over TCP" not in err
    run_json = json.loads((Path(lines[4].removeprefix("run folder: ")) / "run.json").read_text())
    assert run_json["overrides"] == [["draws", "5"]] and run_json["notebooks"][0]["parameters"]["draws"] == 5


def test_crs_book_unknown_parameter_is_one_line_and_runs_nothing(repository, capfd) -> None:
    status = main(["book", "--config", str(repository / "config.yaml"), "--only", "02", "-p", "draws", "5"])
    out, err = capfd.readouterr()
    assert status == 2 and out == ""
    assert err == ("crs book: error: -p draws: no selected notebook (02_read) has a parameter 'draws'; "
                   "their parameters are label\n")
    assert not (repository / "runs").exists()


@pytest.mark.slow
def test_crs_book_quick_01_with_a_model_override_records_it(tmp_path, repo_root, monkeypatch, capfd) -> None:
    """The issue's done-when check, on the real notebook 01 (staged in tmp_path, not the repository)."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_data_and_embeddings.py").write_text(
        (repo_root / "notebooks" / "01_data_and_embeddings.py").read_text())
    monkeypatch.setattr(runner, "REPO_ROOT", tmp_path)
    status = main(["book", "--preset", "quick", "--only", "01", "-p", "model", "timm:resnet18?size=32", "--no-build"])
    out, err = capfd.readouterr()
    assert status == 0, err
    assert out.startswith("[1/1] 01_data_and_embeddings: running...\n[1/1] 01_data_and_embeddings: ")
    assert "Kernel is running over TCP" not in err
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["overrides"] == [["model", "timm:resnet18?size=32"]]
    assert record["notebooks"][0]["parameters"]["model"] == "timm:resnet18?size=32"
    assert record["config"]["notebooks"]["01_data_and_embeddings"]["model"] == "timm:resnet18?size=32"
    executed = (run_dir / "notebooks" / "01_data_and_embeddings.ipynb").read_text()
    assert 'model = \\"timm:resnet18?size=32\\"' in executed  # papermill's injected parameters cell
    assert notebook_parameters(tmp_path / "notebooks" / "01_data_and_embeddings.py")["model"] != "timm:resnet18?size=32"

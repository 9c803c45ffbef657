"""The papermill runner: parameters, run folders, failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crslib.errors import ConfigError, NotebookError
from crslib.runner import notebook_parameters, resolve_parameters, run_notebooks

NOTEBOOK = '''# %% [markdown]
# # A test notebook

# %% tags=["parameters"]
value = 1
label = "a"
results_dir = "results"

# %%
from pathlib import Path
Path(results_dir).mkdir(parents=True, exist_ok=True)
if value < 0:
    raise ValueError(f"negative value {value}")
Path(results_dir, "out.txt").write_text(f"{value}-{label}")
'''


@pytest.fixture()
def notebook_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "01_probe.py").write_text(NOTEBOOK)
    return folder


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_parameters_cell_is_read(notebook_dir: Path) -> None:
    assert notebook_parameters(notebook_dir / "01_probe.py") == {
        "value": 1, "label": "a", "results_dir": "results"}


def test_missing_parameters_cell_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "01_bare.py"
    path.write_text("# %%\nx = 1\n")
    with pytest.raises(ConfigError, match="exactly one cell tagged 'parameters'"):
        notebook_parameters(path)


def test_shared_parameters_apply_only_where_declared(notebook_dir: Path) -> None:
    config = {"name": "t", "parameters": {"value": 5, "undeclared": 1},
              "notebooks": {"01_probe": {"label": "b"}}}
    assert resolve_parameters(config, notebook_dir / "01_probe.py") == {"value": 5, "label": "b"}


def test_unknown_notebook_parameter_is_an_error(notebook_dir: Path) -> None:
    config = {"name": "t", "notebooks": {"01_probe": {"nope": 1}}}
    with pytest.raises(ConfigError, match="nope"):
        resolve_parameters(config, notebook_dir / "01_probe.py")


@pytest.mark.slow
def test_run_executes_with_parameters_into_new_run_folders(tmp_path: Path, notebook_dir: Path) -> None:
    config = write_config(tmp_path, "parameters:\n  value: 7\n  label: z\n")
    first = run_notebooks(config, run_root=tmp_path / "runs", notebook_dir=notebook_dir)
    second = run_notebooks(config, run_root=tmp_path / "runs", notebook_dir=notebook_dir)
    assert first.run_dir != second.run_dir
    out = Path(first.run_dir) / "results" / "01_probe" / "out.txt"
    assert out.read_text() == "7-z"
    record = json.loads((Path(first.run_dir) / "run.json").read_text())
    assert record["notebooks"][0]["parameters"]["value"] == 7
    assert record["notebooks"][0]["seconds"] > 0
    assert (Path(first.run_dir) / "config.yaml").is_file()


@pytest.mark.slow
def test_failing_notebook_names_notebook_and_cell(tmp_path: Path, notebook_dir: Path) -> None:
    config = write_config(tmp_path, "parameters:\n  value: -3\n")
    with pytest.raises(NotebookError) as info:
        run_notebooks(config, run_root=tmp_path / "runs", notebook_dir=notebook_dir)
    message = str(info.value)
    assert "01_probe" in message and "ValueError" in message and "negative value -3" in message
    assert "cell" in message


def test_read_run_evidence_merges_notebooks_in_order(tmp_path) -> None:
    import json

    from crslib.errors import ConfigError
    from crslib.runner import read_run_evidence

    run = tmp_path / "20261130T010000Z-quick"
    for name, payload in [("04_protocol", {"threshold": {"rule": "youden"}, "metrics": {"reported": ["auroc"]}}),
                          ("05_audit", {"split": {"provenance": "official"}, "metrics": {"reported": ["f1"]}})]:
        (run / "results" / name).mkdir(parents=True)
        (run / "results" / name / "evidence.json").write_text(json.dumps(payload))
    (run / "results" / "06_other").mkdir()
    evidence, run_id = read_run_evidence(run)
    assert run_id == run.name
    assert set(evidence) == {"threshold", "metrics", "split"}
    assert evidence["metrics"] == {"reported": ["f1"]}, "the later notebook's record wins"
    (run / "results" / "06_other" / "evidence.json").write_text("{not json")
    with pytest.raises(ConfigError, match="06_other"):
        read_run_evidence(run)
    with pytest.raises(ConfigError, match="does not exist"):
        read_run_evidence(tmp_path / "absent")
    assert read_run_evidence(tmp_path)[0] == {}

"""The papermill runner: parameters, run folders, failures."""

from __future__ import annotations

import json
import os
import stat
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


@pytest.fixture()
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_atomic_writes_honour_the_umask_like_open_does(tmp_path, mask, mode) -> None:
    from crslib._io import atomic_write_json

    previous = os.umask(mask)
    try:
        path = atomic_write_json(tmp_path / "run.json", {"a": 1})
        (tmp_path / "plain.txt").write_text("x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == mode == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode)
    assert json.loads(path.read_text()) == {"a": 1} and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_a_run_folder_is_readable_by_group_and_others_under_umask_022(tmp_path, notebook_dir, umask_022) -> None:
    record = run_notebooks(write_config(tmp_path, "parameters:\n  value: 2\n"), run_root=tmp_path / "runs",
                           notebook_dir=notebook_dir)
    run_dir = Path(record.run_dir)
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"run.json", "config.yaml", "out.txt"} <= {p.name for p in files}
    unreadable = [f"{p.relative_to(run_dir)} {stat.filemode(p.stat().st_mode)}" for p in run_dir.rglob("*")
                  if p.stat().st_mode & (0o055 if p.is_dir() else 0o044) != (0o055 if p.is_dir() else 0o044)]
    assert not unreadable, unreadable


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


# --------------------------------------------------------------------------- execution keys, provenance, staging


def test_execution_key_follows_source_parameters_upstream_versions_and_code(tmp_path, monkeypatch) -> None:
    import shutil

    from crslib import runner

    source = tmp_path / "01_probe.py"
    source.write_text(NOTEBOOK)
    params = {"value": 1, "label": "a", "results_dir": str(tmp_path / "r1")}
    versions = {"numpy": "2.4.0"}
    key = runner.execution_key(source, params, "up", versions)
    assert isinstance(key, str) and len(key) == 64 and int(key, 16) >= 0
    assert runner.execution_key(source, dict(params), "up", dict(versions)) == key  # same inputs, same key
    # the run-specific results folder is not part of the key
    assert runner.execution_key(source, {**params, "results_dir": str(tmp_path / "r2")}, "up", versions) == key
    changed = {
        "parameter": runner.execution_key(source, {**params, "value": 2}, "up", versions),
        "upstream": runner.execution_key(source, params, "other", versions),
        "versions": runner.execution_key(source, params, "up", {"numpy": "2.4.1"}),
    }
    source.write_text(NOTEBOOK.replace("value = 1", "value = 1  # edited"))
    changed["source"] = runner.execution_key(source, params, "up", versions)
    source.write_text(NOTEBOOK)
    # the crslib code: the same files elsewhere give the same key, one changed file another key
    code = tmp_path / "crslib"
    shutil.copytree(Path(runner.__file__).parent, code, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(runner, "__file__", str(code / "runner.py"))
    assert runner.execution_key(source, params, "up", versions) == key
    with open(code / "metrics.py", "a") as handle:
        handle.write("\n# a change\n")
    changed["crslib code"] = runner.execution_key(source, params, "up", versions)
    assert all(value is not None and value != key for value in changed.values()), changed
    assert len(set(changed.values())) == len(changed)
    # a parameter naming the user's own file: never reused
    (tmp_path / "mine.csv").write_text("path\n")
    assert runner.execution_key(source, {**params, "data": str(tmp_path / "mine.csv")}, "up", versions) is None
    assert runner.execution_key(source, {**params, "data": "phantom?patients=4"}, "up", versions) is not None


def test_collect_provenance_hashes_data_zoo_and_weights(tmp_path, monkeypatch) -> None:
    import hashlib

    import crslib.models
    from crslib._io import digest_of
    from crslib.data import load_data
    from crslib.records import NotebookRecord, RunRecord
    from crslib.staging import collect_provenance, git_commit

    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    weights = {}
    for name in ("lite0.safetensors", "nsfw.onnx"):
        weights[name] = tmp_path / name
        weights[name].write_bytes(name.encode() * 10)
    # stand-ins for the packaged weights (converting EfficientNet-Lite0 takes seconds)
    monkeypatch.setattr(crslib.models, "convert_efficientnet_lite0", lambda: weights["lite0.safetensors"])
    monkeypatch.setattr(crslib.models, "open_nsfw_onnx_path", lambda: weights["nsfw.onnx"])
    spec = "phantom?patients=8&size=32&seed=0"
    manifest = load_data(spec)
    cards = crslib.models.train_zoo(manifest, specs=[crslib.models.ZooModelSpec.make("random_init")], image_size=16,
                                 progress=False)
    record = RunRecord("run", str(tmp_path / "run"), "quick", {}, "2026-01-01T00:00:00+00:00", notebooks=[
        NotebookRecord("01_a", {"data": spec, "seed": 3, "k": 10}, 1.0, "a.ipynb"),
        NotebookRecord("02_b", {"null_data": spec, "seeds": [0, 1]}, 1.0, "b.ipynb"),
    ])
    prov = collect_provenance(record)
    assert set(prov) == {"data", "zoo", "public_weights", "seeds", "commit"}
    assert prov["commit"] == git_commit() and len(prov["commit"].removesuffix("+dirty")) == 40
    contents = sorted(hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in manifest["path"])
    assert prov["data"] == {spec: {"images": len(manifest), "patients": int(manifest["patient_id"].nunique()),
                                   "content_sha256": digest_of(contents)}}
    assert prov["seeds"] == {"01_a.seed": 3, "02_b.seeds": [0, 1]}
    # the shipped zoo, whose names a bare zoo: spec loads, then the cache's model that no shipped one hides
    from crslib.models.zoo_shipped import shipped_cards

    shipped = shipped_cards()
    assert [m["name"] for m in prov["zoo"]] == sorted(shipped)
    for entry in prov["zoo"]:
        card = shipped[entry["name"]]
        assert entry == {"name": card["name"], "weights": "shipped", "key": card["key"],
                         "training_data_hash": card["training_data_hash"],
                         "checkpoint_sha256": card["checkpoint_sha256"], "trained_commit": card["trained_commit"]}
    assert cards.loc[0, "key"] not in {m["key"] for m in prov["zoo"]}  # hidden by the shipped model of its name
    assert prov["public_weights"] == {
        "efficientnet_lite0 (converted to timm)": hashlib.sha256(b"lite0.safetensors" * 10).hexdigest(),
        "open_nsfw (ONNX)": hashlib.sha256(b"nsfw.onnx" * 10).hexdigest(),
    }


def test_stage_run_copies_the_run_into_book_generated(tmp_path, monkeypatch) -> None:
    import nbformat

    from crslib.claims import CLAIM_IDS
    from crslib.records import NotebookRecord, RunRecord
    from crslib.staging import GENERATED, render_reproducibility, stage_run

    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "notebooks").mkdir(parents=True)
    notebooks = []
    for name in ("01_a", "02_b"):
        output = run_dir / "notebooks" / f"{name}.ipynb"
        results = run_dir / "results" / name
        results.mkdir(parents=True)
        (results / "table.csv").write_text("a,b\n1,2\n")
        (results / "audit.json").write_text(json.dumps({"path": str(tmp_path / "cache" / "phantom" / "x.png"),
                                                        "results": str(results)}))
        (results / "embeddings.npy").write_bytes(b"not for readers")
        nb = nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_markdown_cell("# Title"),
            nbformat.v4.new_code_cell("seed = 0", metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell(f"# Parameters\nseed = 1\nresults_dir = {str(results)!r}",
                                      metadata={"tags": ["injected-parameters"]}),
            nbformat.v4.new_code_cell("print(seed)", outputs=[nbformat.v4.new_output(
                "stream", name="stdout", text=f"wrote {results}/table.csv from {tmp_path / 'cache'}/emb.npy\n")])])
        nbformat.write(nb, output)
        notebooks.append(NotebookRecord(name, {"seed": 1, "model": "<b>m|x</b>", "results_dir": str(results)}, 2.0,
                                        str(output)))
    record = RunRecord("r1", str(run_dir), "quick", {}, "2026-01-01T00:00:00+00:00", notebooks=notebooks,
                       versions={"numpy": "2.4.0"})
    (run_dir / "run.json").write_text(json.dumps(record.to_dict()))
    book = tmp_path / "book_root"
    (book / GENERATED).mkdir(parents=True)
    (book / GENERATED / "stale.ipynb").write_text("from an older run")
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    target = stage_run(record, book_root=book)
    assert target == book / "book" / "generated"
    assert sorted(p.name for p in target.iterdir()) == ["01_a.ipynb", "02_b.ipynb", "claims.md", "reproducibility.md",
                                                        "results", "run.json", "start_here.md"]
    assert sorted(p.relative_to(target / "results").as_posix() for p in (target / "results").rglob("*.*")) == [
        "01_a/audit.json", "01_a/table.csv", "02_b/audit.json", "02_b/table.csv"]  # tables, not arrays
    # what a reader downloads names no folder of the build machine
    for path in [*target.glob("*.ipynb"), *(target / "results").rglob("*.*")]:
        assert str(tmp_path) not in path.read_text(), path.name
    assert json.loads((target / "results" / "01_a" / "audit.json").read_text()) == {
        "path": "$CRS_CACHE_DIR/phantom/x.png", "results": "./results/01_a"}
    for notebook in notebooks:
        staged = nbformat.read(target / Path(notebook.output).name, as_version=4)
        assert [c.metadata.get("tags", []) for c in staged.cells[1:3]] == [["parameters", "remove-cell"],
                                                                         ["injected-parameters", "remove-cell"]]
        box = staged.cells[3].source
        assert box.startswith("```{admonition} Parameters of this run")
        assert "| `seed` | <code>1</code> |" in box
        assert "&lt;b&gt;m&#124;x&lt;/b&gt;" in box and "<b>" not in box  # escaped, and no table cell split
        assert "results_dir" not in box and str(run_dir) not in box
        assert staged.cells[4].source == "print(seed)"
        assert staged.cells[4].outputs[0].text == f"wrote ./results/{notebook.name}/table.csv from $CRS_CACHE_DIR/emb.npy\n"
        footer = staged.cells[-1].source
        assert footer.startswith("---\n**Provenance.** Commit <code>not recorded (not a git checkout)</code>, run "
                                 "<code>r1</code> (preset <code>quick</code>), executed 2026-01-01T00:00:00+00:00")
        assert staged.cells[-2].source == (f"**Downloads.** This chapter's result tables and reports, as this run "
                                           f"wrote them: {{download}}`audit.json <results/{notebook.name}/audit.json>`, "
                                           f"{{download}}`table.csv <results/{notebook.name}/table.csv>`.")
    assert (target / "run.json").read_bytes() == (run_dir / "run.json").read_bytes()
    assert (target / "reproducibility.md").read_text() == render_reproducibility(record)
    claims_page = (target / "claims.md").read_text()
    assert claims_page.startswith("# Claims at a glance") and "run `r1`" in claims_page
    assert all(f"| {cid} |" in claims_page for cid in CLAIM_IDS)
    assert f"{len(CLAIM_IDS)} not evaluated" in claims_page  # the run wrote no chapter's tables
    start = (target / "start_here.md").read_text()
    assert start.startswith("**This build** ran the `quick` preset (run `r1`) on no data. Of the")
    assert f"it found: {len(CLAIM_IDS)} not evaluated" in start and "{doc}`Claims at a glance <generated/claims>`" in start


def test_start_here_names_the_data_and_models_without_a_machines_folders() -> None:
    from crslib.claims import build_ledger
    from crslib.records import NotebookRecord, RunRecord
    from crslib.staging import render_start_here

    notebooks = [NotebookRecord("01_data_and_embeddings", {"data": "/home/ana/study/xrays`x"}, 1.0, ""),
                 NotebookRecord("02_agreement", {"data": "/home/ana/study/xrays`x",
                                                 "models": "onnx:/srv/models/enc.onnx#feat,timm:resnet18"}, 1.0, ""),
                 NotebookRecord("04_protocol_sensitivity", {"data": "phantom?patients=9&shift=0.5"}, 1.0, "")]
    record = RunRecord("r2", ".", "my.yaml", {}, "2026-01-01T00:00:00+00:00", notebooks=notebooks)
    page = render_start_here(record, build_ledger(Path(__file__).parent))
    assert "your images (folder `xrays'x`) and the phantom, `phantom?patients=9&shift=0.5`" in page
    assert "the models `onnx:enc.onnx#feat,timm:resnet18`" in page
    assert "/home/ana" not in page and "/srv" not in page


def test_git_commit_gives_the_full_hash_and_marks_a_dirty_tree(tmp_path) -> None:
    import subprocess

    from crslib.staging import git_commit

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert git_commit(tmp_path) == head and len(head) == 40
    (tmp_path / "untracked.txt").write_text("not part of the code")
    assert git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("2")
    assert git_commit(tmp_path) == head + "+dirty"
    assert git_commit(tmp_path / "nowhere") is None


def test_the_footer_and_the_reproducibility_page_give_full_hashes_and_a_rebuild_command() -> None:
    from crslib.records import NotebookRecord, RunRecord
    from crslib.staging import provenance_footer, render_reproducibility

    data_hash, key, weights = "d" * 64, "k" * 64, "w" * 64
    provenance = {"commit": "c" * 40 + "+dirty",
                  "data": {"phantom?x=1": {"images": 4, "patients": 2, "content_sha256": data_hash},
                           "other": {"images": 1, "patients": 1, "content_sha256": "o" * 64}},
                  "zoo": [{"name": "cnn", "key": key, "training_data_hash": "t" * 64}],
                  "public_weights": {"lite0": weights}}
    notebook = NotebookRecord("02_agreement", {"data": "phantom?x=1", "k": 10}, 1.0, "o.ipynb",
                              reused_from="20251231T000000Z-default")
    record = RunRecord("20260101T000000Z-default", "/machine/runs/x", "default", {}, "2026-01-01T00:00:00+00:00",
                       notebooks=[notebook], provenance=provenance)
    footer = provenance_footer(record, notebook)
    assert "Commit <code>" + "c" * 40 + "+dirty</code>" in footer
    assert "reused from run <code>20251231T000000Z-default</code>" in footer and "executed 2026" not in footer
    assert f"| data <code>phantom?x=1</code> | <code>{data_hash}</code> |" in footer
    assert "o" * 64 not in footer  # another chapter's data
    assert f"<code>{key}</code>" in footer and f"<code>{weights}</code>" in footer
    page = render_reproducibility(record)
    assert "```bash\nmake book PRESET=default\n```" in page and "/machine" not in page
    assert "c" * 40 + "+dirty" in page and "not committed" in page
    assert all(h in page for h in (data_hash, key, "t" * 64, weights)) and "…" not in page
    record.overrides = [["02_agreement.k", "it's"]]
    record.preset = "default+own"
    assert ".venv/bin/crs book --preset default --data YOUR_DATA --models YOUR_MODELS -p 02_agreement.k " \
           "'it'\"'\"'s'" in render_reproducibility(record)

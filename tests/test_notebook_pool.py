"""A book run executes the chapters that do not read each other side by side, and chapter 07 after them."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from crslib.errors import ConfigError, NotebookError
from crslib.notebook_pool import book_workers, kernel_environment, run_stage, stages
from crslib.runner import run_notebooks

# Each of the two waits until the other has started: they pass only when they run at the same time.
MEET = '''# %% tags=["parameters"]
me = "a"
other = "b"
results_dir = "results/x"

# %%
import json, os, pathlib, time
pathlib.Path(results_dir).mkdir(parents=True, exist_ok=True)
flags = pathlib.Path(results_dir).parent.parent
(flags / f"{me}.started").write_text("")
deadline = time.monotonic() + 60
while not (flags / f"{other}.started").exists():
    if time.monotonic() > deadline:
        raise RuntimeError(f"{other} never started while {me} ran")
    time.sleep(0.05)
pathlib.Path(results_dir, "env.json").write_text(json.dumps({"threads": os.environ.get("OMP_NUM_THREADS")}))
'''

SUMMARY = '''# %% tags=["parameters"]
run_dir = "."
results_dir = "results/z"

# %%
import json, pathlib
found = sorted(p.parent.name for p in pathlib.Path(run_dir, "results").glob("*/env.json"))
pathlib.Path(results_dir).mkdir(parents=True, exist_ok=True)
pathlib.Path(results_dir, "found.json").write_text(json.dumps(found))
'''


def test_stages_put_a_notebook_that_reads_the_run_after_the_others() -> None:
    assert stages([{}, {}, {}]) == [[0, 1, 2]]
    assert stages([{"run_dir": "."}, {}, {}]) == [[0], [1, 2]]
    assert stages([{}, {"run_dir": "."}, {"run_dir": "."}, {}]) == [[0], [1], [2], [3]]
    assert stages([]) == []


def test_book_workers_reads_the_environment_and_refuses_nonsense(monkeypatch) -> None:
    monkeypatch.delenv("CRS_BOOK_WORKERS", raising=False)
    assert book_workers(2) == 2 and book_workers(1) == 1 and book_workers(64) == 4
    monkeypatch.setenv("CRS_BOOK_WORKERS", "3")
    assert book_workers(2) == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("CRS_BOOK_WORKERS", bad)
        with pytest.raises(ConfigError, match="CRS_BOOK_WORKERS"):
            book_workers(2)


def test_run_stage_runs_side_by_side_and_returns_in_order() -> None:
    barrier = threading.Barrier(2, timeout=20)  # broken unless both calls wait at once

    def meet(position: int) -> int:
        barrier.wait()
        return position * 10

    assert run_stage([0, 1], meet, workers=2) == {0: 0, 1: 10}
    order = []
    assert run_stage([2, 0, 1], lambda p: order.append(p) or p, workers=1) == {2: 2, 0: 0, 1: 1}
    assert order == [2, 0, 1]


def test_run_stage_raises_the_first_failure_and_starts_nothing_after_it() -> None:
    started = []
    second = threading.Event()

    def job(position: int) -> int:
        started.append(position)
        if position == 0:
            assert second.wait(20)  # fail only once 1 runs: it finishes, 2 and 3 never start
            raise NotebookError("notebook 0 failed")
        second.set()
        time.sleep(0.5)
        return position

    with pytest.raises(NotebookError, match="notebook 0 failed"):
        run_stage([0, 1, 2, 3], job, workers=2)
    assert sorted(started) == [0, 1]


def test_kernel_environment_sets_threads_per_kernel_and_restores(monkeypatch) -> None:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MPLBACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")  # the user's own setting is kept
    with kernel_environment(2, cpus=4):
        assert os.environ["OMP_NUM_THREADS"] == "2" and os.environ["MKL_NUM_THREADS"] == "7"
        assert os.environ["MPLBACKEND"] == "module://matplotlib_inline.backend_inline"
    assert "OMP_NUM_THREADS" not in os.environ and "MPLBACKEND" not in os.environ
    with kernel_environment(1, cpus=4):
        assert "OMP_NUM_THREADS" not in os.environ  # one notebook at a time: every thread for it


def test_independent_notebooks_run_together_and_the_run_reader_after_them(tmp_path, monkeypatch) -> None:
    """01 and 02 each wait for the other to start (one after the other, 01 would wait in vain)."""
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CRS_BOOK_WORKERS", "2")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "01_a.py").write_text(MEET)
    (notebooks / "02_b.py").write_text(MEET.replace('me = "a"\nother = "b"', 'me = "b"\nother = "a"'))
    (notebooks / "03_summary.py").write_text(SUMMARY)
    (tmp_path / "config.yaml").write_text("name: t\nparameters: {}\n")
    events = []
    run = lambda: run_notebooks(str(tmp_path / "config.yaml"), run_root=tmp_path / "runs",  # noqa: E731
                                notebook_dir=notebooks, progress=events.append, reuse=False)
    record = run()
    assert [n.name for n in record.notebooks] == ["01_a", "02_b", "03_summary"]
    run_dir = Path(record.run_dir)
    assert json.loads((run_dir / "results" / "03_summary" / "found.json").read_text()) == ["01_a", "02_b"]
    names = [(e.event, e.name) for e in events]
    assert names.index(("start", "03_summary")) > max(names.index(("done", "01_a")), names.index(("done", "02_b")))
    assert sorted(e.completed for e in events if e.event == "done") == [1, 2, 3]
    threads = json.loads((run_dir / "results" / "01_a" / "env.json").read_text())["threads"]
    assert threads == str(max(1, (os.cpu_count() or 1) // 2))
    assert json.loads((run_dir / "run.json").read_text())["notebooks"][2]["name"] == "03_summary"

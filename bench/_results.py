"""Write a benchmark's rows into ``bench/results.json``, which the book renders.

Every ``bench_*.py`` script prints its table and then calls :func:`record`.
Each benchmark keeps one entry (the latest run replaces it), with the machine,
the command and the time it was measured, so the Performance page of the book
always says where its numbers come from. ``CRS_BENCH_RESULTS`` points the
scripts at another file (the tests use it).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from crslib.models.zoo_shipped import cpu_model

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATH = REPO_ROOT / "bench" / "results.json"


def results_path() -> Path:
    return Path(os.environ.get("CRS_BENCH_RESULTS") or DEFAULT_PATH)


def _commit() -> str:
    """HEAD's short hash, with ``+changes`` when tracked files other than the results differ from it
    (the numbers then come from code that no commit holds)."""
    git = ["git", "-C", str(REPO_ROOT)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", ".",
                                  ":(exclude)bench/results.json"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = head.stdout.strip() or "unknown"
    return commit + "+changes" if commit != "unknown" and changed.stdout.strip() else commit


def _command() -> str:
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(REPO_ROOT)
    except ValueError:
        pass
    return " ".join(["python", script.as_posix(), *sys.argv[1:]])


def _gpu() -> str:
    """The CUDA GPU a benchmark could use, or "" (torch is only asked if the script imported it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return ""
    return torch.cuda.get_device_name(0)


def machine() -> dict:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    info = {
        "cpu_model": cpu_model(),  # crslib's, as the zoo's cards record it
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "python": platform.python_version(),
        "load_average_1min": round(load, 2),
    }
    gpu = _gpu()
    if gpu:
        info["gpu"] = gpu
    return info


def row(measure: str, value: str, target: str = "", passed: bool | None = None, note: str = "") -> dict:
    """One line of a benchmark table; ``passed`` is None for a measure with no target."""
    return {"measure": measure, "value": value, "target": target, "passed": passed, "note": note}


def record(bench: str, rows: list[dict], *, title: str, seconds: float) -> Path:
    """Replace ``bench``'s entry in the results file with these rows."""
    path = results_path()
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    entries = data.setdefault("benchmarks", {})
    entries[bench] = {
        "title": title,
        "recorded_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": _command(),
        "commit": _commit(),
        "seconds": round(seconds, 1),
        "machine": machine(),
        "rows": rows,
    }
    data["benchmarks"] = dict(sorted(entries.items()))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    print(f"results recorded in {path} ({bench})")
    return path

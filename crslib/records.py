"""The records of a ``crs book`` run (written to its ``run.json``) and of each notebook it executed.

They live apart from :mod:`crslib.runner`, which writes them, so that :mod:`crslib.staging`, which
reads them, imports neither the runner nor its dependencies. :func:`run_results_folder` finds a
run's results, and refuses a folder that holds none, for every command that reads a run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from crslib.errors import InputError


@dataclass
class NotebookRecord:
    """What one notebook execution used and took."""

    name: str
    parameters: dict[str, Any]
    seconds: float
    output: str
    reused_from: str | None = None  # the run whose identical execution this one reuses
    skips: list[dict[str, Any]] = field(default_factory=list)  # analyses the data could not support, files left out


@dataclass
class RunRecord:
    """One ``crs book`` run: where it lives and what it executed."""

    run_id: str
    run_dir: str
    preset: str
    config: dict[str, Any]
    started_utc: str
    notebooks: list[NotebookRecord] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    html_index: str | None = None
    build_seconds: float | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    overrides: list[list[str]] = field(default_factory=list)  # the ``-p NAME VALUE`` pairs, as typed
    book_from_run: str | None = None  # the HTML was left as the run named here built it (nothing changed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Files that make a folder the output of a crslib command: ``crs book``'s record, ``crs audit``'s,
#: ``crs compare``'s and ``crs checklist``'s reports, a chapter's checklist evidence.
RUN_FILES = ("run.json", "evidence.json", "audit.json", "compare.json", "checklist.json")


def run_results_folder(run_dir: str | os.PathLike) -> Path:
    """A run folder's ``results/``, or the folder itself when it holds results directly.

    A folder holds a run when it has ``results/``, or anywhere below it a
    result table (``*.csv``, e.g. ``crs risk``'s) or one of :data:`RUN_FILES`.

    Raises
    ------
    InputError
        The folder does not exist, or holds no run (the message says what was expected).

    Examples
    --------
    >>> import tempfile
    >>> run_results_folder(tempfile.mkdtemp())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    crslib.errors.InputError: '...' is not a run folder: ...
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise InputError(f"run folder {str(run_dir)!r} does not exist or is not a folder; give a run folder "
                         "such as runs/<id>/ from crs book")
    if (root / "results").is_dir():
        return root / "results"
    found = (p for p in root.rglob("*") if p.suffix == ".csv" or p.name in RUN_FILES)
    if next(found, None) is None:
        raise InputError(f"{str(run_dir)!r} is not a run folder: it has no results/ folder, no result tables "
                         "(*.csv) and no run.json or crs audit/compare output; give a run folder such as "
                         "runs/<id>/ from crs book")
    return root

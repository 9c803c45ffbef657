"""The records of a ``crs book`` run (written to its ``run.json``) and of each notebook it executed.

They live apart from :mod:`crslib.runner`, which writes them, so that :mod:`crslib.staging`, which
reads them, imports neither the runner nor its dependencies.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class NotebookRecord:
    """What one notebook execution used and took."""

    name: str
    parameters: dict[str, Any]
    seconds: float
    output: str
    reused_from: str | None = None  # the run whose identical execution this one reuses
    skips: list[dict[str, str]] = field(default_factory=list)  # analyses the data could not support


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

"""Concurrent notebooks: a book run executes the chapters that do not read each other side by side.

Chapters 01-06 each read only their own data, models and results (a
chapter's *What this run shows* box judges only its own claims), so a run
executes them in a pool of worker threads, one papermill kernel each. A
notebook with a ``run_dir`` parameter (chapter 07, which reads the whole
run) waits for every notebook before it and runs alone (:func:`stages`).
Each kernel computes on ``cpus // workers`` threads, so two kernels on two
cores do not fight over them.

``CRS_BOOK_WORKERS`` sets the number of concurrent notebooks (1: one after
the other, as before); the default is the number of CPUs, at most
:data:`MAX_WORKERS`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

from crslib.errors import ConfigError

__all__ = ["MAX_WORKERS", "book_workers", "kernel_environment", "run_stage", "stages"]

#: The most notebooks a run executes at once by default (memory: each kernel holds its models and data).
MAX_WORKERS = 4
#: Thread-count variables a kernel's numerical libraries read when they start.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

T = TypeVar("T")


def book_workers(cpus: int | None = None) -> int:
    """How many notebooks a run executes at once: ``CRS_BOOK_WORKERS``, else the CPUs (at most 4).

    Examples
    --------
    >>> book_workers(2) if "CRS_BOOK_WORKERS" not in os.environ else 2
    2
    """
    text = os.environ.get("CRS_BOOK_WORKERS", "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(f"CRS_BOOK_WORKERS must be a whole number >= 1, got {text!r}")
        return int(text)
    return max(1, min(MAX_WORKERS, cpus or os.cpu_count() or 1))


def stages(parameters: Sequence[dict[str, Any]]) -> list[list[int]]:
    """Positions of the notebooks that may run together, stage by stage.

    A notebook with a ``run_dir`` parameter reads what the notebooks before
    it wrote: it starts a new stage of its own, after them.

    Examples
    --------
    >>> stages([{"data": "a"}, {"data": "b"}, {"run_dir": "."}, {"data": "c"}])
    [[0, 1], [2], [3]]
    """
    out: list[list[int]] = []
    current: list[int] = []
    for position, params in enumerate(parameters):
        if "run_dir" in params:
            out.extend(stage for stage in (current, [position]) if stage)
            current = []
        else:
            current.append(position)
    if current:
        out.append(current)
    return out


@contextmanager
def kernel_environment(workers: int, cpus: int | None = None) -> Iterator[None]:
    """The environment the kernels start in: inline figures, and ``cpus // workers`` threads each.

    Thread variables the user set are kept. The process's environment is
    restored afterwards.
    """
    threads = str(max(1, (cpus or os.cpu_count() or 1) // max(1, workers)))
    wanted = {"MPLBACKEND": "module://matplotlib_inline.backend_inline"}  # Agg there would swallow every figure
    if workers > 1:
        wanted.update({name: threads for name in THREAD_VARIABLES if name not in os.environ})
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_stage(positions: Sequence[int], run_one: Callable[[int], T], workers: int) -> dict[int, T]:
    """Run ``run_one(position)`` for each position, ``workers`` at a time, in the given order.

    When one fails, the notebooks not yet started are not started, the
    running ones finish, and the error of the first failed notebook (in
    ``positions`` order) is raised.
    """
    if workers <= 1 or len(positions) <= 1:
        return {position: run_one(position) for position in positions}
    failed = threading.Event()

    def guarded(position: int) -> T:
        if failed.is_set():
            raise _NotStarted()
        try:
            return run_one(position)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=min(workers, len(positions)), thread_name_prefix="crs-notebook") as pool:
        futures = {position: pool.submit(guarded, position) for position in positions}
        wait(futures.values())
    errors = [f.exception() for f in futures.values() if f.exception() is not None]
    first = next((e for e in errors if not isinstance(e, _NotStarted)), None)
    if first is not None:
        raise first
    return {position: future.result() for position, future in futures.items()}


class _NotStarted(Exception):
    """A notebook not started because another one of its stage failed first."""

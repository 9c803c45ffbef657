"""Shard tasks on ``dask.distributed``: in-process by default, any scheduler on request.

Embedding extraction (:func:`crslib.embed.extract_embeddings`), the zoo
(:func:`crslib.models.train_zoo`) and the per-model neighbour searches of
:mod:`crslib.agreement` are cut into independent shard tasks. Where they run
is one argument, ``scheduler``:

``None`` (default)
    In this process, one task after the other, without Dask.
``"local"`` or ``"local:N"``
    A :class:`distributed.LocalCluster` of N worker processes (default 2),
    one thread each, started for the call and closed after it.
``"tcp://HOST:PORT"`` (any address a Dask client accepts)
    An existing scheduler, e.g. one started by dask-jobqueue on a SLURM
    cluster (the recipe: :ref:`own-data-slurm` in the book, or
    ``README.md`` in the repository root). Workers must see the same
    files: the images, the model weights and the cache folder
    (``CRS_CACHE_DIR``) on a shared file system.
a :class:`distributed.Client`
    Used as it is and left open (notebooks, tests).

Shards write to the same content-addressed cache whichever way they run, so
a run that mixes local and cluster work, or was interrupted, reuses every
finished shard. A worker that dies mid-task is replaced by its nanny and the
task rerun elsewhere (Dask retries a task up to
``distributed.scheduler.allowed-failures`` times); a run that fails anyway
resumes from the finished shards when started again.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from crslib.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["open_client", "run_tasks", "worker_count"]

#: Seconds to wait for a scheduler before giving up with a ConfigError.
CONNECT_TIMEOUT_S = 20


def _local_workers(scheduler: str) -> int:
    _, _, count = scheduler.partition(":")
    if not count:
        return 2
    try:
        n = int(count)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"scheduler {scheduler!r}: 'local:N' needs a positive number of workers")
    return n


@contextlib.contextmanager
def open_client(scheduler: Any = None) -> Iterator[Any]:
    """Yield a Dask client for ``scheduler`` (None: yield None, run in-process).

    Parameters
    ----------
    scheduler : None, "local", "local:N", an address, or a distributed.Client
        See the module docstring.

    Raises
    ------
    ConfigError
        A malformed ``local:N``, or no scheduler answering at the address
        within :data:`CONNECT_TIMEOUT_S` seconds.
    """
    if scheduler is None or scheduler == "":
        yield None
        return
    from distributed import Client

    if isinstance(scheduler, Client):
        yield scheduler
        return
    if not isinstance(scheduler, str):
        raise ConfigError(f"scheduler must be None, 'local[:N]', an address or a dask Client, got {scheduler!r}")
    if scheduler == "local" or scheduler.startswith("local:"):
        from distributed import LocalCluster

        n = _local_workers(scheduler)
        # One thread per worker: the tasks use torch and faiss, which bring
        # their own threads; processes keep the GIL and the threads apart.
        # Without a dashboard the scheduler still serves its health routes, on
        # port 8787 unless told otherwise: any port the system gives keeps a second
        # cluster (another run, a notebook's, RStudio's) from warning that 8787 is taken.
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                          scheduler_kwargs={"dashboard": False, "dashboard_address": ":0"},
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            yield client
        return
    try:
        client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise ConfigError(f"no Dask scheduler answered at {scheduler!r} within {CONNECT_TIMEOUT_S} s: {exc}") from exc
    try:
        yield client
    finally:
        client.close()


def run_tasks(
    client: Any,
    function: Callable[..., Any],
    tasks: Sequence[tuple],
    *,
    shared: dict[str, Any] | None = None,
    keys: Sequence[str] | None = None,
    on_result: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """Run ``function(*task, **shared)`` for every task; results in task order.

    Parameters
    ----------
    client : distributed.Client or None
        None runs the tasks here, one after the other.
    function : callable
        Importable (module-level) so workers can load it.
    tasks : sequence of tuples
        Positional arguments of each task.
    shared : dict, optional
        Keyword arguments every task gets; sent to the cluster once, as a
        task that returns them (rebuilt if its worker dies), not once per
        task.
    keys : sequence of str, optional
        Dask keys, one per task (e.g. content hashes), so a task the cluster
        already holds is not computed twice.
    on_result : callable, optional
        ``on_result(i, result)`` as each task finishes (in completion order
        on a cluster), e.g. to write a shard to the local cache at once.
    """
    shared = dict(shared or {})
    results: list[Any] = [None] * len(tasks)
    if client is None:
        for i, task in enumerate(tasks):
            results[i] = function(*task, **shared)
            if on_result is not None:
                on_result(i, results[i])
        return results
    from distributed import as_completed

    # Scattered data cannot be rebuilt: dask's memory manager drops broadcast
    # replicas, and when the last worker holding one dies every task that
    # needs it is cancelled. A task that returns the value is rerun instead.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
        held = {name: client.submit(_shared_value, value, pure=False) for name, value in shared.items()}
    futures = []
    for i, task in enumerate(tasks):
        extra = {"key": keys[i]} if keys is not None else {}
        futures.append(client.submit(function, *task, **held, pure=False, **extra))
    # two tasks with the same content key share one future
    positions: dict[str, list[int]] = {}
    for i, future in enumerate(futures):
        positions.setdefault(future.key, []).append(i)
    unique = list({f.key: f for f in futures}.values())
    try:
        for future in as_completed(unique):
            value = future.result()  # re-raises the task's own exception
            for i in positions[future.key]:
                results[i] = value
                if on_result is not None:
                    on_result(i, value)
    finally:
        for future in [*futures, *held.values()]:
            future.release()
    return results


def _shared_value(value: Any) -> Any:
    return value


def worker_count(client: Any) -> int:
    """Workers currently connected (1 for in-process)."""
    if client is None:
        return 1
    return max(1, len(client.scheduler_info().get("workers", {})))


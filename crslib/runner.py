"""Run the book's notebooks through papermill and build the HTML.

A run executes every ``notebooks/*.py`` (jupytext py:percent, one cell tagged
``parameters``) with a preset's parameters into its own run folder
``runs/<UTC time>-<preset>/``, which is never overwritten, records each
notebook's parameters and wall time in ``run.json``, copies the executed
notebooks into ``book/generated/`` and builds the book with jupyter-book
(execution off: the notebooks already ran).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from crslib._io import atomic_write_json, atomic_write_text, digest_of, file_sha256
from crslib.config import cache_dir, load_preset
from crslib.errors import ConfigError, NotebookError
from crslib.notebook_pool import book_workers, kernel_environment, run_stage, stages
from crslib.overrides import apply_overrides
from crslib.preflight import check_config_inputs
from crslib.records import NotebookRecord, RunRecord
from crslib.staging import GENERATED, REPO_ROOT, collect_provenance, stage_run

log = logging.getLogger(__name__)

VERSIONED_PACKAGES = (
    "crslib", "numpy", "pandas", "scikit-learn", "torch", "torchvision", "timm",
    "faiss-cpu", "onnxruntime", "papermill", "jupytext", "jupyter-book",
)


def notebook_parameters(path: str | os.PathLike) -> dict[str, Any]:
    """Names and default values assigned in a notebook's ``parameters`` cell.

    Parameters
    ----------
    path : path
        A jupytext py:percent notebook.

    Returns
    -------
    dict
        Parameter name -> default value (literals only, by design: the
        parameters cell holds scalars).

    Raises
    ------
    ConfigError
        If the notebook has no cell tagged ``parameters``, or more than one.
    """
    import jupytext

    notebook = jupytext.read(path)
    cells = [c for c in notebook.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ConfigError(
            f"notebook {path} must have exactly one cell tagged 'parameters' "
            f"(found {len(cells)}); mark it with '# %% tags=[\"parameters\"]'"
        )
    values: dict[str, Any] = {}
    for node in ast.parse(cells[0].source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                raise ConfigError(
                    f"parameter {node.targets[0].id} in {path} must be a literal scalar"
                ) from None
    return values


def list_notebooks(notebook_dir: str | os.PathLike | None = None) -> list[Path]:
    """The book's notebook sources in execution order (sorted by file name)."""
    folder = Path(notebook_dir) if notebook_dir else REPO_ROOT / "notebooks"
    paths = sorted(p for p in folder.glob("[0-9]*.py"))
    if not paths:
        raise ConfigError(f"no notebooks (NN_name.py) found in {folder}")
    return paths


def resolve_parameters(config: dict[str, Any], notebook: Path) -> dict[str, Any]:
    """The parameters a preset gives one notebook.

    Shared ``parameters`` apply to every notebook that declares them; the
    preset's ``notebooks.<name>`` section overrides them for that notebook
    and may only name parameters the notebook declares.
    """
    declared = notebook_parameters(notebook)
    shared = config.get("parameters") or {}
    own = (config.get("notebooks") or {}).get(notebook.stem) or {}
    unknown = sorted(set(own) - set(declared))
    if unknown:
        raise ConfigError(
            f"preset {config.get('name')!r} sets {', '.join(unknown)} for notebook "
            f"{notebook.stem}, which declares only {', '.join(sorted(declared))}"
        )
    chosen = {k: v for k, v in shared.items() if k in declared}
    chosen.update(own)
    return chosen


#: How ``crs book --models A,B,C`` sets each notebook parameter that names models.
MODEL_PARAMETERS: dict[str, str] = {
    "model": "the first model",
    "models": "all models",
    "old_model": "the first model",
    "new_models": "the other models",
    "backbones": "all models",
    "encoders": "all models",
}


def with_overrides(config: dict[str, Any], *, data: str | None = None, models: str | None = None) -> dict[str, Any]:
    """A preset with every chapter's ``data`` and model parameters set, as ``crs book --data --models`` does.

    ``data`` replaces the data of every notebook (also where the preset gives
    a notebook its own); ``models`` (comma-separated specs) sets each model
    parameter as :data:`MODEL_PARAMETERS` says. The zoo's own ``zoo_data``
    is left as it is: the zoo never trains on the user's data.

    Examples
    --------
    >>> c = with_overrides({"name": "quick", "parameters": {"data": "phantom"},
    ...                     "notebooks": {"04_protocol_sensitivity": {"data": "phantom?kermany=1", "seeds": "0"}}},
    ...                    data="/my/images", models="public:efficientnet_lite0, onnx:/m.onnx")
    >>> c["parameters"]["data"], c["notebooks"]["04_protocol_sensitivity"], c["parameters"]["old_model"]
    ('/my/images', {'seeds': '0'}, 'public:efficientnet_lite0')
    >>> c["parameters"]["new_models"], c["name"]
    ('onnx:/m.onnx', 'quick+own')
    """
    from crslib.models.lineup import parse_model_list

    out = json.loads(json.dumps(config))  # a deep copy of plain YAML data
    shared: dict[str, Any] = {}
    if data is not None:
        shared["data"] = str(data)
    if models is not None:
        specs = parse_model_list(models)
        picks = {"the first model": specs[0], "all models": ",".join(specs), "the other models": ",".join(specs[1:])}
        shared.update({name: picks[rule] for name, rule in MODEL_PARAMETERS.items()})
    if not shared:
        return out
    out["parameters"] = {**(out.get("parameters") or {}), **shared}
    for section in (out.get("notebooks") or {}).values():
        for key in shared:
            (section or {}).pop(key, None)
    out["name"] = f"{out.get('name', 'config')}+own"
    return out


@dataclass(frozen=True)
class Progress:
    """One step of a book run, as :func:`run_notebooks` and :func:`build_book` report it to ``progress``."""

    event: str  # 'start', 'done' or 'failed' (a notebook); 'build', 'built' or 'unchanged' (the HTML)
    index: int  # the notebook's 1-based position in the run (the number of notebooks for the HTML)
    total: int
    name: str
    elapsed: float  # seconds since the run began
    seconds: float | None = None  # the step's own time, once it has ended
    reused_from: str | None = None  # on 'done': the run whose identical execution was reused
    completed: int | None = None  # on 'done': how many notebooks of the run have ended (they run side by side)


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that shape a run's numbers."""
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _new_run_dir(run_root: Path, preset: str) -> tuple[str, Path]:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for attempt in range(1000):
        run_id = f"{stamp}-{preset}" + (f"-{attempt}" if attempt else "")
        run_dir = run_root / run_id
        try:
            run_dir.mkdir(parents=True)
            return run_id, run_dir
        except FileExistsError:
            continue
    raise ConfigError(f"cannot create a new run folder under {run_root}")


class _PapermillNoise(logging.Filter):
    """Drop papermill's warnings about parameter lines holding more than one
    '=' (spec strings such as ``phantom?patients=150&size=64`` do): the runner
    reads the parameters cell itself and passes only declared names."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Unable to parse line") or message.startswith("Passed unknown parameter"))


for _name in ("papermill", "papermill.translators", "papermill.parameterize"):
    logging.getLogger(_name).addFilter(_PapermillNoise())


class _KernelTransportNoise(logging.Filter):
    """Drop two ipykernel messages that say nothing to a reader of ``crs book``'s output.

    "Kernel is running over TCP without encryption", printed once per
    notebook: the kernel is the runner's own child, bound to the loopback
    interface. "KeyboardInterrupt caught in kernel": on a busy machine a
    kernel slow to stop after its notebook has ended is stopped with a
    signal, which it logs. The kernel process applies the filter to its log
    handler (:data:`_KERNEL_CONFIG`); every other kernel message still shows.
    """

    NOISE = ("Kernel is running over TCP without encryption", "KeyboardInterrupt caught in kernel")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOISE)


_KERNEL_CONFIG = {"IPKernelApp": {"logging_config": {
    "filters": {"crs_kernel_transport": {"()": f"{__name__}._KernelTransportNoise"}},
    "handlers": {"console": {"filters": ["crs_kernel_transport"]}},
}}}


def execute_notebook(source: Path, output: Path, parameters: dict[str, Any], *, cwd: Path) -> float:
    """Execute one jupytext notebook with papermill; return its wall time.

    Raises
    ------
    NotebookError
        Naming the notebook, the failing cell and the error.
    """
    import jupytext
    import papermill
    from papermill.exceptions import PapermillExecutionError

    notebook = jupytext.read(source)
    notebook.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    output.parent.mkdir(parents=True, exist_ok=True)
    # Kernels inherit the environment; an MPLBACKEND=Agg there would swallow every figure.
    previous_backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="crs-kernel-") as folder:
            kernel_config = Path(folder) / "kernel_config.json"
            kernel_config.write_text(json.dumps(_KERNEL_CONFIG), encoding="utf-8")
            papermill.execute_notebook(
                notebook,
                str(output),
                parameters=parameters,
                kernel_name="python3",
                progress_bar=False,
                cwd=str(cwd),
                extra_arguments=[f"--IPKernelApp.extra_config_file={kernel_config}"],
            )
    except PapermillExecutionError as exc:
        first_line = (exc.source or "").strip().splitlines()[:1]
        raise NotebookError(
            f"notebook {source.stem} failed in cell {exc.exec_count} "
            f"({first_line[0] if first_line else 'empty cell'!r}): {exc.ename}: {exc.evalue}. "
            f"The partly executed notebook is {output}"
        ) from None
    finally:
        if previous_backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = previous_backend
    return time.perf_counter() - start


#: Bump when what an executed notebook depends on changes in a way the key misses.
EXECUTION_CACHE_VERSION = 1


def _names_external_input(value: Any) -> bool:
    """True when a parameter names something outside the embedded default:
    a file or folder of the user's, local weights, an ONNX file or the HF
    cache, whose content the execution key does not cover."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    if text.startswith("phantom"):
        return False
    if any(token in text for token in ("weights=", "pretrained=hf", "onnx:")):
        return True
    return bool(text) and os.path.exists(os.path.expanduser(text))


def _has_external_input(parameters: dict[str, Any]) -> bool:
    """Whether a notebook's parameters name the user's own files. Its own ``results_dir`` does not, nor
    does ``run_dir="."`` (chapter 07's: the run folder itself, whose results the upstream keys cover)."""
    return any(_names_external_input(v) for k, v in parameters.items()
               if k != "results_dir" and not (k == "run_dir" and v == "."))


def _code_digest() -> str:
    package = Path(__file__).resolve().parent
    # every module of every subpackage, named by its path inside the package
    # and the shipped zoo's cards (each holds its weights' SHA-256) and fine-tuning results' cards
    files = sorted(package.rglob("*.py")) + sorted(package.glob("models/zoo_weights/*/card.json")) \
        + sorted(package.glob("models/finetune_results/*.json"))
    return digest_of([[p.relative_to(package).as_posix(), file_sha256(p)] for p in files])


def execution_key(source: Path, parameters: dict[str, Any], upstream: str, versions: dict[str, str]) -> str | None:
    """Content key of one notebook execution, or None when it may not be reused.

    The key covers the notebook's source, its parameters (the run-specific
    ``results_dir`` aside), the crslib code, the package versions and the keys
    of the notebooks executed before it in the run (a later notebook may read
    an earlier one's results). Everything else a notebook on the embedded
    default reads (the phantom, the zoo, the shipped weights) follows from
    these. A notebook whose parameters name the user's own files gets no key:
    it always executes.
    """
    if _has_external_input(parameters):
        return None
    return digest_of([
        EXECUTION_CACHE_VERSION, source.read_text(encoding="utf-8"),
        {k: v for k, v in sorted(parameters.items()) if k != "results_dir"}, _code_digest(), versions, upstream,
    ])


def _reuse_execution(key: str, output: Path, results: Path, run_dir: Path) -> dict[str, Any] | None:
    """Copy a cached execution into this run; return its record or None."""
    entry = cache_dir() / "executions" / key
    try:
        meta = json.loads((entry / "execution.json").read_text(encoding="utf-8"))
        text = (entry / "notebook.ipynb").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    # the injected parameters name the earlier run's folder; this copy belongs to this run
    atomic_write_text(output, text.replace(json.dumps(meta["run_dir"])[1:-1], json.dumps(str(run_dir))[1:-1]))
    if (entry / "results").is_dir():
        if results.exists():
            shutil.rmtree(results)
        shutil.copytree(entry / "results", results)
    return meta


def _store_execution(key: str, output: Path, results: Path, run_dir: Path, run_id: str, seconds: float) -> None:
    entry = cache_dir() / "executions" / key
    staging = entry.with_name(entry.name + ".tmp")
    try:
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        shutil.copy2(output, staging / "notebook.ipynb")
        if results.is_dir():
            shutil.copytree(results, staging / "results")
        atomic_write_json(staging / "execution.json", {"run_id": run_id, "run_dir": str(run_dir), "seconds": seconds})
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(staging, entry)  # complete or absent, never half-written
    except OSError as exc:
        log.warning("cannot cache the execution of %s (%s); continuing", output.name, exc)


def run_notebooks(
    preset: str | os.PathLike = "default",
    *,
    only: Sequence[str] | None = None,
    run_root: str | os.PathLike | None = None,
    notebook_dir: str | os.PathLike | None = None,
    reuse: bool = True,
    data: str | os.PathLike | None = None,
    models: str | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    progress: Callable[[Progress], None] | None = None,
) -> RunRecord:
    """Execute the book's notebooks with a preset into a new run folder.

    A notebook whose execution key (:func:`execution_key`) matches an earlier
    execution is not run again: its executed copy and result files are copied
    into the new run folder, and ``run.json`` names the run it comes from.
    Notebooks on the user's own files always execute.

    Parameters
    ----------
    preset : str or path
        ``quick``, ``default``, ``full`` or a YAML config file.
    only : sequence of str, optional
        Notebook stems (or their number prefixes, e.g. ``"01"``) to run.
    run_root : path, optional
        Parent folder of run folders; default ``runs/`` in the repository.
    notebook_dir : path, optional
        Where the notebook sources are; default ``notebooks/``.
    reuse : bool
        Reuse identical earlier executions (default True); False executes
        every notebook.
    data : str or path, optional
        The data every chapter studies instead of the preset's (see
        :func:`with_overrides`).
    models : str, optional
        Comma-separated model specs every chapter studies (see
        :data:`MODEL_PARAMETERS`).
    overrides : sequence of (str, str) pairs
        ``crs book -p NAME VALUE`` pairs applied on top of the preset (see
        :func:`crslib.overrides.apply_overrides`); recorded as typed in ``run.json``.
    progress : callable, optional
        Called with a :class:`Progress` as each notebook starts and ends.

    Returns
    -------
    RunRecord
        Also written to ``<run_dir>/run.json``; each notebook's ``skips``
        lists the analyses its data could not support (:class:`SkipLog`).
    """
    config = with_overrides(load_preset(preset), data=None if data is None else str(data), models=models)
    notebooks = list_notebooks(notebook_dir)
    if only:
        wanted = set(only)
        notebooks = [p for p in notebooks if p.stem in wanted or p.stem.split("_")[0] in wanted]
        if not notebooks:
            raise ConfigError(f"no notebook matches {', '.join(only)}")
    if overrides:
        config = apply_overrides(config, {p.stem: notebook_parameters(p) for p in notebooks}, overrides)
    # the user's data (and models: --models or a config file) load before the first notebook starts
    check_config_inputs(config, MODEL_PARAMETERS, models=models is not None or os.path.isfile(str(preset)))
    report = progress or (lambda step: None)
    began = time.perf_counter()
    root = Path(run_root) if run_root else REPO_ROOT / "runs"
    run_id, run_dir = _new_run_dir(root, str(config["name"]))
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(config, sort_keys=False))
    record = RunRecord(
        run_id=run_id,
        run_dir=str(run_dir),
        preset=str(config["name"]),
        config=config,
        started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        versions=package_versions(),
        overrides=[[str(name), str(value)] for name, value in overrides or ()],
    )
    plans = _plan_notebooks(notebooks, config, run_dir, record)
    workers = book_workers()
    done: dict[int, NotebookRecord] = {}
    lock = threading.Lock()

    def run_one(position: int) -> NotebookRecord:
        source, parameters, key = plans[position]
        step = {"index": position + 1, "total": len(plans), "name": source.stem}
        with lock:
            report(Progress("start", elapsed=time.perf_counter() - began, **step))
        start = time.perf_counter()
        try:
            notebook = _execute_or_reuse(source, parameters, key, run_dir, run_id, reuse)
        except NotebookError:
            now = time.perf_counter()
            with lock:
                report(Progress("failed", elapsed=now - began, seconds=now - start, **step))
            raise
        with lock:
            done[position] = notebook
            record.notebooks = [done[i] for i in sorted(done)]
            atomic_write_json(run_dir / "run.json", record.to_dict())
            report(Progress("done", elapsed=time.perf_counter() - began, seconds=notebook.seconds,
                            reused_from=notebook.reused_from, completed=len(done), **step))
        return notebook

    with kernel_environment(workers):
        for stage in stages([parameters for _, parameters, _ in plans]):
            run_stage(stage, run_one, workers)
    record.notebooks = [done[i] for i in sorted(done)]
    atomic_write_json(run_dir / "run.json", record.to_dict())
    return record


def _plan_notebooks(notebooks: Sequence[Path], config: dict[str, Any], run_dir: Path,
                    record: RunRecord) -> list[tuple[Path, dict[str, Any], str | None]]:
    """Each notebook with every parameter it runs with (its defaults included) and its execution key."""
    plans = []
    upstream = ""
    for source in notebooks:
        parameters = {**notebook_parameters(source), **resolve_parameters(config, source)}
        parameters["results_dir"] = str(run_dir / "results" / source.stem)
        key = execution_key(source, parameters, upstream, record.versions)
        upstream = key or digest_of([upstream, source.stem, record.run_id])  # no key: nothing after it reuses
        plans.append((source, parameters, key))
    return plans


def _execute_or_reuse(source: Path, parameters: dict[str, Any], key: str | None, run_dir: Path, run_id: str,
                      reuse: bool) -> NotebookRecord:
    """One notebook of a run: its identical execution copied from the cache, else executed (and cached)."""
    results = Path(parameters["results_dir"])
    output = run_dir / "notebooks" / f"{source.stem}.ipynb"
    reused = _reuse_execution(key, output, results, run_dir) if (key and reuse) else None
    if reused is not None:
        log.info("%s: reusing the identical execution of run %s", source.stem, reused["run_id"])
        notebook = NotebookRecord(source.stem, parameters, 0.0, str(output), reused_from=str(reused["run_id"]))
    else:
        log.info("executing %s with %s", source.name, parameters)
        seconds = execute_notebook(source, output, parameters, cwd=run_dir)
        notebook = NotebookRecord(source.stem, parameters, round(seconds, 2), str(output))
        if key:
            _store_execution(key, output, results, run_dir, run_id, round(seconds, 2))
        log.info("%s done in %.1f s", source.stem, seconds)
    notebook.skips = read_skips(results)
    return notebook


SKIPS_FILE = "skips.json"


class SkipLog:
    """A notebook's record of the analyses its data could not support.

    ``skips.check(analysis, reason)`` returns True when ``reason`` is None
    (the analysis runs). Otherwise it shows one sentence on the page (what
    was skipped, and why: the reason from :func:`crslib.needs.unmet_need`),
    records it in ``<results_dir>/skips.json`` (which :func:`run_notebooks`
    copies into ``run.json``) and returns False.

    Examples
    --------
    >>> import tempfile
    >>> skips = SkipLog(tempfile.mkdtemp(), show=False)
    >>> skips.check("the linear probe", None), skips.check("the subgroup table", "the manifest has no `source` column")
    (True, False)
    >>> skips.records
    [{'analysis': 'the subgroup table', 'reason': 'the manifest has no `source` column'}]
    """

    def __init__(self, results_dir: str | os.PathLike, *, show: bool = True):
        self.path = Path(results_dir) / SKIPS_FILE
        self.show = show
        self.records: list[dict[str, Any]] = []
        atomic_write_json(self.path, self.records)  # a rerun starts with no skips

    def files_left_out(self, skipped: Any, *, found: int) -> None:
        """Record the files of the data left out (a table with ``path`` and ``reason``), without showing them.

        One record, whose ``files`` lists each file with its reason; the page
        shows them as one table (:func:`crslib.data.readable.skip_summary`).
        Nothing is recorded when no file was left out.
        """
        if len(skipped) == 0:
            return
        counts = skipped["reason"].value_counts()
        reasons = "; ".join(f"{n} {'file' if n == 1 else 'files'}: {reason}" for reason, n in counts.head(3).items())
        more = f"; {len(counts) - 3} other reasons" if len(counts) > 3 else ""
        self.records.append({
            "analysis": f"{len(skipped)} of the {found} files of the data (no readable image in them)",
            "reason": f"{reasons}{more}; each is listed in skipped_files.csv",
            "files": [{"path": str(row.path), "reason": str(row.reason)} for row in skipped.itertuples()],
        })
        atomic_write_json(self.path, self.records)

    def check(self, analysis: str, reason: str | None) -> bool:
        if reason is None:
            return True
        self.records.append({"analysis": str(analysis), "reason": str(reason)})
        atomic_write_json(self.path, self.records)
        if self.show:
            from IPython.display import Markdown, display

            display(Markdown(f"**Skipped: {_escape_markdown(analysis)}.** "
                             f"{_escape_markdown(reason[0].upper() + reason[1:])}."))
        return False


def _escape_markdown(text: str) -> str:
    r"""User-provided text (column values, file names) shown literally in a Markdown cell.

    Outside `code spans` HTML and Markdown's emphasis and link characters
    are escaped; inside them nothing is, because Markdown shows a code span
    as it is (an escape there would be shown too).

    Examples
    --------
    >>> _escape_markdown("no `patient_id` column in <b>*x_y*</b>")
    'no `patient_id` column in &lt;b&gt;\\*x\\_y\\*&lt;/b&gt;'
    """
    import html

    parts = str(text).split("`")
    return "`".join(part if i % 2 else
                    html.escape(part, quote=False).replace("*", "\\*").replace("_", "\\_").replace("[", "\\[")
                    for i, part in enumerate(parts))


def read_skips(results_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The skips a notebook recorded in ``<results_dir>/skips.json`` (none when it wrote no file)."""
    path = Path(results_dir) / SKIPS_FILE
    if not path.is_file():
        return []
    return [dict(r) for r in json.loads(path.read_text(encoding="utf-8"))]


def read_run_evidence(run_dir: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """Merge the checklist evidence the notebooks of one run recorded.

    Each notebook that measures something a reporting-checklist item needs
    writes ``results/<notebook>/evidence.json`` (item id -> fields, see
    :mod:`crslib.checklist`); an item recorded by two notebooks takes the
    later notebook's fields.

    Parameters
    ----------
    run_dir : path
        A run folder of ``crs book`` (with ``results/``), or any folder
        holding ``*/evidence.json`` files.

    Returns
    -------
    evidence : dict
        Item id -> recorded fields (``{}`` when nothing was recorded).
    run_id : str
        The run's id from ``run.json``, else the folder's name.

    Raises
    ------
    ConfigError
        The folder does not exist, or an evidence file is not valid JSON.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ConfigError(f"run folder {root} does not exist; pass a folder under runs/ written by crs book")
    results = root / "results" if (root / "results").is_dir() else root
    evidence: dict[str, Any] = {}
    for path in sorted(results.glob("*/evidence.json")):
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"evidence file {path} is unreadable ({exc}); rerun its notebook") from None
        if not isinstance(recorded, dict):
            raise ConfigError(f"evidence file {path} must hold a JSON object (item id -> fields)")
        evidence.update(recorded)
    run_id = root.resolve().name
    try:
        run_id = str(json.loads((root / "run.json").read_text(encoding="utf-8")).get("run_id", run_id))
    except (OSError, ValueError):
        pass
    return evidence, run_id


def _check_repository_url(url: str | None) -> None:
    if url is not None and not str(url).startswith(("https://", "http://")):
        raise ConfigError(f"repository URL must start with https://, got {url!r}")


def build_html(*, book_root: str | os.PathLike | None = None, repository_url: str | None = None) -> Path:
    """Build the Jupyter Book (Sphinx, execution off); return ``index.html``.

    Parameters
    ----------
    book_root : path, optional
        Folder holding ``_config.yml``, ``_toc.yml`` and ``book/``; default the repository.
    repository_url : str, optional
        The https URL of the public GitHub repository the repository,
        Binder and Colab buttons point to (a published build takes it from
        CI: ``CRS_REPOSITORY_URL`` in the book workflow); overrides ``repository.url`` in
        ``_config.yml``. Without either, the book has no such buttons.

    Raises
    ------
    ConfigError
        If ``repository_url`` is not an http(s) URL.
    NotebookError
        If jupyter-book fails; the message carries the end of its log.
    """
    root = Path(book_root) if book_root else REPO_ROOT
    _check_repository_url(repository_url)
    executable = Path(sys.executable).parent / "jupyter-book"
    if not executable.exists():
        executable = Path(shutil.which("jupyter-book") or "jupyter-book")
    command = [str(executable), "build", str(root), "--builder", "html"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if repository_url:
        env["CRS_REPOSITORY_URL"] = str(repository_url)  # read by book/_ext/crs_book.py
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise NotebookError(f"jupyter-book build failed:\n{tail}")
    index = root / "_build" / "html" / "index.html"
    if not index.is_file():
        raise NotebookError(f"jupyter-book finished but {index} is missing")
    return index


def build_book(
    preset: str | os.PathLike = "default",
    *,
    only: Sequence[str] | None = None,
    run_root: str | os.PathLike | None = None,
    book_root: str | os.PathLike | None = None,
    build: bool = True,
    repository_url: str | None = None,
    reuse: bool = True,
    data: str | os.PathLike | None = None,
    models: str | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    progress: Callable[[Progress], None] | None = None,
) -> RunRecord:
    """Run the notebooks with a preset, stage them and build the HTML book
    (see :func:`build_html` for ``repository_url``, :func:`run_notebooks`
    for ``data``, ``models``, ``overrides`` and ``progress``, which also hears
    of the HTML build: ``'build'`` and ``'built'``)."""
    _check_repository_url(repository_url)  # before the notebooks run, not after
    began = time.perf_counter()
    record = run_notebooks(preset, only=only, run_root=run_root, reuse=reuse, data=data, models=models,
                           overrides=overrides, progress=progress)
    unchanged = _unchanged_build(record, book_root, repository_url) if build else None
    if unchanged is not None:
        return _reuse_build(record, unchanged, began, progress)
    record.provenance = collect_provenance(record)
    atomic_write_json(Path(record.run_dir) / "run.json", record.to_dict())
    stage_run(record, book_root=book_root)
    if build:
        step = {"index": len(record.notebooks), "total": len(record.notebooks), "name": "HTML book"}
        report = progress or (lambda step: None)
        start = time.perf_counter()
        report(Progress("build", elapsed=start - began, **step))
        record.html_index = str(build_html(book_root=book_root, repository_url=repository_url))
        record.build_seconds = round(time.perf_counter() - start, 2)
        report(Progress("built", elapsed=time.perf_counter() - began, seconds=record.build_seconds, **step))
        atomic_write_json(Path(record.run_dir) / "run.json", record.to_dict())
        key = _build_key(record, book_root, repository_url)
        if key is not None:
            atomic_write_json(Path(record.html_index).parent.parent / BUILD_STAMP,
                              {"key": key, "run_id": record.run_id, "run_dir": record.run_dir})
    return record


#: Written into ``_build/`` after a build: the key of what it showed (see :func:`_build_key`).
BUILD_STAMP = ".crs-build.json"


def _book_key(executions: list[list[str]], preset: str, book_root: str | os.PathLike | None,
              repository_url: str | None) -> str:
    """What a built book shows: each notebook's execution (the run that executed it), the preset, the
    book's hand-written sources, the crslib code (and shipped zoo) and the repository URL."""
    root = Path(book_root) if book_root else REPO_ROOT
    sources = [root / "_config.yml", root / "_toc.yml"] + sorted(
        p for p in (root / "book").rglob("*") if p.is_file() and p.relative_to(root).parts[:2] != GENERATED.parts)
    return digest_of(["crs-build", executions, preset, _code_digest(), repository_url,
                      [[p.relative_to(root).as_posix(), file_sha256(p)] for p in sources if p.is_file()]])


def _build_key(record: RunRecord, book_root: str | os.PathLike | None, repository_url: str | None) -> str | None:
    """The :func:`_book_key` of a finished build; None when a notebook executed without an execution key
    (on the user's own files: never the same twice)."""
    executions = []
    for notebook in record.notebooks:
        origin = notebook.reused_from or (None if _has_external_input(notebook.parameters) else record.run_id)
        if origin is None:
            return None
        executions.append([notebook.name, origin])
    return _book_key(executions, record.preset, book_root, repository_url)


def _unchanged_build(record: RunRecord, book_root: str | os.PathLike | None,
                     repository_url: str | None) -> dict[str, Any] | None:
    """The stamp of the last build when this run would build the same book (every notebook reused
    from the executions that build showed, nothing else changed), else None."""
    if not record.notebooks or not all(n.reused_from for n in record.notebooks):
        return None
    root = Path(book_root) if book_root else REPO_ROOT
    index = root / "_build" / "html" / "index.html"
    try:
        stamp = json.loads((root / "_build" / BUILD_STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    key = _book_key([[n.name, n.reused_from] for n in record.notebooks], record.preset, book_root, repository_url)
    if not isinstance(stamp, dict) or stamp.get("key") != key or not index.is_file():
        return None
    return dict(stamp, html_index=str(index))


def _reuse_build(record: RunRecord, stamp: dict[str, Any], began: float,
                 progress: Callable[[Progress], None] | None) -> RunRecord:
    """Finish a run whose book is already built: point it at that HTML and the run it shows."""
    try:
        shown = json.loads((Path(stamp["run_dir"]) / "run.json").read_text(encoding="utf-8"))
        record.provenance = shown.get("provenance") or {}
    except (OSError, ValueError, KeyError):
        record.provenance = {}
    record.html_index = stamp["html_index"]
    record.build_seconds = 0.0
    record.book_from_run = str(stamp.get("run_id"))
    atomic_write_json(Path(record.run_dir) / "run.json", record.to_dict())
    log.info("the book is unchanged since run %s: not rebuilt", stamp.get("run_id"))
    if progress is not None:
        step = {"index": len(record.notebooks), "total": len(record.notebooks), "name": "HTML book"}
        progress(Progress("unchanged", elapsed=time.perf_counter() - began, seconds=0.0,
                          reused_from=record.book_from_run, **step))
    return record

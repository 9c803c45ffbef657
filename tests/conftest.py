"""Shared test set-up: offline, headless, and an isolated cache per session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Set before crslib, torch or a notebook kernel reads them; kernels inherit them.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["MPLBACKEND"] = "Agg"
if "CRS_CACHE_DIR" not in os.environ:
    os.environ["CRS_CACHE_DIR"] = _SESSION_CACHE = tempfile.mkdtemp(prefix="crs-test-cache-")
    _CREATOR = os.getpid()

    def _remove_session_cache() -> None:
        # only the process that made it; forked children (mutmut, xdist) share it and exit first
        if os.getpid() == _CREATOR:
            shutil.rmtree(_SESSION_CACHE, ignore_errors=True)

    atexit.register(_remove_session_cache)

import crslib  # noqa: E402,F401  (applies the torchvision import fix first)
import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def quick_book(tmp_path_factory: pytest.TempPathFactory, repo_root: Path):
    """A copy of the book sources, built with the quick preset (runs once per session)."""
    root = tmp_path_factory.mktemp("book")
    for name in ["_config.yml", "_toc.yml"]:
        shutil.copy2(repo_root / name, root / name)
    shutil.copytree(repo_root / "book", root / "book", ignore=shutil.ignore_patterns("generated"))
    from crslib.config import cache_dir
    from crslib.runner import build_book

    def trained() -> set[str]:  # zoo models and fine-tunings in the cache
        return {p.name for folder in ("zoo/models", "finetune") for p in (cache_dir() / folder).glob("*")}

    before = trained()
    record = build_book("quick", run_root=root / "runs", book_root=root)
    record.trained_during_build = sorted(trained() - before)  # read by test_book: the quick book trains nothing
    return root, record


@pytest.fixture(scope="session")
def own_books(tmp_path_factory: pytest.TempPathFactory, repo_root: Path):
    """The quick book built on each real-image layout (``tests/realdata.py``) with non-zoo models.

    ``{layout: (book root, RunRecord, cache folder)}``; each build has its
    own cache folder, so a test can check that no zoo model was trained.
    """
    from realdata import LAYOUTS, OWN_MODELS, write_layout

    from crslib.runner import build_book

    books = {}
    saved = os.environ.get("CRS_CACHE_DIR")
    try:
        for layout in LAYOUTS:
            root = tmp_path_factory.mktemp(f"own-{layout}")
            data = write_layout(layout, root / "images")
            for name in ["_config.yml", "_toc.yml"]:
                shutil.copy2(repo_root / name, root / name)
            shutil.copytree(repo_root / "book", root / "book", ignore=shutil.ignore_patterns("generated"))
            cache = root / "cache"
            os.environ["CRS_CACHE_DIR"] = str(cache)  # the notebook kernels inherit it
            record = build_book("quick", run_root=root / "runs", book_root=root, data=str(data), models=OWN_MODELS)
            books[layout] = (root, record, cache)
    finally:
        if saved is None:
            os.environ.pop("CRS_CACHE_DIR", None)
        else:
            os.environ["CRS_CACHE_DIR"] = saved
    return books


#: Under ``make mutation``: the test files (``tests/test_<name>*.py``) that are a module's own
#: tests, where they are not simply ``test_<module>*.py`` (modules cut out of a larger one keep
#: their tests where they were).
OWN_TESTS: dict[str, tuple[str, ...]] = {
    "neighbors": ("agreement", "neighbors"),
    "ann": ("agreement", "ann"),
    "recall": ("agreement", "recall"),
    "similarity": ("agreement", "similarity"),
    "subgroups": ("agreement", "subgroups"),
    "factors": ("agreement", "factors"),
    "probes": ("agreement", "audit", "risk", "transfer", "probes"),
    "splits": ("audit", "risk", "stats", "transfer", "splits"),
    "shortcut": ("audit", "shortcut"),
    "risk_results": ("risk",),
    "risk_needs": ("risk",),
    "risk_scores": ("risk",),
    "risk_multiclass": ("risk",),
    "risk_select": ("risk",),
    "risk_inputs": ("risk",),
    "risk_metrics": ("risk",),
    "_resample": ("stats",),
    "checklist_items": ("checklist",),
}


def _shares_setup(item: pytest.Item) -> bool:
    """Whether the test uses a fixture built once per module or session (expensive: the phantoms)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(defs and defs[-1].scope in ("module", "package", "session") for defs in definitions)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make mutation``, run only the mutated module's own test files.

    mutmut runs a mutant's tests in a fresh fork, so a test of another
    module pays its whole fixture set-up (phantoms, audits: tens of seconds)
    for every mutant of a widely used helper. With ``CRS_MUTATION_SCOPE=own``
    (the default of ``make mutation``) a mutant of ``crslib.stats`` runs the
    tests in ``tests/test_stats*.py`` (see :data:`OWN_TESTS`) that reach it: the kill rate then says
    what a module's own tests catch. ``SCOPE=all`` keeps every fast test that
    reaches the mutant. A normal test run is unchanged.
    """
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if not mutant.startswith("crslib."):
        return
    module = mutant.split(".")[1]
    prefixes = tuple(f"test_{name}" for name in OWN_TESTS.get(module, (module,)))
    own = [item for item in items if Path(str(item.path)).name.startswith(prefixes)]
    # the module's namesake tests first, and within each file the tests without a module- or
    # session-wide fixture first: they are the quick, direct ones, and with -x they usually kill a
    # mutant before a test pays a shared set-up (phantoms, audits) in the mutant's fresh process
    own.sort(key=lambda item: (not Path(str(item.path)).name.startswith(f"test_{module}"), _shares_setup(item)))
    others = [item for item in items if not Path(str(item.path)).name.startswith(prefixes)]
    if os.environ.get("CRS_MUTATION_SCOPE", "own") == "own":
        if others:
            config.hook.pytest_deselected(items=others)
        items[:] = own
    else:
        items[:] = own + others  # with -x, the module's own tests usually kill it first

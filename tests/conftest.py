"""Shared test set-up: offline, headless, and an isolated cache per session."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

# Set before crslib, torch or a notebook kernel reads them; kernels inherit them.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["MPLBACKEND"] = "Agg"
#: the pytest-xdist worker this process is (``make test`` runs one per core), or "" when alone
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if XDIST_WORKER:
    # one worker per core: each computes on one thread, so two workers do not fight over the cores
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
elif "CRS_XDIST_GROUPS" not in os.environ:
    # where the workers write each test's group (see pytest_xdist_make_scheduler); the workers inherit it
    _fd, _groups_file = tempfile.mkstemp(prefix="crs-xdist-groups-", suffix=".json")
    os.close(_fd)
    os.environ["CRS_XDIST_GROUPS"] = _groups_file
    atexit.register(lambda path=_groups_file, pid=os.getpid(): os.getpid() == pid and os.remove(path))
if "CRS_CACHE_DIR" not in os.environ:
    os.environ["CRS_CACHE_DIR"] = _SESSION_CACHE = tempfile.mkdtemp(prefix="crs-test-cache-")
    _CREATOR = os.getpid()

    def _remove_session_cache() -> None:
        # only the process that made it; forked children (mutmut, xdist) share it and exit first
        if os.getpid() == _CREATOR:
            shutil.rmtree(_SESSION_CACHE, ignore_errors=True)

    atexit.register(_remove_session_cache)
if XDIST_WORKER:
    # each worker its own cache: a test that counts what was trained or cached sees only its own worker's work
    os.environ["CRS_CACHE_DIR"] = os.path.join(os.environ["CRS_CACHE_DIR"], f"xdist-{XDIST_WORKER}")

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


#: The repository URL the tests build the quick book's pages with (a published build takes it from CI).
REPOSITORY_URL = "https://github.com/example-org/crs-companion"


@pytest.fixture(scope="session")
def quick_book_with_url(quick_book, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick book's staged pages built again with :data:`REPOSITORY_URL` (not rerun): the HTML folder."""
    from crslib.runner import build_html

    root, _ = quick_book
    site = tmp_path_factory.mktemp("site")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(root / name, site / name)
    shutil.copytree(root / "book", site / "book")
    return build_html(book_root=site, repository_url=REPOSITORY_URL).parent


@pytest.fixture(scope="session")
def own_books(tmp_path_factory: pytest.TempPathFactory, repo_root: Path):
    """The quick book built on each real-image layout (``tests/realdata.py``) with non-zoo models.

    ``{layout: (book root, RunRecord, cache folder)}``; each build has its
    own cache folder, so a test can check that no zoo model was trained.
    """
    from realdata import LAYOUTS, OWN_BOOK_TILES, OWN_MODELS, write_layout

    from crslib.runner import build_book

    books = {}
    saved = os.environ.get("CRS_CACHE_DIR")
    try:
        for layout in LAYOUTS:
            root = tmp_path_factory.mktemp(f"own-{layout}")
            data = write_layout(layout, root / "images", OWN_BOOK_TILES)
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


#: Session fixtures that build a whole book: the tests using one run in one xdist worker, so it is built once.
BOOK_FIXTURES = ("quick_book", "own_books")
#: Fixtures built on a book, or that ask for one by name (request.getfixturevalue), and the book they need.
BOOK_USERS = {"book_under_test": "quick_book", "quick_book_with_url": "quick_book"}


def _xdist_group(item: pytest.Item) -> str:
    """The group of a test for the xdist scheduler: its ``xdist_group`` mark, the book it reads, else its file
    when it shares a module fixture. A test that runs the quick preset's notebooks is marked
    ``xdist_group("quick_book")``: in that worker the quick book has filled the cache it reads.

    "" for a test that needs nothing built by another test.
    """
    marked = item.get_closest_marker("xdist_group")  # pytest-xdist's own mark, read here (see the scheduler)
    if marked is not None and marked.args:
        return str(marked.args[0])
    names = getattr(item, "fixturenames", ())
    for book in BOOK_FIXTURES:
        if book in names or any(BOOK_USERS.get(name) == book for name in names):
            return book
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    if any(defs and defs[-1].scope in ("module", "package") for defs in definitions):
        return Path(str(item.path)).name
    return ""


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: known only when xdist is loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With ``--dist loadgroup``, schedule by :func:`_xdist_group`: each book and each shared module fixture once.

    pytest-xdist's own groups (the ``xdist_group`` mark) are read from the
    test ids, which pytest 9 no longer lets a plugin rename; the workers
    write the groups to the file ``CRS_XDIST_GROUPS`` instead, and the
    scheduler reads it once every worker has collected.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _GroupScheduling(LoadScopeScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = json.loads(Path(os.environ["CRS_XDIST_GROUPS"]).read_text() or "{}")
            return self._groups.get(nodeid) or nodeid

    return _GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for pytest-xdist; under ``make mutation``, run only the mutated module's own tests.

    With ``-n`` and ``--dist loadgroup`` (``make test``), the tests that read
    one built book, or share one module's fixture (its phantoms), go to one
    worker (:func:`pytest_xdist_make_scheduler`), so that nothing expensive is built twice.

    Under ``make mutation``, run only the mutated module's own test files.

    mutmut runs a mutant's tests in a fresh fork, so a test of another
    module pays its whole fixture set-up (phantoms, audits: tens of seconds)
    for every mutant of a widely used helper. With ``CRS_MUTATION_SCOPE=own``
    (the default of ``make mutation``) a mutant of ``crslib.stats`` runs the
    tests in ``tests/test_stats*.py`` (see :data:`OWN_TESTS`) that reach it: the kill rate then says
    what a module's own tests catch. ``SCOPE=all`` keeps every fast test that
    reaches the mutant. A normal test run is unchanged.
    """
    if XDIST_WORKER:
        # the books first: they take longest (``make test`` keeps this order, --no-loadscope-reorder)
        items.sort(key=lambda item: next((i for i, b in enumerate(BOOK_FIXTURES) if _xdist_group(item) == b), 2))
        groups = {item.nodeid: _xdist_group(item) for item in items}
        target = Path(os.environ["CRS_XDIST_GROUPS"])
        partial = target.with_name(f"{target.name}.{XDIST_WORKER}")
        partial.write_text(json.dumps({k: v for k, v in groups.items() if v}))
        partial.replace(target)  # every worker collects the same tests, so any one's file will do
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

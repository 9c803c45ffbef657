"""Check mutmut's mutants of one module in a single pytest process (faster than `make mutation`).

mutmut forks a fresh process per mutant, so each mutant pays pytest's start-up and collection,
and every fixture again; a killed mutant of ``crslib.neighbors`` costs seconds. mutmut's
trampoline picks the mutant to run on every call, from ``MUTANT_UNDER_TEST``, so one pytest
session can run them all: this plugin runs the module's own tests (those of
``tests/conftest.py``'s ``OWN_TESTS``) once to learn which mutated functions each reaches and
how long it takes (a measurement every module's runs share), then, for each mutant, the tests
reaching its function (fastest first; see below), until one fails (killed; a test over ten times
its clean time is a timeout, also caught) or all pass (survived). Every fixture is torn down
between mutants, as in a fresh process; module-level state (imports, caches) is not, so a survivor
is rerun with mutmut (``make mutation RECHECK=1``) before it is listed as equivalent.

Mutants already listed in ``tools/mutation_equivalent.toml`` run last (``--skip-listed`` leaves
them out: each costs all its tests, and the report counts them from mutmut's own run), and ``--cap`` stops a
mutant that has passed its tests for that many seconds with slower tests left ("unfinished":
a survivor of every faster test, to read).

Verdicts go to ``tools/mutation_verdicts/MODULE.jsonl`` (kept in git, so that a fresh checkout
resumes where the last run stopped: a module takes hours on 2 cores), one line per mutant with its
function's source hash, not into mutmut's records; ``tools/mutation_report.py`` counts them
for the mutants mutmut has not caught. ``--recheck`` runs the survivors and unfinished mutants
again after tests were added; the tests new to the run go first, after any that ``--first`` names.
A mutant under which the test process crashes (a C library's abort) is recorded as "crashed", a
kill, and the run resumes after it. ``--compact`` rewrites the verdict file to the current verdicts,
one line per mutant (before a commit), and runs nothing.

It first writes or updates ``mutants/`` with mutmut's own code (minutes for every module on 2
cores the first time; a changed function is mutated again and its mutants numbered anew, so its
older verdicts no longer count and its mutants run again). Run from the repository root::

    .venv/bin/python tools/mutation_inprocess.py neighbors [--functions _select,_rescore] [--cap 40] [--skip-listed]
        [--recheck] [--first test_name_part,...] [--compact]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The in-process verdicts, one file per module (the tests' measured times and reach, shared by every
#: module's runs, stay in mutants/inprocess.stats.json).
VERDICTS = ROOT / "tools" / "mutation_verdicts"
_hits: set[str] = set()


# --------------------------------------------------------------------------- the command line


def own_test_files(module: str, tests: Path) -> list[str]:
    """The module's own test files, as a mutant of it runs them under ``make mutation``."""
    tree = ast.parse((tests / "conftest.py").read_text())
    own = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
               and getattr(node.target, "id", None) == "OWN_TESTS")
    prefixes = tuple(f"test_{name}" for name in own.get(module, (module,)))
    return sorted(f"tests/{p.name}" for p in tests.glob("test_*.py") if p.name.startswith(prefixes))


def mangled(function: str) -> str:
    """mutmut's name for a function (``_select``) or method (``_Searcher.search``) of a module."""
    owner, _, name = function.rpartition(".")
    return f"x\u01c1{owner}\u01c1{name}" if owner else f"x_{name}"


def summary(lines: list[dict]) -> str:
    """Verdicts per mutated function, one line each, then the total."""
    by_function: dict[str, Counter] = {}
    for record in lines:
        function = record["mutant"].rsplit("__mutmut_", 1)[0].split(".", 2)[-1]
        by_function.setdefault(function, Counter())[record["status"]] += 1
    total = Counter()
    rows = []
    for function, counts in by_function.items():
        total.update(counts)
        rows.append(f"{function:40s} " + "  ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    rows.append(f"{'all':40s} " + "  ".join(f"{k} {v}" for k, v in sorted(total.items())))
    return "\n".join(rows)


def generate() -> None:
    """Write or update mutants/ as ``mutmut run`` does before it runs a test (mutmut's own code).

    Tests are copied again; a module is mutated again only when its source changed."""
    from mutmut.__main__ import create_mutants
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir

    os.chdir(ROOT)
    set_mutant_under_test("mutant_generation")
    (ROOT / "mutants").mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    print(f"generated mutants: {create_mutants(os.cpu_count() or 1)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help="a mutated module of crslib, e.g. neighbors")
    parser.add_argument("--functions", default="", help="only these functions (comma-separated, e.g. _select)")
    parser.add_argument("--cap", type=float, default=120.0, help="seconds of passing tests before 'unfinished'")
    parser.add_argument("--skip-listed", action="store_true", help="leave out mutants listed as equivalent")
    parser.add_argument("--recheck", action="store_true",
                        help="run again the mutants whose verdict is 'survived' or 'unfinished' (after new tests)")
    parser.add_argument("--first", default="", help="run tests whose id contains one of these (comma-separated) first")
    parser.add_argument("--compact", action="store_true",
                        help="rewrite the verdict file to its current verdicts, one line per mutant, and stop")
    args = parser.parse_args(argv)
    mutants = ROOT / "mutants"
    generate()
    if not (mutants / "crslib" / f"{args.module}.py.meta").exists():
        print(f"crslib.{args.module} is not in [tool.mutmut] only_mutate of pyproject.toml", file=sys.stderr)
        return 2
    out = VERDICTS / f"{args.module}.jsonl"
    meta = mutants / "crslib" / f"{args.module}.py.meta"
    if args.compact:
        if out.exists():
            kept = list(current_verdicts(out, meta).values())
            out.write_text("".join(json.dumps(v, separators=(",", ":")) + "\n" for v in kept))
            print(summary(kept))
        return 0
    VERDICTS.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tools"), CRS_INPROCESS_MODULE=f"crslib.{args.module}",
               CRS_INPROCESS_OUT=str(out), CRS_INPROCESS_STATS=str(mutants / "inprocess.stats.json"),
               CRS_INPROCESS_FUNCTIONS=args.functions,
               CRS_INPROCESS_CAP=str(args.cap), CRS_INPROCESS_SKIP_LISTED="1" if args.skip_listed else "",
               # --recheck reopens the verdicts made before this run only, not those of a run resumed after a crash
               CRS_INPROCESS_RECHECK=str(len(out.read_text().splitlines())) if args.recheck and out.exists() else "",
               CRS_INPROCESS_FIRST=args.first,
               MUTANT_UNDER_TEST="")
    command = [sys.executable, "-m", "pytest", "-p", "mutation_inprocess", "-m", "not slow",
               "-p", "no:cacheprovider", "-q", "--tb=line", *own_test_files(args.module, mutants / "tests")]
    while True:
        code = subprocess.call(command, cwd=mutants, env=env)
        crashed = _crashed(out, code)
        if crashed is None:
            break
        # a mutant that crashes the interpreter (a C library's abort or segfault) is caught, as a test
        # process that dies fails the suite; record it and resume with the next mutant
        with out.open("a") as fh:
            fh.write(json.dumps(crashed) + "\n")
        print(f"crashed    {crashed['mutant']} ({crashed['by']})", file=sys.stderr, flush=True)
    if out.exists():
        print(summary(list(current_verdicts(out, meta).values())))
    return code


#: Signals that mean the interpreter crashed, not that someone stopped the run.
_CRASH_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)


def _crashed(out: Path, code: int) -> dict | None:
    """The verdict of the mutant that was running when the test process died of a crash, if it did."""
    if code >= 0 or -code not in _CRASH_SIGNALS or not out.exists():
        return None
    last = json.loads(out.read_text().splitlines()[-1])
    if last["status"] != "started":
        return None
    return {**last, "status": "crashed", "by": signal.Signals(-code).name}


def current_verdicts(out: Path, meta: Path, lines: int | None = None) -> dict[str, dict]:
    """The last verdict of each mutant whose function is unchanged since (its source hash in mutmut's ``.meta``).

    A changed function is mutated anew and its mutants renumbered, so its older verdicts are
    dropped (and, by the checker, run again). ``lines``: read only the file's first lines."""
    if not out.exists():
        return {}
    hashes = json.loads(meta.read_text())["hash_by_function_name"]
    verdicts = {}
    for line in out.read_text().splitlines()[:lines]:
        record = json.loads(line) if line.strip() else None
        if record and record["status"] != "started" and record.get("hash") == hashes.get(
                record["mutant"].rsplit("__mutmut_", 1)[0].split(".")[-1]):
            verdicts[record["mutant"]] = record
    return verdicts


# --------------------------------------------------------------------------- the pytest plugin


class MutantTimeout(Exception):
    """A test ran past its limit under a mutant (caught, as mutmut counts a timeout)."""


def _on_alarm(signum, frame):
    raise MutantTimeout("test over its time limit")


def _record_hit(name: str, caller: str | None = None) -> None:
    _hits.add(name)


def _run(item, nextitem, limit: float) -> str:
    from _pytest.runner import runtestprotocol

    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        reports = runtestprotocol(item, log=False, nextitem=nextitem)
    except MutantTimeout:
        return "timeout"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    failed = [r for r in reports if r.failed]
    if not failed:
        return "passed"
    return "timeout" if any("MutantTimeout" in str(r.longrepr) for r in failed) else "killed"


def _reopened(out: Path, meta: Path, before: int) -> set[str]:
    """``--recheck``: the survivors and unfinished mutants of the verdict file's first ``before`` lines
    (those of earlier runs) that no later line decides again, as a run resumed after a crash does."""
    if not before:
        return set()
    decided_since = {json.loads(line)["mutant"] for line in out.read_text().splitlines()[before:]}
    return {m for m, v in current_verdicts(out, meta, before).items()
            if v["status"] in ("survived", "unfinished") and m not in decided_since}


def _merge_stats(stats_file: Path, measured: dict) -> None:
    """Add this run's measurements to the file every module's runs share (a test's hits name the
    functions of every mutated module), reading it again first: a run beside this one may have added
    its own since."""
    if not measured:
        return
    current = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    current.update(measured)
    partial = stats_file.with_name(f"{stats_file.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(current, indent=1))
    os.replace(partial, stats_file)  # a reader beside it sees the old file or the new one, never half


def _source_hash(item) -> str:
    """A short hash of a test function's source (of its module's, where it has none of its own)."""
    try:
        source = inspect.getsource(item.obj)
    except (OSError, TypeError):
        source = Path(str(item.fspath)).read_text()
    return hashlib.sha1(source.encode()).hexdigest()[:12]


def _ordered_mutants(module: str, functions: list[str], skip_listed: bool = False) -> list[str]:
    """The module's mutants (cwd is mutants/), those listed as equivalent last or not at all."""
    names = list(json.loads(Path(module.replace(".", "/") + ".py.meta").read_text())["exit_code_by_key"])
    if functions:
        wanted = {f"{module}.{mangled(f)}" for f in functions}
        names = [n for n in names if n.rsplit("__mutmut_", 1)[0] in wanted]
    os.chdir(ROOT)  # mutmut's diffs read the original source and mutants/ from the repository root
    try:
        sys.path.insert(0, str(ROOT / "tools"))
        from mutation_report import load_equivalent, match_equivalent

        # the report's own matching, as if every mutant had survived
        listed, _ = match_equivalent({module.split(".")[-1]: dict.fromkeys(names, "survived")}, load_equivalent())
    finally:
        os.chdir(ROOT / "mutants")
    return [n for n in names if n not in listed] + ([] if skip_listed else [n for n in names if n in listed])


def pytest_runtestloop(session) -> bool:
    import mutmut.mutation.trampoline as trampoline

    trampoline.record_trampoline_hit = _record_hit
    module, out = os.environ["CRS_INPROCESS_MODULE"], Path(os.environ["CRS_INPROCESS_OUT"])
    cap = float(os.environ["CRS_INPROCESS_CAP"])
    functions = [f for f in os.environ["CRS_INPROCESS_FUNCTIONS"].split(",") if f]
    items = {item.nodeid: item for item in session.items}
    stats_file = Path(os.environ["CRS_INPROCESS_STATS"])
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    measured = {}
    trampoline.set_mutant_under_test("stats")
    # a test is measured again when its source changed: an edited test may reach other functions
    sources = {n: _source_hash(item) for n, item in items.items()}
    new_tests = {n for n in items if n not in stats or stats[n].get("source") != sources[n]}
    for nodeid in new_tests:  # each test alone, its fixtures built for it
        _hits.clear()
        start = time.perf_counter()
        outcome = _run(items[nodeid], None, 900)
        measured[nodeid] = {"secs": time.perf_counter() - start, "outcome": outcome, "source": sources[nodeid],
                            "hits": sorted(h for h in _hits if h.startswith("crslib."))}
    trampoline.set_mutant_under_test("")
    stats.update(measured)
    _merge_stats(stats_file, measured)
    failing = [n for n in items if stats[n]["outcome"] != "passed"]
    if failing:
        print(f"tests fail without a mutant (fix them first): {failing}", file=sys.stderr)
        session.testsfailed = len(failing)
        return True
    meta = Path(module.replace(".", "/") + ".py.meta")
    hashes = json.loads(meta.read_text())["hash_by_function_name"]
    verdicts = current_verdicts(out, meta)
    reopened = _reopened(out, meta, int(os.environ["CRS_INPROCESS_RECHECK"] or 0))
    # the tests asked for first, then those new to this run (written for the survivors), then those that
    # killed the most mutants of the same function, then the fastest: a survivor's killer is rarely the fastest
    first = [p for p in os.environ["CRS_INPROCESS_FIRST"].split(",") if p]
    kills = Counter((v["mutant"].rsplit("__mutmut_", 1)[0], v["by"]) for v in verdicts.values() if "by" in v)
    for mutant in _ordered_mutants(module, functions, bool(os.environ["CRS_INPROCESS_SKIP_LISTED"])):
        if mutant in verdicts and mutant not in reopened:
            continue
        function = mutant.rsplit("__mutmut_", 1)[0]
        tests = sorted((n for n in items if function in stats[n]["hits"]),
                       key=lambda n: (not any(p in n for p in first), n not in new_tests, -kills[function, n],
                                      stats[n]["secs"]))
        record = {"mutant": mutant, "hash": hashes[function.split(".")[-1]], "tests": len(tests),
                  "status": "no tests", "ran": 0}
        with out.open("a") as fh:  # a mark that names the mutant should the process crash under it
            fh.write(json.dumps({**record, "status": "started"}) + "\n")
        trampoline.set_mutant_under_test(mutant)
        start = time.perf_counter()
        for i, nodeid in enumerate(tests):
            record["status"] = "survived"
            following = items[tests[i + 1]] if i + 1 < len(tests) else None
            outcome = _run(items[nodeid], following, max(30.0, 10 * stats[nodeid]["secs"]))
            record["ran"] = i + 1
            if outcome != "passed":
                record.update(status=outcome, by=nodeid)
                break
            if following is not None and time.perf_counter() - start > cap:
                record["status"] = "unfinished"
                break
        session._setupstate.teardown_exact(None)  # a fresh set of fixtures for the next mutant
        trampoline.set_mutant_under_test("")
        record["secs"] = round(time.perf_counter() - start, 2)
        if record["status"] in ("killed", "timeout"):
            kills[function, record["by"]] += 1
        with out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        print(f"{record['status']:10s} {mutant} ({record['ran']}/{record['tests']} tests, {record['secs']} s)",
              file=sys.stderr, flush=True)
    return True


if __name__ == "__main__":
    sys.exit(main())

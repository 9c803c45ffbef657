"""Kill rate per module of the last `make mutation` run, and every surviving mutant.

Reads mutmut's result files under ``mutants/`` (and, for the mutants mutmut has not caught,
the verdicts of ``tools/mutation_inprocess.py``) and writes ``mutants/report.md``:
a table per module (killed, survived, timeouts, mutants no test reaches, kill
rate) and, for each survivor, its diff. Survivors listed in
``tools/mutation_equivalent.toml`` (the mutated function, the mutated line as
it reads after the change, and why it cannot change a result) count as
equivalent and leave the rate's denominator. Entries are matched by that line,
not by mutmut's mutant number, which shifts when the function changes; entries
that match no surviving mutant are reported, so the list cannot go stale
silently.

The kill rate is ``(killed + timeout) / (total - not checked - equivalent)``:
a mutant that no fast test reaches counts as surviving, because it is a bug
the suite would not notice.

Run from the repository root with the project's virtual environment:
``.venv/bin/python tools/mutation_report.py [MODULE...] [--min-rate 0.9]``. It
exits 1 when a module is below ``--min-rate``; ``--open`` prints only the
names of the mutants still open (survived, unreached or not yet checked), which
``make mutation RECHECK=1`` hands back to mutmut after the tests changed.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections import Counter
from pathlib import Path

from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

EQUIVALENT_FILE = Path("tools/mutation_equivalent.toml")
REPORT = Path("mutants/report.md")
CAUGHT = ("killed", "timeout", "segfault", "caught by type check")


def load_results(modules: list[str]) -> tuple[dict[str, dict[str, str]], dict[str, int]]:
    """Status of every mutant, by module, and how many of them the in-process checker decided.

    mutmut's ``.meta`` files first; a mutant mutmut has not caught takes the verdict of
    ``tools/mutation_inprocess.py`` (``tools/mutation_verdicts/MODULE.jsonl``) when that verdict is of
    the function's current source. An "unfinished" mutant (it passed the faster tests) counts as
    surviving, and one that crashed the test process as caught (mutmut's "segfault")."""
    from mutation_inprocess import VERDICTS, current_verdicts

    results, in_process = {}, {}
    for path in sorted(Path("crslib").glob("*.py")):
        if modules and path.stem not in modules:
            continue
        meta = Path("mutants") / (str(path) + ".meta")
        if not meta.exists():
            continue
        data = SourceFileMutationData(path=path)
        data.load()
        statuses = {name: status_by_exit_code[code] for name, code in data.exit_code_by_key.items()}
        verdicts = current_verdicts(VERDICTS / f"{path.stem}.jsonl", meta)
        taken = {name: v["status"] for name, v in verdicts.items() if name in statuses and statuses[name] not in CAUGHT}
        statuses.update({name: {"unfinished": "survived", "crashed": "segfault"}.get(st, st)
                         for name, st in taken.items()})
        results[path.stem], in_process[path.stem] = statuses, len(taken)
    return results, in_process


def load_equivalent() -> list[dict[str, str]]:
    """Entries ``{function, mutated, why}`` of mutants that change no observable result."""
    if not EQUIVALENT_FILE.exists():
        return []
    return tomllib.loads(EQUIVALENT_FILE.read_text())["equivalent"]


def mutated_lines(name: str, module: str) -> list[str]:
    """The lines of a mutant's function as they read after the mutation, stripped."""
    diff = get_diff_for_mutant(name, path=Path("crslib") / f"{module}.py")
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def match_equivalent(results: dict[str, dict[str, str]], entries: list[dict[str, str]]) -> tuple[dict, list]:
    """Surviving mutant name -> reason, and the entries that matched nothing."""
    matched, used = {}, set()
    for module, statuses in results.items():
        for name, status in statuses.items():
            if status not in ("survived", "no tests"):  # import-time code is never reached by a test run
                continue
            function = name.rsplit("__mutmut_", 1)[0]
            lines = None
            for i, entry in enumerate(entries):
                if entry["function"] != function:
                    continue
                lines = mutated_lines(name, module) if lines is None else lines
                if entry["mutated"].strip() in lines:
                    matched[name] = entry["why"]
                    used.add(i)
                    break
    # an entry is stale only once every mutant of its function has been run (a partial run proves nothing)
    finished = {}
    for statuses in results.values():
        for name, status in statuses.items():
            function = name.rsplit("__mutmut_", 1)[0]
            finished[function] = finished.get(function, True) and status != "not checked"
    stale = [e for i, e in enumerate(entries) if i not in used and finished.get(e["function"], False)]
    return matched, stale


def summarise(statuses: dict[str, str], equivalent: dict[str, str]) -> dict[str, float | int]:
    counts = Counter(statuses.values())
    n_equivalent = sum(1 for name, status in statuses.items() if status in ("survived", "no tests") and name in equivalent)
    n_equivalent_unreached = sum(1 for name, status in statuses.items() if status == "no tests" and name in equivalent)
    checked = len(statuses) - counts["not checked"] - n_equivalent
    caught = sum(counts[s] for s in CAUGHT)
    return {
        # a crash of the test process ("segfault") and a type checker's catch are kills too
        "total": len(statuses), "killed": counts["killed"] + counts["segfault"] + counts["caught by type check"],
        "timeout": counts["timeout"],
        "survived": counts["survived"] - (n_equivalent - n_equivalent_unreached), "equivalent": n_equivalent,
        "no_tests": counts["no tests"] - n_equivalent_unreached,
        "not_checked": counts["not checked"], "rate": caught / checked if checked else float("nan"),
    }


def _rate(summary: dict[str, float | int]) -> str:
    """The kill rate, or "not run" when no mutant of the module has been run yet."""
    if summary["rate"] == summary["rate"]:
        return f"{summary['rate']:.1%}"
    return "all equivalent" if summary["not_checked"] == 0 else "not run"


def render(results: dict[str, dict[str, str]], entries: list[dict[str, str]],
           in_process: dict[str, int] | None = None) -> tuple[str, dict[str, dict]]:
    equivalent, stale = match_equivalent(results, entries)
    in_process = in_process or {}
    lines = ["# Mutation testing report", "",
             "| module | mutants | killed | timeout | survived | no test reaches | equivalent | not checked "
             "| kill rate | decided in-process |", "|---|---|---|---|---|---|---|---|---|---|"]
    summaries = {}
    for module, statuses in results.items():
        s = summaries[module] = summarise(statuses, equivalent)
        lines.append(f"| {module} | {s['total']} | {s['killed']} | {s['timeout']} | {s['survived']} | "
                     f"{s['no_tests']} | {s['equivalent']} | {s['not_checked']} | {_rate(s)} | "
                     f"{in_process.get(module, 0)} |")
    lines += ["", "Decided in-process: verdicts of `tools/mutation_inprocess.py` for mutants mutmut has not caught."]
    if stale:
        lines += ["", f"Entries of {EQUIVALENT_FILE} that match no surviving mutant (update or remove them):",
                  *[f"- `{e['function']}`: `{e['mutated']}`" for e in stale]]
    if equivalent:
        lines += ["", "## Equivalent survivors", ""]
        lines += [f"- `{name}`: {why}" for name, why in equivalent.items()]
    for module, statuses in results.items():
        open_ = [n for n, st in statuses.items() if st in ("survived", "no tests") and n not in equivalent]
        if not open_:
            continue
        lines += ["", f"## {module}: {len(open_)} mutants no test kills", ""]
        for name in open_:
            diff = get_diff_for_mutant(name, path=Path("crslib") / f"{module}.py")
            lines += [f"### `{name}` ({statuses[name]})", "", "```diff", diff, "```", ""]
    return "\n".join(lines) + "\n", summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="module names (default: every mutated module)")
    parser.add_argument("--min-rate", type=float, default=None, help="exit 1 when a module's kill rate is below")
    parser.add_argument("--open", action="store_true",
                        help="only print the names of the mutants no test kills (for `mutmut run NAME...`)")
    args = parser.parse_args(argv)
    results, in_process = load_results(args.modules)
    if not results:
        print("no mutation results under mutants/: run `make mutation` first", file=sys.stderr)
        return 2
    if args.open:
        equivalent, _ = match_equivalent(results, load_equivalent())
        print("\n".join(n for statuses in results.values() for n, st in statuses.items()
                        if st in ("survived", "no tests", "not checked") and n not in equivalent))
        return 0
    text, summaries = render(results, load_equivalent(), in_process)
    REPORT.write_text(text)
    for module, s in summaries.items():
        print(f"{module:10s} {s['total']:5d} mutants  killed {s['killed'] + s['timeout']:5d}  "
              f"survived {s['survived'] + s['no_tests']:4d}  equivalent {s['equivalent']:3d}  "
              f"not checked {s['not_checked']:4d}  kill rate {_rate(s)}  (in-process {in_process[module]})")
    print(f"survivors with diffs: {REPORT}")
    low = [m for m, s in summaries.items() if args.min_rate is not None and not s["rate"] >= args.min_rate]
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())

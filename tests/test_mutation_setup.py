"""`make mutation` measures what it claims to: its three lists of modules and tests agree.

The Makefile's MODULES (what the report covers), pyproject's ``only_mutate`` (what mutmut
mutates) and its test selection (what a mutant runs) are kept by hand; a module missing from
one of them, or a module's test file missing from the selection, silently drops out of the
kill rate or makes its mutants look unreached.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import OWN_TESTS

ROOT = Path(__file__).resolve().parents[1]


def _makefile_modules() -> list[str]:
    match = re.search(r"^MODULES \?= (.+)$", (ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    assert match, "the Makefile no longer sets MODULES ?="
    return match.group(1).split()


def _mutmut() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def test_the_report_covers_exactly_the_mutated_modules() -> None:
    mutated = [Path(p).stem for p in _mutmut()["only_mutate"]]
    assert sorted(_makefile_modules()) == sorted(mutated)
    assert all((ROOT / "crslib" / f"{name}.py").is_file() for name in mutated)


def test_each_module_s_own_test_files_are_in_the_selection() -> None:
    selected = {Path(arg).name for arg in _mutmut()["pytest_add_cli_args_test_selection"]
                if not arg.startswith("-")}
    missing = {}
    for module in _makefile_modules():
        prefixes = tuple(f"test_{name}" for name in OWN_TESTS.get(module, (module,)))
        own = {p.name for p in (ROOT / "tests").glob("test_*.py") if p.name.startswith(prefixes)}
        assert own, f"{module}: no test file starts with {prefixes}"
        if own - selected:
            missing[module] = sorted(own - selected)
    assert not missing, f"test files a mutant of these modules would not run: {missing}"


@functools.cache
def _module_tree(module: str) -> ast.Module:
    return ast.parse((ROOT / "crslib" / f"{module}.py").read_text(encoding="utf-8"))


def _defines(module: str, mangled: str) -> bool:
    """Whether crslib/<module>.py defines the function of a mutmut name (x_NAME, or xǁCLASSǁMETHOD)."""
    tree = _module_tree(module)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    if mangled.startswith("xǁ"):
        cls, method = mangled[2:].split("ǁ")
        return any(isinstance(node, ast.ClassDef) and node.name == cls
                   and any(isinstance(m, functions) and m.name == method for m in node.body) for node in tree.body)
    return any(isinstance(node, functions) and node.name == mangled[2:] for node in tree.body)


def test_every_equivalent_mutant_names_a_mutated_function_and_says_why() -> None:
    entries = tomllib.loads((ROOT / "tools" / "mutation_equivalent.toml").read_text())["equivalent"]
    modules = set(_makefile_modules())
    assert len(entries) > 100
    for entry in entries:
        assert set(entry) == {"function", "mutated", "why"}, entry
        _, module, mangled = entry["function"].split(".", 2)
        assert module in modules, entry["function"]
        # an entry for a function that was renamed or moved matches no mutant, and the report cannot see that
        assert _defines(module, mangled), f"{entry['function']} is not defined in crslib/{module}.py"
        assert len(entry["why"]) > 20, entry


def _collected(mutant: str, *files: str) -> list[str]:
    env = {**os.environ, "MUTANT_UNDER_TEST": mutant, "CRS_MUTATION_SCOPE": "own"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *files], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_a_mutant_runs_its_own_tests_namesakes_and_cheap_tests_first() -> None:
    ids = _collected("crslib.splits.x_grouped_split__mutmut_1", "tests/test_audit.py", "tests/test_splits.py",
                     "tests/test_agreement.py")
    files = [i.split("::")[0] for i in ids]
    assert not any(f.endswith("test_agreement.py") for f in files)  # not one of the module's own files
    first_audit = files.index("tests/test_audit.py")
    assert set(files[:first_audit]) == {"tests/test_splits.py"} and set(files[first_audit:]) == {"tests/test_audit.py"}
    audit = [i.split("::")[1] for i in ids[first_audit:]]
    # a test without a module-wide fixture before one that builds the module's phantoms
    assert audit.index("test_fold_assignment_matches_scikit_learn") < audit.index("test_partition_finds_split_shift")
    cheap = audit.index("test_audit_result_to_dict_nests_every_part_and_keeps_the_leakage_precision")
    assert cheap < audit.index("test_no_patient_in_two_folds")
    # outside make mutation, nothing is reordered or left out
    plain = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            "tests/test_audit.py"], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"})
    names = [line.split("::")[1] for line in plain.stdout.splitlines() if "::" in line]
    assert names.index("test_partition_finds_split_shift") < names.index("test_fold_assignment_matches_scikit_learn")


_TOY = {
    "crslib/__init__.py": "",
    "crslib/toy.py": 'def clip_count(n, cap=10):\n    return min(n, cap)\n\n\ndef label(n):\n    return "n=" + str(n)\n',
    "pyproject.toml": '[tool.mutmut]\nsource_paths = ["crslib"]\nonly_mutate = ["crslib/toy.py"]\n',
    "tests/conftest.py": "OWN_TESTS: dict[str, tuple[str, ...]] = {}\n",
    # the label's test reads only its end, so a mutated prefix survives
    "tests/test_toy.py": ("from crslib import toy\n\n\ndef test_clip():\n    assert toy.clip_count(12) == 10\n"
                          "    assert toy.clip_count(3, cap=5) == 3\n\n\n"
                          "def test_label():\n    assert toy.label(3).endswith('3')\n"),
    "tools/mutation_equivalent.toml": ('[[equivalent]]\nfunction = "crslib.toy.x_label"\n'
                                       "mutated = 'return \"XXn=XX\" + str(n)'\nwhy = \"listed for the test\"\n"),
}


def _toy_project(root: Path) -> None:
    for name, text in _TOY.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for name in ("mutation_inprocess.py", "mutation_report.py"):
        (root / "tools" / name).write_text((ROOT / "tools" / name).read_text())


def _check(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}
    done = subprocess.run([sys.executable, "tools/mutation_inprocess.py", *args], cwd=root, env=env,
                          capture_output=True, text=True)
    out = root / "tools" / "mutation_verdicts" / f"{args[0]}.jsonl"
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    # each mutant's "started" mark precedes its verdict
    assert [r["mutant"] for r in records if r["status"] == "started"] == [
        r["mutant"] for r in records if r["status"] != "started"]
    return done, [r for r in records if r["status"] != "started"]


def test_the_in_process_checker_kills_and_keeps_mutants_as_the_tests_decide(tmp_path: Path) -> None:
    _toy_project(tmp_path)
    done, verdicts = _check(tmp_path, "toy", "--functions", "label", "--skip-listed")
    assert done.returncode == 0, done.stderr
    assert [v["mutant"].rsplit("_", 1)[1] for v in verdicts] == ["1", "3", "4"]  # the listed one left out
    done, verdicts = _check(tmp_path, "toy", "--functions", "label")
    assert done.returncode == 0, done.stderr
    # only the function asked for; the mutant listed as equivalent runs last
    assert [v["mutant"].rsplit("_", 1)[1] for v in verdicts] == ["1", "3", "4", "2"]
    status = {v["mutant"].rsplit("__mutmut_", 1)[1]: v["status"] for v in verdicts}
    assert status == {"1": "killed", "2": "survived", "3": "survived", "4": "killed"}  # "XXn=XX", "N=" survive
    assert {v["by"] for v in verdicts if v["status"] == "killed"} == {"tests/test_toy.py::test_label"}
    assert "x_label                                  killed 2  survived 2" in done.stdout
    # a second run resumes: the label's verdicts stay, and clip_count's five mutants die by its own test
    done, verdicts = _check(tmp_path, "toy")
    assert done.returncode == 0, done.stderr
    clip = [v for v in verdicts if "clip_count" in v["mutant"]]
    assert len(verdicts) == 9 and len(clip) == 5
    assert {(v["status"], v["by"], v["tests"]) for v in clip} == {("killed", "tests/test_toy.py::test_clip", 1)}
    # --compact keeps one line per mutant, its last verdict; a function edited since loses its verdicts
    out = tmp_path / "tools" / "mutation_verdicts" / "toy.jsonl"
    assert len(out.read_text().splitlines()) == 18  # each verdict after its "started" mark
    source = tmp_path / "crslib" / "toy.py"
    source.write_text(source.read_text().replace("return min(n, cap)", "return min(cap, n)"))
    env = {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}
    done = subprocess.run([sys.executable, "tools/mutation_inprocess.py", "toy", "--compact"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert kept == [v for v in verdicts if "clip_count" not in v["mutant"]]


def test_the_in_process_checker_refuses_tests_that_fail_without_a_mutant(tmp_path: Path) -> None:
    _toy_project(tmp_path)
    test = tmp_path / "tests" / "test_toy.py"
    test.write_text(test.read_text().replace("== 10", "== 11"))
    done, verdicts = _check(tmp_path, "toy")
    assert done.returncode != 0 and verdicts == []
    assert "tests fail without a mutant (fix them first): ['tests/test_toy.py::test_clip']" in done.stderr


def test_the_in_process_checker_rechecks_survivors_redoes_changed_functions_and_feeds_the_report(
        tmp_path: Path) -> None:
    _toy_project(tmp_path)
    meta = tmp_path / "mutants" / "crslib" / "toy.py.meta"
    done, verdicts = _check(tmp_path, "toy", "--functions", "label", "--skip-listed")
    assert done.returncode == 0, done.stderr
    first_hash = json.loads(meta.read_text())["hash_by_function_name"]["x_label"]
    assert {v["hash"] for v in verdicts} == {first_hash}
    # a test of the whole label, new to the run: --recheck runs survivor 3 ("N=") again, that test first
    test = tmp_path / "tests" / "test_toy.py"
    test.write_text(test.read_text() + "\n\ndef test_label_whole():\n    assert toy.label(3) == 'n=3'\n")
    done, verdicts = _check(tmp_path, "toy", "--functions", "label", "--skip-listed", "--recheck")
    assert done.returncode == 0, done.stderr
    assert len(verdicts) == 4 and verdicts[-1]["mutant"].endswith("__mutmut_3")
    assert (verdicts[-1]["status"], verdicts[-1]["by"], verdicts[-1]["ran"]) == (
        "killed", "tests/test_toy.py::test_label_whole", 1)
    # the report takes the in-process verdicts mutmut lacks: label's three others killed; the listed one
    # was never run, so it stays "not checked" with clip_count's five
    env = {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}
    report = subprocess.run([sys.executable, "tools/mutation_report.py", "toy"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    assert ("toy            9 mutants  killed     3  survived    0  equivalent   0  not checked    6  "
            "kill rate 100.0%  (in-process 3)") in report.stdout
    assert "| toy | 9 | 3 | 0 | 0 | 0 | 0 | 6 | 100.0% | 3 |" in (tmp_path / "mutants" / "report.md").read_text()
    # an edited label is mutated anew: its old verdicts no longer count, and its mutants run again,
    # here with the whole label's test first
    source = tmp_path / "crslib" / "toy.py"
    source.write_text(source.read_text().replace("def label(n):\n", "def label(n):\n    n = int(n)\n"))
    done, verdicts = _check(tmp_path, "toy", "--functions", "label", "--skip-listed", "--first", "label_whole")
    assert done.returncode == 0, done.stderr
    second = json.loads(meta.read_text())
    label_mutants = [name for name in second["exit_code_by_key"] if ".x_label__" in name]
    assert second["hash_by_function_name"]["x_label"] != first_hash and len(label_mutants) > 4
    rerun = [v["mutant"] for v in verdicts[4:]]
    assert rerun == [name for name in label_mutants if name in rerun] and len(rerun) == len(label_mutants) - 1
    assert {(v["hash"], v["status"], v["by"], v["ran"]) for v in verdicts[4:]} == {
        (second["hash_by_function_name"]["x_label"], "killed", "tests/test_toy.py::test_label_whole", 1)}
    # an edited test is measured again: test_label now reaches clip_count as well
    stats = tmp_path / "mutants" / "inprocess.stats.json"
    assert json.loads(stats.read_text())["tests/test_toy.py::test_label"]["hits"] == ["crslib.toy.x_label"]
    test.write_text(test.read_text().replace("endswith('3')", "endswith('3') and toy.clip_count(1) == 1"))
    done, _ = _check(tmp_path, "toy", "--functions", "label")
    assert done.returncode == 0, done.stderr
    assert json.loads(stats.read_text())["tests/test_toy.py::test_label"]["hits"] == [
        "crslib.toy.x_clip_count", "crslib.toy.x_label"]


def test_a_mutant_that_crashes_the_test_process_is_caught_and_the_run_goes_on(tmp_path: Path) -> None:
    _toy_project(tmp_path)
    source = tmp_path / "crslib" / "toy.py"
    source.write_text("import os\n\n\n" + source.read_text() + "\n\ndef guard(n):\n    m = n + 0\n    if m < 0:\n"
                      "        os.abort()  # as a C library's failed check\n    return m\n")
    test = tmp_path / "tests" / "test_toy.py"
    test.write_text(test.read_text() + "\n\ndef test_guard():\n    assert toy.guard(5) == 5\n")
    done, verdicts = _check(tmp_path, "toy", "--functions", "guard")
    assert done.returncode == 0, done.stderr
    first = {v["mutant"].rsplit("__mutmut_", 1)[1]: v["status"] for v in verdicts}
    assert sorted(first.values()) == ["killed", "killed", "survived", "survived", "survived"]  # "m = None", "n + 1"
    # on 0, "m <= 0" and "m < 1" abort: each is recorded as crashed, and the run resumes after it;
    # "n - 0" is rechecked once (a resumed run does not reopen the verdicts it made itself)
    test.write_text(test.read_text().replace("toy.guard(5) == 5", "toy.guard(5) == 5 and toy.guard(0) == 0"))
    done, verdicts = _check(tmp_path, "toy", "--functions", "guard", "--recheck")
    assert done.returncode == 0, done.stderr
    rechecked = [(v["mutant"].rsplit("__mutmut_", 1)[1], v["status"], v.get("by")) for v in verdicts[5:]]
    survivor = next(number for number, status in first.items() if status == "survived")
    assert sorted(rechecked) == sorted([(survivor, "survived", None)] + [
        (number, "crashed", "SIGABRT") for number, status in first.items() if status == "survived" and number != survivor])
    assert done.stderr.count("crashed    crslib.toy.x_guard__mutmut_") == 2
    report = subprocess.run([sys.executable, "tools/mutation_report.py", "toy"], cwd=tmp_path,
                            env={k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"},
                            capture_output=True, text=True)
    assert "killed     4  survived    1  equivalent   0  not checked    9  kill rate 80.0%  (in-process 5)" in (
        report.stdout), report.stderr

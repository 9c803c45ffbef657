"""The Course part of the book: every worked solution runs and prints its answer.

Each ``book/course/exercises_NN.md`` page holds exercises whose solutions sit
in ``{dropdown} Solution`` blocks. The fast tests check the pages' structure
(at least two solutions per page, every solution prints an ``Answer:`` line,
the syllabus links every page). The slow test extracts the ``python`` code of
every solution and runs a page's solutions one after the other in a
subprocess, each in a fresh namespace (so no solution can lean on a variable
of another), then checks the printed answers, including the known values
(an overlap of exactly 1.0, the injected temperature, the item that goes
missing).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

COURSE = Path(__file__).resolve().parent.parent / "book" / "course"
PAGES = sorted(COURSE.glob("exercises_*.md"))
PAGE_TIMEOUT_S = 600  # generous: a busy 2-core machine can be several times slower than an idle one

_DROPDOWN_OPEN = re.compile(r"^(?P<fence>`{3,}|:{3,})\{dropdown\}\s*(?P<title>.*?)\s*$")
_CODE_OPEN = re.compile(r"^(?P<fence>`{3,})\s*(?P<lang>[\w+-]*)\s*$")


def solution_blocks(text: str) -> list[str]:
    """The ``python`` code of each ``{dropdown} Solution`` block, one string per block."""
    lines = text.splitlines()
    solutions: list[str] = []
    i = 0
    while i < len(lines):
        opened = _DROPDOWN_OPEN.match(lines[i])
        if not opened or not opened["title"].startswith("Solution"):
            i += 1
            continue
        fence = opened["fence"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        assert end is not None, f"unclosed {fence}{{dropdown}} Solution block at line {i + 1}"
        body = lines[i + 1:end]
        code: list[str] = []
        k = 0
        while k < len(body):
            block = _CODE_OPEN.match(body[k])
            if block and block["lang"] == "python":
                inner = block["fence"]
                close = next(m for m in range(k + 1, len(body)) if body[m].strip() == inner)
                code.append("\n".join(body[k + 1:close]))
                k = close + 1
            else:
                k += 1
        solutions.append("\n\n".join(code))
        i = end + 1
    return solutions


def solution_explanations(text: str) -> tuple[list[str], str]:
    """The prose of each ``{dropdown} Solution`` block (its code blocks removed), one string per block, and
    the rest of the page (questions, hints, the solutions' code)."""
    lines = text.splitlines()
    explanations: list[str] = []
    in_prose = [False] * len(lines)
    for i, line in enumerate(lines):
        opened = _DROPDOWN_OPEN.match(line)
        if not opened or not opened["title"].startswith("Solution"):
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == opened["fence"])
        prose, inside = [], None
        for j in range(i + 1, end):
            block = _CODE_OPEN.match(lines[j])
            if inside is None and block and block["lang"]:
                inside = block["fence"]
            elif inside is not None and lines[j].strip() == inside:
                inside = None
            elif inside is None:
                prose.append(lines[j])
                in_prose[j] = True
        explanations.append("\n".join(prose))
    return explanations, "\n".join(line for line, prose in zip(lines, in_prose) if not prose)


_DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d+(?!\w|\.\d)")


_EXERCISE_REFERENCE = re.compile(r"[Ee]xercises? \d+\.\d+(?:(?:,| and| or) \d+\.\d+)*")


def unaccounted_numbers(explanation: str, output: str, context: str) -> list[str]:
    """Decimals the explanation quotes that neither the solution printed (to the quoted precision) nor the
    page states elsewhere (the question, the code's own constants) nor the papers report (``crslib.paper``).
    References such as "exercise 2.3" are not numbers."""
    from crslib.paper import CLAIMS

    printed = [float(x) for x in _DECIMAL.findall(output)] + [c.value for c in CLAIMS.values()]
    stated = set(_DECIMAL.findall(context))
    missing = []
    for quoted in _DECIMAL.findall(_EXERCISE_REFERENCE.sub(" ", explanation)):
        digits = len(quoted.split(".")[1])
        value = float(quoted)
        tolerance = 0.5 * 10 ** -digits + 1e-9
        if quoted in stated or any(abs(abs(p) - abs(value)) <= tolerance for p in printed):
            continue
        missing.append(quoted)
    return missing


def _page_id(page: Path) -> str:
    return page.stem


# The driver runs each solution in a fresh namespace and marks where each starts.
_DRIVER = textwrap.dedent(
    """
    import json, sys, traceback
    solutions = json.load(open(sys.argv[1]))
    for number, code in enumerate(solutions, 1):
        print(f"=== solution {number} ===", flush=True)
        try:
            exec(compile(code, f"<solution {number}>", "exec"), {"__name__": "__main__"})
        except BaseException:
            traceback.print_exc()
            sys.exit(1)
        sys.stdout.flush()
    """
)


def _number(pattern: str, output: str) -> float:
    match = re.search(pattern, output)
    assert match, f"no line matches {pattern!r} in:\n{output}"
    return float(match.group(1))


def _check_01(out: str) -> None:
    assert "patients in more than one split: 0" in out
    random_source = _number(r"Answer: random init: silhouette by source (-?[\d.]+)", out)
    random_label = _number(r"Answer: random init: .* by label (-?[\d.]+)", out)
    trained_label = _number(r"Answer: trained: .* by label (-?[\d.]+)", out)
    assert random_source > random_label + 0.3, "a random network should be organised by site, not label"
    assert trained_label > random_label + 0.1, "training on the findings should separate the label"
    # The page words these without numbers (they vary between processors); the order is what it claims
    trained_source = _number(r"Answer: trained: silhouette by source (-?[\d.]+)", out)
    trained_view = _number(r"Answer: trained: .* by view (-?[\d.]+)", out)
    assert trained_label > max(trained_source, trained_view), "the label should separate best once trained"
    assert trained_source < random_source / 2, "the site should separate far less than in the random network"
    held_out_random = _number(r"Going further: random init: .* held-out images (-?[\d.]+)", out)
    held_out_trained = _number(r"Going further: trained: .* held-out images (-?[\d.]+)", out)
    assert held_out_random + 0.1 < held_out_trained < trained_label, "held out: lower, still far above random"
    assert "same key after a re-run: True; same key after changing one image: False" in out
    assert "rows whose embedding changed: 1 of 40" in out


def _check_02(out: str) -> None:
    for case in ["identical embeddings", "orthogonal rotation", "rescaled by 7"]:
        assert f"Answer: {case} -> overlap 1.000" in out
    noise = _number(r"independent noise -> overlap ([\d.]+)", out)
    chance = _number(r"chance k/\(N-1\) = ([\d.]+)", out)
    assert abs(noise - chance) < 0.015, "independent embeddings should agree at chance level"
    assert _number(r"two random-init networks share ([\d.]+)", out) > 3 * _number(r"x chance \(([\d.]+)\)", out)
    same = _number(r"same objective, other seed ([\d.]+)", out)
    assert same > _number(r"; chance ([\d.]+)", out)


def _check_03(out: str) -> None:
    assert _number(r"linear change of basis: held-out R2 (-?[\d.]+)", out) > 0.99
    assert _number(r"linear change of basis: .* retention (-?[\d.]+)", out) > 0.97
    assert _number(r"unrelated encoder: held-out R2 (-?[\d.]+)", out) < 0.05
    assert 0.35 < _number(r"unrelated encoder: .* -> ([\d.]+), retention", out) < 0.65
    assert _number(r"course-supervised_multilabel-seed1: .* retention ([\d.]+)", out) > 0.8
    assert _number(r"course-contrastive-seed0: .* retention ([\d.]+)", out) > 0.75, "most of the AUROC kept"
    maps = {}
    for pair in ["course-supervised_multilabel-seed1", "course-contrastive-seed0"]:
        found = re.search(pair + r": held-out R2 ridge (-?[\d.]+), lstsq (-?[\d.]+), procrustes (-?[\d.]+)", out)
        assert found, out
        maps[pair] = [float(x) for x in found.groups()]
        assert maps[pair][0] > max(maps[pair][1:]), f"{pair}: ridge should have the best held-out R2"
    procrustes = [r2[2] for r2 in maps.values()]
    assert min(procrustes) == maps["course-contrastive-seed0"][2], "Procrustes costs most across objectives"


def _check_04(out: str) -> None:
    assert re.search(r"Answer: test AUROC [\d.]+ for every rule", out)
    assert 2.7 < _number(r"fitted temperature ([\d.]+) \(injected: 3\)", out) < 3.3
    before = _number(r"Answer: test ECE ([\d.]+) before", out)
    after = _number(r"Answer: test ECE [\d.]+ before, ([\d.]+) after", out)
    assert after < before / 2
    assert _number(r"fitted on test: .* on test ([\d.]+)", out) >= 0.9
    assert 4.5 < _number(r"temperature scaling \(temperature ([\d.]+)\)", out) < 6, "about 5"
    ece = _number(r"temperature scaling \(temperature [\d.]+\): test ECE ([\d.]+)", out)
    with_temperature = _number(r"temperature scaling \(temperature [\d.]+\): test ECE [\d.]+ -> ([\d.]+)", out)
    with_platt = _number(r"platt scaling .*: test ECE [\d.]+ -> ([\d.]+)", out)
    assert 0.55 < with_temperature / ece < 0.8, "a temperature lowers the ECE by about a third"
    assert 0 < with_platt < ece / 2, "Platt scaling lowers it by more than half, not to zero"


def _check_05(out: str) -> None:
    assert _number(r"shortcut_strength=1.0: pool ([\d.]+)", out) >= 0.95
    assert _number(r"shortcut_strength=0.0: pool ([\d.]+)", out) <= 0.7
    assert _number(r"split_shift=1.0: .* permutation p = ([\d.]+)", out) <= 0.05
    assert _number(r"split_shift=0.0: .* permutation p = ([\d.]+)", out) > 0.05


def _check_06(out: str) -> None:
    assert "Answer: informative selected in 3 of 3 partitions, random init in 0" in out
    label = r"Answer: label \(classification, auroc\): selected \{'EfficientNet-Lite0 \(ImageNet\)': 3"
    assert re.search(label, out), "the ImageNet encoder should win every partition for the label"
    assert "Answer: the paired interval covers 0: True" in out


def _check_07(out: str) -> None:
    assert "honest run: 7 of 7 complete" in out
    assert ("Answer: item 3 (Threshold rule and where it was fitted) is missing: "
            "threshold fitted on the test split") in out
    assert "Answer: 6 of 7 complete" in out
    assert "Answer: only 1 distinct seed recorded" in out
    assert "Answer: with three seeds and five partitions the item is complete" in out
    assert re.search(r"Answer: threshold effect [\d.]+ balanced accuracy; 2 of 7 items complete", out)


CHECKS: dict[str, Callable[[str], None]] = {
    "exercises_01": _check_01,
    "exercises_02": _check_02,
    "exercises_03": _check_03,
    "exercises_04": _check_04,
    "exercises_05": _check_05,
    "exercises_06": _check_06,
    "exercises_07": _check_07,
}


def test_there_is_one_exercises_page_per_study_notebook() -> None:
    notebooks = sorted(p.stem[:2] for p in (COURSE.parent.parent / "notebooks").glob("[0-9][0-9]_*.py"))
    assert [p.stem.removeprefix("exercises_") for p in PAGES] == notebooks
    assert set(CHECKS) == {p.stem for p in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_page_has_worked_solutions_that_print_an_answer(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Exercises: "), "title the page 'Exercises: ...'"
    solutions = solution_blocks(text)
    assert len(solutions) >= 2, f"{page.name}: {len(solutions)} solution(s), expected at least 2"
    for number, code in enumerate(solutions, 1):
        assert code.strip(), f"{page.name}: solution {number} holds no python code"
        compile(code, f"{page.name} solution {number}", "exec")
        assert 'print(f"Answer:' in code or "print('Answer:" in code or 'print("Answer:' in code, (
            f"{page.name}: solution {number} prints no 'Answer:' line")
    assert ":animate: fade-in" in text


def test_syllabus_links_every_exercises_page_and_chapter() -> None:
    syllabus = (COURSE / "syllabus.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert re.search(r"\{doc\}`(?:[^`<]*<)?" + page.stem + r">?`", syllabus), f"no {{doc}} link to {page.stem}"
    for notebook in sorted((COURSE.parent.parent / "notebooks").glob("[0-9][0-9]_*.py")):
        assert f"../generated/{notebook.stem}" in syllabus, f"the syllabus does not link {notebook.stem}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_solutions_run_and_print_their_answers(page: Path, tmp_path: Path) -> None:
    import json

    solutions = solution_blocks(page.read_text(encoding="utf-8"))
    (tmp_path / "solutions.json").write_text(json.dumps(solutions), encoding="utf-8")
    (tmp_path / "driver.py").write_text(_DRIVER, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "solutions.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S,
    )
    out = result.stdout
    assert result.returncode == 0, f"{page.name}: a solution failed\n{out[-3000:]}\n{result.stderr[-6000:]}"
    parts = re.split(r"^=== solution \d+ ===$", out, flags=re.MULTILINE)[1:]
    assert len(parts) == len(solutions)
    for number, part in enumerate(parts, 1):
        assert re.search(r"^Answer:", part, flags=re.MULTILINE), f"{page.name}: solution {number}: no answer"
    CHECKS[page.stem](out)
    # What a solution's explanation quotes from "our run" must be what the solution prints today
    text = page.read_text(encoding="utf-8")
    explanations, context = solution_explanations(text)
    stale = {number: unaccounted_numbers(explanation, part, context)
             for number, (explanation, part) in enumerate(zip(explanations, parts), 1)}
    stale = {number: numbers for number, numbers in stale.items() if numbers}
    assert not stale, f"{page.name}: numbers the solution text quotes but the solution does not print: {stale}"


def test_the_stale_number_check_finds_a_quoted_number_the_output_lacks() -> None:
    explanation = "In our run the pair shares 0.54 of its neighbours (0.23 with the other; the paper: 0.987)."
    output = "Answer: pair 0.5412; other 0.2349"
    assert unaccounted_numbers(explanation, output, context="The paper reports 0.987.") == []
    assert unaccounted_numbers(explanation, "Answer: pair 0.5512; other 0.2349", context="") == ["0.54"]
    assert unaccounted_numbers(explanation, output, context="") == [], "0.987 is the paper's (crslib.paper)"
    assert unaccounted_numbers("0.544, as exercises 2.3 and 3.2 show", output, context="") == ["0.544"]

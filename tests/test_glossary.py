"""The glossary page and the chapters' links to it: every term a chapter uses is linked where a reader first meets it.

The chapters are jupytext files; their prose is the markdown cells. A term's first occurrence in that prose
(headings and the "Terms used in this chapter" line aside, code spans masked) must sit inside a
``{ref}`text <glossary-...>``` role pointing at the term's entry, and every entry a chapter points at must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "book" / "glossary.md"
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))

#: glossary anchor -> how the term reads in prose (case-insensitive)
TERMS = {
    "glossary-mutual-knn-overlap": r"mutual (?:k-nearest-neighbour|kNN|k-NN|10-NN) overlap",
    "glossary-chance-overlap": r"\bchance(?: level)?\b",
    "glossary-cka": r"\b(?:debiased |linear )?CKA\b",
    "glossary-cknna": r"\bCKNNA\b",
    "glossary-jaccard-knn": r"\bJaccard\b",
    "glossary-mantel-test": r"\bMantel\b",
    "glossary-auroc": r"\bAUROC\b",
    "glossary-delong-test": r"\bDeLong\b",
    "glossary-balanced-accuracy": r"\bbalanced accuracy\b",
    "glossary-youden": r"\bYouden(?:'s J)?\b",
    "glossary-ece": r"\b(?:ECE|expected calibration error)\b",
    "glossary-temperature-scaling": r"\btemperature(?: scaling)?\b",
    "glossary-platt-scaling": r"\bPlatt(?: scaling)?\b",
    "glossary-partition-classifier": r"\bpartition classifier\b",
    "glossary-shortcut": r"\bshortcuts?\b",
    "glossary-locked-validation": r"\blocked validation\b",
    "glossary-feature-union": r"\b(?:feature )?union\b",
    "glossary-approximate-index": r"\b(?:approximate (?:neighbour )?index|HNSW(?:-SQ)?|IVF-PQ)\b",
    "glossary-recall-at-k": r"\brecall@(?:k|10)\b",
    "glossary-procrustes": r"\bProcrustes\b",
    "glossary-linear-map": r"\blinear map\b",
    "glossary-retention": r"\bretention\b",
}

_ROLE_OR_CODE = re.compile(r"\{ref\}`(?P<text>[^`<]*)<(?P<target>[^>`]+)>`|`[^`]*`|\$[^$]*\$|\]\([^)]*\)")


def chapter_prose(source: str) -> str:
    """The markdown cells of a jupytext percent file, comment marks removed, headings and the terms line blanked."""
    cells, current, in_markdown = [], [], False
    for line in source.splitlines():
        if line.startswith("# %%"):
            if in_markdown:
                cells.append("\n".join(current))
            current, in_markdown = [], "[markdown]" in line
            continue
        if in_markdown:
            text = line[2:] if line.startswith("# ") else line.lstrip("#")
            current.append("" if text.startswith("#") or "*Terms used in this chapter*" in text else text)
    if in_markdown:
        cells.append("\n".join(current))
    return "\n\n".join(cells)


def unlinked_first_uses(prose: str) -> dict[str, str]:
    """Term anchor -> the words around its first occurrence, for each term whose first occurrence is not
    inside a ``{ref}`` role to its entry."""
    flat = re.sub(r"\s+", " ", prose)
    roles: list[tuple[int, int, str]] = []
    masked = list(flat)
    for match in _ROLE_OR_CODE.finditer(flat):
        if match["target"]:
            roles.append((match.start(), match.end(), match["target"].strip()))
            # the target name is not prose: blank it so that "glossary-auroc" is not read as the word
            masked[match.start("target"):match.end("target")] = " " * (match.end("target") - match.start("target"))
        else:
            masked[match.start():match.end()] = " " * (match.end() - match.start())
    searchable = "".join(masked)
    problems = {}
    for anchor, pattern in TERMS.items():
        first = re.search(pattern, searchable, flags=re.IGNORECASE)
        if first and not any(start <= first.start() < end and target == anchor for start, end, target in roles):
            problems[anchor] = flat[max(0, first.start() - 40):first.end() + 20]
    return problems


def glossary_anchors() -> set[str]:
    return set(re.findall(r"^\((glossary-[\w-]+)\)=$", GLOSSARY.read_text(encoding="utf-8"), flags=re.MULTILINE))


def test_the_glossary_defines_every_term_the_issue_names_and_the_chapters_use() -> None:
    anchors = glossary_anchors()
    assert set(TERMS) <= anchors, f"terms without a glossary entry: {sorted(set(TERMS) - anchors)}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_term_is_linked_to_the_glossary_where_the_chapter_first_uses_it(chapter: Path) -> None:
    problems = unlinked_first_uses(chapter_prose(chapter.read_text(encoding="utf-8")))
    assert not problems, f"{chapter.name}: first use not linked to the glossary: {problems}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_glossary_link_of_a_chapter_points_at_an_entry(chapter: Path) -> None:
    targets = set(re.findall(r"<(glossary-[\w-]+)>`", chapter.read_text(encoding="utf-8")))
    missing = sorted(targets - glossary_anchors())
    assert not missing, f"{chapter.name}: links to missing entries {missing}"


def test_the_first_use_check_finds_an_unlinked_term_and_accepts_a_linked_one() -> None:
    assert unlinked_first_uses("The {ref}`AUROC <glossary-auroc>` rose; the AUROC of `auroc` fell.") == {}
    found = unlinked_first_uses("The AUROC rose; later the {ref}`AUROC <glossary-auroc>` fell.")
    assert list(found) == ["glossary-auroc"]
    # a link to the wrong entry does not count, and a term in a code span is not a use
    assert "glossary-auroc" in unlinked_first_uses("The {ref}`AUROC <glossary-ece>` and `AUROC`.")
    assert unlinked_first_uses("the `shortcut` knob") == {}


def test_the_glossary_defines_the_books_own_words_and_names_each_public_model_by_what_it_is() -> None:
    anchors = glossary_anchors()
    assert {"glossary-phantom", "glossary-model-zoo", "glossary-public-models", "glossary-verdicts"} <= anchors
    text = GLOSSARY.read_text(encoding="utf-8")
    for word in ("*held*", "*not held*", "*reversed*", "*inconclusive*", "*not evaluated*", "equivalence margin"):
        assert word in text, word
    assert "fine-tuned to detect NSFW" in text and "EfficientNet-Lite1" in text
    # no chapter calls the pair "two ImageNet networks" without saying what Open-NSFW is
    for chapter in CHAPTERS:
        prose = chapter_prose(chapter.read_text(encoding="utf-8"))
        if "Open-NSFW" in prose:
            assert "fine-tuned to detect NSFW" in re.sub(r"\s+", " ", prose), chapter.name
        assert "two ImageNet networks" not in prose, chapter.name


def test_no_page_source_shows_a_placeholder_repository_url() -> None:
    """The API and CLI pages render docstrings and --help: none may show a made-up github.com address."""
    sources = [*ROOT.glob("crslib/**/*.py"), *ROOT.glob("book/**/*.md"), ROOT / "README.md", *CHAPTERS]
    found = [str(p.relative_to(ROOT)) for p in sources if re.search(r"github\.com/(?:ORG|OWNER|USER)/", p.read_text())]
    assert not found, found

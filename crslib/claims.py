"""The claims ledger: each claim of the three studies, what a run measured, and whether it held.

Every quantitative or directional claim of the three studies becomes one
:class:`ClaimVerdict`: the claim in the project's words, the paper's number
(from :mod:`crslib.paper`), the quantity a run measured (read from the run
folder's result tables), a decision rule fixed here in advance, and the
verdict. Rules use the uncertainty the run already computed (patient-grouped
bootstrap intervals, permutation p-values) wherever the tables carry it.

Verdicts
--------
``held``
    The run's number satisfies the rule, beyond its interval where it has one.
``not held``
    The rule fails; also a directional claim whose estimate points the other
    way while its interval still includes the bound.
``reversed``
    The run shows the opposite direction, beyond its interval.
``inconclusive``
    The interval straddles the rule's bound and the estimate points the
    claim's way (or an "at chance" claim whose interval includes chance but
    is wider than the equivalence margin).
``not evaluated``
    The run lacks what the rule needs, or a step it rests on failed a sanity
    check (a fine-tuning at chance, a model that did not learn); ``reason``
    says what. Never an exception.

Examples
--------
>>> import tempfile
>>> with tempfile.TemporaryDirectory() as run:
...     ledger = build_ledger(run)
>>> len(ledger.verdicts) == len(CLAIM_IDS)
True
>>> {v.verdict for v in ledger.verdicts}
{'not evaluated'}
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib._io import JsonResult
from crslib.paper import STUDIES
from crslib.claim_rules import (
    EQUIVALENCE_MARGIN,
    MEASURE_COLUMNS,
    RULES,
    STATISTICS,
    NotEvaluated,
    Outcome,
    Tables,
    effect_origin,
)
from crslib.errors import InputError

__all__ = ["VERDICTS", "CLAIM_IDS", "CHAPTERS", "MEASURE_COLUMNS", "ClaimVerdict", "Ledger", "build_ledger",
           "measures_frame", "render_claims_page", "verdict_label"]

VERDICTS = ("held", "not held", "reversed", "inconclusive", "not evaluated")
#: Chapter folder names (``results/<chapter>/``) and their titles.
CHAPTERS = {
    "02_agreement": "Agreement between encoders",
    "03_transfer": "Transferring classifiers between encoders",
    "04_protocol_sensitivity": "Protocol sensitivity",
    "05_split_and_shortcut_audit": "Split and shortcut audit",
    "06_representation_risk": "Representation risk",
}
_COLOURS = {"held": ("#1b5e20", "#e8f5e9"), "not held": ("#8a1c1c", "#fdecea"), "reversed": ("#6a1b9a", "#f3e5f5"),
            "inconclusive": ("#7a5200", "#fff4e0"), "not evaluated": ("#424242", "#eeeeee")}


@dataclass(frozen=True)
class ClaimVerdict:
    """One claim of a study, this run's measurement and the verdict.

    Attributes
    ----------
    id, study, chapter : str
        Ledger id, study key (:data:`crslib.paper.STUDIES`) and the chapter that measures it.
    claim : str
        The claim in the project's words.
    paper_value : str
        What the paper reports (its numbers, quoted as the paper's).
    run_value : float or None
        This run's number (None when not evaluated).
    interval : tuple of float or None
        Its interval where the run computed one.
    rule : str
        The decision rule, fixed before the run.
    verdict : str
        One of :data:`VERDICTS`.
    reason : str
        The verdict in a sentence built from this run's numbers.
    differs : str
        What in a run may differ from the study; shown when the verdict is ``not held`` or ``reversed``.
    statistic : str
        What ``run_value`` is, with its unit (:data:`crslib.claim_rules.STATISTICS`).
    interval_kind : str
        What ``interval`` is: ``"95% CI"`` or a range over models or pairs.
    origin : str
        Whether the effect was planted in the chapter's data (:func:`crslib.claim_rules.effect_origin`):
        ``"planted (shift=0.5)"``, ``"emerged"``, ``"your data"``; "" when the run folder
        does not say which data the chapter studied.
    control : str
        The same rule on the chapter's null-phantom control (``"null phantom: 0.509, not held"``), or "".
    """

    id: str
    study: str
    chapter: str
    claim: str
    paper_value: str
    run_value: float | None
    interval: tuple[float, float] | None
    rule: str
    verdict: str
    reason: str
    differs: str
    statistic: str = ""
    interval_kind: str = "95% CI"
    origin: str = ""
    control: str = ""

    def sentence(self) -> str:
        """The claim, the paper's number, this run's number and the verdict, as plain text."""
        text = f"{self.claim} (paper: {self.paper_value}). This run: {self.verdict}. {_as_sentence(self.reason)}"
        if self.verdict in ("not held", "reversed") and self.differs:
            text += f" Why this run may differ: {_as_sentence(self.differs)}"
        return text


@dataclass(frozen=True)
class Ledger(JsonResult):
    """The ledger of one run folder: one :class:`ClaimVerdict` per claim.

    Attributes
    ----------
    verdicts : tuple of ClaimVerdict
    source : str
        The results folder the ledger was read from.
    """

    verdicts: tuple[ClaimVerdict, ...]
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"source": ..., "claims": [one object per claim]}``."""
        claims = []
        for verdict in self.verdicts:
            row = asdict(verdict)
            row["run_value"] = _finite(row["run_value"])
            row["interval"] = None if verdict.interval is None else [_finite(x) for x in verdict.interval]
            claims.append(row)
        return {"source": self.source, "claims": claims}

    def to_frame(self) -> pd.DataFrame:
        """One row per claim, indexed by id."""
        return pd.DataFrame([asdict(v) for v in self.verdicts]).set_index("id")

    def chapter(self, chapter: str) -> tuple[ClaimVerdict, ...]:
        """The claims a chapter measures (``"02_agreement"`` or ``"02"``)."""
        key = _chapter_key(chapter)
        return tuple(v for v in self.verdicts if v.chapter == key)

    def counts(self) -> dict[str, int]:
        """How many claims got each verdict."""
        return {name: sum(v.verdict == name for v in self.verdicts) for name in VERDICTS}

    def to_markdown(self, *, links: bool = False, labels: bool = False, study: str | None = None) -> str:
        """The ledger (or one ``study``'s claims, without the study column) as a Markdown table.

        ``links`` links each claim to its chapter's box in the book; ``labels`` shows each verdict as a
        coloured HTML label (with its word) instead of the plain word.
        """
        head = ["id", "study", "claim", "paper", "this run", "in the data", "verdict"]
        if study is not None:
            head.remove("study")
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for v in self.verdicts:
            if study is not None and v.study != study:
                continue
            claim = _md(v.claim)
            if links:
                claim = f"[{claim}]({v.chapter}.ipynb#what-this-run-shows)"
            cells = [v.id if labels else f"`{v.id}`", v.study, claim, _md(v.paper_value), _md(_run_text(v)),
                     _md("; ".join(x for x in (v.origin, v.control) if x) or "—"),
                     verdict_label(v.verdict) if labels else v.verdict]
            if study is not None:
                del cells[1]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def chapter_html(self, chapter: str) -> str:
        """A chapter's *What this run shows* box: one sentence per claim, every string escaped."""
        items = []
        for v in self.chapter(chapter):
            text = (f"{html.escape(v.claim)} (paper: {html.escape(v.paper_value)}). "
                    f"{html.escape(_as_sentence(v.reason))}")
            if v.origin:
                text += f" In the data: {html.escape('; '.join(x for x in (v.origin, v.control) if x))}."
            if v.verdict in ("not held", "reversed") and v.differs:
                text += f" <em>Why this run may differ:</em> {html.escape(_as_sentence(v.differs))}"
            items.append(f"<li>{verdict_label(v.verdict)} {text}</li>")
        if not items:
            return "<div class='crs-claims'><p>This chapter measures no claim of the studies.</p></div>"
        return ("<div class='crs-claims' style='border:1px solid #bbb;border-radius:6px;padding:0.6em 1em'>"
                f"<ul style='margin:0'>{''.join(items)}</ul></div>")


def render_claims_page(ledger: Ledger, *, run_id: str = "") -> str:
    """The book's *Claims at a glance* page (MyST Markdown) for a run's ledger."""
    counts = ledger.counts()
    summary = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
    lines = [
        "# Claims at a glance", "",
        "Each row is one claim of the three studies: what the paper reports (its numbers, measured on its own "
        "data and models), what this build measured"
        + (f" (run `{html.escape(run_id)}`)" if run_id else "")
        + ", and the verdict of a decision rule fixed in `crslib.claims` before any run. A verdict says whether "
        "this run, with its data and models, shows the same thing; on the embedded phantom data it tests the "
        "method, not the studies' numbers.", "",
        f"Of {len(ledger.verdicts)} claims: {summary}.", "",
    ]
    for study, title in STUDIES.items():
        if any(v.study == study for v in ledger.verdicts):
            lines += [f"## {title[0].upper()}{title[1:]}", "", ledger.to_markdown(links=True, labels=True, study=study),
                      ""]
    lines += [
        "## Reading the verdicts", "",
        "*In the data* says, for a run on the phantom, whether the claim's effect was built into the data (the "
        "phantom parameter that plants it, e.g. `shift=0.5`) or *emerged* from the models and the analysis; "
        "where the chapter also studied a null phantom without the effect, the same rule's result on it follows. "
        "On your own data it says *your data*.", "",
        "*held*: the rule is met, beyond the interval where the run has one; *not held*: it is "
        "not, or the estimate points the other way; *reversed*: the run shows the opposite direction beyond the "
        "interval; *inconclusive*: the interval includes the rule's bound while the estimate points the claim's "
        "way (a claim that something is at chance needs its whole interval within chance +- "
        f"{EQUIVALENCE_MARGIN:.2f}); *not evaluated*: the run lacks what the rule needs, or a step it rests on "
        "failed (a fine-tuning at chance), and the chapter's box says which. Each chapter "
        "ends with a *What this run shows* box that gives every verdict in a sentence with its numbers and, "
        "where a claim did not hold, what in the run differs from the study.", "",
        "The same ledger for any run folder, on your own data and models: `crs claims RUN_DIR` (add "
        "`--json FILE` or `--markdown FILE`).", "",
    ]
    return "\n".join(lines)


def _as_sentence(text: str) -> str:
    """Capitalised and ending with a full stop (reasons are built from clauses)."""
    text = text.strip()
    if not text:
        return text
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def verdict_label(verdict: str) -> str:
    """A verdict as a coloured label that carries its word (never colour alone)."""
    colour, background = _COLOURS.get(verdict, ("#000", "#fff"))
    return (f"<span class='crs-verdict' style='color:{colour};background:{background};border:1px solid {colour};"
            f"border-radius:3px;padding:0 0.3em;white-space:nowrap'>{html.escape(verdict)}</span>")


def measures_frame(rows: list[tuple[str, float, float | None, float | None, str]]) -> pd.DataFrame:
    """A chapter's ``measures.csv``: (quantity, value, low, high, detail) rows.

    Examples
    --------
    >>> measures_frame([("chance", 0.02, None, None, "k/(N-1)")]).columns.tolist()
    ['quantity', 'value', 'low', 'high', 'detail']
    """
    frame = pd.DataFrame(rows, columns=MEASURE_COLUMNS)
    if frame["quantity"].duplicated().any():
        raise InputError("each measured quantity may appear once")
    return frame


@dataclass(frozen=True)
class _Claim:
    id: str
    study: str
    chapter: str
    claim: str
    paper_value: str
    rule: str
    evaluate: Callable[[Tables], Outcome]
    differs: str


def build_ledger(run_dir: str | os.PathLike) -> Ledger:
    """The claims ledger of a run folder.

    Parameters
    ----------
    run_dir : path
        A run folder (holding ``results/``), or its ``results/`` folder itself,
        from ``crs book`` or from the CLI.

    Returns
    -------
    Ledger
        One verdict per claim in :data:`CLAIM_IDS` order; a claim whose table
        is missing is ``not evaluated`` with the reason.

    Raises
    ------
    InputError
        If ``run_dir`` is not a folder.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise InputError(f"run folder {str(run_dir)!r} does not exist or is not a folder")
    results = root / "results" if (root / "results").is_dir() else root
    tables, controls = Tables(results), Tables(results, data_index=1)
    data = _chapter_data(root)
    verdicts = []
    for spec in _CLAIMS:
        outcome = _evaluate(spec.evaluate, tables)
        origin = effect_origin(spec.id, data.get(spec.chapter, ""))
        verdicts.append(ClaimVerdict(spec.id, spec.study, spec.chapter, spec.claim, spec.paper_value,
                                     outcome.value, outcome.interval, spec.rule, outcome.verdict, outcome.reason,
                                     spec.differs, STATISTICS.get(spec.id, ""), outcome.interval_kind, origin,
                                     _control_text(spec.evaluate, controls) if origin.startswith("planted") else ""))
    return Ledger(tuple(verdicts), str(results))


def _evaluate(rule: Callable[[Tables], Outcome], tables: Tables) -> Outcome:
    try:
        return rule(tables)
    except NotEvaluated as exc:
        return Outcome(None, None, "not evaluated", str(exc))


def _control_text(rule: Callable[[Tables], Outcome], controls: Tables) -> str:
    """The rule on the chapter's null-phantom control data: its number and verdict, or "" when there is none."""
    outcome = _evaluate(rule, controls)
    if outcome.verdict == "not evaluated" or outcome.value is None:
        return ""
    return f"null phantom: {outcome.value:.3f}, {outcome.verdict}"


def _chapter_data(root: Path) -> dict[str, str]:
    """The ``data`` parameter of each chapter of a run folder (its ``run.json``); {} without one."""
    try:
        run = json.loads((root / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    notebooks = run.get("notebooks", []) if isinstance(run, dict) else []
    return {str(n.get("name")): str(n.get("parameters", {}).get("data") or "") for n in notebooks
            if isinstance(n, dict) and isinstance(n.get("parameters"), dict)}


def _finite(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _md(text: str) -> str:
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def _run_text(v: ClaimVerdict) -> str:
    if v.run_value is None or not np.isfinite(v.run_value):
        return "—"
    label = f"{v.statistic} " if v.statistic else ""
    if v.interval is None and float(v.run_value).is_integer():
        return f"{label}{int(v.run_value)}"  # a count (tasks, encoders)
    text = f"{label}{v.run_value:.3f}"
    if v.interval is not None and all(np.isfinite(v.interval)):
        text += f" ({v.interval_kind} {v.interval[0]:.3f} to {v.interval[1]:.3f})"
    return text


def _chapter_key(chapter: str) -> str:
    matches = [key for key in CHAPTERS if key == chapter or key.split("_")[0] == chapter]
    if not matches:
        raise InputError(f"unknown chapter {chapter!r}; known: {', '.join(CHAPTERS)}")
    return matches[0]


_CLAIMS: tuple[_Claim, ...] = tuple(_Claim(**spec) for spec in RULES)
#: Every claim's id, in ledger order.
CLAIM_IDS: tuple[str, ...] = tuple(c.id for c in _CLAIMS)
if len(set(CLAIM_IDS)) != len(CLAIM_IDS):
    raise ValueError("duplicate claim id")  # a typo in claim_rules, not a user error

"""The seven-item reporting checklist of study 2 and its crosswalk.

Study 2 (protocol sensitivity on Kermany pediatric chest radiographs) ends in
seven reporting recommendations, each tied to an effect the paper measured:
split provenance and shift audit, training policy, threshold rule, metrics
beyond AUROC, calibration, uncertainty, and shortcut checks. This module turns
the evidence one book run recorded into that checklist: for every item it says
whether the run recorded what the item needs (``complete``) or not
(``missing``, with the reasons), puts the effect measured in this run beside
the paper's number, and maps the item to the nearest items of CLAIM 2024,
TRIPOD+AI, MI-CLAIM and DOME (:data:`ITEMS`, :data:`CROSSWALK_SOURCES`).

The module is pure: a mapping in, a :class:`Checklist` out, and strings or
DataFrames from it. It reads no files; another module merges the notebooks'
evidence files into the mapping passed to :func:`build_checklist`.

Evidence schema
---------------
``evidence`` maps an item id to a mapping of recorded fields. Item ids, in
checklist order: ``"split"``, ``"training_policy"``, ``"threshold"``,
``"metrics"``, ``"calibration"``, ``"uncertainty"``, ``"shortcut"``. An item
that is absent (or ``None``) was not recorded by the run. Other ids are kept
under :attr:`Checklist.extra` with a logged warning.

Every item needs an ``"effect"`` entry, the effect this run measured::

    {"description": str,        # what was measured
     "value": float,            # finite
     "unit": str,               # "AUROC", "balanced accuracy", "AUC", ...
     "source": str,             # which notebook or result table
     "paper": float or None,    # optional: the paper's value for comparison
     "low": float, "high": float}  # optional: its confidence interval

An *interval* below is a mapping ``{"estimate": float, "low": float,
"high": float}`` with finite values in [0, 1] and ``low <= high``.

================  ============================================================
item              required fields (besides ``effect``)
================  ============================================================
split             ``provenance`` (str); ``patients_disjoint`` (bool, must be
                  True); ``partition_auc`` (interval). Optional:
                  ``confidence``; ``leakage`` (counts of duplicates and
                  person numbers across pool and test, or "not measured")
training_policy   ``policies_compared`` (list of str containing "frozen" and
                  "finetuned"); ``reported_policy`` (str)
threshold         ``rule`` (str); ``fitted_on`` (str, not the test split)
metrics           ``reported`` (list of str including "balanced_accuracy" and
                  at least one metric other than "auroc")
calibration       ``method`` (str); ``fitted_on`` (str, not the test split);
                  ``ece_before``, ``ece_after`` (float in [0, 1])
uncertainty       ``confidence`` (float in (0, 1)); ``n_resamples`` (int > 0);
                  ``resampling`` (str); ``seeds`` (list of at least 2 distinct
                  seeds); ``split_level`` (non-empty mapping, e.g.
                  ``{"n_partitions": 5, "spread": 0.03}``)
shortcut          ``pool_balanced_accuracy``, ``test_balanced_accuracy``
                  (intervals); ``features`` (non-empty list of str: the file
                  properties used)
================  ============================================================

An item is complete only when every required field is present, not None, not
NaN and passes its check; otherwise it is missing and its ``problems`` say what
is missing or wrong. A run that did not record what an item needs therefore
shows it as missing, never as complete. Fields beyond the required ones are
kept and shown.

The numbers quoted in :attr:`ChecklistItemSpec.paper_effect` are the paper's
(study 2), not this run's; every rendering labels them as the paper's.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from crslib._io import json_ready
from crslib.checklist_items import (
    GUIDELINES,
    ITEM_IDS,
    ITEMS,
    ChecklistItemSpec,
)
from crslib.errors import InputError

log = logging.getLogger(__name__)

__all__ = [
    "ChecklistEntry",
    "item_concern",
    "Checklist",
    "build_checklist",
    "crosswalk_frame",
]

COMPLETE = "complete"
MISSING = "missing"

_SPECS = {spec.item_id: spec for spec in ITEMS}


# --------------------------------------------------------------------------- field checks


class _Bad(Exception):
    """A recorded value fails its check; the message is the problem."""


def _is_nan(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isnan(float(value))


def _fmt(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(name: str, value: Any, *, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Bad(f"{name} must be a number, got {_fmt(value)}")
    x = float(value)
    if math.isnan(x):
        raise _Bad(f"{name} is NaN; record a finite value")
    if math.isinf(x):
        raise _Bad(f"{name} is infinite; record a finite value")
    if (low is not None and x < low) or (high is not None and x > high):
        raise _Bad(f"{name} must be between {low} and {high}, got {x}")
    return x


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"{name} must be a non-empty string, got {_fmt(value)}")
    return value


def _str_list(name: str, value: Any) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _Bad(f"{name} must be a list of strings, got {_fmt(value)}")
    if not value:
        raise _Bad(f"{name} is empty; list at least one entry")
    bad = [v for v in value if not isinstance(v, str) or not v.strip()]
    if bad:
        raise _Bad(f"{name} must contain only non-empty strings, got {_fmt(bad[0])}")
    return list(value)


def _interval(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise _Bad(f"{name} must be a mapping with estimate, low and high, got {_fmt(value)}")
    absent = [k for k in ("estimate", "low", "high") if value.get(k) is None]
    if absent:
        raise _Bad(f"{name} lacks {', '.join(absent)}; record estimate, low and high")
    _, lo, hi = (_number(f"{name}.{k}", value[k], low=0.0, high=1.0) for k in ("estimate", "low", "high"))
    if lo > hi:
        raise _Bad(f"{name}.low ({lo}) is above {name}.high ({hi})")


def _key(text: str) -> str:
    """Normalised token: lower case, letters and digits only ('Fine-tuned' -> 'finetuned')."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


_TEST_NAMES = {"test", "testset", "testsplit", "testing", "officialtest", "officialtestset", "officialtestsplit"}


def _not_test(name: str, value: Any, reason: str) -> None:
    _text(name, value)
    if _key(value) in _TEST_NAMES:
        raise _Bad(reason)


def _find_nan(value: Any, path: str) -> str | None:
    """Path of the first NaN inside nested mappings and lists, or None."""
    if _is_nan(value):
        return path
    if isinstance(value, Mapping):
        for k, v in value.items():
            hit = _find_nan(v, f"{path}.{k}")
            if hit:
                return hit
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            hit = _find_nan(v, f"{path}[{i}]")
            if hit:
                return hit
    return None


def _check_patients(value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise _Bad(f"patients_disjoint must be True or False, got {_fmt(value)}")
    if not bool(value):
        raise _Bad("a patient appears in more than one split")


def _check_policies(value: Any) -> None:
    keys = {_key(v) for v in _str_list("policies_compared", value)}
    lacking = [p for p in ("frozen", "finetuned") if p not in keys]
    if lacking:
        raise _Bad(f"policies_compared lacks {' and '.join(repr(p) for p in lacking)}; compare frozen and finetuned")


def _check_reported_metrics(value: Any) -> None:
    keys = {_key(v) for v in _str_list("reported", value)}
    if "balancedaccuracy" not in keys:  # a threshold-dependent metric beside AUROC
        raise _Bad("reported metrics lack 'balanced_accuracy'")


def _check_seeds(value: Any) -> None:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _Bad(f"seeds must be a list of seeds, got {_fmt(value)}")
    nan = _find_nan(list(value), "seeds")
    if nan:
        raise _Bad(f"{nan} is NaN; record the seeds used")
    # json_ready turns any seed into plain JSON (str as the last resort), so this cannot fail
    n_distinct = len({json.dumps(json_ready(v), sort_keys=True) for v in value})
    if n_distinct < 2:
        raise _Bad(f"only {n_distinct} distinct seed recorded; run at least 2 seeds")


def _check_split_level(value: Any) -> None:
    if not isinstance(value, Mapping):
        raise _Bad(f"split_level must be a mapping such as {{'n_partitions': 5, 'spread': 0.03}}, got {_fmt(value)}")
    if not value:
        raise _Bad("split_level is empty; record the spread over several splits")
    nan = _find_nan(value, "split_level")
    if nan:
        raise _Bad(f"{nan} is NaN; record a finite value")


def _check_n_resamples(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise _Bad(f"n_resamples must be an integer > 0, got {_fmt(value)}")


_CHECKS: dict[str, dict[str, Any]] = {
    "split": {
        "provenance": lambda v: _text("provenance", v),
        "patients_disjoint": _check_patients,
        "partition_auc": lambda v: _interval("partition_auc", v),
    },
    "training_policy": {
        "policies_compared": _check_policies,
        "reported_policy": lambda v: _text("reported_policy", v),
    },
    "threshold": {
        "rule": lambda v: _text("rule", v),
        "fitted_on": lambda v: _not_test("fitted_on", v, "threshold fitted on the test split"),
    },
    "metrics": {
        "reported": _check_reported_metrics,
    },
    "calibration": {
        "method": lambda v: _text("method", v),
        "fitted_on": lambda v: _not_test("fitted_on", v, "calibration fitted on the test split"),
        "ece_before": lambda v: _number("ece_before", v, low=0.0, high=1.0),
        "ece_after": lambda v: _number("ece_after", v, low=0.0, high=1.0),
    },
    "uncertainty": {
        "confidence": lambda v: _check_confidence(v),
        "n_resamples": _check_n_resamples,
        "resampling": lambda v: _text("resampling", v),
        "seeds": _check_seeds,
        "split_level": _check_split_level,
    },
    "shortcut": {
        "pool_balanced_accuracy": lambda v: _interval("pool_balanced_accuracy", v),
        "test_balanced_accuracy": lambda v: _interval("test_balanced_accuracy", v),
        "features": lambda v: _str_list("features", v),
    },
}


def _check_confidence(value: Any) -> None:
    x = _number("confidence", value)
    if not 0.0 < x < 1.0:
        raise _Bad(f"confidence must be between 0 and 1 exclusive (e.g. 0.95), got {x}")


def _check_effect(value: Any) -> list[str]:
    if not isinstance(value, Mapping):
        return [f"effect must be a mapping with description, value, unit and source, got {_fmt(value)}"]
    problems = []
    for key, check in (
        ("description", lambda v: _text("effect.description", v)),
        ("value", lambda v: _number("effect.value", v)),
        ("unit", lambda v: _text("effect.unit", v)),
        ("source", lambda v: _text("effect.source", v)),
    ):
        if value.get(key) is None:
            problems.append(f"effect.{key} not recorded")
            continue
        try:
            check(value[key])
        except _Bad as exc:
            problems.append(str(exc))
    if value.get("paper") is not None:
        try:
            _number("effect.paper", value["paper"])
        except _Bad as exc:
            problems.append(str(exc))
    lo, hi = value.get("low"), value.get("high")
    if lo is not None or hi is not None:
        try:
            if lo is None or hi is None:
                raise _Bad("effect has only one of low and high; record both or neither")
            if _number("effect.low", lo) > _number("effect.high", hi):
                raise _Bad(f"effect.low ({lo}) is above effect.high ({hi})")
        except _Bad as exc:
            problems.append(str(exc))
    return problems


def _assess(spec: ChecklistItemSpec, recorded: Mapping[str, Any] | None) -> list[str]:
    """Problems that keep the item from being complete (empty when complete)."""
    if recorded is None:
        return [f"not recorded in this run (needs {', '.join(spec.required)})"]
    problems: list[str] = []
    for name in spec.required:
        value = recorded.get(name)
        if name == "effect":
            problems.extend(["no measured effect recorded"] if value is None else _check_effect(value))
            continue
        if value is None:
            problems.append(f"{name} not recorded")
            continue
        if _is_nan(value):
            problems.append(f"{name} is NaN; record a finite value")
            continue
        try:
            _CHECKS[spec.item_id][name](value)
        except _Bad as exc:
            problems.append(str(exc))
    return problems


# --------------------------------------------------------------------------- results


@dataclass
class ChecklistEntry:
    """One checklist item as recorded by a run.

    Attributes
    ----------
    number : int
    item_id : str
    title : str
    status : {"complete", "missing"}
    problems : list of str
        Why the item is missing (empty when complete).
    fields : dict
        Everything recorded for the item except ``effect``, unknown fields included.
    effect : dict or None
        The effect measured in this run, as recorded.
    paper_effect : str
        The paper's effect, labelled as the paper's.
    crosswalk : dict of str to tuple of str
    what_to_report : str
    paper_value : float or None
    paper_unit : str
    concern : str
        What the recorded evidence shows to be a problem (e.g. a shortcut found), by a rule fixed in
        :func:`item_concern`; empty when none. An item can be complete (reported) and still a concern.
    """

    number: int
    item_id: str
    title: str
    status: str
    problems: list[str]
    fields: dict[str, Any]
    effect: dict[str, Any] | None
    paper_effect: str
    crosswalk: dict[str, tuple[str, ...]]
    what_to_report: str = ""
    paper_value: float | None = None
    paper_unit: str = ""
    concern: str = ""

    @property
    def complete(self) -> bool:
        return self.status == COMPLETE

    @property
    def effect_value(self) -> float | None:
        """The measured effect as a finite float, or None."""
        if not isinstance(self.effect, Mapping):
            return None
        value = self.effect.get("value")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            return None
        return float(value)

    def to_dict(self) -> dict[str, Any]:
        return json_ready(
            {
                "number": self.number,
                "item_id": self.item_id,
                "title": self.title,
                "status": self.status,
                "problems": list(self.problems),
                "fields": self.fields,
                "effect": self.effect,
                "paper_effect": self.paper_effect,
                "paper_value": self.paper_value,
                "paper_unit": self.paper_unit,
                "what_to_report": self.what_to_report,
                "concern": self.concern,
                "crosswalk": {k: list(v) for k, v in self.crosswalk.items()},
            }
        )


@dataclass
class Checklist:
    """The seven-item checklist of one run.

    Attributes
    ----------
    run_id : str or None
    items : list of ChecklistEntry
        The seven items, in order 1..7.
    extra : dict
        Evidence under ids that are not checklist items, kept as recorded.
    """

    run_id: str | None
    items: list[ChecklistEntry]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_complete(self) -> int:
        return sum(entry.complete for entry in self.items)

    @property
    def n_missing(self) -> int:
        return sum(not entry.complete for entry in self.items)

    def __getitem__(self, item_id: str) -> ChecklistEntry:
        for entry in self.items:
            if entry.item_id == item_id:
                return entry
        raise KeyError(f"no checklist item {item_id!r}; items are {', '.join(ITEM_IDS)}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN and infinities become None).

        Examples
        --------
        >>> d = build_checklist({}, run_id="demo").to_dict()
        >>> d["run_id"], d["n_missing"], [i["number"] for i in d["items"]]
        ('demo', 7, [1, 2, 3, 4, 5, 6, 7])
        """
        return {
            "run_id": self.run_id,
            "n_complete": self.n_complete,
            "n_missing": self.n_missing,
            "items": [entry.to_dict() for entry in self.items],
            "extra": json_ready(self.extra),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The checklist as JSON text (strict JSON: no NaN)."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)

    def to_markdown(self) -> str:
        """The checklist as a Markdown section.

        One numbered section per item with its status ("✅ reported",
        "⚠️ reported, with a concern: ..." or "❌ missing: ..."), the effect measured in this run beside the
        paper's number (labelled as the paper's), what was recorded and the
        crosswalk to CLAIM 2024, TRIPOD+AI, MI-CLAIM and DOME.

        Examples
        --------
        >>> md = build_checklist({}, run_id="demo").to_markdown()
        >>> md.splitlines()[0]
        '# Reporting checklist (run demo)'
        >>> "❌ missing" in md and "**Paper:** a partition classifier" in md
        True
        """
        title = "# Reporting checklist" + (f" (run {_oneline(self.run_id)})" if self.run_id else "")
        lines = [
            title,
            "",
            f"{self.n_complete} of {len(self.items)} items complete. Numbers marked *Paper* are the "
            "paper's (study 2), not this run's.",
        ]
        for entry in self.items:
            badge = ("❌ missing: " + "; ".join(entry.problems) if not entry.complete
                     else f"⚠️ reported, with a concern: {entry.concern}" if entry.concern else "✅ reported")
            lines += ["", f"## {entry.number}. {entry.title}", "", f"**Status:** {_oneline(badge)}", ""]
            lines.append(f"- **What to report:** {entry.what_to_report}")
            lines.append(f"- **Measured in this run:** {_describe_effect(entry.effect)}")
            lines.append(f"- {_paper_line(entry.paper_effect)}")
            if entry.fields:
                recorded = "; ".join(f"{k}: {_show(v)}" for k, v in entry.fields.items())
                lines.append(f"- **Recorded:** {_oneline(recorded)}")
            walk = " · ".join(f"{g}: {_join_ids(ids)}" for g, ids in entry.crosswalk.items())
            lines.append(f"- **Crosswalk:** {walk}")
        if self.extra:
            lines += ["", "## Other evidence", ""]
            lines += [f"- **{_oneline(k)}:** {_oneline(_show(v))}" for k, v in self.extra.items()]
        return "\n".join(lines) + "\n"

    def to_frame(self) -> pd.DataFrame:
        """One row per item: number, item, title, status, effect_value,
        effect_unit, paper_value, problems (joined with "; ").

        Examples
        --------
        >>> frame = build_checklist({}).to_frame()
        >>> list(frame["item"])[:3], set(frame["status"])
        (['split', 'training_policy', 'threshold'], {'missing'})
        """
        rows = [
            {
                "number": e.number,
                "item": e.item_id,
                "title": e.title,
                "status": e.status,
                "effect_value": e.effect_value,
                "effect_unit": e.effect.get("unit") if isinstance(e.effect, Mapping) else None,
                "paper_value": e.paper_value,
                "problems": "; ".join(e.problems),
                "concern": e.concern,
            }
            for e in self.items
        ]
        frame = pd.DataFrame(rows)
        frame["effect_value"] = frame["effect_value"].astype(float)
        frame["paper_value"] = frame["paper_value"].astype(float)
        return frame


def _join_ids(ids: tuple[str, ...]) -> str:
    return ("; " if any(" " in i for i in ids) else ", ").join(ids)


def _paper_line(paper_effect: str) -> str:
    """'Paper: ...' with the label in bold; other text is labelled as the paper's."""
    head, sep, rest = paper_effect.partition(":")
    if sep and head.strip().lower() == "paper":
        return f"**Paper:**{rest}"
    return f"**Paper:** {paper_effect}"


def _oneline(text: Any) -> str:
    return " ".join(str(text).split())


def _num(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return _oneline(x)
    x = float(x)
    return "NaN" if math.isnan(x) else f"{x:.3g}" if abs(x) >= 1000 or (x != 0 and abs(x) < 0.001) else f"{x:.3f}"


def _show(value: Any) -> str:
    if isinstance(value, Mapping) and {"estimate", "low", "high"} <= set(value):
        return f"{_num(value['estimate'])} [{_num(value['low'])}, {_num(value['high'])}]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_show(v) for v in value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        return _num(value)
    return _oneline(value)


def _describe_effect(effect: Any) -> str:
    if not isinstance(effect, Mapping):
        return "nothing recorded"
    parts = []
    if effect.get("description"):
        parts.append(f"{_oneline(effect['description'])}:")
    parts.append(_num(effect.get("value")))
    if effect.get("unit"):
        parts.append(_oneline(effect["unit"]))
    if effect.get("low") is not None and effect.get("high") is not None:
        parts.append(f"(CI {_num(effect['low'])} to {_num(effect['high'])})")
    if effect.get("paper") is not None:
        parts.append(f"(paper: {_num(effect['paper'])})")
    if effect.get("source"):
        parts.append(f"— source: {_oneline(effect['source'])}")
    return " ".join(parts)


# --------------------------------------------------------------------------- build


def build_checklist(evidence: Mapping[str, Mapping[str, Any]], *, run_id: str | None = None) -> Checklist:
    """Assess a run's evidence against the seven checklist items.

    Parameters
    ----------
    evidence : mapping of item id to mapping
        What the run recorded, per item (schema in the module docstring). An
        absent item, or one mapped to None, was not recorded.
    run_id : str, optional
        Identifier of the run, shown in the renderings.

    Returns
    -------
    Checklist
        Seven entries in order; each ``complete`` only when every required
        field is present, finite and passes its check. Evidence under unknown
        ids is kept in ``extra`` (with a logged warning).

    Raises
    ------
    InputError
        If ``evidence`` is not a mapping, a key is not a string, or an item's
        value is not a mapping.

    Examples
    --------
    >>> cl = build_checklist({"threshold": {"rule": "Youden", "fitted_on": "test"}}, run_id="demo")
    >>> cl.n_complete, cl.n_missing
    (0, 7)
    >>> cl["threshold"].problems
    ['threshold fitted on the test split', 'no measured effect recorded']
    """
    if not isinstance(evidence, Mapping):
        raise InputError(
            f"evidence must be a mapping of item id to recorded fields, got {type(evidence).__name__}; "
            f"pass a dict such as {{'split': {{...}}}} with ids from {', '.join(ITEM_IDS)}"
        )
    if run_id is not None and not isinstance(run_id, str):
        raise InputError(f"run_id must be a string or None, got {type(run_id).__name__}")
    bad_keys = [k for k in evidence if not isinstance(k, str)]
    if bad_keys:
        raise InputError(f"evidence keys must be item ids (strings), got {bad_keys[0]!r}; ids are {', '.join(ITEM_IDS)}")
    for key, value in evidence.items():
        if key in _SPECS and value is not None and not isinstance(value, Mapping):
            raise InputError(
                f"evidence[{key!r}] must be a mapping of field name to value, got {type(value).__name__}; "
                f"record the item as a dict with fields {', '.join(_SPECS[key].required)}"
            )
    extra = {k: v for k, v in evidence.items() if k not in _SPECS}
    if extra:
        log.warning(
            "evidence has ids that are not checklist items, kept under 'extra': %s (items are %s)",
            ", ".join(sorted(extra)),
            ", ".join(ITEM_IDS),
        )

    entries = []
    for spec in ITEMS:
        recorded = evidence.get(spec.item_id)
        problems = _assess(spec, recorded)
        recorded = dict(recorded or {})
        effect = recorded.pop("effect", None)
        entries.append(
            ChecklistEntry(
                number=spec.number,
                item_id=spec.item_id,
                title=spec.title,
                status=MISSING if problems else COMPLETE,
                problems=problems,
                fields=recorded,
                effect=dict(effect) if isinstance(effect, Mapping) else effect,
                paper_effect=spec.paper_effect,
                crosswalk=dict(spec.crosswalk),
                what_to_report=spec.what_to_report,
                paper_value=spec.paper_value,
                paper_unit=spec.paper_unit,
                concern=item_concern(spec.item_id, recorded, effect) if not problems else "",
            )
        )
    return Checklist(run_id=run_id, items=entries, extra=dict(extra))


def item_concern(item_id: str, fields: Mapping[str, Any], effect: Any) -> str:
    """What an item's evidence shows to be a problem, by a rule fixed in advance; ``""`` when none.

    ``split``: the partition classifier's interval lies above AUC 0.5 (the test split differs from the
    pool); and, from its ``leakage`` counts (:meth:`crslib.audit.AuditResult.checklist_evidence`), exact
    or embedding duplicates (near duplicates only where that measure is informative) that cross from the
    training pool to the test split, or person numbers found in both (possibly the same patients).
    ``shortcut``: the file-property classifier's pool interval lies above balanced accuracy 0.5.
    ``calibration``: validation-fitted calibration made the test ECE worse (a positive change).
    Several concerns of one item are joined with "; ". Intervals are labelled with the recorded
    ``confidence`` (just "interval" when none is recorded).

    Examples
    --------
    >>> item_concern("shortcut", {"pool_balanced_accuracy": {"estimate": 0.99, "low": 0.98, "high": 1.0},
    ...                           "confidence": 0.95}, None)
    'file properties alone predict the label in the training pool (balanced accuracy 0.990, 95% interval 0.980-1.000)'
    >>> item_concern("split", {}, {"value": 0.52, "low": 0.45, "high": 0.6})
    ''
    >>> item_concern("split", {"leakage": {"exact_duplicates_across": 2, "exact_test_images": 2}}, None)
    'exact duplicate images cross the split (2 clusters, 2 test images)'
    """
    def interval(record: Any, key: str = "estimate") -> tuple[float, float, float] | None:
        if not isinstance(record, Mapping):
            return None
        values = [record.get(name) for name in (key, "low", "high")]
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            return float(values[0]), float(values[1]), float(values[2])
        return None

    level = _interval_label(fields.get("confidence"))
    if item_id == "split":
        concerns = []
        found = interval(effect, "value")
        if found and found[1] > 0.5:
            concerns.append(f"a classifier tells the test split from the training pool (AUC {found[0]:.3f}, {level} "
                            f"{found[1]:.3f}-{found[2]:.3f})")
        return "; ".join(concerns + _leakage_concerns(fields.get("leakage")))
    if item_id == "shortcut":
        found = interval(fields.get("pool_balanced_accuracy"))
        if found and found[1] > 0.5:
            return (f"file properties alone predict the label in the training pool (balanced accuracy "
                    f"{found[0]:.3f}, {level} {found[1]:.3f}-{found[2]:.3f})")
    if item_id == "calibration" and isinstance(effect, Mapping):
        value = effect.get("value")
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            return f"calibration fitted on validation made the test ECE worse (by {value:.3f})"
    return ""


def _interval_label(confidence: Any) -> str:
    """'95% interval' for a recorded confidence of 0.95; 'interval' when none (or no valid one) is recorded."""
    if isinstance(confidence, numbers.Real) and not isinstance(confidence, bool) and 0 < float(confidence) < 1:
        return f"{100 * float(confidence):g}% interval"
    return "interval"


def _leakage_concerns(leakage: Any) -> list[str]:
    """The split item's concerns from its ``leakage`` counts (none when the counts are absent or not measured)."""
    if not isinstance(leakage, Mapping):
        return []

    def count(key: str) -> int:
        value = leakage.get(key)
        return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else 0

    kinds = [("exact", "exact duplicate images"), ("embedding", "embedding near duplicates")]
    if leakage.get("near_informative") is True:
        kinds.append(("near", "near duplicate images (pHash)"))
    concerns = [f"{words} cross the split ({count(f'{kind}_duplicates_across')} clusters, "
                f"{count(f'{kind}_test_images')} test images)" for kind, words in kinds
                if count(f"{kind}_duplicates_across")]
    if count("possible_same_patients_across"):
        concerns.append(f"possibly the same patients in the training pool and the test split "
                        f"({count('possible_same_patients_across')} person numbers in both, "
                        f"{count('possible_same_patient_test_images')} test images)")
    return concerns


def crosswalk_frame() -> pd.DataFrame:
    """The crosswalk: one row per item, one column per guideline.

    Cells hold the identifiers of the guideline's nearest items, joined with
    ", " (or "; " where identifiers are names) (CLAIM 2024 and TRIPOD+AI item numbers, MI-CLAIM part names, DOME
    fields); :data:`CROSSWALK_SOURCES` says how each was verified.

    Examples
    --------
    >>> frame = crosswalk_frame()
    >>> frame.shape, frame.loc["threshold", "TRIPOD+AI"]
    ((7, 4), '15')
    """
    frame = pd.DataFrame(
        {g: [_join_ids(spec.crosswalk[g]) for spec in ITEMS] for g in GUIDELINES},
        index=pd.Index([spec.item_id for spec in ITEMS], name="item"),
    )
    frame.columns.name = "guideline"
    return frame

"""What changed between two runs: result tables and claim verdicts (``crs diff``).

Two run folders (from ``crs book``, or any folder of result tables) are
compared table by table and claim by claim:

- every result table (a CSV under ``results/``, matched by its path relative
  to ``results/``) that both runs hold is aligned row by row and every numeric
  column is compared (:func:`compare_tables`);
- every verdict of the claims ledger (:func:`crslib.claims.build_ledger`) that
  differs between the runs is a *flip* (:func:`compare_ledgers`).

A change counts as *real* only where the table carries the runs' own
intervals and the two runs' intervals do not overlap (:func:`classify_change`).
Only the run-folder reader (:func:`read_result_tables`, :func:`diff_runs`)
touches files; the comparisons are pure functions of DataFrames and ledgers.

Examples
--------
>>> import pandas as pd
>>> a = pd.DataFrame({"scope": ["all"], "auc": [0.70], "low": [0.65], "high": [0.75]})
>>> b = pd.DataFrame({"scope": ["all"], "auc": [0.55], "low": [0.50], "high": [0.60]})
>>> compare_tables(a, b, name="partition_auc.csv").counts()
{'changed': 1, 'real': 1, 'within_interval': 0, 'no_interval': 0, 'text_changed': 0}
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib._io import JsonResult, json_ready
from crslib.claims import Ledger, build_ledger
from crslib.records import run_results_folder

__all__ = ["CHANGE_KINDS", "RTOL", "RunDiff", "TableDiff", "classify_change", "compare_ledgers", "compare_tables",
           "diff_runs", "interval_columns", "read_result_tables"]

#: Relative tolerance below which two numbers count as equal (floating-point noise, CSV round trips).
RTOL = 1e-9
#: Absolute tolerance for numbers at or near zero.
ATOL = 1e-12
#: How a changed number is classified (see :func:`classify_change`).
CHANGE_KINDS = ("real", "within_interval", "no_interval")
#: Changed cells kept per table in ``diff.json`` (the counts always cover every cell).
MAX_CELLS = 500
#: Suffix pairs that name an interval's bounds: ``X_low``/``X_high`` etc.
_BOUND_SUFFIXES = (("_low", "_high"), ("_lower", "_upper"), ("_ci_low", "_ci_high"))
#: Bare bound names: they belong to the numeric column just before the lower bound.
_BARE_BOUNDS = (("low", "high"), ("lower", "upper"), ("ci_low", "ci_high"))
_OCCURRENCE = "__occurrence__"


def interval_columns(columns: list[str] | pd.Index) -> dict[str, tuple[str, str]]:
    """Which columns hold the interval of which value column.

    The result tables follow two conventions: ``X_low``/``X_high`` (also
    ``X_lower``/``X_upper``, ``X_ci_low``/``X_ci_high``) bound column ``X``,
    or, where no column ``X`` exists, the one column whose name starts with
    ``X_`` (``null_low``/``null_high`` bound ``null_mean``); bare
    ``low``/``high`` (or ``ci_low``/``ci_high``) bound the column just before
    the lower bound (``auc, low, high``).

    Parameters
    ----------
    columns : list of str or Index
        A table's columns, in order.

    Returns
    -------
    dict
        ``{value column: (lower bound column, upper bound column)}``.

    Examples
    --------
    >>> interval_columns(["scope", "auc", "low", "high", "null_mean", "null_low", "null_high"])
    {'auc': ('low', 'high'), 'null_mean': ('null_low', 'null_high')}
    >>> interval_columns(["backbone", "auroc", "auroc_low", "auroc_high", "n"])
    {'auroc': ('auroc_low', 'auroc_high')}
    """
    names = [str(c) for c in columns]
    present = set(names)
    found: dict[str, tuple[str, str]] = {}
    for low_name, high_name in _BARE_BOUNDS:
        if low_name in present and high_name in present and names.index(low_name) > 0:
            value = names[names.index(low_name) - 1]
            if not _is_bound(value, present):
                found.setdefault(value, (low_name, high_name))
    for low_suffix, high_suffix in _BOUND_SUFFIXES:
        for name in names:
            if not name.endswith(low_suffix) or name in (b for pair in _BARE_BOUNDS for b in pair):
                continue
            stem = name[: -len(low_suffix)]
            if stem + high_suffix not in present:
                continue
            if stem in present:
                value = stem
            else:
                starts = [c for c in names if c.startswith(stem + "_") and not _is_bound(c, present)]
                if len(starts) != 1:
                    continue
                value = starts[0]
            found.setdefault(value, (name, stem + high_suffix))
    return found


def _is_bound(name: str, present: set[str]) -> bool:
    """True when ``name`` is the lower or upper bound of a pair present in the table."""
    for low_name, high_name in _BARE_BOUNDS:
        if name in (low_name, high_name) and {low_name, high_name} <= present:
            return True
    for low_suffix, high_suffix in _BOUND_SUFFIXES:
        if name.endswith(low_suffix) and name[: -len(low_suffix)] + high_suffix in present:
            return True
        if name.endswith(high_suffix) and name[: -len(high_suffix)] + low_suffix in present:
            return True
    return False


def classify_change(a: float, b: float, a_interval: tuple[float, float] | None = None,
                    b_interval: tuple[float, float] | None = None, *, rtol: float = RTOL) -> str | None:
    """Whether a number changed between two runs and how.

    The rule: two numbers are equal within ``rtol`` (relative, with an
    absolute floor of :data:`ATOL`; two NaNs are equal). A changed number is
    ``"real"`` when both runs have a finite interval for it and the two
    intervals do not overlap (one run's upper bound lies below the other's
    lower bound); ``"within_interval"`` when the intervals overlap (the change
    is within what the runs' own uncertainty allows); ``"no_interval"`` when
    either run lacks an interval.

    Parameters
    ----------
    a, b : float
        The number in run A and in run B.
    a_interval, b_interval : (float, float), optional
        Each run's interval ``(low, high)`` for it.
    rtol : float
        Relative tolerance (default :data:`RTOL`).

    Returns
    -------
    str or None
        None when unchanged, else one of :data:`CHANGE_KINDS`.

    Examples
    --------
    >>> classify_change(0.70, 0.70 + 1e-12)
    >>> classify_change(0.70, 0.55, (0.65, 0.75), (0.50, 0.60))
    'real'
    >>> classify_change(0.70, 0.68, (0.65, 0.75), (0.62, 0.74))
    'within_interval'
    >>> classify_change(12, 13)
    'no_interval'
    """
    a, b = float(a), float(b)
    if (np.isnan(a) and np.isnan(b)) or (np.isfinite(a) and np.isfinite(b) and
                                         abs(a - b) <= max(rtol * max(abs(a), abs(b)), ATOL)) or a == b:
        return None
    bounds = [*(a_interval or (np.nan, np.nan)), *(b_interval or (np.nan, np.nan))]
    if a_interval is None or b_interval is None or not np.all(np.isfinite(np.asarray(bounds, dtype=float))):
        return "no_interval"
    a_low, a_high, b_low, b_high = (float(x) for x in bounds)
    return "real" if (a_high < b_low or b_high < a_low) else "within_interval"


@dataclass(frozen=True)
class TableDiff:
    """How one result table differs between run A and run B.

    Attributes
    ----------
    table : str
        The table's path relative to ``results/`` (``"05_split_and_shortcut_audit/partition_auc.csv"``).
    status : str
        ``"same"``, ``"changed"``, ``"only in A"`` or ``"only in B"``.
    keys : tuple of str
        The columns rows were aligned on: the first text columns that tell
        every row apart (all text columns when none do; rows that share key
        values are then paired in their order).
    rows_a, rows_b : int
        Rows in each run (0 where the table is absent).
    rows_only_a, rows_only_b : DataFrame
        Key values of the rows only one run has.
    columns_only_a, columns_only_b : tuple of str
        Columns only one run's table has.
    cells : DataFrame
        One row per changed number: the row's key (``row``), ``column``, ``a``,
        ``b``, each run's interval (``a_low`` ... ``b_high``, NaN without one)
        and ``kind`` (one of :data:`CHANGE_KINDS`); real changes first.
    columns_retyped : tuple of str
        Columns numeric in one run and text in the other (not compared).
    text_cells : DataFrame
        Text values outside the keys that differ (``row``, ``column``, ``a``, ``b``).
    """

    table: str
    status: str
    keys: tuple[str, ...] = ()
    rows_a: int = 0
    rows_b: int = 0
    rows_only_a: pd.DataFrame = field(default_factory=pd.DataFrame)
    rows_only_b: pd.DataFrame = field(default_factory=pd.DataFrame)
    columns_only_a: tuple[str, ...] = ()
    columns_only_b: tuple[str, ...] = ()
    cells: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=_CELL_COLUMNS))
    columns_retyped: tuple[str, ...] = ()
    text_cells: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["row", "column", "a", "b"]))

    def counts(self) -> dict[str, int]:
        """Changed numbers in all, and by kind; changed text values."""
        kinds = self.cells["kind"].value_counts() if len(self.cells) else {}
        return {"changed": int(len(self.cells)), **{k: int(kinds.get(k, 0)) for k in CHANGE_KINDS},
                "text_changed": int(len(self.text_cells))}

    def by_column(self) -> pd.DataFrame:
        """One row per changed column: how many of its numbers changed, by kind, and the largest change."""
        if self.cells.empty:
            return pd.DataFrame(columns=["column", "changed", *CHANGE_KINDS, "max_abs_change"])
        cells = self.cells.assign(change=(self.cells["b"] - self.cells["a"]).abs())
        rows = []
        for column, part in cells.groupby("column", sort=False):
            kinds = part["kind"].value_counts()
            rows.append({"column": column, "changed": len(part), **{k: int(kinds.get(k, 0)) for k in CHANGE_KINDS},
                         "max_abs_change": float(part["change"].max()) if part["change"].notna().any() else np.nan})
        return pd.DataFrame(rows)

    def to_dict(self, *, max_cells: int = MAX_CELLS) -> dict[str, Any]:
        """JSON-ready; at most ``max_cells`` changed cells (``cells_truncated`` says when more changed)."""
        return json_ready({
            "table": self.table, "status": self.status, "keys": list(self.keys), "rows_a": self.rows_a,
            "rows_b": self.rows_b, "counts": self.counts(), "columns_only_a": list(self.columns_only_a),
            "columns_only_b": list(self.columns_only_b),
            "columns_retyped": list(self.columns_retyped), "rows_only_a": self.rows_only_a,
            "rows_only_b": self.rows_only_b, "columns": self.by_column(), "cells": self.cells.head(max_cells),
            "cells_truncated": len(self.cells) > max_cells, "text_cells": self.text_cells.head(max_cells),
            "text_cells_truncated": len(self.text_cells) > max_cells,
        })


_CELL_COLUMNS = ["row", "column", "a", "b", "a_low", "a_high", "b_low", "b_high", "kind"]


def _numeric(frame: pd.DataFrame) -> set[str]:
    return {str(c) for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])}


def _keyed(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The table indexed by its key values (as text) and the occurrence of each key in order."""
    out = frame.copy()
    out.columns = [str(c) for c in out.columns]
    for key in keys:
        out[key] = out[key].astype(object).where(out[key].notna(), "<missing>").astype(str)
    out[_OCCURRENCE] = out.groupby(keys, sort=False).cumcount() if keys else np.arange(len(out))
    return out.set_index([*keys, _OCCURRENCE])


def _row_label(index: tuple | Any, keys: list[str]) -> str:
    values = index if isinstance(index, tuple) else (index,)
    label = ", ".join(f"{k}={v}" for k, v in zip(keys, values[:-1]))
    if not label:
        return f"row {values[-1] + 1}"
    return f"{label} #{values[-1] + 1}" if values[-1] else label  # the n-th row sharing these key values


def compare_tables(a: pd.DataFrame, b: pd.DataFrame, *, name: str = "", rtol: float = RTOL) -> TableDiff:
    """Compare one result table of two runs.

    Rows are aligned on the table's keys: the first text columns (scope,
    model, finding ...) whose values tell every row apart in both tables, or
    all text columns when none do; rows that share key values, or every row of
    a table without text columns, are paired in their order. Every numeric
    column both tables have is compared with :func:`classify_change`, using
    the interval columns :func:`interval_columns` finds; the bound columns
    themselves are not counted apart from their value (a bound that moved
    while its value did not is not reported). Other text columns are compared
    as text.

    Parameters
    ----------
    a, b : DataFrame
        The table as run A and run B wrote it.
    name : str
        The table's name, for the report.
    rtol : float
        Relative tolerance of "unchanged" (default :data:`RTOL`).

    Returns
    -------
    TableDiff

    Examples
    --------
    >>> a = pd.DataFrame({"model": ["x", "y"], "n": [10, 12], "overlap": [0.40, 0.30]})
    >>> b = pd.DataFrame({"model": ["x", "z"], "n": [10, 12], "overlap": [0.45, 0.30]})
    >>> d = compare_tables(a, b, name="t.csv")
    >>> d.status, d.counts()["no_interval"], d.rows_only_a["model"].tolist(), d.rows_only_b["model"].tolist()
    ('changed', 1, ['y'], ['z'])
    """
    numeric = _numeric(a) & _numeric(b)
    cols_a, cols_b = [str(c) for c in a.columns], [str(c) for c in b.columns]
    text_a, text_b = {c for c in cols_a if c not in _numeric(a)}, {c for c in cols_b if c not in _numeric(b)}
    text = [c for c in cols_a if c in text_a and c in text_b]
    keys = _key_columns(a, b, text)
    retyped = tuple(c for c in cols_a if c in cols_b and c not in numeric and c not in text)
    left, right = _keyed(a, keys), _keyed(b, keys)
    only_a, only_b = left.index.difference(right.index), right.index.difference(left.index)
    shared = left.index.intersection(right.index, sort=False)
    cells = _changed_cells(left.loc[shared], right.loc[shared], [c for c in cols_a if c in numeric], keys, rtol)
    text_cells = _changed_text(left.loc[shared], right.loc[shared], [c for c in text if c not in keys], keys)
    columns_only_a = tuple(c for c in cols_a if c not in cols_b)
    columns_only_b = tuple(c for c in cols_b if c not in cols_a)
    changed = len(cells) or len(text_cells) or len(only_a) or len(only_b) or columns_only_a or columns_only_b or retyped
    return TableDiff(name, "changed" if changed else "same", tuple(keys), len(a), len(b),
                     _only_rows(left, only_a, keys), _only_rows(right, only_b, keys), columns_only_a, columns_only_b,
                     cells, retyped, text_cells)


def _key_columns(a: pd.DataFrame, b: pd.DataFrame, text: list[str]) -> list[str]:
    """The first text columns (in order) whose values tell every row apart in both tables; else all of them."""
    for n in range(1, len(text) + 1):
        keys = text[:n]
        if not a.duplicated(keys).any() and not b.duplicated(keys).any():
            return keys
    return text


def _changed_text(left: pd.DataFrame, right: pd.DataFrame, columns: list[str], keys: list[str]) -> pd.DataFrame:
    """The text values (outside the keys) that differ between two aligned tables."""
    rows = []
    for column in columns:
        x, y = left[column].fillna("").astype(str).to_numpy(), right[column].fillna("").astype(str).to_numpy()
        rows += [[_row_label(left.index[i], keys), column, x[i], y[i]] for i in np.flatnonzero(x != y)]
    return pd.DataFrame(rows, columns=["row", "column", "a", "b"])


def _only_rows(frame: pd.DataFrame, index: pd.Index, keys: list[str]) -> pd.DataFrame:
    """Key values (or 1-based row numbers, without keys) of the rows only one run has."""
    if not keys:
        return pd.DataFrame({"row": np.asarray(index, dtype=int) + 1})
    return frame.loc[index].reset_index()[keys]


def _changed_cells(left: pd.DataFrame, right: pd.DataFrame, numeric: list[str], keys: list[str],
                   rtol: float) -> pd.DataFrame:
    """The changed numbers of two aligned tables (same index), classified, real changes first."""
    bounds_a, bounds_b = interval_columns(list(left.columns)), interval_columns(list(right.columns))
    skip = {c for pair in [*bounds_a.values(), *bounds_b.values()] for c in pair}
    nan = np.full(len(left), np.nan)

    def bound(frame: pd.DataFrame, pair: tuple[str, str] | None, which: int) -> np.ndarray:
        return nan if pair is None else pd.to_numeric(frame[pair[which]], errors="coerce").to_numpy(dtype=float)

    rows = []
    for column in [c for c in numeric if c not in skip]:
        x, y = left[column].to_numpy(dtype=float), right[column].to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            tolerance = np.maximum(rtol * np.maximum(np.abs(x), np.abs(y)), ATOL)
            same = (np.isnan(x) & np.isnan(y)) | (x == y) | (np.abs(x - y) <= tolerance)
        if same.all():
            continue
        ia, ib = bounds_a.get(column), bounds_b.get(column)
        la, ha, lb, hb = bound(left, ia, 0), bound(left, ia, 1), bound(right, ib, 0), bound(right, ib, 1)
        for i in np.flatnonzero(~same):
            kind = classify_change(x[i], y[i], None if ia is None else (la[i], ha[i]),
                                   None if ib is None else (lb[i], hb[i]), rtol=rtol)
            if kind is not None:
                rows.append([_row_label(left.index[i], keys), column, x[i], y[i], la[i], ha[i], lb[i], hb[i], kind])
    cells = pd.DataFrame(rows, columns=_CELL_COLUMNS)
    if len(cells):
        cells = cells.sort_values("kind", key=lambda s: s.map(CHANGE_KINDS.index), kind="stable", ignore_index=True)
    return cells


def compare_ledgers(a: Ledger, b: Ledger) -> pd.DataFrame:
    """The claims whose verdict differs between two ledgers (the *flips*).

    Parameters
    ----------
    a, b : Ledger
        The ledgers of run A and run B (:func:`crslib.claims.build_ledger`).

    Returns
    -------
    DataFrame
        One row per flipped claim: ``id``, ``chapter``, ``claim``,
        ``verdict_a``, ``verdict_b``, ``value_a``, ``value_b``; in ledger order.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as run:
    ...     ledger = build_ledger(run)
    >>> compare_ledgers(ledger, ledger).empty
    True
    """
    theirs = {v.id: v for v in b.verdicts}
    rows = []
    for mine in a.verdicts:
        other = theirs.get(mine.id)
        if other is not None and other.verdict != mine.verdict:
            rows.append({"id": mine.id, "chapter": mine.chapter, "claim": mine.claim, "verdict_a": mine.verdict,
                         "verdict_b": other.verdict, "value_a": mine.run_value, "value_b": other.run_value})
    return pd.DataFrame(rows, columns=["id", "chapter", "claim", "verdict_a", "verdict_b", "value_a", "value_b"])


@dataclass(frozen=True)
class RunDiff(JsonResult):
    """What changed between run A and run B.

    Attributes
    ----------
    run_a, run_b : str
        The two run folders.
    tables : tuple of TableDiff
        One per table either run holds, in path order.
    flips : DataFrame
        The claims whose verdict flipped (:func:`compare_ledgers`).
    unreadable : tuple of str
        Tables that could not be read as CSV (``"path (reason)"``); listed, not compared.
    """

    run_a: str
    run_b: str
    tables: tuple[TableDiff, ...]
    flips: pd.DataFrame
    unreadable: tuple[str, ...] = ()

    @property
    def flipped(self) -> bool:
        """True when at least one claim verdict flipped."""
        return not self.flips.empty

    def counts(self) -> dict[str, int]:
        """Tables compared/changed/only in one run, changed numbers by kind, flips."""
        both = [t for t in self.tables if t.status in ("same", "changed")]
        totals = {k: sum(t.counts()[k] for t in both) for k in ("changed", *CHANGE_KINDS, "text_changed")}
        return {"tables_compared": len(both), "tables_changed": sum(t.status == "changed" for t in both),
                "tables_only_a": sum(t.status == "only in A" for t in self.tables),
                "tables_only_b": sum(t.status == "only in B" for t in self.tables),
                "numbers_changed": totals["changed"], **{k: totals[k] for k in CHANGE_KINDS},
                "text_changed": totals["text_changed"],
                "rows_only_a": sum(len(t.rows_only_a) for t in both),
                "rows_only_b": sum(len(t.rows_only_b) for t in both),
                "flips": int(len(self.flips))}

    def summary(self) -> str:
        """The report's first sentence, built from :meth:`counts`.

        Examples
        --------
        >>> RunDiff("a", "b", (), compare_ledgers(Ledger((), "a"), Ledger((), "a"))).summary()
        'Of 0 result tables in both runs, none changed; no claim verdict flipped.'
        """
        c = self.counts()
        parts = [f"{_n(c['real'], 'number')} moved beyond both runs' intervals (real)" if c["real"] else "",
                 f"{_n(c['within_interval'], 'number')} moved within them" if c["within_interval"] else "",
                 f"{_n(c['no_interval'], 'number')} changed where the table has no interval"
                 if c["no_interval"] else "",
                 f"{_n(c['text_changed'], 'text value')} changed" if c["text_changed"] else "",
                 f"{_n(c['rows_only_a'], 'row')} only in A" if c["rows_only_a"] else "",
                 f"{_n(c['rows_only_b'], 'row')} only in B" if c["rows_only_b"] else ""]
        parts = [p for p in parts if p]
        text = f"Of {_n(c['tables_compared'], 'result table')} in both runs, "
        if c["tables_changed"]:
            text += f"{c['tables_changed']} changed" + (": " + ", ".join(parts) if parts else "")
        else:
            text += "none changed"
        if c["tables_only_a"] or c["tables_only_b"]:
            text += (f"; {_n(c['tables_only_a'], 'table')} only in A and {_n(c['tables_only_b'], 'table')} "
                     "only in B")
        text += "; " + (f"{_n(c['flips'], 'claim verdict')} flipped." if c["flips"] else "no claim verdict flipped.")
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: runs, counts, summary, flips and one object per table."""
        return json_ready({"run_a": self.run_a, "run_b": self.run_b, "counts": self.counts(),
                           "summary": self.summary(), "flips": self.flips, "unreadable": list(self.unreadable),
                           "tables": [t.to_dict() for t in self.tables]})


def _n(count: int, noun: str) -> str:
    """``3 numbers``, ``1 number``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def read_result_tables(run_dir: str | os.PathLike) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Every result table of a run folder, by its path relative to ``results/``.

    Parameters
    ----------
    run_dir : path
        A run folder holding ``results/``, or a folder of result tables itself.

    Returns
    -------
    tables : dict of str to DataFrame
        ``{"02_agreement/headline.csv": frame, ...}``, sorted by path.
    unreadable : list of str
        Tables that could not be parsed, with the reason.

    Raises
    ------
    InputError
        If ``run_dir`` is not a folder, or holds neither ``results/`` nor any CSV.
    """
    results = run_results_folder(run_dir)
    tables, unreadable = {}, []
    for path in sorted(results.rglob("*.csv")):
        name = path.relative_to(results).as_posix()
        try:
            tables[name] = pd.read_csv(path)
        except (ValueError, OSError, UnicodeDecodeError) as exc:
            unreadable.append(f"{name} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
    return tables, unreadable


def diff_runs(run_a: str | os.PathLike, run_b: str | os.PathLike, *, rtol: float = RTOL) -> RunDiff:
    """Compare two run folders: every result table, and the claims ledger's verdicts.

    Parameters
    ----------
    run_a, run_b : path
        Run folders (``runs/<id>/`` from ``crs book``, or their ``results/``).
    rtol : float
        Relative tolerance of "unchanged" (default :data:`RTOL`).

    Returns
    -------
    RunDiff

    Raises
    ------
    InputError
        If either path is not a run folder.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as root:
    ...     for run in ("a", "b"):
    ...         (Path(root) / run / "results" / "02").mkdir(parents=True)
    ...         pd.DataFrame({"k": [10], "overlap": [0.4]}).to_csv(Path(root) / run / "results/02/t.csv", index=False)
    ...     diff = diff_runs(Path(root) / "a", Path(root) / "b")
    >>> diff.summary()
    'Of 1 result table in both runs, none changed; no claim verdict flipped.'
    """
    tables_a, bad_a = read_result_tables(run_a)
    tables_b, bad_b = read_result_tables(run_b)
    diffs = []
    for name in sorted(set(tables_a) | set(tables_b)):
        if name not in tables_b:
            diffs.append(TableDiff(name, "only in A", rows_a=len(tables_a[name])))
        elif name not in tables_a:
            diffs.append(TableDiff(name, "only in B", rows_b=len(tables_b[name])))
        else:
            diffs.append(compare_tables(tables_a[name], tables_b[name], name=name, rtol=rtol))
    flips = compare_ledgers(build_ledger(run_results_folder(run_a)), build_ledger(run_results_folder(run_b)))
    unreadable = tuple(f"A: {u}" for u in bad_a) + tuple(f"B: {u}" for u in bad_b)
    return RunDiff(str(run_a), str(run_b), tuple(diffs), flips, unreadable)

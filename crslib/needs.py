"""What an analysis needs from a manifest, and, when the data lacks it, one sentence saying so.

Every chapter of the book runs on a researcher's own manifest, which may
have no labels, no patient ids, a single acquisition source or no
train/validation/test split. An analysis declares what it needs with
:func:`unmet_need`; when the answer is a sentence instead of None, the
chapter skips that analysis, shows the sentence (what is missing and what to
add to the manifest) and goes on (:class:`crslib.runner.SkipLog` records it
in the run's ``run.json``). What a representation-risk target needs is
:func:`crslib.risk_needs.task_need`.

Examples
--------
>>> import pandas as pd
>>> m = pd.DataFrame({"path": ["a.png", "b.png", "c.png"], "source": ["x", "x", "x"]})
>>> unmet_need(m, columns=["label"])
'the manifest has no `label` column; add one to run it'
>>> unmet_need(m, varying=["source"])
"`source` has a single value ('x'); it needs at least 2 different values"
>>> unmet_need(m, columns=["path"]) is None
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from crslib.errors import InputError

__all__ = ["unmet_need"]


def _values(manifest: pd.DataFrame, column: str) -> pd.Series:
    return manifest[column].dropna().astype(str)


def unmet_need(
    manifest: Any,
    *,
    columns: Sequence[str] = (),
    varying: Sequence[str] = (),
    binary: str | None = None,
    min_per_class: int = 1,
    groups: str | None = None,
    splits: Sequence[str] = (),
    min_rows: int = 1,
) -> str | None:
    """The first thing an analysis needs that the manifest lacks, as a sentence; None when nothing is missing.

    Parameters
    ----------
    manifest : DataFrame
    columns : sequence of str
        Columns that must exist and hold at least one value.
    varying : sequence of str
        Columns that must hold at least two different values (a factor to
        compare levels of).
    binary : str, optional
        A column that must hold exactly two classes, each on at least
        ``min_per_class`` rows (or, with ``groups``, patients).
    min_per_class : int
        See ``binary``.
    groups : str, optional
        Count the classes of ``binary`` in distinct values of this column
        (patients) instead of rows.
    splits : sequence of str
        Values that the ``split`` column must hold, each on at least one row.
    min_rows : int
        Fewest rows.

    Returns
    -------
    str or None
        A sentence naming what is missing and what to add, or None.

    Examples
    --------
    >>> import pandas as pd
    >>> m = pd.DataFrame({"label": [0, 0, 1], "patient_id": ["p1", "p1", "p2"], "split": ["train"] * 3})
    >>> unmet_need(m, binary="label", min_per_class=2, groups="patient_id")
    '`label` needs at least 2 patients of each of its two classes; it has 0: 1, 1: 1'
    >>> unmet_need(m, splits=["train", "test"])
    "no row has split 'test' (the split column holds 'train'); add train/val/test values to run it"
    """
    if not isinstance(manifest, pd.DataFrame):
        raise InputError(f"manifest must be a DataFrame, got {type(manifest).__name__}")
    if len(manifest) < min_rows:
        return f"it needs at least {min_rows} images; the manifest has {len(manifest)}"
    needed = [*columns, *varying, *([binary] if binary else []), *([groups] if groups else []),
              *(["split"] if splits else [])]
    for column in dict.fromkeys(needed):
        if column not in manifest.columns:
            return f"the manifest has no `{column}` column; add one to run it"
        if manifest[column].isna().all():
            return f"`{column}` has no values (every row is empty); fill it to run it"
    for column in varying:
        levels = _values(manifest, column).unique()
        if len(levels) < 2:
            return f"`{column}` has a single value ({levels[0]!r}); it needs at least 2 different values"
    if binary:
        values = _values(manifest, binary)
        counts = (values.groupby(values).size() if groups is None
                  else manifest.loc[values.index, groups].astype(str).groupby(values).nunique())
        unit = "images" if groups is None else "patients"
        if len(counts) != 2:
            return f"`{binary}` needs exactly two classes; it has {len(counts)}" + (
                f" ({', '.join(map(repr, counts.index[:5]))}{', ...' if len(counts) > 5 else ''})" if len(counts) else "")
        if counts.min() < min_per_class:
            held = ", ".join(f"{k}: {v}" for k, v in counts.items())
            return f"`{binary}` needs at least {min_per_class} {unit} of each of its two classes; it has {held}"
    if splits:
        present = sorted(_values(manifest, "split").unique())
        for split in splits:
            if split not in present:
                return (f"no row has split {split!r} (the split column holds {', '.join(map(repr, present))}); "
                        "add train/val/test values to run it")
    return None

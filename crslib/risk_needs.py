"""What a representation-risk target needs: :func:`task_need`, one sentence when the workflow cannot run on it.

A chapter or a command checks each target column before
:func:`crslib.risk.representation_risk` fits anything, skips the ones that
cannot be used (saying why) and goes on with the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from crslib._validation import check_count, check_fractions, check_groups
from crslib.errors import DataError, InputError
from crslib.risk_inputs import _check_target, _check_task
from crslib.risk_multiclass import class_patients, partition
from crslib.risk_scores import MULTICLASS
from crslib.splits import MIN_PATIENTS, min_patients

__all__ = ["task_need"]


def _value_text(value: Any, *, quote: bool = True) -> str:
    """A target value as the manifest shows it: text quoted (unless ``quote=False``), whole numbers as integers."""
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return repr(value) if isinstance(value, str) and quote else str(value)


def task_need(
    y: Any,
    *,
    groups: Any,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    n_partitions: int = 1,
    random_state: int = 0,
    name: str = "y",
    task: str = "auto",
) -> str | None:
    """Why :func:`crslib.risk.representation_risk` cannot run on a target, as one sentence; None when it can.

    The checks of the workflow, made before any model is fitted, so that a
    chapter or a command can skip one target and go on with the others: the
    target needs two classes (a binary label, numbers or text), three or
    more classes (a multi-class label: text, or integers with at most
    :data:`crslib.risk.MAX_CLASSES` values) or a varying number (a
    regression target); and the patients must fill every patient-grouped
    train / validation / test partition, with every class in each for a
    classification target, so each class needs enough patients (the
    partitions of seeds ``random_state`` to ``random_state + n_partitions
    - 1`` are drawn, as :func:`crslib.risk.representation_risk` draws them). Rows with
    a missing target are not counted: drop them before running the
    workflow.

    Parameters
    ----------
    y : array-like of shape (n_images,)
        The target column (missing values allowed).
    groups : array-like of shape (n_images,)
        Patient id per image.
    fractions : sequence of 3 float
        Shares of patients in train, validation and test.
    n_partitions, random_state : int
        The partitions :func:`crslib.risk.representation_risk` will draw.
    name : str
        The target's name in the sentence (e.g. its manifest column).
    task : {"auto", "binary", "multiclass", "regression", "classification"}
        The task type, as :func:`crslib.risk.representation_risk` takes it.

    Returns
    -------
    str or None
        What the target lacks and what to add, or None when the workflow can
        run on it.

    Raises
    ------
    InputError
        ``groups`` does not hold one patient id per image, bad
        ``fractions`` or an unknown ``task``.

    Examples
    --------
    >>> task_need(np.tile(["cat", "dog"], 20), groups=np.arange(40), name="label") is None
    True
    >>> task_need(np.tile(["a", "b", "c"], 10), groups=np.arange(30), name="source") is None
    True
    >>> task_need(np.r_[np.tile(["a", "b"], 10), ["c", "c"]], groups=np.arange(22), name="source")
    '`source` needs at least 4 patients of each class so that train, validation and test (60/20/20 % of patients) all hold every class; it has a: 10, b: 10, c: 2'
    >>> task_need(np.r_[np.zeros(30), np.ones(3)], groups=np.arange(33), name="finding_x")
    '`finding_x` needs at least 4 patients of each class so that train, validation and test (60/20/20 % of patients) all hold both; it has 0: 30, 1: 3'
    """
    values = pd.Series(np.asarray(y, dtype=object) if not isinstance(y, pd.Series) else y.to_numpy(dtype=object))
    if values.ndim != 1 or values.empty:
        raise InputError(f"y must be a non-empty 1-D array with one value per image, got {len(values)} values")
    g_all = check_groups(groups, len(values))
    f = check_fractions(fractions)
    n_partitions = check_count(n_partitions, "n_partitions")
    _check_task(task)
    known = values.notna().to_numpy()
    if not known.any():
        return f"`{name}` has no values (every row is empty); fill it to run it"
    values, g = values[known], g_all[known]
    try:
        levels = np.unique(values.to_numpy())
    except TypeError:
        return f"`{name}` mixes numbers and text; use one type to run it"
    if levels.size < 2:
        return f"`{name}` has a single value ({_value_text(levels[0])}); it needs two classes or a varying number"
    try:
        yv, task, classes = _check_target(values.to_numpy(), len(values), task)
    except InputError as exc:
        return f"`{name}` cannot be used: {exc}"
    shares = "/".join(f"{100 * v / sum(f):.0f}" for v in f) + " % of patients"
    patients = np.unique(g)
    need = max(min_patients(f), MIN_PATIENTS)
    if patients.size < need:
        return (f"`{name}` is known for {patients.size} patients; the train, validation and test partitions "
                f"({shares}) need at least {need}")
    if task != "regression":
        reason = _class_shortfall(yv, g, task, classes, min_patients(f), shares, len(values))
        if reason:
            return f"`{name}` {reason}"
    for i in range(n_partitions):
        try:
            partition(yv, g, task, f, random_state + i)
        except DataError as exc:
            return f"`{name}` does not fill partition {i + 1} of {n_partitions}: {exc}"
    return None


def _class_shortfall(y: np.ndarray, g: np.ndarray, task: str, classes: list[Any], per_class: int, shares: str,
                     n_rows: int) -> str | None:
    """Which classes have too few patients to be in every partition (the end of a sentence), or None."""
    if task == MULTICLASS:
        counts = class_patients(y, g)[0].sum(axis=0)
        rule = "counts for every class among their images"
    else:
        patients, inverse = np.unique(g, return_inverse=True)
        patient_label = np.zeros(patients.size, dtype=np.int64)
        np.maximum.at(patient_label, inverse.ravel(), y)
        counts = np.bincount(patient_label, minlength=len(classes))
        rule = f"counts as {_value_text(classes[1])} when any of their images is"
    if counts.min() >= per_class:
        return None
    held = ", ".join(f"{_value_text(c, quote=False)}: {int(n)}" for c, n in zip(classes, counts))
    return (f"needs at least {per_class} patients of each class so that train, validation and test ({shares}) "
            f"all hold {'both' if task != MULTICLASS else 'every class'}; it has {held}"
            + (f" (a patient {rule})" if np.unique(g).size < n_rows else ""))

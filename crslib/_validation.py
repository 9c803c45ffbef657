"""Argument checks shared by the analysis modules: one home, one message per kind of mistake.

Each check returns the cleaned value or raises :class:`crslib.errors.InputError`
with a message that names the argument and what was wrong with it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from crslib.errors import InputError

# =========================================================================== validation


def as_float(values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as float64; a value that is not a number raises :class:`InputError` with ``what``
    and that value named (``"<what>; 'a' is not one"``) rather than numpy's conversion text."""
    try:
        return values.astype(float)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what}; {str(_first_non_number(values))!r} is not one") from exc


def _first_non_number(values: Any) -> Any:
    for value in values:
        try:
            float(value)
        except (TypeError, ValueError):
            return value
    return None


def as_embeddings(X: Any, name: str = "X", dtype: Any = np.float32) -> np.ndarray:
    """Validated C-contiguous view or copy (float32 by default; ``dtype=None`` keeps the input's, so a
    float16 or memory-mapped array is checked without a full copy) of a 2-D embedding array."""
    try:
        arr = np.asarray(X)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise InputError(f"{name} cannot be converted to an array: {exc}") from exc
    if arr.ndim != 2:
        raise InputError(
            f"{name} must be a 2-D array (images x features), got shape {arr.shape}; "
            "reshape it, e.g. X.reshape(len(X), -1)"
        )
    if arr.dtype.kind not in "fiub":
        raise InputError(f"{name} must hold numbers, got dtype {arr.dtype}")
    n, d = arr.shape
    if n < 2 or d < 1:
        raise InputError(f"{name} needs at least 2 rows and 1 column, got shape {arr.shape}")
    with np.errstate(over="ignore"):  # a value past the target dtype's range is reported below, not warned
        arr32 = np.ascontiguousarray(arr, dtype=dtype)
    finite = np.empty(n, dtype=bool)
    step = max(1, (8 * 2**20) // max(1, d))
    for s in range(0, n, step):
        finite[s : s + step] = np.isfinite(arr32[s : s + step]).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        if arr32.dtype != arr.dtype and np.isfinite(arr[bad]).all():
            raise InputError(
                f"{name} has values beyond {arr32.dtype}'s range ({np.finfo(arr32.dtype).max:g}) in {bad.size} "
                f"row(s), first rows {bad[:5].tolist()}; rescale the embeddings"
            )
        raise InputError(
            f"{name} has NaN or infinite values in {bad.size} row(s), first rows {bad[:5].tolist()}; "
            "drop or re-extract those images"
        )
    return arr32


def check_k(k: Any, n: int, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InputError(f"{name} must be an integer >= 1, got {k!r}")
    k = int(k)
    if k < 1:
        raise InputError(f"{name}={k} must be at least 1")
    if k >= n:
        raise InputError(
            f"{name}={k} must be smaller than the number of images N={n} "
            f"(each image has at most N-1={n - 1} neighbours); lower {name} or add images"
        )
    return k


def check_positive_int(value: Any, name: str, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def check_random_state(random_state: Any) -> int | None:
    if random_state is None:
        return None
    if isinstance(random_state, bool) or not isinstance(random_state, (int, np.integer)) or random_state < 0:
        raise InputError(f"random_state must be a non-negative integer or None, got {random_state!r}")
    return int(random_state)


def check_same_rows(arrays: Mapping[str, Any]) -> int:
    sizes = {name: np.shape(x)[0] if np.ndim(x) >= 1 else None for name, x in arrays.items()}
    distinct = set(sizes.values())
    if len(distinct) != 1:
        desc = ", ".join(f"{name}: {size}" for name, size in sizes.items())
        raise InputError(
            f"embeddings must have one row per image, in the same order, for every model; row counts differ ({desc})"
        )
    return distinct.pop()


def per_image_array(per_image: Any, n: int | None = None) -> np.ndarray:
    x = np.asarray(per_image, dtype=float)
    if x.ndim != 1:
        raise InputError(f"per_image must be 1-D (one overlap per image), got shape {x.shape}")
    if n is not None and x.shape[0] != n:
        raise InputError(f"per_image has {x.shape[0]} values but metadata has {n} rows; they must match row by row")
    if not np.isfinite(x).all():
        raise InputError(f"per_image has NaN values at rows {np.flatnonzero(~np.isfinite(x))[:5].tolist()}")
    return x


# =========================================================================== counts, rows, groups, fractions


def check_open_unit(value: Any, name: str, example: str) -> float:
    """A number strictly between 0 and 1; the messages name the argument and show an ``example`` value.

    Examples
    --------
    >>> check_open_unit(0.25, "ratio", "0.25")
    0.25
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number between 0 and 1 (e.g. {example}), got {value!r}") from None
    if not 0.0 < number < 1.0:
        raise InputError(f"{name} must be between 0 and 1 (e.g. {example}), got {number}")
    return number


def check_confidence(confidence: Any) -> float:
    """A confidence level strictly between 0 and 1.

    Examples
    --------
    >>> check_confidence(0.95)
    0.95
    """
    return check_open_unit(confidence, "confidence", "0.95")


def check_count(value: Any, name: str, minimum: int = 1) -> int:
    """An integer of at least ``minimum`` (booleans refused).

    Examples
    --------
    >>> check_count(3, "n_splits", 2)
    3
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def is_missing(value: Any) -> bool:
    """True for None and scalar NaN/NaT/NA; False for everything else (lists included).

    Examples
    --------
    >>> is_missing(None), is_missing(float("nan")), is_missing("a"), is_missing([1])
    (True, True, False, False)
    """
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def as_feature_matrix(X: Any, name: str) -> np.ndarray:
    """A finite float matrix (rows = images), from an array or a numeric DataFrame.

    1-D input becomes one column. The messages point at
    :func:`crslib.shortcut.property_matrix` for file properties.

    Examples
    --------
    >>> as_feature_matrix([1, 2], "X").shape
    (2, 1)
    """
    if isinstance(X, pd.DataFrame):
        non_numeric = [str(c) for c in X.columns if not pd.api.types.is_numeric_dtype(X[c].dtype)]
        if non_numeric:
            raise InputError(
                f"{name} has non-numeric columns {non_numeric[:5]}; encode file properties with "
                "property_matrix() first"
            )
        X = X.to_numpy(dtype=float)
    try:
        X = np.asarray(X, dtype=float)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be a numeric array (rows = images), got {exc}") from None
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise InputError(f"{name} must be 2-D (images x features), got shape {X.shape}")
    if X.shape[1] == 0:
        raise InputError(f"{name} has no columns")
    bad = ~np.isfinite(X).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{name} has NaN or infinite values in {bad.sum()} row(s) (first: {rows[:5].tolist()}); "
            "fill them (property_matrix() does for file properties) or drop those images"
        )
    return X


def as_row_values(values: Any, n: int, name: str, what: str) -> np.ndarray:
    """One value per row of X (object array), none missing; ``what`` says what to pass when it is None.

    Examples
    --------
    >>> as_row_values(["a", "b"], 2, "split", "the split name of each row").tolist()
    ['a', 'b']
    """
    if values is None:
        raise InputError(f"{name} is required: pass {what}")
    if isinstance(values, (pd.Series, pd.Index)):
        values = values.to_numpy()
    arr = np.asarray(values, dtype=object)
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-D with one value per row, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise InputError(f"{name} has {arr.shape[0]} values but X has {n} rows; pass one value per row, aligned with X")
    missing = np.array([is_missing(v) for v in arr], dtype=bool)
    if missing.any():
        raise InputError(
            f"{name} is missing (NaN/None) in {missing.sum()} row(s) (first: {np.flatnonzero(missing)[:5].tolist()}); "
            "fill them in or drop those rows"
        )
    return arr


def check_groups(groups: Any, n: int) -> np.ndarray:
    """One patient id per image (``None``: every image is its own patient); mixed types compared as text.

    Examples
    --------
    >>> check_groups(None, 3).tolist(), check_groups([7, "7b", 7], 3).tolist()
    ([0, 1, 2], ['7', '7b', '7'])
    """
    if groups is None:
        return np.arange(n)
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != n:
        raise InputError(f"groups must hold one patient id per image ({n}), got shape {g.shape}")
    missing = pd.isna(g)
    if missing.any():
        raise InputError(f"groups has {int(missing.sum())} missing patient id(s); every image needs its patient id")
    try:
        np.unique(g)
    except TypeError:  # ids of mixed types (e.g. 3 and "3b") cannot be sorted: compare them as text
        g = g.astype(str)
    return g


def check_fractions(fractions: Any) -> tuple[float, float, float]:
    """Three positive relative shares (train, validation, test); they need not sum to 1.

    Examples
    --------
    >>> check_fractions([3, 1, 1])
    (3.0, 1.0, 1.0)
    """
    try:
        f = tuple(float(v) for v in fractions)
    except (TypeError, ValueError) as exc:
        raise InputError(f"fractions must be three numbers (train, validation, test), got {fractions!r}") from exc
    if len(f) != 3 or not all(math.isfinite(v) and v > 0 for v in f):
        raise InputError(
            f"fractions must be three positive numbers (train, validation, test), e.g. (0.6, 0.2, 0.2); got {fractions!r}"
        )
    return f

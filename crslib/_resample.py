"""Bootstrap index drawing behind :mod:`crslib.stats`: argument checks, the resampler, and sums of squares
over resamples.

Private: :func:`crslib.stats.resample_indices`, :func:`crslib.stats.sum_of_squares` and the bootstrap
functions of :mod:`crslib.stats` are the public entry points.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from crslib.errors import InputError

# what each row's label is, for the missing-value message
_ROW_LABEL = {"groups": "patient id", "strata": "stratum"}


def as_arrays(arrays: Sequence[Any], what: str = "arrays") -> tuple[list[np.ndarray], int]:
    """The arrays as ndarrays with their common number of rows; InputError otherwise."""
    if len(arrays) == 0:
        raise InputError(f"pass at least one array to resample ({what})")
    out = [np.asarray(a) for a in arrays]
    for i, a in enumerate(out):
        if a.ndim == 0:
            raise InputError(f"{what}[{i}] is a scalar; pass arrays with one row per sample")
    n = out[0].shape[0]
    bad = [(i, a.shape[0]) for i, a in enumerate(out) if a.shape[0] != n]
    if bad:
        raise InputError(
            f"all {what} must have the same number of rows; first has {n}, "
            f"but {', '.join(f'[{i}] has {m}' for i, m in bad)}"
        )
    if n == 0:
        raise InputError(f"{what} are empty: nothing to resample")
    return out, n


def check_no_missing(labels: np.ndarray, name: str) -> None:
    """Refuse NaN or None labels: ``np.unique`` would merge them all into one group."""
    missing = pd.isna(labels)
    if missing.any():
        raise InputError(
            f"{name} has {int(missing.sum())} missing value(s) (NaN or None); give every row its "
            f"{_ROW_LABEL.get(name, 'label')}, or drop those rows"
        )


def codes(labels: Any, n: int, name: str) -> np.ndarray:
    """Integer code per row of a 1-D label array of length ``n`` (sorted label order)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise InputError(f"{name} must be a 1-D array with one label per row ({n}), got shape {labels.shape}")
    check_no_missing(labels, name)
    try:
        _, out = np.unique(labels, return_inverse=True)
    except TypeError as exc:  # mixed types that cannot be sorted
        raise InputError(f"{name} labels cannot be compared ({exc}); pass labels of one type") from exc
    return out.ravel().astype(np.int64)


class Resampler:
    """Draws bootstrap row indices: rows, whole groups, within strata."""

    def __init__(self, n: int, groups: Any = None, strata: Any = None):
        gcodes = codes(groups, n, "groups") if groups is not None else np.arange(n, dtype=np.int64)
        n_groups = int(gcodes.max()) + 1
        # rows sorted by group: group g owns order[start[g]:start[g]+count[g]]
        self.order = np.argsort(gcodes, kind="stable")
        self.count = np.bincount(gcodes, minlength=n_groups)
        self.start = np.concatenate([[0], np.cumsum(self.count)[:-1]])
        if strata is None:
            self.strata_groups = [np.arange(n_groups)]
        else:
            scodes = codes(strata, n, "strata")
            # each group must sit in one stratum
            g_first = np.full(n_groups, -1)
            g_first[gcodes] = scodes
            if groups is not None:
                mixed = np.flatnonzero(np.bincount(gcodes, weights=(scodes != g_first[gcodes])) > 0)
                if mixed.size:
                    raise InputError(
                        f"{mixed.size} group(s) span several strata; each group (e.g. patient) must "
                        "belong to one stratum, or resample without strata"
                    )
            self.strata_groups = [np.flatnonzero(g_first == s) for s in range(int(scodes.max()) + 1)]
            self.strata_groups = [g for g in self.strata_groups if g.size]

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        parts = [gs[rng.integers(0, gs.size, gs.size)] for gs in self.strata_groups]
        drawn = parts[0] if len(parts) == 1 else np.concatenate(parts)
        lens = self.count[drawn]
        total = int(lens.sum())
        # positions start[g] .. start[g]+count[g]-1 for each drawn group, vectorised
        offsets = np.repeat(self.start[drawn] - (np.cumsum(lens) - lens), lens)
        return self.order[offsets + np.arange(total)]


def sum_of_squares(values: Any, counts: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Sum of squared deviations from the mean on each resample, and whether it is more than rounding noise.

    The one rule in crslib for "does this column vary" (R^2, correlation and
    calibration slope are undefined where it does not).

    Parameters
    ----------
    values : array-like of shape (n,)
        Numbers.
    counts : array-like of shape (n_resamples, n), optional
        How often each resample drew each value (a bootstrap count matrix);
        default: one resample of every value once.

    Returns
    -------
    ss : ndarray of shape (n_resamples,)
        Sum of squared deviations from the resample's mean, each value
        counted as often as it was drawn.
    varies : ndarray of bool, shape (n_resamples,)
        False where ``ss`` is below 1e-12 of the centred raw sum of squares:
        the rounding noise of a constant, at any scale.

    Notes
    -----
    The values are centred on their overall mean first, which keeps the
    one-pass sums accurate under a large offset (``1e8 + noise``).

    Examples
    --------
    >>> ss, varies = sum_of_squares(np.full(3, 0.1))  # their computed mean is not exactly 0.1
    >>> varies.tolist(), sum_of_squares(1e8 + np.array([-1.0, 0.0, 1.0]))[0].tolist()
    ([False], [2.0])
    """
    v = np.asarray(values)
    weights = np.ones((1, v.size)) if counts is None else np.asarray(counts)
    centred = v - v.mean()
    n_drawn = weights.sum(axis=1)
    mean = weights @ centred / n_drawn
    raw = weights @ (centred * centred)
    ss = raw - n_drawn * mean * mean
    return ss, ss > 1e-12 * raw  # an exact constant has ss = raw = 0, and 0 > 0 is False

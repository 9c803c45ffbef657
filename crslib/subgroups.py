"""Where two encoders agree: the per-image overlap broken down by metadata.

:func:`overlap_by_subgroup` gives the mean overlap with an interval per
level of each metadata column; :func:`overlap_variance_shares` says how much
of the per-image overlap's variance each column explains.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from crslib import stats
from crslib._validation import check_confidence, check_count, per_image_array
from crslib.errors import InputError
from crslib.probes import label_sort_key

__all__ = [
    "overlap_by_subgroup",
    "overlap_variance_shares",
]



# =========================================================================== subgroups


def _check_metadata(metadata: Any, n: int, columns: Any) -> tuple[pd.DataFrame, list[str]]:
    if not isinstance(metadata, pd.DataFrame):
        raise InputError("metadata must be a pandas DataFrame with one row per image")
    if len(metadata) != n:
        raise InputError(f"metadata has {len(metadata)} rows but per_image has {n}; they must match row by row")
    if isinstance(columns, str):
        columns = [columns]
    columns = list(columns)
    if not columns:
        raise InputError("columns is empty; name at least one metadata column (e.g. 'source')")
    missing = [c for c in columns if c not in metadata.columns]
    if missing:
        raise InputError(f"metadata has no column(s) {missing}; available: {list(metadata.columns)}")
    return metadata.reset_index(drop=True), columns


def _check_groups(groups: Any, n: int) -> np.ndarray | None:
    g = None if groups is None else np.asarray(groups)
    if g is not None and g.shape != (n,):
        raise InputError(f"groups must have one label per image ({n}), got shape {g.shape}")
    return g


def overlap_by_subgroup(
    per_image: Any,
    metadata: pd.DataFrame,
    *,
    columns: Sequence[str] | str,
    groups: Any = None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> pd.DataFrame:
    """Mean per-image overlap, count and bootstrap interval per subgroup.

    Parameters
    ----------
    per_image : array-like of shape (N,)
    metadata : DataFrame with N rows (same order)
    columns : str or list of str
        Each column is treated as categorical; every level gets a row
        (missing values form their own level "NaN").
    groups : array-like of shape (N,), optional
        Patient ids for a patient-level bootstrap within each level.
    n_resamples, confidence, random_state
        See :func:`crslib.stats.bootstrap_ci`.

    Returns
    -------
    DataFrame with columns column, level, n, mean, low, high; levels in order
    (numbers by value, before text such as "NaN").

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> meta = pd.DataFrame({"view": ["PA", "AP"] * 50})
    >>> ov = np.where(meta.view == "PA", 0.2, 0.1)
    >>> t = overlap_by_subgroup(ov, meta, columns="view", n_resamples=50)
    >>> t[["level", "n"]].values.tolist(), t["mean"].round(3).tolist()
    ([['AP', 50], ['PA', 50]], [0.1, 0.2])
    """
    x = per_image_array(per_image)
    meta, columns = _check_metadata(metadata, x.shape[0], columns)
    g = _check_groups(groups, x.shape[0])
    rows = []
    for col in columns:
        levels = meta[col].astype(object).where(meta[col].notna(), "NaN")
        for level in sorted(levels.unique(), key=label_sort_key):
            sel = (levels == level).to_numpy()
            res = stats.bootstrap_ci(
                np.mean,
                x[sel],
                n_resamples=n_resamples,
                groups=None if g is None else g[sel],
                confidence=confidence,
                random_state=random_state,
            )
            rows.append(
                {
                    "column": col,
                    "level": level,
                    "n": int(sel.sum()),
                    "mean": float(res.estimate),
                    "low": res.low,
                    "high": res.high,
                }
            )
    return pd.DataFrame(rows, columns=["column", "level", "n", "mean", "low", "high"])


def _one_hot_blocks(meta: pd.DataFrame, columns: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Design matrix [intercept | one-hot(level != first) per column] and each column's block."""
    parts = [np.ones((len(meta), 1))]
    blocks = {}
    start = 1
    for col in columns:
        codes, uniques = pd.factorize(meta[col].astype(object).where(meta[col].notna(), "NaN"), sort=True)
        L = len(uniques)
        if L > 1:
            D = np.zeros((len(meta), L - 1))
            nz = codes > 0
            D[np.flatnonzero(nz), codes[nz] - 1] = 1.0
            parts.append(D)
        blocks[col] = np.arange(start, start + L - 1)
        start += L - 1
    return np.hstack(parts), blocks


def _r2_from_gram(G: np.ndarray, gy: np.ndarray, yy: float, ybar_sum: float, wsum: float, cols: np.ndarray) -> float:
    """R^2 of a weighted OLS on a subset of design columns, from X'WX, X'Wy."""
    sst = yy - ybar_sum**2 / wsum
    if sst <= 0:
        return float("nan")
    Gs = G[np.ix_(cols, cols)]
    gs = gy[cols]
    beta = np.linalg.lstsq(Gs, gs, rcond=None)[0]
    ssr_fit = float(beta @ gs)  # = y'WX beta = explained + mean part
    sse = yy - ssr_fit
    return float(np.clip(1.0 - sse / sst, 0.0, 1.0))


def overlap_variance_shares(
    per_image: Any,
    metadata: pd.DataFrame,
    *,
    columns: Sequence[str] | str,
    groups: Any = None,
    n_resamples: int = 200,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> pd.DataFrame:
    """How much of the per-image overlap variance each factor explains.

    For each factor (a categorical metadata column: source, view, a finding)
    two shares of the total variance of the per-image overlap:

    * ``share_alone``: eta-squared, the R^2 of an OLS on that factor's
      one-hot coding alone (between-level sum of squares / total);
    * ``share_unique``: the drop in R^2 when the factor is removed from the
      joint OLS on all factors (its unique contribution; shares overlap
      when factors are confounded, e.g. a view used mostly at one source).

    A last row ``(all factors)`` gives the joint R^2. Intervals come from a
    bootstrap over images, or over patients with ``groups`` (weights from
    resampling counts).

    Parameters
    ----------
    per_image : array-like of shape (N,)
    metadata : DataFrame with N rows
    columns : str or list of str
        Categorical factors; bin continuous variables first.
    groups : array-like of shape (N,), optional
        Patient ids: resample whole patients. Give them whenever a patient
        has several images; their overlaps are correlated and an image
        bootstrap gives too narrow an interval.
    n_resamples, confidence, random_state
        See :func:`crslib.stats.bootstrap_ci`.

    Returns
    -------
    DataFrame with columns factor, n_levels, share_alone, share_alone_low,
    share_alone_high, share_unique, share_unique_low, share_unique_high.
    One row per factor, then an ``(all factors)`` row whose ``n_levels`` is
    the number of columns of the joint design (intercept plus, per factor,
    its levels minus one) and whose ``share_unique`` columns are NaN.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> meta = pd.DataFrame({"source": rng.integers(0, 3, 300), "view": rng.integers(0, 2, 300)})
    >>> ov = meta.source.to_numpy() * 0.1 + rng.normal(0, 0.001, 300)
    >>> t = overlap_variance_shares(ov, meta, columns=["source", "view"], n_resamples=20)
    >>> t.set_index("factor").share_alone.round(1).to_dict()
    {'source': 1.0, 'view': 0.0, '(all factors)': 1.0}
    """
    x = per_image_array(per_image)
    n = x.shape[0]
    meta, columns = _check_metadata(metadata, n, columns)
    g = _check_groups(groups, n)
    n_resamples = check_count(n_resamples, "n_resamples")
    confidence = check_confidence(confidence)
    if np.ptp(x) == 0:
        raise InputError("per_image overlap is constant: there is no variance to explain")
    D, blocks = _one_hot_blocks(meta, columns)
    p = D.shape[1]
    all_cols = np.arange(p)
    sub = {c: np.concatenate([[0], b]) for c, b in blocks.items()}
    without = {c: np.setdiff1d(all_cols, b) for c, b in blocks.items()}

    def shares(w: np.ndarray) -> np.ndarray:
        Dw = D * w[:, None]
        G = Dw.T @ D
        gy = Dw.T @ x
        yy = float(w @ (x * x))
        ys = float(w @ x)
        ws = float(w.sum())
        full = _r2_from_gram(G, gy, yy, ys, ws, all_cols)
        vals = []
        for c in columns:
            vals.append(_r2_from_gram(G, gy, yy, ys, ws, sub[c]))
            vals.append(full - _r2_from_gram(G, gy, yy, ys, ws, without[c]))
        vals.append(full)
        return np.array(vals)

    # the bootstrap resamples row indices; their counts weight the Gram matrices (no copied rows)
    res = stats.bootstrap_ci(
        lambda idx: shares(np.bincount(idx, minlength=n).astype(float)),
        np.arange(n),
        n_resamples=n_resamples,
        groups=g,
        confidence=confidence,
        random_state=random_state,
    )
    est, lo, hi = res.estimate, res.low, res.high
    rows = []
    for i, c in enumerate(columns):
        a, u = 2 * i, 2 * i + 1
        rows.append(
            {
                "factor": c,
                "n_levels": int(blocks[c].size + 1),
                "share_alone": est[a],
                "share_alone_low": lo[a],
                "share_alone_high": hi[a],
                "share_unique": est[u],
                "share_unique_low": lo[u],
                "share_unique_high": hi[u],
            }
        )
    rows.append(
        {
            "factor": "(all factors)",
            "n_levels": int(p),
            "share_alone": est[-1],
            "share_alone_low": lo[-1],
            "share_alone_high": hi[-1],
            "share_unique": np.nan,
            "share_unique_low": np.nan,
            "share_unique_high": np.nan,
        }
    )
    return pd.DataFrame(rows)

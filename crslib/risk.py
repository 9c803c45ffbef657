"""Representation risk: the encoder as a source of model uncertainty.

Study 3 (LOOKAGAIN-style) treats the choice of image encoder the way one
treats any other modelling choice: plausible encoders map the same images
into different spaces, and a conclusion drawn on one of them may not hold on
another. The workflow implemented here:

1. **Patient-grouped outer partitions.** The images are split into train,
   locked validation and locked test partitions by whole patients
   (:func:`outer_partition`); no patient is in two partitions.
2. **Common dimension control.** Every encoder's embeddings are standardised
   and reduced by PCA to a shared dimension (default 128), both fitted on the
   training rows only (:func:`reduce_dimensions`), so that no encoder wins by
   its width alone.
3. **Several heads per encoder.** A regularised linear model, k-nearest
   neighbours and a small MLP (:data:`HEADS`); their hyperparameters are
   chosen by patient-grouped cross-validation inside the training rows.
4. **Selection on locked validation data.** Every encoder x head candidate is
   scored on the validation partition; the best one is selected. The test
   partition is never read for any choice.
5. **Feature union only with validation evidence.** The reduced features of
   the ``union_size`` best encoders are concatenated and given a linear
   head; the union replaces the best single-encoder candidate only when a
   paired, patient-grouped bootstrap of the validation gain has a lower
   confidence bound above zero.
6. **Paired and split-level uncertainty.** Every candidate is compared with
   the selected one on the same test bootstrap resamples (paired), and the
   whole workflow is repeated on ``n_partitions`` re-drawn partitions
   (:func:`representation_risk`), which shows how much the test score, the
   selected encoder and the encoders' ranking depend on one split.

Everything here is pure: a mapping of precomputed embeddings (one row per
image, rows aligned across encoders), the target and patient ids in; tidy
DataFrames and dicts out. Nothing reads files or loads models. The
partitions and folds come from :mod:`crslib.splits`, the heads from
:mod:`crslib.probes` (for multi-class tasks both through
:mod:`crslib.risk_multiclass`), the metrics from :mod:`crslib.risk_scores`,
the result objects (which save their own tables) from
:mod:`crslib.risk_results`; :func:`crslib.reports.render_risk_html` renders
results as HTML.

Facts about the public LOOKAGAIN-ML software that this module follows (its
code is not copied) are in :data:`crslib.risk_results.LOOKAGAIN_FACTS`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from crslib import stats
from crslib._compat import one_blas_thread
from crslib._validation import check_confidence, check_count, check_fractions, check_groups, check_random_state
from crslib.config import progress_enabled
from crslib.errors import DataError, InputError
from crslib.risk_multiclass import MAX_CLASSES
from crslib.risk_multiclass import folds as _folds
from crslib.risk_multiclass import head as _head
from crslib.risk_multiclass import linear_head as _linear_head
from crslib.risk_multiclass import partition as _partition
from crslib.risk_results import PartitionResult, RiskResult
from crslib.risk_scores import (MULTICLASS, UNION, count_matrix, partition_scores, primary_score, rank_stability,
                                 resampled_primary, spread_and_selection)
from crslib.risk_scores import weighted_auroc as _weighted_auroc  # noqa: F401 - the names tests and callers import
from crslib.risk_scores import weighted_r2 as _weighted_r2  # noqa: F401

log = logging.getLogger(__name__)

__all__ = [
    "TASKS",
    "TASK_TYPES",
    "MAX_CLASSES",
    "HEADS",
    "METRIC_NAMES",
    "outer_partition",
    "reduce_dimensions",
    "evaluate_partition",
    "representation_risk",
]

#: Prediction tasks as results record them: a binary label (``"classification"``), a label with
#: three or more classes (``"multiclass"``), or a continuous target (e.g. age).
TASKS = ("classification", MULTICLASS, "regression")

#: What the ``task`` argument takes: ``"auto"`` guesses from the target (see :func:`evaluate_partition`);
#: ``"classification"`` is also accepted (binary or multi-class, by the number of classes).
TASK_TYPES = ("auto", "binary", MULTICLASS, "regression")

#: Heads fitted on every encoder's reduced features.
HEADS = ("linear", "knn", "mlp")

#: Primary (selection) and secondary metric of each task.
METRIC_NAMES = {"classification": ("auroc", "accuracy"), MULTICLASS: ("macro_auroc", "balanced_accuracy"),
                "regression": ("r2", "mae")}



# --------------------------------------------------------------------------- validation


def _check_embeddings(embeddings: Any) -> tuple[dict[str, np.ndarray], int]:
    if not isinstance(embeddings, Mapping) or len(embeddings) == 0:
        raise InputError(
            "embeddings must be a non-empty mapping of encoder name -> array of shape (n_images, n_features), "
            f"e.g. {{'resnet50': X1, 'vit_b16': X2}}; got {type(embeddings).__name__}"
            + (" with no encoders" if isinstance(embeddings, Mapping) else "")
        )
    out: dict[str, np.ndarray] = {}
    for name, X in embeddings.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"encoder names must be non-empty strings, got {name!r}")
        if name == UNION:
            raise InputError(f"the encoder name {UNION!r} is reserved for the feature union; rename that encoder")
        try:
            arr = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"embeddings of {name!r} are not numeric ({exc}); pass a float array") from exc
        if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
            raise InputError(
                f"embeddings of {name!r} must be a 2-D array (n_images, n_features), got shape {arr.shape}"
            )
        bad = ~np.isfinite(arr)
        if bad.any():
            rows = np.flatnonzero(bad.any(axis=1))
            raise InputError(
                f"embeddings of {name!r} hold NaN or infinite values in {rows.size} row(s) "
                f"(first: {rows[:5].tolist()}); re-extract them or drop those images from every encoder, y and groups"
            )
        out[name] = arr
    sizes = {name: arr.shape[0] for name, arr in out.items()}
    if len(set(sizes.values())) > 1:
        raise InputError(
            f"encoders have different numbers of rows ({', '.join(f'{k}: {v}' for k, v in sizes.items())}); "
            "the embeddings must be row-aligned: one row per image, in the same order for every encoder"
        )
    return out, next(iter(sizes.values()))


def _guess_task(arr: np.ndarray, unique: np.ndarray) -> str:
    """``task="auto"``: two values binary; text, or integers with up to MAX_CLASSES values, multi-class; else regression."""
    if unique.size == 2:
        return "classification"
    kind = pd.api.types.infer_dtype(arr, skipna=True)
    if kind not in ("integer", "floating", "mixed-integer-float", "decimal"):
        return MULTICLASS
    return MULTICLASS if kind == "integer" and unique.size <= MAX_CLASSES else "regression"


def _check_target(y: Any, n: int, task: str) -> tuple[np.ndarray, str, list[Any] | None]:
    """Target as 0/1 int (binary), class codes 0..k-1 (multi-class) or float (regression), the task, the classes."""
    if task not in TASK_TYPES + ("classification",):
        raise InputError(f"unknown task {task!r}; choose {', '.join(repr(t) for t in TASK_TYPES)} (or "
                         "'classification': binary or multi-class by the number of classes)")
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise InputError(f"y must be a 1-D array with one value per image, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise InputError(f"y has {arr.shape[0]} values but the embeddings have {n} rows; pass one target per image")
    missing = pd.isna(arr)
    if missing.any():
        raise InputError(
            f"y has {int(missing.sum())} missing value(s) (first at row {int(np.flatnonzero(missing)[0])}); "
            "drop those images from y, groups and every encoder's embeddings"
        )
    try:
        unique = np.unique(arr)
    except TypeError as exc:
        raise InputError(f"y mixes values that cannot be compared ({exc}); pass one type") from exc
    if unique.size < 2:
        raise InputError(f"y is constant (every value is {unique.tolist()[0]!r}): there is nothing to predict")
    if task == "auto":
        task = _guess_task(arr, unique)
    elif task == "classification":
        task = "classification" if unique.size == 2 else MULTICLASS
    if task == "binary":
        if unique.size != 2:
            raise InputError(
                f"task='binary' needs a binary target, but y has {unique.size} distinct values; use "
                "task='multiclass' for a label with more classes or task='regression' for a continuous target"
            )
        task = "classification"
    if task == "classification":
        return (arr == unique[1]).astype(np.int64), task, unique.tolist()
    if task == MULTICLASS:
        if unique.size < 3:
            raise InputError(f"task='multiclass' needs at least 3 classes, but y has {unique.size}; use task='binary'")
        return np.searchsorted(unique, arr).astype(np.int64), task, unique.tolist()
    try:
        values = arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"task='regression' needs a numeric target; y cannot be read as numbers ({exc})") from exc
    if not np.isfinite(values).all():
        raise InputError("y holds infinite values; a regression target must be finite")
    if not np.ptp(values) > 0:
        raise InputError("y has zero variance: there is nothing to predict")
    return values, task, None


def _check_heads(heads: Any) -> tuple[str, ...]:
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    unknown = [h for h in heads if h not in HEADS]
    if unknown or not heads:
        raise InputError(f"heads must be a non-empty subset of {', '.join(HEADS)}, got {list(heads)}")
    return tuple(dict.fromkeys(heads))


def _check_seed(random_state: Any) -> int:
    """The integer seed of a run: ``random_state`` itself, or a fresh one when it is None.

    None draws a seed from the operating system's entropy, as scikit-learn
    does, but the drawn integer is what the result records (``random_state``
    of every :class:`PartitionResult`, ``settings["random_state"]``), so the
    run can be repeated exactly by passing it back.
    """
    seed = check_random_state(random_state)
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**31)
        log.info("random_state=None: drew seed %d (pass it as random_state to repeat this run)", seed)
    return seed


def _check_union_size(union_size: Any) -> int:
    if isinstance(union_size, bool) or not isinstance(union_size, (int, np.integer)) or union_size in (1,) \
            or union_size < 0:
        raise InputError(f"union_size must be 0 (no feature union) or an integer >= 2, got {union_size!r}")
    return int(union_size)


# --------------------------------------------------------------------------- partitions


def outer_partition(
    y: Any,
    *,
    groups: Any,
    task: str = "auto",
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    random_state: int | None = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Patient-grouped train / locked validation / locked test row indices.

    All images of a patient land in one partition. For a binary label the
    patients are stratified by their label (1 when any of their images is
    positive), for a multi-class label by the class of most of their images,
    and each stratum is split by :func:`crslib.splits.grouped_partition`
    with the same fractions, so that every partition holds every class; no
    retry with another seed is needed. Regression targets are split without
    strata.

    Parameters
    ----------
    y : array-like of shape (n_images,)
        Binary or multi-class label, or continuous target.
    groups : array-like of shape (n_images,)
        Patient id per image (``None``: every image is its own patient).
    task : {"auto", "binary", "multiclass", "regression", "classification"}
        As in :func:`evaluate_partition`.
    fractions : sequence of 3 float
        Relative shares of patients in train, validation and test.
    random_state : int or None
        Seed of the patient shuffle (None: a fresh seed each call).

    Returns
    -------
    train_idx, val_idx, test_idx : ndarray of int64
        Sorted row indices.

    Raises
    ------
    DataError
        Fewer than :data:`crslib.splits.MIN_PATIENTS` patients, too few patients of a class
        to fill every partition, or a partition with a constant target; the
        message says how many patients are needed.

    Examples
    --------
    >>> y = np.tile([0, 1], 20)
    >>> tr, va, te = outer_partition(y, groups=np.arange(40), random_state=0)
    >>> len(tr) + len(va) + len(te), sorted(set(y[va].tolist()))
    (40, [0, 1])
    """
    y_arr = np.asarray(y)
    yv, task, _ = _check_target(y_arr, y_arr.shape[0] if y_arr.ndim == 1 else -1, task)
    g = check_groups(groups, yv.shape[0])
    return _partition(yv, g, task, check_fractions(fractions), _check_seed(random_state))


def _check_partition(partition: Any, n: int, g: np.ndarray, y: np.ndarray, task: str) -> tuple[np.ndarray, ...]:
    try:
        parts = tuple(np.asarray(p) for p in partition)
    except TypeError as exc:
        raise InputError("partition must be three arrays of row indices (train, validation, test)") from exc
    if len(parts) != 3:
        raise InputError(f"partition must be three arrays of row indices (train, validation, test), got {len(parts)}")
    out = []
    for name, p in zip(("train", "validation", "test"), parts):
        if p.dtype == bool:
            p = np.flatnonzero(p)
        if p.ndim != 1 or p.size == 0 or not np.issubdtype(p.dtype, np.integer) or p.min() < 0 or p.max() >= n:
            raise InputError(f"the {name} partition must be a non-empty 1-D array of row indices in [0, {n})")
        out.append(np.sort(p.astype(np.int64)))
    seen = [set(g[p].tolist()) for p in out]
    for (a, sa), (b, sb) in combinations(zip(("train", "validation", "test"), seen), 2):
        shared = sa & sb
        if shared:
            raise InputError(
                f"{len(shared)} patient(s) are in both the {a} and the {b} partition "
                f"(e.g. {sorted(map(str, shared))[:3]}); partitions must be patient-disjoint"
            )
    for name, p in zip(("train", "validation", "test"), out):
        if np.unique(y[p]).size < 2:
            raise DataError(f"the {name} partition holds a constant target; the metrics are undefined there")
        if task == MULTICLASS and np.unique(y[p]).size < int(y.max()) + 1:
            absent = sorted(set(range(int(y.max()) + 1)) - set(np.unique(y[p]).tolist()))
            raise DataError(f"the {name} partition lacks class code(s) {absent}; a multi-class task needs every "
                            "class in every partition (its macro AUROC is undefined otherwise)")
    return tuple(out)


# --------------------------------------------------------------------------- dimension control


def reduce_dimensions(
    X: Any,
    train_idx: Any,
    *,
    n_components: int = 128,
    random_state: int | None = 0,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Standardise and PCA-reduce embeddings, both fitted on the training rows only.

    The common dimension control of the workflow: every encoder is mapped to
    the same number of dimensions, ``min(n_components, n_train - 1,
    n_features)``, so that no encoder wins by its width. Means, scales and
    principal axes come from ``X[train_idx]`` alone; the other rows are only
    transformed, so changing them cannot change the training rows' features.

    Parameters
    ----------
    X : array-like of shape (n_images, n_features)
        Embeddings of one encoder.
    train_idx : array-like of int (or bool mask)
        Training rows.
    n_components : int
        Shared target dimension (LOOKAGAIN-ML uses 128).
    random_state : int or None
        Seed of the randomised SVD that scikit-learn's PCA picks for wide
        inputs (the same seed gives the same components).

    Returns
    -------
    Z : ndarray of shape (n_images, k)
        PCA scores of every row (not whitened).
    info : dict
        ``n_components`` (k), ``n_features``, ``n_train``,
        ``explained_variance`` (share of the training rows' standardised
        variance kept), ``mean``, ``scale``, ``components`` (k x
        n_features), and the fitted ``scaler`` and ``pca`` objects.

    Examples
    --------
    >>> X = np.random.default_rng(0).normal(size=(50, 20))
    >>> Z, info = reduce_dimensions(X, np.arange(30), n_components=8)
    >>> Z.shape, info["n_components"], info["n_train"]
    ((50, 8), 8, 30)
    """
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    X, _ = _check_embeddings({"X": X})
    X = X["X"]
    tr = np.asarray(train_idx)
    if tr.dtype == bool:
        if tr.shape != (X.shape[0],):
            raise InputError(f"a boolean train_idx needs one entry per row ({X.shape[0]}), got shape {tr.shape}")
        tr = np.flatnonzero(tr)
    if tr.ndim != 1 or not np.issubdtype(tr.dtype, np.integer) or (tr.size and (tr.min() < 0 or tr.max() >= X.shape[0])):
        raise InputError(f"train_idx must be a 1-D array of row indices in [0, {X.shape[0]})")
    if np.unique(tr).size < 2:
        raise InputError(f"PCA needs at least 2 training rows, got {np.unique(tr).size}")
    n_components = check_count(n_components, "n_components")
    k = int(min(n_components, np.unique(tr).size - 1, X.shape[1]))
    scaler = StandardScaler().fit(X[tr])
    S = scaler.transform(X)
    pca = PCA(n_components=k, random_state=_check_seed(random_state)).fit(S[tr])
    Z = pca.transform(S)
    info = {
        "n_components": k,
        "n_features": int(X.shape[1]),
        "n_train": int(tr.size),
        "explained_variance": float(np.sum(pca.explained_variance_ratio_)),
        "mean": scaler.mean_,
        "scale": scaler.scale_,
        "components": pca.components_,
        "scaler": scaler,
        "pca": pca,
    }
    return Z, info


# --------------------------------------------------------------------------- one partition


def _add_scores(table: pd.DataFrame, part: str, task: str, y: np.ndarray, preds: dict[str, np.ndarray],
                samples: dict[str, np.ndarray], confidence: float) -> None:
    """Add ``{part}_score``, ``_low``, ``_high`` (primary metric), ``_secondary`` and ``_undefined`` columns in place."""
    names = table["candidate"].tolist()
    point = [partition_scores(task, y, preds[c]) for c in names]
    low, high, undefined = stats.percentile_interval(np.column_stack([samples[c] for c in names]), confidence)
    table[f"{part}_score"] = [p[0] for p in point]
    table[f"{part}_low"], table[f"{part}_high"] = low, high
    table[f"{part}_secondary"] = [p[1] for p in point]
    # resamples without every class leave the metric undefined: out of the interval, and counted here
    table[f"{part}_undefined"] = undefined.astype(int)


def _union_verdict(diffs: np.ndarray, gain: float, confidence: float) -> dict[str, Any]:
    """The feature-union rule: selected only when its gain's interval lies above zero.

    ``diffs`` are the union's validation score minus the best single
    candidate's on the same resamples; ``gain`` is that difference on the
    validation rows themselves. A positive ``gain`` alone is not enough: the
    lower percentile bound at ``confidence`` must be above 0.
    """
    low, high, _ = stats.percentile_interval(diffs, confidence)
    valid = diffs[np.isfinite(diffs)]
    chosen = bool(np.isfinite(low) and low > 0)
    return {"gain": gain, "low": float(low), "high": float(high),
            "share_positive": float(np.mean(valid > 0)) if valid.size else float("nan"), "chosen": chosen,
            "reason": (f"validation gain {gain:+.4f} [{float(low):+.4f}, {float(high):+.4f}]: "
                       + ("lower bound > 0, the union is selected" if chosen
                          else "interval reaches 0 or below, the best single encoder is kept"))}


def _fit_candidates(
    X: dict[str, np.ndarray], y: np.ndarray, task: str, tr: np.ndarray, va: np.ndarray,
    folds: list[tuple[np.ndarray, np.ndarray]], *, heads: tuple[str, ...], n_components: int, union_size: int,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], list[dict[str, Any]], list[str]]:
    """Reduce every encoder, fit every head, then the feature union of the validation-best encoders.

    Returns the candidates' rows, their predictions for every row, the
    reduction table's rows and the union's members (empty without a union).
    """
    rows: list[dict[str, Any]] = []
    preds: dict[str, np.ndarray] = {}
    reduced: dict[str, np.ndarray] = {}
    reduction = []
    for name, Xe in X.items():
        Z, info = reduce_dimensions(Xe, tr, n_components=n_components, random_state=seed)
        reduced[name] = Z
        reduction.append({"encoder": name, "n_features": info["n_features"], "n_components": info["n_components"],
                          "explained_variance": info["explained_variance"], "n_train": info["n_train"]})
        for head_name in heads:
            pred, param, inner = _head(head_name, Z, y, tr, folds, task, seed)
            cand = f"{name}/{head_name}"
            preds[cand] = pred
            rows.append({"candidate": cand, "encoder": name, "head": head_name, "members": name,
                         "n_features": Z.shape[1], "param": param, "inner_score": inner})

    def val_score(cand: str) -> float:
        return primary_score(task, y[va], preds[cand][va])

    # feature union of the best encoders (each scored by its validation-best head), with a linear head
    k_union = min(union_size, len(X))
    union_members: list[str] = []
    if k_union >= 2:
        best_by_encoder = {name: max(val_score(f"{name}/{h}") for h in heads) for name in X}
        ranked = sorted(X, key=lambda name: -np.nan_to_num(best_by_encoder[name], nan=-np.inf))
        union_members = ranked[:k_union]
        Zu = np.hstack([reduced[m] for m in union_members])
        pred, param, inner = _linear_head(Zu, y, tr, folds, task)
        cand = f"{UNION}/linear"
        preds[cand] = pred
        rows.append({"candidate": cand, "encoder": UNION, "head": "linear", "members": "+".join(union_members),
                     "n_features": Zu.shape[1], "param": param, "inner_score": inner})
    return rows, preds, reduction, union_members


def _select(table: pd.DataFrame, preds: dict[str, np.ndarray], y: np.ndarray, g: np.ndarray, va: np.ndarray,
            task: str, union_members: list[str], *, union_size: int, n_encoders: int, n_resamples: int,
            confidence: float, seed: int) -> tuple[str, dict[str, Any]]:
    """Validation only: scores, CIs and ranks (added to ``table``), the selection and the union decision.

    The same patient-grouped resamples serve every candidate, so the union's
    gain over the best single candidate is paired.
    """
    names = table["candidate"].tolist()
    counts_val = count_matrix(g[va], n_resamples, seed)
    val_samples = {c: resampled_primary(task, y[va], preds[c][va], counts_val) for c in names}
    _add_scores(table, "val", task, y[va], {c: p[va] for c, p in preds.items()}, val_samples, confidence)
    table["val_rank"] = table["val_score"].rank(ascending=False, method="first", na_option="bottom").astype(int)

    single = table[table["encoder"] != UNION]
    if not np.isfinite(single["val_score"]).any():  # pragma: no cover - partitions hold both classes
        raise DataError("no candidate has a defined validation score; check the target and the partitions")
    best_single = str(single["candidate"].iloc[int(np.nanargmax(single["val_score"].to_numpy()))])
    selected = best_single
    if union_members:
        cand = f"{UNION}/linear"
        gain = float(table.loc[table["candidate"] == cand, "val_score"].iloc[0] - single["val_score"].max())
        union = {"evaluated": True, "members": union_members, "candidate": cand, "best_single": best_single,
                 **_union_verdict(val_samples[cand] - val_samples[best_single], gain, confidence)}
        if union["chosen"]:
            selected = cand
    else:
        reason = ("union_size is 0" if union_size == 0 else
                  f"only {n_encoders} encoder(s): a feature union needs at least 2")
        union = {"evaluated": False, "members": [], "candidate": None, "best_single": best_single, "gain": float("nan"),
                 "low": float("nan"), "high": float("nan"), "share_positive": float("nan"), "chosen": False,
                 "reason": reason}
    return selected, union


def _test_comparisons(table: pd.DataFrame, preds: dict[str, np.ndarray], y: np.ndarray, g: np.ndarray,
                      te: np.ndarray, task: str, selected: str, *, n_resamples: int, confidence: float,
                      seed: int) -> pd.DataFrame:
    """After the selection: test scores (added to ``table``) and the paired comparisons with the selected one."""
    names = table["candidate"].tolist()
    counts_test = count_matrix(g[te], n_resamples, seed)
    test_samples = {c: resampled_primary(task, y[te], preds[c][te], counts_test) for c in names}
    _add_scores(table, "test", task, y[te], {c: p[te] for c, p in preds.items()}, test_samples, confidence)
    table["selected"] = table["candidate"] == selected

    sel_test = float(table.loc[table["selected"], "test_score"].iloc[0])
    comp_rows = []
    for c, enc, head, score in table[["candidate", "encoder", "head", "test_score"]].itertuples(index=False):
        if c == selected:
            continue
        diffs = test_samples[c] - test_samples[selected]
        low, high, _ = stats.percentile_interval(diffs, confidence)
        valid = diffs[np.isfinite(diffs)]
        comp_rows.append({"candidate": c, "encoder": enc, "head": head, "difference": float(score - sel_test),
                          "low": float(low), "high": float(high),
                          "share_positive": float(np.mean(valid > 0)) if valid.size else float("nan")})
    return pd.DataFrame(comp_rows, columns=["candidate", "encoder", "head", "difference", "low", "high",
                                            "share_positive"])


def _evaluate(
    X: dict[str, np.ndarray],
    y: np.ndarray,
    g: np.ndarray,
    task: str,
    parts: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    heads: tuple[str, ...],
    n_components: int,
    union_size: int,
    inner_splits: int,
    n_resamples: int,
    confidence: float,
    random_state: int,
    classes: list[Any] | None,
    partition: int = 0,
) -> PartitionResult:
    """The workflow on one checked partition: candidates, selection on validation, then the test."""
    tr, va, te = parts
    seed_cv, seed_model, seed_val, seed_test = (int(s) for s in np.random.SeedSequence(random_state).generate_state(4))
    inner = _folds(y[tr], g[tr], task, inner_splits, seed_cv)
    metric, secondary = METRIC_NAMES[task]
    rows, preds, reduction, union_members = _fit_candidates(
        X, y, task, tr, va, inner, heads=heads, n_components=n_components, union_size=union_size, seed=seed_model)
    table = pd.DataFrame(rows)
    selected, union = _select(table, preds, y, g, va, task, union_members, union_size=union_size, n_encoders=len(X),
                              n_resamples=n_resamples, confidence=confidence, seed=seed_val)
    # the selection is final: now the test labels are read, for every candidate (reporting only)
    comparisons = _test_comparisons(table, preds, y, g, te, task, selected, n_resamples=n_resamples,
                                    confidence=confidence, seed=seed_test)
    return PartitionResult(
        candidates=table, selected=selected, union=union, comparisons=comparisons,
        reduction=pd.DataFrame(reduction), train_idx=tr, val_idx=va, test_idx=te, predictions=preds,
        task=task, metric=metric, secondary_metric=secondary, classes=classes, partition=partition,
        random_state=random_state, n_resamples=n_resamples, confidence=confidence,
    )

def _check_options(heads, n_components, union_size, fractions, inner_splits, n_resamples, confidence, random_state):
    return dict(
        heads=_check_heads(heads),
        n_components=check_count(n_components, "n_components"),
        union_size=_check_union_size(union_size),
        fractions=check_fractions(fractions),
        inner_splits=check_count(inner_splits, "inner_splits", minimum=2),
        n_resamples=check_count(n_resamples, "n_resamples"),
        confidence=check_confidence(confidence),
        random_state=_check_seed(random_state),
    )


def evaluate_partition(
    embeddings: Mapping[str, Any],
    y: Any,
    *,
    groups: Any,
    task: str = "auto",
    heads: Sequence[str] = HEADS,
    n_components: int = 128,
    union_size: int = 2,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    partition: Sequence[Any] | None = None,
    inner_splits: int = 3,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> PartitionResult:
    """Benchmark, select and compare encoder x head candidates on one partition.

    Steps: a patient-grouped train / validation / test partition
    (:func:`outer_partition`, or ``partition``); per encoder, standardisation
    and PCA fitted on the training rows (:func:`reduce_dimensions`); per
    head, hyperparameters chosen by patient-grouped inner CV on the
    training rows; the feature union of the ``union_size`` encoders with the
    best validation scores, with a linear head; selection of the best
    single-encoder candidate by validation score, replaced by the union only
    when the paired validation bootstrap of its gain has a lower bound > 0;
    test scores of every candidate with CIs and paired comparisons against
    the selected one. Test labels are read only after the selection.

    Heads (all fitted on the training rows only):

    * ``"linear"``: standardised features, then ``LogisticRegression``
      (``C`` in 0.01, 0.1, 1, 10) or ``Ridge`` (``alpha`` in 0.1 ... 1000),
      chosen by inner-CV AUROC or R^2;
    * ``"knn"``: mean label (the share of positives, for classification) or
      mean target of the k nearest training rows in the reduced space
      (Euclidean), ``k`` in 5, 15, 31 chosen by inner CV;
    * ``"mlp"``: standardised features, one hidden layer of 64 units, L-BFGS,
      ``alpha=1e-3``, ``max_iter=200``, no early stopping, fixed settings (no
      inner CV); regression targets are standardised on the training rows.

    For a multi-class task every head predicts one probability per class
    (multinomial logistic regression, the class shares among the k nearest
    rows, an MLP classifier; ``predictions`` hold (n_images, k) arrays) and
    the inner CV and the selection use the macro one-vs-rest AUROC.

    The inner CV uses ``inner_splits`` patient-grouped folds
    (``StratifiedGroupKFold`` for classification, ``GroupKFold`` for
    regression), the same for every encoder; with fewer patients than folds
    the defaults (``C=1``, ``alpha=10``, ``k=15``) are used.

    Parameters
    ----------
    embeddings : mapping of str -> array-like of shape (n_images, n_features)
        Precomputed embeddings per encoder, rows aligned across encoders.
    y : array-like of shape (n_images,)
        A binary label (two distinct values; the second in sorted order is
        the positive class), a multi-class label (three or more classes,
        coded 0 .. k-1 in sorted order) or a continuous target.
    groups : array-like of shape (n_images,)
        Patient id per image (``None``: every image is its own patient).
    task : {"auto", "binary", "multiclass", "regression", "classification"}
        ``"auto"`` guesses from ``y``: two distinct values are a binary task;
        text, or integers with 3 to :data:`MAX_CLASSES` (20) distinct values,
        a multi-class task; other numbers (floats, or integers with more
        values) a regression task. ``"classification"`` means binary or
        multi-class by the number of classes. A binary task is scored by
        AUROC (primary, used for selection) and accuracy at 0.5 and is
        recorded as ``task="classification"``; a multi-class task by the
        macro one-vs-rest AUROC of the class probabilities and the balanced
        accuracy of their argmax (``task="multiclass"``); regression by R^2
        (primary) and mean absolute error. A bootstrap resample without
        every class leaves the primary metric undefined: it is left out of
        the interval and counted in ``val_undefined`` / ``test_undefined``.
    heads : sequence of str
        Subset of :data:`HEADS`.
    n_components : int
        Shared PCA dimension (capped by the training rows and each encoder's
        width).
    union_size : int
        Encoders in the feature union; 0 disables it.
    fractions : sequence of 3 float
        Shares of patients in train, validation and test.
    partition : tuple of 3 arrays, optional
        Precomputed (train, validation, test) row indices, e.g. an official
        split; they must be patient-disjoint. Default: :func:`outer_partition`.
    inner_splits : int
        Folds of the inner CV.
    n_resamples : int
        Patient-grouped bootstrap resamples (drawn once per partition and
        shared by every candidate, so comparisons are paired).
    confidence : float
        CI level.
    random_state : int or None
        Seed of the partition; the inner folds, the models, and the
        bootstraps use seeds derived from it. None draws a fresh seed and
        records it in the result's ``random_state``.

    Returns
    -------
    PartitionResult

    Notes
    -----
    The union's members are picked on the same validation rows on which its
    gain is then tested, which favours the union a little; the best single
    candidate is the maximum of many validation scores, which favours it.
    Requiring a lower confidence bound above zero keeps the union out unless
    its gain is clear. BLAS and OpenMP run single-threaded during the call
    (small matrices; measured faster on the 2-core reference machine).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 60)
    >>> emb = {"good": rng.normal(size=(120, 5)) + y[:, None], "noise": rng.normal(size=(120, 5))}
    >>> res = evaluate_partition(emb, y, groups=np.arange(120), heads=["linear"], n_resamples=100)
    >>> res.selected, res.candidates["candidate"].tolist()
    ('good/linear', ['good/linear', 'noise/linear', 'union/linear'])
    """
    X, n = _check_embeddings(embeddings)
    yv, task, classes = _check_target(y, n, task)
    g = check_groups(groups, n)
    opts = _check_options(heads, n_components, union_size, fractions, inner_splits, n_resamples, confidence,
                          random_state)
    if partition is None:
        parts = _partition(yv, g, task, opts.pop("fractions"), opts["random_state"])
    else:
        opts.pop("fractions")
        parts = _check_partition(partition, n, g, yv, task)
    with one_blas_thread():
        return _evaluate(X, yv, g, task, parts, classes=classes, **opts)


# --------------------------------------------------------------------------- repeated partitions


def representation_risk(
    embeddings: Mapping[str, Any],
    y: Any,
    *,
    groups: Any,
    task: str = "auto",
    heads: Sequence[str] = HEADS,
    n_components: int = 128,
    union_size: int = 2,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    n_partitions: int = 10,
    inner_splits: int = 3,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    random_state: int | None = 0,
    progress: bool | None = None,
) -> RiskResult:
    """The representation-risk workflow on repeated patient-grouped partitions.

    Runs :func:`evaluate_partition` on ``n_partitions`` partitions; partition
    ``i`` re-draws train / validation / test with seed ``random_state + i``
    (partition 0 is the primary one, reported in full). Across partitions it
    reports the spread of every candidate's test score, how often each
    encoder (or the union) is selected, and how stable the encoders' ranking
    is.

    Parameters
    ----------
    embeddings, y, groups, task, heads, n_components, union_size, fractions, inner_splits, n_resamples, confidence
        As in :func:`evaluate_partition`.
    n_partitions : int
        Number of partitions (LOOKAGAIN-style default: 10).
    random_state : int or None
        Seed of partition 0. None draws a fresh seed and records it in
        ``settings["random_state"]``, so the run can be repeated.
    progress : bool, optional
        Show a tqdm bar over partitions; default: only when stderr is a
        terminal and not in CI.

    Returns
    -------
    RiskResult

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 60)
    >>> emb = {"good": rng.normal(size=(120, 5)) + y[:, None], "noise": rng.normal(size=(120, 5))}
    >>> res = representation_risk(emb, y, groups=np.arange(120), heads=["linear"], n_partitions=3, n_resamples=100)
    >>> res.selection_counts[["encoder", "count"]].values.tolist()
    [['good', 3], ['noise', 0], ['union', 0]]
    """
    from tqdm import tqdm

    X, n = _check_embeddings(embeddings)
    yv, task, classes = _check_target(y, n, task)
    g = check_groups(groups, n)
    opts = _check_options(heads, n_components, union_size, fractions, inner_splits, n_resamples, confidence,
                          random_state)
    n_partitions = check_count(n_partitions, "n_partitions")
    fractions_, seed = opts.pop("fractions"), opts.pop("random_state")
    results = []
    with one_blas_thread():
        for i in tqdm(range(n_partitions), desc="representation risk", unit="partition",
                      disable=not progress_enabled(progress), leave=False):
            parts = _partition(yv, g, task, fractions_, seed + i)
            results.append(_evaluate(X, yv, g, task, parts, classes=classes, random_state=seed + i, partition=i,
                                     **opts))
            log.info("partition %d: selected %s", i, results[-1].selected)

    all_partitions, spread, selection_counts = spread_and_selection(results, list(X))
    ranks, rank_correlation = rank_stability(results, list(X))
    metric, secondary = METRIC_NAMES[task]
    settings = {"heads": list(opts["heads"]), "n_components": opts["n_components"], "union_size": opts["union_size"],
                "fractions": list(fractions_), "n_partitions": n_partitions, "inner_splits": opts["inner_splits"],
                "n_resamples": opts["n_resamples"], "confidence": opts["confidence"], "random_state": seed,
                "n_images": n, "n_patients": int(np.unique(g).size), "encoders": list(X),
                "classes": None if classes is None else [str(c) for c in classes]}
    return RiskResult(
        primary=results[0], partitions=results, all_partitions=all_partitions, spread=spread,
        selection_counts=selection_counts, rank_stability=ranks, rank_correlation=rank_correlation,
        task=task, metric=metric, secondary_metric=secondary, settings=settings,
    )

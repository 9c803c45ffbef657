"""Input checks of the representation-risk workflow (:mod:`crslib.risk`).

Embeddings, the target and its task, heads, combinations, the selection
loss, seeds and precomputed partitions are checked here, so that a user's
mistake surfaces as one :class:`crslib.errors.InputError` (or
:class:`crslib.errors.DataError` for data that cannot support the task)
that says what to pass instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from crslib._validation import check_confidence, check_count, check_fractions, check_random_state
from crslib.errors import DataError, InputError
from crslib.risk_multiclass import MAX_CLASSES
from crslib.risk_scores import DEFAULT_LOSS, LOSSES, MULTICLASS, UNION
from crslib.risk_select import COMBINATIONS

log = logging.getLogger("crslib.risk")

#: What the ``task`` argument takes: ``"auto"`` guesses from the target (see :func:`evaluate_partition`);
#: ``"classification"`` is also accepted (binary or multi-class, by the number of classes).
TASK_TYPES = ("auto", "binary", MULTICLASS, "regression")

#: Heads fitted on every encoder's reduced features.
HEADS = ("linear", "knn", "mlp")


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


def _check_task(task: Any) -> None:
    """InputError unless ``task`` is one of :data:`TASK_TYPES` or ``"classification"``."""
    if task not in TASK_TYPES + ("classification",):
        raise InputError(f"unknown task {task!r}; choose {', '.join(repr(t) for t in TASK_TYPES)} (or "
                         "'classification': binary or multi-class by the number of classes)")


def _check_target(y: Any, n: int, task: str) -> tuple[np.ndarray, str, list[Any] | None]:
    """Target as 0/1 int (binary), class codes 0..k-1 (multi-class) or float (regression), the task, the classes."""
    _check_task(task)
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


def _check_combinations(combinations: Any) -> tuple[str, ...]:
    kinds = (combinations,) if isinstance(combinations, str) else tuple(combinations)
    unknown = [c for c in kinds if c not in COMBINATIONS]
    if unknown:
        raise InputError(f"combinations must be a subset of {', '.join(COMBINATIONS)}, got {list(kinds)}")
    return tuple(dict.fromkeys(kinds))


def _check_loss(loss: Any, task: str) -> str:
    """The selection loss: ``"auto"`` is log loss for classification and MSE for regression."""
    if loss == "auto":
        return DEFAULT_LOSS[task]
    if loss not in LOSSES[task]:
        raise InputError(f"loss {loss!r} does not score a {task} task; choose auto or {', '.join(LOSSES[task])}")
    return str(loss)


def _check_options(heads, n_components, union_size, combinations, fractions, inner_splits, n_resamples, confidence,
                   random_state):
    return dict(
        heads=_check_heads(heads),
        n_components=check_count(n_components, "n_components"),
        union_size=_check_union_size(union_size),
        combinations=_check_combinations(combinations),
        fractions=check_fractions(fractions),
        inner_splits=check_count(inner_splits, "inner_splits", minimum=2),
        n_resamples=check_count(n_resamples, "n_resamples"),
        confidence=check_confidence(confidence),
        random_state=_check_seed(random_state),
    )



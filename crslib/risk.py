"""Representation risk: the encoder as a source of model uncertainty.

Study 3 treats the choice of image encoder the way one
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
   chosen by patient-grouped cross-validation inside the training rows, by
   the selection loss, each inner fold with a scaler and PCA fitted on its
   own fitting rows only.
4. **Combinations of encoders.** The prediction-level combinations of
   :mod:`crslib.risk_select` (the average, a greedy average chosen by
   forward selection on validation, and a linear stack fitted on the
   encoders' out-of-fold training predictions) and a feature union (the
   reduced features of the ``union_size`` encoders with the lowest
   validation loss, concatenated, with a linear head).
5. **Selection on locked validation data by a proper score.** Log loss
   (classification) or MSE / MAE (regression); within the bootstrap noise
   of the best single candidate the simpler one is kept, and a combination
   replaces it only when a paired, patient-grouped bootstrap of its
   validation gain has a lower confidence bound above zero (crslib's guard;
   :func:`crslib.risk_select.select_candidate`). The test partition is
   never read for any choice. The choice is then refitted on train +
   validation (:func:`refit_prediction`) and both fits are scored on test.
6. **Paired and split-level uncertainty.** Every candidate is compared with
   the selected one on the same test bootstrap resamples (paired), the
   study's metric panel is reported with patient-grouped intervals
   (:mod:`crslib.risk_metrics`), and the whole workflow is repeated on
   ``n_partitions`` re-drawn partitions (:func:`representation_risk`; 12
   by default, as the study's software does), which shows how much the
   test score, the selected candidate and the encoders' ranking depend on
   one split.

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
from typing import Any

import numpy as np
import pandas as pd

from crslib import stats
from crslib._compat import one_blas_thread
from crslib._validation import check_count, check_fractions, check_groups
from crslib.config import progress_enabled
from crslib.errors import InputError
from crslib.risk_inputs import (HEADS, TASK_TYPES, _check_combinations, _check_embeddings, _check_heads,  # noqa: F401
                                _check_loss, _check_options, _check_partition, _check_seed, _check_target,
                                _check_union_size)
from crslib.risk_multiclass import MAX_CLASSES
from crslib.risk_multiclass import folds as _folds
from crslib.risk_multiclass import head as _head
from crslib.risk_multiclass import partition as _partition
from crslib.risk_metrics import metric_panel
from crslib.risk_results import PartitionResult, RiskResult
from crslib.risk_scores import (MULTICLASS, UNION, count_matrix, partition_scores, rank_stability,
                                resampled_primary, row_losses, spread_and_selection)
from crslib.risk_select import COMBINATIONS, average_prediction, fit_stack, greedy_members, select_candidate
from crslib.risk_scores import weighted_auroc as _weighted_auroc  # noqa: F401 - the names tests and callers import
from crslib.risk_scores import weighted_r2 as _weighted_r2  # noqa: F401

log = logging.getLogger(__name__)

__all__ = [
    "TASKS",
    "TASK_TYPES",
    "MAX_CLASSES",
    "HEADS",
    "METRIC_NAMES",
    "COMBINATIONS",
    "outer_partition",
    "reduce_dimensions",
    "refit_prediction",
    "evaluate_partition",
    "representation_risk",
]

#: Prediction tasks as results record them: a binary label (``"classification"``), a label with
#: three or more classes (``"multiclass"``), or a continuous target (e.g. age).
TASKS = ("classification", MULTICLASS, "regression")



#: Primary (selection) and secondary metric of each task.
METRIC_NAMES = {"classification": ("auroc", "accuracy"), MULTICLASS: ("macro_auroc", "balanced_accuracy"),
                "regression": ("r2", "mae")}



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
    yv, task, _ = _check_target(y_arr, y_arr.size, task)  # a y that is not 1-D is refused before its size counts
    g = check_groups(groups, yv.shape[0])
    return _partition(yv, g, task, check_fractions(fractions), _check_seed(random_state))


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


def _param_value(head: str, param: str) -> float | None:
    """The numeric hyperparameter behind ``"C=0.1"``, ``"alpha=10"`` or ``"k=15"`` (None for the MLP)."""
    return None if head == "mlp" else float(param.split("=", 1)[1])


def _reduce_folds(Xe: np.ndarray, tr: np.ndarray, folds: list, n_components: int, seed: int) -> list[np.ndarray]:
    """Per inner fold, the training rows reduced by a scaler and PCA fitted on that fold's fitting rows only."""
    return [reduce_dimensions(Xe[tr], fit, n_components=n_components, random_state=seed)[0] for fit, _ in folds]


def _combinations(base: dict[str, np.ndarray], base_params: dict[str, float | None], fold_reduced: dict, y, task,
                  tr, va, folds, *, base_head: str, kinds: tuple[str, ...], loss: str, seed: int):
    """The prediction-level combinations of the encoders' base heads: rows, predictions, recipes, reasons not fitted."""
    rows, preds, recipes, not_fitted = [], {}, {}, []
    names = list(base)

    def add(kind: str, members: list[str], pred: np.ndarray, param: str, recipe: dict) -> None:
        cand = f"{kind}/{base_head}"
        preds[cand], recipes[cand] = pred, {"kind": kind, "members": members, **recipe}
        rows.append({"candidate": cand, "encoder": kind, "head": base_head, "kind": kind,
                     "members": "+".join(members), "n_members": len(members), "n_features": len(members),
                     "param": param, "inner_loss": float("nan")})

    for kind in kinds:
        if len(names) < 2:
            not_fitted.append({"candidate": kind, "reason": f"a combination needs at least 2 encoders, got {len(names)}"})
        elif kind == "average":
            add(kind, names, average_prediction([base[n] for n in names]), "equal weights", {})
        elif kind == "greedy":
            members = greedy_members({n: base[n][va] for n in names}, y[va], task, loss)
            if len(members) < 2:
                not_fitted.append({"candidate": kind, "reason": f"forward selection on validation kept one encoder "
                                                                 f"({members[0]}): no combination"})
            else:
                add(kind, members, average_prediction([base[n] for n in members]), "forward selection", {})
        elif not folds:
            not_fitted.append({"candidate": kind, "reason": "no inner folds (too few training patients per "
                                                             "class): no out-of-fold predictions to stack"})
        else:
            oof = {}
            for n in names:
                oof[n] = np.zeros(base[n][tr].shape)
                for i, (fit, val) in enumerate(folds):
                    pred, _, _ = _head(base_head, fold_reduced[n][i], y[tr], fit, [], task, seed,
                                       param=base_params[n])
                    oof[n][val] = pred[val]
            stack = fit_stack(oof, y[tr], task)
            add(kind, names, stack(base), "linear stack", {"stack": stack})
    return rows, preds, recipes, not_fitted


def _fit_candidates(
    X: dict[str, np.ndarray], y: np.ndarray, task: str, tr: np.ndarray, va: np.ndarray,
    folds: list[tuple[np.ndarray, np.ndarray]], *, heads: tuple[str, ...], n_components: int, union_size: int,
    combinations: tuple[str, ...], loss: str, seed: int,
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], list[dict[str, Any]], dict[str, dict], list[dict]]:
    """Reduce every encoder, fit every head, the prediction-level combinations, then the feature union.

    Returns the candidates' rows, their predictions for every row, the
    reduction table's rows, each candidate's recipe (what a refit repeats)
    and the combinations that could not be fitted, with the reason.
    """
    rows: list[dict[str, Any]] = []
    preds: dict[str, np.ndarray] = {}
    recipes: dict[str, dict] = {}
    reduced, fold_reduced, reduction = {}, {}, []

    def neg_loss(truth: np.ndarray, pred: np.ndarray) -> float:
        # the inner CV ranks settings by the same proper score as the selection (higher is better here)
        return -float(np.mean(row_losses(task, truth, pred, loss)))

    for name, Xe in X.items():
        Z, info = reduce_dimensions(Xe, tr, n_components=n_components, random_state=seed)
        reduced[name], fold_reduced[name] = Z, _reduce_folds(Xe, tr, folds, n_components, seed)
        reduction.append({"encoder": name, "n_features": info["n_features"], "n_components": info["n_components"],
                          "explained_variance": info["explained_variance"], "n_train": info["n_train"]})
        for head_name in heads:
            pred, param, inner = _head(head_name, Z, y, tr, folds, task, seed, fold_features=fold_reduced[name],
                                       score=neg_loss)
            cand = f"{name}/{head_name}"
            preds[cand] = pred
            recipes[cand] = {"kind": "single", "members": [name], "head": head_name,
                             "param": _param_value(head_name, param)}
            rows.append({"candidate": cand, "encoder": name, "head": head_name, "kind": "single", "members": name,
                         "n_members": 1, "n_features": Z.shape[1], "param": param, "inner_loss": -inner})

    def val_loss(cand: str) -> float:
        return float(np.mean(row_losses(task, y[va], preds[cand][va], loss)))

    base_head = "linear" if "linear" in heads else heads[0]
    base = {name: preds[f"{name}/{base_head}"] for name in X}
    base_params = {name: recipes[f"{name}/{base_head}"]["param"] for name in X}
    c_rows, c_preds, c_recipes, not_fitted = _combinations(
        base, base_params, fold_reduced, y, task, tr, va, folds, base_head=base_head, kinds=combinations, loss=loss,
        seed=seed)
    rows += c_rows
    preds.update(c_preds)
    for cand, recipe in c_recipes.items():
        recipes[cand] = {**recipe, "head": base_head, "base_params": base_params}

    # feature union of the best encoders (each scored by its validation-best head), with a linear head
    k_union = min(union_size, len(X))
    if k_union >= 2:
        best_by_encoder = {name: min(val_loss(f"{name}/{h}") for h in heads) for name in X}
        members = sorted(X, key=lambda name: (best_by_encoder[name], name))[:k_union]
        Zu = np.hstack([reduced[m] for m in members])
        fold_u = [np.hstack([fold_reduced[m][i] for m in members]) for i in range(len(folds))]
        pred, param, inner = _head("linear", Zu, y, tr, folds, task, seed, fold_features=fold_u, score=neg_loss)
        cand = f"{UNION}/linear"
        preds[cand] = pred
        recipes[cand] = {"kind": UNION, "members": members, "head": "linear", "param": _param_value("linear", param)}
        rows.append({"candidate": cand, "encoder": UNION, "head": "linear", "kind": UNION,
                     "members": "+".join(members), "n_members": len(members), "n_features": Zu.shape[1],
                     "param": param, "inner_loss": -inner})
    elif union_size and len(X) < 2:
        not_fitted.append({"candidate": UNION, "reason": f"a feature union needs at least 2 encoders, got {len(X)}"})
    return rows, preds, reduction, recipes, not_fitted


def refit_prediction(recipe: dict[str, Any], X: dict[str, np.ndarray], y: np.ndarray, rows: np.ndarray, task: str,
                     *, n_components: int, seed: int) -> np.ndarray:
    """Refit a candidate on ``rows`` (train + validation) with its chosen settings; prediction for every row.

    The scaler and PCA of every member encoder and its head are fitted again
    on ``rows`` with the hyperparameter chosen on the training rows (no new
    inner CV); a stack keeps its coefficients and refits its base heads, and
    a greedy average keeps its members. Rows outside ``rows`` are only
    predicted, so they cannot change the refitted model.
    """
    def reduced(name: str) -> np.ndarray:
        return reduce_dimensions(X[name], rows, n_components=n_components, random_state=seed)[0]

    kind, members, head_name = recipe["kind"], recipe["members"], recipe["head"]
    if kind == "single":
        return _head(head_name, reduced(members[0]), y, rows, [], task, seed, param=recipe["param"])[0]
    if kind == UNION:
        Zu = np.hstack([reduced(m) for m in members])
        return _head("linear", Zu, y, rows, [], task, seed, param=recipe["param"])[0]
    base = {m: _head(head_name, reduced(m), y, rows, [], task, seed, param=recipe["base_params"][m])[0]
            for m in members}
    if kind == "stack":
        return recipe["stack"](base)
    return average_prediction([base[m] for m in members])


def _union_summary(selection: pd.DataFrame, selected: str, union_size: int, n_encoders: int) -> dict[str, Any]:
    """The feature-union decision as the results have always reported it, now read off the selection table."""
    rows = selection[selection["kind"] == UNION]
    singles = selection[selection["kind"] == "single"]
    kept = str(singles.sort_values(["val_loss", "candidate"])["candidate"].iloc[0])  # the lowest-loss single
    if rows.empty:
        reason = ("union_size is 0" if union_size == 0 else
                  f"only {n_encoders} encoder(s): a feature union needs at least 2")
        return {"evaluated": False, "members": [], "candidate": None, "best_single": kept, "gain": float("nan"),
                "low": float("nan"), "high": float("nan"), "chosen": False, "reason": reason}
    r = rows.iloc[0]
    gain = float(selection.loc[selection["candidate"] == kept, "val_loss"].iloc[0] - r["val_loss"])
    return {"evaluated": True, "members": r["members"].split("+"), "candidate": r["candidate"], "best_single": kept,
            "gain": gain, "low": float(r["gain_low"]), "high": float(r["gain_high"]),
            "chosen": r["candidate"] == selected, "reason": r["why"]}


def _test_comparisons(table: pd.DataFrame, test_samples: dict[str, np.ndarray], selected: str, *,
                      confidence: float) -> pd.DataFrame:
    """After the selection: paired test comparisons of every candidate with the selected one."""
    sel_test = float(table.loc[table["selected"], "test_score"].iloc[0])
    comp_rows = []
    for c, enc, head, score in table[["candidate", "encoder", "head", "test_score"]].itertuples(index=False):
        if c == selected:
            continue
        diffs = test_samples[c] - test_samples[selected]
        low, high, _ = stats.percentile_interval(diffs, confidence)
        comp_rows.append({"candidate": c, "encoder": enc, "head": head, "difference": float(score - sel_test),
                          "low": float(low), "high": float(high), "share_positive": stats.share_positive(diffs)})
    return pd.DataFrame(comp_rows, columns=["candidate", "encoder", "head", "difference", "low", "high",
                                            "share_positive"])


def _dropped(table: pd.DataFrame, metric: str, n_resamples: int) -> pd.DataFrame:
    """Bootstrap resamples left out because the primary metric is undefined on them (a class absent)."""
    out = []
    for part, label in (("val", "validation"), ("test", "test")):
        n = int(table[f"{part}_undefined"].max())
        out.append({"part": label, "metric": metric, "n_resamples": n_resamples, "n_dropped": n,
                    "share": n / n_resamples})
        if n:
            log.info("%s: %d of %d bootstrap resamples lacked a class and were left out of the %s intervals",
                     label, n, n_resamples, metric)
    return pd.DataFrame(out)


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
    combinations: tuple[str, ...],
    loss: str,
    inner_splits: int,
    n_resamples: int,
    confidence: float,
    random_state: int,
    classes: list[Any] | None,
    partition: int = 0,
) -> PartitionResult:
    """The workflow on one checked partition: candidates, selection on validation, refit, then the test."""
    tr, va, te = parts
    seed_cv, seed_model, seed_val, seed_test = (int(s) for s in np.random.SeedSequence(random_state).generate_state(4))
    inner = _folds(y[tr], g[tr], task, inner_splits, seed_cv)
    metric, secondary = METRIC_NAMES[task]
    rows, preds, reduction, recipes, not_fitted = _fit_candidates(
        X, y, task, tr, va, inner, heads=heads, n_components=n_components, union_size=union_size,
        combinations=combinations, loss=loss, seed=seed_model)
    table = pd.DataFrame(rows)
    names = table["candidate"].tolist()

    # validation only: scores for the report, then the selection by the proper score
    counts_val = count_matrix(g[va], n_resamples, seed_val)
    val_samples = {c: resampled_primary(task, y[va], preds[c][va], counts_val) for c in names}
    _add_scores(table, "val", task, y[va], {c: p[va] for c, p in preds.items()}, val_samples, confidence)
    table["val_rank"] = table["val_score"].rank(ascending=False, method="first", na_option="bottom").astype(int)
    val_losses = {c: row_losses(task, y[va], preds[c][va], loss) for c in names}
    selected, selection = select_candidate(table, val_losses, counts_val, loss=loss, confidence=confidence)
    table["val_loss"] = selection["val_loss"].to_numpy()
    union = _union_summary(selection, selected, union_size, len(X))
    refit = refit_prediction(recipes[selected], X, y, np.sort(np.concatenate([tr, va])), task,
                             n_components=n_components, seed=seed_model)

    # the selection is final: now the test labels are read, for every candidate (reporting only)
    counts_test = count_matrix(g[te], n_resamples, seed_test)
    test_samples = {c: resampled_primary(task, y[te], preds[c][te], counts_test) for c in names}
    _add_scores(table, "test", task, y[te], {c: p[te] for c, p in preds.items()}, test_samples, confidence)
    table["test_loss"] = [float(np.mean(row_losses(task, y[te], preds[c][te], loss))) for c in names]
    table["selected"] = table["candidate"] == selected
    comparisons = _test_comparisons(table, test_samples, selected, confidence=confidence)
    refit_table = _refit_table(table, selected, refit, y, te, counts_test, task, loss, confidence,
                               n_train=tr.size, n_fit=tr.size + va.size)
    metrics = pd.concat([
        metric_panel(task, y[te], p[te], g[te], n_resamples=n_resamples, confidence=confidence,
                     random_state=seed_test).assign(fit=fit)
        for fit, p in (("train", preds[selected]), ("train+validation", refit))], ignore_index=True)
    return PartitionResult(
        candidates=table, selected=selected, union=union, comparisons=comparisons,
        reduction=pd.DataFrame(reduction), train_idx=tr, val_idx=va, test_idx=te, predictions=preds,
        task=task, metric=metric, secondary_metric=secondary, classes=classes, partition=partition,
        random_state=random_state, n_resamples=n_resamples, confidence=confidence,
        selection=selection, refit=refit_table, refit_prediction=refit, metrics=metrics[["fit"] + list(
            metrics.columns[:-1])], dropped=_dropped(table, metric, n_resamples),
        not_fitted=pd.DataFrame(not_fitted, columns=["candidate", "reason"]), loss=loss,
    )


def _refit_table(table: pd.DataFrame, selected: str, refit: np.ndarray, y: np.ndarray, te: np.ndarray,
                 counts_test: np.ndarray, task: str, loss: str, confidence: float, *, n_train: int,
                 n_fit: int) -> pd.DataFrame:
    """The selected candidate's test scores as fitted on the training rows and refitted on train + validation."""
    row = table.loc[table["selected"]].iloc[0]
    samples = resampled_primary(task, y[te], refit[te], counts_test)
    low, high, _ = stats.percentile_interval(samples, confidence)
    score, secondary = partition_scores(task, y[te], refit[te])
    return pd.DataFrame([
        {"candidate": selected, "fit": "train", "n_fit": int(n_train), "test_score": row["test_score"],
         "test_low": row["test_low"], "test_high": row["test_high"], "test_secondary": row["test_secondary"],
         "test_loss": row["test_loss"]},
        {"candidate": selected, "fit": "train+validation", "n_fit": int(n_fit), "test_score": score,
         "test_low": float(low), "test_high": float(high), "test_secondary": secondary,
         "test_loss": float(np.mean(row_losses(task, y[te], refit[te], loss)))},
    ])


def evaluate_partition(
    embeddings: Mapping[str, Any],
    y: Any,
    *,
    groups: Any,
    task: str = "auto",
    heads: Sequence[str] = HEADS,
    n_components: int = 128,
    union_size: int = 2,
    combinations: Sequence[str] = COMBINATIONS,
    loss: str = "auto",
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
    training rows (each inner fold reduced by its own fitting rows); the
    prediction-level ``combinations`` of the encoders' linear heads
    (average, greedy average, linear stack on out-of-fold training
    predictions) and the feature union of the ``union_size`` encoders with
    the lowest validation loss; selection by the proper score ``loss`` with
    the tie rule and the evidence rule of
    :func:`crslib.risk_select.select_candidate`; the choice refitted on
    train + validation; test scores of every candidate with CIs, paired
    comparisons against the selected one and the metric panel of both fits.
    Test labels are read only after the selection.

    Heads (all fitted on the training rows only):

    * ``"linear"``: standardised features, then ``LogisticRegression``
      (``C`` in 0.01, 0.1, 1, 10) or ``Ridge`` (``alpha`` in 0.1 ... 1000),
      chosen by the inner-CV selection loss;
    * ``"knn"``: mean label (the share of positives, for classification) or
      mean target of the k nearest training rows in the reduced space
      (Euclidean), ``k`` in 5, 15, 31 chosen by inner CV;
    * ``"mlp"``: standardised features, one hidden layer of 64 units, L-BFGS,
      ``alpha=1e-3``, ``max_iter=200``, no early stopping, fixed settings (no
      inner CV); regression targets are standardised on the training rows.

    For a multi-class task every head predicts one probability per class
    (multinomial logistic regression, the class shares among the k nearest
    rows, an MLP classifier; ``predictions`` hold (n_images, k) arrays); the
    selection loss is the multinomial log loss, and the macro one-vs-rest
    AUROC is reported.

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
        AUROC (primary, reported with every candidate; the selection uses
        ``loss``) and accuracy at 0.5 and is
        recorded as ``task="classification"``; a multi-class task by the
        macro one-vs-rest AUROC of the class probabilities and the balanced
        accuracy of their argmax (``task="multiclass"``); regression by R^2
        (primary) and mean absolute error. A bootstrap resample without
        every class leaves the primary metric undefined: it is left out of
        the interval and counted in ``val_undefined`` / ``test_undefined``
        and in the result's ``dropped`` table.
    heads : sequence of str
        Subset of :data:`HEADS`.
    n_components : int
        Shared PCA dimension (capped by the training rows and each encoder's
        width).
    union_size : int
        Encoders in the feature union; 0 disables it.
    combinations : sequence of str
        Prediction-level combinations to build, a subset of
        :data:`COMBINATIONS` (``()`` for none).
    loss : {"auto", "log_loss", "mse", "mae"}
        Proper score that chooses hyperparameters and the candidate:
        ``"auto"`` is log loss for classification and MSE for regression.
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
    The union's and the greedy average's members are picked on the same
    validation rows on which their gain is then tested, which favours them a
    little; the best single candidate is the minimum of many validation
    losses, which favours it. Requiring a lower confidence bound above zero
    keeps a combination out unless its gain is clear. A proper score also
    rewards calibration: a stack can win by rescaling a shrunken linear head
    (it is fitted on out-of-fold training predictions, so the gain is real
    and not borrowed from validation). BLAS and OpenMP run single-threaded during the call
    (small matrices; measured faster on the 2-core reference machine).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 60)
    >>> emb = {"good": rng.normal(size=(120, 5)) + y[:, None], "noise": rng.normal(size=(120, 5))}
    >>> res = evaluate_partition(emb, y, groups=np.arange(120), heads=["linear"], n_resamples=100)
    >>> res.selected, res.candidates["candidate"].tolist()
    ('good/linear', ['good/linear', 'noise/linear', 'average/linear', 'stack/linear', 'union/linear'])
    >>> res.selection.set_index("candidate").loc["union/linear", "why"].endswith("not selected (crslib's evidence rule)")
    True
    """
    X, n = _check_embeddings(embeddings)
    yv, task, classes = _check_target(y, n, task)
    g = check_groups(groups, n)
    opts = _check_options(heads, n_components, union_size, combinations, fractions, inner_splits, n_resamples,
                          confidence, random_state)
    opts["loss"] = _check_loss(loss, task)
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
    combinations: Sequence[str] = COMBINATIONS,
    loss: str = "auto",
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    n_partitions: int = 12,
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
    encoder (or combination) is selected, and how stable the encoders'
    ranking is.

    Parameters
    ----------
    embeddings, y, groups, task, heads, n_components, union_size, combinations, loss, fractions, inner_splits
        As in :func:`evaluate_partition`; so are ``n_resamples`` and ``confidence``.
    n_partitions : int
        Number of partitions (default 12, the number of repeated partitions
        the study's software uses).
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
    [['good', 3], ['noise', 0], ['average', 0], ['stack', 0], ['union', 0]]
    """
    from tqdm import tqdm

    X, n = _check_embeddings(embeddings)
    yv, task, classes = _check_target(y, n, task)
    g = check_groups(groups, n)
    opts = _check_options(heads, n_components, union_size, combinations, fractions, inner_splits, n_resamples,
                          confidence, random_state)
    opts["loss"] = _check_loss(loss, task)
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
                "combinations": list(opts["combinations"]), "loss": opts["loss"],
                "fractions": list(fractions_), "n_partitions": n_partitions, "inner_splits": opts["inner_splits"],
                "n_resamples": opts["n_resamples"], "confidence": opts["confidence"], "random_state": seed,
                "n_images": n, "n_patients": int(np.unique(g).size), "encoders": list(X),
                "classes": None if classes is None else [str(c) for c in classes]}
    return RiskResult(
        primary=results[0], partitions=results, all_partitions=all_partitions, spread=spread,
        selection_counts=selection_counts, rank_stability=ranks, rank_correlation=rank_correlation,
        task=task, metric=metric, secondary_metric=secondary, settings=settings,
    )

"""Result objects of the representation-risk workflow, and the files they save.

:func:`crslib.risk.evaluate_partition` returns a :class:`PartitionResult`
(one partition: every candidate's scores, the selection, the union decision,
the paired comparisons); :func:`crslib.risk.representation_risk` returns a
:class:`RiskResult` (the workflow repeated on several partitions, with the
spread, selection counts and rank stability). A :class:`RiskResult` writes its
tables with :meth:`RiskResult.save`, which ``crs risk`` and the book's
representation-risk notebook both call, so that both write the same files;
:func:`stability_table` sets several results side by side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib._io import atomic_write_text, json_ready
from crslib.errors import InputError

__all__ = ["LOOKAGAIN_FACTS", "PartitionResult", "RiskResult", "stability_table", "task_type"]

#: Facts about the public LOOKAGAIN-ML software, quoted as its own settings.
LOOKAGAIN_FACTS: dict[str, Any] = {
    "n_encoders": 10,
    "pca_components": 128,
    "pca_fitted_on": "outer training set",
    "n_bootstrap": 2000,
    "cka": "linear CKA on 400 training samples",
    "feature_union": "only through nested validation selection",
    "n_partitions": 12,
    "selection": "lowest validation loss: log loss (classification), MSE or MAE (regression)",
    "refit": "the locked choice refitted on train + validation before the test",
    "combinations": "average, greedy average and linear stack of the encoders' predictions",
}


def task_type(task: str) -> str:
    """The task type a result's ``task`` stands for (a binary task is recorded as ``"classification"``).

    Examples
    --------
    >>> task_type("classification"), task_type("multiclass")
    ('binary', 'multiclass')
    """
    return "binary" if task == "classification" else task


@dataclass
class PartitionResult:
    """The workflow on one patient-grouped train / validation / test partition.

    Attributes
    ----------
    candidates : DataFrame
        One row per candidate (encoder x head, the prediction-level
        combinations ``average``, ``greedy`` and ``stack`` of the encoders'
        base heads, then the feature union): ``candidate``
        (``"encoder/head"``, ``"stack/linear"``; the union is
        ``"union/linear"``), ``encoder`` (the encoder, or the kind of
        combination), ``head``, ``kind`` (``single``, ``average``,
        ``greedy``, ``stack`` or ``union``), ``members`` (encoders whose
        features or predictions it uses), ``n_members``,
        ``n_features`` (input dimension of the head), ``param`` (the
        hyperparameter chosen by inner CV), ``inner_loss`` (its inner-CV
        selection loss on the training rows, each fold reduced by a PCA
        fitted on that fold's own fitting rows; NaN for the MLP, whose
        settings are fixed, and for the combinations), ``val_score``, ``val_low``, ``val_high``,
        ``val_secondary``, ``val_rank`` (1 = best on validation),
        ``val_loss`` (the selection loss on validation), ``test_score``,
        ``test_low``, ``test_high``, ``test_secondary``, ``test_loss`` and
        ``selected``. ``*_score`` is the primary metric (AUROC, macro
        one-vs-rest AUROC or R^2), ``*_low``/``*_high`` its percentile
        interval from a patient-grouped bootstrap, ``*_undefined`` the
        resamples left out of that interval because the metric is undefined
        on them (a class absent), ``*_secondary`` accuracy at 0.5, balanced
        accuracy or mean absolute error.
    selected : str
        The selected candidate (chosen on validation only).
    union : dict
        The feature-union decision: ``evaluated``, ``members``,
        ``candidate``, ``best_single`` (the single candidate with the lowest
        validation loss), ``gain`` (its validation loss minus the union's), ``low``,
        ``high`` (paired, patient-grouped bootstrap interval of that gain),
        ``chosen`` and ``reason``.
    comparisons : DataFrame
        Paired test bootstrap of every other candidate against the selected
        one: ``candidate``, ``encoder``, ``head``, ``difference``
        (candidate minus selected), ``low``, ``high``, ``share_positive``
        (share of resamples where the candidate beats the selected one).
    reduction : DataFrame
        Per encoder: ``encoder``, ``n_features``, ``n_components``,
        ``explained_variance``, ``n_train``.
    train_idx, val_idx, test_idx : ndarray
        Row indices of the partitions.
    predictions : dict
        Candidate -> prediction for every row (probability, value, or an
        (n_rows, k) array of class probabilities for a multi-class task).
    task, metric, secondary_metric : str
        ``task`` is ``"classification"`` (binary), ``"multiclass"`` or
        ``"regression"`` (see :attr:`task_type`).
    classes : list or None
        The label values in code order (binary: the second is the positive class).
    selection : DataFrame
        The selection on validation, one row per candidate (see
        :func:`crslib.risk_select.select_candidate`): validation loss with
        its interval, gap to the best single candidate, ``within_noise``,
        the combinations' paired gain and ``evidence``, ``chosen`` and
        ``why``.
    refit : DataFrame
        The selected candidate on the test partition as fitted on the
        training rows (``fit="train"``) and refitted on train + validation
        (``fit="train+validation"``): ``n_fit``, ``test_score`` with
        ``test_low`` / ``test_high``, ``test_secondary``, ``test_loss``.
    refit_prediction : ndarray
        The refitted selected candidate's prediction for every row.
    metrics : DataFrame
        The study's metric panel of the selected candidate on the test
        partition, both fits (:func:`crslib.risk_metrics.metric_panel`):
        ``fit``, ``metric``, ``value``, ``low``, ``high``, ``n_undefined``.
    dropped : DataFrame
        Per part (validation, test): bootstrap resamples left out of the
        primary metric's intervals because a class was absent
        (``n_dropped``, ``share``).
    not_fitted : DataFrame
        Combinations that could not be built here, with the ``reason``.
    loss : str
        The selection loss (``log_loss``, ``mse`` or ``mae``).
    partition : int
        Index of the partition in :func:`crslib.risk.representation_risk`.
    random_state : int
        Seed of this partition.
    n_resamples : int
    confidence : float
    """

    candidates: pd.DataFrame
    selected: str
    union: dict[str, Any]
    comparisons: pd.DataFrame
    reduction: pd.DataFrame
    train_idx: np.ndarray = field(repr=False)
    val_idx: np.ndarray = field(repr=False)
    test_idx: np.ndarray = field(repr=False)
    predictions: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    task: str = "classification"
    metric: str = "auroc"
    secondary_metric: str = "accuracy"
    classes: list[Any] | None = None
    partition: int = 0
    random_state: int = 0
    n_resamples: int = 2000
    confidence: float = 0.95
    selection: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    refit: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    refit_prediction: np.ndarray | None = field(repr=False, default=None)
    metrics: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    dropped: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    not_fitted: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    loss: str = "log_loss"

    @property
    def task_type(self) -> str:
        """The task type that ran: ``"binary"``, ``"multiclass"`` or ``"regression"``."""
        return task_type(self.task)

    @property
    def selected_row(self) -> pd.Series:
        """The selected candidate's row of :attr:`candidates`."""
        return self.candidates.loc[self.candidates["candidate"] == self.selected].iloc[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (floats rounded to 4 digits, NaN as None)."""
        return json_ready(digits=4, obj={
            "partition": self.partition,
            "random_state": self.random_state,
            "task": self.task,
            "task_type": self.task_type,
            "metric": self.metric,
            "secondary_metric": self.secondary_metric,
            "classes": None if self.classes is None else [str(c) for c in self.classes],
            "n_train": int(self.train_idx.size),
            "n_val": int(self.val_idx.size),
            "n_test": int(self.test_idx.size),
            "n_resamples": self.n_resamples,
            "confidence": self.confidence,
            "selected": self.selected,
            "loss": self.loss,
            "union": self.union,
            "selection": self.selection,
            "refit": self.refit,
            "metrics": self.metrics,
            "dropped": self.dropped,
            "not_fitted": self.not_fitted,
            "candidates": self.candidates,
            "comparisons": self.comparisons,
            "reduction": self.reduction,
        })


@dataclass
class RiskResult:
    """The workflow repeated on ``n_partitions`` patient-grouped partitions.

    Attributes
    ----------
    primary : PartitionResult
        Partition 0, reported in full.
    partitions : list of PartitionResult
        Every partition (the first is :attr:`primary`).
    all_partitions : DataFrame
        Every partition's candidates table with a ``partition`` column.
    spread : DataFrame
        Per candidate: ``candidate``, ``encoder``, ``head``, ``val_mean``,
        and the test score's ``mean``, ``sd``, ``min``, ``max`` over
        partitions, ``n_partitions`` and ``times_selected``.
    selection_counts : DataFrame
        ``encoder`` (each encoder, then each kind of combination that was
        built: ``"average"``, ``"greedy"``, ``"stack"``, ``"union"``), ``count`` (partitions
        in which a candidate of it was selected) and ``share``.
    rank_stability : DataFrame
        Per encoder, scored in each partition by its validation-best head:
        ``mean_val_rank``, ``mean_test_rank`` (1 = best), ``share_first_val``
        and ``share_first_test`` (share of partitions where it ranks first).
    rank_correlation : dict
        ``validation`` and ``test``: mean Spearman correlation of the
        encoders' scores between every pair of partitions (NaN with one
        partition or fewer than two encoders).
    task, metric, secondary_metric : str
        As in :class:`PartitionResult`.
    settings : dict
        The options of the run.
    """

    primary: PartitionResult
    partitions: list[PartitionResult] = field(repr=False)
    all_partitions: pd.DataFrame = field(repr=False)
    spread: pd.DataFrame
    selection_counts: pd.DataFrame
    rank_stability: pd.DataFrame
    rank_correlation: dict[str, float]
    task: str = "classification"
    metric: str = "auroc"
    secondary_metric: str = "accuracy"
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def task_type(self) -> str:
        """The task type that ran: ``"binary"``, ``"multiclass"`` or ``"regression"``."""
        return task_type(self.task)

    @property
    def selected_test_scores(self) -> pd.Series:
        """The selected candidate's test score in each partition (the workflow's result)."""
        sel = self.all_partitions[self.all_partitions["selected"]]
        return sel.set_index("partition")["test_score"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (floats rounded to 4 digits, NaN as None)."""
        scores = self.selected_test_scores
        return json_ready(digits=4, obj={
            "task": self.task,
            "task_type": self.task_type,
            "metric": self.metric,
            "secondary_metric": self.secondary_metric,
            "settings": self.settings,
            "primary": self.primary.to_dict(),
            "selected_per_partition": [p.selected for p in self.partitions],
            "selected_test_score": {
                "mean": float(scores.mean()), "sd": float(scores.std(ddof=1)) if scores.size > 1 else None,
                "min": float(scores.min()), "max": float(scores.max()),
            },
            "spread": self.spread,
            "selection_counts": self.selection_counts,
            "rank_stability": self.rank_stability,
            "rank_correlation": self.rank_correlation,
            "lookagain_facts": LOOKAGAIN_FACTS,
        })

    @property
    def dropped(self) -> pd.DataFrame:
        """What each partition left out: bootstrap resamples without every class, and candidates not fitted.

        One row per partition and part (``validation``, ``test``) with
        ``n_dropped`` resamples of ``n_resamples`` and their ``share``, then one
        row per candidate that could not be fitted (``part="fit"``, with the
        ``reason``).
        """
        rows = []
        for p in self.partitions:
            rows.append(p.dropped.assign(partition=p.partition, candidate="", reason=""))
            if len(p.not_fitted):
                rows.append(p.not_fitted.assign(partition=p.partition, part="fit", metric="", n_resamples=0,
                                                n_dropped=0, share=0.0))
        cols = ["partition", "part", "metric", "n_resamples", "n_dropped", "share", "candidate", "reason"]
        return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)

    def stability(self) -> dict[str, Any]:
        """How much the outcome depends on the partition: one row of :func:`stability_table`.

        Returns
        -------
        dict
            ``selected most often`` (the encoder or kind of combination; ties
            joined by " / " in the order of :attr:`selection_counts`), ``distinct
            encoders selected``, the selected candidate's ``test score mean``,
            ``test score SD`` and ``test score range`` over the partitions, the
            ``rank correlation between partitions`` (validation, test; see
            :attr:`rank_correlation`), ``union chosen (partitions)`` and
            ``combination chosen (partitions)`` (the union, an average, a
            greedy average or a stack).
        """
        scores = self.selected_test_scores
        counts = self.selection_counts
        return {
            "selected most often": " / ".join(counts.loc[counts["count"] == counts["count"].max(), "encoder"]),
            "distinct encoders selected": int((self.selection_counts["count"] > 0).sum()),
            "test score mean": scores.mean(),
            "test score SD": scores.std(ddof=1),
            "test score range": scores.max() - scores.min(),
            "rank correlation between partitions (validation)": self.rank_correlation["validation"],
            "rank correlation between partitions (test)": self.rank_correlation["test"],
            "union chosen (partitions)": int(sum(p.union.get("chosen", False) for p in self.partitions)),
            "combination chosen (partitions)": int(sum(p.selected_row["kind"] != "single" for p in self.partitions)),
        }

    def save(self, folder: str | os.PathLike, *, name: str) -> list[Path]:
        """Write the result's summary and tables into ``folder`` (created if needed), atomically.

        Files, for a result named ``name`` (e.g. its target column):
        ``risk_<name>.json`` (:meth:`to_dict`), ``candidates_<name>.csv``
        and ``comparisons_<name>.csv`` (the first partition's candidates and
        paired test comparisons), ``partitions_<name>.csv``
        (:attr:`all_partitions`), ``spread_<name>.csv``,
        ``selection_<name>.csv`` (:attr:`selection_counts`),
        ``selection_table_<name>.csv``, ``refit_<name>.csv`` and
        ``metrics_<name>.csv`` (the first partition's selection, refit and
        metric panel), ``dropped_<name>.csv`` (:attr:`dropped`: every
        partition's dropped resamples and unfitted candidates) and
        ``stability_<name>.csv`` (:func:`stability_table` of this result).

        Parameters
        ----------
        folder : path
        name : str
            Names the files; no path separators.

        Returns
        -------
        list of Path
            The files written.

        Examples
        --------
        >>> import tempfile
        >>> from crslib.risk import representation_risk
        >>> rng = np.random.default_rng(0)
        >>> y = np.tile([0, 1], 60)
        >>> emb = {"good": rng.normal(size=(120, 5)) + y[:, None], "noise": rng.normal(size=(120, 5))}
        >>> res = representation_risk(emb, y, groups=np.arange(120), heads=["linear"], n_partitions=2, n_resamples=50)
        >>> sorted(p.name for p in res.save(tempfile.mkdtemp(), name="label"))[:3]
        ['candidates_label.csv', 'comparisons_label.csv', 'dropped_label.csv']
        """
        if not isinstance(name, str) or not name or Path(name).name != name:
            raise InputError(f"name must be a non-empty file-name part (e.g. the target column), got {name!r}")
        folder = Path(folder)
        written = [atomic_write_text(folder / f"risk_{name}.json", json.dumps(self.to_dict(), indent=2))]
        tables = {"candidates": self.primary.candidates, "comparisons": self.primary.comparisons,
                  "partitions": self.all_partitions, "spread": self.spread, "selection": self.selection_counts,
                  "selection_table": self.primary.selection, "refit": self.primary.refit,
                  "metrics": self.primary.metrics, "dropped": self.dropped}
        for stem, table in tables.items():
            written.append(atomic_write_text(folder / f"{stem}_{name}.csv", table.to_csv(index=False)))
        written.append(atomic_write_text(folder / f"stability_{name}.csv", stability_table({name: self}).to_csv()))
        return written


def stability_table(outcomes: Mapping[str, RiskResult]) -> pd.DataFrame:
    """Split-level stability of several results side by side (one row of :meth:`RiskResult.stability` per name).

    Parameters
    ----------
    outcomes : mapping of str -> RiskResult
        E.g. one result per target column.

    Returns
    -------
    DataFrame
        Index: the names; columns: the keys of :meth:`RiskResult.stability`.

    Examples
    --------
    >>> from crslib.risk import representation_risk
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 60)
    >>> emb = {"good": rng.normal(size=(120, 5)) + y[:, None], "noise": rng.normal(size=(120, 5))}
    >>> result = representation_risk(emb, y, groups=np.arange(120), heads=["linear"], n_partitions=2,
    ...                              n_resamples=50)
    >>> table = stability_table({"label": result})
    >>> table.loc["label", "selected most often"], table.loc["label", "distinct encoders selected"]
    ('good', 1)
    """
    if not isinstance(outcomes, Mapping) or not outcomes:
        raise InputError("stability_table needs a non-empty mapping of name -> RiskResult")
    for name, result in outcomes.items():
        if not isinstance(result, RiskResult):
            raise InputError(f"outcome {name!r} is a {type(result).__name__}, not a RiskResult")
    return pd.DataFrame({name: result.stability() for name, result in outcomes.items()}).T

"""Protocol audit: split provenance, the partition (adversarial validation)
classifier, and the combined audit of a data set's official split.

Study 2 asks two questions of a data set's official split before any model
is trained on it:

1. **Can the official test split be told apart from the training pool?** A
   *partition classifier* is trained to predict, for each image, whether it
   belongs to the test split or to the pool (train + val). With patient-grouped
   cross-validation its out-of-fold AUC is 0.5 when the two are exchangeable and
   rises towards 1 when the test split comes from a different acquisition batch,
   site mix or archive. On Kermany the paper reports 0.697 overall and 0.898
   among normal images.
2. **Do file properties predict the label?** A *shortcut classifier* sees only
   file properties (size, dimensions, container, bit depth, JPEG settings,
   metadata; :func:`crslib.data.file_properties`) and predicts the label
   (:mod:`crslib.shortcut`). High balanced accuracy in the pool but chance on
   the test split means the archive's file encoding is coupled with the label
   in the pool only: a shortcut a model can learn and the test split does not
   reward. The paper reports 0.992 in the pool and 0.496 on the test split.

Everything here is pure: DataFrames and arrays in, result objects out; no file
is read (compute file properties with :func:`crslib.data.file_properties` and
embeddings with :mod:`crslib.embed` first). Cross-validation is grouped by
patient (:class:`sklearn.model_selection.StratifiedGroupKFold`) and every
confidence interval is a patient-grouped percentile bootstrap
(:func:`crslib.stats.bootstrap_ci`). :func:`run_audit` runs both audits and
:func:`split_provenance`; :func:`crslib.reports.render_audit_html` writes a
self-contained HTML report of its result, and
:meth:`AuditResult.checklist_evidence` the evidence of the reporting checklist
(:mod:`crslib.checklist`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from crslib import paper
from crslib._compat import one_blas_thread
from crslib._io import JsonResult, json_ready
from crslib._validation import as_feature_matrix, as_row_values, check_count
from crslib.errors import DataError, InputError
from crslib.duplicates import ImageFingerprints
from crslib.leakage import LeakageResult, leakage_audit
from crslib.probes import (
    class_codes,
    classifier_name,
    label_sort_key,
    make_classifier,
    out_of_fold_proba,
)
from crslib.shortcut import (
    PropertyMatrix,
    ShortcutAuditResult,
    permutation_note,
    permutation_summary,
    property_matrix,
    shortcut_audit,
)
from crslib.splits import check_pool_and_test, grouped_folds, pool_test_masks
from crslib.stats import auroc, bootstrap_ci, group_permuter

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PERMUTATIONS",
    "EMBEDDING_PERMUTATION_LIMIT",
    "NO_FINGERPRINTS",
    "PAPER_NUMBERS",
    "AuditResult",
    "PartitionAuditResult",
    "partition_audit",
    "run_audit",
    "split_provenance",
]

#: The numbers study 2 reports on the Kermany pediatric chest X-ray data (quoted
#: in reports as the paper's numbers, never as this data's).
PAPER_NUMBERS: dict[str, float] = {
    key: paper.value(key) for key in ("partition_auc", "partition_auc_normal", "shortcut_pool", "shortcut_test")
}

#: Permutations :func:`run_audit` runs by default.
DEFAULT_PERMUTATIONS = 100

#: Largest embedding matrix (rows x dimensions) :func:`run_audit` runs a
#: permutation test on by default (each needs ``n_splits`` refits).
EMBEDDING_PERMUTATION_LIMIT = 1_000_000

#: The note of an audit without a leakage section.
NO_FINGERPRINTS = ("no image fingerprints were given, so duplicate images and shared patients across the splits "
                   "were not audited: pass fingerprints=crslib.duplicates.image_fingerprints(manifest) "
                   "(crs audit computes them unless --no-leakage)")


# --------------------------------------------------------------------------- results


@dataclass
class PartitionAuditResult:
    """Adversarial validation: how well the official test split can be told
    from the training pool.

    Attributes
    ----------
    table : DataFrame
        One row per scope: ``scope`` (``"all"`` or ``"class=<c>"``), ``auc``,
        ``low``, ``high`` (percentile bootstrap CI, patients resampled),
        ``p_value`` (permutation test; NaN without one), ``null_mean``,
        ``null_low``, ``null_high`` (mean and central ``confidence`` range
        of the AUCs under the permutations: cross-validated AUCs of
        exchangeable splits scatter around, and often below, 0.5),
        ``evidence`` (the test's verdict, see
        :func:`crslib.shortcut.permutation_summary`), ``n_pool``,
        ``n_test`` (images), ``n_pool_patients``, ``n_test_patients``.
    scores : ndarray of shape (n_rows,)
        Out-of-fold probability that a row is in the test split (NaN for rows
        in neither the pool nor the test split).
    folds : ndarray of shape (n_rows,)
        Cross-validation fold of each row (-1 for rows left out). All rows of
        a patient share a fold.
    is_test : ndarray of bool, shape (n_rows,)
    used : ndarray of bool, shape (n_rows,)
        Rows in the pool or the test split.
    model : str
    n_splits : int
    shared_patients : list of str
        Patients with images in both the pool and the test split (a leak; the
        CV keeps each in one fold).
    confidence : float
    n_permutations : int
    null : ndarray of shape (n_permutations, n_scopes)
        AUCs with the test/pool assignment shuffled between patients (the
        ``p_value`` column compares each scope with its column).
    """

    table: pd.DataFrame
    scores: np.ndarray = field(repr=False)
    folds: np.ndarray = field(repr=False)
    is_test: np.ndarray = field(repr=False)
    used: np.ndarray = field(repr=False)
    model: str = "logistic"
    n_splits: int = 5
    shared_patients: list[str] = field(default_factory=list)
    confidence: float = 0.95
    n_permutations: int = 0
    null: np.ndarray = field(default_factory=lambda: np.empty((0, 0)), repr=False)

    @property
    def auc(self) -> float:
        """Overall out-of-fold AUC."""
        return float(self.table.loc[self.table["scope"] == "all", "auc"].iloc[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (floats rounded to 4 digits, NaN as None); ``permutation_note`` says why the
        permutation test decides nothing when it had too few permutations
        (:func:`crslib.shortcut.permutation_note`)."""
        return json_ready(digits=4, obj={
            "model": self.model,
            "n_splits": self.n_splits,
            "confidence": self.confidence,
            "n_permutations": self.n_permutations,
            "permutation_note": permutation_note(self.n_permutations),
            "n_excluded": int((~self.used).sum()),
            "n_shared_patients": len(self.shared_patients),
            "shared_patients": self.shared_patients[:20],
            "table": self.table.to_dict(orient="records"),
        })


@dataclass
class AuditResult(JsonResult):
    """Everything :func:`run_audit` found; render with :func:`crslib.reports.render_audit_html`.

    Attributes
    ----------
    n_images : int
    label_column : str
    pool : tuple of str
    test : str
    provenance : dict
        From :func:`split_provenance`.
    partition_properties : PartitionAuditResult
        Partition classifier on file properties.
    shortcut : ShortcutAuditResult
        File properties -> label.
    partition_embeddings : PartitionAuditResult or None
        Partition classifier on embeddings, when given.
    embedding_name : str or None
    property_columns : list of str
        Columns of the property design matrix.
    notes : list of str
        Caveats found while auditing (e.g. no patient ids).
    file_properties : list of str
        The file-property columns given to :func:`run_audit` (before
        encoding), for the checklist evidence; not part of :meth:`to_dict`.
    leakage : LeakageResult or None
        Duplicate images and shared person numbers within and across the
        splits (:func:`crslib.leakage.leakage_audit`); None when
        :func:`run_audit` was given no image fingerprints (a note says so).
    """

    n_images: int
    label_column: str
    pool: tuple[str, ...]
    test: str
    provenance: dict[str, Any]
    partition_properties: PartitionAuditResult
    shortcut: ShortcutAuditResult
    partition_embeddings: PartitionAuditResult | None = None
    embedding_name: str | None = None
    property_columns: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    file_properties: list[str] = field(default_factory=list, repr=False)
    leakage: LeakageResult | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (floats rounded to 4 digits, NaN as None); ``leakage`` is
        :meth:`crslib.leakage.LeakageResult.to_dict` (its counts per kind and scope, and its clusters),
        or None."""
        out = json_ready(digits=4, obj={
            "n_images": self.n_images,
            "label_column": self.label_column,
            "pool": list(self.pool),
            "test": self.test,
            "provenance": self.provenance,
            "partition_properties": self.partition_properties.to_dict(),
            "partition_embeddings": (self.partition_embeddings.to_dict()
                                     if self.partition_embeddings is not None else None),
            "embedding_name": self.embedding_name,
            "shortcut": self.shortcut.to_dict(),
            "leakage": None,  # filled below, at its own precision (similarities need more than 4 digits)
            "property_columns": self.property_columns,
            "notes": self.notes,
            "paper": PAPER_NUMBERS,
        })
        out["leakage"] = self.leakage.to_dict() if self.leakage is not None else None
        return out

    def checklist_evidence(self, *, data: str, source: str = "crs audit") -> dict[str, Any]:
        """Evidence for the ``split`` and ``shortcut`` items of the reporting checklist.

        The partition AUC of the embeddings (of the file properties when the
        audit ran without embeddings) and the shortcut classifier's balanced
        accuracies, each with its interval, its ``confidence`` and the paper's
        number (:data:`PAPER_NUMBERS`), in the fields
        :func:`crslib.checklist.build_checklist` checks; and under ``leakage``
        the duplicates and possible same patients across the pool and the
        test split (``"not measured: ..."`` without a leakage section).
        Saved as ``evidence.json`` in a run's results, it is what ``crs
        checklist`` reads.

        Parameters
        ----------
        data : str
            The data set, as it was given (quoted in the split's provenance).
        source : str
            Where the numbers come from (a notebook or a command).

        Returns
        -------
        dict
            ``{"split": {...}, "shortcut": {...}}``; plain Python values, ready for
            :func:`json.dumps`.

        Examples
        --------
        >>> evidence = result.checklist_evidence(data="chest_xray/")  # doctest: +SKIP
        >>> build_checklist(evidence).items[0].status  # doctest: +SKIP
        'complete'
        """
        part = self.partition_embeddings if self.partition_embeddings is not None else self.partition_properties
        inputs = f"{self.embedding_name} embeddings" if self.partition_embeddings is not None else "file properties"
        model = {"logistic": "logistic regression", "forest": "random forest"}.get(part.model, part.model)
        part_all = part.table.set_index("scope").loc["all"]
        part_props = self.partition_properties.table.set_index("scope").loc["all"]
        shortcut = self.shortcut.table.set_index("scope")
        counts = sorted(self.provenance["splits"], key=lambda entry: -entry["images"])  # as value_counts()
        return {
            "split": {
                "provenance": (f"official split of the data set ({data}): "
                               + ", ".join(f"{e['split']} {e['images']}" for e in counts) + " images"),
                "patients_disjoint": self.provenance["n_patients_in_several_splits"] == 0,
                "patients_disjoint_basis": _patients_basis(self.leakage),
                "leakage": _leakage_evidence(self.leakage),
                "confidence": float(part.confidence),
                "partition_auc": _interval(part_all, "auc"),
                "partition_auc_file_properties": _interval(part_props, "auc"),
                "partition_auc_by_class": {r.scope: float(r.auc) for r in part.table.itertuples()},
                "partition_model": f"{model} on {inputs}",
                "effect": {"description": f"partition classifier AUC (training pool vs official test split), {inputs}",
                           "value": float(part_all["auc"]), "low": float(part_all["low"]),
                           "high": float(part_all["high"]), "unit": "AUC", "paper": PAPER_NUMBERS["partition_auc"],
                           "source": source},
            },
            "shortcut": {
                "pool_balanced_accuracy": _interval(shortcut.loc["pool"], "balanced_accuracy"),
                "test_balanced_accuracy": _interval(shortcut.loc["test"], "balanced_accuracy"),
                "confidence": float(self.shortcut.confidence),
                "features": sorted(c for c in self.file_properties if c != "image_id"),
                "top_features": self.shortcut.importances.sort_values("alone", ascending=False).head(5)[
                    "feature"].tolist(),
                "effect": {"description": "balanced accuracy of a file-property classifier in the training pool "
                                          "(patient-grouped CV); on the test split it is "
                                          f"{shortcut.loc['test', 'balanced_accuracy']:.3f}",
                           "value": float(shortcut.loc["pool", "balanced_accuracy"]),
                           "low": float(shortcut.loc["pool", "low"]), "high": float(shortcut.loc["pool", "high"]),
                           "unit": "balanced accuracy", "paper": PAPER_NUMBERS["shortcut_pool"], "source": source},
            },
        }


def _interval(row: pd.Series, column: str) -> dict[str, float]:
    """A checklist interval ``{"estimate", "low", "high"}`` from a result table's row."""
    return {"estimate": float(row[column]), "low": float(row["low"]), "high": float(row["high"])}


def _leakage_evidence(leakage: LeakageResult | None) -> dict[str, Any] | str:
    """Counts across the pool and the test split per kind, for :func:`crslib.checklist.item_concern`."""
    if leakage is None:
        return "not measured: " + NO_FINGERPRINTS
    table = leakage.counts_table().set_index("kind")

    def count(kind: str, column: str) -> int | None:
        value = table.loc[kind, column]
        return None if pd.isna(value) else int(value)

    evidence: dict[str, Any] = {}
    for kind in ("exact", "embedding", "near"):
        evidence[f"{kind}_duplicates_across"] = count(kind, "across")
        evidence[f"{kind}_test_images"] = count(kind, "test_images")
    evidence["near_informative"] = leakage.near_informative
    evidence["possible_same_patients_across"] = count("patient", "across")
    evidence["possible_same_patient_test_images"] = count("patient", "test_images")
    evidence["n_test_images"] = int((leakage.splits == leakage.test).sum())
    return evidence


def _patients_basis(leakage: LeakageResult | None) -> str:
    """What ``patients_disjoint`` was measured on, and whether the raw person numbers were compared too."""
    text = "the manifest's patient_id (the Kermany loader scopes its person numbers by split)"
    if leakage is None:
        return text + "; raw person numbers not compared (no leakage audit)"
    parsed = leakage.patients.id_sources.get("kermany_file_name", 0)
    return (text + f"; the raw person numbers of {parsed} Kermany file name(s) were compared across splits "
            "(leakage.possible_same_patients_across)")


# --------------------------------------------------------------------------- partition audit


def partition_audit(
    X: Any,
    split: Any,
    *,
    groups: Any,
    labels: Any = None,
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
    n_splits: int = 5,
    n_resamples: int = 1000,
    n_permutations: int = 0,
    confidence: float = 0.95,
    random_state: int = 0,
    model: Any = "logistic",
) -> PartitionAuditResult:
    """Adversarial validation: can a classifier tell the test split from the pool?

    The target is 1 for rows in the official ``test`` split and 0 for rows in
    the ``pool`` (train + val); rows of other splits are left out. Out-of-fold
    probabilities come from patient-grouped, stratified K-fold
    cross-validation (:class:`~sklearn.model_selection.StratifiedGroupKFold`:
    no patient in two folds), the AUC from :func:`crslib.stats.auroc` and its
    interval from a bootstrap that resamples patients
    (:func:`crslib.stats.bootstrap_ci` with ``groups``). With ``labels`` the
    AUC is also computed among the rows of each class separately (same
    out-of-fold scores): Kermany's split is far easier to spot among normal
    images (0.898 in the paper) than overall (0.697).

    Parameters
    ----------
    X : array-like of shape (n_rows, n_features), or PropertyMatrix
        Embeddings, or a property design matrix (:func:`property_matrix`;
        its ``features`` are used). No NaN.
    split : array-like of shape (n_rows,)
        Split name per row.
    groups : array-like of shape (n_rows,)
        Patient id per row (required; pass image ids only if every image is
        a different patient).
    labels : array-like of shape (n_rows,), optional
        Class per row, for the per-class AUCs.
    pool : str or sequence of str
        Splits forming the training pool.
    test : str
        The official test split.
    n_splits : int
        Cross-validation folds (each class needs at least this many patients).
    n_resamples : int
        Bootstrap resamples for the intervals.
    n_permutations : int
        When > 0, a permutation test: the test/pool assignment is shuffled
        between whole patients (among patients with the same number of
        images) and the whole cross-validation rerun, ``n_permutations``
        times; ``p_value`` is the share of shuffles with an AUC at least as
        high (one-sided). Costs ``n_permutations * n_splits`` model fits.
        With fewer than :data:`crslib.shortcut.MIN_PERMUTATIONS` the
        smallest possible p-value, 1 / (n_permutations + 1), is not below
        0.05 and ``evidence`` says ``"too few permutations"``.
    confidence : float
        Interval coverage.
    random_state : int
        Seed of the folds, the model, the bootstrap and the permutations.
    model : {"logistic", "forest"} or estimator
        ``"logistic"`` (default): standardisation + L2 logistic regression
        (C=0.1, balanced class weights), for embeddings and file properties;
        ``"forest"``: a random forest (200 trees, leaves of at least 2 rows,
        balanced class weights), which also finds interactions; or any
        scikit-learn classifier with ``predict_proba`` (cloned per fold).
        See Notes on why logistic is the default.

    Returns
    -------
    PartitionAuditResult

    Notes
    -----
    The interval resamples patients with the out-of-fold scores held fixed,
    so it leaves out the variability of fitting the classifiers: it is too
    narrow. With no difference between the splits, 95% intervals covered
    0.5 in 47 of 60 synthetic data sets (400 images, 8 random features,
    logistic), in 19 of 20 phantom data sets for file properties with
    logistic regression and in only 15 of 20 with the random forest. Use
    the permutation test (``n_permutations``) to decide whether the splits
    differ at all; it is exact under the null. The interval then describes
    the size of a difference, optimistically.

    Raises
    ------
    DataError
        No row is in the test split, or none in the pool.
    InputError
        Misaligned lengths, NaN in ``X``, ``labels`` or ``groups``, a bad
        option, or too few patients for ``n_splits``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> split = np.where(np.arange(300) % 4 == 0, "test", "train")
    >>> X = rng.normal(size=(300, 3)) + (split == "test")[:, None] * 2.0
    >>> res = partition_audit(X, split, groups=np.arange(300), n_resamples=100)
    >>> res.auc > 0.9, list(res.table.columns[:4])
    (True, ['scope', 'auc', 'low', 'high'])
    """
    X = as_feature_matrix(X.features if isinstance(X, PropertyMatrix) else X, "X")
    n = X.shape[0]
    split_arr = as_row_values(split, n, "split", "the split name of each row")
    group_arr = as_row_values(groups, n, "groups", "patient ids (groups=manifest['patient_id'])")
    label_arr = as_row_values(labels, n, "labels", "the class of each row") if labels is not None else None
    pool_t, test = check_pool_and_test(pool, test)
    n_splits = check_count(n_splits, "n_splits", 2)
    n_resamples = check_count(n_resamples, "n_resamples", 1)
    n_permutations = check_count(n_permutations, "n_permutations", 0)
    model_name = classifier_name(model)
    make_classifier(model, random_state)  # validate before any work
    in_pool, in_test = pool_test_masks(split_arr, pool_t, test)
    used = in_pool | in_test
    if (~used).any():
        logger.info("partition audit: %d row(s) in neither the pool %s nor %r are left out",
                    int((~used).sum()), list(pool_t), test)
    Xu = X[used]
    y = in_test[used].astype(np.int64)
    g = np.array([str(v) for v in group_arr[used]], dtype=object)
    shared = sorted(set(g[y == 1].tolist()) & set(g[y == 0].tolist()))
    if shared:
        logger.warning("%d patient(s) have images in both the pool and the %r split (first: %s)",
                       len(shared), test, shared[:3])
    # hundreds of small fits: one BLAS thread is about twice as fast as two here
    with one_blas_thread():
        folds_u = grouped_folds(y, g, n_splits, random_state, "partition audit")
        proba, _ = out_of_fold_proba(model, Xu, y, folds_u, 2, random_state)
        score = proba[:, 1]

        def scope_row(scope: str, mask: np.ndarray) -> dict[str, Any]:
            yy, ss, gg = y[mask], score[mask], g[mask]
            n_pool, n_test = int((yy == 0).sum()), int((yy == 1).sum())
            row = {"scope": scope, "auc": float("nan"), "low": float("nan"), "high": float("nan"),
                   **permutation_summary(float("nan"), []), "n_pool": n_pool, "n_test": n_test,
                   "n_pool_patients": len(set(gg[yy == 0].tolist())), "n_test_patients": len(set(gg[yy == 1].tolist()))}
            if n_pool and n_test:
                ci = bootstrap_ci(auroc, yy, ss, groups=gg, n_resamples=n_resamples, confidence=confidence,
                                  random_state=random_state)
                row.update(auc=float(ci.estimate), low=float(ci.low), high=float(ci.high))
            return row

        masks = [("all", np.ones(len(y), dtype=bool))]
        if label_arr is not None:
            classes, codes = class_codes(label_arr[used])
            masks += [(f"class={c}", codes == k) for k, c in enumerate(classes)]
        rows = [scope_row(scope, mask) for scope, mask in masks]
        null = np.full((n_permutations, len(masks)), np.nan)
        if n_permutations:
            permute = group_permuter(g)
            rng = np.random.default_rng(random_state)
            for b in range(n_permutations):
                y_b = permute(y, rng)
                folds_b = grouped_folds(y_b, g, n_splits, random_state + 1 + b, "partition audit (permutation)")
                score_b = out_of_fold_proba(model, Xu, y_b, folds_b, 2, random_state)[0][:, 1]
                null[b] = [auroc(y_b[mask], score_b[mask]) for _, mask in masks]
            for j, row in enumerate(rows):
                row.update(permutation_summary(row["auc"], null[:, j], confidence=confidence))
    table = pd.DataFrame(rows, columns=["scope", "auc", "low", "high", "p_value", "null_mean", "null_low",
                                        "null_high", "evidence", "n_pool", "n_test", "n_pool_patients",
                                        "n_test_patients"])
    scores = np.full(n, np.nan)
    scores[used] = score
    folds = np.full(n, -1, dtype=np.int64)
    folds[used] = folds_u
    return PartitionAuditResult(table=table, scores=scores, folds=folds, is_test=in_test, used=used,
                                model=model_name, n_splits=n_splits, shared_patients=shared,
                                confidence=float(confidence), n_permutations=n_permutations, null=null)


# --------------------------------------------------------------------------- provenance and run_audit


def split_provenance(
    manifest: pd.DataFrame,
    *,
    label_column: str | None = "label",
    groups: Any = None,
) -> dict[str, Any]:
    """Facts about the splits: images, patients and classes per split, and
    patients found in more than one split.

    Parameters
    ----------
    manifest : DataFrame
        With a ``split`` column.
    label_column : str or None
        Column whose classes are counted per split (skipped when None or absent).
    groups : array-like, optional
        Patient id per row (default: the ``patient_id`` column, else ``image_id``).

    Returns
    -------
    dict
        ``splits``: list of ``{"split", "images", "patients", "classes": {class: images}}``;
        ``n_patients_in_several_splits`` and ``patients_in_several_splits``
        (the first 20, with their splits).

    Examples
    --------
    >>> import pandas as pd
    >>> m = pd.DataFrame({"image_id": list("abcd"), "patient_id": ["p1", "p1", "p2", "p3"],
    ...                   "split": ["train", "test", "train", "test"], "label": [0, 1, 0, 1]})
    >>> facts = split_provenance(m)
    >>> facts["n_patients_in_several_splits"], facts["splits"][0]["patients"]
    (1, 2)
    """
    if "split" not in manifest.columns:
        raise DataError(f"manifest has no 'split' column; columns present: {list(map(str, manifest.columns))}")
    if groups is None:
        groups = manifest["patient_id"] if "patient_id" in manifest.columns else manifest["image_id"]
    g = pd.Series(np.asarray(groups, dtype=object), index=manifest.index).astype(str)
    split = manifest["split"].astype(str)
    has_labels = label_column is not None and label_column in manifest.columns
    order = [s for s in ("train", "val", "test") if s in set(split)] + sorted(set(split) - {"train", "val", "test"})
    splits = []
    for name in order:
        mask = split == name
        entry: dict[str, Any] = {"split": name, "images": int(mask.sum()), "patients": int(g[mask].nunique())}
        if has_labels:
            counts = manifest.loc[mask, label_column].value_counts()
            entry["classes"] = {str(k): int(counts[k]) for k in sorted(counts.index, key=label_sort_key)}
        splits.append(entry)
    per_patient = pd.DataFrame({"g": g, "split": split}).groupby("g")["split"].agg(lambda s: sorted(set(s)))
    several = per_patient[per_patient.map(len) > 1]
    return {
        "splits": splits,
        "n_patients": int(g.nunique()),
        "n_patients_in_several_splits": int(len(several)),
        "patients_in_several_splits": [{"patient_id": str(p), "splits": list(s)} for p, s in several.head(20).items()],
    }


def run_audit(
    manifest: pd.DataFrame,
    properties: pd.DataFrame,
    *,
    embeddings: Any = None,
    embedding_name: str | None = None,
    fingerprints: ImageFingerprints | None = None,
    label_column: str = "label",
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
    n_splits: int = 5,
    n_resamples: int = 1000,
    n_repeats: int = 10,
    n_permutations: int | None = None,
    confidence: float = 0.95,
    random_state: int = 0,
    model: Any = "logistic",
) -> AuditResult:
    """The study-2 audit of a data set's official split, in one call.

    Combines :func:`split_provenance`, a partition audit on file properties,
    a partition audit on embeddings (when ``embeddings`` are given) and a
    shortcut audit (file properties -> label), all with ``model`` (default:
    regularised logistic regression; see :func:`partition_audit`). Patients come from the manifest's ``patient_id``; without one,
    images are treated as independent patients and a warning is logged (and
    noted in the result), since images of one patient in different folds
    inflate every number here.

    Parameters
    ----------
    manifest : DataFrame
        With ``split``, ``label_column`` and ideally ``patient_id``.
    properties : DataFrame
        :func:`crslib.data.file_properties` of the same rows, same order.
    embeddings : array-like of shape (n_images, d), optional
        Embeddings of the same rows.
    embedding_name : str, optional
        Name of the model that made them (for the report).
    fingerprints : ImageFingerprints, optional
        :func:`crslib.duplicates.image_fingerprints` of the manifest: adds
        the leakage audit (:func:`crslib.leakage.leakage_audit` of the
        fingerprints and the ``embeddings``, with this ``pool`` and
        ``test``) as ``result.leakage``. Without them ``leakage`` is None and
        a note says so.
    label_column : str
        The label column.
    pool, test, n_splits, n_resamples, confidence, random_state
        As in :func:`partition_audit`.
    n_repeats : int
        Permutations per property for the shortcut importances.
    n_permutations : int, optional
        Permutation tests of every audit (see :func:`partition_audit`); the
        report decides "differs from chance" by them. Each costs
        ``n_permutations * n_splits`` model fits. Default (None): 100 for
        the file-property audits, and 100 for the embeddings when they have
        at most :data:`EMBEDDING_PERMUTATION_LIMIT` values (rows x
        dimensions), else none (noted in the result; the report then falls
        back on the interval, which is too narrow). 0 turns them off; from 1
        to 19 they cannot reach p < 0.05 and decide nothing (noted).
    model : {"logistic", "forest"} or estimator
        The classifier of all three audits.

    Returns
    -------
    AuditResult

    Raises
    ------
    DataError
        The manifest has no ``split`` column or no row in the test split or
        the pool; the label column is missing, has missing values, or a split
        holds a single class; ``properties`` are not aligned with the manifest.
    InputError
        ``embeddings`` do not have one row per image or contain NaN;
        ``fingerprints`` of another manifest; a bad option.

    Examples
    --------
    >>> import tempfile
    >>> from crslib.data import file_properties
    >>> from crslib.data.phantom import generate_phantom
    >>> from crslib.reports import render_audit_html
    >>> m = generate_phantom(tempfile.mkdtemp(), n_patients=80, image_size=32, shortcut_strength=1.0)
    >>> result = run_audit(m, file_properties(m), n_splits=3, n_resamples=100, n_repeats=2, n_permutations=20)
    >>> result.shortcut.pool_balanced_accuracy > 0.9, result.shortcut.table["evidence"].iloc[0]
    (True, 'yes')
    >>> render_audit_html(result).startswith("<!DOCTYPE html>")
    True
    """
    labels = _check_manifest(manifest, properties, label_column)
    notes: list[str] = []
    pool_t, test = check_pool_and_test(pool, test)
    split = manifest["split"].astype(str).to_numpy(dtype=object)
    _check_split_classes(split, labels, pool_t, test, label_column)
    groups = _patient_groups(manifest, notes)
    emb = _check_embeddings(embeddings, len(manifest))
    # before the cross-validations: fingerprints of another manifest fail fast
    leakage = None if fingerprints is None else leakage_audit(manifest, fingerprints, emb, pool=pool_t, test=test)
    if "readable" in properties.columns:
        unreadable = int((~properties["readable"].astype(bool)).sum())
        if unreadable:
            notes.append(f"{unreadable} file(s) could not be read; their properties are missing (kept as rows)")
    X_props = property_matrix(properties)
    provenance = split_provenance(manifest, label_column=label_column, groups=groups)
    if provenance["n_patients_in_several_splits"]:
        notes.append(f"{provenance['n_patients_in_several_splits']} patient(s) have images in more than one split")
    n_perm_props, n_perm_emb = _permutation_counts(n_permutations, emb, n_splits, notes)
    if leakage is None:
        notes.append(NO_FINGERPRINTS)
    common = dict(pool=pool_t, test=test, n_splits=n_splits, n_resamples=n_resamples, confidence=confidence,
                  random_state=random_state, model=model)
    label_values = labels.to_numpy(dtype=object)
    part_props = partition_audit(X_props, split, groups=groups, labels=label_values, n_permutations=n_perm_props,
                                 **common)
    part_emb = None
    if emb is not None:
        part_emb = partition_audit(emb, split, groups=groups, labels=label_values, n_permutations=n_perm_emb,
                                   **common)
    shortcut = shortcut_audit(X_props, label_values, split, groups=groups, n_repeats=n_repeats,
                              n_permutations=n_perm_props, **common)
    return AuditResult(
        n_images=len(manifest), label_column=label_column, pool=pool_t, test=test, provenance=provenance,
        partition_properties=part_props, shortcut=shortcut, partition_embeddings=part_emb,
        embedding_name=embedding_name if embeddings is not None else None,
        property_columns=list(X_props.features.columns), notes=notes,
        file_properties=[str(c) for c in properties.columns], leakage=leakage,
    )


# the steps of run_audit


def _check_manifest(manifest: Any, properties: Any, label_column: str) -> pd.Series:
    """The label column, after checking the manifest, its split and labels, and the properties' alignment."""
    if not isinstance(manifest, pd.DataFrame):
        raise DataError(f"manifest must be a pandas DataFrame, got {type(manifest).__name__}")
    if not isinstance(properties, pd.DataFrame):
        raise DataError(
            f"properties must be a DataFrame from crslib.data.file_properties(manifest), got {type(properties).__name__}"
        )
    filled = manifest.attrs.get("filled_columns") or []
    if "split" not in manifest.columns or "split" in filled:
        raise DataError(
            "manifest has no 'split' column (or it was filled with 'unspecified'): the audit compares the "
            "official test split with the training pool. Add a 'split' column with train/val/test, or load a "
            "folder laid out as {train,val,test}/{CLASS}/ (e.g. Kermany's chest_xray)"
        )
    if label_column not in manifest.columns:
        raise DataError(
            f"manifest has no label column {label_column!r}; columns present: {list(map(str, manifest.columns))}. "
            "Pass label_column=<name>"
        )
    n = len(manifest)
    labels = manifest[label_column]
    if labels.isna().any():
        bad = np.flatnonzero(labels.isna().to_numpy())
        raise DataError(
            f"label column {label_column!r} is missing in {len(bad)} row(s) (first rows: {bad[:5].tolist()}); "
            "fill in the labels or drop those rows"
        )
    if len(properties) != n:
        raise DataError(
            f"properties have {len(properties)} rows but the manifest has {n}; compute them with "
            "crslib.data.file_properties(manifest) for the same manifest"
        )
    if "image_id" in properties.columns and "image_id" in manifest.columns:
        mismatch = properties["image_id"].astype(str).to_numpy() != manifest["image_id"].astype(str).to_numpy()
        if mismatch.any():
            first = int(np.flatnonzero(mismatch)[0])
            raise DataError(
                f"properties are not aligned with the manifest: row {first} has image_id "
                f"{properties['image_id'].iloc[first]!r} vs {manifest['image_id'].iloc[first]!r}; compute them with "
                "crslib.data.file_properties(manifest) and keep the row order"
            )
    return labels


def _check_split_classes(split: np.ndarray, labels: pd.Series, pool: tuple[str, ...], test: str,
                         label_column: str) -> None:
    """Both the pool and the test split exist and hold at least two classes."""
    pool_test_masks(split, pool, test)
    for name, mask in ((f"the pool {list(pool)}", np.isin(split, list(pool))), (f"the {test!r} split", split == test)):
        present = sorted(set(labels[mask].astype(str)))
        if len(present) < 2:
            raise DataError(
                f"{name} holds a single class ({present[0]!r}) in {label_column!r}; the shortcut audit needs "
                "both classes in the pool and in the test split"
            )


def _patient_groups(manifest: pd.DataFrame, notes: list[str]) -> np.ndarray:
    """Patient id per row as text; without ``patient_id``, the image ids (warned about and noted)."""
    filled = manifest.attrs.get("filled_columns") or []
    if "patient_id" in manifest.columns and "patient_id" not in filled:
        return manifest["patient_id"].astype(str).to_numpy(dtype=object)
    ids = manifest["image_id"] if "image_id" in manifest.columns else pd.Series(np.arange(len(manifest)))
    message = ("the manifest has no patient_id: every image is treated as its own patient, so images of one "
               "patient may sit in different CV folds and the numbers can be optimistic")
    logger.warning(message)
    notes.append(message)
    return ids.astype(str).to_numpy(dtype=object)


def _check_embeddings(embeddings: Any, n: int) -> np.ndarray | None:
    """The embeddings as a finite matrix with one row per manifest row (None stays None)."""
    if embeddings is None:
        return None
    emb = np.asarray(embeddings)
    if emb.ndim != 2 or emb.shape[0] != n:
        raise InputError(
            f"embeddings have shape {emb.shape} but the manifest has {n} rows; pass one embedding row per "
            "manifest row, in the same order"
        )
    return as_feature_matrix(emb, "embeddings")


def _permutation_counts(n_permutations: int | None, emb: np.ndarray | None, n_splits: int,
                        notes: list[str]) -> tuple[int, int]:
    """Permutations of the file-property audits and of the embedding audit (see run_audit's ``n_permutations``)."""
    if n_permutations is not None:
        count = check_count(n_permutations, "n_permutations", 0)
        if permutation_note(count):
            notes.append(permutation_note(count))
        return count, count
    n_perm_emb = DEFAULT_PERMUTATIONS if emb is None or emb.size <= EMBEDDING_PERMUTATION_LIMIT else 0
    if emb is not None and not n_perm_emb:
        notes.append(
            f"no permutation test for the embeddings ({emb.shape[0]} x {emb.shape[1]} values would need "
            f"{DEFAULT_PERMUTATIONS * n_splits} refits); pass n_permutations to run one"
        )
    return DEFAULT_PERMUTATIONS, n_perm_emb

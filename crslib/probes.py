"""Probes and heads: the small supervised models fitted on top of fixed features.

The one home of every model the analyses fit on embeddings or file
properties:

- the linear probe of findings (:func:`linear_probe_auroc`,
  :func:`logistic_probe`: standardise, then L2-regularised logistic
  regression), used by study 1 and the classifier transfer;
- the classifiers of the split and shortcut audits of study 2 and their
  out-of-fold probabilities (:func:`make_classifier`, :func:`out_of_fold_proba`);
- the linear, kNN and MLP heads of the representation-risk workflow of
  study 3 (:func:`fit_head`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from crslib import stats
from crslib._compat import one_blas_thread
from crslib._io import JsonResult, json_ready
from crslib._validation import as_embeddings
from crslib.errors import InputError

log = logging.getLogger(__name__)

__all__ = [
    "ProbeAUROC",
    "ProbeMargin",
    "linear_probe_auroc",
    "logistic_probe",
    "probe_margin",
    "probe_targets",
]


# =========================================================================== linear probe of findings


def check_labels(labels: Any, n: int) -> pd.DataFrame:
    if isinstance(labels, pd.Series):
        labels = labels.to_frame()
    if not isinstance(labels, pd.DataFrame):
        raise InputError("labels must be a DataFrame with one 0/1 column per finding")
    if len(labels) != n:
        raise InputError(f"labels has {len(labels)} rows but the embeddings have {n}; they must match row by row")
    if labels.shape[1] == 0:
        raise InputError("labels has no finding columns")
    out = labels.reset_index(drop=True).apply(pd.to_numeric, errors="coerce")
    for col in out.columns:
        vals = out[col].dropna().unique()
        bad = [v for v in vals if v not in (0, 1)]
        if bad or (labels[col].notna() & out[col].isna()).any():
            found = (bad or list(pd.unique(labels[col][out[col].isna() & labels[col].notna()])))[:3]
            # numpy scalars as plain values: "[2]", not "[np.int64(2)]"
            found = [v.item() if isinstance(v, np.generic) else v for v in found]
            raise InputError(
                f"label column {col!r} must hold 0/1 (or empty for unknown), found values like {found}"
            )
    return out


def probe_targets(
    manifest: pd.DataFrame,
    *,
    min_per_class: int = 5,
    groups: str = "patient_id",
    test_size: float = 0.3,
    random_state: int | None = 0,
) -> tuple[pd.DataFrame, dict[str, str]]:
    """The 0/1 targets of a manifest that a linear probe can be scored on.

    The ``finding_*`` columns when the manifest has any; otherwise a
    ``label`` with exactly two classes (numbers or text), coded 0 for the
    first class and 1 for the second in sorted order (the column is named
    ``label=<second class>``). A finding that does not hold 0/1 (text such
    as ``yes``/``no``, other codes), a column whose classes have fewer than
    ``min_per_class`` patients each, or one that has a single class in the
    training or test part of the probe's patient-grouped split, is left out
    with the reason, so :func:`linear_probe_auroc` (given the same
    ``groups``, ``test_size`` and ``random_state``) fits every column.

    Parameters
    ----------
    manifest : DataFrame
    min_per_class : int
        Fewest patients per class; a patient-grouped train/test split needs
        a few of each.
    groups : str
        The patient column (classes are counted in patients, and the split
        keeps each patient's images together).
    test_size, random_state
        The split of :func:`linear_probe_auroc`.

    Returns
    -------
    targets : DataFrame
        One row per manifest row (same index), one float column of 0/1 (NaN
        unknown) per usable target; no column when none is usable.
    left_out : dict
        Manifest column -> the sentence saying why it cannot be probed
        (:func:`crslib.needs.unmet_need`, or the split); with neither
        findings nor a label, one entry ``"label"`` saying what to add.

    Examples
    --------
    >>> m = pd.DataFrame({"label": ["cat", "dog"] * 10, "patient_id": [f"p{i}" for i in range(20)]})
    >>> targets, left_out = probe_targets(m)
    >>> targets["label=dog"].tolist()[:4], left_out
    ([0.0, 1.0, 0.0, 1.0], {})
    >>> probe_targets(m.drop(columns="label"))[1]["label"]
    'the manifest has no finding_* columns and no `label` column; add 0/1 finding_* columns or a two-class `label` to run it'
    """
    from crslib.needs import unmet_need

    if not isinstance(manifest, pd.DataFrame):
        raise InputError(f"manifest must be a DataFrame, got {type(manifest).__name__}")
    findings = [c for c in manifest.columns if str(c).startswith("finding_")]
    candidates = pd.DataFrame(index=manifest.index)
    left_out: dict[str, str] = {}
    for column in findings or ["label"]:
        if column == "label" and column not in manifest.columns:
            left_out["label"] = ("the manifest has no finding_* columns and no `label` column; add 0/1 "
                                 "finding_* columns or a two-class `label` to run it")
            continue
        reason = unmet_need(manifest, binary=column, min_per_class=min_per_class, groups=groups)
        if reason:
            left_out[column] = reason
        elif findings:
            try:  # the probes' own check: 0/1 or empty, text such as yes/no refused
                candidates[column] = check_labels(manifest[[column]], len(manifest))[column].to_numpy(dtype=float)
            except InputError as exc:
                left_out[column] = str(exc)
        else:
            known = manifest["label"].notna().to_numpy()
            classes, codes = class_codes(manifest["label"].to_numpy()[known])
            coded = np.full(len(manifest), np.nan)
            coded[known] = codes
            candidates[f"label={classes[1]}"] = coded
    if candidates.shape[1] == 0:
        return candidates, left_out
    train, test = _probe_split(manifest[groups].to_numpy(), test_size, random_state)
    for column in list(candidates.columns):
        y = candidates[column].to_numpy()
        y_train, y_test = y[train][~np.isnan(y[train])], y[test][~np.isnan(y[test])]
        reason = degenerate_reason(y_train.astype(int), "training") or degenerate_reason(y_test.astype(int), "test")
        if reason:
            source = column if findings else "label"
            left_out[source] = f"the probe's patient-grouped train/test split does not allow it: {reason}"
            candidates = candidates.drop(columns=column)
    return candidates, left_out


@dataclass(frozen=True, eq=False)
class ProbeAUROC(JsonResult):
    """Test AUROC of a linear probe per finding (:func:`linear_probe_auroc`).

    Attributes
    ----------
    auroc : Series of float
        Test AUROC, indexed by finding (index name ``"finding"``, series name
        ``"auroc"``); NaN for a finding that could not be fitted.
    reasons : dict of str -> str
        Per finding that was not fitted, why (e.g. a single class in the
        training or test part); fitted findings are absent.
    n_train, n_test : int
        Images in the training and test part of the patient-grouped split
        (before leaving out the unlabelled images of a finding).

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> X = np.random.default_rng(0).normal(size=(100, 3))
    >>> y = pd.DataFrame({"edema": (X[:, 0] > 0).astype(int), "never": 0})
    >>> res = linear_probe_auroc(X, y, groups=np.arange(100))
    >>> res.reasons["never"], res.n_train + res.n_test
    ('single class in the training split (0 positive of 70)', 100)
    >>> res.to_frame().columns.tolist()
    ['finding', 'auroc', 'reason', 'n_train', 'n_test']
    """

    auroc: pd.Series
    reasons: dict[str, str] = field(default_factory=dict)
    n_train: int = 0
    n_test: int = 0

    def to_frame(self) -> pd.DataFrame:
        """One row per finding: finding, auroc, reason (empty where fitted), n_train, n_test (a new frame)."""
        findings = list(self.auroc.index)
        return pd.DataFrame({
            "finding": findings,
            "auroc": self.auroc.to_numpy(dtype=float, copy=True),
            "reason": [self.reasons.get(f, "") for f in findings],
            "n_train": self.n_train,
            "n_test": self.n_test,
        })

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: auroc per finding (NaN as None), reasons, n_train, n_test."""
        return json_ready({"auroc": self.auroc, "reasons": self.reasons, "n_train": self.n_train,
                           "n_test": self.n_test})


def linear_probe_auroc(
    X: Any,
    labels: pd.DataFrame,
    *,
    groups: Any,
    test_size: float = 0.3,
    C: float = 1.0,
    max_iter: int = 2000,
    random_state: int | None = 0,
) -> ProbeAUROC:
    """Test AUROC of a linear probe per finding on a patient-grouped split.

    A standardised, L2-regularised logistic regression per finding is
    trained on the embeddings of the training patients and scored on the
    held-out patients (``GroupShuffleSplit``: no patient in both parts).
    Rows with an empty label for a finding are left out for that finding.

    A finding with one class in the training or test part is not fitted: its
    AUROC is NaN and the reason is recorded in ``result.reasons`` (and
    logged). If every finding is degenerate, InputError.

    Parameters
    ----------
    X : array-like of shape (N, d)
    labels : DataFrame of shape (N, n_findings), values 0/1 (NaN = unknown)
    groups : array-like of shape (N,)
        Patient ids.
    test_size : float
        Share of patients held out.
    C : float
        Inverse L2 strength of the logistic regression.
    max_iter : int
    random_state : int

    Returns
    -------
    ProbeAUROC
        ``auroc``: Series of test AUROC, indexed by finding (name
        ``"auroc"``); ``reasons`` for the findings not fitted; ``n_train``
        and ``n_test``, the sizes of the two parts.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 5))
    >>> y = pd.DataFrame({"effusion": (X[:, 0] > 0).astype(int)})
    >>> res = linear_probe_auroc(X, y, groups=np.arange(200))
    >>> float(res.auroc["effusion"]) > 0.9, res.reasons, res.n_train, res.n_test
    (True, {}, 140, 60)
    """
    Xf = as_embeddings(X, "X")
    n = Xf.shape[0]
    lab = check_labels(labels, n)
    g = np.asarray(groups)
    if g.shape != (n,):
        raise InputError(f"groups must have one patient id per image ({n}), got shape {g.shape}")
    if not 0 < test_size < 1:
        raise InputError(f"test_size must be between 0 and 1, got {test_size}")
    if len(pd.unique(g)) < 2:
        raise InputError("groups has a single patient; a patient-grouped split needs at least 2")
    train, test = _probe_split(g, test_size, random_state)
    out = {}
    reasons = {}
    with one_blas_thread():  # one small fit per finding
        for col in lab.columns:
            y = lab[col].to_numpy()
            tr = train[~np.isnan(y[train])]
            te = test[~np.isnan(y[test])]
            reason = degenerate_reason(y[tr].astype(int), "training") or degenerate_reason(y[te].astype(int), "test")
            if reason:
                out[col] = np.nan
                reasons[col] = reason
                log.warning("linear_probe_auroc: finding %r skipped: %s", col, reason)
                continue
            clf = logistic_probe(C, max_iter, random_state).fit(Xf[tr], y[tr].astype(int))
            out[col] = stats.auroc(y[te], clf.decision_function(Xf[te]))
    if reasons and len(reasons) == len(lab.columns):
        raise InputError(
            "no finding could be evaluated: " + "; ".join(f"{c}: {r}" for c, r in reasons.items())
        )
    auroc = pd.Series(out, name="auroc", dtype=float)
    auroc.index.name = "finding"
    return ProbeAUROC(auroc=auroc, reasons=reasons, n_train=int(train.size), n_test=int(test.size))


@dataclass(frozen=True, eq=False)
class ProbeMargin(JsonResult):
    """What an encoder's features add over a reference's on a linear probe
    (:func:`probe_margin`).

    Attributes
    ----------
    auroc, reference_auroc : float
        Mean test AUROC over ``findings`` of the model's and of the
        reference's probe.
    difference, low, high : float
        ``auroc - reference_auroc`` and its patient-grouped paired bootstrap
        interval.
    confidence : float
    findings : list of str
        The findings both probes were fitted on (the others: ``reasons``).
    reasons : dict of str -> str
        Finding -> why it was left out.
    n_test, n_test_patients : int
        Images and patients scored (out of fold, each once).
    n_invalid : int
        Bootstrap resamples left out because a finding had one class in them.
    """

    auroc: float
    reference_auroc: float
    difference: float
    low: float
    high: float
    confidence: float
    findings: list[str]
    reasons: dict[str, str]
    n_test: int
    n_test_patients: int
    n_resamples: int
    n_invalid: int

    @property
    def learned(self) -> bool:
        """True when the whole interval of the difference is above 0."""
        return bool(self.low > 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields plus ``learned``."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["learned"] = self.learned
        return json_ready(out)


def _mean_auroc(y: np.ndarray, scores: np.ndarray) -> float:
    """Mean AUROC over the columns (label -1: unknown, left out); NaN when a
    column has one class, so a bootstrap resample like that counts as invalid."""
    values = []
    for j in range(y.shape[1]):
        known = y[:, j] >= 0
        values.append(stats.auroc(y[known, j], scores[known, j]))
    return float(np.mean(values))


def probe_margin(
    X: Any,
    X_reference: Any,
    labels: pd.DataFrame,
    *,
    groups: Any,
    n_splits: int = 5,
    C: float = 1.0,
    max_iter: int = 2000,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> ProbeMargin:
    """Paired difference of linear-probe AUROC between an encoder and a
    reference (its random initialisation, say) on the same images.

    Both embeddings get the linear probe of :func:`linear_probe_auroc`
    (standardise, L2 logistic regression), scored out of fold: patient-grouped,
    stratified ``n_splits``-fold cross-validation per finding, the same
    folds for both, so every patient is a test patient once. The scores
    leave out the fitted intercept, so that the folds, pooled, are ranked
    on one scale: a constant embedding scores exactly 0.5. The score is
    the mean AUROC over the findings both can be fitted on; the interval of
    the difference resamples the patients (the same ones for both sides),
    so an encoder whose features add nothing over the reference's has an
    interval that reaches 0.

    Parameters
    ----------
    X, X_reference : array-like of shape (N, d) and (N, d_ref)
        Embeddings of the same N images, row by row.
    labels : DataFrame of shape (N, n_findings), values 0/1 (NaN = unknown)
    groups : array-like of shape (N,)
        Patient ids.
    n_splits : int
        Folds (at most the patients of a finding's rarer class; a finding
        with fewer than 2 such patients is left out with the reason).
    C, max_iter, random_state
        As in :func:`linear_probe_auroc` (``random_state`` also seeds the
        folds and the bootstrap).
    n_resamples : int
        Bootstrap resamples of the patients.
    confidence : float

    Returns
    -------
    ProbeMargin
        ``learned`` is True when the interval's lower end is above 0.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> y = pd.DataFrame({"effusion": rng.integers(0, 2, 300)})
    >>> signal = y.to_numpy() + rng.normal(0, 0.5, size=(300, 1))
    >>> noise = rng.normal(size=(300, 4))
    >>> m = probe_margin(np.hstack([signal, noise]), noise, y, groups=np.arange(300), n_resamples=200)
    >>> m.learned, round(m.reference_auroc, 1), m.findings, m.n_test
    (True, 0.5, ['effusion'], 300)
    >>> probe_margin(noise, noise, y, groups=np.arange(300), n_resamples=200).difference
    0.0
    """
    from crslib.splits import stratified_group_kfold

    Xa = as_embeddings(X, "X")
    Xb = as_embeddings(X_reference, "X_reference")
    n = Xa.shape[0]
    if Xb.shape[0] != n:
        raise InputError(f"X has {n} rows and X_reference {Xb.shape[0]}; they must embed the same images")
    lab = check_labels(labels, n)
    g = np.asarray(groups).astype(str)
    if g.shape != (n,):
        raise InputError(f"groups must have one patient id per image ({n}), got shape {g.shape}")
    if isinstance(n_splits, bool) or not isinstance(n_splits, (int, np.integer)) or n_splits < 2:
        raise InputError(f"n_splits must be an integer >= 2, got {n_splits!r}")
    y_all, score_a, score_b, findings, reasons = [], [], [], [], {}
    with one_blas_thread():
        for col in lab.columns:
            y = lab[col].to_numpy()
            rows = np.flatnonzero(~np.isnan(y))
            yk = y[rows].astype(int)
            rarer = min(len(set(g[rows][yk == c])) for c in (0, 1))
            if rarer < 2:
                reasons[str(col)] = f"{rarer} patient(s) of its rarer class; out-of-fold scores need 2"
                continue
            folds = stratified_group_kfold(yk, g[rows], min(int(n_splits), rarer), random_state)
            columns = [np.zeros(n), np.zeros(n)]
            for k in range(int(folds.max()) + 1):
                fit, held = rows[folds != k], rows[folds == k]
                for side, Z in enumerate((Xa, Xb)):
                    clf = logistic_probe(C, max_iter, random_state).fit(Z[fit], y[fit].astype(int))
                    # without the intercept: it follows the fitting folds' class balance, which pooled
                    # across folds would rank one fold's images against another's (a constant
                    # embedding would score below 0.5); within a fold it changes no ranking
                    columns[side][held] = clf.decision_function(Z[held]) - clf[-1].intercept_[0]
            score_a.append(columns[0])
            score_b.append(columns[1])
            y_all.append(np.where(np.isnan(y), -1, y).astype(int))
            findings.append(str(col))
    if not findings:
        raise InputError("no finding could be evaluated: " + "; ".join(f"{c}: {r}" for c, r in reasons.items()))
    Y, A, B = np.column_stack(y_all), np.column_stack(score_a), np.column_stack(score_b)
    res = stats.paired_bootstrap(_mean_auroc, (Y, A), (Y, B), n_resamples=n_resamples, groups=g,
                                 confidence=confidence, random_state=random_state)
    return ProbeMargin(
        auroc=res.estimate_a, reference_auroc=res.estimate_b, difference=res.estimate, low=res.low,
        high=res.high, confidence=res.confidence, findings=findings, reasons=reasons,
        n_test=int((Y >= 0).any(axis=1).sum()), n_test_patients=int(len(pd.unique(g[(Y >= 0).any(axis=1)]))),
        n_resamples=int(n_resamples), n_invalid=res.n_invalid,
    )


def _probe_split(groups: np.ndarray, test_size: float, random_state) -> tuple[np.ndarray, np.ndarray]:
    """The patient-grouped train/test rows of :func:`linear_probe_auroc`."""
    from sklearn.model_selection import GroupShuffleSplit

    split = GroupShuffleSplit(n_splits=1, test_size=test_size, random_state=random_state)
    return next(split.split(np.zeros((len(groups), 1)), groups=groups))


def degenerate_reason(y: np.ndarray, part: str) -> str | None:
    if y.size == 0:
        return f"no labelled images in the {part} split"
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.size:
        return f"single class in the {part} split ({n_pos} positive of {y.size})"
    return None


def logistic_probe(C: float, max_iter: int, random_state):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter, random_state=random_state))


# =========================================================================== classifiers of the split and shortcut audits
# Cross-validated fitting shared by crslib.audit (partition classifier) and crslib.shortcut (file
# properties -> label): one classifier factory, one fit, class probabilities per class code.

# Widest input the built-in logistic model fits with Newton-Cholesky rather than lbfgs.
_NEWTON_MAX_FEATURES = 1024


def make_classifier(model: Any, random_state: int, n_features: int = 0):
    """A fresh, unfitted classifier for the audits.

    Parameters
    ----------
    model : {"logistic", "forest"} or estimator
        ``"logistic"``: standardisation + L2 logistic regression (C=0.1,
        balanced class weights; Newton-Cholesky up to 1,024 features, else
        lbfgs); ``"forest"``: a random forest (200 trees, leaves of at least
        2 rows, balanced class weights); or a scikit-learn classifier with
        ``predict_proba`` (cloned).
    random_state : int
        Seed of the forest.
    n_features : int
        Width of the input (picks the logistic solver; 0: lbfgs).

    Raises
    ------
    InputError
        An unknown name or an object without ``fit``/``predict_proba``.

    Examples
    --------
    >>> type(make_classifier("forest", 0)).__name__
    'RandomForestClassifier'
    """
    from sklearn.base import clone

    if isinstance(model, str):
        if model == "logistic":
            from sklearn.linear_model import LogisticRegression
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler

            # Same objective either way. Newton converges in 4-8 steps of cost n*d^2; lbfgs needs 100-170
            # steps on shuffled labels (the permutation tests). On 1,560 x d phantom embeddings, 2 cores:
            # d = 512 0.2 s vs 1.5 s, d = 1,024 0.65 s vs 1.2 s; above that lbfgs catches up.
            solver = "newton-cholesky" if 0 < n_features <= _NEWTON_MAX_FEATURES else "lbfgs"
            return make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000, class_weight="balanced",
                                                                      solver=solver))
        if model == "forest":
            from sklearn.ensemble import RandomForestClassifier

            return RandomForestClassifier(n_estimators=200, min_samples_leaf=2, class_weight="balanced",
                                          random_state=random_state, n_jobs=1)
        raise InputError(f"model must be 'logistic', 'forest' or a scikit-learn classifier, got {model!r}")
    if not (hasattr(model, "fit") and hasattr(model, "predict_proba")):
        raise InputError(
            f"model must be 'logistic', 'forest' or a scikit-learn classifier with predict_proba, got {type(model).__name__}"
        )
    return clone(model)


def classifier_name(model: Any) -> str:
    """The name a result records for ``model`` (the string, or the estimator's class name)."""
    return model if isinstance(model, str) else type(model).__name__


def fit_classifier(model: Any, X: np.ndarray, y: np.ndarray, random_state: int):
    """:func:`make_classifier` fitted on ``X, y`` (convergence warnings silenced)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    estimator = make_classifier(model, random_state, X.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator.fit(X, y)
    return estimator


def class_proba(estimator: Any, X: np.ndarray, n_classes: int) -> np.ndarray:
    """Class probabilities with one column per class code 0..n_classes-1 (zeros for classes not fitted)."""
    raw = estimator.predict_proba(X)
    out = np.zeros((X.shape[0], n_classes))
    out[:, np.asarray(estimator.classes_, dtype=np.int64)] = raw
    return out


def out_of_fold_proba(model: Any, X: np.ndarray, y: np.ndarray, folds: np.ndarray, n_classes: int,
                      random_state: int) -> tuple[np.ndarray, list[Any]]:
    """Out-of-fold class probabilities, and the fitted model of each fold.

    Parameters
    ----------
    model : {"logistic", "forest"} or estimator
        As in :func:`make_classifier`.
    X : ndarray of shape (n_rows, n_features)
    y : ndarray of int64
        Class codes.
    folds : ndarray of int
        Fold of each row, 0 .. k-1 (e.g. :func:`crslib.splits.grouped_folds`).
    n_classes : int
    random_state : int

    Returns
    -------
    proba : ndarray of shape (n_rows, n_classes)
    fitted : list
        The estimator of fold k at position k.

    Examples
    --------
    >>> X = np.r_[np.zeros((10, 1)), np.ones((10, 1))]; y = np.repeat([0, 1], 10)
    >>> proba, fitted = out_of_fold_proba("logistic", X, y, np.tile([0, 1], 10), 2, 0)
    >>> proba.shape, len(fitted), bool((proba.argmax(axis=1) == y).all())
    ((20, 2), 2, True)
    """
    proba = np.full((len(y), n_classes), np.nan)
    fitted = []
    for k in range(int(folds.max()) + 1):
        held = folds == k
        estimator = fit_classifier(model, X[~held], y[~held], random_state)
        proba[held] = class_proba(estimator, X[held], n_classes)
        fitted.append(estimator)
    return proba, fitted


def label_sort_key(value: Any) -> tuple[int, Any]:
    """Sort key of label values: numbers by value, before everything else as text."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (0, float(value))
    return (1, str(value))


def class_codes(values: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """Label values (sorted by :func:`label_sort_key`, compared as text) and the code of each row.

    Examples
    --------
    >>> class_codes(np.array(["b", "a", "b"], dtype=object))
    (['a', 'b'], array([1, 0, 1]))
    """
    text = np.array([str(v) for v in values], dtype=object)
    keys, first = np.unique(text, return_index=True)
    classes = [values[i] for i in first]
    order = sorted(range(len(keys)), key=lambda i: label_sort_key(classes[i]))
    classes = [classes[i] for i in order]
    lookup = {str(c): k for k, c in enumerate(classes)}
    return classes, np.array([lookup[t] for t in text], dtype=np.int64)


# =========================================================================== heads of the representation-risk workflow
# What crslib.risk fits on each encoder's reduced features: a regularised linear model, k nearest
# neighbours and a small MLP, each returning a prediction for every row, the chosen hyperparameter and
# its inner cross-validation score. ``folds`` are (fit, validation) indices inside the training rows
# (crslib.splits.inner_folds).

# Hyperparameter grids searched by inner cross-validation on the training rows.
_C_GRID = (0.01, 0.1, 1.0, 10.0)  # LogisticRegression inverse regularisation
_ALPHA_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0)  # Ridge penalty
_K_GRID = (5, 15, 31)  # neighbours of the kNN head
_MLP_OPTIONS = {"hidden_layer_sizes": (64,), "solver": "lbfgs", "alpha": 1e-3, "max_iter": 200}
_DEFAULT_PARAM = {"linear_classification": 1.0, "linear_regression": 10.0, "knn": 15}


def r2(y: np.ndarray, pred: np.ndarray) -> float:
    """Coefficient of determination; NaN for a constant ``y`` (its rounding noise too: :func:`stats.sum_of_squares`)."""
    ss_tot, varies = stats.sum_of_squares(y)
    return 1.0 - float(np.sum((y - pred) ** 2)) / float(ss_tot[0]) if varies[0] else float("nan")


def primary_score(task: str, y: np.ndarray, pred: np.ndarray) -> float:
    """The selection metric: AUROC (classification) or R^2 (regression)."""
    from crslib.metrics import metric_score

    return metric_score(y, pred, metric="auroc") if task == "classification" else r2(y, pred)


def linear_head(task: str, value: float):
    """Standardisation, then ``LogisticRegression(C=value)`` or ``Ridge(alpha=value)``."""
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if task == "classification":
        return make_pipeline(StandardScaler(), LogisticRegression(C=value, max_iter=2000))
    return make_pipeline(StandardScaler(), Ridge(alpha=value))


def head_predict(model, task: str, Z: np.ndarray) -> np.ndarray:
    """Probability of the positive class (classification) or the predicted value."""
    return model.predict_proba(Z)[:, 1] if task == "classification" else model.predict(Z)


def fit_linear_head(Z, y, tr, folds, task, *, fold_features=None, param=None, score=None):
    """Linear head, its penalty chosen by inner CV (or fixed by ``param``).

    ``fold_features[i]`` holds the training rows' features as reduced by a
    PCA fitted on fold i's fitting rows only (default: ``Z[tr]`` for every
    fold), so an inner fold's held-out rows never shape the features it is
    scored on. ``score(y, pred)`` ranks the penalties (higher is better;
    default :func:`primary_score` of ``task``). Returns the prediction for
    every row, ``"C=.."`` or ``"alpha=.."``, and its inner-CV score.
    """
    score = score or (lambda truth, pred: primary_score(task, truth, pred))
    grid = _C_GRID if task == "classification" else _ALPHA_GRID
    name = "C" if task == "classification" else "alpha"
    best, inner = _DEFAULT_PARAM[f"linear_{task}"], float("nan")
    if param is not None:
        best = param
    elif folds:
        yt = y[tr]
        scores = []
        for value in grid:
            oof = np.zeros(yt.size)
            for i, (fit, val) in enumerate(folds):
                Zt = Z[tr] if fold_features is None else fold_features[i]
                oof[val] = head_predict(linear_head(task, value).fit(Zt[fit], yt[fit]), task, Zt[val])
            scores.append(score(yt, oof))
        if np.isfinite(scores).any():
            i = int(np.nanargmax(scores))
            best, inner = grid[i], float(scores[i])
    model = linear_head(task, best).fit(Z[tr], y[tr])
    return head_predict(model, task, Z), f"{name}={best:g}", inner


def knn_means(Z_fit: np.ndarray, y_fit: np.ndarray, Z_query: np.ndarray, ks) -> dict[int, np.ndarray]:
    """Mean target of the k nearest fitting rows (Euclidean) for every k, from one neighbour search.

    Exact brute-force search with one matrix product (faster here than
    scikit-learn's threaded search on small inputs); ties in distance are
    broken by row order: of fitting rows at the same (computed) distance,
    the earlier rows are the nearer, so the means are deterministic.

    Examples
    --------
    >>> means = knn_means(np.arange(4.0)[:, None], np.array([0, 0, 1, 1]), np.array([[0.1], [2.9]]), [1, 2])
    >>> means[1].tolist(), means[2].tolist()
    ([0.0, 1.0], [0.0, 1.0])
    """
    k_max = min(max(ks), y_fit.shape[0])  # rows, also for a one-hot (rows x classes) target
    d2 = (Z_query * Z_query).sum(axis=1)[:, None] - 2.0 * (Z_query @ Z_fit.T) + (Z_fit * Z_fit).sum(axis=1)[None, :]
    if k_max < y_fit.shape[0]:
        # argpartition would take an arbitrary subset of the rows tied at the k-th distance;
        # keep every row below it and the earliest of those at it, in row order
        kth = np.partition(d2, k_max - 1, axis=1)[:, k_max - 1, None]
        below, at = d2 < kth, d2 == kth
        keep = below | (at & (np.cumsum(at, axis=1, dtype=np.int32) <= k_max - below.sum(axis=1, keepdims=True)))
        near = np.nonzero(keep)[1].reshape(-1, k_max)
    else:
        near = np.broadcast_to(np.arange(y_fit.shape[0]), d2.shape)
    # near is in row order, so the stable sort keeps tied rows in row order
    order = np.argsort(np.take_along_axis(d2, near, axis=1), axis=1, kind="stable")
    ind = np.take_along_axis(near, order, axis=1)
    cum = np.cumsum(y_fit[ind].astype(float), axis=1)
    return {k: cum[:, min(k, k_max) - 1] / min(k, k_max) for k in ks}


def fit_knn_head(Z, y, tr, folds, task, *, targets=None, score=None, fold_features=None, param=None):
    """kNN head, k chosen by inner CV (or fixed by ``param``): (prediction for every row, ``"k=.."``, inner score).

    ``targets`` (default ``y``) are what the neighbours average, e.g. one-hot
    class indicators (rows x classes) for class shares; ``score(y, pred)``
    (default :func:`primary_score` of ``task``) ranks the k on the inner folds;
    ``fold_features`` as in :func:`fit_linear_head`.
    """
    targets = y if targets is None else targets
    score = score or (lambda truth, pred: primary_score(task, truth, pred))
    best, inner = _DEFAULT_PARAM["knn"], float("nan")
    Zt, yt, tt = Z[tr], y[tr], targets[tr]
    if param is not None:
        best = int(param)
    elif folds:
        oof = {k: np.zeros(tt.shape) for k in _K_GRID}
        for i, (fit, val) in enumerate(folds):
            Zf = Zt if fold_features is None else fold_features[i]
            for k, pred in knn_means(Zf[fit], tt[fit], Zf[val], _K_GRID).items():
                oof[k][val] = pred
        scores = [score(yt, oof[k]) for k in _K_GRID]
        if np.isfinite(scores).any():
            i = int(np.nanargmax(scores))
            best, inner = _K_GRID[i], float(scores[i])
    k = min(best, yt.size)
    return knn_means(Zt, tt, Z, [k])[k], f"k={k}", inner


def fit_mlp_head(Z, y, tr, folds, task, seed):
    """MLP head with fixed settings (no inner CV): (prediction for every row, ``"hidden=64"``, NaN)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if task == "classification":
            model = make_pipeline(StandardScaler(), MLPClassifier(**_MLP_OPTIONS, random_state=seed))
            pred = model.fit(Z[tr], y[tr]).predict_proba(Z)[:, 1]
        else:
            mu, sd = float(y[tr].mean()), float(y[tr].std()) or 1.0
            model = make_pipeline(StandardScaler(), MLPRegressor(**_MLP_OPTIONS, random_state=seed))
            pred = model.fit(Z[tr], (y[tr] - mu) / sd).predict(Z) * sd + mu
    return pred, "hidden=64", float("nan")


def fit_head(head: str, Z, y, tr, folds, task, seed, *, fold_features=None, param=None, score=None):
    """Fit one head (``"linear"``, ``"knn"`` or ``"mlp"``) on the training rows ``tr`` of ``Z``.

    ``fold_features`` (per inner fold, the training rows' fold-reduced
    features) and ``param`` (a fixed hyperparameter value: no inner CV) as
    in :func:`fit_linear_head`, and ``score(y, pred)`` (higher is better)
    that ranks the inner-CV settings; the MLP has fixed settings and
    ignores all three.

    Returns
    -------
    pred : ndarray of shape (n_rows,)
        Prediction for every row of ``Z`` (probability or value).
    param : str
        The hyperparameter chosen.
    inner : float
        Its inner-CV primary score (NaN without inner CV).
    """
    if head == "linear":
        return fit_linear_head(Z, y, tr, folds, task, fold_features=fold_features, param=param, score=score)
    if head == "knn":
        return fit_knn_head(Z, y, tr, folds, task, fold_features=fold_features, param=param, score=score)
    return fit_mlp_head(Z, y, tr, folds, task, seed)

"""Prediction-level combinations and the selection rule of the representation-risk workflow.

:mod:`crslib.risk` fits every encoder x head candidate and the feature union;
this module adds the candidates that combine encoders' *predictions* and
then picks one candidate on the locked validation partition.

Combinations (all built from each encoder's base head, fitted on the
training rows only):

* ``average``: the mean of every encoder's prediction (class probabilities
  are averaged);
* ``greedy``: forward selection on validation, the encoder whose addition to
  an equal-weight average lowers the validation loss most, until no
  addition lowers it;
* ``stack``: a linear model on the encoders' out-of-fold *training*
  predictions (logistic regression on their logits for classification,
  least squares for regression); validation rows never reach its fit.

Selection (:func:`select_candidate`) uses a proper score (log loss; MSE or
MAE for regression) with a stated tie rule:

1. Among single-encoder candidates, those whose paired, patient-grouped
   bootstrap loss difference to the best one has an interval reaching 0
   are *within noise* of it; of those the simplest is kept (linear before
   kNN before MLP), then the lower loss, then the name, so the order in
   which encoders are listed never decides.
2. A combination (average, greedy, stack, feature union) replaces that
   single candidate only when its paired validation gain over the single
   candidate with the lowest loss has a lower confidence bound above 0. This guard is crslib's own rule (not the
   study software's): a union chosen on validation can collapse on test.
   Of several combinations with evidence, the simplest within noise of the
   best is taken (fewer encoders; average, greedy, stack, union).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from crslib import stats
from crslib.risk_scores import MULTICLASS, UNION, resampled_loss, row_losses

__all__ = ["COMBINATIONS", "KINDS", "average_prediction", "greedy_members", "fit_stack", "select_candidate"]

#: Prediction-level combinations, in the order of the tie rule (simpler first).
COMBINATIONS = ("average", "greedy", "stack")

#: Every kind of candidate, simplest first.
KINDS = ("single",) + COMBINATIONS + (UNION,)

_HEAD_ORDER = {"linear": 0, "knn": 1, "mlp": 2}
_CLIP = 1e-6  # probabilities are clipped before the logit of the stack's inputs


def average_prediction(preds: list[np.ndarray]) -> np.ndarray:
    """Equal-weight mean of predictions (values, probabilities, or (n, k) class probabilities)."""
    return np.mean(np.stack(preds), axis=0)


def greedy_members(base: dict[str, np.ndarray], y: np.ndarray, task: str, loss: str) -> list[str]:
    """Forward selection of an equal-weight average on the rows given (the validation rows).

    Starts from the encoder with the lowest loss and adds, one at a time and
    without replacement, the encoder that lowers the average's loss most;
    stops when no addition lowers it. Ties go to the name that sorts first.

    Examples
    --------
    >>> y = np.array([0.0, 1.0, 2.0, 3.0])
    >>> base = {"a": y + [0.5, -0.5, 0.5, -0.5], "b": y - [0.5, -0.5, 0.5, -0.5], "c": y + 3}
    >>> greedy_members(base, y, "regression", "mse")
    ['a', 'b']
    """
    def score(members: list[str]) -> float:
        return float(np.mean(row_losses(task, y, average_prediction([base[m] for m in members]), loss)))

    names = sorted(base)
    members = [min(names, key=lambda n: (score([n]), n))]
    current = score(members)
    while len(members) < len(names):
        trials = [(score(members + [n]), n) for n in names if n not in members]
        best, name = min(trials)
        if not best < current:
            break
        members.append(name)
        current = best
    return members


def _stack_inputs(preds: list[np.ndarray], task: str) -> np.ndarray:
    if task == "regression":
        return np.column_stack(preds)
    if task == MULTICLASS:
        return np.hstack([np.log(np.clip(p, _CLIP, 1.0)) for p in preds])
    clipped = [np.clip(p, _CLIP, 1.0 - _CLIP) for p in preds]
    return np.column_stack([np.log(p / (1.0 - p)) for p in clipped])


def fit_stack(oof: dict[str, np.ndarray], y: np.ndarray, task: str) -> Any:
    """Fit the linear stack on out-of-fold training predictions; returns ``predict(preds_by_encoder)``.

    ``oof`` maps each encoder to its out-of-fold prediction for the training
    rows ``y`` belongs to. The returned function maps the encoders'
    predictions (same keys) for any rows to the stack's prediction. The
    stack's coefficients are exposed as its ``coef`` attribute.

    Examples
    --------
    >>> y = np.arange(20.0)
    >>> stack = fit_stack({"a": y / 2, "b": y / 2}, y, "regression")
    >>> np.allclose(stack({"a": y / 2, "b": y / 2}), y)
    True
    """
    from sklearn.linear_model import LinearRegression, LogisticRegression

    names = list(oof)
    A = _stack_inputs([oof[n] for n in names], task)
    if task == "regression":
        model = LinearRegression().fit(A, y)
        coef = np.r_[model.intercept_, model.coef_]
    else:
        model = LogisticRegression(C=1.0, max_iter=5000).fit(A, y)
        coef = np.r_[np.ravel(model.intercept_), np.ravel(model.coef_)]

    def predict(preds: dict[str, np.ndarray]) -> np.ndarray:
        B = _stack_inputs([preds[n] for n in names], task)
        if task == "regression":
            return model.predict(B)
        proba = model.predict_proba(B)
        return proba[:, 1] if task == "classification" else proba

    predict.coef = coef  # type: ignore[attr-defined]
    return predict


def _simplicity(row: pd.Series) -> tuple:
    return (KINDS.index(row["kind"]), int(row["n_members"]), _HEAD_ORDER.get(row["head"], 3))


def _pick(table: pd.DataFrame, L: dict[str, np.ndarray], confidence: float) -> tuple[str, str, dict[str, tuple]]:
    """The simplest candidate of ``table`` within noise of its lowest-loss one, and each one's gap to that one."""
    best = min(table.itertuples(index=False), key=lambda r: (r.val_loss, r.candidate)).candidate
    gaps = {}
    for c in table["candidate"]:
        low, high, _ = stats.percentile_interval(L[c] - L[best], confidence)
        gaps[c] = (float(low), float(high))
    near = table[[gaps[c][0] <= 0 for c in table["candidate"]]]
    chosen = min(near.itertuples(index=False), key=lambda r: (_simplicity(pd.Series(r._asdict())), r.val_loss,
                                                                r.candidate)).candidate
    return best, chosen, gaps


def select_candidate(candidates: pd.DataFrame, val_row_losses: dict[str, np.ndarray], counts: np.ndarray, *,
                     loss: str, confidence: float) -> tuple[str, pd.DataFrame]:
    """Pick one candidate on validation by a proper score, with the tie rule and the combination guard.

    Parameters
    ----------
    candidates : DataFrame
        ``candidate``, ``kind`` (one of :data:`KINDS`), ``head``, ``members``
        and ``n_members`` per candidate.
    val_row_losses : dict
        Candidate -> per-row loss on the validation rows.
    counts : ndarray of shape (n_resamples, n_val)
        Patient-grouped bootstrap of the validation rows, shared by every
        candidate (so differences are paired).
    loss : str
        Name of the score (for the reasons).
    confidence : float

    Returns
    -------
    selected : str
    selection : DataFrame
        One row per candidate: ``candidate``, ``kind``, ``members``,
        ``val_loss``, ``val_loss_low``, ``val_loss_high``, ``gap`` (loss minus
        the lowest single-encoder loss) with ``gap_low`` / ``gap_high``,
        ``within_noise`` (its gap's interval contains 0), ``gain_low`` /
        ``gain_high`` (combinations: paired gain over the single candidate
        with the lowest loss), ``evidence`` (that gain's lower bound is above 0),
        ``kept`` (the single candidate the tie rule keeps), ``chosen`` and
        ``why``.
    """
    table = candidates[["candidate", "kind", "head", "members", "n_members"]].copy()
    table["val_loss"] = [float(np.mean(val_row_losses[c])) for c in table["candidate"]]
    L = {c: resampled_loss(val_row_losses[c], counts) for c in table["candidate"]}
    low, high, _ = stats.percentile_interval(np.column_stack([L[c] for c in table["candidate"]]), confidence)
    table["val_loss_low"], table["val_loss_high"] = low, high

    singles = table[table["kind"] == "single"]
    best_single, kept, gaps = _pick(singles, L, confidence)
    for c in table["candidate"]:
        if c not in gaps:
            g_low, g_high, _ = stats.percentile_interval(L[c] - L[best_single], confidence)
            gaps[c] = (float(g_low), float(g_high))
    best_loss = float(table.loc[table["candidate"] == best_single, "val_loss"].iloc[0])
    table["gap"] = table["val_loss"] - best_loss
    table["gap_low"] = [gaps[c][0] for c in table["candidate"]]
    table["gap_high"] = [gaps[c][1] for c in table["candidate"]]
    # a combination clearly below the best single's loss has an interval wholly under 0: not "noise"
    table["within_noise"] = (table["gap_low"] <= 0) & (table["gap_high"] >= 0)

    gain = {}
    for c in table.loc[table["kind"] != "single", "candidate"]:
        # against the lowest-loss single candidate, not the simpler one kept: the stricter comparison
        g_low, g_high, _ = stats.percentile_interval(L[best_single] - L[c], confidence)
        gain[c] = (float(g_low), float(g_high))
    table["gain_low"] = [gain.get(c, (np.nan, np.nan))[0] for c in table["candidate"]]
    table["gain_high"] = [gain.get(c, (np.nan, np.nan))[1] for c in table["candidate"]]
    table["evidence"] = table["gain_low"] > 0
    backed = table[table["evidence"]]
    selected = _pick(backed, L, confidence)[1] if len(backed) else kept
    table["kept"] = table["candidate"] == kept
    table["chosen"] = table["candidate"] == selected
    table["why"] = [_why(r, loss, kept, best_single, selected) for r in table.itertuples(index=False)]
    return selected, table.drop(columns=["head"])


def _why(r: Any, loss: str, kept: str, best_single: str, selected: str) -> str:
    gap = f"{r.gap:+.4f} [{r.gap_low:+.4f}, {r.gap_high:+.4f}]"
    if r.kind == "single":
        if r.candidate == kept:
            text = (f"lowest validation {loss} of the single encoders" if r.candidate == best_single else
                    f"within the bootstrap noise of {best_single} ({loss} gap {gap}) and simpler, so preferred")
            return text + ("" if r.candidate == selected else f"; replaced by {selected}")
        if r.candidate == best_single:
            return f"lowest validation {loss} of the single encoders, but {kept} is within its noise and simpler"
        if r.within_noise:
            return f"within the noise of {best_single} ({loss} gap {gap}); {kept} is simpler or lower"
        return f"validation {loss} higher than {best_single}'s by {gap}"
    evidence = f"gain over {best_single} {r.gain_low:+.4f} to {r.gain_high:+.4f}"
    if r.candidate == selected:
        return f"{evidence}: lower bound > 0, selected"
    if r.evidence:
        return f"{evidence}: lower bound > 0, but {selected} is simpler or lower"
    return f"{evidence}: interval reaches 0 or below, not selected (crslib's evidence rule)"

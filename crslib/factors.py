"""Agreement of models that differ in exactly one factor.

The study's trained models differ in pretraining objective, label type, size,
seed, initialisation, training patients and training recipe. Two models that
differ in exactly one of these isolate that factor: their neighbour overlap
says how much changing it alone moves the representation.
:func:`factor_pairs` finds those pairs in a model table and
:func:`factor_table` summarises their agreement per factor.

Examples
--------
>>> import numpy as np, pandas as pd
>>> info = pd.DataFrame({"name": ["a", "b", "c"], "objective": ["sup", "sup", "ssl"],
...                      "seed": [0, 1, 0], "architecture": "small"})
>>> A = pd.DataFrame([[1, .3, .1], [.3, 1, .2], [.1, .2, 1]], index=info.name, columns=info.name)
>>> factor_pairs(A, info)[["model_a", "model_b", "factor"]].values.tolist()
[['a', 'b', 'seed'], ['a', 'c', 'objective']]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from crslib.agreement import AgreementMatrix, _check_agreement_frame
from crslib.errors import InputError

__all__ = ["FACTORS", "SUPERSETS", "factor_pairs", "factor_table"]

#: The factors, in the order a table lists them. ``architecture`` is the size
#: factor; ``init`` random vs pretrained weights; ``patients`` which training
#: patients; ``recipe`` the augmentation strength and schedule.
FACTORS = ("objective", "seed", "architecture", "init", "patients", "recipe")


#: Factor values that contain the others: every training patient includes
#: each half, so a pair of "all" and a half shares half its data and does not
#: isolate the factor the way two disjoint halves do.
SUPERSETS = {"patients": "all"}


def factor_pairs(agreement: AgreementMatrix | pd.DataFrame, model_info: pd.DataFrame,
                 factors: Sequence[str] = FACTORS, *, supersets: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Every pair of models that differ in exactly one factor, with its overlap.

    Parameters
    ----------
    agreement : AgreementMatrix or DataFrame (M x M)
        From :func:`crslib.agreement.agreement_matrix`, or its ``overlap``
        frame.
    model_info : DataFrame
        A ``name`` column and one column per factor. Factors that are not
        columns are taken as equal for every model (a zoo without the
        ``init`` factor trains every model from random weights); models with
        a missing value in a factor column (e.g. public models, whose
        objective or seed the table does not know) are left out.
    factors : sequence of str
        The factors compared; default :data:`FACTORS`.
    supersets : mapping, optional
        factor -> a value that contains the others; a pair in which one
        model has it is left out. Default :data:`SUPERSETS` (patients
        ``all``: only two disjoint halves isolate the training patients).

    Returns
    -------
    DataFrame
        One row per pair (in the order of ``agreement``) with columns
        ``model_a, model_b, factor, value_a, value_b, overlap``.

    Raises
    ------
    InputError
        No factor, a model of ``agreement`` without a row, or a model listed
        twice.
    """
    agreement = _check_agreement_frame(agreement)
    supersets = SUPERSETS if supersets is None else supersets
    factors = list(factors)
    if not factors:
        raise InputError("factor_pairs needs at least one factor, e.g. ('objective', 'seed')")
    if "name" not in model_info.columns:
        raise InputError("model_info needs a 'name' column naming the models of the agreement matrix")
    if model_info["name"].duplicated().any():
        raise InputError(f"model_info lists model(s) {sorted(set(model_info['name'][model_info['name'].duplicated()]))} "
                         "more than once")
    info = model_info.set_index("name")
    names = list(agreement.index)
    absent = [m for m in names if m not in info.index]
    if absent:
        raise InputError(f"model_info has no row for model(s) {absent}")
    present = [f for f in factors if f in info.columns]
    values = info.loc[names, present].astype(object)
    known = ~values.isna().any(axis=1).to_numpy()
    A = agreement.to_numpy(dtype=float)
    rows = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            if not (known[i] and known[j]):
                continue
            differ = [f for f in present if values.iloc[i][f] != values.iloc[j][f]]
            if len(differ) == 1:
                f = differ[0]
                if f in supersets and supersets[f] in (values.iloc[i][f], values.iloc[j][f]):
                    continue
                rows.append({"model_a": names[i], "model_b": names[j], "factor": f, "value_a": values.iloc[i][f],
                             "value_b": values.iloc[j][f], "overlap": A[i, j]})
    return pd.DataFrame(rows, columns=["model_a", "model_b", "factor", "value_a", "value_b", "overlap"])


def factor_table(pairs: pd.DataFrame, factors: Sequence[str] = FACTORS) -> pd.DataFrame:
    """Agreement per factor: the pairs that differ in it alone.

    Parameters
    ----------
    pairs : DataFrame
        From :func:`factor_pairs`.
    factors : sequence of str
        Row order; factors without a pair are left out.

    Returns
    -------
    DataFrame with columns factor, n_pairs, mean, min, max (overlap)

    Examples
    --------
    >>> pairs = pd.DataFrame({"factor": ["seed", "seed", "objective"], "overlap": [0.5, 0.3, 0.1]})
    >>> factor_table(pairs)[["factor", "n_pairs", "mean"]].values.tolist()
    [['objective', 1, 0.1], ['seed', 2, 0.4]]
    """
    missing = {"factor", "overlap"} - set(pairs.columns)
    if missing:
        raise InputError(f"pairs lacks column(s) {sorted(missing)}; pass the result of factor_pairs")
    rows = []
    for f in factors:
        values = pairs.loc[pairs["factor"] == f, "overlap"].to_numpy(dtype=float)
        if values.size:
            rows.append({"factor": f, "n_pairs": int(values.size), "mean": float(np.mean(values)),
                         "min": float(np.min(values)), "max": float(np.max(values))})
    return pd.DataFrame(rows, columns=["factor", "n_pairs", "mean", "min", "max"])

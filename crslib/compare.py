"""The model-replacement check behind ``crs compare``.

Before a successor model replaces an old one, CRS-Bench advises testing on
unlabelled images whether it returns the same nearest neighbours. This module
computes that check from two models' embeddings of the same images: the mutual
kNN overlap with a confidence interval, set against chance and against a
random-initialised network of the new model's architecture; the overlap per
subgroup; how well a linear map carries the new space onto the old one
(held-out R^2); and, when labels are given, how much AUROC the old model's
classifiers keep when applied to mapped new-model embeddings.

Everything here is pure (arrays and DataFrames in, a result object out);
:func:`crslib.reports.render_report_html` renders a self-contained HTML page
from a result.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from crslib._io import json_ready
from crslib._validation import check_same_rows
from crslib.agreement import chance_overlap, overlap_ci, overlap_from_indices
from crslib.ann import knn_search, overlap_error_bound
from crslib.errors import InputError
from crslib.splits import grouped_partition
from crslib.subgroups import overlap_by_subgroup
from crslib.transfer import classifier_transfer, fit_linear_map, held_out_r2

SUBGROUP_COLUMNS = ("source", "view")


@dataclass
class CompareResult:
    """Numbers of one old-vs-new comparison (all JSON-serialisable via :meth:`to_dict`)."""

    old: str
    new: str
    n_images: int
    k: int
    overlap: float
    overlap_low: float
    overlap_high: float
    chance: float
    reference: str | None = None
    reference_overlap: float | None = None
    reference_low: float | None = None
    reference_high: float | None = None
    map_r2: float | None = None
    min_overlap: float | None = None
    passed: bool | None = None
    subgroups: list[dict[str, Any]] = field(default_factory=list)
    transfer: list[dict[str, Any]] = field(default_factory=list)
    search: dict[str, dict[str, Any]] = field(default_factory=dict)
    overlap_error_bound: float = 0.0
    per_image: list[float] = field(default_factory=list, repr=False)

    def to_dict(self, *, per_image: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not per_image:
            out.pop("per_image")
        return out

    def to_json(self) -> str:
        return json.dumps(json_ready(self.to_dict()), indent=2, sort_keys=False) + "\n"


def binary_label_frame(manifest: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """0/1 label columns from manifest columns, for classifier transfer.

    A 0/1 column is kept; a two-valued column becomes one column whose
    positive class is the later value in sorted order (``PNEUMONIA`` over
    ``NORMAL``); a column with more values becomes one-vs-rest columns.

    Raises
    ------
    InputError
        If a column is missing, has missing values or a single value.
    """
    frames = []
    for column in columns:
        if column not in manifest.columns:
            raise InputError(
                f"label column {column!r} is not in the manifest; columns are {', '.join(manifest.columns)}"
            )
        values = manifest[column]
        if values.isna().any():
            raise InputError(f"label column {column!r} has {int(values.isna().sum())} missing values")
        levels = sorted(pd.unique(values), key=str)
        if len(levels) < 2:
            raise InputError(f"label column {column!r} has a single value ({levels[0]!r}); it cannot be scored")
        if set(levels) <= {0, 1}:
            frames.append(values.astype(int).rename(column))
        elif len(levels) == 2:
            frames.append((values == levels[1]).astype(int).rename(f"{column}={levels[1]}"))
        else:
            for level in levels:
                frames.append((values == level).astype(int).rename(f"{column}={level}"))
    return pd.concat(frames, axis=1).reset_index(drop=True)


def compare_embeddings(
    X_old: np.ndarray,
    X_new: np.ndarray,
    metadata: pd.DataFrame,
    *,
    old: str = "old",
    new: str = "new",
    k: int = 10,
    X_reference: np.ndarray | None = None,
    reference: str | None = None,
    labels: pd.DataFrame | None = None,
    min_overlap: float | None = None,
    n_resamples: int = 1000,
    random_state: int = 0,
    scheduler: Any = None,
) -> CompareResult:
    """Compare a successor model's embeddings with the old model's.

    Parameters
    ----------
    X_old, X_new : ndarray of shape (n_images, d_old) and (n_images, d_new)
        Both models' embeddings of the same images, rows aligned.
    metadata : DataFrame
        One row per image (aligned); ``patient_id`` (if present) groups the
        bootstrap and the map/probe split; ``source`` and ``view`` (if present
        with more than one level) give the subgroup table.
    old, new : str
        Names for the report.
    k : int
        Neighbours per image.
    X_reference : ndarray, optional
        Embeddings from a random-initialised network of the new model's
        architecture: the overlap the old model has with it is the floor a
        real successor should clear.
    reference : str, optional
        Name of the reference model.
    labels : DataFrame of 0/1 columns, optional
        Findings for classifier transfer (see :func:`binary_label_frame`).
    min_overlap : float, optional
        The gate: ``passed`` is False when the overlap's upper CI bound is
        below it.
    n_resamples : int
        Bootstrap resamples (over patients when ``patient_id`` is present).
    random_state : int
        Seed of the bootstrap and of the patient-level splits.
    scheduler : None, "local[:N]", a Dask scheduler address or a distributed.Client
        Where the neighbour searches run (see :mod:`crslib.cluster`). Above
        :data:`crslib.agreement.APPROX_THRESHOLD` images they use an
        approximate index; ``search`` then holds each model's measured recall
        and ``overlap_error_bound`` the most the overlap can be off by.

    Returns
    -------
    CompareResult

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> X = np.random.default_rng(0).normal(size=(200, 16))
    >>> result = compare_embeddings(X, 2 * X, pd.DataFrame(index=range(200)), n_resamples=50)
    >>> result.overlap
    1.0
    """
    X_old = np.asarray(X_old)
    X_new = np.asarray(X_new)
    if len(metadata) != len(X_old):
        raise InputError(f"metadata has {len(metadata)} rows but the embeddings have {len(X_old)}")
    metadata = metadata.reset_index(drop=True)
    groups = metadata["patient_id"].to_numpy() if "patient_id" in metadata.columns else None
    from crslib.cluster import open_client

    roles = {"old": X_old, "new": X_new}
    if X_reference is not None:
        roles["reference"] = X_reference
    check_same_rows(roles)
    neighbours, search = {}, {}
    with open_client(scheduler) as client:
        for role, X in roles.items():
            try:
                neighbours[role], search[role] = knn_search(X, k=k, client=client, random_state=random_state)
            except InputError as exc:
                raise InputError(f"{role} embeddings: {exc}") from exc

    def recall(role: str) -> float:  # the conservative end of the measured recall
        info = search[role]
        return 1.0 if info.get("recall") is None else float((info.get("recall_ci") or [info["recall"]])[0])

    per_image = overlap_from_indices(neighbours["old"], neighbours["new"])
    ci = overlap_ci(per_image, groups=groups, n_resamples=n_resamples, random_state=random_state)
    result = CompareResult(
        old=old, new=new, n_images=len(X_old), k=k,
        overlap=float(ci.estimate), overlap_low=float(ci.low), overlap_high=float(ci.high),
        chance=chance_overlap(len(X_old), k), per_image=per_image.astype(float).tolist(),
        search=search, overlap_error_bound=float(overlap_error_bound(recall("old"), recall("new"))),
    )
    if X_reference is not None:
        reference_per_image = overlap_from_indices(neighbours["old"], neighbours["reference"])
        ref = overlap_ci(reference_per_image, groups=groups, n_resamples=n_resamples, random_state=random_state)
        result.reference = reference or "random init"
        result.reference_overlap = float(ref.estimate)
        result.reference_low, result.reference_high = float(ref.low), float(ref.high)
    columns = [c for c in SUBGROUP_COLUMNS if c in metadata.columns and metadata[c].nunique() > 1]
    if columns:
        table = overlap_by_subgroup(per_image, metadata, columns=columns, groups=groups,
                                    n_resamples=min(n_resamples, 500), random_state=random_state)
        result.subgroups = table.to_dict(orient="records")
    patients = groups if groups is not None else np.arange(len(X_old))
    if labels is None:
        fit_idx, test_idx = grouped_partition(patients, (0.8, 0.2), random_state=random_state)
        linear = fit_linear_map(X_new[fit_idx], X_old[fit_idx], random_state=random_state)
        result.map_r2 = float(held_out_r2(linear, X_new[test_idx], X_old[test_idx]))
    else:
        map_idx, train_idx, test_idx = grouped_partition(patients, (0.5, 0.25, 0.25), random_state=random_state)
        table = classifier_transfer(
            X_old, X_new, labels.reset_index(drop=True), map_idx=map_idx, train_idx=train_idx,
            test_idx=test_idx, groups=groups, n_resamples=min(n_resamples, 500), random_state=random_state,
        ).table
        result.transfer = table.to_dict(orient="records")
        result.map_r2 = float(table["map_r2"].dropna().iloc[0]) if table["map_r2"].notna().any() else None
    if min_overlap is not None:
        result.min_overlap = float(min_overlap)
        result.passed = bool(result.overlap_high >= min_overlap)
    return result

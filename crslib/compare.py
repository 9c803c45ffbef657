"""The model-replacement check behind ``crs compare``.

Before a successor model replaces an old one, CRS-Bench advises testing on
unlabelled images whether it returns the same nearest neighbours. This module
computes that check from two models' embeddings of the same images: the mutual
kNN overlap with a confidence interval, set against chance, against a
permutation null (the new model's neighbour lists relabelled by a random
permutation of the images, no new search) and against a random-initialised
network of the new model's architecture; the images whose neighbours changed
most; the overlap per subgroup; how well a linear map carries the new space onto the old one
(held-out R^2); and, when labels are given, how much AUROC the old model's
classifiers keep when applied to mapped new-model embeddings.

The gate (``min_overlap``) decides on the lower end of the overlap's 95%
interval by default (``decision="lower"``): a successor passes only when the
data show its overlap reaches the minimum, not when they merely cannot rule
it out (``decision="upper"``, the lenient rule).

Everything here is pure (arrays and DataFrames in, a result object out);
:func:`crslib.reports.render_report_html` renders a self-contained HTML page
from a result.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from crslib._io import json_ready
from crslib._validation import check_same_rows
from crslib.agreement import chance_overlap, overlap_ci, overlap_from_indices
from crslib.ann import knn_search
from crslib.errors import InputError
from crslib.recall import overlap_error_bound
from crslib.splits import grouped_partition
from crslib.subgroups import overlap_by_subgroup
from crslib.transfer import classifier_transfer, fit_linear_map, held_out_r2

SUBGROUP_COLUMNS = ("source", "view")
#: The rules ``min_overlap`` can be applied by: which end of the overlap's 95% interval must reach it.
DECISIONS = ("lower", "upper")
#: Images with the lowest per-image overlap listed in ``largest_changes`` (compare.json).
N_CHANGES = 100
#: Of those, the ones the report shows as thumbnail strips.
N_STRIPS = 12


@dataclass
class CompareResult:
    """Numbers of one old-vs-new comparison (all JSON-serialisable via :meth:`to_dict`).

    ``old`` and ``new`` are the names the user gave (``models`` holds each
    one's resolved spec and weight hash); ``decision`` and ``gate`` say which
    end of the interval the gate compared with ``min_overlap`` and with which
    numbers; ``null`` is the permutation null (mean, 95% range, p-value);
    ``largest_changes`` the images of lowest overlap. ``per_image`` and
    ``strips`` (the report's thumbnail rows) stay out of the JSON.
    """

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
    decision: str = "lower"
    gate: str | None = None
    null: dict[str, Any] | None = None
    largest_changes: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_image: list[float] = field(default_factory=list, repr=False)
    # the report's raw material: the first N_STRIPS changes with their neighbours' ids and paths
    strips: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def to_dict(self, *, per_image: bool = False) -> dict[str, Any]:
        out = asdict(self)
        out.pop("strips")
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


def model_provenance(spec: str, encoder: Any) -> dict[str, Any]:
    """Where a compared model came from: the spec as written, the spec it resolved to, its hashes.

    Parameters
    ----------
    spec : str
        The model spec the user wrote (``public:efficientnet_lite0``).
    encoder : Encoder
        What :func:`crslib.models.load_encoder` made of it.

    Returns
    -------
    dict
        ``spec``; ``resolved`` (the encoder's canonical spec, which may name a
        cached weight file); ``weights_sha256`` (SHA-256 of the weight or ONNX
        file, None for a network built without one); ``fingerprint`` (the
        encoder's content hash, the embedding cache's key).

    Examples
    --------
    >>> from crslib.models import load_encoder
    >>> info = model_provenance("timm:resnet18?size=32", load_encoder("timm:resnet18?size=32"))
    >>> info["spec"], info["resolved"], info["weights_sha256"]
    ('timm:resnet18?size=32', 'timm:resnet18?seed=0&size=32', None)
    """
    weights = getattr(encoder, "weights_file", None) or getattr(encoder, "path", None)
    sha = None
    if weights is not None:
        from crslib.models import weights_sha256

        sha = weights_sha256(weights)
    return {"spec": str(spec), "resolved": str(encoder.name), "weights_sha256": sha,
            "fingerprint": encoder.fingerprint()}


def _check_options(decision: Any, n_permutations: Any) -> tuple[str, int]:
    if decision not in DECISIONS:
        raise InputError(f"decision must be one of {', '.join(map(repr, DECISIONS))}, got {decision!r}")
    if isinstance(n_permutations, bool) or not isinstance(n_permutations, (int, np.integer)) or n_permutations < 0:
        raise InputError(f"n_permutations must be an integer >= 0 (0 skips the null), got {n_permutations!r}")
    return str(decision), int(n_permutations)


def _relabelled_null(I_old: np.ndarray, I_new: np.ndarray, observed: float, *, n_permutations: int,
                     random_state: int | None) -> dict[str, Any] | None:
    """The overlap when the new model's neighbour lists are given to randomly chosen other images.

    Image ``i`` gets the neighbour list of image ``perm[i]``, its entries
    relabelled (``inv[I_new[perm]]``), so each model keeps its own
    neighbourhood structure (hubs, clusters) while the image correspondence
    is broken; no new search is needed. The p-value counts the observed
    overlap as one of the permutations: ``(1 + #{null >= observed}) /
    (n_permutations + 1)``, never 0.
    """
    if n_permutations == 0:
        return None
    rng = np.random.default_rng(random_state)
    n = len(I_new)
    values = np.empty(n_permutations)
    for p in range(n_permutations):
        perm = rng.permutation(n)
        inv = np.empty_like(perm)
        inv[perm] = np.arange(n)
        values[p] = overlap_from_indices(I_old, inv[I_new[perm]]).mean()
    # overlaps are means of multiples of 1/k: a tie may differ from the observed value by rounding
    at_least = int((values >= observed - 1e-12).sum())
    return {"permuted": "new", "n_permutations": n_permutations, "mean": float(values.mean()),
            "low": float(np.percentile(values, 2.5)), "high": float(np.percentile(values, 97.5)),
            "confidence": 0.95, "p_value": (1 + at_least) / (n_permutations + 1)}


def _largest_changes(per_image: np.ndarray, I_old: np.ndarray, I_new: np.ndarray,
                     metadata: pd.DataFrame) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The N_CHANGES images of lowest overlap (ties in manifest order), and the strips of the first N_STRIPS."""
    def column(name: str) -> np.ndarray | None:  # of plain str, for the JSON
        return np.asarray(metadata[name].astype(str).tolist(), dtype=object) if name in metadata.columns else None

    ids = column("image_id")
    ids = np.asarray(range(len(per_image)), dtype=object) if ids is None else ids
    paths = column("path")

    def image(i: int) -> dict[str, Any]:
        return {"image_id": ids[i], "path": None if paths is None else paths[i]}

    order = np.argsort(per_image, kind="stable")[:N_CHANGES]
    changes = [{**image(i), "overlap": float(per_image[i]), "old_neighbours": ids[I_old[i]].tolist(),
                "new_neighbours": ids[I_new[i]].tolist()} for i in order]
    strips = [{**image(i), "overlap": float(per_image[i]), "old": [image(j) for j in I_old[i]],
               "new": [image(j) for j in I_new[i]]} for i in order[:N_STRIPS]]
    return changes, strips


def _apply_gate(result: CompareResult, min_overlap: float) -> None:
    bound = result.overlap_low if result.decision == "lower" else result.overlap_high
    result.min_overlap = float(min_overlap)
    result.passed = bool(bound >= min_overlap)
    result.gate = (f"{result.decision} 95% bound {bound:.3f} {'>=' if result.passed else '<'} minimum "
                   f"{min_overlap:.3f}: {'pass' if result.passed else 'fail'}")


def _map_and_transfer(result: CompareResult, X_old: np.ndarray, X_new: np.ndarray, labels: pd.DataFrame | None,
                      groups: np.ndarray | None, *, n_resamples: int, random_state: int) -> None:
    patients = groups if groups is not None else np.arange(len(X_old))
    if labels is None:
        fit_idx, test_idx = grouped_partition(patients, (0.8, 0.2), random_state=random_state)
        linear = fit_linear_map(X_new[fit_idx], X_old[fit_idx], random_state=random_state)
        result.map_r2 = float(held_out_r2(linear, X_new[test_idx], X_old[test_idx]))
        return
    map_idx, train_idx, test_idx = grouped_partition(patients, (0.5, 0.25, 0.25), random_state=random_state)
    table = classifier_transfer(
        X_old, X_new, labels.reset_index(drop=True), map_idx=map_idx, train_idx=train_idx,
        test_idx=test_idx, groups=groups, n_resamples=min(n_resamples, 500), random_state=random_state,
    ).table
    result.transfer = table.to_dict(orient="records")
    result.map_r2 = float(table["map_r2"].dropna().iloc[0]) if table["map_r2"].notna().any() else None


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
    decision: str = "lower",
    n_resamples: int = 1000,
    n_permutations: int = 199,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    random_state: int = 0,
    scheduler: Any = None,
    device: str | None = None,
    target_recall: float | None = 0.95,
) -> CompareResult:
    """Compare a successor model's embeddings with the old model's.

    Parameters
    ----------
    X_old, X_new : ndarray of shape (n_images, d_old) and (n_images, d_new)
        Both models' embeddings of the same images, rows aligned.
    metadata : DataFrame
        One row per image (aligned); ``patient_id`` (if present) groups the
        bootstrap and the map/probe split; ``source`` and ``view`` (if present
        with more than one level) give the subgroup table; ``image_id`` and
        ``path`` (if present) name the images whose neighbours changed most.
    old, new : str
        Names for the report: the specs as the user wrote them.
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
        The gate's minimum overlap; ``passed`` and ``gate`` (the rule and
        numbers that decided) are set when it is given.
    decision : {"lower", "upper"}
        Which end of the overlap's 95% interval must reach ``min_overlap``.
        ``"lower"`` (default): the data must show the overlap is at least the
        minimum. ``"upper"``: the lenient rule, failing only when the data
        show it is below, so a wide interval passes.
    n_resamples : int
        Bootstrap resamples (over patients when ``patient_id`` is present).
    n_permutations : int
        Relabellings of the new model's neighbour lists for the permutation
        null (``null``: mean, 95% range, p-value with the +1 correction, so
        at least ``1 / (n_permutations + 1)``); 0 skips it.
    models : mapping of role -> dict, optional
        Provenance of each model, e.g. from :func:`model_provenance` (the
        resolved spec and weight hash); recorded as given.
    random_state : int
        Seed of the bootstrap, the permutations and the patient-level splits.
    scheduler : None, "local[:N]", a Dask scheduler address or a distributed.Client
        Where the neighbour searches run (see :mod:`crslib.cluster`). Above
        :data:`crslib.agreement.APPROX_THRESHOLD` images they use an
        approximate index; ``search`` then holds each model's measured recall
        and ``overlap_error_bound`` the most the overlap can be off by.
    device : str, optional
        Where the exact neighbour searches run in this process
        (:func:`crslib.ann.knn_search`); the neighbours are the same on every device.
    target_recall : float or None
        Recall@k an approximate search is tuned to reach (lower end of its
        95% interval) before it runs (:func:`crslib.ann.knn_search`); only
        above the approximate threshold.

    Returns
    -------
    CompareResult
        With ``largest_changes``: the :data:`N_CHANGES` images of lowest
        overlap, their ids, paths and both neighbour lists.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> X = np.random.default_rng(0).normal(size=(200, 16))
    >>> result = compare_embeddings(X, 2 * X, pd.DataFrame(index=range(200)), min_overlap=0.9, n_resamples=50)
    >>> result.overlap, result.gate, result.null["p_value"]
    (1.0, 'lower 95% bound 1.000 >= minimum 0.900: pass', 0.005)
    """
    decision, n_permutations = _check_options(decision, n_permutations)
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
                neighbours[role], search[role] = knn_search(X, k=k, client=client, random_state=random_state,
                                                            device=device, target_recall=target_recall)
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
        decision=decision, models={role: dict(info) for role, info in (models or {}).items()},
    )
    result.null = _relabelled_null(neighbours["old"], neighbours["new"], float(per_image.mean()),
                                   n_permutations=n_permutations, random_state=random_state)
    result.largest_changes, result.strips = _largest_changes(per_image, neighbours["old"], neighbours["new"],
                                                             metadata)
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
    _map_and_transfer(result, X_old, X_new, labels, groups, n_resamples=n_resamples, random_state=random_state)
    if min_overlap is not None:
        _apply_gate(result, min_overlap)
    return result

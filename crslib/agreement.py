"""Agreement between encoders: the mutual k-nearest-neighbour overlap and its reference points.

The headline measure of CRS-Bench: for each image, the share of its k
nearest neighbours (cosine) that two models have in common,
``|kNN_a(i) & kNN_b(i)| / k``, averaged over images. This module computes it
for a pair (:func:`mutual_knn_overlap`) or a whole zoo
(:func:`agreement_matrix`), with reference points (chance ``k / (N - 1)``,
or its group-aware form when a patient's own images are excluded; a
permutation null), bootstrap intervals over images or patients, a k sweep,
the association of agreement with accuracy (Mantel test), and convergence by
objective and seed.

The neighbours come from :mod:`crslib.neighbors` (exact search) and
:mod:`crslib.ann` (approximate search for large N, with measured recall and
an error bound); complementary indices (linear CKA, CKNNA, Jaccard) are in
:mod:`crslib.similarity`, subgroup breakdowns in :mod:`crslib.subgroups` and
the linear probe in :mod:`crslib.probes`.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from crslib import stats
from crslib._io import JsonResult, json_ready
from crslib._validation import check_confidence, check_count, check_k, check_same_rows, per_image_array
from crslib.ann import APPROX_THRESHOLD, _check_search_options, _search
from crslib.cluster import open_client, worker_count
from crslib.errors import InputError
from crslib.neighbors import _check_index_array, _group_codes, _intersections, knn_indices
from crslib.recall import RecallResult, overlap_error_bound

log = logging.getLogger(__name__)

__all__ = [
    "AgreementMatrix",
    "KSweep",
    "NullResult",
    "overlap_from_indices",
    "mutual_knn_overlap_per_image",
    "mutual_knn_overlap",
    "agreement_matrix",
    "chance_overlap",
    "permutation_null",
    "overlap_ci",
    "k_sweep",
    "accuracy_agreement_association",
    "convergence_pairs",
    "convergence_table",
]


# =========================================================================== overlap




def overlap_from_indices(I_a: Any, I_b: Any) -> np.ndarray:
    """Per-image mutual kNN overlap from precomputed neighbour index arrays.

    Parameters
    ----------
    I_a, I_b : array-like of shape (N, k), integer
        Neighbour indices of the same N images under two models (rows
        without repeated entries), e.g. from :func:`knn_indices`.

    Returns
    -------
    ndarray of shape (N,)
        ``|I_a[i] & I_b[i]| / k``.

    Examples
    --------
    >>> overlap_from_indices([[1, 2], [0, 2]], [[2, 3], [3, 1]])
    array([0.5, 0. ])
    """
    A = _check_index_array(I_a, "I_a")
    B = _check_index_array(I_b, "I_b")
    if A.shape != B.shape:
        raise InputError(f"I_a and I_b must have the same shape (N, k), got {A.shape} and {B.shape}")
    return _intersections(A, B) / A.shape[1]




def mutual_knn_overlap_per_image(
    X_a: Any,
    X_b: Any,
    *,
    k: int = 10,
    exclude_groups: Any = None,
    metric: str = "cosine",
) -> np.ndarray:
    """Per-image share of the k nearest neighbours two models have in common.

    Parameters
    ----------
    X_a, X_b : array-like of shape (N, d_a) and (N, d_b)
        Embeddings of the same N images (same row order) by two models;
        dimensions may differ.
    k : int
        Neighbours per image (CRS-Bench: 10).
    exclude_groups : array-like of shape (N,), optional
        E.g. patient ids: a patient's other images are not counted as
        neighbours (see :func:`knn_indices`).
    metric : {"cosine", "ip", "euclidean"}

    Returns
    -------
    ndarray of shape (N,)
        ``|kNN_a(i) & kNN_b(i)| / k``, values in {0, 1/k, ..., 1}.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 8))
    >>> float(mutual_knn_overlap_per_image(X, 3 * X, k=5).mean())
    1.0
    """
    check_same_rows({"X_a": X_a, "X_b": X_b})
    I_a = knn_indices(X_a, k=k, exclude_groups=exclude_groups, metric=metric)
    I_b = knn_indices(X_b, k=k, exclude_groups=exclude_groups, metric=metric)
    return _intersections(I_a, I_b) / k


def mutual_knn_overlap(
    X_a: Any,
    X_b: Any,
    *,
    k: int = 10,
    exclude_groups: Any = None,
    metric: str = "cosine",
) -> float:
    """Mutual kNN overlap: mean over images of the shared-neighbour share.

    See :func:`mutual_knn_overlap_per_image` for the parameters. Chance
    level is ``k / (N - 1)``, or with ``exclude_groups`` the group-aware
    level of :func:`chance_overlap`.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 8))
    >>> mutual_knn_overlap(X, X, k=5)
    1.0
    """
    return float(np.mean(mutual_knn_overlap_per_image(X_a, X_b, k=k, exclude_groups=exclude_groups, metric=metric)))


@dataclass(frozen=True, eq=False)
class AgreementMatrix(JsonResult):
    """Mutual kNN overlap of every pair of models, with how it was searched.

    Returned by :func:`agreement_matrix`. The functions that take an
    agreement matrix (:func:`accuracy_agreement_association`,
    :func:`convergence_pairs`, :func:`convergence_table`) accept this object
    or its :attr:`overlap` frame alike.

    Attributes
    ----------
    overlap : DataFrame of shape (M, M)
        Symmetric, rows and columns labelled by model name (index name
        ``"model"``), diagonal 1.0.
    k : int
        Neighbours per image.
    n_images : int
        Number of images N.
    search : dict of str -> dict
        Per model, the ``info`` dict of :func:`crslib.ann.knn_search`: index
        used (``"exact"`` or approximate), recall and its interval, seconds.
    overlap_error_bound : dict of str -> float
        Per pair ``"model_a|model_b"`` (in the order of :attr:`overlap`), the
        largest possible difference between the reported and the exact mean
        overlap (:func:`crslib.recall.overlap_error_bound` of the two models'
        recalls, from the lower ends of their 95% intervals; an exact search
        has recall 1). Empty when every model was searched exactly.

    Examples
    --------
    >>> import numpy as np
    >>> Z = np.random.default_rng(0).normal(size=(60, 4))
    >>> res = agreement_matrix({"a": Z, "b": 2 * Z}, k=5)
    >>> res.models, res.k, res.n_images, res.max_error_bound
    (['a', 'b'], 5, 60, 0.0)
    >>> res.to_dict()["overlap"]
    [[1.0, 1.0], [1.0, 1.0]]
    """

    overlap: pd.DataFrame
    k: int
    n_images: int
    search: dict[str, dict] = field(default_factory=dict, repr=False)
    overlap_error_bound: dict[str, float] = field(default_factory=dict)

    @property
    def models(self) -> list[str]:
        """Model names, in the order of the rows of :attr:`overlap`."""
        return [str(m) for m in self.overlap.index]

    @property
    def max_error_bound(self) -> float:
        """Largest :attr:`overlap_error_bound` over the pairs; 0.0 when every search was exact."""
        return float(max(self.overlap_error_bound.values(), default=0.0))

    def to_frame(self) -> pd.DataFrame:
        """A copy of :attr:`overlap` (changing it leaves this result as it is)."""
        return self.overlap.copy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: models, k, n_images, overlap (nested lists, row by row), search, overlap_error_bound."""
        return json_ready({
            "models": self.models,
            "k": self.k,
            "n_images": self.n_images,
            "overlap": self.overlap.to_numpy(dtype=float).tolist(),
            "search": self.search,
            "overlap_error_bound": self.overlap_error_bound,
        })


def agreement_matrix(
    embeddings: Mapping[str, Any],
    *,
    k: int = 10,
    exclude_groups: Any = None,
    metric: str = "cosine",
    return_per_image: bool = False,
    index: str = "auto",
    threshold: int = APPROX_THRESHOLD,
    recall_sample: int = 20_000,
    scheduler: Any = None,
    nprobe: int | None = None,
    target_recall: float | None = 0.95,
) -> AgreementMatrix | tuple[AgreementMatrix, pd.DataFrame]:
    """Mutual kNN overlap between every pair of models.

    Each model is searched once (M searches for M models); pair overlaps
    are then computed from the neighbour index arrays, which costs almost
    nothing next to the searches. Up to ``threshold`` images the searches
    are exact; beyond it (or on request) they are approximate, their recall
    is measured, and the agreement carries a bound on the error that the
    approximation can cause.

    Parameters
    ----------
    embeddings : mapping of model name -> array of shape (N, d_model)
        Embeddings of the same N images, same row order, for each model.
    k : int
    exclude_groups : array-like of shape (N,), optional
        Patient (or other) labels whose members are not counted as
        neighbours of each other.
    metric : {"cosine", "ip", "euclidean"}
    return_per_image : bool
        Also return the per-image overlaps of every pair.
    index : {"auto", "exact", "ivf", "ivfpq", "hnsw", "hnswsq"}
        Neighbour search per model (:func:`knn_search`): ``"auto"`` is
        exact up to ``threshold`` images and above it an HNSW graph over
        8-bit codes whose candidates are re-ranked exactly (``"hnswsq"``).
    threshold : int
        See :data:`APPROX_THRESHOLD`.
    recall_sample : int
        Queries on which each approximate search is checked against the
        exact neighbours (:func:`knn_recall`).
    scheduler : None, "local[:N]", an address, or a distributed.Client
        Where the searches run (:func:`crslib.cluster.open_client`, opened
        once for all models): None in this process; otherwise as Dask
        tasks, several models at a time (up to one per worker). The result
        does not depend on it.
    nprobe : int, optional
        Cells scanned per query by an IVF or IVF-PQ search: an explicit
        override of the depth ``target_recall`` chooses. A fixed depth does
        not keep its recall as N grows: at N=1,000,000 the former default
        (64 of 4,000 cells) measured ``recall@10`` 0.725 on the synthetic data
        of ``bench/bench_scale.py``, an overlap error bound of 0.563.
    target_recall : float or None
        Recall@k (lower end of its 95% interval) each approximate search is
        tuned to reach before it runs (:func:`knn_search`, default 0.95, so
        the bound of a pair is at most about 0.1). On that data at
        N=1,000,000, two models with the default index (``"hnswsq"``) met it
        at once: ``recall@10`` 0.979 (95% interval from 0.977), an overlap
        error bound of 0.046, in 51 minutes on 2 cores with the embeddings
        memory-mapped and +3.2 GB of other memory. Out of reach within the
        probe budget, the search falls back to exact on a ``scheduler``, or
        reports the recall it reached. None: the fixed default depth.

    Returns
    -------
    agreement : AgreementMatrix
        ``overlap``: the (M, M) matrix, symmetric, labelled by model name,
        diagonal 1.0; ``k``; ``n_images``; ``search`` (per model, the
        ``info`` dict of :func:`knn_search`: index used, recall and its
        interval, seconds); ``overlap_error_bound``: per pair
        ``"model_a|model_b"``, the largest possible difference between the
        reported and the exact mean overlap (:func:`overlap_error_bound` of
        the two models' recalls, from the lower ends of their 95% intervals;
        an exact search has recall 1), empty when every search was exact.
    per_image : DataFrame of shape (N, M(M-1)/2)
        Only with ``return_per_image=True``; columns are a MultiIndex
        (model_a, model_b).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> Z = rng.normal(size=(100, 8))
    >>> A = agreement_matrix({"a": Z, "b": 2 * Z, "c": rng.normal(size=(100, 8))}, k=5)
    >>> float(A.overlap.loc["a", "b"]), A.search["a"]["index"], A.overlap_error_bound
    (1.0, 'exact', {})
    """
    if not isinstance(embeddings, Mapping) or len(embeddings) < 2:
        raise InputError("embeddings must be a mapping {model name: array} with at least 2 models")
    names = [str(n) for n in embeddings]
    if len(set(names)) != len(names):
        raise InputError(f"model names must be unique as strings, got {names}")
    check_same_rows(embeddings)
    _check_search_options(index, threshold, recall_sample, nprobe,  # before a cluster is started
                          target_recall=target_recall)

    def search(name: str, X: Any, client: Any) -> tuple[np.ndarray, dict, RecallResult | None]:
        try:
            return _search(
                X, k=k, metric=metric, exclude_groups=exclude_groups, index=index, threshold=threshold,
                recall_sample=recall_sample, random_state=0, client=client, query_block=None, nprobe=nprobe,
                target_recall=target_recall,
            )
        except InputError as exc:
            raise InputError(f"model {name!r}: {exc}") from exc

    with open_client(scheduler) as client:
        workers = worker_count(client)
        if client is None or workers < 2:
            found = [search(name, X, client) for name, X in zip(names, embeddings.values())]
        else:
            # Models in parallel, one per worker at most: an approximate
            # search is a single task, so one model at a time would leave
            # the other workers idle. (Each model's X is sent to every worker,
            # so more at once would only multiply worker memory.)
            with ThreadPoolExecutor(max_workers=min(len(names), workers)) as pool:
                futures = [pool.submit(search, name, X, client) for name, X in zip(names, embeddings.values())]
                found = [f.result() for f in futures]
    index_of = {name: f[0] for name, f in zip(names, found)}
    infos = {name: f[1] for name, f in zip(names, found)}
    recalls = {name: f[2] for name, f in zip(names, found)}
    m = len(names)
    mat = np.eye(m)
    per_image = {}
    for i in range(m):
        for j in range(i + 1, m):
            ov = _intersections(index_of[names[i]], index_of[names[j]]) / k
            mat[i, j] = mat[j, i] = float(ov.mean())
            if return_per_image:
                per_image[(names[i], names[j])] = ov
    bounds: dict[str, float] = {}
    if any(r is not None for r in recalls.values()):
        bounds = {
            f"{names[i]}|{names[j]}": overlap_error_bound(
                1.0 if recalls[names[i]] is None else recalls[names[i]],
                1.0 if recalls[names[j]] is None else recalls[names[j]],
            )
            for i in range(m)
            for j in range(i + 1, m)
        }
    agreement = AgreementMatrix(
        overlap=pd.DataFrame(mat, index=pd.Index(names, name="model"), columns=pd.Index(names, name="model")),
        k=int(k), n_images=len(next(iter(index_of.values()))), search=infos, overlap_error_bound=bounds,
    )
    if return_per_image:
        cols = pd.MultiIndex.from_tuples(list(per_image), names=["model_a", "model_b"])
        return agreement, pd.DataFrame(np.column_stack(list(per_image.values())), columns=cols)
    return agreement


# =========================================================================== reference points


def _chance(k: int, n: int, codes: np.ndarray | None) -> float:
    """Mean over images of k / (candidates outside the image's own group); ``k / (n - 1)`` without groups."""
    if codes is None:
        return k / (n - 1)
    return float(np.mean(k / (n - np.bincount(codes)[codes])))


def chance_overlap(n: int, k: int, *, exclude_groups: Any = None) -> float:
    """Expected mutual kNN overlap of two unrelated models: ``k / (n - 1)``.

    If model b's neighbour set of an image is a uniformly random k-subset of
    the other n - 1 images, each of model a's k neighbours is in it with
    probability k / (n - 1). With a group exclusion the pool shrinks to the
    images outside the query's group, and chance is the mean over images of
    ``k / (n - own group size)``: the reference for overlaps computed with
    the same ``exclude_groups``.

    Parameters
    ----------
    n : int
        Number of images.
    k : int
        Neighbours per image.
    exclude_groups : array-like of shape (n,), optional
        Group label per image (e.g. patient id), as given to the overlap.

    Returns
    -------
    float

    Examples
    --------
    >>> round(chance_overlap(1001, 10), 4)
    0.01
    >>> round(chance_overlap(100, 10, exclude_groups=np.repeat(np.arange(50), 2)), 4)  # 10 / 98
    0.102
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise InputError(f"n must be an integer >= 2 (number of images), got {n!r}")
    k = check_k(k, int(n))
    return _chance(k, int(n), _group_codes(exclude_groups, int(n), k))


@dataclass(frozen=True)
class NullResult:
    """Overlap expected without any relation between two models.

    Attributes
    ----------
    mean : float
        Mean overlap over permutations.
    low, high : float
        Percentile interval of the permutation overlaps.
    values : ndarray of shape (n_permutations,)
        Overlap (mean over images) of each permutation.
    chance : float
        The analytic reference :func:`chance_overlap` (group-aware when the
        null was computed with ``exclude_groups``).
    """

    mean: float
    low: float
    high: float
    values: np.ndarray = field(repr=False)
    chance: float = float("nan")
    confidence: float = 0.95


def permutation_null(
    X_a: Any,
    X_b: Any,
    *,
    k: int = 10,
    n_permutations: int = 20,
    exclude_groups: Any = None,
    metric: str = "cosine",
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> NullResult:
    """Overlap after shuffling the rows of one model relative to the other.

    Shuffling breaks the image correspondence while keeping each model's
    neighbourhood structure (hubs, clusters), a more faithful null than the
    uniform chance ``k / (N - 1)`` when a space has hubs. Each model is
    searched once; the neighbours of the shuffled model follow from the
    permutation (``I_b'[i] = inv[I_b[perm[i]]]``) without a new search.

    With ``exclude_groups`` both models' neighbour lists of image i leave out
    the images of i's group, and the groups stay attached to row positions:
    the permuted model's neighbours of row i (model b's image ``perm[i]``)
    are the closest rows j with ``groups[j] != groups[i]``, as if
    ``X_b[perm]`` were searched with the same ``exclude_groups`` (up to ties
    in similarity). The shuffle breaks the patient correspondence too, so
    model b's own same-patient images of ``perm[i]`` are ordinary
    candidates. The null's mean is then the group-aware chance of
    :func:`chance_overlap`. Model b is searched ``k + largest group - 1``
    deep, enough to keep k neighbours after any exclusion.

    Parameters
    ----------
    X_a, X_b : array-like of shape (N, d)
    k : int
    n_permutations : int
    exclude_groups : array-like of shape (N,), optional
        E.g. patient ids, as in :func:`mutual_knn_overlap_per_image`; give
        the ones the observed overlap was computed with.
    metric : {"cosine", "ip", "euclidean"}
    confidence : float
        Coverage of the percentile interval of the permutation overlaps.
    random_state : int

    Returns
    -------
    NullResult

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(200, 8))
    >>> res = permutation_null(X, X, k=5, n_permutations=10)
    >>> res.mean < 0.1
    True
    """
    n_permutations = check_count(n_permutations, "n_permutations")
    confidence = check_confidence(confidence)
    n = check_same_rows({"X_a": X_a, "X_b": X_b})
    k = check_k(k, n)
    codes = _group_codes(exclude_groups, n, k)
    I_a = knn_indices(X_a, k=k, metric=metric, exclude_groups=exclude_groups)
    depth = k if codes is None else min(n - 1, k + int(np.bincount(codes).max()) - 1)
    I_b = knn_indices(X_b, k=depth, metric=metric)
    rng = np.random.default_rng(random_state)
    values = np.empty(n_permutations)
    for p in range(n_permutations):
        perm = rng.permutation(n)
        inv = np.empty_like(perm)
        inv[perm] = np.arange(n)
        cand = inv[I_b[perm]]  # the permuted model's neighbours, as row positions, closest first
        if codes is not None:
            keep = codes[cand] != codes[:, None]
            keep &= np.cumsum(keep, axis=1) <= k
            cand = cand[keep].reshape(n, k)
        values[p] = _intersections(I_a, cand).mean() / k
    alpha = (1 - confidence) / 2
    return NullResult(
        mean=float(values.mean()),
        low=float(np.percentile(values, 100 * alpha)),
        high=float(np.percentile(values, 100 * (1 - alpha))),
        values=values,
        chance=_chance(k, n, codes),
        confidence=confidence,
    )


def overlap_ci(
    per_image: Any,
    *,
    groups: Any = None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int | None = 0,
) -> stats.BootstrapResult:
    """Bootstrap interval of the mean overlap, over images or over patients.

    Parameters
    ----------
    per_image : array-like of shape (N,)
        Per-image overlaps (:func:`mutual_knn_overlap_per_image`).
    groups : array-like of shape (N,), optional
        Patient ids: resample whole patients (their images are correlated),
        which gives the honest, usually wider, interval.
    n_resamples, confidence, random_state
        See :func:`crslib.stats.bootstrap_ci`.

    Returns
    -------
    crslib.stats.BootstrapResult

    Examples
    --------
    >>> import numpy as np
    >>> res = overlap_ci(np.full(100, 0.3), n_resamples=50)
    >>> round(res.estimate, 3), round(res.low, 3), round(res.high, 3)
    (0.3, 0.3, 0.3)
    """
    x = per_image_array(per_image)
    return stats.bootstrap_ci(
        np.mean, x, n_resamples=n_resamples, groups=groups, confidence=confidence, random_state=random_state
    )




@dataclass(frozen=True, eq=False)
class KSweep(JsonResult):
    """Mutual kNN overlap and chance level for several k (:func:`k_sweep`).

    Attributes
    ----------
    table : DataFrame
        One row per kept k, columns ``k``, ``overlap``, ``chance``,
        ``overlap_over_chance``.
    dropped_k : list of int
        Values of k left out because they are not below the number of
        candidate neighbours (empty when every k was kept).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(30, 4))
    >>> res = k_sweep(X, X, ks=(1, 5, 50))
    >>> res.to_dict()["dropped_k"], res.to_frame()["overlap"].tolist()
    ([50], [1.0, 1.0])
    """

    table: pd.DataFrame
    dropped_k: list[int] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        """A copy of :attr:`table` (changing it leaves this result as it is)."""
        return self.table.copy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``table`` (a list of row records) and ``dropped_k``."""
        return json_ready({"table": self.table, "dropped_k": self.dropped_k})


def k_sweep(
    X_a: Any,
    X_b: Any,
    *,
    ks: Sequence[int] = (1, 5, 10, 20, 50, 100),
    exclude_groups: Any = None,
    metric: str = "cosine",
) -> KSweep:
    """Mutual kNN overlap and chance level for several k.

    Each model is searched once with the largest k; smaller k use the first
    neighbours (the ranking is exact, so prefixes are the smaller-k sets).
    Values of k that are not below N (or not below the candidates left by
    the group exclusion) are dropped and listed in ``dropped_k`` of the
    result.

    Parameters
    ----------
    X_a, X_b : array-like of shape (N, d_a) and (N, d_b)
        Embeddings of the same N images by two models.
    ks : sequence of int
        Values of k (duplicates and order do not matter).
    exclude_groups : array-like of shape (N,), optional
        E.g. patient ids, as in :func:`mutual_knn_overlap_per_image`.
    metric : {"cosine", "ip", "euclidean"}

    Returns
    -------
    KSweep
        ``table`` with columns k, overlap, chance, overlap_over_chance (one
        row per kept k, ascending); ``dropped_k``. Chance is ``k / (N - 1)``,
        or with ``exclude_groups`` the mean over images of
        ``k / (N - own group size)``.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(30, 4))
    >>> res = k_sweep(X, X, ks=(1, 5, 50))
    >>> res.table["k"].tolist(), res.dropped_k
    ([1, 5], [50])
    """
    n = check_same_rows({"X_a": X_a, "X_b": X_b})
    ks_list = []
    for kv in ks:
        if isinstance(kv, bool) or not isinstance(kv, (int, np.integer)) or kv < 1:
            raise InputError(f"ks must hold integers >= 1, got {kv!r}")
        ks_list.append(int(kv))
    ks_list = sorted(set(ks_list))
    codes = _group_codes(exclude_groups, n, 0)
    limit = n - 1 if codes is None else n - int(np.bincount(codes).max())
    keep = [kv for kv in ks_list if kv <= limit]
    dropped = [kv for kv in ks_list if kv > limit]
    if dropped:
        log.info("k_sweep: dropped k=%s (need k <= %d candidates for N=%d)", dropped, limit, n)
    if not keep:
        raise InputError(f"no k in {list(ks)} is below the number of candidate neighbours ({limit}); use smaller k")
    kmax = keep[-1]
    I_a = knn_indices(X_a, k=kmax, exclude_groups=exclude_groups, metric=metric)
    I_b = knn_indices(X_b, k=kmax, exclude_groups=exclude_groups, metric=metric)
    rows = []
    for kv in keep:
        ov = _intersections(I_a[:, :kv], I_b[:, :kv]).mean() / kv
        chance = _chance(kv, n, codes)
        rows.append({"k": kv, "overlap": float(ov), "chance": chance, "overlap_over_chance": float(ov) / chance})
    return KSweep(table=pd.DataFrame(rows), dropped_k=dropped)


def _check_agreement_frame(agreement: Any) -> pd.DataFrame:
    """The (M, M) overlap frame of an :class:`AgreementMatrix`, or a square DataFrame as given."""
    if isinstance(agreement, AgreementMatrix):
        agreement = agreement.overlap
    if not isinstance(agreement, pd.DataFrame):
        raise InputError(
            "agreement must be an AgreementMatrix (see agreement_matrix) or a square DataFrame labelled by model name"
        )
    if agreement.shape[0] != agreement.shape[1] or list(agreement.index) != list(agreement.columns):
        raise InputError("agreement must be square with the same model names, in the same order, on rows and columns")
    return agreement


def accuracy_agreement_association(
    agreement: AgreementMatrix | pd.DataFrame,
    accuracy: pd.Series,
    *,
    n_permutations: int = 999,
    method: str = "spearman",
    random_state: int | None = 0,
) -> dict:
    """Do models that agree more also perform more alike?

    Correlates the agreement matrix with the matrix of absolute accuracy
    differences ``|acc_i - acc_j|`` over model pairs. The p-value comes from
    a Mantel test (:func:`crslib.stats.mantel_test`), because pairs sharing a
    model are not independent; the plain Spearman correlation over pairs is
    reported beside it as a descriptive number. A negative correlation means
    that pairs with similar accuracy agree more.

    Parameters
    ----------
    agreement : AgreementMatrix or DataFrame (M x M)
        From :func:`agreement_matrix`, or its ``overlap`` frame (any square
        frame labelled by model name, same names on rows and columns); both
        give the same answer.
    accuracy : Series indexed by model name (e.g. mean AUROC)
    n_permutations : int
    method : {"spearman", "pearson"}
    random_state : int

    Returns
    -------
    dict with keys mantel_r, mantel_p, n_permutations, exact, spearman_r,
    n_models, n_pairs, method

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> acc = pd.Series({"a": 0.70, "b": 0.72, "c": 0.80, "d": 0.90})
    >>> d = np.abs(acc.values[:, None] - acc.values[None, :])
    >>> agr = pd.DataFrame(1 - d, index=acc.index, columns=acc.index)
    >>> round(accuracy_agreement_association(agr, acc)["spearman_r"], 3)
    -1.0
    """
    agreement = _check_agreement_frame(agreement)
    if not isinstance(accuracy, pd.Series):
        raise InputError("accuracy must be a pandas Series indexed by model name")
    names = list(agreement.index)
    missing = [m for m in names if m not in accuracy.index]
    if missing:
        raise InputError(f"accuracy has no value for model(s) {missing}; index it by the agreement matrix's names")
    acc = pd.to_numeric(accuracy.loc[names], errors="coerce").to_numpy(dtype=float)
    if not np.isfinite(acc).all():
        bad = [names[i] for i in np.flatnonzero(~np.isfinite(acc))]
        raise InputError(f"accuracy is NaN for model(s) {bad}; drop them from both inputs")
    A = agreement.to_numpy(dtype=float)
    D = np.abs(acc[:, None] - acc[None, :])
    res = stats.mantel_test(A, D, n_permutations=n_permutations, method=method, random_state=random_state)
    m = len(names)
    return {
        "mantel_r": res.r,
        "mantel_p": res.p_value,
        "n_permutations": res.n_permutations,
        "exact": res.exact,
        "spearman_r": stats.pairwise_spearman(A, D),
        "n_models": m,
        "n_pairs": m * (m - 1) // 2,
        "method": method,
    }


# =========================================================================== convergence


def _check_model_info(agreement: pd.DataFrame, model_info: Any) -> pd.DataFrame:
    if not isinstance(model_info, pd.DataFrame):
        raise InputError("model_info must be a DataFrame with columns name, objective, seed, architecture")
    need = ["name", "objective", "seed", "architecture"]
    missing = [c for c in need if c not in model_info.columns]
    if missing:
        raise InputError(f"model_info lacks column(s) {missing}; it needs {need}")
    if model_info["name"].duplicated().any():
        dup = model_info["name"][model_info["name"].duplicated()].tolist()
        raise InputError(f"model_info lists model(s) {dup} more than once")
    info = model_info.set_index("name")
    names = list(agreement.index)
    absent = [m for m in names if m not in info.index]
    if absent:
        raise InputError(f"model_info has no row for model(s) {absent}")
    return info.loc[names]


def convergence_pairs(agreement: AgreementMatrix | pd.DataFrame, model_info: pd.DataFrame) -> pd.DataFrame:
    """Every pair of models of the same architecture, with what they share and their overlap.

    Parameters
    ----------
    agreement : AgreementMatrix or DataFrame (M x M)
        From :func:`agreement_matrix`, or its ``overlap`` frame (or a subset
        of it, e.g. ``result.overlap.loc[names, names]``).
    model_info : DataFrame with columns name, objective, seed, architecture
        One row per model of ``agreement`` (e.g. the zoo's model cards,
        :func:`crslib.models.list_zoo`).

    Returns
    -------
    DataFrame
        One row per pair (in the order of ``agreement``) with columns
        ``model_a, model_b, architecture, objective_a, objective_b, seed_a,
        seed_b, overlap``. Pairs of different architectures are left out.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> info = pd.DataFrame({"name": list("abc"), "objective": ["sup", "sup", "ssl"], "seed": [0, 1, 0],
    ...                      "architecture": ["small", "small", "wide"]})
    >>> A = pd.DataFrame(np.full((3, 3), 0.2), index=info.name, columns=info.name)
    >>> convergence_pairs(A, info)[["model_a", "model_b", "overlap"]].values.tolist()
    [['a', 'b', 0.2]]
    """
    agreement = _check_agreement_frame(agreement)
    info = _check_model_info(agreement, model_info)
    names = list(agreement.index)
    A = agreement.to_numpy(dtype=float)
    rows = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            a, b = info.iloc[i], info.iloc[j]
            if a["architecture"] != b["architecture"]:
                continue
            rows.append({"model_a": names[i], "model_b": names[j], "architecture": a["architecture"],
                         "objective_a": a["objective"], "objective_b": b["objective"],
                         "seed_a": a["seed"], "seed_b": b["seed"], "overlap": A[i, j]})
    columns = ["model_a", "model_b", "architecture", "objective_a", "objective_b", "seed_a", "seed_b", "overlap"]
    return pd.DataFrame(rows, columns=columns)


def convergence_table(agreement: AgreementMatrix | pd.DataFrame, model_info: pd.DataFrame) -> pd.DataFrame:
    """Agreement within an objective across seeds vs across objectives.

    For each architecture and objective: the overlap of pairs with the same
    objective and architecture but different seeds ("within"), and of pairs
    of that objective with models of another objective of the same
    architecture ("across"). A row with objective ``(all)`` per
    architecture pools all within-objective and all across-objective pairs.
    Pairs of different architectures are not used (see
    :func:`convergence_pairs`).

    Parameters
    ----------
    agreement : AgreementMatrix or DataFrame (M x M)
        From :func:`agreement_matrix`, or its ``overlap`` frame (or a subset
        of it, e.g. ``result.overlap.loc[names, names]``).
    model_info : DataFrame with columns name, objective, seed, architecture
        One row per model of ``agreement``.

    Returns
    -------
    DataFrame with columns architecture, objective, n_models, within_mean,
    within_min, within_max, n_within, across_mean, n_across,
    within_minus_across

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> info = pd.DataFrame({"name": list("abcd"), "objective": ["sup", "sup", "ssl", "ssl"],
    ...                      "seed": [0, 1, 0, 1], "architecture": "small"})
    >>> A = pd.DataFrame(np.full((4, 4), 0.1), index=info.name, columns=info.name)
    >>> A.loc["c", "d"] = A.loc["d", "c"] = 0.5
    >>> convergence_table(A, info).set_index("objective").within_mean.to_dict()
    {'ssl': 0.5, 'sup': 0.1, '(all)': 0.3}
    """
    agreement = _check_agreement_frame(agreement)
    pairs = convergence_pairs(agreement, model_info)
    info = _check_model_info(agreement, model_info)
    pairs = list(zip(pairs["architecture"], pairs["objective_a"], pairs["objective_b"],
                     pairs["seed_a"] != pairs["seed_b"], pairs["overlap"]))
    rows = []
    for size in pd.unique(info["architecture"]):
        sp = [p for p in pairs if p[0] == size]
        objectives = sorted(pd.unique(info.loc[info["architecture"] == size, "objective"]), key=str)
        for obj in objectives + ["(all)"]:
            if obj == "(all)":
                within = [p[4] for p in sp if p[1] == p[2] and p[3]]
                across = [p[4] for p in sp if p[1] != p[2]]
                n_models = int((info["architecture"] == size).sum())
            else:
                within = [p[4] for p in sp if p[1] == obj and p[2] == obj and p[3]]
                across = [p[4] for p in sp if (p[1] == obj) != (p[2] == obj)]
                n_models = int(((info["architecture"] == size) & (info["objective"] == obj)).sum())
            wm = float(np.mean(within)) if within else np.nan
            am = float(np.mean(across)) if across else np.nan
            rows.append(
                {
                    "architecture": size,
                    "objective": obj,
                    "n_models": n_models,
                    "within_mean": wm,
                    "within_min": float(np.min(within)) if within else np.nan,
                    "within_max": float(np.max(within)) if within else np.nan,
                    "n_within": len(within),
                    "across_mean": am,
                    "n_across": len(across),
                    "within_minus_across": wm - am,
                }
            )
    return pd.DataFrame(rows)

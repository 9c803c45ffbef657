"""Two-dimensional maps of embeddings for figures (PCA and t-SNE)."""

from __future__ import annotations

import numpy as np

from crslib.errors import InputError

METHODS = ("pca", "tsne")


def project_2d(
    X: np.ndarray,
    *,
    method: str = "pca",
    perplexity: float = 30.0,
    random_state: int = 0,
) -> np.ndarray:
    """Project embeddings to two dimensions.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
        Embeddings, one row per image.
    method : {"pca", "tsne"}
        PCA (linear, deterministic) or t-SNE (scikit-learn, PCA-initialised,
        after a PCA to at most 50 dimensions, the usual practice for speed).
    perplexity : float
        t-SNE perplexity; lowered to ``(n_samples - 1) / 3`` for small inputs,
        as t-SNE requires ``perplexity < n_samples``.
    random_state : int
        Seed of t-SNE's optimisation.

    Returns
    -------
    ndarray of shape (n_samples, 2)

    Examples
    --------
    >>> import numpy as np
    >>> project_2d(np.random.default_rng(0).normal(size=(20, 5))).shape
    (20, 2)
    """
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 3:
        raise InputError(f"project_2d needs a 2-D array with at least 3 rows, got shape {X.shape}")
    if not np.isfinite(X).all():
        bad = np.flatnonzero(~np.isfinite(X).all(axis=1))
        raise InputError(f"embeddings contain NaN or infinite values in rows {bad[:5].tolist()}")
    if method not in METHODS:
        raise InputError(f"method must be one of {METHODS}, got {method!r}")
    n_components = min(50, X.shape[0], X.shape[1])
    if method == "pca":
        return PCA(n_components=2, random_state=random_state).fit_transform(X)[:, :2]
    reduced = PCA(n_components=n_components, random_state=random_state).fit_transform(X)
    perplexity = float(min(perplexity, (X.shape[0] - 1) / 3))
    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=random_state)
    return tsne.fit_transform(reduced)

"""Figure functions: ``fn(data, *, ax=None) -> Axes`` (or a Figure for grids).

They draw what they are given and compute nothing a notebook would need to
report; the numbers come from the analysis modules.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure


def image_grid(
    images: Sequence[np.ndarray],
    *,
    titles: Sequence[str] | None = None,
    ncols: int = 6,
    size: float = 1.6,
) -> Figure:
    """Show images (H, W, C) in [0, 1] in a grid, grayscale when C is 1.

    Examples
    --------
    >>> import numpy as np
    >>> fig = image_grid([np.zeros((8, 8, 1))] * 3, titles=["a", "b", "c"])
    """
    n = len(images)
    ncols = max(1, min(ncols, n))
    nrows = max(1, int(np.ceil(n / ncols)))
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows * 1.1), squeeze=False)
    for index, ax in enumerate(axes.flat):
        ax.axis("off")
        if index >= n:
            continue
        image = np.asarray(images[index])
        if image.ndim == 3 and image.shape[2] == 1:
            image = image[:, :, 0]
        ax.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1)
        if titles is not None:
            ax.set_title(titles[index], fontsize=7)
    fig.tight_layout()
    return fig


def embedding_map(
    coords: np.ndarray,
    hue: Sequence | pd.Series,
    *,
    ax: Axes | None = None,
    title: str = "",
    hue_name: str = "",
    point_size: float = 10.0,
) -> Axes:
    """Scatter a 2-D embedding map coloured by a categorical variable."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 4))
    frame = pd.DataFrame({"x": coords[:, 0], "y": coords[:, 1], hue_name or "group": np.asarray(hue)})
    sns.scatterplot(data=frame, x="x", y="y", hue=hue_name or "group", s=point_size,
                    linewidth=0, alpha=0.8, ax=ax, palette="tab10")
    ax.set(xlabel="", ylabel="", xticks=[], yticks=[], title=title)
    ax.legend(title=hue_name, fontsize=7, title_fontsize=8, markerscale=1.5, loc="best", frameon=False)
    return ax

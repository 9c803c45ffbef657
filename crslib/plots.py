"""Figure functions: ``fn(data, *, ax=None) -> Axes`` (or a Figure for grids).

They draw what they are given and compute nothing a notebook would need to
report; the numbers come from the analysis modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

#: pandas display options of the book's tables: every row and column shown, numbers to 3 decimals.
READER_DISPLAY = {"display.max_columns": None, "display.max_rows": 1000, "display.max_colwidth": None,
                  "display.precision": 3, "display.width": None}


#: What a book table shows in a cell that has no value (pandas would print "NaN" or "None"); the HTML
#: reports of crslib.reports write the same.
MISSING_CELL = "n/a"


def set_reader_display() -> dict[str, Any]:
    """Show tables as a reader needs them: never truncated (no ``...``, no "rows x columns" footer),
    rounded to 3 decimals, and, inside a notebook, with :data:`MISSING_CELL` in cells without a value
    (a single-model group has no same-group mean, a change needs two values). Returns the options set.

    Examples
    --------
    >>> options = set_reader_display()
    >>> pd.get_option("display.precision"), pd.get_option("display.max_columns") is None
    (3, True)
    """
    for name, value in READER_DISPLAY.items():
        pd.set_option(name, value)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the notebook stack
        return dict(READER_DISPLAY)
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, reader_html)
    return dict(READER_DISPLAY)


def reader_html(frame: pd.DataFrame) -> str:
    """The notebook HTML of ``frame`` as pandas writes it, with :data:`MISSING_CELL` for missing values.

    Cell text is escaped, as in pandas' own rendering, so a file name such as ``<script>`` shows as text.

    Examples
    --------
    >>> html = reader_html(pd.DataFrame({"mean": [0.5, float("nan")], "name": ["<b>", None]}))
    >>> "NaN" in html, "None" in html, html.count(MISSING_CELL), "&lt;b&gt;" in html
    (False, False, 2, True)
    """
    return frame.to_html(notebook=True, na_rep=MISSING_CELL, escape=True, bold_rows=True,
                         max_rows=pd.get_option("display.max_rows"),
                         max_cols=pd.get_option("display.max_columns"),
                         show_dimensions=pd.get_option("display.show_dimensions"),
                         float_format=pd.get_option("display.float_format"))


#: Human column names for the result tables' machine names (the CSV files keep the machine names).
COLUMN_LABELS: dict[str, str] = {
    "across_mean": "other objective, mean", "n_across": "other-objective pairs", "n_within": "same-objective pairs",
    "within_mean": "same objective, mean", "within_min": "same objective, min", "within_max": "same objective, max",
    "within_minus_across": "same minus other", "n_models": "models", "final_loss": "final training loss",
    "n_levels": "levels", "share_alone": "share alone", "share_alone_low": "alone, low",
    "share_alone_high": "alone, high", "share_unique": "unique share", "share_unique_low": "unique, low",
    "share_unique_high": "unique, high",
    "n_map": "map images (n)", "map_r2": "map held-out R²", "new_model": "new model",
    "mean_original_auroc": "mean AUROC, own classifier", "mean_transferred_auroc": "mean AUROC, transferred",
    "mean_retention": "mean retention", "retention_low": "retention, low", "retention_high": "retention, high",
    "auroc": "AUROC", "auprc": "AUPRC", "f1": "F1", "balanced_accuracy": "balanced accuracy",
    "macro_auroc": "macro AUROC (one-vs-rest)",
    "max_abs_change": "largest change", "mean_abs_change": "mean change",
    "mean_range": "mean range", "n_pairs": "pairs", "n_test": "test images", "n_pool": "pool images",
    "n_images": "images", "paper_value": "paper", "p_value": "permutation p", "auc": "AUC",
    "mean_jpeg_quality": "mean JPEG quality", "mean_kB": "mean size (kB)", "mean_width": "mean width (px)",
    "share_progressive": "progressive JPEG share", "share_rgb": "RGB share",
    # the selection losses and the metric panel of study 3 (crslib.risk_metrics)
    "log_loss": "log loss", "mse": "mean squared error", "mae": "mean absolute error", "r2": "R²",
    "accuracy": "accuracy", "macro_f1": "macro F1", "ece": "ECE", "brier": "Brier score",
    "correlation": "correlation", "calibration_slope": "calibration slope",
}


def reader_table(frame: pd.DataFrame, *, digits: int = 3,
                 labels: dict[str, str] | None = None) -> pd.DataFrame:
    """A result table as the book shows it: machine column names replaced by human ones, numbers rounded.

    Parameters
    ----------
    frame : DataFrame
        A result table; it is not modified.
    digits : int, default 3
        Decimals kept in float columns.
    labels : dict, optional
        Extra or overriding ``{machine name: human name}`` pairs on top of :data:`COLUMN_LABELS`.

    Returns
    -------
    DataFrame
        A copy with its columns (and index names) renamed where a label is known; names that are data
        (model specs, finding names) pass unchanged.

    Examples
    --------
    >>> table = pd.DataFrame({"n_map": [64, 128], "map_r2": [0.87912, 0.9], "model": ["a_b", "c"]})
    >>> reader_table(table).columns.tolist()
    ['map images (n)', 'map held-out R²', 'model']
    >>> reader_table(table)["map held-out R²"].tolist()
    [0.879, 0.9]
    """
    names = {**COLUMN_LABELS, **(labels or {})}
    shown = frame.rename(columns=lambda c: names.get(c, c) if isinstance(c, str) else c)
    shown.index = shown.index.set_names([names.get(n, n) if isinstance(n, str) else n for n in shown.index.names])
    return shown.round(digits)


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
    Three images in one row (``ncols`` is capped at the number of images):

    >>> import numpy as np
    >>> fig = image_grid([np.zeros((8, 8, 1))] * 3, titles=["a", "b", "c"])
    >>> len(fig.axes), [ax.get_title() for ax in fig.axes]
    (3, ['a', 'b', 'c'])
    >>> fig.axes[0].images[0].get_array().shape, fig.axes[0].images[0].get_cmap().name
    ((8, 8), 'gray')
    """
    ncols, nrows = _grid_shape(len(images), ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows * 1.1), squeeze=False)
    _draw_images(axes, images, titles)
    fig.tight_layout()
    return fig


def _grid_shape(n: int, ncols: int) -> tuple[int, int]:
    ncols = max(1, min(ncols, n))
    return ncols, max(1, int(np.ceil(n / ncols)))


def _draw_images(axes: np.ndarray, images: Sequence[np.ndarray], titles: Sequence[str] | None) -> None:
    for index, ax in enumerate(axes.flat):
        ax.axis("off")
        if index >= len(images):
            continue
        image = np.asarray(images[index])
        if image.ndim == 3 and image.shape[2] == 1:
            image = image[:, :, 0]
        ax.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1)
        if titles is not None:
            ax.set_title(titles[index], fontsize=7)


def neighbour_strips(table: Any, images: Any, names: tuple[str, str]) -> Figure:
    """Each query image beside its nearest neighbours under two encoders, the shared ones outlined.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`crslib.neighbors.shared_neighbours`' table.
    images : mapping or sequence
        ``images[row]`` is the image of that row (float in [0, 1]).
    names : (str, str)
        The two encoders, as the rows' labels say them.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"query": [0, 0], "rank": [1, 2], "neighbour_a": [1, 2], "neighbour_b": [2, 3],
    ...                   "shared_a": [False, True], "shared_b": [True, False], "overlap": [0.5, 0.5]})
    >>> fig = neighbour_strips(t, {i: np.full((4, 4), i / 4) for i in range(4)}, ("a", "b"))
    >>> len(fig.axes)  # one query, two strips of 1 + 2 images
    6
    """
    queries = list(dict.fromkeys(table["query"]))
    k = int(table["rank"].max())
    short = [str(n).split("?")[0].split(":")[-1].split("/")[-1] for n in names]  # public:open_nsfw -> open_nsfw
    figure, axes = plt.subplots(2 * len(queries), k + 1, figsize=(0.9 * (k + 1), 2.2 * len(queries) + 0.5),
                                squeeze=False, layout="constrained")
    figure.get_layout_engine().set(h_pad=0.12)  # room for each strip's label above it
    for q, query in enumerate(queries):
        rows = table[table["query"] == query].sort_values("rank")
        for side, (column, shared) in enumerate((("neighbour_a", "shared_a"), ("neighbour_b", "shared_b"))):
            line = axes[2 * q + side]
            _draw_images(line, [images[query], *(images[r] for r in rows[column])], None)
            label = (f"{short[side]}: the query (overlap {rows['overlap'].iloc[0]:.1f}) and its {k} nearest"
                     if side == 0 else f"{short[side]}: the same query and its {k} nearest")
            # above the strip, left-aligned, outside the layout so that it does not squeeze the first column
            line[0].annotate(label, xy=(0, 1.03), xycoords="axes fraction", ha="left", va="bottom", fontsize=9,
                             annotation_clip=False).set_in_layout(False)
            for ax, is_shared in zip(line[1:], rows[shared]):
                ax.axis("on")
                ax.set(xticks=[], yticks=[])
                for spine in ax.spines.values():
                    spine.set(color="#d62728" if is_shared else "#cccccc", linewidth=3 if is_shared else 0.5)
    figure.suptitle("Nearest neighbours under two encoders (outlined red: returned by both)", fontsize=10)
    return figure


def image_panels(
    panels: Sequence[tuple[str, Sequence[np.ndarray], Sequence[str] | None, int]],
    *,
    size: float = 1.6,
) -> Figure:
    """Several titled image grids stacked in one figure (one image on a book page).

    Parameters
    ----------
    panels : sequence of (title, images, titles, ncols)
        One grid per panel, drawn as :func:`image_grid` draws it.
    size : float
        Width of one image in inches.

    Examples
    --------
    >>> import numpy as np
    >>> fig = image_panels([("A", [np.zeros((4, 4))] * 3, ["a", "b", "c"], 2),
    ...                     ("B", [np.ones((4, 4, 3))], None, 4)])
    >>> [sub._suptitle.get_text() for sub in fig.subfigs], len(fig.axes)
    (['A', 'B'], 5)
    """
    shapes = [_grid_shape(len(images), ncols) for _, images, _, ncols in panels]
    width = max(ncols for ncols, _ in shapes)
    heights = [size * 1.1 * nrows + 0.35 for _, nrows in shapes]
    figure = plt.figure(figsize=(size * width, sum(heights)), layout="constrained")
    subfigures = figure.subfigures(len(panels), 1, height_ratios=heights, squeeze=False)[:, 0]
    for subfigure, (title, images, titles, _), (ncols, nrows) in zip(subfigures, panels, shapes):
        _draw_images(subfigure.subplots(nrows, ncols, squeeze=False), images, titles)
        subfigure.suptitle(title)
    return figure


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


def overlap_histogram(
    per_image: np.ndarray,
    *,
    k: int,
    chance: float,
    reference: float | None = None,
    ax: Axes | None = None,
) -> Axes:
    """Histogram of per-image overlaps (multiples of 1/k) with mean, chance and reference lines."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    bins = np.arange(k + 2) / k - 0.5 / k
    ax.hist(per_image, bins=bins, color="#4c72b0", alpha=0.85)
    ax.axvline(float(np.mean(per_image)), color="black", label=f"mean {np.mean(per_image):.3f}")
    ax.axvline(chance, color="grey", linestyle=":", label=f"chance {chance:.3f}")
    if reference is not None:
        ax.axvline(reference, color="#c44e52", linestyle="--", label=f"random init {reference:.3f}")
    ax.set(xlabel=f"share of {k} nearest neighbours in common", ylabel="images", xlim=(-0.05, 1.05))
    ax.legend(frameon=False, fontsize=8)
    return ax


def subgroup_overlap(table: pd.DataFrame, *, chance: float | None = None, ax: Axes | None = None) -> Axes:
    """Mean overlap with its CI per subgroup level (``column, level, mean, low, high``)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.35 * len(table) + 1.2))
    labels = [f"{c}: {v}" for c, v in zip(table["column"], table["level"])]
    y = np.arange(len(table))
    ax.errorbar(table["mean"], y, xerr=[table["mean"] - table["low"], table["high"] - table["mean"]],
                fmt="o", color="#4c72b0", capsize=3)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    if chance is not None:
        ax.axvline(chance, color="grey", linestyle=":", label="chance")
        ax.legend(frameon=False, fontsize=8)
    ax.set(xlabel="mean mutual kNN overlap (95% CI)")
    return ax


def retention_bars(table: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """AUROC retention (transferred / original) per finding with its CI."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.35 * len(table) + 1.2))
    table = table.dropna(subset=["retention"])
    y = np.arange(len(table))
    ax.errorbar(table["retention"], y,
                xerr=[table["retention"] - table["retention_low"], table["retention_high"] - table["retention"]],
                fmt="o", color="#55a868", capsize=3)
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_yticks(y, [str(f).removeprefix("finding_") for f in table["finding"]])
    ax.invert_yaxis()
    ax.set(xlabel="AUROC retention, transferred / original (95% CI)")
    return ax


def agreement_heatmap(matrix: pd.DataFrame, *, ax: Axes | None = None, vmax: float | None = None) -> Axes:
    """Heatmap of a model x model agreement matrix (diagonal masked)."""
    if ax is None:
        size = 0.45 * len(matrix) + 2
        _, ax = plt.subplots(figsize=(size + 1, size))
    mask = np.eye(len(matrix), dtype=bool)
    sns.heatmap(matrix, mask=mask, annot=len(matrix) <= 14, fmt=".2f", cmap="viridis", vmin=0,
                vmax=vmax, square=True, cbar_kws={"label": "mutual kNN overlap"}, ax=ax,
                annot_kws={"fontsize": 6})
    ax.set(xlabel="", ylabel="")
    return ax


def reliability_diagram(curves: pd.DataFrame, *, ax: Axes | None = None, label_col: str | None = None) -> Axes:
    """Reliability diagram from :func:`crslib.metrics.reliability_curve`.

    Draws the observed fraction positive against the mean predicted
    probability per bin, with the bootstrap band (``frac_pos_low`` to
    ``frac_pos_high``) shaded and the diagonal of perfect calibration.
    Several curves (e.g. "before" and "after" recalibration) can be stacked
    in one frame and told apart by ``label_col``.

    Examples
    --------
    >>> import pandas as pd
    >>> curve = pd.DataFrame({"mean_prob": [0.2, 0.7], "frac_pos": [0.1, 0.8],
    ...                       "frac_pos_low": [0.0, 0.6], "frac_pos_high": [0.3, 0.9]})
    >>> ax = reliability_diagram(curve)
    >>> ax.get_xlabel(), [float(v) for v in ax.get_xlim()]
    ('mean predicted probability', [0.0, 1.0])
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="perfect calibration")
    if label_col is None:
        parts = [(None, curves)]
    else:
        parts = [(str(name), frame) for name, frame in curves.groupby(label_col, sort=False)]
    palette = sns.color_palette("tab10", max(1, len(parts)))
    for (name, frame), color in zip(parts, palette):
        frame = frame.sort_values("mean_prob")
        ax.fill_between(frame["mean_prob"], frame["frac_pos_low"], frame["frac_pos_high"],
                        color=color, alpha=0.2, linewidth=0)
        ax.plot(frame["mean_prob"], frame["frac_pos"], marker="o", markersize=3, color=color,
                label=name if name is not None else "observed")
    ax.set(xlabel="mean predicted probability", ylabel="observed fraction positive",
           xlim=(0.0, 1.0), ylim=(0.0, 1.0))
    ax.set_aspect("equal")
    ax.legend(frameon=False, fontsize=8)
    return ax


def interval_dots(
    values: Any,
    low: Any,
    high: Any,
    *,
    positions: Any = None,
    labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    color: str = "#4c72b0",
    label: str | None = None,
    capsize: float = 2,
) -> Axes:
    """Point estimates with their intervals, one horizontal row each.

    Parameters
    ----------
    values, low, high : array-like of shape (n,)
        Estimates and interval bounds (``low <= value <= high``).
    positions : array-like of shape (n,), optional
        Vertical positions (default ``0 .. n-1``); offset them to draw two
        series side by side.
    labels : sequence of str, optional
        Tick labels at ``0 .. n-1``.
    ax, color, label, capsize
        Target axes, marker colour, legend label, error bar cap size.

    Examples
    --------
    >>> ax = interval_dots([0.6, 0.8], [0.5, 0.7], [0.7, 0.9], labels=["a", "b"])
    >>> [t.get_text() for t in ax.get_yticklabels()]
    ['a', 'b']
    """
    values, low, high = (np.asarray(v, dtype=float) for v in (values, low, high))
    ax = ax or plt.subplots(figsize=(6, 0.45 * len(values) + 1.2))[1]
    y = np.arange(len(values)) if positions is None else np.asarray(positions)
    ax.errorbar(values, y, xerr=[values - low, high - values], fmt="o", color=color, label=label, capsize=capsize)
    if labels is not None:
        ax.set_yticks(range(len(labels)), labels)
    return ax

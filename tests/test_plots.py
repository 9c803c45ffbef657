"""crslib.plots: each function draws exactly what it is given, on the axes it is given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from crslib import plots  # noqa: E402


@pytest.fixture()
def ax():
    fig, axes = plt.subplots()
    yield axes
    plt.close(fig)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_image_grid_wraps_rows_and_hides_empty_cells() -> None:
    rgb = np.zeros((6, 5, 3))
    rgb[..., 0] = 1.0
    fig = plots.image_grid([np.full((4, 4, 1), 0.5), rgb, np.zeros((4, 4, 1))], titles=["x", "y", "z"], ncols=2)
    assert len(fig.axes) == 4  # 2 x 2 grid for 3 images
    assert [len(a.images) for a in fig.axes] == [1, 1, 1, 0]
    assert [a.get_title() for a in fig.axes[:3]] == ["x", "y", "z"]
    assert not any(a.axison for a in fig.axes)
    gray, colour = fig.axes[0].images[0], fig.axes[1].images[0]
    assert gray.get_array().shape == (4, 4) and gray.get_cmap().name == "gray"
    assert gray.get_clim() == (0, 1) and float(gray.get_array()[0, 0]) == 0.5
    np.testing.assert_array_equal(colour.get_array(), rgb)


def test_embedding_map_scatters_the_coordinates_by_group(ax) -> None:
    coords = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])
    out = plots.embedding_map(coords, ["b", "a", "b", "a"], ax=ax, title="map", hue_name="site")
    assert out is ax
    assert len(ax.collections) == 1
    np.testing.assert_array_equal(np.asarray(ax.collections[0].get_offsets()), coords)
    colours = ax.collections[0].get_facecolors()
    assert np.array_equal(colours[0], colours[2]) and not np.array_equal(colours[0], colours[1])
    assert sorted(_legend_texts(ax)) == ["a", "b"] and ax.get_legend().get_title().get_text() == "site"
    assert ax.get_title() == "map" and list(ax.get_xticks()) == [] and list(ax.get_yticks()) == []


def test_overlap_histogram_counts_per_multiple_of_one_over_k(ax) -> None:
    per_image = np.array([0.0, 0.25, 0.25, 1.0, 1.0, 1.0])
    out = plots.overlap_histogram(per_image, k=4, chance=0.1, reference=0.3, ax=ax)
    assert out is ax
    assert [p.get_height() for p in ax.patches] == [1, 2, 0, 0, 3]  # one bar per overlap 0, 1/4, ..., 1
    assert [float(line.get_xdata()[0]) for line in ax.lines] == pytest.approx([per_image.mean(), 0.1, 0.3])
    assert _legend_texts(ax) == ["mean 0.583", "chance 0.100", "random init 0.300"]
    assert ax.get_xlabel() == "share of 4 nearest neighbours in common" and ax.get_ylabel() == "images"
    _, plain = plt.subplots()
    plots.overlap_histogram(per_image, k=4, chance=0.1, ax=plain)
    assert len(plain.lines) == 2  # no reference line without a reference


def test_subgroup_overlap_draws_each_level_with_its_ci(ax) -> None:
    table = pd.DataFrame({"column": ["source", "source", "view"], "level": ["s0", "s1", "PA"],
                          "mean": [0.5, 0.6, 0.7], "low": [0.4, 0.5, 0.65], "high": [0.55, 0.7, 0.8]})
    out = plots.subgroup_overlap(table, chance=0.05, ax=ax)
    assert out is ax
    points = ax.lines[0]
    assert list(points.get_xdata()) == [0.5, 0.6, 0.7] and list(points.get_ydata()) == [0, 1, 2]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["source: s0", "source: s1", "view: PA"]
    assert ax.yaxis_inverted()
    bars = ax.collections[0].get_segments()  # the horizontal CI bars, low to high
    np.testing.assert_allclose([seg[:, 0] for seg in bars], [[0.4, 0.55], [0.5, 0.7], [0.65, 0.8]])
    assert float(ax.lines[-1].get_xdata()[0]) == 0.05 and _legend_texts(ax) == ["chance"]
    assert ax.get_xlabel() == "mean mutual kNN overlap (95% CI)"


def test_retention_bars_drop_missing_findings_and_strip_the_prefix(ax) -> None:
    table = pd.DataFrame({"finding": ["finding_opacity", "finding_effusion", "finding_nodule"],
                          "retention": [0.9, np.nan, 1.1], "retention_low": [0.8, np.nan, 1.0],
                          "retention_high": [1.0, np.nan, 1.2]})
    out = plots.retention_bars(table, ax=ax)
    assert out is ax
    assert list(ax.lines[0].get_xdata()) == [0.9, 1.1] and list(ax.lines[0].get_ydata()) == [0, 1]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["opacity", "nodule"]
    np.testing.assert_allclose([seg[:, 0] for seg in ax.collections[0].get_segments()], [[0.8, 1.0], [1.0, 1.2]])
    assert float(ax.lines[-1].get_xdata()[0]) == 1.0  # the no-change line
    assert ax.get_xlabel() == "AUROC retention, transferred / original (95% CI)"


def test_agreement_heatmap_masks_the_diagonal_and_annotates_the_rest(ax) -> None:
    names = ["m1", "m2", "m3"]
    matrix = pd.DataFrame([[1.0, 0.2, 0.3], [0.2, 1.0, 0.4], [0.3, 0.4, 1.0]], index=names, columns=names)
    out = plots.agreement_heatmap(matrix, ax=ax, vmax=0.5)
    assert out is ax
    mesh = ax.collections[0]
    values = mesh.get_array()
    assert np.ma.getmaskarray(values).reshape(3, 3).tolist() == np.eye(3, dtype=bool).tolist()
    assert sorted(t.get_text() for t in ax.texts) == ["0.20", "0.20", "0.30", "0.30", "0.40", "0.40"]
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    assert [t.get_text() for t in ax.get_yticklabels()] == names
    assert mesh.get_clim() == (0, 0.5)
    assert ax.figure.axes[-1].get_ylabel() == "mutual kNN overlap"  # the colour bar


def test_interval_dots_draws_each_interval_where_it_is():
    ax = plots.interval_dots([0.6, 0.8], [0.5, 0.75], [0.7, 0.9], positions=[0.15, 1.15], labels=["a", "b"])
    caps = ax.containers[0]
    segments = caps.lines[2][0].get_segments()  # one horizontal segment per interval
    assert [tuple(np.round(seg[:, 0], 6)) for seg in segments] == [(0.5, 0.7), (0.75, 0.9)]
    assert [seg[0, 1] for seg in segments] == [0.15, 1.15]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]


def test_image_panels_stack_one_grid_per_panel():
    dark, light = np.zeros((4, 4, 1)), np.ones((4, 4, 3))
    fig = plots.image_panels([("first", [dark] * 5, list("abcde"), 2), ("second", [light], ["x"], 4)])
    assert [sub._suptitle.get_text() for sub in fig.subfigs] == ["first", "second"]
    first = fig.subfigs[0].axes
    assert len(first) == 6  # 3 rows x 2 columns, the sixth left empty
    assert [ax.get_title() for ax in first[:5]] == list("abcde") and not first[5].images
    assert first[0].images[0].get_array().shape == (4, 4)  # one channel drawn as grayscale
    assert len(fig.subfigs[1].axes) == 1 and fig.subfigs[1].axes[0].images[0].get_array().shape == (4, 4, 3)


def test_reader_table_renames_machine_columns_and_index_and_keeps_data_names() -> None:
    frame = pd.DataFrame({"factor": ["site", "view"], "share_alone": [0.12345, 0.5],
                          "n_levels": [4, 2], "zoo:supervised_multilabel-cnn_small-seed0": [0.1, 0.2]})
    shown = plots.reader_table(frame.set_index("factor").rename_axis("new_model"))
    assert shown.columns.tolist() == ["share alone", "levels", "zoo:supervised_multilabel-cnn_small-seed0"]
    assert shown.index.name == "new model"
    assert shown["share alone"].tolist() == [0.123, 0.5]
    assert frame.columns[1] == "share_alone", "the caller's table must not change"


def test_reader_table_extra_labels_override_and_digits_apply() -> None:
    frame = pd.DataFrame({"p_value": [0.01234], "ece_uniform_before": [0.20554]})
    shown = plots.reader_table(frame, digits=2, labels={"ece_uniform_before": "ECE before", "p_value": "p"})
    assert shown.to_dict("list") == {"p": [0.01], "ECE before": [0.21]}


def test_reader_table_labels_every_machine_column_of_the_multiindex_rows() -> None:
    frame = pd.DataFrame({"auroc": [0.91], "balanced_accuracy": [0.8]},
                         index=pd.MultiIndex.from_tuples([("a", "frozen")], names=["backbone", "policy"]))
    shown = plots.reader_table(frame)
    assert shown.columns.tolist() == ["AUROC", "balanced accuracy"]
    assert list(shown.index.names) == ["backbone", "policy"]


def test_reader_display_shows_missing_cells_as_a_dash_in_a_notebook_shell() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    frame = pd.DataFrame({"same objective, mean": [0.572, np.nan], "model": ["<script>", None]})
    shell = InteractiveShell.instance()
    try:
        assert "NaN" in shell.display_formatter.format(frame)[0]["text/html"]  # pandas' own rendering
        plots.set_reader_display()
        html = shell.display_formatter.format(frame)[0]["text/html"]
    finally:
        InteractiveShell.clear_instance()
    assert "NaN" not in html and "None" not in html and html.count(plots.MISSING_CELL) == 2
    assert "<td>0.572</td>" in html and "&lt;script&gt;" in html and "<script>" not in html
    # a frame without missing values renders exactly as pandas renders it
    full = frame.fillna({"same objective, mean": 0.5, "model": "b"})
    assert plots.reader_html(full) == full._repr_html_()

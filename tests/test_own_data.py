"""The book on a researcher's own images and models: needs, skips, model lists, --data/--models.

The slow tests build the quick book on real images that are not the phantom
(scikit-image's bundled images cut into tiles, ``tests/realdata.py``) in
three layouts, with public and timm models only, and check that every
chapter ran, that each skipped analysis is named on its page and in
``run.json``, that no zoo model was trained or loaded, and that Chromium
loads every page.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from realdata import LAYOUTS

from crslib.errors import InputError
from crslib.models.lineup import ALL_ZOO, parse_model_list, resolve_models
from crslib.needs import unmet_need
from crslib.runner import MODEL_PARAMETERS, SkipLog, read_skips, with_overrides



# --------------------------------------------------------------------------- needs


def _manifest() -> pd.DataFrame:
    return pd.DataFrame({
        "path": [f"{i}.png" for i in range(8)],
        "patient_id": ["p1", "p1", "p2", "p3", "p4", "p4", "p5", "p6"],
        "label": ["a", "a", "b", "a", "b", "b", "a", None],
        "source": ["s"] * 8,
        "view": ["PA", "AP"] * 4,
        "split": ["train"] * 6 + ["test"] * 2,
        "empty": [np.nan] * 8,
    })


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"columns": ["finding_effusion"]}, "the manifest has no `finding_effusion` column; add one to run it"),
    ({"columns": ["empty"]}, "`empty` has no values (every row is empty); fill it to run it"),
    ({"varying": ["source"]}, "`source` has a single value ('s'); it needs at least 2 different values"),
    ({"binary": "view"}, None),
    ({"binary": "label", "min_per_class": 4}, "`label` needs at least 4 images of each of its two classes; it has a: 4, b: 3"),
    ({"binary": "label", "min_per_class": 3, "groups": "patient_id"},
     "`label` needs at least 3 patients of each of its two classes; it has a: 3, b: 2"),
    ({"binary": "source"}, "`source` needs exactly two classes; it has 1 ('s')"),
    ({"binary": "patient_id"}, "`patient_id` needs exactly two classes; it has 6 ('p1', 'p2', 'p3', 'p4', 'p5', ...)"),
    ({"splits": ["train", "val"]}, "no row has split 'val' (the split column holds 'test', 'train'); add train/val/test "
                                   "values to run it"),
    ({"min_rows": 9}, "it needs at least 9 images; the manifest has 8"),
    ({"columns": ["path"], "varying": ["view"], "binary": "label", "min_per_class": 3, "splits": ["train", "test"],
      "min_rows": 8}, None),
])
def test_unmet_need_names_the_first_missing_thing(kwargs, reason):
    assert unmet_need(_manifest(), **kwargs) == reason


def test_unmet_need_checks_in_order_and_refuses_a_non_frame():
    m = _manifest().drop(columns=["split"])
    # a missing column is reported before a column that does not vary
    assert unmet_need(m, varying=["source"], splits=["train"]) == (
        "the manifest has no `split` column; add one to run it")
    with pytest.raises(InputError, match="manifest must be a DataFrame, got dict"):
        unmet_need({"path": []})


# --------------------------------------------------------------------------- skips


def test_skip_log_records_shows_and_restarts(tmp_path, capsys):
    results = tmp_path / "results" / "02_agreement"
    skips = SkipLog(results, show=False)
    assert skips.check("the linear probe", None) is True
    assert skips.check("the subgroup table", "`source` has a single value ('s')") is False
    assert read_skips(results) == [{"analysis": "the subgroup table", "reason": "`source` has a single value ('s')"}]
    # a rerun of the notebook starts a fresh record
    SkipLog(results, show=False)
    assert read_skips(results) == []
    assert read_skips(tmp_path / "never-ran") == []


def test_skip_log_shows_user_text_literally(tmp_path, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj.data))
    SkipLog(tmp_path).check("the subgroup table", "`<script>` has a single value ('*x_y*'); add `patient_id`")
    # markup characters are escaped outside code spans; inside them Markdown shows text as it is
    assert shown == ["**Skipped: the subgroup table.** `<script>` has a single value ('\\*x\\_y\\*'); "
                     "add `patient_id`."]


# --------------------------------------------------------------------------- model lists


def test_parse_model_list():
    assert parse_model_list("zoo:*, public:open_nsfw ,,public:open_nsfw") == ["zoo:*", "public:open_nsfw"]
    assert parse_model_list(["a:b", " c:d "]) == ["a:b", "c:d"]
    with pytest.raises(InputError, match="no model specs given"):
        parse_model_list(" , ")


def test_non_zoo_models_neither_train_nor_load_the_zoo(tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    lineup = resolve_models("public:efficientnet_lite0,timm:resnet18?size=64,onnx:/models/m.onnx#feat", zoo_data="/does/not/exist",
                            public_size=48)
    assert lineup.specs == {"public:efficientnet_lite0": "public:efficientnet_lite0?size=48",
                            "timm:resnet18?size=64": "timm:resnet18?size=64",
                            "onnx:/models/m.onnx#feat": "onnx:/models/m.onnx#feat"}
    assert lineup.info["architecture"].tolist() == ["efficientnet_lite0", "resnet18", "m.onnx"]
    assert lineup.cards.empty and not (tmp_path / "cache" / "zoo").exists()


def test_zoo_models_train_on_zoo_data_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    preset = {"objectives": ["random_init", "autoencoder"], "seeds": {"random_init": [0], "autoencoder": [0]},
              "wide": [], "epochs": 1, "image_size": 16}
    zoo_data = "phantom?patients=8&size=32&seed=0"
    one = resolve_models("zoo:autoencoder-cnn_small-seed0, timm:resnet18?size=32", zoo_data=zoo_data,
                         zoo_preset=preset)
    assert list(one.specs) == ["autoencoder-cnn_small-seed0", "timm:resnet18?size=32"]
    assert one.cards["name"].tolist() == ["autoencoder-cnn_small-seed0"]  # only the model asked for
    assert one.info.loc[0, ["backend", "objective", "architecture", "seed"]].tolist() == [
        "zoo", "autoencoder", "cnn_small", 0]
    every = resolve_models(ALL_ZOO, zoo_data=zoo_data, zoo_preset=preset)
    assert sorted(every.specs) == ["autoencoder-cnn_small-seed0", "random_init-cnn_small-seed0"]
    assert every.cards.set_index("name").loc["autoencoder-cnn_small-seed0", "reused"]  # trained once
    with pytest.raises(InputError, match=r"zoo model\(s\) \['contrastive-cnn_small-seed0'\] are not in zoo preset"):
        resolve_models("zoo:contrastive-cnn_small-seed0", zoo_data=zoo_data, zoo_preset=preset)


# --------------------------------------------------------------------------- crs book --data --models


def test_with_overrides_sets_every_chapter_and_keeps_the_zoo_data():
    config = {"name": "quick", "parameters": {"data": "phantom", "zoo_data": "phantom", "seed": 0},
              "notebooks": {"04_protocol_sensitivity": {"data": "phantom?kermany=1", "backbones": "zoo:*"},
                            "05_split_and_shortcut_audit": {"data": "phantom?kermany=1"}}}
    out = with_overrides(config, data="/my/images", models="a:x, b:y ,c:z")
    assert out["parameters"] == {"data": "/my/images", "zoo_data": "phantom", "seed": 0, "model": "a:x",
                                 "models": "a:x,b:y,c:z", "old_model": "a:x", "new_models": "b:y,c:z",
                                 "backbones": "a:x,b:y,c:z", "encoders": "a:x,b:y,c:z"}
    assert out["notebooks"] == {"04_protocol_sensitivity": {}, "05_split_and_shortcut_audit": {}}
    assert out["name"] == "quick+own" and config["parameters"]["data"] == "phantom"  # the preset is not changed
    assert set(MODEL_PARAMETERS) <= set(out["parameters"])
    only_data = with_overrides(config, data="/my/images")
    assert only_data["notebooks"]["04_protocol_sensitivity"] == {"backbones": "zoo:*"}
    assert with_overrides(config) == config


def test_every_model_parameter_is_declared_by_a_notebook(repo_root):
    from crslib.runner import list_notebooks, notebook_parameters

    declared = set()
    for notebook in list_notebooks(repo_root / "notebooks"):
        declared |= set(notebook_parameters(notebook))
    assert set(MODEL_PARAMETERS) <= declared, set(MODEL_PARAMETERS) - declared
    assert {"data", "zoo_data"} <= declared


# --------------------------------------------------------------------------- the book on real images




@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_chapter_runs_on_real_images_and_names_what_it_skipped(own_books, layout):
    root, record, cache = own_books[layout]
    run = json.loads((Path(record.run_dir) / "run.json").read_text())
    assert [n["name"][:2] for n in run["notebooks"]] == ["01", "02", "03", "04", "05", "06", "07"]
    for notebook in run["notebooks"]:
        if "data" in notebook["parameters"]:  # every chapter studies the data it was given
            assert notebook["parameters"]["data"] == str(root / "images"), notebook["name"]
        page = root / "_build" / "html" / "book" / "generated" / f"{notebook['name']}.html"
        # as a reader sees it: entities decoded, and the typographic apostrophe Markdown renders as "'"
        text = " ".join(html.unescape(page.read_text(encoding="utf-8")).replace("\u2019", "'").split())
        for skip in notebook["skips"]:
            assert f"Skipped: {skip['analysis']}." in text, (notebook["name"], skip)
        assert "Traceback" not in text, page
    skipped = {n["name"][:2]: [s["analysis"] for s in n["skips"]] for n in run["notebooks"]}
    if layout == "kermany":
        # a split, a two-class label and patients: the protocol and the audit run in full
        assert not skipped["04"] and not skipped["05"], skipped
    else:
        assert skipped["04"] and skipped["05"], skipped  # no train/val/test split
    # the zoo was neither trained nor loaded: only the public networks' converted weights are cached
    assert not list((cache / "zoo").glob("models/*")) and not list((cache / "zoo").glob("current/*"))


@pytest.mark.slow
def test_the_labelled_book_uses_the_labels_it_was_given(own_books):
    root, record, _ = own_books["labelled"]
    run = json.loads((Path(record.run_dir) / "run.json").read_text())
    skipped = {n["name"][:2]: " ".join(s["reason"] for s in n["skips"]) for n in run["notebooks"]}
    # the label column exists: no chapter may say it is missing
    assert all("no `label` column" not in reasons for reasons in skipped.values()), skipped
    risk = Path(record.run_dir) / "results" / "06_representation_risk"
    assert (risk / "risk_label.json").is_file(), sorted(p.name for p in risk.iterdir())

"""No chapter evaluates a shipped zoo model on the images it was trained on.

The shipped zoo trained on the training split of the default phantom (seed 0).
A phantom's patient ``i`` is drawn from ``SeedSequence(seed, (1, i, 0))``:
two phantoms of one seed share their first patients (and their images), two
seeds share none. So every phantom a chapter studies uses another seed than
the zoo's training data, checked here for every preset and notebook default,
and measured on the images themselves for the quick book.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

import crslib  # noqa: F401
from crslib.config import PRESET_NAMES, load_preset
from crslib.data import load_data
from crslib.embed import image_hashes
from crslib.runner import list_notebooks, notebook_parameters, resolve_parameters

DATA_PARAMETERS = ("data", "null_data")


def _seed(spec: str) -> int:
    return int(parse_qs(urlsplit(spec).query).get("seed", ["0"])[0])


def _studied(config: dict) -> list[tuple[str, str, str]]:
    """(notebook, parameter, phantom spec) of every phantom the chapters of a config study."""
    out = []
    for notebook in list_notebooks():
        params = notebook_parameters(notebook) | resolve_parameters(config, notebook)
        for key in DATA_PARAMETERS:
            value = params.get(key)
            if isinstance(value, str) and value.startswith("phantom"):
                out.append((notebook.stem, key, value))
    return out


def _hashes(manifest) -> set[str]:
    hashes, _ = image_hashes(manifest["path"].astype(str).tolist())
    return {h for h in hashes if h}


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_every_studied_phantom_has_other_patients_than_the_zoo_trained_on(preset):
    config = load_preset(preset)
    zoo_seed = _seed(config["parameters"]["zoo_data"])
    studied = _studied(config)
    assert studied
    for notebook, key, spec in studied:
        assert _seed(spec) != zoo_seed, (preset, notebook, key, spec)


def test_the_notebooks_defaults_study_other_patients_than_their_zoo():
    for notebook in list_notebooks():
        params = notebook_parameters(notebook)
        if "zoo_data" not in params:
            continue
        for key in DATA_PARAMETERS:
            if isinstance(params.get(key), str) and params[key].startswith("phantom"):
                assert _seed(params[key]) != _seed(params["zoo_data"]), (notebook.stem, key)


def test_the_rule_holds_on_the_images_same_seed_shares_different_seed_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path))
    zoo = load_data("phantom?patients=40&size=32&seed=0")
    pool = _hashes(zoo[zoo["split"] == "train"])
    assert pool & _hashes(load_data("phantom?patients=20&size=32&seed=0"))  # the rule's other side: it would leak
    assert not pool & _hashes(load_data("phantom?patients=20&size=32&seed=1"))


@pytest.mark.slow
def test_the_quick_books_data_holds_none_of_the_zoos_training_images():
    config = load_preset("quick")
    zoo = load_data(config["parameters"]["zoo_data"])
    pool = _hashes(zoo[zoo["split"] == "train"])
    assert len(pool) > 1000
    for notebook, key, spec in _studied(config):
        if "kermany" not in spec:  # a Kermany-layout phantom renders other images altogether
            assert not pool & _hashes(load_data(spec)), (notebook, key, spec)

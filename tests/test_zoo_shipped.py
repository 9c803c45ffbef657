"""The shipped zoo: weights and cards in the repository, loaded by hash without training, and refused when tampered."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import crslib  # noqa: F401  (before torch/timm)
from crslib.cli import main
from crslib.config import load_preset, preset_zoo_data
from crslib.errors import ModelError
from crslib.models import load_zoo_encoder, zoo_specs
from crslib.models import zoo_shipped
from crslib.models.lineup import resolve_models
from crslib.models.zoo import ZOO_WEIGHTS, list_zoo, zoo_cards
from crslib.models.zoo_shipped import SHIPPED_DIR, shipped_cards, verify_checkpoint

DEFAULT_ZOO_DATA = "phantom?patients=600&size=64&seed=0"
CARD_FIELDS = ("name", "spec", "objective", "hparams", "epochs", "training_data_hash", "zoo_data", "probe",
               "embedding_effective_rank", "checkpoint_sha256", "trained_commit", "trained_cpu", "weights",
               "torch_version", "image_size", "preprocessing")


@pytest.fixture(scope="module")
def cards() -> dict:
    return shipped_cards()


def test_the_shipped_zoo_is_the_default_presets_whole_zoo(cards):
    specs = zoo_specs("default")
    assert sorted(cards) == sorted(s.name for s in specs)
    for spec in specs:
        card = cards[spec.name]
        assert card["spec"] == spec.to_dict(), spec.name
        assert card["zoo_data"] == DEFAULT_ZOO_DATA == preset_zoo_data("default")
        assert card["image_size"] == 64


def test_every_card_has_its_fields_and_matches_its_weights(cards):
    for name, card in cards.items():
        missing = [f for f in CARD_FIELDS if f not in card and not (f == "probe" and card["objective"] == "random_init")]
        assert not missing, (name, missing)
        assert card["weights"] == "shipped"
        assert len(card["trained_commit"]) == 40 and card["trained_cpu"]
        weights = Path(card["path"]) / "encoder.safetensors"
        if card["objective"] == "random_init":  # built from its seed, not shipped
            assert card["built_from_seed"] and not weights.exists()
        else:
            assert not card["built_from_seed"]
            assert verify_checkpoint(weights, card) == card["checkpoint_sha256"]


def test_every_shipped_trained_model_learned_its_objective(cards):
    trained = {n: c for n, c in cards.items() if c["objective"] != "random_init"}
    assert len(trained) == 14
    for name, card in trained.items():
        probe = card["probe"]
        assert probe["low"] > 0 and probe["learned"], (name, probe["difference"], probe["low"])
        assert probe["low"] <= probe["difference"] <= probe["high"]


def test_the_shipped_zoo_stays_within_its_size_budget():
    size = sum(p.stat().st_size for p in SHIPPED_DIR.rglob("*") if p.is_file())
    assert 5e6 < size <= 30e6


def test_a_shipped_model_loads_without_training_and_a_random_init_one_from_its_seed(cards, tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path))
    trained = load_zoo_encoder("zoo:contrastive-cnn_small-seed0")
    assert trained.card["weights"] == "shipped"
    assert trained._weights_fingerprint() == "given:file:" + cards["contrastive-cnn_small-seed0"]["checkpoint_sha256"]
    random = load_zoo_encoder("random_init-cnn_wide-seed0")
    assert random._weights_fingerprint() == "given:file:" + cards["random_init-cnn_wide-seed0"]["checkpoint_sha256"]
    assert random.embedding_dim == 256
    assert not (tmp_path / "zoo").exists()  # nothing trained, nothing cached


def test_the_quick_and_default_books_use_the_shipped_zoo_without_training(tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path))
    for preset in ("quick", "default"):
        parameters = load_preset(preset)["parameters"]
        assert parameters["zoo_data"] == DEFAULT_ZOO_DATA and parameters["zoo_preset"] == "default"
        lineup = resolve_models("zoo:*", zoo_data=parameters["zoo_data"], zoo_preset=parameters["zoo_preset"])
        assert set(lineup.cards["weights"]) == {"shipped"}
        assert lineup.cards.loc[lineup.cards["objective"] != "random_init", "probe_learned"].astype(bool).all()
        assert all(spec == f"zoo:{name}" for name, spec in lineup.specs.items())
    assert not (tmp_path / "zoo").exists() and not (tmp_path / "phantom").exists()


def test_a_zoo_the_shipped_one_does_not_hold_is_trained_here(tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path))
    spec = zoo_specs("quick", overrides={"objectives": ["supervised_single"], "epochs": 1, "image_size": 16})[0]
    table = zoo_cards([spec], zoo_data="phantom?patients=12&size=32&seed=0", image_size=16)
    assert table.loc[0, "weights"] == "trained here" and not table.loc[0, "reused"]
    assert table.loc[0, "loadable"] == f"zoo:{spec.name}@{table.loc[0, 'key'][:16]}"
    encoder = load_zoo_encoder(table.loc[0, "loadable"])
    assert encoder.card["weights"] == "trained here" and encoder.preprocessing.input_size == (1, 16, 16)
    # the bare name still means the shipped model
    assert load_zoo_encoder(spec.name).card["weights"] == "shipped"
    assert ZOO_WEIGHTS == ("shipped", "retrain")
    listed = list_zoo(include_shipped=True)
    assert set(listed["weights"]) == {"shipped", "trained here"}
    assert not listed.loc[listed["weights"] == "trained here", "current"].any()  # the shipped one of that name is


def _tampered_zoo(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / "zoo_weights"
    shutil.copytree(SHIPPED_DIR / name, folder / name)
    path = folder / name / "encoder.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one byte changed
    path.write_bytes(bytes(data))
    return folder


def test_a_tampered_shipped_weight_file_is_refused_in_one_line(tmp_path, monkeypatch, capsys, cards):
    name = "supervised_multilabel-cnn_small-seed0"
    folder = _tampered_zoo(tmp_path, name)
    monkeypatch.setattr(zoo_shipped, "SHIPPED_DIR", folder)
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ModelError) as info:
        load_zoo_encoder(name)
    message = str(info.value)
    path = folder / name / "encoder.safetensors"
    assert str(path) in message and cards[name]["checkpoint_sha256"] in message
    assert "crs zoo --retrain" in message and "\n" not in message
    # the command line: that one line, exit 2
    from crslib.data.phantom import generate_phantom

    generate_phantom(tmp_path / "images", n_patients=4, image_size=32, random_state=0)
    code = main(["embed", "--data", str(tmp_path / "images"), "--model", f"zoo:{name}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "crs zoo --retrain" in err[0] and str(path) in err[0]


def test_the_card_json_on_disk_holds_no_machine_path(cards):
    for card_path in SHIPPED_DIR.glob("*/card.json"):
        card = json.loads(card_path.read_text())
        assert "path" not in card and "/work/" not in card_path.read_text()
        assert np.isfinite(card["embedding_effective_rank"])

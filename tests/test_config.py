"""crslib.config: cache_dir (CRS_CACHE_DIR first, then the XDG cache folder, then ~/.cache) and the data a
preset's zoo trains on."""

from __future__ import annotations

from pathlib import Path

import pytest

from crslib.config import cache_dir, preset_zoo_data
from crslib.errors import ConfigError


def test_cache_dir_honours_crs_cache_dir_and_creates_it(tmp_path, monkeypatch) -> None:
    target = tmp_path / "nested" / "cache"
    monkeypatch.setenv("CRS_CACHE_DIR", str(target))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == target
    assert target.is_dir() and not (tmp_path / "xdg").exists()


def test_cache_dir_defaults_to_the_xdg_then_the_home_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CRS_CACHE_DIR", "")  # empty counts as unset
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "crs"
    assert (tmp_path / "xdg" / "crs").is_dir()
    monkeypatch.delenv("CRS_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "crs" == Path.home() / ".cache" / "crs"
    assert (tmp_path / "home" / ".cache" / "crs").is_dir()


def test_a_presets_zoo_trains_on_its_zoo_data_else_on_its_data(tmp_path) -> None:
    apart = tmp_path / "apart.yaml"
    apart.write_text("parameters:\n  data: /images/chest_xray\n  zoo_data: phantom?patients=80\n")
    assert preset_zoo_data(apart) == "phantom?patients=80"
    shared = tmp_path / "shared.yaml"
    shared.write_text("parameters:\n  data: phantom?patients=90\n")
    assert preset_zoo_data(shared) == "phantom?patients=90"
    assert preset_zoo_data("full") == "phantom?patients=2000&size=128&seed=0"
    neither = tmp_path / "neither.yaml"
    neither.write_text("parameters:\n  seed: 0\n")
    with pytest.raises(ConfigError, match="sets neither parameters.zoo_data nor parameters.data"):
        preset_zoo_data(neither)

"""crslib.config.cache_dir: CRS_CACHE_DIR first, then the XDG cache folder, then ~/.cache."""

from __future__ import annotations

from pathlib import Path

from crslib.config import cache_dir


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

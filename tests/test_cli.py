"""The `crs` command: help, exit statuses, one-line user errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

SUBCOMMANDS = ["phantom", "embed", "zoo", "compare", "book"]


def crs(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crslib", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_help_lists_every_subcommand() -> None:
    result = crs("--help")
    assert result.returncode == 0
    for name in SUBCOMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help(name: str) -> None:
    result = crs(name, "--help")
    assert result.returncode == 0
    assert f"usage: crs {name}" in result.stdout


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_missing_config_file_is_one_line(tmp_path: Path) -> None:
    result = crs("book", "--config", str(tmp_path / "nope.yaml"))
    assert_one_line_error(result, "nope.yaml")


def test_missing_data_is_one_line(tmp_path: Path) -> None:
    result = crs("embed", "--data", str(tmp_path / "absent"), "--model", "timm:resnet18")
    assert_one_line_error(result, "absent")


def test_bad_model_spec_is_one_line(tmp_path: Path) -> None:
    crs("phantom", str(tmp_path / "p"), "--patients", "4", "--image-size", "32")
    result = crs("embed", "--data", str(tmp_path / "p"), "--model", "nonsense:thing")
    assert_one_line_error(result, "nonsense:thing")


def test_debug_shows_traceback(tmp_path: Path) -> None:
    result = crs("--debug", "book", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_phantom_then_embed_then_cache_hit(tmp_path: Path) -> None:
    out = tmp_path / "p"
    made = crs("phantom", str(out), "--patients", "12", "--image-size", "32", "--seed", "3")
    assert made.returncode == 0, made.stderr
    assert (out / "manifest.csv").is_file()
    spec = "timm:resnet18?size=32"
    first = crs("embed", "--data", str(out), "--model", spec, "--out", str(tmp_path / "X.npy"))
    assert first.returncode == 0, first.stderr
    assert "computed" in first.stdout
    second = crs("embed", "--data", str(out), "--model", spec)
    assert second.returncode == 0, second.stderr
    assert "cache hit" in second.stdout
    import numpy as np
    X = np.load(tmp_path / "X.npy")
    ids = np.load(tmp_path / "X_image_ids.npy")
    assert X.shape[0] == len(ids) > 0


def test_truncated_jpeg_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for index in range(3):
        Image.new("L", (40, 40), color=40 * index).save(folder / f"ok{index}.jpg", quality=90)
    good = (folder / "ok0.jpg").read_bytes()
    (folder / "broken.jpg").write_bytes(good[: len(good) // 2])
    result = crs("embed", "--data", str(folder), "--model", "timm:resnet18?size=32")
    assert_one_line_error(result, "broken.jpg")
    skipped = crs("embed", "--data", str(folder), "--model", "timm:resnet18?size=32", "--skip-unreadable")
    assert skipped.returncode == 0, skipped.stderr
    assert "broken.jpg" in skipped.stderr and "3 embeddings" in skipped.stdout

"""Reliability under bad input and faults, through the entry points users run.

Each bad input gives a clear error naming the item, or a documented handling
that the run's output lists; never a crash or a silently wrong table. The
unit-level cases (every image mode, decompression limits, cache internals)
are in test_data.py and test_embed.py; this file checks them end to end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from crslib import agreement
from crslib.errors import DataError, InputError

SPEC = "timm:resnet10t?size=32&seed=0"


def crs(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crslib", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=env)


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Good images in awkward encodings plus every kind of broken file."""
    root = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(0)
    gray = (rng.random((40, 48)) * 255).astype(np.uint8)
    Image.fromarray(gray).save(root / "plain.png")
    Image.fromarray(gray).convert("CMYK").save(root / "cmyk.jpg", quality=90)
    Image.fromarray((gray.astype(np.uint16) * 257)).save(root / "sixteen_bit.png")
    Image.fromarray(gray).convert("P").save(root / "palette.png")
    Image.fromarray(gray).save(root / "Röntgen_åäö_胸部.png")
    good = (root / "plain.png").read_bytes()
    (root / "zero_bytes.png").write_bytes(b"")
    jpeg = root / "cmyk.jpg"
    (root / "truncated.jpg").write_bytes(jpeg.read_bytes()[: len(jpeg.read_bytes()) // 3])
    (root / "text_named.png").write_text("this is not an image\n")
    assert good
    return root


BROKEN = {"zero_bytes.png", "truncated.jpg", "text_named.png"}
READABLE = {"plain.png", "cmyk.jpg", "sixteen_bit.png", "palette.png", "Röntgen_åäö_胸部.png"}


def test_bad_files_stop_the_run_with_their_name(folder: Path) -> None:
    line = one_line_error(crs("embed", "--data", str(folder), "--model", SPEC, "--no-cache"))
    assert any(name in line for name in BROKEN), line


def test_skip_mode_lists_every_broken_file_and_embeds_the_rest(folder: Path, tmp_path: Path) -> None:
    result = crs("embed", "--data", str(folder), "--model", SPEC, "--skip-unreadable", "--no-cache",
                 "--out", str(tmp_path / "X.npy"))
    assert result.returncode == 0, result.stderr
    skipped = {line.split("skipped ", 1)[1].split(":", 1)[0] for line in result.stderr.splitlines()
               if line.startswith("skipped ")}
    assert {Path(p).name for p in skipped} == BROKEN
    ids = np.load(tmp_path / "X_image_ids.npy")
    X = np.load(tmp_path / "X.npy")
    assert X.shape[0] == len(READABLE) == len(ids) and np.isfinite(X).all()
    assert any("Röntgen_åäö_胸部" in str(i) for i in ids), "non-ASCII names survive"


def test_manifest_with_a_missing_file_or_duplicate_ids_is_named(folder: Path, tmp_path: Path) -> None:
    rows = pd.DataFrame({"image_id": ["a", "b"], "path": [str(folder / "plain.png"), str(tmp_path / "gone.png")]})
    rows.to_csv(tmp_path / "missing.csv", index=False)
    one_line_error(crs("embed", "--data", str(tmp_path / "missing.csv"), "--model", SPEC), "gone.png")
    rows.assign(image_id=["a", "a"], path=[str(folder / "plain.png")] * 2).to_csv(tmp_path / "dup.csv", index=False)
    one_line_error(crs("embed", "--data", str(tmp_path / "dup.csv"), "--model", SPEC), "duplicate", "'a'")


def test_bad_embeddings_and_k_give_clear_errors_or_defined_answers() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 8)).astype(np.float32)
    for bad in (np.nan, np.inf):
        Y = X.copy()
        Y[7, 3] = bad
        with pytest.raises(InputError, match="NaN|infinite|finite"):
            agreement.mutual_knn_overlap(X, Y, k=5)
    with pytest.raises(InputError, match="k"):
        agreement.mutual_knn_overlap(X, X, k=50)
    # constant embeddings: every image is equally close to every other; ties break by index, so the
    # answer is defined and reproducible, and equal to the overlap of two identical constant spaces (1.0)
    C = np.ones((50, 8), dtype=np.float32)
    assert agreement.mutual_knn_overlap(C, C, k=5) == pytest.approx(1.0)
    assert agreement.mutual_knn_overlap(C, X, k=5) == agreement.mutual_knn_overlap(C, X, k=5)


def test_a_single_class_in_a_split_is_a_clear_error(tmp_path: Path) -> None:
    made = crs("phantom", str(tmp_path / "p"), "--patients", "40", "--image-size", "32", "--seed", "2")
    assert made.returncode == 0, made.stderr
    manifest = pd.read_csv(tmp_path / "p" / "manifest.csv")
    manifest.loc[manifest["split"] == "test", "label"] = 1
    manifest.to_csv(tmp_path / "p" / "manifest.csv", index=False)
    one_line_error(crs("audit", "--data", str(tmp_path / "p"), "--model", "none", "--resamples", "50"),
                   "class")
    from crslib import protocol

    with pytest.raises(DataError, match="single class"):
        protocol.protocol_splits(manifest["split"], manifest["patient_id"], manifest["label"])


@pytest.mark.slow
def test_killed_extraction_resumes_to_the_same_array(tmp_path: Path) -> None:
    data = tmp_path / "p"
    assert crs("phantom", str(data), "--patients", "400", "--image-size", "64", "--seed", "5").returncode == 0
    spec = "timm:resnet18?size=64&seed=0"
    env_a = dict(os.environ, CRS_CACHE_DIR=str(tmp_path / "cache-a"))
    env_b = dict(os.environ, CRS_CACHE_DIR=str(tmp_path / "cache-b"))
    reference = crs("embed", "--data", str(data), "--model", spec, "--out", str(tmp_path / "ref.npy"), env=env_a)
    assert reference.returncode == 0, reference.stderr
    # kill -9 as soon as the first shard has been written, then rerun
    process = subprocess.Popen([sys.executable, "-m", "crslib", "embed", "--data", str(data), "--model", spec],
                               env=env_b, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    shards = tmp_path / "cache-b" / "embeddings" / "shards"
    while time.monotonic() < deadline and process.poll() is None:
        if shards.is_dir() and any(shards.rglob("*.npy")):
            break
        time.sleep(0.05)
    assert process.poll() is None, "extraction finished before it could be killed; use more images"
    process.send_signal(signal.SIGKILL)
    process.wait()
    rerun = crs("embed", "--data", str(data), "--model", spec, "--out", str(tmp_path / "rerun.npy"), env=env_b)
    assert rerun.returncode == 0, rerun.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "rerun.npy"), np.load(tmp_path / "ref.npy"))
    assert "computed" in rerun.stdout  # it resumed: the finished shard was reused, the rest computed


@pytest.mark.slow
def test_two_runs_with_the_same_parameters_give_identical_tables(quick_book, tmp_path: Path) -> None:
    from crslib.runner import run_notebooks

    _, first = quick_book
    second = run_notebooks("quick", only=["03", "06"], run_root=tmp_path / "runs", reuse=False)  # execute again
    compared = 0
    for name in ("03_transfer", "06_representation_risk"):
        a_dir = Path(first.run_dir) / "results" / name
        b_dir = Path(second.run_dir) / "results" / name
        for a in sorted(a_dir.glob("*.csv")) + sorted(a_dir.glob("*.json")):
            b = b_dir / a.name
            assert b.is_file(), b
            assert a.read_bytes() == b.read_bytes(), f"{name}/{a.name} differs between two runs"
            compared += 1
    assert compared >= 8
    assert Path(first.run_dir) != Path(second.run_dir)  # a new run never overwrites an earlier one

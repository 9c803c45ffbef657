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
    # with ties broken by index, image i's neighbours in C are the 5 lowest other indices;
    # in X (no ties) they are its 5 most cosine-similar rows
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    in_x = np.argsort(-similarity, axis=1, kind="stable")[:, :5]
    in_c = [[j for j in range(6) if j != i][:5] for i in range(50)]
    expected = np.mean([len(set(in_c[i]) & set(in_x[i])) / 5 for i in range(50)])
    assert 0 < expected < 1
    here = agreement.mutual_knn_overlap(C, X, k=5)
    assert here == pytest.approx(expected, abs=1e-12)
    # and a separate process computes exactly the same number
    code = ("import numpy as np; from crslib import agreement; X = np.random.default_rng(1).normal(size=(50, 8))"
            ".astype(np.float32); print(repr(agreement.mutual_knn_overlap(np.ones((50, 8), np.float32), X, k=5)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert other.returncode == 0, other.stderr
    assert float(other.stdout.strip().splitlines()[-1]) == here


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
        protocol.protocol_splits(manifest["split"], manifest["label"], groups=manifest["patient_id"])


#: ``crs`` with two test hooks: CRS_TEST_SHARD_SIZE sets the images per cache shard (the
#: CLI uses 512), and with CRS_TEST_STOP_MARKER set, the run writes that file and then
#: blocks once the first shard is in the cache and a batch of the second is encoded, so
#: a kill always lands in the middle of an extraction, whatever the machine's speed.
HOOKED_CRS = """
import functools, os, sys, time
from pathlib import Path

import crslib.embed as embed
import crslib.models.encoders as encoders
from crslib.cli import main

embed.extract_embeddings = functools.partial(embed.extract_embeddings,
                                             shard_size=int(os.environ["CRS_TEST_SHARD_SIZE"]))
marker = os.environ.get("CRS_TEST_STOP_MARKER")
if marker:
    saved = []
    save, encode = embed._save_shard, encoders.TorchEncoder.encode

    def save_and_count(*args, **kwargs):
        save(*args, **kwargs)
        saved.append(args[1].key)

    def encode_then_stop(self, batch):
        out = encode(self, batch)
        if saved:
            Path(marker).write_text(f"{len(saved)} shard(s) saved")
            time.sleep(3600)  # killed here, with the second shard half done
        return out

    embed._save_shard, encoders.TorchEncoder.encode = save_and_count, encode_then_stop
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_killed_extraction_resumes_to_the_same_array(tmp_path: Path) -> None:
    data = tmp_path / "p"
    assert crs("phantom", str(data), "--patients", "40", "--image-size", "32", "--seed", "5").returncode == 0
    n_images = len(pd.read_csv(data / "manifest.csv"))
    shard_size = 16
    n_shards = -(-n_images // shard_size)
    assert n_shards >= 3
    script = tmp_path / "hooked_crs.py"
    script.write_text(HOOKED_CRS)
    embed = [sys.executable, str(script), "embed", "--data", str(data), "--model", SPEC, "--batch-size", "4",
             "--workers", "0"]

    def env(cache: str, **extra: str) -> dict:
        return dict(os.environ, CRS_CACHE_DIR=str(tmp_path / cache), CRS_TEST_SHARD_SIZE=str(shard_size), **extra)

    def shard_files(cache: str) -> list[Path]:
        return sorted((tmp_path / cache / "embeddings" / "shards").rglob("*.npy"))

    reference = subprocess.run([*embed, "--out", str(tmp_path / "ref.npy")], env=env("cache-a"),
                               capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr
    assert len(shard_files("cache-a")) == n_shards
    # kill -9 while the run is blocked in the middle of its second shard
    marker, log = tmp_path / "one-shard-saved", tmp_path / "killed-run.log"
    with open(log, "w") as output:
        process = subprocess.Popen(embed, env=env("cache-b", CRS_TEST_STOP_MARKER=str(marker)),
                                   stdout=output, stderr=subprocess.STDOUT)
    try:
        for _ in range(6000):  # at most 10 minutes: a guard against a hang, not a measurement
            if marker.exists() or process.poll() is not None:
                break
            time.sleep(0.1)
        assert marker.exists(), f"no shard (status {process.poll()}): {log.read_text()}"
        assert process.poll() is None  # blocked, so the kill lands mid-run
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    finished = shard_files("cache-b")
    assert len(finished) == 1  # the finished shard was kept; the half-done one left nothing
    kept = (finished[0].stat().st_ino, finished[0].stat().st_mtime_ns)
    rerun = subprocess.run([*embed, "--out", str(tmp_path / "rerun.npy")], env=env("cache-b"),
                           capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    # it resumed: one shard reused, the others computed, none computed twice
    assert f"computed, 1 of {n_shards} shards from the cache" in rerun.stdout, rerun.stdout
    assert len(shard_files("cache-b")) == n_shards
    assert (finished[0].stat().st_ino, finished[0].stat().st_mtime_ns) == kept  # read, not written again
    assert [p.name for p in shard_files("cache-b")] == [p.name for p in shard_files("cache-a")]
    rerun_X, reference_X = np.load(tmp_path / "rerun.npy"), np.load(tmp_path / "ref.npy")
    assert rerun_X.shape[0] == n_images
    np.testing.assert_array_equal(rerun_X, reference_X)
    np.testing.assert_array_equal(np.load(tmp_path / "rerun_image_ids.npy"), np.load(tmp_path / "ref_image_ids.npy"))
    # a third run is a full cache hit
    third = subprocess.run(embed, env=env("cache-b"), capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and "(cache hit," in third.stdout, third.stdout + third.stderr


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

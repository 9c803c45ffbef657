"""Embedding extraction: content-addressed cache, resume, bad images, NaN."""

from __future__ import annotations

import logging
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import crslib  # noqa: E402,F401  (before torch/timm)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import crslib.embed as embed_mod  # noqa: E402
from crslib.embed import extract_embeddings  # noqa: E402
from crslib.models import Preprocessing, TorchEncoder, load_encoder  # noqa: E402
from crslib.errors import ImageReadError, InputError, ModelError  # noqa: E402
from assertions import error_message  # noqa: E402

N_IMAGES = 20
SHARD = 8  # -> shards of 8, 8, 4
BATCH = 4


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _write_dataset(folder) -> pd.DataFrame:
    """Grayscale and RGB PNGs of different sizes plus one JPEG."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    rows = []
    for i in range(N_IMAGES):
        size = 24 + (i % 3) * 4
        if i % 4 == 1:
            array = (rng.random((size, size + 2, 3)) * 255).astype(np.uint8)
        else:
            array = (rng.random((size, size)) * 255).astype(np.uint8)
        name = f"img{i:02d}.jpg" if i == 5 else f"img{i:02d}.png"
        Image.fromarray(array).save(folder / name, quality=95)
        rows.append({"image_id": f"id{i:02d}", "path": str((folder / name).resolve())})
    return pd.DataFrame(rows)


def _manifest_for(folder) -> pd.DataFrame:
    files = sorted(p for p in folder.iterdir() if p.suffix in (".png", ".jpg"))
    return pd.DataFrame({"image_id": [f"id{p.stem[3:]}" for p in files], "path": [str(p.resolve()) for p in files]})


class CountingEncoder(TorchEncoder):
    """A tiny conv net that counts the images it encodes and can fail on
    purpose after a number of batches (to simulate an interrupted run)."""

    def __init__(self, *, seed: int = 0, fail_after_batches: int | None = None, nan: bool = False):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3, stride=2),
        )
        pre = Preprocessing((3, 20, 20), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "bilinear", 3)
        super().__init__(net, name=f"toy-seed{seed}{'-nan' if nan else ''}", preprocessing=pre)
        self.encoded = 0
        self.batches = 0
        self.fail_after_batches = fail_after_batches
        self.nan = nan

    def encode(self, batch):
        if self.fail_after_batches is not None and self.batches >= self.fail_after_batches:
            raise KeyboardInterrupt("simulated interruption")
        out = super().encode(batch)
        if self.nan:
            out[-1, 0] = np.nan
        self.batches += 1
        self.encoded += len(out)
        return out


@pytest.fixture
def dataset(tmp_path):
    return _write_dataset(tmp_path / "data")


def _run(manifest, encoder, cache_root, **kw):
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("shard_size", SHARD)
    return extract_embeddings(manifest, encoder, cache_root=cache_root, progress=False, **kw)


def test_miss_then_hit(dataset, tmp_path):
    enc = CountingEncoder()
    first = _run(dataset, enc, tmp_path / "cache")
    assert not first.cache_hit and first.n_computed == N_IMAGES and enc.encoded == N_IMAGES
    assert first.X.shape == (N_IMAGES, 16) and first.X.dtype == np.float32
    assert list(first.image_ids) == list(dataset["image_id"])
    assert first.skipped.empty and list(first.skipped.columns) == ["image_id", "path", "reason"]
    second = _run(dataset, enc, tmp_path / "cache")
    assert second.cache_hit and second.n_computed == 0 and enc.encoded == N_IMAGES
    assert second.key == first.key
    np.testing.assert_array_equal(second.X, first.X)
    # rows follow manifest order, not file order
    shuffled = dataset.iloc[::-1].reset_index(drop=True)
    third = _run(shuffled, enc, tmp_path / "cache")
    np.testing.assert_array_equal(third.X, first.X[::-1])
    # the cached rows are the encoder's output for those images
    from crslib.data import read_image

    direct = enc.encode(enc.preprocess_batch([read_image(p) for p in dataset["path"][:3]]))
    np.testing.assert_allclose(first.X[:3], direct, rtol=1e-5, atol=1e-6)


def test_changed_image_misses_only_its_shard(dataset, tmp_path):
    enc = CountingEncoder()
    before = _run(dataset, enc, tmp_path / "cache")
    Image.fromarray(np.full((24, 24), 200, np.uint8)).save(dataset["path"][9])  # shard 2 of 3
    enc.encoded = 0
    after = _run(dataset, enc, tmp_path / "cache")
    assert not after.cache_hit and after.key != before.key
    assert enc.encoded == SHARD and after.shards == {"total": 3, "from_cache": 2, "computed": 1}
    changed = np.zeros(N_IMAGES, bool)
    changed[9] = True
    assert not np.allclose(after.X[9], before.X[9])
    np.testing.assert_array_equal(after.X[~changed], before.X[~changed])


def test_changed_weight_file_misses(dataset, tmp_path):
    import timm

    weights = tmp_path / "w.pth"
    torch.manual_seed(3)
    torch.save(timm.create_model("test_resnet", num_classes=0).state_dict(), weights)
    spec = f"timm:test_resnet?weights={weights}&size=32"
    first = _run(dataset, load_encoder(spec), tmp_path / "cache")
    assert _run(dataset, load_encoder(spec), tmp_path / "cache").cache_hit
    torch.manual_seed(4)
    torch.save(timm.create_model("test_resnet", num_classes=0).state_dict(), weights)
    changed = _run(dataset, load_encoder(spec), tmp_path / "cache")
    assert not changed.cache_hit and changed.key != first.key
    assert not np.allclose(changed.X, first.X)


def test_moved_folder_hits(dataset, tmp_path):
    enc = CountingEncoder()
    first = _run(dataset, enc, tmp_path / "cache")
    moved = tmp_path / "renamed" / "elsewhere"
    moved.parent.mkdir()
    shutil.move(str(tmp_path / "data"), str(moved))
    second = _run(_manifest_for(moved), enc, tmp_path / "cache")
    assert second.cache_hit and enc.encoded == N_IMAGES
    np.testing.assert_array_equal(second.X, first.X)


def test_interrupted_run_resumes_identically(dataset, tmp_path):
    reference = _run(dataset, CountingEncoder(), tmp_path / "cache-a")
    flaky = CountingEncoder(fail_after_batches=3)  # shard 1 = 2 batches done, shard 2 half done
    with pytest.raises(KeyboardInterrupt):
        _run(dataset, flaky, tmp_path / "cache-b")
    assert flaky.encoded == 3 * BATCH
    resumed = CountingEncoder()
    result = _run(dataset, resumed, tmp_path / "cache-b")
    assert resumed.encoded == N_IMAGES - SHARD  # the finished shard was reused
    assert result.shards == {"total": 3, "from_cache": 1, "computed": 2}
    np.testing.assert_array_equal(result.X, reference.X)
    assert result.key == reference.key


def test_corrupted_shard_is_recomputed(dataset, tmp_path, caplog):
    enc = CountingEncoder()
    first = _run(dataset, enc, tmp_path / "cache")
    shards = sorted((tmp_path / "cache" / "shards").rglob("*.npy"))
    assert len(shards) == 3
    data = shards[0].read_bytes()
    shards[0].write_bytes(data[: len(data) // 2])  # truncated
    enc.encoded = 0
    with caplog.at_level(logging.WARNING, logger="crslib.embed"):
        second = _run(dataset, enc, tmp_path / "cache")
    assert any("damaged" in r.getMessage() and shards[0].name in r.getMessage() for r in caplog.records)
    assert enc.encoded in (SHARD, N_IMAGES - 2 * SHARD) and not second.cache_hit
    np.testing.assert_array_equal(second.X, first.X)
    assert _run(dataset, enc, tmp_path / "cache").cache_hit  # repaired


def _truncate(path):
    data = open(path, "rb").read()
    with open(path, "wb") as handle:
        handle.write(data[: len(data) // 3])


@pytest.mark.parametrize("workers", [0, 1])
def test_truncated_jpeg_raises_naming_the_file(dataset, tmp_path, workers):
    bad = dataset["path"][5]
    _truncate(bad)
    with pytest.raises(ImageReadError) as info:
        _run(dataset, CountingEncoder(), tmp_path / "cache", num_workers=workers)
    assert info.value.path == bad and bad in str(info.value)
    assert "\n" not in str(info.value)


def test_skip_lists_unreadable_images(dataset, tmp_path, caplog):
    bad, gone = dataset["path"][5], dataset["path"][12]
    _truncate(bad)
    os.remove(gone)
    with caplog.at_level(logging.WARNING, logger="crslib.embed"):
        result = _run(dataset, CountingEncoder(), tmp_path / "cache", on_error="skip")
    assert result.X.shape == (N_IMAGES - 2, 16)
    assert list(result.skipped["path"]) == [bad, gone]
    assert list(result.skipped["image_id"]) == ["id05", "id12"]
    assert all(result.skipped["reason"].str.len() > 0)
    assert "id05" not in set(result.image_ids) and "id12" not in set(result.image_ids)
    assert any(bad in r.getMessage() for r in caplog.records)
    # cached shards remember the failure: a second run lists it again, and raise mode still raises
    again = _run(dataset, CountingEncoder(), tmp_path / "cache", on_error="skip")
    assert again.cache_hit and list(again.skipped["path"]) == [bad, gone]
    np.testing.assert_array_equal(again.X, result.X)
    with pytest.raises(ImageReadError, match="img05.jpg"):
        _run(dataset, CountingEncoder(), tmp_path / "cache", on_error="raise")


def test_nan_embeddings_raise_model_error(dataset, tmp_path):
    with pytest.raises(ModelError, match=r"toy-seed0-nan.*NaN.*id03"):
        _run(dataset, CountingEncoder(nan=True), tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.npy")), "no shard with NaN may be cached"


def test_cache_off_writes_nothing_and_hash_index_is_reused(dataset, tmp_path, monkeypatch):
    off = _run(dataset, CountingEncoder(), tmp_path / "cache", cache=False)
    assert not (tmp_path / "cache").exists() and not off.cache_hit and off.key
    _run(dataset, CountingEncoder(), tmp_path / "cache")
    calls = []
    real = embed_mod.file_sha256
    monkeypatch.setattr(embed_mod, "file_sha256", lambda p: calls.append(p) or real(p))
    hit = _run(dataset, CountingEncoder(), tmp_path / "cache")
    assert hit.cache_hit and hit.key == off.key and calls == []  # hashes came from the index
    Image.fromarray(np.zeros((24, 24), np.uint8)).save(dataset["path"][0])
    _run(dataset, CountingEncoder(), tmp_path / "cache")
    assert calls == [dataset["path"][0]]


def test_bad_options(dataset, tmp_path):
    enc = CountingEncoder()
    with pytest.raises(InputError, match="on_error"):
        _run(dataset, enc, tmp_path, on_error="ignore")
    with pytest.raises(InputError, match="batch_size"):
        _run(dataset, enc, tmp_path, batch_size=0)
    with pytest.raises(crslib.DataError, match="path"):
        _run(dataset.drop(columns=["path"]), enc, tmp_path)
    with pytest.raises(InputError, match="Encoder"):
        _run(dataset, "timm:resnet18", tmp_path)


def test_image_hashes_are_the_sha256_of_the_bytes(tmp_path):
    import hashlib

    data = _write_dataset(tmp_path / "data")
    first = data["path"][0]
    twin = str(tmp_path / "another name.png")
    shutil.copy(first, twin)
    (tmp_path / "folder").mkdir()
    paths = [first, data["path"][1], twin, str(tmp_path / "missing.png"), str(tmp_path / "folder")]
    hashes, failures = embed_mod.image_hashes(paths)
    assert hashes[0] == hashlib.sha256(open(first, "rb").read()).hexdigest()
    assert hashes[1] == hashlib.sha256(open(data["path"][1], "rb").read()).hexdigest() != hashes[0]
    assert hashes[2] == hashes[0]  # same bytes, another name: the same hash
    assert hashes[3:] == [None, None]
    assert failures == {3: "no such file", 4: "is a folder, not an image file"}


def test_image_hashes_reuse_index_entries_only_while_size_and_mtime_match(tmp_path):
    import hashlib
    import json

    path = str(tmp_path / "a.bin")
    with open(path, "wb") as handle:
        handle.write(b"first")
    index = tmp_path / "index.json"
    assert embed_mod.image_hashes([path], index_file=index)[0] == [hashlib.sha256(b"first").hexdigest()]
    stored = json.loads(index.read_text())
    assert stored["files"][path][2] == hashlib.sha256(b"first").hexdigest()
    stored["files"][path][2] = "from-the-index"  # an entry whose size and mtime match is trusted as is
    index.write_text(json.dumps(stored))
    assert embed_mod.image_hashes([path], index_file=index)[0] == ["from-the-index"]
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: hashed again
    assert embed_mod.image_hashes([path], index_file=index)[0] == [hashlib.sha256(b"first").hexdigest()]


def test_embed_models_gives_each_models_rows_in_manifest_order(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    specs = {"seed 0": "timm:test_resnet?size=32&seed=0", "seed 1": "timm:test_resnet?size=32&seed=1"}
    out = embed_mod.embed_models(dataset, specs, progress=False)
    assert list(out) == ["seed 0", "seed 1"]
    for name, spec in specs.items():
        expected = extract_embeddings(dataset, load_encoder(spec), cache=False, progress=False).X
        assert out[name].shape == (N_IMAGES, load_encoder(spec).embedding_dim)
        np.testing.assert_array_equal(out[name], expected)
    assert not np.allclose(out["seed 0"], out["seed 1"])
    # a sequence of specs names each model by its spec; an unreadable image is skipped by both
    _truncate(dataset["path"][5])
    skipped = embed_mod.embed_models(dataset, list(specs.values()), on_error="skip", progress=False)
    assert list(skipped) == list(specs.values())
    keep = np.arange(N_IMAGES) != 5
    for name, spec in specs.items():
        np.testing.assert_array_equal(skipped[spec], out[name][keep])


def test_embed_models_refuses_rows_that_would_not_align(dataset, monkeypatch):
    from types import SimpleNamespace

    import crslib.models

    ids = {"a": np.array(["id00", "id01"]), "b": np.array(["id00", "id02"])}
    monkeypatch.setattr(crslib.models, "load_encoder", lambda spec: SimpleNamespace(name=spec))
    monkeypatch.setattr(embed_mod, "extract_embeddings",
                        lambda m, enc, **kw: SimpleNamespace(X=np.zeros((2, 3)), image_ids=ids[enc.name]))
    with pytest.raises(InputError, match="model b skipped other images than the models before it"):
        embed_mod.embed_models(dataset, ["a", "b"], on_error="skip")


# --------------------------------------------------------------------------- saved embeddings


def test_save_and_load_embeddings_round_trip_and_refuse_bad_input(tmp_path):
    from crslib.embed import load_embeddings, save_embeddings

    X = np.random.default_rng(0).normal(size=(50, 6)).astype(np.float32)
    path = save_embeddings(tmp_path / "e.npy", X)
    assert np.array_equal(load_embeddings(path), X) and isinstance(load_embeddings(path), np.memmap)
    in_memory = load_embeddings(path, mmap=False)
    assert not isinstance(in_memory, np.memmap) and np.array_equal(in_memory, X)
    half = load_embeddings(save_embeddings(tmp_path / "h.npy", X.astype(np.float64), dtype="float16"))
    assert half.dtype == np.float16
    assert np.allclose(half, X, rtol=2**-11, atol=0) and not np.array_equal(half.astype(np.float32), X)
    with pytest.raises(InputError, match=r"dtype must be one of \('float32', 'float16'\), got 'int8'"):
        save_embeddings(tmp_path / "x.npy", X, dtype="int8")
    big = X.copy()
    big[30, 2] = 70_000.0
    with pytest.raises(InputError, match=r"beyond float16's range \(65504\), first in row 30; store it as float32"):
        save_embeddings(tmp_path / "x.npy", big, dtype="float16")
    assert not (tmp_path / "x.npy").exists()
    huge = X.astype(np.float64)
    huge[41, 0] = 1e300  # finite in float64, inf once stored as float32
    assert error_message(save_embeddings, tmp_path / "x.npy", huge) == (
        "X has values beyond float32's range (3.40282e+38), first in row 41; rescale the embeddings")
    assert not (tmp_path / "x.npy").exists()
    bad = X.copy()
    bad[4, 0] = np.nan
    with pytest.raises(InputError, match=r"NaN or infinite values in 1 row\(s\), first rows \[4\]"):
        save_embeddings(tmp_path / "x.npy", bad)
    with pytest.raises(InputError, match="no embeddings file at"):
        load_embeddings(tmp_path / "missing.npy")
    np.save(tmp_path / "flat.npy", np.arange(5.0))
    with pytest.raises(InputError, match="holds a 1-D float64 array; embeddings are 2-D floats"):
        load_embeddings(tmp_path / "flat.npy")
    (tmp_path / "text.npy").write_text("not an array")
    with pytest.raises(InputError, match="is not a .npy array of embeddings"):
        load_embeddings(tmp_path / "text.npy")

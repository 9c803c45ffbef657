"""`--device`: the resolver, device-independent cache keys, mixed precision,
the torch top-k search, and zoo / fine-tuning on a named device.

This machine has no GPU: the tests cover "auto" and "cpu", and a GPU asked
for without one (a one-line error, exit 2). bench/bench_device.py measures a
GPU where there is one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import crslib  # noqa: F401
from crslib.device import autocast_dtype, resolve_device
from crslib.errors import InputError
from crslib.neighbors import _Searcher, knn_indices


def crs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crslib", *args], capture_output=True, text=True, timeout=600)


# --------------------------------------------------------------------------- the resolver


def test_auto_and_cpu_resolve_to_the_cpu_here() -> None:
    assert not torch.cuda.is_available()
    assert resolve_device("auto") == "cpu"
    assert resolve_device(None) == "cpu"
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(" CPU ") == "cpu"


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "mps"])
def test_a_gpu_that_torch_does_not_see_is_a_one_line_input_error(name: str) -> None:
    with pytest.raises(InputError) as info:
        resolve_device(name)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"device {name!r} was requested but torch sees no ")
    assert message.endswith("use --device cpu or auto")


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "cpu:1", ""])
def test_unknown_devices_are_named(name: str) -> None:
    with pytest.raises(InputError, match=r"^device must be one of auto, cpu, cuda, mps \(or cuda:N\), got "):
        resolve_device(name)


def test_autocast_types() -> None:
    assert autocast_dtype("cpu") == "bfloat16"
    assert autocast_dtype("cuda:1") == "float16"


def test_crs_embed_on_a_missing_gpu_exits_2_with_one_line(tmp_path: Path) -> None:
    result = crs("embed", "--data", "phantom?patients=3&size=32", "--model", "timm:resnet18?size=32",
                 "--device", "cuda")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "device 'cuda' was requested but torch sees no CUDA GPU" in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["embed", "zoo", "compare", "audit", "risk"])
def test_every_extracting_or_training_command_has_device(command: str) -> None:
    result = crs(command, "--help")
    assert result.returncode == 0
    assert "--device {auto,cpu,cuda,mps}" in result.stdout
    assert ("--amp" in result.stdout) == (command == "embed")


# --------------------------------------------------------------------------- exact search


def _brute_force(X: np.ndarray, k: int) -> np.ndarray:
    """Cosine neighbours by the documented rule: (-similarity rounded to float32, index)."""
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
    S = (Xn @ Xn.T).astype(np.float32)
    np.fill_diagonal(S, -np.inf)
    n = len(X)
    return np.stack([np.lexsort((np.arange(n), -S[i]))[:k] for i in range(n)])


def test_torch_topk_on_the_device_equals_faiss_without_ties() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 24)).astype(np.float32)
    faiss_ids = knn_indices(X, k=10, backend="faiss")
    torch_ids = knn_indices(X, k=10, backend="torch", device="cpu")
    auto_ids = knn_indices(X, k=10, device="auto")
    np.testing.assert_array_equal(torch_ids, faiss_ids)
    np.testing.assert_array_equal(auto_ids, faiss_ids)
    np.testing.assert_array_equal(torch_ids, _brute_force(X.astype(np.float64), 10))


def test_torch_topk_on_the_device_breaks_exact_ties_by_index_like_faiss() -> None:
    # 40 exact copies of four rows, shuffled: every query has 39 exact ties
    # at similarity 1, so its neighbours are decided by index alone.
    rng = np.random.default_rng(1)
    base = rng.normal(size=(4, 8))
    X = np.concatenate([base] * 40).astype(np.float32)
    order = rng.permutation(len(X))
    X = X[order]
    faiss_ids, faiss_sim = knn_indices(X, k=10, backend="faiss", return_similarity=True)
    torch_ids, torch_sim = knn_indices(X, k=10, backend="torch", device="cpu", return_similarity=True)
    np.testing.assert_array_equal(torch_ids, faiss_ids)
    np.testing.assert_array_equal(torch_sim, faiss_sim)
    # the tie rule, by hand: the same direction, lowest indices first, the query left out
    direction = order % 4
    for i in (0, 7, 159):
        same = [j for j in range(len(X)) if direction[j] == direction[i] and j != i]
        assert torch_ids[i].tolist() == same[:10]


def test_faiss_on_a_gpu_device_is_refused_before_anything_runs() -> None:
    X = np.eye(4, dtype=np.float32)
    with pytest.raises(InputError, match=r"^backend='faiss' searches on the CPU; with device='cuda' use backend="):
        _Searcher(X, "cosine", "faiss", None, "cuda")


def test_knn_with_cuda_requested_without_a_gpu_is_the_resolver_error() -> None:
    with pytest.raises(InputError, match="torch sees no CUDA GPU"):
        knn_indices(np.eye(5), k=2, device="cuda")


def test_the_device_reaches_the_exact_search_of_knn_search_and_compare() -> None:
    from crslib.ann import knn_search
    from crslib.compare import compare_embeddings

    rng = np.random.default_rng(2)
    X, Y = rng.normal(size=(80, 6)), rng.normal(size=(80, 6))
    ids, info = knn_search(X, k=5, device="cpu")
    assert info["index"] == "exact"
    np.testing.assert_array_equal(ids, knn_indices(X, k=5))
    with pytest.raises(InputError, match="torch sees no CUDA GPU"):
        knn_search(X, k=5, device="cuda")
    meta = pd.DataFrame({"image_id": [f"i{j}" for j in range(80)]})
    here = compare_embeddings(X, Y, meta, k=5, n_resamples=50, n_permutations=20, device="auto")
    default = compare_embeddings(X, Y, meta, k=5, n_resamples=50, n_permutations=20)
    assert here.overlap == default.overlap
    with pytest.raises(InputError, match="torch sees no CUDA GPU"):
        compare_embeddings(X, Y, meta, k=5, n_resamples=50, n_permutations=20, device="cuda")


# --------------------------------------------------------------------------- extraction


@pytest.fixture(scope="module")
def phantom(tmp_path_factory):
    from crslib.data.phantom import generate_phantom

    return generate_phantom(tmp_path_factory.mktemp("phantom"), n_patients=10, image_size=32, random_state=0)


def test_device_cpu_keeps_the_embeddings_and_the_cache_key(phantom, tmp_path: Path) -> None:
    from crslib.embed import extract_embeddings
    from crslib.models import load_encoder

    enc = load_encoder("timm:resnet18?size=32")
    plain = extract_embeddings(phantom, enc, cache=False, progress=False)
    on_cpu = extract_embeddings(phantom, enc, cache=False, progress=False, device="cpu")
    auto = extract_embeddings(phantom, load_encoder("timm:resnet18?size=32"), cache_root=tmp_path,
                              progress=False, device="auto")
    assert on_cpu.key == plain.key == auto.key
    np.testing.assert_array_equal(on_cpu.X, plain.X)
    np.testing.assert_array_equal(auto.X, plain.X)
    assert enc.device == "cpu" and enc.amp is False


def test_amp_has_its_own_cache_key_and_stays_within_the_stated_tolerance(phantom, tmp_path: Path) -> None:
    from crslib.embed import extract_embeddings
    from crslib.models import load_encoder

    enc = load_encoder("timm:resnet18?size=32")
    fp32 = extract_embeddings(phantom, enc, cache_root=tmp_path, progress=False, device="cpu")
    mixed = extract_embeddings(phantom, enc, cache_root=tmp_path, progress=False, device="cpu", amp=True)
    assert mixed.key != fp32.key and not mixed.cache_hit
    assert not np.array_equal(mixed.X, fp32.X)  # bfloat16 really ran
    # the tolerance stated in extract_embeddings: max |dX| within 2% of max |X| for this model
    assert np.abs(mixed.X - fp32.X).max() <= 0.02 * np.abs(fp32.X).max()
    # amp off again: the float32 entries, from the cache
    again = extract_embeddings(phantom, enc, cache_root=tmp_path, progress=False)
    assert again.key == fp32.key and again.cache_hit
    np.testing.assert_array_equal(again.X, fp32.X)


def test_moving_a_module_keeps_its_given_fingerprint() -> None:
    from crslib.models.encoders import Preprocessing, TorchEncoder

    pre = Preprocessing((3, 8, 8), (0.5,) * 3, (0.25,) * 3, "bilinear", 3)
    enc = TorchEncoder(torch.nn.Conv2d(3, 4, 3), name="tiny", preprocessing=pre, fingerprint="weights-v1")
    before = enc.fingerprint()
    enc._move_module("meta")  # new storage for every tensor, as on a GPU; the values are the same weights
    assert enc.fingerprint() == before
    assert "given:weights-v1" in enc._weights_fingerprint()


def test_encoder_to_sets_device_and_amp_and_checks_the_name() -> None:
    from crslib.models.encoders import Preprocessing, TorchEncoder

    pre = Preprocessing((3, 8, 8), (0.5,) * 3, (0.25,) * 3, "bilinear", 3)
    enc = TorchEncoder(torch.nn.Conv2d(3, 4, 3), name="tiny", preprocessing=pre)
    assert enc.to("auto", amp=True) is enc
    assert (enc.device, enc.amp) == ("cpu", True)
    out = enc.encode(torch.rand(2, 3, 8, 8))
    assert out.dtype == np.float32 and out.shape == (2, 4)
    with pytest.raises(InputError, match="torch sees no CUDA GPU"):
        enc.to("cuda")


def test_onnx_ignores_amp_so_its_key_does_not_change(tmp_path: Path, phantom) -> None:
    from crslib.embed import extract_embeddings
    from crslib.models import load_encoder

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    path = tmp_path / "net.onnx"
    torch.onnx.export(net, (torch.rand(2, 3, 32, 32),), str(path), input_names=["image"], output_names=["f"],
                      dynamic_axes={"image": {0: "batch"}}, dynamo=False)
    enc = load_encoder(f"onnx:{path}")
    plain = extract_embeddings(phantom, enc, cache=False, progress=False)
    mixed = extract_embeddings(phantom, enc, cache=False, progress=False, device="auto", amp=True)
    assert (enc.device, enc.amp, enc.providers) == ("cpu", False, ["CPUExecutionProvider"])
    assert mixed.key == plain.key
    np.testing.assert_array_equal(mixed.X, plain.X)


# --------------------------------------------------------------------------- training


def test_zoo_on_device_cpu_trains_the_same_weights(phantom, tmp_path: Path) -> None:
    from crslib.models.zoo import ZooModelSpec, train_zoo

    spec = ZooModelSpec.make("contrastive", epochs=1, batch_size=8)
    plain = train_zoo(phantom, specs=[spec], image_size=16, cache_root=tmp_path / "a", progress=False)
    on_cpu = train_zoo(phantom, specs=[spec], image_size=16, cache_root=tmp_path / "b", progress=False,
                       device="cpu")
    assert not plain.loc[0, "reused"] and not on_cpu.loc[0, "reused"]
    assert on_cpu.loc[0, "key"] == plain.loc[0, "key"]
    assert on_cpu.loc[0, "checkpoint_sha256"] == plain.loc[0, "checkpoint_sha256"]
    assert on_cpu.loc[0, "final_loss"] == plain.loc[0, "final_loss"]
    assert on_cpu.loc[0, "device"] == "cpu"


def test_zoo_with_cuda_requested_fails_before_training(phantom, tmp_path: Path) -> None:
    from crslib.models.zoo import ZooModelSpec, train_zoo

    with pytest.raises(InputError, match="torch sees no CUDA GPU"):
        train_zoo(phantom, specs=[ZooModelSpec.make("random_init")], image_size=16, cache_root=tmp_path,
                  progress=False, device="cuda")
    assert not (tmp_path / "models").exists()


def test_finetune_on_device_cpu_gives_the_same_probabilities_and_key(phantom, tmp_path: Path) -> None:
    from crslib.models.finetune import finetune_classifier

    spec = "timm:test_resnet?size=32"
    plain = finetune_classifier(phantom, spec, epochs=1, cache_root=tmp_path / "a", progress=False)
    on_cpu = finetune_classifier(phantom, spec, epochs=1, cache_root=tmp_path / "b", progress=False, device="cpu")
    assert not plain.attrs["cache_hit"] and not on_cpu.attrs["cache_hit"]
    assert on_cpu.attrs["key"] == plain.attrs["key"]
    np.testing.assert_array_equal(on_cpu["prob"].to_numpy(), plain["prob"].to_numpy())
    assert on_cpu.attrs["final_loss"] == plain.attrs["final_loss"]

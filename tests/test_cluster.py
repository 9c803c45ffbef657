"""Shard tasks on dask.distributed: a LocalCluster gives what the in-process
run gives, shards are shared through the cache, a killed worker costs nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import crslib  # noqa: F401  (before torch/timm)
import cloudpickle
import numpy as np
import pandas as pd
import pytest
import torch

from crslib.cluster import open_client, run_tasks
from crslib.embed import extract_embeddings
from crslib.models import Preprocessing, TorchEncoder, load_encoder
from crslib.errors import ConfigError, ImageReadError

# The encoders below are defined here, not in crslib: send them to the
# workers by value (the workers cannot import this test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SHARD = 16
SPEC = "timm:resnet18?seed=0&size=32"


@pytest.fixture(scope="module")
def client():
    with open_client("local:2") as c:
        yield c


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> pd.DataFrame:
    from crslib.data import load_data

    return load_data("phantom?patients=24&size=32&seed=3")


@pytest.fixture(scope="module")
def reference(manifest) -> np.ndarray:
    return extract_embeddings(manifest, load_encoder(SPEC), cache=False, shard_size=SHARD, progress=False).X


def _shard_files(root: Path) -> list[Path]:
    return sorted((root / "shards").glob("*/*.npy"))


def test_cluster_extraction_equals_in_process(client, manifest, reference, tmp_path) -> None:
    result = extract_embeddings(manifest, load_encoder(SPEC), shard_size=SHARD, cache_root=tmp_path,
                                scheduler=client)
    assert result.shards["computed"] == result.shards["total"] >= 3
    # bitwise: a shard is encoded from the same batches wherever it runs
    assert np.array_equal(result.X, reference)
    assert list(result.image_ids) == list(manifest["image_id"])
    # every shard was written by the workers into the shared cache
    assert len(_shard_files(tmp_path)) == result.shards["total"]
    again = extract_embeddings(manifest, load_encoder(SPEC), shard_size=SHARD, cache_root=tmp_path, progress=False)
    assert again.cache_hit and np.array_equal(again.X, reference)


def test_worker_count_counts_connected_workers(client) -> None:
    from types import SimpleNamespace

    from crslib.cluster import worker_count

    assert worker_count(None) == 1  # in-process
    assert worker_count(client) == 2  # the module's local:2 cluster (before any worker is killed)

    def stub(workers: dict) -> SimpleNamespace:
        return SimpleNamespace(scheduler_info=lambda: {"workers": workers})

    assert worker_count(stub({"tcp://a": {}, "tcp://b": {}, "tcp://c": {}})) == 3
    assert worker_count(stub({})) == 1  # none connected yet: still at least one
    assert worker_count(SimpleNamespace(scheduler_info=lambda: {})) == 1


def test_local_and_cluster_work_share_the_cache(client, manifest, reference, tmp_path) -> None:
    head = manifest.iloc[: 2 * SHARD]
    local = extract_embeddings(head, load_encoder(SPEC), shard_size=SHARD, cache_root=tmp_path, progress=False)
    assert local.shards["computed"] == 2
    mixed = extract_embeddings(manifest, load_encoder(SPEC), shard_size=SHARD, cache_root=tmp_path,
                               scheduler=client)
    assert mixed.shards["from_cache"] == 2 and mixed.shards["computed"] == mixed.shards["total"] - 2
    assert np.array_equal(mixed.X, reference)


class KillOnceEncoder(TorchEncoder):
    """Kills the worker process running it (SIGKILL) at its third batch, once
    per marker file: a worker lost mid-run."""

    def __init__(self, marker: Path):
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        super().__init__(module, name="kill-once", preprocessing=Preprocessing((1, 32, 32), (0.5,), (0.25,), "bilinear", 1))
        self.marker, self.calls, self.parent = str(marker), 0, os.getpid()

    def encode(self, batch) -> np.ndarray:
        self.calls += 1
        if os.getpid() != self.parent and self.calls >= 3 and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().encode(batch)


def test_a_worker_killed_mid_run_is_replaced_and_the_result_matches(client, manifest, tmp_path) -> None:
    marker = tmp_path / "killed"
    expected = extract_embeddings(manifest, KillOnceEncoder(marker), cache=False, shard_size=SHARD,
                                  batch_size=4, progress=False).X
    assert not marker.exists()  # never kills the test process itself
    workers_before = set(client.scheduler_info()["workers"])
    result = extract_embeddings(manifest, KillOnceEncoder(marker), shard_size=SHARD, batch_size=4,
                                cache_root=tmp_path / "cache", scheduler=client)
    assert marker.exists(), "no worker was killed; the test did not test anything"
    assert np.array_equal(result.X, expected)
    client.wait_for_workers(2, timeout=60)  # the nanny restarted the killed worker
    assert set(client.scheduler_info()["workers"]) != workers_before
    rerun = extract_embeddings(manifest, KillOnceEncoder(marker), shard_size=SHARD, batch_size=4,
                               cache_root=tmp_path / "cache", scheduler=client)
    assert rerun.cache_hit and np.array_equal(rerun.X, expected)


def test_a_task_error_reaches_the_caller_with_its_type(client, manifest, tmp_path) -> None:
    broken = manifest.copy()
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    broken.loc[broken.index[5], "path"] = str(bad)
    with pytest.raises(ImageReadError, match="broken.png"):
        extract_embeddings(broken, load_encoder(SPEC), shard_size=SHARD, cache_root=tmp_path, scheduler=client)
    skipped = extract_embeddings(broken, load_encoder(SPEC), shard_size=SHARD, cache_root=tmp_path / "c2",
                                 on_error="skip", scheduler=client)
    assert list(skipped.skipped["path"]) == [str(bad)] and len(skipped.X) == len(manifest) - 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_onnx_encoders_travel_to_workers(client, tmp_path) -> None:
    onnx_path = tmp_path / "tiny.onnx"
    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    torch.onnx.export(module, torch.zeros(1, 3, 16, 16), str(onnx_path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, dynamo=False)
    encoder = load_encoder(f"onnx:{onnx_path}")
    x = np.random.default_rng(0).random((2, 3, 16, 16), dtype=np.float32)
    (remote,) = run_tasks(client, _encode, [(x,)], shared={"encoder": encoder})
    assert np.array_equal(remote, encoder.encode(x))


def _encode(x, *, encoder):
    return encoder.encode(x)


def test_run_tasks_keeps_task_order_and_shares_equal_keys(client) -> None:
    values = run_tasks(client, divmod, [(7, 2), (9, 4), (7, 2)], keys=["a", "b", "a"])
    assert values == [(3, 1), (2, 1), (3, 1)]
    assert run_tasks(None, _power, [(2,), (3,)], shared={"exponent": 3}) == [8, 27]
    assert run_tasks(client, _power, [(2,), (3,)], shared={"exponent": 3}) == [8, 27]


def _power(x, *, exponent):
    return x**exponent


def test_bad_scheduler_arguments_are_clear_errors(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="positive number of workers"):
        with open_client("local:0"):
            pass
    monkeypatch.setattr("crslib.cluster.CONNECT_TIMEOUT_S", 2)
    with pytest.raises(ConfigError, match="no Dask scheduler answered at 'tcp://127.0.0.1:9'"):
        with open_client("tcp://127.0.0.1:9"):
            pass
    with pytest.raises(ConfigError, match="scheduler must be"):
        with open_client(3):
            pass


def test_a_local_cluster_does_not_claim_port_8787(recwarn) -> None:
    """A second local cluster, or anything else on the dashboard's usual port, gives no warning."""
    import socket

    held = socket.socket()
    try:
        held.bind(("", 8787))
        held.listen()
    except OSError:
        pass  # something else holds 8787 already: the case under test
    try:
        with open_client("local:1") as client:
            assert run_tasks(client, _power, [(3,)], shared={"exponent": 2}) == [9]
    finally:
        held.close()
    taken = [str(w.message) for w in recwarn if "already in use" in str(w.message)]
    assert taken == []


def test_crs_embed_with_a_scheduler_address_matches_in_process(client, manifest, reference, tmp_path) -> None:
    csv = tmp_path / "manifest.csv"
    manifest.to_csv(csv, index=False)
    env = dict(os.environ, CRS_CACHE_DIR=str(tmp_path / "cache"))
    crs = Path(sys.executable).parent / "crs"
    for name, extra in (("cluster", ["--scheduler", client.scheduler.address]), ("local", ["--no-cache"])):
        done = subprocess.run([str(crs), "embed", "--data", str(csv), "--model", SPEC, "--out",
                               str(tmp_path / f"{name}.npy"), *extra], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
    cluster, local = np.load(tmp_path / "cluster.npy"), np.load(tmp_path / "local.npy")
    # crs embed uses shards of 512: one shard here, so the same single batch run
    assert np.array_equal(cluster, local)
    assert np.allclose(local, reference, atol=1e-5)


def test_zoo_trained_on_a_cluster_is_the_zoo_trained_here(client, manifest, tmp_path) -> None:
    from crslib.models import ZooModelSpec, train_zoo

    specs = [ZooModelSpec.make("contrastive", epochs=1, batch_size=16),
             ZooModelSpec.make("supervised_multilabel", epochs=1, batch_size=16)]
    here = train_zoo(manifest, specs=specs, image_size=32, cache_root=tmp_path / "here", progress=False)
    there = train_zoo(manifest, specs=specs, image_size=32, cache_root=tmp_path / "there", scheduler=client)
    assert list(there["name"]) == list(here["name"])
    assert list(there["checkpoint_sha256"]) == list(here["checkpoint_sha256"])
    assert not there["reused"].any()
    reused = train_zoo(manifest, specs=specs, image_size=32, cache_root=tmp_path / "there", scheduler=client)
    assert reused["reused"].all()


def test_compare_on_a_cluster_equals_in_process(client) -> None:
    from crslib.compare import compare_embeddings

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 16)).astype(np.float32)
    Y = X @ rng.normal(size=(16, 12)).astype(np.float32) + 0.5 * rng.normal(size=(400, 12)).astype(np.float32)
    meta = pd.DataFrame({"patient_id": np.arange(400) // 2})
    R = rng.normal(size=(400, 8))
    here = compare_embeddings(X, Y, meta, X_reference=R, n_resamples=50)
    there = compare_embeddings(X, Y, meta, X_reference=R, n_resamples=50, scheduler=client)
    assert 0.05 < here.overlap < 1.0
    assert there.per_image == here.per_image and there.overlap == here.overlap
    assert there.reference_overlap == here.reference_overlap
    assert here.search["old"]["index"] == "exact" and here.overlap_error_bound == 0.0


def test_a_lone_worker_killed_mid_run_gets_the_shared_encoder_back(manifest, tmp_path) -> None:
    # The only worker holds the only copy of the encoder when it dies: the
    # replacement must rebuild it, not cancel every task that needs it.
    marker = tmp_path / "killed"
    expected = extract_embeddings(manifest, KillOnceEncoder(marker), cache=False, shard_size=SHARD,
                                  batch_size=4, progress=False).X
    with open_client("local:1") as lone:
        result = extract_embeddings(manifest, KillOnceEncoder(marker), shard_size=SHARD, batch_size=4,
                                    cache_root=tmp_path / "cache", scheduler=lone)
    assert marker.exists(), "no worker was killed; the test did not test anything"
    assert np.array_equal(result.X, expected)

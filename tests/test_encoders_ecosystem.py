"""hf: and open_clip: model specs: tiny models built from configs, saved to a temporary folder
(or a fake Hugging Face cache) and loaded through the spec; nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from crslib.errors import ModelError
from crslib.models import load_encoder
from crslib.models.specs import is_random_init, parse_spec, random_init_spec

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")

VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
              patch_size=8)
TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=99)
OC_CONFIG = {"embed_dim": 16,
             "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
             "text_cfg": {"context_length": 16, "vocab_size": 99, "width": 32, "heads": 2, "layers": 1}}
OC_PRE = {"mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3], "interpolation": "bilinear"}


def _save_hf(folder: Path, kind: str, seed: int = 5) -> None:  # seed 0 would equal init=random
    from transformers import (BitImageProcessor, CLIPConfig, CLIPImageProcessor, CLIPModel, Dinov2Config,
                              Dinov2Model, SiglipConfig, SiglipImageProcessor, SiglipModel, ViTConfig,
                              ViTImageProcessor, ViTModel)

    torch.manual_seed(seed)
    if kind == "vit":
        model, proc = ViTModel(ViTConfig(**VISION)), ViTImageProcessor(size={"height": 32, "width": 32})
    elif kind == "dinov2":
        model = Dinov2Model(Dinov2Config(**VISION))
        proc = BitImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32},
                                 do_center_crop=True, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    elif kind == "clip":
        model = CLIPModel(CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=16))
        proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    else:
        model = SiglipModel(SiglipConfig(text_config=TEXT, vision_config=VISION))
        proc = SiglipImageProcessor(size={"height": 32, "width": 32})
    model.save_pretrained(folder)
    proc.save_pretrained(folder)


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    for kind in ("vit", "dinov2", "clip", "siglip"):
        _save_hf(root / kind, kind)
    return {kind: root / kind for kind in ("vit", "dinov2", "clip", "siglip")}


def _save_open_clip(folder: Path, seed: int = 5) -> Path:  # seed 0 would equal the random init
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = open_clip.model.CLIP(OC_CONFIG["embed_dim"], OC_CONFIG["vision_cfg"], OC_CONFIG["text_cfg"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": OC_CONFIG, "preprocess_cfg": OC_PRE}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def oc_folder(tmp_path_factory) -> Path:
    return _save_open_clip(tmp_path_factory.mktemp("oc") / "tiny")


def _fake_hf_cache(cache: Path, repo: str, source: Path) -> None:
    """The layout huggingface_hub writes: models--ORG--NAME/{refs/main, snapshots/REV/FILES}."""
    base = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, base / "snapshots" / "0123abcd")
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("0123abcd")


def _batch(seed: int = 0, n: int = 3) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(size=(n, 3, 32, 32)).astype(np.float32))


def _reference(folder: Path, kind: str, pooling: str, x: torch.Tensor) -> np.ndarray:
    """What the transformers model itself returns for the pooling, loaded without crslib."""
    model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    with torch.inference_mode():
        if pooling == "image":
            out = model.get_image_features(pixel_values=x)
            return (out if isinstance(out, torch.Tensor) else out.pooler_output).numpy()
        tower = model.vision_model if kind in ("clip", "siglip") else model
        out = tower(pixel_values=x)
        if pooling == "pooler":
            return out.pooler_output.numpy()
        tokens = out.last_hidden_state
        if pooling == "cls":
            return tokens[:, 0].numpy()
        return tokens[:, 0 if kind == "siglip" else 1:].mean(1).numpy()


CASES = [("vit", "cls", 32), ("vit", "mean", 32), ("vit", "pooler", 32), ("dinov2", "cls", 32),
         ("dinov2", "mean", 32), ("clip", "image", 16), ("clip", "cls", 32), ("clip", "pooler", 32),
         ("siglip", "image", 32), ("siglip", "mean", 32)]


@pytest.mark.parametrize("kind,pooling,dim", CASES)
def test_hf_embeddings_equal_the_models_own_output(hf_models, kind: str, pooling: str, dim: int) -> None:
    enc = load_encoder(f"hf:{hf_models[kind]}?pooling={pooling}")
    x = _batch()
    got = enc.encode(x)
    assert enc.embedding_dim == dim and got.shape == (3, dim)
    np.testing.assert_allclose(got, _reference(hf_models[kind], kind, pooling, x), rtol=1e-5, atol=1e-5)
    assert enc.backend == "hf" and enc.name == f"hf:{hf_models[kind]}?pooling={pooling}"


@pytest.mark.parametrize("kind,default,dim", [("vit", "cls", 32), ("dinov2", "cls", 32), ("clip", "image", 16),
                                              ("siglip", "image", 32)])
def test_hf_default_pooling(hf_models, kind: str, default: str, dim: int) -> None:
    enc = load_encoder(f"hf:{hf_models[kind]}")
    assert enc.name == f"hf:{hf_models[kind]}?pooling={default}" and enc.embedding_dim == dim
    assert enc.fingerprint() == load_encoder(f"hf:{hf_models[kind]}?pooling={default}").fingerprint()


def test_hf_preprocessing_matches_the_image_processor(hf_models) -> None:
    """Mean, std and size come from the processor: an image at the model's size is normalised as the
    processor does it; a grayscale image is repeated to three channels; DINOv2's crop size is the input."""
    image = np.random.default_rng(1).integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    for kind in ("vit", "clip"):
        enc = load_encoder(f"hf:{hf_models[kind]}")
        proc = transformers.AutoImageProcessor.from_pretrained(str(hf_models[kind]), local_files_only=True)
        expected = proc(images=image, do_resize=False, do_center_crop=False, return_tensors="pt")["pixel_values"][0]
        np.testing.assert_allclose(enc.preprocess(image.astype(np.float32) / 255).numpy(), expected.numpy(),
                                   atol=1e-5)
    dino = load_encoder(f"hf:{hf_models['dinov2']}")
    assert dino.preprocessing.input_size == (3, 32, 32) and dino.preprocessing.interpolation == "bicubic"
    assert dino.preprocessing.mean == (0.485, 0.456, 0.406)
    gray = dino.preprocess(np.full((20, 20, 1), 0.5, dtype=np.float32)).numpy()
    np.testing.assert_allclose(gray[:, 0, 0], (0.5 - np.array([0.485, 0.456, 0.406])) / [0.229, 0.224, 0.225],
                               rtol=1e-5)


def test_hf_size_option_interpolates_positions(hf_models) -> None:
    enc = load_encoder(f"hf:{hf_models['vit']}?size=48")
    assert enc.preprocessing.input_size == (3, 48, 48)
    x = torch.zeros(2, 3, 48, 48)
    assert enc.encode(x).shape == (2, 32)
    assert enc.fingerprint() != load_encoder(f"hf:{hf_models['vit']}").fingerprint()


def test_hf_fingerprint_follows_the_weights_and_random_init(hf_models, tmp_path: Path) -> None:
    folder = tmp_path / "vit"
    shutil.copytree(hf_models["vit"], folder)
    first, again = load_encoder(f"hf:{folder}"), load_encoder(f"hf:{folder}")
    assert first.fingerprint() == again.fingerprint()
    x = _batch(2)
    before = first.encode(x)
    copy = pickle.loads(pickle.dumps(first))  # as a Dask worker receives it
    assert copy.fingerprint() == first.fingerprint()
    np.testing.assert_array_equal(copy.encode(x), before)
    _save_hf(folder, "vit", seed=1)  # same architecture, other weights
    changed = load_encoder(f"hf:{folder}")
    assert changed.fingerprint() != first.fingerprint()
    assert not np.allclose(changed.encode(x), before)

    ref = random_init_spec(f"hf:{folder}?pooling=mean&size=32")
    assert ref == f"hf:{folder}?init=random&pooling=mean&seed=0&size=32"
    assert is_random_init(ref) and not is_random_init(f"hf:{folder}")
    rand, rand_again = load_encoder(ref), load_encoder(ref)
    assert rand.fingerprint() == rand_again.fingerprint() != load_encoder(f"hf:{folder}?pooling=mean").fingerprint()
    np.testing.assert_array_equal(rand.encode(x), rand_again.encode(x))  # seeded
    assert not np.allclose(rand.encode(x), load_encoder(f"hf:{folder}?pooling=mean").encode(x))
    assert load_encoder(f"hf:{folder}?init=random&seed=1").fingerprint() != load_encoder(
        f"hf:{folder}?init=random").fingerprint()


def test_hf_repo_id_resolves_from_the_local_cache_only(hf_models, tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    _fake_hf_cache(cache, "someorg/tiny-vit", hf_models["vit"])
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    enc = load_encoder("hf:someorg/tiny-vit")
    assert enc.name == "hf:someorg/tiny-vit?pooling=cls"
    # content-addressed: the cached snapshot and the folder it came from are the same model
    assert enc.fingerprint() == load_encoder(f"hf:{hf_models['vit']}").fingerprint()
    with pytest.raises(ModelError) as err:
        load_encoder("hf:someorg/absent-model")
    message = str(err.value)
    assert "\n" not in message and f"not in the local Hugging Face cache {cache}" in message
    assert "hf download someorg/absent-model" in message


def test_hf_errors_are_one_clear_line(hf_models, tmp_path: Path) -> None:
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    naflex = tmp_path / "naflex"
    naflex.mkdir()
    (naflex / "config.json").write_text(json.dumps({"model_type": "siglip2"}))
    empty = tmp_path / "empty"
    shutil.copytree(hf_models["vit"], empty)
    (empty / "model.safetensors").unlink()
    cases = {
        f"hf:{tmp_path}/missing/folder": "does not exist",
        f"hf:{unknown}": "unknown or unreadable architecture",
        f"hf:{empty}": "holds no weights",
        f"hf:{naflex}": "use a fixed-resolution SigLIP 2 checkpoint such as google/siglip2-base-patch16-224",
        f"hf:{hf_models['siglip']}?pooling=cls": "siglip has no class token; use mean or pooler",
        f"hf:{hf_models['vit']}?pooling=image": "ViTModel has no image projection",
        f"hf:{hf_models['vit']}?pooling=max": "use one of cls, mean, pooler, image",
        f"hf:{hf_models['vit']}?init=zeros": "only init=random is supported",
        f"hf:{hf_models['vit']}?weights=x.bin": "unknown option 'weights'",
    }
    for spec, expected in cases.items():
        with pytest.raises(ModelError) as err:
            load_encoder(spec)
        assert expected in str(err.value) and "\n" not in str(err.value), spec


def test_hf_checkpoint_without_pooler_loads_quietly_for_cls(tmp_path: Path, capfd) -> None:
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    ViTModel(ViTConfig(**VISION), add_pooling_layer=False).save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    capfd.readouterr()
    assert load_encoder(f"hf:{tmp_path}").name == f"hf:{tmp_path}?pooling=cls"
    assert capfd.readouterr().err == ""  # no progress bar, no load report of transformers
    with pytest.raises(ModelError, match=r"the checkpoint has no pooler weights \(pooler.dense.bias, "
                                         r"pooler.dense.weight\); use cls or mean$"):
        load_encoder(f"hf:{tmp_path}?pooling=pooler")


def test_missing_package_is_a_model_error(monkeypatch, oc_folder: Path) -> None:
    monkeypatch.setitem(sys.modules, "open_clip", None)  # what an uninstalled package looks like to import
    with pytest.raises(ModelError, match=r"needs the 'open_clip' package .*pip install open-clip-torch"):
        load_encoder(f"open_clip:local-dir:{oc_folder}")


# --------------------------------------------------------------------------- OpenCLIP


def test_open_clip_local_dir_equals_encode_image(oc_folder: Path) -> None:
    enc = load_encoder(f"open_clip:local-dir:{oc_folder}")
    model = open_clip.create_model(f"local-dir:{oc_folder}", pretrained=None, load_weights=True).eval()
    x = _batch(3)
    with torch.inference_mode():
        expected = model.encode_image(x).numpy()
    assert enc.embedding_dim == 16 and enc.backend == "open_clip"
    np.testing.assert_allclose(enc.encode(x), expected, rtol=1e-5, atol=1e-5)
    pre = enc.preprocessing
    assert pre.input_size == (3, 32, 32) and pre.mean == (0.4, 0.5, 0.6) and pre.std == (0.2, 0.25, 0.3)
    assert pre.interpolation == "bilinear"
    assert enc.fingerprint() == load_encoder(f"open_clip:local-dir:{oc_folder}").fingerprint()


def test_open_clip_named_arch_weights_file_and_random_init(oc_folder: Path, tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "crs-tiny-clip.json").write_text(json.dumps(OC_CONFIG))
    open_clip.add_model_config(configs)
    weights = tmp_path / "w.safetensors"
    shutil.copy(oc_folder / "open_clip_model.safetensors", weights)
    spec = f"open_clip:crs-tiny-clip?weights={weights}"
    enc = load_encoder(spec)
    x = _batch(4)
    np.testing.assert_allclose(enc.encode(x), load_encoder(f"open_clip:local-dir:{oc_folder}").encode(x), atol=1e-6)
    assert enc.preprocessing.mean == tuple(open_clip.constants.OPENAI_DATASET_MEAN)  # no preprocess_cfg: OpenAI's

    _save_open_clip(tmp_path / "other", seed=1)
    shutil.copy(tmp_path / "other" / "open_clip_model.safetensors", weights)
    assert load_encoder(spec).fingerprint() != enc.fingerprint()

    ref = random_init_spec(spec)
    assert ref == "open_clip:crs-tiny-clip?seed=0" and is_random_init(ref) and not is_random_init(spec)
    rand = load_encoder(ref)
    assert rand.fingerprint() == load_encoder(ref).fingerprint() != enc.fingerprint()
    assert not np.allclose(rand.encode(x), enc.encode(x))
    assert load_encoder("open_clip:crs-tiny-clip?seed=1").fingerprint() != rand.fingerprint()
    hub_ref = random_init_spec("open_clip:hf-hub:org/x?pretrained=y")
    assert hub_ref == "open_clip:hf-hub:org/x?init=random&seed=0" and is_random_init(hub_ref)
    with pytest.raises(ModelError, match="does not fit OpenCLIP 'crs-tiny-clip' at size 48"):
        load_encoder(f"{spec}&size=48")


def test_open_clip_hf_hub_resolves_from_the_local_cache(oc_folder: Path, tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    _fake_hf_cache(cache, "someorg/tiny-openclip", oc_folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    enc = load_encoder("open_clip:hf-hub:someorg/tiny-openclip")
    x = _batch(5)
    np.testing.assert_allclose(enc.encode(x), load_encoder(f"open_clip:local-dir:{oc_folder}").encode(x), atol=1e-6)
    assert enc.name == "open_clip:hf-hub:someorg/tiny-openclip"
    rand = load_encoder("open_clip:hf-hub:someorg/tiny-openclip?init=random")
    assert rand.name == "open_clip:hf-hub:someorg/tiny-openclip?init=random&seed=0"
    assert not np.allclose(rand.encode(x), enc.encode(x))
    with pytest.raises(ModelError, match="'someorg/absent' .* is not in the local Hugging Face cache"):
        load_encoder("open_clip:hf-hub:someorg/absent")


def test_open_clip_timm_trunk_as_biomedclip_never_downloads(tmp_path: Path) -> None:
    """BiomedCLIP's image tower is a timm ViT inside OpenCLIP; its config asks timm for pretrained weights,
    which must come from the checkpoint instead (offline)."""
    from safetensors.torch import save_file

    vision = {"timm_model_name": "test_vit", "timm_model_pretrained": False, "timm_pool": "", "timm_proj": "linear",
              "image_size": 160}
    cfg = {"embed_dim": 16, "vision_cfg": vision, "text_cfg": OC_CONFIG["text_cfg"]}
    torch.manual_seed(3)
    model = open_clip.model.CLIP(cfg["embed_dim"], vision, cfg["text_cfg"]).eval()
    (tmp_path / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": dict(cfg, vision_cfg=dict(vision, timm_model_pretrained=True))}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "open_clip_model.safetensors"))
    enc = load_encoder(f"open_clip:local-dir:{tmp_path}")
    x = _batch(6, n=2).repeat(1, 1, 5, 5)  # 160 px
    with torch.inference_mode():
        expected = model.encode_image(x).numpy()
    assert enc.preprocessing.input_size == (3, 160, 160) and enc.embedding_dim == 16
    np.testing.assert_allclose(enc.encode(x), expected, rtol=1e-5, atol=1e-5)


def test_open_clip_errors_are_one_clear_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cases = {
        "open_clip:ViT-Q-99": "no OpenCLIP architecture named 'ViT-Q-99'",
        "open_clip:ViT-B-32?pretrained=openai": "is not in the local Hugging Face cache",
        "open_clip:ViT-B-32?pretrained=no_such_tag": "has no pretrained tag 'no_such_tag'",
        f"open_clip:ViT-B-32?weights={tmp_path}/absent.pt": "does not exist",
        f"open_clip:local-dir:{tmp_path}/nowhere": "has no open_clip_config.json",
        "open_clip:ViT-B-32?weights=a.pt&pretrained=openai": "gives both weights= and pretrained=",
    }
    for spec, expected in cases.items():
        with pytest.raises(ModelError) as err:
            load_encoder(spec)
        assert expected in str(err.value) and "\n" not in str(err.value), spec
    assert parse_spec("open_clip:hf-hub:org/repo?pretrained=x").target == "hf-hub:org/repo"


# --------------------------------------------------------------------------- the CLI


def test_crs_compare_accepts_hf_and_open_clip_specs(hf_models, oc_folder: Path, tmp_path: Path, capsys) -> None:
    from crslib.cli import main

    old, new = f"hf:{hf_models['dinov2']}", f"open_clip:local-dir:{oc_folder}"
    out = tmp_path / "report"
    status = main(["compare", "--old", old, "--new", new, "--data", "phantom?patients=12&size=32&seed=1",
                   "--resamples", "20", "--permutations", "0", "--out", str(out)])
    assert status == 0, capsys.readouterr().err
    report = json.loads((out / "compare.json").read_text())
    assert (report["old"], report["new"]) == (old, new)
    assert report["reference"] == f"open_clip:local-dir:{oc_folder}?init=random&seed=0"
    assert report["models"]["old"]["resolved"] == f"{old}?pooling=cls"
    assert report["models"]["new"]["weights_sha256"] == hashlib.sha256(
        (oc_folder / "open_clip_model.safetensors").read_bytes()).hexdigest()
    assert report["n_images"] >= 12 and 0.0 <= report["overlap"] <= 1.0
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")

    status = main(["compare", "--old", old, "--new", "hf:nobody/not-cached", "--data", "phantom?patients=12&size=32",
                   "--out", str(tmp_path / "failed")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err and "'nobody/not-cached'" in err and "hf download" in err

"""Tests of crslib.data: manifests, loaders, image reading."""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from crslib import data as D
from crslib.data import loaders, properties
from crslib.errors import DataError, ImageReadError, InputError

pydicom = pytest.importorskip("pydicom")
from pydicom.data import get_testdata_file  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))


def _dicom(name: str) -> str:
    path = get_testdata_file(name)
    if path is None:
        pytest.skip(f"pydicom test file {name} not available")
    return path


def _save_gray(path: Path, value: int, size=(12, 10), fmt=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.full((size[1], size[0]), value, dtype=np.uint8)
    Image.fromarray(arr).save(path, format=fmt)
    return path


# --------------------------------------------------------------------------- validate_manifest


def test_validate_missing_required_column_names_it_and_lists_columns():
    with pytest.raises(DataError, match=r"no 'path' column.*image_id"):
        D.validate_manifest(pd.DataFrame({"image_id": ["a"], "label": [1]}))
    with pytest.raises(DataError, match=r"no 'image_id' column"):
        D.validate_manifest(pd.DataFrame({"path": ["a.png"]}))


def test_validate_duplicate_image_id_is_named():
    df = pd.DataFrame({"image_id": ["a", "b", "a"], "path": ["1.png", "2.png", "3.png"]})
    with pytest.raises(DataError, match=r"image_id.*'a'.*row 0.*row 2"):
        D.validate_manifest(df)


def test_validate_nan_label_and_empty_path():
    df = pd.DataFrame({"image_id": ["a", "b"], "path": ["1.png", "2.png"], "label": [1.0, np.nan]})
    with pytest.raises(DataError, match=r"'label'.*row 1 \(image_id 'b'\)"):
        D.validate_manifest(df)
    df = pd.DataFrame({"image_id": ["a", "b"], "path": ["1.png", ""]})
    with pytest.raises(DataError, match=r"'path' is empty.*image_id 'b'"):
        D.validate_manifest(df)
    df = pd.DataFrame({"image_id": ["a", None], "path": ["1.png", "2.png"]})
    with pytest.raises(DataError, match=r"'image_id' is empty.*row 1"):
        D.validate_manifest(df)


def test_validate_finding_column_must_be_binary():
    df = pd.DataFrame({"image_id": ["a", "b"], "path": ["1.png", "2.png"], "finding_edema": [0, 2]})
    with pytest.raises(DataError, match=r"finding_edema.*0 or 1.*image_id 'b'"):
        D.validate_manifest(df)
    df["finding_edema"] = [0.0, 1.0]
    out = D.validate_manifest(df)
    assert out["finding_edema"].dtype == np.int64
    assert out["finding_edema"].tolist() == [0, 1]


def test_validate_fills_defaults_and_resolves_paths(tmp_path, caplog):
    df = pd.DataFrame({"image_id": ["a", "b"], "path": ["x/1.png", "/abs/2.png"], "age": [30.5, 41.0],
                       "split": ["Train", "TEST"]})
    with caplog.at_level(logging.INFO, logger="crslib.data"):
        out = D.validate_manifest(df, root=tmp_path)
    assert out.attrs["filled_columns"] == ["patient_id", "source", "view", "modality"]
    assert "patient_id" in caplog.text
    assert list(out.columns[:7]) == list(D.MANIFEST_COLUMNS)
    assert out["patient_id"].tolist() == ["a", "b"]
    assert out["split"].tolist() == ["train", "test"]
    assert set(out["source"]) == {"unknown"} and set(out["view"]) == {"unknown"}
    assert out["path"].tolist() == [str(tmp_path / "x" / "1.png"), "/abs/2.png"]
    assert out["age"].tolist() == [30.5, 41.0]
    assert out.attrs["root"] == str(tmp_path)
    assert "split" not in D.validate_manifest(pd.DataFrame(out)).attrs["filled_columns"]
    # the input is not modified
    assert "patient_id" not in df.columns


def test_check_files_lists_missing(tmp_path):
    _save_gray(tmp_path / "ok.png", 3)
    rows = {"image_id": [f"m{i}" for i in range(7)] + ["ok"],
            "path": [f"missing{i}.png" for i in range(7)] + ["ok.png"]}
    df = D.validate_manifest(pd.DataFrame(rows), root=tmp_path)
    with pytest.raises(DataError, match=r"7 of 8 .*missing0\.png.*and 2 more"):
        D.check_files(df)
    D.check_files(df.iloc[[-1]])


# --------------------------------------------------------------------------- read/write manifest


@pytest.mark.parametrize("name", ["manifest.csv", "manifest.parquet"])
def test_manifest_round_trip_after_moving_the_folder(tmp_path, name):
    folder = tmp_path / "ds"
    paths = [_save_gray(folder / "img" / f"{i}.png", 40 * i) for i in range(3)]
    df = pd.DataFrame({"image_id": ["NA", "b", "c"], "path": [str(p) for p in paths],
                       "patient_id": ["p1", "p1", "p2"], "label": [0, 1, 1], "age": [1.5, np.nan, 3.0]})
    D.write_manifest(df, folder / name)
    if name.endswith(".csv"):
        text = (folder / name).read_text()
        assert "img/0.png" in text and str(tmp_path) not in text
    moved = tmp_path / "elsewhere" / "copy"
    moved.parent.mkdir()
    shutil.move(str(folder), str(moved))
    back = D.read_manifest(moved / name)
    assert back["image_id"].tolist() == ["NA", "b", "c"]  # the string "NA" is not a missing value
    assert back["path"].tolist() == [str(moved / "img" / f"{i}.png") for i in range(3)]
    assert back["label"].tolist() == [0, 1, 1]
    assert np.isnan(back["age"].iloc[1])
    D.check_files(back)
    assert float(D.read_image(back["path"].iloc[2]).max()) == pytest.approx(80 / 255)


def test_read_manifest_errors(tmp_path):
    (tmp_path / "m.txt").write_text("x")
    with pytest.raises(DataError, match=r"\.csv or \.parquet"):
        D.read_manifest(tmp_path / "m.txt")
    (tmp_path / "m.csv").write_text("image_id,label\na,1\n")
    with pytest.raises(DataError, match=r"no 'path' column"):
        D.read_manifest(tmp_path / "m.csv")


# --------------------------------------------------------------------------- Kermany


@pytest.mark.parametrize(
    ("name", "split", "expected"),
    [
        ("person123_bacteria_4.jpeg", "train", "train/person123"),
        ("person1_virus_6.jpeg", "test", "test/person1"),
        ("IM-0115-0001.jpeg", "train", "train/IM-0115"),
        ("NORMAL2-IM-1427-0001.jpeg", "test", "test/IM-1427"),
        ("chest_xray/test/PNEUMONIA/person123_bacteria_4.jpeg", "TEST", "test/person123"),
        ("scan_7.png", "test", "test/scan_7"),
    ],
)
def test_kermany_patient_id(name, split, expected):
    assert D.kermany_patient_id(name, split) == expected


def test_kermany_patient_id_scopes_test_apart_from_the_training_pool():
    assert D.kermany_patient_id("person1_virus_6.jpeg", "train") != D.kermany_patient_id("person1_virus_6.jpeg", "test")
    # the official val split was carved from the training pool: same child, same id
    assert D.kermany_patient_id("person1_virus_7.jpeg", "val") == "train/person1"


def _kermany_fixture(root: Path) -> dict[str, tuple[str, str]]:
    """chest_xray/{train,val,test}/{NORMAL,PNEUMONIA} with Kermany-style names."""
    names = {
        ("train", "NORMAL"): ["IM-0115-0001.jpeg", "IM-0115-0002.jpeg", "NORMAL2-IM-1427-0001.jpeg"],
        ("train", "PNEUMONIA"): ["person1_virus_6.jpeg", "person1_bacteria_7.jpeg", "person22_bacteria_1.jpeg"],
        ("val", "NORMAL"): ["NORMAL2-IM-1430-0001.jpeg"],
        ("val", "PNEUMONIA"): ["person22_bacteria_9.jpeg"],
        ("test", "NORMAL"): ["IM-0001-0001.jpeg"],
        ("test", "PNEUMONIA"): ["person1_virus_1.jpeg", "person1_virus_2.jpeg"],
    }
    expected = {}
    for (split, cls), files in names.items():
        for i, name in enumerate(files):
            _save_gray(root / "chest_xray" / split / cls / name, 20 * i + 10, fmt="JPEG")
            expected[f"{split}/{cls}/{name[:-5]}"] = (split, cls)
    (root / "chest_xray" / "train" / "NORMAL" / ".DS_Store").write_bytes(b"\x00\x01")
    (root / "chest_xray" / "train" / "PNEUMONIA" / "notes.txt").write_text("not an image")
    (root / "README.txt").write_text("outside the split folders")
    return expected


def test_load_image_folder_kermany_layout(tmp_path):
    expected = _kermany_fixture(tmp_path)
    for root in (tmp_path, tmp_path / "chest_xray"):
        m = D.load_image_folder(root)
        assert len(m) == len(expected)
        assert m["path"].tolist() == sorted(m["path"])
        assert set(m["image_id"]) == set(expected)
        for row in m.itertuples():
            split, cls = expected[row.image_id]
            assert (row.split, row.label) == (split, cls)
        pid = dict(zip(m["image_id"], m["patient_id"]))
        assert pid["train/PNEUMONIA/person1_virus_6"] == "train/person1"
        assert pid["train/PNEUMONIA/person1_bacteria_7"] == "train/person1"
        assert pid["test/PNEUMONIA/person1_virus_1"] == "test/person1"
        assert pid["train/NORMAL/NORMAL2-IM-1427-0001"] == "train/IM-1427"
        assert pid["val/PNEUMONIA/person22_bacteria_9"] == pid["train/PNEUMONIA/person22_bacteria_1"]
        ignored = sorted(Path(p).name for p in m.attrs["ignored_files"])
        assert ignored == (["README.txt", "notes.txt"] if root == tmp_path else ["notes.txt"])
        assert m["label"].map(type).eq(str).all()
        D.check_files(m)


def test_load_image_folder_class_and_plain_layouts(tmp_path):
    _save_gray(tmp_path / "cls" / "cat" / "1.png", 1)
    _save_gray(tmp_path / "cls" / "dog" / "sub" / "2.png", 2)
    m = D.load_image_folder(tmp_path / "cls")
    assert m["label"].tolist() == ["cat", "dog"]
    assert m["split"].tolist() == ["unspecified", "unspecified"]
    assert m["image_id"].tolist() == ["cat/1", "dog/sub/2"]

    _save_gray(tmp_path / "plain" / "a.png", 1)
    _save_gray(tmp_path / "plain" / "a.jpg", 1, fmt="JPEG")
    _save_gray(tmp_path / "plain" / "deeper" / "b.tif", 1, fmt="TIFF")
    m = D.load_image_folder(tmp_path / "plain")
    assert "label" not in m.columns
    assert m["image_id"].tolist() == ["a.jpg", "a.png", "deeper/b"]
    assert m["patient_id"].tolist() == m["image_id"].tolist()

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.md").write_text("hi")
    with pytest.raises(DataError, match="no image files"):
        D.load_image_folder(tmp_path / "empty")


# --------------------------------------------------------------------------- MedMNIST


def _npz(path: Path, *, rgb: bool, n_labels: int, splits=("train", "val", "test"), seed=0) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {}
    for i, split in enumerate(splits):
        n = 3 + i
        shape = (n, 8, 9, 3) if rgb else (n, 8, 9)
        arrays[f"{split}_images"] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        high = 2 if n_labels > 1 else 5
        arrays[f"{split}_labels"] = rng.integers(0, high, size=(n, n_labels)).astype(np.uint8)
    np.savez(path, **arrays)
    return arrays


def test_load_medmnist_grayscale_single_label_and_reuse(tmp_path):
    arrays = _npz(tmp_path / "pneumoniamnist.npz", rgb=False, n_labels=1)
    m = D.load_medmnist(tmp_path / "pneumoniamnist.npz")
    assert len(m) == 3 + 4 + 5
    assert m["image_id"].iloc[0] == "train_000000"
    assert (m["patient_id"] == m["image_id"]).all()
    assert set(m["source"]) == {"pneumoniamnist"}
    assert m["label"].tolist()[:3] == arrays["train_labels"][:, 0].tolist()
    row = m[m["image_id"] == "val_000002"].iloc[0]
    assert row["split"] == "val"
    assert str(Path(row["path"]).parent.parent.parent).startswith(os.environ["CRS_CACHE_DIR"])
    pixels = np.asarray(Image.open(row["path"]))
    np.testing.assert_array_equal(pixels, arrays["val_images"][2])
    x = D.read_image(row["path"])
    assert x.shape == (8, 9, 1)
    np.testing.assert_allclose(x[..., 0] * 255, arrays["val_images"][2], atol=1e-3)

    # a second load reuses the files: an atomic rewrite would give a new inode, any write a new ctime
    def stamp(path):
        st = os.stat(path)
        return st.st_ino, st.st_mtime_ns, st.st_ctime_ns

    manifest_path = Path(m["path"].iloc[0]).parent.parent / "manifest.csv"
    stamps = {p: stamp(p) for p in [*m["path"], manifest_path]}
    again = D.load_medmnist(tmp_path / "pneumoniamnist.npz")
    pd.testing.assert_frame_equal(again, m)
    assert {p: stamp(p) for p in [*again["path"], manifest_path]} == stamps


def test_load_medmnist_rgb_multilabel(tmp_path):
    arrays = _npz(tmp_path / "chest.npz", rgb=True, n_labels=14, splits=("train", "test"))
    out = tmp_path / "out"
    m = D.load_medmnist(tmp_path / "chest.npz", out_dir=out)
    findings = [f"finding_{i}" for i in range(14)]
    assert [c for c in m.columns if c.startswith("finding_")] == findings
    assert "label" not in m.columns
    assert set(m["split"]) == {"train", "test"}
    np.testing.assert_array_equal(m.loc[m["split"] == "test", findings].to_numpy(), arrays["test_labels"])
    path = m.loc[m["image_id"] == "test_000001", "path"].iloc[0]
    assert Path(path).is_relative_to(out)
    np.testing.assert_array_equal(np.asarray(Image.open(path)), arrays["test_images"][1])
    assert D.read_image(path).shape == (8, 9, 3)


def test_load_medmnist_bad_inputs_name_the_key(tmp_path):
    np.savez(tmp_path / "nolabels.npz", train_images=np.zeros((2, 4, 4), np.uint8))
    with pytest.raises(DataError, match="'train_labels'"):
        D.load_medmnist(tmp_path / "nolabels.npz")
    np.savez(tmp_path / "shape.npz", train_images=np.zeros((2, 4), np.uint8), train_labels=np.zeros((2, 1)))
    with pytest.raises(DataError, match="'train_images'.*shape"):
        D.load_medmnist(tmp_path / "shape.npz")
    np.savez(tmp_path / "count.npz", test_images=np.zeros((2, 4, 4), np.uint8), test_labels=np.zeros((3, 1)))
    with pytest.raises(DataError, match="'test_labels'"):
        D.load_medmnist(tmp_path / "count.npz")
    np.savez(tmp_path / "volume.npz", train_images=np.zeros((2, 5, 5, 5), np.uint8), train_labels=np.zeros((2, 1)))
    with pytest.raises(DataError, match="'train_images'.*volumes"):
        D.load_medmnist(tmp_path / "volume.npz")
    np.savez(tmp_path / "range.npz", val_images=np.full((1, 4, 4), 300, np.int64), val_labels=np.zeros((1, 1)))
    with pytest.raises(DataError, match="'val_images'.*0-255"):
        D.load_medmnist(tmp_path / "range.npz")
    np.savez(tmp_path / "ok.npz", val_images=np.full((1, 4, 4, 1), 200, np.int64), val_labels=np.ones((1, 1)))
    ok = D.load_medmnist(tmp_path / "ok.npz")
    assert ok["label"].tolist() == [1] and ok["split"].tolist() == ["val"]
    assert D.read_image(ok["path"].iloc[0])[0, 0, 0] == pytest.approx(200 / 255)
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(DataError, match="text.npz"):
        D.load_medmnist(tmp_path / "text.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    os.replace(tmp_path / "single.npy", tmp_path / "single.npz")
    with pytest.raises(DataError, match="single array"):
        D.load_medmnist(tmp_path / "single.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(DataError, match="keys present.*'x'"):
        D.load_medmnist(tmp_path / "other.npz")


# --------------------------------------------------------------------------- DICOM


def test_read_dicom_grayscale_ct_and_mr():
    for name, shape in (("CT_small.dcm", (128, 128, 1)), ("MR_small.dcm", (64, 64, 1))):
        x = D.read_image(_dicom(name))
        assert x.shape == shape and x.dtype == np.float32
        assert x.min() == 0.0 and x.max() == 1.0
    # the rescaled CT follows the raw pixels monotonically
    raw = pydicom.dcmread(_dicom("CT_small.dcm")).pixel_array.astype(float)
    x = D.read_image(_dicom("CT_small.dcm"))[..., 0]
    assert np.corrcoef(raw.ravel(), x.ravel())[0, 1] > 0.99


def test_read_dicom_monochrome1_is_inverted(tmp_path):
    path = _dicom("RG1_UNCR.dcm")
    ds = pydicom.dcmread(path)
    assert ds.PhotometricInterpretation == "MONOCHROME1"
    raw = ds.pixel_array.astype(float)
    x = D.read_image(path)[..., 0]
    assert x.shape == raw.shape
    sample = np.random.default_rng(0).choice(raw.size, 20000, replace=False)
    assert np.corrcoef(raw.ravel()[sample], x.ravel()[sample])[0, 1] < -0.9
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.save_as(tmp_path / "mono2.dcm")
    y = D.read_image(tmp_path / "mono2.dcm")[..., 0]
    np.testing.assert_allclose(x, 1.0 - y, atol=1e-6)


def test_read_dicom_colour_and_multiframe():
    x = D.read_image(_dicom("SC_rgb.dcm"))
    assert x.shape == (100, 100, 3) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, 0], [1.0, 0.0, 0.0])
    y = D.read_image(_dicom("SC_ybr_full_uncompressed.dcm"))  # YBR_FULL -> RGB
    assert y.shape == (100, 100, 3)
    assert np.abs(x - y).max() < 0.05
    p = D.read_image(_dicom("OBXXXX1A.dcm"))  # palette colour
    assert p.shape[2] == 3 and 0.0 <= p.min() and p.max() <= 1.0
    frames = D.read_image(_dicom("emri_small.dcm"), frame="first")  # 10 frames -> the first
    assert frames.shape == (64, 64, 1)
    first = pydicom.dcmread(_dicom("emri_small.dcm")).pixel_array[0].astype(float)
    assert np.corrcoef(first.ravel(), frames.ravel())[0, 1] > 0.99


def test_read_dicom_pixels_match_pydicom_and_compressed_twins():
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    ds = pydicom.dcmread(_dicom("MR_small.dcm"))
    expected = np.asarray(apply_voi_lut(apply_modality_lut(ds.pixel_array, ds), ds), dtype=np.float64)
    expected = (expected - expected.min()) / (expected.max() - expected.min())
    x = D.read_image(_dicom("MR_small.dcm"))
    assert x.shape == (64, 64, 1) and x.dtype == np.float32
    np.testing.assert_allclose(x[..., 0], expected, atol=1e-6)
    # losslessly compressed copies of the same image decode to the same array
    for name in ("MR_small_RLE.dcm", "MR_small_jp2klossless.dcm"):
        np.testing.assert_array_equal(D.read_image(_dicom(name)), x, err_msg=name)
    # JPEG baseline (lossy, YBR_FULL) is the uncompressed RGB image up to JPEG error: red top-left
    jpeg = D.read_image(_dicom("SC_rgb_jpeg_dcmtk.dcm"))
    plain = D.read_image(_dicom("SC_rgb.dcm"))
    assert jpeg.shape == plain.shape == (100, 100, 3)
    assert np.abs(jpeg - plain).max() < 0.03
    np.testing.assert_allclose(jpeg[0, 0], [1.0, 0.0, 0.0], atol=0.01)


def test_read_dicom_failures_are_clean(tmp_path):
    with pytest.raises(ImageReadError, match="no pixel data"):
        D.read_image(_dicom("rtplan.dcm"))
    with pytest.raises(ImageReadError, match="MR_truncated.dcm"):
        D.read_image(_dicom("MR_truncated.dcm"))
    head = Path(_dicom("CT_small.dcm")).read_bytes()[:400]
    (tmp_path / "cut.dcm").write_bytes(head)
    with pytest.raises(ImageReadError, match="cut.dcm"):
        D.read_image(tmp_path / "cut.dcm")
    with pytest.raises(ImageReadError, match="max_pixels"):
        D.read_image(_dicom("CT_small.dcm"), max_pixels=1000)


def test_load_dicom_folder_reads_headers(tmp_path):
    folder = tmp_path / "dicoms"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(_dicom("CT_small.dcm"), folder / "ct.dcm")
    shutil.copy(_dicom("MR_small.dcm"), folder / "sub" / "mr.dcm")
    shutil.copy(_dicom("SC_rgb.dcm"), folder / "sub" / "IMG0001")  # no suffix: DICM magic
    (folder / "readme.txt").write_text("not dicom")
    m = D.load_dicom_folder(folder)
    assert m["image_id"].tolist() == ["ct", "sub/IMG0001", "sub/mr"]
    assert m["patient_id"].tolist() == ["1CT1", "ID1", "4MR1"]
    assert m["modality"].tolist() == ["CT", "OT", "MR"]
    ct = pydicom.dcmread(folder / "ct.dcm", stop_before_pixels=True)
    assert m["source"].iloc[0] == str(ct.Manufacturer)
    assert [Path(p).name for p in m.attrs["ignored_files"]] == ["readme.txt"]
    assert D.read_image(m["path"].iloc[1]).shape == (100, 100, 3)


# --------------------------------------------------------------------------- read_image: PIL formats


def test_read_16bit_png(tmp_path):
    arr = np.array([[0, 32768], [65535, 1000]], dtype=np.uint16)
    Image.fromarray(arr).save(tmp_path / "a.png")
    x = D.read_image(tmp_path / "a.png")
    assert x.shape == (2, 2, 1) and x.dtype == np.float32
    assert x.max() == 1.0 and x.min() == 0.0
    assert x[0, 1, 0] == pytest.approx(32768 / 65535)
    assert x[1, 1, 0] == pytest.approx(1000 / 65535)


def test_read_palette_rgba_la_and_gray(tmp_path):
    gray_palette = Image.fromarray(np.array([[0, 128], [255, 64]], np.uint8)).convert("P")
    gray_palette.save(tmp_path / "gp.png")
    assert Image.open(tmp_path / "gp.png").mode == "P"
    g = D.read_image(tmp_path / "gp.png")
    assert g.shape == (2, 2, 1)
    assert g[0, 1, 0] == pytest.approx(128 / 255, abs=2 / 255)

    colour = Image.fromarray(np.array([[[255, 0, 0], [0, 0, 255]]], np.uint8)).convert("P", palette=Image.ADAPTIVE)
    colour.save(tmp_path / "cp.png")
    c = D.read_image(tmp_path / "cp.png")
    assert c.shape == (1, 2, 3)
    np.testing.assert_allclose(c[0, 0], [1, 0, 0], atol=0.01)

    rgba = np.zeros((1, 2, 4), np.uint8)
    rgba[0, 0] = [200, 100, 50, 255]
    rgba[0, 1] = [200, 100, 50, 0]
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    r = D.read_image(tmp_path / "rgba.png")
    assert r.shape == (1, 2, 3)
    np.testing.assert_allclose(r[0, 0], [200 / 255, 100 / 255, 50 / 255], atol=1e-6)
    np.testing.assert_allclose(r[0, 1], [0, 0, 0])  # transparent: composited on black

    Image.fromarray(np.array([[[100, 255], [100, 0]]], np.uint8), "LA").save(tmp_path / "la.png")
    la = D.read_image(tmp_path / "la.png")
    assert la.shape == (1, 2, 1)
    np.testing.assert_allclose(la[0, :, 0], [100 / 255, 0.0], atol=1e-6)

    Image.fromarray(np.array([[True, False]])).save(tmp_path / "bit.png")
    assert D.read_image(tmp_path / "bit.png")[0, :, 0].tolist() == [1.0, 0.0]


def test_read_cmyk_jpeg_gives_three_channels(tmp_path):
    Image.new("CMYK", (6, 4), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg", quality=95)
    assert Image.open(tmp_path / "cmyk.jpg").mode == "CMYK"
    x = D.read_image(tmp_path / "cmyk.jpg")
    assert x.shape == (4, 6, 3)
    assert x[..., 0].mean() > 0.8 and x[..., 1].mean() < 0.2  # red


def test_read_int32_and_float_tiffs(tmp_path):
    Image.fromarray(np.array([[0, 100], [200, 400]], np.int32), "I").save(tmp_path / "i.tif")
    x = D.read_image(tmp_path / "i.tif")
    assert x.shape == (2, 2, 1) and x.min() >= 0 and x.max() <= 1
    assert x[0, 1, 0] < x[1, 0, 0] < x[1, 1, 0]
    Image.fromarray(np.array([[-5.0, 5.0]], np.float32), "F").save(tmp_path / "f.tif")
    assert D.read_image(tmp_path / "f.tif")[0, :, 0].tolist() == [0.0, 1.0]
    Image.fromarray(np.array([[np.nan, 5.0]], np.float32), "F").save(tmp_path / "nan.tif")
    with pytest.raises(ImageReadError, match="NaN"):
        D.read_image(tmp_path / "nan.tif")


def test_read_applies_exif_orientation(tmp_path):
    arr = np.zeros((20, 40, 3), np.uint8)
    arr[:, :20] = 255  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(arr).save(tmp_path / "rot.jpg", exif=exif, quality=95)
    x = D.read_image(tmp_path / "rot.jpg")
    assert x.shape == (40, 20, 3)
    assert x[:20].mean() > 0.9 and x[20:].mean() < 0.1  # rotated 90 degrees clockwise: left becomes top


def test_read_image_failures(tmp_path):
    (tmp_path / "zero.png").write_bytes(b"")
    with pytest.raises(ImageReadError, match=r"empty file \(0 bytes\)") as info:
        D.read_image(tmp_path / "zero.png")
    assert info.value.path == str(tmp_path / "zero.png")

    _save_gray(tmp_path / "full.jpg", 0, size=(64, 64), fmt="JPEG")
    noisy = np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)
    Image.fromarray(noisy).save(tmp_path / "full.jpg", quality=95)
    data = (tmp_path / "full.jpg").read_bytes()
    (tmp_path / "half.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageReadError, match="truncated"):
        D.read_image(tmp_path / "half.jpg")

    buf = io.BytesIO()
    Image.fromarray(noisy).save(buf, format="PNG")
    (tmp_path / "half.png").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ImageReadError, match="half.png"):
        D.read_image(tmp_path / "half.png")

    (tmp_path / "text.png").write_text("hello, I am not a PNG\n")
    with pytest.raises(ImageReadError, match="not an image"):
        D.read_image(tmp_path / "text.png")

    with pytest.raises(ImageReadError, match="no such file"):
        D.read_image(tmp_path / "absent.png")


def test_read_image_pixel_limit(tmp_path):
    _save_gray(tmp_path / "small.png", 7, size=(100, 100))
    with pytest.raises(ImageReadError, match="max_pixels=5000"):
        D.read_image(tmp_path / "small.png", max_pixels=5000)
    with pytest.raises(ImageReadError, match="max_pixels"):  # > 2x the limit: Pillow's own error
        D.read_image(tmp_path / "small.png", max_pixels=1000)
    assert D.read_image(tmp_path / "small.png", max_pixels=10_000).shape == (100, 100, 1)
    before = Image.MAX_IMAGE_PIXELS
    D.read_image(tmp_path / "small.png", max_pixels=10_000)
    assert Image.MAX_IMAGE_PIXELS == before  # the global is restored


def test_read_large_image_beyond_pillow_default_limit(tmp_path):
    # 10,000 x 10,000 = 1e8 pixels: above Pillow's warning limit (~8.9e7), below ours (2e8)
    Image.new("1", (10_000, 10_000)).save(tmp_path / "big.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ImageReadError, match="100000000 pixels.*max_pixels|max_pixels=50000000"):
            D.read_image(tmp_path / "big.png", max_pixels=50_000_000)
        x = D.read_image(tmp_path / "big.png")
    assert x.shape == (10_000, 10_000, 1) and x.dtype == np.float32


def test_read_images_skip_lists_every_failure(tmp_path):
    good = _save_gray(tmp_path / "good.png", 9)
    (tmp_path / "zero.png").write_bytes(b"")
    (tmp_path / "text.png").write_text("nope")
    paths = [good, tmp_path / "zero.png", tmp_path / "text.png", tmp_path / "absent.png"]
    images, skipped = D.read_images(paths, on_error="skip")
    assert images[0] is not None and images[0].shape == (10, 12, 1)
    assert images[1:] == [None, None, None]
    assert list(skipped.columns) == ["path", "reason"]
    assert skipped["path"].tolist() == [str(p) for p in paths[1:]]
    assert skipped["reason"].str.len().gt(0).all()
    with pytest.raises(ImageReadError, match="zero.png"):
        D.read_images(paths, on_error="raise")
    with pytest.raises(InputError, match="on_error"):
        D.read_images(paths, on_error="ignore")
    images, skipped = D.read_images([good])
    assert len(skipped) == 0 and list(skipped.columns) == ["path", "reason"]


# --------------------------------------------------------------------------- load_data


def test_load_data_dispatch(tmp_path):
    ds = tmp_path / "ds"
    paths = [_save_gray(ds / f"{i}.png", i) for i in range(3)]
    df = pd.DataFrame({"image_id": list("abc"), "path": [str(p) for p in paths], "label": [0, 1, 0]})
    D.write_manifest(df, ds / "manifest.csv")
    D.write_manifest(df, tmp_path / "m.parquet")
    for source in (ds / "manifest.csv", tmp_path / "m.parquet", ds, str(ds)):
        m = D.load_data(source)
        assert m["image_id"].tolist() == list("abc") and m["label"].tolist() == [0, 1, 0]

    _npz(tmp_path / "x.npz", rgb=False, n_labels=1)
    assert D.load_data(tmp_path / "x.npz")["image_id"].iloc[0] == "train_000000"

    _kermany_fixture(tmp_path / "kermany")
    m = D.load_data(tmp_path / "kermany")
    assert set(m["label"]) == {"NORMAL", "PNEUMONIA"} and set(m["split"]) == {"train", "val", "test"}

    dicoms = tmp_path / "dicoms"
    dicoms.mkdir()
    shutil.copy(_dicom("CT_small.dcm"), dicoms / "a.dcm")
    shutil.copy(_dicom("MR_small.dcm"), dicoms / "b")
    (dicoms / "notes.txt").write_text("x")
    m = D.load_data(dicoms)
    assert m["modality"].tolist() == ["CT", "MR"]

    plain = tmp_path / "plain"
    _save_gray(plain / "x.png", 1)
    shutil.copy(_dicom("CT_small.dcm"), plain / "y.dcm")
    m = D.load_data(plain)
    assert m["image_id"].tolist() == ["x", "y"] and set(m["modality"]) == {"unknown"}

    with pytest.raises(DataError, match=r"no such file or folder: .*nowhere.*'phantom\?\.\.\.'"):
        D.load_data(tmp_path / "nowhere")
    with pytest.raises(DataError, match="pass its folder"):
        D.load_data(paths[0])


def test_phantom_spec_parsing():
    assert loaders._parse_phantom("phantom") == D.PHANTOM_DEFAULTS
    params = loaders._parse_phantom("phantom?patients=200&size=64&seed=3&shortcut=0.8&shift=0.5&kermany=1")
    assert params == {"patients": 200, "size": 64, "seed": 3, "shortcut": 0.8, "shift": 0.5, "kermany": True}
    with pytest.raises(DataError, match=r"unknown key 'colour'.*valid keys: patients, size, seed"):
        D.load_data("phantom?colour=red")
    with pytest.raises(DataError, match="patients='many'"):
        D.load_data("phantom?patients=many")
    with pytest.raises(DataError, match="twice"):
        D.load_data("phantom?seed=1&seed=2")


@pytest.mark.skipif(importlib.util.find_spec("crslib.data.phantom") is None, reason="crslib.data.phantom not written yet")
def test_load_data_phantom_generates_once(tmp_path):
    m = D.load_data("phantom?patients=20&size=32")
    D.check_files(m)
    assert len(m) >= 20 and m["patient_id"].nunique() == 20
    folder = Path(m.attrs["root"])
    assert folder.is_relative_to(Path(os.environ["CRS_CACHE_DIR"]) / "phantom")
    mtimes = {p: os.stat(p).st_mtime_ns for p in m["path"]}
    again = D.load_data("phantom?size=32&patients=20")
    assert again["image_id"].tolist() == m["image_id"].tolist()
    assert {p: os.stat(p).st_mtime_ns for p in again["path"]} == mtimes
    x = D.read_image(m["path"].iloc[0])
    assert x.ndim == 3 and x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0

    k = D.load_data("phantom?patients=20&size=32&kermany=1")
    assert set(k["split"]) == {"train", "val", "test"}
    assert k["label"].nunique() == 2
    assert Path(k.attrs["root"]) != folder
    folder_view = D.load_image_folder(Path(k.attrs["root"]) / "chest_xray")
    assert len(folder_view) == len(k) and set(folder_view["label"]) == {"NORMAL", "PNEUMONIA"}


# --------------------------------------------------------------------------- summaries for notebooks


def test_summarize_manifest_and_select_examples():
    m = pd.DataFrame({
        "image_id": list("abcdef"), "path": [f"{c}.png" for c in "abcdef"],
        "patient_id": ["p1", "p1", "p2", "p3", "p4", "p4"],
        "split": ["train"] * 4 + ["test"] * 2, "view": ["PA", "AP", "PA", "PA", "AP", "PA"],
        "label": [0, 1, 1, 0, 1, 1], "finding_edema": [0, 1, 0, 0, 1, 1], "finding_nodule": [0, 0, 0, 0, 0, 1],
    })
    s = D.summarize_manifest(m)
    assert s.index.tolist() == ["test", "train", "all"]
    assert s.loc["all", "images"] == 6 and s.loc["train", "patients"] == 3
    assert s.loc["test", "label=1"] == 2 and s.loc["train", "label=0"] == 2
    assert s.loc["all", "finding_edema"] == pytest.approx(0.5)

    ex = D.select_examples(m, by="view", n_per_group=2, random_state=1)
    assert ex["group"].tolist() == ["AP", "AP", "PA", "PA"]
    assert (ex["view"] == ex["group"]).all()
    pd.testing.assert_frame_equal(ex, D.select_examples(m, by="view", n_per_group=2, random_state=1))
    pos = D.select_examples(m, by=["finding_edema", "finding_nodule"], n_per_group=5)
    assert pos.groupby("group").size().to_dict() == {"finding_edema": 3, "finding_nodule": 1}
    assert (pos.loc[pos["group"] == "finding_nodule", "image_id"] == "f").all()
    with pytest.raises(DataError, match="'site'"):
        D.select_examples(m, by="site")


# --------------------------------------------------------------------------- file_properties


@pytest.mark.parametrize("kermany", [False, True])
def test_file_properties_recover_the_phantom_encodings(tmp_path, kermany):
    from crslib.data.phantom import generate_phantom

    m = generate_phantom(tmp_path, n_patients=60, image_size=32, random_state=2, shortcut_strength=0.5,
                         kermany_layout=kermany)
    m.index = m.index + 100  # the result keeps the manifest's index
    props = D.file_properties(m)
    lat = pd.read_csv(tmp_path / "latents.csv")
    assert list(props.columns) == list(D.FILE_PROPERTY_COLUMNS)
    assert props.index.equals(m.index) and props["image_id"].tolist() == m["image_id"].tolist()
    assert props["readable"].all()
    assert props["width"].tolist() == lat["file_width"].astype(float).tolist()
    assert props["height"].tolist() == lat["file_height"].astype(float).tolist()
    assert props["file_size"].tolist() == lat["file_bytes"].astype(float).tolist()
    assert np.allclose(props["bytes_per_pixel"], props["file_size"] / (props["width"] * props["height"]))
    expected_format = lat["file_format"].map({"png8": "PNG", "png16": "PNG", "jpeg": "JPEG"})
    assert props["format"].tolist() == expected_format.tolist()
    jpeg = (lat["file_format"] == "jpeg").to_numpy()
    # every phantom JPEG is written by Pillow's libjpeg, so the estimate is exact
    assert (props.loc[jpeg, "jpeg_quality"].to_numpy() == lat.loc[jpeg, "jpeg_quality"].to_numpy()).all()
    assert props.loc[~jpeg, "jpeg_quality"].isna().all()
    assert props.loc[jpeg, "jpeg_progressive"].tolist() == lat.loc[jpeg, "jpeg_progressive"].astype(bool).tolist()
    rgb = jpeg & (lat["color_mode"] == "RGB").to_numpy()
    names = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}
    assert props.loc[rgb, "jpeg_subsampling"].tolist() == lat.loc[rgb, "jpeg_subsampling"].map(names).tolist()
    assert props.loc[jpeg & ~rgb, "jpeg_subsampling"].isna().all()
    assert props.loc[jpeg, "mode"].tolist() == lat.loc[jpeg, "color_mode"].tolist()
    assert props.loc[jpeg, "n_channels"].tolist() == lat.loc[jpeg, "color_mode"].map({"L": 1.0, "RGB": 3.0}).tolist()
    assert props.loc[jpeg, "has_comment"].tolist() == [bool(e) for e in lat.loc[jpeg, "encoding"].map(
        lambda name: name in ("site2", "site3") if kermany else name == "site3")]
    if not kermany:
        png16 = (lat["file_format"] == "png16").to_numpy()
        png8 = (lat["file_format"] == "png8").to_numpy()
        assert (props.loc[png16, "bit_depth"] == 16).all() and (props.loc[png8, "bit_depth"] == 8).all()
        site0 = (lat["encoding"] == "site0").to_numpy()  # tEXt chunks Software and Source
        assert (props.loc[site0, "png_chunks"] == "tEXt").all()
        assert (props.loc[site0, "png_text_keys"] == "Software|Source").all()
        site1 = (lat["encoding"] == "site1").to_numpy()  # pHYs at 150 dpi
        assert props.loc[site1, "has_dpi"].all() and (props.loc[site1, "png_chunks"] == "pHYs").all()
        assert props.loc[jpeg, "png_chunks"].isna().all()
        site2 = (lat["encoding"] == "site2").to_numpy()
        assert props.loc[site2, "has_exif"].all() and not props.loc[site2, "has_dpi"].any()
    assert props["dicom_modality"].isna().all()


def test_file_properties_of_dicom_files():
    ct, mr = _dicom("CT_small.dcm"), _dicom("MR_small.dcm")
    props = D.file_properties(pd.DataFrame({"image_id": ["ct", "mr"], "path": [ct, mr]}))
    assert props["format"].tolist() == ["DICOM", "DICOM"]
    assert props["dicom_modality"].tolist() == ["CT", "MR"]
    assert props["width"].tolist() == [128.0, 64.0] and props["dicom_rows"].tolist() == [128.0, 64.0]
    assert props["bit_depth"].tolist() == [16.0, 16.0] and props["dicom_bits_allocated"].tolist() == [16.0, 16.0]
    assert props["dicom_photometric_interpretation"].tolist() == ["MONOCHROME2", "MONOCHROME2"]
    assert props["dicom_transfer_syntax"].tolist() == ["1.2.840.10008.1.2.1"] * 2
    assert props.loc[0, "dicom_manufacturer"] == "GE MEDICAL SYSTEMS"
    assert props.loc[0, "dicom_pixel_spacing_row"] == pytest.approx(0.661468)
    assert props["file_size"].tolist() == [float(os.path.getsize(ct)), float(os.path.getsize(mr))]
    assert props["jpeg_quality"].isna().all() and props["png_chunks"].isna().all()
    assert props["mode"].isna().all()


def test_file_properties_of_compressed_and_color_dicom():
    j2k, rgb = _dicom("JPEG2000.dcm"), _dicom("SC_rgb.dcm")
    props = D.file_properties(pd.DataFrame({"path": [j2k, rgb]}))
    assert props["dicom_transfer_syntax"].tolist() == ["1.2.840.10008.1.2.4.91", "1.2.840.10008.1.2.1"]
    assert props["n_channels"].tolist() == [1.0, 3.0]
    assert props["image_id"].tolist() == ["JPEG2000", "SC_rgb"]  # file stems without an image_id column


def test_file_properties_of_unusual_files(tmp_path):
    gray = (np.random.default_rng(0).random((30, 40)) * 255).astype(np.uint8)
    Image.fromarray(gray).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=60)
    Image.fromarray(gray.astype(np.uint16) * 257).save(tmp_path / "g16.png")
    Image.fromarray(gray).convert("P").save(tmp_path / "pal.png", dpi=(72, 72))
    Image.fromarray(gray).convert("RGB").save(tmp_path / "q35.jpg", quality=35, subsampling=1, progressive=True,
                                               comment="scanner 4", dpi=(300, 300))
    Image.fromarray(gray).save(tmp_path / "a.tif")
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Comment", "hello")
    info.add_itxt("Author", "me", zip=True)
    Image.fromarray(gray).save(tmp_path / "text.png", pnginfo=info)
    names = ["cmyk.jpg", "g16.png", "pal.png", "q35.jpg", "a.tif", "text.png"]
    props = D.file_properties(pd.DataFrame({"image_id": names, "path": [str(tmp_path / n) for n in names]}))
    p = props.set_index("image_id")
    assert p.loc["cmyk.jpg", "mode"] == "CMYK" and p.loc["cmyk.jpg", "n_channels"] == 4
    assert p.loc["cmyk.jpg", "jpeg_quality"] == 60 and pd.isna(p.loc["cmyk.jpg", "jpeg_subsampling"])
    assert p.loc["g16.png", "bit_depth"] == 16 and p.loc["g16.png", "mode"].startswith("I")
    assert p.loc["g16.png", "png_chunks"] == ""
    assert p.loc["pal.png", "mode"] == "P" and p.loc["pal.png", "bit_depth"] == 8
    assert p.loc["pal.png", "png_chunks"] == "pHYs" and p.loc["pal.png", "has_dpi"]
    assert p.loc["q35.jpg", "jpeg_quality"] == 35 and p.loc["q35.jpg", "jpeg_subsampling"] == "4:2:2"
    assert p.loc["q35.jpg", "jpeg_progressive"] and p.loc["q35.jpg", "has_comment"] and p.loc["q35.jpg", "has_dpi"]
    assert p.loc["a.tif", "format"] == "TIFF" and p.loc["a.tif", "bit_depth"] == 8
    assert p.loc["text.png", "png_chunks"] == "iTXt|tEXt"
    assert p.loc["text.png", "png_text_keys"] == "Author|Comment" and p.loc["text.png", "has_comment"]
    assert p["aspect"].tolist() == [pytest.approx(40 / 30)] * len(names)
    assert not p.loc[["g16.png", "pal.png", "a.tif"], "has_comment"].any()


def test_jpeg_quality_estimate_is_exact_for_libjpeg_tables():
    rng = np.random.default_rng(1)
    gray = (rng.random((16, 16)) * 255).astype(np.uint8)
    for quality in (1, 10, 49, 50, 51, 75, 90, 99, 100):
        buffer = io.BytesIO()
        Image.fromarray(gray).save(buffer, format="JPEG", quality=quality)
        buffer.seek(0)
        assert properties._jpeg_quality(Image.open(buffer).quantization[0]) == quality
    assert np.isnan(properties._jpeg_quality([1, 2, 3]))


def test_file_properties_unreadable_files(tmp_path):
    good = _save_gray(tmp_path / "good.png", 100)
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    (tmp_path / "empty.png").write_bytes(b"")
    plan = _dicom("rtplan.dcm")
    paths = [str(good), str(tmp_path / "bad.png"), str(tmp_path / "empty.png"), str(tmp_path / "gone.png"), plan]
    m = pd.DataFrame({"image_id": ["good", "bad", "empty", "gone", "plan"], "path": paths})
    with pytest.raises(ImageReadError, match=r"bad\.png.*not an image"):
        D.file_properties(m)
    with pytest.raises(ImageReadError, match=r"rtplan\.dcm.*no image"):
        D.file_properties(m.iloc[[0, 4]])
    props = D.file_properties(m, on_error="skip")
    assert props["readable"].tolist() == [True, False, False, False, False]
    assert props.loc[1:, ["file_size", "width", "format", "jpeg_quality"]].isna().all().all()
    assert props["image_id"].tolist() == m["image_id"].tolist()
    skipped = props.attrs["skipped"]
    assert skipped["path"].tolist() == paths[1:]
    assert skipped["reason"].str.contains("empty file").any() and skipped["reason"].str.contains("no such file").any()


def test_file_properties_bad_arguments():
    with pytest.raises(DataError, match="no 'path' column"):
        D.file_properties(pd.DataFrame({"image_id": ["a"]}))
    with pytest.raises(InputError, match="on_error"):
        D.file_properties(pd.DataFrame({"path": ["a.png"]}), on_error="ignore")
    with pytest.raises(DataError, match="DataFrame"):
        D.file_properties(["a.png"])


def test_file_properties_reads_headers_only(tmp_path):
    # what makes it fast: no pixel data is decoded, so Pillow is never asked for a decoder,
    # and a JPEG whose pixel data is cut off still gives its header properties
    from unittest import mock

    from crslib.data.phantom import encode_image, site_signatures

    rng = np.random.default_rng(0)
    paths = []
    for j, site in enumerate(site_signatures(4)):
        for k in range(5):
            path = tmp_path / f"s{j}_{k}.{site.encoding.suffix}"
            path.write_bytes(encode_image(rng.random((48, 48)), site.encoding))
            paths.append(str(path))
    cut = next(Path(p) for p in paths if p.endswith(".jpg"))
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size * 3 // 4])
    with mock.patch.object(Image, "_getdecoder", wraps=Image._getdecoder) as decoders:
        props = D.file_properties(pd.DataFrame({"path": paths}))
        assert decoders.call_count == 0
        with Image.open(paths[0]) as im:  # the spy does see a decode
            im.load()
        assert decoders.call_count == 1
    assert len(props) == 20 and props["readable"].all()
    assert props.loc[paths.index(str(cut)), "width"] == 48

"""DICOM as users have it: every standard transfer syntax decodes offline, the
VOI window and MONOCHROME1 as the file says, multi-frame files by a chosen
rule, and an undecodable file as one line naming it (issue 19, item 1).

The files are pydicom's and pydicom-data's own test files, found in their
installed folders (never downloaded). Lossless twins must decode to exactly
the same array as the uncompressed file; lossy ones within the codec's error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crslib.data import read_image, read_images
from crslib.data.images import DEFAULT_FRAME, FRAME_RULES
from crslib.errors import ImageReadError, InputError

pydicom = pytest.importorskip("pydicom")

from realdata import dicom_test_files, write_dicom_folder  # noqa: E402  (tests/realdata.py)


ALL_TEST_DICOMS = [source for source, _ in dicom_test_files()]


def _dicom(name: str) -> Path:
    found = [p for p in ALL_TEST_DICOMS if p.name == name]
    if not found:
        pytest.skip(f"pydicom test file {name} not installed")
    return found[0]


def _unit(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.float64)
    return (values - values.min()) / (values.max() - values.min())


def _syntax(name: str) -> str:
    return str(pydicom.dcmread(_dicom(name), stop_before_pixels=True).file_meta.TransferSyntaxUID)


# --------------------------------------------------------------------------- transfer syntaxes

# (compressed file, its transfer syntax, uncompressed twin, largest allowed absolute difference in [0, 1])
TWINS = [
    ("emri_small_RLE.dcm", "1.2.840.10008.1.2.5", "emri_small.dcm", 0.0),                 # RLE lossless
    ("SC_rgb_dcmtk_+eb+cr.dcm", "1.2.840.10008.1.2.4.50", "SC_rgb.dcm", 1 / 255 + 1e-6),  # JPEG baseline
    ("SC_rgb_jpeg_gdcm.dcm", "1.2.840.10008.1.2.4.70", "SC_rgb.dcm", 0.0),                # JPEG lossless SV1
    ("MR_small_jpeg_ls_lossless.dcm", "1.2.840.10008.1.2.4.80", "MR_small.dcm", 0.0),     # JPEG-LS lossless
    ("SC_rgb_jls_lossy_line.dcm", "1.2.840.10008.1.2.4.81", "SC_rgb.dcm", 2 / 255 + 1e-6),  # JPEG-LS near-lossless
    ("emri_small_jpeg_2k_lossless.dcm", "1.2.840.10008.1.2.4.90", "emri_small.dcm", 0.0),  # JPEG 2000 lossless
    ("MR2_J2KI.dcm", "1.2.840.10008.1.2.4.91", "MR2_UNCI.dcm", 0.0),                      # JPEG 2000 (as stored)
]


@pytest.mark.parametrize("compressed, uid, plain, tolerance", TWINS, ids=[t[0] for t in TWINS])
def test_each_transfer_syntax_decodes_to_its_uncompressed_twin(compressed, uid, plain, tolerance):
    assert _syntax(compressed) == uid
    assert _syntax(plain) in ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1")
    # frame="all" reads every frame of the multi-frame twins, not only one
    x = read_image(_dicom(compressed), frame="all")
    y = read_image(_dicom(plain), frame="all")
    assert x.shape == y.shape and x.dtype == np.float32
    if tolerance == 0.0:
        np.testing.assert_array_equal(x, y)
    else:
        assert 0 < np.abs(x - y).max() <= tolerance


def test_jpeg_extended_12_bit_matches_the_lossless_copy_of_the_same_image():
    assert _syntax("JPGExtended.dcm") == "1.2.840.10008.1.2.4.51"
    assert pydicom.dcmread(_dicom("JPGExtended.dcm"), stop_before_pixels=True).BitsStored == 12
    lossy = read_image(_dicom("JPGExtended.dcm"))[..., 0]
    lossless = read_image(_dicom("JPEG-LL.dcm"))[..., 0]  # JPEG lossless (process 14), same scan
    assert lossy.shape == lossless.shape == (1024, 256)
    assert np.abs(lossy - lossless).mean() < 0.02
    assert np.corrcoef(lossy.ravel(), lossless.ravel())[0, 1] > 0.98


# --------------------------------------------------------------------------- LUTs and photometry


def test_ct_window_from_the_header_is_applied():
    ds = pydicom.dcmread(_dicom("693_UNCR.dcm"))
    assert (float(ds.WindowCenter), float(ds.WindowWidth), float(ds.RescaleIntercept)) == (40.0, 100.0, -1024.0)
    hu = ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
    # DICOM's linear window (PS3.3 C.11.2.1.2.1), which spans the whole output range on this slice
    expected = np.clip((hu - 39.5) / 99.0 + 0.5, 0.0, 1.0)
    x = read_image(_dicom("693_UNCR.dcm"))[..., 0]
    np.testing.assert_allclose(x, expected, atol=1e-6)
    assert (x[hu <= -10] == 0).all() and (x[hu >= 90] == 1).all()
    np.testing.assert_array_equal(read_image(_dicom("693_J2KR.dcm")), read_image(_dicom("693_UNCR.dcm")))


def test_voi_lut_sequence_is_applied():
    ds = pydicom.dcmread(_dicom("vlut_04.dcm"))
    item = ds.VOILUTSequence[0]
    n_entries, first_mapped, _ = (int(v) for v in item.LUTDescriptor)
    lut = np.asarray(item.LUTData, dtype=np.float64)
    assert len(lut) == n_entries
    raw = ds.pixel_array.astype(np.int64)
    expected = _unit(lut[np.clip(raw - first_mapped, 0, n_entries - 1)])
    np.testing.assert_allclose(read_image(_dicom("vlut_04.dcm"))[..., 0], expected, atol=1e-6)


def test_monochrome1_comes_out_inverted_relative_to_the_stored_values():
    ds = pydicom.dcmread(_dicom("RG3_UNCR.dcm"))
    assert ds.PhotometricInterpretation == "MONOCHROME1"
    center, width = float(ds.WindowCenter), float(ds.WindowWidth)
    windowed = np.clip((ds.pixel_array.astype(np.float64) - (center - 0.5)) / (width - 1) + 0.5, 0.0, 1.0)
    x = read_image(_dicom("RG3_UNCR.dcm"))[..., 0]
    np.testing.assert_allclose(x, 1.0 - _unit(windowed), atol=1e-6)
    # the highest stored value (least attenuation in MONOCHROME1) is the darkest pixel
    assert x.ravel()[np.argmax(ds.pixel_array)] == 0.0
    np.testing.assert_array_equal(read_image(_dicom("RG3_J2KR.dcm")), x[..., None])


# --------------------------------------------------------------------------- multi-frame


def test_frame_rules_pick_the_documented_frame():
    path = _dicom("emri_small.dcm")
    frames = pydicom.dcmread(path).pixel_array
    assert frames.shape == (10, 64, 64)
    assert FRAME_RULES == ("middle", "first", "all") and DEFAULT_FRAME == "middle"
    expected = {"middle": _unit(frames[5]), "first": _unit(frames[0]), "all": _unit(frames.mean(axis=0))}
    got = {rule: read_image(path, frame=rule)[..., 0] for rule in FRAME_RULES}
    for rule in FRAME_RULES:
        np.testing.assert_allclose(got[rule], expected[rule], atol=1e-6, err_msg=rule)
    np.testing.assert_array_equal(read_image(path)[..., 0], got["middle"])
    assert np.abs(got["middle"] - got["first"]).max() > 0.5  # the rules really differ on this file
    # a single-frame file reads the same under every rule
    single = [read_image(_dicom("CT_small.dcm"), frame=rule) for rule in FRAME_RULES]
    np.testing.assert_array_equal(single[0], single[1])
    np.testing.assert_array_equal(single[0], single[2])


def test_frame_rule_on_colour_and_palette_multiframe_files():
    rgb = pydicom.dcmread(_dicom("SC_rgb_2frame.dcm")).pixel_array.astype(np.float64) / 255.0
    assert rgb.shape == (2, 100, 100, 3)
    np.testing.assert_allclose(read_image(_dicom("SC_rgb_2frame.dcm"), frame="first"), rgb[0], atol=1e-6)
    np.testing.assert_allclose(read_image(_dicom("SC_rgb_2frame.dcm"), frame="middle"), rgb[1], atol=1e-6)
    np.testing.assert_allclose(read_image(_dicom("SC_rgb_2frame.dcm"), frame="all"), rgb.mean(axis=0), atol=1e-6)
    palette = read_image(_dicom("OBXXXX1A_rle_2frame.dcm"), frame="all")
    assert palette.shape[2] == 3 and 0.0 <= palette.min() and palette.max() <= 1.0


def test_bad_frame_rule_is_an_input_error():
    with pytest.raises(InputError, match=r"frame must be one of 'middle', 'first', 'all', got 'last'"):
        read_image(_dicom("emri_small.dcm"), frame="last")
    with pytest.raises(InputError, match="got 'last'"):
        read_images([_dicom("emri_small.dcm")], frame="last")


def test_all_frames_count_against_max_pixels():
    path = _dicom("emri_small.dcm")
    assert read_image(path, max_pixels=64 * 64).shape == (64, 64, 1)
    with pytest.raises(ImageReadError, match=r"64 x 64 = 4096 pixels x 10 frames, over max_pixels=4096"):
        read_image(path, max_pixels=64 * 64, frame="all")


def test_frame_rule_is_part_of_the_embedding_cache_key(tmp_path):
    import torch

    from crslib.data import load_data
    from crslib.embed import extract_embeddings
    from crslib.models import Preprocessing, TorchEncoder

    folder = tmp_path / "dicoms"
    folder.mkdir()
    shutil.copy(_dicom("emri_small.dcm"), folder / "cine.dcm")
    shutil.copy(_dicom("MR_small.dcm"), folder / "single.dcm")
    manifest = load_data(folder)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    encoder = TorchEncoder(net, name="tiny", preprocessing=Preprocessing((3, 32, 32), (0.5,) * 3, (0.25,) * 3,
                                                                        "bilinear", 3))
    cache = tmp_path / "cache"
    runs = {rule: extract_embeddings(manifest, encoder, cache_root=cache, progress=False, frame=rule)
            for rule in FRAME_RULES}
    assert len({run.key for run in runs.values()}) == 3
    assert not any(run.cache_hit for run in runs.values())
    row = {image_id: i for i, image_id in enumerate(runs["middle"].image_ids)}
    assert not np.allclose(runs["middle"].X[row["cine"]], runs["first"].X[row["cine"]])
    np.testing.assert_array_equal(runs["middle"].X[row["single"]], runs["first"].X[row["single"]])
    again = extract_embeddings(manifest, encoder, cache_root=cache, progress=False, frame="first")
    assert again.cache_hit and again.key == runs["first"].key
    np.testing.assert_array_equal(again.X, runs["first"].X)
    with pytest.raises(InputError, match="frame must be one of"):
        extract_embeddings(manifest, encoder, cache_root=cache, progress=False, frame="last")


# --------------------------------------------------------------------------- failures and the whole set


def test_undecodable_files_raise_one_line_reasons(tmp_path):
    cases = {
        "JPEG-lossy.dcm": "cannot decode DICOM pixel data (JPEG Extended (Process 2 and 4) "
                          "(1.2.840.10008.1.2.4.51)): every installed decoder failed: pylibjpeg: libjpeg error",
        "MR_truncated.dcm": "cannot decode DICOM pixel data (Explicit VR Little Endian (1.2.840.10008.1.2.1)): "
                            "The number of bytes of pixel data is less than expected (8130 vs 8192 bytes)",
        "emri_small_jpeg_2k_lossless_too_short.dcm": "truncated DICOM file: no pixel data before the end",
        "rtplan.dcm": "DICOM file has no pixel data",
    }
    for name, start in cases.items():
        with pytest.raises(ImageReadError) as info:
            read_image(_dicom(name))
        assert info.value.path == str(_dicom(name))
        assert info.value.reason.startswith(start), info.value.reason
        assert "\n" not in info.value.reason
    # a header-less file (no file meta, so no transfer syntax) with native pixels is read as parsed
    face = read_image(_dicom("OT-PAL-8-face.dcm"))
    assert face.shape == (480, 640, 3)


def test_file_properties_still_report_the_transfer_syntax():
    from crslib.data.properties import file_properties

    names = ["MR_small_jpeg_ls_lossless.dcm", "emri_small_jpeg_2k_lossless.dcm", "JPGExtended.dcm"]
    props = file_properties(pd.DataFrame({"path": [str(_dicom(n)) for n in names]}))
    assert props["dicom_transfer_syntax"].tolist() == [
        "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.51"]


def test_most_test_dicoms_decode_and_the_rest_have_one_line_reasons():
    assert len(ALL_TEST_DICOMS) == 172
    images, skipped = read_images(ALL_TEST_DICOMS, on_error="skip")
    decoded = sum(image is not None for image in images)
    assert decoded >= 136, skipped.to_string()
    assert decoded + len(skipped) == 172
    assert not skipped["reason"].str.contains("\n").any()
    assert not skipped["reason"].str.contains("install the pylibjpeg").any()  # every plugin is installed


def test_crs_embed_over_every_test_dicom_lists_each_left_out_file_once(tmp_path):
    folder = write_dicom_folder(tmp_path / "dicoms")
    env = dict(os.environ, CRS_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-m", "crslib", "embed", "--data", str(folder), "--model",
                             "timm:resnet18?size=32", "--skip-unreadable", "--no-cache"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    n_embedded = int(result.stdout.split()[0])
    assert n_embedded >= 136, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    left_out = [line for line in lines if line.startswith(("skipped ", "ignored "))]
    named = [line.split(" ", 1)[1].split(": ", 1)[0] for line in left_out]
    assert len(named) == len(set(named)) == 172 - n_embedded
    others = [line for line in lines if line not in left_out]
    assert all(line.startswith("WARNING crslib.") for line in others), others  # the loader's and embed's summaries


def test_debug_still_shows_pydicom_log_records(tmp_path):
    folder = tmp_path / "dicoms"
    folder.mkdir()
    for name in ("JPEG-lossy.dcm", "MR_small.dcm"):
        shutil.copy(_dicom(name), folder / name)
    env = dict(os.environ, CRS_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, "-m", "crslib", "embed", "--data", str(folder), "--model", "timm:resnet18?size=32",
               "--skip-unreadable", "--no-cache"]
    quiet = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    debug = subprocess.run(command[:3] + ["--debug"] + command[3:], capture_output=True, text=True, env=env,
                           timeout=600)
    assert quiet.returncode == debug.returncode == 0, quiet.stderr + debug.stderr
    skipped = [line for line in quiet.stderr.splitlines() if line.startswith("skipped ")]
    assert skipped == [line for line in quiet.stderr.splitlines() if "JPEG-lossy.dcm:" in line]
    assert len(skipped) == 1 and "Traceback" not in quiet.stderr
    assert "ERROR pydicom.pixels.decoders.base: libjpeg error" in debug.stderr and "Traceback" in debug.stderr

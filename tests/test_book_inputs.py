"""Commands pointed at the wrong thing: `crs book` checks its data, models and config before the first
notebook, and `crs checklist` / `crs claims` refuse a folder that holds no run; one line, exit 2, nothing
written. Also the readable-image check the chapters use (`crslib.data.drop_unreadable`), on real images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from crslib import runner
from crslib.cli import main
from crslib.data import drop_unreadable, load_data, skip_summary
from crslib.data import readable as readable_module
from crslib.data.readable import NOT_AN_IMAGE
from crslib.errors import ImageReadError, InputError

NOTEBOOK = '''# %% tags=["parameters"]
data = "phantom?patients=20"
models = "timm:resnet18?size=32"
strict = False
results_dir = "results/x"

# %%
import pathlib
pathlib.Path(results_dir).mkdir(parents=True, exist_ok=True)
pathlib.Path(results_dir, "seen.txt").write_text(f"{data} {models}")
'''


def _tiles(n: int = 4) -> list[np.ndarray]:
    """Real image tiles (scikit-image's camera), not the phantom."""
    from skimage import data

    camera = data.camera()
    return [np.ascontiguousarray(camera[64 * i:64 * i + 64, 64:128]) for i in range(n)]


def _folder(root: Path, good: int, broken: int) -> Path:
    root.mkdir(parents=True)
    for i, tile in enumerate(_tiles(good)):
        Image.fromarray(tile).save(root / f"good_{i}.png")
    for i in range(broken):
        (root / f"broken_{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"truncated")
    return root


@pytest.fixture()
def repository(tmp_path, monkeypatch) -> Path:
    """A repository root with one tiny notebook that names data and models, as the chapters do."""
    monkeypatch.setattr(runner, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_see.py").write_text(NOTEBOOK)
    (tmp_path / "config.yaml").write_text("name: t\nparameters: {}\n")
    return tmp_path


def _one_line_refusal(capfd, status: int, repository: Path, *phrases: str) -> str:
    out, err = capfd.readouterr()
    assert status == 2 and out == "", (status, out, err)
    assert err.count("\n") == 1 and err.startswith("crs book: error: "), err
    for phrase in phrases:
        assert phrase in err, err
    assert not (repository / "runs").exists()  # no run folder: no notebook started
    return err


# --- crs book: the inputs are checked before the first notebook ----------------------------------------------

def test_a_missing_data_folder_is_one_line_before_any_notebook(repository, capfd) -> None:
    status = main(["book", "--config", str(repository / "config.yaml"), "--data", str(repository / "nope"),
                   "--no-build"])
    _one_line_refusal(capfd, status, repository, "no such file or folder", str(repository / "nope"))


def test_a_folder_where_no_file_decodes_is_one_line(repository, capfd) -> None:
    data = _folder(repository / "broken", good=0, broken=3)
    status = main(["book", "--config", str(repository / "config.yaml"), "--data", str(data), "--no-build"])
    _one_line_refusal(capfd, status, repository, "none of the 3 images decodes", "broken_0.png")


def test_strict_stops_at_the_first_unreadable_file_and_the_default_runs(repository, capfd) -> None:
    data = _folder(repository / "mixed", good=3, broken=1)
    status = main(["book", "--config", str(repository / "config.yaml"), "--data", str(data), "--no-build",
                   "--strict"])
    _one_line_refusal(capfd, status, repository, "cannot read image", "broken_0.png")
    status = main(["book", "--config", str(repository / "config.yaml"), "--data", str(data), "--no-build"])
    out, err = capfd.readouterr()
    assert status == 0, err
    (run_dir,) = (repository / "runs").iterdir()
    assert (run_dir / "results" / "01_see" / "seen.txt").read_text().startswith(str(data))


@pytest.mark.parametrize("models, phrase", [
    ("onnx:/no/such/model.onnx", "ONNX model file /no/such/model.onnx does not exist"),
    ("resnet18", "lacks a backend prefix"),
    ("timm:resnet18?size=32,timm:resnet18?colour=1", "colour"),
])
def test_a_bad_model_spec_is_one_line_before_any_notebook(repository, capfd, models, phrase) -> None:
    status = main(["book", "--config", str(repository / "config.yaml"), "--models", models, "--no-build"])
    _one_line_refusal(capfd, status, repository, phrase)


def test_a_config_naming_a_missing_folder_or_model_is_refused(repository, capfd) -> None:
    config = repository / "own.yaml"
    config.write_text(f"name: own\nparameters:\n  data: {repository / 'gone'}\n")
    status = main(["book", "--config", str(config), "--no-build"])
    _one_line_refusal(capfd, status, repository, str(repository / "gone"))
    config.write_text("name: own\nparameters:\n  models: onnx:/no/such/model.onnx\n")
    status = main(["book", "--config", str(config), "--no-build"])
    _one_line_refusal(capfd, status, repository, "/no/such/model.onnx")


def test_a_missing_config_file_is_one_line(repository, capfd) -> None:
    status = main(["book", "--config", str(repository / "missing.yaml"), "--no-build"])
    _one_line_refusal(capfd, status, repository, "missing.yaml")


# --- crs checklist and crs claims refuse a folder that holds no run -----------------------------------------

@pytest.mark.parametrize("command", ["checklist", "claims"])
def test_checklist_and_claims_refuse_a_folder_without_a_run_and_write_nothing(tmp_path, capfd, command) -> None:
    empty = tmp_path / "not_a_run"
    (empty / "notes").mkdir(parents=True)
    (empty / "notes" / "readme.txt").write_text("nothing of a run here")
    status = main([command, str(empty)])
    out, err = capfd.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"crs {command}: error: ")
    assert "is not a run folder" in err and "run.json" in err and "results/" in err
    assert sorted(p.relative_to(empty).as_posix() for p in empty.rglob("*")) == ["notes", "notes/readme.txt"]
    status = main([command, str(tmp_path / "missing")])
    assert status == 2 and "does not exist" in capfd.readouterr().err


@pytest.mark.parametrize("command", ["checklist", "claims"])
def test_checklist_and_claims_read_a_run_folder(tmp_path, capfd, command) -> None:
    run = tmp_path / "run"
    (run / "results" / "02_agreement").mkdir(parents=True)
    pd.DataFrame({"k": [10], "overlap": [0.4]}).to_csv(run / "results" / "02_agreement" / "t.csv", index=False)
    assert main([command, str(run)]) == 0, capfd.readouterr().err


# --- drop_unreadable: the files a chapter leaves out, on real images and pydicom's files -------------------

def test_drop_unreadable_keeps_the_images_that_decode_and_names_the_others(tmp_path) -> None:
    data = _folder(tmp_path / "mixed", good=4, broken=2)
    (data / "notes.txt").write_text("not an image")
    (data / "empty.jpg").write_bytes(b"")
    manifest = load_data(data)
    kept, skipped = drop_unreadable(manifest)
    assert sorted(kept["image_id"]) == [f"good_{i}" for i in range(4)]
    assert kept.attrs["unreadable_files"] == 3
    assert list(skipped.columns) == ["image_id", "path", "reason"]
    assert sorted(Path(p).name for p in skipped["path"]) == ["broken_0.png", "broken_1.png", "empty.jpg",
                                                              "notes.txt"]
    reasons = dict(zip(skipped["path"].map(lambda p: Path(p).name), skipped["reason"]))
    assert reasons["notes.txt"] == NOT_AN_IMAGE
    assert all(reasons[name] and reasons[name] != NOT_AN_IMAGE for name in ("broken_0.png", "empty.jpg"))
    summary = skip_summary(skipped)
    assert summary["files"].sum() == 4 and summary["files"].is_monotonic_decreasing
    long = pd.DataFrame({"image_id": ["a"], "path": ["x/a.dcm"], "reason": ["decoder failed: " + "x" * 300]})
    (cut,) = skip_summary(long, width=40)["reason"]
    assert len(cut) == 40 and cut.startswith("decoder failed: ") and cut.endswith("...")
    with pytest.raises(ImageReadError, match="broken_0.png"):
        drop_unreadable(manifest, strict=True)


def test_drop_unreadable_is_cached_and_a_changed_file_is_read_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    data = _folder(tmp_path / "mixed", good=3, broken=1)
    first = drop_unreadable(load_data(data))[1]

    def refuse(path, **kwargs):
        raise AssertionError("decoded again")

    monkeypatch.setattr(readable_module, "read_image", refuse)
    pd.testing.assert_frame_equal(drop_unreadable(load_data(data))[1], first)  # from the cache
    monkeypatch.undo()
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copy(data / "good_0.png", data / "broken_0.png")  # the broken file repaired
    kept, skipped = drop_unreadable(load_data(data))
    assert len(kept) == 4 and skipped.empty


def test_no_readable_image_is_an_input_error(tmp_path) -> None:
    with pytest.raises(InputError, match="none of the 2 images decodes"):
        drop_unreadable(load_data(_folder(tmp_path / "broken", good=0, broken=2)))


def test_pydicom_files_without_pixel_data_are_left_out_with_their_reason(tmp_path) -> None:
    pydicom = pytest.importorskip("pydicom")
    charset = Path(pydicom.__file__).parent / "data" / "charset_files"
    sources = [charset / "chrJapMulti.dcm", Path(pydicom.__file__).parent / "data" / "test_files" / "MR_small.dcm",
               Path(pydicom.__file__).parent / "data" / "test_files" / "CT_small.dcm"]
    if not all(p.is_file() for p in sources):
        pytest.skip("pydicom's test files are not installed")
    folder = tmp_path / "dicom"
    folder.mkdir()
    for path in sources:
        shutil.copy(path, folder / path.name)
    kept, skipped = drop_unreadable(load_data(folder))
    assert sorted(kept["path"].map(lambda p: Path(p).name)) == ["CT_small.dcm", "MR_small.dcm"]
    (reason,) = skipped.loc[skipped["path"].str.endswith("chrJapMulti.dcm"), "reason"]
    assert "pixel data" in reason or reason == NOT_AN_IMAGE


# --- the quick book on a researcher's DICOM folder that also holds non-image objects --------------------------

@pytest.mark.slow
def test_the_quick_book_runs_on_pydicoms_files_and_lists_the_files_it_left_out(tmp_path, repo_root, monkeypatch,
                                                                                 capfd) -> None:
    """The issue's done-when check: 172 real DICOM files, of which about 136 decode, two user models."""
    pytest.importorskip("pydicom")
    from realdata import write_dicom_folder

    folder = write_dicom_folder(tmp_path / "dicoms")
    n_files = sum(1 for p in folder.rglob("*.dcm"))
    shutil.copytree(repo_root / "notebooks", tmp_path / "repo" / "notebooks")
    monkeypatch.setattr(runner, "REPO_ROOT", tmp_path / "repo")
    status = main(["book", "--preset", "quick", "--data", str(folder), "--no-build",
                   "--models", "timm:resnet18?size=64,public:efficientnet_lite0?size=64"])
    out, err = capfd.readouterr()
    assert status == 0, err
    assert "Traceback" not in err
    (run_dir,) = (tmp_path / "repo" / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    chapters = {n["name"]: n for n in record["notebooks"]}
    assert len(chapters) == 7
    (left_out,) = [s for s in chapters["01_data_and_embeddings"]["skips"] if "files" in s]
    files = {Path(f["path"]).name: f["reason"] for f in left_out["files"]}
    assert 20 <= len(files) <= n_files - 136 and all(files.values())
    assert files["chrJapMulti.dcm"] == "DICOM file has no pixel data"
    assert "pixel data" in files["MR_truncated.dcm"] and "rtplan.dcm" in files  # broken; not an image at all
    assert left_out["analysis"].startswith(f"{len(files)} of the {n_files} files of the data")
    assert f"01_data_and_embeddings: skipped {len(files)} of the {n_files} files" in out
    table = pd.read_csv(run_dir / "results" / "01_data_and_embeddings" / "skipped_files.csv")
    assert set(table["path"].map(lambda p: Path(p).name)) == set(files)
    page = (run_dir / "notebooks" / "01_data_and_embeddings.ipynb").read_text()
    assert f"{len(files)} of the {n_files} files were left out" in page and "no pixel data" in page
    # the chapters that need a label or a train/val/test split say so, and why
    for chapter, needs in (("04_protocol_sensitivity", ("label",)), ("05_split_and_shortcut_audit",
                                                                             ("split",)),
                           ("06_representation_risk", ("label",))):
        reasons = " ".join(s["reason"] for s in chapters[chapter]["skips"])
        assert all(need in reasons for need in needs), (chapter, reasons)

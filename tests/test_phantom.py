"""Tests of the phantom generator: determinism, splits, ground truth in the
pixels, file-encoding shortcut, split shift, Kermany layout, argument checks."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from crslib.errors import DataError
from crslib.data.phantom import (
    FINDINGS,
    MANIFEST_COLUMNS,
    encode_image,
    generate_phantom,
    render_phantom,
    site_signatures,
)

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- helpers


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _load(root: Path) -> pd.DataFrame:
    """Manifest joined with the latents (latent columns that the manifest lacks)."""
    manifest = pd.read_csv(root / "manifest.csv")
    latents = pd.read_csv(root / "latents.csv", keep_default_na=True)
    extra = [c for c in latents.columns if c not in manifest.columns]
    return manifest.merge(latents[["image_id", *extra]], on="image_id", how="left", validate="1:1")


def _pixels(path: Path) -> np.ndarray:
    """Gray pixels in [0, 1] whatever the bit depth or colour mode."""
    with Image.open(path) as im:
        if im.mode in ("I;16", "I;16B", "I"):
            return np.asarray(im, dtype=np.float64) / 65535.0
        return np.asarray(im.convert("L"), dtype=np.float64) / 255.0


def _file_features(root: Path, paths) -> np.ndarray:
    """Properties of the files alone: format, bit depth, colour mode, bytes, width, height."""
    rows = []
    for rel in paths:
        path = root / rel
        with Image.open(path) as im:
            rows.append([
                {"PNG": 0, "JPEG": 1}[im.format],
                16 if im.mode.startswith("I") else 8,
                len(im.getbands()),
                path.stat().st_size,
                im.width,
                im.height,
            ])
    return np.asarray(rows, dtype=np.float64)


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    auc = roc_auc_score(y, score)
    return max(auc, 1.0 - auc)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def standard(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    root = tmp_path_factory.mktemp("phantom_std")
    generate_phantom(root, n_patients=240, image_size=64, random_state=0)
    return root, _load(root)


@pytest.fixture(scope="module")
def knobs(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    root = tmp_path_factory.mktemp("phantom_knobs")
    generate_phantom(root, n_patients=240, image_size=64, random_state=0, shortcut_strength=1.0, split_shift=1.0)
    return root, _load(root)


@pytest.fixture(scope="module")
def kermany(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    root = tmp_path_factory.mktemp("phantom_kermany")
    generate_phantom(root, n_patients=200, image_size=64, random_state=3, kermany_layout=True, shortcut_strength=1.0)
    return root, _load(root)


# ---------------------------------------------------------------- determinism


def test_same_seed_gives_byte_identical_files_and_other_seed_differs(tmp_path):
    kwargs = dict(n_patients=25, image_size=48, shortcut_strength=0.5, split_shift=0.5)
    generate_phantom(tmp_path / "a", random_state=7, **kwargs)
    generate_phantom(tmp_path / "b", random_state=7, **kwargs)
    generate_phantom(tmp_path / "c", random_state=8, **kwargs)
    a, b, c = (_hashes(tmp_path / name) for name in "abc")
    assert "manifest.csv" in a and "latents.csv" in a
    assert len(a) > 25
    assert a == b
    assert a["manifest.csv"] != c["manifest.csv"]
    shared = set(a) & set(c)
    assert sum(a[k] != c[k] for k in shared) > 0.9 * len(shared)


def test_determinism_does_not_depend_on_hash_seed(tmp_path):
    code = (
        "import sys; from crslib.data.phantom import generate_phantom; "
        "generate_phantom(sys.argv[1], n_patients=8, image_size=40, random_state=11, kermany_layout=True)"
    )
    for name, hash_seed in (("x", "1"), ("y", "987")):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], check=True, env=env, cwd=REPO)
    assert _hashes(tmp_path / "x") == _hashes(tmp_path / "y")


def test_rerun_into_same_folder_overwrites_and_manifest_is_complete(tmp_path):
    first = generate_phantom(tmp_path, n_patients=6, image_size=32, random_state=1)
    before = _hashes(tmp_path)
    second = generate_phantom(tmp_path, n_patients=6, image_size=32, random_state=1)
    assert _hashes(tmp_path) == before
    assert list(first.columns) == list(MANIFEST_COLUMNS)
    assert first.equals(second)
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in first["path"])
    assert not list(tmp_path.rglob("*.tmp"))


# ---------------------------------------------------------------- structure


def test_manifest_schema_and_patient_level_splits(standard):
    root, df = standard
    manifest = pd.read_csv(root / "manifest.csv")
    assert list(manifest.columns) == list(MANIFEST_COLUMNS)
    assert manifest["image_id"].is_unique
    assert set(manifest["modality"]) == {"DX"}
    assert set(manifest["view"]) == {"PA", "AP"}
    assert set(manifest["source"]) == {f"site{j}" for j in range(4)}
    for rel in manifest["path"]:
        assert not rel.startswith("/") and "\\" not in rel
        assert (root / rel).is_file()
    assert (manifest["label"] == manifest["finding_opacity"]).all()
    splits_per_patient = manifest.groupby("patient_id")["split"].nunique()
    assert (splits_per_patient == 1).all()
    per_patient = manifest.groupby("patient_id").size()
    assert per_patient.between(1, 4).all() and per_patient.nunique() == 4
    assert manifest["patient_id"].nunique() == 240
    share = manifest.drop_duplicates("patient_id")["split"].value_counts(normalize=True)
    assert abs(share["train"] - 0.7) < 0.02 and abs(share["val"] - 0.1) < 0.02 and abs(share["test"] - 0.2) < 0.02
    # patient attributes are constant within a patient
    assert (manifest.groupby("patient_id")[["age", "sex", "habitus"]].nunique() == 1).all().all()
    assert manifest["age"].between(1, 90).all()


def test_findings_prevalence_and_cooccurrence(standard):
    _, df = standard
    patients = df.drop_duplicates("patient_id")
    prev = patients[[f"finding_{f}" for f in FINDINGS]].mean()
    assert prev.between(0.02, 0.6).all(), prev
    assert 0.15 < prev["finding_opacity"] < 0.5
    cm = patients["finding_cardiomegaly"] == 1
    edema = patients["finding_edema"] == 1
    assert edema[cm].mean() > 1.5 * edema.mean()
    effusion = patients["finding_effusion"] == 1
    assert effusion[cm | edema].mean() > 1.5 * effusion.mean()
    device = patients["finding_support_device"] == 1
    assert device[edema].mean() > device.mean()
    # latents: a position for every present finding, none for absent ones
    for f in FINDINGS:
        present = df[f"finding_{f}"] == 1
        assert df.loc[present, f"{f}_x"].between(0, 1).all()
        assert df.loc[~present, f"{f}_x"].isna().all()


def test_prevalence_per_source_and_more_sources(tmp_path):
    m = generate_phantom(tmp_path, n_patients=40, image_size=32, random_state=2, n_sources=6,
                         prevalence={"site0": 1.0, "site1": 0.0, "site2": 1.0, "site3": 0.0,
                                     "site4": {"opacity": 1.0, "nodule": 1.0}, "site5": 0.0})
    assert set(m["source"]) <= {f"site{j}" for j in range(6)} and m["source"].nunique() >= 4
    expected = m["source"].isin(["site0", "site2", "site4"]).astype(int)
    assert (m["label"] == expected).all()
    assert (m.loc[m["source"] == "site4", "finding_nodule"] == 1).all()


# ---------------------------------------------------------------- ground truth in the pixels


def test_nodule_is_a_bright_spot_at_its_latent_position(standard):
    root, df = standard
    nod = df[df["finding_nodule"] == 1]
    assert len(nod) >= 10
    diffs = []
    for r in nod.itertuples():
        a = _pixels(root / r.path)
        h, w = a.shape
        cx, cy, rad = r.nodule_x * w, r.nodule_y * h, max(r.nodule_size * w, 1.0)
        yy, xx = np.mgrid[:h, :w]
        d = np.hypot(xx + 0.5 - cx, yy + 0.5 - cy)
        diffs.append(a[d <= rad].mean() - a[(d > 2.5 * rad) & (d < 2.5 * rad + 2.5)].mean())
    diffs = np.asarray(diffs)
    assert (diffs > 0).mean() > 0.9 and diffs.mean() > 0.05


def test_cardiomegaly_widens_the_bright_heart_shadow(standard):
    root, df = standard

    def bright_run(r) -> float:
        a = _pixels(root / r.path)
        h, w = a.shape
        yc = int(r.heart_y * h)
        row = a[max(0, yc - 1):yc + 2].mean(axis=0)
        lo = max(0, int(w * (r.heart_x - r.thorax_width / 2)))
        hi = min(w, int(w * (r.heart_x + r.thorax_width / 2)))
        thr = 0.5 * (np.percentile(row[lo:hi], 10) + np.percentile(row[lo:hi], 90))
        i = j = int(r.heart_x * w)
        while i > 0 and row[i - 1] > thr:
            i -= 1
        while j < w - 1 and row[j + 1] > thr:
            j += 1
        return (j - i + 1) / w / r.thorax_width

    widths = np.array([bright_run(r) for r in df.itertuples()])
    cm = df["finding_cardiomegaly"].to_numpy() == 1
    assert cm.sum() >= 20
    assert widths[cm].mean() > widths[~cm].mean() + 0.08
    assert np.corrcoef(widths, df["ctr_apparent"])[0, 1] > 0.5


def test_age_is_learnable_from_a_pixel_statistic(standard):
    root, df = standard
    clean = df[df[[f"finding_{f}" for f in FINDINGS]].sum(axis=1) == 0].copy()
    stat = []
    for r in clean.itertuples():
        a = _pixels(root / r.path)
        h, w = a.shape
        stat.append(a[int(0.3 * h):int(0.55 * h), int(0.15 * w):int(0.85 * w)].mean())
    clean["stat"] = stat
    clean["z"] = clean.groupby(["source", "view"])["stat"].transform(lambda s: (s - s.mean()) / s.std())
    r = np.corrcoef(clean["age"], clean["z"])[0, 1]
    assert abs(r) > 0.3, r


def test_ap_view_has_lower_contrast_than_pa(standard):
    root, df = standard

    def contrast(path) -> float:
        a = _pixels(root / path)
        h, w = a.shape
        return a[int(0.2 * h):int(0.8 * h), int(0.2 * w):int(0.8 * w)].std()

    df = df.assign(contrast=[contrast(p) for p in df["path"]])
    by = df.groupby(["source", "view"])["contrast"].mean().unstack()
    assert (by["AP"] < 0.92 * by["PA"]).all(), by


def test_render_phantom_findings_change_the_image():
    base = render_phantom({}, image_size=64, rng=np.random.default_rng(0))
    assert base.shape == (64, 64) and base.dtype == np.float32
    assert 0.0 <= base.min() and base.max() <= 1.0
    for finding in FINDINGS:
        img = render_phantom({finding: 1}, image_size=64, rng=np.random.default_rng(0))
        assert np.abs(img - base).max() > 0.1, finding
    big = render_phantom({"view": "AP"}, image_size=512, rng=np.random.default_rng(0))
    assert big.shape == (512, 512)


# ---------------------------------------------------------------- file encoding and shortcut


def test_site_file_encodings(standard):
    root, df = standard
    expected = {s.name: s.encoding for s in site_signatures(4)}
    assert [e.format for e in expected.values()] == ["png8", "png16", "jpeg", "jpeg"]
    for source, group in df.groupby("source"):
        enc = expected[source]
        for rel in group["path"].head(5):
            with Image.open(root / rel) as im:
                assert im.format == ("PNG" if enc.format.startswith("png") else "JPEG")
                assert im.mode == {"png8": "L", "png16": "I;16", "jpeg": "L"}[enc.format]
                assert im.size == enc.geometry(64)[3:]
                if enc.text:
                    assert im.text.get("Source") == source
                assert "date" not in str(getattr(im, "text", {})).lower()
    assert (df["encoding_by_shortcut"] == 0).all()
    assert {_pixels(root / p).shape for p in df["path"]} == {(64, 64), (72, 72), (80, 80)}


def _tree_bacc(X_train, y_train, X_eval, y_eval) -> float:
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.tree import DecisionTreeClassifier

    tree = DecisionTreeClassifier(max_depth=3, random_state=0).fit(X_train, y_train)
    return balanced_accuracy_score(y_eval, tree.predict(X_eval))


def test_file_properties_predict_the_label_in_the_pool_only(knobs, standard):
    root, df = knobs
    X = _file_features(root, df["path"])
    y = df["label"].to_numpy()
    train = (df["split"] == "train").to_numpy()
    val = (df["split"] == "val").to_numpy()
    test = (df["split"] == "test").to_numpy()
    assert df.loc[~test, "encoding_by_shortcut"].all() and not df.loc[test, "encoding_by_shortcut"].any()
    assert _tree_bacc(X[train], y[train], X[val], y[val]) > 0.9
    assert abs(_tree_bacc(X[train], y[train], X[test], y[test]) - 0.5) < 0.15
    # inside the test split file properties carry (almost) no label information
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.model_selection import GroupKFold, cross_val_predict
    from sklearn.tree import DecisionTreeClassifier

    pred = cross_val_predict(DecisionTreeClassifier(max_depth=3, random_state=0), X[test], y[test],
                             groups=df.loc[test, "patient_id"], cv=GroupKFold(5))
    assert abs(balanced_accuracy_score(y[test], pred) - 0.5) < 0.15

    root0, df0 = standard
    X0 = _file_features(root0, df0["path"])
    y0 = df0["label"].to_numpy()
    tr0 = (df0["split"] == "train").to_numpy()
    pool0 = (df0["split"] != "train").to_numpy()
    assert abs(_tree_bacc(X0[tr0], y0[tr0], X0[pool0], y0[pool0]) - 0.5) < 0.15


def test_shortcut_changes_only_the_encoding(tmp_path):
    a = generate_phantom(tmp_path / "a", n_patients=20, image_size=32, random_state=5)
    b = generate_phantom(tmp_path / "b", n_patients=20, image_size=32, random_state=5, shortcut_strength=1.0)
    cols = [c for c in MANIFEST_COLUMNS if c != "path"]
    assert a[cols].equals(b[cols])
    la = pd.read_csv(tmp_path / "a" / "latents.csv")
    lb = pd.read_csv(tmp_path / "b" / "latents.csv")
    assert la["ctr"].equals(lb["ctr"]) and la["view"].equals(lb["view"])
    assert (lb.loc[lb["split"] != "test", "encoding"].str.startswith("shortcut")).all()


# ---------------------------------------------------------------- split shift


def test_split_shift_moves_the_test_split(knobs, standard):
    def stat(root, df):  # mean brightness of the central half of each image
        out = []
        for p in df["path"]:
            a = _pixels(root / p)
            h, w = a.shape
            out.append(a[h // 4:3 * h // 4, w // 4:3 * w // 4].mean())
        return np.array(out)

    for (root, df), lo, hi in ((knobs, 0.85, 1.0), (standard, 0.5, 0.62)):
        is_test = (df["split"] == "test").to_numpy().astype(int)
        auc = _auc(stat(root, df), is_test)
        assert lo <= auc <= hi, auc
    root, df = knobs
    assert (df.loc[df["split"] == "test", "batch"] == "later").all()
    assert (df.loc[df["split"] == "test", "batch_shift"] == 1.0).all()
    assert (df.loc[df["split"] != "test", "batch_shift"] == 0.0).all()


# ---------------------------------------------------------------- Kermany layout


PNEUMONIA_NAME = re.compile(r"^person(\d+)_(bacteria|virus)_(\d+)\.jpeg$")
NORMAL_NAME = re.compile(r"^(NORMAL2-)?IM-(\d{4})-(\d{4})\.jpeg$")


def test_kermany_layout_names_and_real_jpegs(kermany):
    root, df = kermany
    top = root / "chest_xray"
    assert sorted(p.name for p in top.iterdir()) == ["test", "train", "val"]
    for split in ("train", "val", "test"):
        assert sorted(p.name for p in (top / split).iterdir()) == ["NORMAL", "PNEUMONIA"]
    files = [p for p in top.rglob("*") if p.is_file()]
    assert len(files) == len(df)
    for p in files:
        pattern = PNEUMONIA_NAME if p.parent.name == "PNEUMONIA" else NORMAL_NAME
        assert pattern.match(p.name), p.name
        with Image.open(p) as im:
            assert im.format == "JPEG"
    assert any(p.name.startswith("NORMAL2-") for p in files)
    assert {"bacteria", "virus"} <= {PNEUMONIA_NAME.match(p.name).group(2)
                                     for p in files if p.parent.name == "PNEUMONIA"}
    # manifest at the root, paths relative to it, single label = opacity
    for r in df.itertuples():
        assert r.path.startswith(f"chest_xray/{r.split}/{'PNEUMONIA' if r.label else 'NORMAL'}/")
    assert (df["label"] == df["finding_opacity"]).all()
    others = [f"finding_{f}" for f in FINDINGS if f != "opacity"]
    assert (df[others] == 0).all().all()
    assert df["age"].between(0.5, 6.0).all()
    assert (df.groupby("patient_id")["label"].nunique() == 1).all()
    assert (df.groupby("patient_id")["split"].nunique() == 1).all()


def test_kermany_tiny_val_and_independent_person_numbers(kermany):
    root, df = kermany
    counts = df.groupby(["split", "label"]).size()
    assert counts["val"].min() >= 2
    assert len(df[df["split"] == "val"]) < 0.06 * len(df)
    numbers = {
        split: {int(PNEUMONIA_NAME.match(Path(p).name).group(1))
                for p in df.loc[(df["split"] == split) & (df["label"] == 1), "path"]}
        for split in ("train", "test")
    }
    assert numbers["train"] & numbers["test"]  # numbering restarts: different children reuse numbers
    train_ids = set(df.loc[df["split"] == "train", "patient_id"])
    assert not train_ids & set(df.loc[df["split"] == "test", "patient_id"])


def test_kermany_file_shortcut_is_measurable_with_jpeg_only(kermany):
    root, df = kermany
    X = _file_features(root, df["path"])
    assert set(X[:, 0]) == {1.0}
    y = df["label"].to_numpy()
    train = (df["split"] == "train").to_numpy()
    test = (df["split"] == "test").to_numpy()
    assert _tree_bacc(X[train], y[train], X[train], y[train]) > 0.95
    assert abs(_tree_bacc(X[train], y[train], X[test], y[test]) - 0.5) < 0.15
    # site encodings vary progressive / subsampling / metadata, all JPEG
    encs = [s.encoding for s in site_signatures(4, kermany_layout=True)]
    assert {e.format for e in encs} == {"jpeg"}
    assert len({(e.quality, e.mode, e.progressive, e.subsampling, e.scale, e.pad_x, e.pad_y) for e in encs}) == 4
    with_comment = next(e for e in encs if e.comment)
    data = encode_image(np.full((32, 32), 0.4, dtype=np.float32), with_comment)
    with Image.open(__import__("io").BytesIO(data)) as im:
        assert im.format == "JPEG" and im.info.get("comment") == with_comment.comment.encode()


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_patients": 0}, "n_patients"),
        ({"n_patients": 2.5}, "n_patients"),
        ({"image_size": 31}, "image_size"),
        ({"image_size": 513}, "image_size"),
        ({"random_state": -1}, "random_state"),
        ({"n_sources": 0}, "n_sources"),
        ({"shortcut_strength": 1.5}, "shortcut_strength"),
        ({"shortcut_strength": float("nan")}, "shortcut_strength"),
        ({"split_shift": -0.1}, "split_shift"),
        ({"split_shift": "high"}, "split_shift"),
        ({"prevalence": {"site9": 0.3}}, "site9"),
        ({"prevalence": {"site0": 1.2}}, "prevalence"),
        ({"prevalence": {"site0": {"asthma": 0.1}}}, "asthma"),
        ({"prevalence": [0.3]}, "prevalence"),
        ({"kermany_layout": True, "prevalence": {"site0": {"edema": 0.1}}}, "single label"),
        ({"kermany_layout": "yes"}, "kermany_layout"),
    ],
)
def test_invalid_arguments_raise_data_error(tmp_path, kwargs, message):
    with pytest.raises(DataError, match=message):
        generate_phantom(tmp_path / "out", **{"n_patients": 3, **kwargs})
    assert not (tmp_path / "out").exists()


def test_out_dir_that_is_a_file_is_rejected(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    with pytest.raises(DataError, match="not a folder"):
        generate_phantom(target, n_patients=2)


def test_smallest_sizes_and_single_patient(tmp_path):
    m = generate_phantom(tmp_path, n_patients=1, image_size=32, random_state=0, n_sources=1)
    assert set(m["split"]) == {"train"} and 1 <= len(m) <= 4
    with pytest.raises(DataError, match="image_size"):
        render_phantom({}, image_size=1000, rng=np.random.default_rng(0))
    with pytest.raises(DataError, match="habitus"):
        render_phantom({"habitus": "huge"}, image_size=64, rng=np.random.default_rng(0))


def test_kermany_patient_ids_match_the_folder_loader(kermany):
    """Loading the chest_xray folder itself gives the same patients as the manifest."""
    from crslib.data import kermany_patient_id, load_image_folder

    root, df = kermany
    parsed = [kermany_patient_id(Path(p).name, s) for p, s in zip(df["path"], df["split"])]
    assert parsed == df["patient_id"].tolist()
    folder = load_image_folder(root / "chest_xray").set_index("path")
    absolute = [str((root / p).resolve()) for p in df["path"]]
    assert folder.loc[absolute, "patient_id"].tolist() == df["patient_id"].tolist()


def test_the_same_phantom_asked_for_twice_at_once_is_generated_whole(tmp_path, monkeypatch) -> None:
    """Chapters run side by side ask for the same phantom at once: each reader gets it whole, once.

    A generates and reads its phantom while B is still generating the same one
    (B has removed its manifest, as generate_phantom starts, and left a
    half-written file). Both get the same complete phantom, and one folder
    is left, without a private copy.
    """
    import threading

    from crslib.data import load_data, phantom

    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path / "cache"))
    real = phantom.generate_phantom
    b_writing, a_read = threading.Event(), threading.Event()

    def generate(out_dir, **kwargs):
        if threading.current_thread().name == "A":
            real(out_dir, **kwargs)
            assert b_writing.wait(30)
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "manifest.csv").unlink(missing_ok=True)  # as generate_phantom starts
        half = Path(out_dir) / "half_written.png.tmp"
        half.write_bytes(b"")
        b_writing.set()
        assert a_read.wait(30)
        half.unlink()
        real(out_dir, **kwargs)

    monkeypatch.setattr(phantom, "generate_phantom", generate)
    results, errors = {}, []

    def read(name: str) -> None:
        try:
            results[name] = load_data("phantom?patients=16&size=32&seed=5")
        except Exception as exc:  # noqa: BLE001 - the test reports it below
            errors.append(exc)
        finally:
            if name == "A":
                a_read.set()

    threads = [threading.Thread(target=read, args=(name,), name=name) for name in ("A", "B")]
    threads[0].start()
    while not (tmp_path / "cache" / "phantom").is_dir():  # B starts once A is generating
        pass
    threads[1].start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert not results["A"].attrs.get("ignored_files"), results["A"].attrs["ignored_files"]
    pd.testing.assert_frame_equal(results["A"], results["B"])
    assert all(Path(p).is_file() for p in results["A"]["path"])
    folders = sorted(p.name for p in (tmp_path / "cache" / "phantom").iterdir())
    assert len(folders) == 1 and not folders[0].startswith(".")  # one phantom, no private copy left

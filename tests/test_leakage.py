"""Tests of crslib.leakage and crslib.duplicates: duplicate images and shared patients across splits.

Ground truth comes from construction: a Kermany-layout folder of real image
tiles (``tests/realdata.py``) with every tile distinct, and a copy of it with
planted duplicates of known kinds (the same pixels in another format, JPEG
re-encodes, resized and cropped copies) across and within splits. The audit
must find every planted pair and no other; on the distinct folder, none.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from realdata import write_kermany

from crslib.data import kermany_patient_id, load_image_folder, read_image
from crslib.duplicates import (
    DEFAULT_MAX_DISTANCE,
    ImageFingerprints,
    digest_pairs,
    embedding_pairs,
    hash_pairs,
    image_fingerprints,
    perceptual_hashes,
    phash,
    pixel_digest,
)
from crslib.errors import DataError, InputError
from crslib.leakage import (
    duplicate_clusters,
    embedding_near_duplicates,
    leakage_audit,
    patient_overlap,
)

# --------------------------------------------------------------------------- constructed folders


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im)


def _drop_identical_tiles(root: Path) -> None:
    """Keep one file of each set with identical decoded pixels (the flat tiles repeat)."""
    seen: set[bytes] = set()
    for path in sorted(root.rglob("*.jpeg")):
        key = _pixels(path).tobytes()
        if key in seen:
            path.unlink()
        seen.add(key)


def _jpeg(array: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
    buffer.seek(0)
    return np.asarray(Image.open(buffer))


def _resized(array: np.ndarray, width: int, height: int) -> np.ndarray:
    return np.asarray(Image.fromarray(array).resize((width, height), Image.Resampling.LANCZOS))


#: (kind, direction, how the copy is made, file suffix); direction "pool>test" copies a training
#: pool tile into the test split, "test>train" the other way, "train>val" and "test>test" stay in a side.
PLANTS = [
    ("exact", "pool>test", lambda a: a, "png"),
    ("exact", "pool>test", lambda a: a, "bmp"),
    ("exact", "test>train", lambda a: a, "png16"),
    ("exact", "train>val", lambda a: a, "png"),
    ("jpeg", "pool>test", lambda a: _jpeg(a, 95), "jpeg"),
    ("jpeg", "pool>test", lambda a: _jpeg(a, 50), "jpeg"),
    ("jpeg", "test>test", lambda a: _jpeg(a, 85), "jpeg"),
    ("resized", "pool>test", lambda a: _resized(a, 58, 58), "png"),
    ("resized", "pool>test", lambda a: _resized(a, 70, 70), "png"),
    ("resized", "test>train", lambda a: _resized(a, 64, 60), "png"),
    ("cropped", "pool>test", lambda a: a[2:-2, 2:-2], "png"),
    ("cropped", "pool>test", lambda a: a[3:, 3:], "png"),
    ("cropped", "pool>test", lambda a: _jpeg(np.ascontiguousarray(a[:, :-3]), 90), "jpeg"),
    ("cropped", "test>train", lambda a: a[:-2, 1:], "png"),
]


def _save_copy(array: np.ndarray, path: Path, suffix: str) -> None:
    if suffix == "png16":  # the same picture at 16 bits: 257 * v maps 255 to 65535
        Image.fromarray(array.astype(np.uint16) * 257).save(path.with_suffix(".png"))
    else:
        Image.fromarray(array).save(path.with_suffix("." + suffix))


def _plant(root: Path, manifest: pd.DataFrame, stable: np.ndarray) -> list[dict]:
    """Write the copies of PLANTS into ``root``; each from its own original with a stable pHash."""
    rng = np.random.default_rng(0)
    pool = rng.permutation(np.flatnonzero(stable & manifest["split"].isin(["train", "val"]).to_numpy()))
    test = rng.permutation(np.flatnonzero(stable & (manifest["split"] == "test").to_numpy()))
    picks = {"pool": list(pool), "test": list(test), "train": [i for i in pool if manifest["split"][i] == "train"]}
    planted, used = [], set()
    for number, (kind, direction, make, suffix) in enumerate(PLANTS, start=9001):
        source, target = direction.split(">")
        row = next(i for i in picks[source] if i not in used  # Pillow writes 16 bits for grey only
                   and (suffix != "png16" or _pixels(Path(manifest["path"][i])).ndim == 2))
        used.add(row)
        original = Path(manifest["path"][row])
        label = original.parent.name
        stem = f"IM-{number}-0001" if label == "NORMAL" else f"person{number}_bacteria_1"
        copy = root / target / label / stem
        copy.parent.mkdir(parents=True, exist_ok=True)
        _save_copy(make(_pixels(original)), copy, suffix)
        copy_path = next(copy.parent.glob(stem + ".*"))
        planted.append({"kind": kind, "original": manifest["image_id"][row], "copy": f"{target}/{label}/{stem}",
                        # a re-encode of a smooth JPEG tile can decode to the very same pixels
                        "identical": np.array_equal(read_image(original), read_image(copy_path))})
    return planted


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The distinct folder and the leaky one, each with its manifest and fingerprints, and the planted pairs."""
    base = tmp_path_factory.mktemp("leakage")
    distinct = write_kermany(base / "distinct" / "chest_xray")
    _drop_identical_tiles(distinct)
    manifest = load_image_folder(distinct)
    fingerprints = image_fingerprints(manifest)
    leaky = base / "leaky" / "chest_xray"
    shutil.copytree(distinct, leaky)
    planted = _plant(leaky, load_image_folder(leaky), fingerprints.stable)
    leaky_manifest = load_image_folder(leaky)
    return {"distinct": (manifest, fingerprints), "leaky": (leaky_manifest, image_fingerprints(leaky_manifest)),
            "planted": planted}


def _pair_ids(finding) -> set[frozenset]:
    return {frozenset(p) for p in zip(finding.pairs["image_id_a"], finding.pairs["image_id_b"])}


def _planted_pairs(planted: list[dict], kinds: tuple[str, ...]) -> set[frozenset]:
    return {frozenset((p["original"], p["copy"])) for p in planted if p["kind"] in kinds}


def _identical_pairs(planted: list[dict]) -> set[frozenset]:
    return {frozenset((p["original"], p["copy"])) for p in planted if p["identical"]}


# --------------------------------------------------------------------------- the audit on images


def test_every_planted_exact_copy_is_found_and_nothing_else(folders) -> None:
    manifest, fingerprints = folders["leaky"]
    result = leakage_audit(manifest, fingerprints)
    planted_exact = _planted_pairs(folders["planted"], ("exact",))
    assert planted_exact <= _identical_pairs(folders["planted"])
    assert _pair_ids(result.exact) == _identical_pairs(folders["planted"])
    scopes = dict(zip(map(frozenset, zip(result.exact.pairs["image_id_a"], result.exact.pairs["image_id_b"])),
                      result.exact.pairs["scope"]))
    assert sorted(scopes[p] for p in planted_exact) == ["across", "across", "across", "between_pool"]


@pytest.mark.parametrize("kind", ["jpeg", "resized", "cropped"])
def test_every_planted_near_copy_is_found(folders, kind: str) -> None:
    manifest, fingerprints = folders["leaky"]
    result = leakage_audit(manifest, fingerprints)
    expected = _planted_pairs(folders["planted"], (kind,))
    assert len(expected) >= 3
    assert expected <= _pair_ids(result.near)


def test_near_duplicates_are_exactly_the_planted_pairs(folders) -> None:
    manifest, fingerprints = folders["leaky"]
    result = leakage_audit(manifest, fingerprints)
    assert _pair_ids(result.near) == _planted_pairs(folders["planted"], ("exact", "jpeg", "resized", "cropped"))
    assert result.near.pairs["score"].max() <= DEFAULT_MAX_DISTANCE


def test_distinct_folder_has_no_duplicate_and_no_shared_patient(folders) -> None:
    manifest, fingerprints = folders["distinct"]
    result = leakage_audit(manifest, fingerprints)
    assert len(result.exact.pairs) == 0
    assert len(result.near.pairs) == 0
    assert len(result.patients.table) == 0
    assert result.leaked_test_mask(kinds=("exact", "near", "patient")).sum() == 0
    assert result.near.calibration["fraction_with_match_in_split"] == 0.0


def test_crop_tolerance_is_what_finds_the_cropped_copies(folders) -> None:
    """Plain pHash (no crops) misses a planted crop that the crop-tolerant match finds."""
    manifest, _ = folders["leaky"]
    plain = leakage_audit(manifest, image_fingerprints(manifest, crop_fractions=(0.0,)))
    cropped = _planted_pairs(folders["planted"], ("cropped",))
    assert not cropped <= _pair_ids(plain.near)
    assert _planted_pairs(folders["planted"], ("jpeg",)) <= _pair_ids(plain.near)


def test_leaked_test_rows_are_the_test_side_of_across_clusters(folders) -> None:
    manifest, fingerprints = folders["leaky"]
    result = leakage_audit(manifest, fingerprints)
    split_of = dict(zip(manifest["image_id"], manifest["split"]))
    expected = set()
    for item in folders["planted"]:
        pair = {item["original"], item["copy"]}
        splits = {split_of[i] for i in pair}
        if "test" in splits and splits & {"train", "val"}:
            expected |= {i for i in pair if split_of[i] == "test"}
    assert set(result.leaked_test_ids()) == expected
    mask = result.leaked_test_mask()
    assert set(manifest["image_id"][mask]) == expected
    exact_only = {i for p in folders["planted"] if p["identical"] and {split_of[p["original"]], split_of[p["copy"]]}
                  & {"train", "val"} for i in (p["original"], p["copy"]) if split_of[i] == "test"}
    assert set(result.leaked_test_ids(kinds=("exact",))) == exact_only
    counts = result.near.counts()
    assert counts["n_test_images_leaked"] == len(expected)
    assert counts["pairs"]["within"] == 1 and counts["pairs"]["between_pool"] == 1


def test_result_to_dict_is_json_with_counts_clusters_and_calibration(folders) -> None:
    manifest, fingerprints = folders["leaky"]
    X = np.random.default_rng(0).normal(size=(len(manifest), 32))
    result = leakage_audit(manifest, fingerprints, X)
    d = json.loads(result.to_json())
    assert not any(p["identical"] for p in folders["planted"] if p["kind"] != "exact")  # else counts differ
    assert d["summary"]["exact"]["across_pairs"] == 3
    assert d["exact"]["pairs"] == {"across": 3, "within": 0, "between_pool": 1, "other": 0}
    cluster = d["exact"]["clusters"][0]
    assert cluster["scope"] == "across" and cluster["size"] == 2 and len(cluster["paths"]) == 2
    assert set(cluster["splits"]) == {"train", "test"} or set(cluster["splits"]) == {"val", "test"}
    assert d["near"]["settings"]["max_distance"] == DEFAULT_MAX_DISTANCE
    assert set(d["embedding"]["calibration"]) >= {"threshold", "median_nn_cosine", "nn_cosine_quantiles", "ratio"}
    assert d["n_leaked_test_images"] == len(result.leaked_test_ids())
    assert d["patients"]["label"] == "possible same patient"


# --------------------------------------------------------------------------- fingerprints


def _reference_phash(image: np.ndarray) -> int:
    """pHash written out with PIL and scipy: area-resample to 128 then 32, 2-D DCT, top-left 8 x 8 > median."""
    from scipy.fft import dctn

    grey = image.mean(axis=2) if image.ndim == 3 else image
    work = Image.fromarray(grey.astype(np.float32), mode="F").resize((128, 128), Image.Resampling.BOX)
    thumb = np.asarray(work.resize((32, 32), Image.Resampling.BOX), dtype=np.float64)
    block = dctn(thumb, type=2, norm="ortho")[:8, :8].ravel()
    return int("".join("1" if c > np.median(block) else "0" for c in block), 2)


SKIMAGE = ("camera", "astronaut", "coins", "moon", "brick", "chelsea", "coffee", "immunohistochemistry")


def _skimage(name: str) -> np.ndarray:
    from skimage import data

    return getattr(data, name)()


@pytest.mark.parametrize("name", SKIMAGE)
def test_phash_equals_the_textbook_computation(name: str) -> None:
    image = _skimage(name) / 255.0
    assert phash(image) == _reference_phash(image)


def test_phash_keeps_copies_close_and_different_images_far() -> None:
    copies, others = [], []
    hashes = {}
    for name in SKIMAGE:
        array = _skimage(name)
        h = phash(array / 255.0)
        hashes[name] = h
        height, width = array.shape[:2]
        for copy in (_jpeg(array, 30), _jpeg(array, 90), _resized(array, width // 2, height // 2),
                     _resized(array, int(width * 1.1), int(height * 0.9))):
            copies.append(bin(h ^ phash(copy / 255.0)).count("1"))
    names = list(hashes)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            others.append(bin(hashes[a] ^ hashes[b]).count("1"))
    assert max(copies) <= 6
    assert min(others) >= 16


def test_pixel_digest_ignores_the_container_and_sees_one_pixel(tmp_path: Path) -> None:
    array = _skimage("camera")[:50, :60]
    Image.fromarray(array).save(tmp_path / "a.png")
    Image.fromarray(array).save(tmp_path / "a.bmp")
    Image.fromarray(array.astype(np.uint16) * 257).save(tmp_path / "a16.png")
    Image.fromarray(np.repeat(array[:, :, None], 3, axis=2)).save(tmp_path / "rgb.png")
    digests = {p.name: pixel_digest(read_image(p)) for p in tmp_path.iterdir()}
    assert len(set(digests.values())) == 1, digests
    assert pixel_digest(array / 255.0) == digests["a.png"]  # float64 in, float32 from read_image: one digest
    changed = array.copy()
    changed[10, 10] ^= 1
    assert pixel_digest(changed / 255.0) != digests["a.png"]
    assert pixel_digest(array[:, :59] / 255.0) != digests["a.png"]
    with pytest.raises(InputError, match="divide 8-bit pixels by 255"):
        pixel_digest(array)


def test_flat_images_are_unstable_and_two_are_not_paired() -> None:
    flat = np.full((40, 40), 0.3)
    _, _, stable = perceptual_hashes(flat)
    assert not stable
    assert perceptual_hashes(_skimage("camera") / 255.0)[2]
    hashes = np.array([0, 0, 0], dtype=np.uint64)
    pairs, _, _ = hash_pairs(hashes, stable=[False, False, True])
    assert pairs.tolist() == [[0, 2], [1, 2]]


def test_hash_pairs_reports_the_within_split_nearest_distance() -> None:
    hashes = np.array([0b0, 0b111, 0b1, 2**64 - 1], dtype=np.uint64)
    pairs, distances, nearest = hash_pairs(hashes, max_distance=2, groups=["a", "a", "b", "b"])
    assert pairs.tolist() == [[0, 2], [1, 2]] and distances.tolist() == [1, 2]
    assert nearest.tolist() == [3, 3, 63, 63]


def test_digest_pairs_pairs_every_member_of_a_group() -> None:
    assert digest_pairs(["x", None, "x", "y", "x"]).tolist() == [[0, 2], [0, 4], [2, 4]]
    assert digest_pairs(["x", "y"]).shape == (0, 2)


# --------------------------------------------------------------------------- embeddings


def _near_copy(x: np.ndarray, cosine: float, rng: np.random.Generator) -> np.ndarray:
    """A vector at the given cosine similarity from ``x``."""
    noise = rng.normal(size=x.shape)
    noise -= (noise @ x) / (x @ x) * x
    noise *= np.linalg.norm(x) / np.linalg.norm(noise)
    return cosine * x + np.sqrt(1 - cosine**2) * noise


def _nn_cosines(X: np.ndarray, split: np.ndarray) -> np.ndarray:
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -2)
    sims[split[:, None] != split[None, :]] = -2
    return sims.max(axis=1)


@pytest.mark.parametrize("offset", [0.0, 3.0])
def test_embedding_calibration_finds_planted_near_copies_and_reports_its_numbers(offset: float) -> None:
    """Centred and all-positive (CNN-like, cosines near 1) embeddings alike."""
    rng = np.random.default_rng(1)
    X = np.abs(rng.normal(size=(400, 96))) + offset if offset else rng.normal(size=(400, 96))
    split = np.array(["train"] * 250 + ["val"] * 50 + ["test"] * 100, dtype=object)
    planted = {(3, 310), (40, 320), (260, 330), (7, 120)}  # three across, one within train
    for a, b in planted:
        X[b] = _near_copy(X[a], 0.999, rng)
    found = embedding_near_duplicates(X, split)
    assert {tuple(p) for p in found.pairs[["row_a", "row_b"]].to_numpy()} == planted
    assert sorted(found.pairs["scope"]) == ["across", "across", "across", "within"]
    cal = found.calibration
    nn = _nn_cosines(X, split)
    assert cal["median_nn_cosine"] == pytest.approx(1 - np.median(1 - nn))
    assert cal["threshold"] == pytest.approx(1 - 0.25 * np.median(1 - nn))
    assert cal["threshold_source"] == "calibrated" and cal["n_calibration_images"] == 400
    assert set(found.leaked_test_rows()) == {310, 320, 330}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dim", [64, 256])
def test_embedding_calibration_finds_nothing_in_iid_data(seed: int, dim: int) -> None:
    X = np.random.default_rng(seed).normal(size=(500, dim))
    split = np.array(["train"] * 350 + ["val"] * 50 + ["test"] * 100)
    found = embedding_near_duplicates(X, split)
    assert len(found.pairs) == 0
    assert found.calibration["fraction_with_match_in_split"] == 0.0


def test_a_given_threshold_replaces_the_calibrated_one() -> None:
    X = np.random.default_rng(0).normal(size=(100, 16))
    pairs, cosines, cal = embedding_pairs(X, ["train"] * 100, threshold=-1.0)
    assert len(pairs) == 100 * 99 // 2 and cal["threshold_source"] == "given"
    assert cal["median_nn_cosine"] == pytest.approx(np.median(_nn_cosines(X, np.array(["t"] * 100))))


# --------------------------------------------------------------------------- clusters


def test_a_chain_of_pairs_is_one_cluster() -> None:
    assert duplicate_clusters([[0, 1], [1, 2]], 5).tolist() == [0, 0, 0, -1, -1]
    assert duplicate_clusters([[3, 4], [0, 1]], 5).tolist() == [0, 0, -1, 1, 1]
    assert duplicate_clusters(np.empty((0, 2)), 3).tolist() == [-1, -1, -1]


def test_a_chain_across_three_splits_is_one_across_cluster_of_three() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 64))
    a, b = X[0] / np.linalg.norm(X[0]), rng.normal(size=64)
    b -= (b @ a) * a
    b /= np.linalg.norm(b)
    angle = 0.04  # cos 0.04 = 0.9992 >= 0.999 > cos 0.08 = 0.9968
    X[0], X[30], X[50] = a, np.cos(angle) * a + np.sin(angle) * b, np.cos(2 * angle) * a + np.sin(2 * angle) * b
    split = ["train"] * 30 + ["val"] * 20 + ["test"] * 10
    found = embedding_near_duplicates(X, split, image_ids=[f"img{i}" for i in range(60)], threshold=0.999)
    assert found.pairs[["row_a", "row_b"]].values.tolist() == [[0, 30], [30, 50]]
    clusters = found.clusters()
    assert len(clusters) == 1
    assert clusters[0]["size"] == 3 and clusters[0]["scope"] == "across"
    assert clusters[0]["image_ids"] == ["img0", "img30", "img50"]
    assert found.counts()["pairs"] == {"across": 1, "within": 0, "between_pool": 1, "other": 0}
    assert found.leaked_test_rows().tolist() == [50]


# --------------------------------------------------------------------------- patients


def test_raw_person_numbers_shared_across_splits_are_possible_same_patients() -> None:
    names = [("train", "person5_bacteria_1.jpeg"), ("val", "person5_virus_2.jpeg"),
             ("test", "person5_bacteria_9.jpeg"), ("test", "person6_virus_3.jpeg"),
             ("train", "IM-0003-0001.jpeg"), ("test", "NORMAL2-IM-0003-0002.jpeg"),
             ("train", "person7_virus_4.jpeg"), ("val", "person7_virus_5.jpeg")]
    manifest = pd.DataFrame({
        "image_id": [f"{s}/{n}" for s, n in names], "path": [f"/data/{s}/{n}" for s, n in names],
        "split": [s for s, _ in names], "patient_id": [kermany_patient_id(n, s) for s, n in names]})
    found = patient_overlap(manifest)
    table = found.table.set_index("raw_id")
    assert sorted(table.index) == ["IM-0003", "person5", "person7"]
    assert table.loc["person5", "scope"] == "across" and table.loc["person5", "n_test_images"] == 1
    assert table.loc["person5", "patient_ids"] == "test/person5,train/person5"
    assert table.loc["IM-0003", "scope"] == "across"
    assert table.loc["person7", "scope"] == "between_pool"
    # the loader scopes ids by split, so its ids never cross train and test; val shares train's scope
    assert found.n_manifest_ids_shared == 2
    result = leakage_audit(manifest)
    assert result.leaked_test_rows(kinds=("patient",)).tolist() == [2, 5]
    assert result.leaked_test_rows().tolist() == []
    assert result.to_dict()["patients"]["n_test_images_with_pool_id"] == 2


def test_without_kermany_names_the_manifest_patient_id_is_compared() -> None:
    manifest = pd.DataFrame({"image_id": ["a", "b", "c"], "path": ["a.png", "b.png", "c.png"],
                             "split": ["train", "test", "test"], "patient_id": ["P1", "P1", "P2"]})
    found = patient_overlap(manifest)
    assert found.table["raw_id"].tolist() == ["P1"] and found.id_sources == {"kermany_file_name": 0, "patient_id": 3}


# --------------------------------------------------------------------------- errors


def test_a_manifest_without_path_is_a_data_error() -> None:
    manifest = pd.DataFrame({"image_id": ["a", "b"], "split": ["train", "test"]})
    with pytest.raises(DataError, match="'path'"):
        leakage_audit(manifest)
    with pytest.raises(DataError, match="'path'"):
        image_fingerprints(manifest)


def _small_manifest(n: int) -> pd.DataFrame:
    return pd.DataFrame({"image_id": [f"i{k}" for k in range(n)], "path": [f"i{k}.png" for k in range(n)],
                         "split": ["train"] * (n - 2) + ["test"] * 2})


def test_embeddings_with_another_row_count_are_refused() -> None:
    with pytest.raises(InputError, match="embeddings have 9 rows but the manifest has 10"):
        leakage_audit(_small_manifest(10), embeddings=np.ones((9, 4)))


def test_nan_or_zero_embeddings_are_refused() -> None:
    X = np.random.default_rng(0).normal(size=(10, 4))
    X[3, 1] = np.nan
    with pytest.raises(InputError, match="NaN or infinite values in 1 row"):
        leakage_audit(_small_manifest(10), embeddings=X)
    X[3, 1] = 0.0
    X[5] = 0.0
    with pytest.raises(InputError, match="all-zero row"):
        embedding_near_duplicates(X, ["train"] * 10)


def test_fingerprints_of_another_manifest_are_refused(folders) -> None:
    manifest, fingerprints = folders["distinct"]
    with pytest.raises(InputError, match="recompute them with image_fingerprints"):
        leakage_audit(manifest.iloc[::-1], fingerprints)


@pytest.mark.parametrize("options, message", [
    ({"ratio": 1.5}, "ratio must be between 0 and 1"),
    ({"threshold": 2.0}, "threshold must be a cosine similarity"),
    ({"max_distance": 65}, "max_distance must be an integer from 0 to 64"),
    ({"pool": "test"}, "is also in pool"),
])
def test_bad_options_are_input_errors(folders, options: dict, message: str) -> None:
    manifest, fingerprints = folders["distinct"]
    X = np.random.default_rng(0).normal(size=(len(manifest), 8))
    with pytest.raises(InputError, match=message):
        leakage_audit(manifest, fingerprints, X, **options)


def test_kinds_must_be_known(folders) -> None:
    manifest, fingerprints = folders["distinct"]
    with pytest.raises(InputError, match="unknown kind"):
        leakage_audit(manifest, fingerprints).leaked_test_rows(kinds=("pixels",))


def test_crop_fractions_are_checked() -> None:
    with pytest.raises(InputError, match="start with 0.0"):
        perceptual_hashes(np.eye(8), crop_fractions=(0.05,))


# --------------------------------------------------------------------------- what counts as leakage


def _look_alike(n_train: int = 12, n_test: int = 8) -> tuple[pd.DataFrame, ImageFingerprints]:
    """A manifest whose images all share one pHash but no pixels: a hash that cannot tell them apart."""
    n = n_train + n_test
    manifest = pd.DataFrame({"image_id": [f"i{k}" for k in range(n)], "path": [f"i{k}.png" for k in range(n)],
                             "split": ["train"] * n_train + ["test"] * n_test})
    fingerprints = ImageFingerprints(image_ids=manifest["image_id"].to_numpy(dtype=object),
                                     digests=np.array([f"d{k}" for k in range(n)], dtype=object),
                                     hashes=np.full((n, 1), 12345, dtype=np.uint64), identity=0,
                                     stable=np.ones(n, dtype=bool), crop_fractions=(0.0,))
    return manifest, fingerprints


def test_a_near_kind_matching_most_images_in_their_own_split_is_not_counted_as_leakage() -> None:
    manifest, fingerprints = _look_alike()
    result = leakage_audit(manifest, fingerprints)
    assert result.near.counts()["n_test_images_leaked"] == 8  # every test image "matches" the pool
    assert result.near_informative is False and result.counted_kinds() == ("exact",)
    assert result.leaked_test_mask().sum() == 0 and result.leaked_test_ids() == []
    assert result.leaked_test_mask(kinds=("near",)).sum() == 8  # asked for by name, it is still there
    d = result.to_dict()
    assert d["near_informative"] is False and d["n_leaked_test_images"] == 0
    counts = pd.DataFrame(d["counts"]).set_index("kind")
    assert counts.loc["near", "counted"] == "no: not informative on this data"
    assert counts.loc["near", "across"] == 1 and counts.loc["exact", "across"] == 0
    assert "near duplicates (pHash): not informative on this data" in result.summary()


def test_counts_table_has_one_row_per_kind_and_the_clusters_per_scope(folders) -> None:
    manifest, fingerprints = folders["leaky"]
    X = np.random.default_rng(0).normal(size=(len(manifest), 32))
    result = leakage_audit(manifest, fingerprints, X)
    assert result.near_informative is True and result.counted_kinds() == ("exact", "near", "embedding")
    table = result.counts_table().set_index("kind")
    assert list(table.index) == ["exact", "near", "embedding", "patient"]
    for kind in ("exact", "near", "embedding"):
        counts = getattr(result, kind).counts()
        assert table.loc[kind, ["across", "within", "between_pool", "other"]].tolist() == [
            counts["clusters"][s] for s in ("across", "within", "between_pool", "other")]
        assert table.loc[kind, "test_images"] == counts["n_test_images_leaked"]
    assert table.loc["exact", "across"] == 3 and table.loc["patient", "across"] == 0
    assert table.loc["patient", "unit"] == "person numbers" and table.loc["exact", "unit"] == "clusters"
    assert set(table["counted"]) == {"yes", "no: a possible, not a proven, same patient"}
    text = result.summary()
    assert "exact duplicates across pool and test: 3 clusters (3 test images)" in text
    # a copy found by several kinds is one cluster across the split, listed with every kind that found it
    across = result.across_clusters()
    assert len(across) == len({frozenset(c["image_ids"]) for c in across}) == table.loc["near", "across"]
    exact_ids = {frozenset(c["image_ids"]) for c in result.exact.clusters() if c["scope"] == "across"}
    assert all(c["kinds"][:2] == ["exact", "near"] for c in across if frozenset(c["image_ids"]) in exact_ids)
    assert "possible same patients across pool and test: 0 person numbers" in text


def test_counts_table_says_which_kinds_did_not_run() -> None:
    manifest = _small_manifest(6)
    table = leakage_audit(manifest).counts_table().set_index("kind")
    assert table.loc[["exact", "near", "embedding"], "counted"].tolist() == ["not run"] * 3
    assert table.loc[["exact", "near", "embedding"], "across"].isna().all()

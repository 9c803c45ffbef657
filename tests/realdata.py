"""Real images that are not the phantom, in the three layouts a researcher brings.

The tiles are cut from the photographs, micrographs and scans that ship with
scikit-image (``skimage.data``), so the tests need no download. Two classes
of source image make a label a classifier can learn, and each source image's
tiles are spread over several "patients", so that patient-grouped splits
have something to group:

- ``paths``: a flat folder of image files, nothing else (no label, no
  patient, no split);
- ``labelled``: the same kind of tiles with ``manifest.csv`` (``image_id``,
  ``path``, ``patient_id``, ``label``, ``source``), no split;
- ``kermany``: ``train``/``val``/``test`` / ``NORMAL``/``PNEUMONIA`` folders
  with Kermany-style file names (``IM-XXXX-YYYY.jpeg``,
  ``personN_bacteria_M.jpeg``), patients never crossing splits.

Run as a script to write the three folders: ``python tests/realdata.py OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

#: skimage.data images by class (those bundled in the wheel, no download): photographs and textures
#: vs. microscopy, astronomy, fundus and other scientific images
CLASS_A = ("astronaut", "camera", "coffee", "chelsea", "rocket", "brick", "grass", "gravel")
CLASS_B = ("immunohistochemistry", "cell", "hubble_deep_field", "retina", "moon", "coins", "shepp_logan_phantom",
           "clock")
#: The three layouts, in the order the tests build them.
LAYOUTS = ("paths", "labelled", "kermany")
#: The models the own-data book is built with: no zoo model, so the zoo must stay untrained; the public
#: network runs at the tiles' 64 px, not the 224 px it was trained at (the user's choice, kept by the book)
OWN_MODELS = "public:efficientnet_lite0?size=64,timm:resnet18?size=64"
TILE = 64
TILES_PER_IMAGE = 18
#: Tiles per source image in the own-data books (conftest's own_books): 192 images, 64 patients, enough for
#: every assertion on them; the other tests keep :data:`TILES_PER_IMAGE`, whose exact tiles they rely on
#: (the identical tiles that cross the Kermany layout's split, the leakage audit's planted copies).
OWN_BOOK_TILES = 12
TILES_PER_PATIENT = 3


def _source_image(name: str) -> np.ndarray:
    from skimage import data

    image = getattr(data, name)()
    if image.dtype != np.uint8:
        image = image.astype(np.float64)
        image = (255 * (image - image.min()) / (np.ptp(image) or 1)).astype(np.uint8)
    return image


def tiles(per_image: int = TILES_PER_IMAGE) -> pd.DataFrame:
    """Every tile (``array``), with its source image, class (0 or 1) and patient number."""
    rows = []
    patient = 0
    for label, names in ((0, CLASS_A), (1, CLASS_B)):
        for name in names:
            image = _source_image(name)
            h, w = image.shape[:2]
            corners = [(y, x) for y in range(0, h - TILE + 1, TILE) for x in range(0, w - TILE + 1, TILE)]
            pick = np.random.default_rng(len(rows)).permutation(len(corners))[:per_image]
            for i, c in enumerate(sorted(pick)):
                y, x = corners[c]
                if i % TILES_PER_PATIENT == 0:
                    patient += 1
                rows.append({"source": name, "label": label, "patient": patient,
                             "array": np.ascontiguousarray(image[y:y + TILE, x:x + TILE])})
    return pd.DataFrame(rows)


def _save(array: np.ndarray, path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def write_paths_only(out: str | Path, per_image: int = TILES_PER_IMAGE) -> Path:
    """A flat folder of PNG and JPEG tiles without any metadata."""
    out = Path(out)
    for i, row in tiles(per_image).iterrows():
        _save(row["array"], out / f"tile_{i:04d}.{'png' if i % 3 else 'jpg'}")
    return out


def write_labelled(out: str | Path, per_image: int = TILES_PER_IMAGE) -> Path:
    """Tiles with ``manifest.csv``: image_id, path, patient_id, label (text), source; no split."""
    out = Path(out)
    records = []
    for i, row in tiles(per_image).iterrows():
        rel = f"images/{row['source']}_{i:04d}.png"
        _save(row["array"], out / rel)
        records.append({"image_id": f"tile{i:04d}", "path": rel, "patient_id": f"P{row['patient']:03d}",
                        "label": "microscopy" if row["label"] else "photograph", "source": row["source"]})
    pd.DataFrame(records).to_csv(out / "manifest.csv", index=False)
    return out


def write_kermany(out: str | Path, per_image: int = TILES_PER_IMAGE) -> Path:
    """Tiles in Kermany's layout: split / class folders and its file names; patients stay in one split."""
    out = Path(out)
    table = tiles(per_image)
    patients = table["patient"].unique()
    order = np.random.default_rng(0).permutation(patients)
    split_of = {}
    for rank, p in enumerate(order):
        share = rank / len(order)
        split_of[p] = "test" if share < 0.25 else "val" if share < 0.35 else "train"
    counter: dict[int, int] = {}
    for _, row in table.iterrows():
        p = int(row["patient"])
        counter[p] = counter.get(p, 0) + 1
        if row["label"]:
            name = f"PNEUMONIA/person{p}_bacteria_{counter[p]}.jpeg"
        else:
            name = f"NORMAL/IM-{p:04d}-{counter[p]:04d}.jpeg"
        _save(row["array"], out / split_of[p] / name)
    return out


def write_layout(layout: str, out: str | Path, per_image: int = TILES_PER_IMAGE) -> Path:
    """Write one of :data:`LAYOUTS` into ``out``, ``per_image`` tiles from each source image."""
    writers = {"paths": write_paths_only, "labelled": write_labelled, "kermany": write_kermany}
    return writers[layout](out, per_image)


if __name__ == "__main__":  # pragma: no cover - a convenience for building the folders by hand
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "real_tiles")
    for layout in LAYOUTS:
        print(write_layout(layout, target / layout))


def dicom_test_files() -> list[tuple[Path, Path]]:
    """pydicom's and pydicom-data's own test files (``*.dcm``): ``(file, its path under its package's data)``.

    Real DICOM objects of every kind: images in every transfer syntax, and
    files that are not images (structured reports, RT plans, palettes,
    files without pixel data, truncated files).
    """
    import glob
    import importlib.util

    import pydicom

    roots = [Path(pydicom.__file__).parent / "data"]
    spec = importlib.util.find_spec("data_store")  # the pydicom-data package
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parent / "data")
    return sorted({(Path(p), Path(f"set{i}") / Path(p).relative_to(root)) for i, root in enumerate(roots)
                   for p in glob.glob(str(root / "**" / "*.dcm"), recursive=True)})


def write_dicom_folder(out: str | Path) -> Path:
    """Copy :func:`dicom_test_files` into ``out`` (one subfolder per package), as a researcher's DICOM folder."""
    import shutil

    out = Path(out)
    for source, relative in dicom_test_files():
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, out / relative)
    return out

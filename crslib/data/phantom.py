"""The phantom: a procedural, chest-radiograph-like data set with known structure.

Every image is drawn from latent variables that are written next to it, so each
analysis in the book has a ground truth to recover: patient attributes (age,
sex, habitus) shape the anatomy; eight findings with co-occurrence leave
visible marks at recorded positions; each acquisition site has its own
intensity curve, noise, blur, collimation border, laterality marker and file
encoding; two knobs couple the label with the file encoding in the training
pool (``shortcut_strength``) and shift the official test split
(``split_shift``). The same arguments give byte-identical files.

The public entry point is :func:`generate_phantom` (this module: arguments,
prevalence, splits, names, the per-image loop and the two CSV tables);
:func:`render_phantom` draws one image from a latent dictionary
(:mod:`crslib.data.phantom_render`, with the patient latents and anatomy),
:func:`site_signatures` lists the sites and :func:`encode_image` writes one
image the way a site's archive does (:mod:`crslib.data.phantom_sites`). All
of them are importable from here.

Coordinates
-----------
Rendering works in a normalised frame ``x, y`` in ``[-1, 1]`` (``y`` points
down, the image's right is the patient's left as in a PA radiograph). Positions
written to ``latents.csv`` are fractions ``(0..1)`` of the *saved file's* width
and height (origin top left), so they stay valid after a site pads or rescales
its files; sizes are fractions of the saved file's width.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib._io import atomic_write_text
from crslib.data.kermany import _KermanyNamer
from crslib.data.phantom_render import (
    _MAX_SIZE,
    _MIN_SIZE,
    FINDINGS,
    HABITUS,
    SEXES,
    VIEWS,
    _check_int,
    _check_unit,
    _conditional_tables,
    _device_path,
    _heart_geometry,
    _sample_patient,
    render_phantom,
)
from crslib.data.phantom_sites import (
    _MAX_SOURCES,
    FileEncoding,
    SiteSignature,
    _acquisition,
    _shortcut_encodings,
    encode_image,
    site_signatures,
)
from crslib.errors import DataError

log = logging.getLogger(__name__)

__all__ = [
    "FINDINGS",
    "HABITUS",
    "MANIFEST_COLUMNS",
    "SEXES",
    "SPLITS",
    "VIEWS",
    "FileEncoding",
    "SiteSignature",
    "encode_image",
    "generate_phantom",
    "render_phantom",
    "site_signatures",
]

SPLITS: tuple[str, ...] = ("train", "val", "test")

#: Columns of ``manifest.csv``, in order.
MANIFEST_COLUMNS: tuple[str, ...] = (
    "image_id",
    "path",
    "patient_id",
    "split",
    "source",
    "view",
    "modality",
    "label",
    *(f"finding_{name}" for name in FINDINGS),
    "age",
    "sex",
    "habitus",
)

_SPLIT_FRACTIONS = {"standard": (0.70, 0.10, 0.20), "kermany": (0.835, 0.015, 0.15)}


# Marginal prevalence of the findings other than opacity (standard variant),
# multiplied by a per-site factor.
_BASE_PREVALENCE = {
    "effusion": 0.14,
    "cardiomegaly": 0.14,
    "nodule": 0.08,
    "pneumothorax": 0.05,
    "atelectasis": 0.12,
    "edema": 0.10,
    "support_device": 0.12,
}


# --------------------------------------------------------------------------
# Prevalence
# --------------------------------------------------------------------------


def _default_prevalence(j: int, kermany: bool) -> dict[str, float]:
    if kermany:
        pneu = (0.70, 0.76, 0.72, 0.78)[j] if j < 4 else 0.70 + 0.02 * (j % 5)
        return {name: (pneu if name == "opacity" else 0.0) for name in FINDINGS}
    opacity = (0.28, 0.36, 0.31, 0.40)[j] if j < 4 else 0.28 + 0.03 * ((j * 7) % 5)
    factor = (1.0, 1.15, 0.9, 1.1)[j] if j < 4 else 0.9 + 0.05 * (j % 5)
    prev = {name: round(p * factor, 4) for name, p in _BASE_PREVALENCE.items()}
    prev["opacity"] = opacity
    return {name: prev[name] for name in FINDINGS}


def _resolve_prevalence(prevalence: Mapping | None, n_sources: int, kermany: bool) -> list[dict[str, float]]:
    table = [_default_prevalence(j, kermany) for j in range(n_sources)]
    if prevalence is None:
        return table
    if not isinstance(prevalence, Mapping):
        raise DataError(
            "prevalence must be None or a mapping from site name (site0, site1, ...) to the "
            f"opacity prevalence or to a {{finding: prevalence}} mapping, got {type(prevalence).__name__}"
        )
    names = {f"site{j}": j for j in range(n_sources)}
    for site, value in prevalence.items():
        if site not in names:
            raise DataError(
                f"prevalence names an unknown source {site!r}; with n_sources={n_sources} the sources "
                f"are {', '.join(names)}"
            )
        j = names[site]
        if isinstance(value, Mapping):
            items = value.items()
        else:
            items = (("opacity", value),)
        for finding, p in items:
            finding = "opacity" if finding == "pneumonia" else finding
            if finding not in FINDINGS:
                raise DataError(
                    f"prevalence[{site!r}] names an unknown finding {finding!r}; use one of "
                    f"{', '.join(FINDINGS)}"
                )
            if kermany and finding != "opacity":
                raise DataError(
                    f"prevalence[{site!r}][{finding!r}]: the Kermany-like variant has a single label "
                    "(opacity, alias pneumonia); give only its prevalence"
                )
            table[j][finding] = _check_unit(f"prevalence[{site!r}][{finding!r}]", p)
    return table


# --------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------


def _assign_splits(n: int, rng: np.random.Generator, kermany: bool) -> list[str]:
    f_train, f_val, f_test = _SPLIT_FRACTIONS["kermany" if kermany else "standard"]
    order = rng.permutation(n)
    n_test = int(round(f_test * n))
    n_val = int(round(f_val * n))
    if n - n_test - n_val < 1:  # keep at least one training patient
        n_test = max(0, n - n_val - 1)
        if n - n_test - n_val < 1:
            n_val = max(0, n - 1)
    splits = ["train"] * n
    for i in order[:n_test]:
        splits[int(i)] = "test"
    for i in order[n_test:n_test + n_val]:
        splits[int(i)] = "val"
    return splits


def _ensure_val_classes(splits: list[str], labels: list[int], n_images: list[int],
                        min_per_class: int = 2) -> None:
    """Move training patients to val until val holds ``min_per_class`` images of each class
    (never the last training patient of a class)."""
    for cls in (0, 1):
        have = sum(n for s, c, n in zip(splits, labels, n_images) if s == "val" and c == cls)
        left = sum(1 for s, c in zip(splits, labels) if s == "train" and c == cls)
        for i in range(len(splits)):
            if have >= min_per_class or left <= 1:
                break
            if splits[i] == "train" and labels[i] == cls:
                splits[i] = "val"
                have += n_images[i]
                left -= 1


# --------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------


def _warn_stale_files(out: Path, written: set[str], kermany: bool) -> None:
    """Log image files in the output folder that this run did not write (left by an
    earlier, larger or differently configured run); they are not deleted."""
    folder = out / ("chest_xray" if kermany else "images")
    stale = sorted(
        p.relative_to(out).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(out).as_posix() not in written
    )
    if stale:
        log.warning(
            "phantom: %d file(s) under %s are not in the new manifest (left by an earlier run), "
            "e.g. %s; delete the folder first for a clean data set",
            len(stale), folder, ", ".join(stale[:3]),
        )


def _write_file(path: Path, data: bytes) -> None:
    """Write through a temporary name and a rename, so no half-written image ever
    carries its final name. Unlike :func:`crslib._io.atomic_write_bytes` this does
    not fsync each image (that alone would take most of the run time); the two
    CSVs written last are fsynced, and ``manifest.csv`` marks a complete data set."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _to_file_xy(x: float, y: float, lat: Mapping[str, Any], enc: FileEncoding, size: int) -> tuple[float, float]:
    """Anatomical (x, y) in [-1, 1] -> fractions of the saved file's width and height."""
    rot = lat["rotation"]
    cr, sr = math.cos(rot), math.sin(rot)
    X = cr * x - sr * y + lat["shift_x"]
    Y = sr * x + cr * y + lat["shift_y"]
    scaled, px, py, width, height = enc.geometry(size)
    fx = (px + (X + 1.0) / 2.0 * scaled) / width
    fy = (py + (Y + 1.0) / 2.0 * scaled) / height
    return fx, fy


def _latent_row(lat: Mapping[str, Any], enc: FileEncoding, size: int) -> dict[str, Any]:
    scaled, px, py, width, height = enc.geometry(size)
    to_w = scaled / width / 2.0  # normalised length -> fraction of the file width

    def pos(name: str, xy: tuple[float, float] | None, r: float | None, present: bool) -> dict[str, float]:
        if not present or xy is None:
            return {f"{name}_x": np.nan, f"{name}_y": np.nan, f"{name}_size": np.nan}
        fx, fy = _to_file_xy(xy[0], xy[1], lat, enc, size)
        return {f"{name}_x": fx, f"{name}_y": fy, f"{name}_size": (r or 0.0) * to_w}

    mag = 1.12 if lat["view"] == "AP" else 1.0
    dia = lat["diaphragm"] + lat["inspiration"]
    hcx, hcy, hw, hh = _heart_geometry(lat, mag, dia)
    top, tw = lat["top"], lat["thorax_w"]
    row: dict[str, Any] = {}
    op_xy = lat["opacity_xy"]
    if lat["opacity_subtype"] in ("virus", "patchy"):
        op_xy = (0.38 * tw * (1.0 if op_xy[0] >= 0 else -1.0), op_xy[1])
    row.update(pos("opacity", op_xy, lat["opacity_r"], lat["opacity"]))
    eff_side = lat["effusion_side"]
    eff_x = 0.72 * tw * (eff_side if eff_side != 0 else 1.0)
    row.update(pos("effusion", (eff_x, dia - 0.5 * lat["effusion_h"]), lat["effusion_h"], lat["effusion"]))
    row.update(pos("cardiomegaly", (hcx, hcy), hw, lat["cardiomegaly"]))
    row.update(pos("nodule", lat["nodule_xy"], lat["nodule_r"], lat["nodule"]))
    ptx_side = lat["pneumothorax_side"]
    q = lat["pneumothorax_depth"]
    row.update(pos("pneumothorax", (ptx_side * tw * (1.0 - q / 2.0), top + 0.35 * (dia - top)),
                   q * tw, lat["pneumothorax"]))
    row.update(pos("atelectasis", lat["atelectasis_xy"], lat["atelectasis_len"], lat["atelectasis"]))
    row.update(pos("edema", (0.0, top + 0.5 * (dia - top)), 0.30 * lat["edema_severity"], lat["edema"]))
    if lat["support_device"]:
        tip = _device_path(lat["device_kind"], {**lat, "diaphragm": dia}, lat["device_jitter"])[-1]
    else:
        tip = None
    row.update(pos("support_device", tip, max(0.012, 1.6 / size), lat["support_device"]))
    row["opacity_subtype"] = lat["opacity_subtype"] if lat["opacity"] else ""
    row["effusion_side"] = ({-1.0: "right", 1.0: "left", 0.0: "both"}[eff_side]
                            if lat["effusion"] else "")  # patient's side
    row["pneumothorax_side"] = ({-1.0: "right", 1.0: "left"}[ptx_side] if lat["pneumothorax"] else "")
    row["atelectasis_angle"] = lat["atelectasis_angle"] if lat["atelectasis"] else np.nan
    row["edema_severity"] = lat["edema_severity"] if lat["edema"] else np.nan
    row["device_kind"] = lat["device_kind"] if lat["support_device"] else ""
    row["heart_x"], row["heart_y"] = _to_file_xy(hcx, hcy, lat, enc, size)
    row["ctr"] = lat["ctr"]
    row["ctr_apparent"] = lat["ctr"] * mag
    row["heart_width"] = 2.0 * hw * to_w
    row["thorax_width"] = 2.0 * tw * to_w
    row["lung_height"] = (dia - top) * scaled / height / 2.0
    row["bone_density"] = lat["bone_density"]
    row["lung_density"] = lat["lung_density"]
    row["shift_x"] = lat["shift_x"]
    row["shift_y"] = lat["shift_y"]
    row["rotation"] = lat["rotation"]
    return row


@dataclass(frozen=True)
class _Run:
    """The checked arguments of one :func:`generate_phantom` call and what follows
    from them (the sites and the shortcut's encodings), shared by its steps."""

    out: Path
    n_patients: int
    image_size: int
    seed: int
    n_sources: int
    shortcut_strength: float
    split_shift: float
    kermany: bool
    prev_table: list[dict[str, float]]
    sites: list[SiteSignature]
    shortcut_enc: tuple[FileEncoding, FileEncoding]


def _checked_run(out_dir: str | os.PathLike, *, n_patients: int, image_size: int, seed: int, n_sources: int,
                 shortcut_strength: float, split_shift: float, prevalence: Mapping[str, Any] | None,
                 kermany_layout: bool) -> _Run:
    """Check the arguments of :func:`generate_phantom` (DataError naming the first bad one)."""
    n_patients = _check_int("n_patients", n_patients, 1)
    image_size = _check_int("image_size", image_size, _MIN_SIZE, _MAX_SIZE)
    seed = _check_int("random_state", seed, 0)
    n_sources = _check_int("n_sources", n_sources, 1, _MAX_SOURCES)
    shortcut_strength = _check_unit("shortcut_strength", shortcut_strength)
    split_shift = _check_unit("split_shift", split_shift)
    if not isinstance(kermany_layout, bool):
        raise DataError(f"kermany_layout must be True or False, got {kermany_layout!r}")
    kermany = kermany_layout
    prev_table = _resolve_prevalence(prevalence, n_sources, kermany)
    try:
        out = Path(out_dir)
    except TypeError as exc:
        raise DataError(f"out_dir must be a path, got {out_dir!r}") from exc
    if out.exists() and not out.is_dir():
        raise DataError(f"out_dir {out} exists and is not a folder; choose a folder path")
    return _Run(out=out, n_patients=n_patients, image_size=image_size, seed=seed, n_sources=n_sources,
                shortcut_strength=shortcut_strength, split_shift=split_shift, kermany=kermany,
                prev_table=prev_table, sites=site_signatures(n_sources, kermany_layout=kermany),
                shortcut_enc=_shortcut_encodings(kermany))


def _draw_patients(run: _Run) -> tuple[list[str], list[dict[str, Any]]]:
    """Patient-level splits and latent variables (site, number of images, anatomy,
    findings). The splits draw from ``SeedSequence(seed, spawn_key=(0,))``, patient
    ``i`` from its own stream ``spawn_key=(1, i, 0)``; the official test split draws
    its sites from a mix shifted by ``split_shift``."""
    cond_tables = [_conditional_tables(p) for p in run.prev_table]
    w_pool = np.array([s.pool_weight for s in run.sites], dtype=np.float64)
    w_pool /= w_pool.sum()
    w_alt = np.arange(1, run.n_sources + 1, dtype=np.float64) ** 2
    w_alt /= w_alt.sum()
    w_test = (1.0 - run.split_shift) * w_pool + run.split_shift * w_alt
    cum = {"pool": np.cumsum(w_pool), "test": np.cumsum(w_test)}

    split_rng = np.random.default_rng(np.random.SeedSequence(run.seed, spawn_key=(0,)))
    splits = _assign_splits(run.n_patients, split_rng, run.kermany)
    patients = []
    for i in range(run.n_patients):
        rng = np.random.default_rng(np.random.SeedSequence(run.seed, spawn_key=(1, i, 0)))
        n_img = int(rng.integers(1, 5))
        u_site = float(rng.random())
        j = int(np.searchsorted(cum["test" if splits[i] == "test" else "pool"], u_site, side="right"))
        j = min(j, run.n_sources - 1)
        pat = _sample_patient(rng, kermany=run.kermany, cond=cond_tables[j])
        pat["site"] = j
        pat["n_images"] = n_img
        patients.append(pat)
    if run.kermany:
        _ensure_val_classes(splits, [p["opacity"] for p in patients], [p["n_images"] for p in patients])
    return splits, patients


def _name_images(run: _Run, splits: list[str],
                 patients: list[dict[str, Any]]) -> list[tuple[int, int, str, str, str, str]]:
    """``(patient index, image index, patient_id, image_id, folder, file stem)`` of every image.

    Standard layout: patients ``P00000``, ..., images ``P00000_1``, ... under
    ``images/``. Kermany layout: names by Kermany's rule
    (:class:`~crslib.data.kermany._KermanyNamer`, next to the parser
    :func:`~crslib.data.kermany.kermany_patient_id`, which gives the patient id)
    under ``chest_xray/{split}/{NORMAL,PNEUMONIA}/``, image id ``{split}-{stem}``.
    """
    width = max(5, len(str(run.n_patients - 1)))
    namer = _KermanyNamer()
    jobs = []
    for i, pat in enumerate(patients):
        split = splits[i]
        if run.kermany:
            patient_id, stems = namer.patient(split, pat["n_images"], pneumonia=bool(pat["opacity"]),
                                              subtype=pat["opacity_subtype"],
                                              normal2=(pat["vessel_seed"] % 100) < 35)
            rel_dir = f"chest_xray/{split}/{'PNEUMONIA' if pat['opacity'] else 'NORMAL'}"
            jobs += [(i, k, patient_id, f"{split}-{stem}", rel_dir, stem) for k, stem in enumerate(stems)]
        else:
            patient_id = f"P{i:0{width}d}"
            for k in range(pat["n_images"]):
                stem = image_id = f"{patient_id}_{k + 1}"
                jobs.append((i, k, patient_id, image_id, "images", stem))
    return jobs


def _image_latent(pat: Mapping[str, Any], site: SiteSignature, shift: float,
                  irng: np.random.Generator) -> dict[str, Any]:
    """One image's latent variables: the patient's, plus the view, pose and the
    site's acquisition in a batch shifted by ``shift``, and lesion positions
    jittered per image (drawn from ``irng`` in this order)."""
    p_ap = site.p_ap + 0.30 * pat["support_device"] + 0.15 * pat["edema"] + 0.25 * shift
    p_ap = min(0.95, p_ap)
    lat = dict(pat)
    lat.update({
        "view": "AP" if irng.random() < p_ap else "PA",
        "shift_x": 0.02 * float(irng.standard_normal()),
        "shift_y": 0.02 * float(irng.standard_normal()),
        "rotation": 0.03 * float(irng.standard_normal()),
        "inspiration": 0.03 * float(irng.standard_normal()),
        **_acquisition(site, shift),
        "border_value": site.border_value,
        "marker_letter": site.marker_letter, "marker_x": site.marker_x, "marker_y": site.marker_y,
        "batch_shift": shift,
    })
    jit = 0.015
    for key in ("opacity_xy", "nodule_xy", "atelectasis_xy"):
        bx, by = pat[key]
        lat[key] = (bx + jit * float(irng.standard_normal()), by + jit * float(irng.standard_normal()))
    return lat


def _make_image(run: _Run, job: tuple[int, int, str, str, str, str], pat: Mapping[str, Any],
                split: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Render, encode and write one image; return its manifest row and its
    ``latents.csv`` row. The image draws from ``spawn_key=(1, i, 1, k)``, the
    shortcut's choice of encoding from ``spawn_key=(1, i, 2, k)``."""
    i, k, patient_id, image_id, rel_dir, stem = job
    site = run.sites[pat["site"]]
    pool = split != "test"
    irng = np.random.default_rng(np.random.SeedSequence(run.seed, spawn_key=(1, i, 1, k)))
    crng = np.random.default_rng(np.random.SeedSequence(run.seed, spawn_key=(1, i, 2, k)))
    shift = 0.0 if pool else run.split_shift
    lat = _image_latent(pat, site, shift, irng)
    image = render_phantom(lat, image_size=run.image_size, rng=irng)
    label = int(pat["opacity"])
    by_shortcut = bool(pool and crng.random() < run.shortcut_strength)
    enc = run.shortcut_enc[label] if by_shortcut else site.encoding
    data = encode_image(image, enc)
    suffix = "jpeg" if run.kermany else enc.suffix
    rel = f"{rel_dir}/{stem}.{suffix}"
    _write_file(run.out / rel, data)
    _, _, _, fw, fh = enc.geometry(run.image_size)
    row = {
        "image_id": image_id, "path": rel, "patient_id": patient_id, "split": split,
        "source": site.name, "view": lat["view"], "modality": "DX", "label": label,
        **{f"finding_{name}": int(pat[name]) for name in FINDINGS},
        "age": pat["age"], "sex": pat["sex"], "habitus": pat["habitus"],
    }
    lrow = {"image_id": image_id, "patient_id": patient_id, "split": split,
            "batch": "later" if not pool else "pool", "batch_shift": shift,
            "source": site.name, "view": lat["view"], "age": pat["age"], "sex": pat["sex"],
            "habitus": pat["habitus"], "label": label,
            **{f"finding_{name}": int(pat[name]) for name in FINDINGS}}
    lrow.update(_latent_row(lat, enc, run.image_size))
    lrow.update({
        "gamma": lat["gamma"], "window_low": lat["low"], "window_high": lat["high"],
        "noise": lat["noise"], "blur": lat["blur"], "border": lat["border"],
        "border_value": site.border_value, "marker_letter": site.marker_letter,
        "marker_x": site.marker_x, "marker_y": site.marker_y,
        "encoding": enc.name, "encoding_by_shortcut": int(by_shortcut), "file_format": enc.format,
        "jpeg_quality": enc.quality, "jpeg_subsampling": enc.subsampling,
        "jpeg_progressive": int(enc.progressive), "color_mode": enc.mode,
        "file_width": fw, "file_height": fh, "file_bytes": len(data),
    })
    return row, lrow


def _write_tables(run: _Run, rows: list[dict[str, Any]], latent_rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Write ``latents.csv``, then ``manifest.csv`` (the completion marker); return
    the manifest with absolute paths."""
    out = run.out
    _warn_stale_files(out, {row["path"] for row in rows}, run.kermany)
    manifest = pd.DataFrame(rows, columns=list(MANIFEST_COLUMNS))
    latents = pd.DataFrame(latent_rows)
    atomic_write_text(out / "latents.csv", latents.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    atomic_write_text(out / "manifest.csv",
                      manifest.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    log.info("phantom: wrote %d images of %d patients to %s", len(manifest), run.n_patients, out)
    result = manifest.copy()
    result["path"] = [str((out / p).resolve()) for p in manifest["path"]]
    result.attrs["root"] = str(out.resolve())
    return result


def generate_phantom(
    out_dir: str | os.PathLike,
    *,
    n_patients: int = 300,
    image_size: int = 64,
    random_state: int = 0,
    n_sources: int = 4,
    shortcut_strength: float = 0.0,
    split_shift: float = 0.0,
    prevalence: Mapping[str, Any] | None = None,
    kermany_layout: bool = False,
    progress: bool = False,
) -> pd.DataFrame:
    """Generate the phantom data set: image files, ``manifest.csv`` and ``latents.csv``.

    Patients (1-4 images each, 2.5 on average) get an age, sex and habitus
    that shape the anatomy, up to eight co-occurring findings, a site and a
    patient-level split (train/val/test, 70/10/20). Each image is rendered at
    ``image_size`` and saved with its site's file encoding. The same arguments
    give byte-identical files.

    Parameters
    ----------
    out_dir : str or os.PathLike
        Folder to write (created). Files of an earlier run are overwritten;
        ``manifest.csv`` is removed first and written last, so its presence
        marks a complete data set.
    n_patients : int, default 300
        Number of patients (at least 1).
    image_size : int, default 64
        Rendered image size in pixels, 32-512. Some sites save padded or
        rescaled files, so file dimensions vary.
    random_state : int, default 0
        Seed (non-negative). Each patient draws from its own child stream
        (``numpy.random.SeedSequence(random_state, spawn_key=...)``).
    n_sources : int, default 4
        Number of sites (``site0`` ...), 1-64.
    shortcut_strength : float, default 0.0
        In the training pool (train and val) each image's file encoding is
        chosen by its label (opacity / pneumonia) instead of its site with
        this probability; the test split always uses the site encoding. The
        pixels do not depend on this knob, only the files' encoding.
    split_shift : float, default 0.0
        The test split comes from a later acquisition batch whose intensity
        curve, window, blur, noise, collimation, site mix and share of AP views
        differ by this amount (0: same distribution as the pool).
    prevalence : mapping, optional
        Per-site prevalence: ``{"site1": 0.5}`` sets the opacity (label)
        prevalence of ``site1``; ``{"site1": {"edema": 0.2, ...}}`` sets any
        findings. Values are marginal prevalences; sites not named keep their
        defaults (opacity 0.28-0.40 by site; pneumonia 0.70-0.78 in the
        Kermany-like variant).
    kermany_layout : bool, default False
        The Kermany-like variant: pediatric patients (0.5-6 years), a single
        label (pneumonia = opacity, subtypes bacteria/virus), every file a
        JPEG under ``chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}/`` with
        Kermany-style names, a tiny val split (about 1.5 % of patients, at
        least two images per class when possible).
    progress : bool, default False
        Show a tqdm progress bar.

    Returns
    -------
    pandas.DataFrame
        The manifest (columns :data:`MANIFEST_COLUMNS`) with ``path`` made
        absolute; ``manifest.csv`` stores paths relative to ``out_dir``
        (posix). ``df.attrs["root"]`` is ``out_dir``.

    Raises
    ------
    DataError
        An argument is out of range or ``out_dir`` is a file.

    Notes
    -----
    ``latents.csv`` has one row per image: ``image_id``, ``patient_id``,
    ``split``, ``batch`` ("pool" or "later") and ``batch_shift``; the patient
    attributes and findings; per finding ``<name>_x``, ``<name>_y`` (fractions
    of the saved file's width and height) and ``<name>_size`` (fraction of its
    width: lesion radius, effusion height, pneumothorax depth, atelectasis
    half-length, heart half-width for cardiomegaly, edema extent, device line
    width at the device tip), empty when the finding is absent; subtype
    columns (``opacity_subtype``, ``effusion_side``, ``pneumothorax_side``,
    ``device_kind``, ...); anatomy (``ctr``, ``ctr_apparent``, ``heart_x``,
    ``heart_y``, ``heart_width``, ``thorax_width``, ``lung_height``,
    ``bone_density``, ``lung_density``, pose); the effective acquisition
    (``gamma``, ``window_low``, ``window_high``, ``noise``, ``blur``,
    ``border``, ``border_value``, ``marker_letter``, ``marker_x``,
    ``marker_y``); and the file encoding (``encoding``,
    ``encoding_by_shortcut``, ``file_format``, ``jpeg_quality``,
    ``jpeg_subsampling``, ``jpeg_progressive``, ``color_mode``,
    ``file_width``, ``file_height``, ``file_bytes``).

    Image files are written through a temporary name and a rename (never
    half-written under their final name) but, for speed, not fsynced one by
    one; the two CSVs are written atomically with fsync, ``manifest.csv``
    last.

    Examples
    --------
    >>> import tempfile
    >>> from crslib.data.phantom import generate_phantom
    >>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=4, random_state=1)
    >>> sorted(set(manifest["split"])) <= ["test", "train", "val"]
    True
    """
    run = _checked_run(out_dir, n_patients=n_patients, image_size=image_size, seed=random_state, n_sources=n_sources,
                       shortcut_strength=shortcut_strength, split_shift=split_shift, prevalence=prevalence,
                       kermany_layout=kermany_layout)
    splits, patients = _draw_patients(run)
    jobs = _name_images(run, splits, patients)

    run.out.mkdir(parents=True, exist_ok=True)
    (run.out / "manifest.csv").unlink(missing_ok=True)

    from tqdm import tqdm

    rows, latent_rows = [], []
    bar = tqdm(total=len(jobs), desc="phantom", unit="img", disable=not progress)
    for job in jobs:
        row, lrow = _make_image(run, job, patients[job[0]], splits[job[0]])
        rows.append(row)
        latent_rows.append(lrow)
        bar.update(1)
    bar.close()
    return _write_tables(run, rows, latent_rows)

"""The phantom: a procedural, chest-radiograph-like data set with known structure.

Every image is drawn from latent variables that are written next to it, so each
analysis in the book has a ground truth to recover: patient attributes (age,
sex, habitus) shape the anatomy; eight findings with co-occurrence leave
visible marks at recorded positions; each acquisition site has its own
intensity curve, noise, blur, collimation border, laterality marker and file
encoding; two knobs couple the label with the file encoding in the training
pool (``shortcut_strength``) and shift the official test split
(``split_shift``). The same arguments give byte-identical files.

The public entry point is :func:`generate_phantom`; :func:`render_phantom`
draws one image from a latent dictionary, :func:`site_signatures` lists the
sites and :func:`encode_image` writes one image the way a site's archive does.

Coordinates
-----------
Rendering works in a normalised frame ``x, y`` in ``[-1, 1]`` (``y`` points
down, the image's right is the patient's left as in a PA radiograph). Positions
written to ``latents.csv`` are fractions ``(0..1)`` of the *saved file's* width
and height (origin top left), so they stay valid after a site pads or rescales
its files; sizes are fractions of the saved file's width.
"""

from __future__ import annotations

import io
import logging
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from scipy import ndimage

from crslib._io import atomic_write_text
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

#: The eight findings, in manifest column order (``finding_<name>``).
FINDINGS: tuple[str, ...] = (
    "opacity",
    "effusion",
    "cardiomegaly",
    "nodule",
    "pneumothorax",
    "atelectasis",
    "edema",
    "support_device",
)
VIEWS: tuple[str, ...] = ("PA", "AP")
SEXES: tuple[str, ...] = ("F", "M")
HABITUS: tuple[str, ...] = ("slim", "normal", "broad")
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

_MIN_SIZE, _MAX_SIZE = 32, 512
_MAX_SOURCES = 64
_SPLIT_FRACTIONS = {"standard": (0.70, 0.10, 0.20), "kermany": (0.835, 0.015, 0.15)}
_DEVICE_KINDS = ("ett", "cvc", "ng", "pacemaker")

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
# (finding, parents, risk ratio): P(finding | any parent) ~ ratio * P(finding),
# with the marginal kept at the requested prevalence.
_COUPLINGS = (
    ("cardiomegaly", (), 1.0),
    ("edema", ("cardiomegaly",), 3.5),
    ("effusion", ("cardiomegaly", "edema"), 3.0),
    ("support_device", ("edema",), 3.0),
    ("atelectasis", ("effusion",), 2.5),
    ("pneumothorax", ("support_device",), 2.0),
    ("opacity", (), 1.0),
    ("nodule", (), 1.0),
)


# --------------------------------------------------------------------------
# Sites and file encodings
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEncoding:
    """How a site (or the shortcut) writes an image file.

    Attributes
    ----------
    name : str
        Identifier written to ``latents.csv`` (``site2`` or ``shortcut_pos``).
    format : {"png8", "png16", "jpeg"}
        Container and bit depth.
    quality : int
        JPEG quality (0 for PNG).
    subsampling : int
        JPEG chroma subsampling for RGB files (0 = 4:4:4, 1 = 4:2:2,
        2 = 4:2:0); -1 when not applicable.
    progressive : bool
        Progressive JPEG.
    mode : {"L", "RGB"}
        Grayscale or three identical channels (JPEG only).
    scale : float
        Resampling factor applied to the rendered image before padding.
    pad_x, pad_y : float
        Black padding on each side, as a fraction of the (scaled) image size.
    text : tuple of (str, str)
        PNG text chunks.
    dpi : int
        PNG pHYs resolution in dots per inch (0: no chunk).
    exif : tuple of (int, str)
        JPEG EXIF tags (never a date).
    comment : str
        JPEG COM segment ("" for none).
    """

    name: str
    format: str
    quality: int = 0
    subsampling: int = -1
    progressive: bool = False
    mode: str = "L"
    scale: float = 1.0
    pad_x: float = 0.0
    pad_y: float = 0.0
    text: tuple[tuple[str, str], ...] = ()
    dpi: int = 0
    exif: tuple[tuple[int, str], ...] = ()
    comment: str = ""

    @property
    def suffix(self) -> str:
        return "png" if self.format.startswith("png") else "jpg"

    def geometry(self, image_size: int) -> tuple[int, int, int, int, int]:
        """``(scaled, pad_x_px, pad_y_px, width, height)`` of the saved file."""
        scaled = int(round(image_size * self.scale))
        px = int(round(self.pad_x * scaled))
        py = int(round(self.pad_y * scaled))
        return scaled, px, py, scaled + 2 * px, scaled + 2 * py


@dataclass(frozen=True)
class SiteSignature:
    """Acquisition and archive signature of one source (site).

    Attributes
    ----------
    name : str
        ``site0``, ``site1``, ...
    gamma : float
        Exponent of the intensity curve (detector response).
    low, high : float
        Output window: intensities map to ``low + (high - low) * a**gamma``.
    noise : float
        Standard deviation of additive noise (intensity units 0..1).
    blur : float
        Gaussian blur sigma in pixels at 64 px (scaled with image size).
    border : float
        Collimation border width as a fraction of the image size.
    border_value : float
        Intensity of the collimated border (1 = unexposed white, 0 = black).
    marker_letter : {"L", "R"}
        Laterality marker burnt into the image.
    marker_x, marker_y : float
        Top-left corner of the marker as fractions of the rendered frame.
    p_ap : float
        Base probability of an AP (rather than PA) view.
    pool_weight : float
        Relative share of patients from this site in the training pool.
    encoding : FileEncoding
        How the site's archive writes files.
    """

    name: str
    gamma: float
    low: float
    high: float
    noise: float
    blur: float
    border: float
    border_value: float
    marker_letter: str
    marker_x: float
    marker_y: float
    p_ap: float
    pool_weight: float
    encoding: FileEncoding


_ACQ_ARCHETYPES = (
    # gamma, low, high, noise, blur, border, border_value, letter, mx, my, p_ap, weight
    (1.00, 0.02, 0.98, 0.010, 0.5, 0.00, 1.00, "L", 0.12, 0.12, 0.15, 0.30),
    (0.80, 0.07, 0.92, 0.025, 0.9, 0.05, 0.95, "R", 0.80, 0.12, 0.30, 0.25),
    (1.30, 0.00, 1.00, 0.018, 0.3, 0.07, 0.00, "L", 0.12, 0.79, 0.45, 0.25),
    (1.12, 0.04, 0.96, 0.032, 0.7, 0.03, 0.90, "R", 0.80, 0.79, 0.25, 0.20),
)


def _standard_encoding(j: int) -> FileEncoding:
    name = f"site{j}"
    cycle, arche = divmod(j, 4)
    if arche == 0:
        return FileEncoding(name, "png8", text=(("Software", f"PhantomPACS {3 + cycle}.2"),
                                                 ("Source", name)))
    if arche == 1:
        return FileEncoding(name, "png16", pad_x=0.0625 + 0.03 * cycle, pad_y=0.0625 + 0.03 * cycle,
                            dpi=150 + 50 * cycle)
    if arche == 2:
        return FileEncoding(name, "jpeg", quality=92 - 3 * cycle,
                            exif=((0x010F, "PhantomRad"), (0x0131, f"{name} CR console")))
    return FileEncoding(name, "jpeg", quality=80 - 4 * cycle, scale=1.25 + 0.125 * cycle,
                        comment=f"{name} archive export")


def _kermany_encoding(j: int) -> FileEncoding:
    name = f"site{j}"
    cycle, arche = divmod(j, 4)
    if arche == 0:
        return FileEncoding(name, "jpeg", quality=95 - 2 * cycle, mode="L")
    if arche == 1:
        return FileEncoding(name, "jpeg", quality=90 - 2 * cycle, mode="RGB", subsampling=2,
                            pad_x=0.0625, pad_y=0.0625, exif=((0x0131, f"{name} viewer"),))
    if arche == 2:
        return FileEncoding(name, "jpeg", quality=85 - 2 * cycle, mode="L", progressive=True,
                            scale=1.25 + 0.125 * cycle, comment=f"{name}")
    return FileEncoding(name, "jpeg", quality=80 - 2 * cycle, mode="RGB", subsampling=0,
                        progressive=True, pad_y=0.125,
                        exif=((0x010F, "PhantomRad"),), comment=f"{name} export")


def _shortcut_encodings(kermany: bool) -> tuple[FileEncoding, FileEncoding]:
    """(negative, positive) encodings used when the shortcut picks the encoding."""
    if kermany:
        neg = FileEncoding("shortcut_neg", "jpeg", quality=97, mode="RGB", subsampling=0,
                           progressive=True, scale=1.5)
        pos = FileEncoding("shortcut_pos", "jpeg", quality=70, mode="L", pad_x=0.125)
    else:
        neg = FileEncoding("shortcut_neg", "png16", scale=1.5)
        pos = FileEncoding("shortcut_pos", "jpeg", quality=65, pad_y=0.125)
    return neg, pos


def site_signatures(n_sources: int = 4, *, kermany_layout: bool = False) -> list[SiteSignature]:
    """The acquisition and file-encoding signatures of the phantom's sites.

    Signatures are fixed per site index (they do not depend on the seed); the
    first four are distinct archetypes and later sites vary them.

    Parameters
    ----------
    n_sources : int, default 4
        Number of sites, 1-64.
    kermany_layout : bool, default False
        Signatures of the Kermany-like variant (every file a JPEG).

    Returns
    -------
    list of SiteSignature

    Examples
    --------
    >>> from crslib.phantom import site_signatures
    >>> [s.encoding.format for s in site_signatures(4)]
    ['png8', 'png16', 'jpeg', 'jpeg']
    """
    n_sources = _check_int("n_sources", n_sources, 1, _MAX_SOURCES)
    sites = []
    for j in range(n_sources):
        cycle, arche = divmod(j, 4)
        g, lo, hi, noise, blur, border, bval, letter, mx, my, p_ap, weight = _ACQ_ARCHETYPES[arche]
        wiggle = ((j * 7919) % 11 - 5) / 5.0 if cycle else 0.0  # fixed, in [-1, 1]
        sites.append(SiteSignature(
            name=f"site{j}",
            gamma=round(g * (1 + 0.08 * wiggle), 4),
            low=lo,
            high=hi,
            noise=round(noise * (1 + 0.2 * wiggle), 4),
            blur=round(max(0.0, blur * (1 + 0.3 * wiggle)), 4),
            border=round(max(0.0, border + 0.01 * wiggle), 4),
            border_value=bval,
            marker_letter=letter,
            marker_x=mx,
            marker_y=round(my - 0.02 * cycle if my > 0.5 else my + 0.02 * cycle, 4),
            p_ap=p_ap,
            pool_weight=weight,
            encoding=_kermany_encoding(j) if kermany_layout else _standard_encoding(j),
        ))
    return sites


def _default_prevalence(j: int, kermany: bool) -> dict[str, float]:
    if kermany:
        pneu = (0.70, 0.76, 0.72, 0.78)[j] if j < 4 else 0.70 + 0.02 * (j % 5)
        return {name: (pneu if name == "opacity" else 0.0) for name in FINDINGS}
    opacity = (0.28, 0.36, 0.31, 0.40)[j] if j < 4 else 0.28 + 0.03 * ((j * 7) % 5)
    factor = (1.0, 1.15, 0.9, 1.1)[j] if j < 4 else 0.9 + 0.05 * (j % 5)
    prev = {name: round(p * factor, 4) for name, p in _BASE_PREVALENCE.items()}
    prev["opacity"] = opacity
    return {name: prev[name] for name in FINDINGS}


# --------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DataError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise DataError(f"{name} must be {bound}, got {value}")
    return value


def _check_unit(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataError(f"{name} must be a number in [0, 1], got {value!r}")
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise DataError(f"{name} must be in [0, 1], got {value}")
    return value


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
# Latent variables
# --------------------------------------------------------------------------


def _age_curves(age: float) -> dict[str, float]:
    """Anatomy that changes with age (monotone in adults)."""
    g = 1.0 - math.exp(-age / 30.0)  # 0 at birth, 0.45 at 18, 0.95 at 90
    if age < 30.0:
        bone = 0.55 + 0.45 * (age / 30.0) ** 0.7
    else:
        bone = 1.0 - 0.55 * (age - 30.0) / 60.0
    return {
        "g": g,
        "bone_density": bone,
        "lung_height": 1.05 + 0.25 * g,
        "lung_density": 0.21 - 0.10 * g,
        "rib_rise": 0.05 + 0.20 * g,
        "rib_drop": 0.15 + 0.45 * g,
        "ctr_base": 0.43 + 0.03 * g + 0.08 * math.exp(-age / 2.5),
        "aortic_knob": 0.045 + 0.045 * g,
        "thymus": max(0.0, 1.0 - age / 3.0),
    }


def _conditional_tables(prev: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """P(finding | a parent present), P(finding | no parent), keeping marginals."""
    out: dict[str, tuple[float, float]] = {}
    for name, parents, ratio in _COUPLINGS:
        p = prev[name]
        if not parents:
            out[name] = (p, p)
            continue
        if len(parents) == 1:
            a = prev[parents[0]]
        else:  # P(A or B) with B's conditional on A already fixed
            pa, pb = prev[parents[0]], prev[parents[1]]
            b_depends_on_a = parents[1] in out and _parents_of(parents[1]) == (parents[0],)
            pb_given_a = out[parents[1]][0] if b_depends_on_a else pb
            a = pa + pb - pa * pb_given_a
        if a <= 0.0 or a >= 1.0 or p <= 0.0:
            out[name] = (p, p)
            continue
        # P(f | parent) as high as the ratio asks, within what keeps both conditionals in [0, 1]
        p1 = min(1.0, max(min(ratio * p, p / a), (p - (1.0 - a)) / a))
        p0 = min(1.0, max(0.0, (p - a * p1) / (1.0 - a)))
        out[name] = (p1, p0)
    return out


def _parents_of(name: str) -> tuple[str, ...]:
    for finding, parents, _ in _COUPLINGS:
        if finding == name:
            return parents
    return ()


def _side_lung_point(rng: np.random.Generator, anat: Mapping[str, float], side: float,
                     x_range: tuple[float, float], y_range: tuple[float, float]) -> tuple[float, float]:
    """A point inside the lung on ``side`` (+1 image right, -1 image left), avoiding the heart."""
    top, dia, tw = anat["top"], anat["diaphragm"], anat["thorax_w"]
    hcx, hcy, hw, hh = _heart_geometry(anat, 1.0)
    for _ in range(32):
        fx = rng.uniform(*x_range)
        fy = rng.uniform(*y_range)
        y = top + fy * (dia - top)
        t = (y - anat["thorax_cy"]) / (anat["thorax_cy"] - top)
        half = tw * math.sqrt(max(0.0, 1.0 - t * t))
        x = side * (0.14 + fx * (half - 0.2))
        in_heart = ((x - hcx) / (hw + 0.06)) ** 2 + ((y - hcy) / (hh + 0.06)) ** 2 < 1.0
        if half > 0.3 and not in_heart:
            return x, y
    return side * 0.45 * tw, top + 0.35 * (dia - top)


def _anatomy(age: float, sex: str, habitus: str) -> dict[str, Any]:
    """Mean anatomy of a patient with these attributes (no random variation)."""
    curves = _age_curves(age)
    hab = {"slim": 0.9, "normal": 1.0, "broad": 1.1}[habitus]
    tw = 0.66 * hab * (1.03 if sex == "M" else 0.97) * (1.0 + 0.06 * math.exp(-age / 8.0))
    top = -0.80
    dia = top + curves["lung_height"]
    return {
        "age": round(float(age), 2),
        "sex": sex,
        "habitus": habitus,
        "thorax_w": tw,
        "top": top,
        "diaphragm": dia,
        "thorax_cy": dia + 0.05,
        "dome_h": 0.10,
        "bone_density": curves["bone_density"],
        "lung_density": curves["lung_density"],
        "soft_tissue": 0.42 * {"slim": 0.9, "normal": 1.0, "broad": 1.12}[habitus],
        "rib_rise": curves["rib_rise"],
        "rib_drop": curves["rib_drop"],
        "rib_phase": 0.0,
        "aortic_knob": curves["aortic_knob"],
        "thymus": curves["thymus"],
        "breast": 1.0 if (sex == "F" and age >= 14.0) else 0.0,
        "vessel_seed": 0,
        "ctr": curves["ctr_base"],
        # lesion parameters (used only when the finding is present)
        "opacity_xy": (0.45 * tw, top + 0.55 * (dia - top)),
        "opacity_r": 0.2,
        "opacity_subtype": "lobar",
        "effusion_side": 0.0,
        "effusion_h": 0.22,
        "nodule_xy": (-0.45 * tw, top + 0.35 * (dia - top)),
        "nodule_r": 0.065,
        "pneumothorax_side": -1.0,
        "pneumothorax_depth": 0.3,
        "atelectasis_xy": (0.45 * tw, top + 0.75 * (dia - top)),
        "atelectasis_len": 0.22,
        "atelectasis_angle": 0.15,
        "atelectasis_side": 1.0,
        "edema_severity": 0.8,
        "device_kind": "ett",
        "device_jitter": 0.0,
        **{name: 0 for name in FINDINGS},
    }


def _sample_patient(rng: np.random.Generator, *, kermany: bool,
                    cond: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """Patient-level latent variables: attributes, anatomy and findings."""
    if kermany:
        age = 0.5 + 5.5 * rng.beta(1.3, 2.0)
    elif rng.random() < 0.08:
        age = rng.uniform(1.0, 17.0)
    else:
        age = 18.0 + 72.0 * rng.beta(2.2, 1.6)
    sex = SEXES[int(rng.random() < 0.5)]
    habitus = HABITUS[int(rng.choice(3, p=[0.25, 0.5, 0.25]))]
    pat = _anatomy(age, sex, habitus)
    top = pat["top"]
    dia = top + (pat["diaphragm"] - top) * (1.0 + 0.03 * rng.standard_normal())
    pat["diaphragm"] = dia
    pat["thorax_cy"] = dia + 0.05
    pat["dome_h"] = 0.10 + 0.015 * rng.standard_normal()
    pat["bone_density"] *= 1.0 + 0.04 * rng.standard_normal()
    pat["lung_density"] += 0.01 * rng.standard_normal()
    pat["rib_phase"] = float(rng.uniform(0.0, 1.0))
    pat["vessel_seed"] = int(rng.integers(0, 2**31 - 1))
    ctr = pat["ctr"] + 0.02 * rng.standard_normal()
    # Findings with co-occurrence, in dependency order.
    present: dict[str, int] = {}
    for name, parents, _ in _COUPLINGS:
        p1, p0 = cond[name]
        has_parent = any(present.get(p, 0) for p in parents)
        present[name] = int(rng.random() < (p1 if has_parent else p0))
    if present["cardiomegaly"]:
        ctr += rng.uniform(0.12, 0.19)
    pat["ctr"] = float(ctr)
    pat.update(present)
    # Lesion parameters (drawn whether present or not, so the stream does not
    # depend on which findings are present).
    side_op = 1.0 if rng.random() < 0.5 else -1.0
    pat["opacity_xy"] = _side_lung_point(rng, pat, side_op, (0.25, 0.75), (0.30, 0.80))
    pat["opacity_r"] = float(rng.uniform(0.15, 0.25))
    viral = rng.random() < 1.0 / 3.0
    pat["opacity_subtype"] = ("virus" if viral else "bacteria") if kermany else ("patchy" if viral else "lobar")
    pat["effusion_side"] = (-1.0, 1.0, 0.0)[int(rng.choice(3, p=[0.35, 0.35, 0.30]))]
    pat["effusion_h"] = float(rng.uniform(0.14, 0.30))
    side_nod = 1.0 if rng.random() < 0.5 else -1.0
    pat["nodule_xy"] = _side_lung_point(rng, pat, side_nod, (0.2, 0.8), (0.25, 0.75))
    pat["nodule_r"] = float(rng.uniform(0.05, 0.075))
    pat["pneumothorax_side"] = 1.0 if rng.random() < 0.5 else -1.0
    pat["pneumothorax_depth"] = float(rng.uniform(0.22, 0.40))
    side_at = 1.0 if rng.random() < 0.5 else -1.0
    pat["atelectasis_xy"] = _side_lung_point(rng, pat, side_at, (0.3, 0.7), (0.62, 0.82))
    pat["atelectasis_len"] = float(rng.uniform(0.18, 0.28))
    pat["atelectasis_angle"] = float(rng.uniform(-0.35, 0.35))
    pat["atelectasis_side"] = side_at
    pat["edema_severity"] = float(rng.uniform(0.6, 1.0))
    pat["device_kind"] = _DEVICE_KINDS[int(rng.integers(0, len(_DEVICE_KINDS)))]
    pat["device_jitter"] = float(rng.uniform(-0.05, 0.05))
    return pat


def _heart_geometry(lat: Mapping[str, Any], magnification: float,
                    dia: float | None = None) -> tuple[float, float, float, float]:
    tw = lat["thorax_w"]
    dia = lat["diaphragm"] if dia is None else dia
    hw = lat["ctr"] * tw * magnification
    hh = (0.26 + 0.25 * (lat["ctr"] - 0.45)) * magnification
    hcx = 0.28 * hw
    hcy = dia - 0.26
    return hcx, hcy, hw, hh


_DEFAULT_LATENT: dict[str, Any] = {
    "age": 45.0, "sex": "M", "habitus": "normal", "view": "PA",
    "shift_x": 0.0, "shift_y": 0.0, "rotation": 0.0, "inspiration": 0.0,
    "gamma": 1.0, "low": 0.02, "high": 0.98, "noise": 0.015, "blur": 0.5,
    "border": 0.0, "border_value": 1.0, "marker_letter": "L", "marker_x": 0.12, "marker_y": 0.12,
}


def _complete_latent(latent: Mapping[str, Any]) -> dict[str, Any]:
    """Fill missing keys of a latent dictionary (default: a normal adult PA image)."""
    if not isinstance(latent, Mapping):
        raise DataError(f"latent must be a mapping of latent variables, got {type(latent).__name__}")
    for key, allowed in (("sex", SEXES), ("habitus", HABITUS), ("view", VIEWS)):
        if key in latent and latent[key] not in allowed:
            raise DataError(f"latent[{key!r}] must be one of {', '.join(allowed)}, got {latent[key]!r}")
    lat = dict(_DEFAULT_LATENT)
    if "thorax_w" not in latent:
        base = _anatomy(float(latent.get("age", lat["age"])), str(latent.get("sex", lat["sex"])),
                        str(latent.get("habitus", lat["habitus"])))
        if latent.get("cardiomegaly") and "ctr" not in latent:
            base["ctr"] += 0.15
        lat.update(base)
    lat.update(latent)
    return lat


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    c = ((np.arange(size, dtype=np.float64) + 0.5) * (2.0 / size) - 1.0).astype(np.float32)
    X, Y = np.meshgrid(c, c)
    X.setflags(write=False)
    Y.setflags(write=False)
    return X, Y


@lru_cache(maxsize=32)
def _upsample_index(cells: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = (np.arange(size) + 0.5) * (cells / size) - 0.5
    c = np.clip(c, 0.0, cells - 1.0)
    i0 = np.minimum(np.floor(c).astype(np.intp), cells - 2)
    return i0, i0 + 1, (c - i0).astype(np.float32)


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Zero-mean, unit-ish smooth noise by bilinear upsampling of a cells x cells grid."""
    g = rng.standard_normal((cells, cells), dtype=np.float32)
    i0, i1, f = _upsample_index(cells, size)
    rows = g[i0] * (1.0 - f)[:, None] + g[i1] * f[:, None]
    return rows[:, i0] * (1.0 - f)[None, :] + rows[:, i1] * f[None, :]


def _plain(value: Any) -> Any:
    """numpy scalars (and tuples of them) as Python scalars, so float32 arrays stay float32."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _hypot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sqrt(a * a + b * b)


def _sig(d: np.ndarray, w: float) -> np.ndarray:
    """Soft step from 0 to 1 across ``d = 0`` (a clipped linear ramp of width ``4 w``)."""
    return np.clip(0.5 + d * (0.25 / w), 0.0, 1.0)


def _segment_distance(x: np.ndarray, y: np.ndarray, pts: list[tuple[float, float]]) -> np.ndarray:
    out = None
    for (ax, ay), (bx, by) in zip(pts[:-1], pts[1:]):
        vx, vy = bx - ax, by - ay
        t = np.clip(((x - ax) * vx + (y - ay) * vy) / max(vx * vx + vy * vy, 1e-12), 0.0, 1.0)
        dx = x - ax - t * vx
        dy = y - ay - t * vy
        d = np.sqrt(dx * dx + dy * dy)
        out = d if out is None else np.minimum(out, d)
    return out


_GLYPHS = {
    "L": np.array([[1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 1, 1]], dtype=np.float32),
    "R": np.array([[1, 1, 0], [1, 0, 1], [1, 1, 0], [1, 0, 1], [1, 0, 1]], dtype=np.float32),
}


def _device_path(kind: str, lat: Mapping[str, Any], jitter: float) -> list[tuple[float, float]]:
    top, dia, tw = lat["top"], lat["diaphragm"], lat["thorax_w"]
    carina = top + 0.42 * (dia - top)
    if kind == "ett":
        return [(0.0, -1.05), (0.0, -0.85), (0.005, carina - 0.12 + jitter)]
    if kind == "ng":
        return [(0.0, -1.05), (-0.01, -0.6), (0.02, dia - 0.05), (0.30 * tw, dia + 0.12 + jitter)]
    if kind == "cvc":
        return [(-0.75 * tw, top + 0.02), (-0.20, top + 0.14), (-0.06, top + 0.30),
                (-0.05, carina + 0.08 + jitter)]
    # pacemaker: generator box upper image-right, lead into the right ventricle
    return [(0.55 * tw, top + 0.05), (0.15, top + 0.15), (0.02, carina + 0.10),
            (0.12, dia - 0.12 + jitter)]


def render_phantom(latent: Mapping[str, Any], *, image_size: int, rng: np.random.Generator) -> np.ndarray:
    """Draw one chest-radiograph-like image from latent variables.

    Parameters
    ----------
    latent : mapping
        Latent variables as :func:`generate_phantom` draws them. Missing keys
        take the values of a normal 45-year-old male PA radiograph, so ``{}``
        is valid. The main keys: ``age``, ``sex`` ("F"/"M"), ``habitus``
        (anatomy follows from these unless ``thorax_w`` etc. are given),
        ``view`` ("PA"/"AP"), ``ctr`` (cardiothoracic ratio), a 0/1 flag per
        name in :data:`FINDINGS` with its parameters (``opacity_xy``,
        ``opacity_r``, ``opacity_subtype``, ``nodule_xy``, ``nodule_r``,
        ``effusion_side``, ``effusion_h``, ``pneumothorax_side``,
        ``pneumothorax_depth``, ``atelectasis_xy``, ``atelectasis_len``,
        ``atelectasis_angle``, ``edema_severity``, ``device_kind``; positions in
        the normalised frame ``[-1, 1]``), pose (``shift_x``, ``shift_y``,
        ``rotation``, ``inspiration``) and acquisition (``gamma``, ``low``,
        ``high``, ``noise``, ``blur``, ``border``, ``border_value``,
        ``marker_letter``, ``marker_x``, ``marker_y``).
    image_size : int
        Output size in pixels (32-512).
    rng : numpy.random.Generator
        Source of the image's texture and detector noise.

    Returns
    -------
    numpy.ndarray
        ``(image_size, image_size)`` float32 array in ``[0, 1]`` (bright =
        attenuating), before file encoding.

    Examples
    --------
    >>> import numpy as np
    >>> from crslib.phantom import render_phantom
    >>> img = render_phantom({"cardiomegaly": 1, "ctr": 0.62}, image_size=64,
    ...                      rng=np.random.default_rng(0))
    >>> img.shape, img.dtype
    ((64, 64), dtype('float32'))
    """
    S = _check_int("image_size", image_size, _MIN_SIZE, _MAX_SIZE)
    lat = {k: _plain(v) for k, v in _complete_latent(latent).items()}
    X, Y = _grid(S)
    px = 2.0 / S
    edge = max(0.7 * px, 0.012)
    rot = float(lat["rotation"])
    cr, sr = math.cos(rot), math.sin(rot)
    Xs, Ys = X - lat["shift_x"], Y - lat["shift_y"]
    x = cr * Xs + sr * Ys
    y = -sr * Xs + cr * Ys
    ax = np.abs(x)

    ap = lat["view"] == "AP"
    mag = 1.12 if ap else 1.0
    tw, top = lat["thorax_w"], lat["top"]
    dia = lat["diaphragm"] + lat["inspiration"]
    cy = lat["thorax_cy"] + lat["inspiration"]
    th = cy - top
    soft = lat["soft_tissue"]

    # Rib cage: widest just above the costophrenic angles, tapering to the apices.
    t = (y - cy) / th
    half = np.where(y > cy, tw, tw * np.sqrt(np.clip(1.0 - t * t, 0.0, 1.0)))
    thorax = _sig(half - ax, edge) * _sig(y - top, edge)

    # Body: chest-wall soft tissue around the rib cage, neck, sloping shoulders.
    margin = {"slim": 0.10, "normal": 0.13, "broad": 0.17}.get(lat["habitus"], 0.13)
    wall = np.where(y > top - 0.1, np.maximum(half, 0.9 * tw) + margin, 0.0)
    reach = tw + 0.34
    shoulder = reach * _sig((top + 0.40) - y, 0.08)
    body_hw = np.maximum(np.maximum(wall, shoulder), 0.20)
    skin_top = (top - 0.24) + 0.40 * np.clip((ax - 0.20) / (reach - 0.20), 0.0, 1.0) ** 1.5
    body = _sig(body_hw - ax, edge) * _sig(y - skin_top, edge)

    # Diaphragm domes (the right one, on the image's left, sits higher: liver).
    dome_h = lat["dome_h"]
    dome_y = dia - dome_h * np.exp(-(((ax - 0.42 * tw) / (0.42 * tw)) ** 2))
    dome_y = dome_y - 0.045 * (x < 0).astype(np.float32)
    if lat["atelectasis"]:  # volume loss lifts the hemidiaphragm on that side
        dome_y = dome_y - 0.05 * (np.sign(x) == np.sign(lat["atelectasis_side"])).astype(np.float32)
    above = _sig(dome_y - y, edge)

    # Mediastinum (with the infant thymus), aortic knob, heart.
    med_hw = 0.085 + 0.05 * np.clip((y - top) / (dia - top), 0.0, 1.0)
    med_hw = med_hw + 0.09 * lat["thymus"] * np.exp(-(((y - (top + 0.25)) / 0.18) ** 2)) * (x > 0)
    med = _sig(med_hw - np.abs(x - 0.015), edge)
    knob_r = lat["aortic_knob"]
    knob = _sig(knob_r - _hypot(x - (0.10 + knob_r * 0.6), y - (top + 0.38)), edge)
    hcx, hcy, hw, hh = _heart_geometry(lat, mag, dia)
    heart_d = np.sqrt(((x - hcx) / hw) ** 2 + ((y - hcy) / hh) ** 2)
    heart = _sig(1.0 - heart_d, edge / max(min(hw, hh), 0.1))
    central = np.maximum(np.maximum(med, knob), heart)
    lung = thorax * above * (1.0 - central)

    # Lung parenchyma: density plus vessel markings radiating from the hila.
    vrng = np.random.default_rng(int(lat["vessel_seed"]))
    hx = np.where(x < 0, np.float32(-0.28 * tw), np.float32(0.30 * tw))
    hy = top + 0.50 * (dia - top)
    r_h = _hypot(x - hx, y - hy)
    ang = np.arctan2(y - hy, x - hx)
    streak = np.zeros_like(x)
    for k in (7, 11, 17, 23):
        streak += np.cos(k * ang + vrng.uniform(0, 2 * math.pi)) * vrng.uniform(0.6, 1.0)
    streak = np.clip(0.5 + 0.25 * streak, 0.0, 1.0) ** 2
    markings = (0.07 * streak + 0.05) * np.exp(-r_h / 0.45)
    markings = markings + 0.012 * _smooth_noise(rng, S, 12)
    lung_val = lat["lung_density"] + markings

    if lat["edema"]:  # bilateral perihilar haze, engorged vessels
        sev = lat["edema_severity"]
        lung_val = lung_val + markings * 0.9 * sev
        lung_val = lung_val + 0.26 * sev * np.exp(-((r_h / 0.30) ** 2))
    ptx = None
    if lat["pneumothorax"]:  # air without markings between chest wall and lung edge
        side = lat["pneumothorax_side"]
        edge_x = half * (1.0 - lat["pneumothorax_depth"])
        ptx = (_sig(ax - edge_x, edge) * (np.sign(x) == np.sign(side))
               * _sig((cy - 0.05) - y, 0.05))
        lung_val = lung_val * (1.0 - ptx) + 0.01 * ptx

    A = 0.03 + body * (soft - 0.03)
    A = A + lung * (lung_val - soft)
    A = A + central * thorax * above * 0.16 + central * (1.0 - thorax) * 0.06 * body
    A = A + thorax * (1.0 - above) * 0.12  # abdomen below the domes
    bubble = _hypot((x - 0.42 * tw) / 0.11, (y - (dia + 0.09)) / 0.06)
    A = A - 0.14 * _sig(1.0 - bubble, 0.15) * (1.0 - above)  # gastric air bubble
    trachea = _sig(0.028 + 0.006 * lat["thymus"] - np.abs(x), edge) * _sig((top + 0.40) - y, edge)
    A = A - 0.22 * trachea * body
    if lat["breast"]:
        for s in (-1.0, 1.0):
            bd = _hypot((x - s * 0.62 * tw) / 0.36, (y - (dia - 0.12)) / 0.26)
            A = A + 0.06 * _sig(1.0 - bd, 0.08) * body

    # Findings that add density inside the lungs.
    lung_soft = thorax * above * (1.0 - 0.7 * central)
    if lat["opacity"]:
        ox, oy = lat["opacity_xy"]
        r = lat["opacity_r"]
        tex = _smooth_noise(rng, S, 10)
        if lat["opacity_subtype"] in ("virus", "patchy"):  # bilateral, patchy
            blob = np.zeros_like(x)
            for s in (-1.0, 1.0):
                d = _hypot((x - s * 0.38 * tw) / (1.3 * r), (y - oy) / (1.1 * r))
                blob = np.maximum(blob, _sig(1.0 - d * (1.0 + 0.3 * tex), 0.2))
            dens = 0.26 * (0.65 + 0.35 * np.clip(_smooth_noise(rng, S, 16), -1.0, 1.0))
        else:  # lobar consolidation
            d = _hypot((x - ox) / r, (y - oy) / (0.85 * r))
            blob = _sig(1.0 - d * (1.0 + 0.25 * tex), 0.12)
            dens = 0.30
        A = A + dens * blob * lung_soft
    if lat["nodule"]:
        nx, ny = lat["nodule_xy"]
        r = max(lat["nodule_r"], 1.3 * px)
        A = A + 0.34 * _sig(r - _hypot(x - nx, y - ny), 0.35 * px) * thorax
    if lat["atelectasis"]:  # plate-like band
        cxa, cya = lat["atelectasis_xy"]
        ang_a, half_len = lat["atelectasis_angle"], lat["atelectasis_len"]
        dx, dy = math.cos(ang_a) * half_len, math.sin(ang_a) * half_len
        d = _segment_distance(x, y, [(cxa - dx, cya - dy), (cxa + dx, cya + dy)])
        thick = max(0.035, 1.2 * px)
        A = A + 0.30 * np.exp(-((d / thick) ** 2)) * lung_soft
    if lat["effusion"]:  # meniscus rising laterally, blunted costophrenic angle
        side = lat["effusion_side"]
        h = lat["effusion_h"]
        level = dome_y - h * (0.45 + 0.55 * np.clip(ax / tw, 0.0, 1.0) ** 2)
        eff = _sig(y - level, 0.03) * thorax * (1.0 - central)
        if side != 0.0:
            eff = eff * (np.sign(x) == np.sign(side))
        A = A + eff * (soft + 0.10 - A)
    if ptx is not None:  # visceral pleural line
        line = np.exp(-(((ax - half * (1.0 - lat["pneumothorax_depth"])) / max(0.6 * px, 0.01)) ** 2))
        A = A + 0.18 * line * thorax * above * (np.sign(x) == np.sign(lat["pneumothorax_side"])) \
            * _sig((cy - 0.05) - y, 0.05)

    # Bones: posterior and anterior ribs, clavicles, spine (density falls in the elderly).
    bone = lat["bone_density"]
    u = ax / tw
    sp = (dia - top) / 8.5
    phase = (y - top + lat["rib_rise"] * u - lat["rib_drop"] * u * u) / sp + lat["rib_phase"]
    ribs = (0.5 + 0.5 * np.cos(2.0 * math.pi * phase)) ** 3
    phase_a = (y - top - 0.45 * (1.0 - u) ** 2) / (1.25 * sp) + lat["rib_phase"]
    ribs = ribs + 0.35 * (0.5 + 0.5 * np.cos(2.0 * math.pi * phase_a)) ** 4 * _sig(u - 0.25, 0.05)
    rib_mask = (_sig(half * 1.04 + 0.02 - ax, edge) * _sig(ax - 0.06, edge)
                * _sig(dia + 0.02 - y, 0.04) * _sig(y - (top - 0.06), edge))
    A = A + 0.15 * bone * ribs * rib_mask * (1.0 - 0.7 * central)
    clav_y = top + (0.02 if not ap else -0.10)
    for s in (-1.0, 1.0):
        d = _segment_distance(x, y, [(s * 0.07, clav_y + 0.06), (s * 0.45 * tw / 0.66, clav_y - 0.02),
                                     (s * 0.85 * tw / 0.66, clav_y - 0.09)])
        A = A + 0.20 * bone * np.exp(-((d / max(0.03, 1.0 * px)) ** 2)) * body
    vert = 0.5 + 0.5 * np.cos(2.0 * math.pi * (y - top) / 0.11) ** 2
    A = A + 0.06 * bone * vert * _sig(0.055 - ax, edge) * body

    if lat["support_device"]:  # radiopaque tube or line (and a pacemaker box)
        pts = _device_path(lat["device_kind"], {**lat, "diaphragm": dia}, lat.get("device_jitter", 0.0))
        d = _segment_distance(x, y, pts)
        w = max(0.014, 1.0 * px)
        tube = np.exp(-((d / w) ** 2))
        if lat["device_kind"] == "pacemaker":
            bx, by = pts[0]
            box = _sig(0.09 - np.abs(x - bx), edge) * _sig(0.06 - np.abs(y - by), edge)
            tube = np.maximum(tube, box)
        A = np.maximum(A, 0.97 * tube)

    # ---- acquisition: view contrast, intensity curve, blur, border, marker, noise
    A = np.clip(A, 0.0, 1.0)
    gamma, low, high = lat["gamma"], lat["low"], lat["high"]
    if ap:  # lower contrast: window squeezed towards its middle
        mid = 0.5 * (low + high)
        low, high = mid + 0.8 * (low - mid), mid + 0.8 * (high - mid)
    img = low + (high - low) * A ** gamma
    sigma = lat["blur"] * S / 64.0
    if sigma > 0.05:
        img = ndimage.gaussian_filter(img, sigma, mode="nearest", truncate=3.0)
    border = int(round(lat["border"] * S))
    if border > 0:
        img[:border, :] = lat["border_value"]
        img[-border:, :] = lat["border_value"]
        img[:, :border] = lat["border_value"]
        img[:, -border:] = lat["border_value"]
    glyph = _GLYPHS.get(lat["marker_letter"], _GLYPHS["L"])
    gh = max(5, int(round(0.09 * S)))
    gw = max(3, int(round(gh * 0.6)))
    gi = (np.arange(gh) * 5 // gh)[:, None]
    gj = (np.arange(gw) * 3 // gw)[None, :]
    mask = glyph[gi, gj]
    r0 = min(max(int(round(lat["marker_y"] * S)), 0), S - gh)
    c0 = min(max(int(round(lat["marker_x"] * S)), 0), S - gw)
    patch = img[r0:r0 + gh, c0:c0 + gw]
    img[r0:r0 + gh, c0:c0 + gw] = np.where(mask > 0, 0.97, patch)
    noise = lat["noise"]
    if noise > 0:
        img = img + noise * rng.standard_normal((S, S), dtype=np.float32)
    return np.clip(img, 0.0, 1.0).astype(np.float32)


# --------------------------------------------------------------------------
# File encoding
# --------------------------------------------------------------------------


def encode_image(image: np.ndarray, encoding: FileEncoding) -> bytes:
    """Encode a rendered image the way ``encoding`` says (deterministic bytes).

    Parameters
    ----------
    image : numpy.ndarray
        Square float array in ``[0, 1]`` from :func:`render_phantom`.
    encoding : FileEncoding
        Format, bit depth, JPEG settings, pixel dimensions and metadata.

    Returns
    -------
    bytes
        The file's content. No timestamps are written.

    Examples
    --------
    >>> import numpy as np
    >>> from crslib.phantom import encode_image, site_signatures
    >>> data = encode_image(np.full((32, 32), 0.5), site_signatures(1)[0].encoding)
    >>> data[:4]
    b'\\x89PNG'
    """
    img = np.clip(np.asarray(image, dtype=np.float32), 0.0, 1.0)
    size = img.shape[0]
    scaled, px, py, _, _ = encoding.geometry(size)
    if scaled != size:
        img = np.asarray(Image.fromarray(img, mode=None).resize((scaled, scaled), Image.BILINEAR))
        img = np.clip(img, 0.0, 1.0)
    if px or py:
        img = np.pad(img, ((py, py), (px, px)), mode="constant", constant_values=0.0)
    buf = io.BytesIO()
    if encoding.format == "png16":
        pil = Image.fromarray(np.round(img * 65535.0).astype(np.uint16))
    else:
        pil = Image.fromarray(np.round(img * 255.0).astype(np.uint8))
    if encoding.format in ("png8", "png16"):
        info = PngInfo()
        for key, value in encoding.text:
            info.add_text(key, value)
        kwargs: dict[str, Any] = {"pnginfo": info, "compress_level": 6}
        if encoding.dpi:
            kwargs["dpi"] = (encoding.dpi, encoding.dpi)
        pil.save(buf, format="PNG", **kwargs)
    elif encoding.format == "jpeg":
        if encoding.mode == "RGB":
            pil = pil.convert("RGB")
        kwargs = {"quality": int(encoding.quality), "progressive": bool(encoding.progressive),
                  "optimize": False}
        if encoding.mode == "RGB" and encoding.subsampling >= 0:
            kwargs["subsampling"] = int(encoding.subsampling)
        if encoding.exif:
            exif = Image.Exif()
            for tag, value in encoding.exif:
                exif[tag] = value
            kwargs["exif"] = exif.tobytes()
        if encoding.comment:
            kwargs["comment"] = encoding.comment
        pil.save(buf, format="JPEG", **kwargs)
    else:  # pragma: no cover - guarded by the dataclasses built here
        raise DataError(f"unknown file format {encoding.format!r}; use png8, png16 or jpeg")
    return buf.getvalue()


# --------------------------------------------------------------------------
# Splits and names
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


def _acquisition(site: SiteSignature, shift: float) -> dict[str, float]:
    """Effective acquisition settings of a site in a batch shifted by ``shift`` (0..1):
    the later batch has a steeper intensity curve, a darker, narrower window, more
    noise and blur and a wider collimation border."""
    return {
        "gamma": site.gamma * (1.0 + 0.35 * shift),
        "low": site.low,
        "high": site.high - 0.10 * shift,
        "noise": site.noise + 0.02 * shift,
        "blur": site.blur + 0.5 * shift,
        "border": site.border + 0.03 * shift,
    }


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


def generate_phantom(
    out_dir: str | os.PathLike,
    *,
    n_patients: int = 300,
    image_size: int = 64,
    seed: int = 0,
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
    seed : int, default 0
        Seed (non-negative). Each patient draws from its own child stream
        (``numpy.random.SeedSequence(seed, spawn_key=...)``).
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
    >>> from crslib.phantom import generate_phantom
    >>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=4, seed=1)
    >>> sorted(set(manifest["split"])) <= ["test", "train", "val"]
    True
    """
    n_patients = _check_int("n_patients", n_patients, 1)
    image_size = _check_int("image_size", image_size, _MIN_SIZE, _MAX_SIZE)
    seed = _check_int("seed", seed, 0)
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

    sites = site_signatures(n_sources, kermany_layout=kermany)
    cond_tables = [_conditional_tables(p) for p in prev_table]
    shortcut_enc = _shortcut_encodings(kermany)
    w_pool = np.array([s.pool_weight for s in sites], dtype=np.float64)
    w_pool /= w_pool.sum()
    w_alt = np.arange(1, n_sources + 1, dtype=np.float64) ** 2
    w_alt /= w_alt.sum()
    w_test = (1.0 - split_shift) * w_pool + split_shift * w_alt
    cum = {"pool": np.cumsum(w_pool), "test": np.cumsum(w_test)}

    # ---- patient-level latents (each patient from its own stream)
    split_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    splits = _assign_splits(n_patients, split_rng, kermany)
    patients = []
    for i in range(n_patients):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, i, 0)))
        n_img = int(rng.integers(1, 5))
        u_site = float(rng.random())
        j = int(np.searchsorted(cum["test" if splits[i] == "test" else "pool"], u_site, side="right"))
        j = min(j, n_sources - 1)
        pat = _sample_patient(rng, kermany=kermany, cond=cond_tables[j])
        pat["site"] = j
        pat["n_images"] = n_img
        patients.append(pat)
    if kermany:
        _ensure_val_classes(splits, [p["opacity"] for p in patients], [p["n_images"] for p in patients])

    # ---- names
    width = max(5, len(str(n_patients - 1)))
    counters: dict[tuple[str, str], int] = {}
    jobs = []
    for i, pat in enumerate(patients):
        split = splits[i]
        if kermany:
            # Numbered and scoped as crslib.data.kermany_patient_id parses the names:
            # val children are numbered like train children, test children on their own.
            scope = "test" if split == "test" else "train"
            if pat["opacity"]:
                n_person = counters[(scope, "person")] = counters.get((scope, "person"), 0) + 1
                patient_id = f"{scope}/person{n_person}"
            else:
                prefix = "NORMAL2-IM" if (pat["vessel_seed"] % 100) < 35 else "IM"
                n_pat = counters[(scope, "IM")] = counters.get((scope, "IM"), 0) + 1
                patient_id = f"{scope}/IM-{n_pat:04d}"
        else:
            patient_id = f"P{i:0{width}d}"
        for k in range(pat["n_images"]):
            if kermany:
                cls = "PNEUMONIA" if pat["opacity"] else "NORMAL"
                if pat["opacity"]:
                    m = counters[(scope, "image")] = counters.get((scope, "image"), 0) + 1
                    stem = f"person{n_person}_{pat['opacity_subtype']}_{m}"
                else:
                    stem = f"{prefix}-{n_pat:04d}-{k + 1:04d}"
                image_id = f"{split}-{stem}"
                rel_dir = f"chest_xray/{split}/{cls}"
            else:
                stem = image_id = f"{patient_id}_{k + 1}"
                rel_dir = "images"
            jobs.append((i, k, patient_id, image_id, rel_dir, stem))

    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.csv"
    manifest_path.unlink(missing_ok=True)

    from tqdm import tqdm

    rows, latent_rows = [], []
    bar = tqdm(total=len(jobs), desc="phantom", unit="img", disable=not progress)
    for i, k, patient_id, image_id, rel_dir, stem in jobs:
        pat = patients[i]
        split = splits[i]
        site = sites[pat["site"]]
        pool = split != "test"
        irng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, i, 1, k)))
        crng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, i, 2, k)))
        shift = 0.0 if pool else split_shift
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
        image = render_phantom(lat, image_size=image_size, rng=irng)
        label = int(pat["opacity"])
        by_shortcut = bool(pool and crng.random() < shortcut_strength)
        enc = shortcut_enc[label] if by_shortcut else site.encoding
        data = encode_image(image, enc)
        suffix = "jpeg" if kermany else enc.suffix
        rel = f"{rel_dir}/{stem}.{suffix}"
        _write_file(out / rel, data)
        _, _, _, fw, fh = enc.geometry(image_size)
        rows.append({
            "image_id": image_id, "path": rel, "patient_id": patient_id, "split": split,
            "source": site.name, "view": lat["view"], "modality": "DX", "label": label,
            **{f"finding_{name}": int(pat[name]) for name in FINDINGS},
            "age": pat["age"], "sex": pat["sex"], "habitus": pat["habitus"],
        })
        lrow = {"image_id": image_id, "patient_id": patient_id, "split": split,
                "batch": "later" if not pool else "pool", "batch_shift": shift,
                "source": site.name, "view": lat["view"], "age": pat["age"], "sex": pat["sex"],
                "habitus": pat["habitus"], "label": label,
                **{f"finding_{name}": int(pat[name]) for name in FINDINGS}}
        lrow.update(_latent_row(lat, enc, image_size))
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
        latent_rows.append(lrow)
        bar.update(1)
    bar.close()

    _warn_stale_files(out, {row["path"] for row in rows}, kermany)
    manifest = pd.DataFrame(rows, columns=list(MANIFEST_COLUMNS))
    latents = pd.DataFrame(latent_rows)
    atomic_write_text(out / "latents.csv", latents.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    atomic_write_text(manifest_path, manifest.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    log.info("phantom: wrote %d images of %d patients to %s", len(manifest), n_patients, out)
    result = manifest.copy()
    result["path"] = [str((out / p).resolve()) for p in manifest["path"]]
    result.attrs["root"] = str(out.resolve())
    return result

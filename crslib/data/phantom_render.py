"""One phantom image: patient latent variables, anatomy, findings and pixels.

:func:`render_phantom` draws one chest-radiograph-like image from a dictionary
of latent variables, in named steps: the pose-corrected frame, the anatomy
masks (rib cage, body, diaphragm, mediastinum and heart), the lung parenchyma,
the soft-tissue attenuation, the findings, the bones, support devices, and
the acquisition (intensity curve, blur, collimation, laterality marker,
noise). :func:`_sample_patient` draws a patient's latent variables (age, sex,
habitus, co-occurring findings and their positions) for
:func:`~crslib.data.phantom.generate_phantom`.

Coordinates are the normalised frame ``x, y`` in ``[-1, 1]`` (``y`` points
down, the image's right is the patient's left as in a PA radiograph).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import ndimage

from crslib.errors import DataError

__all__ = ["FINDINGS", "HABITUS", "SEXES", "VIEWS", "render_phantom"]

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

_MIN_SIZE, _MAX_SIZE = 32, 512
_DEVICE_KINDS = ("ett", "cvc", "ng", "pacemaker")

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


@dataclass
class _Frame:
    """Pixel coordinates of one image in the patient's frame (shift and rotation
    undone), the pose-dependent anatomy scalars and, once :func:`_anatomy_masks`
    has run, the anatomy masks; shared by the drawing steps of :func:`render_phantom`."""

    S: int
    px: float
    edge: float
    x: np.ndarray
    y: np.ndarray
    ax: np.ndarray
    ap: bool
    mag: float
    tw: float
    top: float
    dia: float
    cy: float
    soft: float
    half: Any = None
    thorax: Any = None
    body: Any = None
    dome_y: Any = None
    above: Any = None
    central: Any = None
    lung: Any = None


def _frame(lat: Mapping[str, Any], S: int) -> _Frame:
    """The pose-corrected coordinate grid; AP views magnify the heart."""
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
    return _Frame(S=S, px=px, edge=edge, x=x, y=y, ax=ax, ap=ap, mag=mag, tw=tw, top=top, dia=dia, cy=cy,
                  soft=lat["soft_tissue"])


def _anatomy_masks(f: _Frame, lat: Mapping[str, Any]) -> None:
    """Rib cage, body outline, diaphragm domes and the central shadow (mediastinum,
    aortic knob, heart); sets the mask fields of ``f``."""
    x, y, ax, edge = f.x, f.y, f.ax, f.edge
    tw, top, dia, cy = f.tw, f.top, f.dia, f.cy
    th = cy - top

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
    hcx, hcy, hw, hh = _heart_geometry(lat, f.mag, dia)
    heart_d = np.sqrt(((x - hcx) / hw) ** 2 + ((y - hcy) / hh) ** 2)
    heart = _sig(1.0 - heart_d, edge / max(min(hw, hh), 0.1))
    central = np.maximum(np.maximum(med, knob), heart)
    f.half, f.thorax, f.body, f.dome_y, f.above, f.central = half, thorax, body, dome_y, above, central
    f.lung = thorax * above * (1.0 - central)


def _lung_parenchyma(f: _Frame, lat: Mapping[str, Any],
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Lung density plus vessel markings radiating from the hila, the perihilar haze
    of edema and the air of a pneumothorax: ``(lung value, pneumothorax mask or None)``.
    Draws the markings' texture from ``rng``."""
    x, y, ax, edge, tw, top, dia, cy = f.x, f.y, f.ax, f.edge, f.tw, f.top, f.dia, f.cy
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
    markings = markings + 0.012 * _smooth_noise(rng, f.S, 12)
    lung_val = lat["lung_density"] + markings

    if lat["edema"]:  # bilateral perihilar haze, engorged vessels
        sev = lat["edema_severity"]
        lung_val = lung_val + markings * 0.9 * sev
        lung_val = lung_val + 0.26 * sev * np.exp(-((r_h / 0.30) ** 2))
    ptx = None
    if lat["pneumothorax"]:  # air without markings between chest wall and lung edge
        side = lat["pneumothorax_side"]
        edge_x = f.half * (1.0 - lat["pneumothorax_depth"])
        ptx = (_sig(ax - edge_x, edge) * (np.sign(x) == np.sign(side))
               * _sig((cy - 0.05) - y, 0.05))
        lung_val = lung_val * (1.0 - ptx) + 0.01 * ptx
    return lung_val, ptx


def _soft_tissue(f: _Frame, lat: Mapping[str, Any], lung_val: np.ndarray) -> np.ndarray:
    """Attenuation of the body without findings and bones: soft tissue, lungs,
    mediastinum, abdomen, gastric bubble, trachea and breast shadows."""
    x, y, edge, tw, top, dia, soft = f.x, f.y, f.edge, f.tw, f.top, f.dia, f.soft
    body, thorax, above, central = f.body, f.thorax, f.above, f.central
    A = 0.03 + body * (soft - 0.03)
    A = A + f.lung * (lung_val - soft)
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
    return A


def _add_findings(A: np.ndarray, f: _Frame, lat: Mapping[str, Any], ptx: np.ndarray | None,
                  rng: np.random.Generator) -> np.ndarray:
    """Findings that add density: opacity (lobar or patchy; texture from ``rng``),
    nodule, plate atelectasis, effusion and the visceral pleural line of a pneumothorax."""
    x, y, ax, px, tw, cy = f.x, f.y, f.ax, f.px, f.tw, f.cy
    thorax, above, central, half = f.thorax, f.above, f.central, f.half
    lung_soft = thorax * above * (1.0 - 0.7 * central)
    if lat["opacity"]:
        ox, oy = lat["opacity_xy"]
        r = lat["opacity_r"]
        tex = _smooth_noise(rng, f.S, 10)
        if lat["opacity_subtype"] in ("virus", "patchy"):  # bilateral, patchy
            blob = np.zeros_like(x)
            for s in (-1.0, 1.0):
                d = _hypot((x - s * 0.38 * tw) / (1.3 * r), (y - oy) / (1.1 * r))
                blob = np.maximum(blob, _sig(1.0 - d * (1.0 + 0.3 * tex), 0.2))
            dens = 0.26 * (0.65 + 0.35 * np.clip(_smooth_noise(rng, f.S, 16), -1.0, 1.0))
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
        level = f.dome_y - h * (0.45 + 0.55 * np.clip(ax / tw, 0.0, 1.0) ** 2)
        eff = _sig(y - level, 0.03) * thorax * (1.0 - central)
        if side != 0.0:
            eff = eff * (np.sign(x) == np.sign(side))
        A = A + eff * (f.soft + 0.10 - A)
    if ptx is not None:  # visceral pleural line
        line = np.exp(-(((ax - half * (1.0 - lat["pneumothorax_depth"])) / max(0.6 * px, 0.01)) ** 2))
        A = A + 0.18 * line * thorax * above * (np.sign(x) == np.sign(lat["pneumothorax_side"])) \
            * _sig((cy - 0.05) - y, 0.05)
    return A


def _add_bones(A: np.ndarray, f: _Frame, lat: Mapping[str, Any]) -> np.ndarray:
    """Posterior and anterior ribs, clavicles, spine (density falls in the elderly)."""
    x, y, ax, px, edge, tw, top, dia = f.x, f.y, f.ax, f.px, f.edge, f.tw, f.top, f.dia
    half, central, body = f.half, f.central, f.body
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
    clav_y = top + (0.02 if not f.ap else -0.10)
    for s in (-1.0, 1.0):
        d = _segment_distance(x, y, [(s * 0.07, clav_y + 0.06), (s * 0.45 * tw / 0.66, clav_y - 0.02),
                                     (s * 0.85 * tw / 0.66, clav_y - 0.09)])
        A = A + 0.20 * bone * np.exp(-((d / max(0.03, 1.0 * px)) ** 2)) * body
    vert = 0.5 + 0.5 * np.cos(2.0 * math.pi * (y - top) / 0.11) ** 2
    A = A + 0.06 * bone * vert * _sig(0.055 - ax, edge) * body
    return A


def _add_device(A: np.ndarray, f: _Frame, lat: Mapping[str, Any]) -> np.ndarray:
    """A radiopaque tube or line (and a pacemaker box) when ``support_device`` is set."""
    if not lat["support_device"]:
        return A
    x, y, edge = f.x, f.y, f.edge
    pts = _device_path(lat["device_kind"], {**lat, "diaphragm": f.dia}, lat.get("device_jitter", 0.0))
    d = _segment_distance(x, y, pts)
    w = max(0.014, 1.0 * f.px)
    tube = np.exp(-((d / w) ** 2))
    if lat["device_kind"] == "pacemaker":
        bx, by = pts[0]
        box = _sig(0.09 - np.abs(x - bx), edge) * _sig(0.06 - np.abs(y - by), edge)
        tube = np.maximum(tube, box)
    return np.maximum(A, 0.97 * tube)


def _acquire(A: np.ndarray, f: _Frame, lat: Mapping[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Acquisition: view contrast, intensity curve, blur, collimation border,
    laterality marker and detector noise (from ``rng``)."""
    S = f.S
    A = np.clip(A, 0.0, 1.0)
    gamma, low, high = lat["gamma"], lat["low"], lat["high"]
    if f.ap:  # lower contrast: window squeezed towards its middle
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
    >>> from crslib.data.phantom import render_phantom
    >>> img = render_phantom({"cardiomegaly": 1, "ctr": 0.62}, image_size=64,
    ...                      rng=np.random.default_rng(0))
    >>> img.shape, img.dtype
    ((64, 64), dtype('float32'))
    """
    S = _check_int("image_size", image_size, _MIN_SIZE, _MAX_SIZE)
    lat = {k: _plain(v) for k, v in _complete_latent(latent).items()}
    # The steps draw from ``rng`` in this order: lung texture, opacity texture, detector noise.
    f = _frame(lat, S)
    _anatomy_masks(f, lat)
    lung_val, ptx = _lung_parenchyma(f, lat, rng)
    A = _soft_tissue(f, lat, lung_val)
    A = _add_findings(A, f, lat, ptx, rng)
    A = _add_bones(A, f, lat)
    A = _add_device(A, f, lat)
    return _acquire(A, f, lat, rng)

"""The phantom's sites: acquisition signatures and file encodings.

Each source (site) has an acquisition signature (:class:`SiteSignature`:
intensity curve, noise, blur, collimation border, laterality marker, share of
AP views) and a file encoding (:class:`FileEncoding`: container, bit depth,
JPEG settings, pixel dimensions, metadata). :func:`site_signatures` lists
them (fixed per site index, independent of the seed), :func:`_acquisition`
shifts a site's acquisition for the later test batch, and
:func:`encode_image` writes one rendered image the way a site's archive does.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from crslib.data.phantom_render import _check_int
from crslib.errors import DataError

__all__ = ["FileEncoding", "SiteSignature", "encode_image", "site_signatures"]

_MAX_SOURCES = 64

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
    >>> from crslib.data.phantom import site_signatures
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
    >>> from crslib.data.phantom import encode_image, site_signatures
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

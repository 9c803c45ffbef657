"""Data: the manifest schema, loaders for every kind of ``--data``, robust
image reading, file forensics and the synthetic phantom data set.

A data set is a *manifest*: a :class:`pandas.DataFrame` with one row per
image and at least the columns of :data:`MANIFEST_COLUMNS`. The package is
cut by job:

- :mod:`crslib.data.manifest`: the schema; validate, read, write, summarize
  a manifest, check its files, select example rows;
- :mod:`crslib.data.loaders`: image folders (incl. the Kermany layout),
  MedMNIST ``.npz`` files, DICOM folders, ``"phantom?..."`` specs and the
  :func:`load_data` dispatcher behind every ``--data``;
- :mod:`crslib.data.kermany`: Kermany file names, parsed and written by one rule;
- :mod:`crslib.data.images`: :func:`read_image` / :func:`read_images`, float32
  in [0, 1] of shape (H, W, C), :class:`~crslib.errors.ImageReadError` on failure;
- :mod:`crslib.data.properties`: :func:`file_properties`, how each file is
  stored (the raw material of the shortcut audit);
- :mod:`crslib.data.readable`: :func:`drop_unreadable`, the images that
  decode and the files left out, each with its reason;
- :mod:`crslib.data.phantom` (with :mod:`~crslib.data.phantom_render` and
  :mod:`~crslib.data.phantom_sites`): the procedural chest-radiograph phantom.

Every public name is importable from here (``from crslib.data import
load_data, read_image, file_properties, generate_phantom``). The phantom's
names are loaded on first use, so ``import crslib.data`` does not import
Pillow and SciPy. The phantom's own column list (which adds the label,
findings and patient attributes) is ``crslib.data.phantom.MANIFEST_COLUMNS``;
:data:`MANIFEST_COLUMNS` here is what every validated manifest has.
"""

from __future__ import annotations

from typing import Any

from crslib.data.images import (
    DEFAULT_MAX_PIXELS,
    IMAGE_SUFFIXES,
    READER_VERSION,
    is_dicom_file,
    is_image_file,
    read_image,
    read_images,
)
from crslib.data.kermany import kermany_patient_id
from crslib.data.loaders import (
    PHANTOM_DEFAULTS,
    is_phantom_spec,
    load_data,
    load_dicom_folder,
    load_image_folder,
    load_medmnist,
    phantom_parameters,
)
from crslib.data.manifest import (
    MANIFEST_COLUMNS,
    check_files,
    read_manifest,
    select_examples,
    summarize_manifest,
    validate_manifest,
    write_manifest,
)
from crslib.data.properties import (
    FILE_PROPERTY_COLUMNS,
    file_properties,
)
from crslib.data.readable import drop_unreadable, skip_summary

# Public names of crslib.data.phantom, imported on first access (see __getattr__).
_PHANTOM_NAMES = (
    "FINDINGS",
    "HABITUS",
    "SEXES",
    "SPLITS",
    "VIEWS",
    "FileEncoding",
    "SiteSignature",
    "encode_image",
    "generate_phantom",
    "render_phantom",
    "site_signatures",
)

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "FILE_PROPERTY_COLUMNS",
    "IMAGE_SUFFIXES",
    "MANIFEST_COLUMNS",
    "PHANTOM_DEFAULTS",
    "READER_VERSION",
    "check_files",
    "drop_unreadable",
    "file_properties",
    "is_dicom_file",
    "is_image_file",
    "is_phantom_spec",
    "phantom_parameters",
    "kermany_patient_id",
    "load_data",
    "load_dicom_folder",
    "load_image_folder",
    "load_medmnist",
    "read_image",
    "read_images",
    "read_manifest",
    "select_examples",
    "skip_summary",
    "summarize_manifest",
    "validate_manifest",
    "write_manifest",
    *_PHANTOM_NAMES,
]


def __getattr__(name: str) -> Any:
    if name in _PHANTOM_NAMES:
        from crslib.data import phantom

        value = getattr(phantom, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PHANTOM_NAMES))

"""crslib: the library behind the CRS companion book.

Agreement between medical image encoders (mutual k-nearest-neighbour
overlap), protocol sensitivity of reported scores, and representation risk.
Importing crslib first applies the one import-time fix this stack needs
(see :mod:`crslib._compat`), so import it before torch, torchvision or timm.
"""

from crslib._compat import ensure_torchvision_importable

ensure_torchvision_importable()

from crslib.errors import (  # noqa: E402
    ConfigError,
    CRSError,
    DataError,
    ImageReadError,
    InputError,
    ModelError,
    NotebookError,
)

__version__ = "0.1.0"

__all__ = [
    "CRSError",
    "ConfigError",
    "DataError",
    "ImageReadError",
    "InputError",
    "ModelError",
    "NotebookError",
    "__version__",
]

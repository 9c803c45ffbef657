"""Exceptions a user can cause.

Every error that bad input, a bad path or a bad option can cause is a
:class:`CRSError`; its message names the offending thing and how to fix it.
The ``crs`` command prints that one line and exits with status 2.
"""

from __future__ import annotations


class CRSError(Exception):
    """Base class of every user-facing error raised by crslib."""


class DataError(CRSError, ValueError):
    """A manifest, data folder, column or row is missing or malformed."""


class ImageReadError(DataError):
    """An image file cannot be read; the message names the file."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot read image {self.path}: {reason}")


class ModelError(CRSError, ValueError):
    """A model spec is malformed, or its weights or backend are unavailable."""


class InputError(CRSError, ValueError):
    """Arrays or options passed to an analysis function are invalid
    (mismatched shapes, NaN rows, k >= number of samples, a single class)."""


class ConfigError(CRSError, ValueError):
    """A preset or configuration file is missing or invalid."""


class NotebookError(CRSError, RuntimeError):
    """A notebook failed while the runner executed it."""

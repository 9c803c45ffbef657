"""Shared test set-up: offline, headless, and an isolated cache per session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Set before crslib, torch or a notebook kernel reads them; kernels inherit them.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["MPLBACKEND"] = "Agg"
os.environ.setdefault("CRS_CACHE_DIR", tempfile.mkdtemp(prefix="crs-test-cache-"))

import crslib  # noqa: E402,F401  (applies the torchvision import fix first)
import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT

"""The torchvision import fix: applied once, only when needed, before timm."""

from __future__ import annotations

import subprocess
import sys

from crslib._compat import _cuda_torchvision_beside_cpu_torch, ensure_torchvision_importable


def test_timm_imports_after_crslib() -> None:
    code = "import crslib, timm, torchvision; print(timm.__version__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_fix_is_guarded() -> None:
    import torchvision  # noqa: F401  (already imported: nothing may be registered again)

    assert ensure_torchvision_importable() is False


def test_detection_matches_installed_stack() -> None:
    import torch
    import torchvision

    expected = torch.version.cuda is None and "+cu" in torchvision.__version__
    assert _cuda_torchvision_beside_cpu_torch() is expected

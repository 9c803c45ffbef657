"""The torchvision import fix (applied once, only when needed, before timm)
and the one-BLAS-thread limit of the many small fits."""

from __future__ import annotations

import subprocess
import sys

from crslib._compat import _cuda_torchvision_beside_cpu_torch, ensure_torchvision_importable, one_blas_thread


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


def test_one_blas_thread_limits_then_restores() -> None:
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads() -> list[int]:
        return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]

    with threadpool_limits(limits=2, user_api="blas"):  # a known starting point, even on a 1-core runner
        before = blas_threads()
        with one_blas_thread():
            inside = blas_threads()
            # it loads scipy's own OpenBLAS before limiting, so that one is limited too
            assert len(inside) >= len(before) and all(n == 1 for n in inside)
        assert blas_threads()[:len(before)] == before

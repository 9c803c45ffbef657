"""Import-time and threading fixes for this project's pinned Python stack.

Every entry point (library, CLI, notebooks, tests) imports :mod:`crslib`
first, and ``crslib/__init__.py`` calls :func:`ensure_torchvision_importable`
before anything imports torch or timm.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from contextlib import AbstractContextManager
from pathlib import Path

_META = "torchvision._meta_registrations"


def _package_file(package: str, filename: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return ""
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def _cuda_torchvision_beside_cpu_torch() -> bool:
    vision = _package_file("torchvision", "version.py")
    torch_version = _package_file("torch", "version.py")
    vision_is_cuda = re.search(r"__version__\s*=\s*['\"][^'\"]*\+cu\d+", vision) is not None
    torch_is_cpu = re.search(r"^cuda\s*(:[^=]*)?=\s*None", torch_version, re.MULTILINE) is not None
    return vision_is_cuda and torch_is_cpu


def ensure_torchvision_importable() -> bool:
    """Make ``import timm`` work when a CUDA torchvision sits beside a CPU torch.

    The pinned ``torchvision==0.28.0`` wheel is a CUDA build; next to the CPU
    ``torch==2.13.0`` wheel its compiled operators are missing, and importing
    ``torchvision._meta_registrations`` fails with "operator torchvision::nms
    does not exist", which breaks ``import timm``. Registering an empty module
    under that name skips only the meta kernels of those compiled operators,
    which nothing in this project uses. The fix is applied only in exactly that
    situation, and never after torchvision has been imported.

    Returns
    -------
    bool
        True when the stand-in module was registered by this call.
    """
    if _META in sys.modules or "torchvision" in sys.modules:
        return False
    if not _cuda_torchvision_beside_cpu_torch():
        return False
    sys.modules[_META] = types.ModuleType(_META)
    return True


def one_blas_thread() -> AbstractContextManager:
    """Limit BLAS and OpenMP to one thread for the duration of a ``with`` block.

    For the many small fits of the risk and audit workflows (hundreds to a
    few thousand rows, up to about a thousand columns). On the 2-core
    reference machine, multithreaded OpenBLAS (numpy and scipy each load
    their own copy) made a risk run 10-25 times slower than one thread under
    load, and an audit permutation test twice as slow when idle (measured);
    one thread was never slower.
    """
    # threadpoolctl limits the libraries loaded so far: load those used here first
    import scipy.linalg  # noqa: F401
    import scipy.optimize  # noqa: F401
    import sklearn.decomposition  # noqa: F401
    import sklearn.linear_model  # noqa: F401
    import sklearn.model_selection  # noqa: F401
    import sklearn.neural_network  # noqa: F401
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)

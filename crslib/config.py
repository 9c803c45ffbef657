"""Where crslib keeps its cache, and the run presets."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from crslib.errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"
PRESET_NAMES = ("quick", "default", "full")


def cache_dir() -> Path:
    """Root of the content-addressed cache.

    ``$CRS_CACHE_DIR`` when set (the Makefile points it into the repository),
    else ``$XDG_CACHE_HOME/crs`` or ``~/.cache/crs``.
    """
    env = os.environ.get("CRS_CACHE_DIR")
    if env:
        root = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "crs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def load_preset(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """Read a run preset (``quick``, ``default``, ``full``) or a YAML file.

    Parameters
    ----------
    name_or_path : str or path
        A preset name from ``configs/`` or the path of a YAML file with the
        same structure.

    Returns
    -------
    dict
        The parsed configuration, with ``name`` set.
    """
    text = str(name_or_path)
    path = PRESETS_DIR / f"{text}.yaml" if text in PRESET_NAMES else Path(text)
    if not path.is_file():
        raise ConfigError(
            f"no preset or config file {text!r}: use one of {', '.join(PRESET_NAMES)} "
            "or the path of a YAML file"
        )
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config file {path} must hold a mapping at its top level")
    config.setdefault("name", path.stem)
    return config


def preset_zoo_data(name_or_path: str | os.PathLike) -> str:
    """The data a preset's zoo trains on: its ``zoo_data`` parameter, else its ``data``.

    The zoo trains on the phantom whatever data the chapters study, so the two
    differ as soon as a config points the chapters at other images.

    Examples
    --------
    >>> preset_zoo_data("quick")
    'phantom?patients=600&size=64&seed=0'
    """
    parameters = load_preset(name_or_path).get("parameters") or {}
    if "zoo_data" in parameters:
        return str(parameters["zoo_data"])
    if "data" in parameters:
        return str(parameters["data"])
    raise ConfigError(f"preset {name_or_path!r} sets neither parameters.zoo_data nor parameters.data")


def progress_enabled(progress: bool | None = None) -> bool:
    """Whether long work shows a tqdm bar.

    ``progress`` decides when given; otherwise a bar is shown when standard
    error is a terminal and ``CI`` is not set (CI logs stay readable).

    Examples
    --------
    >>> progress_enabled(True), progress_enabled(False)
    (True, False)
    """
    import sys

    if progress is not None:
        return bool(progress)
    if os.environ.get("CI"):
        return False
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False

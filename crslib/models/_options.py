"""Typed values of model spec options, with errors that name the spec.

``timm:NAME?size=64`` and ``onnx:PATH?mean=104,117,123&bgr=1`` carry their
options as text; these converters turn one option's text into an int, a
positive float, a list of floats or a bool, and raise a
:class:`~crslib.errors.ModelError` naming the option and the spec when they
cannot. :mod:`crslib.models.specs` splits spec strings into options and uses
them for the ``timm:`` options; the ONNX backend
(:class:`crslib.models.encoders.OnnxEncoder`) reads its own options with them.

Examples
--------
>>> _parse_int("64", "size", "timm:resnet18?size=64")
64
>>> _parse_floats("104,117,123", "mean", "onnx:m.onnx")
(104.0, 117.0, 123.0)
"""

from __future__ import annotations

import math
import re

from crslib.errors import ModelError


def _parse_int(value: str, key: str, spec: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ModelError(f"option {key}={value!r} in {spec!r} must be an integer") from None
    if number < (0 if key == "seed" else 1):
        raise ModelError(f"option {key}={value!r} in {spec!r} is out of range")
    return number


def _parse_float(value: str, key: str, spec: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ModelError(f"option {key}={value!r} in {spec!r} must be a number") from None
    if not math.isfinite(number) or number <= 0:
        raise ModelError(f"option {key}={value!r} in {spec!r} must be a positive number")
    return number


def _parse_floats(value: str, key: str, spec: str) -> tuple[float, ...]:
    parts = [p for p in re.split(r"[,;\s]+", str(value).strip()) if p]
    try:
        numbers = tuple(float(p) for p in parts)
    except ValueError:
        raise ModelError(f"option {key}={value!r} in {spec!r} must be a comma-separated list of numbers") from None
    if not numbers or not all(math.isfinite(v) for v in numbers):
        raise ModelError(f"option {key}={value!r} in {spec!r} must be a comma-separated list of numbers")
    return numbers


def _parse_bool(value: str, key: str, spec: str) -> bool:
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ModelError(f"option {key}={value!r} in {spec!r} must be 0 or 1")


"""Assertions shared by the test files (``tests/`` is on ``sys.path`` under pytest)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from crslib.errors import InputError


def error_message(fn: Callable[..., Any], *args: Any, error: type[Exception] = InputError, **kwargs: Any) -> str:
    """The whole message of the ``error`` that ``fn(*args, **kwargs)`` raises.

    Tests compare it with the full expected text, so that a changed bound,
    default or wording fails; the call failing with another exception type,
    or not failing, fails the test too.
    """
    with pytest.raises(error) as info:
        fn(*args, **kwargs)
    return str(info.value)

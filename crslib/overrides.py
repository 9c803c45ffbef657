"""``crs book -p NAME VALUE``: notebook parameters set from the command line, the papermill way.

:func:`apply_overrides` turns the ``-p`` pairs into a config whose
notebook sections carry the new values; :func:`crslib.runner.run_notebooks`
applies it to the selected notebooks, so the values reach ``run.json`` and
the execution key like any other parameter.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from crslib.errors import ConfigError


def _override_value(raw: Any, default: Any, where: str) -> Any:
    """The value ``-p NAME VALUE`` gives a parameter whose default is ``default``."""
    value = raw
    if isinstance(raw, str):
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            pass
    if default is None or type(value) is type(default):
        return value
    if isinstance(default, str) and isinstance(raw, str):
        return raw  # YAML read a number, bool or date where the notebook expects text: keep what was typed
    if type(default) is float and (type(value) is int or isinstance(value, str)):
        try:
            return float(value)  # lossless; also '1e-3', which YAML 1.1 reads as text
        except ValueError:
            pass
    raise ConfigError(f"-p {where} {raw}: the notebook's default is {type(default).__name__} {default!r}, "
                      f"this value is {type(value).__name__}")


def apply_overrides(config: dict[str, Any], notebooks: Mapping[str, Mapping[str, Any]],
                    overrides: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """A config with ``crs book -p NAME VALUE`` overrides applied on top (the papermill way).

    ``NAME`` sets the parameter in every given notebook that declares it;
    ``NOTEBOOK.NAME`` (a notebook's name or number prefix) in that notebook
    only, and wins over ``NAME`` whatever their order; otherwise a later
    override wins. A text ``VALUE`` is read as YAML (``20`` an int, ``0.5`` a
    float, ``true`` a bool) and must fit the type of the notebook's default
    unless the default is None; an int for a float default becomes a float,
    and a notebook whose default is text gets the text as typed. The values
    go to each notebook's section of ``notebooks``, so they beat the preset's.

    Parameters
    ----------
    config : dict
        A preset or config (as :func:`crslib.config.load_preset` returns it); not modified.
    notebooks : mapping
        The selected notebooks: stem -> declared parameters and their defaults
        (:func:`notebook_parameters`).
    overrides : sequence of (str, str) pairs
        ``(NAME or NOTEBOOK.NAME, VALUE)`` in command-line order.

    Raises
    ------
    ConfigError
        No selected notebook matches ``NOTEBOOK`` or declares ``NAME`` (close
        names are suggested), or a value does not fit the default's type.

    Examples
    --------
    >>> nbs = {"02_agreement": {"k": 10, "model": "timm:a"}, "03_transfer": {"k": 10, "alpha": 0.5}}
    >>> c = apply_overrides({"name": "quick"}, nbs, [("02.k", "5"), ("k", "20"), ("alpha", "1")])
    >>> c["notebooks"]
    {'02_agreement': {'k': 5}, '03_transfer': {'k': 20, 'alpha': 1.0}}
    """
    out = json.loads(json.dumps(config))  # a deep copy of plain YAML data
    sections = {name: dict(section or {}) for name, section in (out.get("notebooks") or {}).items()}
    for specific in (False, True):
        for target, raw in overrides:
            stem_part, _, name = str(target).rpartition(".")
            if bool(stem_part) != specific:
                continue
            chosen = [s for s in notebooks if not stem_part or stem_part in (s, s.split("_")[0])]
            if not chosen:
                raise ConfigError(f"-p {target}: {stem_part!r} names no selected notebook "
                                  f"(selected: {', '.join(notebooks) or 'none'})")
            having = [s for s in chosen if name in notebooks[s]]
            if not having:
                known = sorted({p for s in chosen for p in notebooks[s]} - {"results_dir"})
                close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
                raise ConfigError(f"-p {target}: no selected notebook ({', '.join(chosen)}) has a parameter "
                                  f"{name!r}; " + (f"did you mean {', '.join(close)}?" if close
                                                   else f"their parameters are {', '.join(known)}"))
            for stem in having:
                sections.setdefault(stem, {})[name] = _override_value(raw, notebooks[stem][name], target)
    if sections:
        out["notebooks"] = sections
    return out

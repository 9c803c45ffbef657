"""The models a chapter studies, from a list of spec strings: the zoo is trained only when asked for.

A chapter of the book takes its models as a parameter (a comma-separated
string or a list of specs, e.g. ``"public:efficientnet_lite0,onnx:/m.onnx#feat"``).
:func:`resolve_models` turns that list into loadable specs. A ``zoo:`` spec
is a small encoder trained here; the zoo is trained (or reused from the
cache) only when such a spec is in the list, and always on its own
``zoo_data`` (the phantom's training pool by default), never on the data
the chapter studies: a trained zoo model then embeds any data like any
other encoder. ``zoo:*`` stands for every model of the zoo preset.

Examples
--------
>>> lineup = resolve_models("public:efficientnet_lite0, timm:resnet18?size=64", zoo_data="phantom",
...                         public_size=32)
>>> lineup.specs
{'public:efficientnet_lite0': 'public:efficientnet_lite0?size=32', 'timm:resnet18?size=64': 'timm:resnet18?size=64'}
>>> lineup.info[["name", "objective", "architecture"]].values.tolist()
[['public:efficientnet_lite0', 'public', 'efficientnet_lite0'], ['timm:resnet18?size=64', 'timm', 'resnet18']]
>>> lineup.cards.empty
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from crslib.errors import InputError
from crslib.models.specs import parse_spec, with_image_size

__all__ = ["ALL_ZOO", "Lineup", "parse_model_list", "resolve_models"]

#: The spec that stands for every model of the zoo preset.
ALL_ZOO = "zoo:*"

# init, patients, recipe and variant are known for zoo models only (the factors of crslib.factors)
_INFO_COLUMNS = ["name", "spec", "backend", "objective", "architecture", "seed", "init", "patients", "recipe",
                 "variant"]


@dataclass(frozen=True, eq=False)
class Lineup:
    """The models of a chapter, ready to embed.

    Attributes
    ----------
    specs : dict
        Display name -> loadable spec (``zoo:`` names without the prefix,
        public networks with the chapter's input size).
    info : DataFrame
        One row per model: ``name``, ``spec``, ``backend``, ``objective``
        (the zoo objective; the backend for other models), ``architecture``
        and ``seed`` (0 where a model has none); for zoo models also
        ``init``, ``patients``, ``recipe`` (augmentation and schedule) and
        ``variant`` (:func:`crslib.models.zoo_presets.factor_values`),
        missing for others.
    cards : DataFrame
        The zoo's model cards of the zoo models in the list (empty when
        there is none: nothing was trained or loaded).
    """

    specs: dict[str, str]
    info: pd.DataFrame = field(repr=False)
    cards: pd.DataFrame = field(repr=False)

    @property
    def names(self) -> list[str]:
        """Display names, in the order given."""
        return list(self.specs)


def parse_model_list(models: str | Sequence[str]) -> list[str]:
    """Model specs from a comma-separated string or a sequence, stripped, duplicates dropped.

    Commas inside a spec's query (``?a=1,2``) are not used by any backend,
    so a comma always separates two specs.

    Examples
    --------
    >>> parse_model_list(" zoo:* , public:open_nsfw,public:open_nsfw ")
    ['zoo:*', 'public:open_nsfw']
    """
    items = models.split(",") if isinstance(models, str) else list(models)
    specs = [str(m).strip() for m in items if str(m).strip()]
    if not specs:
        raise InputError(f"no model specs given ({models!r}); e.g. 'public:efficientnet_lite0,zoo:*'")
    return list(dict.fromkeys(specs))


def _row(name: str, spec: str) -> dict[str, Any]:
    parsed = parse_spec(spec)
    target = parsed.target.split("?")[0].split("#")[0]
    if parsed.backend == "onnx":
        target = os.path.basename(target)
    return {"name": name, "spec": spec, "backend": parsed.backend, "objective": parsed.backend,
            "architecture": target, "seed": 0}


def resolve_models(
    models: str | Sequence[str],
    *,
    zoo_data: str | os.PathLike,
    zoo_preset: str | os.PathLike | Mapping[str, Any] = "default",
    zoo_weights: str = "shipped",
    public_size: int | None = None,
    scheduler: Any = None,
    device: str | None = None,
) -> Lineup:
    """Loadable specs for a chapter's model list, training the zoo only when it is asked for.

    Parameters
    ----------
    models : str or sequence of str
        Model specs (see :func:`crslib.models.parse_spec`), comma-separated
        in a string. ``zoo:NAME`` names a zoo model of ``zoo_preset``;
        ``zoo:*`` every model of the preset.
    zoo_data : str or path
        What the zoo is trained on (anything :func:`crslib.data.load_data`
        reads), e.g. the phantom; read only when a ``zoo:`` spec is listed.
    zoo_preset : str, path or mapping
        The zoo preset (:func:`crslib.models.zoo.zoo_specs`).
    zoo_weights : {"shipped", "retrain"}
        ``"shipped"``: the zoo's weights that ship with crslib, for every
        model that was trained from the same spec on the same ``zoo_data``
        (others are trained here); ``"retrain"``: the zoo trained anew in
        the cache (:func:`crslib.models.zoo.zoo_cards`).
    public_size : int, optional
        Input size given to ``public:`` specs that set none
        (:func:`crslib.models.with_image_size`).
    scheduler : optional
        Where the zoo trains (:func:`crslib.models.zoo.train_zoo`).
    device : str, optional
        The device the zoo trains on (:func:`crslib.device.resolve_device`);
        not part of a zoo model's cache key.

    Returns
    -------
    Lineup

    Raises
    ------
    InputError
        An empty list, or a ``zoo:`` name that is not in the preset (the
        message lists the preset's models).
    crslib.errors.ModelError
        A spec no backend can parse.
    """
    requested = parse_model_list(models)
    zoo_names = [s[4:] for s in requested if s.startswith("zoo:") and s != ALL_ZOO]
    cards = pd.DataFrame()
    rows: list[dict[str, Any]] = []
    if ALL_ZOO in requested or zoo_names:
        from crslib.models.zoo import zoo_cards, zoo_specs
        from crslib.models.zoo_presets import _preset_image_size, factor_values

        preset_specs = zoo_specs(zoo_preset)
        by_name = {s.name: s for s in preset_specs}
        unknown = [n for n in zoo_names if n.split("@")[0] not in by_name]
        if unknown:
            raise InputError(f"zoo model(s) {unknown} are not in zoo preset {zoo_preset!r}; it has "
                             f"{', '.join(by_name)} (or write zoo:* for all of them)")
        wanted = list(by_name) if ALL_ZOO in requested else []
        wanted += [n.split("@")[0] for n in zoo_names if n.split("@")[0] not in wanted]
        cards = zoo_cards([by_name[n] for n in wanted], zoo_data=str(zoo_data),
                          image_size=_preset_image_size(zoo_preset, None), weights=zoo_weights,
                          scheduler=scheduler, device=device)
    card_by_name = {str(c["name"]): c for _, c in cards.iterrows()}
    specs: dict[str, str] = {}
    for spec in requested:
        names = list(card_by_name) if spec == ALL_ZOO else [spec[4:]] if spec.startswith("zoo:") else [spec]
        for name in names:
            if name in specs:
                continue
            if name in card_by_name or spec.startswith("zoo:"):
                card = card_by_name[name.split("@")[0]]
                specs[name] = f"zoo:{name}" if "@" in name else str(card["loadable"])
                rows.append({"name": name, "spec": specs[name], "backend": "zoo", "objective": card["objective"],
                             "architecture": card["architecture"], "seed": int(card["seed"]),
                             **factor_values(card["spec"])})
            else:
                specs[name] = with_image_size(spec, public_size) if public_size else spec
                rows.append(_row(name, specs[name]))
    return Lineup(specs=specs, info=pd.DataFrame(rows, columns=_INFO_COLUMNS), cards=cards)

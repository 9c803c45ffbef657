"""The zoo's models and presets: what each objective trains with, the
:class:`ZooModelSpec` of one model, and :func:`zoo_specs`, the models of a
preset (``quick``, ``default``, ``full``) with the factor pairs the ``full``
preset adds. Training, caching and loading live in :mod:`crslib.models.zoo`,
which re-exports everything public here.

Examples
--------
>>> [s.name for s in zoo_specs("full")][-4:]
['contrastive-cnn_small-seed0-half0', 'contrastive-cnn_small-seed0-half1', \
'supervised_multilabel-cnn_small-seed0-long', 'contrastive-cnn_small-seed0-long']
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from crslib.config import load_preset
from crslib.errors import ConfigError
from crslib.models.augment import _AUG
from crslib.models.networks import ARCHITECTURES

__all__ = ["LABEL_TYPES", "OBJECTIVES", "PATIENT_SETS", "ZOO_FACTORS", "ZOO_PRESETS", "ZooModelSpec", "factor_values",
           "zoo_specs"]

#: Training objectives, in the order the zoo trains them.
OBJECTIVES = (
    "supervised_multilabel",
    "supervised_single",
    "contrastive",
    "self_distillation",
    "masked_image_modelling",
    "autoencoder",
    "random_init",
)

#: What each objective learns from (the "label type" of the model card).
LABEL_TYPES = {
    "supervised_multilabel": "multi-label findings (every finding_* column, binary cross-entropy)",
    "supervised_single": "single label (the 'label' column, opacity/pneumonia, cross-entropy)",
    "contrastive": "none (self-supervised: SimCLR NT-Xent between two augmented views)",
    "self_distillation": "none (self-supervised: BYOL, EMA teacher and predictor)",
    "masked_image_modelling": "none (self-supervised: SimMIM masked-patch pixel reconstruction)",
    "autoencoder": "none (self-supervised: image reconstruction through the pooled embedding)",
    "random_init": "none (no training)",
}

#: The training patients a zoo model can use (``half0``/``half1``: two disjoint halves).
PATIENT_SETS = ("all", "half0", "half1")
#: A zoo model's schedule: its objective's (``base``), or the recipe factor's
#: other one (``long``: twice its objective's epochs in the preset).
RECIPES = ("base", "long")
#: Objectives whose decoder needs the stride-16 CNN's feature map.
_NEEDS_PIXEL_DECODER = ("masked_image_modelling", "autoencoder")


#: Per-objective hyperparameters shared by every model of that objective.
_HPARAMS: dict[str, dict[str, Any]] = {
    "supervised_multilabel": {"augment": "weak"},
    "supervised_single": {"augment": "weak"},
    "contrastive": {"augment": "weak", "temperature": 0.2, "proj_dim": 64},
    "self_distillation": {"method": "byol", "augment": "weak", "proj_dim": 64, "hidden_dim": 256,
                          "ema_momentum": 0.9, "predictor_lr_mult": 1.0, "variance_weight": 1.0},
    "masked_image_modelling": {"augment": "weak", "mask_patch": 8, "mask_ratio": 0.5, "norm_target": True},
    "autoencoder": {"augment": "weak", "mask_ratio": 0.0, "mask_patch": 8},
    "random_init": {},
}
#: Used instead of BYOL's predictor settings with ``hparams={"method": "dino"}``.
_DINO_HPARAMS = {"prototypes": 256, "student_temp": 0.1, "teacher_temp": 0.04, "center_momentum": 0.9,
                 "augment": "strong", "ema_momentum": 0.99}
_OPTIMISER = {"optimizer": "AdamW", "lr": 2e-3, "weight_decay": 1e-4, "schedule": "cosine, 3% linear warm-up"}

#: Preset definitions (used as they are unless the preset YAML has a ``zoo:``
#: section, whose keys override them). ``epochs`` may be one int or a mapping
#: objective -> int; ``seeds`` maps objective -> list of seeds (others: [0]);
#: ``wide`` lists the objectives also trained with ``cnn_wide`` (seed 0).
_ZOO_MODELS: dict[str, Any] = {
    "objectives": list(OBJECTIVES),
    "seeds": {
        "supervised_multilabel": [0, 1, 2],
        "contrastive": [0, 1, 2],
        "self_distillation": [0, 1, 2],
        "random_init": [0, 1, 2],
    },
    "wide": ["supervised_multilabel", "contrastive", "random_init"],
    "batch_size": 64,
    "image_size": 64,
}


def _epochs(n: int, **longer: int) -> dict[str, int]:
    return {objective: longer.get(objective, n) for objective in OBJECTIVES if objective != "random_init"}


# quick and default train the same 18 models and differ only in epochs (and so in time). quick (6
# epochs, 24 steps on the quick phantom, about 60 s on an idle machine) is a smoke run: its cards flag
# the objectives that need longer. default gives each objective the schedule it needed to beat its
# initial weights on the default phantom (seed 0 unless said; margin of the card's probe, 95% interval):
# supervised learns in 8 epochs (136 steps); contrastive did too, but by thin margins (seeds 0, 1, 2 and
# cnn_wide: lower ends 0.016, 0.009, 0.041 and 0.001), so it trains 16 (+0.090 [0.034, 0.149], +0.087
# [0.029, 0.145], +0.093 [0.037, 0.143], cnn_wide +0.077 [0.039, 0.120]); BYOL needed 32 (24 epochs: seeds
# 0 and 1 +0.091 and +0.078, seed 2 +0.008 [-0.039, 0.064]), but at 32 a later book's seeds 0, 1, 2 had
# lower ends 0.001, 0.024 and 0.028, so it trains 48 (+0.092 [0.047, 0.142], +0.122 [0.069, 0.185],
# +0.085 [0.038, 0.131]); the autoencoder 48 (+0.049 [-0.007, 0.100] at 24,
# +0.069 [0.021, 0.117] at 48); masked image modelling 96 (+0.032 at 24, +0.040 at 48, +0.084 [0.042,
# 0.131] at 96). supervised_single learns its label in 8 epochs, on which its card probes it (seeds 0, 1,
# 2: +0.311 [0.243, 0.378], +0.351 [0.271, 0.434], +0.184 [0.136, 0.235]); on the mean over all findings it
# trades the other findings for its label (seeds 0-2 at 3, 4, 8 and 16 epochs: +0.03 to +0.07, lower ends
# -0.03 to 0.02), which is why a supervised model is probed on the labels it trained on (zoo_probe).
# The same code gives other weights on another CPU (other rounding), so margins move between machines.
# Idle-machine wall time per model in a cold default book: 85-93 s for BYOL at 32 epochs, 99 s for the
# autoencoder, 111 s for masked image modelling, against 9 s (supervised) and 18 s (contrastive at 8).
ZOO_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {**_ZOO_MODELS, "epochs": _epochs(6)},
    "default": {**_ZOO_MODELS, "epochs": _epochs(8, contrastive=16, self_distillation=48, autoencoder=48,
                                                    masked_image_modelling=96)},
}
# full adds the study's other factors, each as pairs of seed-0 models that differ in that factor alone
# (zoo_specs names them), with the schedules each needed to beat its initial weights on the default
# phantom (probe margin, lower 95% bound): init is EfficientNet-Lite0 from random vs ImageNet weights,
# supervised only and for 32 epochs (from random weights it fell below them at 8 epochs, -0.036, and
# cleared them at 32, low +0.021; contrastive training lost the ImageNet features at 8 epochs, -0.051);
# patients is cnn_small on two disjoint patient halves for 16 epochs (as many steps as 8 on all
# patients: contrastive halves at 8 epochs did not clear zero); recipe pairs each model with its long
# schedule, twice its epochs (contrastive at 8 and 16: low +0.055; with strong views instead it fell
# below, -0.029; the default's contrastive is now 16, so its long schedule is 32).
ZOO_PRESETS["full"] = {**ZOO_PRESETS["default"],
                       "factors": {"init": {"supervised_multilabel": 32},
                                   "patients": {"supervised_multilabel": 16, "contrastive": 16},
                                   "recipe": ["supervised_multilabel", "contrastive"]}}
_PRESET_KEYS = ("objectives", "seeds", "wide", "epochs", "batch_size", "image_size", "hparams", "factors")
#: What the ``factors`` setting of a preset can add.
ZOO_FACTORS = ("init", "patients", "recipe")


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class ZooModelSpec:
    """One zoo model: what to train, on which architecture, with which seed.

    Parameters
    ----------
    name : str
        ``"{objective}-{architecture}-seed{seed}"`` by convention.
    objective : str
        One of :data:`OBJECTIVES`.
    architecture : str
        One of :data:`ARCHITECTURES` (``cnn_small``, ``cnn_wide``).
    seed : int
        Seeds initialisation, data order, augmentations and masks.
    epochs : int
        Passes over the training pool (0 for ``random_init``).
    batch_size : int
        Images per step (capped at the pool size).
    hparams : dict
        Overrides of the objective's hyperparameters (``lr``,
        ``weight_decay``, ``temperature``, ``mask_ratio``, ...).
    init : {"random", "imagenet"}
        Starting weights: seeded random, or the bundled ImageNet weights
        (only architectures that have them, ``effnet_lite0``).
    patients : {"all", "half0", "half1"}
        Train on every training patient, or on one of two disjoint halves of
        them (:func:`crslib.splits.grouped_partition` into two equal shares,
        ``random_state=0``: every model of a half sees the same patients).
    recipe : {"base", "long"}
        A label for the schedule: ``long`` marks the recipe factor's variant,
        which :func:`zoo_specs` gives twice its objective's epochs (``epochs``
        holds the number trained).

    Examples
    --------
    >>> ZooModelSpec.make("contrastive", seed=1, epochs=5).name
    'contrastive-cnn_small-seed1'
    >>> ZooModelSpec.make("contrastive", patients="half1").name
    'contrastive-cnn_small-seed0-half1'
    """

    name: str
    objective: str
    architecture: str = "cnn_small"
    seed: int = 0
    epochs: int = 10
    batch_size: int = 128
    hparams: Mapping[str, Any] = field(default_factory=dict)
    init: str = "random"
    patients: str = "all"
    recipe: str = "base"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"unknown zoo objective {self.objective!r}: use one of {', '.join(OBJECTIVES)}")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"unknown zoo architecture {self.architecture!r}: use one of {', '.join(ARCHITECTURES)}"
            )
        if not self.name or any(c in self.name for c in "/\\?#&@ ") or self.name.startswith("."):
            raise ConfigError(f"zoo model name {self.name!r} must be non-empty without / \\ ? # & @ or spaces")
        for label, value, low in (("seed", self.seed, 0), ("epochs", self.epochs, 0), ("batch_size", self.batch_size, 2)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ConfigError(f"zoo model {self.name}: {label} must be an integer >= {low}, got {value!r}")
        if self.init not in ARCHITECTURES[self.architecture]["inits"]:
            raise ConfigError(f"zoo model {self.name}: architecture {self.architecture} cannot start from "
                              f"{self.init!r} weights; use one of {', '.join(ARCHITECTURES[self.architecture]['inits'])}")
        if self.patients not in PATIENT_SETS:
            raise ConfigError(f"zoo model {self.name}: patients must be one of {', '.join(PATIENT_SETS)}, "
                              f"got {self.patients!r}")
        if self.recipe not in RECIPES:
            raise ConfigError(f"zoo model {self.name}: recipe must be one of {', '.join(RECIPES)}, got {self.recipe!r}")
        if ARCHITECTURES[self.architecture]["family"] != "cnn" and self.objective in _NEEDS_PIXEL_DECODER:
            raise ConfigError(f"zoo model {self.name}: {self.objective} decodes pixels from the stride-16 CNNs "
                              f"only; use cnn_small or cnn_wide")
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "epochs", 0 if self.objective == "random_init" else int(self.epochs))
        object.__setattr__(self, "batch_size", int(self.batch_size))
        object.__setattr__(self, "hparams", dict(self.hparams or {}))
        allowed = set(_OPTIMISER) | set(_HPARAMS[self.objective])
        if self.objective == "self_distillation":
            allowed |= set(_DINO_HPARAMS)
        unknown = sorted(set(self.hparams) - allowed)
        if unknown:
            raise ConfigError(
                f"zoo model {self.name}: unknown hyperparameter(s) {', '.join(unknown)} for objective "
                f"{self.objective}; valid: {', '.join(sorted(allowed)) or 'none'}"
            )
        augment = self.resolved_hparams().get("augment", "weak")
        if augment not in _AUG:
            raise ConfigError(f"zoo model {self.name}: augment must be one of {', '.join(_AUG)}, got {augment!r}")

    @classmethod
    def make(cls, objective: str, *, architecture: str = "cnn_small", seed: int = 0, epochs: int = 10,
             batch_size: int = 128, hparams: Mapping[str, Any] | None = None, init: str = "random",
             patients: str = "all", recipe: str = "base", suffix: str = "") -> ZooModelSpec:
        """Spec with the conventional name ``{objective}-{architecture}-seed{seed}``, followed by
        ``-imagenet``, ``-{patients}`` and ``-{recipe}`` when they are not the defaults, then ``suffix``."""
        name = (f"{objective}-{architecture}-seed{int(seed)}" + ("-imagenet" if init == "imagenet" else "")
                + (f"-{patients}" if patients != "all" else "") + (f"-{recipe}" if recipe != "base" else "") + suffix)
        return cls(name, objective, architecture, seed, epochs, batch_size, dict(hparams or {}), init, patients,
                   recipe)

    def resolved_hparams(self) -> dict[str, Any]:
        """Optimiser and objective hyperparameters with this spec's overrides."""
        out = dict(_OPTIMISER)
        out.update(_HPARAMS[self.objective])
        if self.objective == "self_distillation" and self.hparams.get("method") == "dino":
            out.pop("predictor_lr_mult", None)
            out.update(_DINO_HPARAMS)
        out.update(self.hparams)
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hparams"] = dict(sorted(self.hparams.items()))
        # the factors added later stay out of the dict at their defaults, so the cache keys of the
        # models trained before them still match
        for key, default in (("init", "random"), ("patients", "all"), ("recipe", "base")):
            if d[key] == default:
                del d[key]
        return d


def _merge(base: dict[str, Any], extra: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in (extra or {}).items():
        if key not in _PRESET_KEYS:
            raise ConfigError(f"unknown key {key!r} in the zoo settings of {where}; valid keys: {', '.join(_PRESET_KEYS)}")
        if key in ("epochs", "seeds", "hparams") and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            merged = dict(out[key])
            merged.update(value)
            out[key] = merged
        else:
            out[key] = copy.deepcopy(value)
    return out


def _preset_settings(preset: str | os.PathLike | Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    if isinstance(preset, Mapping):
        settings = _merge(ZOO_PRESETS["default"], preset, "the given settings")
    else:
        text = str(preset)
        base = ZOO_PRESETS.get(text, ZOO_PRESETS["default"])
        try:
            config = load_preset(text)
        except ConfigError:
            if text not in ZOO_PRESETS:
                raise
            config = {}
        section = config.get("zoo") or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"the zoo: section of preset {text!r} must be a mapping")
        settings = _merge(base, section, f"preset {text!r}")
    return _merge(settings, overrides, "the overrides")


def zoo_specs(preset: str | os.PathLike | Mapping[str, Any] = "default", *,
              overrides: Mapping[str, Any] | None = None) -> list[ZooModelSpec]:
    """The models of a zoo preset.

    Parameters
    ----------
    preset : str, path or mapping
        ``"quick"`` or ``"default"`` (module defaults :data:`ZOO_PRESETS`,
        overridden by a ``zoo:`` section of ``configs/<preset>.yaml`` when it
        has one), another preset name or YAML path (its ``zoo:`` section over
        the ``default`` definition), or a settings mapping.
    overrides : mapping, optional
        Settings applied last, e.g. ``{"epochs": 2, "seeds": {"contrastive": [0]}}``.
        Keys: ``objectives``, ``seeds``, ``wide``, ``epochs``, ``batch_size``,
        ``image_size``, ``hparams`` (objective -> dict), ``factors`` (factor
        -> a list of objectives, or for ``init`` and ``patients`` a mapping
        objective -> epochs; the ``full`` preset's).

    Returns
    -------
    list of ZooModelSpec
        In training order: each objective at ``cnn_small`` with its seeds,
        then the ``wide`` objectives at ``cnn_wide`` with seed 0, then the
        factor pairs (``effnet_lite0`` from random and ImageNet weights,
        ``-half0``/``-half1``, ``-long`` for the recipe's long schedule).

    Examples
    --------
    >>> [s.name for s in zoo_specs("quick")][:2]
    ['supervised_multilabel-cnn_small-seed0', 'supervised_multilabel-cnn_small-seed1']
    """
    settings = _preset_settings(preset, overrides)
    objectives = list(settings.get("objectives") or [])
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown:
        raise ConfigError(f"unknown zoo objective(s) {', '.join(map(str, unknown))}: use {', '.join(OBJECTIVES)}")
    epochs = settings.get("epochs", 10)
    seeds = settings.get("seeds") or {}
    hparams = settings.get("hparams") or {}
    batch_size = settings.get("batch_size", 128)

    def epochs_of(objective: str) -> int:
        if isinstance(epochs, Mapping):
            return int(epochs.get(objective, 10))
        return int(epochs)

    def seeds_of(objective: str) -> list[int]:
        value = seeds.get(objective, [0]) if isinstance(seeds, Mapping) else seeds
        if isinstance(value, (int, np.integer)):
            value = [value]
        return [int(v) for v in value]

    specs: list[ZooModelSpec] = []
    for objective in objectives:
        for seed in seeds_of(objective):
            specs.append(ZooModelSpec.make(objective, seed=seed, epochs=epochs_of(objective),
                                           batch_size=batch_size, hparams=hparams.get(objective)))
    for objective in settings.get("wide") or []:
        if objective not in objectives:
            continue
        specs.append(ZooModelSpec.make(objective, architecture="cnn_wide", seed=0, epochs=epochs_of(objective),
                                       batch_size=batch_size, hparams=hparams.get(objective)))
    specs += _factor_specs(settings.get("factors") or {}, objectives, epochs_of, batch_size, hparams)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"zoo preset {preset!r} names a model twice: {names}")
    return specs


def _factor_specs(factors: Mapping[str, Any], objectives: list[str], epochs_of, batch_size: int,
                  hparams: Mapping[str, Any]) -> list[ZooModelSpec]:
    """The models a preset's ``factors`` setting adds: for each factor, the objectives listed (seed 0)
    as a pair that differs in that factor alone. A factor maps to a list of objectives, or to a mapping
    objective -> epochs for that factor's pair (``init``, ``patients``); ``recipe`` pairs the base
    model with its ``long`` schedule, twice its objective's epochs."""
    if not isinstance(factors, Mapping):
        raise ConfigError(f"the zoo's factors setting must map a factor to objectives, got {factors!r}")
    unknown = sorted(set(factors) - set(ZOO_FACTORS))
    if unknown:
        raise ConfigError(f"unknown zoo factor(s) {', '.join(unknown)}: use {', '.join(ZOO_FACTORS)}")
    specs = []
    for factor in ZOO_FACTORS:
        for objective, epochs in _factor_epochs(factor, factors.get(factor) or [], epochs_of).items():
            if objective not in objectives or objective == "random_init":
                raise ConfigError(f"zoo factor {factor} lists {objective!r}, which is not among the preset's trained "
                                  "objectives")
            common = {"seed": 0, "epochs": epochs, "batch_size": batch_size,
                      "hparams": dict(hparams.get(objective) or {})}
            if factor == "init":
                specs += [ZooModelSpec.make(objective, architecture="effnet_lite0", init=init, **common)
                          for init in ("random", "imagenet")]
                reference = ZooModelSpec.make("random_init", architecture="effnet_lite0", epochs=0, batch_size=batch_size)
                if "random_init" in objectives and reference.name not in {s.name for s in specs}:
                    specs.append(reference)  # the architecture's random-init reference, as cnn_small has
            elif factor == "patients":
                specs += [ZooModelSpec.make(objective, patients=half, **common) for half in ("half0", "half1")]
            else:
                specs.append(ZooModelSpec.make(objective, recipe="long", **(common | {"epochs": 2 * epochs})))
    return specs


def _factor_epochs(factor: str, listed: Any, epochs_of) -> dict[str, int]:
    """objective -> epochs of one factor's setting (a list: each objective's own epochs)."""
    if isinstance(listed, Mapping):
        if factor == "recipe":
            raise ConfigError("zoo factor recipe takes a list of objectives: its variant trains twice their epochs")
        out = {}
        for objective, epochs in listed.items():
            if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
                raise ConfigError(f"zoo factor {factor}: epochs for {objective!r} must be an integer >= 1, "
                                  f"got {epochs!r}")
            out[str(objective)] = int(epochs)
        return out
    if isinstance(listed, str) or not isinstance(listed, (list, tuple)):
        raise ConfigError(f"zoo factor {factor} must list objectives (or map them to epochs), got {listed!r}")
    return {objective: epochs_of(objective) for objective in listed}


def _preset_image_size(preset: Any, overrides: Mapping[str, Any] | None) -> int:
    try:
        return int(_preset_settings(preset, overrides).get("image_size", 64))
    except ConfigError:
        return 64


def factor_values(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A zoo model's study factors from its spec (``card["spec"]`` or
    :meth:`ZooModelSpec.to_dict`), and whether it is a factor variant.

    Returns
    -------
    dict
        ``init``, ``patients``, ``recipe`` (the augmentation, with the
        schedule when it is not the objective's own, e.g. ``"weak, long
        schedule"``; None for ``random_init``) and
        ``variant``: True for a model that the ``factors`` setting adds
        (ImageNet start, a patient half, another augmentation than its
        objective's, or the long schedule), False for the preset's own models.

    Examples
    --------
    >>> factor_values(ZooModelSpec.make("contrastive", hparams={"augment": "strong"}).to_dict())
    {'init': 'random', 'patients': 'all', 'recipe': 'strong', 'variant': True}
    >>> factor_values(ZooModelSpec.make("contrastive", recipe="long", epochs=16).to_dict())["recipe"]
    'weak, long schedule'
    >>> factor_values(ZooModelSpec.make("self_distillation", hparams={"method": "dino"}).to_dict())["variant"]
    False
    """
    hparams = dict(spec.get("hparams") or {})
    init, patients = spec.get("init", "random"), spec.get("patients", "all")
    schedule = spec.get("recipe", "base")
    augment = ZooModelSpec.make(spec["objective"], hparams=hparams).resolved_hparams().get("augment")
    hparams.pop("augment", None)
    own_augment = ZooModelSpec.make(spec["objective"], hparams=hparams).resolved_hparams().get("augment")
    recipe = None if augment is None else augment + ("" if schedule == "base" else f", {schedule} schedule")
    return {"init": init, "patients": patients, "recipe": recipe,
            "variant": bool(init != "random" or patients != "all" or augment != own_augment or schedule != "base")}


"""Image encoders: one interface, model spec strings, public pretrained
references, and the zoo of small encoders trained here.

=====================  ==========================================================
:mod:`.specs`          model spec strings: :func:`parse_spec`, :func:`load_encoder`
:mod:`.encoders`       the :class:`Encoder` interface and its backends (torch, timm, ONNX)
:mod:`.timm_weights`   creating timm models, loading local or HF-cache weight files
:mod:`._options`       typed values of spec options (shared by specs and the ONNX backend)
:mod:`.public`         offline public weights (EfficientNet-Lite0, Open-NSFW)
:mod:`.zoo`            zoo presets, :class:`ZooModelSpec`, :func:`train_zoo`, cards
:mod:`.networks`       the zoo's CNN, heads and MLPs
:mod:`.objectives`     the zoo's training objectives (imports torch)
:mod:`.augment`        the zoo's batched augmentations (no flips)
:mod:`.trainer`        the training pool and the loop that trains one zoo model
:mod:`._training`      deterministic context, warm-up/cosine schedule, EMA teacher update
:mod:`.finetune`       :func:`finetune_classifier` (study 2's fine-tuned policy)
:mod:`.lineup`         a chapter's model list: :func:`resolve_models` (the zoo only for ``zoo:`` specs)
=====================  ==========================================================

Imports go one way, with no cycle: :mod:`.specs` dispatches to the backends
(:mod:`.encoders`, :mod:`.timm_weights`), to :mod:`.public` (which returns
spec strings and never calls back) and, for ``zoo:`` specs, to :mod:`.zoo`;
:mod:`.zoo` -> :mod:`.trainer` -> :mod:`.objectives` -> :mod:`.networks`,
:mod:`.augment`, :mod:`._training`; :mod:`.finetune` -> :mod:`.specs`. torch
is imported when a model is built, not by ``import crslib.models``.

Examples
--------
>>> import crslib
>>> from crslib.models import load_encoder, parse_spec
>>> parse_spec("zoo:contrastive-cnn_small-seed0").backend
'zoo'
>>> load_encoder("timm:test_resnet?size=32").preprocessing.input_size
(3, 32, 32)
"""

from crslib.models.encoders import (
    Encoder,
    OnnxEncoder,
    Preprocessing,
    TimmEncoder,
    TorchEncoder,
    weights_sha256,
)
from crslib.models.finetune import FINETUNE_FORMAT, finetune_classifier
from crslib.models.lineup import ALL_ZOO, Lineup, parse_model_list, resolve_models
from crslib.models.networks import ARCHITECTURES, build_encoder_module
from crslib.models.public import (
    PUBLIC_ENCODERS,
    check_efficientnet_lite0,
    convert_efficientnet_lite0,
    efficientnet_lite0_key_map,
    open_nsfw_onnx_path,
    public_spec,
)
from crslib.models.specs import (
    SPEC_FORMS,
    ParsedSpec,
    is_random_init,
    load_encoder,
    load_public_encoder,
    parse_spec,
    random_init_spec,
    with_image_size,
)
from crslib.models.zoo import (
    LABEL_TYPES,
    OBJECTIVES,
    ZOO_FORMAT,
    ZOO_PRESETS,
    ZOO_THREADS,
    ZooModelSpec,
    list_zoo,
    load_zoo_encoder,
    train_zoo,
    zoo_specs,
)

__all__ = [
    "ALL_ZOO",
    "ARCHITECTURES",
    "Encoder",
    "FINETUNE_FORMAT",
    "Lineup",
    "LABEL_TYPES",
    "OBJECTIVES",
    "OnnxEncoder",
    "PUBLIC_ENCODERS",
    "ParsedSpec",
    "Preprocessing",
    "SPEC_FORMS",
    "TimmEncoder",
    "TorchEncoder",
    "ZOO_FORMAT",
    "ZOO_PRESETS",
    "ZOO_THREADS",
    "ZooModelSpec",
    "build_encoder_module",
    "check_efficientnet_lite0",
    "convert_efficientnet_lite0",
    "efficientnet_lite0_key_map",
    "finetune_classifier",
    "is_random_init",
    "list_zoo",
    "load_encoder",
    "load_public_encoder",
    "load_zoo_encoder",
    "open_nsfw_onnx_path",
    "parse_spec",
    "public_spec",
    "random_init_spec",
    "with_image_size",
    "train_zoo",
    "weights_sha256",
    "zoo_specs",
    "parse_model_list",
    "resolve_models",
]

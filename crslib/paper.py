"""The three studies' reported numbers: the one place in ``crslib`` and the notebooks that types them.

The book, the CLI reports and the reporting checklist quote the papers'
numbers next to what a run measured, always as the paper's. Each number is
stored once here with the claim it supports, said in the project's own words
(the studies' abstracts are the only source). Code elsewhere reads them with
:func:`value` or :func:`claim`; a notebook shows the whole ledger with
:func:`claims_frame`.

Studies
-------
``crs-bench``
    CRS-Bench: mutual k-nearest-neighbour agreement between medical image
    encoders.
``kermany``
    The Kermany pediatric chest radiograph study of protocol sensitivity.
``risk``
    The representation-risk study (LOOKAGAIN-ML).

Examples
--------
>>> value("public_pair_overlap")
0.091
>>> claim("shortcut_test").study
'kermany'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd

from crslib.errors import InputError

__all__ = ["PaperClaim", "STUDIES", "CLAIMS", "value", "claim", "claims_frame"]

#: Study keys and the names the book uses for them.
STUDIES = {
    "crs-bench": "CRS-Bench (mutual kNN agreement between encoders)",
    "kermany": "the Kermany protocol-sensitivity study",
    "risk": "the representation-risk study (LOOKAGAIN-ML)",
}


@dataclass(frozen=True)
class PaperClaim:
    """One number a study reports, with the claim it supports.

    Attributes
    ----------
    key : str
        Short identifier used by code (``value(key)``).
    study : str
        One of :data:`STUDIES`.
    value : float
        The number as the paper reports it.
    unit : str
        What the number measures (e.g. ``"AUROC"``, ``"share of 10 neighbours"``).
    claim : str
        The claim in the project's own words, without the number.
    """

    key: str
    study: str
    value: float
    unit: str
    claim: str


def _claims(*rows: tuple[str, str, float, str, str]) -> dict[str, PaperClaim]:
    out = {}
    for key, study, number, unit, text in rows:
        if study not in STUDIES or key in out:
            raise ValueError(f"bad paper claim {key!r}")  # a typo in this module, not a user error
        out[key] = PaperClaim(key, study, float(number), unit, text)
    return out


#: Every reported number, by key.
CLAIMS: dict[str, PaperClaim] = _claims(
    # CRS-Bench
    ("public_pair_overlap", "crs-bench", 0.091, "share of 10 neighbours",
     "two public models share on average this share of a chest radiograph's 10 nearest neighbours"),
    ("random_init_overlap", "crs-bench", 0.036, "share of 10 neighbours",
     "a randomly initialised network shares this much with the public models"),
    ("other_modalities_max", "crs-bench", 0.300, "share of 10 neighbours",
     "in the four other imaging modalities public models share at most this much"),
    ("transfer_auroc_retention", "crs-bench", 0.987, "share of the original AUROC",
     "a linear map fitted on 4,096 unlabelled radiographs carries classifiers for 14 findings from one "
     "model to another and keeps this share of their AUROC"),
    ("map_fit_images", "crs-bench", 4096, "images",
     "number of unlabelled radiographs the linear map between two models is fitted on"),
    ("supervised_seed_overlap_low", "crs-bench", 0.062, "share of 10 neighbours",
     "lower end of the overlap between two label-supervised models that differ only in their seed"),
    ("supervised_seed_overlap_high", "crs-bench", 0.100, "share of 10 neighbours",
     "upper end of the overlap between two label-supervised models that differ only in their seed"),
    ("ssl_pair_overlap_low", "crs-bench", 0.411, "share of 10 neighbours",
     "lower end of the overlap between two self-distillation, masked-image or contrastive models"),
    ("ssl_pair_overlap_high", "crs-bench", 0.802, "share of 10 neighbours",
     "upper end of the overlap between two self-distillation, masked-image or contrastive models"),
    # Kermany protocol sensitivity
    ("backbone_spread", "kermany", 0.026, "AUROC",
     "under one protocol, eight pretrained backbones differ by only this much"),
    ("policy_effect", "kermany", 0.044, "AUROC",
     "frozen versus fine-tuned moves AUROC by this much on average"),
    ("threshold_effect", "kermany", 0.090, "balanced accuracy",
     "the choice of decision threshold moves balanced accuracy by this much on average"),
    ("partition_auc", "kermany", 0.697, "AUROC",
     "a classifier tells the official test split from the training pool at this AUROC"),
    ("partition_auc_normal", "kermany", 0.898, "AUROC",
     "among normal radiographs the split classifier reaches this AUROC"),
    ("shortcut_pool", "kermany", 0.992, "balanced accuracy",
     "a classifier on file properties alone reaches this inside the training pool"),
    ("shortcut_test", "kermany", 0.496, "balanced accuracy",
     "the same file-property classifier falls to this on the official test split"),
    # Representation risk
    ("houses_r2_resnet50", "risk", 0.396, "test R^2",
     "house prices: test R^2 with ResNet50 features"),
    ("houses_r2_siglip2", "risk", 0.629, "test R^2",
     "house prices: test R^2 with SigLIP 2 features, the encoder validation selects"),
    ("horses_r2_low", "risk", 0.029, "test R^2",
     "racehorse performance: test R^2 of the comparison encoder the study starts from"),
    ("horses_r2_dinov2", "risk", 0.105, "test R^2",
     "racehorse performance: test R^2 with DINOv2 features, the encoder validation selects"),
    ("houses_selected_r2", "risk", 0.658, "test R^2",
     "house prices: test R^2 of the procedure selected on locked validation data"),
    ("pneumonia_selected_accuracy", "risk", 0.979, "accuracy",
     "pneumonia: accuracy of the procedure selected on locked validation data"),
    ("age_mae_siglip2", "risk", 4.786, "years (MAE)",
     "continuous facial age: mean absolute error of SigLIP 2, the encoder validation selects"),
)


def claim(key: str) -> PaperClaim:
    """The :class:`PaperClaim` stored under ``key``.

    Raises
    ------
    InputError
        No claim has that key (the message lists the keys).
    """
    try:
        return CLAIMS[key]
    except (KeyError, TypeError):
        raise InputError(f"no paper number {key!r}; known: {', '.join(CLAIMS)}") from None


def value(key: str) -> float:
    """The reported number stored under ``key`` (see :data:`CLAIMS`)."""
    return claim(key).value


def claims_frame(study: str | None = None) -> pd.DataFrame:
    """All claims (or one study's) as a table: key, study, value, unit, claim.

    Examples
    --------
    >>> float(claims_frame("kermany").loc["threshold_effect", "value"])
    0.09
    """
    if study is not None and study not in STUDIES:
        raise InputError(f"study must be one of {', '.join(STUDIES)}, got {study!r}")
    rows = [asdict(c) for c in CLAIMS.values() if study is None or c.study == study]
    return pd.DataFrame(rows, columns=["key", "study", "value", "unit", "claim"]).set_index("key")

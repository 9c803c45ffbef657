"""The seven items of the reporting checklist: what each asks, the paper's effect behind it, and where it sits in four guidelines.

:data:`ITEMS` holds one :class:`ChecklistItemSpec` per item (the fields a run must
record, the effect the Kermany study measured for it, quoted from
:mod:`crslib.paper`), and its crosswalk to CLAIM 2024, TRIPOD+AI, MI-CLAIM and
DOME, whose references and item wording are in :data:`REFERENCES` and
:data:`CROSSWALK_SOURCES`. :mod:`crslib.checklist` checks a run's evidence
against these items.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from crslib import paper

__all__ = ["ITEM_IDS", "GUIDELINES", "REFERENCES", "CROSSWALK_SOURCES", "ChecklistItemSpec", "ITEMS"]

_P = paper.value  # the paper's reported number, by key

ITEM_IDS = ("split", "training_policy", "threshold", "metrics", "calibration", "uncertainty", "shortcut")
GUIDELINES = ("CLAIM 2024", "TRIPOD+AI", "MI-CLAIM", "DOME")


# --------------------------------------------------------------------------- references


REFERENCES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "CLAIM 2024": MappingProxyType(
            {
                "authors": (
                    "Tejani AS",
                    "Klontzas ME",
                    "Gatti AA",
                    "Mongan JT",
                    "Moy L",
                    "Park SH",
                    "Kahn CE Jr",
                    "for the CLAIM 2024 Update Panel",
                ),
                "year": 2024,
                "title": "Checklist for Artificial Intelligence in Medical Imaging (CLAIM): 2024 Update",
                "journal": "Radiology: Artificial Intelligence",
                "volume": "6",
                "issue": "4",
                "article": "e240300",
                "doi": "10.1148/ryai.240300",
                "pmid": "38809149",
                "url": "https://pubs.rsna.org/doi/10.1148/ryai.240300",
            }
        ),
        "TRIPOD+AI": MappingProxyType(
            {
                "authors": (
                    "Collins GS",
                    "Moons KGM",
                    "Dhiman P",
                    "Riley RD",
                    "Beam AL",
                    "Van Calster B",
                    "Ghassemi M",
                    "Liu X",
                    "Reitsma JB",
                    "van Smeden M",
                    "et al.",
                ),
                "year": 2024,
                "title": (
                    "TRIPOD+AI statement: updated guidance for reporting clinical prediction models "
                    "that use regression or machine learning methods"
                ),
                "journal": "BMJ",
                "volume": "385",
                "article": "e078378",
                "doi": "10.1136/bmj-2023-078378",
                "pmid": "38626948",
                "url": "https://www.bmj.com/content/385/bmj-2023-078378",
            }
        ),
        "MI-CLAIM": MappingProxyType(
            {
                "authors": (
                    "Norgeot B",
                    "Quer G",
                    "Beaulieu-Jones BK",
                    "Torkamani A",
                    "Dias R",
                    "Gianfrancesco M",
                    "Arnaout R",
                    "Kohane IS",
                    "Saria S",
                    "Topol E",
                    "Obermeyer Z",
                    "Yu B",
                    "Butte AJ",
                ),
                "year": 2020,
                "title": "Minimum information about clinical artificial intelligence modeling: the MI-CLAIM checklist",
                "journal": "Nature Medicine",
                "doi": "10.1038/s41591-020-1041-y",
                "url": "https://www.nature.com/articles/s41591-020-1041-y",
                "note": "volume and pages not verified here; published online 9 September 2020",
            }
        ),
        "DOME": MappingProxyType(
            {
                "authors": (
                    "Walsh I",
                    "Fishman D",
                    "Garcia-Gasulla D",
                    "Titma T",
                    "Pollastri G",
                    "ELIXIR Machine Learning Focus Group",
                    "Harrow J",
                    "Psomopoulos FE",
                    "Tosatto SCE",
                ),
                "year": 2021,
                "title": "DOME: recommendations for supervised machine learning validation in biology",
                "journal": "Nature Methods",
                "volume": "18",
                "pages": "1122-1127",
                "doi": "10.1038/s41592-021-01205-4",
                "url": "https://www.nature.com/articles/s41592-021-01205-4",
                "note": "an author correction was published on 23 September 2021",
            }
        ),
    }
)
"""Citations of the four guidelines (for a bibliography).

Every field was read in a retrieved text (see :data:`CROSSWALK_SOURCES`);
fields that could not be verified are left out or say so in ``"note"``.
"""


CROSSWALK_SOURCES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "CLAIM 2024": MappingProxyType(
            {
                "reference": "Tejani et al., Radiology: Artificial Intelligence 2024;6(4):e240300, doi:10.1148/ryai.240300",
                "identifiers": "item numbers 1-44 of the 2024 update",
                "verified": (
                    "Item numbers and short titles of the 44 items (7 data sources, 9 data preprocessing, "
                    "13 image acquisition protocol, 19 how data were assigned to partitions, 20 level at which "
                    "partitions are disjoint, 22 detailed description of model, 24 initialization of model "
                    "parameters, 25 details of training approach, 26 method of selecting the final model, "
                    "28 metrics of model performance, 29 statistical measures of significance and uncertainty, "
                    "30 robustness or sensitivity analysis, 36 demographic and clinical characteristics of "
                    "cases in each partition, 37 performance metrics and measures of statistical uncertainty, "
                    "38 estimates of diagnostic performance and their precision, 39 failure analysis) were "
                    "read in two independent retrieved reproductions of the 2024 checklist that agree item "
                    "for item: a guideline note 'CLAIM, version 2024 update, 44 items, extracted verbatim "
                    "from the PDF checklist' and an ontology audit table 'CLAIM item 01-44' (both public "
                    "GitHub files found with the code search); further project checklists agree on items "
                    "17-21. The RSNA article itself (pubs.rsna.org) could not be retrieved."
                ),
                "section_level_only": (),
                "caveats": (
                    "Only the short item titles were available, not the full item texts or the elaboration. "
                    "No CLAIM 2024 title names decision thresholds or calibration, so items 3 and 5 map to "
                    "the nearest items (model description and performance metrics), not to a dedicated item. "
                    "The 2020 CLAIM (42 items) numbers differently; do not mix them."
                ),
            }
        ),
        "TRIPOD+AI": MappingProxyType(
            {
                "reference": "Collins et al., BMJ 2024;385:e078378, doi:10.1136/bmj-2023-078378",
                "identifiers": "item numbers 1-27 with sub-items (e.g. 12a, 23a)",
                "verified": (
                    "Full item texts of 5a, 7, 12a, 12c, 12e, 12f, 15, 16, 20c, 23a, 24 and 26 were read in a "
                    "retrieved CC BY 4.0 reproduction of the official checklist ('TRIPOD+AI 2024 checklist', "
                    "source Europe PMC PMC11019967, doi:10.1136/bmj-2023-078378); the texts of 12a-12e agree "
                    "word for word with four further independent reproductions. Citation details (BMJ "
                    "2024;385:e078378, published 16 April 2024, PMID 38626948, 27-item checklist) were read "
                    "on retrieved abstract pages (PubMed mirror, repository record)."
                ),
                "section_level_only": (),
                "caveats": (
                    "Item 15 is the only item that names classification thresholds; 12e names calibration; "
                    "12f and 24 cover recalibration (model updating)."
                ),
            }
        ),
        "MI-CLAIM": MappingProxyType(
            {
                "reference": "Norgeot et al., Nature Medicine 2020, doi:10.1038/s41591-020-1041-y",
                "identifiers": "parts of the checklist table, not item numbers",
                "verified": (
                    "The part names 'Part 1: Study design', 'Parts 2-3: Data and optimization', 'Part 4: Model "
                    "performance', 'Part 5: Model examination' and 'Part 6: Reproducibility' were read in a "
                    "retrieved reproduction of the paper's Table 1 (a public GitHub MI-CLAIM checklist that "
                    "cites nature.com/articles/s41591-020-1041-y/tables/1); the item texts under each part "
                    "(e.g. independence between training and test sets; primary metric for algorithm "
                    "performance and for clinical utility; reliability and robustness as the data "
                    "distribution shifts) agree with an ontology audit table of MI-CLAIM items. The "
                    "authors' repository (beaunorgeot/MI-CLAIM) confirms authors and DOI; its checklist is a "
                    "Word file that could not be read."
                ),
                "section_level_only": ("all identifiers: MI-CLAIM has no official item numbers",),
                "caveats": (
                    "The part names rest on one reproduction of Table 1; the Nature Medicine table itself "
                    "could not be retrieved."
                ),
            }
        ),
        "DOME": MappingProxyType(
            {
                "reference": "Walsh et al., Nature Methods 2021;18:1122-1127, doi:10.1038/s41592-021-01205-4",
                "identifiers": "the 21 fields of the four pillars, numbered 1.1-4.5 as in the DOME registry and training course",
                "verified": (
                    "Pillars and field names were read on the retrieved page dome-ml.org/guidelines and in "
                    "the DOME training course chapter 'The DOME Recommendations' (21 fields: 1.1 Provenance, "
                    "1.2 Data splits, 1.3 Redundancy between data splits, ... 2.1 Algorithm, 2.4 "
                    "Parameters, 2.8 Availability of configuration, 3.1 Interpretability, 3.2 Output, 4.1 "
                    "Evaluation method, 4.2 Performance measures, 4.3 Comparison, 4.4 Confidence), which "
                    "also gives the citation; the field names agree with the DOME registry's column map."
                ),
                "section_level_only": (),
                "caveats": (
                    "The dotted numbers come from the DOME registry and training material; the Nature "
                    "Methods paper names the fields by pillar. The identifiers therefore carry the name."
                ),
            }
        ),
    }
)
"""For each guideline: the reference, what the identifiers are, which were
verified against which retrieved text, and which are section-level only."""


# --------------------------------------------------------------------------- item specs


@dataclass(frozen=True)
class ChecklistItemSpec:
    """One of the seven checklist items.

    Attributes
    ----------
    number : int
        Position in the checklist, 1 to 7.
    item_id : str
        Key of the item in the evidence mapping.
    title : str
    what_to_report : str
        The recommendation, in one sentence.
    required : tuple of str
        Fields the run must record for the item to be complete.
    paper_effect : str
        The effect the paper measured, quoted and labelled as the paper's.
    paper_value : float or None
        The paper's headline number for the item (None where the paper gives
        no single number).
    paper_unit : str
        Unit of ``paper_value``.
    crosswalk : mapping of str to tuple of str
        Guideline name to the identifiers of its nearest items.
    """

    number: int
    item_id: str
    title: str
    what_to_report: str
    required: tuple[str, ...]
    paper_effect: str
    crosswalk: Mapping[str, tuple[str, ...]]
    paper_value: float | None = None
    paper_unit: str = ""


def _crosswalk(claim, tripod, miclaim, dome) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType(dict(zip(GUIDELINES, (tuple(claim), tuple(tripod), tuple(miclaim), tuple(dome)))))


_MC_DESIGN = "Part 1: Study design"
_MC_DATA = "Parts 2-3: Data and optimization"
_MC_PERF = "Part 4: Model performance"
_MC_EXAM = "Part 5: Model examination"

ITEMS: tuple[ChecklistItemSpec, ...] = (
    ChecklistItemSpec(
        number=1,
        item_id="split",
        title="Split provenance and shift audit",
        what_to_report=(
            "Say where each split comes from, at which level the splits are disjoint (patients), whether the "
            "same image or possibly the same patient is on both sides (exact and near duplicates, shared "
            "person numbers), and how well a partition classifier tells the test split from the training pool."
        ),
        required=("provenance", "patients_disjoint", "partition_auc", "effect"),
        paper_effect=(
            "Paper: a partition classifier tells the official test split from the training pool at "
            f"AUC {_P('partition_auc'):.3f} ({_P('partition_auc_normal'):.3f} for normal images)."
        ),
        paper_value=_P("partition_auc"),
        paper_unit="AUC",
        crosswalk=_crosswalk(
            ("7", "19", "20", "36"),
            ("5a", "12a", "16", "20c"),
            (_MC_DESIGN, _MC_DATA),
            ("1.1 Provenance", "1.2 Data splits", "1.3 Redundancy between data splits"),
        ),
    ),
    ChecklistItemSpec(
        number=2,
        item_id="training_policy",
        title="Training policy",
        what_to_report=(
            "Report whether the encoder was frozen or fine-tuned, compare both, and say which one the "
            "headline number uses."
        ),
        required=("policies_compared", "reported_policy", "effect"),
        paper_effect=(
            f"Paper: frozen vs fine-tuned moves AUROC by {_P('policy_effect'):.3f}, while backbones differ by only "
            f"{_P('backbone_spread'):.3f}."
        ),
        paper_value=_P("policy_effect"),
        paper_unit="AUROC",
        crosswalk=_crosswalk(
            ("22", "24", "25", "26"),
            ("12c", "12e"),
            (_MC_DATA, _MC_PERF),
            ("2.1 Algorithm", "2.4 Parameters", "2.8 Availability of configuration", "4.3 Comparison"),
        ),
    ),
    ChecklistItemSpec(
        number=3,
        item_id="threshold",
        title="Threshold rule and where it was fitted",
        what_to_report=(
            "State the rule that turns scores into decisions and the split it was fitted on, which must "
            "not be the test split."
        ),
        required=("rule", "fitted_on", "effect"),
        paper_effect=f"Paper: the choice of threshold moves balanced accuracy by {_P('threshold_effect'):.3f}.",
        paper_value=_P("threshold_effect"),
        paper_unit="balanced accuracy",
        crosswalk=_crosswalk(
            ("22", "28"),
            ("15",),
            (_MC_PERF,),
            ("3.2 Output", "4.1 Evaluation method"),
        ),
    ),
    ChecklistItemSpec(
        number=4,
        item_id="metrics",
        title="Metrics beyond AUROC",
        what_to_report=(
            "Report threshold-dependent metrics, balanced accuracy included, beside the threshold-free AUROC."
        ),
        required=("reported", "effect"),
        paper_effect=(
            f"Paper: AUROC is threshold-free and does not show the {_P('threshold_effect'):.3f} swing in balanced accuracy "
            "that the threshold causes."
        ),
        paper_value=None,  # the threshold's effect is not a level of any metric
        paper_unit="",
        crosswalk=_crosswalk(
            ("28", "37", "38"),
            ("12e", "23a"),
            (_MC_PERF,),
            ("4.2 Performance measures",),
        ),
    ),
    ChecklistItemSpec(
        number=5,
        item_id="calibration",
        title="Calibration and where it was fitted",
        what_to_report=(
            "Report the calibration method, the split it was fitted on (not the test split), and the "
            "calibration error before and after on the test split."
        ),
        required=("method", "fitted_on", "ece_before", "ece_after", "effect"),
        paper_effect=(
            "Paper: calibration fitted on the validation split transfers imperfectly to the official "
            "test split (the paper gives no single headline number for it)."
        ),
        paper_value=None,
        paper_unit="",
        crosswalk=_crosswalk(
            ("28", "37"),
            ("12e", "12f", "24"),
            (_MC_PERF,),
            ("4.2 Performance measures",),
        ),
    ),
    ChecklistItemSpec(
        number=6,
        item_id="uncertainty",
        title="Uncertainty",
        what_to_report=(
            "Give confidence intervals (method, level, resamples), results over several seeds, and the "
            "spread over several splits."
        ),
        required=("confidence", "n_resamples", "resampling", "seeds", "split_level", "effect"),
        paper_effect=(
            f"Paper: backbones differ by only {_P('backbone_spread'):.3f} AUROC, a difference that cannot be read without "
            "intervals, seeds and split-level spread."
        ),
        paper_value=None,  # the paper's backbone spread is another quantity than this run's split-level range
        paper_unit="AUROC",
        crosswalk=_crosswalk(
            ("29", "30", "37", "38"),
            ("23a", "26"),
            (_MC_PERF,),
            ("4.1 Evaluation method", "4.4 Confidence"),
        ),
    ),
    ChecklistItemSpec(
        number=7,
        item_id="shortcut",
        title="Shortcut checks",
        what_to_report=(
            "Report how well a classifier on file properties alone predicts the label, in the training "
            "pool and on the test split, and which properties it used."
        ),
        required=("pool_balanced_accuracy", "test_balanced_accuracy", "features", "effect"),
        paper_effect=(
            f"Paper: a classifier on file properties alone reaches {_P('shortcut_pool'):.3f} balanced accuracy in the "
            f"training pool and {_P('shortcut_test'):.3f} on the test split."
        ),
        paper_value=_P("shortcut_pool"),
        paper_unit="balanced accuracy",
        crosswalk=_crosswalk(
            ("13", "30", "39"),
            ("7", "16", "26"),
            (_MC_EXAM,),
            ("1.2 Data splits", "3.1 Interpretability"),
        ),
    ),
)
"""The seven items, in order."""

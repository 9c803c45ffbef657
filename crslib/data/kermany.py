"""Kermany chest X-ray file names: the one home of their naming rule.

Kermany's pediatric chest X-ray archive (``chest_xray/{train,val,test}/
{NORMAL,PNEUMONIA}``) names pneumonia images ``personN_{bacteria|virus}_M.jpeg``
and normal ones ``IM-XXXX-YYYY.jpeg`` or ``NORMAL2-IM-XXXX-YYYY.jpeg``.
:func:`kermany_patient_id` parses a patient id out of such a name (the folder
loader uses it); :class:`_KermanyNamer` hands out names by the same rule and
takes each patient id from that parser (the phantom's Kermany-like variant
names its files with it), so names and ids cannot drift apart.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["kermany_patient_id"]

_KERMANY_PERSON = re.compile(r"^(person\d+)_", re.IGNORECASE)
_KERMANY_IM = re.compile(r"^(?:NORMAL\d*-)?(IM-\d+)-\d+", re.IGNORECASE)


def _kermany_id(filename: str) -> str | None:
    stem = Path(filename).name
    stem = stem.rsplit(".", 1)[0] if "." in stem else stem
    match = _KERMANY_PERSON.match(stem)
    if match:
        return match.group(1).lower()
    match = _KERMANY_IM.match(stem)
    if match:
        return match.group(1).upper()
    return None


def _kermany_scope(split: str) -> str:
    split = str(split).strip().lower()
    return "train" if split == "val" else split


def kermany_patient_id(filename: str, split: str) -> str:
    """Patient id of a Kermany chest X-ray file name, scoped by split.

    The format is ``"{scope}/{id}"``: ``id`` is ``personN`` for
    ``personN_{bacteria|virus}_M.jpeg`` and ``IM-XXXX`` for
    ``IM-XXXX-YYYY.jpeg`` and ``NORMAL2-IM-XXXX-YYYY.jpeg``; ``scope`` is the
    split, because person numbers in the official test split are different
    children from those in the training pool. The tiny official ``val``
    split was carved out of the training pool, so it shares the ``train``
    scope (a child in both train and val keeps one id; patient-level
    re-splitting of the pool cannot leak). Unrecognised names give the file
    stem, scoped likewise.

    Parameters
    ----------
    filename : str
        File name (a path is fine; only its name is used).
    split : str
        ``train``, ``val``, ``test`` (case-insensitive) or any other split name.

    Returns
    -------
    str

    Examples
    --------
    >>> kermany_patient_id("person123_bacteria_4.jpeg", "test")
    'test/person123'
    >>> kermany_patient_id("NORMAL2-IM-1427-0001.jpeg", "train")
    'train/IM-1427'
    """
    scope = _kermany_scope(split)
    found = _kermany_id(filename)
    if found is None:
        name = Path(filename).name
        found = name.rsplit(".", 1)[0] if "." in name else name
        logger.debug("file name %r is not a Kermany name; patient id from the file stem", filename)
    return f"{scope}/{found}"


class _KermanyNamer:
    """Hands out Kermany-style file names, numbered as Kermany's archive numbers them.

    The inverse of :func:`kermany_patient_id`: a pneumonia child is
    ``person{N}`` with images ``person{N}_{subtype}_{M}`` (``M`` counts every
    pneumonia image of the scope), a normal child ``IM-{N:04d}`` with images
    ``IM-{N:04d}-{K:04d}`` or ``NORMAL2-IM-{N:04d}-{K:04d}`` (``K`` = 1, 2, ...
    per child). Numbers run per scope (:func:`_kermany_scope`): val children are
    numbered with train children, test children on their own. The patient id
    is what :func:`kermany_patient_id` parses out of the first name, so names
    and ids cannot disagree.

    Examples
    --------
    >>> namer = _KermanyNamer()
    >>> namer.patient("train", 2, pneumonia=True, subtype="virus")
    ('train/person1', ['person1_virus_1', 'person1_virus_2'])
    >>> namer.patient("val", 1, pneumonia=True, subtype="bacteria")
    ('train/person2', ['person2_bacteria_3'])
    >>> namer.patient("test", 2, pneumonia=False, normal2=True)
    ('test/IM-0001', ['NORMAL2-IM-0001-0001', 'NORMAL2-IM-0001-0002'])
    """

    def __init__(self) -> None:
        self._counters: dict[tuple[str, str], int] = {}

    def _next(self, scope: str, kind: str) -> int:
        number = self._counters[(scope, kind)] = self._counters.get((scope, kind), 0) + 1
        return number

    def patient(self, split: str, n_images: int, *, pneumonia: bool, subtype: str = "",
                normal2: bool = False) -> tuple[str, list[str]]:
        """``(patient id, file stems of its n_images >= 1 images)`` of the next child of ``split``."""
        scope = _kermany_scope(split)
        if pneumonia:
            person = self._next(scope, "person")
            stems = [f"person{person}_{subtype}_{self._next(scope, 'image')}" for _ in range(n_images)]
        else:
            number = self._next(scope, "IM")
            prefix = "NORMAL2-IM" if normal2 else "IM"
            stems = [f"{prefix}-{number:04d}-{k + 1:04d}" for k in range(n_images)]
        return kermany_patient_id(stems[0], split), stems

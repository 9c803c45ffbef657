"""HTML reports: the self-contained pages ``crs audit``, ``crs risk`` and ``crs compare`` write.

One home for every report: one stylesheet (:data:`CSS`), one page wrapper
(:func:`_page`), and one renderer per result object:

- :func:`render_audit_html` for :class:`crslib.audit.AuditResult` (split
  facts, partition and shortcut tables, a plain-language reading of each
  number next to the paper's numbers, duplicates and possible same patients
  across the split with thumbnails of the duplicate clusters);
- :func:`render_risk_html` for :class:`crslib.risk_results.RiskResult` objects, one
  section per task;
- :func:`render_report_html` for :class:`crslib.compare.CompareResult`
  (figures embedded as PNG data URIs).
- :func:`render_diff_html` for :class:`crslib.diff.RunDiff` (``crs diff``: what
  changed between two runs).

Pages have inline CSS and no scripts or external assets. Every string a user
provides (file names, column values, model specs, task names) is
HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from crslib import paper
from crslib.audit import NO_FINGERPRINTS, PAPER_NUMBERS, AuditResult, PartitionAuditResult
from crslib.errors import InputError
from crslib.risk_results import RiskResult
from crslib.shortcut import ALPHA, MIN_PERMUTATIONS, ShortcutAuditResult, permutation_note

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from crslib.compare import CompareResult
    from crslib.diff import RunDiff, TableDiff
    from crslib.leakage import LeakageResult

__all__ = ["CSS", "render_audit_html", "render_risk_html", "render_report_html", "render_diff_html"]

#: The one stylesheet of every report.
CSS = """body{font-family:system-ui,sans-serif;max-width:62em;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
table{border-collapse:collapse;margin:.8em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.dataframe{font-size:90%}table.dataframe td{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1em 0}img{max-width:100%}
.reading{background:#f7f9fc;border-left:4px solid #4a78b5;padding:.6em 1em;margin:.8em 0}
.paper{color:#555}.note{background:#fff6e0;border-left:4px solid #d9a400;padding:.5em 1em}"""


def _page(title: str, body: str) -> str:
    """A complete HTML document: ``title`` (escaped here) and ``body`` (HTML, escaped by the caller)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/>
<title>{html.escape(title)}</title>
<style>{CSS}</style>
</head><body>
{body}
</body></html>
"""


# --------------------------------------------------------------------------- audit


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, (float, np.floating)):
        return "n/a" if not math.isfinite(float(value)) else f"{float(value):.{digits}f}"
    if value is None or value is pd.NA or value is pd.NaT:
        return "n/a"
    return str(value)


def _html_table(frame: pd.DataFrame, digits: int = 3) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for _, row in frame.iterrows():
        cells = []
        for value in row:
            numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            cls = ' class="num"' if numeric else ""
            cells.append(f"<td{cls}>{html.escape(_fmt(value, digits))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _pct(confidence: float) -> str:
    """A coverage as a percentage: 0.95 -> '95%', 0.975 -> '97.5%'."""
    return f"{100 * float(confidence):g}%"


def _ci(value: float, low: float, high: float, confidence: float) -> str:
    return f"{_fmt(value)} ({_pct(confidence)} CI {_fmt(low)} to {_fmt(high)})"


def _finite(row: Any, key: str) -> float:
    """A row's number, NaN where the column is absent or empty."""
    value = row.get(key, float("nan"))
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _evidence(row: Any, chance: float) -> bool | None:
    """Is the number above chance? The permutation test's verdict when it ran
    (None when it had too few permutations to decide), else the (too narrow)
    interval's: above chance only when its lower bound is."""
    verdict = row.get("evidence")
    if verdict in ("yes", "no"):
        return verdict == "yes"
    if verdict == "too few permutations":
        return None
    low = _finite(row, "low")
    return None if not math.isfinite(low) else low > chance


def _evidence_text(row: Any, chance: float, n_permutations: int, confidence: float) -> str:
    """The permutation test (p-value and null distribution) or, without one, the interval, in words."""
    p_value, verdict = _finite(row, "p_value"), row.get("evidence")
    null = ""
    if math.isfinite(_finite(row, "null_mean")):
        null = (f"shuffled: mean {_finite(row, 'null_mean'):.3f}, {_pct(confidence)} range "
                f"{_finite(row, 'null_low'):.3f} to {_finite(row, 'null_high'):.3f}")
    if verdict in ("yes", "no") and math.isfinite(p_value):
        words = "above chance" if verdict == "yes" else "no higher than shuffled data give"
        return (f"a permutation test ({n_permutations} shuffles of whole patients) finds it {words} "
                f"(p = {p_value:.3f}{'; ' + null if null else ''}). ")
    if verdict == "too few permutations":
        return (f"a permutation test gives p = {p_value:.3f}{' (' + null + ')' if null else ''}, but "
                f"{html.escape(permutation_note(n_permutations) or 'too few permutations were valid')} "
                "(no verdict). ")
    low, high = _finite(row, "low"), _finite(row, "high")
    if not math.isfinite(low):
        return ""
    if low > chance:
        return (f"the interval lies above {chance:.3g}, but it leaves out the variability of refitting the "
                "classifier and is too narrow, so a lower bound close to it is weak evidence (run with "
                "n_permutations for a test). ")
    if high < chance:
        return (f"the interval lies below {chance:.3g}; cross-validated scores of data without signal scatter "
                "around, and often below, chance, so this is not evidence of anything (run with n_permutations "
                "for a test). ")
    return f"the interval includes {chance:.3g}. "


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _read_partition(result: PartitionAuditResult, what: str, test: str) -> str:
    row = result.table.iloc[0]
    auc, low, high = float(row["auc"]), float(row["low"]), float(row["high"])
    text = (f"A classifier given only {what} tells an image of the official {html.escape(test)} split from an "
            f"image of the training pool with an AUC of {_ci(auc, low, high, result.confidence)}, estimated out "
            "of fold with patient-grouped cross-validation. An AUC of 0.5 means the two cannot be told apart; "
            "1.0 means every test image can be picked out. ")
    text += _sentence(_evidence_text(row, 0.5, result.n_permutations, result.confidence))
    differs = _evidence(row, 0.5)
    null_mean = _finite(row, "null_mean")
    # cross-validated AUCs of exchangeable splits are biased below 0.5: an interval below it is no finding
    below_null = math.isfinite(auc) and auc <= (null_mean if math.isfinite(null_mean) else 0.5)
    if differs:
        text += ("So this is evidence that the test split differs from the pool in these respects: a test score "
                 "measures transfer to a shifted batch as well as performance on the training distribution. ")
    elif below_null:
        text += ("An AUC at or below the null is not evidence of a difference: cross-validated AUCs of splits "
                 "that do not differ scatter around, and often below, 0.5 (nor is it proof that there is none). ")
    elif differs is not None:
        text += ("So this is not evidence of a difference between the test split and the pool in these respects "
                 "(nor proof that there is none). ")
    per_class = result.table.iloc[1:]
    if len(per_class):
        parts = [f"{html.escape(str(r['scope']).removeprefix('class='))}: {_fmt(r['auc'])}"
                 for _, r in per_class.iterrows()]
        text += f"Within each class the AUC is {'; '.join(parts)}. "
    text += (f'<span class="paper">For comparison, the paper reports a partition AUC of '
             f"{PAPER_NUMBERS['partition_auc']:.3f} on the Kermany pediatric chest X-rays overall and "
             f"{PAPER_NUMBERS['partition_auc_normal']:.3f} among normal images (the paper's numbers, not this "
             "data's).</span>")
    return text


def _read_shortcut(result: ShortcutAuditResult, test: str) -> str:
    pool = result.table.set_index("scope").loc["pool"]
    tst = result.table.set_index("scope").loc["test"]
    chance, confidence = float(pool["chance"]), result.confidence
    text = (f"A classifier that sees only file properties (size, dimensions, container, bit depth, JPEG "
            f"settings, metadata), never what the image shows, predicts the label with a balanced accuracy of "
            f"{_ci(pool['balanced_accuracy'], pool['low'], pool['high'], confidence)} in the training pool "
            f"(patient-grouped cross-validation) and "
            f"{_ci(tst['balanced_accuracy'], tst['low'], tst['high'], confidence)} on the official "
            f"{html.escape(test)} split (a model fitted on the whole pool). Chance is {chance:.3f}. ")
    text += "In the pool, " + _evidence_text(pool, chance, result.n_permutations, confidence)
    text += "On the test split, " + _evidence_text(tst, chance, result.n_permutations, confidence)
    pool_above, test_above = _evidence(pool, chance), _evidence(tst, chance)
    if pool_above and test_above is False:
        text += ("File encoding carries the label in the pool but not in the test split: a model can learn "
                 "this shortcut during training and the test split will not reveal it, nor reward it. ")
    elif pool_above and test_above:
        text += ("File encoding carries label information in the pool and, to a degree, on the test split "
                 "too; a model may use it, and the test score would partly credit that. ")
    elif pool_above:
        text += ("File encoding carries label information in the pool; whether it does on the test split these "
                 "permutations cannot decide. ")
    elif pool_above is False:
        text += "These data give no evidence that file properties carry the label in the pool. "
    imp = result.importances
    if len(imp):
        top = imp[imp["importance_mean"] > 0.005].head(3)
        if len(top):
            text += ("The properties the pool classifier relies on most (drop of out-of-fold balanced accuracy "
                     "when permuted): " + ", ".join(f"{html.escape(str(r.feature))} ({r.importance_mean:.3f})"
                                                  for r in top.itertuples()) + ". ")
        else:
            text += ("Permuting any single property barely changes the pool's balanced accuracy: the "
                     "information is spread over several properties that carry it redundantly. ")
        alone = imp.dropna(subset=["alone"]).sort_values("alone", ascending=False, kind="stable")
        strong = alone[alone["alone"] >= chance + 0.5 * (1.0 - chance)]
        if len(strong):
            shown = ", ".join(f"{html.escape(str(r.feature))} ({r.alone:.3f})" for r in strong.head(6).itertuples())
            more = f" and {len(strong) - 6} more" if len(strong) > 6 else ""
            text += f"Properties that predict the label in the pool by themselves (balanced accuracy alone): {shown}{more}. "
    text += (f'<span class="paper">For comparison, the paper reports {PAPER_NUMBERS["shortcut_pool"]:.3f} in the '
             f"pool and {PAPER_NUMBERS['shortcut_test']:.3f} on the test split of the Kermany pediatric chest "
             "X-rays (the paper's numbers, not this data's).</span>")
    return text


#: Clusters across the split, and images per cluster, that the audit report shows.
MAX_CLUSTERS_SHOWN = 12
MAX_CLUSTER_IMAGES_SHOWN = 8
_KIND_WORDS = {"exact": "exact", "near": "near (pHash)", "embedding": "embedding"}


def _cluster_row(cluster: Mapping[str, Any], cache: dict[str, str | None]) -> str:
    members = list(zip(cluster["image_ids"], cluster["paths"], cluster["splits"]))
    shown = members[:MAX_CLUSTER_IMAGES_SHOWN]
    more = f" (+{len(members) - len(shown)} more)" if len(members) > len(shown) else ""
    thumbs = "".join(_thumbnail_tag({"image_id": i, "path": p}, cache) for i, p, _ in shown)
    names = "<br/>".join(f"{html.escape(str(s))}: {html.escape(str(p if p is not None else i))}" for i, p, s in shown)
    kinds = ", ".join(_KIND_WORDS[k] for k in cluster["kinds"])
    return (f'<tr class="cluster"><td>{html.escape(kinds)}</td><td class="num">{len(members)}</td>'
            f'<td style="white-space:nowrap">{thumbs}{html.escape(more)}</td>'
            f'<td><small style="word-break:break-all">{names}</small></td></tr>')


def _patients_text(leakage: LeakageResult) -> str:
    table = leakage.patients.table
    across = table[table["scope"] == "across"]
    if not len(across):
        return "<p>No person number occurs in both the training pool and the test split.</p>"
    n_test = int(leakage.patients.leaked_test_rows(leakage.splits).size)
    shown = across.head(10)[["raw_id", "splits", "n_pool_images", "n_test_images"]]
    more = f"<p>and {len(across) - len(shown)} more (audit.json lists them all).</p>" if len(across) > 10 else ""
    return (f"<p><b>{len(across)} person number(s) occur in both the training pool and the test split</b> "
            f"({n_test} test images). They are <i>possibly</i> the same patients: whether an archive numbers the "
            "persons of its test split anew is not known from the files (Kermany's loader assumes it does), so a "
            "shared number is possible, not certain, leakage; check the archive's documentation.</p>"
            + _html_table(shown) + more)


def _leakage_section(leakage: LeakageResult | None) -> str:
    """Duplicates and possible same patients across the split: counts per kind and scope, the clusters across the
    pool and the test split with thumbnails, the shared person numbers."""
    head = "<h2>Duplicates and shared patients across the split</h2>"
    if leakage is None:
        return head + ('<p class="note">Duplicates and shared patients: not measured; '
                       f"{html.escape(NO_FINGERPRINTS)}.</p>")
    counts = leakage.counts_table()
    for column in ("across", "within", "between_pool", "other", "test_images"):
        counts[column] = [("n/a" if pd.isna(v) else int(v)) for v in counts[column]]
    counts = counts.rename(columns={"counted": "counted as leakage", "between_pool": "between pool splits",
                                    "test_images": "test images in them"})
    reading = ("Every image was compared with every other: exact duplicates (the same decoded pixels), near "
               "duplicates (a crop-tolerant perceptual hash), embedding near duplicates (cosine similarity above a "
               "threshold calibrated on this data) and person numbers of the file names found in more than one split. "
               "A test image with a copy in the training pool makes the test score partly a measure of memory. "
               f"In this data: {html.escape(leakage.summary())}. ")
    if leakage.near is not None and not leakage.near_informative:
        reading += ("The near-duplicate (pHash) counts are not informative on this data: the hash matches most images "
                    "with others of their own split, so its counts are an upper bound and are not counted as leakage. ")
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in leakage.notes)
    clusters = leakage.across_clusters()
    if clusters:
        cache: dict[str, str | None] = {}
        rows = "".join(_cluster_row(c, cache) for c in clusters[:MAX_CLUSTERS_SHOWN])
        rest = len(clusters) - MAX_CLUSTERS_SHOWN
        more = f"<p>and {rest} more clusters across the split (audit.json lists them all).</p>" if rest > 0 else ""
        shown = ("<h3>Duplicate clusters across the training pool and the test split</h3><table><thead><tr><th>kind"
                 "</th><th>images</th><th>thumbnails</th><th>split: file</th></tr></thead>"
                 f"<tbody>{rows}</tbody></table>{more}")
    else:
        shown = ("<p>No exact or embedding duplicate crosses from the training pool to the test split"
                 + (" (nor a near duplicate)." if leakage.near_informative else ".") + "</p>")
    return (head + f'<p class="reading">{reading}</p>{notes}<h3>Counts per kind and scope</h3>'
            + "<p>Clusters of duplicates (person numbers for the patients) per scope: across the pool and the test "
              "split, within one split, between two pool splits (train and val), other.</p>"
            + _html_table(counts) + shown + "<h3>Possible same patients</h3>" + _patients_text(leakage))


def render_audit_html(result: AuditResult) -> str:
    """A self-contained HTML report of an audit (inline CSS, no external assets).

    Parameters
    ----------
    result : AuditResult
        From :func:`run_audit`.

    Returns
    -------
    str
        A complete HTML document: split facts, the partition and shortcut
        tables, the most important file properties, a plain-language
        reading of each number next to the paper's numbers (quoted as the
        paper's), and the duplicates and possible same patients across the
        split (counts per kind and scope, up to :data:`MAX_CLUSTERS_SHOWN`
        clusters with thumbnails; or why they were not measured).

    Examples
    --------
    >>> html_text = render_audit_html(result)  # doctest: +SKIP
    """
    if not isinstance(result, AuditResult):
        raise InputError(f"render_audit_html needs an AuditResult from run_audit, got {type(result).__name__}")
    prov = result.provenance
    split_rows = []
    for entry in prov["splits"]:
        classes = ", ".join(f"{k}: {v}" for k, v in entry.get("classes", {}).items())
        split_rows.append({"split": entry["split"], "images": entry["images"], "patients": entry["patients"],
                           f"images per {result.label_column}": classes})
    split_table = _html_table(pd.DataFrame(split_rows))
    n_shared = prov["n_patients_in_several_splits"]
    if n_shared:
        shown = ", ".join(f"{p['patient_id']} ({'/'.join(p['splits'])})" for p in prov["patients_in_several_splits"][:10])
        leak = (f"<p><b>{n_shared} patient(s) have images in more than one split</b> (e.g. {html.escape(shown)}). "
                "Images of one patient in both the training pool and the test split let a model recognise the "
                "patient rather than the finding.</p>")
    else:
        leak = "<p>No patient has images in more than one split.</p>"
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in result.notes)
    parts = [p for p in (result.partition_properties, result.partition_embeddings, result.shortcut) if p is not None]
    levels = sorted({float(p.confidence) for p in parts})
    coverage = (f"Every interval is a {_pct(levels[0])}" if len(levels) == 1 else
                f"Intervals (at {', '.join(map(_pct, levels))}, as each says) are a")
    sections = [
        f"<h2>Splits</h2>{split_table}{leak}",
        "<h2>Partition classifier on file properties</h2>"
        f'<p class="reading">{_read_partition(result.partition_properties, "file properties", result.test)}</p>'
        + _html_table(result.partition_properties.table),
    ]
    if result.partition_embeddings is not None:
        name = result.embedding_name or "an encoder"
        sections.append(
            f"<h2>Partition classifier on embeddings ({html.escape(name)})</h2>"
            f'<p class="reading">{_read_partition(result.partition_embeddings, f"the embeddings of {html.escape(name)}", result.test)}</p>'
            + _html_table(result.partition_embeddings.table)
        )
    sections.append(
        "<h2>Shortcut classifier: file properties to label</h2>"
        f'<p class="reading">{_read_shortcut(result.shortcut, result.test)}</p>'
        + _html_table(result.shortcut.table)
        + "<h3>Most important file properties (pool, out of fold)</h3>"
        + _html_table(result.shortcut.importances.head(15))
    )
    sections.append(_leakage_section(result.leakage))
    return _page("crs audit: split and file-property audit", f"""<h1>Split and file-property audit</h1>
<p>{result.n_images:,} images; label column <code>{html.escape(result.label_column)}</code>; training pool
{html.escape(' + '.join(result.pool))}, official test split {html.escape(result.test)}. {coverage}
percentile bootstrap over patients; every classifier is evaluated on patients it was not fitted on. A permutation
test decides at p &lt; {ALPHA} and needs at least {MIN_PERMUTATIONS} permutations to be able to.</p>
{notes}
{''.join(sections)}""")


# --------------------------------------------------------------------------- representation risk


def render_risk_html(outcomes: Mapping[str, RiskResult]) -> str:
    """A self-contained HTML summary of :func:`representation_risk` results.

    Parameters
    ----------
    outcomes : mapping of task name -> RiskResult

    Returns
    -------
    str
        One HTML page (inline CSS, tables only, no external assets).

    Examples
    --------
    >>> from crslib.risk import representation_risk
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat(np.tile([0, 1], 30), 2)
    >>> emb = {"a": rng.normal(size=(120, 4)) + y[:, None], "b": rng.normal(size=(120, 4))}
    >>> res = representation_risk(emb, y, groups=np.repeat(np.arange(60), 2), heads=("linear",), n_partitions=2,
    ...                           n_resamples=50)
    >>> render_risk_html({"y": res}).startswith("<!DOCTYPE html>")
    True
    """
    if not isinstance(outcomes, Mapping) or not outcomes:
        raise InputError("render_risk_html needs a non-empty mapping of task name -> RiskResult")
    sections = []
    for task, result in outcomes.items():
        if not isinstance(result, RiskResult):
            raise InputError(f"outcome of task {task!r} is a {type(result).__name__}, not a RiskResult")
        sections.append(_risk_section(str(task), result))
    return _page("crs risk", (
        "<h1>Representation risk</h1><p>Encoders benchmarked under common dimension control (PCA "
        "fitted on training rows), several heads, prediction-level combinations (average, greedy average, "
        "linear stack) and a feature union; selection on a locked validation partition by a proper score, "
        "preferring the simpler candidate within the bootstrap noise; a combination only with paired "
        "validation evidence (crslib's own rule); the choice refitted on train + validation before the test; "
        "paired and split-level uncertainty (patient-grouped).</p>"
        + "".join(sections)
    ))


def _interval(value: float, low: float, high: float) -> str:
    return f"{value:.4f} [{low:.4f}, {high:.4f}]"


def _risk_section(task: str, result: RiskResult) -> str:
    """One task's part of :func:`render_risk_html`: selection, refit, metric panel, what was dropped, stability."""
    primary = result.primary
    scores = result.selected_test_scores
    sel = primary.selection
    selection = pd.DataFrame({
        "candidate": sel["candidate"], "kind": sel["kind"], "members": sel["members"],
        f"validation {primary.loss}": [_interval(*r) for r in sel[["val_loss", "val_loss_low", "val_loss_high"]]
                                       .to_numpy()],
        "gap to best single": [_interval(*r) for r in sel[["gap", "gap_low", "gap_high"]].to_numpy()],
        "gain over best single": ["" if np.isnan(lo) else f"[{lo:.4f}, {hi:.4f}]"
                                  for lo, hi in sel[["gain_low", "gain_high"]].to_numpy()],
        "chosen": sel["chosen"], "why": sel["why"],
    })
    columns = ["candidate", "kind", "val_score", "val_low", "val_high", "test_score", "test_low", "test_high",
               "test_secondary", "test_loss", "selected"]
    candidates = primary.candidates.sort_values("val_loss")[columns]
    panel = primary.metrics.assign(value=[_interval(*r) for r in primary.metrics[["value", "low", "high"]]
                                          .to_numpy()]).pivot(index="metric", columns="fit", values="value")
    panel = panel.reindex(primary.metrics["metric"].drop_duplicates())
    dropped = result.dropped
    n_dropped = dropped.loc[dropped["part"] != "fit", "n_dropped"]
    not_fitted = dropped[dropped["part"] == "fit"]
    drop_text = (f"Over {len(result.partitions)} partitions, {int(n_dropped.sum()):,} of "
                 f"{int(dropped.loc[dropped['part'] != 'fit', 'n_resamples'].sum()):,} bootstrap resamples lacked a "
                 f"class and were left out of the {html.escape(result.metric)} intervals; "
                 f"{len(not_fitted)} candidate fit(s) could not be made"
                 + (": " + "; ".join(sorted({html.escape(f"{r.candidate}: {r.reason}")
                                             for r in not_fitted.itertuples()})) if len(not_fitted) else "") + ".")
    refit = primary.refit.set_index("fit")
    return (
        f"<h2>{html.escape(task)} ({html.escape(result.task)}, {html.escape(result.metric)})</h2>"
        f"<p>Selected on validation (first partition) by {html.escape(primary.loss)}: "
        f"<b>{html.escape(primary.selected)}</b>. Test {html.escape(result.metric)} as fitted on the training rows "
        f"{_interval(*refit.loc['train', ['test_score', 'test_low', 'test_high']])}; refitted on train + "
        f"validation {_interval(*refit.loc['train+validation', ['test_score', 'test_low', 'test_high']])}. "
        f"Over {len(result.partitions)} partitions the selected candidate's test score (train fit) ranged "
        f"{scores.min():.3f}-{scores.max():.3f} (mean {scores.mean():.3f}).</p>"
        f"<p>{drop_text}</p>"
        "<h3>Selection on validation (first partition)</h3>" + _html_table(selection, digits=4)
        + "<h3>Test: the selected candidate, fitted on train and refitted on train + validation</h3>"
        + _html_table(primary.refit, digits=4)
        + "<h3>Metric panel of the selected candidate on test</h3>" + _html_table(panel.reset_index(), digits=4)
        + "<h3>Candidates (first partition)</h3>" + _html_table(candidates, digits=4)
        + "<h3>Paired test comparisons with the selected candidate</h3>"
        + _html_table(primary.comparisons, digits=4)
        + "<h3>Selection over repeated partitions</h3>" + _html_table(result.selection_counts)
        + "<h3>Test score spread over partitions</h3>" + _html_table(result.spread, digits=4)
    )


# --------------------------------------------------------------------------- model replacement check


def _figure_png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


#: Largest side of a thumbnail in the compare report, in pixels.
THUMBNAIL_PX = 48


def _thumbnail(path: str | None, cache: dict[str, str | None]) -> str | None:
    """A small PNG of an image file, base64-encoded; None when there is no path or it cannot be read."""
    if path is None:
        return None
    if path not in cache:
        from PIL import Image

        from crslib.data import read_image
        from crslib.errors import ImageReadError

        try:
            pixels = np.round(255 * read_image(path)).astype(np.uint8)
        except ImageReadError:
            cache[path] = None
        else:
            image = Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)
            image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
            buffer = io.BytesIO()
            image.save(buffer, format="PNG", optimize=True)
            cache[path] = base64.b64encode(buffer.getvalue()).decode("ascii")
    return cache[path]


def _thumbnail_tag(image: Mapping[str, Any], cache: dict[str, str | None], shared: bool = False) -> str:
    label = html.escape(f"{image['image_id']} ({image['path']})", quote=True)
    outline = "outline:2px solid #2a8a2a;" if shared else ""
    data = _thumbnail(image["path"], cache)
    if data is None:
        return (f'<span title="{label}: unreadable" style="display:inline-block;width:{THUMBNAIL_PX}px;'
                f'height:{THUMBNAIL_PX}px;margin:2px;background:#eee;{outline}">?</span>')
    return f'<img src="data:image/png;base64,{data}" alt="{label}" title="{label}" style="margin:2px;{outline}"/>'


def _strip_section(result: CompareResult) -> str:
    """The queries of lowest overlap as thumbnail strips: the image, the old model's and the new model's neighbours."""
    head = ('<section id="changed-neighbours"><h2>Images whose neighbours changed most</h2>'
            f"<p>The {len(result.strips)} images with the lowest overlap; compare.json lists the "
            f"{len(result.largest_changes)} lowest with both neighbour lists. Each row shows the image, its "
            f"{result.k} nearest neighbours under the old model and under the new one, nearest first; an outlined "
            "neighbour is in both lists.</p>")
    cache: dict[str, str | None] = {}
    if not result.strips or result.strips[0]["path"] is None:
        return head + '<p class="note">no thumbnails: the manifest has no path column</p></section>'
    if not any([_thumbnail(s["path"], cache) for s in result.strips]):
        return (head + f'<p class="note">no thumbnails: none of the {len(result.strips)} query images could be '
                f"read (the first is {html.escape(str(result.strips[0]['path']))})</p></section>")
    rows = []
    for strip in result.strips:
        both = {n["image_id"] for n in strip["old"]} & {n["image_id"] for n in strip["new"]}
        old = "".join(_thumbnail_tag(n, cache, n["image_id"] in both) for n in strip["old"])
        new = "".join(_thumbnail_tag(n, cache, n["image_id"] in both) for n in strip["new"])
        shared = f"{round(strip['overlap'] * result.k)} of {result.k} neighbours shared"
        rows.append(f'<tr><td style="width:14em">{_thumbnail_tag(strip, cache)}<br/>{html.escape(str(strip["image_id"]))}'
                    f': {shared}<br/><small style="word-break:break-all">{html.escape(str(strip["path"]))}</small></td>'
                    f'<td style="white-space:nowrap"><div>old: {old}</div><div>new: {new}</div></td></tr>')
    return (head + "<table><thead><tr><th>image</th><th>its neighbours under the old model (top) and the new "
            f"model (bottom)</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>")


def _compare_rows(result: CompareResult) -> str:
    """The summary table of a comparison: models and their provenance, overlap, null, reference, gate."""

    def row(name: str, value: str) -> str:
        return f"<tr><th>{html.escape(name)}</th><td>{html.escape(value)}</td></tr>"

    def provenance(role: str) -> list[str]:
        info = result.models.get(role)
        if not info:
            return []
        sha = info.get("weights_sha256") or "none (no weight file)"
        return [row(f"{role} model provenance", f"resolved to {info.get('resolved')}; weights SHA-256 {sha}; "
                    f"encoder fingerprint {info.get('fingerprint')}")]

    rows = []
    for role, name in (("old", result.old), ("new", result.new)):
        rows += [row(f"{role} model", name), *provenance(role)]
    rows += [
        row("images", f"{result.n_images:,}"),
        row(f"mutual {result.k}-NN overlap",
            f"{result.overlap:.3f} (95% CI {result.overlap_low:.3f}-{result.overlap_high:.3f})"),
        row("chance k/(N-1)", f"{result.chance:.4f}"),
    ]
    if result.null is not None:
        null = result.null
        rows.append(row(f"permutation null ({null['n_permutations']} relabellings of the {null['permuted']} model's "
                        "neighbour lists)",
                        f"mean {null['mean']:.4f} (95% range {null['low']:.4f}-{null['high']:.4f}); p = "
                        f"{null['p_value']:.3g} for the observed {result.overlap:.3f} (smallest possible "
                        f"{1 / (null['n_permutations'] + 1):.3g})"))
    for role, info in result.search.items():
        if info.get("recall") is not None:
            target = info.get("target_recall")
            met = ("" if target is None else f"; target {target:.3f} " +
                   ("met" if info.get("target_met") else "not met within the probe budget"))
            rows.append(row(f"{role} model's neighbours", f"approximate ({info['index']}), recall@{result.k} "
                            f"{info['recall']:.3f} against exact search on {info['recall_sample']:,} queries"
                            + met))
        elif info.get("fallback"):
            rows.append(row(f"{role} model's neighbours", f"exact: {info['fallback']}"))
    if result.overlap_error_bound > 0:
        rows.append(row("overlap error bound (approximate index)", f"at most {result.overlap_error_bound:.3f}"))
    if result.reference_overlap is not None:
        rows.append(row(f"old vs {result.reference}", f"{result.reference_overlap:.3f} "
                        f"(95% CI {result.reference_low:.3f}-{result.reference_high:.3f})"))
        rows += provenance("reference")
    if result.map_r2 is not None:
        rows.append(row("linear map new -> old, held-out R^2", f"{result.map_r2:.3f}"))
    if result.passed is not None:
        rule = ("lower: pass only when the lower 95% bound of the overlap reaches the minimum"
                if result.decision == "lower" else
                "upper (lenient): pass unless the upper 95% bound of the overlap is below the minimum")
        rows.append(row("decision rule", rule))
        rows.append(row("gate", f"{'PASS' if result.passed else 'FAIL'}: {result.gate}"))
    return "".join(rows)


def render_report_html(result: CompareResult) -> str:
    """A self-contained HTML report of a model-replacement check (figures embedded as PNG data URIs).

    Parameters
    ----------
    result : CompareResult
        From :func:`crslib.compare.compare_embeddings`.

    Returns
    -------
    str
        A complete HTML document: the models as the user named them (with
        the resolved spec and weight hash when ``result.models`` has them),
        the overlap with its interval, chance, the permutation null and the
        reference, the map's R^2, the gate's rule and verdict, the subgroup
        and transfer tables and their figures, and thumbnail strips of the
        images whose neighbours changed most (read from ``path``; a note says
        why when there are none). File names and specs are escaped.

    Examples
    --------
    >>> page = render_report_html(result)  # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from crslib import plots

    figures = []
    fig, ax = plt.subplots(figsize=(6, 3.2))
    plots.overlap_histogram(np.asarray(result.per_image), k=result.k, chance=result.chance,
                            reference=result.reference_overlap, ax=ax)
    figures.append(("Per-image overlap", _figure_png(fig)))
    plt.close(fig)
    if result.subgroups:
        fig, ax = plt.subplots(figsize=(6, 0.35 * len(result.subgroups) + 1.2))
        plots.subgroup_overlap(pd.DataFrame(result.subgroups), chance=result.chance, ax=ax)
        figures.append(("Overlap by subgroup", _figure_png(fig)))
        plt.close(fig)
    if result.transfer:
        fig, ax = plt.subplots(figsize=(6, 0.35 * len(result.transfer) + 1.2))
        plots.retention_bars(pd.DataFrame(result.transfer), ax=ax)
        figures.append(("Classifier transfer retention", _figure_png(fig)))
        plt.close(fig)

    tables = ""
    if result.subgroups:
        tables += "<h2>Overlap by subgroup</h2>" + _html_table(pd.DataFrame(result.subgroups), digits=4)
    if result.transfer:
        tables += "<h2>Classifier transfer</h2>" + _html_table(pd.DataFrame(result.transfer), digits=4)
    images = "".join(
        f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{data}"/>'
        f"<figcaption>{html.escape(title)}</figcaption></figure>"
        for title, data in figures
    )
    return _page(f"crs compare: {result.old} vs {result.new}", f"""<h1>Model replacement check</h1>
<p>Do the two models return the same nearest neighbours for the same images? The mutual k-NN overlap is the share
of each image's k nearest neighbours (cosine) that both models have in common, averaged over images.
For reference, CRS-Bench reports {paper.value("public_pair_overlap"):.3f} of 10 neighbours between public models on
chest radiographs and {paper.value("random_init_overlap"):.3f} for a random network (the paper's numbers, not this
data's).
The permutation null gives the new model's neighbour lists to randomly chosen other images: what two models with these
neighbourhood structures share by accident.</p>
<table>{_compare_rows(result)}</table>
{images}
{tables}
{_strip_section(result)}""")


# --------------------------------------------------------------------------- diff

#: Rows shown per list in the diff page (changed numbers, rows only in one run); diff.json has more.
DIFF_ROWS_SHOWN = 20
_CHANGE_WORDS = {"changed": "numbers changed", "real": "real (intervals apart)",
               "within_interval": "within the intervals", "no_interval": "no interval",
               "text_changed": "text changed"}


def _diff_table_section(table: TableDiff) -> str:
    """One changed table of a :class:`crslib.diff.RunDiff`: columns, rows only in one run, changed numbers."""
    parts = [f"<h3>{html.escape(table.table)}</h3>"]
    for which, columns in (("A", table.columns_only_a), ("B", table.columns_only_b)):
        if columns:
            parts.append(f"<p>Columns only in run {which}: {html.escape(', '.join(columns))}.</p>")
    if table.columns_retyped:
        parts.append(f"<p>Columns numeric in one run and text in the other (not compared): "
                     f"{html.escape(', '.join(table.columns_retyped))}.</p>")
    for which, rows in (("A", table.rows_only_a), ("B", table.rows_only_b)):
        if len(rows):
            more = f" (first {DIFF_ROWS_SHOWN}; all in diff.json)" if len(rows) > DIFF_ROWS_SHOWN else ""
            parts.append(f"<p>{len(rows)} rows only in run {which}{more}:</p>"
                         + _html_table(rows.head(DIFF_ROWS_SHOWN)))
    if len(table.cells):
        parts.append("<p>Changed columns:</p>" + _html_table(table.by_column().rename(columns=_CHANGE_WORDS), digits=4))
        cells = table.cells.assign(kind=table.cells["kind"].map(_CHANGE_WORDS)).head(DIFF_ROWS_SHOWN)
        more = (f" (the first {DIFF_ROWS_SHOWN} of {len(table.cells)}, real changes first; diff.json lists up to "
                "500)") if len(table.cells) > DIFF_ROWS_SHOWN else ""
        parts.append(f"<p>Changed numbers{more}:</p>" + _html_table(cells, digits=4))
    if len(table.text_cells):
        shown = len(table.text_cells) > DIFF_ROWS_SHOWN
        more = f" (the first {DIFF_ROWS_SHOWN} of {len(table.text_cells)})" if shown else ""
        parts.append(f"<p>Changed text{more}:</p>" + _html_table(table.text_cells.head(DIFF_ROWS_SHOWN)))
    return "\n".join(parts)


def render_diff_html(diff: RunDiff) -> str:
    """The *What changed* page of ``crs diff``: a summary sentence, flipped verdicts, then each changed table.

    Parameters
    ----------
    diff : RunDiff
        From :func:`crslib.diff.diff_runs`.

    Returns
    -------
    str
        A complete HTML document; run paths, table names, column names and
        key values are escaped.

    Examples
    --------
    >>> import pandas as pd
    >>> from crslib.diff import RunDiff, compare_tables
    >>> table = compare_tables(pd.DataFrame({"x": [1.0]}), pd.DataFrame({"x": [2.0]}), name="<b>.csv")
    >>> page = render_diff_html(RunDiff("a", "b", (table,), pd.DataFrame()))
    >>> "&lt;b&gt;.csv" in page and "<b>.csv" not in page
    True
    """
    overview = pd.DataFrame([{"table": t.table, "status": t.status, "rows A": t.rows_a, "rows B": t.rows_b,
                              **{_CHANGE_WORDS[k]: v for k, v in t.counts().items()}} for t in diff.tables])
    if diff.flips.empty:
        flips = "<p>No claim verdict flipped.</p>"
    else:
        flips = _html_table(diff.flips.rename(columns={"verdict_a": "verdict in A", "verdict_b": "verdict in B",
                                                       "value_a": "value in A", "value_b": "value in B"}))
    changed = [t for t in diff.tables if t.status == "changed"]
    unreadable = "".join(f"<li>{html.escape(u)}</li>" for u in diff.unreadable)
    body = f"""<h1>What changed between two runs</h1>
<p class="reading">{html.escape(diff.summary())}</p>
<p>Run A: <code>{html.escape(diff.run_a)}</code><br/>Run B: <code>{html.escape(diff.run_b)}</code></p>
<p>A number counts as a <em>real</em> change only where its table carries the runs' own intervals and the two runs'
intervals do not overlap; a change <em>within the intervals</em> is what the runs' own uncertainty allows; a change
with <em>no interval</em> (counts, point estimates, coordinates) cannot be judged against noise here. Rows are matched
on the tables' text columns (the first ones that tell rows apart); numbers equal within a relative 1e-9 count as
unchanged.</p>
<h2>Claim verdicts that flipped</h2>
{flips}
<h2>Result tables</h2>
{_html_table(overview) if len(overview) else "<p>Neither run has a result table.</p>"}
{"<p>Tables that could not be read (not compared):</p><ul>" + unreadable + "</ul>" if unreadable else ""}
{"<h2>Changed tables</h2>" if changed else ""}
{"".join(_diff_table_section(t) for t in changed)}"""
    return _page(f"crs diff: {diff.run_a} vs {diff.run_b}", body)


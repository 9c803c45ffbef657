"""Small Sphinx fixes for the CRS companion book (a local extension).

- Jupyter Book's extensions register some inline scripts twice (one copy
  with filename ``None``, one with ``""``), so a page carried ``const
  THEBE_JS_URL = ...`` twice: a JavaScript SyntaxError in the reader's
  console. Identical script entries are dropped from every page.
- pydata-sphinx-theme logs "Got invalid theme mode" to the console when no
  default colour mode is configured: the default becomes "auto".

It also adds:

- the ``crs-cli`` directive: the help of ``crs`` and of each subcommand,
  generated from :func:`crslib.cli.build_parser` at build time;
- the ``crs-bench`` directive: the tables ``make bench`` recorded in
  ``bench/results.json`` (``CRS_BENCH_RESULTS`` overrides the path);
- the repository and launch buttons. The repository URL comes from
  ``repository.url`` in ``_config.yml`` or from ``CRS_REPOSITORY_URL``
  (``crs book --repository-url``); without one the buttons are left out
  rather than pointing nowhere. The study pages are built from executed
  copies in ``book/generated/``, which are not in git, so their launch
  buttons are pointed at what does exist: Binder opens the jupytext source
  ``notebooks/<name>.py`` (``postBuild`` makes JupyterLab open it as a
  notebook); Colab, which opens only ``.ipynb`` files on GitHub, opens the
  executed notebook the published site carries under ``_sources/`` on the
  branch named by ``crs_published_branch`` (default ``gh-pages``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path



def _repo_root() -> Path:
    # the repository crslib is installed from: the notebooks and bench/ live
    # there even when the book is built from a copy (the tests build one)
    from crslib.runner import REPO_ROOT

    return REPO_ROOT


def _script_key(script) -> tuple:
    attributes = getattr(script, "attributes", {}) or {}
    # an inline script is registered with filename None or "" depending on the extension
    return (getattr(script, "filename", str(script)) or "", tuple(sorted((k, str(v)) for k, v in attributes.items())))


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _default_colour_mode(app, pagename, templatename, context, doctree) -> None:
    if not context.get("default_mode"):
        context["default_mode"] = "auto"


def _cli_help_nodes() -> list:
    import argparse
    import os

    from docutils import nodes

    from crslib.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal's width; the page must not depend on it
    try:
        parser = build_parser()
        out = [nodes.literal_block(text=parser.format_help(), language="text")]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    section = nodes.section(ids=[f"crs-{name}"], names=[f"crs {name}"])
                    section += nodes.title(text=f"crs {name}")
                    section += nodes.literal_block(text=sub.format_help(), language="text")
                    out.append(section)
        return out
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def _cli_directive():
    from docutils.parsers.rst import Directive

    class CrsCli(Directive):
        """``crs --help`` and every subcommand's help, as literal blocks."""

        has_content = False

        def run(self):
            return _cli_help_nodes()

    return CrsCli


def _bench_results_path() -> Path:
    return Path(os.environ.get("CRS_BENCH_RESULTS") or _repo_root() / "bench" / "results.json")


def _table(header: list[str], rows: list[list[str]]):
    from docutils import nodes

    table = nodes.table(classes=["crs-bench-table"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in header)

    def line(cells):
        out = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=cell)
            out += entry
        return out

    head = nodes.thead()
    head += line(header)
    body = nodes.tbody()
    body.extend(line(r) for r in rows)
    group += head
    group += body
    return table


def _bench_nodes(path: Path) -> list:
    from docutils import nodes

    if not path.is_file():
        missing = nodes.paragraph()
        missing += nodes.Text(f"No benchmark results are recorded yet ({path.name} is missing): run ")
        missing += nodes.literal(text="make bench")
        missing += nodes.Text(" and rebuild the book.")
        return [missing]
    benchmarks = json.loads(path.read_text(encoding="utf-8")).get("benchmarks", {})
    out = []
    for name, entry in benchmarks.items():
        section = nodes.section(ids=[f"bench-{name}"], names=[f"bench {name}"])
        section += nodes.title(text=entry.get("title", name))
        m = entry.get("machine", {})
        measured = nodes.paragraph()
        measured += nodes.Text(
            f"Measured {entry.get('recorded_utc', '?')} at commit {entry.get('commit', '?')} on "
            f"{m.get('cpus', '?')} CPUs ({m.get('platform', '?')}, Python {m.get('python', '?')})"
            + (f" and one GPU ({m['gpu']})" if m.get("gpu") else "") + "; "
            f"load average {m.get('load_average_1min', '?')} at the end; the benchmark took "
            f"{entry.get('seconds', '?')} s. Command: ")
        # A literal, not text: Sphinx's smartquotes would turn the command's
        # ``--option`` into an en dash, and the command would no longer paste.
        measured += nodes.literal(text=entry.get("command", "?"))
        measured += nodes.Text(".")
        section += measured
        verdict = {True: "yes", False: "no", None: ""}
        rows = [[r["measure"], r["value"], r.get("target", ""), verdict[r.get("passed")], r.get("note", "")]
                for r in entry.get("rows", [])]
        section += _table(["Measure", "Value", "Target", "Met", "Note"], rows)
        out.append(section)
    return out


def _bench_directive():
    from docutils.parsers.rst import Directive

    class CrsBench(Directive):
        """One section per benchmark recorded by ``make bench``."""

        has_content = False

        def run(self):
            path = _bench_results_path()
            env = self.state.document.settings.env
            if path.is_file():
                env.note_dependency(str(path))
            return _bench_nodes(path)

    return CrsBench


def _start_here_directive():
    from docutils import nodes
    from docutils.parsers.rst import Directive
    from docutils.statemachine import StringList

    class CrsStartHere(Directive):
        """The landing page's *Start here* summary of the staged run (``book/generated/start_here.md``,
        written by ``crs book``); nothing before a run has been staged."""

        has_content = False

        def run(self):
            env = self.state.document.settings.env
            path = Path(env.srcdir) / "book" / "generated" / "start_here.md"
            if not path.is_file():
                return []
            env.note_dependency(str(path))
            container = nodes.container(classes=["crs-start-here"])
            container += nodes.rubric(text="Start here")
            # parsed as the page's own MyST, so its {doc} links resolve from the landing page
            self.state.nested_parse(StringList(path.read_text(encoding="utf-8").splitlines(), str(path)),
                                    self.content_offset, container)
            return [container]

    return CrsStartHere


def _repository_from_environment(app, config) -> None:
    options = dict(config.html_theme_options or {})
    url = os.environ.get("CRS_REPOSITORY_URL") or options.get("repository_url") or ""
    if url:
        options["repository_url"] = url
        options["use_repository_button"] = True
        options["use_issues_button"] = True
    else:
        # buttons to a repository that is not there would be broken links
        options["use_repository_button"] = False
        options["use_issues_button"] = False
        options["use_edit_page_button"] = False
        options["launch_buttons"] = {}
    config.html_theme_options = options


def _launch_targets(app, pagename, templatename, context, doctree) -> None:
    prefix = "book/generated/"
    if not pagename.startswith(prefix):
        return
    name = pagename[len(prefix):]
    source = f"notebooks/{name}.py"
    if not (_repo_root() / source).is_file():
        return
    options = app.config.html_theme_options or {}
    branch = options.get("repository_branch") or "main"
    published = app.config.crs_published_branch
    for group in context.get("header_buttons", []):
        if group.get("label") != "launch-buttons":
            continue
        for button in group.get("buttons", []):
            url = button.get("url", "")
            if button.get("text") == "Binder" and "?urlpath=" in url:
                base, _, target = url.partition("?urlpath=")
                interface = target.split(pagename)[0]
                button["url"] = f"{base}?urlpath={interface}{source}"
            elif button.get("text") == "Colab":
                button["url"] = url.replace(f"/blob/{branch}/{pagename}.ipynb",
                                            f"/blob/{published}/_sources/{pagename}.ipynb")


def _root_favicon(app, exception) -> None:
    """Write ``favicon.ico`` at the site root.

    The pages link their icon (``html.favicon``), but the root ``index.html``
    is a bare redirect with no icon link, so a browser asks it for
    ``/favicon.ico``; on a plain static server the 404 is a console error.
    The icon is drawn after ``book/favicon.svg`` (Pillow cannot read SVG).
    """
    if exception is not None or app.builder.format != "html":
        return
    from PIL import Image, ImageDraw

    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    draw.rounded_rectangle((0, 0, 63, 63), radius=12, fill="#1f4e79")
    draw.ellipse((10, 20, 34, 44), outline="#ffffff", width=5)
    draw.ellipse((30, 20, 54, 44), outline="#9fd3ff", width=5)
    image.save(Path(app.outdir) / "favicon.ico", sizes=[(16, 16), (32, 32), (64, 64)])


def setup(app):
    app.add_config_value("crs_published_branch", "gh-pages", "html")
    app.add_directive("crs-cli", _cli_directive())
    app.add_directive("crs-bench", _bench_directive())
    app.add_directive("crs-start-here", _start_here_directive())
    app.connect("config-inited", _repository_from_environment)
    app.connect("html-page-context", _launch_targets, priority=900)
    # after the themes' own page-context handlers (priority 500)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    app.connect("html-page-context", _default_colour_mode, priority=900)
    app.connect("build-finished", _root_favicon)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


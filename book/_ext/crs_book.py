"""Small Sphinx fixes for the CRS companion book (a local extension).

- Jupyter Book's extensions register some inline scripts twice (one copy
  with filename ``None``, one with ``""``), so a page carried ``const
  THEBE_JS_URL = ...`` twice: a JavaScript SyntaxError in the reader's
  console. Identical script entries are dropped from every page.
- pydata-sphinx-theme logs "Got invalid theme mode" to the console when no
  default colour mode is configured: the default becomes "auto".

It also adds the ``crs-cli`` directive: the help of ``crs`` and of each
subcommand, generated from :func:`crslib.cli.build_parser` at build time.
"""

from __future__ import annotations


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


def setup(app):
    app.add_directive("crs-cli", _cli_directive())
    # after the themes' own page-context handlers (priority 500)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    app.connect("html-page-context", _default_colour_mode, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


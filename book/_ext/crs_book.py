"""Small Sphinx fixes for the CRS companion book (a local extension).

- Jupyter Book's extensions register some inline scripts twice (one copy
  with filename ``None``, one with ``""``), so a page carried ``const
  THEBE_JS_URL = ...`` twice: a JavaScript SyntaxError in the reader's
  console. Identical script entries are dropped from every page.
- pydata-sphinx-theme logs "Got invalid theme mode" to the console when no
  default colour mode is configured: the default becomes "auto".
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


def setup(app):
    # after the themes' own page-context handlers (priority 500)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    app.connect("html-page-context", _default_colour_mode, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


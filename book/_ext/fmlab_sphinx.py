"""Small fixes to the rendered pages of the book, as a local Sphinx extension.

- Drop script tags that appear twice on a page. sphinx-thebe registers its inline
  configuration (``const THEBE_JS_URL = ...``) twice with Sphinx 7.4, once with the file
  name ``None`` and once with ``''``; a second ``const`` declaration is a JavaScript error
  in the browser, and tests/test_browser.py requires pages that log no errors.
"""


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        attributes = getattr(script, "attributes", {}) or {}
        key = (getattr(script, "filename", None) or "", attributes.get("body", ""))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

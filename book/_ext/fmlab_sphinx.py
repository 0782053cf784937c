"""The book's own Sphinx extension.

- **Claims index.** Every ``fmlab.claim`` shown in an executed chapter carries its
  record (statement, kind, key, evidence, value) in a ``data-fmlab-claim`` attribute of
  its HTML output. While Sphinx reads a page (a freshly executed notebook or one from
  the execution cache alike), this extension collects those records. The directive
  ``{fmlab-claims-index}`` renders them, headline (keyed) results first, then by
  chapter, each linking to the verified line in its chapter; at the end of the build
  every record is written to ``_build/claims.json``.
- **Buttons only for a real repository.** The repository button and the Binder/Colab
  launch buttons appear only when ``repository.url`` in ``_config.yml`` names a
  repository; while it is empty they are turned off here, so that the site never links
  to a repository that does not exist.
- **Duplicate scripts.** sphinx-thebe registers its inline configuration
  (``const THEBE_JS_URL = ...``) twice with Sphinx 7.4, once with the file name ``None``
  and once with ``''``; a second ``const`` declaration is a JavaScript error in the
  browser, and tests/test_browser.py requires pages that log no errors. Script tags that
  appear twice on a page are dropped.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

_DATA = re.compile(r'data-fmlab-claim="([^"]*)"')


class claims_index_placeholder(nodes.General, nodes.Element):
    """Replaced by the claims tables once every page has been read."""


class ClaimsIndexDirective(SphinxDirective):
    has_content = False

    def run(self):
        self.env.fmlab_claims_index_docs = getattr(
            self.env, "fmlab_claims_index_docs", set()
        )
        self.env.fmlab_claims_index_docs.add(self.env.docname)
        return [claims_index_placeholder()]


def _collect(app, doctree):
    env = app.env
    if not hasattr(env, "fmlab_claims"):
        env.fmlab_claims = {}
    found = []
    for node in doctree.findall(nodes.raw):
        if "html" not in node.get("format", ""):
            continue
        for match in _DATA.finditer(node.astext()):
            found.append(json.loads(html.unescape(match.group(1))))
    if found:
        env.fmlab_claims[env.docname] = found
    else:
        env.fmlab_claims.pop(env.docname, None)


def _purge(app, env, docname):
    getattr(env, "fmlab_claims", {}).pop(docname, None)
    getattr(env, "fmlab_claims_index_docs", set()).discard(docname)


def _merge(app, env, docnames, other):
    env.fmlab_claims = getattr(env, "fmlab_claims", {})
    env.fmlab_claims.update(getattr(other, "fmlab_claims", {}))
    env.fmlab_claims_index_docs = getattr(env, "fmlab_claims_index_docs", set())
    env.fmlab_claims_index_docs |= getattr(other, "fmlab_claims_index_docs", set())


def _always_outdated(app, env, added, changed, removed):
    # the index page shows what the chapters produced: rebuild it whenever it is built
    return sorted(getattr(env, "fmlab_claims_index_docs", set()))


def _chapters(env):
    """Documents with claims, in the reading order of the table of contents."""
    claims = getattr(env, "fmlab_claims", {})
    order = []
    root = env.config.root_doc

    def walk(doc):
        for child in env.toctree_includes.get(doc, []):
            if child not in order:
                order.append(child)
                walk(child)

    walk(root)
    ordered = [d for d in order if d in claims]
    return ordered + sorted(d for d in claims if d not in ordered)


def _chapter_label(env, docname):
    number = env.toc_secnumbers.get(docname, {}).get("")
    title = env.titles[docname].astext() if docname in env.titles else docname
    return (".".join(map(str, number)) + ". " if number else "") + title


def _table(widths, header, rows):
    """A docutils table; each cell is a node or a string."""
    table = nodes.table(classes=["fmlab-claims-index"])
    group = nodes.tgroup(cols=len(widths))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    for part, lines in ((nodes.thead(), [header]), (nodes.tbody(), rows)):
        for line in lines:
            row = nodes.row()
            for cell in line:
                node = (
                    cell if isinstance(cell, nodes.Node) else nodes.paragraph(text=cell)
                )
                row += nodes.entry("", node)
            part += row
        group += part
    return table


def _value_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v:.4g}" for k, v in value.items())
    return f"{value:.4g}"


def _headlines(app, fromdocname):
    """A table of every keyed claim, with its value, for the top of the index."""
    env = app.env
    rows = []
    for docname in _chapters(env):
        uri = app.builder.get_relative_uri(fromdocname, docname)
        for r in env.fmlab_claims[docname]:
            if not r.get("key"):
                continue
            link = nodes.paragraph()
            link += nodes.reference(
                "", r["statement"], internal=True, refuri=f"{uri}#{r['anchor']}"
            )
            rows.append(
                [
                    nodes.paragraph("", "", nodes.literal(text=r["key"])),
                    r["kind"],
                    link,
                    _value_text(r.get("value")),
                ]
            )
    if not rows:
        return []
    section = nodes.section(ids=["claims-headlines"])
    section += nodes.title(text="Headline results")
    section += nodes.paragraph(
        text="Every keyed claim of the book, with the value measured by this build."
    )
    section += _table((18, 10, 56, 16), ("key", "kind", "claim", "value"), rows)
    return [section]


def _resolve(app, doctree, fromdocname):
    env = app.env
    for placeholder in list(doctree.findall(claims_index_placeholder)):
        content = _headlines(app, fromdocname)
        for docname in _chapters(env):
            records = env.fmlab_claims[docname]
            uri = app.builder.get_relative_uri(fromdocname, docname)
            section = nodes.section(ids=[f"claims-{nodes.make_id(docname)}"])
            title = nodes.title()
            title += nodes.reference(
                "", _chapter_label(env, docname), internal=True, refuri=uri
            )
            section += title
            counts = {
                k: sum(r["kind"] == k for r in records) for k in ("finding", "check")
            }
            summary = (
                f"{len(records)} claims: {counts['finding']} findings, "
                f"{counts['check']} checks."
            )
            section += nodes.paragraph(text=summary)
            rows = []
            for r in records:
                para = nodes.paragraph()
                para += nodes.reference(
                    "", r["statement"], internal=True, refuri=f"{uri}#{r['anchor']}"
                )
                if r.get("key"):
                    para += nodes.Text(" ")
                    para += nodes.literal(text=r["key"])
                rows.append(
                    ["✔" if r["verified"] else "✘", r["kind"], para, r["evidence"]]
                )
            section += _table((6, 12, 50, 32), ("", "kind", "claim", "evidence"), rows)
            content.append(section)
        if len(content) <= 1 and not _chapters(env):
            content = [nodes.paragraph(text="No chapter has been executed yet.")]
        placeholder.replace_self(content)


def _write_json(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    env = app.env
    rows = []
    for docname in _chapters(env):
        page = app.builder.get_target_uri(docname)
        for r in env.fmlab_claims[docname]:
            rows.append(
                {
                    "chapter": _chapter_label(env, docname),
                    "document": docname,
                    "key": r.get("key"),
                    "kind": r["kind"],
                    "statement": r["statement"],
                    "verified": r["verified"],
                    "evidence": r["evidence"],
                    "value": r.get("value"),
                    "link": f"{page}#{r['anchor']}",
                }
            )
    out = Path(app.outdir).parent / "claims.json"
    out.write_text(
        json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )


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


def _buttons_only_with_a_repository(app, config):
    options = config.html_theme_options
    url = (options.get("repository_url") or "").strip()
    if url:
        options.setdefault("use_repository_button", True)
        return
    options.pop("repository_url", None)
    options["use_repository_button"] = False
    options["use_edit_page_button"] = False
    options["use_issues_button"] = False
    launch = dict(options.get("launch_buttons") or {})
    for name in ("binderhub_url", "jupyterhub_url", "colab_url", "deepnote_url"):
        launch[name] = ""
    launch["thebe"] = False
    options["launch_buttons"] = launch


def setup(app):
    app.connect("config-inited", _buttons_only_with_a_repository)
    app.add_node(claims_index_placeholder)
    app.add_directive("fmlab-claims-index", ClaimsIndexDirective)
    app.connect("doctree-read", _collect)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-get-outdated", _always_outdated)
    app.connect("doctree-resolved", _resolve)
    app.connect("build-finished", _write_json)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 2}

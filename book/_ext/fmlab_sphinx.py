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


class ledger_placeholder(nodes.General, nodes.Element):
    """Replaced by the reproduction ledger once every page has been read."""


class LedgerDirective(SphinxDirective):
    has_content = False

    def run(self):
        return [ledger_placeholder()]


def _registry(app) -> dict:
    """The claims registry, ``book/claims.yml`` (keys and phenomena)."""
    import yaml

    path = Path(app.srcdir) / "book" / "claims.yml"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {"keys": data.get("keys") or {}, "phenomena": data.get("phenomena") or {}}


def _records_by_key(env) -> dict:
    out = {}
    for docname, records in getattr(env, "fmlab_claims", {}).items():
        for r in records:
            if r.get("key"):
                out[r["key"]] = (docname, r)
    return out


def ledger_rows(registry: dict, by_key: dict) -> list[dict]:
    """One row per phenomenon: its keys' values and a status computed from them.

    *reproduced*: every key is claimed and verified (and no caveat is registered);
    *partly*: some are, or all are but the registry records a caveat;
    *not reproduced*: none is (each key is measured and fails, or fails its claim);
    *not studied*: the phenomenon has no key in the book yet.
    """
    rows = []
    for pid, ph in registry["phenomena"].items():
        keys = [k for k, e in registry["keys"].items() if e["phenomenon"] == pid]
        held = []
        for k in keys:
            r = by_key.get(k, (None, None))[1]
            held.append(bool(r and r.get("claimed", True) and r["verified"]))
        if not keys:
            status = "not studied"
        elif all(held):
            status = "partly" if ph.get("caveat") else "reproduced"
        elif any(held):
            status = "partly"
        else:
            status = "not reproduced"
        rows.append({"id": pid, "phenomenon": ph, "keys": keys, "status": status})
    return rows


def _key_line(key, entry, found):
    """``✔ key = value`` for the ledger's "this build" column: ✔ claimed and verified,
    ○ measured (not claimed), ✘ a failed claim."""
    if found is None:
        return f"{key}: not produced"
    r = found[1]
    if r.get("claimed", True):
        mark = "✔" if r["verified"] else "✘"
    else:
        mark = "○"
    return f"{mark} {key} = {_value_text(r.get('value'))}"


def _ledger(app, fromdocname):
    env = app.env
    reg = _registry(app)
    by_key = _records_by_key(env)
    rows = []
    for row in ledger_rows(reg, by_key):
        ph = row["phenomenon"]
        book = nodes.paragraph()
        for i, k in enumerate(row["keys"]):
            if i:
                book += nodes.raw("", "<br/>", format="html")
            found = by_key.get(k)
            text = _key_line(k, reg["keys"][k], found)
            if found is not None:
                uri = app.builder.get_relative_uri(fromdocname, found[0])
                book += nodes.reference(
                    "", text, internal=True, refuri=f"{uri}#{found[1]['anchor']}"
                )
            else:
                book += nodes.Text(text)
        if not row["keys"]:
            book += nodes.Text("no experiment in this build")
        why = ph.get("caveat", "")
        if row["status"] == "not reproduced" and not why:
            found = [by_key[k][1] for k in row["keys"] if k in by_key]
            if any(r["verified"] for r in found):
                why = (
                    "measured: holds at this build for some keys, but not claimed "
                    "until it holds at every seed offset"
                )
            else:
                why = "measured: does not hold by the margin rule (see the key's line)"
        status = nodes.paragraph()
        status += nodes.strong(text=row["status"])
        if why:
            status += nodes.Text(": " + why)
        rows.append(
            [
                f"Ch. {ph['chapter']}. {ph['title']}",
                str(ph.get("paper", "")),
                book,
                status,
            ]
        )
    section = nodes.section(ids=["reproduction-ledger"])
    section += nodes.title(text="Reproduction ledger")
    section += nodes.paragraph(
        text="One row per phenomenon of the sources: the paper's number, this build's "
        "numbers (each key's value, the quantity its verdict tests, as defined in "
        "book/claims.yml; ✔ claimed and verified, ○ measured but not claimed) and a "
        "status computed from the keys. Follow a key to the line where its chapter "
        "computes it."
    )
    section += _table(
        (28, 17, 30, 25),
        ("phenomenon", "paper", "this build", "status"),
        rows,
        classes=("fmlab-ledger", "colwidths-given"),
    )
    return [section]


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


def _table(widths, header, rows, classes=("fmlab-claims-index",)):
    """A docutils table; each cell is a node or a string."""
    table = nodes.table(classes=list(classes))
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
    keys = _registry(app)["keys"]
    rows = []
    for docname in _chapters(env):
        uri = app.builder.get_relative_uri(fromdocname, docname)
        for r in env.fmlab_claims[docname]:
            if not r.get("key"):
                continue
            quantity = keys.get(r["key"], {}).get("quantity", "")
            link = nodes.paragraph()
            link += nodes.reference(
                "", r["statement"], internal=True, refuri=f"{uri}#{r['anchor']}"
            )
            rows.append(
                [
                    nodes.paragraph("", "", nodes.literal(text=r["key"])),
                    r["kind"] if r.get("claimed", True) else "measured",
                    link,
                    _value_text(r.get("value"))
                    + (f" ({quantity})" if quantity else ""),
                ]
            )
    if not rows:
        return []
    section = nodes.section(ids=["claims-headlines"])
    section += nodes.title(text="Headline results")
    section += nodes.paragraph(
        text="Every keyed claim of the book, with the value measured by this build "
        "and what that value is (from the claims registry)."
    )
    section += _table((18, 10, 40, 32), ("key", "kind", "claim", "value"), rows)
    return [section]


def _resolve(app, doctree, fromdocname):
    env = app.env
    for placeholder in list(doctree.findall(ledger_placeholder)):
        placeholder.replace_self(_ledger(app, fromdocname))
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
                mark = (
                    "○" if not r.get("claimed", True) else "✔" if r["verified"] else "✘"
                )
                kind = r["kind"] if r.get("claimed", True) else "measured"
                rows.append([mark, kind, para, r["evidence"]])
            section += _table((6, 12, 50, 32), ("", "kind", "claim", "evidence"), rows)
            content.append(section)
        if len(content) <= 1 and not _chapters(env):
            content = [nodes.paragraph(text="No chapter has been executed yet.")]
        placeholder.replace_self(content)


def _check_registry(app, env):
    """Every key the chapters produce is registered, and every registered key is
    produced by its chapter: otherwise the build fails."""
    if not getattr(env, "fmlab_claims", None):
        return
    from sphinx.errors import ExtensionError

    keys = _registry(app)["keys"]
    produced = _records_by_key(env)
    unknown = sorted(set(produced) - set(keys))
    missing = sorted(set(keys) - set(produced))
    if unknown:
        raise ExtensionError("claims not in book/claims.yml: " + ", ".join(unknown))
    if missing:
        raise ExtensionError(
            "keys of book/claims.yml that no chapter produced: " + ", ".join(missing)
        )


def _write_json(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    env = app.env
    keys = _registry(app)["keys"]
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
                    "claimed": r.get("claimed", True),
                    "evidence": r["evidence"],
                    "value": r.get("value"),
                    "strength": r.get("strength"),
                    "quantity": keys.get(r.get("key"), {}).get("quantity"),
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
    app.add_node(ledger_placeholder)
    app.add_directive("fmlab-ledger", LedgerDirective)
    app.connect("env-check-consistency", _check_registry)
    app.connect("doctree-read", _collect)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-get-outdated", _always_outdated)
    app.connect("doctree-resolved", _resolve)
    app.connect("build-finished", _write_json)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 2}

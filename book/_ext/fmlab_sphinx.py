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
- **Downloads.** ``make book`` builds a source archive of the built commit and a wheel
  of ``fmlab`` into ``_build/downloads`` (``scripts/build_downloads.py``, which writes
  ``manifest.json``). ``{fmlab-downloads}`` lists them with the commit and the build
  date; every chapter gets a line "Run this chapter" under its title, and every page's
  download menu links them. When the build finishes, the files are copied into the site
  (``downloads/``), every chapter's ``.ipynb`` download is replaced by the executed
  notebook (``_build/executed``, written by ``scripts/execute_chapters.py``), and
  ``claims.json`` is published beside them.
- **Label ids become numbers.** A claim statement that names an equation, a theorem or
  a section by its MyST label, "(ch3-eq-ratio)", shows the number the page gives it,
  "(3.4)", linked to it, in the chapter's claim lines and in the claims index.
- **The closing claims table** of each chapter (``fmlab.claims_table()``) is folded
  into a ``<details>`` element: the green lines above it already show each claim.
- **Verdict marks link to the claims page.** A chapter's verdict line (its mark and
  number, ``fmlab.claim``'s one-line output beside the result) links to the claim's row
  on the claims page, where the full evidence stands.
- **Reproduction notes.** ``{fmlab-repro-notes} N`` renders Chapter N's rows of the
  reproduction ledger (from the registry and this build's values) and, for each of its
  keys, the values that the stored robustness run (``book/robustness.json``, written by
  ``scripts/check_seeds.py --store``) measured at every seed offset. The section
  "Reproduction notes" of a chapter is folded into a ``<details>`` element.
- **Runtimes.** ``{fmlab-runtimes}`` shows each chapter's budget beside the time this
  build took to execute it (from the execution cache).
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
import shutil
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
    """One row per phenomenon: its keys' values and a status computed from them
    (:func:`fmlab.claims.ledger_status`): from the keys' verdicts alone, demoted from
    *reproduced* to *partly* only by a ``caveat`` (what limits the result); a ``note``
    (what describes it) never changes the status.
    """
    from fmlab.claims import ledger_status

    rows = []
    for pid, ph in registry["phenomena"].items():
        keys = [k for k, e in registry["keys"].items() if e["phenomenon"] == pid]
        held = []
        for k in keys:
            r = by_key.get(k, (None, None))[1]
            held.append(bool(r and r.get("claimed", True) and r["verified"]))
        status = ledger_status(held, ph.get("caveat"))
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
    return f"{mark} {key} = {_value_text(r.get('value'), entry.get('unit', ''))}"


def _note_paragraph(note: str) -> nodes.paragraph:
    """A ledger row's note: what describes the result without limiting it."""
    para = nodes.paragraph(classes=["fmlab-ledger-note"])
    para += nodes.emphasis(text="Note: ")
    para += nodes.Text(note)
    return para


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
        if ph.get("retired"):  # a key moved to the paper's level: its old numbers
            book += nodes.raw("", "<br/>", format="html")
            book += nodes.emphasis(text="retired: ")
            book += nodes.Text(ph["retired"])
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
        if ph.get("note"):  # describes the result; not why the status is what it is
            status = [status, _note_paragraph(ph["note"])]
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


class repro_notes_placeholder(nodes.General, nodes.Element):
    """Replaced by a chapter's ledger rows and robustness values."""


class ReproNotesDirective(SphinxDirective):
    """``{fmlab-repro-notes} N``: Chapter N's rows of the reproduction ledger."""

    required_arguments = 1
    has_content = False

    def run(self):
        try:
            chapter = int(self.arguments[0])
        except ValueError:
            raise self.error(
                f"fmlab-repro-notes takes a chapter number, got {self.arguments[0]!r}"
            ) from None
        return [repro_notes_placeholder(chapter=chapter)]


def _robustness(app) -> dict:
    """The stored robustness run (``book/robustness.json``), or an empty record."""
    path = Path(app.srcdir) / "book" / "robustness.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _robustness_text(entry: dict | None) -> str:
    """A key's verdicts at the stored offsets: "holds at 5 of 5 offsets (0, 1, 2, 3,
    4); weakest 1.90× the rule's 3 s.e., at offset 3; values 0.08 to 0.12", or, for a
    key read from a stored run (recorded once, under ``"stored"``), that run's
    verdict."""
    if not entry:
        return "no stored run at other seed offsets yet"
    if "stored" in entry:  # read from a results file: one run, whatever the offset
        run = entry["stored"]
        held = "does not hold"
        if run.get("verified"):
            held = "holds" if run.get("claimed", True) else "would hold"
        text = (
            f"one stored run ({run.get('script', 'its script')}), the same at every "
            f"seed offset: {held}"
        )
        if run.get("strength") is not None:
            text += f", {run['strength']:.2f}× the rule's 3 s.e."
        if isinstance(run.get("value"), float):
            text += f"; value {run['value']:.4g}"
        return text
    by = entry.get("offsets", {})
    offsets = sorted(by, key=int)
    held = [k for k in offsets if by[k].get("verified")]
    claimed = all(by[k].get("claimed", True) for k in offsets)
    text = f"{'holds' if claimed else 'would hold'} at {len(held)} of {len(offsets)} "
    text += f"offsets ({', '.join(offsets)})"
    strengths = {
        k: by[k]["strength"] for k in offsets if by[k].get("strength") is not None
    }
    if strengths:
        worst = min(strengths, key=strengths.get)
        text += (
            f"; weakest {strengths[worst]:.2f}× the rule's 3 s.e., at offset {worst}"
        )
    values = [by[k]["value"] for k in offsets if isinstance(by[k].get("value"), float)]
    if values:
        text += f"; values {min(values):.4g} to {max(values):.4g}"
    return text


def _repro_notes(app, node, fromdocname):
    chapter = node["chapter"]
    reg = _registry(app)
    by_key = _records_by_key(app.env)
    stored = _robustness(app).get("keys", {})
    rows = [
        r for r in ledger_rows(reg, by_key) if r["phenomenon"]["chapter"] == chapter
    ]
    if not rows:
        return [
            nodes.paragraph(text=f"The ledger has no phenomenon of Chapter {chapter}.")
        ]
    out = []
    for row in rows:
        ph = row["phenomenon"]
        item = nodes.paragraph()
        item += nodes.strong(text=ph["title"])
        item += nodes.Text(f" (paper: {ph.get('paper', '')}): ")
        item += nodes.emphasis(text=row["status"])
        why = ph.get("caveat")
        if why:
            item += nodes.Text(": " + why)
        if ph.get("note"):
            item += nodes.Text(". ")
            item += nodes.emphasis(text="Note: ")
            item += nodes.Text(ph["note"])
        if ph.get("retired"):
            item += nodes.Text(" Retired: " + ph["retired"])
        out.append(item)
        bullets = nodes.bullet_list()
        for k in row["keys"]:
            found = by_key.get(k)
            para = nodes.paragraph()
            para += nodes.literal(text=k)
            para += nodes.Text(" — this build: ")
            unit = reg["keys"][k].get("unit", "")
            value = _value_text(found[1].get("value"), unit) if found else None
            para += nodes.Text(value or "not produced")
            para += nodes.Text("; " + _robustness_text(stored.get(k)) + ".")
            bullets += nodes.list_item("", para)
        if row["keys"]:
            out.append(bullets)
    claims_doc = sorted(getattr(app.env, "fmlab_claims_index_docs", set()))
    if claims_doc:
        uri = app.builder.get_relative_uri(fromdocname, claims_doc[0])
        link = nodes.paragraph()
        link += nodes.Text("Every claim of the page with its full evidence: ")
        link += nodes.reference("", "the claims page", internal=True, refuri=uri)
        link += nodes.Text(".")
        out.append(link)
    return out


_FOLDED = "Reproduction notes"


def _fold_repro_notes(doctree):
    """Fold the content of each section titled "Reproduction notes" into a
    ``<details>`` element (its title stays visible)."""
    for section in list(doctree.findall(nodes.section)):
        if not section.children or not isinstance(section[0], nodes.title):
            continue
        if section[0].astext().strip() != _FOLDED:
            continue
        section["classes"].append("fmlab-repro-notes")
        section.insert(
            1,
            nodes.raw(
                "",
                '<details class="fmlab-repro"><summary>Show the reproduction notes: '
                "departures from the paper, each phenomenon at other seeds, every "
                "claim of the page</summary>",
                format="html",
            ),
        )
        section.append(nodes.raw("", "</details>", format="html"))


class ClaimsIndexDirective(SphinxDirective):
    has_content = False

    def run(self):
        self.env.fmlab_claims_index_docs = getattr(
            self.env, "fmlab_claims_index_docs", set()
        )
        self.env.fmlab_claims_index_docs.add(self.env.docname)
        # the index typesets the statements' mathematics, which it only adds when the
        # doctree is resolved; Sphinx loads MathJax on a page whose source has math, so
        # the placeholder carries an empty formula for it to find
        placeholder = claims_index_placeholder()
        placeholder += nodes.math("", "")
        return [placeholder]


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
    getattr(env, "fmlab_runtimes_docs", set()).discard(docname)


def _merge(app, env, docnames, other):
    env.fmlab_claims = getattr(env, "fmlab_claims", {})
    env.fmlab_claims.update(getattr(other, "fmlab_claims", {}))
    env.fmlab_claims_index_docs = getattr(env, "fmlab_claims_index_docs", set())
    env.fmlab_claims_index_docs |= getattr(other, "fmlab_claims_index_docs", set())
    env.fmlab_runtimes_docs = getattr(env, "fmlab_runtimes_docs", set())
    env.fmlab_runtimes_docs |= getattr(other, "fmlab_runtimes_docs", set())


def _always_outdated(app, env, added, changed, removed):
    # the index page shows what the chapters produced: rebuild it whenever it is built;
    # and every chapter is read again from the execution cache, because a chapter
    # re-executed after a change to the library has new outputs but an unchanged file
    # (Sphinx would otherwise keep the page it rendered from the old outputs)
    chapters = {d for d in env.found_docs if _is_chapter(env, d)}
    # every page links the downloads (its download menu): when they change (a new
    # commit, a PDF built), every page is written again
    manifest = _downloads(app) or {}
    stamp = (
        manifest.get("archive"),
        manifest.get("built"),
        (Path(app.outdir).parent / "pdf" / "book.pdf").is_file(),
    )
    if getattr(env, "fmlab_downloads_stamp", None) != stamp:
        env.fmlab_downloads_stamp = stamp
        return sorted(env.found_docs)
    return sorted(
        getattr(env, "fmlab_claims_index_docs", set())
        | getattr(env, "fmlab_runtimes_docs", set())
        | chapters
    )


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
    """A docutils table; each cell is a node, a list of nodes or a string."""
    table = nodes.table(classes=list(classes))
    group = nodes.tgroup(cols=len(widths))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    for part, lines in ((nodes.thead(), [header]), (nodes.tbody(), rows)):
        for line in lines:
            row = nodes.row()
            for cell in line:
                if isinstance(cell, list):  # several paragraphs
                    row += nodes.entry("", *cell)
                    continue
                node = (
                    cell if isinstance(cell, nodes.Node) else nodes.paragraph(text=cell)
                )
                row += nodes.entry("", node)
            part += row
        group += part
    return table


def _value_text(value, unit: str = "") -> str:
    """A key's value as the ledger prints it, with its registered unit."""
    if value is None:
        return ""
    if isinstance(value, dict):
        text = ", ".join(f"{k}: {v:.4g}" for k, v in value.items())
    else:
        text = f"{value:.4g}"
    return f"{text} ({unit})" if unit else text


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
                "",
                "",
                *statement_nodes(app, r["statement"]),
                internal=True,
                refuri=f"{uri}#{r['anchor']}",
            )
            rows.append(
                [
                    nodes.paragraph("", "", nodes.literal(text=r["key"])),
                    r["kind"] if r.get("claimed", True) else "measured",
                    link,
                    _value_text(r.get("value"), keys.get(r["key"], {}).get("unit", ""))
                    + (f"; {quantity}" if quantity else ""),
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


def _row_id(docname: str, anchor: str) -> str:
    """The id of a claim's row on the claims page (a verdict line links to it)."""
    return f"row-{nodes.make_id(docname)}-{anchor}"


def _resolve(app, doctree, fromdocname):
    env = app.env
    for placeholder in list(doctree.findall(repro_notes_placeholder)):
        placeholder.replace_self(_repro_notes(app, placeholder, fromdocname))
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
                    "",
                    "",
                    *statement_nodes(app, r["statement"]),
                    internal=True,
                    refuri=f"{uri}#{r['anchor']}",
                )
                if r.get("key"):
                    para += nodes.Text(" ")
                    para += nodes.literal(text=r["key"])
                mark = (
                    "○" if not r.get("claimed", True) else "✔" if r["verified"] else "✘"
                )
                kind = r["kind"] if r.get("claimed", True) else "measured"
                rows.append([mark, kind, para, r["evidence"]])
            table = _table((6, 12, 50, 32), ("", "kind", "claim", "evidence"), rows)
            body = next(table.findall(nodes.tbody))
            for row, r in zip(body.children, records):
                row["ids"].append(_row_id(docname, r["anchor"]))
            section += table
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


def _one_tab_title(app, pagename, templatename, context, doctree):
    """The landing page's title is the book's title: the browser tab shows it once.
    Sphinx's layout appends " — <book title>" to every page's title whenever the
    context has a ``docstitle``, so the landing page gets none; the sidebar's title,
    which also reads ``docstitle``, keeps the book's title as the logo's text."""
    if pagename != app.config.root_doc:
        return
    book = context.get("docstitle") or ""
    title = re.sub(r"<[^>]+>", "", str(context.get("title") or ""))
    if html.unescape(title).strip() != html.unescape(book).strip():
        return
    logo = dict(context.get("theme_logo") or {})
    if not logo.get("text") and not (logo.get("image_relative") or {}).get("light"):
        logo["text"] = book
        context["theme_logo"] = logo
    context["docstitle"] = ""


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


# ---------------------------------------------------------------------------------
# Downloads: the source archive, the wheel, executed notebooks


def _downloads(app) -> dict | None:
    """The manifest of ``scripts/build_downloads.py``, or None when it was not run."""
    path = Path(app.outdir).parent / "downloads" / "manifest.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


class downloads_placeholder(nodes.General, nodes.Element):
    """Replaced by the list of downloads once the manifest is known."""


class DownloadsDirective(SphinxDirective):
    has_content = False

    def run(self):
        return [downloads_placeholder()]


def _static_uri(app, fromdocname: str, path: str) -> str:
    """A link from a page to a file at ``path`` under the site's root."""
    from sphinx.util.osutil import relative_uri

    return relative_uri(app.builder.get_target_uri(fromdocname), path)


def _build_line(manifest: dict) -> str:
    commit = manifest["commit"][:10]
    dirty = " with uncommitted changes" if manifest.get("dirty") else ""
    return f"Built on {manifest['built']} from commit {commit}{dirty}."


def _downloads_list(app, fromdocname):
    manifest = _downloads(app)
    if manifest is None:
        return [
            nodes.paragraph(
                text="The downloads are built by `make book` "
                "(scripts/build_downloads.py); this copy of the site was built without "
                "them."
            )
        ]
    items = nodes.bullet_list()
    entries = [
        (
            manifest["archive"],
            "the whole book as a source archive (every notebook, the library, the "
            "Makefile and the tests) at the commit this site was built from",
        ),
        (
            manifest["wheel"],
            f"the library fmlab {manifest['version']} as a wheel: "
            "pip install it, then run any chapter",
        ),
    ]
    if (Path(app.outdir).parent / "pdf" / "book.pdf").is_file():
        entries.append(("book.pdf", "the whole book as one PDF"))
    for name, what in entries:
        para = nodes.paragraph()
        para += nodes.reference(
            "",
            name,
            internal=False,
            refuri=_static_uri(app, fromdocname, f"downloads/{name}"),
        )
        para += nodes.Text(": " + what)
        items += nodes.list_item("", para)
    para = nodes.paragraph()
    para += nodes.Text(
        "Each chapter's download menu (the arrow at the top of its page) gives the "
        "chapter as an executed notebook, with every output and figure. "
    )
    para += nodes.reference(
        "",
        "claims.json",
        internal=False,
        refuri=_static_uri(app, fromdocname, "claims.json"),
    )
    para += nodes.Text(" lists every claim of the book with its verdict and values. ")
    para += nodes.emphasis(text=_build_line(manifest))
    return [items, para]


def _is_chapter(env, docname: str) -> bool:
    return str(env.doc2path(docname)).endswith(".ipynb")


def _run_this_chapter(app, doctree, docname):
    """A line under a chapter's title: its executed notebook, the wheel, the source,
    and how long executing the page took for this site (the run whose outputs it
    shows, from the execution cache's record, as on the runtimes page)."""
    manifest = _downloads(app)
    env = app.env
    if manifest is None or not _is_chapter(env, docname):
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None or not section.children:
        return
    para = nodes.paragraph(classes=["fmlab-run-this"])
    para += nodes.strong(text="Run this chapter: ")
    links = [
        (
            "the executed notebook",
            f"_sources/{docname}.ipynb",
        ),
        (f"fmlab {manifest['version']} (wheel)", f"downloads/{manifest['wheel']}"),
        ("the book's source", f"downloads/{manifest['archive']}"),
    ]
    for i, (text, path) in enumerate(links):
        if i:
            para += nodes.Text(" · ")
        para += nodes.reference(
            "", text, internal=False, refuri=_static_uri(app, docname, path)
        )
    para += nodes.Text(" (")
    para += nodes.reference(
        "",
        "how",
        internal=True,
        refuri=app.builder.get_relative_uri(docname, "book/how-to-run")
        + "#run-a-chapter-yourself",
    )
    para += nodes.Text(").")
    took = _measured(app).get(Path(env.doc2path(docname)).stem)
    if took is not None:  # the run whose outputs the page shows, measured by the build
        seconds, computed = took
        how = (
            "with its models already trained"
            if computed == 0
            else "training its models"
            if computed
            else ""
        )
        para += nodes.Text(
            f" Executing it for this site took {_duration(seconds)} on one core"
            + (f", {how}" if how else "")
            + " ("
        )
        para += nodes.reference(
            "",
            "every page's time",
            internal=True,
            refuri=app.builder.get_relative_uri(docname, "book/runtimes"),
        )
        para += nodes.Text(").")
    section.insert(1, para)


def _duration(seconds: float) -> str:
    """``seconds`` as a reader says it: "45 s", "3 min 20 s"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def _measured(app) -> dict:
    """:func:`_measured_seconds`, read once per build."""
    if getattr(app, "_fmlab_measured", None) is None:
        app._fmlab_measured = _measured_seconds(app)
    return app._fmlab_measured


def _download_menu(app, pagename, templatename, context, doctree):
    """The download menu of every page: the chapter's executed notebook, the wheel,
    the source archive, and the book's PDF when it was built."""
    manifest = _downloads(app)
    buttons = context.get("header_buttons") or []
    group = next((b for b in buttons if b.get("label") == "download-buttons"), None)
    if group is None:
        return
    from sphinx.util.osutil import relative_uri

    here = app.builder.get_target_uri(pagename)
    items = []
    notebook = str(context.get("sourcename", "")).endswith(".ipynb")
    for b in group["buttons"]:
        label = b.get("label")
        if label == "download-pdf-button":
            continue  # the browser's print dialog: replaced by the book's PDF below
        if notebook and label == "download-notebook-button":
            continue  # (a text notebook's); a chapter's source is its .ipynb, below
        if notebook and label == "download-source-button":
            # the chapter's .ipynb: _publish puts there the executed chapter, baked
            # and numbered as the book (scripts/build_downloads.py)
            b = {
                **b,
                "text": ".ipynb (executed)",
                "tooltip": "The chapter as an executed notebook, with its outputs, "
                "numbered as the book",
                "icon": "fas fa-code",
                "label": "download-notebook-button",
            }
            items.insert(0, b)
            continue
        items.append(b)
    if manifest is not None:
        for text, name, tip, icon in (
            (
                "source (.tar.gz)",
                manifest["archive"],
                "The whole book: notebooks, library, Makefile",
                "fas fa-file-archive",
            ),
            (
                "fmlab (.whl)",
                manifest["wheel"],
                "The library, to pip install",
                "fas fa-box",
            ),
        ):
            items.append(
                {
                    "type": "link",
                    "url": relative_uri(here, f"downloads/{name}"),
                    "text": text,
                    "tooltip": tip,
                    "icon": icon,
                    "label": f"download-{name}",
                }
            )
    if (Path(app.outdir).parent / "pdf" / "book.pdf").is_file():
        items.append(
            {
                "type": "link",
                "url": relative_uri(here, "downloads/book.pdf"),
                "text": "book (.pdf)",
                "tooltip": "The whole book as one PDF",
                "icon": "fas fa-file-pdf",
                "label": "download-book-pdf",
            }
        )
    group["buttons"] = items


def _publish(app, exception):
    """Copy the downloads, the executed chapters and claims.json into the site."""
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    build = out.parent
    target = out / "downloads"
    if target.exists():
        shutil.rmtree(target)  # no archive of an earlier commit stays behind
    target.mkdir()
    manifest = _downloads(app)
    if manifest is not None:
        for key in ("archive", "wheel"):
            shutil.copy2(build / "downloads" / manifest[key], target / manifest[key])
    pdf = build / "pdf" / "book.pdf"
    if pdf.is_file():
        shutil.copy2(pdf, target / "book.pdf")
    # each chapter's .ipynb download: the executed chapter baked for Jupyter and
    # numbered as the book (scripts/build_downloads.py), else as executed
    sources = out / "_sources"
    baked = build / "downloads" / "notebooks"
    for executed in sorted((build / "executed").glob("*.ipynb")):
        chosen = baked / executed.name
        if not chosen.is_file():
            chosen = executed
        for page in sources.rglob(executed.name):
            shutil.copy2(chosen, page)
    claims = build / "claims.json"
    if claims.is_file():
        shutil.copy2(claims, out / "claims.json")


# ---------------------------------------------------------------------------------
# Slider frames as image files: a page's HTML carries its widgets' state, and each
# frame of a slider figure is an ipywidgets Image whose PNG would sit in that state as
# base64. Each is written to _images/frames/ instead and the Image shows it by URL
# (ipywidgets' format "url"), so the page's HTML stays small and the frames load after
# the text, from files the browser caches.

_WIDGET_STATE = re.compile(
    r'(<script type="application/vnd\.jupyter\.widget-state\+json">)(.*?)(</script>)',
    re.S,
)


def frames_to_files(page: Path, images: Path) -> int:
    """Move the PNG frames of the widget state in ``page`` (an HTML file) to files in
    ``images`` (named by content); returns how many were moved."""
    import base64
    import hashlib
    import os

    text = page.read_text(encoding="utf-8")
    moved = 0

    def swap(match):
        nonlocal moved
        state = json.loads(match.group(2))
        for model in state.get("state", {}).values():
            if model.get("model_name") != "ImageModel":
                continue
            fmt = model.get("state", {}).get("format", "png")
            for buf in model.get("buffers", []):
                if buf.get("path") != ["value"] or fmt == "url":
                    continue
                data = base64.b64decode(buf["data"])
                name = hashlib.sha1(data).hexdigest()[:20] + "." + fmt
                images.mkdir(parents=True, exist_ok=True)
                (images / name).write_bytes(data)
                url = os.path.relpath(images / name, page.parent).replace(os.sep, "/")
                buf["data"] = base64.b64encode(url.encode()).decode("ascii")
                buf["encoding"] = "base64"
                model["state"]["format"] = "url"
                moved += 1
        body = json.dumps(state, separators=(",", ":")).replace("</", "<\\/")
        return match.group(1) + body + match.group(3)

    new = _WIDGET_STATE.sub(swap, text)
    if moved:
        page.write_text(new, encoding="utf-8")
    return moved


# The theme loads Font Awesome twice: as CSS with its web fonts (which draws every icon
# of the site) and as a 1.5 MB script that redraws the icons as SVG, there "so that
# users can add custom icons". The book adds none: the script goes, and with it a
# third of a chapter's weight before it is ready on a slow line.
_ICON_SCRIPT = re.compile(
    r'\s*<script defer src="[^"]*_static/scripts/fontawesome\.js[^"]*"></script>'
)


def drop_icon_script(page: Path) -> bool:
    """Remove the theme's Font Awesome script from ``page`` (an HTML file)."""
    text = page.read_text(encoding="utf-8")
    new = _ICON_SCRIPT.sub("", text)
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


def _drop_icon_script(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        drop_icon_script(page)


def _frames_to_files(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for page in out.rglob("*.html"):
        if "widget-state+json" in page.read_text(encoding="utf-8", errors="ignore"):
            frames_to_files(page, out / "_images" / "frames")


# ---------------------------------------------------------------------------------
# Label ids in claim statements become the numbers the pages show

_LABEL = re.compile(r"\b(ch[0-9]+-[A-Za-z0-9_-]*[A-Za-z0-9])\b")
_TAG = re.compile(r"(<[^>]*>)")


def _label_targets(app) -> dict:
    """label -> (docname, anchor, text): equations "(3.4)" without the parentheses,
    theorems and the like "Theorem 3.2", sections by their title."""
    env = app.env
    cache = getattr(app, "_fmlab_label_cache", None)
    if cache is not None:
        return cache
    targets = {}
    std = env.get_domain("std")
    for label, (docname, anchor, title) in std.labels.items():
        if _LABEL.fullmatch(label) and title:
            targets[label] = (docname, anchor, title)
    for label, entry in (getattr(env, "proof_list", None) or {}).items():
        number = ""
        if not entry.get("nonumber"):
            numbers = env.toc_fignumbers.get(entry["docname"], {}).get(
                entry["countertype"], {}
            )
            number = ".".join(map(str, numbers.get(label, ())))
        title = (entry.get("realtype") or entry.get("type") or "").title()
        targets[label] = (entry["docname"], label, f"{title} {number}".strip())
    math = env.get_domain("math")
    for label, (docname, number) in math.equations.items():
        anchor = nodes.make_id(f"equation-{label}")
        numbers = env.toc_fignumbers.get(docname, {}).get("displaymath", {})
        eqno = ".".join(map(str, numbers.get(anchor, ()))) or str(number)
        targets[label] = (docname, anchor, eqno)
    app._fmlab_label_cache = targets
    return targets


def _numbered_html(app, fromdocname: str, text: str) -> str:
    """HTML ``text`` with every known label id outside tags replaced by its number,
    linked (equations keep their parentheses: "(ch3-eq-ratio)" -> "(3.4)")."""
    targets = _label_targets(app)

    def swap(match):
        found = targets.get(match.group(1))
        if found is None:
            return match.group(0)
        docname, anchor, shown = found
        uri = app.builder.get_relative_uri(fromdocname, docname)
        shown = html.escape(shown)
        return f'<a class="reference internal" href="{uri}#{anchor}">{shown}</a>'

    parts = _TAG.split(text)
    inside_link = False
    for i, part in enumerate(parts):
        if i % 2:
            if re.match(r"<a[\s>]", part):
                inside_link = True
            elif part.startswith("</a"):
                inside_link = False
            continue
        if inside_link:
            parts[i] = _LABEL.sub(
                lambda m: (
                    html.escape(targets[m.group(1)][2])
                    if m.group(1) in targets
                    else m.group(0)
                ),
                part,
            )
        else:
            parts[i] = _LABEL.sub(swap, part)
    return "".join(parts)


def numbered_text(app, text: str) -> str:
    """Plain ``text`` with known label ids replaced by their numbers (no links)."""
    targets = _label_targets(app)
    return _LABEL.sub(
        lambda m: targets[m.group(1)][2] if m.group(1) in targets else m.group(0), text
    )


def statement_nodes(app, statement: str) -> list:
    """A claim statement as nodes: its text with label ids as numbers, its inline
    mathematics (between dollar signs) as math nodes, typeset like the prose."""
    from fmlab.claims import statement_parts

    return [
        nodes.Text(numbered_text(app, text))
        if kind == "text"
        else nodes.math(text, text)
        for kind, text in statement_parts(statement)
    ]


_VERDICT_HREF = re.compile(r'class="fmlab-verdict" href="#([^"]+)"')


def _link_verdicts(app, text: str, fromdocname: str) -> str:
    """Point each verdict mark at its claim's row on the claims page."""
    docs = sorted(getattr(app.env, "fmlab_claims_index_docs", set()))
    if not docs:
        return text
    uri = app.builder.get_relative_uri(fromdocname, docs[0])
    return _VERDICT_HREF.sub(
        lambda m: (
            f'class="fmlab-verdict" href="{uri}#{_row_id(fromdocname, m.group(1))}"'
        ),
        text,
    )


def _claims_outputs(app, doctree, fromdocname):
    """In a chapter's raw HTML outputs: label ids in claim lines become numbers, and
    the closing claims table is folded."""
    for node in list(doctree.findall(nodes.raw)):
        if "html" not in node.get("format", ""):
            continue
        text = node.astext()
        changed = text
        if "fmlab-claim" in text:
            changed = _numbered_html(app, fromdocname, text)
            changed = _link_verdicts(app, changed, fromdocname)
        if changed.lstrip().startswith('<table class="fmlab-claims">'):
            n = changed.count("<tr>") - 1
            m = changed.count("<td>○</td>")  # measured, not claimed
            what = f"{n - m} claims of this page, each verified by this build"
            if m:
                what += f", and {m} measured result{'s' if m > 1 else ''}, not claimed"
            changed = (
                '<details class="fmlab-claims-details"><summary>The '
                f"{what} (open the table)</summary>" + changed + "</details>"
            )
        if changed != text:
            node.replace_self(nodes.raw("", changed, format="html"))


# ---------------------------------------------------------------------------------
# Runtimes: each chapter's budget beside the time this build took


class RuntimesDirective(SphinxDirective):
    """``{fmlab-runtimes}`` with one line per chapter: ``<file stem>: <budget s>
    [<budget s with trained models cached>]``; the options ``book`` and ``page`` are
    the build's own targets (seconds of wall-clock time for executing every chapter,
    and for the longest page), compared with the last execution."""

    has_content = True
    option_spec = {"book": float, "page": float}

    def run(self):
        budgets = {}
        for line in self.content:
            if not line.strip():
                continue
            stem, _, rest = line.partition(":")
            values = [float(v) for v in rest.split()]
            budgets[stem.strip()] = values
        self.env.fmlab_runtime_budgets = budgets
        # the page shows times of the last execution: rebuild it on every build
        self.env.fmlab_runtimes_docs = getattr(self.env, "fmlab_runtimes_docs", set())
        self.env.fmlab_runtimes_docs.add(self.env.docname)
        node = runtimes_placeholder()
        node["budgets"] = budgets
        node["targets"] = {
            k: self.options[k] for k in ("book", "page") if k in self.options
        }
        return [node]


class runtimes_placeholder(nodes.General, nodes.Element):
    """Replaced by the runtimes table at resolve time."""


def _measured_seconds(app) -> dict:
    """Chapter file stem -> (seconds the cached execution this site shows took, the
    number of model-cache entries it computed or ``None`` when not recorded)."""
    try:
        import nbformat
        from jupyter_cache import get_cache
    except ImportError:
        return {}
    path = Path(app.outdir).parent / ".jupyter_cache"
    if not path.is_dir():
        return {}
    cache = get_cache(str(path))
    out = {}
    for docname in app.env.found_docs:
        if not _is_chapter(app.env, docname):
            continue
        source = Path(app.env.doc2path(docname))
        try:
            record = cache.match_cache_notebook(nbformat.read(source, as_version=4))
        except (KeyError, OSError):
            continue
        data = record.data or {}
        seconds = data.get("execution_seconds")
        if seconds is not None:
            out[source.stem] = (float(seconds), data.get("cache_computed"))
    return out


def runtime_verdict(seconds: float, budget: list, computed: int | None) -> str:
    """How a page's execution time compares with its budgets: ``budget`` is [cold] or
    [cold, with trained models cached]; ``computed`` the model-cache entries the run
    computed (0: everything came from the cache; ``None``: not recorded)."""
    cached_run = computed == 0 and len(budget) > 1
    limit = budget[1] if cached_run else budget[0]
    kind = "a run with its models cached" if cached_run else "a first run"
    verdict = "within" if seconds <= limit else "over"
    text = f"{verdict} the budget of {kind}, {limit:.0f} s"
    if computed is None:
        text += " (whether its models were cached was not recorded)"
    elif computed:
        text += f" ({computed} cache entries computed)"
    return text


def _runtimes(app, node, fromdocname):
    env = app.env
    measured = _measured(app)
    by_stem = {
        Path(env.doc2path(d)).stem: d for d in env.found_docs if _is_chapter(env, d)
    }
    rows = []
    for stem, budget in node["budgets"].items():
        docname = by_stem.get(stem)
        label = _chapter_label(env, docname) if docname else stem
        cell = nodes.paragraph()
        if docname:
            cell += nodes.reference(
                "",
                label,
                internal=True,
                refuri=app.builder.get_relative_uri(fromdocname, docname),
            )
        else:
            cell += nodes.Text(label)
        seconds, computed = measured.get(stem, (None, None))
        if seconds is None:
            took, verdict = "not executed by this build", ""
        else:
            took = f"{seconds:.0f} s"
            verdict = runtime_verdict(seconds, budget, computed)
        rows.append(
            [
                cell,
                f"{budget[0]:.0f} s",
                f"{budget[1]:.0f} s" if len(budget) > 1 else "—",
                took,
                verdict,
            ]
        )
    table = _table(
        (34, 14, 18, 14, 20),
        (
            "chapter",
            "budget, nothing cached",
            "budget, trained models cached",
            "this build took",
            "",
        ),
        rows,
    )
    longest = max(measured.items(), key=lambda kv: kv[1][0], default=None)
    if longest is not None:
        docname = by_stem.get(longest[0])
        label = _chapter_label(env, docname) if docname else longest[0]
        longest = (label, longest[1][0])
    return [table, _execution_summary(app, node.get("targets", {}), longest)]


def _execution_summary(app, targets=None, longest=None) -> nodes.paragraph:
    """A paragraph on the last execution of chapters (scripts/execute_chapters.py
    records it): wall time against the summed chapter time and the cores it used, the
    build's ``targets`` (``book``: wall seconds, ``page``: seconds of the
    ``longest`` page, a (label, seconds) pair) and the machine's speed."""
    targets = targets or {}
    path = Path(app.outdir).parent / ".jupyter_cache" / "fmlab_execution.json"
    try:
        run = json.loads(path.read_text())
        wall, total, jobs = run["wall_seconds"], run["chapter_seconds"], run["jobs"]
        n = len(run["chapters"])
    except (OSError, ValueError, KeyError, TypeError):
        return nodes.paragraph("", "No execution of the chapters is recorded.")
    efficiency = total / (jobs * wall) if wall > 0 and jobs > 0 else float("nan")
    text = (
        f"The last execution of chapters for this site ran {n} of them, {jobs} at a "
        f"time: {wall:.0f} s of wall-clock time for {total:.0f} s of chapter time, "
        f"a parallel efficiency of {efficiency:.0%} (chapter time over cores × wall "
        "time; 100% would keep every core busy until the end)."
    )
    goals = []
    if "book" in targets:
        book = targets["book"]
        verdict = "within" if wall <= book else "over"
        goals.append(
            f"every chapter executed in at most {book:.0f} s of wall-clock time "
            f"({verdict}: {wall:.0f} s, {wall / book:.1f}× the target)"
        )
    if "page" in targets and longest is not None:
        page = targets["page"]
        verdict = "within" if longest[1] <= page else "over"
        goals.append(
            f"no page longer than {page:.0f} s ({verdict}: the longest, "
            f"{longest[0]}, took {longest[1]:.0f} s)"
        )
    if goals:
        text += " The build's own targets on two cores: " + "; ".join(goals) + "."
    speed = run.get("gflops")
    if speed:
        text += (
            " The machine's speed, a 1024 × 1024 matrix product on one otherwise idle "
            f"core: {speed[0]:.0f} GFLOP/s before the chapters and {speed[-1]:.0f} "
            "after. It does not see what slows a core while both run chapters, so on "
            "a shared machine the times vary more than it does."
        )
    return nodes.paragraph("", text)


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
# words after which a full stop does not end a sentence
_ABBREVIATIONS = {
    "fig",
    "figs",
    "eq",
    "eqs",
    "al",
    "vs",
    "cf",
    "e.g",
    "i.e",
    "ch",
    "sec",
}


def first_sentence(text: str, limit: int = 300) -> str:
    """The first sentence of a caption (an abbreviation such as "Fig." or "et al."
    does not end it), on one line, at most ``limit`` characters."""
    text = " ".join(text.split())
    end = len(text)
    for match in _SENTENCE_END.finditer(text):
        word = text[: match.start()].rsplit(" ", 1)[-1].lower()
        if match.group() == "." and (
            word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())
        ):
            continue
        end = match.end()
        break
    sentence = text[:end]
    if len(sentence) > limit:
        sentence = sentence[: limit - 1].rsplit(" ", 1)[0] + "…"
    return sentence


def _lazy_images(doctree) -> None:
    """A chapter's figures load when they come near the screen (the browser's lazy
    loading), so that the page is ready before the figures far below it arrive."""
    for image in doctree.findall(nodes.image):
        image.setdefault("loading", "lazy")


def _figure_alt_text(doctree) -> int:
    """Every image of a captioned figure whose alt text is missing or its file path
    gets its caption's first sentence as alt text, its formulas left out (a screen
    reader, or a reader whose image did not load, reads what the figure shows, not
    "../_images/…png")."""
    changed = 0
    for figure in doctree.findall(nodes.figure):
        caption = next(iter(figure.findall(nodes.caption)), None)
        if caption is None or not caption.astext().strip():
            continue
        # the words, not the TeX source of the caption's formulas
        words = "".join(
            str(t)
            for t in caption.findall(nodes.Text)
            if not isinstance(t.parent, nodes.math)
        )
        alt = first_sentence(re.sub(r"\s+([,.;:)])", r"\1", words))
        for image in figure.findall(nodes.image):
            current = (image.get("alt") or "").strip()
            uri = str(image.get("uri", ""))
            if not current or current == uri or current.endswith(Path(uri).name):
                image["alt"] = alt
                changed += 1
    return changed


_EXERCISE_WORD = re.compile(r"\b[Ee]xercise\s*$")


def _one_word_exercise(doctree) -> int:
    """A reference to an exercise reads "Exercise 1.3" (sphinx-exercise's text), so
    "see exercise {ref}`label`" would read "see exercise Exercise 1.3": the word before
    the reference goes (a sentence that opens with it keeps the reference's capital)."""
    changed = 0
    for ref in list(doctree.findall(nodes.reference)):
        if not ref.astext().startswith("Exercise "):
            continue
        parent = ref.parent
        if parent is None:
            continue
        index = parent.index(ref) - 1
        # MyST makes a line break its own text node: step over blank ones
        while (
            index >= 0
            and isinstance(parent[index], nodes.Text)
            and not str(parent[index]).strip()
        ):
            index -= 1
        if index < 0 or not isinstance(parent[index], nodes.Text):
            continue
        before = str(parent[index])
        trimmed = _EXERCISE_WORD.sub("", before)
        if trimmed != before:
            parent[index] = nodes.Text(trimmed)
            changed += 1
    return changed


def _resolve_pages(app, doctree, fromdocname):
    for node in list(doctree.findall(downloads_placeholder)):
        node.replace_self(_downloads_list(app, fromdocname))
    for node in list(doctree.findall(runtimes_placeholder)):
        node.replace_self(_runtimes(app, node, fromdocname))
    if _is_chapter(app.env, fromdocname):
        _claims_outputs(app, doctree, fromdocname)
        _run_this_chapter(app, doctree, fromdocname)
        _lazy_images(doctree)
    _fold_repro_notes(doctree)
    _figure_alt_text(doctree)
    _one_word_exercise(doctree)


def _single_page_handlers(app):
    """The single-page HTML builder (``make pdf``) draws every node the HTML builder
    draws: an extension that registers visitors for "singlehtml" stops Sphinx from
    falling back to the "html" ones (sphinx-proof's theorems, for one)."""
    if app.builder.name != "singlehtml":
        return
    handlers = app.registry.translation_handlers
    single = handlers.setdefault("singlehtml", {})
    for node, visitors in handlers.get("html", {}).items():
        single.setdefault(node, visitors)
    # the one page has every chapter's math and widgets, but Sphinx and myst-nb add
    # MathJax and the widget manager only to a page whose own source has them
    app.set_html_assets_policy("always")
    # and every formula typeset before printing, not when it comes near the screen
    config = dict(app.config.mathjax3_config or {})
    config.pop("loader", None)
    app.config.mathjax3_config = config
    for path, attributes in (app.config.nb_ipywidgets_js or {}).items():
        app.add_js_file(path, **attributes)


def setup(app):
    app.connect("config-inited", _buttons_only_with_a_repository)
    # a tap on a figure opens it at full size (assets/fmlab-figures.js)
    app.add_js_file("fmlab-figures.js", loading_method="defer")
    app.connect("builder-inited", _single_page_handlers)
    app.add_node(claims_index_placeholder)
    app.add_directive("fmlab-claims-index", ClaimsIndexDirective)
    app.add_node(ledger_placeholder)
    app.add_directive("fmlab-ledger", LedgerDirective)
    app.add_node(repro_notes_placeholder)
    app.add_directive("fmlab-repro-notes", ReproNotesDirective)
    app.connect("env-check-consistency", _check_registry)
    app.connect("doctree-read", _collect)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-get-outdated", _always_outdated)
    app.connect("doctree-resolved", _resolve)
    app.connect("build-finished", _write_json)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.connect("html-page-context", _download_menu, priority=600)
    app.connect("html-page-context", _one_tab_title)
    app.add_node(downloads_placeholder)
    app.add_directive("fmlab-downloads", DownloadsDirective)
    app.add_node(runtimes_placeholder)
    app.add_directive("fmlab-runtimes", RuntimesDirective)
    app.connect("doctree-resolved", _resolve_pages)
    app.connect("build-finished", _publish, priority=900)
    app.connect("build-finished", _frames_to_files, priority=950)
    app.connect("build-finished", _drop_icon_script, priority=960)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 2}

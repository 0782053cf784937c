"""Bake an executed chapter's MyST references and glued values into its Markdown.

    python scripts/bake_notebooks.py SRC DEST [--lab]

The chapters are MyST notebooks: their text pastes numbers computed by their code
(``{glue:text}`key```), cites ``references.bib`` (``{cite:t}``) and refers to other
pages, sections, figures, equations, theorems and exercises (``{doc}``, ``{ref}``,
``{numref}``, ``{eq}``, ``{prf:ref}``). Only the book's build resolves these; opened in
Jupyter, every one of them shows as its raw key ("the accuracy goes from ch6_bayes_k3").
This script rewrites the Markdown cells of executed notebooks so that they read as the
book's pages do:

- a glued value becomes its text, formatted as on the page, taken from the notebook's
  own outputs (``myst_nb.glue`` stores it in an output whose metadata ``scrapbook``
  names the key);
- a citation becomes "Xie et al. (2022)" (``{cite:t}``) or "(Xie et al., 2022)"
  (``{cite:p}``), from ``references.bib``;
- a reference becomes the text the book shows, with the book's numbers: a page's or a
  section's title, "Fig. 6.2", "Theorem 6.1", "Exercise 6.3", "(6.4)". The numbers are
  computed from the table of contents as Sphinx assigns them (``numfig``): per chapter,
  one counter per kind, in reading order across the chapter's pages. A reference to
  another chapter page links to its notebook (``06b-icl-transformer.ipynb``, beside
  this one);
- the target lines ``(label)=`` are dropped, a gated solution (``solution-start`` and
  ``solution-end``, which span cells) becomes a line "Solution to Exercise 6.3", the
  book's own directives (``{fmlab-repro-notes}``: only the build can fill them) a line
  that points to the book's page, and a Markdown cell left empty is removed.

Code cells and their outputs are not touched (but for ``--lab``'s first frames,
below), so nbval (which compares code cells' outputs) and a rerun of the notebook see
the notebook as executed. Directives (definitions, theorems, proofs, exercises) and
labelled equations stay MyST: JupyterLab renders them with the ``jupyterlab-myst``
extension. ``scripts/execute_chapters.py``
bakes every chapter it exports to ``_build/executed`` (what nbval compares), and
``scripts/build_downloads.py`` bakes those again with ``--lab``: the notebooks the
site offers as each chapter's ".ipynb (executed)" download, numbered as the book.

``--lab`` (``make lab``, into ``_build/lab``) also prepares a notebook for JupyterLab
with ``jupyterlab-myst``: front matter in the first cell numbers its definitions,
theorems, exercises and equations as the book does ("Theorem 6.1", "(6.4)");
unlabelled equations and proofs are unnumbered, as in the book; each figure's numbered
caption follows it as a Markdown cell; each slider figure's output carries its first
frame as a PNG, shown until the chapter runs (JupyterLab restores no widget state in a
notebook it does not trust); the code cells that the book folds
(``hide-input``) are folded, and those it removes (``remove-cell``) are folded with
their outputs.
"""

import argparse
import ast
import codecs
import copy
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]

# {role}`content`
ROLE = re.compile(r"\{(?P<role>[a-z]+(?::[a-z]+)?)\}`(?P<body>[^`]*)`")
# `text <target>`: a reference with explicit text
EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
# a target line: (label)=
TARGET = re.compile(r"^\((?P<label>[^()\s]+)\)=[ \t]*\n?", re.M)
# a directive's opening fence, ```{name} argument
DIRECTIVE = re.compile(
    r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[a-zA-Z][\w:-]*)\}[ \t]*(?P<arg>[^\n]*)$", re.M
)
OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>[^\n]*)$")
# display math at the start of a line, with an optional label: $$ ... $$ (label)
DISPLAY_MATH = re.compile(
    r"^(?P<indent>[ \t]*)\$\$(?P<body>.+?)\$\$(?:[ \t]*\((?P<label>[^()\s]+)\))?",
    re.M | re.S,
)
MARKDOWN_SPECIAL = re.compile(r"[\\`*_$<>\[\]]")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<title>.+?)[ \t]*#*[ \t]*$")

# Sphinx's names of the numbered kinds (and jupyterlab-myst's, for the front matter)
FIGURE, EQUATION, EXERCISE = "figure", "displaymath", "exercise"
MYST_KIND = {FIGURE: "figure", EQUATION: "equation", EXERCISE: "exercise"}
# Sphinx's default numfig_format, which the book keeps
NUMFIG_FORMAT = {FIGURE: "Fig. %s", "section": "Section %s"}


def _warn(message: str) -> None:
    print(f"bake_notebooks: warning: {message}", file=sys.stderr)


# --- the bibliography -----------------------------------------------------------------


def _latex_text(s: str) -> str:
    """BibTeX text without LaTeX: accents decoded, braces dropped."""
    try:
        s = codecs.decode(s, "ulatex")
    except Exception:  # an odd accent: keep the text as it is
        pass
    return s.replace("{", "").replace("}", "").strip()


def load_bibliography(path: Path = ROOT / "references.bib") -> dict[str, tuple]:
    """Each entry's key: (the authors' last names, et al. or not, the year)."""
    import latexcodec  # noqa: F401 - registers the "ulatex" codec
    from pybtex.database import parse_file

    entries = {}
    for key, entry in parse_file(str(path), bib_format="bibtex").entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [
            _latex_text(" ".join(p.prelast_names + p.last_names))
            for p in people
            if str(p) != "others"
        ]
        others = any(str(p) == "others" for p in people)
        year = _latex_text(entry.fields.get("year", "n.d."))
        entries[key] = (names or [key], others, year)
    return entries


def _authors(names: list[str], others: bool) -> str:
    if len(names) >= 3 or (others and names):
        return f"{names[0]} et al."
    return " and ".join(names)


def cite(keys: list[str], textual: bool, bib: dict[str, tuple]) -> str:
    """``{cite:t}``: "Xie et al. (2022)"; ``{cite:p}``: "(Xie et al., 2022)"."""
    parts = []
    for key in keys:
        if key not in bib:
            _warn(f"no entry {key!r} in references.bib")
            parts.append((key, "n.d."))
            continue
        names, others, year = bib[key]
        parts.append((_authors(names, others), year))
    if textual:
        return ", ".join(f"{a} ({y})" for a, y in parts)
    return "(" + "; ".join(f"{a}, {y}" for a, y in parts) + ")"


# --- the book: pages, labels and numbers ----------------------------------------------


@dataclass
class Target:
    doc: str  # the page, e.g. "notebooks/06-in-context-learning"
    kind: str  # "doc", "section", "figure", "displaymath", "exercise", "theorem", ...
    title: str = ""  # a page's or section's title, a directive's title, a caption
    number: tuple[int, ...] = ()  # the book's number, e.g. (6, 2)


@dataclass
class Book:
    """Every page of the table of contents, every label in it, and its numbers."""

    root: Path
    docs: dict[str, Target] = field(default_factory=dict)
    labels: dict[str, Target] = field(default_factory=dict)
    # the first number of each kind on a chapter's page (for jupyterlab-myst)
    starts: dict[str, dict[str, int]] = field(default_factory=dict)
    # the chapter number of a chapter's page
    chapter: dict[str, int] = field(default_factory=dict)
    bib: dict[str, tuple] = field(default_factory=dict)

    def number_text(self, target: Target) -> str:
        return ".".join(map(str, target.number))


def _toc_pages(root: Path) -> list[tuple[str, bool, int]]:
    """(page, numbered, top-level index) in reading order; a page nested under a
    chapter shares that chapter's index."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    pages = [(toc["root"], False, 0)]
    chapter = 0

    def walk(entries, numbered, top):
        nonlocal chapter
        for e in entries or []:
            index = top
            if "file" in e:
                if top is None and numbered:
                    chapter += 1
                    index = chapter
                pages.append((e["file"], numbered, index or 0))
            walk(e.get("sections"), numbered, index)
            walk(e.get("chapters"), numbered, index)

    for part in toc.get("parts", []):
        walk(part.get("chapters"), bool(part.get("numbered")), None)
    walk(toc.get("chapters"), False, None)
    return [(p.removesuffix(".md").removesuffix(".ipynb"), n, c) for p, n, c in pages]


def _page_cells(root: Path, doc: str, pages: Path | None = None) -> list[dict]:
    """A page as cells: (type, source, metadata); a Markdown page is one cell. A
    notebook is read from ``pages`` (the executed chapters) where it is there."""
    nb_path = root / f"{doc}.ipynb"
    if pages is not None and (pages / nb_path.name).exists():
        nb_path = pages / nb_path.name
    if nb_path.exists():
        nb = nbformat.read(str(nb_path), as_version=4)
        return [
            {"type": c.cell_type, "source": c.source, "metadata": c.metadata}
            for c in nb.cells
        ]
    md_path = root / f"{doc}.md"
    if md_path.exists():
        return [{"type": "markdown", "source": md_path.read_text(), "metadata": {}}]
    return []


def _directive_options(text: str, start: int) -> dict[str, str]:
    """The ``:key: value`` lines right after a directive's opening line."""
    options = {}
    for line in text[start:].lstrip("\n").split("\n"):
        m = OPTION.match(line.strip())
        if not m:
            break
        options[m["key"]] = m["value"].strip()
    return options


def _numbered_kind(name: str, options: dict) -> str | None:
    """The Sphinx counter of a directive, or None if it is not numbered."""
    if "nonumber" in options:
        return None
    if name.startswith("prf:") and name != "prf:proof":
        return name.removeprefix("prf:")
    if name in ("exercise", "exercise-start"):
        return EXERCISE
    return None


def _markdown_items(text: str):
    """(position, kind, label, title, options) of the numbered or labelled things in
    a Markdown text, in reading order: target lines, directives, labelled equations."""
    items = []
    for m in TARGET.finditer(text):
        rest = text[m.end() :].lstrip("\n").split("\n", 1)[0]
        h = HEADING.match(rest)
        items.append((m.start(), "section", m["label"], h["title"] if h else "", {}))
    for m in DIRECTIVE.finditer(text):
        options = _directive_options(text, m.end())
        kind = _numbered_kind(m["name"], options) or f"directive:{m['name']}"
        items.append((m.start(), kind, options.get("label"), m["arg"].strip(), options))
    for m in DISPLAY_MATH.finditer(text):
        if m["label"]:
            items.append((m.start(), EQUATION, m["label"], "", {}))
    return sorted(items, key=lambda item: item[0])


def load_book(root: Path = ROOT, pages: Path | None = None) -> Book:
    """Read the table of contents and every page it lists; a chapter from the folder
    ``pages`` where it is there (the executed chapters being baked, so that their
    numbers are those of the text they were executed with)."""
    book = Book(root=root, bib=load_bibliography(root / "references.bib"))
    counters: dict[int, dict[str, int]] = {}
    for doc, numbered, chapter in _toc_pages(root):
        cells = _page_cells(root, doc, pages)
        title = ""
        for cell in cells:
            if cell["type"] == "markdown":
                for line in cell["source"].split("\n"):
                    h = HEADING.match(line)
                    if h and line.startswith("# "):
                        title = h["title"]
                        break
            if title:
                break
        book.docs[doc] = Target(doc, "doc", title, (chapter,) if numbered else ())
        counter = counters.setdefault(chapter if numbered else 0, {})
        if numbered:
            book.chapter[doc] = chapter
            book.starts[doc] = {}

        def number(kind: str) -> tuple[int, ...]:
            counter[kind] = counter.get(kind, 0) + 1
            if numbered:
                book.starts[doc].setdefault(kind, counter[kind])
                return (chapter, counter[kind])
            return (counter[kind],)

        for cell in cells:
            if cell["type"] == "code":
                fig = (cell["metadata"].get("mystnb") or {}).get("figure") or {}
                if fig.get("name"):
                    book.labels[fig["name"]] = Target(
                        doc, FIGURE, fig.get("caption", ""), number(FIGURE)
                    )
                continue
            if cell["type"] != "markdown":
                continue
            for _, kind, label, title, _opts in _markdown_items(cell["source"]):
                if kind == "section" or kind.startswith("directive:"):
                    if label:
                        book.labels[label] = Target(doc, kind, title)
                    continue
                target = Target(doc, kind, title, number(kind))
                if label:
                    book.labels[label] = target
        if numbered:  # a page's title is its chapter's or section's target
            book.docs[doc].number = (chapter,)
    # a section label on a page's first line names the page ("ch6" -> Chapter 6)
    for label, target in book.labels.items():
        if target.kind == "section" and target.title == book.docs[target.doc].title:
            target.number = book.docs[target.doc].number
    return book


# --- glued values ---------------------------------------------------------------------


def glue_values(nb) -> dict[str, dict]:
    """Every value glued by the notebook's code: key -> its MIME bundle."""
    data = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            meta = (output.get("metadata") or {}).get("scrapbook")
            if not meta:
                continue
            prefix = meta.get("mime_prefix", "")
            data[meta["name"]] = {
                mime[len(prefix) :]: value
                for mime, value in (output.get("data") or {}).items()
                if mime.startswith(prefix)
            }
    return data


def format_plain_text(text: str, fmt_spec: str) -> str:
    """A glued ``text/plain`` value as ``{glue:text}`` shows it (myst-nb's rule: the
    literal's value, formatted with the format spec if one is given)."""
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if fmt_spec == "":
        return str(value)
    kind = fmt_spec[-1]
    if kind == "s":
        value = str(value)
    elif kind in "bcdoxX":
        value = int(value)
    elif kind in "eEfFgGn%":
        value = float(value)
    return format(value, fmt_spec)


# --- baking ---------------------------------------------------------------------------


@dataclass
class _Page:
    book: Book
    doc: str
    glue: dict[str, dict]
    lab: bool
    missing: list[str] = field(default_factory=list)


def _resolve_doc(page: _Page, target: str) -> str:
    base = Path(page.doc).parent
    path = Path(target.lstrip("/")) if target.startswith("/") else base / target
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            parts = parts[:-1]
        elif part != ".":
            parts.append(part)
    return "/".join(parts).removesuffix(".md").removesuffix(".ipynb")


def _link(page: _Page, text: str, doc: str) -> str:
    """A reference to another chapter page: a link to its notebook, beside this one
    (in ``_build/executed``, in ``_build/lab``, or where a reader saved both)."""
    if doc != page.doc and (page.book.root / f"{doc}.ipynb").exists():
        if Path(doc).parent == Path(page.doc).parent:
            return f"[{text}]({Path(doc).name}.ipynb)"
    return text


def _glue(page: _Page, role: str, body: str) -> str:
    key, fmt = body, ""
    if role == "glue:text" and ":" in body:
        key, fmt = body.rsplit(":", 1)
    elif role == "glue:md" and ":" in body:
        key = body.rsplit(":", 1)[0]
    data = page.glue.get(key.strip())
    if data is None:
        page.missing.append(key)
        return f"`{key}`"
    if role == "glue:md" or (role in ("glue", "glue:any") and "text/markdown" in data):
        if "text/markdown" in data:
            return str(data["text/markdown"]).strip()
    if role in ("glue", "glue:any") and "text/latex" in data:
        return str(data["text/latex"]).strip()
    if "text/plain" not in data:
        page.missing.append(key)
        return f"`{key}`"
    text = format_plain_text(
        str(data["text/plain"]), fmt if role == "glue:text" else ""
    )
    return MARKDOWN_SPECIAL.sub(r"\\\g<0>", text)  # pasted as text, not as Markdown


def _kind_name(kind: str) -> str:
    if kind == EXERCISE:
        return "Exercise"
    return kind.replace("-", " ").title()


def _reference(page: _Page, role: str, body: str) -> str:
    m = EXPLICIT.match(body)
    text, target = (m["text"], m["target"].strip()) if m else (None, body.strip())
    book = page.book
    if role == "doc":
        doc = _resolve_doc(page, target)
        info = book.docs.get(doc)
        if info is None:
            _warn(f"{page.doc}: no page {target!r}")
        return _link(page, text or (info.title if info else target), doc)
    label = target.lower() if role == "ref" else target
    info = book.labels.get(label) or book.labels.get(target)
    if info is None:
        _warn(f"{page.doc}: no label {target!r} ({{{role}}})")
        return text or target
    number = book.number_text(info)
    if role == "eq":
        return text or f"({number})"
    if role == "numref":
        fmt = text or NUMFIG_FORMAT.get(info.kind, "%s")
        return fmt.replace("%s", number).replace("{number}", number)
    if role == "prf:ref":
        return text or f"{_kind_name(info.kind)} {number}".strip()
    # {ref}: a section's title, a figure's caption, a directive's title or number
    if text:
        return _link(page, text, info.doc) if info.kind == "section" else text
    if info.kind == "section":
        return _link(page, info.title or target, info.doc)
    if info.kind == FIGURE:
        return info.title or f"Fig. {number}"
    if info.title:
        return info.title
    return f"{_kind_name(info.kind)} {number}".strip()


def _bake_text(page: _Page, text: str) -> str:
    def role(m: re.Match) -> str:
        name, body = m["role"], m["body"]
        if name.startswith("glue"):
            return _glue(page, name, body)
        if name in ("cite", "cite:p", "cite:t"):
            keys = [k.strip() for k in body.split(",") if k.strip()]
            return cite(keys, name == "cite:t", page.book.bib)
        if name in ("doc", "ref", "numref", "eq", "prf:ref"):
            return _reference(page, name, body)
        return m.group(0)  # a role Jupyter renders itself ({math}, ...) or unknown

    text = TARGET.sub("", text)
    return ROLE.sub(role, text)


def _gated_solution(page: _Page, text: str) -> str:
    """A gated solution's opening (in a cell of its own) -> "Solution to Exercise N";
    its closing -> nothing."""

    def replace(m: re.Match) -> str:
        name = m["name"]
        if name == "solution-end":
            return ""
        info = page.book.labels.get(m["arg"].strip())
        what = (
            f"Exercise {page.book.number_text(info)}" if info else "the exercise above"
        )
        return f"**Solution to {what}**"

    block = re.compile(
        r"^(?P<fence>`{3,}|:{3,})\{(?P<name>solution-start|solution-end)\}[ \t]*"
        r"(?P<arg>[^\n]*)\n(?:[ \t]*:[\w-]+:[^\n]*\n)*[ \t]*(?P=fence)[ \t]*$",
        re.M,
    )
    return block.sub(replace, text)


BUILD_ONLY = re.compile(
    r"^(?P<fence>`{3,}|:{3,})\{(?P<name>fmlab-[\w-]+)\}[^\n]*\n(?:.*?\n)??"
    r"[ \t]*(?P=fence)[ \t]*$",
    re.M | re.S,
)


# "see exercise {ref}`label`": the reference's text is "Exercise 1.3" itself
DOUBLED_EXERCISE = re.compile(r"\b[Ee]xercise\s+(\[?)Exercise\b")


def _one_word_exercise(text: str) -> str:
    """ "(exercise Exercise 1.3)" reads "(Exercise 1.3)", as on the book's pages."""
    return DOUBLED_EXERCISE.sub(r"\1Exercise", text)


def _build_only(text: str) -> str:
    """The book's own directives (``{fmlab-repro-notes}``, ...; book/_ext), which only
    its build can fill, become a line that points to the page."""
    note = "*(Computed when the book is built: see this chapter's page in the book.)*"
    return BUILD_ONLY.sub(note, text)


def _lab_markdown(text: str) -> str:
    """For jupyterlab-myst: unlabelled display equations and proofs unnumbered, as in
    the book (it numbers neither)."""

    def math(m: re.Match) -> str:
        if m["label"] or "\\begin{equation" in m["body"]:
            return m.group(0)
        body = m["body"].strip("\n")
        return (
            f"{m['indent']}$$\n\\begin{{equation*}}\n{body}\n\\end{{equation*}}\n"
            f"{m['indent']}$$"
        )

    def proof(m: re.Match) -> str:
        if m["name"] != "prf:proof":
            return m.group(0)
        options = _directive_options(m.string, m.end())
        return m.group(0) if "nonumber" in options else m.group(0) + "\n:nonumber:"

    return DIRECTIVE.sub(proof, DISPLAY_MATH.sub(math, text))


def _front_matter(book: Book, doc: str) -> str:
    """jupyterlab-myst's numbering of this page: the chapter's prefix ("6.%s") and the
    first number of each kind, so that it shows the book's numbers."""
    if doc not in book.chapter:
        return ""
    numbering: dict[str, object] = {"enumerator": f"{book.chapter[doc]}.%s"}
    for kind, start in sorted(book.starts[doc].items()):
        name = MYST_KIND.get(kind, f"proof:{kind}")
        numbering[name] = {"start": start}
    return "---\n" + yaml.safe_dump({"numbering": numbering}, sort_keys=False) + "---\n"


def _has_caption_after(cells: list, cell) -> bool:
    """Whether the cell after a figure's cell is already its caption (a notebook baked
    for JupyterLab once)."""
    index = next(i for i, c in enumerate(cells) if c is cell)
    following = cells[index + 1] if index + 1 < len(cells) else None
    return bool(
        following is not None
        and following.cell_type == "markdown"
        and following.source.startswith("**Fig. ")
    )


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def first_frame(models: dict, model_id: str) -> str | None:
    """The base64 PNG a slider figure (``fmlab.slider_figure``) shows before its slider
    moves: the first image in the view's children, a stack followed only into its
    selected child; None when the view has no PNG image."""
    model = models.get(model_id)
    if model is None:
        return None
    state = model.get("state", {})
    if model.get("model_name") == "ImageModel":
        if state.get("format", "png") != "png":
            return None
        for buf in model.get("buffers", []):
            if buf.get("path") == ["value"] and buf.get("encoding") == "base64":
                return buf["data"]
        return None
    children = [str(c).removeprefix("IPY_MODEL_") for c in state.get("children", [])]
    if model.get("model_name") == "StackModel":
        index = state.get("selected_index")
        children = [] if index is None else children[index : index + 1]
    for child in children:
        frame = first_frame(models, child)
        if frame:
            return frame
    return None


def _slider_frames(nb) -> int:
    """Each slider figure's output also carries its first frame as a PNG. JupyterLab
    restores no widget state in a notebook it does not trust (a downloaded one), and
    then shows the richest safe type of the output: the frame, not a line of
    ``VBox(children=(…``. Run, the cell draws the live slider in its place."""
    models = ((nb.metadata.get("widgets") or {}).get(WIDGET_STATE) or {}).get(
        "state"
    ) or {}
    added = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = output.get("data") or {}
            if WIDGET_VIEW not in data or "image/png" in data:
                continue
            frame = first_frame(models, data[WIDGET_VIEW].get("model_id", ""))
            if frame:
                data["image/png"] = frame
                added += 1
    return added


def bake_notebook(nb, book: Book, doc: str, lab: bool = False):
    """A copy of the executed notebook ``nb`` (the page ``doc`` of ``book``, e.g.
    ``notebooks/06-in-context-learning``), its Markdown baked (see the module's
    docstring); ``lab=True`` also prepares it for JupyterLab with jupyterlab-myst."""
    nb = copy.deepcopy(nb)
    page = _Page(book, doc, glue_values(nb), lab)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            text = _build_only(_gated_solution(page, cell.source))
            text = _one_word_exercise(_bake_text(page, text))
            if lab:
                text = _lab_markdown(text)
            if not text.strip():
                continue
            cell.source = text.strip("\n")
            cells.append(cell)
            continue
        cells.append(cell)
        if not lab or cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        jupyter = cell.metadata.setdefault("jupyter", {})
        if "hide-input" in tags or "remove-input" in tags or "remove-cell" in tags:
            jupyter["source_hidden"] = True
        if "remove-cell" in tags or "remove-output" in tags:
            jupyter["outputs_hidden"] = True
        if not jupyter:
            del cell.metadata["jupyter"]
        figure = (cell.metadata.get("mystnb") or {}).get("figure") or {}
        target = book.labels.get(figure.get("name", ""))
        if target is not None and not _has_caption_after(nb.cells, cell):
            caption = _bake_text(page, figure.get("caption", ""))
            number = book.number_text(target)
            note = nbformat.v4.new_markdown_cell(f"**Fig. {number}.** {caption}")
            if cell.get("id"):  # the same id at every bake
                note.id = f"{cell.id}-caption"[:64]
            cells.append(note)
    nb.cells = cells
    if lab:
        _slider_frames(nb)
    first = nb.cells[0] if nb.cells else None
    if lab and first and first.cell_type == "markdown":
        if not first.source.startswith("---\nnumbering:"):  # not baked for lab yet
            first.source = _front_matter(book, doc) + first.source
    if page.missing:
        _warn(f"{doc}: no glued value for {sorted(set(page.missing))}")
    return nb


def bake_folder(src: Path, dest: Path, lab: bool = False, book: Book | None = None):
    """Bake every chapter notebook of ``src`` into ``dest`` (the same names); return
    the paths written."""
    book = book or load_book(ROOT, pages=src)
    by_name = {Path(doc).name: doc for doc in book.docs}
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(src.glob("*.ipynb")):
        doc = by_name.get(path.stem)
        if doc is None:
            _warn(f"{path.name} is not a page of the table of contents; skipped")
            continue
        nb = nbformat.read(str(path), as_version=4)
        out = dest / path.name
        nbformat.write(bake_notebook(nb, book, doc, lab=lab), str(out))
        written.append(out)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="a folder of executed chapters")
    parser.add_argument("dest", type=Path, help="where to write the baked chapters")
    parser.add_argument(
        "--lab", action="store_true", help="also prepare them for jupyterlab-myst"
    )
    args = parser.parse_args(argv)
    if not any(args.src.glob("*.ipynb")):
        print(f"bake_notebooks: no notebook in {args.src}", file=sys.stderr)
        return 1
    written = bake_folder(args.src, args.dest, lab=args.lab)
    print(f"bake_notebooks: {len(written)} notebooks baked into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

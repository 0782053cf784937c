"""The running text of a page reads as a textbook's (issue 51).

- **Results as tables and figures, words for what they mean.** A paragraph of running
  text (markdown before ``## Reproduction notes``; a bullet item counts as a paragraph;
  tables, headings, math and code blocks are not running text) carries at most
  :data:`MAX_GLUED` glued quantities (``{glue:text}`` / ``{glue:}`` roles). More than
  that is a result narrated as a list of numbers: the numbers go into a glued table or
  the figure the paragraph describes, and the paragraph says what they show.
- **One notation page that cites what exists.** Every label the notation page cites
  (``{ref}``, ``{prf:ref}``, ``{eq}``, ``{numref}``) is defined on a page of the book,
  every section it names in words is a heading of that chapter's pages, and every
  symbol the book renamed to keep one meaning is used on its page and listed there.

Pages whose text is being rewritten by another issue are on :data:`NOT_YET`, with the
reason; the lead removes them when their rewrite lands.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BOOK = ROOT / "book"

MAX_GLUED = 5
NOTES_HEADING = "## Reproduction notes"

NOT_YET: dict[str, str] = {}

GLUE = re.compile(r"\{glue(?::text|:md|:)?\}`[^`]+`")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
ITEM = re.compile(r"^\s*([*+-]|\d+\.)\s")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def running_text(path: Path) -> list[tuple[int, str]]:
    """(cell index, markdown) of the cells before ``## Reproduction notes``."""
    out = []
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        if NOTES_HEADING in text:
            out.append((i, text[: text.index(NOTES_HEADING)]))
            break
        out.append((i, text))
    return out


def paragraphs(markdown: str) -> list[str]:
    """The paragraphs of running text: blank lines and bullet items separate them;
    tables, headings, display math, code fences and directive options are dropped
    (the prose inside a directive, such as a theorem or an exercise, is kept)."""
    out, cur, in_code, in_math = [], [], False, False

    def flush():
        if cur:
            out.append("\n".join(cur))
            cur.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        fence = FENCE.match(line)
        if fence:
            flush()
            # a directive ({prf:theorem}, {exercise}...) holds prose; a plain fence or
            # a math/code directive does not
            opener = stripped.lstrip("`~")
            if in_code:
                in_code = False
            elif not opener.startswith("{") or opener.startswith(("{math", "{code")):
                in_code = bool(opener) or not in_code
            continue
        if in_code:
            continue
        if stripped.startswith("$$"):
            flush()
            in_math = not in_math if stripped.count("$$") == 1 else in_math
            continue
        if in_math:
            continue
        if (
            not stripped
            or stripped.startswith(("|", "#", ":"))
            or re.match(r"^\(.*\)=$", stripped)
        ):
            flush()
            continue
        if ITEM.match(line):
            flush()
        cur.append(line)
    flush()
    return out


def glued_per_paragraph(path: Path) -> list[tuple[int, int, str]]:
    """(cell index, number of glued quantities, paragraph) for each paragraph."""
    return [
        (i, len(GLUE.findall(p)), p)
        for i, md in running_text(path)
        for p in paragraphs(md)
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_paragraph_carries_few_glued_numbers(path):
    if path.stem in NOT_YET:
        pytest.xfail(NOT_YET[path.stem])
    heavy = [
        f"markdown cell {i}: {n} glued quantities in: {p[:80]!r}..."
        for i, n, p in glued_per_paragraph(path)
        if n > MAX_GLUED
    ]
    assert heavy == [], (
        f"paragraphs with more than {MAX_GLUED} glued numbers: put them in a glued "
        "table or the figure, and say in words what they show\n" + "\n".join(heavy)
    )


def test_the_allowlist_names_only_existing_pages():
    assert set(NOT_YET) <= {p.stem for p in NOTEBOOKS}


def test_the_counter_splits_paragraphs_and_items():
    md = (
        "One {glue:text}`a` and {glue:text}`b`.\n\n"
        "* item {glue:text}`c`\n* item {glue:text}`d` {glue:}`e`\n\n"
        "| {glue:text}`t1` | {glue:text}`t2` |\n\n"
        "```{prf:theorem} T\nA theorem {glue:text}`f`.\n```\n\n"
        "$$\nx = 1\n$$\n"
    )
    counts = [len(GLUE.findall(p)) for p in paragraphs(md)]
    assert counts == [2, 1, 2, 1]


# --- the notation page -------------------------------------------------------------

CITE = re.compile(r"\{(ref|prf:ref|eq|numref|doc)\}`(?:[^`<]*<)?([^`>]+)>?`")
LABEL_TARGET = re.compile(r"^\(([^)\s]+)\)=\s*$", re.M)
LABEL_OPTION = re.compile(r"^:label:\s*(\S+)", re.M)
EQ_LABEL = re.compile(r"\$\$\s*\(([^)\s]+)\)")


def book_labels() -> set[str]:
    """Every label defined on a page: targets, directive labels and equation labels."""
    texts = [
        "".join(c["source"])
        for nb in NOTEBOOKS
        for c in _cells(nb)
        if c["cell_type"] == "markdown"
    ]
    texts += [p.read_text(encoding="utf-8") for p in BOOK.glob("*.md")]
    labels = set()
    for t in texts:
        for rx in (LABEL_TARGET, LABEL_OPTION, EQ_LABEL):
            labels |= set(rx.findall(t))
    return labels


def test_every_section_the_notation_page_cites_exists():
    text = (BOOK / "notation.md").read_text(encoding="utf-8")
    labels = book_labels()
    pages = {p.stem for p in NOTEBOOKS} | {p.stem for p in BOOK.glob("*.md")}
    missing = []
    for role, target in CITE.findall(text):
        name = target.strip()
        if role == "doc":
            if Path(name).name not in pages:
                missing.append(f"{{doc}}`{name}`")
        elif name not in labels:
            missing.append(f"{{{role}}}`{name}`")
    assert missing == []


# Symbols renamed so that each has one meaning on its page (issue 51): the page uses
# the new name, and the notation page lists it.
RENAMED = {
    "a block of parameters, page 05 (B is the batch size)": (
        "05-implicit-bias",
        r"\\mathcal I",
    ),
    "the head's layer traces, page 05b (B is the batch size)": (
        "05b-same-loss",
        r"\\mathcal T_1",
    ),
    "the Rayleigh quotient, page 02 (Q is an orthogonal matrix)": (
        "02-interface",
        r"\\mathcal R\(\\zeta\)",
    ),
    "Xie et al.'s boundary constants (c is the concept)": (
        "06-in-context-learning",
        r"\\delta_1,\\dots,\\delta_4",
    ),
    "Xie et al.'s error terms (epsilon is the smoothing)": (
        "06-in-context-learning",
        r"\\xi\^c_\{\\text\{delim\}\}",
    ),
    "the eigenvalues omega_i of Sigma, page 01 (s is the labelling)": (
        "01-pretraining-and-adaptation",
        r"\\operatorname\{diag\}\(\\omega\)",
    ),
    "the augmentation's noise scales, page 02 (s is the spread, epsilon the excess)": (
        "02-interface",
        r"(?s)\\sigma\$.*\\sigma_\{\\text\{jitter\}\}",
    ),
    "the smallest eigenvalue kappa_min, page 03 (lambda is the ridge penalty)": (
        "03-lp-vs-ft",
        r"\\kappa_\{\\min\}\(\\Sigma_\{\\text\{ood\}\}\)",
    ),
    "the best accuracy q of the one-standard-error rule, page 03": (
        "03-lp-vs-ft",
        r"\$n_\{\\text\{val\}\}\$, \$q\$|q\(1-q\)/n_\{\\text\{val\}\}",
    ),
    "the cyclic orders pi_k and the emission noise nu, page 05b": (
        "05b-same-loss",
        r"(?s)cyclic orders? \$?\\pi_k.*emission noise",
    ),
    "the decoder's bias b and the largest width d_max, page 05c": (
        "05c-same-loss-transformer",
        r"(?s)z=D\\phi\+b.*m\s*=\s*d_\{\\max\}/d",
    ),
    "Chapter 4's filter argument tau": (
        None,
        r"Ch\. 4: the argument \$\\eta t\\kappa\$",
    ),
}


@pytest.mark.parametrize("what", RENAMED)
def test_a_renamed_symbol_is_used_and_listed(what):
    page, rx = RENAMED[what]
    assert re.search(rx, (BOOK / "notation.md").read_text(encoding="utf-8")), what
    if page is not None:
        text = "".join(
            "".join(c["source"]) for c in _cells(ROOT / "notebooks" / f"{page}.ipynb")
        )
        assert re.search(rx, text), f"{what}: not on page {page}"


# Second meanings renamed away (issue 51): on each page a letter keeps the meaning of
# the source it follows, the other meaning takes a letter of its own, and the old use
# is gone from the page's text (markdown and the statements of its code cells).
RETIRED = {
    "c = E[y^2], page 01 (c is the hidden class)": (
        "01-pretraining-and-adaptation",
        r"c\s*=\s*\\mathbb\{E\}\[y\^2\]|\+\s*c\s*,",
    ),
    "the eigenvalues s_i of Sigma, page 01 (s is the labelling)": (
        "01-pretraining-and-adaptation",
        r"\\operatorname\{diag\}\(s\)|\(s_i\s*\+\s*\\lambda\)",
    ),
    "the augmentation width s, page 02 (s(f) is the spread)": (
        "02-interface",
        r"width \$s\$|\$s\$ controls|\(larger \$s\$\)|every \$s\$|\$s=0\.3\$"
        r"|grows with \$s\$|rises with \$s\$|smallest \$s\$|largest \$s\$",
    ),
    "the jitter epsilon = 0.1, page 02 (epsilon is the excess spectral loss)": (
        "02-interface",
        r"\\varepsilon\s*=\s*0\.1",
    ),
    "the representation phi_theta, page 02 (phi is the label leakage)": (
        "02-interface",
        r"\\phi_\\theta",
    ),
    "the accuracy p of the one-standard-error rule, page 03 (p is the dimension)": (
        "03-lp-vs-ft",
        r"p\(1-p\)|best accuracy\s+\$p\$",
    ),
    "the eigenvalue lambda_min, page 03 (lambda is the ridge penalty)": (
        "03-lp-vs-ft",
        r"\\lambda_\{?\\min",
    ),
    "the encoder's bias c in an exercise, page 03 (c is a class)": (
        "03-lp-vs-ft",
        r"Bx \+ c\)",
    ),
    "the class index c of the task's rule, page 03 (c is Kumar et al.'s constant)": (
        "03-lp-vs-ft",
        r"\\arg\\max_c",
    ),
    "the cyclic orders sigma_k, page 05b (sigma is the head's activation)": (
        "05b-same-loss",
        r"\\sigma_k",
    ),
    "the emission noise epsilon, page 05b (varepsilon is the tolerance)": (
        "05b-same-loss",
        r"\\epsilon",
    ),
    "the block summed out, twice in a row, page 05b": (
        "05b-same-loss",
        r"summed out\. Every coordinate",
    ),
    "the decoder's bias c, page 05c (c counts the copies)": (
        "05c-same-loss-transformer",
        r"D\\phi\s*\+\s*c\b|D @ phi \+ c|D \* phi \+ c"
        r"|\\partial\(D,c\)|\\nabla_\{D,c\}",
    ),
    "the query scale c, page 05c (c counts the copies)": (
        "05c-same-loss-transformer",
        r"queries of a head by \$c\$|c\\odot w",
    ),
    "the largest width D, page 05c (D is the decoder)": (
        "05c-same-loss-transformer",
        r"m = D/d|width \$D\$|\(D\+1\)|embedded at \$D\$",
    ),
    "machinery and a broken sentence in page 05c's running text": (
        "05c-same-loss-transformer",
        r"no several points|\n\nThe tests check each of these ratios",
    ),
}


def _page_text(page: str) -> str:
    return "".join(
        "".join(c["source"]) for c in _cells(ROOT / "notebooks" / f"{page}.ipynb")
    )


@pytest.mark.parametrize("what", RETIRED)
def test_a_retired_meaning_is_gone_from_its_page(what):
    page, rx = RETIRED[what]
    assert re.findall(rx, _page_text(page)) == [], what


# Xie et al.'s names that the book renamed on Chapter 6's pages: theta is a model's
# parameters (their concept is c), epsilon the smoothing (their error terms are xi).
XIE_OLD = re.compile(
    r"\\theta\^\\star|\\epsilon(\^\\theta)?_\{\\text\{(start|delim)\}\}"
)


@pytest.mark.parametrize("page", ["06-in-context-learning", "06b-icl-transformer"])
def test_chapter_6_writes_xies_symbols_as_the_book_does(page):
    text = "".join(
        "".join(c["source"])
        for c in _cells(ROOT / "notebooks" / f"{page}.ipynb")
        if c["cell_type"] == "markdown"
    )
    assert XIE_OLD.findall(text) == []


def _headings(stems) -> list[str]:
    out = []
    for nb in NOTEBOOKS:
        if nb.stem.split("-")[0] in stems:
            for c in _cells(nb):
                if c["cell_type"] == "markdown":
                    out += [
                        re.sub(r"^#+\s*", "", ln).lower()
                        for ln in "".join(c["source"]).splitlines()
                        if re.match(r"^#{1,4} ", ln)
                    ]
    return out


def cited_sections() -> list[tuple[str, str]]:
    """(chapter, section name) for every section that the chapter tables of the
    notation page cite in words, in their column "introduced" ("page 5b, The
    experiment", or a heading of the chapter's pages)."""
    text = (BOOK / "notation.md").read_text(encoding="utf-8")
    out = []
    for chapter, body in re.findall(
        r"^### Chapter (\d)\n(.*?)(?=^##|\Z)", text, re.M | re.S
    ):
        for line in body.splitlines():
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if not line.startswith("|") or len(cols) < 3 or set(cols[2]) <= {"-"}:
                continue
            if cols[2] == "introduced":
                continue
            words = re.sub(r"(eq\. )?\{[a-z:]+\}`[^`]*`", "", cols[2])
            for part in re.split(r"[;,]\s*(?=[A-Z(]|$)|,\s*$", words):
                part = re.sub(r"\((proof|remarks|the question)\)", "", part).strip(
                    " ,;"
                )
                if part:
                    out.append((chapter, part))
    return out


def test_every_section_the_notation_page_names_exists():
    missing = []
    for chapter, name in cited_sections():
        if re.fullmatch(r"page \d[a-z]?", name):  # a page, beside a cited label
            assert any(nb.stem.startswith(f"0{name[5:]}-") for nb in NOTEBOOKS), name
            continue
        m = re.match(r"page (\d[a-z]?), (.*)", name)
        stems = (
            {f"0{m.group(1)}"} if m else {f"0{chapter}", f"0{chapter}b", f"0{chapter}c"}
        )
        name = m.group(2) if m else re.sub(r"^Part [IV]+, ", "", name)
        if not any(h.startswith(name.lower()) for h in _headings(stems)):
            missing.append(f"Chapter {chapter}: {name!r}")
    assert missing == []

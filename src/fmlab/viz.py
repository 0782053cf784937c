"""The book's plot style and slider figures that work with and without a kernel.

:func:`slider_figure` renders a figure for every combination of parameter values
ahead of time and returns an ipywidgets layout in which each slider is linked, in the
browser (``ipywidgets.jslink``), to a ``Stack`` of images. In Jupyter the sliders are
live; in the static book the widget state stored at build time is enough, so moving a
slider switches images with no kernel and no Python.
"""

from __future__ import annotations

import functools
import html
import io
import itertools
import numbers
import os
from typing import Callable, Mapping, Sequence

import matplotlib.pyplot as plt

__all__ = [
    "use_style",
    "PALETTE",
    "COLUMN_PX",
    "FIGURE_PX",
    "drawing",
    "fig_to_png",
    "fit_to_column",
    "glue",
    "glue_figure",
    "glue_texts",
    "text_collisions",
    "render_png",
    "slider_figure",
    "table",
    "Table",
    "Tables",
]

#: Colours used for the same roles in every chapter (colour-blind safe, Okabe-Ito).
PALETTE = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "green": "#009E73",
    "red": "#D55E00",
    "purple": "#CC79A7",
    "sky": "#56B4E9",
    "yellow": "#F0E442",
    "black": "#000000",
}


#: The book's text column in CSS pixels (the article column of the rendered pages at a
#: 1280-px window). Every figure is drawn to this width, so that no page scales it down.
COLUMN_PX = 688
#: The width figures are drawn to, a little under the column so that rounding never
#: makes one wider than it.
FIGURE_PX = 680
#: CSS pixels per inch of figure: a 9-point label is shown 10 pixels high.
PX_PER_INCH = 80
#: PNGs carry this many pixels per CSS pixel, so that they are sharp on high-density
#: screens ("retina"); the page shows them at :data:`FIGURE_PX`.
PIXEL_RATIO = 2
#: No text of a figure is smaller than this (points): 9 pt is 10 px on the page.
MIN_FONT_PT = 9.0


def drawing() -> bool:
    """Whether figures are drawn: yes, unless ``FMLAB_DRAW=0``.

    ``make test`` sets it for nbval's re-execution of the chapters, which compares
    every text output with the built page and never an image (nbval leaves PNGs out of
    its comparison). There a figure shows its text line only, and a slider figure keeps
    its sliders but draws no frame. The build draws every figure, and its tests check
    the drawn ones (colliding labels, sizes, the browser test)."""
    return os.environ.get("FMLAB_DRAW", "1") != "0"


def use_style() -> None:
    """Apply the book's figure style (call once at the top of a chapter).

    Besides the rcParams (colours, fonts, grid), every figure the notebook shows is
    fitted to the text column when it is rendered: its width is set so that, with
    ``bbox_inches="tight"``, it is :data:`FIGURE_PX` CSS pixels wide (its height
    follows, less than proportionally, so that a wide row of panels does not become a
    flat strip); any text smaller than :data:`MIN_FONT_PT` is raised to it; a figure
    laid out by ``fig.tight_layout()`` is laid out again at its new size; and it is
    saved as a PNG with :data:`PIXEL_RATIO` pixels per CSS pixel, whose displayed
    width is stored in the output's metadata (the page shows it at exactly that
    width, sharp on high-density screens). :func:`fig_to_png` (slider frames) does
    the same.
    """
    plt.rcParams.update(
        {
            "figure.figsize": (FIGURE_PX / PX_PER_INCH, 3.8),
            "figure.dpi": PX_PER_INCH,
            "savefig.dpi": PX_PER_INCH * PIXEL_RATIO,
            "savefig.bbox": "tight",
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.fontsize": 9,
            "legend.frameon": False,
            "xtick.labelsize": 9,
            "ytick.labelsize": 9,
            "font.size": 10,
            "lines.linewidth": 1.8,
            "axes.prop_cycle": plt.cycler(color=list(PALETTE.values())),
        }
    )
    _remember_tight_layout()
    _share_mathtext_parses()
    _install_inline_formatter()


def _remember_tight_layout() -> None:
    """Make ``Figure.tight_layout`` remember its arguments on the figure, so that a
    figure resized to the column can be laid out again the way its author asked."""
    from matplotlib.figure import Figure

    if getattr(Figure.tight_layout, "_fmlab", False):
        return
    original = Figure.tight_layout

    def tight_layout(self, **kwargs):
        self._fmlab_tight_layout = dict(kwargs)
        return original(self, **kwargs)

    tight_layout._fmlab = True
    tight_layout.__doc__ = original.__doc__
    Figure.tight_layout = tight_layout


def _share_mathtext_parses() -> None:
    """Let every renderer share one cache of parsed math text.

    Matplotlib caches a parsed expression (``$10^{-3}$``, a tick label of a log axis)
    per parser, and every renderer has its own parser: each new figure, and each new
    size or resolution of one (fitting it to the column, saving it at 2x), parses
    every label again, which is most of the cost of drawing a slider figure's frames.
    The parse depends only on the expression, the resolution, the font and the
    parser's kind, so one cache keyed by those gives the same result, computed once.
    """
    from matplotlib.mathtext import MathTextParser

    if getattr(MathTextParser._parse_cached, "_fmlab", False):
        return
    parse = MathTextParser._parse_cached.__wrapped__  # the method under its lru_cache
    kinds = {}  # (parser class, output type) -> a parser of that kind

    @functools.lru_cache(maxsize=4096)
    def shared(kind, s, dpi, prop, antialiased, load_glyph_flags):
        return parse(kinds[kind], s, dpi, prop, antialiased, load_glyph_flags)

    def _parse_cached(self, s, dpi, prop, antialiased, load_glyph_flags):
        kind = (type(self), self._output_type)
        kinds.setdefault(kind, self)
        return shared(kind, s, dpi, prop, antialiased, load_glyph_flags)

    _parse_cached._fmlab = True
    MathTextParser._parse_cached = _parse_cached


def _install_inline_formatter() -> None:
    """Show figures in a notebook through :func:`_figure_png` (a 2x PNG with its
    display width), instead of the inline backend's 1x PNG."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    import matplotlib
    from matplotlib.figure import Figure

    backend = str(matplotlib.rcParams._get("backend") or "").lower()
    if "inline" in backend:
        # the inline backend registers its own PNG formatter when it is first loaded:
        # load it now, so that ours, registered after it, is the one that stays
        import matplotlib_inline.backend_inline  # noqa: F401
    formatters = shell.display_formatter.formatters
    for mime in ("image/svg+xml", "image/jpeg", "application/pdf"):
        formatters[mime].pop(Figure, None)
    formatters["image/png"].for_type(Figure, _figure_png)


def _figure_png(fig):
    """The display formatter of a figure: (base64 PNG, metadata with its width)."""
    import base64

    if not fig.axes and not fig.images and not fig.texts:
        return None  # an empty figure shows nothing, like the inline backend
    if not drawing():
        return None  # its text line only
    data, width = render_png(fig)
    return base64.b64encode(data).decode("ascii"), {"width": width}


def fit_to_column(fig, *, bbox: str | None = None) -> float:
    """Resize ``fig`` in place so that it is :data:`FIGURE_PX` CSS pixels wide when
    saved with :data:`PX_PER_INCH` (its tight bounding box with ``bbox="tight"``),
    after raising every text to at least :data:`MIN_FONT_PT` and letting the figure's
    own texts (``fig.text``) wrap at its edge. Returns the width it will have, in
    inches (more than the target only when some text cannot shrink to fit)."""
    return _fit(fig, bbox)[0]


def _fit(fig, bbox):
    """:func:`fit_to_column`'s work: the width in inches, and the box (inches) to
    save at the final size: the padded tight box it measured, or the whole figure."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        if text.get_fontsize() < MIN_FONT_PT:
            text.set_fontsize(MIN_FONT_PT)
    for text in fig.texts:
        text.set_wrap(True)
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = axis.get_ticklabels(which="both")
            if labels and min(t.get_fontsize() for t in labels) < MIN_FONT_PT:
                ax.tick_params(axis=name, which="both", labelsize=MIN_FONT_PT)
    tight = bbox if bbox is not None else plt.rcParams["savefig.bbox"]
    tight = tight == "tight"
    relayout = getattr(fig, "_fmlab_tight_layout", None)
    constrained = isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    target = FIGURE_PX / PX_PER_INCH
    w0, h0 = fig.get_size_inches()

    box = None

    def measure() -> float:
        nonlocal box
        if relayout is not None:
            fig.tight_layout(**relayout)
        if not tight:
            box = fig.bbox_inches.frozen()
            return box.width
        if constrained:
            fig.canvas.draw()
        box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(
            float(plt.rcParams["savefig.pad_inches"])
        )
        return box.width

    width = measure()
    seen = []  # (figure width, measured width) at the height fixed by the first resize
    for step in range(5):
        if abs(width - target) * PX_PER_INCH < 2:
            break
        w = fig.get_size_inches()[0]
        if step == 0:
            new_w = max(w * target / width, 1.0)
            # the height follows the width less than proportionally (square root),
            # so that a row of four panels squeezed to the column keeps some height
            fig.set_size_inches(new_w, h0 * (new_w / w0) ** 0.5)
        else:
            seen.append((w, width))
            if len(seen) < 2:
                new_w = w * target / width
            else:  # the secant through the last two sizes: text of fixed size adds
                (wa, ma), (wb, mb) = seen[-2:]  # a constant that the ratio ignores
                slope = (mb - ma) / (wb - wa) if wb != wa else 0.0
                if abs(mb - ma) * PX_PER_INCH < 2 or slope < 0.05:
                    break  # resizing no longer moves the width (axes of fixed aspect)
                new_w = min(max(wb + (target - mb) / slope, wb / 2), 2 * wb)
            fig.set_size_inches(max(new_w, 1.0), fig.get_size_inches()[1])
        width = measure()
    return width, box


def render_png(fig, *, bbox: str | None = None) -> tuple[bytes, int]:
    """``fig`` fitted to the column (:func:`fit_to_column`) as a 2x PNG, and the
    width in CSS pixels to show it at (at most :data:`FIGURE_PX`: a figure whose text
    would not let it shrink to the column is drawn at a smaller scale instead)."""
    import struct

    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    width, box = _fit(fig, bbox)
    scale = min(1.0, FIGURE_PX / (width * PX_PER_INCH))
    buf = io.BytesIO()
    # the box was measured at the fitted size: saving with it, rather than with
    # "tight", spares savefig a layout pass to find the same box. A figure laid out by
    # tight_layout keeps a placeholder layout engine that does nothing at draw time,
    # yet makes savefig draw the figure once more before saving: set it aside meanwhile
    engine = fig.get_layout_engine()
    if isinstance(engine, PlaceHolderLayoutEngine):
        fig._layout_engine = None
    try:
        fig.savefig(
            buf,
            format="png",
            dpi=PX_PER_INCH * PIXEL_RATIO * scale,
            bbox_inches=box,
        )
    finally:
        fig._layout_engine = engine
    if bbox is None or bbox == "tight":
        _warn_collisions(fig)
    data = buf.getvalue()
    pixels = struct.unpack(">I", data[16:20])[0]  # the PNG header's width
    return data, round(pixels / PIXEL_RATIO)


#: What a figure with colliding text writes to the notebook's stderr when it is shown;
#: tests/book/test_figures.py fails on any executed notebook that contains it.
COLLISION_MARK = "fmlab: text collides in a figure"


def _drawn_texts(fig) -> list:
    """Draw ``fig`` and return the text artists that put glyphs on the canvas (a tick
    label outside the axis' view is an artist too, but never drawn; a text of several
    lines reaches the renderer line by line, without its artist)."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.text import Text

    drawn, seen, calls = [], set(), [0]
    draw_text, draw = RendererAgg.draw_text, Text.draw

    def count(self, *args, **kwargs):
        calls[0] += 1
        return draw_text(self, *args, **kwargs)

    def record(self, renderer):
        before = calls[0]
        result = draw(self, renderer)
        if calls[0] > before and str(self.get_text()).strip() and id(self) not in seen:
            seen.add(id(self))
            drawn.append(self)
        return result

    RendererAgg.draw_text, Text.draw = count, record
    try:
        fig.canvas.draw()
    finally:
        RendererAgg.draw_text, Text.draw = draw_text, draw
    return drawn


def text_collisions(fig, *, tolerance: float = 1.0) -> list[str]:
    """The texts of ``fig`` that overlap one another as drawn: titles, axis and tick
    labels, annotations, figure texts, and each legend's box against any text outside
    it. Two boxes collide when they overlap by more than ``tolerance`` pixels in both
    directions (a glyph's box carries some blank space). Returns one line per
    collision; empty when the figure is clean."""
    from matplotlib.legend import Legend

    texts = _drawn_texts(fig)
    renderer = fig.canvas.get_renderer()
    legends = [lg for lg in fig.findobj(Legend) if lg.get_visible()]
    owner = {id(t): lg for lg in legends for t in lg.get_texts() + [lg.get_title()]}
    boxes = [
        (repr(t.get_text())[:40], t.get_window_extent(renderer), owner.get(id(t)))
        for t in texts
    ]
    boxes += [("legend", lg.get_window_extent(renderer), lg) for lg in legends]
    out = []
    for i, (name, box, group) in enumerate(boxes):
        for other, obox, ogroup in boxes[i + 1 :]:
            if group is not None and group is ogroup:
                continue  # two parts of one legend
            dx = min(box.x1, obox.x1) - max(box.x0, obox.x0)
            dy = min(box.y1, obox.y1) - max(box.y0, obox.y0)
            if dx > tolerance and dy > tolerance:
                out.append(f"{name} overlaps {other}")
    return out


def _warn_collisions(fig) -> None:
    import sys

    try:
        found = text_collisions(fig)
    except Exception as err:  # noqa: BLE001 - a check must not break a figure
        found = [f"could not be checked ({type(err).__name__}: {err})"]
    if found:
        title = fig.get_suptitle() or next(
            (ax.get_title() for ax in fig.axes if ax.get_title()), "untitled"
        )
        print(
            f"{COLLISION_MARK} ({title[:50]!r}): " + "; ".join(found[:6]),
            file=sys.stderr,
        )


def fig_to_png(fig) -> bytes:
    """PNG bytes of a matplotlib figure fitted to the column (2x pixels, shown at
    :data:`FIGURE_PX`); the figure is closed afterwards."""
    data, _ = render_png(fig)
    plt.close(fig)
    return data


#: The prefix of the MIME types of a value glued without being shown (myst-nb's).
GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, variable, display: bool = True) -> None:
    """Keep ``variable``'s display data in the cell's output under ``name``, for the
    book's ``{glue:...}`` roles and directives: the output of ``myst_nb.glue``, the
    same bytes, without importing myst-nb in the kernel. Its glue module imports
    nbformat, whose JSON-schema checkers compile a grammar (``rfc3987_syntax``) at
    import: 2-6 s for every chapter's kernel, for nothing a chapter uses. ``display``
    shows the value in the cell too."""
    from IPython.core.formatters import format_display_data
    from IPython.display import display as show

    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    bundle, metadata = format_display_data(variable)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = dict(name=name, mime_prefix=prefix)
    show({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)


def glue_texts(texts: Mapping[str, str]) -> None:
    """Keep each text of ``texts`` under its name, for ``{glue:text}`name``` in the
    prose (the numbers a page quotes, computed by the run)."""
    if not isinstance(texts, Mapping):
        raise TypeError(
            f"texts must be a mapping name -> text, got {type(texts).__name__}"
        )
    for name, text in texts.items():
        if not isinstance(name, str) or not isinstance(text, str):
            kind = type(text).__name__
            raise TypeError(f"texts must map names to strings; {name!r} maps to {kind}")
        glue(name, text, display=False)


def glue_figure(name: str, fig) -> None:
    """Keep ``fig`` under ``name`` for a numbered, captioned figure in the text, and
    close it (so that the cell does not also show it).

    In the notebook, the figure's cell ends with ``glue_figure("ch3-fig-ood", fig)``
    and a markdown cell places it, with its number and caption::

        ```{glue:figure} ch3-fig-ood
        :name: fig-ch3-ood

        The caption, which the prose cites as {numref}`fig-ch3-ood`.
        ```

    The figure is fitted to the column like every other (:func:`use_style`).
    """
    glue(name, fig, display=False)
    plt.close(fig)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def slider_figure(
    render: Callable[..., "plt.Figure"],
    params: Mapping[str, Sequence],
    *,
    labels: Mapping[str, str] | None = None,
    initial: Mapping[str, int] | None = None,
    readouts: Mapping[str, Sequence[str]] | None = None,
):
    """A figure with one slider per parameter, precomputed for the static book.

    Parameters
    ----------
    render : callable
        ``render(**values)`` returns a matplotlib Figure for one combination of values.
    params : mapping name -> sequence of values
        The values each slider steps through (at most 200 combinations in all).
    labels : mapping name -> str, optional
        Text shown before each slider (defaults to the parameter name).
    initial : mapping name -> int, optional
        Index of the value each slider starts at (default 0).
    readouts : mapping name -> sequence of str, optional
        What each slider shows beside it at each of its values (default: the value
        itself, e.g. ``0.03``). Give it when the values are not what the reader
        should read (``{"t_index": ["t = 0", "t = 1/2", ...]}``).

    Returns
    -------
    ipywidgets.VBox
        Sliders above nested ``Stack``s of ``Image`` widgets, linked in the browser.
    """
    import ipywidgets as w

    if not callable(render):
        raise TypeError("render must be callable")
    if not isinstance(params, Mapping) or not params:
        raise ValueError("params must be a non-empty mapping of name -> list of values")
    names = list(params)
    values = {}
    for name in names:
        vals = list(params[name])
        if not vals:
            raise ValueError(f"params[{name!r}] must hold at least one value")
        values[name] = vals
    total = 1
    for name in names:
        total *= len(values[name])
    if total > 200:
        raise ValueError(f"params give {total} combinations; at most 200 are allowed")
    labels = dict(labels or {})
    initial = dict(initial or {})
    for name, idx in initial.items():
        if name not in values:
            raise ValueError(f"initial names unknown parameter {name!r}")
        if not (isinstance(idx, int) and 0 <= idx < len(values[name])):
            raise ValueError(
                f"initial[{name!r}] must be an index in [0, {len(values[name]) - 1}]"
            )

    readouts = {n: list(v) for n, v in (readouts or {}).items()}
    for name, texts in readouts.items():
        if name not in values:
            raise ValueError(f"readouts names unknown parameter {name!r}")
        if len(texts) != len(values[name]):
            raise ValueError(
                f"readouts[{name!r}] has {len(texts)} texts for "
                f"{len(values[name])} values"
            )

    images, widths = {}, {}
    for combo in itertools.product(*(range(len(values[n])) for n in names)):
        if not drawing():  # the sliders and an empty image per frame
            images[combo], widths[combo] = b"", FIGURE_PX
            continue
        fig = render(**{n: values[n][i] for n, i in zip(names, combo)})
        images[combo], widths[combo] = render_png(fig)
        plt.close(fig)

    sliders = {
        n: w.IntSlider(
            value=initial.get(n, 0),
            min=0,
            max=len(values[n]) - 1,
            readout=False,
            continuous_update=True,
            description=labels.get(n, n),
            style={"description_width": "initial"},
            # room for the label and a track of about 200 px
            layout=w.Layout(
                width=f"{min(600, 220 + 8 * len(labels.get(n, n)))}px",
                max_width="75%",
            ),
        )
        for n in names
    }

    def stack(children, name):
        s = w.Stack(children=children, selected_index=sliders[name].value)
        w.jslink((sliders[name], "value"), (s, "selected_index"))
        return s

    def build(level, prefix):
        name = names[level]
        if level == len(names) - 1:
            # shown at its CSS width (a 2x PNG), never wider than the column
            kids = [
                w.Image(
                    value=images[prefix + (i,)],
                    format="png",
                    width=str(widths[prefix + (i,)]),
                    layout=w.Layout(max_width="100%", height="auto"),
                )
                for i in range(len(values[name]))
            ]
        else:
            kids = [build(level + 1, prefix + (i,)) for i in range(len(values[name]))]
        return stack(kids, name)

    rows = []
    for n in names:
        texts = readouts.get(n) or [_fmt(v) for v in values[n]]
        readout = stack([w.HTML(f"<b>{html.escape(t)}</b>") for t in texts], n)
        rows.append(w.HBox([sliders[n], readout], layout=w.Layout(max_width="100%")))
    box = w.VBox(rows + [build(0, ())], layout=w.Layout(max_width="100%"))
    box.add_class("fmlab-slider-figure")
    return box


class Table:
    """A table of results: HTML in the rendered page, aligned text in a terminal.

    Built by :func:`table`; display it as the last expression of a cell.
    """

    def __init__(self, columns: list[str], rows: list[list[str]], caption: str | None):
        self.columns, self.rows, self.caption = columns, rows, caption

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td style="text-align:{"right" if _numeric(v) else "left"}">'
                f"{html.escape(v)}</td>"
                for v in row
            )
            + "</tr>"
            for row in self.rows
        )
        cap = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (
            f'<table class="fmlab-table">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )

    def __repr__(self) -> str:
        widths = [
            max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
            for i, c in enumerate(self.columns)
        ]
        line = "  ".join(c.ljust(w) for c, w in zip(self.columns, widths))
        out = [self.caption] if self.caption else []
        out += [line, "  ".join("-" * w for w in widths)]
        for row in self.rows:
            out.append(
                "  ".join(
                    v.rjust(w) if _numeric(v) else v.ljust(w)
                    for v, w in zip(row, widths)
                )
            )
        # no trailing padding: a wall-clock value in the last column would otherwise
        # pad its line differently from run to run, behind the stopwatch sanitizer
        return "\n".join(line.rstrip() for line in out)


class Tables:
    """Several :class:`Table` shown as one output, one after another (a table too wide
    for the page's column, split by the quantities it shows)."""

    def __init__(self, *tables: Table):
        if not tables or not all(isinstance(t, Table) for t in tables):
            raise TypeError("tables must be one or more Table (fmlab.viz.table)")
        self.tables = tables

    def _repr_html_(self) -> str:
        return "".join(t._repr_html_() for t in self.tables)

    def __repr__(self) -> str:
        return "\n\n".join(repr(t) for t in self.tables)


def _numeric(text: str) -> bool:
    """Whether a cell reads as a number (right-aligned): a true minus sign, thousands
    separators, a percent sign, a spread after ± ("0.82 ± 0.01") and a trailing
    footnote mark * allowed."""
    text = text.removesuffix("*").replace("\u2212", "-").replace(",", "")
    try:
        for part in text.replace("%", "").split("\u00b1"):
            float(part)
    except ValueError:
        return False
    return True


def _cell(value, digits: int) -> str:
    if isinstance(value, str):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.{digits}f}".replace("-", "\u2212")
    return str(value)


def table(
    rows: Sequence[Mapping] | Mapping[str, Sequence],
    *,
    columns: Sequence[str] | None = None,
    caption: str | None = None,
    digits: int = 3,
) -> Table:
    """The one way a chapter shows a table.

    ``rows`` is a list of mappings (one per row, column name to value) or a mapping of
    column name to a sequence of values. ``columns`` picks and orders the columns (by
    default those of the first row). Reals are printed with ``digits`` decimals, with
    a true minus sign; strings are shown as they are.
    """
    if isinstance(rows, Mapping):
        names = list(rows)
        lengths = {len(rows[c]) for c in names}
        if len(lengths) > 1:
            raise ValueError(
                f"rows: the columns have different lengths {sorted(lengths)}"
            )
        n = lengths.pop() if lengths else 0
        rows = [{c: rows[c][i] for c in names} for i in range(n)]
    rows = list(rows)
    if not all(isinstance(r, Mapping) for r in rows):
        raise TypeError("rows must be a list of mappings or a mapping of columns")
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 0:
        raise ValueError(f"digits must be a non-negative integer, got {digits!r}")
    names = list(columns) if columns is not None else (list(rows[0]) if rows else [])
    for i, r in enumerate(rows):
        missing = [c for c in names if c not in r]
        if missing:
            raise KeyError(f"rows[{i}] has no column {missing[0]!r}")
    return Table(
        [str(c) for c in names],
        [[_cell(r[c], digits) for c in names] for r in rows],
        caption,
    )

"""The book's plot style and slider figures that work with and without a kernel.

:func:`slider_figure` renders a figure for every combination of parameter values
ahead of time and returns an ipywidgets layout in which each slider is linked, in the
browser (``ipywidgets.jslink``), to a ``Stack`` of images. In Jupyter the sliders are
live; in the static book the widget state stored at build time is enough, so moving a
slider switches images with no kernel and no Python.
"""

from __future__ import annotations

import html
import io
import itertools
import numbers
from typing import Callable, Mapping, Sequence

import matplotlib.pyplot as plt

__all__ = ["use_style", "PALETTE", "fig_to_png", "slider_figure", "table", "Table"]

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


def use_style() -> None:
    """Apply the book's matplotlib style (call once at the top of a chapter)."""
    plt.rcParams.update(
        {
            "figure.figsize": (6.0, 3.6),
            "figure.dpi": 100,
            "savefig.dpi": 100,
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
            "lines.linewidth": 1.8,
            "axes.prop_cycle": plt.cycler(color=list(PALETTE.values())),
        }
    )


def fig_to_png(fig) -> bytes:
    """PNG bytes of a matplotlib figure; the figure is closed afterwards."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


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

    images = {}
    for combo in itertools.product(*(range(len(values[n])) for n in names)):
        fig = render(**{n: values[n][i] for n, i in zip(names, combo)})
        images[combo] = fig_to_png(fig)

    sliders = {
        n: w.IntSlider(
            value=initial.get(n, 0),
            min=0,
            max=len(values[n]) - 1,
            readout=False,
            continuous_update=True,
            description=labels.get(n, n),
            style={"description_width": "initial"},
            layout=w.Layout(width="320px"),
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
            kids = [
                w.Image(value=images[prefix + (i,)], format="png")
                for i in range(len(values[name]))
            ]
        else:
            kids = [build(level + 1, prefix + (i,)) for i in range(len(values[name]))]
        return stack(kids, name)

    rows = []
    for n in names:
        readout = stack([w.HTML(f"<b>{_fmt(v)}</b>") for v in values[n]], n)
        rows.append(w.HBox([sliders[n], readout]))
    return w.VBox(rows + [build(0, ())])


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
        return "\n".join(out)


def _numeric(text: str) -> bool:
    try:
        float(text.replace("\u2212", "-").replace("%", "").replace("\u00b1", "e"))
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

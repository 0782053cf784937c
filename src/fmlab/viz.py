"""The book's plot style and slider figures that work with and without a kernel.

:func:`slider_figure` renders a figure for every combination of parameter values
ahead of time and returns an ipywidgets layout in which each slider is linked, in the
browser (``ipywidgets.jslink``), to a ``Stack`` of images. In Jupyter the sliders are
live; in the static book the widget state stored at build time is enough, so moving a
slider switches images with no kernel and no Python.
"""

from __future__ import annotations

import io
import itertools
from typing import Callable, Mapping, Sequence

import matplotlib.pyplot as plt

__all__ = ["use_style", "PALETTE", "fig_to_png", "slider_figure"]

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

"""The slider figure: every state precomputed, sliders linked in the browser."""

import ipywidgets as w
import matplotlib.pyplot as plt
import pytest

from fmlab import slider_figure


def _render(a, b):
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.set_title(f"{a}-{b}")
    return fig


def test_slider_figure_has_one_image_per_state():
    box = slider_figure(_render, {"a": [1, 2, 3], "b": ["x", "y"]})
    sliders = [row.children[0] for row in box.children[:-1]]
    assert [s.max for s in sliders] == [2, 1]
    outer = box.children[-1]
    assert isinstance(outer, w.Stack) and len(outer.children) == 3
    images = [img for inner in outer.children for img in inner.children]
    assert len(images) == 6 and all(
        isinstance(i, w.Image) and i.value[:4] == b"\x89PNG" for i in images
    )
    assert len({i.value for i in images}) == 6  # every state is a different picture


def test_nothing_is_drawn_under_fmlab_draw_0(monkeypatch):
    """nbval's re-execution (FMLAB_DRAW=0): the same widgets and text, no pictures."""
    from fmlab.viz import _figure_png

    drawn = slider_figure(_render, {"a": [1, 2, 3], "b": ["x", "y"]})
    fig, _ = plt.subplots(figsize=(1, 1))
    assert _figure_png(fig) is not None
    monkeypatch.setenv("FMLAB_DRAW", "0")
    calls = []
    box = slider_figure(lambda **v: calls.append(v), {"a": [1, 2, 3], "b": ["x", "y"]})
    assert not calls, "a frame was rendered"
    assert repr(box)[:110] == repr(drawn)[:110]  # what nbval compares of a widget
    images = [img for inner in box.children[-1].children for img in inner.children]
    assert len(images) == 6 and all(i.value == b"" for i in images)
    assert _figure_png(fig) is None  # the figure shows its text line only
    plt.close(fig)


def test_slider_figure_validates():
    with pytest.raises(ValueError, match="params"):
        slider_figure(_render, {})
    with pytest.raises(ValueError, match="at least one value"):
        slider_figure(_render, {"a": []})
    with pytest.raises(ValueError, match="at most 200"):
        slider_figure(_render, {"a": range(20), "b": range(11)})
    with pytest.raises(TypeError, match="render"):
        slider_figure(None, {"a": [1]})
    with pytest.raises(ValueError, match="initial"):
        slider_figure(_render, {"a": [1], "b": [2]}, initial={"a": 5})


def test_figures_are_fitted_to_the_column():
    """A wide figure with small text is drawn at the column's width, every text at
    least MIN_FONT_PT, as a 2x PNG (its pixel width twice its display width)."""
    import struct

    from fmlab import viz

    viz.use_style()
    for size in ((13, 3.3), (4, 3)):
        fig, axes = plt.subplots(1, 3, figsize=size)
        for ax in axes:
            ax.plot([1, 2], label="a label")
            ax.legend(fontsize=6)
        fig.tight_layout()
        data, width = viz.render_png(fig)
        plt.close(fig)
        assert abs(width - viz.FIGURE_PX) <= 3 and width <= viz.COLUMN_PX
        pixels = struct.unpack(">I", data[16:20])[0]
        assert abs(pixels - viz.PIXEL_RATIO * width) <= 1
        texts = [t for ax in axes for t in ax.get_legend().get_texts()]
        assert min(t.get_fontsize() for t in texts) >= viz.MIN_FONT_PT


def test_slider_images_fit_and_read_out_values():
    box = slider_figure(
        lambda t: plt.subplots(figsize=(12, 3))[0],
        {"t": [0, 1]},
        readouts={"t": ["t = 0", "t = 16"]},
    )
    image = box.children[-1].children[0]
    assert int(image.width) <= 688 and image.layout.max_width == "100%"
    readout = box.children[0].children[1]
    assert [h.value for h in readout.children] == ["<b>t = 0</b>", "<b>t = 16</b>"]
    with pytest.raises(ValueError, match="readouts"):
        slider_figure(_render, {"a": [1], "b": [2]}, readouts={"a": ["x", "y"]})


def test_table_text_has_no_trailing_padding():
    # a wall-clock value in the last column, under a wider header, must not change the
    # padding of its line (nbval compares the text with the times sanitized)
    from fmlab.viz import table

    def text(t):
        rows = [{"step": "a", "CPU time, best of 3": f"⏱ {t} ms"}]
        return repr(table(rows + [{"step": "bb", "CPU time, best of 3": "x"}]))

    assert all(line == line.rstrip() for line in text("9.8").splitlines())
    assert text("9.8").replace("9.8", "T") == text("123.4").replace("123.4", "T")


def test_tables_show_one_after_another_and_a_marked_number_is_a_number():
    from fmlab.viz import Tables, table

    a = table([{"width": "32*", "x": 1.0}], caption="A")
    b = table([{"width": "16", "y": "b"}], caption="B")
    both = Tables(a, b)
    assert both._repr_html_() == a._repr_html_() + b._repr_html_()
    assert repr(both) == repr(a) + "\n\n" + repr(b)
    assert 'text-align:right">32*</td>' in a._repr_html_()  # a footnote mark
    spread = table([{"acc": "0.82 ± 0.01", "n": "4,826", "d": "−0.3 ± 0.1"}])
    assert spread._repr_html_().count("text-align:right") == 3
    assert 'text-align:left">b</td>' in b._repr_html_()
    with pytest.raises(TypeError, match="tables"):
        Tables()
    with pytest.raises(TypeError, match="tables"):
        Tables(a, "b")


def test_glue_texts_keeps_each_text_and_names_bad_input(monkeypatch):
    from fmlab import viz
    from fmlab.viz import glue_texts

    kept = {}
    monkeypatch.setattr(
        viz, "glue", lambda name, text, display: kept.update({name: text})
    )
    glue_texts({"ch9_a": "1.5", "ch9_b": "2 of 3"})
    assert kept == {"ch9_a": "1.5", "ch9_b": "2 of 3"}
    with pytest.raises(TypeError, match="texts must be a mapping"):
        glue_texts([("ch9_a", "1")])
    with pytest.raises(TypeError, match="'ch9_c' maps to float"):
        glue_texts({"ch9_c": 1.5})


@pytest.mark.parametrize("display", [True, False])
def test_glue_writes_what_myst_nb_glue_writes(monkeypatch, display):
    """Oracle: myst-nb's own glue, whose output the book's roles read."""
    import IPython.display
    from myst_nb.ext import glue as myst_glue

    from fmlab.viz import glue

    shown = []

    def keep(*args, **kwargs):
        shown.append((args, kwargs))

    monkeypatch.setattr(IPython.display, "display", keep)
    monkeypatch.setattr(myst_glue, "ipy_display", keep)

    class Picture:  # what a figure shows in a kernel: an image and its text
        def _repr_png_(self):
            return b"\x89PNG not really"

        def __repr__(self):
            return "<a picture>"

    for value in ("0.25 ± 0.01", 3, Picture()):
        glue("ch9_x", value, display=display)
        myst_glue.glue("ch9_x", value, display=display)
        assert shown[-2] == shown[-1]
    assert any(k.endswith("image/png") for k in shown[-1][0][0])
    with pytest.raises(TypeError, match="name must be"):
        glue("", 1)

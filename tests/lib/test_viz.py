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

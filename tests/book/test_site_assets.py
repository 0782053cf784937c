"""Units of the book's Sphinx extension that shape the pages' weight (issue 42)."""

import base64
import importlib.util
import json
from pathlib import Path

from scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[2]


def _ext():
    path = ROOT / "book" / "_ext" / "fmlab_sphinx.py"
    spec = importlib.util.spec_from_file_location("fmlab_sphinx_units", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slider_frames_become_image_files(tmp_path):
    png = b"\x89PNG fake frame"
    state = {
        "version_major": 2,
        "version_minor": 0,
        "state": {
            "a": {
                "model_name": "ImageModel",
                "state": {"format": "png", "width": "680"},
                "buffers": [
                    {
                        "path": ["value"],
                        "encoding": "base64",
                        "data": base64.b64encode(png).decode(),
                    }
                ],
            },
            "b": {"model_name": "IntSliderModel", "state": {"value": 1}},
        },
    }
    page = tmp_path / "notebooks" / "03.html"
    page.parent.mkdir()
    page.write_text(
        '<html><script type="application/vnd.jupyter.widget-state+json">'
        + json.dumps(state)
        + "</script></html>"
    )
    images = tmp_path / "_images" / "frames"
    assert _ext().frames_to_files(page, images) == 1
    files = list(images.iterdir())
    assert [f.read_bytes() for f in files] == [png]
    text = page.read_text()
    body = text.split('json">')[1].split("</script>")[0]
    model = json.loads(body)["state"]["a"]
    assert model["state"]["format"] == "url"
    url = base64.b64decode(model["buffers"][0]["data"]).decode()
    assert url == f"../_images/frames/{files[0].name}"
    assert (page.parent / url).resolve() == files[0].resolve()
    assert _ext().frames_to_files(page, images) == 0  # already moved


def test_a_figures_alt_text_is_its_captions_first_sentence():
    from docutils import nodes

    ext = _ext()
    assert ext.first_sentence("Fig. 3 vs. the bound. More text.") == (
        "Fig. 3 vs. the bound."
    )
    assert ext.first_sentence("Kumar et al. find it. Then") == "Kumar et al. find it."
    assert ext.first_sentence("Accuracy at k = 3. Then") == "Accuracy at k = 3."
    assert ext.first_sentence("no full stop") == "no full stop"
    figure = nodes.figure()
    figure += nodes.image(uri="../_images/abc.png")
    figure += nodes.image(uri="b.png", alt="a reader's own words")
    figure += nodes.caption(
        "",
        "",
        nodes.Text("The loss "),
        nodes.math("", "\\frac1n L"),
        nodes.Text(" over\nsteps . Dashed: the bound."),
    )
    doc = nodes.document(None, None)
    doc += figure
    assert ext._figure_alt_text(doc) == 1
    first, second = list(doc.findall(nodes.image))
    assert first["alt"] == "The loss over steps."
    assert second["alt"] == "a reader's own words"


def test_the_word_exercise_is_not_doubled_before_a_reference():
    from docutils import nodes

    ext = _ext()
    para = nodes.paragraph()
    para += nodes.Text("the same path (exercise")
    para += nodes.Text("\n")  # MyST's line break
    para += nodes.reference("", "Exercise 1.3", refuri="#ex")
    para += nodes.Text("). Exercise ")
    para += nodes.reference("", "Exercise 6.2", refuri="#ex2")
    para += nodes.Text(" and Theorem ")
    para += nodes.reference("", "Theorem 6.1", refuri="#th")
    doc = nodes.document(None, None)
    doc += para
    assert ext._one_word_exercise(doc) == 2
    assert para.astext() == (
        "the same path (\nExercise 1.3). Exercise 6.2 and Theorem Theorem 6.1"
    )


def _bake():
    return load_script("bake_notebooks")


def test_a_slider_figure_carries_its_first_frame_for_jupyterlab():
    import nbformat

    bake = _bake()
    frame = base64.b64encode(b"\x89PNG frame 2").decode()
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_s"]}},
        "s": {
            "model_name": "StackModel",
            "state": {"selected_index": 1, "children": ["IPY_MODEL_a", "IPY_MODEL_b"]},
        },
        "a": {
            "model_name": "ImageModel",
            "state": {"format": "png"},
            "buffers": [{"path": ["value"], "encoding": "base64", "data": "QQ=="}],
        },
        "b": {
            "model_name": "ImageModel",
            "state": {"format": "png"},
            "buffers": [{"path": ["value"], "encoding": "base64", "data": frame}],
        },
    }
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {bake.WIDGET_STATE: {"state": state}}
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={bake.WIDGET_VIEW: {"model_id": "box"}, "text/plain": "VBox(…)"},
        )
    ]
    nb.cells = [cell]
    assert bake.first_frame(state, "box") == frame  # the stack's selected child
    assert bake._slider_frames(nb) == 1
    assert cell.outputs[0]["data"]["image/png"] == frame
    assert bake._slider_frames(nb) == 0  # already there


def test_the_theme_icon_script_is_dropped(tmp_path):
    page = tmp_path / "a.html"
    page.write_text(
        '<head>\n  <script defer src="../_static/scripts/fontawesome.js?digest=1">'
        '</script>\n  <script defer src="../_static/doctools.js"></script></head>'
    )
    assert _ext().drop_icon_script(page)
    assert "fontawesome" not in page.read_text()
    assert "doctools.js" in page.read_text()
    assert not _ext().drop_icon_script(page)


def test_a_baked_notebook_does_not_double_the_word_exercise():
    bake = _bake()
    text = "paths (exercise Exercise 1.3); it forbids. Exercise [Exercise 6.2](x) of"
    assert bake._one_word_exercise(text) == (
        "paths (Exercise 1.3); it forbids. [Exercise 6.2](x) of"
    )

"""Units of the book's Sphinx extension that shape the pages' weight (issue 42)."""

import base64
import importlib.util
import json
from pathlib import Path

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

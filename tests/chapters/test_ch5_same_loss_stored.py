"""The stored run of Chapter 5's same-loss page (notebooks/05b-same-loss.ipynb): the
script's configuration is the page's and the page reads the stored run. (That the file
records today's code, refuses a changed line and reruns to its record on another
rounding path: tests/chapters/test_stored_runs.py.)

Oracle: the page's own config cell.
"""

import json
from pathlib import Path

from scripts_loader import load_script

from fmlab.chapters import ch5_implicit_bias as ch5

ROOT = Path(__file__).resolve().parents[2]


def _page_config():
    nb = json.loads((ROOT / "notebooks" / "05b-same-loss.ipynb").read_text())
    (cell,) = [
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "code"
        and "cfg = ch5.SameLossConfig(" in "".join(c["source"])
    ]
    scope = {"ch5": ch5}
    exec(cell, scope)
    return scope["cfg"]


def test_the_stored_run_is_the_pages_and_records_todays_code():
    config, res = ch5.same_loss_results()
    page = _page_config()
    assert (
        config == page == ch5.SameLossConfig(**load_script("ch5_same_loss").PAGE_CONFIG)
    )
    assert res["stored"]["script"] == "scripts/ch5_same_loss.py"
    assert res["adversarial_gap"].shape == (page.n_models,)
    assert res["recovery0_accuracy"].shape == (3, page.n_models, 2)
    # the page's run is the stored one; another config is not
    assert ch5.same_loss_run(page)["stored"] == res["stored"]

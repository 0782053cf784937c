"""A chapter read in JupyterLab (``make lab``), tested in a real browser.

A copy of one executed chapter is baked for JupyterLab (``scripts/bake_notebooks.py
--lab``), JupyterLab is started on it (on a free port of 127.0.0.1, with a token, with
settings of its own), and headless Chromium, driven by Selenium, opens it. With the
``jupyterlab-myst`` extension the page must render as in the book: its theorem is a
rendered MyST proof block ("Theorem 6.1", the book's number, with typeset math), not the
raw ```` ```{prf:theorem} ```` source; every glued number shows as the number the page
shows, not as its key; and no citation or reference is left unresolved. A screenshot is
saved to ``_build/screenshots/lab-06-in-context-learning.png`` (the theorem). The
server is always stopped, with its kernel.

Needs the executed chapters (``make book``; ``make test`` builds it first), JupyterLab
with ``jupyterlab-myst`` (``requirements.txt``), Debian's ``chromium`` and
``chromedriver``. Without them the test skips with a loud reason, unless
``FMLAB_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which turns that skip into a failure.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import chromium
import pytest
from scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
EXECUTED = ROOT / "_build" / "executed"
SHOTS = ROOT / "_build" / "screenshots"
PAGE = "notebooks/06-in-context-learning"
# a sentence of the page with a glued number in it, and the key glued there
GLUED_KEY = "ch6_bayes_k3"


def _unavailable(reason: str):
    chromium.unavailable(reason, "JUPYTERLAB BROWSER TEST")


def _bake_module():
    return load_script("bake_notebooks")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(driver, script, timeout=60.0, what="condition"):
    chromium.wait(driver, script, timeout, what, poll=0.5)


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    """The chapter, executed by the build and baked for JupyterLab, in a folder of
    its own: (folder, notebook name, its glued values as the page shows them)."""
    source = EXECUTED / f"{Path(PAGE).name}.ipynb"
    if not source.exists():
        _unavailable(f"no executed chapter {source}; run `make book` first")
    import nbformat

    bake = _bake_module()
    book = bake.load_book(ROOT, pages=EXECUTED)
    folder = tmp_path_factory.mktemp("lab")
    nb = bake.bake_notebook(
        nbformat.read(str(source), as_version=4), book, PAGE, lab=True
    )
    nbformat.write(nb, str(folder / source.name))
    glued = {
        key: bake.format_plain_text(str(data["text/plain"]), "")
        for key, data in bake.glue_values(nb).items()
        if "text/plain" in data
    }
    # the page's first theorem, as the book titles it: "Theorem 6.1 (its title)"
    theorem = min(
        (t for t in book.labels.values() if t.doc == PAGE and t.kind == "theorem"),
        key=lambda t: t.number,
    )
    title = f"Theorem {book.number_text(theorem)}"
    if theorem.title:
        title += f" ({theorem.title})"
    return folder, source.name, glued, title


@pytest.fixture(scope="module")
def lab(baked, tmp_path_factory):
    """JupyterLab on the baked chapter: its URL (with the token)."""
    for module in ("jupyterlab", "jupyterlab_myst"):
        if importlib.util.find_spec(module) is None:
            _unavailable(f"{module} is not installed (requirements.txt pins it)")
    folder = baked[0]
    home = tmp_path_factory.mktemp("jupyter")
    settings = home / "settings" / "@jupyterlab"
    for plugin, values in {
        # render every cell, not only those scrolled into view
        "notebook-extension/tracker": {"windowingMode": "none"},
        # no question about news, no check for updates (no network here)
        "apputils-extension/notification": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
    }.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        FMLAB_PROGRESS="0",
        OMP_NUM_THREADS="1",
    )
    port, token = _free_port(), secrets.token_hex(16)
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={folder}",
        f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log_path = home / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        end = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(
                    f"{url}/api/status?token={token}", timeout=5
                ):
                    break
            except OSError:
                if server.poll() is not None or time.time() > end:
                    pytest.fail(
                        "JupyterLab did not start:\n" + log_path.read_text()[-3000:]
                    )
                time.sleep(0.5)
        yield url, token, log_path
    finally:
        # SIGTERM: the server shuts its kernel down; then the whole group, by force
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    driver = chromium.driver(what="JUPYTERLAB BROWSER TEST")
    driver.set_page_load_timeout(90)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def _screenshot(driver, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    path = SHOTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def test_chapter_reads_in_jupyterlab(baked, browser, lab):
    _, name, glued, theorem_title = baked
    url, token, log_path = lab
    driver = browser
    driver.get(f"{url}/lab/tree/{name}?token={token}")
    _wait(
        driver,
        "return document.querySelectorAll('.jp-Notebook .jp-MarkdownCell').length > 5",
        timeout=120,
        what=f"JupyterLab to open {name} (server log: {log_path})",
    )
    # jupyterlab-myst renders the MyST: a proof block with its title and math
    _wait(
        driver,
        "return Array.from(document.querySelectorAll('.myst-proof-title'))"
        ".some(e => e.innerText.startsWith('Theorem'))",
        timeout=60,
        what="jupyterlab-myst to render the chapter's theorem",
    )
    _wait(
        driver,
        "return document.querySelectorAll('.jp-MarkdownCell .katex').length > 20",
        timeout=60,
        what="the chapter's math to be typeset",
    )
    time.sleep(1.0)  # the last cells' rendering
    driver.execute_script(  # the theorem at the top of the window
        "Array.from(document.querySelectorAll('aside.myst-proof'))"
        ".find(a => a.innerText.startsWith('Theorem')).scrollIntoView()"
    )
    time.sleep(0.5)
    shot = _screenshot(driver, f"lab-{Path(PAGE).name}")

    # (a) the theorem: a rendered proof block, numbered as in the book, math typeset
    theorems = driver.execute_script(
        "return Array.from(document.querySelectorAll('aside.myst-proof'))"
        ".map(a => [a.querySelector('.myst-proof-title').innerText,"
        "  a.querySelectorAll('.katex').length])"
        ".filter(t => t[0].startsWith('Theorem'))"
    )
    assert theorems, f"no rendered theorem (screenshot: {shot})"
    title, n_math = theorems[0]
    assert " ".join(title.split()) == theorem_title, (
        f"the first theorem is titled {title!r}, not {theorem_title!r} as in the book"
    )
    assert n_math > 0, f"the theorem's math is not typeset (screenshot: {shot})"
    text = driver.execute_script(
        "return Array.from(document.querySelectorAll('.jp-MarkdownCell"
        " .jp-RenderedMarkdown, .jp-MarkdownCell .jp-RenderedMySTMarkdown'))"
        ".map(e => e.innerText).join('\\n')"
    )
    if not text.strip():  # whatever jupyterlab-myst names its output, the cells' text
        text = driver.execute_script(
            "return Array.from(document.querySelectorAll('.jp-MarkdownCell'))"
            ".map(e => e.innerText).join('\\n')"
        )
    for raw in ("{prf:theorem}", "{prf:definition}", ":label:", "{exercise}"):
        assert raw not in text, f"the page shows raw MyST source {raw!r}"

    # (b) a glued number shows as the number the book prints, not as its key
    flat = re.sub(r"\s+", " ", text)
    assert GLUED_KEY in glued, f"the chapter no longer glues {GLUED_KEY!r}"
    value = re.sub(r"\s+", " ", glued[GLUED_KEY])
    assert re.search(r"\d", value), f"{GLUED_KEY} = {value!r} holds no number"
    assert f"the accuracy goes from {value}" in flat, (
        f"the glued value of {GLUED_KEY} ({value!r}) is not on the page"
    )
    shown_keys = sorted(k for k in glued if re.search(rf"\b{re.escape(k)}\b", flat))
    assert not shown_keys, f"glue keys shown as text: {shown_keys}"
    assert "{glue" not in text and "{cite" not in text and "{numref" not in text

    # citations and references are resolved (jupyterlab-myst marks the ones it is not)
    unresolved = driver.execute_script(
        "return Array.from(document.querySelectorAll("
        '\'.jp-MarkdownCell [title="Citation Not Found"],'
        ' .jp-MarkdownCell [title="Cross Reference Not Found"]\'))'
        ".map(e => e.innerText)"
    )
    assert not unresolved, f"unresolved citations or references: {unresolved[:5]}"
    assert "Xie et al. (2022)" in flat, "the citation of Xie et al. is not rendered"

    # (c) the slider figure shows its first frame before the chapter runs (JupyterLab
    # restores no widget state in a notebook it does not trust), not a line of
    # "VBox(children=(…"
    as_text = driver.execute_script(
        "return Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
        ".map(o => o.innerText.trim()).filter(t => /^[A-Z][A-Za-z]*Box\\(children/"
        ".test(t)).length"
    )
    assert not as_text, f"{as_text} slider figures show as text (screenshot: {shot})"
    frame = driver.execute_script(
        "const i = Array.from(document.querySelectorAll("
        "'.jp-OutputArea-output img')).filter(i => i.naturalWidth > 0);"
        "const f = i.find(i => i.closest('.jp-Cell') && i.closest('.jp-Cell')"
        "  .innerText.includes('slider'));"
        "if (f) f.scrollIntoView({block: 'center'});"
        "return i.length"
    )
    assert frame > 0, "no figure is shown as an image"
    time.sleep(0.5)
    _screenshot(driver, f"lab-{Path(PAGE).name}-slider")

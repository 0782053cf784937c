"""The rendered book, tested in a real browser (headless Chromium driven by Selenium).

For every page of the table of contents: it loads with no console error and no failed or
off-site request; its math is typeset; every image loads; every internal link resolves;
and every slider figure changes its picture when its slider moves, with no kernel. A
screenshot of every page is saved to ``_build/screenshots/``.

Needs a built book (``make book``; ``make test`` builds it first), Debian's ``chromium``
and ``chromedriver``. Without a browser the tests skip with a loud reason, unless
``FMLAB_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which turns that skip into a failure.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import chromium
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
_unavailable = chromium.unavailable
_wait = chromium.wait


def _toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                pages.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [p.removesuffix(".md").removesuffix(".ipynb") for p in pages]


PAGES = _toc_pages()
# The repository the site may link to (its buttons appear only when this is set).
REPOSITORY = (
    (yaml.safe_load((ROOT / "_config.yml").read_text()).get("repository") or {}).get(
        "url"
    )
    or ""
).strip()
REPOSITORY_HOSTS = (
    "github.com",
    "gitlab.com",
    "mybinder.org",
    "colab.research.google.com",
    "deepnote.com",
)


@functools.lru_cache(maxsize=None)
def _page_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").exists():
        _unavailable(f"no built book at {HTML}; run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    driver = chromium.driver(
        "--disable-quic",
        "--hide-scrollbars",
        capabilities={"goog:loggingPrefs": {"browser": "ALL", "performance": "ALL"}},
    )
    # how long the driver waits for the renderer to answer a command: generous, since
    # the other test worker may be executing a chapter on the second core meanwhile
    # (what the tests measure, such as a first paint, comes from the browser's own
    # clock and is unaffected)
    driver.set_page_load_timeout(180)
    driver.set_script_timeout(60)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def _network_events(driver):
    events = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        events.append((msg["method"], msg.get("params", {})))
    return events


def _screenshot(driver, name: str) -> None:
    """A full-page picture: the viewport is made as tall as the page, then captured."""
    height = driver.execute_script(
        "return Math.min(document.documentElement.scrollHeight, 30000)"
    )
    metrics = {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    (SHOTS / f"{name.replace('/', '__')}.png").write_bytes(
        base64.b64decode(shot["data"])
    )


@pytest.mark.parametrize("page", PAGES)
def test_page_in_browser(page, server, browser):
    driver = browser
    driver.get_log("browser")
    driver.get_log("performance")  # drop what earlier pages left
    driver.get(f"{server}/{page}.html")
    _wait(driver, "return document.readyState === 'complete'", what="the page to load")
    source = (HTML / f"{page}.html").read_text()

    # math: typeset by the MathJax served from the site itself
    if 'class="math' in source:
        driver.set_script_timeout(60)
        n_math = driver.execute_async_script(
            "const done = arguments[0];"
            "const wait = () => (window.MathJax && MathJax.startup"
            "    && MathJax.startup.promise)"
            "  ? MathJax.startup.promise.then("
            "      () => done(document.querySelectorAll('mjx-container').length))"
            "  : setTimeout(wait, 100);"
            "wait();"
        )
        assert n_math > 0, f"{page}: the page has math but MathJax typeset nothing"
        errors = driver.execute_script(
            "return document.querySelectorAll('mjx-merror').length"
        )
        assert errors == 0, f"{page}: {errors} formulas failed to typeset"
        # every inline formula, those of the claim statements included, is typeset
        raw = driver.execute_script(
            "return [...document.querySelectorAll('span.math')]"
            "  .filter(s => !s.querySelector('mjx-container'))"
            "  .map(s => s.textContent.slice(0, 60))"
        )
        assert not raw, f"{page}: formulas left as TeX: {raw[:3]}"

    # widgets: rendered from the stored state, without a kernel
    has_widgets = "application/vnd.jupyter.widget-view+json" in source
    if has_widgets:
        _wait(
            driver,
            "return document.querySelectorAll("
            "'.jupyter-widgets .widget-slider').length > 0",
            what="the widgets to render",
        )

    # every image loads
    _wait(
        driver,
        "return Array.from(document.images).every(i => i.complete)",
        what="images to load",
    )
    broken = driver.execute_script(
        "return Array.from(document.images)"
        ".filter(i => i.naturalWidth === 0 && i.offsetParent !== null)"
        ".map(i => i.src.slice(0, 80))"
    )
    assert not broken, f"{page}: images that did not load: {broken}"

    # internal links resolve to files of the built site
    hrefs = driver.execute_script(
        "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
    )
    missing, no_anchor = [], []
    for href in hrefs:
        url = urlparse(href)
        if url.scheme in ("http", "https") and url.netloc == urlparse(server).netloc:
            target = HTML / unquote(url.path).lstrip("/")
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                missing.append(href)
            elif url.fragment and target.suffix == ".html":
                if f'id="{unquote(url.fragment)}"' not in _page_text(target):
                    no_anchor.append(href)
    assert not missing, f"{page}: links to missing pages: {sorted(set(missing))[:10]}"
    assert not no_anchor, f"{page}: links to missing anchors: {sorted(no_anchor)[:10]}"

    # no button or link points at a repository (or a launcher of one) that the book's
    # configuration does not name
    if not REPOSITORY:
        stray = [h for h in hrefs if any(host in h for host in REPOSITORY_HOSTS)]
        assert not stray, f"{page}: links to an unconfigured repository: {stray[:5]}"

    # the claims page opens with the reproduction ledger: its first section, a table
    # with one row per phenomenon of the registry, every status shown
    if page == "book/claims":
        first = driver.execute_script(
            "return document.querySelector('article section section, "
            "article section > section')?.id"
        )
        assert first == "reproduction-ledger", f"first section is {first!r}"
        statuses = driver.execute_script(
            "return Array.from(document.querySelectorAll("
            "'#reproduction-ledger table.fmlab-ledger tbody tr'))"
            ".map(r => r.cells[3].innerText.split(':')[0].trim())"
        )
        phenomena = yaml.safe_load((ROOT / "book" / "claims.yml").read_text())
        assert len(statuses) == len(phenomena["phenomena"])
        known = {"reproduced", "partly", "not reproduced", "not studied"}
        assert set(statuses) <= known, set(statuses) - known

    driver.execute_script("window.scrollTo(0, 0)")
    _screenshot(driver, page)

    # every slider figure changes its picture when its slider moves
    if has_widgets:
        from selenium.webdriver.common.keys import Keys

        boxes = driver.find_elements(
            "css selector",
            ".jp-OutputArea-output .widget-vbox, .cell_output .widget-vbox",
        )
        figures = [
            b
            for b in boxes
            if b.find_elements("css selector", ".widget-slider")
            and b.find_elements("css selector", "img")
        ]
        assert figures, f"{page}: widgets but no slider figure rendered"
        visible = (
            "return Array.from(arguments[0].querySelectorAll('img'))"
            ".filter(i => i.offsetParent !== null).map(i => i.src.slice(-120))"
        )
        for fig in figures:
            for handle in fig.find_elements("css selector", ".noUi-handle"):
                before = driver.execute_script(visible, fig)
                assert len(before) == 1, (
                    f"{page}: expected one visible image, got {len(before)}"
                )
                driver.execute_script(
                    "arguments[0].scrollIntoView({block: 'center'})", handle
                )
                handle.send_keys(
                    Keys.END
                    if handle.get_attribute("aria-valuenow")
                    != handle.get_attribute("aria-valuemax")
                    else Keys.HOME
                )
                time.sleep(0.3)
                after = driver.execute_script(visible, fig)
                assert after != before, (
                    f"{page}: moving a slider did not change the picture"
                )

    _check_layout(driver, page)

    # the widgets' icon fonts load lazily, when the first glyph that needs one is drawn:
    # wait for every font the page asked for, so that a missing one fails every run
    driver.set_script_timeout(30)
    driver.execute_async_script(
        "const done = arguments[0];"
        "document.fonts.ready.then(() => setTimeout(() => done(true), 300));"
    )

    # no console errors; no failed, erroring or off-site requests
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, f"{page}: console errors: {severe[:5]}"
    host = urlparse(server).netloc
    offsite, failed = set(), []
    for method, params in _network_events(driver):
        if method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            scheme = urlparse(url).scheme
            if scheme not in ("data", "blob", "about") and urlparse(url).netloc != host:
                offsite.add(url)
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            failed.append(params.get("errorText"))
        elif (
            method == "Network.responseReceived" and params["response"]["status"] >= 400
        ):
            failed.append(f"{params['response']['status']} {params['response']['url']}")
    assert not offsite, f"{page}: requests to other hosts: {sorted(offsite)[:5]}"
    assert not failed, f"{page}: failed requests: {failed[:5]}"


# a figure is shown at no less than this fraction of the width it was drawn for
MIN_FIGURE_SCALE = 0.9

# pages whose figures do not have numbered captions yet (issue 28); shrinks to empty
UNCAPTIONED: set[str] = set()


def _check_layout(driver, page):
    """At the desktop width: every figure is shown at >= 90% of the width it was drawn
    for (its width attribute: the figures are 2x PNGs), no printed output scrolls
    sideways, every figure has a numbered caption (pages not in UNCAPTIONED), no claim
    line shows a MyST label id, and no code cell scrolls sideways (code lines are at
    most 88 characters, which assets/fmlab.css sizes to fit the column)."""
    driver.execute_script("window.scrollTo(0, 0)")
    small = driver.execute_script(
        "return Array.from(document.querySelectorAll('.cell_output img'))"
        ".filter(i => i.offsetParent !== null && i.naturalWidth > 0)"
        ".map(i => {"
        "  const drawn = parseFloat(i.style.width)"
        "    || parseFloat(i.getAttribute('width')) || i.naturalWidth;"
        "  return [i.clientWidth / drawn, drawn, i.src.slice(-40)];"
        "}).filter(r => r[0] < arguments[0])",
        MIN_FIGURE_SCALE,
    )
    assert not small, (
        f"{page}: figures shown below {MIN_FIGURE_SCALE:.0%} of their width "
        f"(scale, drawn width): {[(round(r[0], 2), r[1]) for r in small][:5]}"
    )
    # an element scrolls sideways when it is a scrolling box wider than it shows, or
    # reaches past the right edge of the article (the page itself then scrolls)
    overflow = (
        "(e => { const x = getComputedStyle(e).overflowX;"
        " const edge = document.querySelector('.bd-article')"
        "   .getBoundingClientRect().right;"
        " const scrolls = x === 'auto' || x === 'scroll';"
        " return (scrolls && e.scrollWidth > e.clientWidth + 1)"
        "   || e.getBoundingClientRect().right > edge + 1; })"
    )
    wide_outputs = driver.execute_script(
        "return Array.from(document.querySelectorAll("
        "'.cell_output pre, .cell_output .output, .cell_output .jupyter-widgets,"
        " .cell_output table, .cell_output img'))"
        f".filter(e => e.offsetParent !== null && {overflow}(e))"
        ".map(e => [e.scrollWidth, e.clientWidth, e.className.slice(-40)])"
    )
    assert not wide_outputs, (
        f"{page}: {len(wide_outputs)} outputs scroll sideways (scroll, client width): "
        f"{wide_outputs[:5]}"
    )
    if page not in UNCAPTIONED:  # every figure and slider figure: numbered, captioned
        bare = driver.execute_script(
            "return Array.from(document.querySelectorAll("
            "'.cell_output img, .cell_output .widget-slider'))"
            ".filter(e => e.offsetParent !== null)"
            ".filter(e => { const f = e.closest('figure');"
            "  return !f || !f.querySelector('figcaption .caption-number'); })"
            ".map(e => (e.src || e.className).slice(-40))"
        )
        assert not bare, f"{page}: {len(bare)} figures without a numbered caption"
    label_ids = driver.execute_script(
        "return Array.from(document.querySelectorAll('.fmlab-claim'))"
        ".map(e => e.innerText).filter(t => /\\bch[0-9]+-[a-z]/.test(t))"
    )
    assert not label_ids, f"{page}: claim lines show label ids: {label_ids[:3]}"
    # (a folded cell is not laid out until it is opened)
    wide_code = driver.execute_script(
        "return Array.from(document.querySelectorAll('.cell_input pre'))"
        ".filter(e => !e.closest('details:not([open])'))"
        f".filter(e => e.offsetParent !== null && {overflow}(e)).length"
    )
    assert not wide_code, f"{page}: {wide_code} code cells scroll sideways"


def test_search_finds_chapter_content(server, browser):
    """The site's own search (no server needed) finds words only a chapter contains."""
    browser.get(f"{server}/search.html?q=decomposition")
    _wait(
        browser,
        "return document.querySelectorAll('#search-results li').length > 0",
        timeout=30,
        what="search results",
    )
    links = browser.execute_script(
        "return Array.from(document.querySelectorAll('#search-results li a'))"
        ".map(a => a.href)"
    )
    assert any("notebooks/01-" in link for link in links), (
        f"search did not find Chapter 1: {links[:5]}"
    )


def test_site_size_within_budget():
    if not (HTML / "index.html").exists():
        _unavailable(f"no built book at {HTML}; run `make book` first")
    files = [p for p in HTML.rglob("*") if p.is_file()]
    downloads = HTML / "downloads"  # the archive, the wheel and the PDF: on demand only
    size = sum(p.stat().st_size for p in files if downloads not in p.parents)
    assert size <= 60 * 2**20, (
        f"the built site is {size / 2**20:.1f} MB, over its 60 MB budget"
    )
    extra = sum(p.stat().st_size for p in files if downloads in p.parents)
    assert extra <= 30 * 2**20, (
        f"the downloads are {extra / 2**20:.1f} MB, over their 30 MB budget"
    )


CHAPTERS = [p for p in PAGES if p.startswith("notebooks/")]
PHONE_PX = 400
FIRST_PAINT_MS = 3000
HTML_MAX_BYTES = 2 * 2**20
# the slow line of issue 42: 10 Mbit/s both ways, 40 ms of latency
SLOW_LINE = {
    "offline": False,
    "latency": 40,
    "downloadThroughput": 10e6 / 8,
    "uploadThroughput": 10e6 / 8,
}


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_reads_on_a_phone(page, server, browser):
    """At 400 px no page scrolls sideways, and a tap on a figure opens it at full
    size (its drawn width: the page shows it at about half of that)."""
    driver = browser
    metrics = {"width": PHONE_PX, "height": 800, "deviceScaleFactor": 2, "mobile": True}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        driver.get(f"{server}/{page}.html")
        _wait(driver, "return document.readyState === 'complete'", what="the page")
        width = driver.execute_script("return document.documentElement.scrollWidth")
        wide = driver.execute_script(
            "return Array.from(document.querySelectorAll('.bd-article *'))"
            ".filter(e => e.getBoundingClientRect().right > arguments[0] + 1"
            "  && !e.closest('details:not([open])') && e.offsetParent !== null)"
            ".filter(e => !Array.from(e.children).some(c =>"
            "  c.getBoundingClientRect().right > arguments[0] + 1))"
            ".slice(0, 5).map(e => e.tagName + '.' + e.className.slice(0, 30)"
            "  + ': ' + (e.innerText || '').slice(0, 40))",
            PHONE_PX,
        )
        assert width <= PHONE_PX + 1, (
            f"{page}: {width} px wide at {PHONE_PX} px; widest elements: {wide}"
        )
        figures = driver.find_elements(
            "css selector", ".cell_output img:not(.jupyter-widgets img)"
        )
        if figures:
            driver.execute_script(
                "arguments[0].scrollIntoView({block: 'center'})", figures[0]
            )
            figures[0].click()
            _wait(
                driver,
                "const i = document.querySelector('.fmlab-figure-zoom img');"
                "return i && i.complete && i.naturalWidth > 0",
                timeout=10,
                what="the figure to open at full size",
            )
            shown, drawn = driver.execute_script(
                "const i = document.querySelector('.fmlab-figure-zoom img');"
                "const f = arguments[0];"
                "return [i.clientWidth, parseFloat(f.style.width)"
                " || parseFloat(f.getAttribute('width')) || f.naturalWidth / 2]",
                figures[0],
            )
            assert shown >= 0.95 * drawn, f"{page}: full size {shown} < {drawn} px"
            _screenshot_phone(driver, page + "-zoom")
            driver.find_element("css selector", ".fmlab-figure-zoom").click()
            assert not driver.find_elements("css selector", ".fmlab-figure-zoom")
        driver.execute_script("window.scrollTo(0, 0)")
        _screenshot_phone(driver, page + "-phone")
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def _screenshot_phone(driver, name: str) -> None:
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    (SHOTS / f"{name.replace('/', '__')}.png").write_bytes(
        base64.b64decode(shot["data"])
    )


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_paints_fast_on_a_slow_line(page, server, browser):
    """On a 10 Mbit/s line with 40 ms latency and an empty browser cache, a chapter's
    first contentful paint comes within 3 s, and its HTML is under 2 MB."""
    size = (HTML / f"{page}.html").stat().st_size
    assert size < HTML_MAX_BYTES, f"{page}: HTML of {size / 2**20:.1f} MB"
    driver = browser
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", SLOW_LINE)
    try:
        # navigate without waiting for the load event: the paint is what is measured,
        # and the rest of the page (fonts, widget bundle) may load after it
        driver.execute_cdp_cmd("Page.navigate", {"url": f"{server}/{page}.html"})
        _wait(
            driver,
            f"return location.pathname.endsWith('/{page}.html') && "
            "performance.getEntriesByName('first-contentful-paint').length > 0",
            timeout=60,
            what="the first contentful paint",
        )
        paint = driver.execute_script(
            "return performance.getEntriesByName('first-contentful-paint')[0].startTime"
        )
    finally:
        driver.execute_cdp_cmd(
            "Network.emulateNetworkConditions",
            {
                "offline": False,
                "latency": 0,
                "downloadThroughput": -1,
                "uploadThroughput": -1,
            },
        )
        driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": False})
    PAINTS[page] = (paint, size)
    assert paint < FIRST_PAINT_MS, f"{page}: first contentful paint {paint:.0f} ms"


PAINTS: dict[str, tuple[float, int]] = {}


def test_zz_first_paint_table():
    """Prints the first-paint table of the chapters measured above."""
    if not PAINTS:
        pytest.skip("no chapter page was measured")
    print("\npage | first contentful paint (ms) | HTML (kB)")
    for page, (paint, size) in PAINTS.items():
        print(f"{page} | {paint:.0f} | {size / 1024:.0f}")

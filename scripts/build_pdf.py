"""Print the whole book to one PDF: ``_build/pdf/book.pdf``.

    python scripts/build_pdf.py [--html _build/singlehtml] [--out _build/pdf/book.pdf]

``make pdf`` builds the single-page HTML version of the book first (``jupyter-book build
. --builder singlehtml``, from the same execution cache as the site), then runs this
script: it serves that page locally, opens it in the headless Chromium the browser test
uses, waits until MathJax has typeset the mathematics and the slider figures have been
drawn from their stored state (each shows its default frame), and prints it with
Chromium's own PDF printer (page numbers in the footer). Code cells that the page folds
stay folded; the print style (``assets/fmlab.css``) leaves out the navigation. A later
``make book`` links the PDF from the preface and every download menu.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import re
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _wait(driver, script: str, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if driver.execute_script(script):
            return
        time.sleep(0.5)
    print(f"build_pdf: gave up waiting for {what} after {timeout:.0f} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "singlehtml")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "_build" / "pdf" / "book.pdf"
    )
    args = parser.parse_args(argv)
    if not (args.html / "index.html").is_file():
        print(f"build_pdf: no {args.html}/index.html; run the singlehtml build first")
        return 1
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chrome or not driver_path:
        print(
            "build_pdf: needs chromium and chromedriver (apt-get install chromium "
            "chromium-driver)"
        )
        return 1
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    # Jupyter Book's root page is book/preface: the single page is written there, with
    # links relative to the site's root; a copy at the root resolves them
    page = args.html / "index.html"
    redirect = re.search(r'url=([^"]+)"', page.read_text(encoding="utf-8"))
    if redirect:
        page = args.html / "the-whole-book.html"
        shutil.copy2(args.html / redirect.group(1), page)

    handler = functools.partial(_Quiet, directory=str(args.html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        opts.add_argument(flag)
    driver = webdriver.Chrome(
        service=Service(executable_path=driver_path), options=opts
    )
    driver.set_page_load_timeout(300)
    driver.set_script_timeout(300)
    try:
        driver.get(f"http://127.0.0.1:{httpd.server_address[1]}/{page.name}")
        _wait(driver, "return document.readyState === 'complete'", 300, "the page")
        _wait(
            driver,
            "return !window.MathJax || (MathJax.startup && MathJax.startup.promise"
            " && document.querySelectorAll('mjx-container').length > 0)",
            300,
            "MathJax",
        )
        driver.execute_async_script(
            "const done = arguments[0];"
            "if (window.MathJax && MathJax.startup && MathJax.startup.promise)"
            "  MathJax.startup.promise.then(() => done(1)); else done(0);"
        )
        has_widgets = driver.execute_script(
            "return document.querySelectorAll("
            "'script[type=\"application/vnd.jupyter.widget-view+json\"]').length"
        )
        if has_widgets:
            _wait(
                driver,
                "return document.querySelectorAll('.widget-slider').length >= "
                f"{has_widgets}",
                300,
                "the slider figures",
            )
        _wait(
            driver,
            "return Array.from(document.images).every(i => i.complete)",
            300,
            "the images",
        )
        pdf = driver.execute_cdp_cmd(
            "Page.printToPDF",
            {
                "printBackground": True,
                "paperWidth": 8.27,  # A4
                "paperHeight": 11.69,
                "marginTop": 0.6,
                "marginBottom": 0.7,
                "marginLeft": 0.6,
                "marginRight": 0.6,
                "displayHeaderFooter": True,
                "headerTemplate": "<span></span>",
                "footerTemplate": (
                    '<div style="font-size:8px;width:100%;text-align:center">'
                    '<span class="pageNumber"></span> / <span class="totalPages">'
                    "</span></div>"
                ),
            },
        )
    finally:
        driver.quit()
        httpd.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(base64.b64decode(pdf["data"]))
    print(f"build_pdf: {args.out} ({args.out.stat().st_size / 2**20:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Headless Chromium for the browser tests (test_browser.py, test_lab.py): one place
for the skip-or-fail rule, the driver's set-up and the polling wait.

Without Debian's ``chromium`` and ``chromedriver`` (or selenium) a browser test skips
with a loud reason, unless ``FMLAB_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which turns
that skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

REQUIRED = os.environ.get("FMLAB_REQUIRE_BROWSER", "") not in ("", "0")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)


def unavailable(reason: str, what: str = "BROWSER TEST"):
    """Skip loudly, or fail when the browser is required."""
    message = f"{what} NOT RUN: {reason}"
    print("\n" + "!" * 78 + f"\n{message}\n" + "!" * 78)
    if REQUIRED:
        pytest.fail(message + " (FMLAB_REQUIRE_BROWSER=1 makes this a failure)")
    pytest.skip(message)


def driver(*extra_flags: str, capabilities: dict | None = None, what="BROWSER TEST"):
    """A headless Chromium driven by selenium, with :data:`FLAGS` and
    ``extra_flags``; skips (or fails) through :func:`unavailable` without one."""
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chrome or not driver_path:
        unavailable(
            "Chromium and chromedriver are not installed "
            "(apt-get install chromium chromium-driver)",
            what,
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed in this environment", what)
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for flag in FLAGS + extra_flags:
        opts.add_argument(flag)
    for name, value in (capabilities or {}).items():
        opts.set_capability(name, value)
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)


def wait(driver, script, timeout=30.0, what="condition", poll=0.2):
    """Poll ``script`` until it returns something true, or fail after ``timeout`` s."""
    end = time.time() + timeout
    while time.time() < end:
        if driver.execute_script(script):
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")

"""A real headless Chromium for browser tests: Debian's `chromium` and `chromium-driver`, driven
by Selenium with both paths given, so Selenium Manager never runs (nothing is downloaded). Where
either is missing the test is skipped with the reason, a failure where CI is set."""

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

from missing import skip_or_fail

CHROMIUM = ("chromium", "chromium-browser")
CHROMEDRIVER = "chromedriver"
ROOT = Path(__file__).resolve().parents[1]


def _which(*names: str) -> str | None:
    return next((p for p in map(shutil.which, names) if p), None)


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator["webdriver.Chrome"]:  # noqa: F821
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        skip_or_fail("selenium is not installed (it is in the `test` extra: scripts/setup)")
    browser, driver = _which(*CHROMIUM), _which(CHROMEDRIVER)
    if browser is None or driver is None:
        skip_or_fail("chromium and chromedriver are not on PATH (apt-get install chromium chromium-driver)")
    os.environ["SE_OFFLINE"] = "true"  # belt and braces: Selenium Manager must never fetch a browser
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--force-device-scale-factor=1", "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def screenshot_dir() -> Path:
    """Where browser tests save their screenshots: LORAPLEX_SCREENSHOTS (docs/img to refresh
    docs/console.md's), else var/screenshots."""
    out = Path(os.environ.get("LORAPLEX_SCREENSHOTS") or ROOT / "var" / "screenshots")
    if not out.is_absolute():
        out = ROOT / out
    out.mkdir(parents=True, exist_ok=True)
    return out


def full_page_screenshot(driver, path: Path) -> Path:
    """The whole page, not just the viewport (Chrome DevTools' capture beyond the viewport)."""
    import base64

    png = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    path.write_bytes(base64.b64decode(png["data"]))
    return path

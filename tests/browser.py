"""Headless Debian Chromium driven by selenium, for the tests of hfai-web's pages."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def chromium(profile: Path, *, hide_scrollbars: bool = False):
    """A headless Chromium with its own profile folder; skips the test without Debian's chromium
    and chromium-driver (fails it under CI, which installs them: .ci/run)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if binary is None or not Path(driver_path).exists():
        why = "needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={profile}"]
    if hide_scrollbars:  # full-page screenshots without a scrollbar's strip
        flags.append("--hide-scrollbars")
    for flag in flags:
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=opts)

"""Headless Chromium for the browser tests: Debian's ``chromium`` package (``.ci/run``
installs it), driven by Playwright; never a downloaded browser."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import pytest

CHROMIUM: Final = Path("/usr/bin/chromium")
CHROMIUM_ARGS: Final = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Outside CI a machine without the browser skips these tests; in CI they must run.
MISSING: Final = not CHROMIUM.exists() and os.environ.get("CI") != "true"
MISSING_REASON: Final = (
    f"{CHROMIUM} is missing (install Debian's chromium package; in CI this test runs)"
)


def skip_module_without_chromium() -> None:
    """Skip the calling test module when the browser is missing (never in CI)."""
    if MISSING:
        pytest.skip(MISSING_REASON, allow_module_level=True)

"""A real headless browser for the tests: Debian's chromium, run once per screenshot with
nothing that reaches the network (no sync, no component updates, no QUIC, a fresh profile)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.tools import require_tool


def screenshot(page: Path, png: Path, width: int, height: int) -> bytes:
    """Open ``page`` (a local file) in headless chromium at ``width`` x ``height`` CSS pixels,
    one device pixel each, and return the PNG of what it shows."""
    chromium = require_tool("chromium", "chromium")
    profile = png.parent / f"{png.stem}-profile"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            f"--window-size={width},{height}",
            page.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return png.read_bytes()

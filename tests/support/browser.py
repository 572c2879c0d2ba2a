"""A real headless browser for the tests: Debian's chromium, with nothing that reaches the
network (no sync, no component updates, no QUIC, a fresh profile).

:func:`screenshot` runs it once per picture. :class:`Chromium` drives one over its DevTools pipe
(file descriptors 3 and 4, no port is opened) for what the command line cannot do: lay a page
out for print (emulated print media at a paper's width), measure where its elements went, and
print it to PDF as a user's print dialog would, backgrounds off.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.tools import require_tool

QUIET = [
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
]


def screenshot(page: Path, png: Path, width: int, height: int) -> bytes:
    """Open ``page`` (a local file) in headless chromium at ``width`` x ``height`` CSS pixels,
    one device pixel each, and return the PNG of what it shows."""
    chromium = require_tool("chromium", "chromium")
    profile = png.parent / f"{png.stem}-profile"
    subprocess.run(
        [
            chromium,
            *QUIET,
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


class Chromium:
    """One headless chromium and one tab in it, driven over the DevTools protocol's pipe.

    Use it as a context manager: ``with Chromium(tmp_path) as browser: browser.open(...)``; it
    loads local files only.
    """

    def __init__(self, workdir: Path) -> None:
        chromium = require_tool("chromium", "chromium")
        commands_read, self._commands = _pipe()
        self._replies, replies_write = _pipe()
        self._buffer = b""
        self._next_id = 0
        self._session: str | None = None
        # The protocol's pipe is chromium's fds 3 (commands) and 4 (replies); both ends are
        # numbered 10 or more, so moving them there clobbers neither (bash: dash takes one digit).
        read, write = commands_read, replies_write
        move = f'exec "$@" 3<&{read} 4>&{write} {read}<&- {write}>&-'
        self._process = subprocess.Popen(
            [
                require_tool("bash", "bash"),
                "-c",
                move,
                "bash",
                chromium,
                *QUIET,
                "--remote-debugging-pipe",
                f"--user-data-dir={workdir}/profile",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(commands_read, replies_write),
        )
        os.close(commands_read)
        os.close(replies_write)

    def __enter__(self) -> Chromium:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self._session = attached["sessionId"]
        self.call("Page.enable")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            self._session = None
            self.call("Browser.close")
        except OSError:
            pass  # it is gone already
        finally:
            os.close(self._commands)
            os.close(self._replies)
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def open(self, page: Path, width: int, height: int, *, media: str = "") -> None:
        """Show ``page`` (a local file) at ``width`` x ``height`` CSS pixels and wait until it
        has loaded; ``media="print"`` lays it out on screen as for paper (none: as on screen,
        and printing it uses the print style)."""
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.call("Emulation.setDeviceMetricsOverride", metrics)
        self.call("Emulation.setEmulatedMedia", {"media": media})
        url = page.resolve().as_uri()
        self.call("Page.navigate", {"url": url})
        loaded = f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
        deadline = time.monotonic() + 60
        while not self.evaluate(loaded):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load in a minute")
            time.sleep(0.05)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (the page itself runs no script)."""
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def print_pdf(self, **options: Any) -> bytes:
        """The page printed to PDF with chromium's print defaults (Letter, backgrounds off, the
        page's own ``@page`` margins), as a user's print dialog prints it."""
        return base64.b64decode(self.call("Page.printToPDF", options)["data"])

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send one command and return its result (events that arrive meanwhile are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self._session is not None:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium exited ({self._process.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message


def _pipe() -> tuple[int, int]:
    """A pipe whose two ends are numbered 10 or more (and not inherited unless passed)."""
    ends = []
    for end in os.pipe():
        ends.append(fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(end)
    return ends[0], ends[1]

"""Debian's headless Chromium, driven over the DevTools protocol (for the lock board's tests and screenshot).

:func:`chromium_path` installs Debian's ``chromium`` with apt-get when it is
missing (:func:`tests.provision.debian_programs`, as the MariaDB fixture
does). :class:`Browser` starts it headless with ``--remote-debugging-port=0``
in a fresh profile, and speaks the DevTools protocol (JSON over a WebSocket,
https://chromedevtools.github.io/devtools-protocol/) with aiohttp: navigate,
evaluate an expression in the page, take a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from .provision import debian_programs

__all__ = ["Browser", "chromium_path"]

_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


def chromium_path() -> str:
    """The path of ``chromium``, installed from Debian's package when missing."""
    return debian_programs(["chromium"], ["chromium"])["chromium"]


class Browser:
    """A headless Chromium with one page (use as ``async with Browser(path) as browser``).

    Args:
        path: the chromium program.
        width, height: the window, in CSS pixels.
    """

    def __init__(self, path: str, *, width: int = 1400, height: int = 900) -> None:
        self._path, self._size = path, f"{width},{height}"
        self._ids = itertools.count(1)
        self._profile = tempfile.TemporaryDirectory(prefix="fencepost-chromium-")
        self._process: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None

    async def __aenter__(self) -> Browser:
        args = ["--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--remote-debugging-port=0", f"--user-data-dir={self._profile.name}", f"--window-size={self._size}",
                "about:blank"]
        if os.geteuid() == 0:
            args.insert(0, "--no-sandbox")  # Chromium's sandbox refuses to run as root
        self._process = await asyncio.create_subprocess_exec(self._path, *args, stdout=asyncio.subprocess.DEVNULL,
                                                             stderr=asyncio.subprocess.PIPE)
        try:
            browser_url = await asyncio.wait_for(self._listening(), 60)
            self._session = aiohttp.ClientSession()
            port = browser_url.split("/")[2]
            async with self._session.get(f"http://{port}/json/list") as answer:
                pages = [t for t in await answer.json() if t["type"] == "page"]
            self._socket = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _listening(self) -> str:
        assert self._process is not None and self._process.stderr is not None
        while True:
            line = await self._process.stderr.readline()
            if not line:
                raise RuntimeError(f"{self._path} exited with {await self._process.wait()} before listening")
            found = _LISTENING.search(line)
            if found:
                asyncio.ensure_future(self._drain())
                return found.group(1).decode()

    async def _drain(self) -> None:
        """Read the rest of Chromium's stderr (a full pipe would block it)."""
        assert self._process is not None and self._process.stderr is not None
        while await self._process.stderr.readline():
            pass

    async def __aexit__(self, *_: object) -> None:
        if self._socket is not None:
            await self._socket.close()
        if self._session is not None:
            await self._session.close()
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        with contextlib.suppress(OSError):
            self._profile.cleanup()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result.

        Raises:
            RuntimeError: the command failed (the protocol's error message).
        """
        assert self._socket is not None
        ident = next(self._ids)
        await self._socket.send_json({"id": ident, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self._socket.receive_json(), 30)
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})  # type: ignore[no-any-return]

    async def open(self, url: str) -> None:
        """Load ``url`` in the page."""
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values)."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        """A PNG of the page as shown, into ``path``."""
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

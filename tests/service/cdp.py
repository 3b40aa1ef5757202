"""A small driver for headless Chromium over the DevTools protocol (websocket-client, which the
kubernetes client already brings): navigate, type into a form, read the DOM, cookies and history,
take a screenshot. Enough to use the operator page as a person would, with no browser download."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import websocket

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--window-size=1200,700", "--remote-debugging-port=0", "--remote-allow-origins=*"]


class Browser:
    def __init__(self, tmp_path: Path) -> None:
        assert CHROMIUM is not None
        self.profile = tmp_path / f"cdp-profile-{time.monotonic_ns()}"
        self.process = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ids = itertools.count(1)
        self.socket = websocket.create_connection(self._page_socket(), timeout=30, suppress_origin=True)
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=1200, height=700, deviceScaleFactor=1, mobile=False)

    def _page_socket(self) -> str:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        import httpx

        while True:
            pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json", trust_env=False).json()
                     if t["type"] == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == ident:
                assert "error" not in message, message
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                         awaitPromise=True)["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(f"document.readyState === 'complete' && ({expression})"):
            if time.monotonic() > deadline:
                raise TimeoutError(expression)
            time.sleep(0.1)

    def sign_in(self, url: str, token: str) -> None:
        """Open `url`, which shows the sign-in form, type the token and submit it."""
        self.send("Page.navigate", url=url)
        self.wait_for("document.querySelector('input[name=token]') !== null")
        self.evaluate(f"document.querySelector('input[name=token]').value = {json.dumps(token)}; "
                      "document.querySelector('form').submit(); true")
        self.wait_for("document.querySelector('form') === null || "
                      "document.querySelector('.error').textContent !== 'sign in to see the queue'")

    def url(self) -> str:
        return self.evaluate("location.href")

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def history(self) -> list[str]:
        entries = self.send("Page.getNavigationHistory")["entries"]
        return [entry["url"] for entry in entries]

    def cookie(self, name: str) -> dict[str, Any] | None:
        cookies = self.send("Network.getCookies")["cookies"]
        return next((cookie for cookie in cookies if cookie["name"] == name), None)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)

"""`specdec play` as the tests run it: a real server process on a free port, with a test plugin
installed beside it (a drafter that raises, one that cannot be made without options)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROMPT = "def area(r):\n    return"  # the prompt the play tests type

PLUGIN = '''
import specdec


class RaisingDrafter:
    """Raises in propose: the page must say so and keep serving."""
    name = "play-raiser"

    def propose(self, ctx, k):
        raise RuntimeError("this drafter always fails")


class PathDrafter:
    """Cannot be made without a path: the page lists it as unavailable."""
    name = "play-needs-path"

    def __init__(self, path):
        self.path = path

    def propose(self, ctx, k):
        raise AssertionError("never made")


@specdec.hookimpl
def specdec_register_drafters():
    return [RaisingDrafter, PathDrafter]
'''


def install_test_plugin(folder: Path) -> Path:
    """A plugin distribution `specdec-play-test` in `folder` (put it on PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "specdec_play_test_plugin.py").write_text(PLUGIN)
    info = folder / "specdec_play_test_plugin-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specdec-play-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[specdec]\nplay-test = specdec_play_test_plugin\n")
    return folder


@dataclass
class PlayServer:
    """A running `specdec play`: its address and everything it printed so far."""

    process: subprocess.Popen[str]
    url: str
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def get(self, path: str, host: str | None = None) -> tuple[int, Any]:
        """GET `path`; `host` sends that Host header instead of the URL's."""
        return _answer(urllib.request.Request(self.url + path, headers={"Host": host} if host else {}))

    def post(self, path: str, body: Any, content_type: str = "application/json",
             host: str | None = None) -> tuple[int, Any]:
        """POST `body` (JSON unless bytes) to `path`; `host` sends that Host header instead of the URL's."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": content_type, **({"Host": host} if host else {})}
        return _answer(urllib.request.Request(self.url + path, data=data, method="POST", headers=headers))

    def stop(self, timeout: float = 60) -> int:
        """Ctrl-C, as a user stops it; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout)


def _answer(request: urllib.request.Request) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            raw, status, kind = response.read(), response.status, response.headers.get("content-type", "")
    except urllib.error.HTTPError as error:
        raw, status, kind = error.read(), error.code, error.headers.get("content-type", "")
    return status, json.loads(raw) if "json" in kind else raw.decode()


def start_play(arguments: list[str], plugin_dir: Path | None, timeout: float = 300) -> PlayServer:
    """`python -m specdec play --port 0 ARGUMENTS`, returned once it prints its address."""
    env = dict(os.environ)
    if plugin_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["OMP_NUM_THREADS"] = "1"
    process = subprocess.Popen([sys.executable, "-m", "specdec", "play", "--port", "0", *arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()
    server = PlayServer(process, "")

    def pump(stream: Any, into: list[str], announce: bool) -> None:
        for line in stream:
            into.append(line)
            if announce:
                lines.put(line)
        if announce:
            lines.put(None)

    assert process.stdout is not None and process.stderr is not None
    threading.Thread(target=pump, args=(process.stdout, server.stdout, True), daemon=True).start()
    threading.Thread(target=pump, args=(process.stderr, server.stderr, False), daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            process.kill()
            raise RuntimeError(f"specdec play printed no address within {timeout} s") from None
        if line is None:
            raise RuntimeError(f"specdec play exited ({process.wait()}): {''.join(server.stderr)[-3000:]}")
        if "serving http://" in line:
            server.url = line.split("serving ", 1)[1].split()[0].rstrip("/")
            return server


def call_app(app: Any, method: str, path: str, body: Any = None, host: str = "127.0.0.1:8000") -> tuple[int, Any]:
    """One request straight into the ASGI `app` in this process (no socket, no HTTP client):
    the status and the answer (parsed when JSON)."""
    import anyio

    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    sent: list[dict[str, Any]] = []
    bodies = [{"type": "http.request", "body": data, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return bodies.pop() if bodies else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", host.encode()), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    anyio.run(app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    kind = dict(start["headers"]).get(b"content-type", b"").decode()
    return start["status"], json.loads(raw) if "json" in kind else raw.decode()

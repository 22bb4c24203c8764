"""`specdec play` answers only requests whose Host header names the address it serves (the
DNS-rebinding hole): the names it allows for each `--host`, and the real server refusing any other."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from play_server import PROMPT, call_app, start_play

from specdec.cli.common import CLIError
from specdec.cli.play import allowed_hosts
from specdec.play import Playground
from specdec.play.app import create_app


def test_the_allowed_hosts_follow_the_address_served(monkeypatch: pytest.MonkeyPatch) -> None:
    assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "[::1]"]
    assert set(allowed_hosts("localhost")) == set(allowed_hosts("::1")) == {"localhost", "127.0.0.1", "[::1]"}
    assert set(allowed_hosts("127.0.0.2")) == {"127.0.0.2", "localhost", "127.0.0.1", "[::1]"}
    assert allowed_hosts("192.168.1.5") == ["192.168.1.5"]
    assert allowed_hosts("192.168.1.5", ["Play.Example.com", "::1", "[FE80::1]"]) == [
        "192.168.1.5", "play.example.com", "[::1]", "[fe80::1]"]
    addresses = {"playbox": "10.1.2.3", "playbox.lab.example": "2001:db8::7"}

    def resolve(name: str, port: object, *args: object, **kwargs: object) -> list[tuple]:
        if name not in addresses:
            raise socket.gaierror(f"unknown {name}")
        family = socket.AF_INET6 if ":" in addresses[name] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (addresses[name], 0))]

    monkeypatch.setattr(socket, "gethostname", lambda: "playbox")
    monkeypatch.setattr(socket, "getfqdn", lambda name="": "playbox.lab.example")
    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    machine = {"localhost", "127.0.0.1", "[::1]", "playbox", "playbox.lab.example", "10.1.2.3", "[2001:db8::7]"}
    assert set(allowed_hosts("0.0.0.0")) == machine | {"0.0.0.0"}
    assert set(allowed_hosts("::", ["proxy.example.com"])) == machine | {"[::]", "proxy.example.com"}


@pytest.mark.parametrize("name", ["*.example.com", "play.example.com:8000", "http://play.example.com", "",
                                  "a b"])
def test_an_allowed_host_that_is_no_name_is_refused(name: str) -> None:
    with pytest.raises(CLIError, match=re.escape(f"--allowed-host {name!r} is not a host name or address")):
        allowed_hosts("127.0.0.1", [name])


def test_the_allowed_names_are_those_the_host_header_carries(playground: Playground) -> None:
    app = create_app(playground, allowed_hosts=allowed_hosts("::1", ["play.example.com"]))
    for host in ("[::1]:8000", "LOCALHOST:8000", "127.0.0.1", "play.example.com"):
        assert call_app(app, "GET", "/api/info", host=host)[0] == 200, host
    for host in ("evil.example.com", "[::2]:8000", "127.0.0.2:8000", "::1"):
        assert call_app(app, "GET", "/api/info", host=host) == (400, "Invalid host header"), host
    with pytest.raises(ValueError, match="without wildcards"):
        create_app(playground, allowed_hosts=["*"])


@pytest.mark.parametrize("method, path", [("GET", "/"), ("GET", "/api/info"), ("GET", "/static/play.js"),
                                          ("POST", "/api/run"), ("POST", "/api/compare")])
def test_a_request_for_another_host_is_refused_and_serves_nothing(play_server, method: str, path: str) -> None:
    for host in ("evil.example.com", f"evil.example.com:{play_server.port}"):
        if method == "GET":
            answer = play_server.get(path, host=host)
        else:
            answer = play_server.post(path, {"prompt": PROMPT, "max_new_tokens": 4}, host=host)
        assert answer == (400, "Invalid host header"), host


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "[::1]"])
def test_the_loopback_names_are_served(play_server, name: str) -> None:
    host = f"{name}:{play_server.port}"
    status, page = play_server.get("/", host=host)
    assert status == 200 and "<title>specdec play</title>" in page
    status, info = play_server.get("/api/info", host=host)
    assert status == 200 and "ngram" in [d["name"] for d in info["drafters"]]
    status, run = play_server.post("/api/run", {"prompt": PROMPT, "drafter": "ngram", "max_new_tokens": 4}, host=host)
    assert status == 200 and len(run["tokens"]) == 4


def test_a_wildcard_bind_answers_this_machines_names_and_allowed_hosts(quick_zoo: Path) -> None:
    server = start_play(["--host", "0.0.0.0", "--allowed-host", "play.example.test", "--quick", "--cache-dir",
                         str(quick_zoo.parent), "--drafter", "ngram"], None)
    try:
        for host in (socket.gethostname(), "localhost", "play.example.test"):
            assert server.get("/api/info", host=f"{host}:{server.port}")[0] == 200, host
        assert server.get("/api/info", host="evil.example.com") == (400, "Invalid host header")
    finally:
        assert server.stop() == 0
    assert "play.example.test" in "".join(server.stderr)

"""The HTTP side of `specdec play`: a Starlette app serving the page's three files and its JSON
API, every error as a JSON body `{"error": ..., "status": ...}`.

    GET  /                 the page (static/index.html; its script and style beside it)
    GET  /static/{name}    play.js, play.css: the page's own files, nothing else
    GET  /api/info         the drafters, limits and defaults the controls are drawn from
    POST /api/run          a traced generation: the step view and the timeline
    POST /api/compare      every drafter on one prompt
    POST /api/probe        one forward's verdicts on a typed continuation

The model runs on one worker thread, one request at a time; at most `Limits.queue` more wait
for it, and the next is answered 503 (busy) at once. POSTs must say `application/json`, which a
page on another origin cannot send without the browser first asking permission (not given).
Only requests whose Host header names the server (`allowed_hosts`) are served; any other is
answered 400 "Invalid host header" before it reaches a route, so a page whose name was rebound
to this machine's address (DNS rebinding) reads nothing. A request's own error (4xx) says what
was wrong with it; an error it did not cause (a drafter's, the server's) is a 500 with a fixed
message, its exception and traceback logged to `specdec.play` and never sent to the client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specdec.play.playground import Playground
from specdec.play.requests import BadRequest, CompareRequest, ProbeRequest, RunRequest, parse_request
from specdec.verifier import DraftError

__all__ = ["PAGE_FILES", "ModelQueue", "create_app"]

logger = logging.getLogger("specdec.play")

PAGE_FILES = {"index.html": "text/html; charset=utf-8", "play.js": "text/javascript; charset=utf-8",
              "play.css": "text/css; charset=utf-8"}


class ModelQueue:
    """One model thread, and a bound on the requests waiting for it."""

    def __init__(self, waiting: int) -> None:
        self.limiter = anyio.CapacityLimiter(1)
        self.waiting = waiting
        self.admitted = 0  # served + waiting (the event loop is one thread: no lock needed)

    async def call(self, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if self.admitted > self.waiting:
            raise BadRequest(503, f"the model is busy with {self.admitted} requests (one running, "
                                  f"{self.admitted - 1} waiting, the most this server queues); try again shortly")
        self.admitted += 1
        try:
            return await anyio.to_thread.run_sync(work, limiter=self.limiter)
        finally:
            self.admitted -= 1


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def _failed(request: Request, what: str, error: BaseException) -> JSONResponse:
    """A 500 for `error`: its traceback to the log, a fixed message to the client (an exception's
    text may hold paths, settings or data the client has no business reading)."""
    logger.error("%s %s failed", request.method, request.url.path, exc_info=error)
    return _error(500, f"{what}; the server's log has the details")


def _page_files() -> dict[str, bytes]:
    folder = resources.files("specdec.play") / "static"
    return {name: (folder / name).read_bytes() for name in PAGE_FILES}


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it passes `limit` bytes."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise BadRequest(415, f"send the request as JSON with Content-Type: application/json (got "
                              f"{request.headers.get('content-type', 'none')!r})")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"the request body is over {limit} bytes, the most this page takes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(playground: Playground, *, allowed_hosts: Sequence[str]) -> Starlette:
    """The app serving `playground`'s page and API to requests whose Host header names one of
    `allowed_hosts` (names or addresses, IPv6 ones in brackets: "[::1]"; the port is not compared)."""
    if not allowed_hosts or any("*" in name or not name for name in allowed_hosts):
        raise ValueError(f"allowed_hosts must name the hosts this page answers to, without wildcards, got "
                         f"{list(allowed_hosts)!r}")
    files = _page_files()
    queue = ModelQueue(playground.limits.queue)

    async def page(request: Request) -> Response:
        return Response(files["index.html"], media_type=PAGE_FILES["index.html"])

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in files:
            return _error(404, f"no page file {name!r}; the page's files are {', '.join(PAGE_FILES)}")
        return Response(files[name], media_type=PAGE_FILES[name], headers={"Cache-Control": "no-cache"})

    async def info(request: Request) -> Response:
        return JSONResponse(playground.describe())

    def api(kind: type, work: Callable[[Any], dict[str, Any]]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                parsed = parse_request(await _body(request, playground.limits.max_body_bytes), kind,
                                       playground.limits)
                return JSONResponse(await queue.call(lambda: work(parsed)))
            except BadRequest as error:
                return _error(error.status, str(error))
            except DraftError as error:  # the drafter's fault, not the request's
                return _failed(request, "the drafter failed", error)
            except Exception as error:  # a fault of the server's (the request was checked before any decoding)
                return _failed(request, "the server failed", error)
        return endpoint

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if error.status_code == 404:
            return _error(404, f"no such page: {request.url.path}; the page is at /")
        if error.status_code == 405:
            return _error(405, f"{request.method} is not allowed on {request.url.path}")
        return _error(error.status_code, str(error.detail))

    async def server_error(request: Request, error: Exception) -> Response:  # raised outside the API's endpoints
        return _failed(request, "the server failed", error)

    routes = [Route("/", page, methods=["GET"]), Route("/static/{name:path}", static, methods=["GET"]),
              Route("/api/info", info, methods=["GET"]),
              Route("/api/run", api(RunRequest, playground.run), methods=["POST"]),
              Route("/api/compare", api(CompareRequest, playground.compare), methods=["POST"]),
              Route("/api/probe", api(ProbeRequest, playground.probe), methods=["POST"])]
    hosts = Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts), www_redirect=False)
    return Starlette(routes=routes, middleware=[hosts],
                     exception_handlers={HTTPException: http_error, Exception: server_error})

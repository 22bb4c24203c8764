"""`specdec play`: the interactive page on the zoo (or `--target DIR` with `--drafter` specs),
served on 127.0.0.1 until Ctrl-C (`specdec.play`), to requests addressed to that host only."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.cli.common import CLIError, load_target
from specdec.errors import one_line

__all__ = ["LOOPBACK_NAMES", "add_play_command", "allowed_hosts", "is_loopback"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")  # how a browser on this machine names it
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address `name` spells (an IPv6 one with or without brackets), or None for a name."""
    try:
        return ipaddress.ip_address(name[1:-1] if name.startswith("[") and name.endswith("]") else name)
    except ValueError:
        return None


def _host_name(name: str) -> str:
    """`name` as a Host header carries it (lowercase; an IPv6 address in brackets)."""
    address = _address(name)
    if address is None:
        return name.lower()
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def _this_machine() -> list[str]:
    """This machine's host name, its fully qualified name and the addresses they resolve to."""
    names = [socket.gethostname(), socket.getfqdn()]
    addresses = []
    for name in names:
        try:
            addresses += [str(info[4][0]) for info in socket.getaddrinfo(name, None)]
        except (OSError, UnicodeError):  # a name that does not resolve adds no address
            pass
    return [n for n in names + addresses if n]


def allowed_hosts(host: str, extra: Sequence[str] = ()) -> list[str]:
    """The Host header names the page answers to when served on `host`: the host itself; for a
    loopback host also the loopback names; for a wildcard (0.0.0.0, ::) those and this machine's
    names and addresses; then `extra` (--allowed-host, e.g. a reverse proxy's name)."""
    names = [host]
    address = _address(host)
    wildcard = address is not None and address.is_unspecified
    if is_loopback(host) or wildcard:
        names += LOOPBACK_NAMES
    if wildcard:
        names += _this_machine()
    for name in extra:
        if _address(name) is None and not _HOST_NAME.fullmatch(name):
            raise CLIError(f"--allowed-host {name!r} is not a host name or address; give one such as "
                           "play.example.com or 192.168.1.5, without a scheme, port or wildcard")
        names.append(name)
    return list(dict.fromkeys(_host_name(n) for n in names))


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); port 0 takes a free one."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise CLIError(f"--host {host!r} is not an address of this machine: {error}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise CLIError(f"cannot serve on {host}:{port}: {error.strerror or error}; choose another --port "
                       "(0 takes a free one)") from None
    sock.listen(64)
    return sock


def _playground(args: argparse.Namespace) -> Any:
    from specdec.cli.common import parse_drafter_spec
    from specdec.play.playground import Playground, drafter_choices
    from specdec.play.requests import Limits

    known: dict[str, dict[str, Any]] = {}
    registered: dict[str, str] = {}  # zoo label -> its registered drafter
    for spec in args.drafter or []:
        name, options = parse_drafter_spec(spec)
        known[name] = options
    if args.target is None:
        from specdec import zoo

        directory = zoo.ready(zoo.QUICK if args.quick else zoo.FULL, root=args.cache_dir)
        target: Path | str = directory / "target"
        zoo_drafters = zoo.zoo_drafters(directory)  # label -> (registered drafter, options)
        zoo_options = {label: options for label, (_, options) in zoo_drafters.items()}
        registered = {label: name for label, (name, _) in zoo_drafters.items()}
        known = {**zoo_options, **known} if not args.drafter else {n: {**zoo_options.get(n, {}), **o}
                                                                   for n, o in known.items()}
        title = f"the {'quick' if args.quick else 'full'} zoo"
    else:
        target, title = args.target, str(args.target)
    tokenizer, model = load_target(target, args)
    limits = Limits(queue=args.queue)
    playground = Playground(tokenizer, model, drafter_choices(known, only_known=bool(args.drafter),
                                                              registered=registered), limits, title,
                            _example(), args.verify_rule)
    playground.warm_up()
    return playground


def _example() -> str:
    """The page's first prompt: a held-out function signature, as `specdec trace` uses."""
    from specdec.data.corpus import stdlib_corpus
    from specdec.data.prompts import code_prompts

    try:
        return code_prompts(stdlib_corpus(), per_category=1, categories=("signature",))[0].text
    except (FileNotFoundError, IndexError):
        return "def area(r):\n"


def _play(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from specdec.play.app import create_app
    except ImportError as error:
        raise CLIError(f"specdec play needs starlette and uvicorn ({error}); pip install 'specdec[play]'") from None
    if args.tp != 1:
        raise CLIError("specdec play serves one process; run it without --tp")
    if not 0 <= args.port <= 65535:
        raise CLIError(f"--port must be in [0, 65535], got {args.port}")
    if args.queue < 0:
        raise CLIError(f"--queue must be >= 0, got {args.queue}")
    hosts = allowed_hosts(args.host, args.allowed_host or [])
    sock = _bind(args.host, args.port)  # before loading: a port in use is said at once
    try:
        try:
            playground = _playground(args)
        except (ValueError, TypeError, OSError, KeyError) as error:
            raise CLIError(one_line(error)) from None
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        if not is_loopback(args.host):
            print(f"specdec play: warning: --host {args.host} makes the page reachable from other machines, and "
                  "it has no authentication: anyone who reaches it can run the model", file=sys.stderr)
            print(f"specdec play: answering requests addressed to {', '.join(hosts)} (--allowed-host adds a name)",
                  file=sys.stderr)
        names = ", ".join(c.name for c in playground.choices.values() if c.available)
        print(f"specdec play: {playground.title}, drafters {names}", flush=True)
        print(f"specdec play: serving http://{shown}:{port}/  (Ctrl-C stops)", flush=True)
        app = create_app(playground, allowed_hosts=hosts)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        _log_errors_to_stderr()
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then raises the signal again
            pass
    finally:
        sock.close()
    print("specdec play: stopped", flush=True)
    return 0


def _log_errors_to_stderr() -> None:
    """The server's own errors (the `specdec.play` log: a failed request's traceback) on stderr."""
    log = logging.getLogger("specdec.play")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("specdec play: %(levelname)s: %(message)s"))
        log.addHandler(handler)


def add_play_command(commands: Any) -> None:
    """Register `play` under the top-level subparsers."""
    from specdec.cli.common import add_model_options
    from specdec.cli.sampling_options import add_verify_rule_option

    play = commands.add_parser("play", help="an interactive page: step through speculative decoding on the zoo")
    play.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only); the page has "
                      "no authentication")
    play.add_argument("--allowed-host", action="append", metavar="NAME",
                      help="also answer requests addressed to NAME (repeat for more), e.g. the name a reverse proxy "
                           "forwards under; by default only --host's own names are answered, so that no other site "
                           "can reach the page through a rebound name (DNS rebinding)")
    play.add_argument("--port", type=int, default=8000, help="default 8000 (0 takes a free port)")
    play.add_argument("--target", metavar="DIR|ORG/NAME", default=None, help="default: the zoo's target")
    play.add_argument("--drafter", action="append", metavar="NAME[:key=value,...]",
                      help="offer this drafter (repeat for more); default: every registered drafter (the zoo's "
                           "checkpoints with the zoo)")
    play.add_argument("--quick", action="store_true", help="without --target: the quick zoo")
    play.add_argument("--cache-dir", metavar="DIR", default=None)
    play.add_argument("--queue", type=int, default=4, help="requests that may wait for the model (default 4); "
                      "more are answered 503")
    add_model_options(play, compile=False)
    add_verify_rule_option(play, default="token")  # it teaches the token-wise rule first; each step shows block too
    play.set_defaults(run=_play)

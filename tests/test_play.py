"""`specdec play` without a browser: the requests' checks, the bounded queue, the playground's
answers against `specdec.generate` and `specdec.teaching.probe`, and the real server's errors (every bad
request a 4xx/5xx JSON naming what was wrong, and the server serving on after each)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest
from play_server import start_play

import specdec
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.play import BadRequest, CompareRequest, Limits, Playground, ProbeRequest, RunRequest, drafter_choices
from specdec.play.app import ModelQueue
from specdec.play.requests import parse_request
from specdec.teaching.probe import probe
from specdec.teaching.trace import Trace
from specdec.zoo import drafter_options

PROMPT = "def area(r):\n    return"


def _refused(body: bytes, kind: type = RunRequest, limits: Limits = Limits()) -> tuple[int, str]:
    with pytest.raises(BadRequest) as caught:
        parse_request(body, kind, limits)
    return caught.value.status, str(caught.value)


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b"[" * 60000, 400, "not JSON"),
    (b'{"k": 2}', 400, "'prompt' is missing"),
    (b'{"prompt": "x", "depth": 3}', 400, "unknown field 'depth'"),
    (b'{"prompt": "x", "k": "3"}', 400, 'k must be an integer, got "3"'),
    (b'{"prompt": "x", "k": true}', 400, "k must be an integer, got true"),
    (b'{"prompt": "x", "k": 0}', 400, "k must be in [1, 16], got 0"),
    (b'{"prompt": "x", "k": 17}', 400, "k must be in [1, 16], got 17"),
    (b'{"prompt": "x", "shape": "star"}', 400, "shape must be one of chain, tree, got 'star'"),
    (b'{"prompt": "x", "temperature": -1}', 400, "temperature must be in [0, 10]"),
    (b'{"prompt": "x", "top_p": 0}', 400, "top_p must be in (0, 1]"),
    (b'{"prompt": "x", "max_new_tokens": 100000}', 413, "over this page's budget of 256"),
    (b'{"prompt": ""}', 400, "prompt is empty"),
    (json.dumps({"prompt": "x" * 5000}).encode(), 413, "prompt has 5000 characters"),
])
def test_bad_requests_are_refused_naming_the_value(body: bytes, status: int, words: str) -> None:
    got, message = _refused(body)
    assert got == status and words in message


def test_the_body_limit_and_the_other_kinds() -> None:
    assert _refused(b"{" + b" " * 70000 + b"}")[0] == 413
    assert "max_new_tokens 200 is over this page's budget of 128" in _refused(
        b'{"prompt": "x", "max_new_tokens": 200}', CompareRequest)[1]
    assert "continuation is empty" in _refused(b'{"prefix": "a", "continuation": ""}', ProbeRequest)[1]
    assert "top must be in [1, 20], got 50" in _refused(b'{"prefix": "a", "continuation": "b", "top": 50}',
                                                         ProbeRequest)[1]
    parsed = parse_request(b'{"prompt": "x", "temperature": 1, "drafter": "eagle"}', RunRequest, Limits())
    assert parsed == RunRequest(prompt="x", drafter="eagle", temperature=1.0)


def test_the_queue_serves_one_at_a_time_and_refuses_beyond_its_bound() -> None:
    """One request runs, `waiting` wait, and the next is answered 503 at once."""
    queue = ModelQueue(waiting=1)
    release, running = threading.Event(), []
    outcomes: list[object] = []

    def work() -> dict:
        running.append(threading.get_ident())
        assert len(running) - len(outcomes) <= 1  # never two at once
        release.wait(10)
        return {"ok": True}

    async def one() -> None:
        try:
            outcomes.append(await queue.call(work))
        except BadRequest as error:
            outcomes.append(error.status)
            release.set()  # the refusal came at once, while the others were still queued

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(one)
                await anyio.sleep(0.05)

    anyio.run(main)
    assert sorted(outcomes, key=str) == [503, {"ok": True}, {"ok": True}]
    assert queue.admitted == 0


@pytest.fixture(scope="module")
def playground(quick_zoo: Path) -> Playground:
    tokenizer = load_tokenizer(quick_zoo / "target")
    model = load_causal_lm(quick_zoo / "target").eval()
    return Playground(tokenizer, model, drafter_choices(drafter_options(quick_zoo)), example=PROMPT)


def _reference(playground: Playground, quick_zoo: Path, name: str, tree: bool = False, **settings):
    tokenizer = playground.tokenizer
    options = dict(drafter_options(quick_zoo)[name])
    if tree:
        options.update(specdec.plugins.drafter_class(name).tree_options)
    trace = Trace()
    result = specdec.generate(load_causal_lm(quick_zoo / "target").eval(),
                              tokenizer(PROMPT, add_special_tokens=False)["input_ids"],
                              drafter=specdec.make_drafter(name, **options), trace=trace,
                              eos_token_id=tokenizer.eos_token_id, **settings)
    return result, trace


@pytest.mark.parametrize("name, tree, temperature", [("eagle", False, 0.0), ("medusa", True, 0.0),
                                                     ("draft-model", True, 0.8)])
def test_a_run_is_specdec_generate_step_for_step(playground: Playground, quick_zoo: Path, name: str, tree: bool,
                                                 temperature: float) -> None:
    answer = playground.run(RunRequest(prompt=PROMPT, drafter=name, k=3, shape="tree" if tree else "chain",
                                       temperature=temperature, top_p=0.95 if temperature else 1.0,
                                       max_new_tokens=20, seed=5))
    sampling = specdec.Sampling(temperature=temperature, top_p=0.95 if temperature else 1.0)
    result, trace = _reference(playground, quick_zoo, name, tree, num_draft_tokens=3, max_new_tokens=20,
                               sampling=sampling, seed=5)
    assert answer["tokens"] == result.tokens
    assert len(answer["steps"]) == result.stats.steps == answer["summary"]["steps"]
    for got, want in zip(answer["steps"], trace.steps):
        assert [(t["token"], t["kind"], t["node"]) for t in got["tokens"]] == [(t.token, t.kind, t.node)
                                                                                  for t in want.tokens]
        assert [t["uniform"] for t in got["tokens"]] == [t.uniform for t in want.tokens]
        assert [d["token"] for d in got["drafted"]] == list(want.drafted)
        assert got["caches"]["target"] == list(want.caches.target)
        assert got["caches"]["drafter"] == (list(want.caches.drafter) if want.caches.drafter else None)
        assert got["tree"] == (want.parents is not None)
    summary = answer["summary"]
    assert summary["plain_forwards"] == len(result.tokens)
    assert summary["forwards_saved"] == len(result.tokens) - result.stats.steps
    assert 0 < summary["draft_tax"] < 1 and summary["speedup"] > 0


def test_compare_gives_plain_tokens_under_every_drafter_at_temperature_zero(playground: Playground,
                                                                            quick_zoo: Path) -> None:
    answer = playground.compare(CompareRequest(prompt=PROMPT, k=3, max_new_tokens=16))
    rows = {r["drafter"]: r for r in answer["rows"]}
    assert set(rows) == {"plain"} | set(playground.choices)
    for name, row in rows.items():
        assert row["error"] is None and row["same_as_plain"] is True, name
        assert row["tokens"] == answer["plain_tokens"]
    result, _ = _reference(playground, quick_zoo, "eagle", num_draft_tokens=3, max_new_tokens=16)
    assert rows["eagle"]["mean_accepted_length"] == result.stats.mean_accepted_length
    assert rows["plain"]["mean_accepted_length"] == 1.0


def test_the_probe_is_specdec_probe(playground: Playground) -> None:
    answer = playground.probe(ProbeRequest(prefix=PROMPT, continuation=" r * r\n", top=3))
    encode = lambda text: playground.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    want = probe(playground.lm.model, encode(PROMPT), encode(" r * r\n"), top=3)
    assert [(p["token"], p["verdict"], p["rank"]) for p in answer["positions"]] == [
        (p.token, p.verdict, p.rank) for p in want.positions]
    assert answer["num_accepted"] == want.num_accepted and answer["correction"] == want.correction
    assert all(len(p["top"]) == 3 for p in answer["positions"])


def test_the_playground_refuses_what_the_model_cannot_take(playground: Playground) -> None:
    with pytest.raises(BadRequest, match="unknown drafter 'nope'; this page offers plain, "):
        playground.run(RunRequest(prompt=PROMPT, drafter="nope"))
    with pytest.raises(BadRequest, match="has no tree; choose shape chain"):
        playground.run(RunRequest(prompt=PROMPT, drafter="plain", shape="tree"))
    long = "x = 1\n" * 400  # under the character limit, over 512 tokens
    with pytest.raises(BadRequest, match=r"prompt makes \d+ tokens; the most this page takes is 512") as caught:
        playground.run(RunRequest(prompt=long[:3990]))
    assert caught.value.status == 413


# --- the real server --------------------------------------------------------------------------------


def test_the_server_lists_every_registered_drafter_plugins_included(play_server) -> None:
    status, info = play_server.get("/api/info")
    assert status == 200
    drafters = {d["name"]: d for d in info["drafters"]}
    assert {"plain", "ngram", "eagle", "medusa", "mtp", "play-raiser", "play-needs-path"} <= set(drafters)
    assert drafters["play-raiser"]["available"]
    assert not drafters["play-needs-path"]["available"] and "path" in drafters["play-needs-path"]["reason"]
    assert drafters["eagle"]["tree"] and not drafters["plain"]["tree"]


@pytest.mark.parametrize("method, path, body, status, words", [
    ("POST", "/api/run", {"prompt": PROMPT, "drafter": "nope"}, 400, "unknown drafter 'nope'"),
    ("POST", "/api/run", {"prompt": PROMPT, "k": 99}, 400, "k must be in [1, 16], got 99"),
    ("POST", "/api/run", {"prompt": "x" * 4500}, 413, "prompt has 4500 characters"),
    ("POST", "/api/run", {"prompt": PROMPT, "max_new_tokens": 5000}, 413, "budget of 256"),
    ("POST", "/api/compare", {"prompt": PROMPT, "max_new_tokens": 500}, 413, "budget of 128"),
    ("POST", "/api/run", b"{oops", 400, "not JSON"),
    ("POST", "/api/run", {"prompt": PROMPT, "drafter": "play-raiser"}, 500,
     "drafter 'play-raiser' raised in propose: RuntimeError: this drafter always fails"),
    ("POST", "/api/run", {"prompt": PROMPT, "drafter": "play-needs-path"}, 400, "unavailable here"),
    ("GET", "/static/../pyproject.toml", None, 404, "page"),
    ("GET", "/static/..%2F..%2Fpyproject.toml", None, 404, "no page file"),
    ("GET", "/static/specdec/cli.py", None, 404, "no page file 'specdec/cli.py'"),
    ("GET", "/etc/passwd", None, 404, "no such page"),
    ("GET", "/api/run", None, 405, "GET is not allowed on /api/run"),
])
def test_bad_requests_get_json_errors_and_the_server_serves_on(play_server, method, path, body, status,
                                                               words) -> None:
    got, answer = play_server.get(path) if method == "GET" else play_server.post(path, body)
    assert got == status
    assert isinstance(answer, dict) and answer["status"] == status and words in answer["error"]
    again, good = play_server.post("/api/run", {"prompt": PROMPT, "drafter": "ngram", "max_new_tokens": 4})
    assert again == 200 and len(good["tokens"]) == 4


@pytest.mark.parametrize("kind", ["text/plain", "text/plain; x=application/json"])
def test_a_post_must_say_json(play_server, kind: str) -> None:
    status, answer = play_server.post("/api/probe", b'{"prefix": "a", "continuation": "b"}', kind)
    assert status == 415 and "Content-Type: application/json" in answer["error"]


def test_compare_shows_a_failing_drafter_in_its_row(play_server) -> None:
    status, answer = play_server.post("/api/compare", {"prompt": PROMPT, "k": 2, "max_new_tokens": 6})
    assert status == 200
    rows = {r["drafter"]: r for r in answer["rows"]}
    assert "always fails" in rows["play-raiser"]["error"]
    assert rows["play-needs-path"]["error"].startswith("unavailable")
    assert all(r["same_as_plain"] for r in answer["rows"] if r["error"] is None)


def test_a_public_host_warns_and_ctrl_c_stops_cleanly(quick_zoo: Path) -> None:
    server = start_play(["--host", "0.0.0.0", "--quick", "--cache-dir", str(quick_zoo.parent), "--drafter", "ngram"],
                        None)
    try:
        assert server.get("/api/info")[0] == 200
        assert [d["name"] for d in server.get("/api/info")[1]["drafters"]] == ["plain", "ngram"]
    finally:
        status = server.stop()
    assert status == 0
    assert "has no authentication" in "".join(server.stderr)
    assert "specdec play: stopped" in "".join(server.stdout)


def test_a_port_in_use_is_refused_before_loading(quick_zoo: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "specdec", "play", "--port", str(port), "--quick", "--cache-dir",
                               str(quick_zoo.parent)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"cannot serve on 127.0.0.1:{port}" in done.stderr and "choose another --port" in done.stderr

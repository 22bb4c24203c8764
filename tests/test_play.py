"""`specdec play` without a browser: the requests' checks, the bounded queue, the playground's
answers against `specdec.generate` and `specdec.teaching.probe`, its drafters made once and reset
before each use, and the real server's errors (every bad request a 4xx JSON naming what was
wrong, every failure of the server's a 500 JSON that names nothing but is logged, and the server
serving on after each). The Host check: tests/test_play_hosts.py."""

from __future__ import annotations

import importlib
import json
import logging
import re
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import anyio
import pytest
from play_server import PROMPT, call_app, start_play

import specdec
from specdec.checkpoints import load_causal_lm
from specdec.cli.play import LOOPBACK_NAMES
from specdec.play import BadRequest, CompareRequest, Limits, Playground, ProbeRequest, RunRequest, drafter_choices
from specdec.play.app import ModelQueue, create_app
from specdec.play.playground import FAILED_ROW
from specdec.play.requests import parse_request
from specdec.teaching.probe import probe
from specdec.teaching.trace import Trace
from specdec.verifier import DraftError
from specdec.zoo import drafter_options


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
    (b'{"prompt": "x", "draft_length": "short"}', 400, "draft_length must be one of fixed, auto, got 'short'"),
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
    assert "max_new_tokens 300 is over this page's budget of 256" in _refused(
        b'{"prompt": "x", "max_new_tokens": 300}', CompareRequest)[1]
    assert parse_request(b'{"prompt": "x", "max_new_tokens": 200}', CompareRequest, Limits()).max_new_tokens == 200
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


def _reference(playground: Playground, quick_zoo: Path, name: str, tree: bool = False, **settings):
    tokenizer = playground.tokenizer
    options = dict(drafter_options(quick_zoo)[name])
    if tree:
        options.update(specdec.plugins.drafter_class(name).tree_options)
    trace = Trace()
    result = specdec.generate(load_causal_lm(quick_zoo / "target").eval(),
                              tokenizer(PROMPT, add_special_tokens=False)["input_ids"],
                              drafter=specdec.make_drafter(name, **options), trace=trace,
                              eos_token_id=tokenizer.eos_token_id, verify_rule=playground.verify_rule, **settings)
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


def test_an_auto_draft_length_run_shows_each_steps_decision(playground: Playground) -> None:
    """draft_length "auto" (`specdec.decoding.auto_draft`): every step but a last one at the budget
    carries the drafter's decision, and the tokens are the fixed-k run's (greedy)."""
    app = create_app(playground, allowed_hosts=LOOPBACK_NAMES)
    runs = [call_app(app, "POST", "/api/run", {"prompt": PROMPT, "drafter": "ngram", "k": 3, "max_new_tokens": 16,
                                                "draft_length": length}) for length in ("auto", "fixed")]
    assert [status for status, _ in runs] == [200, 200]
    auto, fixed = (answer for _, answer in runs)
    assert [t["text"] for s in auto["steps"] for t in s["tokens"] if t["kind"] != "rejected"] == \
        [t["text"] for s in fixed["steps"] for t in s["tokens"] if t["kind"] != "rejected"]
    assert all(step["note"] for step in auto["steps"][:-1]) and not any(step["note"] for step in fixed["steps"])


def test_a_sampled_chain_step_carries_both_rules_verdicts_to_the_page(playground: Playground) -> None:
    """Each sampled chain step with a draft holds token-wise and block verification of that draft with
    the uniforms it drew (`specdec.teaching.rule_compare`): the verifier's own a_i and u_i for the
    tokens it tried, the number token-wise kept, and the longest prefix whose block test passed. A
    greedy run and a tree carry none. Read through the server's JSON, as the page gets it."""
    app = create_app(playground, allowed_hosts=LOOPBACK_NAMES)
    status, answer = call_app(app, "POST", "/api/run", {"prompt": PROMPT, "drafter": "draft-model", "k": 3,
                                                        "temperature": 0.8, "top_p": 0.95, "max_new_tokens": 24,
                                                        "seed": 3})
    assert status == 200
    compared = [s for s in answer["steps"] if s["drafted"]]
    assert compared and all(s["rules"] is not None for s in compared)
    assert all(s["rules"] is None for s in answer["steps"] if not s["drafted"])
    for index, step in enumerate(answer["steps"]):
        rules = step["rules"]
        if rules is None:
            continue
        k = len(step["drafted"])
        assert len(rules["acceptance"]) == len(rules["block_h"]) == len(rules["uniforms"]) == k
        tried = [t for t in step["tokens"] if t["kind"] in ("accepted", "rejected")]
        assert rules["uniforms"][: len(tried)] == [t["uniform"] for t in tried]
        assert rules["acceptance"][: len(tried)] == pytest.approx([t["accept"] for t in tried], abs=1e-6)
        passed = [u < a for u, a in zip(rules["uniforms"], rules["acceptance"])]
        assert rules["token_kept"] == (passed + [False]).index(False)
        if index < len(answer["steps"]) - 1:  # the last step may be cut at the budget
            assert rules["token_kept"] == sum(t["kind"] == "accepted" for t in tried)
        own = [i + 1 for i, (u, h) in enumerate(zip(rules["uniforms"], rules["block_h"])) if u < h]
        assert rules["block_kept"] == max(own, default=0)
        assert all(0.0 <= h <= 1.0 + 1e-6 for h in rules["block_h"])  # h = m / m may round past 1
    for greedy_or_tree in ({"temperature": 0.0}, {"temperature": 0.8, "shape": "tree"}):
        status, other = call_app(app, "POST", "/api/run", {"prompt": PROMPT, "drafter": "draft-model", "k": 3,
                                                           "max_new_tokens": 12, **greedy_or_tree})
        assert status == 200 and all(s["rules"] is None for s in other["steps"])


def test_a_playground_verifying_by_blocks_keeps_what_the_block_row_says(playground: Playground,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`specdec play --verify-rule block`: the run is verified by block verification, so on every
    step not cut at the budget the tokens it kept are the block row's, and the page is told the rule."""
    monkeypatch.setattr(playground, "verify_rule", "block")
    answer = playground.run(RunRequest(prompt=PROMPT, drafter="draft-model", k=3, temperature=0.8, top_p=0.95,
                                       max_new_tokens=24, seed=3))
    assert answer["verify_rule"] == "block"
    steps = [s for s in answer["steps"][:-1] if s["rules"] is not None]
    assert steps
    for step in steps:
        assert step["rules"]["block_kept"] == sum(t["kind"] == "accepted" for t in step["tokens"])


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
    ("POST", "/api/compare", {"prompt": PROMPT, "max_new_tokens": 500}, 413, "budget of 256"),
    ("POST", "/api/run", b"{oops", 400, "not JSON"),
    ("POST", "/api/run", {"prompt": PROMPT, "drafter": "play-raiser"}, 500,
     "the drafter failed; the server's log has the details"),
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
    assert "always fails" not in json.dumps(answer)  # a 500 keeps the exception's text to the server
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
    assert rows["play-raiser"]["error"] == FAILED_ROW and "always fails" not in json.dumps(answer)
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


# --- drafters made once per server ------------------------------------------------------------------


def test_each_drafter_is_made_once_per_shape_and_reused(playground: Playground, quick_zoo: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    made: Counter[tuple[str, tuple]] = Counter()
    make = specdec.plugins.make_drafter

    def counted(name: str, **options):
        made[name, tuple(sorted(options.items()))] += 1
        return make(name, **options)

    monkeypatch.setattr(specdec.plugins, "make_drafter", counted)
    known = {n: o for n, o in drafter_options(quick_zoo).items() if n in ("ngram", "suffix", "eagle")}
    server = Playground(playground.tokenizer, playground.lm.model, drafter_choices(known, only_known=True),
                        example=PROMPT)
    for shape in ("chain", "tree", "chain", "tree"):
        server.run(RunRequest(prompt=PROMPT, drafter="ngram", shape=shape, max_new_tokens=6))
        server.run(RunRequest(prompt=PROMPT, drafter="suffix", shape=shape, max_new_tokens=6))
        answer = server.compare(CompareRequest(prompt=PROMPT, shape=shape, max_new_tokens=6))
        assert all(row["error"] is None for row in answer["rows"])
    want = Counter()
    for name, options in known.items():
        tree = {**options, **specdec.plugins.drafter_class(name).tree_options}
        want[name, tuple(sorted(options.items()))] += 1
        want[name, tuple(sorted(tree.items()))] += 1
    assert made == want


def test_a_reused_drafter_forgets_the_requests_before(playground: Playground) -> None:
    """Suffix decoding remembers every output; reused without `forget` its second run of the same
    request would draft the first one's answer."""
    request = RunRequest(prompt=PROMPT, drafter="suffix", k=4, max_new_tokens=40)
    first, second = playground.run(request), playground.run(request)
    drafted = lambda answer: [[d["token"] for d in step["drafted"]] for step in answer["steps"]]  # noqa: E731
    assert second["tokens"] == first["tokens"]
    assert drafted(second) == drafted(first)
    assert second["summary"]["accepted"] == first["summary"]["accepted"]
    again = CompareRequest(prompt=PROMPT, k=3, max_new_tokens=24)
    rows = lambda answer: [(r["drafter"], r.get("tokens"), r.get("steps"), r["error"])  # noqa: E731
                           for r in answer["rows"]]
    assert rows(playground.compare(again)) == rows(playground.compare(again))


# --- errors: the request's (4xx) or the server's (500, logged) ------------------------------------------


def test_an_error_inside_generate_is_a_logged_500_and_the_server_serves_on(
        playground: Playground, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(playground, allowed_hosts=LOOPBACK_NAMES)
    module = importlib.import_module("specdec.decoding.generate")

    def broken(*args, **kwargs):
        raise ValueError("a bug deep in decoding")

    monkeypatch.setattr(module, "generate", broken)
    with caplog.at_level(logging.ERROR, logger="specdec.play"):
        status, answer = call_app(app, "POST", "/api/run", {"prompt": PROMPT, "drafter": "ngram", "max_new_tokens": 4})
    assert status == 500 and answer == {"error": "the server failed; the server's log has the details", "status": 500}
    logged = [r for r in caplog.records if r.name == "specdec.play"]
    assert len(logged) == 1 and logged[0].exc_info is not None and logged[0].exc_info[0] is ValueError
    assert "/api/run" in logged[0].getMessage()
    monkeypatch.undo()
    status, answer = call_app(app, "POST", "/api/run", {"prompt": PROMPT, "drafter": "ngram", "max_new_tokens": 4})
    assert status == 200 and len(answer["tokens"]) == 4


def test_compare_logs_a_drafters_unexpected_error_and_marks_its_row_failed(
        playground: Playground, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    module = importlib.import_module("specdec.decoding.generate")
    generate = module.generate

    def only_plain(lm, prompt, drafter=None, **settings):
        if drafter is not None:
            raise ValueError(f"a bug under {type(drafter).__name__}")
        return generate(lm, prompt, drafter=drafter, **settings)

    monkeypatch.setattr(module, "generate", only_plain)
    with caplog.at_level(logging.ERROR, logger="specdec.play"):
        answer = playground.compare(CompareRequest(prompt=PROMPT, max_new_tokens=4))
    drafters = [r for r in answer["rows"] if r["drafter"] != "plain"]
    assert len(answer["plain_tokens"]) == 4 and drafters
    assert all(r["error"] == FAILED_ROW for r in drafters) and "a bug under" not in json.dumps(answer)
    logged = [r for r in caplog.records if r.name == "specdec.play"]
    assert len(logged) == len(drafters) and all(r.exc_info and r.exc_info[0] is ValueError for r in logged)


def test_a_drafters_failure_is_a_logged_500_that_leaks_nothing(
        playground: Playground, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(playground, allowed_hosts=LOOPBACK_NAMES)

    def broken(*args, **kwargs):
        raise DraftError("drafter 'ngram' returned a broken draft: token 99 at /home/someone/secret.txt")

    monkeypatch.setattr(importlib.import_module("specdec.decoding.generate"), "generate", broken)
    with caplog.at_level(logging.ERROR, logger="specdec.play"):
        status, answer = call_app(app, "POST", "/api/run", {"prompt": PROMPT, "drafter": "ngram", "max_new_tokens": 4})
    assert status == 500 and answer == {"error": "the drafter failed; the server's log has the details", "status": 500}
    logged = [r for r in caplog.records if r.name == "specdec.play"]
    assert len(logged) == 1 and logged[0].exc_info is not None and logged[0].exc_info[0] is DraftError
    assert "secret.txt" in str(logged[0].exc_info[1])  # the details are the server's to read


def test_an_error_outside_the_api_is_a_logged_json_500_that_leaks_nothing(
        playground: Playground, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(playground, allowed_hosts=LOOPBACK_NAMES)

    def broken() -> dict:
        raise RuntimeError("cannot read /home/someone/secret.txt")

    async def served(scope, receive, send) -> None:  # Starlette re-raises after answering, for the server's log
        with pytest.raises(RuntimeError, match="secret"):
            await app(scope, receive, send)

    monkeypatch.setattr(playground, "describe", broken)
    with caplog.at_level(logging.ERROR, logger="specdec.play"):
        status, answer = call_app(served, "GET", "/api/info")
    assert status == 500 and answer == {"error": "the server failed; the server's log has the details", "status": 500}
    logged = [r for r in caplog.records if r.name == "specdec.play"]
    assert len(logged) == 1 and logged[0].exc_info is not None and logged[0].exc_info[0] is RuntimeError
    assert "/api/info" in logged[0].getMessage()


@pytest.mark.parametrize("settings, words", [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                                             ({"temperature": float("nan")}, "temperature"),
                                             ({"k": 0}, "k must be in [1, 16]")])
def test_a_bad_setting_is_a_400_before_any_decoding(playground: Playground, monkeypatch: pytest.MonkeyPatch,
                                                     settings: dict, words: str) -> None:
    def never(*args, **kwargs):
        raise AssertionError("decoded with a bad setting")

    monkeypatch.setattr(importlib.import_module("specdec.decoding.generate"), "generate", never)
    for request in (RunRequest(prompt=PROMPT, **settings), CompareRequest(prompt=PROMPT, **settings)):
        with pytest.raises(BadRequest, match=re.escape(words)) as caught:
            getattr(playground, "run" if isinstance(request, RunRequest) else "compare")(request)
        assert caught.value.status == 400
    app = create_app(playground, allowed_hosts=LOOPBACK_NAMES)
    body = json.dumps({"prompt": PROMPT, **settings}).encode()
    status, answer = call_app(app, "POST", "/api/run", body)
    assert status == 400 and words in answer["error"]


# --- compare's budget ----------------------------------------------------------------------------------


@pytest.mark.parametrize("asked, decoded", [(4, 4), (6, 6), (9, 6)])
def test_compare_states_the_budget_it_decoded(playground: Playground, asked: int, decoded: int) -> None:
    limits = Limits(max_new_tokens=10, max_compare_tokens=6)
    capped = Playground(playground.tokenizer, playground.lm.model, list(playground.choices.values()), limits,
                        example=PROMPT)
    app = create_app(capped, allowed_hosts=LOOPBACK_NAMES)
    status, answer = call_app(app, "POST", "/api/compare", {"prompt": PROMPT, "k": 2, "max_new_tokens": asked})
    assert status == 200
    assert answer["budget"] == {"asked": asked, "decoded": decoded, "cap": 6, "capped": asked > 6}
    assert answer["request"]["max_new_tokens"] == asked
    assert len(answer["plain_tokens"]) == decoded
    assert all(r["new_tokens"] == decoded for r in answer["rows"] if r["error"] is None)


def test_compare_over_the_run_budget_is_refused(playground: Playground) -> None:
    capped = Playground(playground.tokenizer, playground.lm.model, list(playground.choices.values()),
                        Limits(max_new_tokens=10, max_compare_tokens=6), example=PROMPT)
    status, answer = call_app(create_app(capped, allowed_hosts=LOOPBACK_NAMES), "POST", "/api/compare",
                              {"prompt": PROMPT, "max_new_tokens": 11})
    assert status == 413 and "max_new_tokens 11 is over this page's budget of 10" in answer["error"]

"""The model side of `specdec play`: one target and the drafters the page offers, answering the
page's requests with plain JSON-ready dicts.

- `run`: one traced generation (`specdec.generate(..., trace=Trace())`) and plain decoding of
  as many tokens, so each step's draft and verify time stands beside what plain decoding spent
  on the tokens that step emitted (Leviathan et al. 2023, Fig. 1: the draft/verify timeline),
  and on a sampled chain step what token-wise and block verification (Sun et al., ICLR 2025)
  each keep of its draft with the same draws (`specdec.teaching.rule_compare`).
- `compare`: the same prompt under every drafter, plain decoding first as the reference.
- `probe`: one forward's verdict on a typed continuation (`specdec.teaching.probe`).

Everything here runs on the server's single model thread (`specdec.play.app`): one request
at a time, so timings are never shared with another request's forwards. Each drafter is made
once per server and shape, and reset (`specdec.protocols.forget`) before every generation.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.errors import one_line
from specdec.play.requests import BadRequest, CompareRequest, Limits, ProbeRequest, RunRequest, check_request
from specdec.protocols import Drafter, forget
from specdec.runtime.target import CausalLM
from specdec.teaching.rule_compare import ComparingTrace, RuleComparison
from specdec.teaching.trace import Trace, TraceStep
from specdec.types import Generation, Sampling

__all__ = ["FAILED_ROW", "DrafterChoice", "Playground", "PLAIN", "drafter_choices"]

PLAIN = "plain"  # the page's name for plain decoding (no drafter)
FAILED_ROW = "failed; the server's log has the details"  # a compare row's error: no exception text leaves

logger = logging.getLogger("specdec.play")


@dataclass(frozen=True)
class DrafterChoice:
    """A drafter the page lists: its name there (a registry name, or a zoo label such as
    draft-model-xtok), the options it is made with (a zoo checkpoint, a command line's --drafter
    options), those of its tree mode (None: chains only), why it cannot be used when making it
    failed, the instance that check made (the playground reuses it for chains; not part of
    equality or repr), and the registered drafter it is (None: `name`)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    tree_options: dict[str, Any] | None = None
    reason: str | None = None
    drafter: Drafter | None = field(default=None, compare=False, repr=False)
    registered: str | None = None

    @property
    def available(self) -> bool:
        return self.reason is None

    @property
    def registry_name(self) -> str:
        return self.registered or self.name


def drafter_choices(known: dict[str, dict[str, Any]], only_known: bool = False,
                    registered: dict[str, str] | None = None) -> list[DrafterChoice]:
    """Every registered drafter, plugins included, each made once to see that it works: with its
    options in `known` (the zoo's checkpoints, or --drafter specs), else with none. A name of
    `known` that is not a registered drafter's is a label `registered` maps to one (the zoo's
    draft-model-xtok to draft-model: `specdec.zoo.zoo_drafters`). With `only_known`, the
    registered drafters outside `known` are left out. A drafter that fails to be made is listed
    with the reason; it never takes the others down. Each choice keeps the instance made."""
    from specdec import plugins

    registered = registered or {}
    choices = []
    names = plugins.drafter_names()
    for name in list(known) + [n for n in names if n not in known and not only_known]:
        options = known.get(name, {})
        drafter_name = registered.get(name, name)
        alias = drafter_name if drafter_name != name else None
        tree = None
        try:
            tree = getattr(plugins.drafter_class(drafter_name), "tree_options", None)
            made = plugins.make_drafter(drafter_name, **options)
        except Exception as error:  # a plugin's failure is shown beside it, not raised
            choices.append(DrafterChoice(name, options, None, f"{type(error).__name__}: {one_line(error)}",
                                         registered=alias))
            continue
        choices.append(DrafterChoice(name, options, dict(tree) if isinstance(tree, dict) and tree else None,
                                     drafter=made, registered=alias))
    return choices


class Playground:
    """One target (and its tokenizer) and the drafters the page offers."""

    def __init__(self, tokenizer: Any, model: Any, choices: list[DrafterChoice], limits: Limits = Limits(),
                 title: str = "", example: str = "def area(r):\n", verify_rule: str = "token") -> None:
        from specdec.verifier import check_verify_rule

        self.verify_rule = check_verify_rule(verify_rule)  # every run's verification rule
        self.tokenizer = tokenizer
        self.lm = CausalLM(model, share_cache=True)
        self.choices = {c.name: c for c in choices}
        # (name, shape) -> the one instance serving it; tree instances are made on first use
        self._made: dict[tuple[str, str], Drafter] = {(c.name, "chain"): c.drafter for c in choices
                                                      if c.available and c.drafter is not None}
        # drafter instance id -> its `auto` wrapper, which keeps its step times and acceptance across requests
        self._autos: dict[int, Drafter] = {}
        self.limits = limits
        self.title = title
        self.example = example
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos = eos if isinstance(eos, int) and 0 <= eos < self.lm.vocab_size else None

    def warm_up(self) -> None:
        """A short plain generation, so the first request's timings hold no one-time costs."""
        from specdec.decoding.generate import generate

        generate(self.lm, self._encode(self.example, 8), max_new_tokens=8)

    def describe(self) -> dict[str, Any]:
        """What the page needs to draw its controls: the drafters, the limits, the defaults."""
        drafters = [{"name": PLAIN, "available": True, "reason": None, "tree": False, "options": {}}]
        drafters += [{"name": c.name, "available": c.available, "reason": c.reason, "tree": c.tree_options is not None,
                      "options": {k: str(v) for k, v in c.options.items()}} for c in self.choices.values()]
        return {"title": self.title, "model": type(self.lm.model).__name__, "vocab_size": self.lm.vocab_size,
                "eos_token_id": self.eos, "drafters": drafters, "limits": asdict(self.limits),
                "defaults": asdict(RunRequest(prompt=self.example)),
                "compare_defaults": asdict(CompareRequest(prompt=self.example))}

    # --- the step view and the timeline -------------------------------------------------------

    def run(self, request: RunRequest) -> dict[str, Any]:
        """One traced generation and the plain-decoding timings of as many tokens."""
        check_request(request, self.limits)
        sampling = _sampling(request.temperature, request.top_p)
        prompt = self._encode(request.prompt, request.max_new_tokens)
        drafter = self._drafter(request.drafter, request.shape)
        trace = ComparingTrace()
        result = self._generate(prompt, self._auto(drafter, request.draft_length), request.k, request.max_new_tokens,
                                sampling, request.seed, trace)
        plain = self._plain_step_seconds(prompt, len(result.tokens), sampling, request.seed)
        steps, at = [], 0
        for step, comparison in zip(trace.steps, trace.comparisons):
            emitted = len(step.emitted)
            steps.append(self._step(step, sum(plain[at : at + emitted]), comparison))
            at += emitted
        draft = sum(s.draft_seconds for s in trace.steps)
        verify = sum(s.verify_seconds for s in trace.steps)
        spent = draft + verify
        plain_total = sum(plain)
        stats = result.stats
        return {
            "request": asdict(request), "drafter": request.drafter, "tree": any(s.parents is not None for s in trace.steps),
            "verify_rule": self.verify_rule,
            "prompt_tokens": prompt, "tokens": result.tokens, "text": self._decode(result.tokens),
            "pieces": [self._decode([t]) for t in result.tokens], "steps": steps,
            "summary": {
                "steps": stats.steps, "new_tokens": stats.new_tokens, "drafted": stats.drafted,
                "accepted": stats.accepted, "mean_accepted_length": stats.mean_accepted_length,
                "acceptance_rate": stats.acceptance_rate, "prefill_ms": 1e3 * trace.prefill_seconds,
                "draft_ms": 1e3 * draft, "verify_ms": 1e3 * verify, "plain_ms": 1e3 * plain_total,
                "plain_forwards": len(plain), "forwards_saved": len(plain) - stats.steps,
                "draft_tax": draft / spent if spent else 0.0,
                "speedup": plain_total / spent if spent else 0.0}}

    def _step(self, step: TraceStep, plain_seconds: float, rules: RuleComparison | None) -> dict[str, Any]:
        """One step for the page; `rules`: token-wise and block verification of a sampled chain's
        draft with the step's draws (`specdec.teaching.rule_compare`), None otherwise."""
        parents = step.parents if step.parents is not None else tuple(range(-1, len(step.drafted) - 1))
        caches = step.caches
        return {
            "tree": step.parents is not None,
            "drafted": [{"node": i, "token": t, "text": self._decode([t]), "parent": parents[i]}
                        for i, t in enumerate(step.drafted)],
            "tokens": [{"token": t.token, "text": self._decode([t.token]), "kind": t.kind, "p": t.p, "q": t.q,
                        "accept": t.accept, "uniform": t.uniform, "node": t.node} for t in step.tokens],
            "emitted": step.emitted, "draft_forwards": step.draft_forwards, "note": step.note, "draft_ms": 1e3 * step.draft_seconds, "verify_ms": 1e3 * step.verify_seconds,
            "plain_ms": 1e3 * plain_seconds, "rules": None if rules is None else asdict(rules),
            "caches": None if caches is None else {"target": list(caches.target),
                                                   "drafter": None if caches.drafter is None else list(caches.drafter)}}

    def _plain_step_seconds(self, prompt: list[int], count: int, sampling: Sampling, seed: int) -> list[float]:
        """Seconds of each of `count` plain decoding steps after `prompt` (one forward per token;
        a forward's cost does not depend on which token it reads, so these are the same tokens'
        cost at any temperature)."""
        if count == 0:
            return []
        trace = Trace()
        self._generate(prompt, None, 0, count, sampling, seed, trace, eos=False)
        return [s.draft_seconds + s.verify_seconds for s in trace.steps]

    # --- compare ------------------------------------------------------------------------------

    def compare(self, request: CompareRequest) -> dict[str, Any]:
        """Plain decoding, then every available drafter, on the same prompt and settings, each
        decoding at most `Limits.max_compare_tokens` (the answer's `budget` says what was cut)."""
        check_request(request, self.limits)
        sampling = _sampling(request.temperature, request.top_p)
        cap = self.limits.max_compare_tokens
        budget = min(request.max_new_tokens, cap)
        prompt = self._encode(request.prompt, budget)
        plain = self._generate(prompt, None, 0, budget, sampling, request.seed)
        rows = [self._row(PLAIN, "chain", plain, plain, sampling)]
        for choice in self.choices.values():
            if not choice.available:
                rows.append({"drafter": choice.name, "shape": None, "error": f"unavailable: {choice.reason}"})
                continue
            shape = request.shape if choice.tree_options is not None else "chain"
            try:
                drafter = self._drafter(choice.name, shape)
                result = self._generate(prompt, self._auto(drafter, request.draft_length), request.k, budget, sampling,
                                        request.seed)
            except Exception:  # the drafter's fault (DraftError) or unexpected: its row only, the others go on
                logger.exception("compare: drafter %r (%s) failed", choice.name, shape)  # the exception stays here
                rows.append({"drafter": choice.name, "shape": shape, "error": FAILED_ROW})
                continue
            rows.append(self._row(choice.name, shape, result, plain, sampling))
        return {"request": asdict(request), "plain_tokens": plain.tokens, "plain_text": self._decode(plain.tokens),
                "greedy": sampling.greedy, "rows": rows,
                "budget": {"asked": request.max_new_tokens, "decoded": budget, "cap": cap,
                           "capped": request.max_new_tokens > cap}}

    def _row(self, name: str, shape: str, result: Generation, plain: Generation, sampling: Sampling) -> dict[str, Any]:
        stats = result.stats
        decode = stats.wall_seconds - stats.prefill_seconds
        plain_decode = plain.stats.wall_seconds - plain.stats.prefill_seconds
        return {"drafter": name, "shape": shape, "tokens": result.tokens, "text": self._decode(result.tokens),
                "same_as_plain": result.tokens == plain.tokens if sampling.greedy else None,
                "steps": stats.steps, "new_tokens": stats.new_tokens,
                "mean_accepted_length": stats.mean_accepted_length, "acceptance_rate": stats.acceptance_rate,
                "decode_ms": 1e3 * decode, "draft_ms": 1e3 * stats.draft_seconds,
                "speedup": plain_decode / decode if decode > 0 else 0.0, "error": None}

    # --- probe --------------------------------------------------------------------------------

    def probe(self, request: ProbeRequest) -> dict[str, Any]:
        """One forward's greedy verdict on each continuation token, and the target's top tokens."""
        from specdec.teaching.probe import probe

        check_request(request, self.limits)
        prefix = self._encode(request.prefix, 0, "prefix")
        continuation = self._encode(request.continuation, 0, "continuation")
        if len(prefix) + len(continuation) > self.limits.max_prompt_tokens:
            raise BadRequest(413, f"prefix and continuation make {len(prefix) + len(continuation)} tokens; the most "
                                  f"this page takes is {self.limits.max_prompt_tokens}")
        result = probe(self.lm.model, prefix, continuation, top=request.top)
        return {"request": asdict(request), "num_accepted": result.num_accepted, "bonus": result.bonus,
                "correction": result.correction, "correction_text": self._decode([result.correction]),
                "positions": [{"token": p.token, "text": self._decode([p.token]), "probability": p.probability,
                               "rank": p.rank, "verdict": p.verdict,
                               "top": [{"token": t, "text": self._decode([t]), "probability": q} for t, q in p.top]}
                              for p in result.positions]}

    # --- shared -------------------------------------------------------------------------------

    def _generate(self, prompt: list[int], drafter: Drafter | None, k: int, budget: int, sampling: Sampling,
                  seed: int, trace: Trace | None = None, eos: bool = True) -> Generation:
        from specdec.decoding.generate import generate

        return generate(self.lm, prompt, drafter=drafter, num_draft_tokens=k if drafter is not None else 0,
                        max_new_tokens=budget, sampling=sampling, eos_token_id=self.eos if eos else None,
                        seed=seed, trace=trace, verify_rule=self.verify_rule, tokenizer=self.tokenizer)

    def _auto(self, drafter: Drafter | None, draft_length: str) -> Drafter | None:
        """`drafter`, drafting up to k tokens only when it pays (`specdec.decoding.auto_draft`) under
        draft_length "auto": one wrapper per drafter instance, so that what it measured (step times,
        acceptance) carries from one request to the next, as in the bench."""
        if drafter is None or draft_length != "auto":
            return drafter
        from specdec.decoding.auto_draft import AutoDraft

        if id(drafter) not in self._autos:
            self._autos[id(drafter)] = AutoDraft(drafter)  # type: ignore[assignment]
        return self._autos[id(drafter)]

    def _drafter(self, name: str, shape: str) -> Drafter | None:
        """The drafter `name` (None for plain decoding) in `shape`: made once per server (a chain's
        when the page's choices were checked, a tree's on first use), forgotten before each use so
        that nothing of an earlier request drafts for this one."""
        from specdec.plugins import make_drafter

        if name == PLAIN:
            if shape == "tree":
                raise BadRequest(400, "plain decoding drafts nothing, so it has no tree; choose shape chain")
            return None
        choice = self.choices.get(name)
        if choice is None:
            offered = ", ".join([PLAIN] + list(self.choices))
            raise BadRequest(400, f"unknown drafter {name!r}; this page offers {offered}")
        if not choice.available:
            raise BadRequest(400, f"drafter {name!r} is unavailable here: {choice.reason}")
        if shape == "tree" and choice.tree_options is None:
            raise BadRequest(400, f"drafter {name!r} drafts chains only; choose shape chain")
        drafter = self._made.get((name, shape))
        if drafter is None:
            options = {**choice.options, **(choice.tree_options or {})} if shape == "tree" else choice.options
            drafter = self._made[(name, shape)] = make_drafter(choice.registry_name, **options)
        forget(drafter)  # e.g. suffix decoding's trie of earlier outputs
        return drafter

    def _encode(self, text: str, budget: int, field_name: str = "prompt") -> list[int]:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise BadRequest(400, f"{field_name} {text!r} makes no tokens; type some text")
        if len(ids) > self.limits.max_prompt_tokens:
            raise BadRequest(413, f"{field_name} makes {len(ids)} tokens; the most this page takes is "
                                  f"{self.limits.max_prompt_tokens}")
        limit = self.lm.max_positions
        if limit is not None and len(ids) + budget > limit:
            raise BadRequest(413, f"{field_name} ({len(ids)} tokens) and max_new_tokens ({budget}) exceed the "
                                  f"model's {limit} positions; shorten the prompt or the budget")
        return ids

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))


def _sampling(temperature: float, top_p: float) -> Sampling:
    """The request's sampling settings; those `Sampling` refuses are the request's fault (400)."""
    try:
        return Sampling(temperature=temperature, top_p=top_p)
    except ValueError as error:
        raise BadRequest(400, f"{one_line(error)}; change the setting") from None

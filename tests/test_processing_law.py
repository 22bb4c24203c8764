"""The sampling settings stay exact under speculation, in closed form.

A tiny float64 target over six tokens (a, b, ab, ba, c and an end token) and a tiny drafter
model. For each setting (penalties, min-p, a logit bias with banned words and repeated n-grams,
a history-dependent custom processor, a grammar), plain sampling's law of a 3-token
continuation is enumerated independently of specdec: transformers' own processors over each
whole prefix, a grammar mask from a fresh xgrammar matcher that parses each prefix from the
start, the product of the resulting distributions (an output ends at the end token under the
grammar).

specdec's side is the loop's own pieces: each verify row's p from `Pipeline.probabilities` with
`Prefixes.of_verify`, the drafter's q from `DraftContext.probabilities` over its own draft prefix,
and the verifier, whose every random branch is enumerated with scripted draws
(`test_verifier_tree.exact_law`), over every draft the drafter can make. Two laws must equal the
enumeration to 1e-9: one step's output extended by plain sampling, and the output of as many
steps as 3 tokens take (the matcher committed to each step's output). For a chain of two
sampled tokens, a sampled tree (two siblings drawn from one row, a grandchild) and a
deterministic tree (the drafter's top two, each followed by its top one).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterator, Sequence

import pytest
import torch

from specdec import Sampling
from specdec.processing import Pipeline, Prefixes
from specdec.protocols import DraftContext
from specdec.verifier import verify_chain, verify_tree

from reference_sampling import plain_law, transformers_processors, word_tokenizer
from test_processing import EvenAfterOdd
from test_verifier_tree import exact_law
from tiny import tiny_model

EXACT = 1e-9
WORDS = ["a", "b", "ab", "ba", "c", "</s>"]
VOCAB = len(WORDS)
END = WORDS.index("</s>")
PROMPT = [0, 1, 4, 2, 3, 0]
GENERATED = [2]  # one token already generated (the OpenAI penalties count generated tokens only)
LENGTH = 3
REGEX = "(ab|ba)+c?"  # after "a" only b or ba; the end token only after a whole pair or the c

SETTINGS = {
    "penalties": Sampling(temperature=0.8, top_k=3, repetition_penalty=1.3, presence_penalty=0.5,
                          frequency_penalty=0.4),
    "min-p": Sampling(temperature=1.1, min_p=0.2),
    "bias-and-bans": Sampling(temperature=0.9, logit_bias={1: 1.5, 4: -0.7, 0: float("-inf")},
                              bad_words_ids=[[3, 2]], no_repeat_ngram_size=2),
    "custom-processor": Sampling(temperature=0.7, top_p=0.9, logits_processors=[EvenAfterOdd()]),
    "grammar": Sampling(temperature=0.9, top_k=4, regex=REGEX, repetition_penalty=1.2),
}
# node parents and how each node's token comes about
SHAPES = {
    "chain": (None, "sampled"),
    "sampled-tree": ([-1, -1, 0], "sampled"),
    "deterministic-tree": ([-1, -1, 0, 1], "ranked"),
}

Law = dict[tuple[int, ...], float]  # output tokens -> probability


@functools.lru_cache(maxsize=None)
def _tokenizer() -> object:
    return word_tokenizer(WORDS)


@functools.lru_cache(maxsize=None)
def _models() -> tuple[torch.nn.Module, torch.nn.Module]:
    return (tiny_model("llama", vocab_size=VOCAB, seed=5, layers=1, hidden=16, head_scale=16.0),
            tiny_model("qwen2", vocab_size=VOCAB, seed=6, layers=1, hidden=16, head_scale=12.0))


@functools.lru_cache(maxsize=None)
def _logits(which: int, ids: tuple[int, ...]) -> torch.Tensor:
    """The raw next-token logits [V] after `ids`: the target's (which 0), or the drafter's (which 1:
    most of the target's, plus a second model's, so that drafts are often but not always accepted)."""
    target, other = _models()
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        logits = target(input_ids=tensor, attention_mask=torch.ones_like(tensor)).logits[0, -1]
        if which == 1:
            logits = 0.7 * logits + 0.5 * other(input_ids=tensor, attention_mask=torch.ones_like(tensor)).logits[0, -1]
    return logits


# --- the reference: plain sampling, enumerated without specdec ------------------------------------------

@functools.lru_cache(maxsize=None)
def reference_p(name: str, prefix: tuple[int, ...]) -> tuple[float, ...]:
    """Plain sampling's next-token distribution after the prompt, then `prefix` of generated ids."""
    s = SETTINGS[name]
    ids = PROMPT + list(prefix)
    processors = transformers_processors(s, len(PROMPT), _compiled(name) if s.constraint else None)
    scores = processors(torch.tensor([ids]), _logits(0, tuple(ids))[None].clone())
    return tuple(scores.softmax(-1)[0].tolist())


def _ends(name: str, tokens: Sequence[int]) -> bool:
    return SETTINGS[name].constraint is not None and END in tokens


def _cut(name: str, tokens: Sequence[int], room: int) -> tuple[int, ...]:
    """An output as the loop keeps it: at most `room` tokens, up to and with the end token under the grammar."""
    tokens = tuple(tokens[:room])
    if SETTINGS[name].constraint is not None and END in tokens:
        tokens = tokens[: tokens.index(END) + 1]
    return tokens


def reference_law(name: str) -> Law:
    """P(output) of plain sampling for 3 new tokens after PROMPT + GENERATED."""
    s = SETTINGS[name]
    return plain_law(functools.partial(_logits, 0), PROMPT, s, LENGTH, _compiled(name) if s.constraint else None,
                     END if s.constraint else None, GENERATED)


# --- specdec's side: the pipeline, the drafter's q, the verifier -------------------------------------

@functools.lru_cache(maxsize=None)
def _compiled(name: str) -> object:
    from specdec.processing.constraint import compile_constraint

    kind, text = SETTINGS[name].constraint  # type: ignore[misc]
    return compile_constraint(kind, text, _tokenizer(), VOCAB)


def pipeline_at(name: str, generated: Sequence[int]) -> Pipeline:
    """The generation's pipeline once `generated` ids are committed (its matcher advanced over them)."""
    from specdec.processing.constraint import Matcher

    s = SETTINGS[name]
    matcher = None if s.constraint is None else Matcher(_compiled(name), VOCAB)
    pipeline = Pipeline(s, VOCAB, len(PROMPT), matcher)
    pipeline.commit(list(generated))
    return pipeline


def drafts(ctx: DraftContext, parents: list[int] | None, how: str) -> Iterator[tuple[float, list[int], torch.Tensor | None]]:
    """Every draft the drafter model makes on this shape, with its probability: (weight, tokens, q [n, V]
    or None). Sampled tokens are drawn from ctx.probabilities of the drafter's logits over the node's
    own draft prefix; ranked ones are the drafter's most likely ids there, without q."""
    shape = [-1, 0] if parents is None else parents
    committed = tuple(ctx.tokens.tolist())

    def row(prefix: tuple[int, ...]) -> torch.Tensor:
        return ctx.probabilities(_logits(1, committed + prefix)[None], [list(prefix)])[0]  # (V,)

    def extend(i: int, tokens: list[int], rows: list[torch.Tensor], weight: float):
        if i == len(shape):
            yield weight, tokens, torch.stack(rows) if how == "sampled" else None
            return
        path: list[int] = []
        node = shape[i]
        while node >= 0:
            path.insert(0, tokens[node])
            node = shape[node]
        q = row(tuple(path))
        if how == "ranked":
            elder = sum(1 for j in range(i) if shape[j] == shape[i])  # the sibling slot: the slot-th likeliest id
            ranked = sorted(range(VOCAB), key=lambda t: (-float(q[t]), t))
            yield from extend(i + 1, tokens + [ranked[elder]], rows + [q], weight)
            return
        for token in range(VOCAB):
            if q[token] > 0:
                yield from extend(i + 1, tokens + [token], rows + [q], weight * float(q[token]))

    yield from extend(0, [], [], 1.0)


def step_law(name: str, shape: str, generated: tuple[int, ...]) -> Law:
    """The law of one step's emitted tokens after PROMPT + generated, over the draft and the verifier."""
    parents, how = SHAPES[shape]
    pipeline = pipeline_at(name, generated)
    committed = torch.tensor(PROMPT + list(generated))
    ctx = DraftContext(tokens=committed, sampling=SETTINGS[name], generator=torch.Generator(), target=None,  # type: ignore[arg-type]
                       vocab_size=VOCAB, pipeline=pipeline)
    law: defaultdict[tuple[int, ...], float] = defaultdict(float)
    for weight, tokens, q in drafts(ctx, parents, how):
        draft = torch.tensor(tokens)
        rows = Prefixes.of_verify(committed, len(PROMPT), draft, parents)
        logits = torch.stack([_logits(0, tuple(committed.tolist()) + tuple(rows.suffix(r))) for r in range(rows.rows)])
        p = pipeline.probabilities(logits, rows)  # (n + 1, V)
        if parents is None:
            run = lambda: verify_chain(p, draft, q, None)  # noqa: E731
        else:
            run = lambda: verify_tree(p, draft, parents, q, None)  # noqa: E731
        for (_, emitted), w in exact_law(run).items():
            law[emitted] += weight * w
    return dict(law)


def extended_law(name: str, law: Law) -> Law:
    """One step's output, cut to 3 tokens and extended to 3 by plain sampling (the reference's p)."""
    out: defaultdict[tuple[int, ...], float] = defaultdict(float)

    def walk(tokens: tuple[int, ...], weight: float) -> None:
        if len(tokens) == LENGTH or _ends(name, tokens):
            out[tokens] += weight
            return
        for token, w in enumerate(reference_p(name, tuple(GENERATED) + tokens)):
            if w > 0:
                walk(tokens + (token,), weight * w)

    for emitted, w in law.items():
        walk(_cut(name, emitted, LENGTH), w)
    return dict(out)


def multi_step_law(name: str, shape: str) -> Law:
    """The output of steps until 3 tokens (or the end token), each step from its own committed state."""
    out: defaultdict[tuple[int, ...], float] = defaultdict(float)

    def walk(tokens: tuple[int, ...], weight: float) -> None:
        for emitted, w in step_law(name, shape, tuple(GENERATED) + tokens).items():
            emitted = _cut(name, emitted, LENGTH - len(tokens))
            grown = tokens + emitted
            if len(grown) == LENGTH or _ends(name, grown):
                out[grown] += weight * w
            else:
                walk(grown, weight * w)

    walk((), 1.0)
    return dict(out)


def assert_equal_laws(actual: Law, expected: Law, context: str) -> None:
    assert abs(sum(actual.values()) - 1.0) <= EXACT, f"{context}: the law sums to {sum(actual.values())!r}"
    worst = max((abs(actual.get(key, 0.0) - expected.get(key, 0.0)), key) for key in set(actual) | set(expected))
    assert worst[0] <= EXACT, (f"{context}: P{worst[1]} = {actual.get(worst[1], 0.0)!r}, plain sampling gives "
                               f"{expected.get(worst[1], 0.0)!r}")


# --- the tests ------------------------------------------------------------------------------------------

def test_each_setting_changes_plain_sampling() -> None:
    """Not vacuous: each setting moves plain sampling's next-token law away from the bare softmax."""
    for name, s in SETTINGS.items():
        bare = _logits(0, tuple(PROMPT + GENERATED)).div(s.temperature).softmax(-1)
        processed = torch.tensor(reference_p(name, tuple(GENERATED)), dtype=torch.float64)
        assert (processed - bare).abs().max() > 1e-3, name
    assert 0.0 in reference_p("grammar", tuple(GENERATED)) and 0.0 in reference_p("min-p", tuple(GENERATED))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", list(SETTINGS))
def test_one_step_extended_by_plain_sampling_is_plain_sampling(name: str, shape: str) -> None:
    law = step_law(name, shape, tuple(GENERATED))
    assert max(map(len, law)) == 3, f"{name}, {shape}: no draft was ever accepted whole"
    assert_equal_laws(extended_law(name, law), reference_law(name), f"{name}, {shape}, one step")


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", list(SETTINGS))
def test_steps_to_three_tokens_are_plain_sampling(name: str, shape: str) -> None:
    assert_equal_laws(multi_step_law(name, shape), reference_law(name), f"{name}, {shape}, steps")


@pytest.mark.parametrize("name", [name for name, s in SETTINGS.items() if s.reads_prefix])
def test_a_pipeline_blind_to_the_draft_prefix_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Power, and each setting's law depends on the prefix: p from the committed ids alone at every
    verify row (each row's draft prefix left out, as an engine that processes the draft like the
    committed text does) is far from plain sampling."""
    original = Prefixes.of_verify

    def committed_only(committed, prompt_length, draft, parents):  # type: ignore[no-untyped-def]
        rows = original(committed, prompt_length, draft, parents)
        return Prefixes(rows.committed, rows.prompt_length, torch.full_like(rows.suffixes, -1))

    monkeypatch.setattr(Prefixes, "of_verify", committed_only)
    law = extended_law(name, step_law(name, "chain", tuple(GENERATED)))
    expected = reference_law(name)
    error = max(abs(law.get(key, 0.0) - expected.get(key, 0.0)) for key in set(law) | set(expected))
    assert error > 1e-4, f"{name}: a pipeline blind to the draft prefix went unnoticed (off by {error:.3g})"

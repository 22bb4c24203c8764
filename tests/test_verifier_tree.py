"""Tree verification is lossless: an independent exact calculator, the real verifier's exact law,
greedy walks, pitfall regressions (each shown to catch a buggy variant), and tree validation.

The model. `PrefixModel` gives, for every prefix of tokens after the root (the last committed
token), the target's distribution p(prefix) and the drafter's rows q(prefix, slot), drawn
reproducibly from a seed with exact zeros, ties, one-hot rows and rows equal to p. A node's
token is drawn from its row given its ancestors' tokens, so siblings are independent draws.

The calculator (`calculator_law`) writes the tree rule down afresh in plain Python, without
`verify_tree`: at an accepted node the children are tried in draft order against p' (first p at
that node), a sampled child x accepted with min(1, p'(x)/q(x)) and p' <- norm(max(0, p' - q)) on
rejection, a deterministic one accepted with p'(x) and x removed on rejection; when all children
fail the last token is drawn from p', and an accepted leaf's bonus from p at the leaf. Over the
draft's own randomness it sums the nodes' tokens out, weighted by their q-probabilities (a node
not reached never matters, so its token is summed out lazily). Extending every output with plain
sampling to a fixed length must give exactly the product of the p's (`assert_lossless`).

The real code (`exact_law`) is tied to the calculator without sampling error: torch.rand and
torch.multinomial are replaced by scripted draws, and every branch of the verifier's decisions
is enumerated, weighted by P(U < t) for the threshold t each uniform is actually compared with,
or by the distribution handed to multinomial. A uniform compared as a tensor tells its threshold
in the comparison; one read as a Python float is weighted by the `acceptance` the verifier
reports and fed again at it, just below and at, to show that it is the threshold (`ScriptedDraws`).
A seeded Monte-Carlo chi-square then checks the real draws (direction of the comparison, the
generator).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.sampling import probabilities
from specdec.trees import chain_parents, children, depths, path_to
from specdec.types import Draft, Sampling, Verdict
from specdec.verifier import DraftError, residual_distribution, validate_draft, verify_chain, verify_tree, verify_tree_greedy
from test_lossless_statistical import ALPHA, chi_square_p_value

EXACT = 1e-9  # lossless: the extended law equals the product of p's to this
SAME = 1e-10  # the verifier's exact law equals the calculator's to this
TRUNCATED = Sampling(temperature=0.7, top_k=3, top_p=0.9)

Law = dict[tuple[tuple[int, ...], tuple[int, ...]], float]  # (accepted path, emitted tokens) -> probability
Verify = Callable[..., Verdict]

# How each node's token comes about: sampled from a row shared by its siblings (i.i.d., duplicates
# frequent), sampled from a row of its own, deterministic candidates (no probs) ranked by q or in
# an arbitrary order, or mixed (sampled rows beside one-hot rows, a one-hot row being a degenerate draw).
SAMPLED_MODES = ("shared", "per-sibling", "mixed")
DETERMINISTIC_MODES = ("top", "arbitrary")
MODES = SAMPLED_MODES + DETERMINISTIC_MODES


# --- the model: p and q for every prefix ---------------------------------------------------------

class PrefixModel:
    """p(prefix) and q(prefix, slot) over V tokens, drawn lazily and reproducibly from `seed`.

    `sampling` given: rows are `specdec.sampling.probabilities` of random logits (truncated by
    top-k / top-p); otherwise raw distributions with exact zeros, ties and one-hot rows.
    """

    def __init__(self, seed: int, vocab: int, sampling: Sampling | None = None,
                 root: tuple[tuple[float, ...], tuple[float, ...]] | None = None) -> None:
        self.seed, self.vocab, self.sampling = seed, vocab, sampling
        self._rows: dict[tuple[int, ...], tuple[float, ...]] = {}
        if root is not None:  # explicit p(()) and q((), 0)
            self._rows[0, 0], self._rows[1, 0] = root

    def __repr__(self) -> str:
        return f"PrefixModel(seed={self.seed}, vocab={self.vocab}, sampling={self.sampling})"

    def _rng(self, kind: int, slot: int, prefix: tuple[int, ...]) -> np.random.Generator:
        return np.random.default_rng([self.seed, kind, slot, len(prefix), *prefix])

    def _draw(self, rng: np.random.Generator) -> tuple[float, ...]:
        vocab = self.vocab
        if self.sampling is not None:
            logits = torch.tensor(rng.normal(0.0, 2.0, vocab), dtype=torch.float64)
            if rng.random() < 0.2:
                logits[int(rng.integers(vocab))] = logits[int(rng.integers(vocab))]  # a tie
            return tuple(probabilities(logits, self.sampling).tolist())
        style = rng.random()
        if style < 0.1:
            weights = np.zeros(vocab)
            weights[int(rng.integers(vocab))] = 1.0
        else:
            weights = rng.random(vocab) ** 2 + 1e-3
            if style < 0.45:
                weights[rng.random(vocab) < 0.4] = 0.0  # exact zeros
            elif style < 0.6:
                weights[int(rng.integers(vocab))] = weights[int(rng.integers(vocab))]  # a tie
            if not weights.any():
                weights[int(rng.integers(vocab))] = 1.0
        return tuple((weights / weights.sum()).tolist())

    def p(self, prefix: tuple[int, ...]) -> tuple[float, ...]:
        key = (0, 0, *prefix)
        if key not in self._rows:
            self._rows[key] = self._draw(self._rng(0, 0, prefix))
        return self._rows[key]

    def q(self, prefix: tuple[int, ...], slot: int) -> tuple[float, ...]:
        key = (1, slot, *prefix)
        if key not in self._rows:
            rng = self._rng(1, slot, prefix)
            self._rows[key] = self.p(prefix) if rng.random() < 0.15 else self._draw(rng)  # sometimes q == p
        return self._rows[key]

    def ranked(self, prefix: tuple[int, ...]) -> list[int]:
        """Tokens by q(prefix, 0), most likely first (ties by id): a top-k drafter's candidates."""
        row = self.q(prefix, 0)
        return sorted(range(self.vocab), key=lambda t: (-row[t], t))

    def permutation(self, prefix: tuple[int, ...]) -> tuple[int, ...]:
        key = (2, 0, *prefix)
        if key not in self._rows:
            self._rows[key] = tuple(int(t) for t in self._rng(2, 0, prefix).permutation(self.vocab))
        return self._rows[key]  # type: ignore[return-value]


def one_hot_row(token: int, vocab: int) -> tuple[float, ...]:
    return tuple(1.0 if t == token else 0.0 for t in range(vocab))


def node_spec(model: PrefixModel, mode: str, prefix: tuple[int, ...], slot: int
              ) -> tuple[tuple[float, ...] | None, list[tuple[int, float]]]:
    """(q row or None, [(token, probability)]) of the node in sibling slot `slot` after `prefix`."""
    if mode == "shared":
        row = model.q(prefix, 0)
    elif mode == "per-sibling" or (mode == "mixed" and slot % 2 == 0):
        row = model.q(prefix, slot + 1)
    elif mode == "mixed":
        token = model.permutation(prefix)[slot % model.vocab]
        return one_hot_row(token, model.vocab), [(token, 1.0)]
    elif mode == "top":
        return None, [(model.ranked(prefix)[slot], 1.0)]
    elif mode == "arbitrary":
        return None, [(model.permutation(prefix)[slot], 1.0)]
    else:
        raise ValueError(mode)
    return row, [(token, w) for token, w in enumerate(row) if w > 0]


def slots(parents: Sequence[int]) -> list[int]:
    """Each node's index among its parent's children."""
    count: Counter[int] = Counter()
    out = []
    for parent in parents:
        out.append(count[parent])
        count[parent] += 1
    return out


@dataclass(frozen=True)
class ConcreteDraft:
    tokens: tuple[int, ...]
    rows: tuple[tuple[float, ...], ...] | None  # None: deterministic (probs None)

    def tensors(self, vocab: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        tokens = torch.tensor(self.tokens, dtype=torch.long)
        if self.rows is None:
            return tokens, None
        return tokens, torch.tensor(self.rows, dtype=torch.float64).reshape(len(self.tokens), vocab)


def prefixes_of(parents: Sequence[int], tokens: Sequence[int]) -> list[tuple[int, ...]]:
    """The tokens from the root down to each node's parent (the prefix each node continues)."""
    out: list[tuple[int, ...]] = []
    for parent in parents:
        out.append(() if parent < 0 else out[parent] + (tokens[parent],))
    return out


def draft_assignments(model: PrefixModel, parents: Sequence[int], mode: str
                      ) -> Iterator[tuple[float, ConcreteDraft]]:
    """Every concrete draft the mode can produce on this tree, with its probability."""
    slot = slots(parents)

    def extend(i: int, tokens: tuple[int, ...], rows: tuple, weight: float) -> Iterator[tuple[float, ConcreteDraft]]:
        if i == len(parents):
            yield weight, ConcreteDraft(tokens, None if mode in DETERMINISTIC_MODES else rows)
            return
        prefix = () if parents[i] < 0 else prefixes_of(parents[: i], tokens)[parents[i]] + (tokens[parents[i]],)
        row, choices = node_spec(model, mode, prefix, slot[i])
        for token, w in choices:
            yield from extend(i + 1, tokens + (token,), rows + (row,), weight * w)

    yield from extend(0, (), (), 1.0)


def sample_draft(model: PrefixModel, parents: Sequence[int], mode: str, rng: np.random.Generator) -> ConcreteDraft:
    slot = slots(parents)
    tokens: list[int] = []
    rows = []
    paths: list[tuple[int, ...]] = []  # tokens from the root down to each node
    for i, parent in enumerate(parents):
        prefix = () if parent < 0 else paths[parent]
        row, choices = node_spec(model, mode, prefix, slot[i])
        threshold = rng.random() * sum(w for _, w in choices)
        for token, w in choices:
            threshold -= w
            if threshold < 0:
                break
        tokens.append(token)
        paths.append(prefix + (token,))
        rows.append(row)
    return ConcreteDraft(tuple(tokens), None if mode in DETERMINISTIC_MODES else tuple(rows))


def target_rows(model: PrefixModel, parents: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """p [n + 1, V] as the loop hands it to the verifier: row 0 the root, row i + 1 node i."""
    rows = [model.p(())] + [model.p(prefix + (tokens[i],)) for i, prefix in enumerate(prefixes_of(parents, tokens))]
    return torch.tensor(rows, dtype=torch.float64)


# --- the calculator: the tree rule written down afresh, no verify_tree ---------------------------

def calculator_law(model: PrefixModel, parents: Sequence[int], mode: str, draft: ConcreteDraft | None = None) -> Law:
    """Exact law of (accepted path, emitted tokens): for the fixed `draft`, or over the draft's
    own randomness (draft None: each node's token summed out with its q-probability)."""
    kids = children(parents)
    slot = slots(parents)
    vocab = model.vocab

    def node_law(row: int, prefix: tuple[int, ...]) -> Law:
        if not kids[row]:  # accepted leaf (or the root of an empty tree): bonus from its own p
            return {((), (y,)): w for y, w in enumerate(model.p(prefix)) if w > 0}
        return group_law(kids[row], 0, prefix, model.p(prefix))

    def group_law(group: list[int], j: int, prefix: tuple[int, ...], dist: Sequence[float]) -> Law:
        if j == len(group):  # every child rejected: the correction from p'
            return {((), (y,)): w for y, w in enumerate(dist) if w > 0}
        child = group[j]
        row, choices = node_spec(model, mode, prefix, slot[child])
        if draft is not None:
            choices = [(draft.tokens[child], 1.0)]
            row = None if draft.rows is None else draft.rows[child]
        out: defaultdict = defaultdict(float)
        rejected = 0.0
        rejected_token = -1
        for token, weight in choices:
            accept = dist[token] if row is None else min(1.0, dist[token] / row[token])
            if accept > 0:
                for (path, emitted), w in node_law(child + 1, prefix + (token,)).items():
                    out[(child,) + path, (token,) + emitted] += weight * accept * w
            rejected += weight * (1.0 - accept)
            rejected_token = token
        if rejected > 0:
            if row is None:  # deterministic: remove the candidate
                residual = [0.0 if t == rejected_token else dist[t] for t in range(vocab)]
            else:
                residual = [max(0.0, dist[t] - row[t]) for t in range(vocab)]
            mass = sum(residual)
            residual = [r / mass for r in residual] if mass > 1e-12 else list(dist)
            for key, w in group_law(group, j + 1, prefix, residual).items():
                out[key] += rejected * w
        return dict(out)

    return node_law(0, ())


def emitted_law(law: Law) -> dict[tuple[int, ...], float]:
    out: defaultdict = defaultdict(float)
    for (_, emitted), w in law.items():
        out[emitted] += w
    return dict(out)


def lossless_error(model: PrefixModel, law: Law, length: int) -> float:
    """max |P(s) - prod p| over all s of `length` tokens, the output extended by plain sampling."""
    by_tokens = emitted_law(law)
    assert max(map(len, by_tokens)) <= length
    worst = abs(sum(by_tokens.values()) - 1.0)
    for sequence in itertools.product(range(model.vocab), repeat=length):
        steps = [model.p(sequence[:t])[sequence[t]] for t in range(length)]
        target = math.prod(steps)
        got = sum(by_tokens.get(sequence[:m], 0.0) * math.prod(steps[m:]) for m in range(1, length + 1))
        worst = max(worst, abs(got - target))
    return worst


def assert_lossless(model: PrefixModel, law: Law, length: int, context: str) -> None:
    error = lossless_error(model, law, length)
    assert error <= EXACT, f"{context}: the output extended to {length} tokens is off by {error:.3g}"


def assert_same_law(actual: Law, expected: Law, context: str) -> None:
    keys = set(actual) | set(expected)
    worst = max((abs(actual.get(key, 0.0) - expected.get(key, 0.0)), key) for key in keys)
    assert worst[0] <= SAME, (f"{context}: P{worst[1]} is {actual.get(worst[1], 0.0)!r}, "
                              f"expected {expected.get(worst[1], 0.0)!r}")


# --- the real verifier's exact law: scripted draws ------------------------------------------------

LOW, HIGH = 0.0, math.nextafter(1.0, 0.0)  # a uniform below / at least any threshold in (0, 1)

# Tensor comparisons by name -> whether "uniform OP threshold" holding means the uniform is below it
# (a continuous U makes < and <= one event, > and >= the other)
BELOW = {"lt": True, "__lt__": True, "less": True, "le": True, "__le__": True, "less_equal": True,
         "gt": False, "__gt__": False, "greater": False, "ge": False, "__ge__": False, "greater_equal": False}
KEEPS_DRAWS = ("__getitem__", "reshape", "view", "flatten", "squeeze", "unsqueeze")  # each element stays one draw
TRANSPARENT = ("__get__", "__set__", "__len__", "dim", "size", "numel")  # shapes and dtypes: nothing is read


class ScriptedDraws:
    """Stand-ins for torch.rand and torch.multinomial that follow a script of choices.

    A uniform's choice 0 stands for the event U < t, choice 1 for U >= t, where t is the threshold
    the verifier compares it with; a multinomial's choice c picks the c-th token of its support.
    Past the script every draw takes choice 0 and records how many choices it had.

    A uniform's threshold is what the verifier does with the draw, not what it reports: compared as
    a tensor (`Uniforms`: the token-wise and block rules), the comparison names its threshold, is
    recorded, and answers the scripted outcome. Read as a number (float(), item(), tolist(): the
    tree walks compare Python floats), it gives LOW or HIGH (or `values[i]`), and its threshold is
    the verifier's `acceptance` entry, paired in draw order, which `exact_law` then tests by feeding
    the draw at that threshold. A uniform neither compared nor read decides nothing (weight 1).
    """

    def __init__(self, script: Sequence[int], values: dict[int, float] | None = None) -> None:
        self.script = tuple(script)
        self.values = values or {}  # uniform draw -> the value it reads as (else LOW or HIGH)
        self.kinds: list[str] = []
        self.options: list[int] = []
        self.weights: list[float | None] = []  # None for uniforms: known after the call
        self.thresholds: dict[int, float] = {}  # uniform draw -> the threshold a tensor comparison gave it
        self.read: set[int] = set()  # uniform draws read as numbers
        self.reported: dict[int, float] = {}  # read draws -> the threshold the verifier reports (`resolve`)

    def choice(self, index: int) -> int:
        return self.script[index] if index < len(self.script) else 0

    def _choose(self, kind: str, options: int) -> int:
        index = len(self.kinds)
        self.kinds.append(kind)
        self.options.append(options)
        return self.choice(index)

    def rand(self, *size: Any, generator: Any = None, dtype: torch.dtype | None = None, device: Any = None,
             **_: Any) -> torch.Tensor:
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        first = len(self.kinds)
        values = []
        for _ in range(math.prod(shape)):
            choice = self._choose("u", 2)
            self.weights.append(None)
            values.append(self.values.get(len(self.kinds) - 1, HIGH if choice else LOW))
        return Uniforms.made(self, torch.tensor(values, dtype=dtype or torch.float32).reshape(shape),
                             list(range(first, len(self.kinds))))

    def multinomial(self, distribution: torch.Tensor, num_samples: int, replacement: bool = False,
                    generator: Any = None, **_: Any) -> torch.Tensor:
        assert distribution.dim() == 1 and num_samples == 1, "scripted draws serve one token at a time"
        support = distribution.nonzero().flatten().tolist()
        assert support, f"multinomial of an all-zero distribution {distribution}"
        token = support[self._choose("m", len(support))]
        self.weights.append(float(distribution[token] / distribution.sum()))
        return torch.tensor([token])

    def compare(self, index: int, threshold: float, below: bool) -> bool:
        """Whether uniform `index` is below `threshold` (below=True) or at least it, as scripted."""
        known = self.thresholds.setdefault(index, threshold)
        assert known == threshold or known != known, f"uniform {index} compared with {known}, then {threshold}"
        return (self.choice(index) == 0) == below

    def resolve(self, acceptance: list[float]) -> list[float]:
        """The probability of each choice taken: a compared uniform's from its threshold, a read one's
        from the `acceptance` entry of its place among the uniforms drawn."""
        uniforms = [i for i, kind in enumerate(self.kinds) if kind == "u"]
        read = [i for i in uniforms if i in self.read and i not in self.thresholds]
        if read:
            assert len(uniforms) == len(acceptance), f"{len(uniforms)} uniforms drawn, {len(acceptance)} acceptances"
            self.reported = {i: a for i, a in zip(uniforms, acceptance) if i in read}
        weights = list(self.weights)
        for i in uniforms:
            t = min(1.0, max(0.0, self.thresholds.get(i, self.reported.get(i, 1.0))))
            weights[i] = t if self.choice(i) == 0 else 1.0 - t
        return weights  # type: ignore[return-value]


class Uniforms(torch.Tensor):
    """ScriptedDraws.rand's tensor: each element knows its draw (`draws`, in element order).
    Compared with a tensor or a number, it answers each draw's scripted outcome and records the
    threshold (`ScriptedDraws.compare`); indexed or reshaped, its elements keep their draws; used
    any other way (float(), tolist(), arithmetic), its draws count as read as numbers."""

    source: ScriptedDraws
    draws: list[int]

    @staticmethod
    def made(source: ScriptedDraws, values: torch.Tensor, draws: list[int]) -> Uniforms:
        out = values.as_subclass(Uniforms)
        out.source, out.draws = source, draws
        return out

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        with torch._C.DisableTorchFunctionSubclass():
            if name in TRANSPARENT:
                return func(*args, **kwargs)
            mine = [arg for arg in args if isinstance(arg, Uniforms)]
            mine += [item for arg in (*args, *kwargs.values()) if isinstance(arg, (list, tuple))  # torch.cat's list
                     for item in arg if isinstance(item, Uniforms)]
            if name in BELOW and len(args) == 2 and not kwargs and len(mine) == 1:
                first, second = args
                if first is mine[0]:
                    return first.compared(second, BELOW[name])
                if second is mine[0]:
                    return second.compared(first, not BELOW[name])  # threshold OP uniform
            out = func(*args, **kwargs)
            if name in KEEPS_DRAWS and len(mine) == 1 and args[0] is mine[0] and isinstance(out, torch.Tensor):
                index = torch.tensor(mine[0].draws).reshape(mine[0].shape)
                return Uniforms.made(mine[0].source, out, func(index, *args[1:], **kwargs).flatten().tolist())
        for uniforms in mine:
            uniforms.source.read.update(uniforms.draws)
        return out

    def compared(self, threshold: Any, below: bool) -> torch.Tensor:
        """The scripted outcome of each element against its threshold, elementwise (torch functions off)."""
        thresholds = threshold.to(torch.float64) if isinstance(threshold, torch.Tensor) else \
            torch.tensor(float(threshold), dtype=torch.float64)
        values, index = torch.broadcast_tensors(thresholds, torch.tensor(self.draws).reshape(self.shape))
        assert index.numel() == len(self.draws), "one uniform compared with several thresholds at once"
        outcome = [self.source.compare(draw, value, below)
                   for draw, value in zip(index.flatten().tolist(), values.flatten().tolist())]
        return torch.tensor(outcome, dtype=torch.bool).reshape(index.shape)


@contextmanager
def scripted(draws: ScriptedDraws) -> Iterator[None]:
    with mock.patch.object(torch, "rand", draws.rand), mock.patch.object(torch, "multinomial", draws.multinomial):
        yield


def _outcome(draws: ScriptedDraws, verdict: Verdict) -> tuple[Any, ...]:
    """What a run did: its draws in order (kind, choices, a multinomial's weight) and its verdict."""
    return (draws.kinds, draws.options, draws.weights, verdict.accepted_nodes, verdict.tokens.tolist())


def check_read_thresholds(run: Callable[[], Verdict], draws: ScriptedDraws, verdict: Verdict) -> None:
    """The uniforms `run` read as numbers were weighted by the thresholds it reports: run it again
    with each fed just below its threshold where the script has U < t, at it where U >= t. The
    same branches must follow; a verifier that compares with anything else takes another at one
    of them (so does u <= t, though it differs from u < t with probability zero). Over the two
    branches of one draw this pins t to the reported value."""
    values = {i: math.nextafter(a, -math.inf) if draws.choice(i) == 0 else a for i, a in draws.reported.items()}
    probe = ScriptedDraws([draws.choice(i) for i in range(len(draws.kinds))], values)
    with scripted(probe):
        again = run()
    assert _outcome(probe, again) == _outcome(draws, verdict), (
        f"fed just below or at the thresholds it reports (draw: value {values}), the verifier took other "
        f"branches: it compares its uniforms with something other than the acceptance it reports")


def exact_law(run: Callable[[], Verdict]) -> Law:
    """The exact law of (accepted path, emitted tokens) of `run()`, every branch of its draws enumerated."""
    law: defaultdict = defaultdict(float)
    pending: list[tuple[int, ...]] = [()]
    checked: set[tuple[int, ...]] = set()  # the choices up to and including each read uniform fed at its threshold
    while pending:
        script = pending.pop()
        draws = ScriptedDraws(script)
        with scripted(draws):
            verdict = run()
        weights = draws.resolve([] if verdict.acceptance is None else verdict.acceptance.tolist())
        for i in range(len(script), len(draws.kinds)):
            if any(w == 0.0 for w in weights[:i]):
                break
            for alternative in range(1, draws.options[i]):
                if draws.kinds[i] == "u" and weights[i] == 1.0:
                    continue  # t = 1 (or a uniform that decides nothing): U >= t has probability 0
                pending.append(script + tuple(0 for _ in range(len(script), i)) + (alternative,))
        weight = math.prod(weights)
        if weight > 0:
            taken = [draws.choice(i) for i in range(len(draws.kinds))]
            ways = {tuple(taken[: i + 1]) for i in draws.reported}
            if not ways <= checked:  # a read uniform no earlier run reached this way (most share their parent's)
                check_read_thresholds(run, draws, verdict)
                checked |= ways
            law[tuple(verdict.accepted_nodes), tuple(verdict.tokens.tolist())] += weight
    return dict(law)


def verifier_law(verify: Verify, model: PrefixModel, parents: Sequence[int], draft: ConcreteDraft) -> Law:
    tokens, q = draft.tensors(model.vocab)
    p = target_rows(model, parents, draft.tokens)
    return exact_law(lambda: verify(p, tokens, list(parents), q, None))


def marginal_verifier_law(verify: Verify, model: PrefixModel, parents: Sequence[int], mode: str) -> Law:
    """The exact law of `verify` over the draft's randomness too (every assignment enumerated)."""
    law: defaultdict = defaultdict(float)
    for weight, draft in draft_assignments(model, parents, mode):
        for key, w in verifier_law(verify, model, parents, draft).items():
            law[key] += weight * w
    return dict(law)


# --- buggy variants, each one the pitfall tests below must catch -----------------------------------

def _rows(p: torch.Tensor | Callable[[int], torch.Tensor]) -> Callable[[int], torch.Tensor]:
    """p as verify_tree takes it (a tensor [n + 1, V] or a function of the row) -> a function of the row."""
    return p.__getitem__ if isinstance(p, torch.Tensor) else p


def _buggy_verify_tree(p: torch.Tensor | Callable[[int], torch.Tensor], tokens: torch.Tensor,
                       parents: Sequence[int], q: torch.Tensor | None, generator: torch.Generator | None,
                       *, stale_bonus: bool = False, dedup: bool = False, keep_p: bool = False,
                       squared: bool = False) -> Verdict:
    """The tree walk with one known bug switched on (each flag is LOSSY):

    stale_bonus: after accepting a leaf, the bonus comes from p' of the level the leaf was tried
        at (p there, or the residual its rejected elder siblings left), not the leaf's own row;
    dedup: each distinct token is tried once among siblings, though i.i.d. siblings must each be
        tried against the residual;
    keep_p: a rejected sibling leaves p' unchanged, so the next sibling and the correction see
        p, not the residual (a rejected deterministic candidate can come straight back);
    squared: a child is accepted when its uniform falls below its acceptance squared, while the
        verdict reports the acceptance itself.
    """
    row_of = _rows(p)
    dtype = row_of(0).dtype
    if q is not None:
        q = (q / q.sum(dim=-1, keepdim=True)).to(dtype)
    kids = children(parents)
    path: list[int] = []
    tried: list[float] = []
    row = 0
    while True:
        distribution = row_of(row)
        chosen = -1
        seen: set[int] = set()
        for child in kids[row]:
            token = int(tokens[child])
            if dedup and token in seen:
                continue
            seen.add(token)
            accept = float(distribution[token]) if q is None else min(1.0, float(distribution[token] / q[child, token]))
            tried.append(accept)
            if float(torch.rand((), generator=generator, dtype=dtype)) < (accept**2 if squared else accept):
                chosen = child
                break
            if not keep_p:
                distribution = residual_distribution(distribution, None if q is None else q[child], tokens[child])
        if chosen < 0 or (stale_bonus and not kids[chosen + 1]):
            if chosen >= 0:
                path.append(chosen)
            last = torch.multinomial(distribution, 1, generator=generator)  # stale after a leaf
            break
        path.append(chosen)
        row = chosen + 1
    return Verdict(tokens=torch.cat([tokens[path], last]), num_accepted=len(path),
                   acceptance=torch.tensor(tried, dtype=dtype), path=tuple(path))


def verify_tree_stale_bonus(p, tokens, parents, q, generator) -> Verdict:  # type: ignore[no-untyped-def]
    return _buggy_verify_tree(p, tokens, parents, q, generator, stale_bonus=True)


def verify_tree_dedup_siblings(p, tokens, parents, q, generator) -> Verdict:  # type: ignore[no-untyped-def]
    return _buggy_verify_tree(p, tokens, parents, q, generator, dedup=True)


def verify_tree_siblings_against_p(p, tokens, parents, q, generator) -> Verdict:  # type: ignore[no-untyped-def]
    return _buggy_verify_tree(p, tokens, parents, q, generator, keep_p=True)


def verify_tree_squared(p, tokens, parents, q, generator) -> Verdict:  # type: ignore[no-untyped-def]
    return _buggy_verify_tree(p, tokens, parents, q, generator, squared=True)


def verify_tree_smoothed(p: torch.Tensor | Callable[[int], torch.Tensor], tokens: torch.Tensor,
                         parents: Sequence[int], q: torch.Tensor | None,
                         generator: torch.Generator | None) -> Verdict:
    """LOSSY: "guards against zeros" by flooring p at 1e-9, so truncated tokens can come out."""
    if isinstance(p, torch.Tensor):
        values = p.clamp(min=1e-9)
        return verify_tree(values / values.sum(-1, keepdim=True), tokens, parents, q, generator)

    def floored(row: int) -> torch.Tensor:
        values = p(row).clamp(min=1e-9)
        return values / values.sum()

    return verify_tree(floored, tokens, parents, q, generator)


# --- strategies ------------------------------------------------------------------------------------

@st.composite
def tree_shapes(draw: st.DrawFn, max_nodes: int = 6, max_depth: int = 3, max_children: int | None = None,
                chain: bool | None = None) -> list[int]:
    """Parent lists in a random topological order (not only breadth-first), or chains."""
    if chain is None:
        chain = draw(st.integers(0, 4)) == 0
    if chain:
        return chain_parents(draw(st.integers(1, max_depth)))
    n = draw(st.integers(1, max_nodes))
    parents: list[int] = []
    depth: list[int] = []
    count: Counter[int] = Counter()
    for i in range(n):
        options = [j for j in [-1, *range(i)] if (j < 0 or depth[j] < max_depth)
                   and (max_children is None or count[j] < max_children)]
        parent = draw(st.sampled_from(options))
        parents.append(parent)
        depth.append(1 if parent < 0 else depth[parent] + 1)
        count[parent] += 1
    return parents


@st.composite
def cases(draw: st.DrawFn, modes: Sequence[str] = MODES, max_nodes: int = 6
          ) -> tuple[PrefixModel, list[int], str]:
    vocab = draw(st.integers(3, 4))
    mode = draw(st.sampled_from(list(modes)))
    sampling = draw(st.sampled_from([None, None, TRUNCATED]))
    max_children = vocab if mode in DETERMINISTIC_MODES else None  # distinct candidates
    parents = draw(tree_shapes(max_nodes=max_nodes, max_children=max_children))
    model = PrefixModel(draw(st.integers(0, 2**32 - 1)), vocab, sampling)
    return model, parents, mode


def depth_of(parents: Sequence[int]) -> int:
    return max(depths(parents), default=0)


# --- the calculator: lossless for every tree and draft kind ---------------------------------------

@settings(max_examples=150)
@given(cases())
def test_calculator_output_extended_by_plain_sampling_is_the_target_chain(case) -> None:
    model, parents, mode = case
    law = calculator_law(model, parents, mode)
    assert_lossless(model, law, depth_of(parents) + 1, f"mode {mode}, parents {parents}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("parents", [[-1], [-1, 0], [-1, 0, 1]], ids=["chain1", "chain2", "chain3"])
def test_chains_given_as_trees_are_lossless(parents: list[int], mode: str) -> None:
    for seed in range(5):
        model = PrefixModel(seed, 4, TRUNCATED if seed % 2 else None)
        assert_lossless(model, calculator_law(model, parents, mode), len(parents) + 1, f"{mode}, seed {seed}")


@settings(max_examples=40)
@given(cases(max_nodes=4))
def test_calculator_sums_the_draft_out_like_an_explicit_enumeration(case) -> None:
    """The lazy sum over the draft's randomness equals summing every concrete draft's law."""
    model, parents, mode = case
    explicit: defaultdict = defaultdict(float)
    for weight, draft in draft_assignments(model, parents, mode):
        for key, w in calculator_law(model, parents, mode, draft).items():
            explicit[key] += weight * w
    assert_same_law(dict(explicit), calculator_law(model, parents, mode), f"mode {mode}, parents {parents}")


# --- verify_tree has the calculator's law -----------------------------------------------------------

@settings(max_examples=120)
@given(cases(), st.integers(0, 2**32 - 1))
def test_verify_tree_has_the_calculators_exact_law(case, draft_seed: int) -> None:
    model, parents, mode = case
    draft = sample_draft(model, parents, mode, np.random.default_rng(draft_seed))
    assert_same_law(verifier_law(verify_tree, model, parents, draft), calculator_law(model, parents, mode, draft),
                    f"mode {mode}, parents {parents}, draft {draft.tokens}")


@settings(max_examples=40)
@given(cases(), st.integers(0, 2**32 - 1))
def test_p_given_as_a_row_function_has_the_same_law(case, draft_seed: int) -> None:
    """The loop hands verify_tree a function of the row (rows computed on demand): same law,
    and only rows on the walk (the root, then accepted nodes) are asked for."""
    model, parents, mode = case
    draft = sample_draft(model, parents, mode, np.random.default_rng(draft_seed))
    tokens, q = draft.tensors(model.vocab)
    p = target_rows(model, parents, draft.tokens)
    asked: set[int] = set()

    def row(r: int) -> torch.Tensor:
        asked.add(r)
        return p[r]

    law = exact_law(lambda: verify_tree(row, tokens, parents, q, None))
    assert_same_law(law, verifier_law(verify_tree, model, parents, draft), f"mode {mode}, parents {parents}")
    visitable = {0} | {node + 1 for path, _ in law for node in path}
    assert asked <= visitable, f"rows {sorted(asked - visitable)} were computed but never on an accepted path"


@settings(max_examples=60)
@given(cases(modes=MODES), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_chain_given_as_a_tree_has_the_law_of_verify_chain(case, length: int, draft_seed: int) -> None:
    model, _, mode = case
    parents = chain_parents(length)
    draft = sample_draft(model, parents, mode, np.random.default_rng(draft_seed))
    tokens, q = draft.tensors(model.vocab)
    p = target_rows(model, parents, draft.tokens)
    chain = exact_law(lambda: verify_chain(p, tokens, q, None))
    assert_same_law(verifier_law(verify_tree, model, parents, draft), chain, f"mode {mode}, draft {draft.tokens}")


def test_scripted_enumeration_reproduces_the_chain_closed_form() -> None:
    """The enumeration itself, checked on one position: P(out) = p for d ~ q (test_verifier_exact)."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.6, 0.0, 0.3]], dtype=torch.float64)
    out: defaultdict = defaultdict(float)
    for d in (0, 1, 3):
        for (_, emitted), w in exact_law(lambda: verify_chain(p, torch.tensor([d]), q, None)).items():
            out[emitted[0]] += float(q[0, d]) * w
    assert [out[t] for t in range(4)] == pytest.approx(p[0].tolist(), abs=1e-12)


def test_the_enumeration_weighs_each_uniform_by_the_threshold_it_is_compared_with() -> None:
    """A tree walk that accepts when u < a**2 while reporting a (its uniforms read as floats): fed at
    the thresholds it reports, it takes other branches, and the harness says so."""
    model, parents = PrefixModel(0, 3), [-1, -1, 0]
    assert_lossless(model, marginal_verifier_law(_buggy_verify_tree, model, parents, "shared"), 3, "the walk")
    with pytest.raises(AssertionError, match="took other branches"):
        marginal_verifier_law(verify_tree_squared, model, parents, "shared")


# Fixed trees for the Monte-Carlo check of the real draws: (parents, mode, vocab, sampling, seed).
MONTE_CARLO = {
    "shared-iid-siblings": ([-1, -1, -1, 0, 0, 3], "shared", 3, None, 11),
    "per-sibling-rows": ([-1, 0, -1, 2, 1], "per-sibling", 4, None, 12),
    "top-candidates": ([-1, -1, 0, 0, 1], "top", 4, None, 13),
    "mixed-truncated": ([-1, -1, -1, 0, 1, 4], "mixed", 4, TRUNCATED, 14),
}


@pytest.mark.parametrize("name", list(MONTE_CARLO))
def test_verify_tree_samples_the_calculators_law(name: str) -> None:
    parents, mode, vocab, sampling, seed = MONTE_CARLO[name]
    model = PrefixModel(seed, vocab, sampling)
    law = calculator_law(model, parents, mode)
    keys = sorted(law)
    index = {key: i for i, key in enumerate(keys)}
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    counts = np.zeros(len(keys) + 1, dtype=np.int64)  # the last cell: outcomes the law rules out
    accepted = 0
    for _ in range(3000):
        draft = sample_draft(model, parents, mode, rng)
        tokens, q = draft.tensors(vocab)
        verdict = verify_tree(target_rows(model, parents, draft.tokens), tokens, parents, q, generator)
        counts[index.get((tuple(verdict.accepted_nodes), tuple(verdict.tokens.tolist())), len(keys))] += 1
        accepted += verdict.num_accepted
    assert accepted > 0
    probs = np.array([law[key] for key in keys] + [0.0])
    p_value = chi_square_p_value(counts, probs / probs.sum())
    assert p_value >= ALPHA, f"{name}: verify_tree's draws deviate from the exact law: p = {p_value:.3g}"


# --- greedy -----------------------------------------------------------------------------------------

def greedy_walk(argmax: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """(path, emitted): from the root, descend into the first child equal to the argmax there."""
    path: list[int] = []
    row = 0
    while True:
        match = [i for i, parent in enumerate(parents) if parent == row - 1 and tokens[i] == argmax[row]]
        if not match:
            return path, [tokens[i] for i in path] + [argmax[row]]
        path.append(match[0])
        row = match[0] + 1


@settings(max_examples=200)
@given(st.data())
def test_greedy_tree_follows_the_first_child_equal_to_the_argmax(data: st.DataObject) -> None:
    vocab = data.draw(st.integers(2, 4))
    parents = data.draw(tree_shapes(max_nodes=10, max_depth=4))
    n = len(parents)
    tokens = data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    argmax = data.draw(st.lists(st.integers(0, vocab - 1), min_size=n + 1, max_size=n + 1))
    verdict = verify_tree_greedy(torch.tensor(argmax), torch.tensor(tokens, dtype=torch.long), parents)
    path, emitted = greedy_walk(argmax, tokens, parents)
    assert list(verdict.accepted_nodes) == path and verdict.num_accepted == len(path)
    assert verdict.tokens.tolist() == emitted
    kids = children(parents)
    compared = []  # children compared at each visited row, up to the first match
    for row in [0] + [node + 1 for node in path]:
        for child in kids[row]:
            compared.append(1.0 if tokens[child] == argmax[row] else 0.0)
            if compared[-1]:
                break
    assert verdict.acceptance.tolist() == compared


@settings(max_examples=150)
@given(st.data())
def test_greedy_tree_emits_the_greedy_chain_to_the_trees_reach(data: st.DataObject) -> None:
    vocab = data.draw(st.integers(2, 4))
    model = PrefixModel(data.draw(st.integers(0, 2**32 - 1)), vocab)
    greedy: list[int] = []
    for _ in range(6):
        row = model.p(tuple(greedy))
        greedy.append(max(range(vocab), key=lambda t: (row[t], -t)))  # the first argmax, as torch's
    parents = data.draw(tree_shapes(max_nodes=10, max_depth=4, max_children=vocab))
    n = len(parents)
    tokens = [0] * n  # distinct candidates among siblings, as deterministic drafts promise
    for group in children(parents):
        for child, token in zip(group, data.draw(st.permutations(range(vocab)))):
            tokens[child] = token
    if data.draw(st.booleans()):  # plant the greedy chain along one branch (swapping with a sibling)
        leaf = data.draw(st.integers(0, n - 1))
        for depth, node in enumerate(path_to(parents, leaf)):
            for sibling in children(parents)[parents[node] + 1]:
                if tokens[sibling] == greedy[depth]:
                    tokens[sibling] = tokens[node]
            tokens[node] = greedy[depth]
    argmax = [int(torch.tensor(model.p(prefix)).argmax()) for prefix in
              [()] + [prefix + (tokens[i],) for i, prefix in enumerate(prefixes_of(parents, tokens))]]
    verdict = verify_tree_greedy(torch.tensor(argmax), torch.tensor(tokens, dtype=torch.long), parents)
    reach = max([d for i, d in enumerate(depths(parents))
                 if [tokens[j] for j in path_to(parents, i)] == greedy[:d]], default=0)
    assert verdict.num_accepted == reach
    assert verdict.tokens.tolist() == greedy[: reach + 1]


# --- pitfalls: each test flags its buggy variant ---------------------------------------------------

def assert_flags(lossless: bool, errors: list[float], context: str) -> None:
    if lossless:
        assert max(errors) <= EXACT, f"{context}: lossless verifier off by {max(errors):.3g}"
    else:
        assert min(errors) > 1e-3, f"{context}: the buggy variant went undetected, errors {errors}"


# Trees where leaves are accepted at full depth after elder siblings were rejected above them.
FULL_DEPTH = [([-1, -1], "top", 3, 0), ([-1, -1], "shared", 3, 1), ([-1, -1, 1, 1], "per-sibling", 3, 2),
              ([-1, -1, 0, 1, 1], "mixed", 3, 6), ([-1, 0, 0, -1, 3], "arbitrary", 3, 4)]


@pytest.mark.parametrize(("verify", "lossless", "rule"), [
    pytest.param(verify_tree, True, "bonus and residual chain", id="verify_tree"),
    pytest.param(verify_tree_stale_bonus, False, "bonus after a full-depth acceptance",
                 id="stale-residual-bonus-is-caught"),
    pytest.param(verify_tree_siblings_against_p, False, "residual chain over siblings",
                 id="siblings-against-p-is-caught"),
])
def test_full_depth_bonus_and_sibling_residuals(verify: Verify, lossless: bool, rule: str) -> None:
    """The bonus after a full-depth acceptance comes from the leaf's own row, and each rejected
    sibling leaves its residual for the next: the real verifier passes, each broken twin is flagged."""
    errors = []
    for parents, mode, vocab, seed in FULL_DEPTH:
        model = PrefixModel(seed, vocab)
        errors.append(lossless_error(model, marginal_verifier_law(verify, model, parents, mode), depth_of(parents) + 1))
    assert_flags(lossless, errors, rule)


# i.i.d. siblings from one row over a small vocabulary, duplicates frequent. At the root the
# residual of a rejection keeps two tokens, so trying a duplicate against it changes it again:
# p = (.2, .3, .5), q = (.6, .2, .2) leave (0, .25, .75), and trying q again (0, 1/12, 11/12).
# (Where a residual is one-hot, a skipped duplicate happens to change nothing.)
ROOT_3 = ((0.2, 0.3, 0.5), (0.6, 0.2, 0.2))
ROOT_4 = ((0.1, 0.3, 0.2, 0.4), (0.4, 0.1, 0.3, 0.2))
DUPLICATES = [([-1, -1], ROOT_3, 20), ([-1, -1, -1], ROOT_3, 21), ([-1, -1, 0, 0], ROOT_3, 22),
              ([-1, -1, -1], ROOT_4, 23), ([-1, 0, -1, 0, 1], ROOT_4, 24)]


@pytest.mark.parametrize(("verify", "lossless"), [
    pytest.param(verify_tree, True, id="verify_tree"),
    pytest.param(verify_tree_dedup_siblings, False, id="dedup-siblings-is-caught"),
])
def test_duplicate_iid_siblings_are_each_tried(verify: Verify, lossless: bool) -> None:
    errors = []
    for parents, root, seed in DUPLICATES:
        model = PrefixModel(seed, len(root[0]), root=root)
        errors.append(lossless_error(model, marginal_verifier_law(verify, model, parents, "shared"),
                                     depth_of(parents) + 1))
    assert_flags(lossless, errors, "duplicate i.i.d. siblings")


def test_duplicate_siblings_are_tried_in_turn() -> None:
    """Two equal i.i.d. siblings: the second is tried (a second uniform) after the first fails."""
    p = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.6, 0.2, 0.2]] * 2, dtype=torch.float64)
    law = exact_law(lambda: verify_tree(p, torch.tensor([0, 0]), [-1, -1], q, None))
    # the first is accepted with 1/3; after it p' = (0, .1, .3)/.4 gives the second 0, and the
    # correction comes from the residual of that: (0, .05, .55)/.6 (de-duplicating would use p')
    assert law == pytest.approx({((0,), (0, 0)): 1 / 3, ((), (1,)): 2 / 3 / 12, ((), (2,)): 2 / 3 * 11 / 12},
                                abs=1e-12)


def truncated_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, list[int], torch.Tensor | None]:
    """p from the sampling pipeline (t 0.7, top-k 3, top-p 0.9) over V = 6, a 2-level tree whose
    nodes are the target's likely tokens, so leaves are accepted and bonuses drawn."""
    generator = torch.Generator().manual_seed(seed)
    parents = [-1, -1, 0, 0, 1]
    p = probabilities(2.5 * torch.randn(6, 6, generator=generator, dtype=torch.float64), TRUNCATED)  # (n+1, V)
    order = p.argsort(dim=-1, descending=True)
    tokens = torch.tensor([int(order[0, 1]), int(order[0, 0]), int(order[1, 0]), int(order[1, 1]), int(order[2, 0])])
    q = None
    if seed % 2:  # sampled from q = the drafter's own processed rows (tokens in their support)
        q = probabilities(2.5 * torch.randn(5, 6, generator=generator, dtype=torch.float64), TRUNCATED)
        q[torch.arange(5), tokens] += 0.5
        q = q / q.sum(-1, keepdim=True)
    return p, tokens, parents, q


def outside_truncation(law: Law, p: torch.Tensor, parents: Sequence[int]) -> list:
    """Outcomes of positive probability emitting a token the truncated p at its row rules out."""
    bad = []
    for (path, emitted), w in law.items():
        rows = [0] + [node + 1 for node in path]
        if any(float(p[row, token]) == 0.0 for row, token in zip(rows, emitted)):
            bad.append(((path, emitted), w))
    return bad


@pytest.mark.parametrize(("verify", "lossless"), [
    pytest.param(verify_tree, True, id="verify_tree"),
    pytest.param(verify_tree_smoothed, False, id="floored-p-is-caught"),
    pytest.param(verify_tree_stale_bonus, False, id="stale-residual-bonus-is-caught"),
])
def test_truncated_tokens_never_come_out_as_bonus_or_correction(verify: Verify, lossless: bool) -> None:
    found = []
    for seed in range(6):
        p, tokens, parents, q = truncated_case(seed)
        assert int((p == 0).sum(-1).min()) >= 3, "top-k 3 of 6 must rule out tokens at every row"
        law = exact_law(lambda: verify(p, tokens, parents, q, None))
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
        assert any(len(path) == 2 for path, _ in law), "no leaf is ever accepted: the case is vacuous"
        found.append(outside_truncation(law, p, parents))
    if lossless:
        assert not any(found), f"tokens outside top-k / top-p emitted: {found}"
    else:
        assert any(found), "the buggy variant never emitted a truncated token"


def test_truncated_tokens_never_come_out_of_the_real_draws() -> None:
    generator = torch.Generator().manual_seed(5)
    for seed in range(6):
        p, tokens, parents, q = truncated_case(seed)
        for _ in range(300):
            verdict = verify_tree(p, tokens, parents, q, generator)
            rows = [0] + [node + 1 for node in verdict.accepted_nodes]
            assert all(float(p[row, t]) > 0 for row, t in zip(rows, verdict.tokens.tolist())), verdict


@pytest.mark.parametrize("mode", ["shared", "top", "mixed"])
def test_truncated_targets_stay_lossless_through_the_real_verifier(mode: str) -> None:
    for seed, parents in enumerate([[-1, -1, 0], [-1, 0, -1, 1]]):
        model = PrefixModel(100 + seed, 4, TRUNCATED)
        law = marginal_verifier_law(verify_tree, model, parents, mode)
        assert_lossless(model, law, depth_of(parents) + 1, f"{mode}, parents {parents}")


# --- validate_draft on trees ---------------------------------------------------------------------

NAME = "my-tree-drafter"
CPU = torch.device("cpu")
K, VOCAB = 3, 10


def tree(parents: object, n: int | None = None, probs: bool = False) -> Draft:
    count = n if n is not None else (len(parents) if isinstance(parents, list) else 3)
    tokens = torch.arange(count, dtype=torch.long) % VOCAB
    rows = torch.full((count, VOCAB), 1.0 / VOCAB, dtype=torch.float64) if probs else None
    value = torch.tensor(parents, dtype=torch.long) if isinstance(parents, list) else parents
    return Draft(tokens, rows, value)


BAD_TREES: dict[str, tuple[Draft, str]] = {
    "float parents": (tree(torch.tensor([-1.0, 0.0, 1.0])), "LongTensor"),
    "int32 parents": (tree(torch.tensor([-1, 0, 1], dtype=torch.int32)), "LongTensor"),
    "2-D parents": (tree(torch.tensor([[-1, 0, 1]])), "LongTensor"),
    "0-D parents": (tree(torch.tensor(-1), n=1), "LongTensor"),
    "parents too short": (tree(torch.tensor([-1, 0]), n=3), "n=3"),
    "parents too long": (tree(torch.tensor([-1, 0, 1, 2]), n=3), "n=3"),
    "parents a list": (Draft(torch.tensor([1, 2]), None, [-1, 0]), "LongTensor"),  # type: ignore[arg-type]
    "first node with a parent": (tree([0, 0]), "parents[0] = 0"),
    "parent is the node itself": (tree([-1, 1, 1]), "parents[1] = 1"),
    "parent after the node": (tree([-1, 2, 0]), "parents[1] = 2"),
    "parent below -1": (tree([-1, -2, 0]), "parents[1] = -2"),
    "too deep": (tree([-1, 0, 1, 2]), f"4 tokens deep but at most k={K}"),
    "too deep, wide first": (tree([-1, -1, -1, -1, 0, 4, 5, 6]), f"5 tokens deep but at most k={K}"),
    "probs for fewer rows than nodes": (Draft(torch.tensor([1, 2, 3, 4]), torch.full((3, VOCAB), 0.1),
                                              torch.tensor([-1, -1, -1, -1])), "probs must have shape"),
}


@pytest.mark.parametrize("kind", list(BAD_TREES))
def test_broken_tree_raises_draft_error_naming_the_drafter(kind: str) -> None:
    draft, fragment = BAD_TREES[kind]
    with pytest.raises(DraftError, match=re.escape(NAME)) as error:
        validate_draft(draft, K, VOCAB, CPU, NAME)
    assert fragment in str(error.value)


GOOD_TREES: dict[str, Draft] = {
    "wide: more nodes than k, depth 1": tree([-1] * 7),
    "more nodes than k at depth k": tree([-1, -1, 0, 0, 1, 2, 2, 4], probs=True),
    "random order": tree([-1, 0, -1, 2, 1, 3, 0]),
    "chain as tree": tree([-1, 0, 1], probs=True),
    "empty tree": Draft(torch.zeros(0, dtype=torch.long), None, torch.zeros(0, dtype=torch.long)),
    "duplicate siblings": Draft(torch.tensor([4, 4, 4]), torch.full((3, VOCAB), 0.1), torch.tensor([-1, -1, -1])),
}


@pytest.mark.parametrize("kind", list(GOOD_TREES))
def test_well_formed_trees_are_valid_and_return_their_parents(kind: str) -> None:
    draft = GOOD_TREES[kind]
    assert validate_draft(draft, K, VOCAB, CPU, NAME) == draft.parents.tolist()


def test_chains_return_no_parents_and_keep_their_length_limit() -> None:
    assert validate_draft(Draft(torch.tensor([1, 2, 3])), K, VOCAB, CPU, NAME) is None
    with pytest.raises(DraftError, match=re.escape(NAME)):
        validate_draft(Draft(torch.tensor([1, 2, 3, 4])), K, VOCAB, CPU, NAME)  # the same nodes as a tree pass
    assert validate_draft(tree([-1, -1, -1, -1]), K, VOCAB, CPU, NAME) == [-1] * 4


def test_tree_probs_are_checked_per_node() -> None:
    probs = torch.full((4, VOCAB), 0.1)
    probs[3] = torch.eye(VOCAB)[0]  # node 3 (token 3) could not come from a one-hot at 0
    with pytest.raises(DraftError, match=r"q\(d\) = 0 at position 3"):
        validate_draft(Draft(torch.tensor([0, 1, 2, 3]), probs, torch.tensor([-1, -1, -1, -1])), K, VOCAB, CPU, NAME)

"""Hypothesis strategies for the sampling pipeline and the verifier, and random verifies on a
target's cache.

Everything is float64 over a small vocabulary, and deliberately awkward: exact zeros, exact
ties and near-ties (values a few ulps apart), one-hot rows, and a wide range of magnitudes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from specdec.types import Sampling

MAX_VOCAB = 8

# Weights before normalisation: zeros and ties are drawn often on purpose.
_TIE = 0.25
_weights = st.one_of(
    st.just(0.0),
    st.just(_TIE),
    st.just(_TIE * (1 + 2**-50)),  # a near-tie with _TIE
    st.floats(min_value=1e-6, max_value=1.0),
)
_logit_values = st.one_of(
    st.just(0.0),
    st.just(1.5),
    st.just(1.5 + 2**-48),  # a near-tie with 1.5
    st.floats(min_value=-30.0, max_value=30.0),
)


@st.composite
def vocab_sizes(draw: st.DrawFn, min_size: int = 2) -> int:
    return draw(st.integers(min_value=min_size, max_value=MAX_VOCAB))


@st.composite
def probability_vectors(draw: st.DrawFn, vocab_size: int) -> torch.Tensor:
    """A float64 distribution [V] with zeros, ties and near-ties; never all zero."""
    weights = draw(st.lists(_weights, min_size=vocab_size, max_size=vocab_size))
    if not any(weights):
        weights[draw(st.integers(0, vocab_size - 1))] = 1.0
    vector = torch.tensor(weights, dtype=torch.float64)
    return vector / vector.sum()


@st.composite
def distribution_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q), two float64 distributions [V] over the same vocabulary; sometimes q == p."""
    vocab_size = draw(vocab_sizes())
    p = draw(probability_vectors(vocab_size))
    q = p.clone() if draw(st.booleans()) and draw(st.booleans()) else draw(probability_vectors(vocab_size))
    return p, q


@st.composite
def logits(draw: st.DrawFn, vocab_size: int, rows: int | None = None) -> torch.Tensor:
    """Float64 logits [V] (rows None) or [rows, V], with ties and near-ties."""
    shape = (vocab_size,) if rows is None else (rows, vocab_size)
    count = vocab_size * (rows or 1)
    values = draw(st.lists(_logit_values, min_size=count, max_size=count))
    return torch.tensor(values, dtype=torch.float64).reshape(shape)


@st.composite
def samplings(draw: st.DrawFn, greedy: bool | None = None) -> Sampling:
    """Valid settings; greedy=None mixes greedy in, True/False forces it."""
    if greedy is None:
        greedy = draw(st.integers(0, 4)) == 0
    if greedy:
        temperature = 0.0
    else:
        temperature = draw(st.one_of(st.just(1.0), st.floats(min_value=0.05, max_value=5.0)))
    top_k = draw(st.one_of(st.just(0), st.integers(min_value=1, max_value=MAX_VOCAB + 2)))
    # exact binary fractions hit top-p's boundary (cumulative mass == 1 - top_p) on tied logits
    top_p = draw(st.one_of(st.just(1.0), st.sampled_from([0.25, 0.5, 0.75]),
                           st.floats(min_value=0.01, max_value=1.0)))
    return Sampling(temperature=temperature, top_k=top_k, top_p=top_p)


@dataclass(frozen=True)
class ChainCase:
    """One verifier input: p [k + 1, V], draft tokens [k], q [k, V] or None (deterministic)."""

    p: torch.Tensor
    tokens: torch.Tensor
    q: torch.Tensor | None

    @property
    def k(self) -> int:
        return int(self.tokens.shape[0])


@st.composite
def chain_drafts(draw: st.DrawFn, sampled: bool | None = None, min_k: int = 0, max_k: int = 4) -> ChainCase:
    """A chain draft and the target rows that verify it.

    Sampled drafts (q given) take each token from the support of its q row, as a sampling
    drafter would; deterministic drafts (q None) may propose any id, even one with p(d) = 0.
    """
    if sampled is None:
        sampled = draw(st.booleans())
    vocab_size = draw(vocab_sizes())
    k = draw(st.integers(min_value=min_k, max_value=max_k))
    p = torch.stack([draw(probability_vectors(vocab_size)) for _ in range(k + 1)])  # (k+1, V)
    if not sampled:
        tokens = draw(st.lists(st.integers(0, vocab_size - 1), min_size=k, max_size=k))
        return ChainCase(p, torch.tensor(tokens, dtype=torch.long), None)
    rows = [draw(probability_vectors(vocab_size)) for _ in range(k)]
    tokens = [draw(st.sampled_from(row.nonzero().flatten().tolist())) for row in rows]
    q = torch.stack(rows) if rows else torch.zeros(0, vocab_size, dtype=torch.float64)  # (k, V)
    return ChainCase(p, torch.tensor(tokens, dtype=torch.long), q)


# --- random verifies on a target's cache (tests of layer types that must roll back exactly) -----------------

VERIFY_STEPS = st.lists(st.tuples(st.sampled_from(["chain", "tree"]), st.integers(1, 4),
                                  st.randoms(use_true_random=False)), min_size=1, max_size=6)


def random_verify(lm, committed: list[int], kind: str, size: int, rnd, vocab: int, width: int):
    """One verify of `size` random draft tokens after `committed` (the cache holds all but its
    last): a chain padded to `width` rows and rolled back to a random acceptance, or a random tree
    padded to `width` rows with a random root path kept. Returns the kept rows' logits [r, V] and
    the accepted draft tokens."""
    base = len(committed) - 1
    drafts = [rnd.randrange(vocab) for _ in range(size)]
    ids = torch.tensor(committed[-1:] + drafts)
    if kind == "chain":
        logits, _ = lm.forward(ids, keep=size + 1, rows=width)
        path = list(range(rnd.randint(0, size)))
        lm.rollback(base + 1 + len(path))
        return logits[: 1 + len(path)], [drafts[i] for i in path]
    parents = [-1] + [rnd.randrange(-1, i) for i in range(1, size)]
    tree = lm.forward_tree(ids, parents, rows=width)
    node, path = rnd.randrange(-1, size), []
    while node >= 0:
        path.insert(0, node)
        node = parents[node]
    rows = [0] + [i + 1 for i in path]
    lm.keep_path(base, rows)
    return torch.stack([tree.row(r) for r in rows]), [drafts[i] for i in path]

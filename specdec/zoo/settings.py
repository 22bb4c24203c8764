"""The build settings of a zoo family: what to train, how big and how long. A family's cache
directory is keyed by these settings, so changing any of them builds a new family."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, replace

from specdec.training.draft_model import DraftSize
from specdec.training.optim import Steps
from specdec.training.target import TargetSize

__all__ = ["FULL", "HYBRID", "HYBRID_QUICK", "LEARNED", "QUICK", "TRAINING_FREE", "ZOO_FORMAT", "ZooSettings",
           "family"]

ZOO_FORMAT = 10  # bump when the build changes what the same settings produce (10: evaluation and figures files)
LEARNED = ("draft-model", "medusa", "eagle", "eagle3", "mtp")  # trained by the build (mtp with the target)
TRAINING_FREE = ("ngram", "lookahead", "suffix", "retrieval")


@dataclass(frozen=True)
class ZooSettings:
    """One family: tokenizer, target (+ MTP), and the learned drafters `drafters` names among a draft
    model, Medusa heads, an EAGLE-1 and an EAGLE-3 head, and (for retrieval) a datastore of the
    training text. The build measures each drafter's draft tax (`specdec.zoo.costs`): one draft
    step's cost against one target forward."""

    name: str
    vocab_size: int
    tokenizer_chars: int  # training text the tokenizer sees
    train_chars: int | None  # training text encoded for the models (None: all of it)
    heldout_chars: int | None
    target: TargetSize
    target_steps: Steps
    draft: DraftSize
    medusa_heads: int
    medusa_layers: int
    student_steps: Steps  # draft model, Medusa and the EAGLE heads train together; EAGLE-1 at a quarter of its lr,
    # EAGLE-3 at eagle3_lr
    eagle3_layers: tuple[int, ...]  # the target hidden states the EAGLE-3 head fuses (hidden_states indices)
    eagle3_vocab: int  # its draft vocabulary: the most frequent training tokens
    eagle3_lr: float  # its learning rate (training-time test takes a higher one than the other students)
    eval_windows: int  # held-out windows for the losses
    eval_prompts: int  # held-out code prompts per category for the accepted lengths (`specdec.zoo.measure`)
    eval_new_tokens: int
    eval_temperature: float  # 0: greedy; else sampled, prompt i with seed + i (`docs/zoo.md`, *Figures*)
    cost_rounds: int  # timed rounds of the draft-tax measurement (`specdec.zoo.costs`)
    cost_compiled: bool  # measure it on the compiled engine (the quick family's 60 s budget cannot compile)
    seed: int = 0
    drafters: tuple[str, ...] = LEARNED + TRAINING_FREE  # the family's drafters: those that serve its target

    def __post_init__(self) -> None:
        unknown = sorted(set(self.drafters) - set(LEARNED + TRAINING_FREE))
        if unknown or "mtp" not in self.drafters:
            raise ValueError(f"zoo family {self.name!r}: drafters must come from {LEARNED + TRAINING_FREE} and "
                             f"include mtp (trained with the target), got {self.drafters}")

    def key(self) -> str:
        """12 hex digits of SHA-256 over the settings, the build format and the Python version (whose
        standard library is the corpus)."""
        python = "%d.%d" % sys.version_info[:2]
        blob = json.dumps({"format": ZOO_FORMAT, "python": python, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def directory_name(self) -> str:
        return f"{self.name}-{self.key()}"


FULL = ZooSettings(
    name="full", vocab_size=2048, tokenizer_chars=3_000_000, train_chars=None, heldout_chars=None,
    target=TargetSize(hidden=64, layers=32, heads=2, kv_heads=1, intermediate=192),
    target_steps=Steps(steps=1100, batch=4, seq_len=352, lr=1e-2, seed=1),
    draft=DraftSize(hidden=96, layers=1, heads=3, kv_heads=1),
    medusa_heads=3, medusa_layers=1,
    student_steps=Steps(steps=450, batch=4, seq_len=352, lr=1e-2, seed=2),
    eagle3_layers=(2, 16, 29), eagle3_vocab=2048, eagle3_lr=1.5e-2,
    eval_windows=24, eval_prompts=20, eval_new_tokens=128, eval_temperature=0.5,
    cost_rounds=3, cost_compiled=True)

QUICK = ZooSettings(
    name="quick", vocab_size=512, tokenizer_chars=300_000, train_chars=1_000_000, heldout_chars=100_000,
    target=TargetSize(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, max_positions=1024),
    target_steps=Steps(steps=80, batch=8, seq_len=128, lr=4e-3, seed=1),
    draft=DraftSize(hidden=32, layers=1, heads=2, kv_heads=1),
    medusa_heads=3, medusa_layers=1,
    student_steps=Steps(steps=40, batch=8, seq_len=128, lr=3e-3, seed=2),
    eagle3_layers=(0, 1, 2), eagle3_vocab=384, eagle3_lr=3e-3,
    eval_windows=8, eval_prompts=1, eval_new_tokens=24, eval_temperature=0.5,
    cost_rounds=1, cost_compiled=False)

# The Qwen3.5 case: a hybrid target in Qwen3.5's layout (three GatedDeltaNet linear-attention layers
# to one full-attention layer) with one MTP module, and the drafters that serve such a target
# (lookahead's extra rows cannot, `docs/engine.md`).
HYBRID_DRAFTERS = ("draft-model", "eagle3", "mtp", "ngram", "suffix")

HYBRID = replace(  # the full family's data and students, a shallower hybrid target and fewer steps
    FULL, name="hybrid",
    target=TargetSize(hidden=64, layers=12, heads=2, kv_heads=1, intermediate=192, architecture="qwen3_5"),
    target_steps=replace(FULL.target_steps, steps=500), student_steps=replace(FULL.student_steps, steps=150),
    eagle3_layers=(2, 6, 10), cost_compiled=False,  # eager draft tax: the build stays near 6 min
    drafters=HYBRID_DRAFTERS)

HYBRID_QUICK = ZooSettings(
    name="hybrid-quick", vocab_size=384, tokenizer_chars=200_000, train_chars=400_000, heldout_chars=50_000,
    target=TargetSize(hidden=32, layers=4, heads=2, kv_heads=1, intermediate=64, max_positions=512,
                      architecture="qwen3_5"),
    target_steps=Steps(steps=30, batch=4, seq_len=96, lr=4e-3, seed=1),
    draft=DraftSize(hidden=32, layers=1, heads=2, kv_heads=1),
    medusa_heads=3, medusa_layers=1,
    student_steps=Steps(steps=15, batch=4, seq_len=96, lr=3e-3, seed=2),
    eagle3_layers=(0, 2, 4), eagle3_vocab=256, eagle3_lr=3e-3,
    eval_windows=4, eval_prompts=1, eval_new_tokens=16, eval_temperature=0.5,
    cost_rounds=1, cost_compiled=False, drafters=HYBRID_DRAFTERS)

_FAMILIES = {"full": FULL, "quick": QUICK, "hybrid": HYBRID, "hybrid-quick": HYBRID_QUICK}


def family(name: str) -> ZooSettings:
    """The settings of a named family ("full", "quick", "hybrid" or "hybrid-quick")."""
    if name not in _FAMILIES:
        raise ValueError(f"unknown zoo family {name!r}; choose from {sorted(_FAMILIES)}")
    return _FAMILIES[name]

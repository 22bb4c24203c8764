"""The build settings of a zoo family: what to train, how big and how long. A family's cache
directory is keyed by these settings, so changing any of them builds a new family."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from specdec.training.draft_model import DraftSize
from specdec.training.optim import Steps
from specdec.training.target import TargetSize

__all__ = ["DFLASH_BLOCK", "FULL", "HYBRID", "HYBRID_QUICK", "LATER_FIELDS", "LEARNED", "PARALLEL", "QUICK",
           "TRAINING_FREE", "VARIANTS", "XTOK", "ZOO_FORMAT", "ZooSettings", "family", "settings_from_record"]

ZOO_FORMAT = 10  # bump when the build changes what the same settings produce (10: evaluation and figures files)
XTOK = "draft-model-xtok"  # the draft model on a tokenizer of its own (`specdec.zoo.xtok`)
PARALLEL = ("dflash", "pard")  # block drafters, each trained alone from the frozen target (`specdec.zoo.parallel`)
LEARNED = ("draft-model", XTOK, "medusa", "eagle", "eagle3", "mtp", *PARALLEL)  # trained by the build (mtp with the
# target)
TRAINING_FREE = ("ngram", "lookahead", "suffix", "retrieval", "self")
DFLASH_BLOCK = 16  # the zoo's DFlash block, the published drafters': it drafts k = 15 (`specdec.zoo.options`)
VARIANTS = ("eagle3-k15",)  # rows of a drafter the family has, at another k: EAGLE-3 at DFlash's k
# Fields added after families had shipped, without a ZOO_FORMAT bump (they change nothing else a build
# writes): at these values they are left out of a family's record, so families without them keep their keys.
LATER_FIELDS = {"xtok_vocab_size": None, "xtok_steps": None, "dflash_layers": None, "dflash_steps": None,
                "pard_steps": None}


@dataclass(frozen=True)
class ZooSettings:
    """One family: tokenizer, target (+ MTP), and the learned drafters `drafters` names among a draft
    model, a draft model on a tokenizer of its own (`draft-model-xtok`), Medusa heads, an EAGLE-1
    and an EAGLE-3 head, and (for retrieval) a datastore of the training text. The build measures
    each drafter's draft tax (`specdec.zoo.costs`): one draft step's cost against one target forward."""

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
    # the family's drafters: those that serve its target (the block drafters and variants where a family names them)
    drafters: tuple[str, ...] = tuple(name for name in LEARNED if name not in PARALLEL) + TRAINING_FREE
    # draft-model-xtok's own tokenizer: a metaspace BPE with byte fallback (sentencepiece style) of this many
    # entries, another size than the target's byte-level `vocab_size`; None: the family has no such piece
    xtok_vocab_size: int | None = None
    # draft-model-xtok's training steps (the students' batch, windows and learning rate); None: the students' steps
    xtok_steps: int | None = None
    # the DFlash drafter's layers and training steps (its block is DFLASH_BLOCK); None: the family has none
    dflash_layers: int | None = None
    dflash_steps: int | None = None
    # the PARD draft model's training steps (the draft model's shape, started from the distilled draft model)
    pard_steps: int | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.drafters) - set(LEARNED + TRAINING_FREE + VARIANTS))
        if unknown or "mtp" not in self.drafters:
            raise ValueError(f"zoo family {self.name!r}: drafters must come from {LEARNED + TRAINING_FREE + VARIANTS} "
                             f"and include mtp (trained with the target), got {self.drafters}")
        for name, fields_ in (("dflash", (self.dflash_layers, self.dflash_steps)), ("pard", (self.pard_steps,))):
            if (name in self.drafters) != all(value is not None for value in fields_) or \
                    any(value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1)
                        for value in fields_):
                raise ValueError(f"zoo family {self.name!r}: {name}'s settings are positive ints exactly when the "
                                 f"drafters include {name}, got {fields_} with drafters {self.drafters}")
        if "pard" in self.drafters and "draft-model" not in self.drafters:
            raise ValueError(f"zoo family {self.name!r}: pard starts from the family's draft model; add draft-model")
        if "eagle3-k15" in self.drafters and ("eagle3" not in self.drafters or "dflash" not in self.drafters):
            raise ValueError(f"zoo family {self.name!r}: eagle3-k15 is EAGLE-3 at DFlash's k; it needs eagle3 "
                             "and dflash")
        if (XTOK in self.drafters) != (self.xtok_vocab_size is not None):
            raise ValueError(f"zoo family {self.name!r}: xtok_vocab_size is set exactly when the drafters include "
                             f"{XTOK}, got {self.xtok_vocab_size!r} with drafters {self.drafters}")
        if self.xtok_steps is not None and (XTOK not in self.drafters or isinstance(self.xtok_steps, bool)
                                            or not isinstance(self.xtok_steps, int) or self.xtok_steps < 1):
            raise ValueError(f"zoo family {self.name!r}: xtok_steps must be a positive int, and only with "
                             f"{XTOK} among the drafters, got {self.xtok_steps!r}")
        if self.xtok_vocab_size is not None and self.xtok_vocab_size == self.vocab_size:
            raise ValueError(f"zoo family {self.name!r}: xtok_vocab_size must differ from vocab_size "
                             f"({self.vocab_size}), so that {XTOK} drafts across vocabularies")

    def record(self) -> dict[str, Any]:
        """The settings as the manifest and the shipped record hold them (JSON types), without the
        `LATER_FIELDS` at their absent values."""
        every = json.loads(json.dumps(asdict(self)))
        return {name: value for name, value in every.items()
                if not (name in LATER_FIELDS and value == LATER_FIELDS[name])}

    def key(self) -> str:
        """12 hex digits of SHA-256 over the settings (`record`), the build format and the Python
        version (whose standard library is the corpus)."""
        python = "%d.%d" % sys.version_info[:2]
        blob = json.dumps({"format": ZOO_FORMAT, "python": python, **self.record()}, sort_keys=True)
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
    cost_rounds=3, cost_compiled=True,
    # draft-model-xtok: 1.5 times the target's 2048 entries (it shares 91% of the held-out target tokens; 1536: 82%),
    # trained 2500 steps, to about the distilled draft model's held-out loss (450 steps left it far above)
    xtok_vocab_size=3072, xtok_steps=2500,
    # the block drafters, added by `specdec zoo extend`: DFlash (two layers fusing five of the target's, block 16)
    # and PARD (from the draft model), and EAGLE-3 at DFlash's k
    drafters=("draft-model", XTOK, "medusa", "eagle", "eagle3", "mtp", "dflash", "pard", *TRAINING_FREE, "eagle3-k15"),
    dflash_layers=2, dflash_steps=1200, pard_steps=100)

QUICK = ZooSettings(
    name="quick", vocab_size=512, tokenizer_chars=300_000, train_chars=1_000_000, heldout_chars=100_000,
    target=TargetSize(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, max_positions=1024),
    target_steps=Steps(steps=80, batch=8, seq_len=128, lr=4e-3, seed=1),
    draft=DraftSize(hidden=32, layers=1, heads=2, kv_heads=1),
    medusa_heads=3, medusa_layers=1,
    student_steps=Steps(steps=40, batch=8, seq_len=128, lr=3e-3, seed=2),
    eagle3_layers=(0, 1, 2), eagle3_vocab=384, eagle3_lr=3e-3,
    eval_windows=8, eval_prompts=1, eval_new_tokens=24, eval_temperature=0.5,
    cost_rounds=1, cost_compiled=False,
    # every drafter but draft-model-xtok (its build minute) and self (which refuses the batches the tests
    # decode every zoo drafter in), the block drafters trained a few steps (their build path, not their figures)
    drafters=("draft-model", "medusa", "eagle", "eagle3", "mtp", "dflash", "pard", "ngram", "lookahead", "suffix",
              "retrieval"), dflash_layers=1, dflash_steps=10, pard_steps=10)

# The Qwen3.5 case: a hybrid target in Qwen3.5's layout (three GatedDeltaNet linear-attention layers
# to one full-attention layer) with one MTP module, and the drafters that serve such a target
# (lookahead's extra rows cannot, `docs/engine.md`).
HYBRID_DRAFTERS = ("draft-model", "eagle3", "mtp", "ngram", "suffix")

HYBRID = replace(  # the full family's data and students, a shallower hybrid target and fewer steps
    FULL, name="hybrid",
    target=TargetSize(hidden=64, layers=12, heads=2, kv_heads=1, intermediate=192, architecture="qwen3_5"),
    target_steps=replace(FULL.target_steps, steps=500), student_steps=replace(FULL.student_steps, steps=150),
    eagle3_layers=(2, 6, 10), cost_compiled=False,  # eager draft tax: the build stays near 6 min
    drafters=(*HYBRID_DRAFTERS, "dflash", "eagle3-k15"), xtok_vocab_size=None, xtok_steps=None,
    dflash_steps=800, pard_steps=None)  # the seed's question: DFlash or the model's own MTP module

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


def settings_from_record(record: dict[str, Any]) -> ZooSettings:
    """The settings a manifest's (or a shipped record's) "settings" hold, back as ZooSettings."""
    nested = {"target": TargetSize, "target_steps": Steps, "draft": DraftSize, "student_steps": Steps}
    known = {field.name for field in fields(ZooSettings)}
    unknown = sorted(set(record) - known)
    if unknown:
        raise ValueError(f"zoo settings record has fields this code does not know: {', '.join(unknown)}")
    values = {name: nested[name](**value) if name in nested else value for name, value in record.items()}
    values |= {name: tuple(values[name]) for name in ("eagle3_layers", "drafters") if name in values}
    return ZooSettings(**values)


def family(name: str) -> ZooSettings:
    """The settings of a named family ("full", "quick", "hybrid" or "hybrid-quick")."""
    if name not in _FAMILIES:
        raise ValueError(f"unknown zoo family {name!r}; choose from {sorted(_FAMILIES)}")
    return _FAMILIES[name]

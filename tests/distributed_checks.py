"""Run by tests/test_distributed.py under `torchrun --nproc_per_node 2` (gloo, CPU): a tensor-
parallel target decodes with every drafter family, both ranks agree whatever seeds they are
given, a forced disagreement is caught, a pipeline-parallel target is exact, the CLI writes from
rank 0 only, and `specdec train` runs data-parallel. Each rank writes what it saw to
OUT/rank{r}.json; the test compares it with single-process decoding.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_checks.py ZOO FILES OUT

ZOO: the quick zoo (its target has 4 attention and 2 key/value heads, so it splits in two);
FILES: a draft model whose heads split in two (`draft`), prompts.txt and a text corpus.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from specdec.protocols import row_view
import specdec
from specdec import Draft, Sampling
from specdec.checkpoints import load_causal_lm, load_tokenizer
from specdec.distributed.ranks import CHECK_VARIABLE, RankDisagreement

TEXTS = ["def parse(text):\n    ", "import os\nimport sys\n\n\ndef main("]
NEW = 20
SAMPLED = Sampling(temperature=0.8, top_p=0.95)


def drafters(zoo: Path, files: Path) -> dict[str, Any]:
    """The drafter settings decoded beside the sharded target (the test decodes the same alone):
    replicated on every rank, except the draft model sharded like the target."""
    return {
        "plain": lambda: None,
        "ngram": lambda: specdec.make_drafter("ngram", max_ngram=3),
        "suffix": lambda: specdec.make_drafter("suffix"),
        "lookahead": lambda: specdec.make_drafter("lookahead"),
        "medusa+tree": lambda: specdec.make_drafter("medusa", path=str(zoo / "medusa"), tree=True),
        "draft-model": lambda: specdec.make_drafter("draft-model", model=str(zoo / "draft-model")),
        "draft-model+tree": lambda: specdec.make_drafter("draft-model", model=str(zoo / "draft-model"), tree=True),
        "draft-model-sharded": lambda: specdec.make_drafter("draft-model", model=str(files / "draft"), shard=True),
        "draft-model-xtok": lambda: specdec.make_drafter("draft-model", model=str(files / "draft-xtok")),
        "eagle": lambda: specdec.make_drafter("eagle", path=str(zoo / "eagle")),
        "eagle+tree": lambda: specdec.make_drafter("eagle", path=str(zoo / "eagle"), tree=True),
        "eagle3": lambda: specdec.make_drafter("eagle3", path=str(zoo / "eagle3")),
        "mtp": lambda: specdec.make_drafter("mtp", path=str(zoo / "target")),
        "dflash": lambda: specdec.make_drafter("dflash", path=str(files / "dflash")),
    }


def prompts(zoo: Path) -> list[list[int]]:
    """TEXTS as the zoo's tokenizer encodes them."""
    from specdec.checkpoints import load_tokenizer

    tokenizer = load_tokenizer(zoo / "target")
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]


class RankSkewedDrafter:
    """Drafts like prompt lookup, but rank 1 drafts other tokens (`skew="draft"`) or draws one
    extra number from the shared generator per step (`skew="draws"`): a bug the check must name."""

    name = "rank-skewed"

    def __init__(self, skew: str) -> None:
        self.skew = skew
        self.inner = row_view(specdec.make_drafter("ngram", max_ngram=3))

    def propose(self, ctx: Any, k: int) -> Draft:
        draft = self.inner.propose(ctx, k)
        if dist.get_rank() == 1:
            if self.skew == "draft":
                return Draft((ctx.tokens[-1:].repeat(k) + 1) % ctx.vocab_size)
            torch.rand(1, generator=ctx.generator)
        return draft


def main() -> None:
    zoo, files, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ids = prompts(zoo)
    seen: dict[str, Any] = {"rank": rank}
    target = load_causal_lm(zoo / "target", tp=2)
    tokenizer = load_tokenizer(zoo / "target")  # for the draft model with a tokenizer of its own
    seen["sharded"] = type(target.get_output_embeddings().weight).__name__
    for name, make in drafters(zoo, files).items():
        seen[f"greedy/{name}"] = [specdec.generate(target, p, drafter=make(), max_new_tokens=NEW,
                                                   tokenizer=tokenizer).tokens for p in ids]
        # a different seed on every rank, and none: the ranks still emit the same tokens
        seen[f"sampled/{name}"] = [specdec.generate(target, p, drafter=make(), max_new_tokens=NEW, sampling=SAMPLED,
                                                    seed=1000 + 7 * rank, tokenizer=tokenizer).tokens for p in ids]
        seen[f"unseeded/{name}"] = specdec.generate(target, ids[0], drafter=make(), max_new_tokens=NEW,
                                                    sampling=SAMPLED, tokenizer=tokenizer).tokens
    for name in ("plain", "ngram", "draft-model", "eagle"):
        make = drafters(zoo, files)[name]
        seen[f"batch-greedy/{name}"] = [g.tokens for g in specdec.generate_batch(target, ids, drafter=make(),
                                                                                 max_new_tokens=NEW)]
        seen[f"batch-sampled/{name}"] = [g.tokens for g in specdec.generate_batch(
            target, ids, drafter=make(), max_new_tokens=NEW, sampling=SAMPLED, seed=50 + rank)]
    for name, rule in (("draft-model", "block"), ("draft-model+tree", "traversal"), ("eagle", "block")):
        # each rank its own seed, and a rule of its own on rank 1: the leader's verdict is what every rank takes
        mine = rule if rank == 0 else "token"
        seen[f"rule/{name}"] = [specdec.generate(target, p, drafter=drafters(zoo, files)[name](), max_new_tokens=NEW,
                                                 sampling=SAMPLED, seed=20 + rank, verify_rule=mine).tokens for p in ids]
        seen[f"batch-rule/{name}"] = [g.tokens for g in specdec.generate_batch(
            target, ids, drafter=drafters(zoo, files)[name](), max_new_tokens=NEW, sampling=SAMPLED, seed=70 + rank,
            verify_rule=mine)]
    for skew in ("draft", "draws"):  # without the check: rank 0's draft and verdict are what every rank takes
        seen[f"skewed/{skew}"] = specdec.generate(target, ids[0], drafter=RankSkewedDrafter(skew), max_new_tokens=NEW,
                                                  sampling=SAMPLED if skew == "draws" else Sampling(), seed=3).tokens
    os.environ[CHECK_VARIABLE] = "1"
    seen["checked/ngram"] = specdec.generate(target, ids[0], drafter="ngram", max_new_tokens=NEW,
                                             sampling=SAMPLED, seed=rank).tokens
    for skew in ("draft", "draws"):
        try:
            specdec.generate(target, ids[0], drafter=RankSkewedDrafter(skew), max_new_tokens=40,
                             sampling=SAMPLED if skew == "draws" else Sampling(), seed=3)
            seen[f"caught/{skew}"] = None
        except RankDisagreement as error:
            seen[f"caught/{skew}"] = str(error)
    del os.environ[CHECK_VARIABLE]
    seen["cost"] = agreement_cost(target, ids)
    seen.update(pipeline(zoo, files, ids))
    seen.update(command_line(zoo, files, out, rank))
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


def agreement_cost(target: Any, ids: list[list[int]]) -> dict[str, float]:
    """Seconds per step of the two agreements (a k = 4 chain's draft and verdict) and of a step."""
    from specdec.runtime.target import CausalLM

    ranks = CausalLM(target).ranks
    assert ranks is not None
    # ngram's payloads: its node budget (64, undeclared) sets a draft's 3 + 2 * 64 and a verdict's 3 + 2 * 64 longs
    draft, verdict = torch.zeros(3 + 2 * 64, dtype=torch.long), torch.zeros(3 + 2 * 64, dtype=torch.long)
    for _ in range(20):
        ranks.agree(draft, "draft")
    dist.barrier()
    start = time.perf_counter()
    repeats = 300
    for _ in range(repeats):
        ranks.agree(draft, "draft")
        ranks.agree(verdict, "verdict")
    agreements = (time.perf_counter() - start) / repeats
    checked = replace(ranks, check=True)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        checked.agree(draft, "draft")
        checked.agree(verdict, "verdict")
    gathers = (time.perf_counter() - start) / repeats
    result = specdec.generate(target, ids[0], drafter="ngram", max_new_tokens=64)
    return {"agreements_per_step": agreements, "checked_agreements_per_step": gathers,
            "step": result.stats.wall_seconds / max(1, result.stats.steps)}


def pipeline(zoo: Path, files: Path, ids: list[list[int]]) -> dict[str, Any]:
    """A pipeline-parallel target (each rank a stage): exact only with explicit masks and positions."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    staged = AutoModelForCausalLM.from_pretrained(zoo / "target", distributed_config=DistributedConfig(pp_size=2),
                                                  dtype=torch.float32).eval()
    seen: dict[str, Any] = {}
    for name in ("plain", "ngram", "draft-model", "draft-model+tree"):
        seen[f"pipeline/{name}"] = [specdec.generate(staged, p, drafter=drafters(zoo, files)[name](),
                                                     max_new_tokens=NEW).tokens for p in ids]
    seen["pipeline/batch-ngram"] = [g.tokens for g in specdec.generate_batch(staged, ids, drafter="ngram",
                                                                             max_new_tokens=NEW)]
    try:
        specdec.generate(staged, ids[0], drafter=drafters(zoo, files)["eagle"](), max_new_tokens=4)
        seen["pipeline/eagle-refused"] = None
    except Exception as error:  # noqa: BLE001 - the message is what the test reads
        seen["pipeline/eagle-refused"] = f"{type(error).__name__}: {error}"
    return seen


def command_line(zoo: Path, files: Path, out: Path, rank: int) -> dict[str, Any]:
    """`specdec generate --tp 2` prints on rank 0 only; `specdec train` under DDP writes from rank 0."""
    from specdec.cli import main as cli

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = cli(["generate", "--target", str(zoo / "target"), "--tp", "2", "--drafter", "ngram",
                      "--max-new-tokens", "8", "--temperature", "0.7", "--seed", str(rank), "--check-ranks",
                      "--prompts", str(files / "prompts.txt")])
    seen: dict[str, Any] = {"cli/status": status, "cli/stdout": printed.getvalue()}
    with contextlib.redirect_stdout(io.StringIO()):
        seen["train/status"] = cli(["train", "draft-model", "--target", str(zoo / "target"), "--data",
                                    str(files / "corpus"), "--out", str(out / "trained"), *TRAIN_FLAGS])
    return seen


TRAIN_FLAGS = ["--steps", "6", "--batch-size", "4", "--seq-len", "16", "--hidden", "16", "--layers", "1",
               "--attention-heads", "2", "--kv-heads", "1", "--k", "2", "--no-progress", "--seed", "3"]

if __name__ == "__main__":
    main()

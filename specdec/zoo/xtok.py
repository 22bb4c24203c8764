"""The zoo's draft model on a tokenizer of its own (`draft-model-xtok`), for measuring drafting
across vocabularies (`specdec.drafters.draft_models.translation`) on the family's target.

Its tokenizer is a metaspace BPE with byte fallback (`specdec.training.tokenizer`, sentencepiece
style: another segmentation, other special tokens) trained on the same training text as the
target's byte-level one, with `settings.xtok_vocab_size` entries, another size than the target's.
Its model is a Qwen3 causal LM of the family's `draft` shape on that vocabulary, trained from
scratch as a language model on the training text in its own ids (`specdec.training.language_model`:
a token-level distillation from the target is impossible across vocabularies), with the students'
batch and learning rate for `settings.xtok_steps` steps: as a small model of another family is
trained on its own, longer than a student distilled from the target needs. Both lie in the
piece's directory, so `make_drafter("draft-model", model=<dir>)` loads them.

It needs nothing of the target, so a built family gains it without being built again
(`specdec.zoo.extend`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from specdec.checkpoints import load_tokenizer, quiet_transformers
from specdec.data.corpus import Corpus
from specdec.training.data import encode_corpus, training_texts
from specdec.training.language_model import new_language_model, train_language_model
from specdec.training.losses import next_token_loss
from specdec.training.optim import Steps
from specdec.training.tokenizer import save_metaspace_tokenizer, train_metaspace_tokenizer
from specdec.zoo.settings import XTOK, ZooSettings

__all__ = ["SEED_OFFSET", "build_xtok", "xtok_loss", "xtok_steps"]

SEED_OFFSET = 6  # its initialisation seed: settings.seed + 6 (the students take + 2 .. + 5)


def build_xtok(work: Path, settings: ZooSettings, corpus: Corpus, show_progress: bool,
               say: Callable[[str], None]) -> int:
    """Train the tokenizer and the model into `work/draft-model-xtok`; the model's parameters."""
    if settings.xtok_vocab_size is None:
        raise ValueError(f"the {settings.name} family has no {XTOK} (its settings give no xtok_vocab_size)")
    directory = work / XTOK
    say(f"{XTOK}: a metaspace BPE with byte fallback, {settings.xtok_vocab_size} entries (the target's: "
        f"{settings.vocab_size}), and a language model on it")
    save_metaspace_tokenizer(train_metaspace_tokenizer(training_texts(corpus, settings.tokenizer_chars),
                                                       settings.xtok_vocab_size),
                             directory, settings.target.max_positions)
    tokenizer = load_tokenizer(directory)
    data = encode_corpus(tokenizer, corpus, int(tokenizer.eos_token_id), settings.train_chars, settings.heldout_chars)
    say(f"{XTOK} data: {data.train.shape[0]:,} training tokens in its own ids")
    with torch.random.fork_rng(devices=[]):  # the build's other pieces see the random state they would without it
        model = new_language_model(settings.draft, len(tokenizer), settings.target.max_positions,
                                   settings.seed + SEED_OFFSET, tokenizer.bos_token_id, tokenizer.eos_token_id)
        train_language_model(model, data.train, xtok_steps(settings), show_progress, f"training {XTOK}")
    with quiet_transformers():
        model.save_pretrained(directory)
    tokenizer.save_pretrained(str(directory))
    return sum(p.numel() for p in model.parameters())


def xtok_steps(settings: ZooSettings) -> Steps:
    """Its training: the students' batch, windows, learning rate and seed, for `settings.xtok_steps`
    steps (None: the students' steps)."""
    steps = settings.student_steps
    return steps if settings.xtok_steps is None else replace(steps, steps=settings.xtok_steps)


@torch.no_grad()
def xtok_loss(model: Any, tokenizer: Any, target_tokenizer: Any, windows: torch.Tensor) -> dict[str, float]:
    """Its held-out loss on the family's loss windows (target ids [n, T]), each window's text
    encoded in its own ids: "loss" in nats per target token (the text's total over the T - 1
    target tokens each window predicts, comparable with the target's), "loss_per_own_token"."""
    total, own, predicted = 0.0, 0, 0
    for window in windows:
        text = target_tokenizer.decode(window.tolist())
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])  # (1, T')
        logits = model(input_ids=ids[:, :-1]).logits  # (1, T' - 1, V')
        total += next_token_loss(logits, ids[:, 1:]).item() * (ids.shape[1] - 1)
        own += ids.shape[1] - 1
        predicted += window.shape[0] - 1
    return {"loss": total / predicted, "loss_per_own_token": total / own}

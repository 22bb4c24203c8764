"""The zoo's block drafters: a DFlash drafter (`specdec.training.dflash`) and a PARD draft model
(`specdec.training.pard`), each trained alone from the family's frozen target on its training
text, so a built family gains them without being built again (`specdec.zoo.extend`).

DFlash drafts the published block of 16 (`DFLASH_BLOCK`) with `settings.dflash_layers` draft layers
fusing five of the target's layers, as the published drafters do (spread from 1 to L - 3), for
`settings.dflash_steps` steps of the students' batch and windows at their learning rate, with
`DFLASH_ANCHORS` random anchors per window: about one position in five of the 352-token windows,
the density of the paper's 512 anchors per 3072-token sequence. PARD starts from the family's distilled draft model and learns to
draft with mask tokens for `settings.pard_steps` steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from specdec.drafters.parallel.dflash_files import save_dflash
from specdec.training.dflash import DFlashStudent, training_layer_ids
from specdec.training.distill import distill
from specdec.training.optim import Steps
from specdec.training.pard import PardStudent, save_pard
from specdec.zoo.settings import DFLASH_BLOCK, ZooSettings

__all__ = ["DFLASH_ANCHORS", "DFLASH_FUSED", "DFLASH_SEED", "PARD_SEED", "build_dflash", "build_pard", "dflash_steps"]

DFLASH_SEED = 7  # settings.seed + 7: after the students (+ 2 .. + 5) and draft-model-xtok (+ 6)
DFLASH_ANCHORS = 64
DFLASH_FUSED = 5  # target layers fused
PARD_SEED = 8


def dflash_steps(settings: ZooSettings) -> Steps:
    """DFlash's training: the students' batch, windows, learning rate and seed, for its own steps."""
    if settings.dflash_steps is None:
        raise ValueError(f"the {settings.name} family has no dflash (its settings give no dflash_steps)")
    return replace(settings.student_steps, steps=settings.dflash_steps, seed=settings.seed + DFLASH_SEED)


def build_dflash(work: Path, settings: ZooSettings, target: Any, tokenizer: Any, train: torch.Tensor,
                 show_progress: bool, say: Callable[[str], None]) -> int:
    """Train the family's DFlash drafter into `work/dflash`; its parameters."""
    steps = dflash_steps(settings)
    layers = settings.dflash_layers or 1
    with torch.random.fork_rng(devices=[]):  # the build's other pieces see the random state they would without it
        fused = training_layer_ids(int(target.config.get_text_config().num_hidden_layers), DFLASH_FUSED)
        student = DFlashStudent.create(target, settings.seed + DFLASH_SEED, lr=steps.lr, tokenizer=tokenizer,
                                       block_size=DFLASH_BLOCK, layers=layers, target_layer_ids=fused,
                                       anchors=DFLASH_ANCHORS)
        say(f"dflash: {layers} draft layer(s) reading target layers {list(student.module.spec.target_layer_ids)}, "
            f"block {DFLASH_BLOCK}, mask id {student.module.spec.mask_token_id}, {steps.steps} steps")
        distill(target, [student], train, steps, show_progress)
    save_dflash(student.module.eval(), work / "dflash")
    return sum(p.numel() for p in student.module.parameters())


def build_pard(work: Path, settings: ZooSettings, target: Any, tokenizer: Any, train: torch.Tensor,
               show_progress: bool, say: Callable[[str], None]) -> int:
    """Train the family's PARD draft model into `work/pard`, from its draft model; its parameters."""
    if settings.pard_steps is None:
        raise ValueError(f"the {settings.name} family has no pard (its settings give no pard_steps)")
    steps = replace(settings.student_steps, steps=settings.pard_steps, seed=settings.seed + PARD_SEED)
    with torch.random.fork_rng(devices=[]):
        student = PardStudent.create(settings.draft, target, tokenizer, settings.seed + PARD_SEED, lr=steps.lr,
                                     init=work / "draft-model")
        say(f"pard: the draft model learning {student.recipe.para_num} offsets with mask id {student.mask}, "
            f"{steps.steps} steps")
        distill(target, [student], train, steps, show_progress)
    save_pard(student, tokenizer, work / "pard")
    return sum(p.numel() for p in student.module.parameters())

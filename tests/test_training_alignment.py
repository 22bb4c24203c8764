"""What each trainer teaches is what its drafter drafts: on the same prefix, a student's
teacher-forced prediction at the index its loss uses equals the drafter's first draft token.
This pins the position bookkeeping (pairs (x_{j+1}, f_j), Medusa head offsets) end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from specdec.protocols import row_view
import specdec
from specdec.drafters.feature_heads.eagle import save_eagle
from specdec.drafters.feature_heads.medusa_files import save_medusa
from specdec.training.draft_model import DraftModelStudent, DraftSize
from specdec.training.eagle import EagleStudent
from specdec.training.medusa import MedusaStudent
from specdec.training.mtp import MtpStudent, write_mtp
from specdec.training.teacher import teacher_batch

T = 11  # prompt length


class Recorder:
    """Wraps a drafter and keeps every draft it proposes."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.drafts = row_view(inner), []
        self.name = inner.name
        self.uses_hidden_states = getattr(self.inner, "uses_hidden_states", False)

    def prefill(self, ctx: Any) -> None:
        if hasattr(self.inner, "prefill"):
            self.inner.prefill(ctx)

    def propose(self, ctx: Any, k: int) -> Any:
        draft = self.inner.propose(ctx, k)
        self.drafts.append(draft.tokens.tolist())
        return draft

    def commit(self, ctx: Any, num_accepted: int) -> None:
        if hasattr(self.inner, "commit"):
            self.inner.commit(ctx, num_accepted)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Qwen3ForCausalLM, Path]:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # peaked next-token distributions: no argmax near-ties
    directory = tmp_path_factory.mktemp("target")
    model.save_pretrained(directory)
    return model, directory


def _scramble(module: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.3)


def _first_draft(model: Qwen3ForCausalLM, prompt: torch.Tensor, drafter: Any) -> int:
    recorder = Recorder(drafter)
    specdec.generate(model, prompt, drafter=recorder, num_draft_tokens=1, max_new_tokens=2)
    return recorder.drafts[0][0]


def _student(kind: str, model: Qwen3ForCausalLM) -> Any:
    lm_head = model.get_output_embeddings()
    student = {"draft-model": lambda: DraftModelStudent.create(DraftSize(16, 1, 2, 1), model, seed=1),
               "medusa": lambda: MedusaStudent.create(2, 1, lm_head, seed=1),
               "eagle": lambda: EagleStudent.create(model, seed=1),
               "mtp": lambda: MtpStudent.create(model, seed=1)}[kind]()
    student.module.double().eval()
    _scramble(student.module, seed=5)  # away from the initialisation (Medusa starts as a copy of the LM head)
    return student


def _save(kind: str, student: Any, target_dir: Path, out: Path) -> dict[str, str]:
    if kind == "draft-model":
        student.module.save_pretrained(out)
        return {"model": str(out)}
    if kind == "medusa":
        save_medusa(student.module, out)
    elif kind == "eagle":
        save_eagle(student.module, out)
    else:
        write_mtp(student.module, target_dir, out)
    return {"path": str(out)}


@pytest.mark.parametrize("kind", ["draft-model", "medusa", "eagle", "mtp"])
def test_the_student_predicts_what_its_drafter_drafts(kind: str, target, tmp_path: Path):
    model, directory = target
    prompt = torch.randint(0, 96, (T,), generator=torch.Generator().manual_seed(3))
    batch = teacher_batch(model, prompt[None])
    student = _student(kind, model)
    with torch.no_grad():
        predicted = {  # the row whose loss is taken against the target's distribution at T-1
            "draft-model": lambda: student.module(input_ids=prompt[None]).logits[0, T - 1],
            "medusa": lambda: student.module(batch.hidden)[0, 0, T - 2],  # head 0 at t = T-2
            "eagle": lambda: model.lm_head(student._predict(batch, noisy=False))[0, T - 2],  # pair j = T-2
            "mtp": lambda: student._logits(batch)[0, T - 2],  # pair j = T-2
        }[kind]()
    top2 = predicted.topk(2).values
    assert (top2[0] - top2[1]).item() > 1e-6  # a clear argmax
    drafter = specdec.make_drafter(kind, **_save(kind, student, directory, tmp_path))
    assert _first_draft(model, prompt, drafter) == int(predicted.argmax())

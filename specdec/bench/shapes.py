"""The synthetic targets of `specdec.bench.synthetic`: Llama shapes built from configs with
random weights, the settings that measure them, and drafters made for them (a draft model of the
target's first layers, random EAGLE, MTP and Medusa heads), which measure cost, not acceptance."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

__all__ = ["DRAFTERS", "SETTINGS", "Setting", "Shape", "build_target", "drafter_factories"]

DRAFTERS = ("ngram", "draft-model", "eagle", "eagle+tree", "mtp", "medusa+tree")


@dataclass(frozen=True)
class Shape:
    """A Llama-shaped target (grouped-query attention, SwiGLU, untied embeddings)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    def config(self) -> LlamaConfig:
        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, num_hidden_layers=self.layers,
                           num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                           intermediate_size=self.intermediate, max_position_embeddings=8192,
                           rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                           tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                           attn_implementation="sdpa")  # type: ignore[call-arg]


@dataclass(frozen=True)
class Setting:
    """What one run measures: the targets, their dtype, the prompt and output lengths, k, the
    drafters on the synthetic targets, and whether transformers' rows and the zoo run too."""

    name: str
    shapes: tuple[Shape, ...]
    dtype: str = "float32"
    prompt: int = 128
    new_tokens: int = 128
    k: int = 4
    tree_rows: tuple[int, ...] = (17, 65)  # a 16- and a 64-node tree with their root
    drafters: tuple[str, ...] = ("ngram",)
    engines: tuple[str, ...] = ("compiled",)
    peers: bool = True
    repeats: int = 3
    zoo: bool = False
    batches: tuple[int, ...] = ()  # the batch curve's sizes, on the first target and the zoo (none: no curve)
    batch_drafters: tuple[str, ...] = ("ngram",)  # the curve's drafters beside plain decoding (compiled)


LLAMA_1B = Shape("llama-1b", hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
LLAMA_8B = Shape("llama-8b", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256)
LLAMA_300M = Shape("llama-300m", hidden=1024, layers=20, heads=16, kv_heads=4, intermediate=2816, vocab=32000)
TINY = Shape("tiny", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=256)

SETTINGS = {
    "gpu": Setting("gpu", (LLAMA_1B, LLAMA_8B), dtype="bfloat16", prompt=128, new_tokens=256,
                   engines=("eager", "compiled"), repeats=3, zoo=True, batches=(1, 8, 32),
                   batch_drafters=("ngram", "eagle")),
    "cpu-300m": Setting("cpu-300m", (LLAMA_300M,), prompt=64, new_tokens=64, drafters=DRAFTERS,
                        engines=("eager", "compiled"), repeats=2),
    "tiny": Setting("tiny", (TINY,), prompt=16, new_tokens=12, tree_rows=(17,), drafters=("ngram", "eagle+tree"),
                    engines=("eager", "compiled"), repeats=1, batches=(1, 2), batch_drafters=("ngram",)),
}


def build_target(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> PreTrainedModel:
    """A random target, initialised on `device` in `dtype` (no float32 copy of a large model)."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point else default)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(shape.config())
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def _layer_skip(target: PreTrainedModel, layers: int) -> PreTrainedModel:
    """A draft model made of the target's first `layers` layers, its final norm and LM head
    (weights shared, so it costs layers / L of a target forward)."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    with torch.device("meta"):
        draft = LlamaForCausalLM(config)  # type: ignore[arg-type]
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:layers])
    draft.model.norm, draft.lm_head = target.model.norm, target.lm_head
    draft.model.rotary_emb = target.model.rotary_emb
    return draft.eval()


def drafter_factories(target: PreTrainedModel, directory: Path, names: Sequence[str]) -> dict[str, Callable[[], Any]]:
    """Makers of the drafters `names` for a random target; heads are random and written to `directory`."""
    from safetensors.torch import save_file

    from specdec.drafters.feature_heads.eagle import save_eagle
    from specdec.drafters.feature_heads.medusa_head import MedusaHeads
    from specdec.drafters.feature_heads.medusa_files import save_medusa
    from specdec.drafters.feature_heads.mtp_files import mtp_checkpoint_keys
    from specdec.plugins import make_drafter
    from specdec.training.eagle import EagleStudent
    from specdec.training.mtp import create_mtp_head

    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    made: dict[str, Callable[[], Any]] = {}
    for name in names:
        base, tree = name.removesuffix("+tree"), name.endswith("+tree")
        options: dict[str, Any] = {"tree": True} if tree else {}
        if base == "draft-model":
            options["model"] = _layer_skip(target, max(1, target.config.num_hidden_layers // 8))
        elif base == "eagle" and not (directory / "eagle").is_dir():
            save_eagle(EagleStudent.create(target, seed=1).module.eval().to(target.dtype), directory / "eagle")
        elif base == "medusa" and not (directory / "medusa").is_dir():
            save_medusa(MedusaHeads(3, 1, hidden, vocab).to(target.dtype), directory / "medusa")
        elif base == "mtp" and not (directory / "mtp").is_dir():  # the module's keys beside the target's config
            head = create_mtp_head(target.config, seed=2).to(target.dtype)
            (directory / "mtp").mkdir()
            config = {**target.config.to_dict(), "mtp_num_hidden_layers": 1}
            (directory / "mtp" / "config.json").write_text(json.dumps(config, default=str))
            keys = mtp_checkpoint_keys(head)
            save_file({keys[k]: v.contiguous().cpu() for k, v in head.state_dict().items()},
                      str(directory / "mtp" / "model.safetensors"))
        if base in ("eagle", "medusa", "mtp"):
            options["path"] = str(directory / base)
        made[name] = functools.partial(make_drafter, base, **options)
    return made

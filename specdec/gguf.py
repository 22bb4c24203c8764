"""GGUF checkpoints (llama.cpp's one-file format): recognising one, loading its model and its
tokenizer through transformers, and converting it to a float checkpoint directory.

transformers reads a GGUF's config, weights and tokenizer (chat template included) from the file's
metadata. specdec asks it to dequantise every weight at load (`GgufConfig(dequantize=True)`), so
the model it runs is an ordinary float model in the dtype asked (float32 when none is). Before any
weight is read, `check_gguf` makes sure that the file exists, starts with the GGUF magic, states an
architecture transformers can read, and that the packages transformers needs for it are installed;
each failure names the file and what to do.

`specdec.checkpoints` dispatches here for a path `is_gguf` recognises, so every caller of
`load_causal_lm` and `load_tokenizer` takes GGUF files; it also quiets transformers' logs, which
this module leaves as they are.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import secrets
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

__all__ = ["MAGIC", "Converted", "GGUFDependencyError", "NotGGUFError", "UnsupportedGGUFArchitecture", "check_gguf",
           "convert_gguf", "gguf_architecture", "is_gguf", "load_gguf_model", "load_gguf_tokenizer",
           "supported_architectures"]

MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file
SUFFIX = ".gguf"
DEFAULT_DTYPE = torch.float32  # what transformers dequantises to
# transformers' name of an architecture: the name llama.cpp writes in general.architecture (transformers
# takes either), and the names llama.cpp writes besides those transformers lists
_FILE_NAMES = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss", "minimax_m2": "minimax-m2"}
_MORE_FILE_NAMES = ("t5encoder",)
_NOT_ARCHITECTURES = ("general", "tokenizer")  # keys of transformers' mapping that name no architecture


class GGUFDependencyError(ImportError, ValueError):
    """A package transformers needs to read a GGUF file is not installed."""


class NotGGUFError(ValueError):
    """A file taken for a GGUF file does not start with the GGUF magic."""


class UnsupportedGGUFArchitecture(ValueError):
    """A GGUF file states an architecture transformers cannot read from GGUF."""


@dataclass(frozen=True)
class Converted:
    """What `convert_gguf` wrote."""

    directory: Path  # the float checkpoint directory
    parameters: int  # the model's parameter count
    dtype: torch.dtype  # the weights' dtype
    architecture: str  # the GGUF file's general.architecture


def _head(path: Path) -> bytes:
    with path.open("rb") as file:
        return file.read(len(MAGIC))


def is_gguf(path: str | Path) -> bool:
    """Whether `path` names a GGUF file: not a directory, and named *.gguf (existing or not) or
    starting with the GGUF magic."""
    path = Path(path).expanduser()
    if path.is_dir():
        return False
    if path.suffix.lower() == SUFFIX:
        return True
    try:
        return path.is_file() and _head(path) == MAGIC
    except OSError:
        return False


def _transformers_names() -> set[str]:
    """The architectures transformers lists as readable from GGUF, by its own names."""
    from transformers.integrations.gguf import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return {*GGUF_SUPPORTED_ARCHITECTURES, *GGUF_ARCHS} - set(_NOT_ARCHITECTURES)


def supported_architectures() -> tuple[str, ...]:
    """The general.architecture values, as llama.cpp writes them, of the GGUF files this
    transformers can read, sorted."""
    return tuple(sorted({_FILE_NAMES.get(name, name) for name in _transformers_names()} | set(_MORE_FILE_NAMES)))


def gguf_architecture(file: str | Path) -> str:
    """The general.architecture stated in the metadata of the GGUF file `file` (no tensor is read).

    Raises FileNotFoundError, NotGGUFError, or ValueError for a file with no architecture."""
    from transformers.integrations.gguf import read_gguf_metadata

    file = _existing(Path(file).expanduser())
    try:
        metadata, _ = read_gguf_metadata(str(file))
    except (ValueError, KeyError, IndexError, struct.error) as error:  # truncated or malformed metadata
        raise ValueError(f"GGUF file {str(file)!r} has unreadable metadata ({error}); the file may be truncated: "
                         "download or convert it again") from None
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise ValueError(f"GGUF file {str(file)!r} states no general.architecture in its metadata, so transformers "
                         "cannot tell which model it holds; write it again with llama.cpp's convert_hf_to_gguf.py")
    return architecture


def _existing(file: Path) -> Path:
    """`file`, after checking that it exists and starts with the GGUF magic."""
    if not file.exists():
        raise FileNotFoundError(f"GGUF file {str(file)!r} does not exist (looked for {str(file.absolute())!r}); "
                                "pass the path of a .gguf file, a checkpoint directory or a hub id")
    if file.is_dir():
        raise NotGGUFError(f"{str(file)!r} is a directory, not a GGUF file; a checkpoint directory needs no .gguf "
                           "suffix")
    head = _head(file)
    if head != MAGIC:
        raise NotGGUFError(f"{str(file)!r} is not a GGUF file: it starts with {head!r}, not {MAGIC!r}; pass a .gguf "
                           "file written by llama.cpp (convert_hf_to_gguf.py), or a checkpoint directory")
    return file


def _needs_gguf_package(architecture: str) -> bool:
    """Whether transformers reads this architecture's config and weights through the `gguf`
    package (its older reader) rather than its own."""
    from transformers.integrations.gguf import GGUF_ARCHS, GGUF_CONFIG_ARCHS

    return architecture not in GGUF_ARCHS or architecture not in GGUF_CONFIG_ARCHS


def _require(package: str, file: Path, architecture: str, minimum: str | None = None) -> None:
    """Raise GGUFDependencyError unless `package` (at least version `minimum`) can be imported."""
    pin = f"{package}>={minimum}" if minimum else package
    fix = f"install it with `pip install '{pin}'`"
    try:
        importlib.import_module(package)
    except ImportError:
        raise GGUFDependencyError(f"reading GGUF file {str(file)!r} (architecture {architecture!r}) with transformers "
                                  f"needs the `{package}` package, which is not installed; {fix}") from None
    if minimum is None:
        return
    from packaging.version import InvalidVersion, Version

    try:
        found = importlib.metadata.version(package)
        old = Version(found) < Version(minimum)
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return  # importable but unversioned (a source checkout): let transformers try
    if old:
        raise GGUFDependencyError(f"reading GGUF file {str(file)!r} (architecture {architecture!r}) with transformers "
                                  f"needs `{package}` >= {minimum}, and {found} is installed; {fix}")


def check_gguf(file: str | Path, model: bool = True) -> str:
    """Check, before any weight is read, that transformers can load the GGUF file `file`: it exists,
    starts with the GGUF magic, states a supported architecture, and the packages needed are
    installed (`gguf` for transformers' older reader; `accelerate` for a `model`). Returns the
    architecture."""
    from transformers.utils.import_utils import GGUF_MIN_VERSION

    file = Path(file).expanduser()
    architecture = gguf_architecture(file)
    supported = supported_architectures()
    if architecture not in supported and architecture not in _transformers_names():
        import transformers

        raise UnsupportedGGUFArchitecture(
            f"GGUF file {str(file)!r} holds architecture {architecture!r}, which transformers "
            f"{transformers.__version__} cannot read from GGUF (it reads {', '.join(supported)}); use the original "
            "checkpoint directory or hub id instead")
    if _needs_gguf_package(architecture):
        _require("gguf", file, architecture, GGUF_MIN_VERSION)
    if model:
        _require("accelerate", file, architecture)
    return architecture


def _rethrown(error: ImportError, file: Path) -> GGUFDependencyError:
    return GGUFDependencyError(f"reading GGUF file {str(file)!r} with transformers failed for a missing package: "
                               f"{' '.join(str(error).split())}; install it (`pip install gguf accelerate`)")


def load_gguf_model(file: str | Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """The causal LM in the GGUF file `file`, its weights dequantised to `dtype` (float32 when None),
    in eval mode: an ordinary float model, with no quantizer attached."""
    from transformers import AutoModelForCausalLM, GgufConfig

    file = Path(file).expanduser()
    check_gguf(file)
    dequantized = GgufConfig(dequantize=True)  # dense weights, and a model save_pretrained can write
    try:
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True,
                                                     dtype=dtype or DEFAULT_DTYPE, quantization_config=dequantized)
    except ImportError as error:
        raise _rethrown(error, file) from error
    return model.eval()


def load_gguf_tokenizer(file: str | Path) -> Any:
    """The tokenizer described in the GGUF file `file`'s metadata, with its chat template (when the
    file has one)."""
    from transformers import AutoTokenizer

    file = Path(file).expanduser()
    check_gguf(file, model=False)
    try:
        return AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
    except ImportError as error:
        raise _rethrown(error, file) from error


def convert_gguf(file: str | Path, out: str | Path, dtype: torch.dtype | None = None) -> Converted:
    """Write the GGUF file `file` as a float checkpoint directory `out` (config.json,
    model.safetensors, the tokenizer's files and chat template) in `dtype` (float32 when None).

    It is written to a temporary directory beside `out` and renamed at the end, so a failure leaves
    nothing behind. Raises FileExistsError when `out` exists and is not an empty directory."""
    file, out = Path(file).expanduser(), Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {str(out)!r} exists and is not an empty directory; choose a new one")
    architecture = check_gguf(file)
    model = load_gguf_model(file, dtype)
    tokenizer = load_gguf_tokenizer(file)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}.partial"
    staging.mkdir()  # as `out` will be: with the umask's permissions (mkdtemp's are private)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    parameters = sum(parameter.numel() for parameter in model.parameters())
    return Converted(out, parameters, model.dtype, architecture)

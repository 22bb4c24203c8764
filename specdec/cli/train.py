"""`specdec train KIND --target DIR --data PATH... --out DIR`: train a draft model, Medusa heads,
an EAGLE-1 or EAGLE-3 head or an MTP module for a local transformers causal LM (`specdec.training.run`)."""

from __future__ import annotations

import argparse
from typing import Any

from specdec.cli.common import CLIError, resolve_target
from specdec.errors import one_line

__all__ = ["add_train_command"]


def _train(args: argparse.Namespace) -> int:
    from specdec.training.draft_model import DraftSize
    from specdec.training.optim import Steps
    from specdec.training.run import DEFAULT_LR, TrainSettings, train_drafter

    try:
        steps = Steps(steps=args.steps, batch=args.batch_size, seq_len=args.seq_len,
                      lr=args.lr if args.lr is not None else DEFAULT_LR[args.kind], seed=args.seed)
        settings = TrainSettings(
            steps=steps, draft=DraftSize(hidden=args.hidden, layers=args.layers, heads=args.attention_heads,
                                         kv_heads=args.kv_heads), draft_from_target=args.draft_init == "target",
            medusa_heads=args.medusa_heads, medusa_layers=args.medusa_layers, k=args.k,
            draft_vocab=args.draft_vocab, eagle3_layers=_layers(args.eagle3_layers))
        if args.k < 1:
            raise ValueError(f"--k must be >= 1, got {args.k}")
        report = train_drafter(args.kind, resolve_target(args.target), args.data, args.out, settings,
                               show_progress=not args.no_progress)
    except (ValueError, KeyError, OSError, ArithmeticError) as error:
        raise CLIError(one_line(error)) from None
    figures = ", ".join(f"{key}={value:.3f}" for key, value in report.heldout.items())
    print(f"saved {args.kind} to {report.out}")
    print(f"held-out: {figures}")
    print(f"held-out acceptance (greedy, k={args.k}): mean accepted length {report.mean_accepted_length:.2f}, "
          f"acceptance rate {report.acceptance_rate:.3f}")
    return 0


def _layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--eagle3-layers must be comma-separated layer indices such as 2,16,29, "
                         f"got {text!r}") from None


def add_train_command(commands: Any) -> None:
    """Register `train` under the top-level subparsers."""
    from specdec.training.run import KINDS

    train = commands.add_parser("train", help="train a drafter for a local causal LM on text files")
    train.add_argument("kind", choices=KINDS, metavar="KIND", help=", ".join(KINDS))
    train.add_argument("--target", required=True, metavar="DIR|ORG/NAME",
                       help="the target's checkpoint (model + tokenizer): a directory or a hub id")
    train.add_argument("--data", required=True, nargs="+", metavar="PATH",
                       help="text files or directories (.py .txt .md .rst .json); 1/16 of the files held out")
    train.add_argument("--out", required=True, metavar="DIR", help="new directory for the checkpoint")
    train.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    train.add_argument("--batch-size", type=int, default=8, help="windows per step (default 8)")
    train.add_argument("--seq-len", type=int, default=256, help="tokens per window (default 256)")
    train.add_argument("--lr", type=float, default=None, help="peak learning rate (default per kind)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--k", type=int, default=4, help="draft length of the held-out estimate (default 4)")
    train.add_argument("--hidden", type=int, default=128, help="draft-model: hidden size (default 128)")
    train.add_argument("--layers", type=int, default=2, help="draft-model: layers (default 2)")
    train.add_argument("--attention-heads", type=int, default=4, help="draft-model: attention heads (default 4)")
    train.add_argument("--kv-heads", type=int, default=2, help="draft-model: key/value heads (default 2)")
    train.add_argument("--draft-init", choices=("target", "random"), default="target",
                       help="draft-model: embeddings start from the target's, projected to --hidden (default), "
                            "or at random")
    train.add_argument("--medusa-heads", type=int, default=4, help="medusa: heads (default 4)")
    train.add_argument("--medusa-layers", type=int, default=1, help="medusa: residual blocks per head (default 1)")
    train.add_argument("--draft-vocab", type=int, default=None,
                       help="eagle3: the draft vocabulary's size, its most frequent training tokens "
                            "(default min(V, 32000))")
    train.add_argument("--eagle3-layers", default=None, metavar="I,J,K",
                       help="eagle3: target hidden_states indices to fuse (0 = embeddings; default 2,L//2,L-3)")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.set_defaults(run=_train)

"""`specdec train KIND --target DIR --data PATH... --out DIR`: train a draft model, Medusa heads,
an EAGLE-1 or EAGLE-3 head, an MTP module, a DFlash drafter or a PARD draft model for a local transformers
causal LM (`specdec.training.run`)."""

from __future__ import annotations

import argparse
from typing import Any

from specdec.cli.common import CLIError, resolve_target
from specdec.errors import one_line

__all__ = ["add_train_command"]


def _train(args: argparse.Namespace) -> int:
    from specdec.training.draft_model import DraftSize
    from specdec.training.optim import Steps
    from specdec.training.pard import PardRecipe
    from specdec.training.run import DEFAULT_LR, TrainSettings, train_drafter

    try:
        steps = Steps(steps=args.steps, batch=args.batch_size, seq_len=args.seq_len,
                      lr=args.lr if args.lr is not None else DEFAULT_LR[args.kind], seed=args.seed)
        settings = TrainSettings(
            steps=steps, draft=DraftSize(hidden=args.hidden, layers=args.layers, heads=args.attention_heads,
                                         kv_heads=args.kv_heads), draft_from_target=args.draft_init == "target",
            medusa_heads=args.medusa_heads, medusa_layers=args.medusa_layers, k=args.k,
            draft_vocab=args.draft_vocab, eagle3_layers=_layers(args.eagle3_layers),
            dflash_block_size=args.block_size, dflash_layers=args.dflash_layers,
            dflash_target_layers=_layers(args.dflash_target_layers, "--dflash-target-layers"),
            dflash_gamma=args.gamma, dflash_mask_token_id=args.mask_token_id, dflash_anchors=args.anchors,
            dflash_heads=args.dflash_heads,
            pard=PardRecipe(para_num=args.para_num), pard_init=args.init)
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


def _layers(text: str | None, option: str = "--eagle3-layers") -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{option} must be comma-separated layer indices such as 2,16,29, "
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
    train.add_argument("--block-size", type=int, default=16,
                       help="dflash: B, the block drafted per forward (the last id and B - 1 masks; default 16)")
    train.add_argument("--dflash-layers", type=int, default=2, help="dflash: draft layers (default 2)")
    train.add_argument("--dflash-target-layers", default=None, metavar="I,J",
                       help="dflash: target layers whose outputs are fused (0-based; default spread over "
                            "1..L-3 as the reference does)")
    train.add_argument("--dflash-heads", type=int, default=None,
                       help="dflash: attention heads, each with its own keys and values, at the target's head "
                            "size (default: the target's heads)")
    train.add_argument("--gamma", type=float, default=None,
                       help="dflash: slot j's loss weight is exp(-(j-1)/gamma) (default 7 for B=16, 5 for 10, "
                            "4 for 8)")
    train.add_argument("--mask-token-id", type=int, default=None,
                       help="dflash: the id filling masked slots (default: one the tokenizer never produces)")
    train.add_argument("--anchors", type=int, default=512,
                       help="dflash: blocks drawn per training window, at most (default 512)")
    train.add_argument("--para-num", type=int, default=8,
                       help="pard: P, the blocks of a training window (mask offsets 0..P-1; default 8)")
    train.add_argument("--init", default=None, metavar="DIR|ORG/NAME",
                       help="pard: start from this causal LM on the target's tokenizer (e.g. a small model of the "
                            "target's family; then pass a lower --lr, such as 1e-4) instead of a fresh draft model "
                            "of --hidden/--layers")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    train.set_defaults(run=_train)

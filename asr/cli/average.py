"""Average the weights of several checkpoints of one run.

    python -m asr.average exp/librispeech100_transformer --last 10
    python -m asr.average exp/librispeech100 --best 5 --out exp/librispeech100/avg_best5.pt

What is averaged, and how, is in :mod:`asr.averaging`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.average", description=__doc__.split("\n\n")[0])
    parser.add_argument("exp_dir", type=Path, metavar="EXP_DIR", help="the run folder (exp_dir of the recipe)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, metavar="N", help="average the N newest epoch{E}.pt")
    which.add_argument("--best", type=int, metavar="N", help="average the N best best_epoch{E}.pt by validation metric")
    parser.add_argument("--out", type=Path, metavar="FILE", help="default: EXP_DIR/avg_last{N}.pt or avg_best{N}.pt")
    args = parser.parse_args(argv)
    # imported once the arguments are parsed: --help needs none of it (torch and the data readers)
    from asr.averaging import average_checkpoints, select_checkpoints
    from asr.checkpointing import CheckpointError, save_checkpoint
    from asr.writing import WriteError

    count = args.last if args.last is not None else args.best
    if count < 1:
        parser.error(f"the number of checkpoints must be at least 1, got {count}")
    try:
        paths = select_checkpoints(args.exp_dir, args.last, args.best)
        payload = average_checkpoints(paths)
    except CheckpointError as err:
        parser.error(str(err))
    out = args.out or args.exp_dir / (f"avg_last{count}.pt" if args.last is not None else f"avg_best{count}.pt")
    try:
        save_checkpoint(out, payload)
    except WriteError as err:  # a full disk, a denied write: nothing partial is left at out
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checkpoint tools: ``convert`` rewrites a checkpoint of an older lnasr version in today's format.

    python -m asr.checkpoint convert old/last.pt new/last.pt

Converting runs no code in the file: it is read as checkpoints are, allowed numpy arrays besides.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.cli.errors import fail, what_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m asr.checkpoint",
        description="Checkpoint tools. 'convert' rewrites a checkpoint of an older lnasr version "
        "(a last.pt with numpy RNG state) into today's format, which loads without running code.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="rewrite an older checkpoint in today's safe format")
    convert.add_argument("source", type=Path, help="the older checkpoint")
    convert.add_argument(
        "target", type=Path,
        help="where to write the converted one: the source itself converts in place; another existing file "
        "needs --overwrite",
    )
    convert.add_argument("--overwrite", action="store_true", help="replace an existing target file")
    args = parser.parse_args(argv)
    # imported once the arguments are parsed: --help needs none of it (torch and the data readers)
    from asr.checkpoints.io import FORMAT_VERSION, CheckpointError, convert_checkpoint, load_checkpoint
    from asr.writing import WriteError

    if args.source.is_file() and what_file(args.source) not in ("a checkpoint", "a file"):
        fail(f"{args.source} is not a checkpoint: it is {what_file(args.source)}")
    in_place = args.target.exists() and args.source.exists() and args.target.resolve() == args.source.resolve()
    if args.target.exists() and not in_place and not args.overwrite:
        fail(f"{args.target} exists; give another target, or --overwrite to replace it")
    try:
        convert_checkpoint(args.source, args.target)
        load_checkpoint(args.target)  # the result must pass the safe reader
    except (CheckpointError, WriteError) as err:
        fail(err)
    print(f"converted {args.source} into {args.target} (checkpoint format {FORMAT_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

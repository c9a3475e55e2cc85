"""Make a synthetic corpus of LibriSpeech's shape and layout, to rehearse the LibriSpeech recipes.

    python -m asr.synth_librispeech OUT                 # 100 hours of training speech, dev and test 5.4 h each
    python -m asr.synth_librispeech OUT --hours 10 --jobs 2

Writes ``OUT/LibriSpeech/{train-clean-100,dev-clean,test-clean}`` (16 kHz FLAC,
upper-case ``*.trans.txt``), ``SPEAKERS.TXT`` and ``README.txt``; point a
recipe's ``data.root`` at ``OUT``. The text is public domain (the King James
Bible and Shakespeare's plays), spoken by eSpeak NG, SVOX Pico and Piper
voices. The same ``--hours`` and ``--seed`` give the same bytes whatever
``--jobs``; a stopped run is finished by running the same command again. What
it makes and costs: docs/benchmarks.md, "Synthetic LibriSpeech-shaped corpus".
Needs ``pip install -e ".[synth]"``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from asr.cli.errors import fail


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m asr.synth_librispeech",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("out", type=Path, metavar="OUT", help="folder to write OUT/LibriSpeech into")
    parser.add_argument("--hours", type=float, default=100.0, help="hours of training speech (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed gives the same corpus (default 0)")
    parser.add_argument(
        "--jobs", type=int, default=None, help=f"worker processes (default: one per CPU core, {os.cpu_count()} here)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        fail(f"--jobs must be at least 1, got {args.jobs}")
    # imported once the arguments are parsed: --help needs none of it (torch, the synthesisers)
    from asr.synthesis.books import TextSourceError
    from asr.synthesis.librispeech import Options, SynthCorpusError, generate

    try:
        options = Options(hours=args.hours, seed=args.seed)
    except ValueError as err:
        fail(err)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        root = generate(args.out, options, jobs=args.jobs, progress=not args.quiet)
    except (SynthCorpusError, TextSourceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: the chapters finished so far are kept; run the same command again to finish the corpus",
            file=sys.stderr,
        )
        return 130
    print(f"corpus ready: {root} (README.txt there says what it holds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

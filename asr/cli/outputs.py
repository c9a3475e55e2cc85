"""The one overwrite rule of every command that writes results, and its one error line.

A command's output (a file or a folder; its default place or one given with ``--out``) that holds
what another run of the command wrote (other inputs or settings), or something the command cannot
read as its own, is refused before anything is computed: one line, ``error: <path> holds ...; give
another --out FILE to write elsewhere, or --overwrite to replace it``, exit status 2, nothing changed.
The same command again replaces its own output, as re-running a stage does in ESPnet or Kaldi, so a
study or a script can run it again without ``--overwrite``. Each command says what "the same" means
(what its output records) in its ``clash_with``; this module holds the option and the wording.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from asr.cli.errors import fail


def add_overwrite_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--overwrite``: replace ``what`` (e.g. "the results of another evaluation") found at the output."""
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace {what} found at the output (otherwise refused)")


def refuse_to_replace(out: str | Path, holds: str, *, out_given: bool = True, metavar: str = "FILE") -> NoReturn:
    """Stop with the one error line (:func:`refusal`), exit status 2."""
    fail(refusal(out, holds, out_given=out_given, metavar=metavar))


def refusal(out: str | Path, holds: str, *, out_given: bool = True, metavar: str = "FILE") -> str:
    """The message: ``out`` holds ``holds`` (e.g. "the results of another evaluation (its data ...)").
    ``out_given``: the output was named with ``--out`` (so the hint says *another*)."""
    return (f"{out} holds {holds}; give {'another ' if out_given else ''}--out {metavar} to write elsewhere, "
            "or --overwrite to replace it")

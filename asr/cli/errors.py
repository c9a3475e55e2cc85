"""How a command says that what it was given cannot be used: one line, exit status 2.

argparse prints its usage block for a command line it cannot parse (an unknown option, a missing
argument, a value of the wrong type): that is a usage error, and the usage is what helps. Whatever is
found wrong once the command line has been read (a file that is missing or is not what the option
takes, a corpus, a checkpoint, a recipe key, an option's value out of range) is one line on stderr,
``error: ...`` naming the file, key or option, and exit status 2, with no usage block to bury it.
"""

from __future__ import annotations

import sys
from typing import NoReturn


def one_line(message: object) -> str:
    """``message`` on one line: a message of several lines is joined with ``; ``."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def what_file(path: object) -> str:
    """What the file at ``path`` plainly is, for an error that says what was given: "a WAV audio file",
    "a text file", "a checkpoint", or "a file"."""
    from pathlib import Path

    from asr.checkpoints.io import not_a_checkpoint  # here: it imports torch, which --help never needs

    return not_a_checkpoint(path) or ("a checkpoint" if Path(str(path)).suffix == ".pt" else "a file")


def fail(message: object) -> NoReturn:
    """Print ``error: <message>`` (on one line) on stderr and exit with status 2."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(2)


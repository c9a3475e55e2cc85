"""What the entry points write to a terminal: log lines that share it with tqdm progress bars.

:class:`ProgressBarHandler` is the logging handler of ``asr.train`` and ``asr.evaluate``: each record
is written with ``tqdm.write``, which clears the bar, writes the line and draws the bar again below
it, so a log line never runs into a bar. :func:`not_a_command` is what a library module run with
``python -m`` says: which command uses it.
"""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

from tqdm import tqdm


class ProgressBarHandler(logging.StreamHandler):
    """Log records to a stream that a tqdm progress bar also draws on: each line goes above the bar,
    never into it."""

    def emit(self, record) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # as logging.StreamHandler does: a failed write is reported, not raised
            self.handleError(record)


def not_a_command(module: str, command: str) -> NoReturn:
    """For ``python -m`` on a library module: name the command that uses it (on stdout and exit 0 for
    ``--help``, else as an error, exit 2)."""
    message = f"{module} is a library module, not a command; its command is python -m {command} (python -m {command} --help)"
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(message)
        raise SystemExit(0)
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)

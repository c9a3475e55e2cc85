"""What the entry points write to a terminal: log lines that share it with tqdm progress bars.

:class:`ProgressBarHandler` is the logging handler of ``asr.train`` and ``asr.evaluate``: each record
is written with ``tqdm.write``, which clears the bar, writes the line and draws the bar again below
it, so a log line never runs into a bar.
"""

from __future__ import annotations

import logging

from tqdm import tqdm


class ProgressBarHandler(logging.StreamHandler):
    """Log records to a stream that a tqdm progress bar also draws on: each line goes above the bar,
    never into it."""

    def emit(self, record) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # as logging.StreamHandler does: a failed write is reported, not raised
            self.handleError(record)

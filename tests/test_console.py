"""asr/console.py: log lines and progress bars on one terminal."""

import io
import logging

from tqdm import tqdm

from asr.console import ProgressBarHandler


def test_log_lines_go_above_the_progress_bar_not_into_it():
    terminal = io.StringIO()
    handler = ProgressBarHandler(terminal)
    handler.setFormatter(logging.Formatter("%(message)s"))
    record = logging.LogRecord("asr.train", logging.INFO, __file__, 1, "epoch 1: valid loss 2.0000", None, None)
    with tqdm(total=10, desc="epoch 1", file=terminal, mininterval=0) as bar:
        bar.update(3)
        handler.emit(record)
        bar.update(3)
    # What a terminal shows of each line: the text after its last carriage return. The log line is one of
    # them on its own; written into the bar's line, it would show after the bar's text.
    shown = [line.rsplit("\r", 1)[-1] for line in terminal.getvalue().split("\n")]
    assert "epoch 1: valid loss 2.0000" in shown

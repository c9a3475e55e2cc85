"""Graceful stop: SIGTERM, SIGINT or SIGUSR1 end training at the next step boundary, with a checkpoint.

Cluster schedulers send ``SIGTERM`` (SLURM; ``SIGUSR1`` with ``--signal``) some time before
they preempt or end a job, and Ctrl-C sends ``SIGINT``. The first of these signals only
sets a flag: the trainer finishes the step in progress, writes ``last.pt`` (atomically,
through :func:`asr.checkpoints.io.save_checkpoint`), logs where it stopped and raises
:class:`TrainingStopped`; ``asr.train`` then exits with :data:`EXIT_STOPPED` (75,
``EX_TEMPFAIL``: "try again"), and ``--resume`` continues to the same final weights
as a run that was never stopped. Under ``torchrun`` the flag is all-reduced at every
step boundary, so every rank stops after the same step.

A second signal stops the process at once (:class:`StopNow` is raised wherever it
is): a save in progress is abandoned, its temporary file removed, and the previous
``last.pt`` stays as it was. ``asr.train`` then exits with 128 + the signal's number
(143 for SIGTERM, 130 for SIGINT), as a process killed by it would.

:data:`PARENT_DIED` (SIGUSR2) stops a run as the first signal does, but never "at once": it is the
signal :mod:`asr.studies.tether` asks the kernel to send when the study that started the run dies, and
the kernel sends it at every step of the orphan's reparenting, once for each thread of the dead study it
is handed to before it reaches a live process (``forget_original_parent`` in the kernel's exit.c). A
study killed with SIGKILL mostly gives one, sometimes two, depending on the order its threads end; so
repeats of it are ignored, while a SIGTERM, SIGINT or SIGUSR1 after it still stops at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

PARENT_DIED = signal.SIGUSR2  # the parent's death (asr.studies.tether): a stop that repeats count once

HANDLED_SIGNALS = (*STOP_SIGNALS, PARENT_DIED)  # what a run catches, and its loader workers ignore

EXIT_STOPPED = 75  # stopped on a signal after writing a resumable checkpoint (sysexits EX_TEMPFAIL)


class TrainingStopped(Exception):
    """Training stopped on a signal after writing a resumable checkpoint; the message says where."""

    exit_code = EXIT_STOPPED


class StopNow(BaseException):
    """A second stop signal: end at once. A BaseException, so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int):
        super().__init__(f"stopped at once by a second {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    """Catches the stop signals while installed (a context manager; main thread only, else a no-op)."""

    def __init__(self):
        self.received: int | None = None  # the first stop signal, once one came
        self._previous: dict[int, object] = {}

    @property
    def name(self) -> str | None:
        return signal.Signals(self.received).name if self.received is not None else None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None and signum == PARENT_DIED:
            return  # the kernel repeats it while the orphan is reparented (above); the stop is under way
        if self.received is not None:
            _say(f"{signal.Signals(signum).name} again: stopping at once; last.pt is the last one completed\n")
            raise StopNow(signum)
        self.received = signum
        # Only the flag is set here: the trainer logs and saves at the next step boundary.
        # (os.write, not logging: a handler may run while the logging stream is mid-write.)
        if signum == PARENT_DIED:
            why, again = " (the study that started this run has ended)", "SIGTERM"
        else:
            why, again = "", "it again"
        _say(
            f"{signal.Signals(signum).name} received{why}: finishing the current step, then writing last.pt "
            f"and stopping (send {again} to stop at once)\n"
        )


def ignore_stop_signals(worker_id: int | None = None) -> None:
    """In a DataLoader worker: ignore the stop signals (a terminal's Ctrl-C or SLURM signal them too);
    the main process stops the run and then ends its workers."""
    for signum in HANDLED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _say(text: str) -> None:
    try:
        os.write(sys.stderr.fileno(), text.encode())
    except (OSError, ValueError, AttributeError):  # no usable stderr (e.g. captured in a test)
        pass

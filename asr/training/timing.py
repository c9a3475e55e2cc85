"""The run's clock, and where a training loop's wall time goes.

:class:`RunClock` is the run's own clock: the seconds of training and validation so far, a resumed run's
earlier ones included (the pauses between resumes are not), which ``train.max_minutes`` ends the run by
and a learning-rate cooldown reads; with ``train.max_steps`` it says whether the run ends here.

Where the wall time goes: waiting for the loader's next batch, or everything else.

:class:`LoaderClock` wraps the loader of an epoch. Between two logged updates it reads the wall time per
update and the share of it the main process spent blocked in the loader (``time/seconds_per_update``,
``time/loader_wait`` in TensorBoard and ``train.log``). A share near 0 means the loader keeps ahead of
the model; a large one means more ``data.num_workers`` (or features on the device) would speed the run
up, whatever the model costs. The step reads its loss back each batch (``.item()``), so on a GPU the
time in the loader is not hidden behind queued kernels.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator


class RunClock:
    """Seconds of training and validation so far (``progress.seconds`` in every checkpoint), and the limits
    that end a run: ``max_steps`` updates, ``max_minutes`` on this clock. ``agree`` (several processes) takes a
    reading to the one every rank uses, the slowest rank's."""

    def __init__(self, max_steps: int | None = None, max_minutes: float | None = None,
                 agree: Callable[[float], float] | None = None):
        self.max_steps, self.max_minutes, self._agree = max_steps, max_minutes, agree
        self.ended_by: str | None = None  # the limit (train.max_steps or train.max_minutes) that ended the run
        self.start(0.0)

    def start(self, seconds: float) -> None:
        """Start the clock at ``seconds``: a resumed run continues its clock."""
        self._started, self._before = time.time(), seconds
        self.seconds = seconds  # as of the latest update (train.max_minutes only)

    def now(self) -> float:
        """The run's clock now, in seconds (a resumed run's earlier time included)."""
        return self._before + time.time() - self._started

    def read(self, progress) -> None:
        """Bring ``progress.seconds`` up to now: a run resumed from a checkpoint goes on from its time."""
        progress.seconds = self.now()

    def minutes(self) -> float:
        """Minutes of training and validation so far, as read after the latest update (train.max_minutes'
        check), so that every rank sees the same clock."""
        return self.seconds / 60.0

    def limit_reached(self, step: int) -> bool:
        """Whether train.max_steps or train.max_minutes ends the run after update ``step``; once it has, it
        stays ended. Every rank agrees (one any rank out of time stops them all after the same update)."""
        if self.ended_by is None and self.max_steps is not None and step >= self.max_steps:
            self.ended_by = f"train.max_steps={self.max_steps}"
        # The budget ends a run only once it has made an update: "after the first update past it", even on a
        # machine so busy that the budget is spent before the first batch arrives.
        if self.ended_by is None and self.max_minutes is not None and step > 0:
            seconds = self.now()
            if self._agree is not None:  # the slowest rank's clock, the same on every rank
                seconds = self._agree(seconds)
            self.seconds = seconds  # what the learning rate's cooldown reads until the next update
            if seconds >= self.max_minutes * 60:
                self.ended_by = f"train.max_minutes={self.max_minutes:g}"
        return self.ended_by is not None


class LoaderClock:
    """Wall time spent waiting for batches, against the time between two :meth:`read` calls."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self.restart()

    def restart(self) -> None:
        """Start a new interval (after a validation, say, whose time is no update's)."""
        self._since = self._clock()
        self._waited = 0.0
        self._updates = 0

    def batches(self, loader: Iterable) -> Iterator:
        """The loader's batches, timing each wait for the next one."""
        iterator = iter(loader)
        while True:
            asked = self._clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self._waited += self._clock() - asked
            yield batch

    def updated(self) -> None:
        """One optimiser update was made."""
        self._updates += 1

    def read(self) -> dict[str, float]:
        """``seconds_per_update`` and ``loader_wait`` (a share of the wall time, 0-1) since the last read or
        restart, then a new interval; empty when no update was made in it."""
        now = self._clock()
        elapsed, updates, waited = now - self._since, self._updates, self._waited
        self._since, self._waited, self._updates = now, 0.0, 0
        if updates == 0 or elapsed <= 0:
            return {}
        return {"seconds_per_update": elapsed / updates, "loader_wait": min(waited / elapsed, 1.0)}

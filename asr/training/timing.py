"""Where a training loop's wall time goes: waiting for the loader's next batch, or everything else.

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

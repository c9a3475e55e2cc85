"""Preparation work spread over processes, in order, with a progress bar.

Reading 28,539 audio headers or accumulating MVN statistics over 100 hours of
audio is the same loop over a list many times. :func:`map_chunks` cuts the
list into fixed chunks, hands them to ``jobs`` worker processes (a PyTorch
``DataLoader``, as the training loader uses: forked workers with one torch
thread each) and yields the chunks' results in list order, so the caller
combines them in the same order whatever the number of processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

Item = TypeVar("Item")
Result = TypeVar("Result")


def available_cores() -> int:
    """CPU cores this process may run on (the affinity mask, which a batch scheduler narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_jobs(jobs: int) -> int:
    """``data.prepare_jobs`` as a process count: 0 means one per available core."""
    if jobs < 0:
        raise ValueError(f"jobs must be >= 0, got {jobs}")
    return jobs or available_cores()


class _Chunks(Dataset):
    """Item i: ``function`` applied to chunk i."""

    def __init__(self, function: Callable[[list], object], chunks: list[list]):
        self.function = function
        self.chunks = chunks

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, index: int):
        return self.function(self.chunks[index])


def _as_is(result):
    """The loader's collate function: results come back as the function returned them."""
    return result


def map_chunks(
    function: Callable[[list[Item]], Result],
    items: Sequence[Item],
    jobs: int,
    chunk_size: int,
    desc: str,
    unit: str = "file",
) -> Iterator[Result]:
    """``function(chunk)`` for each chunk of ``items`` in order, the chunks run in up to ``jobs`` processes.

    ``jobs`` 1 (or a list of one chunk) runs in this process, with no process
    started; 0 means one process per core. The chunks depend on
    ``chunk_size`` alone, never on ``jobs``, so a caller that combines the
    results in order gets the same numbers from any number of processes. The
    results come as they are ready, so a caller that stops at the first
    problem (``data.strict``) stops the workers there too. A progress bar
    (``desc``, counted in ``unit``) goes to stderr when it is a terminal.
    ``function`` must be a module-level function (or a ``functools.partial``
    of one) where processes are spawned rather than forked.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    chunks = [list(items[i : i + chunk_size]) for i in range(0, len(items), chunk_size)]
    workers = min(resolve_jobs(jobs), len(chunks))
    if workers <= 1:
        results = map(function, chunks)
    else:
        # batch_size=None: one chunk per item; each worker keeps two chunks queued (prefetch_factor).
        # A private generator: the workers' seeds would otherwise be drawn from the global RNG, and
        # a run that prepares its data (rather than finding it cached) would train differently.
        results = DataLoader(
            _Chunks(function, chunks), batch_size=None, num_workers=workers, collate_fn=_as_is,
            generator=torch.Generator().manual_seed(0),
        )
    # disable=None: a bar on a terminal only; none at all for no items (an empty bar says nothing)
    with tqdm(total=len(items), desc=desc, unit=unit, disable=None if items else True, leave=False) as bar:
        for index, result in enumerate(results):
            bar.update(len(chunks[index]))
            yield result


def processes_used(jobs: int, items: int, chunk_size: int) -> int:
    """How many processes :func:`map_chunks` runs ``items`` in (1: this one), for the log."""
    return max(1, min(resolve_jobs(jobs), -(-items // chunk_size)))

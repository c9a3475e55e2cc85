"""CUDA-graph bookkeeping shared by the LN-LSTM's Triton backend and the speller.

A CUDA graph replays fixed launches on fixed buffers, so what varies between calls (batch,
frames) is padded to a few buckets (:func:`padded_batch`, :func:`padded_time`), inputs are
copied into a recording's buffers and outputs out of them, and recordings of one kind share a
memory pool (:class:`GraphCache` for the LN-LSTM's time loops; the speller keeps its own
recordings in :mod:`asr.models.speller_graphs`, built on the same pieces). When a capture
fails, :class:`CapturePolicy` decides what follows: one warning, and that kind of loop runs
eagerly for the rest of the process (a capture that failed once, e.g. under a debugger or a
profiler that forbids it, fails again). Every policy counts its recordings, so a run can
record whether CUDA graphs were used (:func:`report`).

Whether a model may record at all is its recipe's choice (``model.lnlstm_cuda_graphs``,
``model.speller_cuda_graphs``); a benchmark switches it with a command-line override
(``model.lnlstm_cuda_graphs=false``), which the run records.
"""

from __future__ import annotations

import collections
import math
import warnings
from collections.abc import Callable
from types import SimpleNamespace

import torch

class CapturePolicy:
    """What happens to one kind of recording (``what``) after a failed capture: warn once, and
    run that kind eagerly from then on (:attr:`enabled` False). Counts the recordings made."""

    def __init__(self, owner: str, what: str, switch: str) -> None:
        self.owner, self.what, self.switch = owner, what, switch
        self.enabled = True
        self.failure: str | None = None
        self.recorded = 0

    def give_up(self, exc: Exception, what: str | None = None) -> None:
        if self.failure is None:
            warnings.warn(
                f"{self.owner}: CUDA graph capture failed ({type(exc).__name__}: {exc}); running "
                f"{what or self.what} eagerly ({self.switch}: false skips the attempt)",
                RuntimeWarning,
                stacklevel=3,
            )
        self.enabled = False
        self.failure = f"{type(exc).__name__}: {exc}"


LNLSTM_POLICY = CapturePolicy("LNLSTM", "the time loops", "model.lnlstm_cuda_graphs")
SPELLER_POLICY = CapturePolicy("Speller", "the speller", "model.speller_cuda_graphs")


def report() -> dict[str, dict]:
    """Per kind: how many graphs were recorded in this process, and the capture failure if any."""
    return {
        name: {"recorded": policy.recorded, "failed": policy.failure}
        for name, policy in (("lnlstm", LNLSTM_POLICY), ("speller", SPELLER_POLICY))
    }


def warm_up(run: Callable, steps: int) -> None:
    """``run()`` ``steps`` times on a side stream before a capture, so that lazy initialisations
    (handles, workspaces, compiled kernels) happen outside it."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(steps):
            run()
    torch.cuda.synchronize()


def padded_time(time: int) -> int:
    """Round T up to a multiple of max(16, 2^(bit_length(T) - 4)): at most 1/8 more steps
    from T = 128 on, and about 8 buckets per doubling of T."""
    quantum = max(16, 1 << max(0, time.bit_length() - 4))
    return -(-time // quantum) * quantum


def padded_batch(batch: int) -> int:
    return -(-batch // 8) * 8


class GraphCache:
    """Recorded time loops of one kind (forward or backward), one per padded shape.

    All entries take their buffers from one arena, so they overwrite each
    other's: a caller copies its inputs in, runs, and copies its outputs out
    before anything else runs on the stream. When a shape needs a bigger arena,
    a new one is allocated and every recorded loop is dropped (they point into
    the old one); they are recorded again when next needed.
    """

    # Least recently used graphs beyond this (per device) are dropped. A training run
    # sees some dozens of padded shapes per kind (each listener layer has its own
    # length); below that number every epoch would record its graphs anew.
    capacity = 512

    def __init__(self) -> None:
        self.arenas: dict[torch.device, torch.Tensor] = {}
        self.entries: dict[torch.device, collections.OrderedDict] = {}
        self.pools: dict[torch.device, tuple] = {}

    def pool(self, device: torch.device) -> tuple:
        """The memory pool every recording of this kind on ``device`` shares. The recorded
        loops allocate nothing that outlives a replay (only scratch, such as cuBLAS's
        workspace), and replays never overlap (one stream), so they can share it: memory
        stays that of one recording, whatever the number of shapes. PyTorch frees a pool
        with the last graph that uses it, and its handle cannot be used again: see
        :meth:`_drop_pool_if_unused`."""
        if device not in self.pools:
            self.pools[device] = torch.cuda.graph_pool_handle()
        return self.pools[device]

    def buffers(self, key, specs: dict, device: torch.device) -> tuple[SimpleNamespace, object]:
        """The buffers of ``key`` (views into the arena) and its graph (None until recorded)."""
        entries = self.entries.setdefault(device, collections.OrderedDict())
        if key in entries:
            entries.move_to_end(key)
            return entries[key]
        needed = arena_bytes(specs)
        arena = self.arenas.get(device)
        if arena is None or arena.numel() < needed:
            entries.clear()
            self.arenas[device] = None  # free the old arena before allocating the new one
            # zeros: every buffer starts finite (padding regions are multiplied by zero gradients).
            # Never an inference tensor, which could not be written to outside inference mode later.
            with torch.inference_mode(False):
                arena = self.arenas[device] = torch.zeros(needed, dtype=torch.uint8, device=device)
        entries[key] = (carve(arena, specs), None)
        while len(entries) > self.capacity:
            entries.popitem(last=False)
        self._drop_pool_if_unused(device)
        return entries[key]

    def _drop_pool_if_unused(self, device: torch.device) -> None:
        """Forget the pool once no recorded graph holds it (PyTorch has freed it then);
        the next recording starts a new one."""
        if all(graph is None for _, graph in self.entries[device].values()):
            self.pools.pop(device, None)

    def set_graph(self, key, device: torch.device, graph) -> None:
        entries = self.entries[device]
        entries[key] = (entries[key][0], graph)


def _align(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def arena_bytes(specs: dict) -> int:
    return sum(_align(math.prod(shape) * dtype.itemsize) for shape, dtype in specs.values())


def carve(arena: torch.Tensor, specs: dict) -> SimpleNamespace:
    buffers, offset = {}, 0
    for name, (shape, dtype) in specs.items():
        nbytes = math.prod(shape) * dtype.itemsize
        buffers[name] = arena[offset : offset + nbytes].view(dtype).view(shape)
        offset += _align(nbytes)
    return SimpleNamespace(**buffers)


def run_recorded(
    cache: GraphCache, policy: CapturePolicy, key, specs: dict, fill: Callable, launch: Callable, device
) -> SimpleNamespace:
    """Fill the buffers of ``key`` and run its time loop: by replaying its CUDA graph, recording
    it first (after one eager run, which also compiles the kernels and gives this call's result)."""
    buffers, graph = cache.buffers(key, specs, device)
    fill(buffers)
    if graph is not None:
        graph.replay()
        return buffers
    if device.type != "cuda":
        launch(buffers)
        return buffers
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        launch(buffers)
    torch.cuda.current_stream(device).wait_stream(side)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=cache.pool(device), capture_error_mode="thread_local"):
            launch(buffers)
        cache.set_graph(key, device, graph)
        policy.recorded += 1
    except Exception as exc:  # noqa: BLE001 -- capture is not possible here: keep the eager loop (already run)
        policy.give_up(exc)
    return buffers

"""The speller on CUDA as recorded CUDA graphs: in training its whole loop over output steps,
forward and backward, in decoding one step; recorded once per padded shape and replayed.

Eagerly, each output step of :meth:`asr.models.speller.Speller.forward` launches a few dozen
small kernels (the embedding, the cells, the attention's energies, softmax and
context, the output layer), and their backward as many again; at the sizes of an
ASR speller the GPU waits for Python and autograd most of the time. Here the loop
(:meth:`Speller.teacher_forced`) is recorded as two CUDA graphs, its forward and its
backward (as :func:`torch.cuda.make_graphed_callables` does); a training step then
replays them, a launch each.

A graph has fixed shapes, so batch, listener frames and output steps are padded
to buckets (:func:`padded_shape`) and a few graphs serve a training run. The
padding changes no result: padded frames are masked out of the attention (they
get weight exactly 0, and the location filters see the zeros they would see past
the end of the utterance anyway), extra output steps come after every row's last
one (nothing flows back from them), and padded rows (one valid frame of zeros,
pad tokens) are sliced away. The eager loop on padded inputs is the reference:
:func:`padded_call` runs either.

Used by :meth:`Speller.forward` when :func:`teacher_forcing_applies`: CUDA tensors, training mode with
gradients, an attention that says it may be recorded (``LASAttention.recordable``: the content, dot and
location-aware ones without a window; not MoChA), one process (not under ``torch.distributed``), not disabled with
``model.speller_cuda_graphs: false``. Everything the graphs bake in is part of their
key: the padded shape, dtypes, the autocast state, the scheduled-sampling
probability and the parameters' storage (a model moved or rebuilt records anew).
A recording keeps its shape's saved activations, so a speller records at most
CAPACITY shapes or ``model.speller_cuda_graphs_memory`` of the GPU's memory; later new shapes
run eagerly. Padding, warm-up and the policy after a failed capture are
:mod:`asr.models.cuda_graphs`', shared with the LN-LSTM.
Dropout and scheduled sampling draw fresh random numbers at every replay (the
graphs use PyTorch's graph-safe generator), not the eager loop's numbers.

In inference (greedy and beam search) the loop is driven step by step from
outside, so there :meth:`Speller.step` replays one recorded step instead
(:func:`decoding_step`, used when :func:`decoding_applies`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from asr.models import cuda_graphs as graphs
from asr.models.cuda_graphs import padded_batch, padded_time
from asr.models.interface import STATIC_STATE_KEY

logger = logging.getLogger(__name__)

# A recording keeps what its shape's forward saved for the backward pass, so recordings
# add up: a speller records new shapes until it holds CAPACITY of them or its share of
# the GPU's memory (model.speller_cuda_graphs_memory), and runs shapes it meets after that eagerly.
CAPACITY = 64
WARMUP_STEPS = 2  # eager forward + backward runs before a recording (lazy initialisations)


def _enabled(speller) -> bool:
    """Whether this speller may record: its recipe's switch (``model.speller_cuda_graphs``), and no failed capture."""
    return speller.cuda_graphs and graphs.SPELLER_POLICY.enabled


def padded_tokens(steps: int) -> int:
    """Output steps rounded up to a multiple of 8."""
    return -(-steps // 8) * 8


def padded_shape(batch: int, frames: int, steps: int) -> tuple[int, int, int]:
    """(B, T, L) of a recording: B to a multiple of 8, T to :func:`padded_time`'s buckets
    (at most 1/8 more from T = 128 on), L to a multiple of 8."""
    return padded_batch(batch), padded_time(frames), padded_tokens(steps)


def padded_call(speller, decoder_input: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, run):
    """``run(decoder_input, keys, mask)`` on inputs padded to :func:`padded_shape`, with its
    log-probs and weights cut back to (B, L, V) and (B, L, T). Padding is differentiable
    (``F.pad``): gradients reach ``keys`` as if unpadded."""
    batch, steps = decoder_input.shape
    frames = keys.size(1)
    batch_p, frames_p, steps_p = padded_shape(batch, frames, steps)
    pad_id = speller.embedding.padding_idx if speller.embedding.padding_idx is not None else 0
    decoder_input = F.pad(decoder_input, (0, steps_p - steps, 0, batch_p - batch), value=pad_id)
    keys = F.pad(keys, (0, 0, 0, frames_p - frames, 0, batch_p - batch))
    mask = F.pad(mask, (0, frames_p - frames, 0, batch_p - batch), value=False)
    if batch_p > batch:
        mask[batch:, 0] = True  # attention needs a valid frame in every row
    log_probs, weights = run(decoder_input, keys, mask)
    return log_probs[:batch, :steps], weights[:batch, :steps, :frames]


def teacher_forcing_applies(speller, keys: torch.Tensor) -> bool:
    """Whether :meth:`Speller.forward` should replay recorded graphs for this call."""
    if not (keys.is_cuda and speller.training and torch.is_grad_enabled() and _enabled(speller)):
        return False
    if torch.cuda.is_current_stream_capturing():
        return False
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    # The content, dot and location-aware attentions without a window (not MoChA): LASAttention.recordable.
    return speller.attention.recordable


class _Recordings:
    """The recorded loops and steps of one speller, sharing one memory pool (they never run
    at the same time), up to CAPACITY of them or ``memory_share`` of the GPU's memory.

    Kept on the speller itself; a copy of the speller (``copy.deepcopy``, pickling)
    starts with none, since graphs point at the original's parameters.
    """

    def __init__(self, memory_share: float = 0.25) -> None:
        self.memory_share = memory_share
        self.entries: dict = {}
        self.pool = None
        self.bytes = 0  # memory the recordings hold (CUDA)
        self.full = False

    def __deepcopy__(self, memo) -> _Recordings:
        return _Recordings(self.memory_share)

    def __getstate__(self) -> dict:
        return _Recordings(self.memory_share).__dict__

    def get(self, key):
        return self.entries.get(key)

    def record(self, key, make: Callable, device: torch.device):
        """``make(pool)``, a new recording for ``key``, kept; or None once the recordings are full."""
        if self.full:
            return None
        cuda = device.type == "cuda"
        if cuda and self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        before = torch.cuda.memory_allocated(device) if cuda else 0
        recording = make(self.pool)
        if cuda:
            self.bytes += torch.cuda.memory_allocated(device) - before
        self.entries[key] = recording
        graphs.SPELLER_POLICY.recorded += 1
        limit = self.memory_share * torch.cuda.get_device_properties(device).total_memory if cuda else math.inf
        if len(self.entries) >= CAPACITY or self.bytes >= limit:
            self.full = True
            logger.info(
                "speller: %d shapes recorded as CUDA graphs (%.2f GiB); shapes not seen yet will run eagerly",
                len(self.entries), self.bytes / 2**30,
            )
        return recording


def _recordings(speller) -> _Recordings:
    return speller.__dict__.setdefault("_cuda_graphs", _Recordings(speller.cuda_graphs_memory))


def _baked_in(speller) -> tuple:
    """What every recording bakes in besides its shapes: the autocast state and the
    parameters' storage (a model moved or rebuilt records anew)."""
    autocast = torch.is_autocast_enabled("cuda")
    return (
        autocast, torch.get_autocast_dtype("cuda") if autocast else None,
        tuple(p.data_ptr() for p in speller.parameters()),
    )


def _key(speller, decoder_input, keys, mask) -> tuple:
    return (
        tuple(decoder_input.shape), tuple(keys.shape), keys.dtype, keys.requires_grad, keys.device,
        speller.sampling_probability, *_baked_in(speller),
    )


class _Recording:
    """The loop recorded for one padded shape: a forward graph and a backward graph over fixed
    input, output and gradient tensors (what :func:`torch.cuda.make_graphed_callables` does,
    here capturing in thread-local mode: a DataLoader's pin-memory thread allocating pinned
    memory during a global-mode capture invalidates it)."""

    def __init__(self, speller, decoder_input, keys, mask, pool) -> None:
        self.decoder_input = decoder_input.clone()
        # A leaf with this call's values: the recorded backward must stop at the keys.
        self.keys = keys.detach().clone().requires_grad_(keys.requires_grad)
        self.mask = mask.clone()
        self.params = tuple(p for p in speller.parameters() if p.requires_grad)
        wrt = ((self.keys,) if self.keys.requires_grad else ()) + self.params

        def loop():
            # Without autocast's cache of cast weights: a cast cached before the capture would be
            # left out of the graph, and replays after an optimizer step would use stale weights.
            with torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                                enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False):
                return speller.teacher_forced(self.decoder_input, self.keys, self.mask)

        def forward_and_backward() -> None:
            outputs = loop()
            torch.autograd.grad(outputs, wrt, [torch.zeros_like(o) for o in outputs], allow_unused=True)

        graphs.warm_up(forward_and_backward, WARMUP_STEPS)
        self.forward_graph = torch.cuda.CUDAGraph()
        self.backward_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.forward_graph, pool=pool, capture_error_mode="thread_local"):
            self.outputs = loop()
        self.grad_outputs = tuple(torch.zeros_like(o) for o in self.outputs)
        with torch.cuda.graph(self.backward_graph, pool=pool, capture_error_mode="thread_local"):
            self.grads = torch.autograd.grad(self.outputs, wrt, self.grad_outputs, allow_unused=True)

    def __call__(self, decoder_input, keys, mask):
        return _Replay.apply(self, decoder_input, keys, mask, *self.params)


class _Replay(torch.autograd.Function):
    """Copy the inputs in, replay the forward graph; in backward, copy the output gradients
    in and replay the backward graph."""

    @staticmethod
    def forward(ctx, recording: _Recording, decoder_input, keys, mask, *params):
        recording.decoder_input.copy_(decoder_input)
        recording.keys.detach().copy_(keys)
        recording.mask.copy_(mask)
        recording.forward_graph.replay()
        ctx.recording = recording
        # The outputs are the recording's tensors, overwritten by its next replay.
        return tuple(o.detach() for o in recording.outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outputs):
        recording = ctx.recording
        for static, grad in zip(recording.grad_outputs, grad_outputs):
            static.copy_(grad)
        recording.backward_graph.replay()
        grads = [g.detach() if g is not None else None for g in recording.grads]
        grad_keys = grads.pop(0) if recording.keys.requires_grad else None
        return (None, None, grad_keys, None, *grads)


def teacher_forced(speller, decoder_input: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor):
    """:meth:`Speller.forward` by replaying recorded graphs (see the module docstring).
    If recording fails, warns once and runs the eager loop from then on."""
    recordings = _recordings(speller)

    def run(decoder_input, keys, mask):
        key = ("teacher-forced", *_key(speller, decoder_input, keys, mask))
        graphed = recordings.get(key)
        if graphed is None:
            try:
                graphed = recordings.record(
                    key, lambda pool: _Recording(speller, decoder_input, keys, mask, pool), keys.device
                )
            except Exception as exc:  # noqa: BLE001 -- capture is not possible here: run eagerly
                graphs.SPELLER_POLICY.give_up(exc, "the teacher-forced loop")
                graphed = None
            if graphed is None:
                return speller.teacher_forced(decoder_input, keys, mask)
        return graphed(decoder_input, keys, mask)

    return padded_call(speller, decoder_input, keys, mask, run)


# --- decoding: one output step at a time --------------------------------------------------

def decoding_applies(speller, state: dict) -> bool:
    """Whether :meth:`Speller.step` should replay a recorded step: inference (eval mode, no
    gradients) on CUDA, an attention that may be recorded (the content, dot or location-aware one
    without a window: ``LASAttention.recordable``)."""
    if speller.training or torch.is_grad_enabled() or not _enabled(speller):
        return False
    keys = state[STATIC_STATE_KEY]["keys"]
    if not keys.is_cuda or torch.cuda.is_current_stream_capturing():
        return False
    return speller.attention.recordable


_SPELLER_ENTRIES = ("h", "c", "context", STATIC_STATE_KEY)  # every other entry of the state is the attention's
_LISTENER_ENTRIES = ("keys", "mask")  # every other entry of the static part is the attention's


def _padded_zeros(x: torch.Tensor, rows: int, frames: int, frame_dim: int | None) -> torch.Tensor:
    """Zeros shaped like ``x`` with ``rows`` rows and, along ``frame_dim`` (None: none), ``frames`` frames."""
    sizes = list(x.shape)
    sizes[0] = rows
    if frame_dim is not None:
        sizes[frame_dim] = frames
    return x.new_zeros(sizes)


def _region(rows: int, frames: int, frame_dim: int | None) -> tuple[slice, ...]:
    """The index of a call's first ``rows`` rows and ``frames`` frames (along ``frame_dim``) in a buffer."""
    if frame_dim is None:
        return (slice(0, rows),)
    return (slice(0, rows), *[slice(None)] * (frame_dim - 1), slice(0, frames))


class _StepRecording:
    """One output step recorded for N' hypotheses over T' listener frames (both padded).

    Its buffers hold the step's inputs: rows past a call's N and frames past its T are
    masked out (a valid first frame in each padded row, so the softmax is defined) and
    computed but never returned; rows do not interact, so stale values there change
    nothing. The listener part (keys, mask, the attention's static entries such as the
    projected keys) is copied in only when it changes, i.e. when utterances leave the batch.
    The attention's entries are padded along their frames (``LASAttention.frame_dims``).
    """

    def __init__(self, speller, state: dict, rows: int, frames: int, pool) -> None:
        self.speller = speller
        static = state[STATIC_STATE_KEY]
        self.frame_dims = speller.attention.frame_dims
        self.attended = [name for name in state if name not in _SPELLER_ENTRIES]  # "weights" among them
        self.static_attended = [name for name in static if name not in _LISTENER_ENTRIES]
        with torch.inference_mode(False):  # buffers any later call can write, in inference mode or not
            def buffer(x, *sizes):
                return x.new_zeros(*sizes)

            def padded(entries: dict, name: str) -> torch.Tensor:
                return _padded_zeros(entries[name], rows, frames, self.frame_dims.get(name))

            self.tokens = torch.full((rows,), speller.embedding.padding_idx or 0, dtype=torch.long,
                                     device=static["keys"].device)
            self.state = {
                "h": [buffer(h, rows, h.size(1)) for h in state["h"]],
                "c": [buffer(c, rows, c.size(1)) for c in state["c"]],
                "context": buffer(state["context"], rows, state["context"].size(1)),
                **{name: padded(state, name) for name in self.attended},
                STATIC_STATE_KEY: {
                    "keys": buffer(static["keys"], rows, frames, static["keys"].size(2)),
                    "mask": buffer(static["mask"], rows, frames),
                    **{name: padded(static, name) for name in self.static_attended},
                },
            }
        self.static_source = None
        self.copy_in(self.tokens[: len(state["h"][0])], state)  # a valid first input: pad tokens
        self.graph = None
        if self.tokens.is_cuda:
            graphs.warm_up(lambda: speller.eager_step(self.tokens, self.state), WARMUP_STEPS)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
                self.outputs = speller.eager_step(self.tokens, self.state)

    def copy_in(self, tokens: torch.Tensor, state: dict) -> None:
        rows, frames = state[STATIC_STATE_KEY]["keys"].shape[:2]
        self.tokens[: len(tokens)].copy_(tokens)
        for name in ("h", "c"):
            for target, value in zip(self.state[name], state[name]):
                target[:rows].copy_(value)
        self.state["context"][:rows].copy_(state["context"])
        for name in self.attended:
            self.state[name][_region(rows, frames, self.frame_dims.get(name))].copy_(state[name])
        static = state[STATIC_STATE_KEY]
        if static is not self.static_source:
            target = self.state[STATIC_STATE_KEY]
            target["keys"].zero_()
            target["keys"][:rows, :frames].copy_(static["keys"])
            for name in self.static_attended:
                target[name].zero_()
                target[name][_region(rows, frames, self.frame_dims.get(name))].copy_(static[name])
            target["mask"].fill_(False)
            target["mask"][:rows, :frames].copy_(static["mask"])
            target["mask"][rows:, 0] = True
            self.static_source = static

    def run(self, tokens: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """The step for ``tokens`` and ``state`` (N rows, T frames), as fresh tensors."""
        self.copy_in(tokens, state)
        if self.graph is None:  # off CUDA (nothing recorded): the step, run eagerly on the buffers
            self.outputs = self.speller.eager_step(self.tokens, self.state)
        else:
            self.graph.replay()
        rows, frames = state[STATIC_STATE_KEY]["keys"].shape[:2]
        log_probs, new = self.outputs
        return log_probs[:rows].clone(), dict(
            state,
            h=[h[:rows].clone() for h in new["h"]],
            c=[c[:rows].clone() for c in new["c"]],
            context=new["context"][:rows].clone(),
            **{name: new[name][_region(rows, frames, self.frame_dims.get(name))].clone() for name in self.attended},
        )


def decoding_step(speller, tokens: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
    """:meth:`Speller.step` by replaying a step recorded for the padded shape (rows to a
    multiple of 8, frames to :func:`padded_time`'s buckets). If recording fails, warns once
    and runs :meth:`Speller.eager_step` from then on."""
    recordings = _recordings(speller)
    static = state[STATIC_STATE_KEY]
    rows, frames = static["keys"].shape[:2]
    key = (
        "step", padded_batch(rows), padded_time(frames), static["keys"].device, static["keys"].dtype,
        state["h"][0].dtype, *_baked_in(speller),
    )
    recording = recordings.get(key)
    if recording is None:
        try:
            recording = recordings.record(
                key,
                lambda pool: _StepRecording(speller, state, padded_batch(rows), padded_time(frames), pool),
                static["keys"].device,
            )
        except Exception as exc:  # noqa: BLE001 -- capture is not possible here: run eagerly
            graphs.SPELLER_POLICY.give_up(exc, "the decoder")
            recording = None
        if recording is None:
            return speller.eager_step(tokens, state)
    return recording.run(tokens, state)

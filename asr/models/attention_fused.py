"""The fused C++ step of the additive and location-aware attention (``csrc/attention.cpp``).

One step of :class:`asr.models.attention.Attention` with one head, ``type`` ``content`` or
``location``, on CPU in float32 or float64: the energies, the softmax and the context in one pass
over each utterance's frames, and backward by hand from the saved ``tanh`` values. It computes what
the reference path (PyTorch ops under autograd) computes, to float rounding: the tests hold the two
to each other, values and gradients. The speller calls the attention once per output step, in
training and in decoding, so on a CPU this is where a LAS spends most of its time.

The operator is built with the LN-LSTM's (:mod:`asr.models.lnlstm.backends.cpp`: compiled on first
use and cached). ``model.attention.backend`` chooses: ``auto`` (the fused step wherever it applies
and builds, else the reference path), ``reference`` or ``cpp`` (an error where it cannot run).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

BACKENDS = ("auto", "reference", "cpp")
_FUSED_TYPES = ("content", "location")
_ran: set[str] = set()  # which paths have computed an attention step in this process


def applies(attention, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the fused step cannot compute ``attention`` on keys of ``device`` and ``dtype``; None where it
    can (the build aside)."""
    if attention.type not in _FUSED_TYPES:
        return f"type {attention.type!r} (only {' and '.join(_FUSED_TYPES)})"
    if attention.heads != 1:
        return f"{attention.heads} heads (only 1)"
    if torch.device(device).type != "cpu":
        return f"device {torch.device(device).type} (only cpu)"
    if dtype not in (torch.float32, torch.float64):
        return f"dtype {dtype} (only float32 and float64)"
    if torch.is_autocast_enabled("cpu"):
        return "CPU autocast"
    return None


def _operator(strict: bool):
    from asr.models.lnlstm.backends import cpp  # the build both operators share

    if cpp.load(strict) is None:
        return None
    return torch.ops.asr_attention


def chosen(attention, device: torch.device, dtype: torch.dtype) -> str:
    """``cpp`` or ``reference``: the path ``attention``'s backend setting takes for keys of ``device`` and
    ``dtype``. A named ``cpp`` that cannot run raises ValueError (RuntimeError where the operator does
    not build)."""
    backend = attention.config.backend
    if backend == "reference":
        return "reference"
    reason = applies(attention, device, dtype)
    if reason is not None:
        if backend == "cpp":
            raise ValueError(f"model.attention.backend: cpp cannot compute this attention: {reason}")
        return "reference"
    if _operator(strict=backend == "cpp") is None:
        return "reference"
    return "cpp"


def record(path: str) -> None:
    _ran.add(path)


def ran() -> list[str]:
    """The attention paths that have run in this process (``cpp``, ``reference``), sorted."""
    return sorted(_ran)


class Accumulator:
    """The gradients of the keys and projected keys over the steps of one teacher-forced loop.

    Every step reads the same keys, so autograd would give each step's backward a (B, T, H) and a
    (B, T, dim) gradient to fill and then add up: several passes over them per step. With an
    accumulator the steps add their projected keys' gradient into one buffer, keep their weights and
    context gradient (small) for the keys' gradient, and the loop's first step, whose backward runs
    after every other step's (each later step reads its outputs), returns both sums: the keys' one
    product of the weights and the context gradients. Make one per forward pass; backward once.
    """

    def __init__(self) -> None:
        self.steps = 0
        self.d_projected_keys: torch.Tensor | None = None
        self.weights: list[torch.Tensor] = []
        self.grad_contexts: list[torch.Tensor] = []

    def totals(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The projected keys' and the keys' gradients summed over the steps so far (None: none), and a
        fresh start."""
        d_keys = None
        if self.grad_contexts:
            weights = torch.stack(self.weights, 1)  # (B, steps, T)
            d_keys = torch.bmm(weights.transpose(1, 2), torch.stack(self.grad_contexts, 1))  # (B, T, H)
        d_projected_keys = self.d_projected_keys
        self.d_projected_keys, self.weights, self.grad_contexts = None, [], []
        return d_projected_keys, d_keys


class _FusedStep(torch.autograd.Function):
    """(scaling, save, accumulator, projected_keys (B, T, dim), keys (B, T, H), mask, allowed (B, T) bool,
    prev (B, T), query (B, dim), conv_w (C, width), loc_w (dim, C), v (dim), bias (B, T)) -> context (B, H),
    weights (B, T). prev, conv_w and loc_w are empty without location, bias empty without a prior;
    accumulator an :class:`Accumulator` or None."""

    @staticmethod
    def forward(ctx, scaling, save, accumulator, projected_keys, keys, mask, allowed, prev, query, conv_w, loc_w, v,
                bias):
        context, weights, gates, loc = torch.ops.asr_attention.forward(
            projected_keys, keys, mask, allowed, prev, query, conv_w, loc_w, v, bias, scaling, save
        )
        if save:
            ctx.save_for_backward(projected_keys, keys, mask, allowed, prev, conv_w, loc_w, v, bias, weights, gates, loc)
            ctx.accumulator = accumulator
            ctx.first = accumulator is not None and accumulator.steps == 0
            if accumulator is not None:
                accumulator.steps += 1
        ctx.scaling = scaling
        ctx.location = conv_w.numel() > 0
        ctx.has_bias = bias.numel() > 0
        return context, weights

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_context, grad_weights):
        projected_keys, keys, mask, allowed, prev, conv_w, loc_w, v, bias, weights, gates, loc = ctx.saved_tensors
        empty = keys.new_empty(0)
        accumulator = ctx.accumulator
        into = empty
        if accumulator is not None:
            if accumulator.d_projected_keys is None:
                accumulator.d_projected_keys = torch.zeros_like(projected_keys)
            into = accumulator.d_projected_keys
        d_pk, d_keys, d_prev, d_q, d_conv_w, d_loc_w, d_v, d_bias = torch.ops.asr_attention.backward(
            empty if grad_context is None else grad_context, empty if grad_weights is None else grad_weights,
            projected_keys, keys, mask, allowed, prev, conv_w, loc_w, v, bias, weights, gates, loc, ctx.scaling,
            into, accumulator is None,
        )
        if accumulator is not None:
            if grad_context is not None:
                accumulator.weights.append(weights)
                accumulator.grad_contexts.append(grad_context)
            d_pk, d_keys = accumulator.totals() if ctx.first else (None, None)
        if not ctx.location:
            d_prev = d_conv_w = d_loc_w = None
        return (None, None, None, d_pk, d_keys, None, None, d_prev, d_q, d_conv_w, d_loc_w, d_v,
                d_bias if ctx.has_bias else None)


def step(attention, query, keys, mask, prev_weights, projected_keys, attend, energy_bias, accumulator=None):
    """:meth:`Attention.forward <asr.models.attention.Attention.forward>` with the fused operator
    (same arguments; :func:`chosen` said ``cpp``): context (B, H), weights (B, 1, T). ``accumulator``:
    the loop's :class:`Accumulator`, or None (each step's backward returns its own gradients)."""
    batch, _, time, dim = projected_keys.shape
    empty = keys.new_empty(0)
    q = attention.query_proj(query)
    if attention.type == "location":
        if prev_weights is None:
            prev_weights = attention.initial_weights(mask, keys.dtype)
        prev = prev_weights.reshape(batch, time).contiguous()
        conv_w = attention.location_conv.weight.view(attention.config.conv_channels, -1)
        loc_w = attention.location_proj.weight
    else:
        prev = conv_w = loc_w = empty
    allowed = mask if attend is None else attend
    bias = empty if energy_bias is None else energy_bias.to(keys.dtype).contiguous()
    tensors = (projected_keys.reshape(batch, time, dim), keys.contiguous(), mask.contiguous(), allowed.contiguous(),
               prev, q, conv_w, loc_w, attention.energy.view(dim), bias)
    save = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    context, weights = _FusedStep.apply(float(attention.config.scaling), save, accumulator if save else None, *tensors)
    return context, weights.unsqueeze(1)

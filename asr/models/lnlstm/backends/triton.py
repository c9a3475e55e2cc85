"""The LN-LSTM's GPU path: fused Triton kernels, a hand-written backward, CUDA graphs.

:class:`asr.models.lnlstm.LNLSTM` calls :func:`fused_layer` for CUDA tensors
(and :class:`~asr.models.lnlstm.LNLSTMCell` calls :func:`cell_step`); it
computes the function of :mod:`asr.models.lnlstm` (its reference path is the
definition). With ``TRITON_INTERPRET=1`` set before the kernels are loaded the
same code runs on CPU tensors, which is how the tests check it without a GPU.

One layer (all directions), forward:

* Everything that does not depend on the recurrence is done for all frames
  and both directions at once, with PyTorch ops inside the layer's autograd
  Function (:func:`_input_gates`): ``LN_x(W_x x) + b`` is one GEMM against the
  directions' stacked ``W_x`` and one layer norm, giving the input gates ``gx``
  (B, T, D, 4H) in float32. The Function takes the layer as the C++ operator
  does (:data:`~asr.models.lnlstm.backends.LAYER_INPUTS`: x and W_x, not ``gx``).
* Per time step, two launches: one batched GEMM ``W_h h_{t-1}`` for all
  directions (``torch.bmm``, cuBLAS), then one Triton kernel
  (:func:`asr.models.lnlstm.backends.triton_kernels.lstm_forward_step`) that does LN_h over
  4H, the gates, the cell update, LN_c, the output and the length mask for
  every (direction, row). Row b of the backward direction reads frame
  ``length_b - 1 - step``, so it starts at its own last frame with no
  reversed copies of the input.
* The states of every step are kept (in training) for the backward pass.

Backward, written by hand (:class:`_Layer`):

* ``W_h h_{t-1}`` for all steps is recomputed as one GEMM (cheaper in memory
  than storing 4H-wide intermediates); then per step, in reverse, one Triton
  kernel (:func:`~asr.models.lnlstm.backends.triton_kernels.lstm_backward_step`) recomputes
  the step's pointwise math and back-propagates through LN_c, the cell, the
  gates and LN_h, accumulating the LN parameters' gradients per row; and one
  batched GEMM carries ``dL/dh`` through ``W_h`` to the step before.
* ``dL/dW_h`` is one GEMM over all steps at the end; ``dL/dgx`` goes back
  through LN_x (ATen's layer-norm backward) and ``W_x`` as GEMMs over all
  frames (:func:`_input_gates_backward`).

No Python per time step on CUDA: the whole time loop of a forward or backward
pass is captured once in a CUDA graph per padded shape and replayed. Batch
and time are padded to buckets (B to a multiple of 8, T to at most 1/8 more:
see :func:`padded_time`) so a few graphs serve a training run; the padding is
rows of length 0 and frames past every row's end, so it changes no result.
Graphs read and write fixed buffers, so each call copies its inputs in and its
outputs out; all graphs of one kind share one memory arena (sized by the
largest shape seen), so memory does not grow with the number of shapes.
Elsewhere (CPU under the interpreter, or with ``model.lnlstm_cuda_graphs: false``) the
same launches run eagerly on buffers of the exact shape.

Precision: under ``torch.autocast`` (bf16 or fp16) the recurrent GEMMs take
their operands in the autocast dtype, as the reference path's ``F.linear``
would: the states kept for them and for the backward pass are rounded to it,
and so is ``dL/d(W_h h)``. The input gates, the cell state, all pointwise
math, LN statistics, parameter-gradient accumulation and the outputs ``y``,
``h_n``, ``c_n`` are float32, as on the reference path. Without autocast
everything is float32. Parameters must be float32.

Like the C++ operator, the backward is not differentiable again (no double
backward); use the reference path for that.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from asr.models import cuda_graphs as graphs
from asr.models.lnlstm.backends.base import LAYER_INPUTS, Backend, layer_inputs

_lock = threading.Lock()
_kernels = None
_load_error: Exception | None = None
_device_errors: dict[str, Exception | None] = {}  # "cuda:0" -> error of the first compile-and-run, or None



# --- loading, and the decision whether this path can run ----------------------------


def load(strict: bool = False):
    """The kernels module (:mod:`asr.models.lnlstm.backends.triton_kernels`), importing triton on first call.

    strict=False: when triton is missing or the kernels cannot be defined, warn
    once and return None. strict=True: raise RuntimeError instead.
    """
    global _kernels, _load_error
    if _kernels is not None:
        return _kernels
    with _lock:
        if _kernels is None and _load_error is None:
            try:
                from asr.models.lnlstm.backends import triton_kernels

                _kernels = triton_kernels
            except Exception as exc:  # noqa: BLE001 -- ImportError, or whatever a broken triton install raises
                _load_error = exc
                if not strict:
                    warnings.warn(
                        f"LNLSTM: Triton is not usable ({exc}); using the slower PyTorch reference path",
                        RuntimeWarning,
                        stacklevel=4,
                    )
    if _kernels is None and strict:
        raise RuntimeError(f"LNLSTM: the Triton path needs triton, which could not be loaded: {_load_error}")
    return _kernels


def interpreting() -> bool:
    """True when the kernels were defined under ``TRITON_INTERPRET=1`` (then they run on CPU tensors)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(load(strict=True).lstm_forward_step, InterpretedFunction)


def usable(device: torch.device, strict: bool = False) -> bool:
    """Whether the Triton path runs on ``device``.

    CPU: only when :func:`interpreting`. CUDA: the kernels are compiled and run
    once on a tiny problem the first time a device is asked about; a failure
    warns once (strict=False) or raises (strict=True), and later calls answer
    False without trying again.
    """
    if load(strict) is None:
        return False
    if device.type == "cpu":
        if interpreting():
            return True
        if strict:
            raise RuntimeError(
                "LNLSTM: the Triton path runs CPU tensors only under Triton's interpreter: set "
                "TRITON_INTERPRET=1 before asr.models.lnlstm.backends.triton_kernels is imported (here the kernels "
                "were compiled for a GPU)"
            )
        return False
    if device.type != "cuda":
        if strict:
            raise RuntimeError(f"LNLSTM: the Triton path runs on CUDA devices, got {device}")
        return False
    name = str(torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device()))
    if name not in _device_errors:
        with _lock:
            if name not in _device_errors:
                try:
                    _probe(torch.device(name))
                    _device_errors[name] = None
                except Exception as exc:  # noqa: BLE001 -- a compile error, out of resources, a driver error
                    _device_errors[name] = exc
                    if not strict:
                        warnings.warn(
                            f"LNLSTM: the Triton kernels failed on {name} ({type(exc).__name__}: {exc}); "
                            "using the slower PyTorch reference path",
                            RuntimeWarning,
                            stacklevel=4,
                        )
    error = _device_errors[name]
    if error is not None and strict:
        raise RuntimeError(f"LNLSTM: the Triton kernels failed on {name}: {error}") from error
    return error is None


def _probe(device: torch.device) -> None:
    """Compile and run the kernels (forward and backward, layer and cell) on a tiny problem,
    in the variants training uses most: with and without layer norm, float32 and bf16 GEMMs."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(device)

    lengths = torch.tensor([3, 1], dtype=torch.int32, device=device)
    with torch.autocast(device.type, enabled=False):
        for layer_norm, gemm_dtype in ((True, torch.float32), (False, torch.float32), (True, torch.bfloat16)):
            config = _Config(hidden=4, layer_norm=layer_norm, forget_bias=1.0, eps=1e-5, gemm_dtype=gemm_dtype)
            params = (rand(2, 16, 4), rand(2, 16), rand(2, 16), rand(2, 4), rand(2, 4))[: 5 if layer_norm else 1]
            gx = rand(2, 3, 2, 16)
            out = _forward(gx, params, rand(2, 2, 4), rand(2, 2, 4), lengths, config, save=True, static=False)
            _backward(gx, params, lengths, out.h_saved, out.c_saved, rand(2, 3, 2, 4), rand(2, 2, 4),
                      rand(2, 2, 4), config, torch.float32, static=False)
            ln_params = params[1:] if layer_norm else (None,) * 4
            gh = rand(3, 16).to(gemm_dtype)
            _cell_forward(rand(3, 16), gh, rand(3, 4), ln_params, config)
            _cell_backward(rand(3, 16), gh, rand(3, 4), ln_params, rand(3, 4), rand(3, 4), config)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a kernel that faults reports it here


# --- shapes, launch sizes ----------------------------------------------------------


@dataclass(frozen=True)
class _Config:
    """What a kernel launch bakes in besides the buffers."""

    hidden: int
    layer_norm: bool
    forget_bias: float
    eps: float
    gemm_dtype: torch.dtype  # operand type of the recurrent GEMMs: float32, or the autocast type


def _launch_sizes(rows: int, hidden: int, device: torch.device) -> tuple[tuple[int], int, int, int]:
    """(grid, rows per program, BLOCK_H, warps) for ``rows`` (direction, batch) rows.
    Under the interpreter one program takes every row: its cost is per operation,
    not per element."""
    import triton

    block_h = triton.next_power_of_2(hidden)
    if device.type == "cpu":
        rows_per_program, warps = triton.next_power_of_2(rows), 4
    else:
        rows_per_program = max(1, min(triton.next_power_of_2(rows), 1024 // (4 * block_h)))
        warps = 4 if 4 * rows_per_program * block_h <= 2048 else 8
    return (triton.cdiv(rows, rows_per_program),), rows_per_program, block_h, warps


def _autocast_dtype(device: torch.device) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return torch.float32


# --- static buffers and CUDA graphs (the bookkeeping is asr.models.cuda_graphs') ---------

_FORWARD_LOOPS = graphs.GraphCache()
_BACKWARD_LOOPS = graphs.GraphCache()


def _static(device: torch.device, cuda_graphs: bool) -> bool:
    """Whether time loops run as recorded loops on shared, padded buffers: CUDA graphs, on a GPU only.
    (Off CUDA, :func:`asr.models.cuda_graphs.run_recorded` runs a loop eagerly on those buffers.)"""
    if device.type != "cuda":
        return False
    return cuda_graphs and graphs.LNLSTM_POLICY.enabled and not interpreting()


def _fresh(specs: dict, device: torch.device, **bound) -> SimpleNamespace:
    """Buffers of the exact shape for one eager run; ``bound`` tensors are used as they are."""
    buffers = {name: torch.empty(shape, dtype=dtype, device=device) for name, (shape, dtype) in specs.items()
               if name not in bound}
    return SimpleNamespace(**buffers, **bound)


# --- one layer: forward -------------------------------------------------------------


def _norm_gain_bias_specs(directions: int, hidden: int) -> dict:
    """Buffer specs of the recurrent and cell norms' gains and biases, shared by forward and backward."""
    return {
        "lnh_w": ((directions, 4 * hidden), torch.float32),
        "lnh_b": ((directions, 4 * hidden), torch.float32),
        "lnc_w": ((directions, hidden), torch.float32),
        "lnc_b": ((directions, hidden), torch.float32),
    }


def _forward_specs(directions, batch, time, config: _Config, save: bool) -> dict:
    hidden, gemm = config.hidden, config.gemm_dtype
    slots = time + 1 if save else 2  # all states for the backward pass, else two alternating
    specs = {
        "gx": ((batch, time, directions, 4 * hidden), torch.float32),
        "lengths": ((batch,), torch.int32),
        "w_h": ((directions, 4 * hidden, hidden), gemm),
        "h": ((directions, slots, batch, hidden), gemm),
        "c": ((directions, slots, batch, hidden), torch.float32),
        "gh": ((directions, batch, 4 * hidden), gemm),
        "y": ((batch, time, directions, hidden), torch.float32),
        "h_last": ((directions, batch, hidden), torch.float32),
    }
    if config.layer_norm:
        specs.update(_norm_gain_bias_specs(directions, hidden))
    return specs


def _ln_args(buffers, config: _Config) -> tuple:
    """LN parameter pointers for a launch; without layer norm any tensor will do (never read)."""
    if config.layer_norm:
        return buffers.lnh_w, buffers.lnh_b, buffers.lnc_w, buffers.lnc_b
    return (buffers.w_h,) * 4


def _forward_launches(buffers, config: _Config, directions: int, batch: int, time: int, save: bool) -> None:
    kernels = load(strict=True)
    rows = directions * batch
    grid, rows_per_program, block_h, warps = _launch_sizes(rows, config.hidden, buffers.gx.device)
    w_h_t = buffers.w_h.transpose(1, 2)
    gx, gh, y = buffers.gx, buffers.gh, buffers.y
    slots = buffers.h.size(1)
    for step in range(time):
        slot_in, slot_out = (step, step + 1) if save else (step % slots, (step + 1) % slots)
        h_in, h_out = buffers.h[:, slot_in], buffers.h[:, slot_out]
        c_in, c_out = buffers.c[:, slot_in], buffers.c[:, slot_out]
        torch.bmm(h_in, w_h_t, out=gh)
        kernels.lstm_forward_step[grid](
            gx, gx.stride(0), gx.stride(1), gx.stride(2),
            gh, gh.stride(0), gh.stride(1),
            h_in, c_in, h_out, c_out, h_in.stride(0), h_in.stride(1),
            y, y.stride(0), y.stride(1), y.stride(2),
            buffers.h_last,
            buffers.lengths, step, batch, rows,
            *_ln_args(buffers, config),
            config.forget_bias, config.eps,
            H=config.hidden, BLOCK_H=block_h, ROWS=rows_per_program,
            LAYER_NORM=config.layer_norm, SEQUENCE=True, num_warps=warps,
        )


def _forward(gx, params, h0, c0, lengths, config: _Config, save: bool, static: bool) -> SimpleNamespace:
    """One layer's time loop. gx (B, T, D, 4H) float32; params (w_h (D, 4H, H), and with layer
    norm lnh_w, lnh_b (D, 4H), lnc_w, lnc_b (D, H)); h0, c0 (D, B, H); lengths (B,) int32.

    Returns y (B, T, D, H), h_n, c_n (D, B, H), and with save the states before
    every step, h_saved, c_saved (D, T' + 1, B', H) (T', B' the padded sizes).
    """
    batch, time, directions, _ = gx.shape
    device = gx.device
    batch_padded, time_padded = (graphs.padded_batch(batch), graphs.padded_time(time)) if static else (batch, time)
    specs = _forward_specs(directions, batch_padded, time_padded, config, save)
    w_h, *ln = params

    def fill(buffers) -> None:
        if static:
            _copy_inputs(buffers, gx, lengths, params, config.layer_norm)
            buffers.h[:, 0, batch:].zero_()
            buffers.c[:, 0, batch:].zero_()
            buffers.h_last[:, batch:].zero_()
        buffers.h[:, 0, :batch].copy_(h0)
        buffers.c[:, 0, :batch].copy_(c0)
        buffers.h_last[:, :batch].copy_(h0)

    def launch(buffers) -> None:
        _forward_launches(buffers, config, directions, batch_padded, time_padded, save)

    if static:
        key = ("forward", device, directions, batch_padded, time_padded, config, save)
        buffers = graphs.run_recorded(_FORWARD_LOOPS, graphs.LNLSTM_POLICY, key, specs, fill, launch, device)
    else:
        bound = {"gx": gx, "lengths": lengths, "w_h": w_h.to(config.gemm_dtype)}
        if config.layer_norm:
            bound.update(zip(("lnh_w", "lnh_b", "lnc_w", "lnc_b"), ln))
        buffers = _fresh(specs, device, **bound)
        fill(buffers)
        launch(buffers)
    last = time_padded if save else time_padded % buffers.h.size(1)  # the slot holding the final state
    take = torch.clone if static else (lambda t: t)  # the shared buffers are overwritten by the next call
    return SimpleNamespace(
        y=take(buffers.y[:batch, :time]),
        h_n=buffers.h_last[:, :batch].clone(),
        c_n=buffers.c[:, last, :batch].clone(),
        h_saved=take(buffers.h) if save else None,
        c_saved=take(buffers.c) if save else None,
    )


# --- one layer: backward ------------------------------------------------------------


def _backward_specs(directions, batch, time, config: _Config) -> dict:
    hidden, gemm = config.hidden, config.gemm_dtype
    specs = {
        "gx": ((batch, time, directions, 4 * hidden), torch.float32),
        "lengths": ((batch,), torch.int32),
        "w_h": ((directions, 4 * hidden, hidden), gemm),
        "h": ((directions, time + 1, batch, hidden), gemm),
        "c": ((directions, time + 1, batch, hidden), torch.float32),
        "dy": ((batch, time, directions, hidden), torch.float32),
        "gh": ((directions, time, batch, 4 * hidden), gemm),
        "dgh": ((directions, time, batch, 4 * hidden), gemm),
        "dgx": ((batch, time, directions, 4 * hidden), torch.float32),
        "dh": ((directions, batch, hidden), gemm),
        "carry": ((directions, batch, hidden), torch.float32),
        "dc": ((directions, batch, hidden), torch.float32),
        "dh0": ((directions, batch, hidden), torch.float32),
        "dw_h": ((directions, 4 * hidden, hidden), gemm),
    }
    if config.layer_norm:
        specs.update(
            _norm_gain_bias_specs(directions, hidden),
            dlnh_w=((directions, batch, 4 * hidden), torch.float32),
            dlnh_b=((directions, batch, 4 * hidden), torch.float32),
            dlnc_w=((directions, batch, hidden), torch.float32),
            dlnc_b=((directions, batch, hidden), torch.float32),
        )
    return specs


def _backward_launches(buffers, config: _Config, directions: int, batch: int, time: int) -> None:
    kernels = load(strict=True)
    hidden = config.hidden
    rows = directions * batch
    grid, rows_per_program, block_h, warps = _launch_sizes(rows, hidden, buffers.gx.device)
    # The states before each step, (D, T * B, H): h is (D, T + 1, B, H), its last slot is h_n.
    h_steps = buffers.h.view(directions, (time + 1) * batch, hidden)[:, : time * batch]
    torch.bmm(h_steps, buffers.w_h.transpose(1, 2), out=buffers.gh.view(directions, time * batch, 4 * hidden))
    buffers.dh.zero_()
    if config.layer_norm:
        ln_grads = (buffers.dlnh_w, buffers.dlnh_b, buffers.dlnc_w, buffers.dlnc_b)
        for grad in ln_grads:
            grad.zero_()
    else:
        ln_grads = (buffers.carry,) * 4  # never written without layer norm
    gx, dgx, dy, dh = buffers.gx, buffers.dgx, buffers.dy, buffers.dh
    for step in reversed(range(time)):
        gh, dgh, c_prev = buffers.gh[:, step], buffers.dgh[:, step], buffers.c[:, step]
        kernels.lstm_backward_step[grid](
            gx, gx.stride(0), gx.stride(1), gx.stride(2),
            gh, gh.stride(0), gh.stride(1),
            c_prev, c_prev.stride(0), c_prev.stride(1),
            dh, dh.stride(0), dh.stride(1),
            buffers.carry, buffers.dc, buffers.dc,
            dy, dy.stride(0), dy.stride(1), dy.stride(2),
            dgx, dgx.stride(0), dgx.stride(1), dgx.stride(2),
            dgh, dgh.stride(0), dgh.stride(1),
            *ln_grads,
            buffers.lengths, step, batch, rows,
            *_ln_args(buffers, config),
            config.forget_bias, config.eps,
            H=hidden, BLOCK_H=block_h, ROWS=rows_per_program,
            LAYER_NORM=config.layer_norm, SEQUENCE=True, ACCUMULATE=True, num_warps=warps,
        )
        torch.bmm(dgh, buffers.w_h, out=dh)  # dL/dh_{t-1} through W_h, for the step before
    torch.add(dh, buffers.carry, out=buffers.dh0)
    torch.bmm(buffers.dgh.view(directions, time * batch, 4 * hidden).transpose(1, 2), h_steps, out=buffers.dw_h)


def _backward(gx, params, lengths, h_saved, c_saved, dy, dh_n, dc_n, config: _Config, h0_dtype, static: bool):
    """Gradients of one layer: dgx, (dw_h, dlnh_w, dlnh_b, dlnc_w, dlnc_b), dh0, dc0."""
    batch, time, directions, _ = gx.shape
    device = gx.device
    time_padded, batch_padded = h_saved.size(1) - 1, h_saved.size(2)  # as the forward ran
    specs = _backward_specs(directions, batch_padded, time_padded, config)
    w_h, *ln = params

    def fill(buffers) -> None:
        if static:
            _copy_inputs(buffers, gx, lengths, params, config.layer_norm)
            buffers.h.copy_(h_saved)
            buffers.c.copy_(c_saved)
            buffers.dy[:batch, :time].copy_(dy)
            buffers.carry[:, batch:].zero_()
            buffers.dc[:, batch:].zero_()
        buffers.carry[:, :batch].copy_(dh_n)
        buffers.dc[:, :batch].copy_(dc_n)

    def launch(buffers) -> None:
        _backward_launches(buffers, config, directions, batch_padded, time_padded)

    if static:
        key = ("backward", device, directions, batch_padded, time_padded, config)
        buffers = graphs.run_recorded(_BACKWARD_LOOPS, graphs.LNLSTM_POLICY, key, specs, fill, launch, device)
    else:
        bound = {"gx": gx, "lengths": lengths, "w_h": w_h.to(config.gemm_dtype), "h": h_saved, "c": c_saved,
                 "dy": dy.contiguous()}
        if config.layer_norm:
            bound.update(zip(("lnh_w", "lnh_b", "lnc_w", "lnc_b"), ln))
        buffers = _fresh(specs, device, **bound)
        fill(buffers)
        launch(buffers)
    take = torch.clone if static else (lambda t: t)
    grads = [buffers.dw_h.to(torch.float32, copy=True)]
    if config.layer_norm:
        grads += [buffers.dlnh_w.sum(1), buffers.dlnh_b.sum(1), buffers.dlnc_w.sum(1), buffers.dlnc_b.sum(1)]
    dh0 = buffers.dh0[:, :batch].to(h0_dtype, copy=True)
    dc0 = buffers.dc[:, :batch].clone()
    return take(buffers.dgx[:batch, :time]), grads, dh0, dc0


def _input_gates(x, w_x, bias, ln_x_gain, ln_x_bias, config: _Config):
    """The input gates LN_x(W_x x) + b (W_x x + b without layer norm) for every frame and direction,
    x (B, T, I) -> float32 (B, T, D, 4H), and what their backward needs: the projections W_x x and
    LN_x's means and inverse standard deviations (all None without layer norm). The projections are one
    GEMM over all frames, in the autocast type where autocast is on (as F.linear would run)."""
    batch, time = x.shape[:2]
    directions, gates = w_x.shape[:2]
    projection = torch.matmul(x.to(config.gemm_dtype), w_x.flatten(0, 1).to(config.gemm_dtype).t())
    projection = projection.float().view(batch, time, directions, gates)
    if not config.layer_norm:
        return projection + bias, (None, None, None)
    normalised, mean, rstd = torch.native_layer_norm(projection, (gates,), None, None, config.eps)
    return torch.addcmul(ln_x_bias + bias, normalised, ln_x_gain, out=normalised), (projection, mean, rstd)


def _input_gates_backward(dgx, x, w_x, ln_x_gain, saved, config: _Config, need_dx: bool, need_dw: bool):
    """Gradients of :func:`_input_gates` given dgx (B, T, D, 4H): dx, dW_x, db and, with layer norm,
    LN_x's gain and bias."""
    projection, mean, rstd = saved
    batch, time, directions, gates = dgx.shape
    dbias = dgx.sum((0, 1))
    ln_grads = ()
    if config.layer_norm:
        normalised = (projection - mean) * rstd
        ln_grads = ((dgx * normalised).sum((0, 1)), dbias)
        dprojection = torch.ops.aten.native_layer_norm_backward(
            dgx * ln_x_gain, projection, (gates,), mean, rstd, None, None, [True, False, False]
        )[0]
    else:
        dprojection = dgx
    dprojection = dprojection.reshape(batch * time, directions * gates).to(config.gemm_dtype)
    dx = dw_x = None
    if need_dx:
        dx = (dprojection @ w_x.flatten(0, 1).to(config.gemm_dtype)).view(batch, time, -1).to(x.dtype)
    if need_dw:
        flat_x = x.reshape(batch * time, -1).to(config.gemm_dtype)
        dw_x = (dprojection.t() @ flat_x).view(w_x.shape).to(w_x.dtype)
    return dx, dw_x, dbias, ln_grads


# _Layer.apply's arguments: the lengths, the state, the settings, then LAYER_INPUTS.
_ARGUMENTS = ("lengths", "h0", "c0", "config", "save", "static", *LAYER_INPUTS)


class _Layer(torch.autograd.Function):
    """The whole layer with the hand-written backward: (lengths, h0, c0, config, save, static, then
    :data:`~asr.models.lnlstm.backends.LAYER_INPUTS`: x, W_x, W_h, b and the LN_x, LN_h and LN_c gains
    and biases) -> (y, h_n, c_n). It takes what the C++ operator takes: the input side (the input gates
    of every frame, :func:`_input_gates`) is computed and differentiated here, the recurrence in the
    kernels."""

    @staticmethod
    def forward(ctx, lengths, h0, c0, config: _Config, save: bool, static: bool, x, w_x, w_h, bias,
                lnx_w, lnx_b, lnh_w, lnh_b, lnc_w, lnc_b):
        params = (w_h, lnh_w, lnh_b, lnc_w, lnc_b) if config.layer_norm else (w_h,)
        with torch.autocast(x.device.type, enabled=False):
            gx, input_saved = _input_gates(x, w_x, bias, lnx_w, lnx_b, config)
            gx = gx.contiguous()
            if not save:
                input_saved = None  # the projections are not needed: free them before the recurrence
            out = _forward(gx, params, h0, c0, lengths, config, save, static)
        if save:
            ctx.save_for_backward(gx, lengths, out.h_saved, out.c_saved, x, w_x, lnx_w, *input_saved, *params)
        ctx.config = config
        ctx.static = static
        ctx.h0_dtype = h0.dtype
        return out.y, out.h_n, out.c_n

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_n, dc_n):
        gx, lengths, h_saved, c_saved, x, w_x, lnx_w, projection, mean, rstd, *params = ctx.saved_tensors
        config = ctx.config
        need_dx, need_dw_x = (ctx.needs_input_grad[_ARGUMENTS.index(name)] for name in ("x", "weight_x"))
        with torch.autocast(gx.device.type, enabled=False):
            dgx, param_grads, dh0, dc0 = _backward(
                gx, params, lengths, h_saved, c_saved, dy, dh_n, dc_n, config, ctx.h0_dtype, ctx.static
            )
            dx, dw_x, dbias, ln_x_grads = _input_gates_backward(
                dgx, x, w_x, lnx_w, (projection, mean, rstd), config, need_dx, need_dw_x
            )
        dw_h, *ln_hc_grads = param_grads
        if not config.layer_norm:
            ln_x_grads, ln_hc_grads = (None, None), [None] * 4
        return (None, dh0, dc0, None, None, None, dx, dw_x, dw_h, dbias, *ln_x_grads, *ln_hc_grads)


def _copy_inputs(buffers, gx: torch.Tensor, lengths: torch.Tensor, params, layer_norm: bool) -> None:
    """Copy a call's inputs into a recording's padded buffers: gx and lengths (padding rows get
    length 0), W_h and, with LN, the LN_h and LN_c gains and biases."""
    batch, time = gx.shape[:2]
    w_h, *ln = params
    buffers.gx[:batch, :time].copy_(gx)
    buffers.lengths[batch:].zero_()
    buffers.lengths[:batch].copy_(lengths)
    buffers.w_h.copy_(w_h)
    if layer_norm:
        for name, value in zip(("lnh_w", "lnh_b", "lnc_w", "lnc_b"), ln):
            getattr(buffers, name).copy_(value)


def fused_layer(params, x: torch.Tensor, lengths: torch.Tensor | None, h0: torch.Tensor, c0: torch.Tensor,
                cuda_graphs: bool = True):
    """One layer, all directions, on the Triton path.

    params: the layer's :class:`~asr.models.lnlstm.parameters.LayerParameters`; x (B, T, I);
    lengths (B,) or None; h0, c0 (D, B, H); cuda_graphs: whether the time loops may be recorded.
    Returns y (B, T, D * H) zero at padding, h_n, c_n (D, B, H).
    """
    batch, time = x.shape[:2]
    spec = params.spec
    directions, hidden = params.directions, params.hidden_size
    if batch == 0 or time == 0:
        return x.new_zeros(batch, time, directions * hidden), h0, c0
    config = _Config(hidden, spec.layer_norm, spec.forget_bias, spec.eps, _autocast_dtype(x.device))
    if lengths is None:
        lengths = torch.full((batch,), time, dtype=torch.int32, device=x.device)
    else:
        lengths = lengths.to(device=x.device, dtype=torch.int32)
    inputs = layer_inputs(params, x)
    save = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (*inputs.values(), h0, c0)
    )
    static = _static(x.device, cuda_graphs)
    y, h_n, c_n = _Layer.apply(lengths, h0, c0, config, save, static, *(inputs[name] for name in LAYER_INPUTS))
    return y.view(batch, time, directions * hidden), h_n, c_n


# --- one step of a single cell (the speller's) ------------------------------------------


def _cell_launch_common(rows: int, config: _Config, device):
    grid, rows_per_program, block_h, warps = _launch_sizes(rows, config.hidden, device)
    meta = {"H": config.hidden, "BLOCK_H": block_h, "ROWS": rows_per_program, "LAYER_NORM": config.layer_norm,
            "SEQUENCE": False, "num_warps": warps}
    return grid, meta


def _cell_forward(gx, gh, c, ln_params, config: _Config):
    """gx, gh (N, 4H), c (N, H) contiguous -> h, c (N, H) float32."""
    rows, hidden = c.shape
    h_new = torch.empty(rows, hidden, dtype=torch.float32, device=c.device)
    c_new = torch.empty(rows, hidden, dtype=torch.float32, device=c.device)
    lnh = ln_params if config.layer_norm else (gx,) * 4
    grid, meta = _cell_launch_common(rows, config, c.device)
    load(strict=True).lstm_forward_step[grid](
        gx, gx.stride(0), 0, 0,
        gh, 0, gh.stride(0),
        c, c, h_new, c_new, 0, hidden,
        h_new, 0, 0, 0,
        h_new,
        c, 0, rows, rows,  # y, h_last, lengths: unused without SEQUENCE
        *lnh,
        config.forget_bias, config.eps,
        **meta,
    )
    return h_new, c_new


def _cell_backward(gx, gh, c, ln_params, dh, dc, config: _Config):
    """Gradients of one cell step: dgx, dgh, dc_prev and, with layer norm, the LN parameters'."""
    rows, hidden = c.shape
    dgx = torch.empty_like(gx)
    dgh = torch.empty_like(gh)
    dc_prev = torch.empty_like(c)
    if config.layer_norm:
        widths = (4 * hidden, 4 * hidden, hidden, hidden)
        per_row = [torch.empty(rows, n, dtype=torch.float32, device=c.device) for n in widths]
        lnh = ln_params
    else:
        per_row = [dc_prev] * 4  # never written
        lnh = (gx,) * 4
    grid, meta = _cell_launch_common(rows, config, c.device)
    load(strict=True).lstm_backward_step[grid](
        gx, gx.stride(0), 0, 0,
        gh, 0, gh.stride(0),
        c, 0, hidden,
        dh, 0, hidden,
        dh, dc, dc_prev,  # carry: unused without SEQUENCE
        dh, 0, 0, 0,
        dgx, dgx.stride(0), 0, 0,
        dgh, 0, dgh.stride(0),
        *per_row,
        c, 0, rows, rows,
        *lnh,
        config.forget_bias, config.eps,
        ACCUMULATE=False,
        **meta,
    )
    ln_grads = [g.sum(0) for g in per_row] if config.layer_norm else [None] * 4
    return dgx, dgh, dc_prev, ln_grads


class _CellStep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gx, gh, c, lnh_w, lnh_b, lnc_w, lnc_b, config: _Config):
        ln_params = (lnh_w, lnh_b, lnc_w, lnc_b)
        with torch.autocast(gx.device.type, enabled=False):
            h_new, c_new = _cell_forward(gx, gh, c, ln_params, config)
        ctx.save_for_backward(gx, gh, c, *(ln_params if config.layer_norm else ()))
        ctx.config = config
        return h_new, c_new

    @staticmethod
    @once_differentiable
    def backward(ctx, dh, dc):
        gx, gh, c, *ln_params = ctx.saved_tensors
        with torch.autocast(gx.device.type, enabled=False):
            dgx, dgh, dc_prev, ln_grads = _cell_backward(
                gx, gh, c, ln_params, dh.contiguous(), dc.contiguous(), ctx.config
            )
        return (dgx, dgh, dc_prev, *ln_grads, None)


def cell_step(cell, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`LNLSTMCell.forward <asr.models.lnlstm.LNLSTMCell.forward>` on the Triton path:
    x (N, I), h, c (N, H) -> h, c (N, H) float32.

    ``LN_x(W_x x) + b`` and ``W_h h`` are PyTorch ops (autograd); LN_h, the
    gates, the cell update, LN_c and the output are one kernel, with one
    kernel for their backward.
    """
    if x.size(0) == 0:  # no rows, nothing to launch
        return cell.recurrent_step(cell.input_gates(x), h, c)
    config = _Config(cell.hidden_size, cell.layer_norm, cell.forget_bias, cell.eps, _autocast_dtype(x.device))
    gx = cell.input_gates(x).float().contiguous()
    gh = F.linear(h, cell.weight_h).contiguous()
    if cell.layer_norm:
        ln_params = (cell.ln_h.weight, cell.ln_h.bias, cell.ln_c.weight, cell.ln_c.bias)
    else:
        ln_params = (None,) * 4
    return _CellStep.apply(gx, gh, c.contiguous(), *ln_params, config)


class TritonBackend(Backend):
    """The Triton kernels behind the backend contract: CUDA (CPU under the interpreter), float32
    parameters (autocast included), whole layers and the single step of a cell."""

    name = "triton"
    auto_devices = ("cuda",)

    def supports(self, spec, device, dtype, param_dtype, single_step) -> bool:
        return spec.fused_by(self.name) and param_dtype == torch.float32 and device.type in ("cuda", "cpu")

    def available(self, device, strict: bool = False) -> bool:
        return usable(device, strict)

    def layer(self, params, x, lengths, h0, c0, cuda_graphs: bool):
        return fused_layer(params, x, lengths, h0, c0, cuda_graphs)

    def cell_step(self, cell, x, h, c):
        return cell_step(cell, x, h, c)


BACKEND = TritonBackend()

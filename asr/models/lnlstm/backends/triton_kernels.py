"""Triton kernels of the LN-LSTM time step: forward and backward, each one launch.

Imported only by :mod:`asr.models.lnlstm_triton` (this module needs triton).
The equations are those of :mod:`asr.models.lnlstm`; see there. One program
handles ``ROWS`` rows of the flattened (direction, batch) index
``r = d * batch + b``; a row's 4H gate pre-activations are held as one
``(ROWS, BLOCK_H, 4)`` tile (unit k of gate g, gates in the order i, j, f, o,
at memory offset ``g * H + k``), so LN_h is one reduction over the flattened
tile and the gates are separated by ``tl.split`` (and put back together by
``tl.join``) without any reduction.

Two uses share the kernels, chosen by the ``SEQUENCE`` constexpr:

* ``SEQUENCE=True``: step ``step`` of a whole layer. Row (d, b) works on frame
  ``t = step`` (d = 0) or ``t = length_b - 1 - step`` (d = 1), so each row's
  backward direction starts at its own last frame; a row with ``step >=
  length_b`` is past its end: it keeps its state, its output at frame ``step``
  is zero, and its gradients pass through unchanged. Every (row, frame) of the
  outputs is written exactly once over the steps, so no buffer needs zeroing.
* ``SEQUENCE=False``: one step of a single cell (the speller's), every row valid.

All arithmetic is float32 whatever the storage types (bf16/fp16 operands are
widened on load, results rounded on store). Offsets are computed in int64 so
that buffers over 2^31 elements are addressed correctly.

The math avoids ``tl.sigmoid`` and library tanh: both are written with one
``exp`` of a non-positive argument, which never overflows and serves all four
gates of the tile at once; they run the same under ``TRITON_INTERPRET=1``
(numpy) as on a GPU.
Device-function calls are kept few: under the interpreter each one costs
about as much as a dozen operations.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # e <= 1, so 1 - e is exact for small |x| and nothing overflows.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0.0, t, -t)


@triton.jit
def _rows_and_frames(lengths_ptr, step, batch, num_rows, ROWS: tl.constexpr, SEQUENCE: tl.constexpr):
    """Rows of this program -> d, b, in range, valid, the frame a valid row works on,
    and the frame whose outputs the row writes (its own if valid, else ``step``)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    in_range = rows < num_rows
    # Rows past the end compute on row 0's parameters (their results are never
    # stored), so that every address formed stays inside the buffers.
    d = tl.where(in_range, rows // batch, 0)
    b = tl.where(in_range, rows % batch, 0)
    if SEQUENCE:
        length = tl.load(lengths_ptr + b, mask=in_range, other=0)
        valid = in_range & (step < length)
        frame = tl.where(d == 0, step, length - 1 - step)
        out_frame = tl.where(valid, frame, step)
    else:
        valid = in_range
        frame = rows * 0
        out_frame = frame
    return d.to(tl.int64), b.to(tl.int64), in_range, valid, frame.to(tl.int64), out_frame.to(tl.int64)


@triton.jit
def _cell_forward(
    gx, gh, c_prev, d, gates, units, cols, tile_ok, col_ok,
    lnh_w_ptr, lnh_b_ptr, lnc_w_ptr, lnc_b_ptr, forget_bias, eps,
    H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, LAYER_NORM: tl.constexpr,
):
    """The step's math on loaded tiles: gx, gh (ROWS, BLOCK_H, 4), c_prev (ROWS, BLOCK_H).

    Returns the gate activations i, j, f, o and c, tanh(LN_c(c)), h, each
    (ROWS, BLOCK_H), and what the backward needs of the norms: LN_h's
    normalised input and 1/std per row, LN_c's likewise (placeholders without
    layer norm).
    """
    col_ok2 = col_ok[None, :]
    if LAYER_NORM:
        mean = tl.sum(tl.reshape(gh, (ROWS, 4 * BLOCK_H)), axis=1) / (4 * H)
        centred = tl.where(tile_ok, gh - mean[:, None, None], 0.0)
        var = tl.sum(tl.reshape(centred * centred, (ROWS, 4 * BLOCK_H)), axis=1) / (4 * H)
        rstd_h = 1.0 / tl.sqrt(var + eps)
        gh_hat = centred * rstd_h[:, None, None]
        param = d[:, None, None] * (4 * H) + gates * H + units
        weight = tl.load(lnh_w_ptr + param, mask=tile_ok, other=0.0)
        bias = tl.load(lnh_b_ptr + param, mask=tile_ok, other=0.0)
        z = gx + gh_hat * weight + bias
    else:
        rstd_h = d * 0.0
        gh_hat = gh
        z = gx + gh
    # sigmoid for i, f (with the forget bias), o and tanh for j, from one exp over the
    # tile: with e = exp(-|u|), sigmoid(u) = 1 / (1 + e) (u >= 0) or e / (1 + e), and
    # tanh(z) = +-(1 - e) / (1 + e) with u = 2z. No argument of exp is positive.
    is_j = gates == 1
    u = tl.where(is_j, 2.0 * z, z + tl.where(gates == 2, forget_bias, 0.0))
    e = tl.exp(-tl.abs(u))
    r = 1.0 / (1.0 + e)
    act = tl.where(is_j, (1.0 - e) * r, tl.where(u >= 0.0, r, e * r))
    act = tl.where(is_j & (u < 0.0), -act, act)
    # (ROWS, BLOCK_H, 4) -> (.., 2, 2): the last axis splits gates 0, 2 (i, f) from 1, 3 (j, o).
    i_f, j_o = tl.split(tl.reshape(act, (ROWS, BLOCK_H, 2, 2)))
    i, f = tl.split(i_f)
    j, o = tl.split(j_o)
    c = c_prev * f + i * j
    if LAYER_NORM:
        mean_c = tl.sum(tl.where(col_ok2, c, 0.0), axis=1) / H
        centred_c = tl.where(col_ok2, c - mean_c[:, None], 0.0)
        rstd_c = 1.0 / tl.sqrt(tl.sum(centred_c * centred_c, axis=1) / H + eps)
        c_hat = centred_c * rstd_c[:, None]
        param_c = d[:, None] * H + cols[None, :]
        weight_c = tl.load(lnc_w_ptr + param_c, mask=col_ok2, other=0.0)
        bias_c = tl.load(lnc_b_ptr + param_c, mask=col_ok2, other=0.0)
        c_norm = c_hat * weight_c + bias_c
    else:
        rstd_c = rstd_h
        c_hat = c
        c_norm = c
    tanh_c = _tanh(c_norm)
    h = tanh_c * o
    return i, j, f, o, c, tanh_c, h, gh_hat, rstd_h, c_hat, rstd_c


@triton.jit(do_not_specialize=["step"])
def lstm_forward_step(
    gx_ptr, gx_sb, gx_st, gx_sd,            # input gates LN_x(W_x x) + b, element (b, frame, d, 4H)
    gh_ptr, gh_sd, gh_sb,                   # W_h h_{t-1} of this step, element (d, b, 4H)
    h_in_ptr, c_in_ptr, h_out_ptr, c_out_ptr, state_sd, state_sb,  # state (d, b, H) before / after
    y_ptr, y_sb, y_st, y_sd,                # output h, element (b, frame, d, H) (SEQUENCE only)
    h_last_ptr,                             # h at each row's last valid frame so far, (D, B, H) contiguous
                                            # float32, updated in place (SEQUENCE only)
    lengths_ptr, step, batch, num_rows,
    lnh_w_ptr, lnh_b_ptr, lnc_w_ptr, lnc_b_ptr,  # (D, 4H) and (D, H), contiguous
    forget_bias, eps,
    H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
    LAYER_NORM: tl.constexpr, SEQUENCE: tl.constexpr,
):
    d, b, in_range, valid, frame, out_frame = _rows_and_frames(lengths_ptr, step, batch, num_rows, ROWS, SEQUENCE)
    cols = tl.arange(0, BLOCK_H)
    units = cols[None, :, None]
    gates = tl.arange(0, 4)[None, None, :]
    col_ok = cols < H
    tile_ok = in_range[:, None, None] & (units < H) & (gates < 4)
    read_ok = valid[:, None, None] & (units < H) & (gates < 4)
    ok2 = in_range[:, None] & col_ok[None, :]

    gx_row = b * gx_sb + frame * gx_st + d * gx_sd
    gx = tl.load(gx_ptr + gx_row[:, None, None] + gates * H + units, mask=read_ok, other=0.0).to(tl.float32)
    gh_row = d * gh_sd + b * gh_sb
    gh = tl.load(gh_ptr + gh_row[:, None, None] + gates * H + units, mask=tile_ok, other=0.0).to(tl.float32)
    state = (d * state_sd + b * state_sb)[:, None] + cols[None, :]
    c_prev = tl.load(c_in_ptr + state, mask=ok2, other=0.0).to(tl.float32)

    _, _, _, _, c, _, h, _, _, _, _ = _cell_forward(
        gx, gh, c_prev, d, gates, units, cols, tile_ok, col_ok,
        lnh_w_ptr, lnh_b_ptr, lnc_w_ptr, lnc_b_ptr, forget_bias, eps, H, BLOCK_H, ROWS, LAYER_NORM,
    )
    if SEQUENCE:
        # Past its end a row keeps its state and outputs zeros.
        h_prev = tl.load(h_in_ptr + state, mask=ok2, other=0.0).to(tl.float32)
        keep = valid[:, None]
        h_new = tl.where(keep, h, h_prev)
        c_new = tl.where(keep, c, c_prev)
        y = (b * y_sb + out_frame * y_st + d * y_sd)[:, None] + cols[None, :]
        tl.store(y_ptr + y, tl.where(keep, h, 0.0), mask=ok2)
        # h_out may be rounded to the GEMM's operand type; h_n is taken from here, in float32.
        tl.store(h_last_ptr + (d * batch + b)[:, None] * H + cols[None, :], h, mask=ok2 & keep)
    else:
        h_new = h
        c_new = c
    tl.store(h_out_ptr + state, h_new, mask=ok2)
    tl.store(c_out_ptr + state, c_new, mask=ok2)


@triton.jit
def _ln_c_backward(
    d_norm_c, c_hat, rstd_c, d, b, batch, cols, col_ok2, ok2, keep,
    lnc_w_ptr, dlnc_w_ptr, dlnc_b_ptr, H: tl.constexpr, ACCUMULATE: tl.constexpr,
):
    """Backward of c_norm = LN_c(c) over the H cell units: dL/dc (ROWS, BLOCK_H), and the rows'
    gradients of LN_c's gain and bias stored (added, with ACCUMULATE) where valid."""
    param_c = d[:, None] * H + cols[None, :]
    weight_c = tl.load(lnc_w_ptr + param_c, mask=col_ok2, other=0.0)
    d_hat_c = d_norm_c * weight_c
    mean_d = tl.sum(d_hat_c, axis=1) / H
    mean_dx = tl.sum(d_hat_c * c_hat, axis=1) / H
    d_c = rstd_c[:, None] * (d_hat_c - mean_d[:, None] - c_hat * mean_dx[:, None])
    dlnc_w = tl.where(keep, d_norm_c * c_hat, 0.0)
    dlnc_b = tl.where(keep, d_norm_c, 0.0)
    rows_c = (d * batch + b)[:, None] * H + cols[None, :]
    if ACCUMULATE:
        dlnc_w += tl.load(dlnc_w_ptr + rows_c, mask=ok2, other=0.0)
        dlnc_b += tl.load(dlnc_b_ptr + rows_c, mask=ok2, other=0.0)
    tl.store(dlnc_w_ptr + rows_c, dlnc_w, mask=ok2)
    tl.store(dlnc_b_ptr + rows_c, dlnc_b, mask=ok2)
    return tl.where(col_ok2, d_c, 0.0)


@triton.jit
def _ln_h_backward(
    dz, gh_hat, rstd_h, d, b, batch, gates, units, tile_ok,
    lnh_w_ptr, dlnh_w_ptr, dlnh_b_ptr,
    H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, ACCUMULATE: tl.constexpr,
):
    """Backward of LN_h over the whole 4H gate vector: dL/d(W_h h) (ROWS, BLOCK_H, 4), and the rows'
    gradients of LN_h's gain and bias stored (added, with ACCUMULATE)."""
    param = d[:, None, None] * (4 * H) + gates * H + units
    weight = tl.load(lnh_w_ptr + param, mask=tile_ok, other=0.0)
    d_hat = dz * weight
    mean_d = tl.sum(tl.reshape(d_hat, (ROWS, 4 * BLOCK_H)), axis=1) / (4 * H)
    mean_dx = tl.sum(tl.reshape(d_hat * gh_hat, (ROWS, 4 * BLOCK_H)), axis=1) / (4 * H)
    dgh = rstd_h[:, None, None] * (d_hat - mean_d[:, None, None] - gh_hat * mean_dx[:, None, None])
    dlnh_w = dz * gh_hat
    dlnh_b = dz
    rows_h = (d * batch + b)[:, None, None] * (4 * H) + gates * H + units
    if ACCUMULATE:
        dlnh_w += tl.load(dlnh_w_ptr + rows_h, mask=tile_ok, other=0.0)
        dlnh_b += tl.load(dlnh_b_ptr + rows_h, mask=tile_ok, other=0.0)
    tl.store(dlnh_w_ptr + rows_h, dlnh_w, mask=tile_ok)
    tl.store(dlnh_b_ptr + rows_h, dlnh_b, mask=tile_ok)
    return tl.where(tile_ok, dgh, 0.0)


@triton.jit(do_not_specialize=["step"])
def lstm_backward_step(
    gx_ptr, gx_sb, gx_st, gx_sd,            # as in the forward
    gh_ptr, gh_sd, gh_sb,                   # W_h h_{t-1} of this step (recomputed), (d, b, 4H)
    c_in_ptr, c_sd, c_sb,                   # c_{t-1} of this step, (d, b, H)
    dh_ptr, state_sd, state_sb,             # dL/dh_t through W_h (SEQUENCE) or from outside (cell), (d, b, H);
                                            # carry and dc share its strides
    carry_ptr,                              # dL/dh_t passed through padded steps, updated in place (SEQUENCE only)
    dc_in_ptr, dc_out_ptr,                  # dL/dc_t in, dL/dc_{t-1} out (may be the same buffer)
    dy_ptr, dy_sb, dy_st, dy_sd,            # dL/dy, element (b, frame, d, H) (SEQUENCE only)
    dgx_ptr, dgx_sb, dgx_st, dgx_sd,        # out: dL/d input gates, like gx
    dgh_ptr, dgh_sd, dgh_sb,                # out: dL/d(W_h h_{t-1}), like gh
    dlnh_w_ptr, dlnh_b_ptr, dlnc_w_ptr, dlnc_b_ptr,  # per-row LN parameter gradients, (rows, 4H) and (rows, H)
    lengths_ptr, step, batch, num_rows,
    lnh_w_ptr, lnh_b_ptr, lnc_w_ptr, lnc_b_ptr,
    forget_bias, eps,
    H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
    LAYER_NORM: tl.constexpr, SEQUENCE: tl.constexpr, ACCUMULATE: tl.constexpr,
):
    d, b, in_range, valid, frame, out_frame = _rows_and_frames(lengths_ptr, step, batch, num_rows, ROWS, SEQUENCE)
    cols = tl.arange(0, BLOCK_H)
    units = cols[None, :, None]
    gates = tl.arange(0, 4)[None, None, :]
    col_ok = cols < H
    col_ok2 = col_ok[None, :]
    tile_ok = in_range[:, None, None] & (units < H) & (gates < 4)
    read_ok = valid[:, None, None] & (units < H) & (gates < 4)
    ok2 = in_range[:, None] & col_ok2
    keep = valid[:, None]

    # Recompute the forward step (cheaper than storing its 4H-wide intermediates).
    gx_row = b * gx_sb + frame * gx_st + d * gx_sd
    gx = tl.load(gx_ptr + gx_row[:, None, None] + gates * H + units, mask=read_ok, other=0.0).to(tl.float32)
    gh_row = d * gh_sd + b * gh_sb
    gh = tl.load(gh_ptr + gh_row[:, None, None] + gates * H + units, mask=tile_ok, other=0.0).to(tl.float32)
    c_prev = tl.load(c_in_ptr + (d * c_sd + b * c_sb)[:, None] + cols[None, :], mask=ok2, other=0.0)
    c_prev = c_prev.to(tl.float32)
    i, j, f, o, _, tanh_c, _, gh_hat, rstd_h, c_hat, rstd_c = _cell_forward(
        gx, gh, c_prev, d, gates, units, cols, tile_ok, col_ok,
        lnh_w_ptr, lnh_b_ptr, lnc_w_ptr, lnc_b_ptr, forget_bias, eps, H, BLOCK_H, ROWS, LAYER_NORM,
    )

    state = (d * state_sd + b * state_sb)[:, None] + cols[None, :]
    dh = tl.load(dh_ptr + state, mask=ok2, other=0.0).to(tl.float32)
    if SEQUENCE:
        dh += tl.load(carry_ptr + state, mask=ok2, other=0.0)
        dy = (b * dy_sb + frame * dy_st + d * dy_sd)[:, None] + cols[None, :]
        dh += tl.load(dy_ptr + dy, mask=keep & col_ok2, other=0.0).to(tl.float32)
    dc_next = tl.load(dc_in_ptr + state, mask=ok2, other=0.0).to(tl.float32)

    # h = tanh(LN_c(c)) * o
    d_o = dh * tanh_c * o * (1.0 - o)
    d_norm_c = dh * o * (1.0 - tanh_c * tanh_c)
    if LAYER_NORM:
        dc = dc_next + _ln_c_backward(
            d_norm_c, c_hat, rstd_c, d, b, batch, cols, col_ok2, ok2, keep,
            lnc_w_ptr, dlnc_w_ptr, dlnc_b_ptr, H, ACCUMULATE,
        )
    else:
        dc = dc_next + d_norm_c
    # c = c_prev * f + i * j
    d_i = dc * j * i * (1.0 - i)
    d_j = dc * i * (1.0 - j * j)
    d_f = dc * c_prev * f * (1.0 - f)
    # The inverse of the split in _cell_forward: back to (ROWS, BLOCK_H, 4), gates i, j, f, o.
    dz = tl.reshape(tl.join(tl.join(d_i, d_f), tl.join(d_j, d_o)), (ROWS, BLOCK_H, 4))
    dz = tl.where(read_ok, dz, 0.0)
    if LAYER_NORM:
        dgh = _ln_h_backward(
            dz, gh_hat, rstd_h, d, b, batch, gates, units, tile_ok,
            lnh_w_ptr, dlnh_w_ptr, dlnh_b_ptr, H, BLOCK_H, ROWS, ACCUMULATE,
        )
    else:
        dgh = dz
    # Every (row, frame) of dgx is written once over the steps: zeros past a row's end.
    dgx = (b * dgx_sb + out_frame * dgx_st + d * dgx_sd)[:, None, None] + gates * H + units
    tl.store(dgx_ptr + dgx, dz, mask=tile_ok)
    tl.store(dgh_ptr + (d * dgh_sd + b * dgh_sb)[:, None, None] + gates * H + units, dgh, mask=tile_ok)
    tl.store(dc_out_ptr + state, tl.where(keep, dc * f, dc_next), mask=ok2)
    if SEQUENCE:
        # A row past its end passes dL/dh on to the step before; a valid row's goes through W_h (dgh).
        tl.store(carry_ptr + state, tl.where(keep, 0.0, dh), mask=ok2)

"""The LN-LSTM's reference path: a PyTorch loop over time, the definition every backend must match.

It works on every device, dtype and variant (each step is the cell's own
:meth:`~asr.models.lnlstm.cells.LNLSTMCell.recurrent_step`), and it is what gradcheck and the
conformance tests (tests/lnlstm/) pin down.
"""

from __future__ import annotations

import torch

from asr.models.common import lengths_to_mask


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each row of x (B, T, D) within its own length; padding stays in place.

    Row b's frames ``0 .. len_b - 1`` become ``len_b - 1 .. 0``; frames
    ``len_b ..`` are untouched. Applying it twice is the identity.
    """
    batch, time = x.shape[:2]
    t = torch.arange(time, device=x.device).unsqueeze(0).expand(batch, time)
    lengths = lengths.to(x.device).unsqueeze(1)
    index = torch.where(t < lengths, lengths - 1 - t, t)
    return x.gather(1, index.unsqueeze(-1).expand_as(x))


def reference_direction(
    cell,
    x: torch.Tensor,
    mask: torch.Tensor | None,
    h: torch.Tensor,
    c: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run one direction forwards in time: x (B, T, I), mask (B, T) bool (True =
    valid) or None -> y (B, T, H) zero at padding, final h, c (B, H).

    Rows past their length keep their state, so the final state is the one at
    each row's own last valid frame.
    """
    input_gates = cell.input_gates(x)
    outputs = []
    # unbind (not x[:, t]) keeps backward fast: indexing in the loop makes
    # autograd scatter into a full-size gradient at every step.
    steps = input_gates.unbind(1)
    valid_steps = mask.unsqueeze(-1).unbind(1) if mask is not None else [None] * len(steps)
    for gates_t, valid in zip(steps, valid_steps):
        h_new, c_new = cell.recurrent_step(gates_t, h, c)
        if valid is None:
            h, c = h_new, c_new
            outputs.append(h_new)
        else:
            h = torch.where(valid, h_new, h)
            c = torch.where(valid, c_new, c)
            outputs.append(torch.where(valid, h_new, torch.zeros_like(h_new)))
    if not outputs:
        return x.new_zeros(x.size(0), 0, cell.hidden_size), h, c
    return torch.stack(outputs, 1), h, c


def reference_layer(
    cells: list,
    x: torch.Tensor,
    lengths: torch.Tensor | None,
    h0: torch.Tensor,
    c0: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer, all directions: x (B, T, I), h0, c0 (D, B, H) ->
    y (B, T, D * H), h_n, c_n (D, B, H)."""
    mask = None if lengths is None else lengths_to_mask(lengths.to(x.device), x.size(1))
    outputs, h_last, c_last = [], [], []
    for direction, cell in enumerate(cells):
        reverse = direction == 1
        if reverse:
            x_dir = x.flip(1) if lengths is None else reverse_padded(x, lengths)
        else:
            x_dir = x
        y, h, c = reference_direction(cell, x_dir, mask, h0[direction], c0[direction])
        if reverse:
            y = y.flip(1) if lengths is None else reverse_padded(y, lengths)
        outputs.append(y)
        h_last.append(h)
        c_last.append(c)
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, -1)
    return out, torch.stack(h_last), torch.stack(c_last)

"""Layer-normalised LSTM (Ba, Kiros & Hinton 2016, "Layer Normalization", sec. 3.1).

One step, per direction and layer::

    gates = LN_x(W_x x_t) + LN_h(W_h h_{t-1}) + b        ; i, j, f, o = split(gates)
    c_t   = c_{t-1} * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)
    h_t   = tanh(LN_c(c_t)) * sigmoid(o)

* Each LN has its own gain (init 1) and bias (init 0), uses the biased variance
  and ``eps`` inside the square root. ``LN_x`` and ``LN_h`` normalise over the
  whole 4H gate vector (not per gate), ``LN_c`` over the H cell units.
* **The un-normalised cell c_t is carried to the next step**; ``LN_c`` only feeds
  the output. Several public implementations carry ``LN_c(c_t)`` instead, which
  changes the recurrence (the cell can no longer grow to count/integrate) and
  is not what the paper writes.
* The variance is computed from mean-subtracted values (never as
  ``E[x^2] - E[x]^2``), so constant inputs (zero variance) and inputs scaled by
  1e4 or 1e-4 stay finite; a well-known TensorFlow LN-LSTM cell produced NaN there.
* Gate order inside every 4H vector is ``i, j, f, o`` (input gate, candidate,
  forget gate, output gate). ``torch.nn.LSTM`` uses ``i, f, g, o``; convert with
  :func:`load_from_torch_lstm`.
* ``layer_norm=False`` gives a plain LSTM: ``gates = W_x x_t + W_h h_{t-1} + b``
  and ``h_t = tanh(c_t) * sigmoid(o)``; ``b`` plays the role of nn.LSTM's
  ``b_ih + b_hh``.

Two implementations compute the same function:

* the reference PyTorch path (:func:`_reference_direction`): a loop over time,
  works on every device and is what gradcheck and the equivalence tests pin down;
* a fused C++ operator for CPU (``asr/models/csrc/lnlstm.cpp``, loaded by
  :mod:`asr.models.lnlstm_ext`), JIT-compiled for this CPU on first use and
  cached; its speed against torch.nn.LSTM is in docs/performance.md. It is used for CPU float32/float64 tensors when
  it builds; otherwise the reference path runs (with one warning).
  ``ASR_LNLSTM_IMPL=python`` (environment) or ``set_implementation("python")``
  forces the reference path;
* for CUDA tensors, fused Triton kernels (:mod:`asr.models.lnlstm_triton`): one
  fused kernel per time step and a hand-written backward, the time loop
  replayed as a CUDA graph. Used for float32 parameters (autocast included)
  when Triton compiles; otherwise the reference path runs (with one warning).
  ``set_implementation("triton")`` forces it, and with ``TRITON_INTERPRET=1``
  it also runs CPU tensors (slowly: that is for testing). The single-step
  :meth:`LNLSTMCell.forward` (the speller's) uses the same kernels.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from asr.models import lnlstm_ext, lnlstm_triton
from asr.models.common import lengths_to_mask

_IMPLEMENTATIONS = ("auto", "python", "cpp", "triton")
# "auto": fused C++ on CPU when it builds, Triton on CUDA when it compiles, else
# reference; "python": always the reference path; "cpp": fused C++ on CPU,
# raising if it cannot be built; "triton": the Triton kernels (CUDA, or CPU
# under TRITON_INTERPRET=1), raising if they cannot run.
_implementation = os.environ.get("ASR_LNLSTM_IMPL", "auto")


def set_implementation(name: str) -> None:
    """Choose the LNLSTM implementation: ``"auto"`` (default), ``"python"``, ``"cpp"`` or ``"triton"``.

    The environment variable ``ASR_LNLSTM_IMPL`` sets the initial value.
    """
    global _implementation
    if name not in _IMPLEMENTATIONS:
        raise ValueError(
            f"LNLSTM implementation (set_implementation / ASR_LNLSTM_IMPL) must be one of "
            f"{_IMPLEMENTATIONS}, got {name!r}"
        )
    _implementation = name


def get_implementation() -> str:
    """The current implementation switch (see :func:`set_implementation`)."""
    if _implementation not in _IMPLEMENTATIONS:
        raise ValueError(f"ASR_LNLSTM_IMPL must be one of {_IMPLEMENTATIONS}, got {_implementation!r}")
    return _implementation


def _use_triton(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the Triton path runs for input x: forced by "triton", or "auto" with a CUDA
    tensor. It takes float32 parameters only (under autocast too); other parameter
    dtypes use the reference path, as the C++ operator does for dtypes it lacks."""
    implementation = get_implementation()
    if weight.dtype != torch.float32:
        return False
    if implementation == "triton":
        return lnlstm_triton.usable(x.device, strict=True)
    return implementation == "auto" and x.device.type == "cuda" and lnlstm_triton.usable(x.device)


class LNLSTMCell(nn.Module):
    """One step of the (layer-normalised) LSTM; also holds one direction's parameters.

    Args:
        input_size: I, size of x_t.
        hidden_size: H, size of h_t and c_t.
        layer_norm: apply LN_x, LN_h, LN_c as in the module docstring; False gives
            a plain LSTM.
        forget_bias: added to the forget-gate pre-activation, so a fresh cell
            starts by remembering (1.0 as in TensorFlow's LSTM cells; use 0.0 to
            match torch.nn.LSTM, which has none).
        eps: epsilon of the three layer norms.

    Parameters: ``weight_x`` (4H, I), ``weight_h`` (4H, H), ``bias`` (4H,), gate
    order ``i, j, f, o``; with layer_norm, ``ln_x`` and ``ln_h`` (nn.LayerNorm over
    4H) and ``ln_c`` (nn.LayerNorm over H).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        layer_norm: bool = True,
        forget_bias: float = 1.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if input_size <= 0 or hidden_size <= 0:
            raise ValueError(f"input_size and hidden_size must be positive, got {input_size}, {hidden_size}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.layer_norm = layer_norm
        self.forget_bias = float(forget_bias)
        self.eps = float(eps)
        self.weight_x = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_h = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.empty(4 * hidden_size))
        if layer_norm:
            self.ln_x = nn.LayerNorm(4 * hidden_size, eps=eps)
            self.ln_h = nn.LayerNorm(4 * hidden_size, eps=eps)
            self.ln_c = nn.LayerNorm(hidden_size, eps=eps)
        else:
            self.register_module("ln_x", None)
            self.register_module("ln_h", None)
            self.register_module("ln_c", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Same init as nn.LSTM, so the plain variant trains like it. The gate
        # bias must not start at 0: with b = 0 (and LN biases 0) an all-zero
        # input keeps h = c = 0 forever, every LN then sees zero variance, and
        # back-propagation through time gains 1/sqrt(eps) twice per step (inf
        # in float32 within ~10 steps). A random b breaks that fixed point.
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in (self.weight_x, self.weight_h, self.bias):
            nn.init.uniform_(weight, -bound, bound)
        if self.layer_norm:
            for ln in (self.ln_x, self.ln_h, self.ln_c):
                ln.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, layer_norm={self.layer_norm}, "
            f"forget_bias={self.forget_bias}, eps={self.eps}"
        )

    def input_gates(self, x: torch.Tensor) -> torch.Tensor:
        """``LN_x(W_x x) + b`` for any leading shape: x (..., I) -> (..., 4H).

        It does not depend on the recurrence, so the sequence path computes it
        for all time steps at once.
        """
        gates = F.linear(x, self.weight_x)
        if self.layer_norm:
            gates = self.ln_x(gates)
        return gates + self.bias

    def recurrent_step(
        self, input_gates: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from precomputed input gates (B, 4H) and state (B, H) -> (h, c)."""
        gates_h = F.linear(h, self.weight_h)
        if self.layer_norm:
            gates_h = self.ln_h(gates_h)
        i, j, f, o = (input_gates + gates_h).chunk(4, dim=-1)
        c = c * torch.sigmoid(f + self.forget_bias) + torch.sigmoid(i) * torch.tanh(j)
        c_out = self.ln_c(c) if self.layer_norm else c
        h = torch.tanh(c_out) * torch.sigmoid(o)
        return h, c

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, I), state (h, c) each (B, H) or None for zeros -> (h, c) each (B, H).

        c is the un-normalised cell, to be passed back in as state.
        """
        if x.dim() != 2 or x.size(1) != self.input_size:
            raise ValueError(f"LNLSTMCell expects x of shape (B, {self.input_size}), got {tuple(x.shape)}")
        if state is None:
            zeros = x.new_zeros(x.size(0), self.hidden_size)
            state = (zeros, zeros)
        h, c = state
        if _use_triton(x, self.weight_h):
            return lnlstm_triton.cell_step(self, x, h, c)
        return self.recurrent_step(self.input_gates(x), h, c)


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


def _reference_direction(
    cell: LNLSTMCell,
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


class LNLSTM(nn.Module):
    """Multi-layer, optionally bidirectional (layer-normalised) LSTM, batch-first.

    Drop-in shaped like ``torch.nn.LSTM(batch_first=True)`` but with lengths:

    Args:
        input_size: I, feature size of x.
        hidden_size: H per direction.
        num_layers: stacked layers; layer l > 0 reads the previous layer's
            (B, T, H * directions) output.
        bidirectional: add a backward direction; each row's backward pass starts
            at its own last valid frame, not at the padding.
        layer_norm: the LN-LSTM of the module docstring; False is a plain LSTM.
        dropout: dropout on every layer's output except the last (as nn.LSTM),
            only in training mode.
        forget_bias: added to the forget-gate pre-activation (0.0 matches nn.LSTM).
        eps: epsilon of every layer norm.

    ``cells[layer * directions + d]`` is the :class:`LNLSTMCell` holding layer
    ``layer``, direction ``d`` (0 forward, 1 backward) -- the same order as
    nn.LSTM's ``h_n``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bidirectional: bool = False,
        layer_norm: bool = True,
        dropout: float = 0.0,
        forget_bias: float = 1.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.layer_norm = layer_norm
        self.dropout = float(dropout)
        self.forget_bias = float(forget_bias)
        self.eps = float(eps)
        self.cells = nn.ModuleList(
            LNLSTMCell(
                input_size if layer == 0 else hidden_size * self.num_directions,
                hidden_size,
                layer_norm=layer_norm,
                forget_bias=forget_bias,
                eps=eps,
            )
            for layer in range(num_layers)
            for _ in range(self.num_directions)
        )

    @property
    def output_size(self) -> int:
        """Feature size of the output y: H * directions."""
        return self.hidden_size * self.num_directions

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
            f"bidirectional={self.bidirectional}, layer_norm={self.layer_norm}, "
            f"dropout={self.dropout}, forget_bias={self.forget_bias}, eps={self.eps}"
        )

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor | None = None,
        state: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, T, I); lengths (B,) integers on CPU or x's device, or None for all T;
        state (h_0, c_0) each (num_layers * directions, B, H) or None for zeros.

        Returns y (B, T, H * directions), zero at padded positions, and
        (h_n, c_n) each (num_layers * directions, B, H), taken at each row's own
        last valid frame (the backward direction's at frame 0). c_n is the
        un-normalised cell.
        """
        if x.dim() != 3 or x.size(2) != self.input_size:
            raise ValueError(f"LNLSTM expects x of shape (B, T, {self.input_size}), got {tuple(x.shape)}")
        batch, time = x.shape[:2]
        num_states = self.num_layers * self.num_directions
        if lengths is not None:
            lengths = self._check_lengths(lengths, batch, time)
        if state is None:
            zeros = x.new_zeros(num_states, batch, self.hidden_size)
            h0, c0 = zeros, zeros
        else:
            h0, c0 = state
            expected = (num_states, batch, self.hidden_size)
            if tuple(h0.shape) != expected or tuple(c0.shape) != expected:
                raise ValueError(
                    f"LNLSTM state must be two tensors of shape {expected}, got {tuple(h0.shape)} and {tuple(c0.shape)}"
                )

        path = self._fused_path(x)
        h_n, c_n = [], []
        layer_input = x
        for layer in range(self.num_layers):
            cells = list(self.cells[layer * self.num_directions : (layer + 1) * self.num_directions])
            first = layer * self.num_directions
            h_layer = h0[first : first + self.num_directions]
            c_layer = c0[first : first + self.num_directions]
            if path == "cpp":
                out, h_last, c_last = lnlstm_ext.fused_layer(cells, layer_input, lengths, h_layer, c_layer)
            elif path == "triton":
                out, h_last, c_last = lnlstm_triton.fused_layer(cells, layer_input, lengths, h_layer, c_layer)
            else:
                out, h_last, c_last = self._reference_layer(cells, layer_input, lengths, h_layer, c_layer)
            h_n.append(h_last)
            c_n.append(c_last)
            if self.dropout > 0.0 and self.training and layer < self.num_layers - 1:
                out = F.dropout(out, self.dropout, training=True)
            layer_input = out
        return layer_input, (torch.cat(h_n, 0), torch.cat(c_n, 0))

    @staticmethod
    def _check_lengths(lengths: torch.Tensor, batch: int, time: int) -> torch.Tensor:
        if lengths.dim() != 1 or lengths.size(0) != batch:
            raise ValueError(f"LNLSTM lengths must have shape ({batch},), got {tuple(lengths.shape)}")
        if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError(f"LNLSTM lengths must be integers, got {lengths.dtype}")
        if batch and (int(lengths.min()) < 0 or int(lengths.max()) > time):
            raise ValueError(
                f"LNLSTM lengths must lie in [0, T={time}], got min {int(lengths.min())}, max {int(lengths.max())}"
            )
        return lengths

    def _fused_path(self, x: torch.Tensor) -> str | None:
        """"triton", "cpp" or None (the reference path) for input x."""
        if _use_triton(x, self.cells[0].weight_h):
            return "triton"
        implementation = get_implementation()
        if implementation not in ("auto", "cpp") or x.device.type != "cpu":
            return None
        if x.dtype not in (torch.float32, torch.float64):
            return None
        if implementation == "cpp":
            lnlstm_ext.load(strict=True)
            return "cpp"
        return "cpp" if lnlstm_ext.load(strict=False) is not None else None

    @staticmethod
    def _reference_layer(
        cells: list[LNLSTMCell],
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
            y, h, c = _reference_direction(cell, x_dir, mask, h0[direction], c0[direction])
            if reverse:
                y = y.flip(1) if lengths is None else reverse_padded(y, lengths)
            outputs.append(y)
            h_last.append(h)
            c_last.append(c)
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, -1)
        return out, torch.stack(h_last), torch.stack(c_last)


_TORCH_TO_IJFO = (0, 2, 1, 3)  # nn.LSTM chunks i, f, g, o -> our i, j(=g), f, o


@torch.no_grad()
def load_from_torch_lstm(lnlstm: LNLSTM, torch_lstm: nn.LSTM) -> None:
    """Copy a ``torch.nn.LSTM``'s weights into ``lnlstm`` so they compute the same.

    Sizes, layers and directions must agree and the LSTM must have biases.
    Gate blocks are reordered from nn.LSTM's ``i, f, g, o`` to ``i, j, f, o``;
    ``bias = b_ih + b_hh`` with ``forget_bias`` subtracted from the forget block,
    so that ``sigmoid(f + forget_bias)`` sees nn.LSTM's pre-activation whatever
    forget_bias is. With ``layer_norm=False`` the result equals nn.LSTM exactly;
    with layer_norm the weights are copied and the norms left as they are.
    """
    if not isinstance(torch_lstm, nn.LSTM):
        raise TypeError(f"expected torch.nn.LSTM, got {type(torch_lstm).__name__}")
    mismatches = [
        name
        for name, ours, theirs in (
            ("input_size", lnlstm.input_size, torch_lstm.input_size),
            ("hidden_size", lnlstm.hidden_size, torch_lstm.hidden_size),
            ("num_layers", lnlstm.num_layers, torch_lstm.num_layers),
            ("bidirectional", lnlstm.bidirectional, torch_lstm.bidirectional),
        )
        if ours != theirs
    ]
    if mismatches:
        raise ValueError(f"LNLSTM and nn.LSTM differ in {', '.join(mismatches)}")
    if not torch_lstm.bias or torch_lstm.proj_size:
        raise ValueError("load_from_torch_lstm needs an nn.LSTM with bias=True and proj_size=0")

    def reorder(t: torch.Tensor) -> torch.Tensor:
        blocks = t.chunk(4, 0)
        return torch.cat([blocks[k] for k in _TORCH_TO_IJFO], 0)

    hidden = lnlstm.hidden_size
    for layer in range(lnlstm.num_layers):
        for direction in range(lnlstm.num_directions):
            suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
            cell = lnlstm.cells[layer * lnlstm.num_directions + direction]
            cell.weight_x.copy_(reorder(getattr(torch_lstm, "weight_ih" + suffix)))
            cell.weight_h.copy_(reorder(getattr(torch_lstm, "weight_hh" + suffix)))
            bias = reorder(getattr(torch_lstm, "bias_ih" + suffix) + getattr(torch_lstm, "bias_hh" + suffix))
            bias[2 * hidden : 3 * hidden] -= cell.forget_bias
            cell.bias.copy_(bias)

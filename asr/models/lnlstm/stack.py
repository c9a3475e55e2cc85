"""The stack: layers, directions, dropout and length checks around the backends."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from asr.models.lnlstm import selection
from asr.models.lnlstm.backends import backends
from asr.models.lnlstm.cells import LNLSTMCell, LNLSTMOptions
from asr.models.lnlstm.parameters import LayerParameters


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
        dropout: dropout on every layer's output except the last (as nn.LSTM),
            only in training mode.
        options: the LN-LSTM's :class:`~asr.models.lnlstm.cells.LNLSTMOptions`, handed to every cell
            (layer norm, variant, eps, forget bias, backend request, C++ build, self-check) and read here for
            ``cuda_graphs`` (whether the Triton backend may record its time loops as CUDA graphs).
        **fields: fields of :class:`~asr.models.lnlstm.cells.LNLSTMOptions` that replace ``options``'
            (``layer_norm=False, backend="reference"``), as nn.LSTM takes its options by keyword.

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
        dropout: float = 0.0,
        options: LNLSTMOptions = LNLSTMOptions(),
        **fields,
    ) -> None:
        super().__init__()
        options = replace(options, **fields) if fields else options
        self.check = options.check  # a fused backend's self-check (asr.models.lnlstm.selfcheck)
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.layer_norm = options.layer_norm
        self.dropout = float(dropout)
        self.forget_bias = options.forget_bias
        self.cells = nn.ModuleList(
            LNLSTMCell(input_size if layer == 0 else hidden_size * self.num_directions, hidden_size, options)
            for layer in range(num_layers)
            for _ in range(self.num_directions)
        )
        self.variant = self.cells[0].variant
        self.eps = self.cells[0].eps
        self.backend = self.cells[0].backend
        self.build = self.cells[0].build
        self.cuda_graphs = options.cuda_graphs

    @property
    def output_size(self) -> int:
        """Feature size of the output y: H * directions."""
        return self.hidden_size * self.num_directions

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
            f"bidirectional={self.bidirectional}, layer_norm={self.layer_norm}, variant={self.variant}, "
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
        carried cell (un-normalised, except for tf_contrib).
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

        name = self.select_backend(x)
        backend = backends(self.build)[name]
        selection.record(x.device, name)
        h_n, c_n = [], []
        layer_input = x
        for layer in range(self.num_layers):
            params = LayerParameters(self.cells[layer * self.num_directions : (layer + 1) * self.num_directions])
            first = layer * self.num_directions
            h_layer = h0[first : first + self.num_directions]
            c_layer = c0[first : first + self.num_directions]
            out, h_last, c_last = backend.layer(params, layer_input, lengths, h_layer, c_layer, self.cuda_graphs)
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

    def select_backend(self, x: torch.Tensor) -> str:
        """The name of the backend that computes this module for input x (B, T, I)."""
        return selection.checked(self.backend, self.cells[0].spec, x.device, x.dtype, self.cells[0].weight_h.dtype,
                                 check=self.check, build=self.build)


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

"""The LN-LSTM's backends: one contract (:class:`Backend`), three implementations.

* :mod:`.reference`: the PyTorch loop over time of :mod:`asr.models.lnlstm.reference`, the
  definition; every device, dtype and variant.
* :mod:`.cpp`: a fused C++ operator for CPU (``csrc/lnlstm.cpp``), float32 and float64.
* :mod:`.triton`: fused Triton kernels for CUDA (CPU under ``TRITON_INTERPRET=1``), float32
  parameters, and the single step the speller takes.

Every backend's :meth:`Backend.layer` takes one layer's :class:`~asr.models.lnlstm.parameters.LayerParameters`
(per-direction tensors gathered once), x (B, T, I), lengths (B,) or None, h0, c0 (D, B, H) and
whether CUDA graphs may be recorded, and returns y (B, T, D * H) zero at padding and h_n, c_n
(D, B, H). Which one runs is decided in :func:`asr.models.lnlstm.selection.select_backend` only.

Both fused backends split a layer in the same place: :func:`input_gates`, the part that does
not depend on the recurrence, runs first for every frame and direction as ordinary
autograd-tracked PyTorch ops; their own operator takes its result and computes the recurrence,
and its hand-written backward returns the gradient of the input gates, which autograd carries
on to x, ``W_x``, ``LN_x`` and the bias.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch
import torch.nn.functional as F


class Backend(Protocol):
    name: str
    # Device types on which "auto" picks this backend (where it is also supported and available).
    auto_devices: tuple[str, ...]

    def supports(self, spec, device: torch.device, dtype: torch.dtype, param_dtype: torch.dtype,
                 single_step: bool) -> bool:
        """Whether it computes this call: a fact about the code (variant, device, dtypes), no probing."""

    def available(self, device: torch.device, strict: bool = False) -> bool:
        """Whether it can run on ``device`` here (builds or compiles on first call and remembers);
        strict: raise RuntimeError with the reason instead of answering False (which warns once)."""

    def layer(self, params, x: torch.Tensor, lengths: torch.Tensor | None, h0: torch.Tensor, c0: torch.Tensor,
              cuda_graphs: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer, all directions (see the module docstring)."""


@functools.cache
def backends() -> dict[str, Backend]:
    """Every backend by name, in the order ``auto`` tries them (the reference path is never
    a candidate of ``auto``: it is what runs when no other does)."""
    from asr.models.lnlstm.backends import cpp, reference, triton

    return {"triton": triton.BACKEND, "cpp": cpp.BACKEND, "reference": reference.BACKEND}


def input_gates(params, x: torch.Tensor) -> torch.Tensor:
    """The input gates of a fused layer: ``LN_x(W_x x) + b`` (``W_x x + b`` without layer norm)
    for every frame and direction, x (B, T, I) -> (B, T, D, 4H), autograd-tracked.

    One GEMM against the directions' stacked ``W_x`` (B * T rows: the BLAS at full speed), then
    one layer norm over each 4H row. Only the variants with ``fused`` (ba2016 and the plain LSTM)
    take this path; the bias b comes after LN_x in their equations, so it is added here.
    """
    batch, time = x.shape[:2]
    spec = params.spec
    gates = F.linear(x, params.weight_x.flatten(0, 1)).view(batch, time, params.directions, 4 * params.hidden_size)
    if not spec.layer_norm:
        return gates + params.bias
    gain, shift = params.ln_x
    return torch.addcmul(shift + params.bias, F.layer_norm(gates, gates.shape[-1:], eps=spec.eps), gain)

"""The contract every LN-LSTM backend implements (:class:`Backend`), and the layer inputs the fused ones share.

A backend takes one layer's :class:`~asr.models.lnlstm.parameters.LayerParameters` (per-direction
tensors gathered once; a backend reads parameters nowhere else), x (B, T, I), lengths (B,) or None,
h0, c0 (D, B, H) and whether CUDA graphs may be recorded, and returns y (B, T, D * H), zero at
padding, and h_n, c_n (D, B, H), taken at each row's own last frame. A backend whose
:meth:`Backend.supports` accepts single steps also computes one step of one cell (the speller's):
:meth:`Backend.cell_step`. Which backend runs is decided in
:func:`asr.models.lnlstm.selection.select_backend` only; the reference path
(:mod:`asr.models.lnlstm.backends.reference`), the C++ operator (:mod:`.cpp`) and the Triton
kernels (:mod:`.triton`) implement this class.

Both fused backends split a layer in the same place: their autograd Function takes the whole layer,
:data:`LAYER_INPUTS` gathered by :func:`layer_inputs` (x and W_x, not precomputed input gates), and
returns a gradient for each. Inside, the C++ operator computes the input products in chunks of frames
and LN_x per row in cache; the Triton backend computes them for all frames at once with PyTorch ops
(docs/architecture.md, "Where the fused backends split a layer").
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Backend(ABC):
    """One implementation of the LN-LSTM's layer (and, where it says so, of a cell's single step)."""

    name: str
    # Device types on which "auto" picks this backend (where it is also supported and available).
    auto_devices: tuple[str, ...] = ()

    @abstractmethod
    def supports(self, spec, device: torch.device, dtype: torch.dtype, param_dtype: torch.dtype,
                 single_step: bool) -> bool:
        """Whether it computes this call: a fact about the code (the cells'
        :class:`~asr.models.lnlstm.cells.CellSpec`, device, input and parameter dtypes, a whole layer or
        one step), no probing."""

    @abstractmethod
    def available(self, device: torch.device, strict: bool = False) -> bool:
        """Whether it can run on ``device`` here (builds or compiles on first call and remembers);
        strict: raise RuntimeError with the reason instead of answering False (which warns once)."""

    @abstractmethod
    def layer(self, params, x: torch.Tensor, lengths: torch.Tensor | None, h0: torch.Tensor, c0: torch.Tensor,
              cuda_graphs: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer, all directions (the module docstring): y (B, T, D * H), h_n, c_n (D, B, H)."""

    def cell_step(self, cell, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of ``cell`` (an :class:`~asr.models.lnlstm.cells.LNLSTMCell`): x (B, I), h, c (B, H)
        -> the new h, c (B, H). Only for backends whose :meth:`supports` accepts single steps."""
        raise NotImplementedError(f"the {self.name} backend computes whole layers only")


# What each fused backend's autograd Function takes of a layer, in this order, and gives gradients for:
# the whole layer, input side included (x and W_x, not precomputed input gates), so that both fused
# backends split a layer in the same place. The LN entries are absent without layer norm.
# A tf_contrib layer (the C++ operator's only) has one norm per gate acting on W_x x + W_h h, and no b
# and no LN_x: its four gate norms' gains and shifts, stacked (D, 4H) in gate order, take LN_h's slots
# (the norm that meets the recurrent product), and b and LN_x are absent.
LAYER_INPUTS = ("x", "weight_x", "weight_h", "bias", "ln_x_gain", "ln_x_bias", "ln_h_gain", "ln_h_bias",
                "ln_c_gain", "ln_c_bias")
LN_INPUTS = LAYER_INPUTS[4:]


def layer_inputs(params, x: torch.Tensor, absent=None) -> dict:
    """:data:`LAYER_INPUTS` of one layer by name, from its
    :class:`~asr.models.lnlstm.parameters.LayerParameters` and x (B, T, I); ``absent`` stands for the
    parameters a layer does not have (layer norm without it; b and LN_x for tf_contrib)."""
    spec = params.spec
    if spec.layer_norm and spec.variant == "tf_contrib":
        gain, shift = params.ln_gates
        ln_c_gain, ln_c_bias = params.ln_c
        return {"x": x, "weight_x": params.weight_x, "weight_h": params.weight_h, "bias": absent,
                "ln_x_gain": absent, "ln_x_bias": absent, "ln_h_gain": gain, "ln_h_bias": shift,
                "ln_c_gain": ln_c_gain, "ln_c_bias": ln_c_bias}
    inputs = {"x": x, "weight_x": params.weight_x, "weight_h": params.weight_h, "bias": params.bias}
    for norm in ("ln_x", "ln_h", "ln_c"):
        gain, bias = getattr(params, norm) if spec.layer_norm else (absent, absent)
        inputs[f"{norm}_gain"], inputs[f"{norm}_bias"] = gain, bias
    return inputs

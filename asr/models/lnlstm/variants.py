"""The three layer-normalised LSTM cells the normalisation study compares (``model.lnlstm_variant``).

All three share the gate order ``i, j, f, o``, the forget bias inside the
forget gate's sigmoid and the parameters ``weight_x`` (4H, I) and ``weight_h``
(4H, H) of :class:`asr.models.lnlstm.LNLSTMCell`; each is one class below (:data:`CELL_VARIANTS`); they differ in what is
normalised, over what, with which gains, biases and epsilon, and in which cell
state is carried (docs/normalization.md, section 2.3, has the table):

``ba2016`` (the default; Ba, Kiros & Hinton 2016, sec. 3.1)::

    gates = LN_x(W_x x) + LN_h(W_h h) + b      LN_x, LN_h over all 4H, gain and bias, eps 1e-5
    c'    = c * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)
    h'    = tanh(LN_c(c')) * sigmoid(o)         LN_c over H, gain and bias, eps 1e-5
    carried: (h', c')                           the un-normalised cell

``tf_contrib`` (TensorFlow 1.x ``tf.contrib.rnn.LayerNormBasicLSTMCell``)::

    i, j, f, o = split(W [x; h])               one projection, no bias when LN is on
    i, j, f, o = LN_i(i), LN_j(j), LN_f(f), LN_o(o)    each over its own H units, gain and shift, eps 1e-12
    c'    = LN_c(c * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j))
    h'    = tanh(c') * sigmoid(o)
    carried: (h', c')                           the NORMALISED cell

``raw_gates`` (the hand-written cell of the study)::

    gates = N(W_x x) + N(W_h h) + b            N: LN over all 4H without gain or bias, eps 1e-3
    c', h' as in ba2016, LN_c with gain and bias, eps 1e-5; carried: the un-normalised cell

Facts about ``tf_contrib`` come from TensorFlow's source (tensorflow/tensorflow,
``tensorflow/contrib/rnn/python/ops/rnn_cell.py``, class
``LayerNormBasicLSTMCell``, and ``tensorflow/contrib/layers/python/layers/layers.py``,
function ``layer_norm``); docs/normalization.md cites them in detail. The
projection ``W [x; h]`` is stored here as its two column blocks ``weight_x``
and ``weight_h`` (``W [x; h] = W_x x + W_h h``), so that the input part can be
computed for all time steps at once. TensorFlow's recurrent dropout on
``tanh(j)`` is not reproduced (the study ran without it: keep probability 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VARIANTS = ("ba2016", "tf_contrib", "raw_gates")

# Every LN of tf.contrib.layers.layer_norm: variance_epsilon = 1e-12.
TF_CONTRIB_EPS = 1e-12
RAW_GATES_GATE_EPS = 1e-3
RAW_GATES_CELL_EPS = 1e-5
BA2016_EPS = 1e-5


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"lnlstm_variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    return variant


def default_eps(variant: str) -> tuple[float, float]:
    """(epsilon of the gate norms, epsilon of the cell norm) of a variant as published."""
    variant_class = CELL_VARIANTS[check_variant(variant)]
    return variant_class.gate_eps, variant_class.cell_eps


def per_gate_layer_norm(gates: torch.Tensor, norms: nn.ModuleList) -> torch.Tensor:
    """gates (B, 4H) -> each H block normalised by its own LN of ``norms`` (i, j, f, o), (B, 4H).

    One ``layer_norm`` call over a (B, 4, H) view with the four gains and shifts
    stacked: the same function as four separate calls, with fewer kernels per step.
    """
    hidden = gates.size(-1) // 4
    blocks = gates.view(*gates.shape[:-1], 4, hidden)
    normalised = F.layer_norm(blocks, (hidden,), eps=norms[0].eps)
    gain = torch.stack([norm.weight for norm in norms])
    shift = torch.stack([norm.bias for norm in norms])
    return (normalised * gain + shift).flatten(-2)


class Ba2016:
    """Ba, Kiros & Hinton 2016 (the module docstring); also the plain LSTM, whose cell has no norms.

    A variant class owns what differs between cells: its norms (``build_norms``), whether the
    gates have a learned bias, its default epsilons, and its step. It holds no state: the
    cell (:class:`asr.models.lnlstm.LNLSTMCell`) holds the parameters and passes itself in.
    """

    name = "ba2016"
    gate_eps = BA2016_EPS
    cell_eps = BA2016_EPS
    gate_bias = True
    affine_gate_norms = True
    affine_recurrent_norm = True  # LN_h of W_h h alone, with a gain (LNLSTMOptions.recurrent_gain)
    # The fused backends that compute this variant's equations (CellSpec.fused_by); any other backend
    # asked for it runs the reference path. Both compute ba2016's (and the plain LSTM's).
    fused_backends: tuple[str, ...] = ("cpp", "triton")

    @classmethod
    def build_norms(cls, hidden_size: int, eps: float | None) -> dict[str, nn.Module]:
        """``ln_x``, ``ln_h`` over 4H and ``ln_c`` over H; ``eps`` (None: the variant's own)
        replaces the epsilon of every one of them."""
        gate_eps, cell_eps = (cls.gate_eps, cls.cell_eps) if eps is None else (eps, eps)
        four_h = 4 * hidden_size
        return {
            "ln_x": nn.LayerNorm(four_h, eps=gate_eps, elementwise_affine=cls.affine_gate_norms),
            "ln_h": nn.LayerNorm(four_h, eps=gate_eps, elementwise_affine=cls.affine_gate_norms),
            "ln_c": nn.LayerNorm(hidden_size, eps=cell_eps),
        }

    @staticmethod
    def input_gates(cell, x: torch.Tensor) -> torch.Tensor:
        """``LN_x(W_x x) + b``, x (..., I) -> (..., 4H)."""
        gates = F.linear(x, cell.weight_x)
        if cell.ln_x is not None:
            gates = cell.ln_x(gates)
        return gates if cell.bias is None else gates + cell.bias

    @staticmethod
    def step(cell, input_gates: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from input gates (B, 4H) and state (B, H) -> (h, c), c un-normalised."""
        gates_h = F.linear(h, cell.weight_h)
        if cell.ln_h is not None:
            gates_h = cell.ln_h(gates_h)
        i, j, f, o = (input_gates + gates_h).chunk(4, dim=-1)
        c = c * torch.sigmoid(f + cell.forget_bias) + torch.sigmoid(i) * torch.tanh(j)
        c_out = cell.ln_c(c) if cell.layer_norm else c
        h = torch.tanh(c_out) * torch.sigmoid(o)
        return h, c


class RawGates(Ba2016):
    """ba2016's step with gate norms that have no gain or bias, epsilon 1e-3."""

    name = "raw_gates"
    gate_eps = RAW_GATES_GATE_EPS
    cell_eps = RAW_GATES_CELL_EPS
    affine_gate_norms = False
    affine_recurrent_norm = False
    fused_backends = ()


class TfContrib(Ba2016):
    """TensorFlow 1.x ``LayerNormBasicLSTMCell``: per-gate LN of one projection, the normalised cell carried."""

    name = "tf_contrib"
    gate_eps = TF_CONTRIB_EPS
    cell_eps = TF_CONTRIB_EPS
    gate_bias = False
    affine_recurrent_norm = False  # one norm per gate of W_x x + W_h h together
    # The C++ operator computes it (per-gate LN and the normalised cell carried: csrc/lnlstm.cpp);
    # the Triton kernels do not.
    fused_backends = ("cpp",)

    @classmethod
    def build_norms(cls, hidden_size: int, eps: float | None) -> dict[str, nn.Module]:
        """``ln_gates`` (four LNs over H, for i, j, f, o) and ``ln_c`` over H. TensorFlow initialises
        gain and shift to ``norm_gain=1.0`` and ``norm_shift=0.0``, nn.LayerNorm's initialisation too."""
        gate_eps, cell_eps = (cls.gate_eps, cls.cell_eps) if eps is None else (eps, eps)
        return {
            "ln_gates": nn.ModuleList(nn.LayerNorm(hidden_size, eps=gate_eps) for _ in range(4)),
            "ln_c": nn.LayerNorm(hidden_size, eps=cell_eps),
        }

    @staticmethod
    def input_gates(cell, x: torch.Tensor) -> torch.Tensor:
        """Just ``W_x x``: the norms act on ``W_x x + W_h h``."""
        return F.linear(x, cell.weight_x)

    @staticmethod
    def step(
        cell, input_gates: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One ``tf_contrib`` step: input_gates (B, 4H) = ``W_x x`` (no LN, no bias), state (B, H)
        -> (h, c), c being the normalised cell that TensorFlow carries."""
        gates = per_gate_layer_norm(input_gates + F.linear(h, cell.weight_h), cell.ln_gates)
        i, j, f, o = gates.chunk(4, dim=-1)
        c = cell.ln_c(c * torch.sigmoid(f + cell.forget_bias) + torch.sigmoid(i) * torch.tanh(j))
        return torch.tanh(c) * torch.sigmoid(o), c


# name -> variant class; a new variant is one class here plus its name in VARIANTS.
CELL_VARIANTS = {variant.name: variant for variant in (Ba2016, TfContrib, RawGates)}

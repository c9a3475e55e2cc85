"""One direction of one layer: :class:`LNLSTMCell`, its parameters and its step; :class:`CellSpec`, what it
computes; :class:`LNLSTMOptions`, every option of a model's LN-LSTMs in one object."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from asr.models.lnlstm import selection
from asr.models.lnlstm.backends import backends
from asr.models.lnlstm.backends.cpp import check_build
from asr.models.lnlstm.selfcheck import CHECK_MODES
from asr.models.lnlstm.variants import CELL_VARIANTS, Ba2016, check_variant, default_eps


@dataclass(frozen=True)
class CellSpec:
    """What a cell computes besides its parameters' values: the variant, whether it is
    layer-normalised (False: a plain LSTM, whatever the variant), the gate norms' epsilon
    and the forget bias. Every cell of an :class:`~asr.models.lnlstm.LNLSTM` has the same spec."""

    variant: str = "ba2016"
    layer_norm: bool = True
    eps: float = Ba2016.gate_eps
    forget_bias: float = 1.0

    @property
    def math(self):
        """The variant class whose norms and step the cell uses (ba2016's for the plain LSTM: no norms)."""
        return CELL_VARIANTS[self.variant] if self.layer_norm else Ba2016

    def fused_by(self, backend: str) -> bool:
        """Whether the fused backend named ``backend`` computes this cell: C++ the plain LSTM, ba2016
        and tf_contrib; Triton the plain LSTM and ba2016 (the variant's ``fused_backends``)."""
        return backend in self.math.fused_backends

    @property
    def fusable(self) -> bool:
        """Whether some fused backend computes this cell (raw_gates: none; it always runs the reference path)."""
        return bool(self.math.fused_backends)

    def cell(self, input_size: int, hidden_size: int, backend: str = "auto") -> LNLSTMCell:
        """A fresh cell (freshly initialised weights) that computes this spec. The self-check
        (:mod:`asr.models.lnlstm.selfcheck`) builds its tiny copies of a call with it, so that module
        needs no import of this one (which imports it)."""
        options = LNLSTMOptions(layer_norm=self.layer_norm, variant=self.variant, eps=self.eps,
                                forget_bias=self.forget_bias, backend=backend)
        return LNLSTMCell(input_size, hidden_size, options)


@dataclass(frozen=True)
class LNLSTMOptions:
    """Every option of a model's LN-LSTMs, built once from the recipe (``LASConfig.lnlstm_options``) and
    handed down whole: the listener and the speller to :class:`~asr.models.lnlstm.LNLSTM`, which hands it to
    each :class:`LNLSTMCell`. A new LN-LSTM option is one field here.

    Fields:
        layer_norm: LN_x, LN_h and LN_c as in :mod:`asr.models.lnlstm`; False gives a plain LSTM.
        variant: which LN-LSTM cell, ``ba2016`` (the package docstring), ``tf_contrib`` or ``raw_gates``
            (:mod:`asr.models.lnlstm.variants`; ``model.lnlstm_variant``); ignored without layer_norm.
        eps: epsilon of every layer norm of a cell; None: the variant's own (ba2016 1e-5).
        forget_bias: added to the forget-gate pre-activation, so a fresh cell starts by remembering (1.0 as in
            TensorFlow's LSTM cells; 0.0 matches torch.nn.LSTM, which has none).
        backend: the backend request (``model.lnlstm_backend``): auto, reference, cpp or triton
            (:mod:`asr.models.lnlstm.selection`).
        build: how the C++ backend builds its operator (``model.lnlstm_build``): native (``-march=native``,
            this CPU's vector extensions) or portable (what a CPU without them gets; for measuring).
            One build serves a process: the first load decides (:mod:`asr.models.lnlstm.backends.cpp`).
        check: what a fused backend's failed self-check does (``model.lnlstm_check``): fallback, strict or
            off (:mod:`asr.models.lnlstm.selfcheck`).
        cuda_graphs: whether the Triton backend may record a layer's time loops as CUDA graphs
            (``model.lnlstm_cuda_graphs``); False runs them eagerly. A cell's single step ignores it.
        recurrent_gain: the initial gain of the recurrent term's norm ``LN_h`` (``ba2016``;
            ``model.lnlstm_recurrent_gain``); None: 1, as published. ``LN_h`` divides ``W_h h`` by its
            spread, which the LSTM's initialisation keeps small, so at gain 1 it undoes that initialisation
            and the gradient stops decaying back through time; a gain near that spread keeps it
            (docs/studies/ln_open_vocabulary.md). The cells without ``LN_h`` gains (``tf_contrib``,
            ``raw_gates``) refuse it.
    """

    layer_norm: bool = True
    variant: str = "ba2016"
    eps: float | None = None
    forget_bias: float = 1.0
    backend: str = "auto"
    build: str = "native"
    check: str = "fallback"
    cuda_graphs: bool = True
    recurrent_gain: float | None = None

    def __post_init__(self) -> None:
        check_variant(self.variant)
        if self.recurrent_gain is not None:
            if self.recurrent_gain <= 0.0:
                raise ValueError(f"recurrent_gain must be positive, got {self.recurrent_gain}")
            if not CELL_VARIANTS[self.variant].affine_recurrent_norm:
                raise ValueError(f"recurrent_gain: the {self.variant} cell has no gain on a norm of W_h h alone")
            object.__setattr__(self, "recurrent_gain", float(self.recurrent_gain))
        if self.eps is not None and self.eps <= 0.0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if self.check not in CHECK_MODES:
            raise ValueError(f"check must be one of {', '.join(CHECK_MODES)}, got {self.check!r}")
        # canonical types and spellings ("python" is the reference path's older name)
        object.__setattr__(self, "layer_norm", bool(self.layer_norm))
        object.__setattr__(self, "eps", None if self.eps is None else float(self.eps))
        object.__setattr__(self, "forget_bias", float(self.forget_bias))
        object.__setattr__(self, "backend", selection.check_backend(self.backend))
        check_build(self.build)
        object.__setattr__(self, "cuda_graphs", bool(self.cuda_graphs))

    @property
    def spec(self) -> CellSpec:
        """What the cells compute: the :class:`CellSpec` of these options (eps resolved to the variant's
        gate epsilon where None)."""
        gate_eps = default_eps(self.variant)[0] if self.eps is None else self.eps
        return CellSpec(self.variant, self.layer_norm, float(gate_eps), self.forget_bias)


class LNLSTMCell(nn.Module):
    """One step of the (layer-normalised) LSTM; also holds one direction's parameters.

    Args:
        input_size: I, size of x_t.
        hidden_size: H, size of h_t and c_t.
        options: the LN-LSTM's :class:`LNLSTMOptions` (layer norm, variant, eps, forget bias, backend
            request of :meth:`forward`, self-check).
        **fields: fields of :class:`LNLSTMOptions` that replace ``options``' (``layer_norm=False``).

    Parameters: ``weight_x`` (4H, I), ``weight_h`` (4H, H), ``bias`` (4H,), gate
    order ``i, j, f, o``; with layer_norm, ``ln_x`` and ``ln_h`` (nn.LayerNorm over
    4H) and ``ln_c`` (nn.LayerNorm over H). A ``tf_contrib`` cell has
    ``ln_gates`` (four nn.LayerNorm over H) and ``ln_c`` instead, and no ``bias``
    (None); a ``raw_gates`` cell's ``ln_x`` and ``ln_h`` have no parameters.
    Norms a variant does not use are None.
    """

    def __init__(self, input_size: int, hidden_size: int, options: LNLSTMOptions = LNLSTMOptions(),
                 **fields) -> None:
        super().__init__()
        options = replace(options, **fields) if fields else options
        self.check = options.check  # a fused backend's self-check (asr.models.lnlstm.selfcheck)
        if input_size <= 0 or hidden_size <= 0:
            raise ValueError(f"input_size and hidden_size must be positive, got {input_size}, {hidden_size}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        # The gate norms' epsilon is the spec's (the fused paths read it; ba2016 uses one epsilon throughout).
        self.spec = options.spec
        self.backend = options.backend
        self.build = options.build  # the C++ operator's build, where the cpp backend runs this cell's layer
        self.recurrent_gain = options.recurrent_gain  # reset_parameters starts LN_h's gain there
        variant = CELL_VARIANTS[options.variant]
        self.weight_x = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_h = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        if not options.layer_norm or variant.gate_bias:
            self.bias = nn.Parameter(torch.empty(4 * hidden_size))
        else:
            self.register_parameter("bias", None)
        norms = variant.build_norms(hidden_size, options.eps) if options.layer_norm else {}
        for name in ("ln_x", "ln_h", "ln_gates", "ln_c"):
            self.register_module(name, norms.get(name))
        self.reset_parameters()

    # The spec's fields, under the names the rest of the toolkit reads.
    variant = property(lambda self: self.spec.variant)
    layer_norm = property(lambda self: self.spec.layer_norm)
    eps = property(lambda self: self.spec.eps)
    forget_bias = property(lambda self: self.spec.forget_bias)
    fusable = property(lambda self: self.spec.fusable)

    def reset_parameters(self) -> None:
        # Same init as nn.LSTM, so the plain variant trains like it. The gate
        # bias must not start at 0: with b = 0 (and LN biases 0) an all-zero
        # input keeps h = c = 0 forever, every LN then sees zero variance, and
        # back-propagation through time gains 1/sqrt(eps) twice per step (inf
        # in float32 within ~10 steps). A random b breaks that fixed point.
        # (tf_contrib has no b, as in TensorFlow: docs/normalization.md shows what follows.)
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in (self.weight_x, self.weight_h, self.bias):
            if weight is not None:
                nn.init.uniform_(weight, -bound, bound)
        for name in ("ln_x", "ln_h", "ln_gates", "ln_c"):
            norm = getattr(self, name)
            for module in norm.modules() if norm is not None else ():
                if isinstance(module, nn.LayerNorm):
                    module.reset_parameters()
        if self.recurrent_gain is not None and self.ln_h is not None:
            nn.init.constant_(self.ln_h.weight, self.recurrent_gain)  # LNLSTMOptions.recurrent_gain says why

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, layer_norm={self.layer_norm}, variant={self.variant}, "
            f"forget_bias={self.forget_bias}, eps={self.eps}"
        )

    def input_gates(self, x: torch.Tensor) -> torch.Tensor:
        """``LN_x(W_x x) + b`` for any leading shape: x (..., I) -> (..., 4H)
        (for tf_contrib just ``W_x x``: its norms act on ``W_x x + W_h h``).

        It does not depend on the recurrence, so the sequence path computes it
        for all time steps at once.
        """
        return self.spec.math.input_gates(self, x)

    def recurrent_step(
        self, input_gates: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from precomputed input gates (B, 4H) and state (B, H) -> (h, c)."""
        return self.spec.math.step(self, input_gates, h, c)

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, I), state (h, c) each (B, H) or None for zeros -> (h, c) each (B, H).

        c is the cell to be passed back in as state (un-normalised, except for tf_contrib).
        """
        if x.dim() != 2 or x.size(1) != self.input_size:
            raise ValueError(f"LNLSTMCell expects x of shape (B, {self.input_size}), got {tuple(x.shape)}")
        if state is None:
            zeros = x.new_zeros(x.size(0), self.hidden_size)
            state = (zeros, zeros)
        h, c = state
        name = selection.checked(self.backend, self.spec, x.device, x.dtype, self.weight_h.dtype, single_step=True,
                                 check=self.check, build=self.build)
        selection.record(x.device, name)
        return backends(self.build)[name].cell_step(self, x, h, c)

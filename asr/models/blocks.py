"""Building blocks the encoder-decoder model's encoders and decoder share: sinusoidal positions,
multi-head attention on SDPA, the position-wise feed-forward, the pre/post-norm residual wiring, the
x4 convolutional subsampling front, the encoder frame around a stack of layers, and the checks of the keys
every stack has (:mod:`asr.models.transformer`, :mod:`asr.models.transformer_encoder`, :mod:`asr.models.conformer`).

Masks follow the toolkit convention (``asr.models.common``): boolean, True = may attend / valid.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.models.common import lengths_to_mask
from asr.models.drophead import drop_heads
from asr.models.norms import make_norm

ACTIVATIONS = {"relu": F.relu, "swish": F.silu}

LAYER_NORM_PLACEMENTS = ("pre", "post")


def check_stack(config, name: str) -> None:
    """Check the keys every layer stack has (``model.encoder``, ``model.decoder``); errors name ``name.key``."""
    if config.num_layers < 1:
        raise ValueError(f"{name}.num_layers must be >= 1, got {config.num_layers}")
    if config.ff_dim < 1:
        raise ValueError(f"{name}.ff_dim must be >= 1, got {config.ff_dim}")
    if config.layer_norm not in LAYER_NORM_PLACEMENTS:
        raise ValueError(f"{name}.layer_norm must be one of {LAYER_NORM_PLACEMENTS}, got {config.layer_norm!r}")
    for regulariser in ("layerdrop", "drophead"):
        if not 0.0 <= getattr(config, regulariser) < 1.0:
            raise ValueError(f"{name}.{regulariser} must be in [0, 1), got {getattr(config, regulariser)}")


def sinusoidal_positions(positions: Tensor, dim: int) -> Tensor:
    """Vaswani et al.'s encodings: (L,) integer positions -> (L, dim) float.

    ``pe[p, 2i] = sin(p / 10000^(2i/dim))``, ``pe[p, 2i+1] = cos(...)``,
    computed on demand so there is no maximum length and a single decoding
    step gets exactly the row the full pass uses.
    """
    exponents = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim
    inv_freq = torch.exp(exponents * -math.log(10000.0))
    angles = positions.to(torch.float32).unsqueeze(1) * inv_freq  # (L, dim/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention on top of SDPA.

    Keys and values are projected by :meth:`project_kv` separately from the
    attention itself, so callers can cache them: the decoder projects the
    encoder output once per utterance and appends one step's keys to the
    self-attention cache per token.

    ``drophead`` is the current DropHead rate (moved along its schedule by
    :meth:`Transformer.set_scheduled`): in training, whole heads
    of each example are dropped after attending and before the output
    projection joins them (:func:`asr.models.drophead.drop_heads`).
    """

    def __init__(self, d_model: int, heads: int, dropout: float, drophead: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.dropout = dropout
        self.drophead = drophead
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def _split(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, H, L, D/H)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) -> keys, values, each (B, H, S, D/H)."""
        return self._split(self.key(x)), self._split(self.value(x))

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
        """x: (B, L, D) queries; keys/values: (B, H, S, D/H); mask broadcastable
        to (B, H, L, S), True = may attend, or None (attend everywhere).
        Returns (B, L, D)."""
        queries = self._split(self.query(x))
        dropout = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, dropout_p=dropout)
        if self.training:
            attended = drop_heads(attended, self.drophead)
        batch, _, length, _ = attended.shape
        return self.out(attended.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class FeedForward(nn.Module):
    """Position-wise ``Linear -> activation -> Dropout -> Linear``: (B, L, D) -> (B, L, D).

    The Transformer's is ReLU without inner dropout (Vaswani et al.); the Conformer's is Swish with
    it (Gulati et al. 2020, as ESPnet and torchaudio)."""

    def __init__(self, d_model: int, ff_dim: int, activation: str = "relu", dropout: float = 0.0) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        self.inner = nn.Linear(d_model, ff_dim)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)
        self.outer = nn.Linear(ff_dim, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.outer(self.dropout(self.activation(self.inner(x))))


class ResidualLayer(nn.Module):
    """Pre- or post-norm residual wiring shared by encoder and decoder layers.

    A sublayer reads ``self._sublayer_input(x, norm)`` and its result is
    merged by ``self._residual(x, y, norm)``; that pair is the whole
    difference between the two placements.
    """

    def __init__(self, layer_norm: str, dropout: float) -> None:
        super().__init__()
        self.pre_norm = layer_norm == "pre"
        self.residual_dropout = nn.Dropout(dropout)

    def _sublayer_input(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x) if self.pre_norm else x

    def _residual(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        y = self.residual_dropout(y)
        return x + y if self.pre_norm else norm(x + y)


class Conv2dSubsampling(nn.Module):
    """x4 time reduction: (B, T, F) -> (B, T', D), ``T' = ((T - 1) // 2 - 1) // 2``.

    Two 3x3 convolutions with stride 2 and no padding (ESPnet's
    ``Conv2dSubsampling``), then a linear map of channels x remaining
    frequency bins to ``d_model``. Without padding, output frame t sees input
    frames 4t .. 4t+6 only, so the valid outputs of an utterance never read
    its padding: the lengths above are exact.
    """

    MIN_FRAMES = 7  # the fewest input frames that give one output frame

    def __init__(self, input_dim: int, d_model: int) -> None:
        super().__init__()
        if input_dim < self.MIN_FRAMES:
            raise ValueError(
                f"the Transformer's convolutional front-end needs feature dimension >= {self.MIN_FRAMES}, "
                f"got {input_dim}"
            )
        self.conv = nn.Sequential(
            nn.Conv2d(1, d_model, kernel_size=3, stride=2),
            nn.ReLU(),
            nn.Conv2d(d_model, d_model, kernel_size=3, stride=2),
            nn.ReLU(),
        )
        self.proj = nn.Linear(d_model * self.output_lengths(input_dim), d_model)

    @staticmethod
    def output_lengths(lengths):
        """Frames (int or (B,) tensor) after both convolutions."""
        return ((lengths - 1) // 2 - 1) // 2

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x.unsqueeze(1))  # (B, C, T', F')
        batch, channels, frames, freqs = x.shape
        return self.proj(x.transpose(1, 2).reshape(batch, frames, channels * freqs))


def checked_lengths(features: Tensor, lengths: Tensor, input_dim: int, encoder: str) -> Tensor:
    """``lengths`` (B,) on the features' device, after checking that features are (B, T, input_dim),
    that no length exceeds T and that every utterance gives the subsampling at least one frame.
    Errors name the ``encoder`` and the batch rows."""
    if features.dim() != 3 or features.shape[-1] != input_dim:
        raise ValueError(f"expected features (B, T, {input_dim}), got {tuple(features.shape)}")
    lengths = lengths.to(features.device)
    too_short = lengths < Conv2dSubsampling.MIN_FRAMES
    if too_short.any():
        rows = too_short.nonzero().flatten().tolist()
        raise ValueError(
            f"utterances too short for the {encoder}'s x4 convolutional subsampling: it needs at least "
            f"{Conv2dSubsampling.MIN_FRAMES} feature frames, got lengths {lengths[too_short].tolist()} "
            f"(batch rows {rows})"
        )
    if int(lengths.max()) > features.shape[1]:
        raise ValueError(f"feature lengths {lengths.tolist()} exceed the padded length {features.shape[1]}")
    return lengths


class SubsampledEncoder(nn.Module, ABC):
    """What every encoder kind shares: (B, T, F) features -> (B, T', D) through the x4 subsampling,
    times ``sqrt(d_model)``, a stack of layers with LayerDrop, and an optional closing norm.

    A kind supplies a function that makes its layers and two methods: ``embed(features)`` gives the stack's input and what
    each layer reads besides it (positions, or None), and ``blocks(x, mask, extra)`` runs the stack
    (through :meth:`stack`). The sqrt(d_model) scale is ESPnet's (its ``PositionalEncoding.xscale``):
    at initialisation the subsampling output of mean-variance normalised features is about 0.1 per
    coordinate against the positions' 0.7, and the scale puts content and positions on comparable
    footing, like ``scale_embedding`` does for tokens (docs/normalization.md, section 3).
    """

    kind = "encoder"  # named in input errors

    def __init__(self, config, input_dim: int, make_layers: Callable[[], Iterable[nn.Module]], closing_norm: bool) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.d_model = config.d_model
        self.layerdrop = config.encoder.layerdrop
        self.subsampling = Conv2dSubsampling(input_dim, config.d_model)
        self.input_scale = math.sqrt(config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        # The layers are made here, after the subsampling: modules draw their initial weights from the
        # global generator in the order they are made, so a seed gives the weights it gave before the
        # encoders shared this class (made before it, the layers took the subsampling's draws).
        self.layers = nn.ModuleList(make_layers())
        self.final_norm = make_norm(config.norm_type, config.d_model, config.eps) if closing_norm else None

    def scaled_input(self, features: Tensor) -> Tensor:
        """(B, T, F) -> (B, T', D): the subsampling, times sqrt(d_model)."""
        return self.subsampling(features) * self.input_scale

    def with_absolute_positions(self, x: Tensor) -> Tensor:
        """``x`` (B, T', D) plus sinusoidal positions, then dropout."""
        positions = sinusoidal_positions(torch.arange(x.shape[1], device=x.device), self.d_model)
        return self.dropout(x + positions.to(x.dtype))

    def stack(self, x: Tensor, *layer_inputs) -> Tensor:
        """Every layer (LayerDrop skips a whole layer in training), then the closing norm."""
        for layer in self.layers:
            if self.training and self.layerdrop > 0 and torch.rand(()) < self.layerdrop:
                continue
            x = layer(x, *layer_inputs)
        return self.final_norm(x) if self.final_norm is not None else x

    @abstractmethod
    def embed(self, features: Tensor) -> tuple[Tensor, Tensor | None]:
        """(B, T, F) -> the stack's input (B, T', D) and what each layer reads besides it (or None)."""

    @abstractmethod
    def blocks(self, x: Tensor, mask: Tensor, extra: Tensor | None) -> Tensor:
        """The stack on ``x`` (B, T', D) with ``mask`` (B, T') True = valid; usually :meth:`stack`."""

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """features: (B, T, F), lengths: (B,). Returns out (B, T', D), mask (B, T') True = valid, lengths (B,)."""
        lengths = checked_lengths(features, lengths, self.input_dim, self.kind)
        x, extra = self.embed(features)
        out_lengths = Conv2dSubsampling.output_lengths(lengths)
        mask = lengths_to_mask(out_lengths, x.shape[1])
        return self.blocks(x, mask, extra), mask, out_lengths

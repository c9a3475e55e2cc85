"""The Transformer encoder (Vaswani et al. 2017), ``model.encoder.kind: transformer``: the x4
convolutional subsampling, times ``sqrt(d_model)`` plus sinusoidal positions, then N layers of
self-attention and feed-forward, each with a residual and a norm placed by ``model.encoder.layer_norm``
(``pre``: ``x + Sublayer(Norm(x))`` and one ``final_norm`` after the stack; ``post``:
``Norm(x + Sublayer(x))``). LayerDrop skips whole layers in training. docs/normalization.md has the diagrams.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from asr.models.blocks import (
    Conv2dSubsampling, FeedForward, MultiHeadAttention, ResidualLayer, checked_lengths, sinusoidal_positions,
)
from asr.models.common import lengths_to_mask
from asr.models.norms import make_norm

if TYPE_CHECKING:
    from asr.models.transformer import EncoderConfig, TransformerConfig


class EncoderLayer(ResidualLayer):
    """Self-attention then feed-forward, each with a residual and a norm."""

    def __init__(self, config: TransformerConfig, stack: EncoderConfig) -> None:
        super().__init__(stack.layer_norm, config.dropout)
        d_model = config.d_model
        self.self_attn_norm = make_norm(config.norm_type, d_model, config.eps)
        self.self_attn = MultiHeadAttention(d_model, config.heads, config.attention_dropout, stack.drophead)
        self.ff_norm = make_norm(config.norm_type, d_model, config.eps)
        self.feed_forward = FeedForward(d_model, stack.ff_dim)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x: (B, T, D); mask: (B, 1, 1, T) True = valid key frame. Returns (B, T, D)."""
        h = self._sublayer_input(x, self.self_attn_norm)
        keys, values = self.self_attn.project_kv(h)
        x = self._residual(x, self.self_attn(h, keys, values, mask), self.self_attn_norm)
        h = self._sublayer_input(x, self.ff_norm)
        return self._residual(x, self.feed_forward(h), self.ff_norm)


class TransformerEncoder(nn.Module):
    """Subsampling, positions and the encoder layers: (B, T, F) -> (B, T', D)."""

    def __init__(self, config: TransformerConfig, input_dim: int) -> None:
        super().__init__()
        stack = config.encoder
        self.input_dim = input_dim
        self.d_model = config.d_model
        self.layerdrop = stack.layerdrop
        self.subsampling = Conv2dSubsampling(input_dim, config.d_model)
        self.input_scale = math.sqrt(config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(EncoderLayer(config, stack) for _ in range(stack.num_layers))
        # Pre-norm leaves the residual stream unnormalised; this norm gives the
        # decoder's cross-attention (and the CTC head) normalised input.
        self.final_norm = make_norm(config.norm_type, config.d_model, config.eps) if stack.layer_norm == "pre" else None

    def front_end(self, features: Tensor) -> Tensor:
        """(B, T, F) -> (B, T', D): subsampling, times sqrt(d_model), plus positions, dropout.

        The sqrt(d_model) scale is ESPnet's (its ``PositionalEncoding.xscale``):
        at initialisation the subsampling output of mean-variance normalised
        features is about 0.1 per coordinate against the positions' 0.7, and
        the scale puts content and positions on comparable footing, like
        ``scale_embedding`` does for tokens (docs/normalization.md, section 3).
        """
        x = self.subsampling(features) * self.input_scale
        positions = sinusoidal_positions(torch.arange(x.shape[1], device=x.device), self.d_model)
        return self.dropout(x + positions.to(x.dtype))

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """features: (B, T, F), lengths: (B,). Returns out (B, T', D), mask
        (B, T') True = valid, lengths (B,)."""
        lengths = checked_lengths(features, lengths, self.input_dim, "Transformer")
        x = self.front_end(features)
        out_lengths = Conv2dSubsampling.output_lengths(lengths)
        mask = lengths_to_mask(out_lengths, x.shape[1])
        # Keys at padded frames are masked; padded query rows compute garbage
        # that no valid frame ever reads.
        attn_mask = mask[:, None, None, :]
        for layer in self.layers:
            if self.training and self.layerdrop > 0 and torch.rand(()) < self.layerdrop:
                continue
            x = layer(x, attn_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, mask, out_lengths

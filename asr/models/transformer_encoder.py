"""The Transformer encoder (Vaswani et al. 2017), ``model.encoder.kind: transformer``: the x4
convolutional subsampling, times ``sqrt(d_model)`` plus sinusoidal positions, then N layers of
self-attention and feed-forward, each with a residual and a norm placed by ``model.encoder.layer_norm``
(``pre``: ``x + Sublayer(Norm(x))`` and one ``final_norm`` after the stack; ``post``:
``Norm(x + Sublayer(x))``). LayerDrop skips whole layers in training. docs/normalization.md has the diagrams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from asr.models.blocks import FeedForward, MultiHeadAttention, ResidualLayer, SubsampledEncoder
from asr.models.encoder_registry import EncoderConfig, EncoderHost
from asr.models.norms import make_norm


@dataclass
class TransformerEncoderConfig(EncoderConfig):
    """The Transformer encoder's keys (``model.encoder`` with ``kind: transformer``, the default): those
    every encoder has, and no more."""

    kind: Literal["transformer"] = "transformer"  # the encoder, a kind of the table in asr/models/encoders.py


class EncoderLayer(ResidualLayer):
    """Self-attention then feed-forward, each with a residual and a norm."""

    def __init__(self, config: EncoderHost, stack: EncoderConfig) -> None:
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


class TransformerEncoder(SubsampledEncoder):
    """Subsampling, positions and the encoder layers: (B, T, F) -> (B, T', D)."""

    kind = "Transformer"

    def __init__(self, config: EncoderHost, input_dim: int) -> None:
        stack = config.encoder
        # Pre-norm leaves the residual stream unnormalised; the closing norm gives the
        # decoder's cross-attention (and the CTC head) normalised input.
        super().__init__(config, input_dim, lambda: [EncoderLayer(config, stack) for _ in range(stack.num_layers)],
                         closing_norm=stack.layer_norm == "pre")

    def front_end(self, features: Tensor) -> Tensor:
        """(B, T, F) -> (B, T', D): subsampling, times sqrt(d_model), plus positions, dropout."""
        return self.with_absolute_positions(self.scaled_input(features))

    def embed(self, features: Tensor) -> tuple[Tensor, None]:
        return self.front_end(features), None

    def blocks(self, x: Tensor, mask: Tensor, extra: None = None) -> Tensor:
        # Keys at padded frames are masked; padded query rows compute garbage
        # that no valid frame ever reads.
        return self.stack(x, mask[:, None, None, :])

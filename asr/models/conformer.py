"""The Conformer encoder (Gulati et al. 2020), ``model.encoder.kind: conformer``, with every norm in
it switchable.

Audio path: features (B, T, F) -> the x4 convolutional subsampling (:class:`~asr.models.blocks.Conv2dSubsampling`,
as ESPnet's) -> times ``sqrt(d_model)`` -> positions -> N Conformer blocks -> (B, T', D). A block is
the macaron sandwich: half a feed-forward, self-attention, the convolution module, half a
feed-forward, then a LayerNorm. With ``model.encoder.layer_norm: pre`` (as published)::

    x = x + 1/2 FF1(Norm(x))
    x = x + MHSA(Norm(x))
    x = x + Conv(Norm(x))
    x = x + 1/2 FF2(Norm(x))
    x = FinalNorm(x)                       (model.encoder.final_norm)

and with ``post`` every ``x + f(Norm(x))`` becomes ``Norm(x + f(x))`` (Squeezeformer's placement).
The convolution module is ``pointwise conv (D -> 2D), GLU, depthwise conv (model.encoder.conv_kernel),
ConvNorm (model.encoder.conv_norm: batchnorm | layernorm | groupnorm | none), Swish, pointwise conv``.
``model.norm_type`` (layernorm | scalenorm | rmsnorm) is every norm but ConvNorm. A pre-norm stack whose
blocks end without their final norm gets one norm after the last block (as the Transformer's pre-norm
stack), so the decoder and the CTC head read normalised states either way. docs/normalization.md
draws each setting.

Padding never reaches a valid frame: the subsampling's valid outputs read no padded input, attention
masks padded keys, the convolution module zeroes padded frames before its depthwise convolution, and
ConvNorm leaves them out of its statistics (:mod:`asr.models.norms`). So an utterance's output does not
depend on its batch's padding, BatchNorm's training mode included.

Positions (``model.encoder.positions``): ``relative`` (the published model, and ESPnet's
``rel_pos``/``rel_selfattn`` of ``rel_pos_type: latest``): Transformer-XL attention (Dai et al. 2019)
over sinusoidal embeddings of the relative distance, with the learned biases ``u`` and ``v``;
``absolute``: sinusoidal positions added once after the subsampling, as the Transformer encoder.

How it differs from ``torchaudio.models.Conformer`` (tests/test_conformer.py checks the rest with
copied weights): torchaudio has no subsampling and no positions (its attention is plain), and its
convolution module and BatchNorm/GroupNorm read padded frames, so its outputs depend on the padding.
ESPnet's pre-norm Conformer adds one more LayerNorm after the last block, on top of each block's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from asr.models.blocks import FeedForward, MultiHeadAttention, SubsampledEncoder
from asr.models.encoder_registry import EncoderConfig, EncoderHost
from asr.models.norms import CONV_NORMS, make_conv_norm, make_norm
from asr.models.relative_attention import RelativeMultiHeadAttention, relative_positions

POSITIONS = ("relative", "absolute")


@dataclass
class ConformerConfig(EncoderConfig):
    """The Conformer's keys (``model.encoder`` with ``kind: conformer``) besides those every encoder has.
    docs/normalization.md draws every setting. ``layer_norm`` is its blocks' placement: pre as published,
    post as Squeezeformer."""

    kind: Literal["conformer"] = "conformer"
    conv_kernel: int = 31          # the depthwise convolution's frames after the x4 subsampling (Gulati et al., ESPnet: 31)
    # The convolution module's norm: batchnorm as published; layernorm (per frame over channels) or
    # groupnorm (per utterance) do not depend on the batch. Padded frames never enter the statistics.
    conv_norm: Literal["batchnorm", "layernorm", "groupnorm", "none"] = "batchnorm"
    conv_norm_groups: int = 1      # groups of conv_norm: groupnorm (1: torchaudio's use_group_norm)
    final_norm: bool = True        # each block's closing norm (as published); a pre-norm stack without it gets one after the last block
    positions: Literal["relative", "absolute"] = "relative"  # Transformer-XL relative self-attention (as published) or sinusoids added once

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.conv_kernel < 1 or self.conv_kernel % 2 == 0:
            raise ValueError(f"encoder.conv_kernel must be a positive odd number (centred, 'same' length), got {self.conv_kernel}")
        if self.conv_norm not in CONV_NORMS:
            raise ValueError(f"encoder.conv_norm must be one of {CONV_NORMS}, got {self.conv_norm!r}")
        if self.conv_norm_groups < 1:
            raise ValueError(f"encoder.conv_norm_groups must be >= 1, got {self.conv_norm_groups}")
        if self.positions not in POSITIONS:
            raise ValueError(f"encoder.positions must be one of {POSITIONS}, got {self.positions!r}")

    def check_model(self, model: EncoderHost) -> None:
        if model.d_model % self.conv_norm_groups:
            raise ValueError(f"encoder.conv_norm_groups must divide d_model={model.d_model}, got {self.conv_norm_groups}")


class ConvolutionModule(nn.Module):
    """Pointwise conv (D -> 2D), GLU, depthwise conv, ConvNorm, Swish, pointwise conv: (B, T, D) -> (B, T, D).

    Padded frames are zeroed before the depthwise convolution, so a valid frame near the end of an
    utterance reads zeros there whatever the batch padded it with (the published model's "same"
    padding), and ConvNorm takes its statistics from valid frames only.
    """

    def __init__(self, d_model: int, kernel: int, norm: str, groups: int = 1, eps: float = 1e-5) -> None:
        super().__init__()
        self.pointwise_in = nn.Conv1d(d_model, 2 * d_model, kernel_size=1)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel, padding=kernel // 2, groups=d_model)
        self.norm = make_conv_norm(norm, d_model, eps=eps, groups=groups)
        self.pointwise_out = nn.Conv1d(d_model, d_model, kernel_size=1)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x: (B, T, D); mask: (B, T) True = valid frame."""
        x = F.glu(self.pointwise_in(x.transpose(1, 2)), dim=1)  # (B, D, T)
        x = x.masked_fill(~mask[:, None, :], 0.0)
        x = F.silu(self.norm(self.depthwise(x), mask))
        return self.pointwise_out(x).transpose(1, 2)


class ConformerBlock(nn.Module):
    """One macaron block; the module docstring gives its two placements."""

    def __init__(self, config: EncoderHost, stack: ConformerConfig) -> None:
        super().__init__()
        d_model, norm = config.d_model, config.norm_type
        self.pre_norm = stack.layer_norm == "pre"
        self.ff1_norm = make_norm(norm, d_model, config.eps)
        self.ff1 = FeedForward(d_model, stack.ff_dim, activation="swish", dropout=config.dropout)
        self.self_attn_norm = make_norm(norm, d_model, config.eps)
        attention = RelativeMultiHeadAttention if stack.positions == "relative" else MultiHeadAttention
        self.self_attn = attention(d_model, config.heads, config.attention_dropout, stack.drophead)
        self.conv_module_norm = make_norm(norm, d_model, config.eps)
        self.conv_module = ConvolutionModule(d_model, stack.conv_kernel, stack.conv_norm, stack.conv_norm_groups, config.eps)
        self.ff2_norm = make_norm(norm, d_model, config.eps)
        self.ff2 = FeedForward(d_model, stack.ff_dim, activation="swish", dropout=config.dropout)
        self.final_norm = make_norm(norm, d_model, config.eps) if stack.final_norm else None
        self.residual_dropout = nn.Dropout(config.dropout)

    def _sublayer(self, x: Tensor, norm: nn.Module, run, scale: float = 1.0) -> Tensor:
        if self.pre_norm:
            return x + scale * self.residual_dropout(run(norm(x)))
        return norm(x + scale * self.residual_dropout(run(x)))

    def forward(self, x: Tensor, mask: Tensor, positions: Tensor | None) -> Tensor:
        """x: (B, T, D); mask: (B, T) True = valid frame; positions: (2T - 1, D) relative embeddings,
        or None with absolute positions. Returns (B, T, D)."""
        key_mask = mask[:, None, None, :]
        if positions is None:
            def attend(h: Tensor) -> Tensor:
                return self.self_attn(h, *self.self_attn.project_kv(h), key_mask)
        else:
            def attend(h: Tensor) -> Tensor:
                return self.self_attn(h, positions, key_mask)
        x = self._sublayer(x, self.ff1_norm, self.ff1, 0.5)
        x = self._sublayer(x, self.self_attn_norm, attend)
        x = self._sublayer(x, self.conv_module_norm, lambda h: self.conv_module(h, mask))
        x = self._sublayer(x, self.ff2_norm, self.ff2, 0.5)
        return self.final_norm(x) if self.final_norm is not None else x


class ConformerEncoder(SubsampledEncoder):
    """Subsampling, positions and the Conformer blocks: (B, T, F) -> (B, T', D), as
    :class:`~asr.models.transformer_encoder.TransformerEncoder` (same inputs, outputs and LayerDrop)."""

    kind = "Conformer"

    def __init__(self, config: EncoderHost, input_dim: int) -> None:
        stack = config.encoder
        closing = stack.layer_norm == "pre" and not stack.final_norm
        super().__init__(config, input_dim, lambda: [ConformerBlock(config, stack) for _ in range(stack.num_layers)],
                         closing_norm=closing)
        self.relative = stack.positions == "relative"

    def front_end(self, features: Tensor) -> tuple[Tensor, Tensor | None]:
        """(B, T, F) -> (B, T', D) and the relative position embeddings (2T' - 1, D) (None with absolute
        positions, which are added here): subsampling, times sqrt(d_model) (for both kinds of
        positions, as ESPnet), dropout on both."""
        x = self.scaled_input(features)
        if self.relative:
            positions = relative_positions(x.shape[1], self.d_model, x.device).to(x.dtype)
            return self.dropout(x), self.dropout(positions)
        return self.with_absolute_positions(x), None

    def embed(self, features: Tensor) -> tuple[Tensor, Tensor | None]:
        return self.front_end(features)

    def blocks(self, x: Tensor, mask: Tensor, positions: Tensor | None) -> Tensor:
        """The block stack and the closing norm: (B, T', D) -> (B, T', D)."""
        return self.stack(x, mask, positions)

"""Normalisation layers for the Transformer and the Conformer: LayerNorm, ScaleNorm, RMSNorm and
FixNorm, and the norms over (B, C, T) of the Conformer's convolution module.

``make_norm(norm_type, dim, eps)`` is the one place a sublayer norm is built, so ``model.norm_type``
switches every norm of both stacks at once; ``make_conv_norm`` builds the convolution module's
(``model.encoder.conv_norm``). Those see padding, so each takes the frame mask and leaves padded
frames out of its statistics: an utterance's output never depends on how its batch was padded. FixNorm is different in kind: it normalises the rows of an embedding
table, not activations, and is applied by the token embedding (see
``asr.models.transformer.TokenEmbedding``).

Reference: Nguyen & Salazar (2019), "Transformers without Tears: Improving
the Normalization of Self-Attention". Where every norm sits, per setting, is
documented in ``docs/normalization.md``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterable, Iterator, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NormType = Literal["layernorm", "scalenorm", "rmsnorm"]
NORM_TYPES = ("layernorm", "scalenorm", "rmsnorm")
CONV_NORMS = ("batchnorm", "layernorm", "groupnorm", "none")


class ScaleNorm(nn.Module):
    """``g * x / ||x||`` over the last dimension, with one learned scalar ``g``.

    Nguyen & Salazar (2019) replace LayerNorm's per-feature gain and bias and
    its mean subtraction by a single length: every vector is projected onto
    the sphere of radius ``g``. ``g`` starts at ``sqrt(dim)``, the length a
    vector of unit-variance coordinates has, so at initialisation the output
    has the scale LayerNorm would give it.

    x: (..., dim) -> (..., dim). ``eps`` bounds the norm from below so an
    all-zero vector maps to zero instead of NaN.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.scale = nn.Parameter(torch.tensor(math.sqrt(dim)))

    def forward(self, x: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps)
        return x * (self.scale / norm)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class FixNorm(nn.Module):
    """Rows of an embedding table scaled to a fixed length ``radius``.

    Nguyen & Salazar (2019): l2-normalising word embeddings removes the
    frequency-dependent embedding norms that let frequent tokens dominate; the
    token embedding then multiplies by ``sqrt(d_model)`` (``scale_embedding``)
    so that a unit-length row enters the stack with LayerNorm-like scale.
    There is nothing to learn: the radius is fixed.

    weight: (V, D) -> (V, D), each row of length ``radius``.
    """

    def __init__(self, radius: float = 1.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.radius = radius
        self.eps = eps

    def forward(self, weight: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(weight, dim=-1, keepdim=True).clamp(min=self.eps)
        return weight * (self.radius / norm)

    def extra_repr(self) -> str:
        return f"radius={self.radius}, eps={self.eps}"


def make_norm(norm_type: str, dim: int, eps: float = 1e-5) -> nn.Module:
    """The sublayer norm named by ``norm_type``: ``"layernorm"``, ``"scalenorm"`` or ``"rmsnorm"``
    (Zhang & Sennrich 2019: LayerNorm without the mean subtraction and the bias, torch's ``nn.RMSNorm``).

    Each maps (..., dim) -> (..., dim) over the last dimension.
    """
    if norm_type == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if norm_type == "scalenorm":
        return ScaleNorm(dim, eps=eps)
    if norm_type == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {norm_type!r}")


# ---------------------------------------------------------------- norms over (B, C, T) with a frame mask


def _synced(total: Tensor) -> Tensor:
    """``total`` summed over every rank of the process group, differentiably (one all-reduce), or itself
    outside distributed training. What makes BatchNorm's statistics the whole global batch's under DDP."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        from torch.distributed.nn.functional import all_reduce

        return all_reduce(total)
    return total


class MaskedBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm over (B, C, T) whose batch statistics count the valid frames only.

    ``nn.BatchNorm1d`` averages over every frame of the padded batch, so how much padding a batch has
    changes every utterance's output in training, and the running statistics learn the padding. Here
    the mean and variance of each channel are taken over the frames ``mask`` keeps, summed over every
    rank under distributed training (as ``nn.SyncBatchNorm``), and the running statistics (torch's
    momentum and unbiased variance) are used at evaluation, as ``nn.BatchNorm1d``'s are. The parameters
    and buffers are ``nn.BatchNorm1d``'s, so its weights load as they are. ``synchronise`` False keeps the
    statistics to this rank's batch (:func:`batch_statistics` does, as only rank 0 validates).

    x: (B, C, T); mask: (B, T) True = valid frame -> (B, C, T). Padded frames are normalised too, with
    the valid frames' statistics, and nothing valid reads them.
    """

    synchronise = True

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # type: ignore[override]
        if not self.training and self.track_running_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        synced = _synced if self.synchronise else (lambda total: total)
        valid = mask[:, None, :].to(x.dtype)
        totals = synced(torch.cat(((x * valid).sum((0, 2)), valid.sum().reshape(1))))
        count = totals[-1]
        mean = totals[:-1] / count
        centred = (x - mean[None, :, None]) * valid
        variance = synced((centred * centred).sum((0, 2))) / count
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                unbiased = variance * (count / (count - 1).clamp(min=1.0))
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)
        y = (x - mean[None, :, None]) * torch.rsqrt(variance + self.eps)[None, :, None]
        if self.affine:
            y = y * self.weight[None, :, None] + self.bias[None, :, None]
        return y


class MaskedGroupNorm(nn.GroupNorm):
    """GroupNorm over (B, C, T) per utterance, whose statistics count the valid frames only.

    ``nn.GroupNorm`` would average an utterance's padding in with its frames. With one group (the
    default, torchaudio's ``use_group_norm``) it normalises each utterance over all its channels and
    frames: independent of the batch, unlike BatchNorm, and the same in training and evaluation.

    x: (B, C, T); mask: (B, T) True = valid frame -> (B, C, T).
    """

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # type: ignore[override]
        batch, channels, frames = x.shape
        grouped = x.reshape(batch, self.num_groups, channels // self.num_groups, frames)
        valid = mask[:, None, None, :].to(x.dtype)
        count = valid.sum((2, 3), keepdim=True) * (channels // self.num_groups)
        mean = (grouped * valid).sum((2, 3), keepdim=True) / count
        centred = (grouped - mean) * valid
        variance = (centred * centred).sum((2, 3), keepdim=True) / count
        y = ((grouped - mean) * torch.rsqrt(variance + self.eps)).reshape(batch, channels, frames)
        if self.affine:
            y = y * self.weight[None, :, None] + self.bias[None, :, None]
        return y


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of each frame of (B, C, T) (ESPnet's ``cnn_module_norm: layer_norm``):
    per frame, so neither the batch nor the padding reaches it. ``mask`` is accepted and unused."""

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:  # type: ignore[override]
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class NoNorm(nn.Module):
    """``model.encoder.conv_norm: none``: (B, C, T) passes unchanged."""

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return x


def make_conv_norm(kind: str, channels: int, eps: float = 1e-5, groups: int = 1) -> nn.Module:
    """The convolution module's norm over (B, C, T) with a frame mask: ``batchnorm``, ``layernorm``
    (over channels, per frame), ``groupnorm`` (``groups`` groups, per utterance) or ``none``."""
    if kind == "batchnorm":
        return MaskedBatchNorm1d(channels, eps=eps)
    if kind == "layernorm":
        return ChannelLayerNorm(channels, eps=eps)
    if kind == "groupnorm":
        return MaskedGroupNorm(groups, channels, eps=eps)
    if kind == "none":
        return NoNorm()
    raise ValueError(f"conv_norm must be one of {CONV_NORMS}, got {kind!r}")


@contextmanager
def _batch_mode(model: nn.Module) -> Iterator[list[MaskedBatchNorm1d]]:
    """Inside: every :class:`MaskedBatchNorm1d` of ``model`` that tracks running statistics is in training
    mode and unsynchronised (its own process's batch only); yields them. Every other module keeps its
    mode. Each norm's mode, ``synchronise`` and momentum are restored after; its statistics are not."""
    norms = [m for m in model.modules() if isinstance(m, MaskedBatchNorm1d) and m.track_running_stats]
    saved = [(m.training, m.synchronise, m.momentum) for m in norms]
    for norm in norms:
        norm.train()
        norm.synchronise = False
    try:
        yield norms
    finally:
        for norm, (training, synchronise, momentum) in zip(norms, saved):
            norm.train(training)
            norm.synchronise = synchronise
            norm.momentum = momentum


@contextmanager
def batch_statistics(model: nn.Module) -> Iterator[int]:
    """Inside: every :class:`MaskedBatchNorm1d` of ``model`` normalises with the batch's own statistics,
    as in training, while every other module keeps its mode (dropout stays off in an evaluated model)
    and no running statistic moves. Yields how many such norms there are. What training-mode BatchNorm
    would make of the same batch, beside what evaluation makes of it (``valid_batchnorm_gap``). The
    statistics are this process's batch's alone, never summed over ranks: under DDP only rank 0 validates,
    and a collective the other ranks never join would wait for ever."""
    with _batch_mode(model) as norms:
        saved = [(m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone()) for m in norms]
        try:
            yield len(norms)
        finally:
            for norm, (mean, var, count) in zip(norms, saved):
                norm.running_mean.copy_(mean), norm.running_var.copy_(var), norm.num_batches_tracked.copy_(count)


@torch.no_grad()
def recompute_batch_statistics(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]]) -> int:
    """Re-estimate the running statistics of every :class:`MaskedBatchNorm1d` of ``model`` from
    ``batches`` of ``(features, lengths)``, with the weights as they are: the statistics are reset and
    each batch's (training mode, valid frames only) enters with equal weight (momentum None, a
    cumulative mean), as ``torch.optim.swa_utils.update_bn`` does for averaged weights. Every other
    module keeps its mode (dropout stays off in an evaluated model); each norm's momentum, mode and
    ``synchronise`` are restored after. Returns how many batches went in (0: the model has no such
    norm, and nothing was run)."""
    count = 0
    with _batch_mode(model) as norms:
        if not norms:
            return 0
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None
        for features, lengths in batches:
            model.encode(features, lengths)
            count += 1
    return count

"""Normalisation layers for the Transformer: LayerNorm, ScaleNorm and FixNorm.

``make_norm(norm_type, dim, eps)`` is the one place a Transformer sublayer
norm is built, so ``model.norm_type`` switches every norm of both stacks at
once. FixNorm is different in kind: it normalises the rows of an embedding
table, not activations, and is applied by the token embedding (see
``asr.models.transformer.TokenEmbedding``).

Reference: Nguyen & Salazar (2019), "Transformers without Tears: Improving
the Normalization of Self-Attention". Where every norm sits, per setting, is
documented in ``docs/normalization.md``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

NormType = Literal["layernorm", "scalenorm"]
NORM_TYPES = ("layernorm", "scalenorm")


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
    """The sublayer norm named by ``norm_type``: ``"layernorm"`` or ``"scalenorm"``.

    Both map (..., dim) -> (..., dim) over the last dimension.
    """
    if norm_type == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if norm_type == "scalenorm":
        return ScaleNorm(dim, eps=eps)
    raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {norm_type!r}")

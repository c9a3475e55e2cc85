"""Helpers for padded batches of feature frames ``(B, T, D)`` with per-row lengths ``(B,)``."""

from __future__ import annotations

import torch
from torch import Tensor


def valid_frames(lengths: Tensor, num_frames: int) -> Tensor:
    """``(B, T)`` bool, True = a valid frame (before the row's length), False = padding."""
    return torch.arange(num_frames, device=lengths.device)[None, :] < lengths[:, None]


def take_frames(feats: Tensor, index: Tensor) -> Tensor:
    """``out[b, t] = feats[b, index[b, t]]`` for ``feats (B, T, D)`` and ``index (B, T')`` long.

    As one ``index_select`` on the flattened frames: ``torch.gather`` with an index expanded over D
    is an order of magnitude slower on CPU, where the loader path runs this for every utterance.
    """
    batch, frames, dim = feats.shape
    rows = torch.arange(batch, device=feats.device)[:, None] * frames
    return feats.reshape(batch * frames, dim).index_select(0, (index + rows).flatten()).view(*index.shape, dim)

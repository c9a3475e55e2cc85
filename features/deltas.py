"""Delta and delta-delta features, as Kaldi's ``add-deltas`` computes them.

With window N = 2 (Kaldi's default), the delta of a sequence c is

    d_t = sum_{n=1..N} n * (c_{t+n} - c_{t-n}) / (2 * sum_{n=1..N} n^2),

a 5-tap regression filter. The delta-delta is the same filter applied twice,
i.e. a 9-tap filter on c. At the edges Kaldi clamps frame indices to
[0, T-1] *on the input features* for both orders (which is not the same as
taking deltas of the already edge-padded deltas); here both filters read
``c`` at clamped indices directly. Written as gathers over a batch with
per-row lengths, so that padded frames of a batch are never read: each
utterance is clamped at its own last frame.
"""

from __future__ import annotations

import torch
from torch import Tensor

from features.frames import take_frames

DELTA_WINDOW = 2  # N above; the filter has 2N + 1 taps


def _filters() -> tuple[Tensor, Tensor]:
    """The delta filter (2N + 1 taps) and the delta-delta filter (4N + 1 taps, the first convolved with itself)."""
    offsets = torch.arange(-DELTA_WINDOW, DELTA_WINDOW + 1, dtype=torch.float64)
    delta = offsets / (2 * (offsets[DELTA_WINDOW + 1 :] ** 2).sum())
    twice = torch.nn.functional.conv1d(
        torch.nn.functional.pad(delta, (2 * DELTA_WINDOW, 2 * DELTA_WINDOW))[None, None], delta.flip(0)[None, None]
    )
    return delta, twice.flatten()


def add_deltas(feats: Tensor) -> Tensor:
    """``(T, D)`` -> ``(T, 3D)``: ``[feats, delta, delta-delta]`` along the feature axis."""
    lengths = torch.tensor([feats.shape[0]], device=feats.device)
    return add_deltas_batch(feats.unsqueeze(0), lengths).squeeze(0)


def add_deltas_batch(feats: Tensor, lengths: Tensor) -> Tensor:
    """``(B, T, D)`` with ``lengths (B,)`` valid frames -> ``(B, T, 3D)``, each row's frame indices clamped to
    ``[0, length - 1]`` (frames after a row's length hold unspecified values)."""
    delta_taps, twice_taps = _filters()
    frames = torch.arange(feats.shape[1], device=feats.device)[None, :]  # (1, T)
    last = (lengths.to(feats.device) - 1).clamp(min=0)[:, None]  # (B, 1)

    def filtered(taps: Tensor) -> Tensor:
        half = (len(taps) - 1) // 2
        out = torch.zeros_like(feats)
        for offset, tap in zip(range(-half, half + 1), taps.tolist()):
            if tap == 0.0:
                continue
            index = torch.minimum((frames + offset).clamp(min=0), last)  # (B, T)
            out += tap * take_frames(feats, index)
        return out

    return torch.cat([feats, filtered(delta_taps), filtered(twice_taps)], dim=2)

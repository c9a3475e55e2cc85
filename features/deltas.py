"""Delta and delta-delta features, as Kaldi's ``add-deltas`` computes them.

With window N = 2 (Kaldi's default), the delta of a sequence c is

    d_t = sum_{n=1..N} n * (c_{t+n} - c_{t-n}) / (2 * sum_{n=1..N} n^2),

a 5-tap regression filter. The delta-delta is the same filter applied twice,
i.e. a 9-tap filter on c. At the edges Kaldi clamps frame indices to
[0, T-1] *on the input features* for both orders; we reproduce that by
replicate-padding c by 4 frames before filtering twice and cropping, which
is not the same as taking deltas of the (already edge-padded) deltas.
"""

from __future__ import annotations

import torch
import torchaudio
from torch import Tensor

DELTA_WINDOW = 2  # N above; the filter has 2N + 1 taps


def add_deltas(feats: Tensor) -> Tensor:
    """``(T, D)`` -> ``(T, 3D)``: ``[feats, delta, delta-delta]`` along the feature axis."""
    win_length = 2 * DELTA_WINDOW + 1
    # compute_deltas works on (..., D, T) and replicate-pads by DELTA_WINDOW frames.
    x = feats.transpose(0, 1).unsqueeze(0)  # (1, D, T)
    delta = torchaudio.functional.compute_deltas(x, win_length=win_length)
    pad = 2 * DELTA_WINDOW
    padded = torch.nn.functional.pad(x, (pad, pad), mode="replicate")
    twice = torchaudio.functional.compute_deltas(
        torchaudio.functional.compute_deltas(padded, win_length=win_length), win_length=win_length
    )
    # The cropped frames of `twice` only ever saw real (clamped) frames of c, never the extra padding.
    delta_delta = twice[..., pad:-pad]
    return torch.cat([x, delta, delta_delta], dim=1).squeeze(0).transpose(0, 1).contiguous()

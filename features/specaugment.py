"""SpecAugment (Park et al. 2019): time warp, frequency masks and time masks on ``(T, D)`` features.

Training only; :class:`features.pipeline.FeaturePipeline` never calls it when
``train=False``.

Where it runs, and what a mask is filled with. The paper masks log-mel
spectrograms that were normalised to zero mean and fills masked cells with 0,
i.e. with the mean. We keep that meaning rather than the literal 0:

- SpecAugment runs AFTER mean-variance normalisation. With ``mvn: utterance``
  or ``mvn: global``, 0 is the (utterance or training-set) mean of every
  feature dimension, so masked cells are filled with 0 (``fill="zero"``).
- With ``mvn: none`` a literal 0 would be an arbitrary constant in log-mel
  space (a log energy of 0 in int16 units, far from both speech and silence),
  and log(0) would be worse. Masked cells are then filled with this
  utterance's mean of each feature bin (``fill="mean"``, computed on the
  features handed to :func:`spec_augment`, before masking).

Either way a masked region looks like "average speech" to the model, not like
a value it never sees otherwise.

Order and randomness. :func:`spec_augment` warps first (when ``time_warp > 0``),
then draws all frequency masks, then all time masks, each from the given
``torch.Generator`` (the global RNG if ``None``), so the same generator state
gives the same augmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from features.config import SpecAugmentConfig


@dataclass
class Masks:
    """Mask positions for one utterance; a mask is ``(first index, width)``, width may be 0."""

    freq: list[tuple[int, int]] = field(default_factory=list)  # along D (bins)
    time: list[tuple[int, int]] = field(default_factory=list)  # along T (frames)


def _randint(low: int, high: int, generator: torch.Generator | None) -> int:
    """Uniform integer in [low, high], both inclusive."""
    return int(torch.randint(low, high + 1, (1,), generator=generator).item())


def draw_masks(
    num_frames: int, num_bins: int, config: SpecAugmentConfig, generator: torch.Generator | None = None
) -> Masks:
    """Draw ``config.freq_masks`` frequency and ``config.time_masks`` time masks for a ``(T, D)`` input.

    Frequency width f ~ U{0..min(F, D)}, start ~ U{0..D-f}. Time width
    t ~ U{0..min(T_max, floor(p * T))}, start ~ U{0..T-t}, where T_max is
    ``time_mask_width`` and p is ``time_mask_ratio`` (the paper's upper bound,
    so short utterances are not wiped out).
    """
    masks = Masks()
    max_f = min(config.freq_mask_width, num_bins)
    for _ in range(config.freq_masks):
        width = _randint(0, max_f, generator)
        masks.freq.append((_randint(0, num_bins - width, generator), width))
    max_t = min(config.time_mask_width, int(config.time_mask_ratio * num_frames))
    for _ in range(config.time_masks):
        width = _randint(0, max_t, generator)
        masks.time.append((_randint(0, num_frames - width, generator), width))
    return masks


def apply_masks(feats: Tensor, masks: Masks, fill: Tensor | None = None) -> Tensor:
    """Copy of ``feats (T, D)`` with masked cells set to ``fill (D,)`` per bin, or 0 if ``fill`` is None."""
    out = feats.clone()
    fill_row = torch.zeros(feats.shape[1], dtype=feats.dtype, device=feats.device) if fill is None else fill
    for start, width in masks.freq:
        out[:, start : start + width] = fill_row[start : start + width]
    for start, width in masks.time:
        out[start : start + width, :] = fill_row
    return out


def time_warp(feats: Tensor, max_warp: int, generator: torch.Generator | None = None) -> Tensor:
    """Warp ``feats (T, D)`` along time, keeping the shape ``(T, D)``.

    A centre frame c ~ U{W+1..T-W-1} is moved to c + w, w ~ U{-W..W}; the two
    sides are stretched/squeezed by linear interpolation with their outer
    frames fixed (so the first and last frame are unchanged). A piecewise
    linear stand-in for the paper's sparse image warp, as in ESPnet/Lingvo
    ports. Utterances with T < 2W + 2 are returned unchanged.
    """
    num_frames = feats.shape[0]
    if max_warp <= 0 or num_frames < 2 * max_warp + 2:
        return feats
    centre = _randint(max_warp + 1, num_frames - max_warp - 1, generator)
    warped = centre + _randint(-max_warp, max_warp, generator)
    x = feats.transpose(0, 1).unsqueeze(0)  # (1, D, T): interpolate works on the last axis
    left = F.interpolate(x[..., :centre], size=warped, mode="linear", align_corners=True)
    right = F.interpolate(x[..., centre:], size=num_frames - warped, mode="linear", align_corners=True)
    return torch.cat([left, right], dim=-1).squeeze(0).transpose(0, 1).contiguous()


def spec_augment(
    feats: Tensor,
    config: SpecAugmentConfig,
    generator: torch.Generator | None = None,
    fill: Literal["zero", "mean"] = "zero",
) -> Tensor:
    """Time warp, then frequency and time masks: ``(T, D)`` -> ``(T, D)``.

    ``fill="zero"`` for mean-variance-normalised features (0 is the mean);
    ``fill="mean"`` fills with each bin's mean over this utterance (for
    ``mvn: none``). See the module docstring.
    """
    if fill not in ("zero", "mean"):
        raise ValueError(f"spec_augment: fill must be 'zero' or 'mean', got {fill!r}")
    fill_row = feats.mean(dim=0) if fill == "mean" else None
    feats = time_warp(feats, config.time_warp, generator)
    masks = draw_masks(feats.shape[0], feats.shape[1], config, generator)
    return apply_masks(feats, masks, fill_row)

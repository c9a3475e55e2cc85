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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from features.config import SpecAugmentConfig
from features.frames import take_frames, valid_frames


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


def draw_time_warp(num_frames: int, max_warp: int, generator: torch.Generator | None = None) -> tuple[int, int] | None:
    """``(centre, warped centre)`` of a time warp of ``num_frames`` frames, or None when ``max_warp`` is 0 or
    the utterance is too short (``T < 2W + 2``): c ~ U{W+1..T-W-1}, warped = c + w, w ~ U{-W..W}."""
    if max_warp <= 0 or num_frames < 2 * max_warp + 2:
        return None
    centre = _randint(max_warp + 1, num_frames - max_warp - 1, generator)
    return centre, centre + _randint(-max_warp, max_warp, generator)


def time_warp(feats: Tensor, max_warp: int, generator: torch.Generator | None = None) -> Tensor:
    """Warp ``feats (T, D)`` along time, keeping the shape ``(T, D)``.

    A centre frame c ~ U{W+1..T-W-1} is moved to c + w, w ~ U{-W..W}; the two
    sides are stretched/squeezed by linear interpolation with their outer
    frames fixed (so the first and last frame are unchanged). A piecewise
    linear stand-in for the paper's sparse image warp, as in ESPnet/Lingvo
    ports. Utterances with T < 2W + 2 are returned unchanged.
    """
    warp = draw_time_warp(feats.shape[0], max_warp, generator)
    if warp is None:
        return feats
    lengths = torch.tensor([feats.shape[0]], device=feats.device)
    return warp_frames(feats.unsqueeze(0), lengths, [warp]).squeeze(0)


def warp_frames(feats: Tensor, lengths: Tensor, warps: Sequence[tuple[int, int] | None]) -> Tensor:
    """Time warp each row of ``feats (B, T, D)`` (``lengths (B,)`` valid frames) by ``warps[b]``
    (``(centre, warped centre)`` from :func:`draw_time_warp`, None = unchanged), batched.

    What ``F.interpolate(mode="linear", align_corners=True)`` does to each side of the centre
    (frames ``[0, c)`` stretched onto ``[0, c')``, frames ``[c, T)`` onto ``[c', T)``), written
    as one gather so that a batch of utterances of different lengths and warps is one operation
    on the device. Frames after a row's length are left as they are.
    """
    batch, frames = feats.shape[:2]
    device = feats.device
    centre = torch.tensor([w[0] if w else 0 for w in warps], dtype=torch.float64, device=device)[:, None]
    warped = torch.tensor([w[1] if w else 0 for w in warps], dtype=torch.float64, device=device)[:, None]
    length = lengths.to(device, torch.float64)[:, None]
    out_index = torch.arange(frames, dtype=torch.float64, device=device)[None, :]  # (1, T)
    # align_corners=True: output j of a side of n_in -> n_out frames reads input j * (n_in - 1) / (n_out - 1).
    left = out_index * _ratio(centre - 1, warped - 1)
    right = centre + (out_index - warped) * _ratio(length - centre - 1, length - warped - 1)
    source = torch.where(out_index < warped, left, right)
    has_warp = torch.tensor([w is not None for w in warps], device=device)[:, None]
    source = torch.where(has_warp & (out_index < length), source, out_index)  # (B, T)
    low = source.floor()
    # the last frame of each side interpolates with nothing beyond it (the side ends there)
    side_end = torch.where(out_index < warped, centre - 1, length - 1)
    side_end = torch.where(has_warp & (out_index < length), side_end, out_index)
    high = torch.minimum(low + 1, side_end)
    weight = (source - low).to(feats.dtype)[..., None]
    return take_frames(feats, low.long()) * (1 - weight) + take_frames(feats, high.long()) * weight


def _ratio(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator``, 0 where the denominator is 0 (a side of one frame maps to its first)."""
    return torch.where(denominator > 0, numerator / denominator.clamp(min=1), torch.zeros_like(numerator))


@dataclass
class SpecAugmentDraws:
    """Everything random about one utterance's SpecAugment. The draws depend only on the feature shape
    ``(T, D)``, so they can be made where the audio is read (a DataLoader worker, with the utterance's
    own generator) and applied later, batched, where the features are computed (:func:`apply_batch`)."""

    warp: tuple[int, int] | None  # (centre, warped centre) of the time warp; None: not warped
    masks: Masks


def draw(
    num_frames: int, num_bins: int, config: SpecAugmentConfig, generator: torch.Generator | None = None
) -> SpecAugmentDraws:
    """The time warp, then the frequency and time masks of a ``(num_frames, num_bins)`` input, in that order."""
    warp = draw_time_warp(num_frames, config.time_warp, generator)
    return SpecAugmentDraws(warp, draw_masks(num_frames, num_bins, config, generator))


def apply_batch(
    feats: Tensor, lengths: Tensor, draws: Sequence[SpecAugmentDraws], fill: Literal["zero", "mean"] = "zero"
) -> Tensor:
    """SpecAugment of each row of ``feats (B, T, D)`` with its ``draws``; ``lengths (B,)`` are the valid frames.

    Padded frames (after a row's length) take no part: they are not in the mean of ``fill="mean"``
    and no warp reads them; what they hold afterwards is unspecified (the caller zeroes them).
    """
    if fill not in ("zero", "mean"):
        raise ValueError(f"spec_augment: fill must be 'zero' or 'mean', got {fill!r}")
    batch, frames, bins = feats.shape
    valid = valid_frames(lengths.to(feats.device), frames)  # (B, T), True = valid
    if fill == "mean":
        counts = lengths.to(feats.device, feats.dtype).clamp(min=1)[:, None]
        fill_rows = (feats * valid[..., None]).sum(dim=1) / counts  # (B, D), before the warp as in spec_augment
    else:
        fill_rows = torch.zeros(batch, bins, dtype=feats.dtype, device=feats.device)
    if any(d.warp is not None for d in draws):
        feats = warp_frames(feats, lengths, [d.warp for d in draws])
    masked = _mask_cells(draws, frames, bins, feats.device)
    return torch.where(masked, fill_rows[:, None, :], feats)


def _mask_cells(draws: Sequence[SpecAugmentDraws], frames: int, bins: int, device: torch.device) -> Tensor:
    """``(B, T, D)`` bool, True = masked, from each row's frequency and time masks."""

    def spans(masks: list[list[tuple[int, int]]], size: int) -> Tensor:
        width = max((len(m) for m in masks), default=0)
        starts = torch.zeros(len(masks), max(width, 1), dtype=torch.long)
        ends = torch.zeros_like(starts)  # empty spans [0, 0) pad rows with fewer masks
        for row, row_masks in enumerate(masks):
            for column, (start, extent) in enumerate(row_masks):
                starts[row, column], ends[row, column] = start, start + extent
        starts, ends = starts.to(device), ends.to(device)
        position = torch.arange(size, device=device)[None, :, None]  # (1, size, 1)
        return ((position >= starts[:, None, :]) & (position < ends[:, None, :])).any(dim=2)  # (B, size)

    freq = spans([d.masks.freq for d in draws], bins)  # (B, D)
    time = spans([d.masks.time for d in draws], frames)  # (B, T)
    return freq[:, None, :] | time[:, :, None]


def spec_augment(
    feats: Tensor,
    config: SpecAugmentConfig,
    generator: torch.Generator | None = None,
    fill: Literal["zero", "mean"] = "zero",
) -> Tensor:
    """Time warp, then frequency and time masks: ``(T, D)`` -> ``(T, D)``.

    ``fill="zero"`` for mean-variance-normalised features (0 is the mean);
    ``fill="mean"`` fills with each bin's mean over this utterance (for
    ``mvn: none``). See the module docstring. The same code as the batched
    :func:`apply_batch`, on a batch of one.
    """
    if fill not in ("zero", "mean"):
        raise ValueError(f"spec_augment: fill must be 'zero' or 'mean', got {fill!r}")
    draws = draw(feats.shape[0], feats.shape[1], config, generator)
    lengths = torch.tensor([feats.shape[0]], device=feats.device)
    return apply_batch(feats.unsqueeze(0), lengths, [draws], fill).squeeze(0)

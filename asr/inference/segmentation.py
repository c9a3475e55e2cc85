"""Long utterances decoded in pieces: cut at the quietest stretches, decode each piece, join the transcripts.

An attention decoder trained on short utterances skips words on longer ones:
its state has never counted that far (docs/results.md, "Long utterances").
Long-form recognisers avoid the problem by never showing the decoder more than
it was trained on: Whisper decodes 30-second windows, and ESPnet and icefall
cut long recordings into segments first. This module does the same with the
simplest cue there is, loudness: an utterance longer than ``max_frames`` is
cut at the frame where the loudness, averaged over ``smooth`` frames (a fifth
of a second at 10 ms frames), is lowest, which in speech is a pause between
words, and each side is cut again until no piece is longer than
``max_frames``. No piece is shorter than a quarter of ``max_frames``, so a cut
never leaves a sliver.

Loudness is read from the features themselves (:func:`loudness`), so pieces
are cut from the very features the model reads (after MVN: a per-utterance
MVN is the whole utterance's, not each piece's). The recogniser joins the
pieces' transcripts with a space (:meth:`asr.inference.recogniser.Recogniser.transcribe`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from features.config import FeatureConfig

SMOOTH_SECONDS = 0.2  # the stretch loudness is averaged over: shorter than a pause between words is long


def loudness(features: torch.Tensor, config: FeatureConfig) -> torch.Tensor:
    """(T,) a per-frame loudness of ``features`` (T, D) made by ``config``: the zeroth cepstrum of MFCCs
    (proportional to the summed log mel energies), the mean log mel energy of a filterbank.
    Only its order within the utterance matters, so MVN does not change what it says."""
    if config.kind == "mfcc":
        return features[:, 0].float()
    return features[:, : config.num_mel_bins].float().mean(1)


def cut_points(level: torch.Tensor, max_frames: int, smooth: int = 1) -> list[int]:
    """Frames (ascending) at which to cut an utterance with per-frame loudness ``level`` (T,) so that no
    piece is longer than ``max_frames``: each cut at the quietest frame (``level`` averaged over
    ``smooth`` frames around it) that leaves at least ``max_frames // 4`` frames on either side."""
    if max_frames < 4:
        raise ValueError(f"max_frames must be at least 4, got {max_frames}")
    smooth = max(1, smooth) | 1  # odd, so the average is centred on its frame
    smoothed = F.avg_pool1d(
        level.float().view(1, 1, -1), smooth, stride=1, padding=smooth // 2, count_include_pad=False
    ).view(-1)
    shortest = max_frames // 4
    cuts: list[int] = []

    def split(start: int, end: int) -> None:
        if end - start <= max_frames:
            return
        low, high = start + shortest, end - shortest  # non-empty: end - start > max_frames >= 4 * shortest
        cut = low + int(smoothed[low:high].argmin())
        split(start, cut)
        cuts.append(cut)
        split(cut, end)

    split(0, level.numel())
    return cuts


def split_features(features: torch.Tensor, config: FeatureConfig, max_seconds: float) -> list[torch.Tensor]:
    """``features`` (T, D) in pieces of at most ``max_seconds`` each, cut where it is quietest (module docstring);
    one piece, ``features`` itself, when it is not longer."""
    per_second = 1000.0 / config.frame_shift_ms
    max_frames = int(max_seconds * per_second)
    if features.size(0) <= max_frames:
        return [features]
    cuts = cut_points(loudness(features, config), max_frames, round(SMOOTH_SECONDS * per_second))
    bounds = [0, *cuts, features.size(0)]
    return [features[start:end] for start, end in zip(bounds, bounds[1:])]

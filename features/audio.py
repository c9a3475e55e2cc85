"""Audio input: read a file, downmix to mono, resample to the configured rate.

Files are read with ``soundfile`` (WAV, FLAC, OGG, ...); ``torchaudio.load``
is not used because it needs FFmpeg/torchcodec, which this toolkit does not
require. Waveforms are float32 in [-1, 1] and channels-first, ``(C, N)``.
"""

from __future__ import annotations

from pathlib import Path

import soundfile
import torch
import torchaudio
from torch import Tensor


class AudioError(ValueError):
    """Audio that cannot be used: missing, unreadable, empty or too short. Names the file when there is one."""


def load_audio(path: str | Path) -> tuple[Tensor, int]:
    """Read an audio file as it is stored (no downmix, no resampling).

    Returns ``(waveform (C, N) float32 in [-1, 1], sample_rate)``. A missing,
    unreadable or zero-length file raises :class:`AudioError` naming ``path``.
    """
    path = Path(path)
    if not path.is_file():
        raise AudioError(f"audio file not found: {path}")
    try:
        # always_2d gives (N, C) even for mono, so the layout never depends on the file.
        data, sample_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise AudioError(f"cannot read audio file {path}: {err}") from err
    if data.shape[0] == 0:
        raise AudioError(f"audio file {path} contains no samples")
    return torch.from_numpy(data.T.copy()), int(sample_rate)


def to_mono(waveform: Tensor) -> Tensor:
    """``(C, N)`` or ``(N,)`` -> ``(N,)``, averaging the channels.

    Averaging (rather than taking channel 0) keeps speech that is panned to
    one side and does not change the level of a mono file stored as stereo.
    """
    if waveform.dim() == 1:
        return waveform
    if waveform.dim() != 2 or waveform.shape[0] == 0:
        raise AudioError(f"expected a waveform of shape (C, N) or (N,), got {tuple(waveform.shape)}")
    return waveform.mean(dim=0)


def resample(waveform: Tensor, orig_rate: int, new_rate: int) -> Tensor:
    """Band-limited (sinc) resampling along the last axis; a no-op when the rates agree."""
    if orig_rate <= 0:
        raise AudioError(f"sample rate must be positive, got {orig_rate}")
    if orig_rate == new_rate:
        return waveform
    return torchaudio.functional.resample(waveform, orig_rate, new_rate)

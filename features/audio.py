"""Audio input: read a file, downmix to mono, resample to the configured rate.

Files are read with ``soundfile`` (WAV, FLAC, OGG, ...); ``torchaudio.load``
is not used because it needs FFmpeg/torchcodec, which this toolkit does not
require. Waveforms are float32 in [-1, 1] and channels-first, ``(C, N)``.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from pathlib import Path

import soundfile
import torch
import torchaudio
from torch import Tensor

logger = logging.getLogger(__name__)


class AudioError(ValueError):
    """Audio that cannot be used: missing, unreadable, damaged, empty or too short. Names the file when there is one.

    ``reason`` is a short phrase that says which, for the skip reports of
    :mod:`asr.data.report`; the subclasses below set their own.
    """

    reason = "audio that fails to decode"


class MissingAudioError(AudioError):
    """No file at the path given."""

    reason = "missing audio file"


class NonFiniteAudioError(AudioError):
    """Samples that are NaN or infinite: one such file would turn every statistic computed over it into NaN."""

    reason = "non-finite samples"


class ShortAudioError(AudioError):
    """Too few samples for even one analysis frame."""

    reason = "shorter than one frame"


class TruncatedAudioError(AudioError):
    """A WAV file cut short: its header promises more samples than the file holds (a copy or a download
    that stopped). Decoders read what is there without a word; training skips it (:func:`load_audio`)."""

    reason = "truncated audio file"


def truncation(path: str | Path) -> str | None:
    """How a WAV file falls short of what its header promises, in words, or None (not a WAV, or whole).

    Reads the RIFF chunk headers only (a few bytes each). A ``data`` size of 0 or 0xFFFFFFFF is what a
    writer that streamed the file and never came back to its header leaves: no promise, no truncation."""
    import struct

    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            block_align = 0
            while True:
                chunk = f.read(8)
                if len(chunk) < 8:
                    return None
                name, length = chunk[:4], struct.unpack("<I", chunk[4:])[0]
                if name == b"fmt ":
                    fmt = f.read(min(length, 16))
                    block_align = struct.unpack("<H", fmt[12:14])[0] if len(fmt) >= 14 else 0
                    f.seek(length - len(fmt) + (length & 1), 1)
                    continue
                if name == b"data":
                    if length in (0, 0xFFFFFFFF):
                        return None
                    held = size - f.tell()
                    if held >= length:
                        return None
                    if block_align:
                        return f"its header promises {length // block_align} samples, the file holds {held // block_align}"
                    return f"its header promises {length} bytes of samples, the file holds {held}"
                f.seek(length + (length & 1), 1)
    except OSError:
        return None  # load_audio says why it cannot be read


_warned_truncated: set[str] = set()  # each truncated file is named once per process, however often it is read


def load_audio(path: str | Path, start: float = 0.0, end: float | None = None,
               truncated: str = "warn") -> tuple[Tensor, int]:
    """Read an audio file as it is stored (no downmix, no resampling).

    Returns ``(waveform (C, N) float32 in [-1, 1], sample_rate)``. ``start``
    and ``end`` (seconds; ``end`` None = the end of the file) read a span
    alone: WAV and FLAC seek to it without decoding what comes before. A missing,
    unreadable, damaged or zero-length file (or span) raises :class:`AudioError`
    naming ``path`` (a folder, a broken symbolic link and a loop of them are each named as such);
    one with NaN or infinite samples (a float WAV can hold them) raises :class:`NonFiniteAudioError`.
    A WAV file cut short (:func:`truncation`) is decoded from what is there with a warning naming it
    (``truncated="warn"``: what a user who transcribes it wants), or raises :class:`TruncatedAudioError`
    (``truncated="refuse"``: training data, where its transcript would describe audio that is gone).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingAudioError(_not_a_file(path))
    cut = truncation(path)
    if cut is not None:
        if truncated == "refuse":
            raise TruncatedAudioError(f"audio file {path} is truncated: {cut}")
        if str(path) not in _warned_truncated:
            _warned_truncated.add(str(path))
            logger.warning("audio file %s is truncated: %s; decoding what is there", path, cut)
    try:
        with soundfile.SoundFile(str(path)) as f:
            sample_rate = f.samplerate
            first = round(start * sample_rate)
            if first:
                f.seek(first)
            frames = -1 if end is None else max(round(end * sample_rate) - first, 0)
            # always_2d gives (N, C) even for mono, so the layout never depends on the file.
            data = f.read(frames, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise AudioError(f"cannot read audio file {path}: {err}") from err
    if data.shape[0] == 0:
        span = "" if not start and end is None else f" from {start:.3f} s to {'the end' if end is None else f'{end:.3f} s'}"
        raise AudioError(f"audio file {path} contains no samples{span}")
    waveform = torch.from_numpy(data.T.copy())
    check_finite(waveform, str(path))
    return waveform, int(sample_rate)


def _not_a_file(path: Path) -> str:
    """Why ``path``, which is not a regular file, cannot be read as audio, naming it."""
    if path.is_dir():
        return f"{path} is a folder, not an audio file"
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python < 3.13 reports a loop so
            return f"{path} is a loop of symbolic links"
        except OSError as err:
            if err.errno == errno.ELOOP:
                return f"{path} is a loop of symbolic links"
            return f"{path} is a symbolic link to {os.readlink(path)}, which does not exist"
        return f"{path} is a symbolic link to something that is not a file"
    if path.exists():
        return f"{path} is not a regular file (a device or a pipe)"
    return f"audio file not found: {path}"


def check_finite(waveform: Tensor, where: str) -> None:
    """Raise :class:`NonFiniteAudioError` naming ``where`` if any sample of ``waveform`` is NaN or infinite."""
    finite = torch.isfinite(waveform)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise NonFiniteAudioError(f"{where}: {bad} of {waveform.numel()} samples are NaN or infinite")


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
    return _resampler(orig_rate, new_rate, waveform.dtype, waveform.device)(waveform)


@functools.lru_cache(maxsize=32)
def _resampler(orig_rate: int, new_rate: int, dtype: torch.dtype, device: torch.device) -> torchaudio.transforms.Resample:
    # torchaudio.functional.resample builds its sinc kernel on every call, which cost as much as
    # the filtering for a few seconds of audio; training resamples every utterance (speed
    # perturbation, band limits) between a handful of rate pairs, so the kernels are kept.
    return torchaudio.transforms.Resample(orig_rate, new_rate, dtype=dtype).to(device)

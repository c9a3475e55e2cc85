"""The record every corpus reader produces and every later stage consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from features.audio import AudioError, load_audio

# The splits a recipe's data is divided into (asr.data.config, asr.data.demo).
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True, eq=False)
class InMemoryAudio:
    """Audio that exists only in memory (e.g. a connected-digit utterance built from several takes).

    waveform: (C, N) float32 in [-1, 1], channels first, as ``features.audio.load_audio`` returns.
    sources:  the files it was built from, so an error about it can name them.

    ``eq=False``: two buffers are the same only if they are the same object;
    comparing or hashing sample arrays would be slow and rarely meaningful.
    """

    waveform: torch.Tensor = field(repr=False)
    sample_rate: int
    sources: tuple[Path, ...] = ()

    @property
    def num_samples(self) -> int:
        return int(self.waveform.shape[-1])

    def __str__(self) -> str:
        names = ", ".join(p.name for p in self.sources[:4]) + (", ..." if len(self.sources) > 4 else "")
        return f"<in-memory audio {self.num_samples} samples at {self.sample_rate} Hz from {names or 'no files'}>"


@dataclass(frozen=True)
class AudioSegment:
    """A span of one channel, or of all channels, of an audio file: a Kaldi ``segments`` line, a lhotse supervision.

    start, end: seconds from the start of the file (``end`` None: to its end).
    channel:    the file's channel to read (a supervision on one channel of a
                multi-channel recording, where the others may hold other talkers);
                None: every channel, down-mixed by the feature pipeline as for a whole file.

    Only the span is read (:func:`read_audio`), never the whole recording.
    """

    path: Path
    start: float = 0.0
    end: float | None = None
    channel: int | None = None

    def __str__(self) -> str:
        end = "end" if self.end is None else f"{self.end:.2f}"
        channel = "" if self.channel is None else f" channel {self.channel}"
        return f"{self.path} [{self.start:.2f}-{end} s{channel}]"


@dataclass(frozen=True)
class Utterance:
    """One transcribed utterance.

    id:       unique within a corpus (LibriSpeech: ``<speaker>-<chapter>-<n>``).
    audio:    a file path, an :class:`AudioSegment` of a file, or an :class:`InMemoryAudio`;
              :func:`read_audio` reads any of them.
    text:     the transcript after :func:`asr.data.text.normalize_text`.
    duration: seconds, from the file header (no decoding), the segment or the buffer length.
    speaker:  speaker id, used for per-speaker analysis and speaker-disjoint splits.
    """

    id: str
    audio: Path | AudioSegment | InMemoryAudio
    text: str
    duration: float
    speaker: str

    @property
    def in_memory(self) -> bool:
        return isinstance(self.audio, InMemoryAudio)

    @property
    def source(self) -> str:
        """What to name in a message about this utterance: the file, or the files it was built from."""
        return str(self.audio)


def read_audio(audio: Path | AudioSegment | InMemoryAudio, truncated: str = "warn") -> tuple[torch.Tensor, int]:
    """``(waveform (C, N) float32, sample_rate)`` of an utterance's audio, as stored (no downmix, no resampling).

    The one place an utterance's samples are read: a segment reads its span
    alone (and its channel, when it names one). Raises
    :class:`~features.audio.AudioError` naming the file; a WAV file cut short is decoded with a warning,
    or refused (``truncated="refuse"``, :func:`features.audio.load_audio`).
    """
    if isinstance(audio, InMemoryAudio):
        return audio.waveform, audio.sample_rate
    if not isinstance(audio, AudioSegment):
        return load_audio(audio, truncated=truncated)
    waveform, sample_rate = load_audio(audio.path, audio.start, audio.end, truncated=truncated)
    if audio.channel is None:
        return waveform, sample_rate
    if not 0 <= audio.channel < waveform.shape[0]:
        raise AudioError(f"{audio}: the file has {waveform.shape[0]} channel(s), no channel {audio.channel}")
    return waveform[audio.channel : audio.channel + 1], sample_rate

"""The record every corpus reader produces and every later stage consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

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
class Utterance:
    """One transcribed utterance.

    id:       unique within a corpus (LibriSpeech: ``<speaker>-<chapter>-<n>``).
    audio:    a file path (read and featurised with ``FeaturePipeline.from_file``) or an
              :class:`InMemoryAudio` (featurised with ``FeaturePipeline.from_waveform``).
    text:     the transcript after :func:`asr.data.text.normalize_text`.
    duration: seconds, from the file header (no decoding) or the buffer length.
    speaker:  speaker id, used for per-speaker analysis and speaker-disjoint splits.
    """

    id: str
    audio: Path | InMemoryAudio
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

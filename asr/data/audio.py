"""What a corpus reader asks of an audio file before any sample is read: how long it is.

Every reader needs each utterance's duration before training, to filter and to
batch by length, and reading the samples of a whole corpus for that would take
minutes. :func:`header_duration` answers from the file's header alone, for the
LibriSpeech reader (:mod:`asr.data.librispeech`, whose answers are cached per
file) and the Kaldi reader (:mod:`asr.data.kaldi`, one header per recording);
a new corpus form calls it too. A file it cannot use raises
:class:`UnusableAudio` with the reason a :class:`~asr.data.report.SkipReport`
counts it under.
"""

from __future__ import annotations

from pathlib import Path

import soundfile

from asr.data import report as reasons


class UnusableAudio(Exception):
    """An audio file a reader cannot use: ``reason`` (an :mod:`asr.data.report` reason) and a message naming it."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


def header_duration(path: str | Path, channel: int | None = None) -> float:
    """Seconds of audio in the file at ``path``, from its header (no samples decoded).

    ``channel``: the channel the reader will take (a Kaldi pipe that picks one, a lhotse
    supervision on one), which the file must have; None: every channel.
    Raises :class:`UnusableAudio` when the file is missing, its header cannot be read
    (libsndfile's formats: WAV, FLAC, Ogg, ...), it holds no samples or lacks the channel.
    """
    path = Path(path)
    if not path.is_file():
        raise UnusableAudio(reasons.MISSING_AUDIO_FILE, f"audio file not found: {path}")
    try:
        info = soundfile.info(str(path))
    except (RuntimeError, OSError, ValueError) as err:  # soundfile.LibsndfileError is a RuntimeError
        raise UnusableAudio(reasons.UNREADABLE_AUDIO, f"{path}: cannot read audio header: {err}") from err
    if info.frames <= 0 or info.samplerate <= 0:
        raise UnusableAudio(reasons.EMPTY_AUDIO, f"{path}: audio file contains no samples")
    if channel is not None and not 0 <= channel < info.channels:
        raise UnusableAudio(
            reasons.UNREADABLE_AUDIO, f"{path} has {info.channels} channel(s), no channel {channel}"
        )
    return info.frames / info.samplerate

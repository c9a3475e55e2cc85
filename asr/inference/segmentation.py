"""Long recordings decoded in pieces cut at pauses: find the speech, pack it into pieces, read each piece alone.

An attention decoder trained on short utterances skips words on longer ones:
its state has never counted that far (docs/studies/long_utterances.md).
Long-form recognisers avoid the problem by never showing the decoder more than
it was trained on: Whisper decodes 30-second windows, and ESPnet and icefall
cut long recordings into segments first, WhisperX packs voice-activity
segments into windows. This module does the last with the simplest cue there
is, loudness, read from the audio itself:

1. :func:`frame_levels`: the level (dB) of every 10 ms frame, read block by
   block (:func:`recording_levels`), so a recording of any length costs its
   levels (1.4 MB an hour) and one block of samples.
2. :func:`plan_pieces`: frames louder than :func:`speech_threshold` are speech;
   quieter stretches shorter than ``MIN_PAUSE_SECONDS`` are part of the words
   around them (the closure before a stop consonant), longer ones are pauses.
   Each speech stretch keeps ``PAD_SECONDS`` of the pause on either side; the
   rest of every pause is left out. The stretches are packed, in order, into
   pieces of at most ``max_seconds`` of audio. A piece is never cut inside a
   word unless the speech goes on for longer than that without a pause; then
   it is cut at its quietest frame (:func:`cut_points`). At the piece's two
   outer edges, the padding stops where the pause is at the recording's floor
   (within ``EDGE_FLOOR_DB`` of its 5th percentile level).
3. The recogniser reads each piece's stretches alone (:func:`read_piece`), joins
   them, computes the features (a per-utterance MVN is the piece's own, as it
   was each training utterance's) and decodes the pieces ``batch_size`` at a
   time (:meth:`asr.inference.recogniser.Recogniser.transcribe`).

Why this shape (measured in docs/studies/long_recordings.md): with the
cutter this module had before (fixed windows cut at their quietest frame),
a quarter of the insertions came from pieces that held no speech, and most of
the rest from long pauses inside pieces: a decoder trained on gaps of at most
0.3 s writes a word into a pause of a second. No cut fell inside a word. A
piece as long as the longest training utterance, once its pauses are short,
holds more words than any training utterance, and the decoder drops the
last ones; so the recogniser's default piece is the mean training utterance.
A piece that begins or ends with a tenth of a second of the pause's floor
looks like no training utterance (those begin and end with the recording's own
margin): a small LAS trained on FSDD takes wrote words into it, and trimming
the floor at the edges took its long-recording WER from 34% to 19%, and cost
the recipe's model 1 point (6.75% to 7.75%; docs/studies/long_recordings.md). Between a piece's stretches the
padding stays: it is the gap between words that training utterances have.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import soundfile
import torch
import torch.nn.functional as F

from asr.data.utterance import AudioSegment, InMemoryAudio, read_audio
from features.audio import AudioError, check_finite, to_mono

FRAME_SECONDS = 0.01     # one level per 10 ms, the feature frame shift
MIN_PAUSE_SECONDS = 0.15  # a quieter stretch this long is a pause; shorter ones are inside a word (a stop's closure)
MIN_SPEECH_SECONDS = 0.05  # louder stretches shorter than this are clicks, not speech
PAD_SECONDS = 0.1        # of a pause kept before and after a piece's speech (FSDD takes start and end about so)
EDGE_FLOOR_DB = 6.0      # at a piece's outer edges, pause frames within this of the recording's floor are left out
SMOOTH_SECONDS = 0.2     # the stretch loudness is averaged over when a word-long cut must be made without a pause
FLOOR_DB = -80.0         # levels below this are this (digital silence would be -inf)
BLOCK_SECONDS = 30.0     # audio read at a time while measuring levels


@dataclass(frozen=True)
class Piece:
    """What of a recording is decoded as one utterance: its speech stretches ``spans``, ``[start, end)`` in
    frames of :data:`FRAME_SECONDS`, in order, each with up to :data:`PAD_SECONDS` of the pause around it;
    the rest of the pauses between them is left out, so no pause inside a piece is longer than a pause
    inside a training utterance (module docstring)."""

    spans: tuple[tuple[int, int], ...]

    @property
    def start(self) -> int:
        return self.spans[0][0]

    @property
    def end(self) -> int:
        return self.spans[-1][1]

    @property
    def frames(self) -> int:
        return sum(end - start for start, end in self.spans)


def frame_levels(waveform: torch.Tensor, sample_rate: int) -> torch.Tensor:
    """(F,) the level in dB (full scale 1) of each whole 10 ms frame of ``waveform`` (C, N) or (N,)."""
    mono = to_mono(waveform).float()
    size = round(FRAME_SECONDS * sample_rate)
    frames = mono[: mono.numel() // size * size].view(-1, size)
    power = frames.pow(2).mean(1)
    return (10 * torch.log10(power.clamp(min=1e-12))).clamp(min=FLOOR_DB)


def recording_levels(audio: Path | AudioSegment | InMemoryAudio) -> tuple[torch.Tensor, int]:
    """(F,) :func:`frame_levels` of a whole recording, and its sample rate. A file is read
    :data:`BLOCK_SECONDS` at a time, never whole; a segment or in-memory audio is read as it is held."""
    if not isinstance(audio, Path):
        waveform, rate = read_audio(audio)
        return frame_levels(waveform, rate), rate
    try:
        with soundfile.SoundFile(str(audio)) as f:
            rate = f.samplerate
            block = round(BLOCK_SECONDS / FRAME_SECONDS) * round(FRAME_SECONDS * rate)  # whole frames
            levels = []
            for data in f.blocks(blocksize=block, dtype="float32", always_2d=True):
                samples = torch.from_numpy(data.T.copy())
                check_finite(samples, str(audio))
                levels.append(frame_levels(samples, rate))
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise AudioError(f"cannot read audio file {audio}: {err}") from err
    if not levels:
        raise AudioError(f"audio file {audio} contains no samples")
    return torch.cat(levels), rate


def read_span(audio: Path | AudioSegment | InMemoryAudio, start: int, end: int) -> tuple[torch.Tensor, int]:
    """(C, n) samples of frames ``[start, end)`` of a recording, and the rate: a file's span alone is read (seek)."""
    start_s, end_s = start * FRAME_SECONDS, end * FRAME_SECONDS
    if isinstance(audio, Path):
        return read_audio(AudioSegment(audio, start_s, end_s))
    if isinstance(audio, AudioSegment):
        last = audio.start + end_s if audio.end is None else min(audio.start + end_s, audio.end)
        return read_audio(AudioSegment(audio.path, audio.start + start_s, last, audio.channel))
    rate = audio.sample_rate
    return audio.waveform[:, round(start_s * rate) : round(end_s * rate)], rate


def read_piece(audio: Path | AudioSegment | InMemoryAudio, piece: Piece) -> tuple[torch.Tensor, int]:
    """(C, n) samples of a piece (its spans joined), and the rate."""
    parts = [read_span(audio, start, end) for start, end in piece.spans]
    return torch.cat([waveform for waveform, _ in parts], dim=1), parts[0][1]


def floor_and_peak(levels: torch.Tensor) -> tuple[float, float]:
    """A recording's floor (the 5th percentile of its frame levels: the pauses) and its speech (the 95th), dB."""
    floor, peak = torch.quantile(levels.float(), torch.tensor([0.05, 0.95])).tolist()
    return floor, peak


def speech_threshold(floor: float, peak: float) -> float:
    """The level (dB) above which a frame counts as speech: a third of the way from the recording's
    floor up to its speech (:func:`floor_and_peak`). Relative, so it holds for quiet and loud
    recordings alike; a third leaves the weak consonants (the /s/ of SIX) above it."""
    return floor + (peak - floor) / 3


def plan_pieces(levels: torch.Tensor, max_seconds: float, threshold: float | None = None) -> list[Piece]:
    """The pieces to decode of a recording with frame levels ``levels`` (F,) (module docstring, step 2),
    none longer than ``max_seconds``, in order; stretches without speech belong to none."""
    max_frames = int(max_seconds / FRAME_SECONDS)
    pad = round(PAD_SECONDS / FRAME_SECONDS)
    if max_frames < 2 * pad + 4:
        raise ValueError(f"pieces of {max_seconds} s are too short to hold a word")
    floor, peak = floor_and_peak(levels)
    threshold = speech_threshold(floor, peak) if threshold is None else threshold
    speech = _speech_stretches(levels > threshold)
    # A stretch with no pause for longer than a piece may hold (padding included) is cut at its quietest frames.
    longest = max_frames - 2 * pad
    smooth = round(SMOOTH_SECONDS / FRAME_SECONDS)
    stretches: list[tuple[int, int]] = []
    for start, end in speech:
        bounds = [start, *(start + cut for cut in cut_points(levels[start:end], longest, smooth)), end]
        stretches += list(zip(bounds, bounds[1:]))
    # Each stretch with up to `pad` frames of the pause on either side, never more than half of it.
    padded = []
    for index, (start, end) in enumerate(stretches):
        before = stretches[index - 1][1] if index else 0
        # (the last may reach past the last whole frame: reading stops at the recording's end)
        after = stretches[index + 1][0] if index + 1 < len(stretches) else levels.numel() + 2 * pad
        padded.append((max(start - pad, (before + start + 1) // 2), min(end + pad, (end + after) // 2)))
    # Pack them in order while the piece still fits; stretches that touch are read as one.
    pieces: list[list[tuple[int, int]]] = []
    for start, end in padded:
        if pieces and sum(b - a for a, b in pieces[-1]) + end - start <= max_frames:
            if pieces[-1][-1][1] == start:
                pieces[-1][-1] = (pieces[-1][-1][0], end)
            else:
                pieces[-1].append((start, end))
        else:
            pieces.append([(start, end)])
    return [Piece(tuple(_trim_edges(spans, levels, floor + EDGE_FLOOR_DB))) for spans in pieces]


def _trim_edges(spans: list[tuple[int, int]], levels: torch.Tensor, floor: float) -> list[tuple[int, int]]:
    """``spans`` without the frames at or below ``floor`` at their start and their end (never emptied)."""
    (start, first_end), (last_start, end) = spans[0], spans[-1]
    while start < first_end - 1 and levels[start] <= floor:
        start += 1
    while end > last_start + 1 and (end > levels.numel() or levels[end - 1] <= floor):
        end -= 1
    if len(spans) == 1:
        return [(start, end)]
    return [(start, first_end), *spans[1:-1], (last_start, end)]


def _speech_stretches(loud: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` frames of the speech in a loud-frame mask (F,): runs of loud frames joined across
    quiet gaps shorter than :data:`MIN_PAUSE_SECONDS`, without those shorter than :data:`MIN_SPEECH_SECONDS`."""
    runs = _runs(loud)
    min_pause = round(MIN_PAUSE_SECONDS / FRAME_SECONDS)
    min_speech = round(MIN_SPEECH_SECONDS / FRAME_SECONDS)
    joined: list[tuple[int, int]] = []
    for start, end in runs:
        if joined and start - joined[-1][1] < min_pause:
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((start, end))
    return [(start, end) for start, end in joined if end - start >= min_speech]


def _runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of True in a boolean mask (F,)."""
    padded = F.pad(mask.to(torch.int8), (1, 1))
    edges = (padded[1:] - padded[:-1]).nonzero().view(-1).tolist()
    return list(zip(edges[0::2], edges[1::2]))


def cut_points(level: torch.Tensor, max_frames: int, smooth: int = 1) -> list[int]:
    """Frames (ascending) at which to cut a stretch with per-frame loudness ``level`` (T,) so that no
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


def recording_pieces(audio: Path | AudioSegment | InMemoryAudio, max_seconds: float) -> Iterator[tuple[torch.Tensor, int]]:
    """The samples (C, n) and rate of each piece of a recording to decode, read one at a time."""
    levels, _ = recording_levels(audio)
    for piece in plan_pieces(levels, max_seconds):
        yield read_piece(audio, piece)

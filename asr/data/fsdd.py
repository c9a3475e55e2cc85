"""The Free Spoken Digit Dataset (FSDD) and connected-digit utterances built from it.

FSDD recordings are isolated digits named ``{digit}_{speaker}_{take}.wav``
(mono, 8 kHz). :func:`read_fsdd` lists them, filtered by speaker and take;
:func:`build_connected_digits` joins several takes of one speaker with short
random gaps of silence into utterances transcribed as words
(``"THREE SEVEN ZERO"``). Gaps go only between takes: the takes are already
trimmed, and the feature pipeline's dither keeps pure-zero silence finite.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
import torch

from asr.data import report as reasons
from asr.data.config import DataConfig
from asr.data.report import DataError, SkipReport
from asr.data.text import DIGIT_WORDS
from asr.data.utterance import InMemoryAudio, Utterance
from features.audio import AudioError, NonFiniteAudioError, load_audio, to_mono

_FILE_NAME = re.compile(r"^(?P<digit>[0-9])_(?P<speaker>[^_]+)_(?P<take>[0-9]+)\.wav$")


@dataclass(frozen=True)
class FSDDRecording:
    """One isolated-digit take."""

    path: Path
    digit: int
    speaker: str
    take: int


def read_fsdd(
    folder: str | Path,
    speakers: Sequence[str] | None = None,
    take_range: Sequence[int] | None = None,
    report: SkipReport | None = None,
) -> list[FSDDRecording]:
    """FSDD recordings in ``folder``, sorted by (speaker, digit, take).

    speakers:   keep only these (None or empty = all); naming a speaker that has no
                recordings is an error, so a typo does not silently shrink the set.
    take_range: inclusive ``[low, high]`` of take numbers (None = all).
    A ``.wav`` whose name does not follow ``{digit}_{speaker}_{take}.wav`` is
    recorded in ``report`` (or raises in strict mode). A missing folder, or one
    without recordings, raises :class:`DataError` naming it.
    """
    report = SkipReport() if report is None else report
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise DataError(f"FSDD recordings folder not found: {folder}")
    recordings = []
    for path in sorted(folder.glob("*.wav")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            report.skip(reasons.BAD_FILENAME, f"{path}: not an FSDD name {{digit}}_{{speaker}}_{{take}}.wav")
            continue
        recordings.append(FSDDRecording(path, int(match["digit"]), match["speaker"], int(match["take"])))
    if not recordings:
        raise DataError(f"no FSDD recordings ({{digit}}_{{speaker}}_{{take}}.wav) in {folder}")
    if speakers:
        found = {r.speaker for r in recordings}
        missing = sorted(set(speakers) - found)
        if missing:
            raise DataError(
                f"FSDD speaker(s) {', '.join(missing)} have no recordings in {folder} "
                f"(found: {', '.join(sorted(found))})"
            )
        keep = set(speakers)
        recordings = [r for r in recordings if r.speaker in keep]
    if take_range is not None:
        low, high = take_range
        recordings = [r for r in recordings if low <= r.take <= high]
    return sorted(recordings, key=lambda r: (r.speaker, r.digit, r.take))


def build_connected_digits(
    recordings: Sequence[FSDDRecording],
    num_utterances: int,
    digits_per_utterance: Sequence[int] = (1, 7),
    gap_seconds: Sequence[float] = (0.05, 0.3),
    seed: int = 0,
    report: SkipReport | None = None,
    gap_noise: float = 0.001,
    name: str = "fsdd",
) -> list[Utterance]:
    """``num_utterances`` connected-digit utterances, the same ones for the same seed.

    Ids are ``{name}-{speaker}-seed{seed}-{index:05d}``. Each utterance draws a
    speaker, a count in the inclusive ``digits_per_utterance`` range, that many takes of the speaker (with replacement) and a gap before
    every take but the first, uniform in ``gap_seconds``. Its waveform is
    ``take_1, gap, take_2, ..., take_n``: (1, N) float32 held in memory
    (:class:`InMemoryAudio`), with N = sum of the take lengths + the gaps.
    A gap is Gaussian noise of standard deviation ``gap_noise`` (full scale 1),
    not digital silence: exact zeros become log(0)-floor frames in the
    features, which real recordings (the connected-digit dev set's gaps are
    noise of about 1e-3 RMS) never contain, and which would dominate the
    global MVN statistics. ``gap_noise=0`` gives exact silence.
    All takes must share one sample rate (there is no resampling here); one
    that differs raises :class:`DataError` naming the file. Unreadable or empty
    takes, and takes with NaN or infinite samples, are recorded in ``report`` and never drawn.
    """
    report = SkipReport() if report is None else report
    takes: dict[str, list[tuple[FSDDRecording, torch.Tensor]]] = {}
    sample_rate, rate_source = 0, None
    for recording in recordings:
        try:
            waveform, rate = load_audio(recording.path)
        except AudioError as err:
            empty = recording.path.is_file() and recording.path.stat().st_size == 0
            if isinstance(err, NonFiniteAudioError):
                reason = reasons.NONFINITE_AUDIO
            else:
                reason = reasons.EMPTY_AUDIO if empty else reasons.UNREADABLE_AUDIO
            report.skip(reason, str(err))
            continue
        if rate_source is None:
            sample_rate, rate_source = rate, recording.path
        elif rate != sample_rate:
            raise DataError(
                f"{recording.path}: sample rate {rate} Hz differs from {sample_rate} Hz of {rate_source}; "
                "connected-digit takes are joined without resampling, so all must share one rate"
            )
        takes.setdefault(recording.speaker, []).append((recording, to_mono(waveform).unsqueeze(0)))
    if num_utterances > 0 and not takes:
        raise DataError("no usable FSDD recordings to build connected-digit utterances from")

    rng = random.Random(seed)
    noise = torch.Generator().manual_seed(seed)
    speakers = sorted(takes)
    utterances = []
    for index in range(num_utterances):
        speaker = rng.choice(speakers)
        count = rng.randint(digits_per_utterance[0], digits_per_utterance[1])
        chosen = [rng.choice(takes[speaker]) for _ in range(count)]
        pieces = [chosen[0][1]]
        for _, waveform in chosen[1:]:
            gap = round(rng.uniform(gap_seconds[0], gap_seconds[1]) * sample_rate)
            pieces.extend([torch.randn(1, gap, generator=noise) * gap_noise, waveform])
        waveform = torch.cat(pieces, dim=1)
        audio = InMemoryAudio(waveform, sample_rate, tuple(r.path for r, _ in chosen))
        text = " ".join(DIGIT_WORDS[r.digit] for r, _ in chosen)
        utterances.append(
            Utterance(f"{name}-{speaker}-seed{seed}-{index:05d}", audio, text, waveform.shape[1] / sample_rate, speaker)
        )
    return utterances


def connected_digits(config: DataConfig, split: str, report: SkipReport | None = None) -> list[Utterance]:
    """The connected digits of ``split`` that ``data.fsdd`` and ``data.digits`` describe (see :class:`DigitsConfig`).

    Empty when ``data.fsdd`` is "", and for dev and test unless
    ``data.digits.held_out_speaker`` is set. Each split draws from its own
    seed (``digits.seed`` + 0, 1, 2), so the sets differ even where their
    takes overlap. A held-out speaker without recordings is an error.
    """
    digits = config.digits
    if not config.fsdd or (split != "train" and not digits.held_out_speaker):
        return []
    folder = config.resolve(config.fsdd)
    if not folder.is_dir():
        raise DataError(
            f"data.fsdd: FSDD recordings folder not found: {folder} (data.root={config.root!r}, "
            f"data.fsdd={config.fsdd!r}); the dataset is at https://github.com/Jakobovski/free-spoken-digit-dataset"
        )
    held_out = digits.held_out_speaker
    if held_out:
        try:  # read_fsdd checks the speaker exists; say which key named it
            # The folder's misnamed files are reported once per split: here for test, below for the others.
            held_out_takes = read_fsdd(folder, [held_out], None, report if split == "test" else SkipReport())
        except DataError as err:
            raise DataError(f"data.digits.held_out_speaker: {err}") from None
    if split == "test":
        chosen = held_out_takes
        count, offset = digits.test_utterances, 2
    else:
        recordings = read_fsdd(folder, digits.speakers or None, None, report)
        low, high = digits.dev_take_range if split == "dev" else digits.take_range
        chosen = [r for r in recordings if r.speaker != held_out and low <= r.take <= high]
        count, offset = (digits.dev_utterances, 1) if split == "dev" else (digits.utterances, 0)
    if count == 0:
        return []
    if not chosen:
        raise DataError(f"data.digits: no FSDD recordings in {folder} for the {split} split of this config")
    return build_connected_digits(
        chosen,
        count,
        digits.digits_per_utterance,
        digits.gap_seconds,
        digits.seed + offset,
        report,
        digits.gap_noise,
        name=f"fsdd-{split}",
    )


@dataclass(frozen=True)
class DigitRecording:
    """One long recording of isolated FSDD takes in a row, with where each digit lies.

    waveform: (1, N) float32; spans: ``(first sample, end sample)`` of each take, in order;
    takes: the recordings played, aligned with ``spans``; text: their words.
    """

    waveform: torch.Tensor = field(repr=False)
    sample_rate: int
    spans: tuple[tuple[int, int], ...]
    takes: tuple[FSDDRecording, ...]

    @property
    def text(self) -> str:
        return " ".join(DIGIT_WORDS[take.digit] for take in self.takes)

    @property
    def seconds(self) -> float:
        return self.waveform.shape[1] / self.sample_rate


def build_digit_recording(
    recordings: Sequence[FSDDRecording],
    num_digits: int,
    pause_seconds: Sequence[float] = (0.2, 1.2),
    seed: int = 0,
    gap_noise: float = 0.001,
) -> DigitRecording:
    """A long recording of ``num_digits`` takes drawn from ``recordings`` (any speaker, with replacement,
    the same ones for the same seed), separated by pauses uniform in ``pause_seconds`` of Gaussian
    noise of standard deviation ``gap_noise``, as :func:`build_connected_digits` fills its gaps.
    The test case of long-form decoding (:mod:`asr.inference.segmentation`): its words and the
    digits' boundaries are known, so every cut can be checked against them. All takes must share
    one sample rate (:class:`DataError` names the first that does not)."""
    rng = random.Random(seed)
    noise = torch.Generator().manual_seed(seed)
    loaded: dict[Path, torch.Tensor] = {}
    pieces: list[torch.Tensor] = []
    spans: list[tuple[int, int]] = []
    takes: list[FSDDRecording] = []
    sample_rate, position = 0, 0
    for index in range(num_digits):
        take = rng.choice(list(recordings))
        if take.path not in loaded:
            waveform, rate = load_audio(take.path)
            if sample_rate and rate != sample_rate:
                raise DataError(f"{take.path}: sample rate {rate} Hz differs from {sample_rate} Hz of the others")
            sample_rate = rate
            loaded[take.path] = to_mono(waveform).unsqueeze(0)
        if index:
            gap = round(rng.uniform(pause_seconds[0], pause_seconds[1]) * sample_rate)
            pieces.append(torch.randn(1, gap, generator=noise) * gap_noise)
            position += gap
        waveform = loaded[take.path]
        pieces.append(waveform)
        spans.append((position, position + waveform.shape[1]))
        takes.append(take)
        position += waveform.shape[1]
    return DigitRecording(torch.cat(pieces, dim=1), sample_rate, tuple(spans), tuple(takes))

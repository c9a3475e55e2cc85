"""Reader for Kaldi data directories, as Kaldi, ESPnet and lhotse's ``export_to_kaldi`` write them.

A data directory holds::

    wav.scp    <recording-id> <audio file>            (or a decode-a-file pipeline ending in "|", below)
    text       <utterance-id> <TRANSCRIPT>
    segments   <utterance-id> <recording-id> <start s> <end s>   optional: without it, utterance = recording
    utt2spk    <utterance-id> <speaker-id>            optional: without it, each utterance is its own speaker

Other files (``spk2utt``, ``utt2dur``, ``feats.scp``, ...) are not read. Relative
audio paths are taken from the working directory, as Kaldi takes them.

**Pipelines.** Real directories often decode through a command. Data never
runs a command here: the decode-a-file forms below are recognised, their file
is taken out and read directly, and any other ``... |`` line is skipped with a
message naming the file and line (there is no option to run it; decode such
audio to files and list those)::

    flac -c -d -s F.flac |
    sox F -t wav - |                          (output format options allowed; no effects)
    ffmpeg -threads 1 -i F.flac -ar 16000 -map_channel 0.0.0  -f wav -threads 1 pipe:1 |   (lhotse's export)

A resampling option (``-ar``, ``-r``) is dropped: the feature pipeline
resamples every file to ``features.sample_rate`` anyway. ``-map_channel 0.0.C``
reads channel C; otherwise every channel is read and down-mixed, as ``sox -c 1``
would.

Durations come from the audio headers (one per recording) or from
``segments``. A segment may overshoot its recording's end by at most
:data:`MAX_OVERSHOOT` seconds (it is cut at the end, as Kaldi's
``extract-segments`` does); further, or starting past the end, it is skipped.
Every problem with one line or utterance is recorded in the
:class:`~asr.data.report.SkipReport` with the file and line, and loses that
utterance alone.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from asr.data import report as reasons
from asr.data.audio import UnusableAudio, header_duration
from asr.data.report import DataError, SkipReport
from asr.data.text import normalize_text, text_lines
from asr.data.utterance import AudioSegment, Utterance

WAV_SCP, TEXT, SEGMENTS, UTT2SPK = "wav.scp", "text", "segments", "utt2spk"
# Kaldi's extract-segments --max-overshoot default: segment ends computed from rounded
# times often lie a few milliseconds past the recording's end.
MAX_OVERSHOOT = 0.5


def is_kaldi_dir(path: str | Path) -> bool:
    """A folder holding ``wav.scp`` and ``text``."""
    path = Path(path)
    return (path / WAV_SCP).is_file() and (path / TEXT).is_file()


@dataclass(frozen=True)
class _Recording:
    """A usable wav.scp entry: the file to read and the channel it selects (None = all)."""

    path: Path
    channel: int | None
    where: str  # wav.scp:<line>


@dataclass(frozen=True)
class _Unusable:
    """A wav.scp entry that cannot be read; each utterance of the recording is skipped with this."""

    reason: str
    message: str


def read_kaldi_dir(folder: str | Path, report: SkipReport | None = None) -> list[Utterance]:
    """All utterances of a Kaldi data directory, in ``text`` order (see the module docstring).

    A folder without ``wav.scp`` or ``text`` raises :class:`DataError`;
    problems with single lines and utterances go into ``report``.
    """
    report = SkipReport() if report is None else report
    folder = Path(folder).expanduser()
    if not is_kaldi_dir(folder):
        missing = [name for name in (WAV_SCP, TEXT) if not (folder / name).is_file()]
        raise DataError(f"Kaldi data directory {folder}: no {' and no '.join(missing)} in it")
    wav_scp = _read_table(folder / WAV_SCP, report)
    recordings = {rec: _recording(where, value) for rec, (where, value) in wav_scp.items()}
    texts = _read_table(folder / TEXT, report)
    speakers = _read_table(folder / UTT2SPK, report) if (folder / UTT2SPK).is_file() else {}
    has_segments = (folder / SEGMENTS).is_file()
    if has_segments:
        spans = _read_table(folder / SEGMENTS, report)
    else:  # each recording is one utterance, from its start to its end
        spans = {rec: (where, f"{rec} 0 -1") for rec, (where, _) in wav_scp.items()}
    durations: dict[Path, float | _Unusable] = {}

    utterances: list[Utterance] = []
    for utt, (text_where, text) in texts.items():
        if utt not in spans:
            listing = folder / (SEGMENTS if has_segments else WAV_SCP)
            report.skip(reasons.MISSING_AUDIO, f"{text_where}: transcript of {utt} but no line in {listing}")
            continue
        span_where, span = spans[utt]
        try:
            rec, start, end = _parse_segment(span)
        except ValueError as err:
            report.skip(reasons.MALFORMED_LINE, f"{span_where}: {err}: {span!r}")
            continue
        recording = recordings.get(rec)
        if recording is None:
            report.skip(reasons.MISSING_AUDIO, f"{span_where}: recording {rec} of utterance {utt} is not in {folder / WAV_SCP}")
            continue
        if isinstance(recording, _Unusable):
            report.skip(recording.reason, f"{recording.message} (utterance {utt})")
            continue
        if recording.path not in durations:
            durations[recording.path] = _header_duration(recording)
        total = durations[recording.path]
        if isinstance(total, _Unusable):
            report.skip(total.reason, f"{total.message} (utterance {utt})")
            continue
        end = total if end < 0 else end
        if start >= total or end > total + MAX_OVERSHOOT:
            report.skip(
                reasons.SEGMENT_PAST_END,
                f"{span_where}: utterance {utt} spans {start:.2f}-{end:.2f} s but {recording.path} lasts {total:.2f} s",
            )
            continue
        end = min(end, total)
        if has_segments or recording.channel is not None:
            audio = AudioSegment(recording.path, start, end if has_segments else None, recording.channel)
        else:
            audio = recording.path
        speaker = speakers[utt][1].split()[0] if utt in speakers and speakers[utt][1] else utt
        utterances.append(Utterance(utt, audio, normalize_text(text), end - start, speaker))
    for utt, (span_where, _) in spans.items():
        if utt not in texts:
            report.skip(reasons.MISSING_TRANSCRIPT, f"{span_where}: audio of {utt} but no line in {folder / TEXT}")
    return utterances


def audio_file(entry: str) -> tuple[str, int | None]:
    """The file a ``wav.scp`` entry reads and the channel it selects (None = all channels).

    A plain path is that path. A recognised decode-a-file pipeline (module
    docstring) gives its input file; any other pipeline raises ValueError
    saying so. Nothing is run.
    """
    entry = entry.strip()
    if not entry.endswith("|"):
        return entry, None
    try:
        words = shlex.split(entry[:-1])
    except ValueError as err:
        raise ValueError(f"audio read through a command, which is never run, and cannot be split into words ({err})") from err
    found = _PIPELINES[Path(words[0]).name](words[1:]) if words and Path(words[0]).name in _PIPELINES else None
    if found is None:
        raise ValueError(
            "audio read through a command, which is never run; only decode-a-file pipelines "
            "(flac -c -d -s F |, sox F -t wav - |, ffmpeg -i F ... -f wav pipe:1 |) are recognised: "
            "decode this audio to files and list them in wav.scp"
        )
    return found


def _flac(args: list[str]) -> tuple[str, int | None] | None:
    """``flac -c -d -s F`` (flags in any order, ``-cds`` combined or long)."""
    letters, files = set(), []
    long = {"--decode": "d", "--stdout": "c", "--silent": "s"}
    for arg in args:
        if arg in long:
            letters.add(long[arg])
        elif arg.startswith("-") and len(arg) > 1 and set(arg[1:]) <= set("cds"):
            letters.update(arg[1:])
        elif arg.startswith("-"):
            return None
        else:
            files.append(arg)
    return (files[0], None) if len(files) == 1 and {"c", "d"} <= letters else None


_SOX_VALUES = {"-t", "--type", "-r", "--rate", "-b", "--bits", "-e", "--encoding", "-c", "--channels"}
_SOX_FLAGS = {"-q", "--no-show-progress", "-G", "--guard", "-V0", "-V1"}


def _sox(args: list[str]) -> tuple[str, int | None] | None:
    """``sox [format options] F [format options] -``: a format conversion to stdout, no effects after it."""
    positional, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg in _SOX_VALUES:
            if i + 1 == len(args):
                return None
            i += 2
            continue
        if arg in _SOX_FLAGS:
            i += 1
            continue
        if arg.startswith("-") and arg != "-":
            return None
        positional.append(arg)
        i += 1
    return (positional[0], None) if len(positional) == 2 and positional[1] == "-" and positional[0] != "-" else None


_FFMPEG_VALUES = {"-threads", "-ar", "-ac", "-f", "-loglevel", "-v", "-acodec", "-c:a", "-sample_fmt"}
_FFMPEG_FLAGS = {"-nostdin", "-hide_banner", "-y", "-vn"}


def _ffmpeg(args: list[str]) -> tuple[str, int | None] | None:
    """``ffmpeg -i F [-ar R] [-map_channel 0.0.C] -f wav pipe:1`` and the like: one input, WAV to stdout."""
    inputs, channel, output, i = [], None, None, 0
    while i < len(args):
        arg = args[i]
        if arg in _FFMPEG_FLAGS:
            i += 1
            continue
        if arg in _FFMPEG_VALUES or arg in ("-i", "-map_channel"):
            if i + 1 == len(args):
                return None
            value = args[i + 1]
            if arg == "-i":
                inputs.append(value)
            elif arg == "-map_channel":
                parts = value.split(".")
                if channel is not None or len(parts) != 3 or parts[:2] != ["0", "0"] or not parts[2].isdigit():
                    return None
                channel = int(parts[2])
            elif arg == "-f" and value != "wav":
                return None
            i += 2
            continue
        if arg in ("pipe:1", "pipe:", "-") and i == len(args) - 1:
            output = arg
            i += 1
            continue
        return None
    return (inputs[0], channel) if len(inputs) == 1 and output is not None else None


_PIPELINES = {"flac": _flac, "sox": _sox, "ffmpeg": _ffmpeg}


def _recording(where: str, value: str) -> _Recording | _Unusable:
    if not value.strip():
        return _Unusable(reasons.MALFORMED_LINE, f"{where}: no audio after the recording id")
    try:
        path, channel = audio_file(value)
    except ValueError as err:
        return _Unusable(reasons.COMMAND_AUDIO, f"{where}: {err}: {value.strip()!r}")
    return _Recording(Path(path).expanduser(), channel, where)


def _header_duration(recording: _Recording) -> float | _Unusable:
    """Seconds of audio in the recording's file, from its header (no decoding)."""
    try:
        return header_duration(recording.path, recording.channel)
    except UnusableAudio as err:
        return _Unusable(err.reason, f"{recording.where}: {err.message}")


def _parse_segment(span: str) -> tuple[str, float, float]:
    """``<recording-id> <start> <end>`` -> (recording, start, end); end -1 means the end of the recording."""
    fields = span.split()
    if len(fields) != 3:
        raise ValueError("expected '<utterance-id> <recording-id> <start> <end>'")
    try:
        start, end = float(fields[1]), float(fields[2])
    except ValueError as err:
        raise ValueError("start and end are not numbers") from err
    if start < 0 or (end != -1 and end <= start):
        raise ValueError(f"need 0 <= start < end (or end -1), got start {start} and end {end}")
    return fields[0], start, end


def _read_table(path: Path, report: SkipReport) -> dict[str, tuple[str, str]]:
    """``<id> <rest>`` per non-blank line -> {id: ("<path>:<line>", rest)}, first occurrence kept.

    Lines are decoded one by one, so a line that is not UTF-8 costs that line
    alone; a repeated id is reported and the first line kept.
    """
    try:
        raw_lines = text_lines(path.read_bytes())
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from err
    table: dict[str, tuple[str, str]] = {}
    for line_no, raw in enumerate(raw_lines, start=1):
        where = f"{path}:{line_no}"
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as err:
            report.skip(reasons.MALFORMED_LINE, f"{where}: line is not valid UTF-8 ({err.reason} at byte {err.start})")
            continue
        if not line:
            continue
        parts = line.split(maxsplit=1)
        if parts[0] in table:
            report.skip(reasons.DUPLICATE_ID, f"{where}: id {parts[0]} already used at {table[parts[0]][0]}")
            continue
        table[parts[0]] = (where, parts[1] if len(parts) > 1 else "")
    return table

"""Kaldi data directories (asr/data/kaldi.py): segments read their span alone, wav.scp pipelines are
recognised but never run, and every bad line or utterance is skipped, counted and named."""

from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from asr.data import report as reasons
from asr.data.kaldi import audio_file, read_kaldi_dir
from asr.data.report import DataError, SkipReport
from asr.data.text import normalize_text
from asr.data.utterance import AudioSegment, read_audio

RATE = 16000


@pytest.fixture(scope="module")
def long_recording(tmp_path_factory, librivox_mini) -> tuple[Path, np.ndarray, list[tuple[str, float, float, str]]]:
    """A stereo 16-bit WAV: left, three LibriVox utterances one after the other; right, the same reversed in time.

    Returns (path, samples (N, 2) as read back, [(utterance id, start s, end s, transcript)]).
    """
    lines = (librivox_mini / "9999" / "1" / "9999-1.trans.txt").read_text().splitlines()[:3]
    pieces, spans, at = [], [], 0
    for line in lines:
        utt, text = line.split(" ", 1)
        audio, rate = soundfile.read(str(librivox_mini / "9999" / "1" / f"{utt}.flac"), dtype="int16")
        assert rate == RATE
        pieces.append(audio)
        spans.append((utt, at / RATE, (at + len(audio)) / RATE, text))
        at += len(audio)
    left = np.concatenate(pieces)
    path = tmp_path_factory.mktemp("kaldi_audio") / "chapter.wav"
    soundfile.write(str(path), np.stack([left, left[::-1]], axis=1), RATE, subtype="PCM_16")
    samples, _ = soundfile.read(str(path), dtype="float32", always_2d=True)
    return path, samples, spans


def write_dir(folder: Path, **files: str | bytes) -> Path:
    """A data directory with the given files (``wav_scp`` for wav.scp)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        target = folder / name.replace("wav_scp", "wav.scp")
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    return folder


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("/data/a b/x.wav", ("/data/a b/x.wav", None)),  # a plain path is the rest of the line
        ("flac -c -d -s /data/x.flac |", ("/data/x.flac", None)),
        ("/usr/bin/flac -d -c '/data/a b/x.flac' |", ("/data/a b/x.flac", None)),
        ("flac -cds /data/x.flac|", ("/data/x.flac", None)),
        ("sox /data/x.flac -t wav - |", ("/data/x.flac", None)),
        ("sox /data/x.wav -t wav -r 8000 -b 16 -c 1 - |", ("/data/x.wav", None)),
        ("ffmpeg -threads 1 -i /data/x.flac -ar 16000 -map_channel 0.0.0  -f wav -threads 1 pipe:1 |", ("/data/x.flac", 0)),
        ("ffmpeg -nostdin -i /data/x.flac -map_channel 0.0.1 -f wav - |", ("/data/x.flac", 1)),
        ("ffmpeg -i /data/x.flac -f wav pipe:1 |", ("/data/x.flac", None)),
    ],
)
def test_decode_a_file_pipelines_give_their_file(entry, expected):
    assert audio_file(entry) == expected


@pytest.mark.parametrize(
    "entry",
    [
        "touch {marker} |",
        "sh -c 'touch {marker}' |",
        "sox /data/x.flac -t wav - speed 1.1 |",  # an effect changes the audio: not a plain decode
        "sox /data/x.flac -t wav {marker} |",
        "flac -c -d -s /data/x.flac | tee {marker} |",
        "flac -c -s /data/x.flac |",  # no -d: flac would encode, not decode
        "ffmpeg -i /data/x.flac -af volume=2 -f wav pipe:1 |",
        "ffmpeg -i /data/x.flac -i /data/y.flac -f wav pipe:1 |",
        "ffmpeg -i /data/x.flac -f mp3 pipe:1 |",
        "sph2pipe -f wav -p -c 1 /data/x.sph |",
        "flac -c -d 'unclosed |",
    ],
)
def test_any_other_pipeline_is_skipped_naming_its_line_and_never_run(entry, tmp_path, long_recording):
    marker = tmp_path / "ran"
    folder = write_dir(
        tmp_path / "data",
        wav_scp=f"good {long_recording[0]}\nbad {entry.format(marker=marker)}\n",
        text="good ONE\nbad TWO\n",
    )
    with pytest.raises(ValueError, match="never run"):
        audio_file(entry.format(marker=marker))
    report = SkipReport()
    utterances = read_kaldi_dir(folder, report)
    assert [u.id for u in utterances] == ["good"]
    assert report.counts() == {reasons.COMMAND_AUDIO: 1}
    [message] = report.messages(reasons.COMMAND_AUDIO)
    assert message.startswith(f"{folder / 'wav.scp'}:2: ") and "never run" in message and "utterance bad" in message
    assert not marker.exists()


def test_segments_read_their_span_alone_and_match_lhotse(long_recording, tmp_path):
    path, samples, spans = long_recording
    folder = write_dir(
        tmp_path / "data",
        wav_scp=f"chapter {path}\n",
        segments="".join(f"{utt} chapter {start} {end}\n" for utt, start, end, _ in spans),
        text="".join(f"{utt} {text}\n" for utt, _, _, text in spans),
        utt2spk="".join(f"{utt} reader\n" for utt, *_ in spans),
    )
    report = SkipReport()
    utterances = read_kaldi_dir(folder, report)
    assert len(report) == 0
    assert [(u.id, u.text, u.speaker) for u in utterances] == [(s[0], normalize_text(s[3]), "reader") for s in spans]
    for utt, (_, start, end, _) in zip(utterances, spans):
        assert utt.duration == pytest.approx(end - start, abs=1e-9)
        waveform, rate = read_audio(utt.audio)
        assert rate == RATE
        # Both channels of exactly the span (the feature pipeline down-mixes them, as for any file).
        expected = samples[round(start * RATE) : round(end * RATE)].T
        assert torch.equal(waveform, torch.from_numpy(np.ascontiguousarray(expected)))

    # lhotse's own Kaldi importer and loader read the same spans.
    from lhotse import CutSet
    from lhotse.kaldi import load_kaldi_data_dir

    recordings, supervisions, _ = load_kaldi_data_dir(folder, sampling_rate=RATE)
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions).trim_to_supervisions()
    by_id = {c.supervisions[0].id: c for c in cuts}
    for utt in utterances:
        reference = torch.from_numpy(by_id[utt.id].load_audio())
        torch.testing.assert_close(read_audio(utt.audio)[0], reference, rtol=0, atol=1e-6)


def test_a_mapped_channel_is_read_alone(long_recording, tmp_path):
    path, samples, spans = long_recording
    utt, start, end, text = spans[1]
    folder = write_dir(
        tmp_path / "data",
        wav_scp=f"chapter ffmpeg -threads 1 -i {path} -ar 16000 -map_channel 0.0.1  -f wav -threads 1 pipe:1 |\n",
        segments=f"{utt} chapter {start} {end}\n",
        text=f"{utt} {text}\n",
    )
    [utterance] = read_kaldi_dir(folder)
    assert utterance.audio == AudioSegment(path, start, end, channel=1)
    waveform, _ = read_audio(utterance.audio)
    expected = samples[round(start * RATE) : round(end * RATE), 1]
    assert torch.equal(waveform, torch.from_numpy(np.ascontiguousarray(expected))[None])
    assert utterance.speaker == utt  # no utt2spk: each utterance is its own speaker


def test_without_segments_each_recording_is_an_utterance(librivox_mini, tmp_path):
    flacs = sorted((librivox_mini / "9999" / "1").glob("*.flac"))
    folder = write_dir(
        tmp_path / "data",
        wav_scp="".join(f"{f.stem} flac -c -d -s {f} |\n" for f in flacs),
        text=(librivox_mini / "9999" / "1" / "9999-1.trans.txt").read_text(),
    )
    utterances = read_kaldi_dir(folder)
    assert [u.audio for u in utterances] == flacs  # whole files, read as LibriSpeech files are
    for utt in utterances:
        info = soundfile.info(str(utt.audio))
        assert utt.duration == info.frames / info.samplerate


def test_bad_lines_and_utterances_are_skipped_counted_and_named(long_recording, tmp_path):
    path, _, spans = long_recording
    total = len(soundfile.read(str(path))[0]) / RATE
    (a, a_start, a_end, a_text), (b, b_start, b_end, b_text), (c, c_start, c_end, c_text) = spans
    folder = write_dir(
        tmp_path / "data",
        wav_scp=f"chapter {path}\nlost {tmp_path / 'missing.flac'}\nempty\n",
        segments=(
            f"{a} chapter {a_start} {a_end}\n"
            f"{b} chapter {b_start} {total + 0.2}\n"      # a little past the end: cut at the end, kept
            f"past chapter {total - 0.5} {total + 2}\n"   # far past the end
            f"late chapter {total + 1} {total + 3}\n"     # starts after the end
            f"gone lost 0 1.5\n"                          # its file does not exist
            f"nowhere unknown 0 1\n"                      # its recording is not in wav.scp
            f"blank empty 0 1\n"                          # its wav.scp line has no audio
            f"garbled chapter zero one\n"                 # not numbers
            f"untold chapter {c_start} {c_end}\n"         # audio without a transcript
        ),
        text=(
            f"{a} {a_text}\n{b} {b_text}\n".encode()
            + b"broken \xff\xfe TEXT\n"                   # not UTF-8
            + f"past X\nlate X\ngone X\nnowhere X\nblank X\ngarbled X\nunheard HELLO\n{a} AGAIN\n".encode()
        ),
    )
    report = SkipReport()
    utterances = read_kaldi_dir(folder, report)
    assert [u.id for u in utterances] == [a, b]
    assert utterances[0].text == normalize_text(a_text)
    assert utterances[1].duration == pytest.approx(total - b_start)
    assert report.counts() == {
        reasons.SEGMENT_PAST_END: 2, reasons.MISSING_AUDIO_FILE: 1, reasons.MISSING_AUDIO: 2,
        reasons.MALFORMED_LINE: 3, reasons.MISSING_TRANSCRIPT: 1, reasons.DUPLICATE_ID: 1,
    }
    messages = " | ".join(s.message for s in report.skips)
    for named in (
        f"{folder / 'segments'}:3: utterance past", f"{folder / 'segments'}:4: utterance late",
        f"{folder / 'wav.scp'}:2: audio file not found: {tmp_path / 'missing.flac'} (utterance gone)",
        f"{folder / 'segments'}:6: recording unknown of utterance nowhere",
        f"{folder / 'wav.scp'}:3: no audio after the recording id (utterance blank)",
        f"{folder / 'segments'}:8:", f"{folder / 'text'}:3: line is not valid UTF-8",
        f"{folder / 'text'}:10: transcript of unheard but no line in {folder / 'segments'}",
        f"{folder / 'segments'}:9: audio of untold", f"{folder / 'text'}:11: id {a} already used",
    ):
        assert named in messages

    with pytest.raises(DataError, match="data.strict is true"):
        read_kaldi_dir(folder, SkipReport(strict=True))


def test_a_folder_without_text_is_an_error_naming_it(tmp_path, long_recording):
    folder = write_dir(tmp_path / "data", wav_scp=f"chapter {long_recording[0]}\n")
    with pytest.raises(DataError, match=f"{folder}: no text"):
        read_kaldi_dir(folder)

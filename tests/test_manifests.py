"""lhotse manifests (asr/data/manifests.py): supervisions read their span and channel as lhotse itself
reads them, sources that are commands are never run, and bad lines or utterances are skipped, counted
and named."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

from asr.data import report as reasons
from asr.data.manifests import read_manifest
from asr.data.report import DataError, SkipReport
from asr.data.sources import read_sources
from asr.data.text import normalize_text
from asr.data.utterance import read_audio

RATE = 16000


@pytest.fixture(scope="module")
def recording(tmp_path_factory, librivox_mini) -> tuple[Path, list[tuple[str, float, float, str]]]:
    """A stereo WAV: left, three LibriVox utterances in a row; right, the same reversed in time.
    Returns (path, [(utterance id, start s, end s, transcript)])."""
    lines = (librivox_mini / "9999" / "1" / "9999-1.trans.txt").read_text().splitlines()[:3]
    pieces, spans, at = [], [], 0
    for line in lines:
        utt, text = line.split(" ", 1)
        audio, _ = soundfile.read(str(librivox_mini / "9999" / "1" / f"{utt}.flac"), dtype="int16")
        pieces.append(audio)
        spans.append((utt, at / RATE, (at + len(audio)) / RATE, text))
        at += len(audio)
    left = np.concatenate(pieces)
    path = tmp_path_factory.mktemp("manifest_audio") / "chapter.wav"
    soundfile.write(str(path), np.stack([left, left[::-1]], axis=1), RATE, subtype="PCM_16")
    return path, spans


def supervisions_of(path: Path, spans, channels) -> SupervisionSet:
    return SupervisionSet.from_segments(
        SupervisionSegment(utt, path.stem, start, end - start, channel=channel, text=text, speaker="reader")
        for (utt, start, end, text), channel in zip(spans, channels)
    )


def write_jsonl_gz(path: Path, lines: list[str | bytes]) -> Path:
    with gzip.open(path, "wb") as f:
        f.write(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


def test_supervisions_read_their_span_and_channels_as_lhotse_does(recording, tmp_path):
    path, spans = recording
    recordings = RecordingSet.from_recordings([Recording.from_file(path)])
    # one on the left channel, one on the right (another talker's channel), one on both (down-mixed later)
    supervisions = supervisions_of(path, spans, [0, 1, [0, 1]])
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    recordings.to_file(tmp_path / "corpus_recordings_all.jsonl.gz")
    supervisions.to_file(tmp_path / "corpus_supervisions_all.jsonl.gz")
    cuts.to_file(tmp_path / "corpus_cuts_all.jsonl")
    references = {c.supervisions[0].id: c.load_audio() for c in cuts.trim_to_supervisions(keep_overlapping=False)}

    for name in ("corpus_recordings_all.jsonl.gz", "corpus_supervisions_all.jsonl.gz", "corpus_cuts_all.jsonl"):
        report = SkipReport()
        utterances = read_manifest(tmp_path / name, report)
        assert len(report) == 0, report.summary()
        assert [(u.id, u.text, u.speaker) for u in utterances] == [(s[0], normalize_text(s[3]), "reader") for s in spans]
        for utt, (_, start, end, _) in zip(utterances, spans):
            assert utt.duration == pytest.approx(end - start, abs=1e-9)
            waveform, rate = read_audio(utt.audio)
            assert rate == RATE
            torch.testing.assert_close(waveform, torch.from_numpy(references[utt.id]), rtol=0, atol=1e-6)
    assert [u.audio.channel for u in utterances] == [0, 1, None]


def test_sources_other_than_files_are_skipped_and_commands_never_run(recording, tmp_path):
    path, spans = recording
    marker = tmp_path / "ran"
    good = Recording.from_file(path).to_dict()
    command = {**good, "id": "command", "sources": [{"type": "command", "channels": [0, 1], "source": f"touch {marker}"}]}
    url = {**good, "id": "url", "sources": [{"type": "url", "channels": [0, 1], "source": "https://example.com/a.wav"}]}
    sped = {**good, "id": "sped", "transforms": [{"name": "Speed", "kwargs": {"factor": 1.1}}]}
    write_jsonl_gz(tmp_path / "c_recordings_x.jsonl.gz", [json.dumps(r) for r in (good, command, url, sped)])
    utt, start, end, text = spans[0]
    sups = [SupervisionSegment(f"{rec}-1", rec, start, end - start, channel=[0, 1], text=text).to_dict()
            for rec in ("chapter", "command", "url", "sped")]
    write_jsonl_gz(tmp_path / "c_supervisions_x.jsonl.gz", [json.dumps(s) for s in sups])

    report = SkipReport()
    utterances = read_manifest(tmp_path / "c_supervisions_x.jsonl.gz", report)
    assert [u.id for u in utterances] == ["chapter-1"]
    assert report.counts() == {reasons.COMMAND_AUDIO: 1, reasons.UNSUPPORTED_AUDIO: 2}
    [message] = report.messages(reasons.COMMAND_AUDIO)
    assert "supervision command-1 (recording command)" in message and "never run" in message
    assert not marker.exists()


def test_bad_lines_and_utterances_are_skipped_counted_and_named(recording, tmp_path):
    path, spans = recording
    duration = Recording.from_file(path).duration
    rec = Recording.from_file(path).to_dict()
    missing = {**rec, "id": "lost", "sources": [{"type": "file", "channels": [0, 1], "source": str(tmp_path / "lost.wav")}]}
    unused = {**rec, "id": "unused"}
    recordings = write_jsonl_gz(
        tmp_path / "c_recordings_x.jsonl.gz",
        [json.dumps(rec), b"{not json", json.dumps(missing), b"\xff\xfe", json.dumps(unused), json.dumps({"id": 3})],
    )
    (a, a_start, a_end, a_text), (b, b_start, _, b_text) = spans[:2]

    def sup(utt, rec_id, start, end, text="X"):
        return json.dumps(SupervisionSegment(utt, rec_id, start, end - start, channel=0, text=text).to_dict())

    write_jsonl_gz(tmp_path / "c_supervisions_x.jsonl.gz", [
        sup(a, "chapter", a_start, a_end, a_text),
        sup(b, "chapter", b_start, duration + 0.2, b_text),   # a little past the end: cut at the end, kept
        sup("past", "chapter", duration - 1, duration + 2),    # far past the end
        sup("gone", "lost", 0, 1),                             # its file does not exist
        sup("orphan", "nowhere", 0, 1),                        # its recording is not in the manifest
        "[1, 2]",
    ])
    report = SkipReport()
    utterances = read_manifest(recordings, report)
    assert [u.id for u in utterances] == [a, b]
    assert utterances[1].duration == pytest.approx(duration - b_start)
    assert report.counts() == {
        reasons.MALFORMED_LINE: 4, reasons.SEGMENT_PAST_END: 1, reasons.MISSING_AUDIO_FILE: 1,
        reasons.MISSING_AUDIO: 1, reasons.MISSING_TRANSCRIPT: 1,
    }
    messages = " | ".join(s.message for s in report.skips)
    sups = tmp_path / "c_supervisions_x.jsonl.gz"
    for named in (
        f"{recordings}:2: not a JSON line", f"{recordings}:4: not a JSON line", f"{recordings}:6: not a lhotse manifest item",
        f"{sups}:6: not a JSON object", f"{sups}:3: supervision past (recording chapter): spans",
        f"{sups}:4: supervision gone (recording lost): audio file not found", f"{sups}:5: supervision orphan",
        f"{recordings}:5: recording unused has no supervision",
    ):
        assert named in messages
    with pytest.raises(DataError, match="data.strict is true"):
        read_manifest(recordings, SkipReport(strict=True))


def test_a_manifest_that_is_not_json_loses_nothing_else(recording, tmp_path):
    path, spans = recording
    recordings = RecordingSet.from_recordings([Recording.from_file(path)])
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions_of(path, spans, [0, 0, 0]))
    cuts.to_file(tmp_path / "good_cuts.jsonl.gz")
    (tmp_path / "bad_cuts.jsonl.gz").write_text("this is not a manifest\n")  # not even gzip
    (tmp_path / "text_cuts.jsonl").write_text("utt1 HELLO WORLD\nutt2 GOODBYE\n")  # a Kaldi text file, say
    report = SkipReport()
    utterances = read_sources(
        [tmp_path / "bad_cuts.jsonl.gz", tmp_path / "text_cuts.jsonl", tmp_path / "good_cuts.jsonl.gz"], report
    )
    assert [u.id for u in utterances] == [s[0] for s in spans]
    assert report.counts() == {reasons.MALFORMED_LINE: 3}
    messages = " | ".join(s.message for s in report.skips)
    assert f"{tmp_path / 'bad_cuts.jsonl.gz'}: cannot read it" in messages
    assert f"{tmp_path / 'text_cuts.jsonl'}:2: not a JSON line" in messages


def test_a_pair_without_its_partner_is_an_error_naming_it(recording, tmp_path):
    path, spans = recording
    supervisions_of(path, spans, [0, 0, 0]).to_file(tmp_path / "c_supervisions_x.jsonl.gz")
    with pytest.raises(DataError, match="c_recordings_x.jsonl.gz, which does not exist"):
        read_manifest(tmp_path / "c_supervisions_x.jsonl.gz")
    with pytest.raises(DataError, match="lhotse manifest not found"):
        read_manifest(tmp_path / "nothing.jsonl.gz")

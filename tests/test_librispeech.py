"""LibriSpeech-layout reader: transcripts, durations, the duration manifest, and bad input."""

import os
import shutil
from pathlib import Path

import pytest
import soundfile

from asr.data import report as reasons
from asr.data.librispeech import manifest_path, read_librispeech, read_subset
from asr.data.report import DataError, SkipReport
from asr.data.text import normalize_text
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline

TRANS = Path("9999") / "1" / "9999-1.trans.txt"


def parse_transcripts(subset: Path) -> dict[str, str]:
    """id -> transcript, straight from every *.trans.txt (independent of the reader)."""
    entries = {}
    for trans in subset.rglob("*.trans.txt"):
        for line in trans.read_text().splitlines():
            utt_id, text = line.split(" ", 1)
            entries[utt_id] = text
    return entries


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Manifests go to a per-test cache, never to the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """relative path -> (size, mtime) of everything under ``folder``."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture
def mini_copy(tmp_path, librivox_mini) -> Path:
    """A writable copy of librivox_mini (real files, so their mtimes can change without touching shared data)."""
    copy = Path(shutil.copytree(librivox_mini, tmp_path / "test-mini"))
    for path in [copy, *copy.rglob("*")]:  # the shared originals are read-only
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def test_reads_librivox_mini_transcripts_and_durations(librivox_mini, tmp_path):
    expected = parse_transcripts(librivox_mini)
    utterances = read_subset(librivox_mini, cache_dir=tmp_path / "cache")
    assert len(utterances) == 5
    assert {u.id: u.text for u in utterances} == {k: normalize_text(v) for k, v in expected.items()}
    for utt in utterances:
        info = soundfile.info(str(utt.audio))
        assert utt.duration == pytest.approx(info.frames / info.samplerate)
        assert utt.speaker == "9999"
        assert utt.audio.parent.name == "1" and utt.audio.name == f"{utt.id}.flac"


def test_librivox_mini_features_are_80_dim_at_100_frames_per_second(librivox_mini, tmp_path):
    pipeline = FeaturePipeline(FeatureConfig())
    for utt in read_subset(librivox_mini, cache_dir=tmp_path / "cache")[:2]:
        features = pipeline.from_file(utt.audio)
        assert features.shape[1] == 80
        assert abs(features.shape[0] - 100 * utt.duration) <= 3


def test_the_manifest_is_kept_in_the_cache_dir_and_the_corpus_is_never_written(mini_copy, tmp_path):
    cache = tmp_path / "cache"
    before = listing(mini_copy)  # a writable copy: nothing but the toolkit's own rule keeps it unchanged
    read_subset(mini_copy, cache_dir=cache)
    assert manifest_path(mini_copy, cache).is_file()
    assert listing(mini_copy) == before
    # The default cache is $XDG_CACHE_HOME/lnasr (set per test by private_cache).
    read_subset(mini_copy)
    assert manifest_path(mini_copy).is_file()
    assert Path(os.environ["XDG_CACHE_HOME"]) in manifest_path(mini_copy).parents


def test_second_run_uses_manifest_and_rereads_only_changed_files(mini_copy, monkeypatch):
    first = read_subset(mini_copy)
    assert manifest_path(mini_copy).is_file()

    calls = []
    real_info = soundfile.info

    def counting_info(path, *args, **kwargs):
        calls.append(Path(path).name)
        return real_info(path, *args, **kwargs)

    monkeypatch.setattr(soundfile, "info", counting_info)
    assert read_subset(mini_copy) == first
    assert calls == []

    changed = mini_copy / "9999" / "1" / "9999-1-0002.flac"
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert read_subset(mini_copy) == first
    assert calls == ["9999-1-0002.flac"]


def test_manifest_notices_a_replaced_file(mini_copy):
    read_subset(mini_copy)
    short, long = mini_copy / "9999" / "1" / "9999-1-0001.flac", mini_copy / "9999" / "1" / "9999-1-0000.flac"
    shutil.copyfile(long, short)  # new size and mtime: the cached duration is stale
    durations = {u.id: u.duration for u in read_subset(mini_copy)}
    assert durations["9999-1-0001"] == pytest.approx(durations["9999-1-0000"])


def test_a_cache_that_cannot_be_written_costs_only_a_rescan(mini_copy, monkeypatch, caplog):
    # The failed write is simulated, not made with file modes: root may write anywhere.
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied (simulated)")

    counted = []
    real_info = soundfile.info
    monkeypatch.setattr(soundfile, "info", lambda path, *a, **k: counted.append(path) or real_info(path, *a, **k))
    with monkeypatch.context() as patch:
        patch.setattr("asr.data.cache.tempfile.mkstemp", refuse)
        first = read_subset(mini_copy)
    assert len(first) == 5 and not manifest_path(mini_copy).exists()
    assert "could not write duration manifest" in caplog.text
    assert read_subset(mini_copy) == first  # read again from the headers, then cached
    assert len(counted) == 10
    assert read_subset(mini_copy) == first
    assert len(counted) == 10


def test_an_undecodable_transcript_line_loses_that_line_alone(mini_copy):
    trans = mini_copy / TRANS
    lines = trans.read_bytes().splitlines()
    lines[2] = lines[2][:12] + b"\xff\xfe BROKEN " + lines[2][12:]
    trans.write_bytes(b"\n".join(lines) + b"\n")
    report = SkipReport()
    utterances = read_subset(mini_copy, report)
    broken = lines[2].split()[0].decode()
    assert sorted(u.id for u in utterances) == sorted(i for i in parse_transcripts_ids(lines) if i != broken)
    assert report.counts() == {reasons.MALFORMED_TRANSCRIPT: 1, reasons.MISSING_TRANSCRIPT: 1}
    (line_message,) = report.messages(reasons.MALFORMED_TRANSCRIPT)
    assert f"{trans}:3" in line_message
    with pytest.raises(DataError, match=r"trans\.txt:3"):
        read_subset(mini_copy, SkipReport(strict=True))


def test_a_transcript_that_starts_with_a_byte_order_mark_keeps_its_first_utterance(mini_copy):
    """issue 81: the mark became part of the first id, reported both as a transcript without audio and as
    audio without a transcript, with ids that print identically."""
    trans = mini_copy / TRANS
    expected = sorted(u.id for u in read_subset(mini_copy))
    trans.write_bytes(b"\xef\xbb\xbf" + trans.read_bytes())
    report = SkipReport()
    assert sorted(u.id for u in read_subset(mini_copy, report)) == expected
    assert report.counts() == {}


def parse_transcripts_ids(lines: list[bytes]) -> list[str]:
    return [line.split()[0].decode() for line in lines if line.strip()]


def test_several_subsets_are_concatenated(librivox_mini, fsdd_dev, tmp_path):
    utterances = read_librispeech([librivox_mini, fsdd_dev], cache_dir=tmp_path / "cache")
    expected = {**parse_transcripts(librivox_mini), **parse_transcripts(fsdd_dev)}
    assert len(utterances) == len(expected) > 5
    assert {u.id: u.text for u in utterances} == expected
    assert {u.speaker for u in utterances} == {"9999", "9000", "9001", "9002", "9003"}


def test_missing_and_empty_folders_are_errors_naming_them(tmp_path):
    missing = tmp_path / "no-such-subset"
    with pytest.raises(DataError, match="no-such-subset"):
        read_subset(missing)
    empty = tmp_path / "empty-subset"
    empty.mkdir()
    with pytest.raises(DataError, match="empty-subset"):
        read_subset(empty)


def _zero_length(subset: Path) -> str:
    (subset / "9999" / "1" / "9999-1-0003.flac").write_bytes(b"")
    return "9999-1-0003.flac"


def _garbage(subset: Path) -> str:
    (subset / "9999" / "1" / "9999-1-0003.flac").write_bytes(os.urandom(2000))
    return "9999-1-0003.flac"


def _transcript_without_audio(subset: Path) -> str:
    (subset / "9999" / "1" / "9999-1-0003.flac").unlink()
    return "9999-1.trans.txt:4"


def _audio_without_transcript(subset: Path) -> str:
    trans = subset / TRANS
    lines = trans.read_text().splitlines()
    trans.write_text("\n".join(line for line in lines if not line.startswith("9999-1-0003")) + "\n")
    return "9999-1-0003.flac"


def _duplicate_id(subset: Path) -> str:
    trans = subset / TRANS
    trans.write_text(trans.read_text() + "9999-1-0003 A SECOND TRANSCRIPT\n")
    return "9999-1.trans.txt:6"


def _two_audio_files_for_one_id(subset: Path) -> str:
    folder = subset / "9999" / "1"
    shutil.copyfile(folder / "9999-1-0000.flac", folder / "9999-1-0003.wav")
    return "9999-1-0003.wav"


BAD_INPUT = [
    (_zero_length, reasons.EMPTY_AUDIO),
    (_garbage, reasons.UNREADABLE_AUDIO),
    (_transcript_without_audio, reasons.MISSING_AUDIO),
    (_audio_without_transcript, reasons.MISSING_TRANSCRIPT),
    (_duplicate_id, reasons.DUPLICATE_ID),
    (_two_audio_files_for_one_id, reasons.DUPLICATE_ID),
]


@pytest.mark.parametrize("damage, reason", BAD_INPUT, ids=[d.__name__.strip("_") for d, _ in BAD_INPUT])
def test_bad_input_is_skipped_and_named_or_raises_in_strict_mode(mini_copy, damage, reason):
    named = damage(mini_copy)
    report = SkipReport()
    utterances = read_subset(mini_copy, report)
    assert report.counts() == {reason: 1}
    assert named in report.messages(reason)[0]
    assert len(utterances) == (5 if reason == reasons.DUPLICATE_ID else 4)
    assert named in report.summary() and reason in report.summary()

    with pytest.raises(DataError, match=named.replace(".", r"\.")):
        read_subset(mini_copy, SkipReport(strict=True))

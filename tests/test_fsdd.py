"""FSDD reader and the connected-digit builder, on the real recordings."""

import shutil

import numpy as np
import pytest
import soundfile
import torch

from asr.data import report as reasons
from asr.data.config import DataConfig, DigitsConfig
from asr.data.corpus import load_split
from asr.data.fsdd import (
    DIGIT_WORDS,
    build_connected_digits,
    connected_digits,
    read_fsdd,
)
from asr.data.report import DataError, SkipReport
from asr.data.utterance import InMemoryAudio
from features.audio import load_audio

SPEAKERS = ["george", "jackson", "nicolas", "yweweler"]


@pytest.fixture(scope="module")
def two_speakers(fsdd_recordings):
    """A small pool (2 speakers x 10 digits x 5 takes) keeps the builder tests fast."""
    return read_fsdd(fsdd_recordings, speakers=["george", "nicolas"], take_range=[5, 9])


def test_reader_finds_all_2000_recordings(fsdd_recordings):
    recordings = read_fsdd(fsdd_recordings)
    assert len(recordings) == 2000
    assert sorted({r.speaker for r in recordings}) == SPEAKERS
    assert {r.digit for r in recordings} == set(range(10))
    assert {r.take for r in recordings} == set(range(50))
    for r in recordings[::97]:
        assert r.path.name == f"{r.digit}_{r.speaker}_{r.take}.wav" and r.path.is_file()


def test_reader_filters_by_speaker_and_take(fsdd_recordings):
    recordings = read_fsdd(fsdd_recordings, speakers=["jackson", "yweweler"], take_range=[0, 4])
    assert len(recordings) == 2 * 10 * 5
    assert {r.speaker for r in recordings} == {"jackson", "yweweler"}
    assert {r.take for r in recordings} == set(range(5))


def test_reader_errors_name_the_problem(fsdd_recordings, tmp_path):
    with pytest.raises(DataError, match="bob"):
        read_fsdd(fsdd_recordings, speakers=["george", "bob"])
    with pytest.raises(DataError, match="no-recordings-here"):
        read_fsdd(tmp_path / "no-recordings-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty"):
        read_fsdd(tmp_path / "empty")


def test_reader_reports_names_it_cannot_parse(fsdd_recordings, tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    shutil.copy(fsdd_recordings / "3_george_7.wav", folder)
    shutil.copy(fsdd_recordings / "4_george_7.wav", folder / "four-george.wav")
    report = SkipReport()
    recordings = read_fsdd(folder, report=report)
    assert [r.path.name for r in recordings] == ["3_george_7.wav"]
    assert report.counts() == {reasons.BAD_FILENAME: 1}
    assert "four-george.wav" in report.messages(reasons.BAD_FILENAME)[0]
    with pytest.raises(DataError, match="four-george.wav"):
        read_fsdd(folder, report=SkipReport(strict=True))


def test_connected_digits_are_deterministic_by_seed(two_speakers):
    first = build_connected_digits(two_speakers, 8, seed=3)
    again = build_connected_digits(two_speakers, 8, seed=3)
    other = build_connected_digits(two_speakers, 8, seed=4)
    assert [u.id for u in first] == [u.id for u in again]
    assert [u.text for u in first] == [u.text for u in again]
    assert all(a.audio.waveform.equal(b.audio.waveform) for a, b in zip(first, again))
    assert [u.audio.sources for u in first] != [u.audio.sources for u in other]


def test_connected_digit_transcripts_lengths_and_takes(two_speakers):
    pool = {r.path: r for r in two_speakers}
    utterances = build_connected_digits(two_speakers, 12, digits_per_utterance=[2, 5], gap_seconds=[0.1, 0.2], seed=0)
    silent = build_connected_digits(two_speakers, 2, digits_per_utterance=[2, 2], gap_seconds=[0.1, 0.1], gap_noise=0.0)
    first_take = silent[0].audio.sources[0]
    assert not silent[0].audio.waveform[:, load_audio(first_take)[0].shape[1] :][:, :800].any()
    for utt in utterances:
        takes = [pool[p] for p in utt.audio.sources]
        assert 2 <= len(takes) <= 5
        assert utt.text.split() == [DIGIT_WORDS[t.digit] for t in takes]
        assert {t.speaker for t in takes} == {utt.speaker}
        assert all(5 <= t.take <= 9 for t in takes)

        audio = utt.audio
        assert isinstance(audio, InMemoryAudio) and audio.sample_rate == 8000
        assert audio.waveform.dtype.is_floating_point and audio.waveform.shape[0] == 1
        take_samples = [soundfile.info(str(t.path)).frames for t in takes]
        gaps = audio.num_samples - sum(take_samples)
        n_gaps = len(takes) - 1
        assert n_gaps * 0.1 * 8000 - n_gaps <= gaps <= n_gaps * 0.2 * 8000 + n_gaps
        assert utt.duration == pytest.approx(audio.num_samples / 8000)

        # the takes are copied verbatim: the first at the start, the last at the end,
        # and a pause of low-level noise (std gap_noise = 1e-3) right after the first take
        first, _ = load_audio(takes[0].path)
        last, _ = load_audio(takes[-1].path)
        assert audio.waveform[:, : first.shape[1]].equal(first)
        assert audio.waveform[:, audio.num_samples - last.shape[1] :].equal(last)
        pause = audio.waveform[:, first.shape[1] : first.shape[1] + 800]
        assert 0.0008 < float(pause.std()) < 0.0012 and (pause != 0).all()


def test_mismatched_sample_rate_is_an_error_naming_the_file(fsdd_recordings, tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    shutil.copy(fsdd_recordings / "1_george_5.wav", folder)
    data, rate = soundfile.read(str(fsdd_recordings / "2_george_5.wav"))
    soundfile.write(str(folder / "2_george_5.wav"), np.repeat(data, 2), 2 * rate)
    with pytest.raises(DataError, match="2_george_5.wav"):
        build_connected_digits(read_fsdd(folder), 3)


def test_unreadable_take_is_reported_and_never_used(fsdd_recordings, tmp_path):
    folder = tmp_path / "recordings"
    folder.mkdir()
    for name in ["1_george_5.wav", "2_george_5.wav"]:
        shutil.copy(fsdd_recordings / name, folder)
    (folder / "3_george_5.wav").write_bytes(b"RIFF not really a wave file")
    (folder / "4_george_5.wav").write_bytes(b"")
    audio, rate = soundfile.read(str(fsdd_recordings / "5_george_5.wav"), dtype="float32")
    audio[100:110] = float("nan")
    soundfile.write(str(folder / "5_george_5.wav"), audio, rate, subtype="FLOAT")
    report = SkipReport()
    utterances = build_connected_digits(read_fsdd(folder), 20, seed=1, report=report)
    assert report.counts() == {reasons.UNREADABLE_AUDIO: 1, reasons.EMPTY_AUDIO: 1, reasons.NONFINITE_AUDIO: 1}
    assert "5_george_5.wav" in report.messages(reasons.NONFINITE_AUDIO)[0]
    assert all(torch.isfinite(u.audio.waveform).all() for u in utterances)
    assert "3_george_5.wav" in report.messages(reasons.UNREADABLE_AUDIO)[0]
    assert "4_george_5.wav" in report.messages(reasons.EMPTY_AUDIO)[0]
    assert set(" ".join(u.text for u in utterances).split()) == {"ONE", "TWO"}
    with pytest.raises(DataError, match="3_george_5.wav"):
        build_connected_digits(read_fsdd(folder), 20, report=SkipReport(strict=True))


def test_config_builds_the_set_relative_to_root(shared_data):
    config = DataConfig(
        root=str(shared_data),
        fsdd="fsdd/recordings",
        digits=DigitsConfig(speakers=["yweweler"], take_range=[0, 4], utterances=5, seed=7),
    )
    utterances = connected_digits(config, "train")
    assert len(utterances) == 5 and {u.speaker for u in utterances} == {"yweweler"}
    assert connected_digits(config, "dev") == connected_digits(config, "test") == []  # no held-out speaker
    assert connected_digits(DataConfig(), "train") == []  # no recordings folder: no connected digits


def test_a_held_out_speaker_is_only_in_the_test_split(shared_data):
    digits = DigitsConfig(
        held_out_speaker="nicolas", utterances=12, dev_utterances=6, test_utterances=5, dev_take_range=[0, 1]
    )
    config = DataConfig(root=str(shared_data), fsdd="fsdd/recordings", dev=["no/such/folder"], digits=digits)
    train = connected_digits(config, "train")
    dev, _ = load_split(config, "dev")  # data.dev is not read in a fold: the missing folder does not matter
    test = connected_digits(config, "test")
    assert (len(train), len(dev), len(test)) == (12, 6, 5)
    assert "nicolas" not in {u.speaker for u in train + dev}
    assert {u.speaker for u in test} == {"nicolas"}

    def takes(utterances):
        return {int(p.stem.split("_")[2]) for u in utterances for p in u.audio.sources}

    assert takes(train) <= set(range(5, 50)) and takes(dev) <= {0, 1}
    assert len({u.id for u in train + dev + test}) == 12 + 6 + 5  # ids never collide across splits

    missing = DataConfig(root=str(shared_data), fsdd="fsdd/recordingz")
    with pytest.raises(DataError, match="data.fsdd.*recordingz"):
        connected_digits(missing, "train")
    unknown = DataConfig(root=str(shared_data), fsdd="fsdd/recordings", digits=DigitsConfig(held_out_speaker="nobody"))
    with pytest.raises(DataError, match="held_out_speaker.*nobody"):
        connected_digits(unknown, "test")

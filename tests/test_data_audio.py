"""The one audio-header duration reader (asr.data.audio), which every corpus reader calls."""

import wave

import numpy as np
import pytest
import soundfile

from asr.data import report as reasons
from asr.data.audio import UnusableAudio, header_duration


def test_durations_from_headers_match_the_decoded_samples(fsdd_recordings, librivox_mini):
    files = sorted(fsdd_recordings.glob("*.wav"))[:20] + sorted(librivox_mini.rglob("*.flac"))
    assert len(files) == 25
    for path in files:
        samples, rate = soundfile.read(path, dtype="int16")
        assert header_duration(path) == pytest.approx(len(samples) / rate, abs=1e-9), path
    for path in files[:20]:  # WAV: Python's own parser, which shares no code with libsndfile
        with wave.open(str(path)) as stored:
            assert header_duration(path) == pytest.approx(stored.getnframes() / stored.getframerate(), abs=1e-9)


def test_a_channel_must_exist(tmp_path):
    stereo = tmp_path / "stereo.wav"
    soundfile.write(stereo, np.zeros((800, 2), dtype=np.int16), 8000)
    assert header_duration(stereo, channel=1) == header_duration(stereo) == 0.1
    with pytest.raises(UnusableAudio, match=r"has 2 channel\(s\), no channel 2") as err:
        header_duration(stereo, channel=2)
    assert err.value.reason == reasons.UNREADABLE_AUDIO


def test_files_it_cannot_use_name_the_file_and_the_reason(tmp_path):
    garbage = tmp_path / "garbage.flac"
    garbage.write_bytes(b"not audio at all" * 10)
    empty = tmp_path / "empty.wav"
    with wave.open(str(empty), "wb") as out:  # a valid header that counts no samples
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16000)
    for path, reason in (
        (tmp_path / "missing.wav", reasons.MISSING_AUDIO_FILE),
        (garbage, reasons.UNREADABLE_AUDIO),
        (empty, reasons.EMPTY_AUDIO),
    ):
        with pytest.raises(UnusableAudio) as err:
            header_duration(path)
        assert err.value.reason == reason and str(path) in err.value.message

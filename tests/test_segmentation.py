"""Long recordings in pieces (asr.inference.segmentation): where the cuts fall, on made-up loudness and on a long
recording of real FSDD digits whose boundaries are known (that a recogniser decodes a long recording as its
pieces: tests/test_inference_cli.py; how accurately: benchmarks/long_recording.py, docs/studies/long_recordings.md)."""

import pytest
import soundfile
import torch

from asr.data.fsdd import build_digit_recording, read_fsdd
from asr.data.utterance import AudioSegment, InMemoryAudio
from asr.decoding import DecodingOptions
from asr.inference import segmentation
from asr.inference.segmentation import (
    FRAME_SECONDS, Piece, cut_points, frame_levels, plan_pieces, read_piece, read_span, recording_levels,
    recording_pieces,
)


def test_cuts_fall_in_the_quiet_stretches():
    level = torch.ones(1000)
    level[300:320] = 0.0
    level[700:720] = 0.0
    cuts = cut_points(level, max_frames=500, smooth=5)
    assert len(cuts) == 2
    assert 300 <= cuts[0] < 320 and 700 <= cuts[1] < 720


def test_no_cut_where_the_utterance_fits():
    assert cut_points(torch.rand(500), max_frames=500) == []


@pytest.mark.parametrize("seed", range(5))
def test_pieces_are_never_longer_than_asked_nor_shorter_than_a_quarter_of_it(seed):
    generator = torch.Generator().manual_seed(seed)
    length = int(torch.randint(501, 5000, (1,), generator=generator))
    bounds = [0, *cut_points(torch.rand(length, generator=generator), max_frames=500, smooth=21), length]
    pieces = [end - start for start, end in zip(bounds, bounds[1:])]
    assert sum(pieces) == length
    assert max(pieces) <= 500 and min(pieces) >= 500 // 4


def test_too_short_a_piece_is_refused():
    with pytest.raises(ValueError, match="max_frames"):
        cut_points(torch.rand(10), max_frames=3)
    with pytest.raises(ValueError, match="segment_seconds"):
        DecodingOptions(segment_seconds=0.1)
    with pytest.raises(ValueError, match="segment_seconds"):
        DecodingOptions(segment_seconds=-1.0)
    assert DecodingOptions(segment_seconds=0).segment_seconds == 0  # 0: off


@pytest.fixture(scope="module")
def digits(fsdd_recordings):
    """120 FSDD takes of the four speakers (about 2.3 minutes) with 0.2-1.2 s pauses, boundaries known."""
    return build_digit_recording(read_fsdd(fsdd_recordings, take_range=[0, 4]), 120, seed=3)


def _piece_samples(recording, piece: Piece) -> list[tuple[int, int]]:
    rate = recording.sample_rate
    return [(round(start * FRAME_SECONDS * rate), round(end * FRAME_SECONDS * rate)) for start, end in piece.spans]


@pytest.mark.parametrize("seconds", [2.0, 2.5, 10.0])
def test_pieces_of_a_digit_recording_are_cut_in_pauses_and_all_hold_speech(digits, seconds):
    """Against the known boundaries: no digit is split between pieces (each has at least 99% of its
    energy in one piece), every piece holds a digit, none is longer than asked, and of the pauses
    only PAD_SECONDS on either side of the speech are decoded."""
    pieces = plan_pieces(frame_levels(digits.waveform, digits.sample_rate), seconds)
    assert all(0 < piece.frames <= seconds / FRAME_SECONDS for piece in pieces)
    assert all(a.end <= b.start for a, b in zip(pieces, pieces[1:]))  # in order, never overlapping
    energy = digits.waveform[0].pow(2)
    held = [0] * len(pieces)
    for start, end in digits.spans:
        total = float(energy[start:end].sum())
        shares = [
            sum(float(energy[max(start, a) : min(end, b)].sum()) for a, b in _piece_samples(digits, piece)) / total
            for piece in pieces
        ]
        best = max(range(len(pieces)), key=shares.__getitem__)
        assert shares[best] > 0.99, f"digit at {start / digits.sample_rate:.2f} s is cut: {shares[best]:.3f} in one piece"
        held[best] += 1
    assert min(held) >= 1, "a piece holds no digit"
    pad = round((segmentation.PAD_SECONDS + FRAME_SECONDS) * digits.sample_rate)
    for piece in pieces:
        for a, b in _piece_samples(digits, piece):
            inside = [(start, end) for start, end in digits.spans if start < b and a < end]
            assert inside, "a stretch without a digit is decoded"
            assert a >= inside[0][0] - pad and b <= inside[-1][1] + pad
    if seconds >= 10.0:  # long pieces: several digits each, as the model was trained on
        assert len(pieces) < len(digits.spans) / 4


def test_speech_without_a_pause_longer_than_a_piece_is_cut_at_its_quietest_frame():
    levels = torch.full((1000,), -60.0)
    levels[100:900] = -20.0
    levels[480:490] = -35.0  # quieter, but too short to be a pause
    pieces = plan_pieces(levels, max_seconds=5.0)
    assert len(pieces) == 2
    assert 470 <= pieces[0].end <= 500 and pieces[0].end == pieces[1].start  # within the 0.2 s smoothing of the dip
    assert pieces[0].start == 100 and pieces[1].end == 900  # the pause is all floor: no padding outside


def test_a_piece_keeps_the_margin_around_its_speech_but_not_the_floor_of_the_pause():
    """Outside a piece's speech, PAD_SECONDS of the pause at most, and of that only what is louder than the
    recording's floor (a take's own margin); between two stretches of one piece the padding stays, floor or
    not (the gap between words)."""
    levels = torch.full((1000,), -60.0)
    levels[300:400] = -20.0  # speech
    levels[450:550] = -20.0  # speech again after a 0.5 s pause at the floor
    levels[295:300] = -50.0  # a margin: below the speech threshold (about -47 dB), above the floor's 6 dB
    levels[550:553] = -50.0
    (piece,) = plan_pieces(levels, max_seconds=5.0)
    assert piece.spans == ((295, 410), (440, 553))
    levels[295:300] = levels[550:553] = -58.0  # within EDGE_FLOOR_DB of the floor: not a margin
    (piece,) = plan_pieces(levels, max_seconds=5.0)
    assert piece.spans == ((300, 410), (440, 550))


def test_a_recording_without_speech_has_no_pieces():
    assert plan_pieces(torch.full((3000,), -60.0), max_seconds=5.0, threshold=-40.0) == []


def test_a_file_is_measured_block_by_block_and_read_piece_by_piece(digits, tmp_path, monkeypatch):
    """The levels of a file read in blocks are those of the whole waveform, and each piece read from the
    file (a seek) holds the samples of the recording there; a segment of the file reads as the file does."""
    path = tmp_path / "digits.wav"
    soundfile.write(path, digits.waveform[0].numpy(), digits.sample_rate, subtype="FLOAT")
    monkeypatch.setattr(segmentation, "BLOCK_SECONDS", 7.3)  # many blocks, none a whole number of seconds
    levels, rate = recording_levels(path)
    assert rate == digits.sample_rate
    torch.testing.assert_close(levels, frame_levels(digits.waveform, rate))
    pieces = plan_pieces(levels, 4.0)
    read = list(recording_pieces(path, 4.0))
    assert len(read) == len(pieces)
    for piece, (waveform, _) in zip(pieces, read):
        expected = torch.cat([digits.waveform[0, a:b] for a, b in _piece_samples(digits, piece)])
        assert torch.equal(waveform[0], expected)
        start, end = piece.spans[0]
        if start >= 100:  # the same span read from a segment of the file starting 1 s (100 frames) in
            segment = read_span(AudioSegment(path, 1.0), start - 100, end - 100)[0]
            torch.testing.assert_close(segment, read_span(path, start, end)[0])
        assert torch.equal(read_piece(InMemoryAudio(digits.waveform, rate), piece)[0], waveform)

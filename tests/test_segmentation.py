"""Long utterances in pieces (asr.inference.segmentation): where the cuts fall, on made-up loudness and on real
speech (that a recogniser decoding with ``segment_seconds`` gives what its pieces give: tests/test_inference_cli.py)."""

import pytest
import torch

from asr.decoding import DecodingOptions
from asr.inference.segmentation import cut_points, split_features
from features.audio import load_audio
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline


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


@pytest.mark.parametrize(
    "config",
    [FeatureConfig(kind="mfcc", sample_rate=8000, num_ceps=13, mvn="utterance"),
     FeatureConfig(kind="fbank", sample_rate=8000, num_mel_bins=40, mvn="none", deltas=True)],
    ids=["mfcc-utterance-mvn", "fbank-deltas"],
)
def test_real_digits_are_cut_in_the_pause_between_them(config, fsdd_recordings):
    """Two FSDD digits (real speech, room noise and all) with 0.4 s of silence between them: the one cut
    is in the silence, whatever the features."""
    first, rate = load_audio(fsdd_recordings / "3_george_0.wav")
    second, _ = load_audio(fsdd_recordings / "7_jackson_0.wav")
    gap = torch.zeros(1, int(0.4 * rate))
    waveform = torch.cat([first, gap, second], dim=1)
    features = FeaturePipeline(config).from_waveform(waveform, rate)
    pieces = split_features(features, config, max_seconds=0.8 * features.size(0) / 100)
    assert len(pieces) == 2
    assert torch.equal(torch.cat(pieces), features)
    gap_start = first.size(1) / rate * 100  # in 10 ms frames
    assert gap_start < pieces[0].size(0) < gap_start + 40

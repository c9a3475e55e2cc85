"""Mean-variance normalisation: utterance MVN, global statistics, their round trips through files and checkpoints."""

import io

import pytest
import torch

from features.audio import load_audio
from features.config import FeatureConfig
from features.mvn import GlobalStats, apply_mvn, utterance_mvn
from features.pipeline import FeaturePipeline


@pytest.fixture(scope="module")
def digit_paths(fsdd_recordings):
    # Several speakers and digits: per-utterance statistics differ, so global != per-utterance MVN.
    return [fsdd_recordings / f"{d}_{s}_{t}.wav" for d, s, t in
            [(0, "george", 5), (4, "jackson", 9), (8, "nicolas", 20), (2, "yweweler", 33), (9, "george", 41)]]


def accumulate(pipeline: FeaturePipeline, paths) -> GlobalStats:
    """Global statistics over the raw features of ``paths``, set on ``pipeline``."""
    stats = GlobalStats(pipeline.feature_dim)
    for path in paths:
        stats.update(pipeline.raw_features(*load_audio(path)))
    pipeline.stats = stats
    return stats


@pytest.fixture(scope="module")
def global_pipeline(digit_paths):
    pipeline = FeaturePipeline(FeatureConfig(sample_rate=8000, mvn="global", deltas=True))
    accumulate(pipeline, digit_paths)
    return pipeline


def raw(pipeline, path):
    return pipeline.raw_features(*load_audio(path))


def test_utterance_mvn_gives_zero_mean_unit_std_per_dimension(librivox_mini):
    path = sorted(librivox_mini.rglob("*.flac"))[0]
    feats = FeaturePipeline(FeatureConfig(mvn="utterance")).from_file(path)
    raw_feats = raw(FeaturePipeline(FeatureConfig()), path)
    assert raw_feats.mean(dim=0).abs().min() > 1.0  # log-mel in int16 units is far from zero mean
    torch.testing.assert_close(feats.mean(dim=0), torch.zeros(80), atol=1e-4, rtol=0)
    torch.testing.assert_close(feats.std(dim=0, unbiased=False), torch.ones(80), atol=1e-4, rtol=0)


def test_global_stats_equal_statistics_of_the_concatenated_training_features(global_pipeline, digit_paths):
    stats = global_pipeline.stats
    everything = torch.cat([raw(global_pipeline, p) for p in digit_paths]).double()
    assert stats.count == everything.shape[0] and stats.dim == 240
    torch.testing.assert_close(stats.mean, everything.mean(dim=0), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(stats.std, everything.std(dim=0, unbiased=False), rtol=1e-9, atol=1e-10)

    # Normalised with the global numbers, the training set as a whole (not each utterance) is standardised.
    normalised = [global_pipeline.from_file(p) for p in digit_paths]
    joined = torch.cat(normalised)
    torch.testing.assert_close(joined.mean(dim=0), torch.zeros(240), atol=1e-4, rtol=0)
    torch.testing.assert_close(joined.std(dim=0, unbiased=False), torch.ones(240), atol=1e-4, rtol=0)
    assert normalised[0].mean(dim=0).abs().max() > 0.1


def test_global_stats_do_not_depend_on_how_frames_are_split(global_pipeline, digit_paths):
    feats = torch.cat([raw(global_pipeline, p) for p in digit_paths])
    once, split = GlobalStats(240), GlobalStats(240)
    once.update(feats)
    for chunk in feats.split(37):
        split.update(chunk)
    assert once.count == split.count
    torch.testing.assert_close(once.mean, split.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(once.std, split.std, rtol=1e-10, atol=1e-12)


def test_float64_accumulation_keeps_a_small_variance_on_a_large_mean():
    generator = torch.Generator().manual_seed(0)
    feats = 1000.0 + 0.01 * torch.randn(20000, 3, generator=generator, dtype=torch.float64)
    stats = GlobalStats(3)
    for chunk in feats.split(1000):
        stats.update(chunk)
    torch.testing.assert_close(stats.std, feats.std(dim=0, unbiased=False), rtol=1e-6, atol=0)


def test_stats_round_trip_through_save_load_and_state_dict(global_pipeline, tmp_path, digit_paths):
    stats = global_pipeline.stats
    path = tmp_path / "cmvn.pt"
    stats.save(path)
    for copy in (GlobalStats.load(path), GlobalStats.from_state_dict(stats.state_dict())):
        assert copy.count == stats.count and copy.std_floor == stats.std_floor
        assert torch.equal(copy.mean, stats.mean) and torch.equal(copy.std, stats.std)
    # A state_dict is a snapshot: later updates to the live stats do not leak into it.
    live = GlobalStats.from_state_dict(stats.state_dict())
    state = live.state_dict()
    live.update(torch.ones(3, 240))
    assert state["count"] == stats.count and torch.equal(state["sum"], stats.sum)


def test_pipeline_checkpoint_round_trip_reproduces_features(global_pipeline, digit_paths):
    """What training saves in the checkpoint rebuilds a pipeline that computes identical features."""
    buffer = io.BytesIO()
    torch.save({"features": global_pipeline.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["features"]
    assert isinstance(state["config"], dict)
    restored = FeaturePipeline.from_state_dict(state)
    assert restored.config == global_pipeline.config
    for path in digit_paths[:2]:
        torch.testing.assert_close(restored.from_file(path), global_pipeline.from_file(path), rtol=0, atol=0)


def test_pipeline_state_with_an_unknown_config_key_is_rejected(global_pipeline):
    state = global_pipeline.state_dict()
    state["config"]["spec_augment"]["freq_mask_widht"] = 10
    with pytest.raises(ValueError, match="features.spec_augment.freq_mask_widht"):
        FeaturePipeline.from_state_dict(state)


def test_global_mvn_without_stats_is_a_clear_error(digit_paths):
    pipeline = FeaturePipeline(FeatureConfig(sample_rate=8000, mvn="global"))
    with pytest.raises(ValueError, match="compute_global_stats"):
        pipeline.from_file(digit_paths[0])
    with pytest.raises(ValueError, match="global"):
        apply_mvn(torch.zeros(5, 80), "global", None)


def test_stats_of_the_wrong_dimension_are_rejected(global_pipeline):
    with pytest.raises(ValueError, match="dimension 240"):
        FeaturePipeline(FeatureConfig(mvn="global"), stats=global_pipeline.stats)  # 80-dim features
    with pytest.raises(ValueError, match=r"\(T, 240\)"):
        global_pipeline.stats.update(torch.zeros(4, 80))


def test_empty_stats_and_constant_dimensions():
    with pytest.raises(ValueError, match="no frames"):
        GlobalStats(4).mean
    stats = GlobalStats(2)
    stats.update(torch.tensor([[3.0, 1.0], [3.0, -1.0]]))
    assert stats.std[0] == stats.std_floor  # a constant dimension is floored, not divided by zero
    out = stats.normalize(torch.tensor([[3.0, 1.0]]))
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0]]))
    single = utterance_mvn(torch.tensor([[5.0, -2.0]]))  # one frame: std 0 everywhere
    torch.testing.assert_close(single, torch.zeros(1, 2))


def test_loading_missing_or_corrupt_stats_names_the_file(tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(ValueError, match=str(missing)):
        GlobalStats.load(missing)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=str(corrupt)):
        GlobalStats.load(corrupt)


_STATE = {"dim": 1, "count": 1, "sum": [0.0], "sum_squares": [0.0], "std_floor": 1e-5}


@pytest.mark.parametrize("state", [5, [1, 2], {**_STATE, "dim": "x"}, {**_STATE, "count": None}, {**_STATE, "sum": "text"}],
                         ids=["int", "list", "dim-text", "count-none", "sum-text"])
def test_a_state_that_is_not_statistics_is_a_value_error_saying_so(state):
    # Callers (a cache entry, a checkpoint) catch ValueError: any other type would end in a traceback.
    with pytest.raises(ValueError, match="GlobalStats state"):
        GlobalStats.from_state_dict(state)


def test_statistics_that_load_but_cannot_be_right_are_named_by_check():
    stats = GlobalStats(3)
    stats.update(torch.tensor([[3.0, 1.0, 5.0], [3.0, -1.0, 5.0], [3.0, 0.5, 5.0]]))
    stats.check()  # constant dimensions: a variance of 0 (or a rounding error below it) is right
    negative = GlobalStats.from_state_dict({**stats.state_dict(), "sum_squares": stats.sum_squares * 0.5})
    with pytest.raises(ValueError, match="negative variance in 2 of 3 dimensions"):
        negative.check()
    infinite = GlobalStats.from_state_dict({**stats.state_dict(), "sum": stats.sum + float("inf")})
    with pytest.raises(ValueError, match="NaN or infinite"):
        infinite.check()
    with pytest.raises(ValueError, match="no frames"):
        GlobalStats(3).check()

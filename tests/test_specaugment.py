"""SpecAugment: training-only masks after MVN, filled with the mean, bounded, reproducible; time warp."""

import pytest
import torch
import torch.nn.functional as F

from features.audio import load_audio
from features.config import FeatureConfig, SpecAugmentConfig
from features.mvn import GlobalStats
from features.pipeline import FeaturePipeline
from features.specaugment import apply_masks, draw_masks, spec_augment, time_warp, warp_frames


def seeded(seed):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def speech(librivox_mini):
    """(waveform, sample_rate) of ~3.3 s of real read speech."""
    return load_audio(sorted(librivox_mini.rglob("*.flac"))[4])


@pytest.fixture(scope="module")
def normalised(speech):
    """(T, 80) utterance-normalised log-mel features of real speech."""
    return FeaturePipeline(FeatureConfig(mvn="utterance")).from_waveform(*speech)


def masked_cells(masks, frames, bins):
    cells = torch.zeros(frames, bins, dtype=torch.bool)
    for start, width in masks.freq:
        cells[:, start : start + width] = True
    for start, width in masks.time:
        cells[start : start + width, :] = True
    return cells


def test_masks_only_in_training(speech):
    spec = SpecAugmentConfig(enabled=True, time_warp=5)
    augmented = FeaturePipeline(FeatureConfig(mvn="utterance", spec_augment=spec))
    plain = FeaturePipeline(FeatureConfig(mvn="utterance"))
    reference = plain.from_waveform(*speech)
    torch.testing.assert_close(augmented.from_waveform(*speech), reference, rtol=0, atol=0)
    assert not torch.equal(augmented.from_waveform(*speech, train=True, generator=seeded(0)), reference)
    # enabled: false leaves training features alone too.
    torch.testing.assert_close(plain.from_waveform(*speech, train=True, generator=seeded(0)), reference)


@pytest.mark.parametrize("mvn", ["utterance", "global", "none"])
def test_pipeline_fills_masks_with_the_mean(speech, mvn):
    """After MVN the fill is 0 (the mean); without MVN it is the utterance's per-bin mean, never a raw 0."""
    spec = SpecAugmentConfig(enabled=True, freq_masks=2, freq_mask_width=20, time_masks=2, time_mask_width=30)
    pipeline = FeaturePipeline(FeatureConfig(mvn=mvn, spec_augment=spec))
    if mvn == "global":
        pipeline.stats = _stats_of(pipeline.raw_features(*speech))
    clean = pipeline.from_waveform(*speech)
    frames, bins = clean.shape
    for seed in range(5):
        out = pipeline.from_waveform(*speech, train=True, generator=seeded(seed))
        # With no dither and no warp, SpecAugment is the first consumer of the generator.
        cells = masked_cells(draw_masks(frames, bins, spec, seeded(seed)), frames, bins)
        assert cells.any()
        fill = torch.zeros(bins) if mvn != "none" else clean.mean(dim=0)
        torch.testing.assert_close(out[cells], fill.expand(frames, bins)[cells], rtol=0, atol=1e-6)
        torch.testing.assert_close(out[~cells], clean[~cells], rtol=0, atol=0)
        if mvn == "none":
            assert out[cells].min() > clean.min() and (out[cells] != 0).all()


def _stats_of(feats):
    stats = GlobalStats(feats.shape[1])
    stats.update(feats)
    return stats


def test_mask_widths_and_positions_stay_within_the_configured_bounds():
    spec = SpecAugmentConfig(freq_masks=3, freq_mask_width=27, time_masks=2, time_mask_width=40, time_mask_ratio=0.2)
    for frames in (60, 300):  # 60 frames: the ratio (12 frames), not the width, is the binding limit
        max_t = min(40, int(0.2 * frames))
        widest_f = widest_t = 0
        for seed in range(200):
            masks = draw_masks(frames, 80, spec, seeded(seed))
            assert len(masks.freq) == 3 and len(masks.time) == 2
            for start, width in masks.freq:
                assert 0 <= width <= 27 and 0 <= start and start + width <= 80
                widest_f = max(widest_f, width)
            for start, width in masks.time:
                assert 0 <= width <= max_t and 0 <= start and start + width <= frames
                widest_t = max(widest_t, width)
        assert widest_f == 27 and widest_t == max_t  # the bounds are reached, i.e. U{0..bound} inclusive


def test_fully_masked_bins_are_bounded_on_real_features(normalised):
    spec = SpecAugmentConfig(freq_masks=2, freq_mask_width=10, time_masks=2, time_mask_width=20)
    for seed in range(10):
        out = spec_augment(normalised, spec, seeded(seed))
        zero_columns = int((out == 0).all(dim=0).sum())
        zero_rows = int((out == 0).all(dim=1).sum())
        assert zero_columns <= 2 * 10 and zero_rows <= 2 * 20


def test_fill_mean_uses_each_bins_utterance_mean(normalised):
    raw_like = normalised * 3.0 + torch.linspace(5.0, 15.0, normalised.shape[1])  # a non-zero-mean input
    spec = SpecAugmentConfig(freq_masks=1, freq_mask_width=15, time_masks=1, time_mask_width=25)
    out = spec_augment(raw_like, spec, seeded(3), fill="mean")
    masks = draw_masks(*raw_like.shape, spec, seeded(3))
    expected = apply_masks(raw_like, masks, raw_like.mean(dim=0))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="fill"):
        spec_augment(raw_like, spec, seeded(3), fill="min")


def test_augmentation_is_deterministic_per_generator(normalised):
    spec = SpecAugmentConfig(enabled=True, time_warp=5)
    first = spec_augment(normalised, spec, seeded(11))
    again = spec_augment(normalised, spec, seeded(11))
    other = spec_augment(normalised, spec, seeded(12))
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert not torch.equal(first, other)


def test_time_warp_keeps_shape_ends_and_range(normalised):
    frames = normalised.shape[0]
    changed = 0
    for seed in range(5):
        warped = time_warp(normalised, 20, seeded(seed))
        assert warped.shape == normalised.shape
        # The ends are pinned; linear interpolation never leaves a bin's original range.
        torch.testing.assert_close(warped[[0, -1]], normalised[[0, -1]])
        assert (warped.min(dim=0).values >= normalised.min(dim=0).values - 1e-5).all()
        assert (warped.max(dim=0).values <= normalised.max(dim=0).values + 1e-5).all()
        changed += not torch.allclose(warped, normalised)
    assert changed >= 4  # only a warp of w = 0 (1 chance in 41) leaves it unchanged
    assert time_warp(normalised, 0, seeded(0)) is normalised
    short = normalised[:30]
    assert time_warp(short, 20, seeded(0)) is short  # too short to warp by 20 frames either way
    assert frames > 60


def test_time_warp_moves_a_frame_to_its_warped_position():
    """A ramp through time stays monotone; the frame at the centre lands at centre + w."""
    frames = torch.arange(100, dtype=torch.float32)[:, None].repeat(1, 3)  # (100, 3), value = frame index
    warped = time_warp(frames, 10, seeded(5))
    generator = seeded(5)
    centre = int(torch.randint(11, 90, (1,), generator=generator))
    shift = int(torch.randint(-10, 11, (1,), generator=generator))
    assert shift != 0
    assert (warped[1:, 0] >= warped[:-1, 0]).all()
    assert warped[centre + shift, 0] == pytest.approx(float(centre), abs=1e-4)


def test_batched_time_warp_is_linear_interpolation_of_each_side():
    """warp_frames on a padded batch equals F.interpolate(align_corners=True) of each row's two sides,
    row by row, and reads nothing past a row's length."""
    generator = seeded(2)
    lengths = torch.tensor([60, 45, 23, 60])
    feats = torch.randn(4, 60, 6, generator=generator)
    warps = [(30, 24), (10, 14), None, (55, 59)]
    warped = warp_frames(feats, lengths, warps)
    for row, warp in enumerate(warps):
        frames = int(lengths[row])
        x = feats[row, :frames].T.unsqueeze(0)  # (1, D, T)
        if warp is None:
            expected = feats[row, :frames]
        else:
            centre, target = warp
            left = F.interpolate(x[..., :centre], size=target, mode="linear", align_corners=True)
            right = F.interpolate(x[..., centre:], size=frames - target, mode="linear", align_corners=True)
            expected = torch.cat([left, right], dim=-1).squeeze(0).T
        torch.testing.assert_close(warped[row, :frames], expected, rtol=1e-5, atol=1e-5)

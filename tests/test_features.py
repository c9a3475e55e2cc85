"""Audio loading, fbank/MFCC, deltas and the training/inference feature pipeline, on real speech."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import torchaudio
from torchaudio.compliance import kaldi

from features.audio import AudioError, load_audio, resample, to_mono
from features.config import FeatureConfig, SpecAugmentConfig
from features.deltas import add_deltas
from features.filterbank import check_mel_filters, extract, num_frames
from features.pipeline import FeaturePipeline, speed_perturb

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def libri_flac(librivox_mini):
    return sorted(librivox_mini.rglob("*.flac"))[1]  # ~3 s of read speech


@pytest.fixture(scope="module")
def digit_wav(fsdd_recordings):
    return fsdd_recordings / "7_jackson_12.wav"


def expected_frames(duration):
    """100 frames per second, less the 1.5 frames that the 25 ms window overhangs a 10 ms shift (snip_edges)."""
    return duration * 100 - 1.5


def seeded(seed):
    return torch.Generator().manual_seed(seed)


# --- audio -------------------------------------------------------------------------------------------


def test_load_audio_gives_channels_first_float(libri_flac):
    waveform, sample_rate = load_audio(libri_flac)
    info = soundfile.info(str(libri_flac))
    assert sample_rate == info.samplerate == 16000
    assert waveform.shape == (1, info.frames) and waveform.dtype == torch.float32
    assert 0 < waveform.abs().max() <= 1.0


@pytest.mark.parametrize("case", ["missing", "garbage", "empty"])
def test_bad_audio_raises_audio_error_naming_the_file(tmp_path, case):
    path = tmp_path / f"{case}.wav"
    if case == "garbage":
        path.write_bytes(b"this is not audio at all \x00\x01\x02" * 40)
    elif case == "empty":
        soundfile.write(str(path), np.zeros(0, dtype=np.int16), 16000, subtype="PCM_16")
    with pytest.raises(AudioError, match=str(path)) as info:
        load_audio(path)
    assert isinstance(info.value, ValueError)
    with pytest.raises(AudioError, match=str(path)):
        FeaturePipeline(FeatureConfig()).from_file(path)


def test_audio_shorter_than_one_frame_names_the_file(tmp_path, digit_wav):
    waveform, sample_rate = load_audio(digit_wav)
    path = tmp_path / "short.wav"
    soundfile.write(str(path), waveform[0, :150].numpy(), sample_rate)  # 150 samples < 200-sample window at 8 kHz
    with pytest.raises(AudioError, match=str(path)):
        FeaturePipeline(FeatureConfig(sample_rate=8000)).from_file(path)


def test_stereo_downmix_is_the_mean_of_the_channels(librivox_mini, libri_flac):
    left, sr = load_audio(libri_flac)
    right, _ = load_audio(sorted(librivox_mini.rglob("*.flac"))[4])
    n = min(left.shape[1], right.shape[1])
    stereo = torch.cat([left[:, :n], 0.5 * right[:, :n]])  # (2, N): two different real signals
    expected = (left[0, :n] + 0.5 * right[0, :n]) / 2
    torch.testing.assert_close(to_mono(stereo), expected, rtol=0, atol=0)
    pipeline = FeaturePipeline(FeatureConfig())
    torch.testing.assert_close(pipeline.from_waveform(stereo, sr), pipeline.from_waveform(expected, sr))
    # A (1, N) file and its (N,) samples are the same audio.
    torch.testing.assert_close(pipeline.from_waveform(left, sr), pipeline.from_waveform(left[0], sr))


# --- fbank / MFCC --------------------------------------------------------------------------------------


def test_fbank_is_80_dim_at_100_frames_per_second(librivox_mini):
    pipeline = FeaturePipeline(FeatureConfig())
    for path in sorted(librivox_mini.rglob("*.flac"))[:2]:
        info = soundfile.info(str(path))
        feats = pipeline.from_file(path)
        assert feats.shape[1] == pipeline.feature_dim == 80
        assert feats.dtype == torch.float32 and torch.isfinite(feats).all()
        assert abs(feats.shape[0] - expected_frames(info.duration)) <= 1
        assert feats.shape[0] == num_frames(info.frames, pipeline.config)


def test_fbank_matches_kaldi_on_int16_samples(libri_flac):
    """The float waveform is scaled by 32768, so the features are what Kaldi computes from the int16 file."""
    samples, sr = soundfile.read(str(libri_flac), dtype="int16")
    reference = kaldi.fbank(torch.from_numpy(samples.astype(np.float32))[None], num_mel_bins=80, sample_frequency=sr)
    feats = FeaturePipeline(FeatureConfig()).from_file(libri_flac)
    torch.testing.assert_close(feats, reference, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "rate, bins, frame_ms, warp", [(16000, 80, 25.0, 1.0), (16000, 40, 25.0, 0.913), (8000, 23, 20.0, 1.087)]
)
def test_fbank_and_mfcc_match_kaldi_with_a_vtln_warp(libri_flac, rate, bins, frame_ms, warp):
    # extract() builds the window and the mel filters itself and keeps them between calls: it must
    # still compute what torchaudio's Kaldi functions compute, for every warp, rate and frame length.
    waveform, sr = load_audio(libri_flac)
    waveform = resample(waveform[0], sr, rate)
    scaled = waveform * 32768.0
    options = dict(
        num_mel_bins=bins, sample_frequency=float(rate), frame_length=frame_ms, dither=0.0,
        vtln_low=100.0, vtln_high=-500.0, vtln_warp=warp,
    )
    for _ in range(2):  # the second time from the kept filters
        config = FeatureConfig(sample_rate=rate, num_mel_bins=bins, frame_length_ms=frame_ms)
        torch.testing.assert_close(
            extract(waveform, config, warp=warp), kaldi.fbank(scaled[None], **options), rtol=1e-5, atol=1e-4
        )
        config = FeatureConfig(kind="mfcc", sample_rate=rate, num_mel_bins=bins, num_ceps=13, frame_length_ms=frame_ms)
        torch.testing.assert_close(
            extract(waveform, config, warp=warp), kaldi.mfcc(scaled[None], num_ceps=13, **options), rtol=1e-4, atol=1e-3
        )


@pytest.mark.parametrize("num_ceps", [13, 40])
def test_mfcc_is_the_liftered_dct_of_the_log_mel_fbank(libri_flac, num_ceps):
    mfcc = FeaturePipeline(FeatureConfig(kind="mfcc", num_ceps=num_ceps)).from_file(libri_flac)
    fbank = FeaturePipeline(FeatureConfig(kind="fbank")).from_file(libri_flac)
    assert mfcc.shape == (fbank.shape[0], num_ceps)
    # Kaldi's MFCC: orthonormal DCT-II over the 80 log-mel energies, then the sine lifter with Q = 22.
    bins = fbank.shape[1]
    m = torch.arange(bins, dtype=torch.float64)[:, None]
    k = torch.arange(num_ceps, dtype=torch.float64)[None, :]
    dct = math.sqrt(2.0 / bins) * torch.cos(math.pi / bins * (m + 0.5) * k)
    dct[:, 0] = math.sqrt(1.0 / bins)
    lifter = 1.0 + 11.0 * torch.sin(math.pi * k[0] / 22.0)
    expected = (fbank.double() @ dct) * lifter
    torch.testing.assert_close(mfcc.double(), expected, rtol=1e-4, atol=1e-3)


def test_8khz_digits_resampled_to_16khz_keep_100_frames_per_second(digit_wav):
    info = soundfile.info(str(digit_wav))
    assert info.samplerate == 8000
    pipeline = FeaturePipeline(FeatureConfig(sample_rate=16000))
    feats = pipeline.from_file(digit_wav)
    assert feats.shape == (num_frames(2 * info.frames, pipeline.config), 80)
    assert abs(feats.shape[0] - expected_frames(info.duration)) <= 1
    # Resampling preserves the signal below 4 kHz: energy in the upper (empty) half of the 16 kHz
    # spectrum is far below the speech band.
    assert feats[:, :40].mean() > feats[:, 70:].mean() + 5


def test_resample_is_a_no_op_at_the_same_rate(digit_wav):
    waveform, sr = load_audio(digit_wav)
    assert resample(waveform, sr, sr) is waveform


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_resample_equals_torchaudio_and_keeps_no_state_between_calls(digit_wav, dtype):
    # Kernels are kept between calls: the same rates must give torchaudio's result every time,
    # whatever was resampled before, for mono (N,) and multichannel (C, N) input.
    waveform, sr = load_audio(digit_wav)
    waveform = waveform.to(dtype)
    for orig, new in [(sr, 16000), (16000, 14400), (sr, 16000), (17600, 16000), (sr, 16000)]:
        for signal in (waveform[0], torch.cat([waveform, -waveform])):
            expected = torchaudio.functional.resample(signal, orig, new)
            got = resample(signal, orig, new)
            assert got.dtype == dtype
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


# --- deltas --------------------------------------------------------------------------------------------


def _clamped_filter(x, taps):
    """sum_j taps[j] * x[clamp(t + j - K)] for a (2K+1)-tap filter, frames clamped to [0, T-1] like Kaldi."""
    x = x.double().numpy()
    half = (len(taps) - 1) // 2
    frames = x.shape[0]
    out = np.zeros_like(x)
    for t in range(frames):
        for j, tap in enumerate(taps):
            out[t] += tap * x[min(max(t + j - half, 0), frames - 1)]
    return torch.from_numpy(out)


def test_deltas_triple_the_dim_and_match_the_regression_formula(libri_flac):
    plain = FeaturePipeline(FeatureConfig()).from_file(libri_flac)
    with_deltas = FeaturePipeline(FeatureConfig(deltas=True)).from_file(libri_flac)
    assert with_deltas.shape == (plain.shape[0], 240)
    torch.testing.assert_close(with_deltas[:, :80], plain)
    # d_t = sum_{n=1,2} n (c_{t+n} - c_{t-n}) / 10; delta-delta is that filter applied twice to c.
    delta_taps = np.array([-2.0, -1.0, 0.0, 1.0, 2.0]) / 10.0
    torch.testing.assert_close(with_deltas[:, 80:160].double(), _clamped_filter(plain, delta_taps), atol=1e-4, rtol=0)
    torch.testing.assert_close(
        with_deltas[:, 160:].double(), _clamped_filter(plain, np.convolve(delta_taps, delta_taps)), atol=1e-4, rtol=0
    )


def test_deltas_of_a_ramp_are_its_slope_and_zero_curvature():
    frames = torch.arange(30, dtype=torch.float32)[:, None]
    ramp = torch.cat([0.5 * frames, -2.0 * frames], dim=1)  # (30, 2)
    out = add_deltas(ramp)
    interior = slice(4, -4)  # edges are clamped, so only frames >= 4 from an end see the full ramp
    torch.testing.assert_close(out[interior, 2:4], torch.tensor([0.5, -2.0]).expand(22, 2))
    torch.testing.assert_close(out[interior, 4:], torch.zeros(22, 2))


# --- dither and determinism ---------------------------------------------------------------------------


def test_dither_only_in_training_and_reproducible_with_a_generator(digit_wav):
    waveform, sr = load_audio(digit_wav)
    clean = FeaturePipeline(FeatureConfig(sample_rate=8000))
    dithered = FeaturePipeline(FeatureConfig(sample_rate=8000, dither=1.0))
    reference = clean.from_waveform(waveform, sr)
    torch.testing.assert_close(dithered.from_waveform(waveform, sr, train=False), reference, rtol=0, atol=0)
    train_a = dithered.from_waveform(waveform, sr, train=True, generator=seeded(1))
    train_b = dithered.from_waveform(waveform, sr, train=True, generator=seeded(1))
    train_c = dithered.from_waveform(waveform, sr, train=True, generator=seeded(2))
    torch.testing.assert_close(train_a, train_b, rtol=0, atol=0)
    assert not torch.equal(train_a, reference) and not torch.equal(train_a, train_c)
    # One LSB of noise in int16 units barely moves the log-mel of speech (it is not a gross perturbation).
    assert (train_a - reference).abs().median() < 0.05


def test_inference_dither_is_reproducible_per_recording_and_leaves_the_global_rng_alone(digit_wav):
    waveform, sr = load_audio(digit_wav)
    undithered = FeaturePipeline(FeatureConfig(sample_rate=8000, dither=1.0)).from_waveform(waveform, sr)
    pipeline = FeaturePipeline(FeatureConfig(sample_rate=8000, dither=1.0, dither_inference=True))
    torch.manual_seed(0)
    first = pipeline.from_waveform(waveform, sr)
    after_first = torch.rand(3)
    torch.manual_seed(0)
    pipeline.from_waveform(waveform[:, :4000], sr)  # another recording in between changes nothing
    second = pipeline.from_waveform(waveform, sr)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(torch.rand(3), after_first, rtol=0, atol=0)  # the noise is not the global RNG's
    assert not torch.equal(first, undithered)
    assert (first - undithered).abs().median() < 0.05  # one LSB, as in training
    # The same audio through from_file gives the same noise; raw_features (global MVN statistics) has none.
    torch.testing.assert_close(pipeline.from_file(digit_wav), first, rtol=0, atol=0)
    torch.testing.assert_close(pipeline.raw_features(waveform, sr), undithered, rtol=0, atol=0)
    # Without dither there is nothing to apply.
    plain = FeaturePipeline(FeatureConfig(sample_rate=8000, dither_inference=True)).from_waveform(waveform, sr)
    torch.testing.assert_close(plain, undithered, rtol=0, atol=0)


def test_inference_dither_gives_near_silence_the_floor_training_saw():
    # A quiet 8 kHz recording played at 16 kHz: speech below 4 kHz, and nothing above but the
    # resampler's residue, as in the real connected-digit dev set. In training every utterance had
    # one LSB of dither; without dither at inference the empty mel bins fall far below that floor.
    rate = 16000
    generator = seeded(0)
    narrow = resample(resample(0.01 * torch.randn(rate, generator=generator), rate, 8000), 8000, rate)
    config = dict(kind="fbank", num_mel_bins=40, sample_rate=rate, dither=1.0)
    trained_on = FeaturePipeline(FeatureConfig(**config)).from_waveform(narrow, rate, train=True, generator=seeded(1))
    plain = FeaturePipeline(FeatureConfig(**config)).from_waveform(narrow, rate)
    dithered = FeaturePipeline(FeatureConfig(**config, dither_inference=True)).from_waveform(narrow, rate)
    top = slice(36, 40)  # the highest mel bins, well above 4 kHz
    floor = trained_on[:, top].mean()
    assert plain[:, top].mean() < floor - 2  # more than a factor e^2 (8.7 dB) below what training saw
    assert abs(dithered[:, top].mean() - floor) < 0.1
    torch.testing.assert_close(dithered[:, :20], plain[:, :20], rtol=0, atol=0.05)  # speech bins barely move


def test_dither_inference_must_be_a_boolean():
    with pytest.raises(ValueError, match="dither_inference"):
        FeatureConfig(dither=1.0, dither_inference="yes")


def test_a_checkpoint_from_before_dither_inference_loads_without_it():
    state = FeaturePipeline(FeatureConfig(dither=1.0)).state_dict()
    del state["config"]["dither_inference"]
    assert FeaturePipeline.from_state_dict(state).config.dither_inference is False


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_speed_perturbation_scales_duration_and_pitch(factor):
    # A 500 Hz tone, 1 s at 8 kHz: played `factor` times as fast it lasts 1/factor s at 500*factor Hz.
    rate = 8000
    tone = torch.sin(2 * math.pi * 500 * torch.arange(rate) / rate)
    perturbed = speed_perturb(tone, rate, [factor])
    assert abs(perturbed.numel() - rate / factor) <= 1
    spectrum = torch.fft.rfft(perturbed).abs()
    peak_hz = int(spectrum.argmax()) * rate / perturbed.numel()
    assert abs(peak_hz - 500 * factor) < 5
    torch.testing.assert_close(speed_perturb(tone, rate, [1.0]), tone, rtol=0, atol=0)


def test_speed_perturbation_draws_from_the_generator_in_training_only(digit_wav):
    waveform, sr = load_audio(digit_wav)
    pipeline = FeaturePipeline(FeatureConfig(sample_rate=8000, speed_perturb=[0.8, 1.25]))
    plain = pipeline.from_waveform(waveform, sr)
    assert plain.shape == FeaturePipeline(FeatureConfig(sample_rate=8000)).from_waveform(waveform, sr).shape
    lengths = {pipeline.from_waveform(waveform, sr, train=True, generator=seeded(s)).shape[0] for s in range(12)}
    # Both factors are drawn, and each changes the frame count the expected way.
    assert len(lengths) == 2
    assert min(lengths) < plain.shape[0] < max(lengths)
    with pytest.raises(ValueError, match="speed_perturb"):
        FeatureConfig(speed_perturb=[3.0])


@pytest.mark.parametrize("warp", [0.9, 1.1])
def test_vtlp_warp_moves_a_tone_as_scaling_its_frequency_would(warp):
    # Within Kaldi's VTLN breakpoints (100 Hz to Nyquist - 500 Hz) a warp factor w shows a tone
    # at f Hz in the mel filter where an unwarped filterbank shows f * w Hz, like speed
    # perturbation by w does to pitch, but without changing the duration.
    rate = 8000
    config = FeatureConfig(sample_rate=rate, num_mel_bins=40)

    def peak_filter(hz, warp):
        tone = 0.5 * torch.sin(2 * math.pi * hz * torch.arange(rate) / rate)
        feats = extract(tone, config, warp=warp)
        assert feats.shape[0] == num_frames(rate, config)
        return int(feats.mean(dim=0).argmax())

    for hz in (500, 1000, 2000, 3000):
        assert peak_filter(hz, warp) == peak_filter(hz * warp, 1.0) != peak_filter(hz, 1.0)


def test_vtlp_draws_a_warp_per_training_utterance_from_the_generator(digit_wav):
    waveform, sr = load_audio(digit_wav)
    pipeline = FeaturePipeline(FeatureConfig(sample_rate=8000, vtlp=[0.9, 1.1]))
    plain = FeaturePipeline(FeatureConfig(sample_rate=8000)).from_waveform(waveform, sr)
    torch.testing.assert_close(pipeline.from_waveform(waveform, sr), plain, rtol=0, atol=0)
    warped = [pipeline.from_waveform(waveform, sr, train=True, generator=seeded(s)) for s in range(3)]
    torch.testing.assert_close(
        warped[0], pipeline.from_waveform(waveform, sr, train=True, generator=seeded(0)), rtol=0, atol=0
    )
    assert all(w.shape == plain.shape for w in warped)  # the duration is kept
    assert not torch.equal(warped[0], warped[1]) and not torch.equal(warped[0], plain)
    for bad in ([1.1, 0.9], [0.5, 1.0], [0.9]):
        with pytest.raises(ValueError, match="vtlp"):
            FeatureConfig(vtlp=bad)


def test_a_given_warp_replaces_the_vtlp_draw_in_training_and_inference(digit_wav):
    waveform, sr = load_audio(digit_wav)
    pipeline = FeaturePipeline(FeatureConfig(sample_rate=8000, num_mel_bins=40, vtlp=[0.8, 1.2], dither=0.0))
    plain = pipeline.from_waveform(waveform, sr)
    torch.testing.assert_close(pipeline.from_waveform(waveform, sr, warp=1.0), plain, rtol=0, atol=0)
    warped = pipeline.from_waveform(waveform, sr, warp=0.9)
    assert warped.shape == plain.shape and not torch.equal(warped, plain)
    direct = extract(resample(to_mono(waveform), sr, 8000), pipeline.config, warp=0.9)
    torch.testing.assert_close(warped, direct, rtol=0, atol=0)
    # In training (no other random step here) the given warp is used whatever the generator.
    for seed in range(3):
        trained = pipeline.from_waveform(waveform, sr, train=True, generator=seeded(seed), warp=0.9)
        torch.testing.assert_close(trained, warped, rtol=0, atol=0)


def test_inference_is_deterministic_and_ignores_training_only_steps(libri_flac):
    training_config = FeatureConfig(
        dither=1.0, mvn="utterance", speed_perturb=[0.9, 1.1], vtlp=[0.9, 1.1],
        spec_augment=SpecAugmentConfig(enabled=True, time_warp=5),
    )
    pipeline = FeaturePipeline(training_config)
    first, second = pipeline.from_file(libri_flac), pipeline.from_file(libri_flac)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    plain = FeaturePipeline(FeatureConfig(mvn="utterance")).from_file(libri_flac)
    torch.testing.assert_close(first, plain, rtol=0, atol=0)


@pytest.mark.parametrize("train", [False, True])
def test_from_file_equals_from_waveform_of_load_audio(digit_wav, train):
    config = FeatureConfig(
        kind="mfcc", num_ceps=40, deltas=True, dither=1.0, mvn="utterance",
        spec_augment=SpecAugmentConfig(enabled=True, time_mask_width=10),
    )
    pipeline = FeaturePipeline(config)
    from_file = pipeline.from_file(digit_wav, train=train, generator=seeded(7))
    waveform, sr = load_audio(digit_wav)
    from_waveform = pipeline.from_waveform(waveform, sr, train=train, generator=seeded(7))
    assert from_file.shape[1] == pipeline.feature_dim == 120
    torch.testing.assert_close(from_file, from_waveform, rtol=0, atol=0)


# --- config and packaging -----------------------------------------------------------------------------


def test_invalid_config_values_name_the_field():
    with pytest.raises(ValueError, match="num_ceps"):
        FeatureConfig(kind="mfcc", num_ceps=81)
    with pytest.raises(ValueError, match="mvn"):
        FeatureConfig(mvn="global-ish")
    with pytest.raises(ValueError, match="time_mask_ratio"):
        SpecAugmentConfig(time_mask_ratio=1.5)


def test_more_mel_bins_than_the_spectrum_resolves_is_refused():
    # A 10 ms window at 8 kHz has 128-point FFT bins 62.5 Hz apart: 80 mel filters cannot all contain one.
    with pytest.raises(ValueError, match="num_mel_bins=80"):
        FeaturePipeline(FeatureConfig(sample_rate=8000, frame_length_ms=10.0))
    FeaturePipeline(FeatureConfig(sample_rate=8000))  # the standard 25 ms window resolves all 80
    # Warping squeezes some filters: 72 fit unwarped at 8 kHz, but not at VTLP's extremes.
    FeaturePipeline(FeatureConfig(sample_rate=8000, num_mel_bins=72))
    with pytest.raises(ValueError, match=r"warped by 1.3 \(features.vtlp\)"):
        FeaturePipeline(FeatureConfig(sample_rate=8000, num_mel_bins=72, vtlp=[0.7, 1.3]))
    # So do test-time VTLN warps, named as such.
    with pytest.raises(ValueError, match=r"warped by 1.3 \(test-time VTLN\)"):
        check_mel_filters(FeatureConfig(sample_rate=8000, num_mel_bins=72), [1.0, 1.3])


def test_non_float_waveform_is_rejected(digit_wav):
    with pytest.raises(AudioError, match="float"):
        FeaturePipeline(FeatureConfig()).from_waveform(torch.zeros(8000, dtype=torch.int16), 8000)


@pytest.mark.slow
def test_features_package_does_not_import_asr():
    code = "import sys, features.pipeline; print(sorted(m for m in sys.modules if m.split('.')[0] == 'asr'))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT
    )
    assert result.stdout.strip() == "[]"


def test_a_folder_a_symlink_loop_and_a_broken_link_are_each_named_as_such(tmp_path):
    """issue 81: all three were "audio file not found"."""
    (tmp_path / "x.flac").mkdir()
    (tmp_path / "a.wav").symlink_to(tmp_path / "b.wav")
    (tmp_path / "b.wav").symlink_to(tmp_path / "a.wav")
    (tmp_path / "gone.wav").symlink_to(tmp_path / "nowhere.wav")
    for name, message in [("x.flac", "is a folder, not an audio file"), ("a.wav", "is a loop of symbolic links"),
                          ("gone.wav", f"is a symbolic link to {tmp_path / 'nowhere.wav'}, which does not exist"),
                          ("missing.wav", None)]:
        with pytest.raises(AudioError) as err:
            load_audio(tmp_path / name)
        expected = f"{tmp_path / name} {message}" if message else f"audio file not found: {tmp_path / name}"
        assert str(err.value) == expected

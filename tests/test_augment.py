"""Training-time waveform augmentation (features/augment.py): band limits, noise, microphones, rooms, on real speech."""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torchaudio.functional as AF

from features.audio import load_audio, to_mono
from features.augment import (
    add_noise,
    augment_waveform,
    band_limit,
    coloured_noise,
    lowpass,
    microphone,
    narrowband,
    peaking_filter,
    reverberate,
    room_impulse_responses,
)
from features.config import (
    AugmentConfig,
    BandLimitConfig,
    FeatureConfig,
    MicrophoneConfig,
    NoiseConfig,
    ReverbConfig,
    SpecAugmentConfig,
)
from features.pipeline import FeaturePipeline

RATE = 16000
SMALL_BANK = ReverbConfig(probability=1.0, rooms=4, rt60=[0.2, 0.4])


@pytest.fixture(scope="module")
def speech(librivox_mini):
    """About 3 s of read speech at 16 kHz: real energy up to 8 kHz."""
    waveform, rate = load_audio(sorted(librivox_mini.rglob("*.flac"))[1])
    assert rate == RATE
    return to_mono(waveform)


def signal():
    """scipy.signal, imported on first use: it takes 1.6 s, which every test worker would pay while collecting."""
    import scipy.signal

    return scipy.signal


def seeded(seed):
    return torch.Generator().manual_seed(seed)


def band_energy_db(waveform, low_hz, high_hz, rate=RATE):
    """Energy of ``waveform`` between the two frequencies, in dB (Welch power spectrum, summed)."""
    freqs, power = signal().welch(waveform.double().numpy(), fs=rate, nperseg=1024)
    band = (freqs >= low_hz) & (freqs < high_hz)
    return 10 * math.log10(power[band].sum())


def lag_of_best_match(a, b, max_lag=200):
    """The shift of ``b`` against ``a`` (in samples, within ``max_lag``) at which they correlate best."""
    a, b = a.double().numpy(), b.double().numpy()
    # scores[k] = sum over the middle of a of a[i] * b[i + k - max_lag], k = 0 .. 2 max_lag
    scores = signal().correlate(b, a[max_lag:-max_lag], mode="valid", method="fft")
    return int(np.argmax(scores)) - max_lag


# --- band limits -----------------------------------------------------------------------------------------


def test_narrowband_removes_what_an_8khz_recording_lacks_and_keeps_the_rest(speech):
    # The same resampler upsamples real 8 kHz recordings in the feature pipeline: its transition band
    # runs from 3.5 to 5 kHz, and above it nothing of the speech is left.
    limited = narrowband(speech, RATE, 8000)
    assert limited.shape == speech.shape
    assert band_energy_db(speech, 5000, 7500) - band_energy_db(limited, 5000, 7500) > 40
    assert abs(band_energy_db(speech, 100, 3000) - band_energy_db(limited, 100, 3000)) < 0.5
    assert lag_of_best_match(speech, limited) == 0


@pytest.mark.parametrize("cutoff", [3000.0, 5500.0])
def test_lowpass_removes_energy_above_the_cutoff_and_keeps_it_below(speech, cutoff):
    limited = lowpass(speech, RATE, cutoff)
    assert limited.shape == speech.shape and limited.dtype == speech.dtype
    assert band_energy_db(speech, cutoff * 1.25, 8000) - band_energy_db(limited, cutoff * 1.25, 8000) > 40
    assert abs(band_energy_db(speech, 100, cutoff * 0.8) - band_energy_db(limited, 100, cutoff * 0.8)) < 0.5
    assert lag_of_best_match(speech, limited) == 0  # zero phase: nothing moves in time
    torch.testing.assert_close(lowpass(speech, RATE, 8000.0), speech, rtol=0, atol=0)  # at Nyquist: as it is


@pytest.mark.parametrize("cutoff", [3000.0, 6500.0])
def test_lowpass_is_scipys_butterworth_run_forward_and_backward(speech, cutoff):
    # The reference: the filter designed and run by scipy. The two may differ only where sosfiltfilt
    # pads the ends, so the comparison leaves out 50 ms at each end.
    sections = signal().butter(8, cutoff, btype="low", fs=RATE, output="sos")
    expected = signal().sosfiltfilt(sections, speech.double().numpy())
    got = lowpass(speech, RATE, cutoff).double().numpy()
    edge = RATE // 20
    error = np.abs(got - expected)[edge:-edge].max()
    assert error < 1e-4 * np.abs(expected).max()


def test_band_limit_draws_both_kinds_from_the_generator(speech):
    config = BandLimitConfig(probability=1.0, narrow_share=0.5, cutoff_hz=[6000.0, 7000.0])
    kinds = set()
    for seed in range(8):
        limited = band_limit(speech, RATE, config, seeded(seed))
        torch.testing.assert_close(limited, band_limit(speech, RATE, config, seeded(seed)), rtol=0, atol=0)
        # 8 kHz leaves nothing at 5-5.4 kHz; a low-pass at 6-7 kHz keeps that band
        kinds.add(band_energy_db(speech, 5000, 5400) - band_energy_db(limited, 5000, 5400) > 30)
    assert kinds == {True, False}


# --- noise -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("snr_db", [0.0, 12.5, 30.0])
@pytest.mark.parametrize("colour", [0.0, 1.0, 2.0])
def test_noise_is_added_at_the_requested_snr(speech, snr_db, colour):
    noisy = add_noise(speech, snr_db, colour, seeded(0))
    noise = (noisy - speech).double()
    measured = 10 * math.log10(speech.double().pow(2).mean() / noise.pow(2).mean())
    assert measured == pytest.approx(snr_db, abs=0.01)
    torch.testing.assert_close(noisy, add_noise(speech, snr_db, colour, seeded(0)), rtol=0, atol=0)
    assert not torch.equal(noisy, add_noise(speech, snr_db, colour, seeded(1)))


@pytest.mark.parametrize("colour", [0.0, 1.0, 2.0])
def test_noise_colour_sets_the_spectral_slope(colour):
    # power ~ 1/f^colour: each octave up loses 3 * colour dB (10 log10 2 per unit of colour)
    noise = coloured_noise(RATE * 8, colour, seeded(3))
    assert noise.pow(2).mean().item() == pytest.approx(1.0, rel=1e-4)
    slope = (band_energy_db(noise, 1000, 2000) - band_energy_db(noise, 500, 1000)) - 10 * math.log10(2)
    assert slope == pytest.approx(-10 * math.log10(2) * colour, abs=0.5)


def test_silence_stays_silent():
    assert torch.equal(add_noise(torch.zeros(1000), 10.0, 1.0, seeded(0)), torch.zeros(1000))


# --- microphone ------------------------------------------------------------------------------------------


def test_peaking_filter_equals_torchaudios_equalizer_and_has_its_gain_at_the_centre(speech):
    sos = peaking_filter(1200.0, 7.5, 1.3, RATE)
    ours = torch.from_numpy(signal().sosfilt(sos, speech.double().numpy())).float()
    torch.testing.assert_close(ours, AF.equalizer_biquad(speech, RATE, 1200.0, 7.5, 1.3), rtol=0, atol=1e-5)
    _, response = signal().sosfreqz(sos, worN=[100.0, 1200.0, 7000.0], fs=RATE)
    gain_db = 20 * np.log10(np.abs(response))
    assert gain_db[1] == pytest.approx(7.5, abs=1e-6)
    assert abs(gain_db[0]) < 1.0 and abs(gain_db[2]) < 1.0


def test_microphone_cuts_the_bass_and_is_reproducible(speech):
    config = MicrophoneConfig(probability=1.0, highpass_hz=[300.0, 300.0], bands=2, gain_db=[-6.0, 6.0])
    coloured = microphone(speech, RATE, config, seeded(4))
    assert coloured.shape == speech.shape and coloured.dtype == speech.dtype
    # a 2nd-order high-pass at 300 Hz: 12 dB per octave below it
    assert band_energy_db(speech, 20, 120) - band_energy_db(coloured, 20, 120) > 12
    torch.testing.assert_close(coloured, microphone(speech, RATE, config, seeded(4)), rtol=0, atol=0)
    assert not torch.equal(coloured, microphone(speech, RATE, config, seeded(5)))


# --- rooms -----------------------------------------------------------------------------------------------


def test_reverberation_keeps_length_and_aligns_on_the_direct_path(speech):
    impulse = torch.zeros(50)
    impulse[7] = 0.25
    torch.testing.assert_close(reverberate(speech, impulse), speech, rtol=0, atol=1e-6)
    echo = torch.zeros(50)
    echo[7], echo[27] = 0.5, 0.25  # the direct path (scaled to gain 1) and an echo 20 samples later
    expected = speech.clone()
    expected[20:] += 0.5 * speech[:-20]
    torch.testing.assert_close(reverberate(speech, echo), expected, rtol=0, atol=1e-5)


def test_simulated_rooms_are_reproducible_and_reverberant(speech):
    bank = room_impulse_responses(RATE, SMALL_BANK)
    assert len(bank) == SMALL_BANK.rooms
    again = [torch.from_numpy(r.numpy().copy()) for r in room_impulse_responses(RATE, dataclasses.replace(SMALL_BANK))]
    assert all(torch.equal(a, b) for a, b in zip(bank, again))
    assert len({r.numel() for r in bank}) > 1  # different rooms, not one room repeated
    click = torch.zeros(RATE)
    click[4000] = 1.0
    for rir in bank:
        assert reverberate(speech, rir).shape == speech.shape
        # the direct sound stays where it was, at gain 1; the room adds what follows it
        heard = reverberate(click, rir)
        assert int(heard.abs().argmax()) == 4000 and heard[4000] == pytest.approx(1.0)
        assert heard[4100:].pow(2).sum() > 0.05 * heard.pow(2).sum()
        # Energy decay (Schroeder backward integral): 20 dB down after some tens of ms, not at once.
        decay = np.cumsum(rir.double().numpy()[::-1] ** 2)[::-1]
        decay_db = 10 * np.log10(decay / decay[0])
        seconds_to_20db = np.argmax(decay_db < -20) / RATE
        assert 0.02 < seconds_to_20db < 0.4


# --- the chain and the pipeline --------------------------------------------------------------------------


EVERYTHING = AugmentConfig(
    reverb=SMALL_BANK,
    noise=NoiseConfig(probability=1.0),
    microphone=MicrophoneConfig(probability=1.0),
    band_limit=BandLimitConfig(probability=1.0),
)


def test_the_chain_is_a_function_of_the_generator_state(speech):
    first = augment_waveform(speech, RATE, EVERYTHING, seeded(11))
    assert first.shape == speech.shape
    torch.testing.assert_close(first, augment_waveform(speech, RATE, EVERYTHING, seeded(11)), rtol=0, atol=0)
    assert not torch.equal(first, augment_waveform(speech, RATE, EVERYTHING, seeded(12)))


def test_each_step_applies_with_its_probability(speech):
    config = AugmentConfig(noise=NoiseConfig(probability=0.3))
    changed = sum(not torch.equal(augment_waveform(speech, RATE, config, seeded(s)), speech) for s in range(200))
    assert 40 <= changed <= 80  # 60 expected; 5 standard deviations would be 32


def test_evaluation_ignores_augmentation_and_disabled_steps_draw_nothing(speech):
    augmented = FeatureConfig(mvn="utterance", dither=1.0, augment=EVERYTHING)
    plain = FeatureConfig(mvn="utterance", dither=1.0)
    torch.testing.assert_close(
        FeaturePipeline(augmented).from_waveform(speech, RATE),
        FeaturePipeline(plain).from_waveform(speech, RATE),
        rtol=0,
        atol=0,
    )
    # Training with every probability at 0 gives exactly what a recipe without the section got.
    off = FeatureConfig(mvn="utterance", dither=1.0, spec_augment=SpecAugmentConfig(enabled=True), augment=AugmentConfig())
    before = dataclasses.replace(off, augment=AugmentConfig(band_limit=BandLimitConfig(cutoff_hz=[4000.0, 5000.0])))
    torch.testing.assert_close(
        FeaturePipeline(off).from_waveform(speech, RATE, train=True, generator=seeded(2)),
        FeaturePipeline(before).from_waveform(speech, RATE, train=True, generator=seeded(2)),
        rtol=0,
        atol=0,
    )
    trained = FeaturePipeline(augmented).from_waveform(speech, RATE, train=True, generator=seeded(2))
    assert trained.shape == FeaturePipeline(plain).from_waveform(speech, RATE).shape  # frame count kept


def test_augment_config_survives_the_checkpoint_and_old_checkpoints_load():
    pipeline = FeaturePipeline(FeatureConfig(augment=EVERYTHING))
    rebuilt = FeaturePipeline.from_state_dict(pipeline.state_dict())
    assert rebuilt.config == pipeline.config
    old = pipeline.state_dict()
    del old["config"]["augment"]  # written before the section existed
    assert FeaturePipeline.from_state_dict(old).config.augment == AugmentConfig()
    bad = pipeline.state_dict()
    bad["config"]["augment"]["noise"]["loudness"] = 3
    with pytest.raises(ValueError, match=r"features\.augment\.noise\.loudness"):
        FeaturePipeline.from_state_dict(bad)


@pytest.mark.parametrize(
    "make, key",
    [
        (lambda: NoiseConfig(probability=1.5), "augment.noise.probability"),
        (lambda: NoiseConfig(snr_db=[30.0, 5.0]), "augment.noise.snr_db"),
        (lambda: ReverbConfig(rooms=0), "augment.reverb.rooms"),
        (lambda: ReverbConfig(rt60=[0.0, 0.5]), "augment.reverb.rt60"),
        (lambda: MicrophoneConfig(gain_db=[-40.0, 0.0]), "augment.microphone.gain_db"),
        (lambda: BandLimitConfig(narrow_share=2.0), "augment.band_limit.narrow_share"),
    ],
)
def test_invalid_values_name_the_key(make, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        make()


def test_training_dataset_simulates_the_rooms_before_workers_fork(speech):
    from asr.data.dataset import SpeechDataset
    from asr.data.tokenizer import CharTokenizer
    from features import augment

    config = dataclasses.replace(SMALL_BANK, rooms=3)
    pipeline = FeaturePipeline(FeatureConfig(augment=AugmentConfig(reverb=config)))
    before = augment._simulate_rooms.cache_info().misses
    SpeechDataset([], pipeline, CharTokenizer(["A"]), train=False)
    assert augment._simulate_rooms.cache_info().misses == before
    SpeechDataset([], pipeline, CharTokenizer(["A"]), train=True)
    assert augment._simulate_rooms.cache_info().misses == before + 1

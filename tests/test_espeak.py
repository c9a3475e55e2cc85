"""eSpeak NG wrapper: synthesis, speaking rate, voices, reproducible batches and clear errors."""

import sys
import time

import numpy as np
import pytest

from asr.synthesis import espeak

TEXT = "set a timer for five minutes"


def long_term_log_spectrum(audio: np.ndarray, size: int = 512) -> np.ndarray:
    """Mean power spectrum over 512-sample frames, in log: a voice's timbre, independent of timing."""
    frames = audio[: audio.size // size * size].reshape(-1, size) * np.hanning(size)
    return np.log((np.abs(np.fft.rfft(frames, axis=1)) ** 2).mean(axis=0) + 1e-10)


def test_synthesis_is_non_silent_float_audio_at_the_reported_rate():
    audio, rate = espeak.synthesize(TEXT, "en-us+m3", rate=175, pitch=50)
    assert rate == espeak.sample_rate()
    assert 8000 <= rate <= 48000
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert np.abs(audio).max() <= 1.0
    assert np.sqrt(np.mean(audio**2)) > 0.01  # speech, not silence
    # six words at 175 words per minute: about two seconds
    assert 1.0 < audio.size / rate < 4.0


def test_faster_rate_gives_shorter_audio():
    slow, _ = espeak.synthesize(TEXT, "en-us+m3", rate=100, pitch=50)
    fast, _ = espeak.synthesize(TEXT, "en-us+m3", rate=350, pitch=50)
    assert fast.size < 0.6 * slow.size


def test_different_voices_sound_different():
    male_1, _ = espeak.synthesize(TEXT, "en-us+m3", rate=175, pitch=50)
    male_2, _ = espeak.synthesize(TEXT, "en-us+m3", rate=175, pitch=50)
    same = np.abs(long_term_log_spectrum(male_1) - long_term_log_spectrum(male_2)).mean()
    for other in ("en-us+f2", "en-us+m1"):  # a female variant, and another male one
        audio, _ = espeak.synthesize(TEXT, other, rate=175, pitch=50)
        different = np.abs(long_term_log_spectrum(male_1) - long_term_log_spectrum(audio)).mean()
        assert different > 3 * same, other


def test_unknown_variant_and_language_raise_errors_naming_them():
    with pytest.raises(espeak.UnknownVoiceError, match="'m99'"):
        espeak.synthesize(TEXT, "en-us+m99", rate=175, pitch=50)
    with pytest.raises(espeak.UnknownVoiceError, match="'xx-nowhere'"):
        espeak.synthesize(TEXT, "xx-nowhere+m3", rate=175, pitch=50)
    with pytest.raises(espeak.UnknownVoiceError, match="no language"):
        espeak.check_voice("+m3")
    espeak.check_voice("en-gb-scotland+f3")  # a real one passes


def test_out_of_range_parameters_and_empty_text_are_rejected():
    with pytest.raises(ValueError, match="rate must be in"):
        espeak.synthesize(TEXT, "en-us+m3", rate=1000, pitch=50)
    with pytest.raises(ValueError, match="pitch_range must be in"):
        espeak.synthesize(TEXT, "en-us+m3", rate=175, pitch=50, pitch_range=-1)
    with pytest.raises(ValueError, match="empty text"):
        espeak.synthesize("  ", "en-us+m3", rate=175, pitch=50)


def test_available_variants_lists_the_standard_ones_sorted():
    variants = espeak.available_variants()
    assert {f"m{i}" for i in range(1, 9)} | {f"f{i}" for i in range(1, 6)} <= set(variants)
    assert variants == sorted(set(variants))


@pytest.mark.slow
def test_synthesize_many_is_reproducible_and_in_request_order():
    requests = [
        espeak.SynthesisRequest("one", "en-us+m3", 175, 50),
        espeak.SynthesisRequest("turn off the kitchen light please", "en+f2", 150, 60, 70, 2),
        espeak.SynthesisRequest("three seven", "en-gb-x-rp+m1", 200, 40),
        espeak.SynthesisRequest("what time is it", "en-us+whisper", 180, 50),  # breath noise from the generator
    ]
    first = list(espeak.synthesize_many(requests))
    # eSpeak seeds its noise generator from the clock (in seconds) unless told otherwise, so
    # the second run must start in another second for this test to see that difference.
    time.sleep(1.0)
    second = list(espeak.synthesize_many(requests))
    assert len(first) == len(requests)
    for (a, rate_a), (b, rate_b) in zip(first, second, strict=True):
        assert rate_a == rate_b == espeak.sample_rate()
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    # each result is the speech of its own request: about the length of speaking it here (the texts'
    # lengths differ by far more than the few percent that the engine's carried-over state adds)
    for request, (audio, _) in zip(requests, first, strict=True):
        here, _ = espeak.synthesize(
            request.text, request.voice, request.rate, request.pitch, request.pitch_range, request.word_gap
        )
        assert audio.size == pytest.approx(here.size, rel=0.1)


@pytest.mark.slow
def test_synthesize_many_reports_the_worker_error_after_the_good_results():
    requests = [
        espeak.SynthesisRequest("one", "en-us+m3", 175, 50),
        espeak.SynthesisRequest("two", "en-us+nosuchvariant", 175, 50),
    ]
    results = espeak.synthesize_many(requests)
    audio, _ = next(results)
    assert audio.size > 0
    with pytest.raises(espeak.EspeakError, match="nosuchvariant"):
        next(results)


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "espeakng_loader", None)  # makes `import espeakng_loader` fail
    with pytest.raises(espeak.EspeakError, match="pip install espeakng-loader"):
        espeak._Engine()
    with pytest.raises(espeak.EspeakError, match="pip install espeakng-loader"):
        espeak.available_variants()


def test_unloadable_library_says_how_to_install(monkeypatch, tmp_path):
    import espeakng_loader

    monkeypatch.setattr(espeakng_loader, "get_library_path", lambda: str(tmp_path / "libespeak-ng.so"))
    with pytest.raises(espeak.EspeakError, match=r"cannot load .*pip install espeakng-loader"):
        espeak._Engine()

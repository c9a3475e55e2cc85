"""The synthesiser contract (asr.synthesis.engines), one body run over eSpeak NG, SVOX Pico and Piper."""

import numpy as np
import pytest

from asr.synthesis import engines, espeak, pico, piper

REQUESTS = {
    "espeak": [espeak.SynthesisRequest(t, "en-us+m3", 170, 50) for t in ("one two", "three", "one two")],
    "pico": [pico.PicoRequest(t, "en-US") for t in ("one two", "three", "one two")],
    "piper": [piper.PiperRequest(t, "joe") for t in ("one two", "three", "one two")],
}


def test_the_registry_knows_each_synthesiser_by_name_and_by_request():
    assert set(engines.SYNTHESISERS) == set(REQUESTS)
    for name, requests in REQUESTS.items():
        synthesiser = engines.get(name)
        assert isinstance(synthesiser, engines.Synthesiser)
        assert synthesiser.name == name
        assert engines.for_request(requests[0]) == name
    with pytest.raises(ValueError, match="unknown synthesiser 'festival'.*espeak"):
        engines.get("festival")
    with pytest.raises(TypeError, match="no synthesiser takes a str"):
        engines.for_request("hello")


@pytest.mark.slow  # starts worker processes
@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_a_list_is_spoken_in_order_and_the_same_list_gives_the_same_samples(name):
    synthesiser = engines.get(name)
    synthesiser.check()
    requests = REQUESTS[name]
    first = list(synthesiser.speak(requests))
    again = list(synthesiser.speak(requests))
    assert len(first) == len(requests)
    for a, b in zip(first, again, strict=True):
        assert a.dtype == np.float32 and a.ndim == 1
        np.testing.assert_array_equal(a, b)
    # in order: "one two" is longer than "three"
    assert first[0].size > first[1].size and first[2].size > first[1].size
    assert 0.01 < float(np.abs(first[0]).max()) <= 1.0
    # about a second of speech at the synthesiser's own rate, not another's
    assert 0.3 * synthesiser.sample_rate < first[0].size < 3.0 * synthesiser.sample_rate


@pytest.mark.slow  # starts worker processes
def test_pico_in_a_worker_speaks_as_a_fresh_speaker_here():
    requests = REQUESTS["pico"]
    here = pico.PicoVoices(["en-US"])
    for spoken, request in zip(pico.speak_many(requests), requests, strict=True):
        np.testing.assert_array_equal(spoken, here.speak(request))


@pytest.mark.slow  # starts worker processes
def test_a_rejected_pico_request_names_the_reason_and_closing_early_stops_the_worker():
    with pytest.raises(pico.PicoError, match="rate"):
        list(pico.speak_many([pico.PicoRequest("one", "en-US"), pico.PicoRequest("two", "en-US", rate=900)]))
    spoken = pico.speak_many(REQUESTS["pico"])
    next(spoken)
    spoken.close()
    assert spoken._worker.process.poll() is not None
    assert list(pico.speak_many([])) == []

"""benchmarks/gpu_corpus.py: without Piper, Pico speaks Piper's speakers and every other speaker is as drawn."""

import importlib.util
import sys

from helpers import PROJECT_ROOT

from asr.synthesis import librispeech, pico

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import gpu_corpus  # noqa: E402

COUNTS = {"train-clean-100": 75, "dev-clean": 5, "test-clean": 5}


def test_piper_speakers_go_to_picos_voices_in_turn_and_the_rest_are_as_drawn():
    options = librispeech.Options(hours=30, seed=0)
    drawn = gpu_corpus._drawn(options, COUNTS)
    spoken = gpu_corpus.speakers_without_piper(options, COUNTS)
    piper_at = [i for i, s in enumerate(drawn) if s.synthesiser == "piper"]
    assert len(piper_at) >= 2 and len(spoken) == len(drawn)
    assert all(s.synthesiser != "piper" for s in spoken)
    for i, (before, after) in enumerate(zip(drawn, spoken)):
        assert (after.id, after.subset, after.level_db, after.noise) == (before.id, before.subset, before.level_db,
                                                                          before.noise)
        if i not in piper_at:
            assert after == before
    voices = [spoken[i].voice for i in piper_at]
    assert all(spoken[i].synthesiser == "pico" for i in piper_at)
    assert voices == [pico.VOICES[k % len(pico.VOICES)] for k in range(len(piper_at))]


def test_with_piper_installed_the_corpus_is_left_as_it_is():
    if importlib.util.find_spec("piper") is None:
        assert librispeech._speakers is gpu_corpus.speakers_without_piper
    else:
        assert librispeech._speakers is gpu_corpus._drawn

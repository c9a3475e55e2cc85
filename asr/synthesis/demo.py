"""A synthetic speech corpus made with eSpeak NG, so a recipe can train and evaluate with nothing downloaded.

Utterances are spoken digit strings (``"THREE SEVEN ZERO"``) and short
voice-assistant commands (``"SET A TIMER FOR FIVE MINUTES"``,
``"TURN OFF THE KITCHEN LIGHT"``) from a closed vocabulary of under 100 words
(:data:`VOCABULARY`), spoken by eSpeak voices (``"<language>+<variant>"``,
e.g. ``"en-us+m3"``: accent x speaker-like variant; see :mod:`asr.synthesis.espeak`).
A share of the training and dev utterances (``pico_share``, off by default)
can be spoken instead by a second synthesiser, SVOX Pico
(:mod:`asr.synthesis.pico`), whose two English voices are trained on recordings of
real speakers, and another share (``piper_share``) by a neural synthesiser,
Piper (:mod:`asr.synthesis.piper`), whose voice is a network trained on one real
speaker; the test split is always the held-out eSpeak voices.

Splits:
    train  ``train_voices``, ``train_utterances`` utterances
    dev    the same voices, new utterances: a check on overfitting to the
           sentences and renditions heard, with the speakers known
    test   ``test_voices``, which must not be training voices: held-out
           "speakers" (the default ones use variants never heard in training)

Sentences are drawn independently for every utterance from one distribution,
so short ones (one or two digits, ``"WHAT TIME IS IT"``) recur across splits,
as they do in real command corpora; the corpus' ``README.txt`` reports how
many dev and test transcripts also occur in training.

Each utterance draws its speaking rate, pitch, intonation, pauses between
words, level, leading and trailing silence and background-noise level, so
that even one voice never sounds twice the same. eSpeak runs at 22050 Hz;
the audio is resampled to ``sample_rate`` with :func:`features.audio.resample`
and stored as 16-bit FLAC in LibriSpeech layout, which
:func:`asr.data.librispeech.read_subset` reads::

    <cache_dir>/demo/<key>/LibriSpeech/{train,dev,test}/<speaker>/<chapter>/<speaker>-<chapter>-<n>.flac
                                                                  .../<speaker>-<chapter>.trans.txt
    <cache_dir>/demo/<key>/README.txt, voices.txt, synth_options.json

with one speaker id per voice (100, 101, ... in ``train_voices`` then
``test_voices`` order, then the Pico voices when they speak) and the chapter telling the split (1 train, 2 dev,
3 test), so utterance ids are unique across the three splits. ``<key>`` is
:func:`asr.data.demo.corpus_key`, a hash of every option that changes the corpus and of the
format version: a changed option makes a new corpus beside the old one, and an unchanged one
reuses the corpus already there. ``synth_options.json`` records what made it (the options, the
format and the synthesisers' package versions), for the record: a corpus is found by its
folder, so one made by an older Piper or eSpeak NG is still read after an upgrade.

The corpus is prepared apart from training, as ESPnet's and icefall's data
preparation stages are: ``python -m asr.synth_demo RECIPE [key=value ...]``
(:mod:`asr.cli.synth_demo`) runs :func:`prepare_corpus`, which synthesises
it; training, checking and evaluation only read it, through
:func:`asr.data.demo.corpus_subsets`, which raises
:class:`~asr.data.demo.DemoCorpusNotPrepared` (naming the key and the command that
prepares it) when it is not there.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import soundfile
import torch
from tqdm import tqdm

from asr.config import check_range
from asr.data.demo import FORMAT_VERSION, USE_OPTIONS, DemoConfig, corpus_folder, subset_folders
from asr.data.text import DIGIT_WORDS
from asr.data.utterance import SPLITS
from asr.synthesis import engines, espeak, pico, piper
from features.audio import resample

logger = logging.getLogger(__name__)

OPTIONS_FILE = "synth_options.json"  # what made the corpus: options, format, synthesiser versions
_CHAPTER = {"train": 1, "dev": 2, "test": 3}
_FIRST_SPEAKER_ID = 100
_RESAMPLE_BATCH = 32  # utterances resampled per call (see resample_batch)

# ---------------------------------------------------------------------------------------------
# Sentences. A template's {slot}s are filled from _SLOTS, recursively; "" makes a slot optional.
# Everything is already in normalize_text's form: upper case, A-Z, apostrophe and single spaces.

_SLOTS: dict[str, tuple[str, ...]] = {
    "digit": DIGIT_WORDS,
    "phone_number": tuple(" ".join(["{digit}"] * n) for n in range(3, 8)),
    "on_off": ("ON", "OFF"),
    "room": ("", "KITCHEN", "BEDROOM", "BATHROOM", "OFFICE", "GARAGE", "LIVING ROOM"),
    "appliance": ("LIGHT", "LIGHTS", "LAMP", "FAN", "HEATER", "RADIO", "TELEVISION"),
    "opening": ("DOOR", "WINDOW"),
    "open_close": ("OPEN", "CLOSE"),
    "up_down": ("UP", "DOWN"),
    "lock_unlock": ("LOCK", "UNLOCK"),
    "outer_door": ("FRONT DOOR", "BACK DOOR", "GARAGE DOOR"),
    "count": ("TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE", "TEN", "FIFTEEN", "TWENTY", "THIRTY"),
    "duration": ("ONE MINUTE", "{count} MINUTES", "ONE HOUR", "{count} HOURS", "{count} SECONDS"),
    "hour": ("ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE", "TEN", "ELEVEN", "TWELVE"),
    "clock_time": ("{hour}", "{hour} FIFTEEN", "{hour} THIRTY"),
    "day": ("TODAY", "TOMORROW", "TONIGHT"),
    "maybe_day": ("", "{day}"),
    "temperature": ("EIGHTEEN", "NINETEEN", "TWENTY", "TWENTY ONE", "TWENTY TWO", "TWENTY THREE", "TWENTY FIVE"),
    "contact": ("MOM", "DAD", "ANNA", "PETER", "GRANDMA", "THE OFFICE", "THE DOCTOR"),
    "media": ("SOME MUSIC", "THE NEWS", "THE RADIO", "THE NEXT SONG"),
    "task": ("CALL {contact}", "BUY MILK", "FEED THE CAT", "WATER THE PLANTS"),
    "when": ("{day}", "IN {duration}", "AT {clock_time}"),
}
_TEMPLATES: tuple[str, ...] = (
    "TURN {on_off} THE {room} {appliance}",
    "{open_close} THE {room} {opening}",
    "{lock_unlock} THE {outer_door}",
    "SET A TIMER FOR {duration}",
    "CANCEL THE TIMER",
    "SET AN ALARM FOR {clock_time}",
    "WAKE ME UP AT {clock_time} {maybe_day}",
    "CANCEL THE ALARM",
    "SET THE {room} TEMPERATURE TO {temperature} DEGREES",
    "CALL {contact}",
    "DIAL {phone_number}",
    "PLAY {media}",
    "STOP THE MUSIC",
    "TURN THE VOLUME {up_down}",
    "WHAT'S THE WEATHER {maybe_day}",
    "WHAT TIME IS IT",
    "REMIND ME TO {task} {when}",
)
_SLOT = re.compile(r"\{(\w+)\}")


def _words(pattern: str) -> set[str]:
    return set(_SLOT.sub(" ", pattern).split())


# Every word a transcript can contain.
VOCABULARY: frozenset[str] = frozenset().union(
    *(_words(t) for t in _TEMPLATES), *(_words(a) for alts in _SLOTS.values() for a in alts)
)


def draw_transcript(rng: np.random.Generator, digit_fraction: float, digits_per_utterance: list[int]) -> str:
    """One sentence: with probability ``digit_fraction`` a digit string whose length is uniform in the
    inclusive ``digits_per_utterance`` range, else a command from a uniformly drawn template."""
    if rng.random() < digit_fraction:
        count = int(rng.integers(digits_per_utterance[0], digits_per_utterance[1] + 1))
        return " ".join(DIGIT_WORDS[int(d)] for d in rng.integers(0, 10, size=count))
    return " ".join(_fill(_TEMPLATES[int(rng.integers(len(_TEMPLATES)))], rng).split())


def _fill(pattern: str, rng: np.random.Generator) -> str:
    def one(match: re.Match) -> str:
        alternatives = _SLOTS[match[1]]
        return _fill(alternatives[int(rng.integers(len(alternatives)))], rng)

    return _SLOT.sub(one, pattern)


# ---------------------------------------------------------------------------------------------
# The corpus.


@dataclass(frozen=True)
class _Planned:
    """Everything drawn for one utterance before its audio exists."""

    split: str
    utt_id: str
    # transcript (lower-cased for the synthesiser), voice, rate, pitch, ...: eSpeak's or Pico's
    request: espeak.SynthesisRequest | pico.PicoRequest | piper.PiperRequest
    text: str  # the transcript as written to trans.txt
    level_db: float
    lead_seconds: float
    trail_seconds: float
    noise: float
    noise_seed: tuple[int, ...]


def prepare_corpus(config: DemoConfig, cache_dir: str | Path) -> dict[str, Path]:
    """The ``train``, ``dev`` and ``test`` subset folders of the corpus ``config`` describes,
    synthesised first when they are not there yet (``python -m asr.synth_demo`` calls this).

    Generated under ``<cache_dir>/demo/<key>/`` on the first call (the demo recipe's
    cost is in docs/studies/demo_recipe.md) and reused afterwards. Generation builds
    into a hidden temporary folder beside the target and renames it into place
    when complete, so an interrupted run never leaves a half corpus that a
    later run would take for a finished one. An option the synthesisers cannot
    take (:func:`check_config`) raises :class:`ValueError` naming the config field;
    a missing eSpeak raises :class:`asr.synthesis.espeak.EspeakError` saying how to install it.
    """
    target = corpus_folder(config, cache_dir)
    root, key = target.parent, target.name
    paths = subset_folders(target)
    if target.is_dir():
        logger.info("reusing the demo corpus at %s", target)
        return paths

    check_config(config)
    for name in ("train_voices", "test_voices"):
        for voice in getattr(config, name):
            try:
                espeak.check_voice(voice)
            except espeak.UnknownVoiceError as err:
                raise ValueError(f"demo corpus {name}: {err}") from err
    if config.pico_share > 0:
        pico.PicoVoices(config.pico_voices)  # a missing ttspico says how to install it before anything is built
    if config.piper_share > 0:
        piper.PiperVoices(config.piper_voices)  # likewise a missing piper-tts or voice package

    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    plan = _plan(config)
    logger.info(
        "generating demo corpus at %s: %s utterances",
        target,
        ", ".join(f"{split} {sum(p.split == split for p in plan)}" for split in SPLITS),
    )
    building = Path(tempfile.mkdtemp(prefix=f".{key}-partial-", dir=root))
    try:
        # disable=None: a bar on a terminal, nothing in a log file
        with tqdm(total=len(plan), desc="synthesising the demo corpus", unit="utt", disable=None) as bar:
            seconds = _render_all(plan, config, building / "LibriSpeech", bar.update)
        _write_description(building, config, key, plan, seconds)
        building.chmod(0o755)  # mkdtemp makes it private; the corpus is meant to be shared like any other
        try:
            os.rename(building, target)
        except OSError:
            if not target.is_dir():
                raise
            # another process finished the same corpus first; theirs is identical
            shutil.rmtree(building)
            logger.info("reusing the demo corpus at %s (generated concurrently)", target)
            return paths
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    logger.info(
        "generated demo corpus at %s in %.1f s (%.1f minutes of audio)",
        target,
        time.perf_counter() - started,
        sum(seconds.values()) / 60,
    )
    return paths


def speaker_ids(config: DemoConfig) -> dict[str, str]:
    """Voice -> speaker id: 100, 101, ... in ``train_voices``, ``test_voices``, then Pico voice order
    (``"pico:en-US"``, ... when ``pico_share`` > 0), then Piper's (``"piper:joe"`` when ``piper_share`` > 0)."""
    voices = [*config.train_voices, *config.test_voices, *pico_speakers(config), *piper_speakers(config)]
    return {voice: str(_FIRST_SPEAKER_ID + i) for i, voice in enumerate(voices)}


def pico_speakers(config: DemoConfig) -> list[str]:
    """The Pico voices as speakers are named in ``voices.txt``: ``"pico:<voice>"``; none when unused."""
    return [f"pico:{voice}" for voice in config.pico_voices] if config.pico_share > 0 else []


def piper_speakers(config: DemoConfig) -> list[str]:
    """The Piper voices as speakers are named in ``voices.txt``: ``"piper:<voice>"``; none when unused."""
    return [f"piper:{voice}" for voice in config.piper_voices] if config.piper_share > 0 else []


def check_config(config: DemoConfig) -> None:
    """What :class:`~asr.data.demo.DemoConfig` cannot check without the synthesisers: that its ranges are
    within what eSpeak NG, Pico and Piper accept, and that Pico and Piper have the voices named (when they
    speak). :class:`ValueError` naming the option otherwise. eSpeak's voices are checked with eSpeak itself,
    in :func:`prepare_corpus`."""
    check_range("rate_wpm", config.rate_wpm, *espeak.RATE_LIMITS)
    check_range("pitch", config.pitch, *espeak.PITCH_LIMITS)
    check_range("intonation", config.intonation, *espeak.PITCH_LIMITS)
    if config.pico_share > 0:
        _check_voices("pico", config.pico_voices, pico.check_voice, pico.PicoError)
    check_range("pico_rate", config.pico_rate, *pico.RATE_LIMITS)
    check_range("pico_pitch", config.pico_pitch, *pico.PITCH_LIMITS)
    if config.piper_share > 0:
        _check_voices("piper", config.piper_voices, piper.check_voice, piper.PiperError)
    check_range("piper_length_scale", config.piper_length_scale, *piper.LENGTH_LIMITS)
    check_range("piper_noise_scale", config.piper_noise_scale, *piper.NOISE_LIMITS)
    check_range("piper_noise_w_scale", config.piper_noise_w_scale, *piper.NOISE_LIMITS)


def _check_voices(synthesiser: str, voices: list[str], check_voice, error: type[Exception]) -> None:
    """Each of ``<synthesiser>_voices`` is known (``check_voice`` raises ``error`` otherwise);
    :class:`ValueError` naming the option if not."""
    for voice in voices:
        try:
            check_voice(voice)
        except error as err:
            raise ValueError(f"{synthesiser}_voices: {err}") from None


def _plan(config: DemoConfig) -> list[_Planned]:
    """All utterances of all splits, in order. Each draws from its own generator seeded by
    (seed, split, index), so changing one split's size does not change the others' sentences."""
    ids = speaker_ids(config)
    plan = []
    for split_number, split in enumerate(SPLITS):
        voices = config.test_voices if split == "test" else config.train_voices
        count = getattr(config, f"{split}_utterances")
        per_speaker: Counter[str] = Counter()
        pico_count = 0
        piper_count = 0
        for index in range(count):
            rng = np.random.default_rng([config.seed, split_number, index])
            voice = voices[index % len(voices)]  # round robin: every voice gets an equal share
            text = draw_transcript(rng, config.digit_fraction, config.digits_per_utterance)
            request = espeak.SynthesisRequest(
                # lower case: eSpeak spells out some all-capital words as abbreviations ("US", "IT")
                text=text.lower(),
                voice=voice,
                rate=int(rng.integers(config.rate_wpm[0], config.rate_wpm[1] + 1)),
                pitch=int(rng.integers(config.pitch[0], config.pitch[1] + 1)),
                pitch_range=int(rng.integers(config.intonation[0], config.intonation[1] + 1)),
                word_gap=int(rng.integers(config.word_gap[0], config.word_gap[1] + 1)),
            )
            planned = _Planned(
                split=split,
                utt_id="",
                request=request,
                text=text,
                level_db=float(rng.uniform(*config.level_db)),
                lead_seconds=float(rng.uniform(*config.silence_seconds)),
                trail_seconds=float(rng.uniform(*config.silence_seconds)),
                noise=float(rng.uniform(*config.noise)),
                noise_seed=(config.seed, split_number, index, 1),
            )
            # drawn last, and only when enabled, so corpora without it keep every other draw
            if config.isolated_digits > 0 and _is_digit_string(text) and rng.random() < config.isolated_digits:
                planned = replace(planned, request=replace(request, text=spoken_one_by_one(text)))
            # likewise drawn after everything else: Pico speaks this one instead of the eSpeak voice
            if config.pico_share > 0 and split != "test" and rng.random() < config.pico_share:
                pico_voice = config.pico_voices[pico_count % len(config.pico_voices)]
                pico_count += 1
                voice = f"pico:{pico_voice}"  # its speaker, as pico_speakers names it
                request = pico.PicoRequest(
                    text=planned.request.text,
                    voice=pico_voice,
                    rate=int(rng.integers(config.pico_rate[0], config.pico_rate[1] + 1)),
                    pitch=int(rng.integers(config.pico_pitch[0], config.pico_pitch[1] + 1)),
                )
                planned = replace(planned, request=request)
            # and Piper's, among the utterances Pico does not speak
            elif config.piper_share > 0 and split != "test" and rng.random() < config.piper_share:
                piper_voice = config.piper_voices[piper_count % len(config.piper_voices)]
                piper_count += 1
                voice = f"piper:{piper_voice}"
                request = piper.PiperRequest(
                    text=planned.request.text,
                    voice=piper_voice,
                    length_scale=float(rng.uniform(*config.piper_length_scale)),
                    noise_scale=float(rng.uniform(*config.piper_noise_scale)),
                    noise_w_scale=float(rng.uniform(*config.piper_noise_w_scale)),
                )
                planned = replace(planned, request=request)
            speaker = ids[voice]
            planned = replace(planned, utt_id=f"{speaker}-{_CHAPTER[split]}-{per_speaker[speaker]:04d}")
            per_speaker[speaker] += 1
            plan.append(planned)
    return plan


def _is_digit_string(text: str) -> bool:
    return all(word in DIGIT_WORDS for word in text.split())


def spoken_one_by_one(text: str) -> str:
    """``"ONE FIVE EIGHT"`` -> ``"One. Five. Eight."``: one sentence per word, which eSpeak speaks
    with a sentence's falling pitch and pause (lower case after a full stop would not end a sentence)."""
    return " ".join(f"{word.capitalize()}." for word in text.lower().split())


def _render_all(
    plan: list[_Planned], config: DemoConfig, folder: Path, progress: Callable[[int], object] = lambda done: None
) -> dict[str, float]:
    """Synthesise, render and write every planned utterance with its transcripts; seconds of audio per split.
    ``progress(n)`` is called after each ``n`` utterances written (a progress bar's ``update``)."""
    transcripts: dict[Path, list[str]] = {}
    seconds = dict.fromkeys(SPLITS, 0.0)
    # Each synthesiser speaks all of its requests of the plan as one list, in plan order, in worker
    # processes that work ahead while this process writes, so the samples depend only on the plan
    # (see asr.synthesis.engines).
    names = [engines.for_request(p.request) for p in plan]
    synthesisers = {name: engines.get(name) for name in dict.fromkeys(names)}
    spoken = {
        name: synthesiser.speak([p.request for p, n in zip(plan, names, strict=True) if n == name])
        for name, synthesiser in synthesisers.items()
    }

    def speak(index: int) -> tuple[np.ndarray, int]:
        return next(spoken[names[index]]), synthesisers[names[index]].sample_rate

    try:
        for start in range(0, len(plan), _RESAMPLE_BATCH):
            batch = plan[start : start + _RESAMPLE_BATCH]
            waveforms, rates = zip(*(speak(start + i) for i in range(len(batch))), strict=True)
            speech = resample_mixed(list(waveforms), list(rates), config.sample_rate)
            for planned, waveform in zip(batch, speech, strict=True):
                audio = _render(planned, waveform, config.sample_rate)
                speaker, chapter, _ = planned.utt_id.split("-")
                chapter_dir = folder / planned.split / speaker / chapter
                if chapter_dir not in transcripts:
                    chapter_dir.mkdir(parents=True)
                    transcripts[chapter_dir] = []
                soundfile.write(chapter_dir / f"{planned.utt_id}.flac", audio, config.sample_rate, subtype="PCM_16")
                transcripts[chapter_dir].append(f"{planned.utt_id} {planned.text}\n")
                seconds[planned.split] += audio.size / config.sample_rate
            progress(len(batch))
    finally:
        for each in spoken.values():
            each.close()  # stops the workers if writing failed half way
    for chapter_dir, lines in transcripts.items():
        speaker, chapter = chapter_dir.parent.name, chapter_dir.name
        (chapter_dir / f"{speaker}-{chapter}.trans.txt").write_text("".join(lines), encoding="utf-8")
    return seconds


def resample_mixed(waveforms: list[np.ndarray], rates: list[int], new_rate: int) -> list[np.ndarray]:
    """Each waveform at its own rate resampled to ``new_rate``: :func:`resample_batch` once per rate."""
    out: list[np.ndarray] = list(waveforms)
    for rate in sorted(set(rates)):
        if rate == new_rate:
            continue
        rows = [i for i, r in enumerate(rates) if r == rate]
        for i, resampled in zip(rows, resample_batch([waveforms[i] for i in rows], rate, new_rate), strict=True):
            out[i] = resampled
    return out


def resample_batch(waveforms: list[np.ndarray], orig_rate: int, new_rate: int) -> list[np.ndarray]:
    """Each ``(N_i,)`` waveform resampled with :func:`features.audio.resample`, in one call.

    Building the filter kernel costs more than filtering a short utterance, and
    one call builds it once for the whole batch. Zero padding the rows to one
    length changes none of the ``ceil(N_i * new_rate / orig_rate)`` samples kept,
    since ``resample`` pads every row with zeros past its end anyway.
    """
    padded = np.zeros((len(waveforms), max(w.size for w in waveforms)), dtype=np.float32)
    for row, waveform in zip(padded, waveforms, strict=True):
        row[: waveform.size] = waveform
    resampled = resample(torch.from_numpy(padded), orig_rate, new_rate).numpy()
    return [
        row[: -(-waveform.size * new_rate // orig_rate)] for row, waveform in zip(resampled, waveforms, strict=True)
    ]


def _render(planned: _Planned, speech: np.ndarray, sample_rate: int) -> np.ndarray:
    """The resampled ``(N,)`` float speech -> the stored ``(M,)`` int16 samples: scaled to the drawn
    peak level, framed by silence, over background noise."""
    speech = speech * np.float32(10 ** (planned.level_db / 20) / max(float(np.abs(speech).max()), 1e-9))
    lead = round(planned.lead_seconds * sample_rate)
    trail = round(planned.trail_seconds * sample_rate)
    audio = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(trail, np.float32)])
    noise = np.random.default_rng(list(planned.noise_seed)).standard_normal(audio.size, dtype=np.float32)
    audio += np.float32(planned.noise) * noise
    # round and clip here rather than leave the float -> int conversion (and its overflow) to libsndfile
    return np.clip(np.round(audio * 32767), -32768, 32767).astype(np.int16)


def _write_description(
    folder: Path, config: DemoConfig, key: str, plan: list[_Planned], seconds: dict[str, float]
) -> None:
    """``voices.txt`` (speaker id, voice, splits), ``README.txt`` (what this corpus is and how it was made) and
    ``synth_options.json`` (:func:`recorded_options`)."""
    ids = speaker_ids(config)
    recorded = recorded_options(config, key)
    voice_lines = ["# speaker\tvoice\tsplits\n"]
    for voice, speaker in ids.items():
        splits = "test" if voice in config.test_voices else "train,dev"
        voice_lines.append(f"{speaker}\t{voice}\t{splits}\n")
    (folder / "voices.txt").write_text("".join(voice_lines), encoding="utf-8")

    texts = {split: [p.text for p in plan if p.split == split] for split in SPLITS}
    train_texts = set(texts["train"])
    lines = [
        "Synthetic demo speech corpus generated by lnasr (asr/synthesis/demo.py) with eSpeak NG"
        + (f" and SVOX Pico ({100 * config.pico_share:.0f}% of train and dev)" if config.pico_share > 0 else "")
        + (f" and Piper ({100 * config.piper_share:.0f}% of the rest of train and dev)" if config.piper_share > 0 else "")
        + ".\n",
        f"Corpus key {key}, format version {FORMAT_VERSION}. Delete this folder to regenerate it.\n\n",
        "Splits (LibriSpeech layout; chapter 1 = train, 2 = dev, 3 = test):\n",
    ]
    for split in SPLITS:
        line = f"  {split}: {len(texts[split])} utterances, {seconds[split] / 60:.1f} minutes"
        if split != "train":
            seen = sum(t in train_texts for t in texts[split]) / len(texts[split])
            line += f", {100 * seen:.0f}% of transcripts also occur in train"
        lines.append(line + "\n")
    lines += [
        f"\nTraining (and dev) voices: {', '.join(config.train_voices)}\n",
        f"Held-out test voices: {', '.join(config.test_voices)}\n",
        *([f"SVOX Pico voices (train and dev): {', '.join(pico_speakers(config))}\n"] if config.pico_share > 0 else []),
        *([f"Piper voices (train and dev): {', '.join(piper_speakers(config))}\n"] if config.piper_share > 0 else []),
        "Speaker ids per voice: voices.txt\n",
        f"Vocabulary ({len(VOCABULARY)} words): {' '.join(sorted(VOCABULARY))}\n",
        f"Synthesisers: {', '.join(f'{name} {v}' for name, v in recorded['synthesisers'].items())}\n",
        f"\nOptions:\n{json.dumps(recorded['options'], indent=2)}\n",
    ]
    (folder / "README.txt").write_text("".join(lines), encoding="utf-8")
    (folder / OPTIONS_FILE).write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def recorded_options(config: DemoConfig, key: str) -> dict:
    """What ``synth_options.json`` records: the key, the format, the options and the package versions of
    the synthesisers that spoke the corpus. For the record only: the corpus is found by its folder."""
    synthesisers = {"espeak": f"espeakng-loader={espeak.version()}"}
    if config.pico_share > 0:
        synthesisers["pico"] = f"ttspico={pico.version()}"
    if config.piper_share > 0:
        synthesisers["piper"] = piper.version()
    options = {k: v for k, v in asdict(config).items() if k not in USE_OPTIONS}
    return {"key": key, "format": FORMAT_VERSION, "options": options, "synthesisers": synthesisers}

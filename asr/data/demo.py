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
    <cache_dir>/demo/<key>/README.txt, voices.txt

with one speaker id per voice (100, 101, ... in ``train_voices`` then
``test_voices`` order, then the Pico voices when they speak) and the chapter telling the split (1 train, 2 dev,
3 test), so utterance ids are unique across the three splits. ``<key>`` is a
hash of every option that changes the corpus, the format version and the
synthesisers' package versions: a changed option makes a new corpus beside the old
one, and an unchanged one reuses the corpus already there.

The corpus is prepared apart from training, as ESPnet's and icefall's data
preparation stages are: ``python -m asr.synth_demo RECIPE [key=value ...]``
(:mod:`asr.cli.synth_demo`) runs :func:`prepare_corpus`, which synthesises
it; training, checking and evaluation only read it, through
:func:`corpus_subsets`, which raises :class:`DemoCorpusNotPrepared` (naming
the key and the command that prepares it) when it is not there.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shlex
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import soundfile
import torch
from tqdm import tqdm

from asr.config import check_range
from asr.synthesis import engines, espeak, pico, piper
from asr.data.report import DataError
from asr.data.text import DIGIT_WORDS
from asr.data.utterance import SPLITS
from features.audio import resample

logger = logging.getLogger(__name__)

# Bump when the generation changes in a way the config does not show (grammar,
# rendering, layout), so corpora made by older code are not reused.
FORMAT_VERSION = 2  # 2: the splits under LibriSpeech/ (the samples are those of version 1)
USE_OPTIONS = ("enabled", "splits")  # how a recipe uses the corpus; they do not change its audio
_CHAPTER = {"train": 1, "dev": 2, "test": 3}
_FIRST_SPEAKER_ID = 100
_RESAMPLE_BATCH = 32  # utterances resampled per call (see resample_batch)

# Accents crossed with voice variants. Test variants are never heard in training,
# so the test set measures generalisation to new "speakers" in known accents.
_LANGUAGES = ("en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-029")
_TRAIN_VARIANTS = ("m1", "m2", "m3", "m4", "m6", "m8", "f1", "f2", "f3")
DEFAULT_TRAIN_VOICES = tuple(f"{lang}+{variant}" for variant in _TRAIN_VARIANTS for lang in _LANGUAGES)
# One voice per held-out variant, each in a different accent: 4 test speakers, like 4 new people.
DEFAULT_TEST_VOICES = ("en-us+m5", "en+f4", "en-gb-x-rp+m7", "en-029+f5")


@dataclass
class DemoConfig:
    """The synthetic demo corpus (the ``data.demo`` section of a recipe). See the module docstring."""

    enabled: bool = False  # true: train/evaluate on the corpus (prepared first with python -m asr.synth_demo)
    # the recipe's splits the corpus joins: [train] adds its voices as training data only
    # (e.g. more speakers for a real-speech recipe), leaving that recipe's dev and test sets as they are
    splits: list[str] = field(default_factory=lambda: list(SPLITS))
    # 3000 utterances are about 1.6 hours of audio: enough for a small model to learn the
    # ~100-word vocabulary in minutes on a CPU; generating them takes well under a minute.
    train_utterances: int = 3000
    dev_utterances: int = 300  # spoken by the training voices
    test_utterances: int = 300  # spoken by test_voices, which training never hears
    # "<language>+<variant>" voices; dev uses the training voices, test must use others (held out)
    train_voices: list[str] = field(default_factory=lambda: list(DEFAULT_TRAIN_VOICES))
    # Shorthand for many voices: when given, train_voices becomes every accent with every
    # variant (variant-major, as the default list) and these two are emptied, so a saved
    # config lists the voices themselves. Names: asr.synthesis.espeak.available_variants().
    train_accents: list[str] = field(default_factory=list)
    train_variants: list[str] = field(default_factory=list)
    test_voices: list[str] = field(default_factory=lambda: list(DEFAULT_TEST_VOICES))  # held out: none in train_voices
    digit_fraction: float = 0.4  # share of utterances that are digit strings; the rest are commands
    digits_per_utterance: list[int] = field(default_factory=lambda: [1, 7])  # inclusive range of digits
    # Per-utterance draws, uniform in the inclusive [low, high] ranges below.
    rate_wpm: list[int] = field(default_factory=lambda: [130, 210])  # words per minute; eSpeak's default is 175
    pitch: list[int] = field(default_factory=lambda: [30, 70])  # eSpeak pitch 0-100; 50 = the voice's own
    intonation: list[int] = field(default_factory=lambda: [30, 80])  # eSpeak pitch range 0-100; 0 = monotone
    word_gap: list[int] = field(default_factory=lambda: [0, 3])  # extra pause between words, units of 10 ms
    # Share of digit strings spoken one digit per sentence ("One. Five. Eight."): each digit in its
    # citation form with a falling pitch and a sentence pause, like isolated recordings joined together.
    isolated_digits: float = 0.0
    level_db: list[float] = field(default_factory=lambda: [-20.0, -3.0])  # speech peak in dB re full scale
    silence_seconds: list[float] = field(default_factory=lambda: [0.05, 0.4])  # before and after the speech
    # std of white background noise over the whole utterance (full scale 1): real recordings are
    # never digitally silent, and exact zeros give log(0)-floor frames in the features
    noise: list[float] = field(default_factory=lambda: [0.0005, 0.003])
    sample_rate: int = 16000  # Hz; the feature pipeline's rate, so files need no resampling when read
    # A second synthesiser whose voices come from real speakers (asr.synthesis.pico): the share of train
    # and dev utterances spoken by pico_voices (round robin) instead of an eSpeak voice. 0 = eSpeak only.
    pico_share: float = 0.0
    pico_voices: list[str] = field(default_factory=lambda: list(pico.VOICES))
    pico_rate: list[int] = field(default_factory=lambda: [75, 125])  # percent of the voice's own speaking rate
    # percent of the voice's own pitch: both voices are female, so most of the range lowers them
    pico_pitch: list[int] = field(default_factory=lambda: [55, 130])
    # A neural synthesiser, Piper (asr.synthesis.piper), whose voices are networks trained on one real
    # speaker each: the share of train and dev utterances spoken by piper_voices (round robin) instead
    # of an eSpeak voice (drawn after Pico's share, among the utterances Pico does not speak). 0 = none.
    piper_share: float = 0.0
    piper_voices: list[str] = field(default_factory=lambda: list(piper.VOICES))
    # per-utterance draws: durations times length_scale (2 = half as fast), and the network's
    # variation of sound (noise_scale) and of durations (noise_w_scale); the voices' own are 1, 0.667, 0.8
    piper_length_scale: list[float] = field(default_factory=lambda: [0.8, 1.6])
    piper_noise_scale: list[float] = field(default_factory=lambda: [0.4, 0.9])
    piper_noise_w_scale: list[float] = field(default_factory=lambda: [0.4, 1.0])
    seed: int = 0  # the same seed (and options) gives the same transcripts and samples

    def __post_init__(self) -> None:
        # one spelling per value, so DemoConfig(noise=[0, 1]) and noise: [0.0, 1.0] name the same corpus
        self.digit_fraction = float(self.digit_fraction)
        self.isolated_digits = float(self.isolated_digits)
        self.pico_share = float(self.pico_share)
        self.piper_share = float(self.piper_share)
        for name in ("piper_length_scale", "piper_noise_scale", "piper_noise_w_scale"):
            setattr(self, name, [float(x) for x in getattr(self, name)])
        for name in ("level_db", "silence_seconds", "noise"):
            setattr(self, name, [float(x) for x in getattr(self, name)])
        for name in ("train_utterances", "dev_utterances", "test_utterances"):
            # an empty split would be a folder without transcripts, which readers reject
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.train_accents or self.train_variants:
            missing = "train_variants" if self.train_accents else "train_accents"
            if not (self.train_accents and self.train_variants):
                raise ValueError(f"{missing} is empty: give train_accents and train_variants together (or train_voices)")
            self.train_voices = [f"{a}+{v}" for v in self.train_variants for a in self.train_accents]
            self.train_accents, self.train_variants = [], []
        unknown = sorted(set(self.splits) - set(SPLITS))
        if unknown or not self.splits:
            raise ValueError(f"splits must be a non-empty list of {', '.join(SPLITS)}, got {self.splits}")
        for name in ("train_voices", "test_voices"):
            voices = getattr(self, name)
            if not voices:
                raise ValueError(f"{name} must name at least one voice")
            for voice in voices:
                language, _, variant = voice.partition("+")
                if not language or not variant:
                    raise ValueError(f"{name}: {voice!r} is not '<language>+<variant>' (e.g. 'en-us+m3')")
            repeated = sorted(v for v, n in Counter(voices).items() if n > 1)
            if repeated:
                raise ValueError(f"{name}: voice(s) listed twice: {', '.join(repeated)}")
        shared = sorted(set(self.train_voices) & set(self.test_voices))
        if shared:
            raise ValueError(f"test_voices must be held out, but {', '.join(shared)} are also in train_voices")
        for name in ("digit_fraction", "isolated_digits", "pico_share", "piper_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        check_range("digits_per_utterance", self.digits_per_utterance, 1, 20)
        check_range("rate_wpm", self.rate_wpm, *espeak.RATE_LIMITS)
        check_range("pitch", self.pitch, *espeak.PITCH_LIMITS)
        check_range("intonation", self.intonation, *espeak.PITCH_LIMITS)
        check_range("word_gap", self.word_gap, 0, 100)
        check_range("level_db", self.level_db, -60.0, 0.0)
        check_range("silence_seconds", self.silence_seconds, 0.0, 10.0)
        check_range("noise", self.noise, 0.0, 0.1)
        if self.pico_share > 0:
            _check_voices("pico", self.pico_voices, pico.check_voice, pico.PicoError)
        check_range("pico_rate", self.pico_rate, *pico.RATE_LIMITS)
        check_range("pico_pitch", self.pico_pitch, *pico.PITCH_LIMITS)
        if self.piper_share > 0:
            _check_voices("piper", self.piper_voices, piper.check_voice, piper.PiperError)
        check_range("piper_length_scale", self.piper_length_scale, *piper.LENGTH_LIMITS)
        check_range("piper_noise_scale", self.piper_noise_scale, *piper.NOISE_LIMITS)
        check_range("piper_noise_w_scale", self.piper_noise_w_scale, *piper.NOISE_LIMITS)
        if self.sample_rate < 8000:
            raise ValueError(f"sample_rate must be at least 8000 Hz, got {self.sample_rate}")


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


# what the error says to run when the caller does not know the recipe (entry points pass the exact command)
_GENERIC_COMMAND = "python -m asr.synth_demo RECIPE [key=value ...]   (the recipe and overrides of this run)"


def prepare_command(source: str | Path, overrides: Iterable[str] = ()) -> str:
    """The shell command that prepares the demo corpus of a recipe (or of the config a checkpoint
    holds) with these overrides: ``python -m asr.synth_demo recipes/demo.yaml data.demo.seed=1``."""
    return shlex.join(["python", "-m", "asr.synth_demo", str(source), *overrides])


class DemoCorpusNotPrepared(DataError):
    """A recipe reads a demo corpus that has not been prepared: the message names the corpus
    key, the folder it was looked for in and the command that prepares it."""

    def __init__(self, key: str, folder: Path, command: str = _GENERIC_COMMAND):
        super().__init__(
            f"data.demo: the demo corpus {key} has not been prepared ({folder} not found). "
            f"Training and evaluation only read it; prepare it once with\n    {command}"
        )
        self.key = key
        self.folder = folder
        self.command = command


def corpus_folder(config: DemoConfig, cache_dir: str | Path) -> Path:
    """Where the corpus ``config`` describes lives: ``<cache_dir>/demo/<key>`` (see :func:`corpus_key`)."""
    return Path(cache_dir).expanduser() / "demo" / corpus_key(config)


def corpus_subsets(config: DemoConfig, cache_dir: str | Path, command: str = _GENERIC_COMMAND) -> dict[str, Path]:
    """The ``train``, ``dev`` and ``test`` subset folders of the prepared corpus ``config`` describes.

    Reads only: a corpus not yet prepared raises :class:`DemoCorpusNotPrepared`, whose
    message tells the user to run ``command`` (the exact ``python -m asr.synth_demo ...``
    when the caller knows it)."""
    target = corpus_folder(config, cache_dir)
    if not target.is_dir():
        raise DemoCorpusNotPrepared(target.name, target, command)
    return _subsets(target)


def _subsets(target: Path) -> dict[str, Path]:
    return {split: target / "LibriSpeech" / split for split in SPLITS}


def prepare_corpus(config: DemoConfig, cache_dir: str | Path) -> dict[str, Path]:
    """The ``train``, ``dev`` and ``test`` subset folders of the corpus ``config`` describes,
    synthesised first when they are not there yet (``python -m asr.synth_demo`` calls this).

    Generated under ``<cache_dir>/demo/<key>/`` on the first call (the demo recipe's
    cost is in docs/studies/demo_recipe.md) and reused afterwards. Generation builds
    into a hidden temporary folder beside the target and renames it into place
    when complete, so an interrupted run never leaves a half corpus that a
    later run would take for a finished one. An unknown voice raises
    :class:`ValueError` naming it and the config field; a missing eSpeak raises
    :class:`asr.synthesis.espeak.EspeakError` saying how to install it.
    """
    target = corpus_folder(config, cache_dir)
    root, key = target.parent, target.name
    paths = _subsets(target)
    if target.is_dir():
        logger.info("reusing the demo corpus at %s", target)
        return paths

    for name in ("train_voices", "test_voices"):
        for voice in getattr(config, name):
            try:
                espeak.check_voice(voice)
            except espeak.UnknownVoiceError as err:
                raise ValueError(f"demo corpus {name}: {err}") from err
    if config.pico_share > 0:
        pico.Speaker(config.pico_voices)  # a missing ttspico says how to install it before anything is built
    if config.piper_share > 0:
        piper.Speaker(config.piper_voices)  # likewise a missing piper-tts or voice package

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


def corpus_key(config: DemoConfig) -> str:
    """Folder name of the corpus: a hash of the options that change it, the format and eSpeak versions."""
    options = asdict(config)
    for name in USE_OPTIONS:  # whether and where a recipe uses the corpus does not change it
        del options[name]
    del options["train_accents"], options["train_variants"]  # always empty: spelled out in train_voices
    if not options["isolated_digits"]:  # added later: corpora that do not use it keep their folders
        del options["isolated_digits"]
    if options["pico_share"]:  # likewise
        options["pico"] = pico.version()
    else:
        for name in ("pico_share", "pico_voices", "pico_rate", "pico_pitch"):
            del options[name]
    if options["piper_share"]:  # likewise
        options["piper"] = piper.version()
    else:
        for name in ("piper_share", "piper_voices", "piper_length_scale", "piper_noise_scale", "piper_noise_w_scale"):
            del options[name]
    try:
        engine_version = importlib.metadata.version("espeakng-loader")
    except importlib.metadata.PackageNotFoundError:
        engine_version = "missing"
    described = json.dumps({"format": FORMAT_VERSION, "espeak": engine_version, **options}, sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()[:12]


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


def _check_voices(synthesiser: str, voices: list[str], check_voice, error: type[Exception]) -> None:
    """``<synthesiser>_voices`` names at least one voice, each known (``check_voice`` raises ``error``
    otherwise) and listed once; :class:`ValueError` naming the option if not."""
    name = f"{synthesiser}_voices"
    if not voices:
        raise ValueError(f"{name} must name at least one voice when {synthesiser}_share > 0")
    for voice in voices:
        try:
            check_voice(voice)
        except error as err:
            raise ValueError(f"{name}: {err}") from None
    if len(set(voices)) < len(voices):
        raise ValueError(f"{name}: a voice is listed twice: {voices}")


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
    """``voices.txt`` (speaker id, voice, splits) and ``README.txt`` (what this corpus is and how it was made)."""
    ids = speaker_ids(config)
    voice_lines = ["# speaker\tvoice\tsplits\n"]
    for voice, speaker in ids.items():
        splits = "test" if voice in config.test_voices else "train,dev"
        voice_lines.append(f"{speaker}\t{voice}\t{splits}\n")
    (folder / "voices.txt").write_text("".join(voice_lines), encoding="utf-8")

    texts = {split: [p.text for p in plan if p.split == split] for split in SPLITS}
    train_texts = set(texts["train"])
    lines = [
        "Synthetic demo speech corpus generated by lnasr (asr/data/demo.py) with eSpeak NG"
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
        f"\nOptions:\n{json.dumps({k: v for k, v in asdict(config).items() if k not in USE_OPTIONS}, indent=2)}\n",
    ]
    (folder / "README.txt").write_text("".join(lines), encoding="utf-8")

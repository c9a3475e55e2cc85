"""The demo corpus as a recipe asks for it (``data.demo``), and where its prepared copy is found.

The corpus itself (spoken digit strings and voice-assistant commands by eSpeak NG,
SVOX Pico and Piper voices) is made apart from training by
``python -m asr.synth_demo RECIPE [key=value ...]`` (:mod:`asr.cli.synth_demo`, which runs
:func:`asr.synthesis.demo.prepare_corpus`; :mod:`asr.synthesis.demo` says what the corpus holds)::

    <cache_dir>/demo/<key>/LibriSpeech/{train,dev,test}/<speaker>/<chapter>/<speaker>-<chapter>-<n>.flac
                                                                  .../<speaker>-<chapter>.trans.txt
    <cache_dir>/demo/<key>/README.txt, voices.txt, synth_options.json

``<key>`` (:func:`corpus_key`) is a hash of every option that changes the corpus and of the
format version: a changed option makes a new corpus beside the old one, and an unchanged
one finds the corpus already there. Training, checking and evaluation only read it, with
:func:`asr.data.librispeech.read_subset`, through :func:`corpus_subsets`, which raises
:class:`DemoCorpusNotPrepared` (naming the key and the command that prepares it) when it is
not there. Nothing here imports a synthesiser: a prepared corpus is found by its folder and
the settings that asked for it, whatever synthesiser versions are installed now.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from asr.config import check_range
from asr.data.report import DataError
from asr.data.utterance import SPLITS

# Bump when the generation changes in a way the config does not show (grammar,
# rendering, layout), so corpora made by older code are not reused.
FORMAT_VERSION = 2  # 2: the splits under LibriSpeech/ (the samples are those of version 1)
USE_OPTIONS = ("enabled", "splits")  # how a recipe uses the corpus; they do not change its audio

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
    pico_voices: list[str] = field(default_factory=lambda: ["en-US", "en-GB"])  # both of its English voices
    pico_rate: list[int] = field(default_factory=lambda: [75, 125])  # percent of the voice's own speaking rate
    # percent of the voice's own pitch: both voices are female, so most of the range lowers them
    pico_pitch: list[int] = field(default_factory=lambda: [55, 130])
    # A neural synthesiser, Piper (asr.synthesis.piper), whose voices are networks trained on one real
    # speaker each: the share of train and dev utterances spoken by piper_voices (round robin) instead
    # of an eSpeak voice (drawn after Pico's share, among the utterances Pico does not speak). 0 = none.
    piper_share: float = 0.0
    piper_voices: list[str] = field(default_factory=lambda: ["joe"])  # the voice installed with the toolkit
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
        # The ranges' bounds that are the synthesisers' own (eSpeak's words per minute, Pico's percentages,
        # Piper's scales) and whether Pico and Piper have the voices named are checked where the corpus is
        # made (asr.synthesis.demo.check_config): reading a prepared corpus needs no synthesiser.
        check_range("digits_per_utterance", self.digits_per_utterance, 1, 20)
        for name in ("rate_wpm", "pitch", "intonation", "pico_rate", "pico_pitch"):
            check_range(name, getattr(self, name), 0)
        check_range("word_gap", self.word_gap, 0, 100)
        check_range("level_db", self.level_db, -60.0, 0.0)
        check_range("silence_seconds", self.silence_seconds, 0.0, 10.0)
        check_range("noise", self.noise, 0.0, 0.1)
        for name in ("piper_length_scale", "piper_noise_scale", "piper_noise_w_scale"):
            check_range(name, getattr(self, name), 0.0)
        for synthesiser in ("pico", "piper"):
            voices = getattr(self, f"{synthesiser}_voices")
            if getattr(self, f"{synthesiser}_share") == 0:
                continue
            if not voices:
                raise ValueError(f"{synthesiser}_voices must name at least one voice when {synthesiser}_share > 0")
            if len(set(voices)) < len(voices):
                raise ValueError(f"{synthesiser}_voices: a voice is listed twice: {voices}")
        if self.sample_rate < 8000:
            raise ValueError(f"sample_rate must be at least 8000 Hz, got {self.sample_rate}")


def corpus_key(config: DemoConfig) -> str:
    """Folder name of the corpus: a hash of the format and of the options that change the corpus.

    Not of the synthesisers' versions: a corpus is found by the request that made it, so a new
    Piper or eSpeak NG leaves a prepared corpus readable (the versions that made it are recorded
    in its ``synth_options.json``). Options that do not change the audio are left out: how a recipe
    uses the corpus, and the settings of a synthesiser that speaks none of it.
    """
    options = asdict(config)
    for name in USE_OPTIONS:  # whether and where a recipe uses the corpus does not change it
        del options[name]
    del options["train_accents"], options["train_variants"]  # always empty: spelled out in train_voices
    if not options["isolated_digits"]:
        del options["isolated_digits"]
    if not options["pico_share"]:
        for name in ("pico_share", "pico_voices", "pico_rate", "pico_pitch"):
            del options[name]
    if not options["piper_share"]:
        for name in ("piper_share", "piper_voices", "piper_length_scale", "piper_noise_scale", "piper_noise_w_scale"):
            del options[name]
    described = json.dumps({"format": FORMAT_VERSION, **options}, sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()[:12]


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
    return subset_folders(target)


def subset_folders(folder: Path) -> dict[str, Path]:
    """The ``train``, ``dev`` and ``test`` subset folders of the corpus at ``folder`` (``<cache_dir>/demo/<key>``)."""
    return {split: folder / "LibriSpeech" / split for split in SPLITS}

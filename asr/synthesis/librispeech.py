"""A synthetic corpus of LibriSpeech's shape, to rehearse the LibriSpeech recipes where LibriSpeech cannot be had.

``python -m asr.synth_librispeech OUT --hours 100`` writes::

    OUT/LibriSpeech/{train-clean-100,dev-clean,test-clean}/<speaker>/<chapter>/<speaker>-<chapter>-<nnnn>.flac
                                                                      .../<speaker>-<chapter>.trans.txt
    OUT/LibriSpeech/SPEAKERS.TXT   one line per speaker: id, subset, minutes, synthesiser and voice
    OUT/LibriSpeech/README.txt     what this is, the text's source and licence, voices, sizes, the command

16 kHz 16-bit FLAC, upper-case transcripts, read by
:func:`asr.data.librispeech.read_subset` like the real corpus.

Shape (train-clean-100: 28,539 utterances, 100.6 h, 251 speakers, 585 chapters;
dev-clean and test-clean 5.4 h and 40 speakers each). At ``--hours H`` the
training subset has H hours, ``round(2.5 H)`` speakers (at least 3) with 1-4
chapters each (2.3 on average), every speaker the same share of the hours; the
dev and test subsets have 5.4 % of H each and ``round(0.4 H)`` speakers (at
least 1). Utterance durations are drawn like train-clean-100's (1-24.5 s, mean
about 12.7 s, most 10-17 s): the drawn duration, less the silence around the
speech, times the voice's words per second gives a number of words, and whole
sentences are joined until that number is reached.

Text (:mod:`asr.synthesis.books`): the King James Bible and Shakespeare's plays,
both public domain, 1.6 million words, 31,000 distinct. Each book of the Bible
and each play is read by one subset only: test first, then dev, take whole
books until they have text enough, and training the rest; a sentence that also
occurs in a held-out book is skipped in training (and a test sentence in dev),
so no sentence is in two subsets. A chapter is read on from where the
previous chapter read in the same book, one book after another, so chapters
are contiguous text, as LibriSpeech's are.

Speakers: eSpeak NG voices (an accent crossed with a voice variant; dev and
test use variants never heard in training, and each other's neither), SVOX
Pico's two voices (:data:`PICO_SHARE` of the training speakers) and Piper's
one (:data:`PIPER_SHARE`; by far the slowest), at least one speaker each, each
speaker with a rate, pitch, level and background noise drawn once, plus small
variations per utterance. Pico and Piper have so few voices that they speak
training speakers only.

Behaviour: the corpus depends only on ``--hours``, ``--seed`` and the
installed synthesiser and text packages (recorded in ``synth_options.json``):
each chapter is spoken by synthesisers started afresh for it (see
:mod:`asr.synthesis.engines`), so the samples do not depend on ``--jobs``, the
number of worker processes that make chapters side by side. Each chapter is
written in a temporary folder and renamed into place when complete; a run that
is stopped is resumed by running the same command again, which skips the
finished chapters and gives the same bytes as a run never stopped. A folder
made with other options is refused, naming them.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import soundfile
import torch
from tqdm import tqdm

from asr.synthesis import books, engines, espeak, pico, piper
from features.audio import resample

logger = logging.getLogger(__name__)

# Bump when the generation changes in a way the options do not show, so an old folder is not resumed.
FORMAT_VERSION = 1
OPTIONS_FILE = "synth_options.json"  # the options, format and packages a corpus was made with
SAMPLE_RATE = 16000
SUBSETS = ("train-clean-100", "dev-clean", "test-clean")
# The shape of LibriSpeech's subsets, per hour of train-clean-100 (100.6 h, 251 speakers, 585 chapters).
HELD_OUT_SHARE = 5.4 / 100.6  # dev-clean and test-clean: 5.4 h each
TRAIN_SPEAKERS_PER_HOUR = 251 / 100.6
HELD_OUT_SPEAKERS_PER_HOUR = 40 / 100.6  # per hour of training audio
CHAPTERS_PER_SPEAKER = ((1, 2, 3, 4), (0.2, 0.4, 0.3, 0.1))  # mean 2.3, as 585 / 251
MAX_SECONDS = 24.5  # train-clean-100's longest utterance
PICO_SHARE = 0.15  # of the training speakers
PIPER_SHARE = 0.06  # of the training speakers: Piper makes about 15x real time per core, eSpeak about 500x

# eSpeak NG accents, and voice variants that sound like a person (not the robot, whisper or croak ones)
ESPEAK_ACCENTS = (
    "en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-us-nyc",
)
ESPEAK_VARIANTS = (
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5",
    "klatt", "klatt2", "klatt3", "klatt4", "Alex", "Alicia", "Andrea", "Andy", "Annie", "Denis", "Diogo", "Gene",
    "Gene2", "Henrique", "Hugo", "Jacky", "Lee", "Marco", "Mario", "Michael", "Mike", "Nguyen", "Reed", "Storm",
    "adam", "anika", "antonio", "aunty", "belinda", "benjamin", "boris", "caleb", "david", "ed", "edward",
    "edward2", "grandma", "grandpa", "gustave", "ian", "iven", "iven2", "iven3", "iven4", "john", "linda",
    "marcelo", "max", "michel", "miguel", "mike2", "norbert", "pablo", "paul", "pedro", "quincy", "rob", "robert",
    "sandro", "shelby", "steph", "steph2", "steph3", "travis", "victor", "zac",
)
HELD_OUT_VARIANTS = 10  # variants for dev and as many for test, never heard in training

# Words per second at each synthesiser's own setting (eSpeak per word per minute of its rate), measured
# on the utterances of a --hours 1 corpus (joined Bible and Shakespeare sentences, pauses included):
# what turns a drawn duration into a number of words. tests/test_synth_librispeech.py checks them.
ESPEAK_WORDS_PER_SECOND_PER_WPM = 3.03 / 160
PICO_WORDS_PER_SECOND = 2.94  # at rate 100 %
PIPER_WORDS_PER_SECOND = 3.50  # at length_scale 1


class SynthCorpusError(RuntimeError):
    """The output folder cannot be used (not writable, made with other options) or the text ran out."""


@dataclass(frozen=True)
class Options:
    """Everything that decides the corpus' content; recorded in ``synth_options.json``."""

    hours: float = 100.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.hours <= 1000:
            raise ValueError(f"--hours must be in (0, 1000], got {self.hours}")


@dataclass(frozen=True)
class Speaker:
    """One speaker of the corpus: a voice of one synthesiser with its own settings, drawn once (``_speakers``)."""

    id: str
    subset: str
    synthesiser: str  # a name in asr.synthesis.engines.SYNTHESISERS
    voice: str
    rate: float  # eSpeak: words per minute; Pico: percent; Piper: length_scale (durations times this)
    pitch: float  # eSpeak: 0-100; Pico: percent; Piper: none (0)
    pitch_range: int  # eSpeak's intonation, 0-100
    level_db: float  # speech peak re full scale, before the per-utterance variation
    noise: float  # std of the background noise (full scale 1)

    def words_per_second(self) -> float:
        if self.synthesiser == "espeak":
            return ESPEAK_WORDS_PER_SECOND_PER_WPM * self.rate
        if self.synthesiser == "pico":
            return PICO_WORDS_PER_SECOND * self.rate / 100
        return PIPER_WORDS_PER_SECOND / self.rate

    def describe(self) -> str:
        if self.synthesiser == "espeak":
            return f"espeak {self.voice} rate={self.rate:.0f}wpm pitch={self.pitch:.0f} intonation={self.pitch_range}"
        if self.synthesiser == "pico":
            return f"pico {self.voice} rate={self.rate:.0f}% pitch={self.pitch:.0f}%"
        return f"piper {self.voice} length_scale={self.rate:.2f}"


@dataclass(frozen=True)
class PlannedUtterance:
    """One utterance as planned, before its audio exists: what is said, by which request, how it is rendered.
    (Read back from the corpus, it is an :class:`asr.data.utterance.Utterance` like any other.)"""

    id: str
    sentences: tuple[str, ...]  # the transcript's sentences (asr.synthesis.books.Sentence.words)
    request: object  # the synthesiser's request (asr.synthesis.engines)
    level_db: float
    lead_seconds: float
    trail_seconds: float

    @property
    def words(self) -> str:
        """The transcript."""
        return " ".join(self.sentences)

    def planned_seconds(self, speaker: Speaker) -> float:
        """Its duration as planned: the silences and the words at the speaker's words per second."""
        words = sum(s.count(" ") + 1 for s in self.sentences)
        return self.lead_seconds + self.trail_seconds + words / speaker.words_per_second()


@dataclass(frozen=True)
class Chapter:
    """One chapter to make: everything a worker needs, and nothing that depends on other chapters."""

    subset: str
    speaker: Speaker
    id: str
    book: str  # where its text comes from
    utterances: tuple[PlannedUtterance, ...]
    seed: tuple[int, ...]  # of its background noise

    @property
    def folder(self) -> Path:
        """Relative to ``OUT/LibriSpeech``."""
        return Path(self.subset) / self.speaker.id / self.id


@dataclass
class Plan:
    options: Options
    speakers: list[Speaker]
    chapters: list[Chapter]
    books: dict[str, list[str]] = field(default_factory=dict)  # subset -> the books it reads

    def utterances(self, subset: str | None = None) -> Iterator[PlannedUtterance]:
        for chapter in self.chapters:
            if subset is None or chapter.subset == subset:
                yield from chapter.utterances


# ---------------------------------------------------------------------------------------------
# The plan: every utterance's text, voice and rendering, drawn before any audio exists (cheap: seconds at 100 h).


def _clip(value, low, high):
    """``value`` within ``[low, high]``: ``np.clip`` for one number, without its cost per call (the plan
    makes about 100,000 such calls at 100 hours)."""
    return min(max(value, low), high)


def draw_seconds(rng: np.random.Generator) -> float:
    """One target duration, spread like train-clean-100's: most 10-17 s, a tail down to 1 s, at most 24.5 s."""
    if rng.random() < 0.8:
        return _clip(float(rng.normal(13.9, 2.2)), 1.0, MAX_SECONDS)
    return float(rng.uniform(1.5, 11.0))


def plan(options: Options) -> Plan:
    """The whole corpus as data (see the module docstring); :class:`SynthCorpusError` if the text runs out."""
    documents = books.documents()
    targets = {
        "train-clean-100": options.hours * 3600,
        "dev-clean": options.hours * 3600 * HELD_OUT_SHARE,
        "test-clean": options.hours * 3600 * HELD_OUT_SHARE,
    }
    speaker_counts = {
        "train-clean-100": max(3, round(TRAIN_SPEAKERS_PER_HOUR * options.hours)),
        "dev-clean": max(1, round(HELD_OUT_SPEAKERS_PER_HOUR * options.hours)),
        "test-clean": max(1, round(HELD_OUT_SPEAKERS_PER_HOUR * options.hours)),
    }
    speakers = _speakers(options, speaker_counts)
    assigned = _assign_books(documents, targets, np.random.default_rng([options.seed, 1]))
    held_out: set[str] = set()  # sentences of the books read by test, then by test and dev
    chapters: list[Chapter] = []
    next_chapter = 1000
    for subset_index, subset in reversed(list(enumerate(SUBSETS))):  # test, dev, train: see _assign_books
        rng = np.random.default_rng([options.seed, 2, subset_index])
        reader = _Reader([documents[i] for i in assigned[subset]], skip=frozenset(held_out))
        subset_chapters = []
        here = [s for s in speakers if s.subset == subset]
        share = targets[subset] / len(here)
        for speaker in here:
            count = int(rng.choice(CHAPTERS_PER_SPEAKER[0], p=CHAPTERS_PER_SPEAKER[1]))
            for _ in range(count):  # each chapter an equal part of the speaker's share
                chapter_id = str(next_chapter)
                next_chapter += 1
                book, utterances = _read_chapter(reader, speaker, chapter_id, share / count, rng)
                seed = (options.seed, 3, int(chapter_id))
                subset_chapters.append(Chapter(subset, speaker, chapter_id, book, tuple(utterances), seed))
        chapters = subset_chapters + chapters
        held_out |= {s.words for i in assigned[subset] for s in documents[i].sentences}
    return Plan(options, speakers, chapters, {s: [documents[i].name for i in assigned[s]] for s in SUBSETS})


def _speakers(options: Options, counts: dict[str, int]) -> list[Speaker]:
    rng = np.random.default_rng([options.seed, 0])
    variants = list(ESPEAK_VARIANTS)
    rng.shuffle(variants)
    variants_of = {
        "test-clean": variants[:HELD_OUT_VARIANTS],
        "dev-clean": variants[HELD_OUT_VARIANTS : 2 * HELD_OUT_VARIANTS],
        "train-clean-100": variants[2 * HELD_OUT_VARIANTS :],
    }
    speakers = []
    next_id = 100
    for subset in SUBSETS:
        n = counts[subset]
        names = ["espeak"] * n
        if subset == "train-clean-100":  # Pico's and Piper's few voices speak training speakers only
            # at least one each, so that even a tiny corpus is spoken by all three
            n_piper = max(1, round(PIPER_SHARE * n))
            n_pico = max(1, round(PICO_SHARE * n))
            names = ["piper"] * n_piper + ["pico"] * n_pico + ["espeak"] * (n - n_piper - n_pico)
            rng.shuffle(names)
        voices = [f"{a}+{v}" for v in variants_of[subset] for a in ESPEAK_ACCENTS]
        espeak_voices = list(rng.permutation(voices)[: names.count("espeak")])
        if len(espeak_voices) < names.count("espeak"):
            raise SynthCorpusError(f"{subset} needs {names.count('espeak')} eSpeak voices, only {len(voices)} exist")
        pico_count = 0
        for name in names:
            level_db = float(rng.uniform(-16.0, -4.0))
            noise = float(np.exp(rng.uniform(np.log(3e-4), np.log(3e-3))))
            if name == "espeak":
                voice = str(espeak_voices.pop(0))
                rate, pitch = float(rng.uniform(115, 165)), float(rng.uniform(20, 80))
                pitch_range = int(rng.integers(25, 86))
            elif name == "pico":
                voice = pico.VOICES[pico_count % len(pico.VOICES)]
                pico_count += 1
                rate, pitch, pitch_range = float(rng.uniform(80, 112)), float(rng.uniform(60, 135)), 0
            else:
                voice = next(iter(piper.VOICES))
                rate, pitch, pitch_range = float(rng.uniform(1.0, 1.4)), 0.0, 0
            speakers.append(Speaker(str(next_id), subset, name, voice, rate, pitch, pitch_range, level_db, noise))
            next_id += 1
    return speakers


def _assign_books(documents, targets: dict[str, float], rng: np.random.Generator) -> dict[str, list[int]]:
    """Indices of the books each subset reads: test, then dev, take books in a seeded order until they hold
    1.5 times the words their hours need at 2.9 words per second; training reads all the others."""
    order = [int(i) for i in rng.permutation(len(documents))]
    assigned: dict[str, list[int]] = {}
    for subset in ("test-clean", "dev-clean"):
        needed = targets[subset] * 2.9 * 1.5
        taken, words = [], 0
        while words < needed and len(order) > 1:
            taken.append(order.pop(0))
            words += documents[taken[-1]].words
        assigned[subset] = taken
    assigned["train-clean-100"] = order
    return assigned


class _Reader:
    """Sentences of a subset's books, read on book by book, one chapter from one book (while it lasts)."""

    def __init__(self, documents: list[books.Document], skip: frozenset[str]) -> None:
        self.documents = documents
        self.skip = skip
        self.cursors = [0] * len(documents)
        self.turn = 0

    def start_chapter(self) -> int:
        """The book the next chapter reads: the next one in turn that has text left."""
        for step in range(len(self.documents)):
            index = (self.turn + step) % len(self.documents)
            if self._advance(index):
                self.turn = index + 1
                return index
        raise SynthCorpusError(
            f"the text ran out: {sum(d.words for d in self.documents)} words in "
            f"{len(self.documents)} books are not enough for these --hours (at most about 140 hours)"
        )

    def _advance(self, index: int) -> bool:
        """Moves the book's cursor past skipped sentences; whether it has one left."""
        sentences = self.documents[index].sentences
        while self.cursors[index] < len(sentences) and sentences[self.cursors[index]].words in self.skip:
            self.cursors[index] += 1
        return self.cursors[index] < len(sentences)

    def take(self, index: int, words: int, most: int) -> list[books.Sentence]:
        """Whole sentences from book ``index`` (then the next books) whose words come nearest to ``words``,
        at most ``most`` words unless the first sentence alone has more."""
        taken: list[books.Sentence] = []
        count = 0
        while count < words:
            if not self._advance(index):
                index = self.start_chapter()
                continue
            sentence = self.documents[index].sentences[self.cursors[index]]
            # stop before a sentence that would overshoot by more than the words still missing
            if taken and (count + sentence.count - words > words - count or count + sentence.count > most):
                break
            taken.append(sentence)
            count += sentence.count
            self.cursors[index] += 1
        return taken


def _read_chapter(reader: _Reader, speaker: Speaker, chapter_id: str, seconds: float, rng):
    """A chapter's utterances, drawn until their planned durations add up to ``seconds``."""
    book = reader.start_chapter()
    utterances: list[PlannedUtterance] = []
    total = 0.0
    while total < seconds or not utterances:
        drawn = draw_seconds(rng)
        lead, trail = float(rng.uniform(0.1, 0.45)), float(rng.uniform(0.1, 0.45))
        request = _request(speaker, rng)
        words = max(1, round(max(0.8, drawn - lead - trail) * speaker.words_per_second()))
        most = int((MAX_SECONDS - lead - trail) * speaker.words_per_second())
        sentences = reader.take(book, words, most)
        text = " ".join(s.spoken for s in sentences)
        request = replace(request, text=text)
        utterances.append(
            PlannedUtterance(
                id=f"{speaker.id}-{chapter_id}-{len(utterances):04d}",
                sentences=tuple(s.words for s in sentences),
                request=request,
                level_db=_clip(speaker.level_db + float(rng.uniform(-2.0, 2.0)), -30.0, -1.0),
                lead_seconds=lead,
                trail_seconds=trail,
            )
        )
        total += utterances[-1].planned_seconds(speaker)
    return reader.documents[book].name, utterances


def _request(speaker: Speaker, rng: np.random.Generator):
    """The speaker's settings with this utterance's small variations (the text is filled in after)."""
    if speaker.synthesiser == "espeak":
        return espeak.SynthesisRequest(
            text="",
            voice=speaker.voice,
            rate=int(round(speaker.rate * rng.uniform(0.96, 1.04))),
            pitch=_clip(round(speaker.pitch + float(rng.uniform(-3, 3))), 0, 100),
            pitch_range=_clip(speaker.pitch_range + int(rng.integers(-5, 6)), 0, 100),
            word_gap=int(rng.integers(0, 2)),
        )
    if speaker.synthesiser == "pico":
        return pico.PicoRequest(
            text="",
            voice=speaker.voice,
            rate=int(round(speaker.rate * rng.uniform(0.96, 1.04))),
            pitch=int(round(speaker.pitch * rng.uniform(0.97, 1.03))),
        )
    return piper.PiperRequest(
        text="",
        voice=speaker.voice,
        length_scale=round(speaker.rate * float(rng.uniform(0.96, 1.04)), 4),
        noise_scale=round(float(rng.uniform(0.5, 0.8)), 4),
        noise_w_scale=round(float(rng.uniform(0.6, 0.9)), 4),
    )


# ---------------------------------------------------------------------------------------------
# Making the audio.


_RESAMPLE_BATCH = 16  # utterances resampled per call: one kernel build, bounded memory


def make_chapter(chapter: Chapter, root: Path, partial: Path) -> dict[str, float]:
    """Speaks, renders and writes one chapter into ``partial``, then renames it to ``root / chapter.folder``.

    Returns ``{"seconds": audio seconds, "wall": seconds taken, "cpu": CPU seconds of this process and
    the synthesiser workers it started}``. Runs in a worker process (or in the caller for ``--jobs 1``);
    torch runs on one thread so the samples cannot depend on how many threads there are.
    """
    started = time.perf_counter()
    cpu_started = _cpu_seconds()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        name = chapter.speaker.synthesiser
        # one Piper process per chapter: the chapters run side by side already
        synthesiser = engines.get(name, **({"processes": 1} if name == "piper" else {}))
        spoken = synthesiser.speak([u.request for u in chapter.utterances])
        noise_rng = np.random.default_rng(list(chapter.seed))
        seconds = 0.0
        try:
            for start in range(0, len(chapter.utterances), _RESAMPLE_BATCH):
                batch = chapter.utterances[start : start + _RESAMPLE_BATCH]
                speech = _resample([next(spoken) for _ in batch], synthesiser.sample_rate)
                for utterance, waveform in zip(batch, speech, strict=True):
                    audio = _render(utterance, waveform, chapter.speaker.noise, noise_rng)
                    soundfile.write(partial / f"{utterance.id}.flac", audio, SAMPLE_RATE, subtype="PCM_16")
                    seconds += audio.size / SAMPLE_RATE
        finally:
            spoken.close()
        lines = "".join(f"{u.id} {u.words}\n" for u in chapter.utterances)
        (partial / f"{chapter.speaker.id}-{chapter.id}.trans.txt").write_text(lines, encoding="utf-8")
        target = root / chapter.folder
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(partial, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(partial)  # made meanwhile by another run: the same bytes
    finally:
        torch.set_num_threads(threads)
    return {"seconds": seconds, "wall": time.perf_counter() - started, "cpu": _cpu_seconds() - cpu_started}


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its ended children (the synthesiser workers, once closed)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _resample(waveforms: list[np.ndarray], rate: int) -> list[np.ndarray]:
    """Each waveform from ``rate`` to 16 kHz, in one call (zero padding changes none of the samples kept)."""
    if rate == SAMPLE_RATE:
        return waveforms
    padded = np.zeros((len(waveforms), max(w.size for w in waveforms)), dtype=np.float32)
    for row, waveform in zip(padded, waveforms, strict=True):
        row[: waveform.size] = waveform
    resampled = resample(torch.from_numpy(padded), rate, SAMPLE_RATE).numpy()
    return [row[: -(-w.size * SAMPLE_RATE // rate)] for row, w in zip(resampled, waveforms, strict=True)]


def _render(utterance: PlannedUtterance, speech: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Speech scaled to its peak level, framed by silence, over the speaker's background noise: int16."""
    speech = speech * np.float32(10 ** (utterance.level_db / 20) / max(float(np.abs(speech).max()), 1e-9))
    lead = round(utterance.lead_seconds * SAMPLE_RATE)
    trail = round(utterance.trail_seconds * SAMPLE_RATE)
    audio = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(trail, np.float32)])
    audio += np.float32(noise) * rng.standard_normal(audio.size, dtype=np.float32)
    return np.clip(np.round(audio * 32767), -32768, 32767).astype(np.int16)


# ---------------------------------------------------------------------------------------------
# The command.


def recorded_options(options: Options) -> dict:
    """What ``synth_options.json`` holds: the options, the format and the packages that shape the audio."""
    packages = [f"espeakng-loader={espeak.version()}", f"ttspico={pico.version()}", piper.version(), books.versions()]
    return {"format": FORMAT_VERSION, **asdict(options), "packages": " ".join(packages)}


def check_output(out: Path, options: Options) -> Path:
    """``OUT/LibriSpeech``, created and writable, with options matching any run before;
    else :class:`SynthCorpusError`."""
    root = out / "LibriSpeech"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise SynthCorpusError(f"cannot write the corpus under {out}: {err}") from err
    wanted = recorded_options(options)
    if not check_recorded(root, wanted):
        (root / OPTIONS_FILE).write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return root


def check_recorded(root: Path, wanted: dict, only_wanted: bool = False) -> bool:
    """True when ``root`` records ``wanted`` (every recorded key compared, or only ``wanted``'s with
    ``only_wanted``), False when it holds no corpus yet; :class:`SynthCorpusError` when it was made with
    other options or by something else."""
    recorded = root / OPTIONS_FILE
    if recorded.exists():
        try:
            before = json.loads(recorded.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise SynthCorpusError(f"{recorded} is unreadable ({err}); delete {root} to start again") from err
        compared = set(wanted) if only_wanted else set(before) | set(wanted)
        differing = sorted(k for k in compared if before.get(k) != wanted.get(k))
        if differing:
            described = "; ".join(f"{k}: {before.get(k)!r} there, {wanted.get(k)!r} now" for k in differing)
            raise SynthCorpusError(
                f"{root} was made with other options ({described}); "
                "give those options to resume it, or another OUT folder"
            )
        return True
    if root.is_dir() and any(p.name in SUBSETS for p in root.iterdir()):
        raise SynthCorpusError(f"{root} already holds a corpus this command did not make (no {OPTIONS_FILE}); use another OUT")
    return False


def check_synthesisers(corpus: Plan) -> None:
    """Every synthesiser the plan needs is installed (its error names the pip command) and knows its voices."""
    needed = sorted({s.synthesiser for s in corpus.speakers if any(c.speaker == s for c in corpus.chapters)})
    for name in needed:
        try:
            engines.get(name).check()
        except (espeak.EspeakError, pico.PicoError, piper.PiperError) as err:
            raise SynthCorpusError(f"this corpus needs the {name} synthesiser: {err}") from err
    for speaker in corpus.speakers:
        if speaker.synthesiser == "espeak":
            espeak.check_voice(speaker.voice)


def generate(out: Path, options: Options, jobs: int | None = None, progress: bool = True) -> Path:
    """Makes (or finishes) the corpus under ``out``; returns ``out/LibriSpeech``."""
    jobs = jobs or os.cpu_count() or 1
    # An output under a file, or a folder made with other options, is refused before the books are read
    # (seconds); the packages' versions are compared after the synthesisers are checked, so that a missing
    # one is named as such, and the folder is made only then.
    root = Path(out) / "LibriSpeech"
    nearest = next(p for p in (root, *root.parents) if p.exists())
    if not nearest.is_dir():
        raise SynthCorpusError(f"cannot write the corpus under {out}: {nearest} is not a folder")
    check_recorded(root, asdict(options), only_wanted=True)
    corpus = plan(options)
    # before synth_options.json is written: it records the packages' versions, "missing" included
    check_synthesisers(corpus)
    root = check_output(Path(out), options)
    _write_speakers(root, corpus)
    partial_root = Path(out) / ".synth_partial"
    shutil.rmtree(partial_root, ignore_errors=True)  # chapters a stopped run left half made
    todo = [c for c in corpus.chapters if not (root / c.folder).is_dir()]
    total = sum(len(c.utterances) for c in corpus.chapters)
    logger.info(
        "%s: %d chapters of %d to make (%d utterances), %d worker processes",
        root, len(todo), len(corpus.chapters), sum(len(c.utterances) for c in todo), jobs,
    )
    bar = tqdm(total=total, initial=total - sum(len(c.utterances) for c in todo), unit="utt", disable=not progress)
    made: dict[str, Counter] = defaultdict(Counter)  # synthesiser -> audio, wall and CPU seconds

    def done(chapter: Chapter, result: dict[str, float]) -> None:
        made[chapter.speaker.synthesiser].update(result)
        bar.update(len(chapter.utterances))

    started = time.perf_counter()
    try:
        if jobs == 1:
            for chapter in todo:
                done(chapter, make_chapter(chapter, root, partial_root / chapter.id))
        else:
            _make_in_workers(todo, root, partial_root, jobs, done)
    finally:
        bar.close()
    shutil.rmtree(partial_root, ignore_errors=True)
    _write_readme(root, corpus)
    if made:  # the real-time factors of docs/benchmarks.md: audio seconds per CPU second, per synthesiser
        logger.info("made %d chapters in %.1f s", len(todo), time.perf_counter() - started)
        for name, used in sorted(made.items()):
            logger.info(
                "  %s: %.3f h of audio, %.0f CPU s (%.0fx real time per core), %.0f s in workers (%.0fx per worker)",
                name, used["seconds"] / 3600, used["cpu"], used["seconds"] / max(used["cpu"], 1e-9),
                used["wall"], used["seconds"] / max(used["wall"], 1e-9),
            )
    return root


def _make_in_workers(todo: list[Chapter], root: Path, partial_root: Path, jobs: int, done) -> None:
    # spawn, not fork: the workers start from a clean interpreter, whatever threads this process runs
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        pending = {}
        queue = list(reversed(todo))
        try:
            while queue or pending:
                while queue and len(pending) < 2 * jobs:  # a few ahead, not the whole corpus in the pool's queue
                    chapter = queue.pop()
                    pending[pool.submit(make_chapter, chapter, root, partial_root / chapter.id)] = chapter
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    done(pending.pop(future), future.result())
        except BaseException:
            for future in pending:
                future.cancel()
            raise


def _write_speakers(root: Path, corpus: Plan) -> None:
    """``SPEAKERS.TXT`` as LibriSpeech's (id | subset | minutes | name), with the voice for the name."""
    minutes = Counter()
    for chapter in corpus.chapters:
        # planned minutes (the README gives the measured hours): known before any audio exists
        minutes[chapter.speaker.id] += sum(u.planned_seconds(chapter.speaker) for u in chapter.utterances) / 60
    # SPEAKERS.TXT and README.txt name this module by its path before issue 79 (now asr.synthesis.librispeech),
    # so that a corpus made today is the same bytes as one made before the move
    lines = [
        "; Speakers of this synthetic LibriSpeech-shaped corpus (asr.data.synth_librispeech)\n",
        "; MINUTES are planned from the words and the voice's rate; the audio differs a little\n",
        ";ID  |SUBSET           |MINUTES| VOICE\n",
    ]
    for speaker in corpus.speakers:
        lines.append(f"{speaker.id:<5}| {speaker.subset:<16}| {minutes[speaker.id]:6.2f}| {speaker.describe()}\n")
    (root / "SPEAKERS.TXT").write_text("".join(lines), encoding="utf-8")


def _write_readme(root: Path, corpus: Plan) -> None:
    options = corpus.options
    lines = [
        "Synthetic LibriSpeech-shaped speech corpus, made by lnasr:\n",
        f"    python -m asr.synth_librispeech OUT --hours {options.hours:g} --seed {options.seed}\n",
        # the module's path before issue 79, kept: the same bytes as a corpus made before the move (_write_speakers)
        "(the same command on the same packages gives the same bytes; see asr/data/synth_librispeech.py).\n\n",
        "Text (public domain; sentences joined into utterances, normalised to upper case A-Z and apostrophes,\n",
        "sentences with digits dropped):\n",
        *(f"  - {source}\n" for source in books.SOURCES),
        "Synthesisers: eSpeak NG (espeakng-loader, GPL-3.0), SVOX Pico (ttspico, Apache-2.0), "
        "Piper (piper-tts, GPL-3.0) with its joe voice (CC0 data).\n",
        f"Packages: {recorded_options(options)['packages']}\n\n",
        "Subsets (16 kHz 16-bit FLAC):\n",
    ]
    words_by_subset = {}
    for subset in SUBSETS:
        files = sorted((root / subset).rglob("*.flac"))
        seconds = sum(soundfile.info(str(f)).frames for f in files) / SAMPLE_RATE
        utterances = list(corpus.utterances(subset))
        words_by_subset[subset] = {w for u in utterances for w in u.words.split()}
        speakers = [s for s in corpus.speakers if s.subset == subset]
        by_synth = Counter(s.synthesiser for s in speakers)
        chapters = sum(c.subset == subset for c in corpus.chapters)
        lines.append(
            f"  {subset}: {len(utterances)} utterances, {seconds / 3600:.2f} hours, {len(speakers)} speakers "
            f"({', '.join(f'{n} {name}' for name, n in sorted(by_synth.items()))}), {chapters} chapters, "
            f"{sum(len(u.words.split()) for u in utterances)} words ({len(words_by_subset[subset])} distinct)\n"
        )
        read = sorted({c.book for c in corpus.chapters if c.subset == subset})
        lines.append(f"      read from {len(read)} of its {len(corpus.books[subset])} books: {', '.join(read)}\n")
    train = words_by_subset["train-clean-100"]
    for subset in SUBSETS[1:]:
        unseen = len(words_by_subset[subset] - train) / max(1, len(words_by_subset[subset]))
        lines.append(f"  {subset}: {100 * unseen:.1f}% of its distinct words are not in train-clean-100\n")
    lines += [
        "\nDev and test speakers use eSpeak NG voice variants never heard in training (and not each other's);\n",
        "each book is read by one subset only and no sentence occurs in two subsets.\n",
        "Speakers, their subsets, minutes and voices: SPEAKERS.TXT. Options: synth_options.json.\n",
    ]
    (root / "README.txt").write_text("".join(lines), encoding="utf-8")

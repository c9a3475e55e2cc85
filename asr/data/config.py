"""Data options (the ``data:`` section of a recipe)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from asr.config import check_range
from asr.data.padding import check_pad_frames_to
from asr.data.demo import DemoConfig
from asr.data.utterance import SPLITS


@dataclass
class DigitsConfig:
    """Connected-digit utterances built from the Free Spoken Digit Dataset (``data.fsdd``).

    Each utterance joins several takes of one speaker with short random gaps
    and is transcribed as words (``"THREE SEVEN ZERO"``). The sets are rebuilt
    from ``seed`` on every run, so they need no files of their own.

    Without ``held_out_speaker`` only the training split gets connected digits
    (validation comes from ``data.dev``). With it, the run is one fold of a
    leave-one-speaker-out evaluation:

    - train: the other speakers' takes in ``take_range``;
    - dev:   the other speakers' takes in ``dev_take_range`` (``data.dev`` is not
             read, since a shared dev set may contain the held-out speaker);
    - test:  the held-out speaker, every take (no take of theirs was trained on).
    """

    speakers: list[str] = field(default_factory=list)  # speakers to draw from; empty = every speaker found
    # inclusive range of take numbers; FSDD's own convention keeps takes 0-4 as its test split
    take_range: list[int] = field(default_factory=lambda: [5, 49])
    utterances: int = 2000            # how many training utterances to build
    digits_per_utterance: list[int] = field(default_factory=lambda: [1, 7])  # inclusive range of digits per utterance
    gap_seconds: list[float] = field(default_factory=lambda: [0.05, 0.3])  # pause between takes, uniform in range
    gap_noise: float = 0.001          # std of the Gaussian noise filling the pauses (full scale 1); 0 = digital silence
    seed: int = 0                     # the same seed builds the same utterances (speakers, takes and gaps)
    held_out_speaker: str = ""        # leave-one-speaker-out: test on this speaker, train and validate on the others
    dev_take_range: list[int] = field(default_factory=lambda: [0, 4])  # takes of the dev set (held_out_speaker only)
    dev_utterances: int = 200         # size of that dev set
    test_utterances: int = 400        # size of the held-out speaker's test set

    def __post_init__(self) -> None:
        check_range("take_range", self.take_range, minimum=0)
        check_range("dev_take_range", self.dev_take_range, minimum=0)
        check_range("digits_per_utterance", self.digits_per_utterance, minimum=1)
        check_range("gap_seconds", self.gap_seconds, minimum=0.0)
        if self.gap_noise < 0:
            raise ValueError(f"gap_noise must be >= 0, got {self.gap_noise}")
        for name in ("utterances", "dev_utterances", "test_utterances"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.held_out_speaker and self.held_out_speaker in self.speakers:
            raise ValueError(
                f"held_out_speaker {self.held_out_speaker!r} is also listed in speakers: "
                "a held-out speaker cannot be trained on"
            )


@dataclass
class DataConfig:
    """Which corpora to read, how to tokenise them and how to batch them.

    Each entry of ``train``/``dev``/``test`` is read in the form its path shows
    (:mod:`asr.data.sources`): a folder holding ``wav.scp`` and ``text`` is a Kaldi
    data directory; a ``*.jsonl``/``*.jsonl.gz`` file is a lhotse manifest; anything
    else is a subset folder in LibriSpeech layout (``<subset>/<speaker>/<chapter>/*.flac``
    with ``<speaker>-<chapter>.trans.txt``). Several entries of one split are
    concatenated. Relative paths (and ``fsdd``) are taken relative to ``root``.
    """

    root: str = ""                    # base folder for relative subset paths ("" = the working directory)
    train: list[str] = field(default_factory=list)  # e.g. [LibriSpeech/train-clean-100, LibriSpeech/train-clean-360]
    dev: list[str] = field(default_factory=list)    # validation, e.g. [LibriSpeech/dev-clean]
    test: list[str] = field(default_factory=list)   # e.g. [LibriSpeech/test-clean, LibriSpeech/test-other]
    fsdd: str = ""                    # FSDD recordings folder ({digit}_{speaker}_{take}.wav); "" = no connected digits
    digits: DigitsConfig = field(default_factory=DigitsConfig)  # how connected digits are built from data.fsdd
    demo: DemoConfig = field(default_factory=DemoConfig)  # the synthetic demo corpus to read (asr.data.demo; made by python -m asr.synth_demo)
    tokenizer: Literal["char", "bpe"] = "char"  # characters need no training; BPE shortens targets for attention
    bpe_vocab_size: int = 256         # upper bound: sentencepiece stops early when the transcripts are too few
    max_duration: float = 20.0        # seconds; longer utterances are skipped (memory grows with T for attention)
    min_duration: float = 0.1         # seconds; shorter ones give fewer encoder frames than targets after subsampling
    max_frames_per_batch: int = 20000  # padded feature frames per batch (batch size * longest utterance, padded)
    # Each batch's frames padded up to a multiple of this (1 = to the longest utterance), or to the first of a
    # list of increasing lengths (buckets) that holds the longest: fewer batch shapes an epoch, so what a GPU
    # prepares per shape (CUDA graphs, attention plans) is prepared once. The budget above counts the padding.
    pad_frames_to: int | list[int] = 1
    num_workers: int = 2              # DataLoader worker processes computing features
    strict: bool = False              # true: the first problem (unreadable file, unknown character, ...) is an error
    seed: int = 0                     # shuffling, dither and SpecAugment draws
    # where preparation keeps what it computed from the corpus (duration manifests, BPE models, global MVN
    # statistics), so that a new run on the same corpus starts in seconds; "" = $XDG_CACHE_HOME/lnasr or ~/.cache/lnasr
    cache_dir: str = ""
    # processes reading audio headers and accumulating global MVN statistics, and sentencepiece's threads
    # training BPE, when a run starts; 0 = one per CPU core available. The results do not depend on it.
    prepare_jobs: int = 0

    def __post_init__(self) -> None:
        if self.bpe_vocab_size < 8:
            raise ValueError(f"bpe_vocab_size must be at least 8, got {self.bpe_vocab_size}")
        if self.min_duration < 0 or self.max_duration <= self.min_duration:
            raise ValueError(
                f"need 0 <= min_duration < max_duration, got min_duration={self.min_duration}, "
                f"max_duration={self.max_duration}"
            )
        if self.max_frames_per_batch <= 0:
            raise ValueError(f"max_frames_per_batch must be positive, got {self.max_frames_per_batch}")
        check_pad_frames_to(self.pad_frames_to)
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.prepare_jobs < 0:
            raise ValueError(f"prepare_jobs must be >= 0 (0 = one per core), got {self.prepare_jobs}")

    def resolve(self, path: str | Path) -> Path:
        """``path`` relative to ``root`` (an absolute path stays as it is)."""
        return Path(self.root).expanduser() / Path(path).expanduser()

    def subset_paths(self, split: Literal["train", "dev", "test"]) -> list[Path]:
        """The subset folders of ``split``, relative paths resolved against ``root``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        return [self.resolve(p) for p in getattr(self, split)]

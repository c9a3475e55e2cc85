"""Data options (the ``data:`` section of a recipe)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass
class FSDDConfig:
    """A connected-digit training set built from Free Spoken Digit Dataset takes.

    Each utterance joins several takes of one speaker with short random gaps of
    silence and is transcribed as words (``"THREE SEVEN ZERO"``). The set is
    rebuilt from ``seed`` on every run, so it needs no files of its own.
    """

    recordings: str = ""              # folder of {digit}_{speaker}_{take}.wav (relative to data.root); "" = none
    speakers: list[str] = field(default_factory=list)  # speakers to draw from; empty = every speaker found
    # inclusive range of take numbers; FSDD's own convention keeps takes 0-4 as its test split
    take_range: list[int] = field(default_factory=lambda: [5, 49])
    utterances: int = 2000            # how many connected-digit utterances to build
    digits_per_utterance: list[int] = field(default_factory=lambda: [1, 7])  # inclusive range of digits per utterance
    gap_seconds: list[float] = field(default_factory=lambda: [0.05, 0.3])  # pause between takes, uniform in range
    gap_noise: float = 0.001          # std of the Gaussian noise filling the pauses (full scale 1); 0 = digital silence
    seed: int = 0                     # the same seed builds the same utterances (speakers, takes and gaps)

    def __post_init__(self) -> None:
        _check_range("take_range", self.take_range, minimum=0)
        _check_range("digits_per_utterance", self.digits_per_utterance, minimum=1)
        _check_range("gap_seconds", self.gap_seconds, minimum=0.0)
        if self.gap_noise < 0:
            raise ValueError(f"gap_noise must be >= 0, got {self.gap_noise}")
        if self.utterances < 0:
            raise ValueError(f"utterances must be >= 0, got {self.utterances}")


@dataclass
class DataConfig:
    """Which corpora to read, how to tokenise them and how to batch them.

    Subset folders are in LibriSpeech layout (``<subset>/<speaker>/<chapter>/*.flac``
    with ``<speaker>-<chapter>.trans.txt``); several subsets of one split are
    concatenated. Relative subset paths (and ``fsdd.recordings``) are taken
    relative to ``root``.
    """

    root: str = ""                    # base folder for relative subset paths ("" = the working directory)
    train: list[str] = field(default_factory=list)  # e.g. [LibriSpeech/train-clean-100, LibriSpeech/train-clean-360]
    valid: list[str] = field(default_factory=list)  # e.g. [LibriSpeech/dev-clean]
    test: list[str] = field(default_factory=list)   # e.g. [LibriSpeech/test-clean, LibriSpeech/test-other]
    fsdd: FSDDConfig = field(default_factory=FSDDConfig)  # connected digits added to the training split
    tokenizer: Literal["char", "bpe"] = "char"  # characters need no training; BPE shortens targets for attention
    bpe_vocab_size: int = 256         # upper bound: sentencepiece stops early when the transcripts are too few
    max_duration: float = 20.0        # seconds; longer utterances are skipped (memory grows with T for attention)
    min_duration: float = 0.1         # seconds; shorter ones give fewer encoder frames than targets after subsampling
    max_frames_per_batch: int = 20000  # padded feature frames per batch (batch size * longest utterance)
    num_workers: int = 2              # DataLoader worker processes computing features
    strict: bool = False              # true: the first problem (unreadable file, unknown character, ...) is an error
    seed: int = 0                     # shuffling, dither and SpecAugment draws
    cache_dir: str = ""               # manifests of read-only subsets; "" = $XDG_CACHE_HOME/lnasr or ~/.cache/lnasr

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
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")

    def resolve(self, path: str | Path) -> Path:
        """``path`` relative to ``root`` (an absolute path stays as it is)."""
        return Path(self.root).expanduser() / Path(path).expanduser()

    def subset_paths(self, split: Literal["train", "valid", "test"]) -> list[Path]:
        """The subset folders of ``split``, relative paths resolved against ``root``."""
        if split not in ("train", "valid", "test"):
            raise ValueError(f"split must be train, valid or test, got {split!r}")
        return [self.resolve(p) for p in getattr(self, split)]


def _check_range(name: str, value: list, minimum: float) -> None:
    if len(value) != 2 or value[0] > value[1] or value[0] < minimum:
        raise ValueError(f"{name} must be [low, high] with {minimum} <= low <= high, got {value}")

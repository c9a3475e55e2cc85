"""A recipe's ``data`` section turned into utterances and a tokenizer.

:func:`load_split` reads a split (its LibriSpeech-layout subsets and, for
training, the FSDD connected digits); :func:`build_tokenizer` trains the
tokenizer the recipe asks for on the training transcripts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from asr.data.config import DataConfig
from asr.data.fsdd import connected_digits
from asr.data.librispeech import read_librispeech
from asr.data.report import DataError, SkipReport
from asr.data.tokenizer import BPETokenizer, CharTokenizer, Tokenizer
from asr.data.utterance import Utterance


def load_split(
    config: DataConfig, split: Literal["train", "valid", "test"], report: SkipReport | None = None
) -> tuple[list[Utterance], SkipReport]:
    """All utterances of ``split`` as read (not yet filtered), and the reader's skips.

    A split that names no subsets (and, for training, no connected digits)
    gives no utterances; one whose every utterance is skipped is an error.

    The ``data.fsdd`` connected-digit set is added to the training split only.
    Pass the returned report on to :func:`asr.data.dataset.prepare_utterances`,
    which adds its own skips and logs the whole report once.
    """
    report = SkipReport(strict=config.strict) if report is None else report
    utterances = read_librispeech(config.subset_paths(split), report, config.cache_dir or None)
    if split == "train":
        utterances.extend(connected_digits(config.fsdd, report, root=config.root))
    if not utterances and (getattr(config, split) or (split == "train" and config.fsdd.recordings)):
        raise DataError(f"data.{split}: every utterance was skipped\n{report.summary()}")
    return utterances, report


def build_tokenizer(config: DataConfig, texts: Iterable[str]) -> Tokenizer:
    """The ``data.tokenizer`` kind (``char`` or ``bpe`` of ``data.bpe_vocab_size``) trained on ``texts``.

    Train it on the training transcripts only, so validation and test
    characters it has never seen show up as such in the skip report.
    """
    if config.tokenizer == "char":
        return CharTokenizer.train(texts)
    if config.tokenizer == "bpe":
        return BPETokenizer.train(texts, config.bpe_vocab_size)
    raise ValueError(f"data.tokenizer: unknown kind {config.tokenizer!r} (expected 'char' or 'bpe')")

"""A recipe's ``data`` section turned into utterances and a tokenizer.

:func:`load_split` reads a split (its LibriSpeech-layout subsets, the demo
corpus and its FSDD connected digits); :func:`build_tokenizer` trains the tokenizer the recipe
asks for on the training transcripts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Literal

from asr.data.config import DataConfig
from asr.data.demo import corpus_subsets
from asr.data.fsdd import connected_digits
from asr.data.librispeech import default_cache_dir
from asr.data.report import DataError, SkipReport
from asr.data.sources import read_sources
from asr.data.tokenizer import CharTokenizer, Tokenizer, cached_bpe
from asr.data.utterance import SPLITS, Utterance

logger = logging.getLogger(__name__)


def load_split(
    config: DataConfig, split: Literal["train", "dev", "test"], report: SkipReport | None = None
) -> tuple[list[Utterance], SkipReport]:
    """All utterances of ``split`` as read (not yet filtered), and the reader's skips.

    A split gathers its LibriSpeech-layout subsets (``data.train``, ``data.dev``,
    ``data.test``), its part of the demo corpus (``data.demo``, where ``data.demo.splits`` lists
    the split; prepared beforehand by ``python -m asr.synth_demo``, else
    :class:`asr.data.demo.DemoCorpusNotPrepared` says how) and its connected digits
    (:func:`asr.data.fsdd.connected_digits`). Nothing is synthesised here.
    In a leave-one-speaker-out fold (``data.digits.held_out_speaker``) the dev
    split is the built one alone: ``data.dev`` is not read, because a shared dev
    set may contain the held-out speaker. A split with no sources gives no
    utterances; a source that lists none (:func:`asr.data.sources.read_source`), or a split whose
    every utterance is skipped, is an error naming them.

    Pass the returned report on to :func:`asr.data.dataset.prepare_utterances`,
    which adds its own skips and logs the whole report once.
    """
    report = SkipReport(strict=config.strict) if report is None else report
    subsets = config.subset_paths(split)
    if split == "dev" and config.fsdd and config.digits.held_out_speaker:
        if subsets:
            logger.info(
                "data.digits.held_out_speaker=%s: validating on connected digits of the other speakers, not data.dev",
                config.digits.held_out_speaker,
            )
        subsets = []
    if config.demo.enabled and split in config.demo.splits:
        # prepared by python -m asr.synth_demo, read like any LibriSpeech-layout subset
        subsets = [*subsets, corpus_subsets(config.demo, config.cache_dir or default_cache_dir())[split]]
    utterances = read_sources(subsets, report, config.cache_dir or None, config.prepare_jobs)
    digits = connected_digits(config, split, report)
    utterances.extend(digits)
    if not utterances and subsets:
        named = ", ".join(str(subset) for subset in subsets)
        raise DataError(f"data.{split}: every utterance of {named} was skipped\n{report.summary()}")
    return utterances, report


def check_demo_prepared(config: DataConfig, command: str, splits: Iterable[str] = SPLITS) -> None:
    """Raise :class:`asr.data.demo.DemoCorpusNotPrepared` telling the user to run ``command``
    (:func:`asr.data.demo.prepare_command`) when one of ``splits`` reads a demo corpus that has
    not been prepared: entry points call this first, so the error names the exact command and
    comes before anything else is done."""
    if config.demo.enabled and set(splits) & set(config.demo.splits):
        corpus_subsets(config.demo, config.cache_dir or default_cache_dir(), command)


def build_tokenizer(config: DataConfig, texts: Iterable[str]) -> Tokenizer:
    """The ``data.tokenizer`` kind (``char`` or ``bpe`` of ``data.bpe_vocab_size``) trained on ``texts``.

    Train it on the training transcripts only, so validation and test
    characters it has never seen show up as such in the skip report.
    """
    if config.tokenizer == "char":
        return CharTokenizer.train(texts)
    if config.tokenizer == "bpe":
        return cached_bpe(texts, config.bpe_vocab_size, config.cache_dir or None, config.prepare_jobs)
    raise ValueError(f"data.tokenizer: unknown kind {config.tokenizer!r} (expected 'char' or 'bpe')")

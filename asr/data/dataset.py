"""Utterances -> (features, tokens) items, and the one-shot validation before training.

:func:`prepare_utterances` runs once, before training: it leaves out what
cannot or should not be trained on (too long or short, empty transcript,
characters the tokenizer cannot encode, repeated ids) and records each
omission in a :class:`~asr.data.report.SkipReport` naming the file, which it
logs summarised by reason. :class:`SpeechDataset` then featurises items
through :class:`features.pipeline.FeaturePipeline`, the same code path
``transcribe`` uses, so training and inference features cannot drift apart.

Audio whose header reads can still fail where its samples are read: a FLAC
cut in the middle, a float WAV holding NaN. Such an item is not an error that
stops a run: :class:`SpeechDataset` hands back a :class:`~asr.data.report.Skip`
in its place, :func:`~asr.data.batching.collate` leaves it out of the batch and
carries it in ``Batch.skipped``, and the trainer counts and logs it. With
``data.strict`` it is a :class:`DataError` naming the file instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

import features
from asr.data import report as reasons
from asr.data.cache import Entry, Fingerprint, cache_folder, load_entry, write_entry
from asr.data.config import DataConfig
from asr.data.parallel import map_chunks, processes_used
from asr.data.report import DataError, Skip, SkipReport
from asr.data.tokenizer import Tokenizer, UnknownCharactersError
from asr.data.utterance import InMemoryAudio, Utterance, read_audio
from features.audio import AudioError, NonFiniteAudioError
from features.config import FeatureConfig
from features.filterbank import num_frames
from features.mvn import GlobalStats
from features.pipeline import FeaturePipeline, PreparedAudio

logger = logging.getLogger(__name__)


def prepare_utterances(
    utterances: Sequence[Utterance],
    config: DataConfig,
    tokenizer: Tokenizer | None = None,
    report: SkipReport | None = None,
    limit_duration: bool = True,
    name: str = "data",
) -> tuple[list[Utterance], SkipReport]:
    """The utterances fit to train on, and the report of those left out.

    Left out, each with a message naming the file: a repeated utterance id; an
    empty transcript; duration outside ``[config.min_duration, config.max_duration]``
    (when ``limit_duration``; pass False for a test set, so that its score stays
    comparable with published ones); characters ``tokenizer`` cannot encode
    (skipped when ``tokenizer`` is None, e.g. before training it on these very
    transcripts). ``report`` (default: a new one with ``strict=config.strict``)
    may already hold the reader's skips; the whole report is logged as
    ``name`` when this returns. In strict mode the first problem raises
    :class:`DataError`.
    """
    report = SkipReport(strict=config.strict) if report is None else report
    kept: list[Utterance] = []
    seen: set[str] = set()
    for utt in utterances:
        where = f"{utt.source} (utterance {utt.id})"
        if utt.id in seen:
            report.skip(reasons.DUPLICATE_ID, f"{where}: utterance id used more than once")
            continue
        seen.add(utt.id)
        if not utt.text:
            report.skip(reasons.EMPTY_TRANSCRIPT, f"{where}: empty transcript")
            continue
        if limit_duration and utt.duration > config.max_duration:
            report.skip(reasons.TOO_LONG, f"{where}: {utt.duration:.2f} s > data.max_duration {config.max_duration} s")
            continue
        if limit_duration and utt.duration < config.min_duration:
            report.skip(reasons.TOO_SHORT, f"{where}: {utt.duration:.3f} s < data.min_duration {config.min_duration} s")
            continue
        if tokenizer is not None:
            unknown = tokenizer.unknown_characters(utt.text)
            if unknown:
                shown = " ".join(repr(c) for c in sorted(unknown))
                report.skip(reasons.UNKNOWN_CHARACTERS, f"{where}: characters the tokenizer does not know: {shown}")
                continue
        kept.append(utt)
    report.log(name)
    return kept, report


class SpeechDataset(Dataset):
    """Items ``{"id": str, "features": (T, D) float32, "tokens": (L,) long}`` for :func:`asr.data.batching.collate`,
    or ``{"id": str, "skip": Skip}`` for an utterance whose audio fails where it is read (module docstring).
    With ``compute_on="device"`` an item holds ``"audio"``, a :class:`~features.pipeline.PreparedAudio`
    (read, augmented, dithered, every random draw made), instead of ``"features"``: the features are then
    computed for the whole batch where the model is (:func:`asr.data.batching.with_features`), with the
    same draws from the same generator, so they equal the ``"loader"`` item's features.

    train: apply the pipeline's training-time augmentation (speed perturbation, rooms, noise,
           microphones, band limits, dither, VTLP, SpecAugment). Its randomness comes
           from a generator seeded by ``(seed, epoch, index)``, so an item is the
           same whichever DataLoader worker computes it and however many
           workers there are; call :meth:`set_epoch` before each
           epoch for fresh draws. With ``persistent_workers=True``
           the workers would keep the epoch they started with, so do not use it.
    warp:  a fixed VTLN factor for every item instead of VTLP's draw (speaker
           adaptation at the speaker's test-time warp, see :mod:`asr.adapt`).
    strict: raise :class:`DataError` naming the file instead of handing back a skip.
    compute_on: ``"loader"`` (features here, per item) or ``"device"`` (audio here, features later;
           ``features.compute_on`` resolved by :func:`features.config.resolve_compute_on`).
    """

    def __init__(
        self,
        utterances: Sequence[Utterance],
        pipeline: FeaturePipeline,
        tokenizer: Tokenizer,
        train: bool = False,
        seed: int = 0,
        warp: float | None = None,
        strict: bool = False,
        compute_on: str = "loader",
    ):
        if compute_on not in ("loader", "device"):
            raise ValueError(f"SpeechDataset: compute_on must be 'loader' or 'device', got {compute_on!r}")
        self.compute_on = compute_on
        self.utterances = list(utterances)
        self.pipeline = pipeline
        self.tokenizer = tokenizer
        self.train = train
        self.seed = seed
        self.warp = warp
        self.strict = strict
        self.epoch = 0
        if train:
            # here, in the main process, so that every DataLoader worker inherits the room bank
            pipeline.prepare_training()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.utterances)

    def generator(self, index: int) -> torch.Generator:
        """The generator for item ``index`` in the current epoch (a function of seed, epoch and index only)."""
        # SeedSequence mixes the three numbers into well-separated seeds: neighbouring
        # (epoch, index) pairs must not give correlated streams.
        entropy = [self.seed % 2**64, self.epoch, index]
        state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
        return torch.Generator().manual_seed(int(state))

    def __getitem__(self, index: int) -> dict:
        """Item ``index``; an index planned by the trainer (:class:`asr.training.plan.PlannedIndex`) also
        says how likely SpecAugment is to mask it at the update it serves."""
        utt = self.utterances[index]
        generator = self.generator(index) if self.train else None
        spec_augment = getattr(index, "spec_augment", 1.0)
        try:
            if self.compute_on == "device":
                content = {"audio": utterance_audio(utt, self.pipeline, self.train, generator, self.warp, spec_augment)}
            else:
                features = utterance_features(utt, self.pipeline, train=self.train, generator=generator, warp=self.warp,
                                              spec_augment=spec_augment)
                content = {"features": features}
        except AudioError as err:
            skip = audio_skip(err)
            if self.strict:
                SkipReport(strict=True).add(skip)
            return {"id": utt.id, "skip": skip}
        try:
            tokens = self.tokenizer.encode(utt.text)
        except UnknownCharactersError as err:
            raise DataError(f"utterance {utt.id} ({utt.source}): {err}") from err
        return {"id": utt.id, **content, "tokens": torch.tensor(tokens, dtype=torch.long)}

    def num_frames(self) -> list[int]:
        """Feature frames of each item, from its duration (for batching; no audio is read)."""
        config = self.pipeline.config
        return [num_frames(round(utt.duration * config.sample_rate), config) for utt in self.utterances]


def load_utterance_audio(utt: Utterance, truncated: str = "warn") -> tuple[torch.Tensor, int]:
    """``(waveform (C, N), sample_rate)`` of a file, segment or in-memory utterance (:func:`asr.data.utterance.read_audio`).

    Raises :class:`~features.audio.AudioError` (of the same kind as the cause)
    whose message names the file and the utterance. ``truncated``: what a WAV file cut short gets
    (:func:`features.audio.load_audio`).
    """
    try:
        return read_audio(utt.audio, truncated)
    except AudioError as err:
        raise type(err)(_naming(utt, err)) from err


def utterance_features(
    utt: Utterance,
    pipeline: FeaturePipeline,
    train: bool = False,
    generator: torch.Generator | None = None,
    warp: float | None = None,
    raw: bool = False,
    spec_augment: float = 1.0,
) -> torch.Tensor:
    """Features ``(T, D)`` of one utterance (``raw``: before MVN and SpecAugment, for statistics).

    Any :class:`~features.audio.AudioError` names the file and the utterance;
    features that come out NaN or infinite are a
    :class:`~features.audio.NonFiniteAudioError`. A WAV file cut short is a
    :class:`~features.audio.TruncatedAudioError` in training and statistics (``train``, ``raw``): its
    transcript would describe audio that is gone; elsewhere (validation, evaluation, transcription) it
    is decoded from what is there, with a warning naming it.
    """
    waveform, sample_rate = load_utterance_audio(utt, "refuse" if train or raw else "warn")
    try:
        if raw:
            features = pipeline.raw_features(waveform, sample_rate)
        else:
            features = pipeline.from_waveform(waveform, sample_rate, train=train, generator=generator, warp=warp,
                                              spec_augment=spec_augment)
    except AudioError as err:
        raise type(err)(_naming(utt, err)) from err
    if not bool(torch.isfinite(features).all()):
        raise NonFiniteAudioError(_naming(utt, "the features hold NaN or infinite values"))
    return features


def utterance_audio(
    utt: Utterance,
    pipeline: FeaturePipeline,
    train: bool = False,
    generator: torch.Generator | None = None,
    warp: float | None = None,
    spec_augment: float = 1.0,
) -> PreparedAudio:
    """The first stage of :func:`utterance_features` (:meth:`FeaturePipeline.prepare`): the utterance's
    samples and random draws, for features computed later, batched, on the model's device.

    Errors as in :func:`utterance_features`, except that features that would come out non-finite are
    not detected here (samples that are not finite are): the training step's finite-loss check skips them.
    """
    waveform, sample_rate = load_utterance_audio(utt, "refuse" if train else "warn")
    try:
        return pipeline.prepare(waveform, sample_rate, train=train, generator=generator, warp=warp,
                                spec_augment=spec_augment)
    except AudioError as err:
        raise type(err)(_naming(utt, err)) from err


def audio_skip(err: AudioError) -> Skip:
    """The skip-report entry for audio that failed where it was read (the message names the file)."""
    return Skip(err.reason, str(err))


def _naming(utt: Utterance, err: Exception | str) -> str:
    """``err``'s message naming ``utt``'s file (once) and id."""
    text = str(err)
    if utt.source in text:
        return f"{text} (utterance {utt.id})"
    return f"{utt.source} (utterance {utt.id}): {text}"


_UTTERANCES_PER_CHUNK = 16  # MVN work per task handed to a process: ~200 s of audio, a fraction of a second


def _accumulate(pipeline: FeaturePipeline, utterances: list[Utterance]) -> tuple[GlobalStats, list[Skip]]:
    """Statistics of the raw features of ``utterances``, and a Skip for each whose audio fails (a worker's task)."""
    stats = GlobalStats(pipeline.feature_dim)
    skips = []
    for utt in utterances:
        try:
            stats.update(utterance_features(utt, pipeline, raw=True))
        except AudioError as err:
            skips.append(audio_skip(err))
    return stats, skips


def compute_global_stats(
    utterances: Sequence[Utterance],
    pipeline: FeaturePipeline,
    jobs: int = 1,
    report: SkipReport | None = None,
) -> GlobalStats:
    """Accumulate global MVN statistics over ``utterances`` (no dither) and set them on ``pipeline``.

    The same raw features the pipeline normalises, so the statistics match
    training and inference exactly. ``jobs`` processes share the work (1 =
    this process, 0 = one per core), each summing fixed chunks of
    utterances; the chunk sums are added in order, so the result is the same
    to the last bit for any ``jobs`` (and equal to a sum utterance by
    utterance within float64 rounding). An utterance whose audio fails to
    decode or holds NaN or infinite samples adds nothing: it is recorded in
    ``report`` (a :class:`DataError` in strict mode, at the first one), so
    no non-finite frame ever reaches the statistics.
    """
    report = SkipReport() if report is None else report
    stats = GlobalStats(pipeline.feature_dim)
    chunks = map_chunks(
        partial(_accumulate, pipeline), utterances, jobs, _UTTERANCES_PER_CHUNK,
        desc="global MVN statistics", unit="utt",
    )
    for part, skips in chunks:
        for skip in skips:
            report.add(skip)
        stats.count += part.count
        stats.sum += part.sum
        stats.sum_squares += part.sum_squares
    if stats.count == 0:
        raise DataError(f"global MVN statistics: no utterance could be read\n{report.summary()}")
    pipeline.stats = stats
    return stats


# Feature options that leave the raw features (what the statistics are computed on) as they are:
# training-time randomness, the normalisation itself, and where training computes its features
# (``compute_on``, where that option exists). Every other option is part of the cache key, so
# an option added later invalidates cached statistics until it is listed here.
_NOT_IN_RAW_FEATURES = frozenset(
    {"dither", "dither_inference", "speed_perturb", "vtlp", "mvn", "spec_augment", "augment", "compute_on"}
)


def global_stats_path(
    utterances: Sequence[Utterance], config: FeatureConfig, cache_dir: str | Path | None = None
) -> Path:
    """Where :func:`cached_global_stats` keeps the statistics of ``utterances`` under ``config``
    (named by the fingerprint of :func:`global_stats_key`)."""
    return _stats_entry_path(global_stats_key(utterances, config), cache_dir)


def _stats_entry_path(key: dict, cache_dir: str | Path | None) -> Path:
    return cache_folder(cache_dir, "mvn") / f"{key['fingerprint'][:32]}.pt"


def global_stats_key(utterances: Sequence[Utterance], config: FeatureConfig) -> dict:
    """The key the statistics of ``utterances`` under ``config`` are kept and checked under.

    ``fingerprint`` is a SHA-256 over:

    - each utterance in order: its id, its file's absolute path, size and
      mtime in nanoseconds (and the span, for a segment of a file; for audio
      held in memory, the samples themselves).
      Size and mtime stand for the content for the reason the duration
      manifest gives (:class:`asr.data.librispeech.DurationManifest`): every
      rewrite of a file changes its mtime; hashing 6 GB of audio on each
      start would cost the minutes the cache saves, where a stat per file
      costs milliseconds per thousand files;
    - the feature options that change raw features (all but
      :data:`_NOT_IN_RAW_FEATURES`);
    - the source of the ``features`` package and the torch version, so a
      new feature implementation never meets statistics of the old one.

    The feature dimension and the number of utterances are in the key in plain
    words too, so that a refused entry says what it was made for.
    """
    fingerprint = Fingerprint("global mvn v1").add(torch.__version__)
    options = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_IN_RAW_FEATURES}
    fingerprint.add(json.dumps(options, sort_keys=True))
    for source in sorted(Path(features.__file__).parent.glob("*.py")):
        fingerprint.add(source.name, source.read_bytes())
    for utt in utterances:
        fingerprint.add(utt.id)
        if isinstance(utt.audio, InMemoryAudio):
            samples = utt.audio.waveform.detach().to("cpu", torch.float32).contiguous().numpy()
            fingerprint.add("in memory", utt.audio.sample_rate, hashlib.blake2b(samples.tobytes()).digest())
            continue
        # A file, or a span of one (a Kaldi segment, a lhotse supervision), which names its file in
        # ``path``; the repr of such a frozen dataclass carries the span and the channel exactly.
        path = getattr(utt.audio, "path", utt.audio)
        fingerprint.add(repr(utt.audio), os.path.abspath(path))
        try:
            st = os.stat(path)
            fingerprint.add(st.st_size, st.st_mtime_ns)
        except OSError as err:  # reported as a skip when the statistics are computed; keyed as it is now
            fingerprint.add("cannot stat", err.errno)
    return {"feature_dim": config.feature_dim, "utterances": len(utterances), "fingerprint": fingerprint.hexdigest(64)}


def cached_global_stats(
    utterances: Sequence[Utterance],
    pipeline: FeaturePipeline,
    jobs: int = 1,
    report: SkipReport | None = None,
    cache_dir: str | Path | None = None,
) -> GlobalStats:
    """:func:`compute_global_stats`, or the statistics it computed before for the same utterance files
    and feature options (see :func:`global_stats_key`), set on ``pipeline`` either way.

    The cache entry keeps the skips found while computing, and they go into
    ``report`` again, so the log says the same whether or not the statistics
    were computed. Its content is read with ``torch.load(weights_only=True)``,
    and it is used only when it verifies (:mod:`asr.data.cache`: its checksum
    and its key) and holds statistics of this feature dimension that can be
    right (:meth:`GlobalStats.check`: frames, finite sums, no negative
    variance); any other is ignored with one warning and computed again.
    """
    report = SkipReport() if report is None else report
    key = global_stats_key(utterances, pipeline.config)
    path = _stats_entry_path(key, cache_dir)
    cached = load_entry(
        path, "mvn", key, lambda entry: _parse_stats_entry(entry, pipeline.feature_dim), "MVN statistics",
        "computing them again",
    )
    if cached is not None:
        stats, skips = cached
        logger.info("global MVN statistics of these %d utterances from %s", len(utterances), path)
        for skip in skips:
            report.add(skip)
        pipeline.stats = stats
        return stats
    processes = processes_used(jobs, len(utterances), _UTTERANCES_PER_CHUNK)
    logger.info("accumulating global MVN statistics over %d utterances in %d process(es)", len(utterances), processes)
    start = time.perf_counter()
    before = len(report)
    stats = compute_global_stats(utterances, pipeline, jobs, report)
    elapsed = time.perf_counter() - start
    entry = {"stats": stats.state_dict(), "skips": [[s.reason, s.message] for s in report.skips[before:]]}
    content = io.BytesIO()
    torch.save(entry, content)
    write_entry(path, "mvn", key, content.getvalue(), "MVN statistics")
    logger.info(
        "global MVN statistics: %d utterances (%.1f h) in %.1f s, %.0f utterances/s; kept in %s",
        len(utterances), sum(u.duration for u in utterances) / 3600, elapsed, len(utterances) / max(elapsed, 1e-9), path,
    )
    return stats


def _parse_stats_entry(entry: Entry, dim: int) -> tuple[GlobalStats, list[Skip]]:
    """The statistics and skips of a verified cache entry; ValueError naming what is wrong with them."""
    try:
        content = torch.load(io.BytesIO(entry.content), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several unrelated types for a damaged file
        raise ValueError(f"cannot read it: {err}") from err
    if not isinstance(content, dict) or not {"stats", "skips"} <= set(content):
        raise ValueError("not a statistics entry")
    stats = GlobalStats.from_state_dict(content["stats"])
    if stats.dim != dim:
        raise ValueError(f"statistics of dimension {stats.dim}, expected dimension {dim}")
    stats.check()
    skips = content["skips"]
    if not isinstance(skips, list) or not all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s) for s in skips
    ):
        raise ValueError("its list of skipped utterances is malformed")
    return stats, [Skip(reason, message) for reason, message in skips]

"""A recipe's data made ready to train on: the tokenizer, the feature pipeline, and the batched datasets."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.utils.data import DataLoader

from asr.data.batching import BucketBatchSampler, collate_padded
from asr.data.config import DataConfig
from asr.data.corpus import build_tokenizer, load_split
from asr.data.dataset import SpeechDataset, cached_global_stats, prepare_utterances
from asr.data.report import DataError, SkipReport
from asr.data.tokenizer import Tokenizer, tokenizer_from_state_dict
from asr.training.config import TrainConfig
from asr.training.signals import ignore_stop_signals
from features.config import FeatureConfig, resolve_compute_on
from features.pipeline import FeaturePipeline

logger = logging.getLogger("asr.train")


class Recipe(Protocol):
    """What of a recipe its training data is read with (an :class:`asr.experiment.ExperimentConfig`)."""

    data: DataConfig
    features: FeatureConfig
    train: TrainConfig


@dataclass
class TrainingData:
    tokenizer: Tokenizer
    pipeline: FeaturePipeline
    train_set: SpeechDataset
    valid_set: SpeechDataset
    sampler: BucketBatchSampler      # the training batches of each epoch (this rank's share)
    valid_batches: list[list[int]]   # the validation batches, shortest first


def build_training_data(
    config: Recipe, resume_state: dict | None, world_size: int = 1, rank: int = 0
) -> TrainingData:
    """Read, filter and batch the training and dev splits of ``config``.

    A new run trains the tokenizer on the training transcripts and, for global
    MVN, accumulates the statistics; a resumed run takes both from its
    checkpoint, since they are part of the run. The durations, a BPE model and
    the statistics are kept in ``data.cache_dir`` under keys made from the
    corpus' files and transcripts and the options they depend on, so a new
    run on an unchanged corpus loads them; what is computed is computed in
    ``data.prepare_jobs`` processes.
    """
    data_cfg = config.data
    start = time.perf_counter()
    train_utts, train_report = load_split(data_cfg, "train")
    if resume_state is not None:
        tokenizer = tokenizer_from_state_dict(resume_state["tokenizer"])
        pipeline = FeaturePipeline.from_state_dict(resume_state["features"])
    else:
        tokenizer = build_tokenizer(data_cfg, [u.text for u in train_utts if u.text])
    train_utts, _ = prepare_utterances(train_utts, data_cfg, tokenizer, train_report, name="train")
    if not train_utts:
        raise DataError(f"no usable training utterances (data.train={data_cfg.train}, data.fsdd={data_cfg.fsdd!r})")
    if resume_state is None:
        pipeline = FeaturePipeline(config.features)
        if config.features.mvn == "global":
            stats_report = SkipReport(strict=data_cfg.strict)
            cached_global_stats(train_utts, pipeline, data_cfg.prepare_jobs, stats_report, data_cfg.cache_dir or None)
            stats_report.log("global MVN statistics")
    valid_utts, valid_report = load_split(data_cfg, "dev")
    valid_utts, _ = prepare_utterances(valid_utts, data_cfg, tokenizer, valid_report, limit_duration=False, name="dev")
    # The builder (asr.run) resolves features.compute_on for its device before this; a caller that has not
    # (a tool, a test) gets the loader path for "auto", as on a CPU.
    compute_on = resolve_compute_on(config.features.compute_on, "cpu")
    common = dict(seed=data_cfg.seed, strict=data_cfg.strict, compute_on=compute_on)
    train_set = SpeechDataset(train_utts, pipeline, tokenizer, train=True, **common)
    valid_set = SpeechDataset(valid_utts, pipeline, tokenizer, train=False, **common)
    sampler = BucketBatchSampler(
        train_set.num_frames(), data_cfg.max_frames_per_batch, shuffle=True, seed=data_cfg.seed,
        num_replicas=world_size, rank=rank, shortest_first_epochs=config.train.curriculum_epochs,
        pad_frames_to=data_cfg.pad_frames_to,
    )
    valid_batches = list(BucketBatchSampler(valid_set.num_frames(), data_cfg.max_frames_per_batch, shuffle=False,
                                            pad_frames_to=data_cfg.pad_frames_to))
    logger.info(
        "train: %d utterances, dev: %d utterances (data prepared in %.1f s)",
        len(train_utts), len(valid_utts), time.perf_counter() - start,
    )
    return TrainingData(tokenizer, pipeline, train_set, valid_set, sampler, valid_batches)


def make_loader(batches, dataset: SpeechDataset, workers: int, seed: int, pin_memory: bool,
                pad_frames_to: int | list[int] = 1) -> DataLoader:
    """A DataLoader over fixed ``batches`` of ``dataset``, their frames padded as ``data.pad_frames_to`` says.

    A private generator: creating the iterator must not draw from the global RNG,
    or a resumed run's dropout masks would differ from the uninterrupted run's.
    """
    return DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate_padded(pad_frames_to),
        num_workers=workers,
        persistent_workers=False,
        generator=torch.Generator().manual_seed(seed),
        pin_memory=pin_memory,
        worker_init_fn=ignore_stop_signals,  # the main process stops the run (asr.training.signals)
    )

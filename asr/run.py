"""A training run built from its recipe, above the loop that runs it.

:func:`build_trainer` turns an :class:`~asr.experiment.ExperimentConfig` into what the loop
(:class:`asr.training.trainer.Trainer`) needs and hands it over: the device and process group, the data
(tokenizer, feature pipeline, batches), the model, the optimiser, the schedules, and for a resumed run
the checkpoint's state put back. The loop imports nothing from here or from :mod:`asr.experiment`; what
it reads of the recipe is the ``train:`` section (:class:`~asr.training.config.TrainConfig`) and the
pieces built here.

It runs, in this order: a refused run (a folder that holds a run without ``--resume``, nothing to resume
from with it) is refused before anything is written; ``features.compute_on: auto`` is resolved for the
device (on a copy of the recipe: the caller's config is left as it was), so the run records where its
features were computed; a resumed run's checkpoint is read and its settings compared with these (a refused
resume leaves ``train.log`` and ``config.yaml`` as they were); ``train.log`` opens; the data is prepared
and the model built; ``config.yaml`` is written, once, with the settings, the history of resumes and the
runtime record of which code computes the model (:class:`asr.training.reporting.RunRecord`; nothing
writes it after, and what ran goes into ``train.log`` when the run ends).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Callable

import torch

from asr.data.batching import batch_shapes
from asr.experiment import ExperimentConfig, as_recipe, experiment_config_to_dict
from asr.models import runtime
from asr.models.registry import build_model
from asr.training.clipping import ClippingWatch
from asr.training.data import build_training_data, make_loader
from asr.training.distributed import all_max, device_kind, init_distributed, resolve_device
from asr.training.errors import TrainingError
from asr.training.metrics import higher_is_better
from asr.training.hooks import Hook
from asr.training.reporting import Reporting, RunLog, RunRecord, held_records, setup_logging
from asr.training.resume import read_resume_state, refusal, remove_stale_checkpoint_writes, restore, settings_record
from asr.training.schedules import ScheduleSet, WatchedSchedules, run_schedules
from asr.training.state import Progress, seed_everything
from asr.training.timing import RunClock
from asr.training.trainer import RunParts, Trainer
from features.config import resolve_compute_on

logger = logging.getLogger("asr.train")


def build_trainer(config: ExperimentConfig, resume: bool = False, overrides: list[str] | None = None,
                  command: str | None = None, verbose: bool = False, hooks: list[Hook] | None = None) -> Trainer:
    """The run of ``config`` (overrides applied), ready for :meth:`Trainer.fit`. ``overrides``
    (``key.sub=value``) and ``command`` are what the run was started with, recorded in ``train.log`` and
    TensorBoard. ``verbose`` logs every entry of the runtime record (which code computes the model), not
    only its one-line summary. ``hooks`` (:mod:`asr.training.hooks`) are called after the run's own
    (the runtime record's, then ``train.log`` and TensorBoard)."""
    train = config.train
    dist = init_distributed(device_kind(train.device))
    device = resolve_device(train.device, dist.local_rank)
    exp_dir = Path(config.exp_dir)
    refused = refusal(exp_dir, resume)
    if refused:  # before anything is written: a refused run leaves the folder as it found it
        raise TrainingError(refused)
    command = command or "python -m asr.train (called from Python)"
    overrides = list(overrides or [])
    # resolved before config.yaml is written, so the run records where its features were computed
    chosen = config.features.compute_on
    features = dataclasses.replace(config.features, compute_on=resolve_compute_on(chosen, device.type))
    config = dataclasses.replace(config, features=features)
    resolved = experiment_config_to_dict(config)
    # A resumed run's checkpoint is read and its settings compared with these before anything is written:
    # a refused resume leaves train.log and config.yaml as they were (its messages wait for train.log).
    with held_records(logger) as held:
        resume_state = read_resume_state(exp_dir) if resume else None
        settings = settings_record(resolved, resume_state, exp_dir, command, as_recipe)
    exp_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(exp_dir / "train.log" if dist.is_main else None)
    logger.info("command line: %s", command)
    logger.info("overrides: %s", " ".join(overrides) or "none")
    logger.info("features computed on the %s (features.compute_on=%s, training on %s)",
                features.compute_on, chosen, device)
    held.release()
    if dist.is_main:
        remove_stale_checkpoint_writes(exp_dir)
    seed_everything(train.seed)
    data = build_training_data(config, resume_state, dist.world_size, dist.rank)
    raw_model = build_model(config.model, data.pipeline.feature_dim, data.tokenizer).to(device)
    if hasattr(raw_model, "batch_shapes"):  # model.sdpa_backend's auto: are an epoch's shapes few? (asr.models.sdpa)
        raw_model.batch_shapes = len(set(batch_shapes(data.sampler.batches(), data.train_set.num_frames(),
                                                      config.data.pad_frames_to)))
    # which code computes the model here (LN-LSTM backends, C++ build flags, CUDA graphs): recorded with the run
    record = RunRecord(exp_dir / "config.yaml", settings, runtime.describe(raw_model, device), device,
                       main=dist.is_main, verbose=verbose)
    if verbose:
        runtime.log(logger, record.runtime)
    else:  # one line: the whole record is in config.yaml
        logger.info("%s", runtime.summary(record.runtime, f"{exp_dir / 'config.yaml'}, runtime; --verbose"))
    record.write()
    model = raw_model
    if dist.enabled:
        model = torch.nn.parallel.DistributedDataParallel(
            raw_model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = build_optimizer(raw_model, train)
    agree = (lambda seconds: all_max(seconds, device)) if dist.enabled else None
    clock = RunClock(train.max_steps, train.max_minutes, agree)
    schedules = build_run_schedules(config, raw_model, optimizer, len(data.sampler), minutes=clock.minutes)
    logger.info(
        "model: %s, %.2fM parameters; features: %d-dim; vocabulary: %d",
        config.model.type, sum(p.numel() for p in raw_model.parameters()) / 1e6,
        data.pipeline.feature_dim, data.tokenizer.vocab_size,
    )
    progress = Progress()
    if resume_state is not None:
        progress = restore(resume_state, raw_model, optimizer, schedules, exp_dir)
    log = RunLog(exp_dir, train.log_every_steps, dist.is_main, train.max_steps)
    log.settings(resolved, overrides, command)

    def loader(batches, dataset, epoch: int):
        return make_loader(batches, dataset, config.data.num_workers, config.data.seed + epoch,
                           pin_memory=device.type == "cuda", pad_frames_to=config.data.pad_frames_to)

    return Trainer(RunParts(
        train=train, exp_dir=exp_dir, config=resolved, data=data, raw_model=raw_model, model=model,
        optimizer=optimizer, schedules=schedules, device=device, dist=dist, loader=loader, clock=clock,
        progress=progress, dev=config.data.dev, hooks=[record, Reporting(log, train.best_metric), WatchedSchedules(),
               ClippingWatch(train.grad_clip, dist.is_main), *(hooks or [])],
    ))


def build_run_schedules(config: ExperimentConfig, model: torch.nn.Module, optimizer, batches_per_epoch: int,
                        minutes: Callable[[], float] | None = None) -> ScheduleSet:
    """The run's schedules (:func:`asr.training.schedules.run_schedules`): the learning rate, each of
    ``train.schedules`` and the model's own (the Transformer's DropHead). ``minutes()``: the run's clock
    (minutes of training and validation so far), for a learning-rate cooldown that ``train.max_minutes`` ends."""
    cfg = config.train
    return run_schedules(cfg, model, optimizer, planned_updates(cfg, batches_per_epoch),
                         d_model=config.model.schedule_dim, higher_is_better=higher_is_better, minutes=minutes)


def planned_updates(cfg, batches_per_epoch: int) -> int:
    """Optimizer steps the run is planned to take: ``max_epochs`` epochs (each ends with its partial
    accumulation applied), or ``max_steps`` when that comes first. Early stopping may end it sooner."""
    total = cfg.max_epochs * math.ceil(batches_per_epoch / cfg.accum_grad)
    return total if cfg.max_steps is None else min(total, cfg.max_steps)


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return kind(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)

"""The training loop: epochs of :class:`~asr.training.step.TrainingStep`, validation, checkpoints, and the
events that hooks answer.

The run is built above the loop (:func:`asr.run.build_trainer` turns the recipe into data, model, optimiser
and schedules, and a resumed run's state put back) and handed over as :class:`RunParts`; this module
imports nothing above :mod:`asr.training`. What the loop consults lives beside it, one concern to a module:

- :mod:`asr.training.schedules`: everything that moves over the updates (learning rate, CTC weight,
  label smoothing, scheduled sampling, the attention prior, SpecAugment, the length cap), asked once
  per update and saved with the run;
- :mod:`asr.training.plan`: an epoch's batches, planned with the data schedules when it starts;
- :mod:`asr.training.skips`: a step that did not reach the weights, by its reason;
- :mod:`asr.training.timing`: the run's clock, and the limits (``train.max_steps``, ``train.max_minutes``);
- :mod:`asr.training.validation` and :mod:`asr.training.metrics`: the validation and its metrics, each
  of which says whether higher is better;
- :mod:`asr.training.epoch_end`: ranking an epoch, early stopping, its checkpoints;
- :mod:`asr.training.hooks`: the events (update, validation, epoch end, run end) that whatever watches or
  steers the run answers; ``train.log`` and TensorBoard (:mod:`asr.training.reporting`) and the runtime
  record (what ran, logged when the run ends) are hooks too;
- :mod:`asr.training.resume`: finding what to resume from, and putting it back.

The experiment directory (``exp_dir``) receives the resolved ``config.yaml`` (written once, when the run is
built: :func:`asr.run.build_trainer`), ``train.log``,
TensorBoard event files (:mod:`asr.training.reporting` lists what is in them), ``last.pt`` (everything
needed to resume), ``epoch{E}.pt`` for the last ``train.keep_last`` epochs (these can be resumed from
too, should ``last.pt`` be unreadable or missing) and the best ``train.keep_best`` epochs as
``best_epoch{E}.pt`` (weights only). Epochs are numbered from 1, in those names as in ``train.log``
and TensorBoard (``epoch1.pt`` is written after the first). Every checkpoint carries the config, tokenizer and feature
pipeline, so any of them can be used for inference. ``asr.train`` holds ``train.lock`` while it runs
(:mod:`asr.training.runlock`).

``last.pt`` is written when an epoch's batches are done, before its validation, so a validation that
fails loses no training: ``--resume`` validates that epoch again. A run that ``train.max_steps`` or
``train.max_minutes`` stops inside an epoch is validated there too, at its last step (logged, not ranked: the epoch is not done),
so its curves end where it did. The run ends with a summary (:func:`asr.training.reporting.end_summary`).
A run refused (:func:`asr.training.resume.refusal`) writes nothing into its folder, nor does a resume whose
settings differ from its checkpoint's where they may not (:mod:`asr.training.resume`). A run started or resumed
removes the temporary files of checkpoint writes that a killed run left, logging each. A stop signal ends the
loop at the next step boundary with ``last.pt`` written (:mod:`asr.training.signals`); a batch that runs out of
CUDA memory is skipped like a non-finite one, logged with its size and counted with the epoch's
skipped utterances.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from asr.checkpoints.io import save_checkpoint
from asr.decoding import DecodingOptions
from asr.training.config import TrainConfig
from asr.training.data import TrainingData
from asr.training.distributed import Distributed, all_agree
from asr.training.epoch_end import EpochEnd
from asr.training.errors import TrainingError
from asr.training.hooks import EpochDone, Hook, RunEnd, Update, Validated
from asr.training.plan import plan_epoch
from asr.training.schedules import ScheduleSet
from asr.training.signals import StopSignals, TrainingStopped
from asr.training.skips import SkipPolicy
from asr.training.state import Progress, rng_state, set_rng_state
from asr.training.step import TrainingStep
from asr.training.timing import LoaderClock, RunClock
from asr.training.validation import Validation, validate, validation_options

logger = logging.getLogger("asr.train")

__all__ = ["RunParts", "Trainer", "TrainingError", "training_lengths"]


@dataclass
class RunParts:
    """What the builder (:func:`asr.run.build_trainer`) hands the loop: everything composed from the recipe."""

    train: TrainConfig           # the recipe's train: section
    exp_dir: Path
    config: dict                 # the resolved recipe as plain data, which every checkpoint carries
    data: TrainingData
    raw_model: torch.nn.Module
    model: torch.nn.Module       # what trains: raw_model, or DistributedDataParallel around it
    optimizer: torch.optim.Optimizer
    schedules: ScheduleSet
    device: torch.device
    dist: Distributed
    loader: Callable             # (batches, dataset, epoch) -> the batches' DataLoader
    clock: RunClock
    progress: Progress           # where the run is: a new run's, or a resumed one's as its checkpoint left it
    dev: list                    # data.dev, named when no dev utterance can be read
    hooks: list[Hook] = field(default_factory=list)  # called in this order at each event (asr.training.hooks)


class Trainer:
    """Runs the loop over what the builder made (:class:`RunParts`) and calls its hooks; one instance per process."""

    def __init__(self, parts: RunParts):
        self.parts = parts
        self.train_cfg, self.exp_dir, self.data, self.dist = parts.train, parts.exp_dir, parts.data, parts.dist
        self.raw_model, self.model, self.device = parts.raw_model, parts.model, parts.device
        self.optimizer, self.schedules, self.clock = parts.optimizer, parts.schedules, parts.clock
        self.tokenizer, self.pipeline = parts.data.tokenizer, parts.data.pipeline
        self.progress, self.hooks = parts.progress, parts.hooks
        self._planned = 0  # batches planned for the epoch in progress
        self.stop_signals = StopSignals()  # installed while fit() runs
        cfg = self.train_cfg
        # No scheduler here: the schedules set the learning rate before each update.
        self.step = TrainingStep(self.model, self.optimizer, None, cfg.grad_clip, use_amp=cfg.amp and self.device.type == "cuda",
                                 distributed=self.dist.enabled, pipeline=self.pipeline)
        self.durations = [u.duration for u in self.data.train_set.utterances]
        self.skips = SkipPolicy(cfg.max_nonfinite_in_a_row, cfg.max_oom_batches_in_a_row)
        self.epoch_end = EpochEnd(self.exp_dir, cfg.best_metric, cfg.keep_best, cfg.keep_last,
                                  cfg.early_stopping_patience, self.dist.is_main)

    # ------------------------------------------------------------------ loops

    def fit(self) -> Progress:
        self.clock.start(self.progress.seconds)  # a resumed run continues its clock
        why = f"train.max_epochs={self.train_cfg.max_epochs}"
        try:
            with self.stop_signals:
                while self.progress.epoch < self.train_cfg.max_epochs and not self.clock.limit_reached(self.progress.step):
                    self._stop_if_asked()
                    if self._train_epoch():
                        why = f"early stopping: train.early_stopping_patience={self.train_cfg.early_stopping_patience}"
                        break
            self._call("on_run_end", RunEnd(self.clock.ended_by or why, self.progress.step, self._epochs_done()))
        finally:
            for hook in self.hooks:
                hook.close(self)
        return self.progress

    def _call(self, event: str, payload) -> None:
        for hook in self.hooks:
            getattr(hook, event)(self, payload)

    def _detailed(self, step: int) -> bool:
        """Whether a hook reports update ``step`` in detail (asr.training.hooks.Hook.detailed)."""
        return any(hook.detailed(step) for hook in self.hooks)

    def _epochs_done(self) -> float:
        """Epochs done, with the share of the one in progress (a run that train.max_steps stopped inside it)."""
        planned = self._planned
        return self.progress.epoch + (self.progress.batch_in_epoch / planned if planned else 0.0)

    def _stop_if_asked(self) -> None:
        """At a step boundary: after a stop signal to any rank, write last.pt and raise TrainingStopped."""
        asked = self.stop_signals.received is not None
        if self.dist.enabled:
            asked = not all_agree(not asked, self.device)  # every rank stops after the same step
        if not asked:
            return
        progress = self.progress
        self._save_last()
        if self.dist.enabled:
            torch.distributed.barrier()  # rank 0's checkpoint is on disk before any rank leaves
        where = f"step {progress.step} (epoch {progress.epoch + 1}, batch {progress.batch_in_epoch})"
        why = self.stop_signals.name or "a stop signal to another rank"
        message = f"stopped by {why} after {where}; {self.exp_dir / 'last.pt'} written, continue with --resume"
        logger.warning(message)
        raise TrainingStopped(message)

    def _train_epoch(self) -> bool:
        """One epoch (or its remainder after a resume). Returns True when early stopping fired."""
        cfg, progress, sampler = self.train_cfg, self.progress, self.data.sampler
        epoch = progress.epoch  # epochs done: seeds this epoch's shuffle; the epoch's number is epoch + 1
        number = epoch + 1
        sampler.set_epoch(epoch)
        self.data.train_set.set_epoch(epoch)
        if progress.batch_in_epoch == 0 or progress.epoch_first_step is None:
            # (a run of an older version resumed mid-epoch kept no record of it; it had no data schedules)
            progress.epoch_first_step = progress.step
        plan = plan_epoch(list(sampler), self.durations, progress.epoch_first_step, cfg.accum_grad, self.schedules)
        if plan.left_out_batches and progress.batch_in_epoch == 0:
            logger.info("epoch %d: %d batches (%d utterances) over the max_duration schedule's cap left out",
                        number, plan.left_out_batches, plan.left_out_utterances)
        planned = self._planned = len(plan.batches)
        batches = plan.batches[progress.batch_in_epoch :]
        self.model.train()
        bar = tqdm(total=len(batches), desc=f"epoch {number}", disable=None if self.dist.is_main else True, leave=False)
        accumulated, utterances, start = 0, 0, time.time()
        values: dict[str, float] = {}
        clock = LoaderClock()
        for batch in clock.batches(self.parts.loader(batches, self.data.train_set, epoch)):
            if accumulated == 0:  # a step boundary: nothing accumulated that a resume would lose
                self._stop_if_asked()
                values = self.schedules.apply(progress.step)  # the values this update is made with
            progress.batch_in_epoch += 1
            accumulated += 1
            self.skips.items(progress, batch)
            outcome = self.step.backward(batch.to(self.device), scale=1.0 / cfg.accum_grad)
            bar.update(1)
            if outcome.loss is None:
                self.skips.step(progress, outcome.skipped, batch.ids)
                accumulated = 0
                self.optimizer.zero_grad(set_to_none=True)
                continue
            # A partial accumulation at the end of the epoch is applied, not carried over.
            if accumulated < cfg.accum_grad and progress.batch_in_epoch != planned:
                continue
            accumulated = 0
            update = self.step.update(group_norms=self._detailed(progress.step + 1))
            if update.skipped:
                self.skips.step(progress, update.skipped, batch.ids)
                continue
            progress.step += 1
            clock.updated()
            self.skips.updated(progress)
            utterances += len(batch.ids) * cfg.accum_grad
            # refresh=False: the bar redraws at most every 0.1 s (tqdm's mininterval), not at every update
            bar.set_postfix(loss=f"{outcome.loss:.3f}", utt_per_s=f"{utterances / max(time.time() - start, 1e-9):.1f}",
                            refresh=False)
            self._call("on_update", Update(number, progress.step, outcome.loss, update.grad_norm, values,
                                           epoch + progress.batch_in_epoch / planned, update.group_norms,
                                           clock.read() if self._detailed(progress.step) else {}))
            if cfg.save_every_steps and progress.step % cfg.save_every_steps == 0:
                self._save_last()
            if self.clock.limit_reached(progress.step):
                break
            if cfg.valid_every_steps and progress.step % cfg.valid_every_steps == 0 and progress.batch_in_epoch < planned:
                self._validate_within(number)
                clock.restart()  # the validation's time is no update's
        bar.close()
        self._save_last()  # the epoch's training is kept before its validation runs
        validation = self.validate()
        if self.clock.ended_by is not None and progress.batch_in_epoch < planned:
            # stopped inside the epoch: validated where it stopped, for the curves and the summary; the
            # epoch is not done, so it is neither ranked nor checkpointed as one (last.pt has the weights)
            self._report(number, validation, self._epochs_done())
            self._save_last()
            return False
        progress.epoch += 1
        progress.batch_in_epoch = 0
        progress.epoch_first_step = None
        return self._end_of_epoch(number, validation)

    def _validate_within(self, epoch: int) -> None:
        """A validation inside epoch number ``epoch`` (``train.valid_every_steps``): logged, not ranked. The
        random state is put back after it, so training goes on as it would have without it (and as a run
        resumed from a checkpoint written just before it does)."""
        random_state = rng_state()
        self._report(epoch, self.validate(), self._epochs_done())
        set_rng_state(random_state)

    def validation_options(self) -> DecodingOptions:
        """The decoding behind the validation WER and CER (``train.valid_*``)."""
        return validation_options(self.train_cfg, self.raw_model)

    def validate(self) -> Validation:
        """Every validation metric of the model (:mod:`asr.training.metrics`) on rank 0, shared with the
        other ranks. Scored nothing: the metrics are empty and the epoch goes unranked."""
        result = Validation({})
        if self.dist.is_main and len(self.data.valid_set) > 0:
            loader = self.parts.loader(self.data.valid_batches, self.data.valid_set, 0)
            result = validate(self.raw_model, loader, self.tokenizer, self.device, self.validation_options(),
                              self.train_cfg.valid_max_utterances)
            if result.skipped:
                result.skipped.log("validation")
            if result.utterances == 0:
                logger.warning("validation scored nothing: none of the %d dev utterances could be read; "
                               "this epoch goes unranked", len(self.data.valid_set))
            elif result.decoded == 0:
                logger.warning("validation decoded no utterance; WER and CER are skipped this epoch")
        if self.dist.enabled:
            shared = [result]
            torch.distributed.broadcast_object_list(shared, src=0)
            result = shared[0]
        return result

    def _end_of_epoch(self, epoch: int, validation: Validation) -> bool:
        """Log, rank and checkpoint the finished epoch number ``epoch`` (from 1). Returns True when
        early stopping fires."""
        progress, metrics = self.progress, validation.metrics
        self.epoch_end.rank(progress, epoch, metrics)
        self._report(epoch, validation, progress.epoch)
        progress.skipped_in_epoch = {}
        self.epoch_end.checkpoint(epoch, progress, metrics, self._payload, self._training_state())
        self._save_last()
        self._call("on_epoch_end", EpochDone(epoch, progress.step, metrics))
        if len(self.data.valid_set) > 0 and validation.utterances == 0 and self.dist.is_main:
            raise TrainingError(
                f"none of the {len(self.data.valid_set)} dev utterances could be read (data.dev={self.parts.dev}); "
                f"epoch {epoch} is saved in {self.exp_dir}. Fix the dev set, then continue with --resume"
            )
        return self.epoch_end.should_stop(progress)

    def _report(self, epoch: int, validation: Validation, epochs_done: float) -> None:
        """A validation after ``epochs_done`` epochs, in epoch number ``epoch``, to the hooks; the run's clock
        is brought up to it."""
        self.clock.read(self.progress)
        self._call("on_validation", Validated(epoch, self.progress.step, validation, epochs_done))

    # ------------------------------------------------------------------ checkpoints

    def _payload(self, training: dict | None = None) -> dict:
        return {
            "config": self.parts.config,
            "model": self.raw_model.state_dict(),
            "tokenizer": self.tokenizer.state_dict(),
            "features": self.pipeline.state_dict(),
            # longer recordings are decoded in pieces of at most the mean (asr.inference.segmentation)
            **training_lengths(self.data.train_set.utterances),
            "training": training,
        }

    def _training_state(self) -> dict:
        """What resuming needs (asr.checkpoints.io.RESUME_KEYS)."""
        return {
            "progress": vars(self.progress).copy(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedules.state_dict(),
            "rng": rng_state(),
        }

    def _save_last(self) -> None:
        self.clock.read(self.progress)  # a run resumed from this checkpoint goes on from this time (train.max_minutes)
        if not self.dist.is_main:
            return
        save_checkpoint(self.exp_dir / "last.pt", self._payload(self._training_state()))


def training_lengths(utterances) -> dict[str, float]:
    """The longest and the mean training utterance in seconds, as a checkpoint records them."""
    durations = [u.duration for u in utterances]
    if not durations:
        return {}
    return {"longest_utterance_seconds": max(durations), "mean_utterance_seconds": sum(durations) / len(durations)}


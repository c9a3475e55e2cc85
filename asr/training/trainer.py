"""The training loop: epochs of :class:`~asr.training.step.TrainingStep`, validation, checkpoints, resume.

The loop is small on purpose; what it consults lives beside it, one concern to a module:

- :mod:`asr.training.schedules`: everything that moves over the updates (learning rate, CTC weight,
  label smoothing, scheduled sampling, the attention prior, SpecAugment, the length cap), asked once
  per update and saved with the run;
- :mod:`asr.training.plan`: an epoch's batches, planned with the data schedules when it starts;
- :mod:`asr.training.validation` and :mod:`asr.training.metrics`: the validation and its metrics, each
  of which says whether higher is better;
- :mod:`asr.training.epoch_end`: ranking an epoch, early stopping, its checkpoints;
- :mod:`asr.training.reporting`: ``train.log`` and TensorBoard.

The experiment directory (``exp_dir``) receives the resolved ``config.yaml``, ``train.log``,
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
A run refused (:func:`refusal`) writes nothing into its folder, nor does a resume whose settings differ from
its checkpoint's where they may not (:mod:`asr.training.resume`). A run started or resumed removes the
temporary files of checkpoint writes that a killed run left, logging each. A stop signal ends the loop at the
next step boundary with ``last.pt`` written (:mod:`asr.training.signals`); a batch that runs out of
CUDA memory is skipped like a non-finite one, logged with its size and counted with the epoch's
skipped utterances.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
import yaml
from tqdm import tqdm

from asr.averaging import epoch_of
from asr.checkpointing import CheckpointError, load_checkpoint, save_checkpoint
from asr.data.batching import batch_shapes
from asr.decoding import DecodingOptions
from asr.experiment import ExperimentConfig, experiment_config_to_dict
from asr.models import runtime
from asr.models.interface import ScheduledRegularisation
from asr.models.registry import build_model
from asr.schedulers import warmup_updates
from asr.training.data import build_training_data, make_loader
from asr.training.distributed import all_agree, all_max, device_kind, init_distributed, resolve_device
from asr.training.epoch_end import EpochEnd
from asr.training.metrics import higher_is_better
from asr.training.plan import plan_epoch
from asr.training.reporting import (  # noqa: F401 (write_epoch_summaries re-exported)
    RunLog,
    end_summary,
    held_records,
    setup_logging,
    write_epoch_summaries,
)
from asr.training.resume import check_resume
from asr.training.schedules import LearningRateSchedule, ScheduleSet, build_schedules, run_spent
from asr.training.signals import StopSignals, TrainingStopped
from asr.training.state import Progress, restore_progress, rng_state, seed_everything, set_rng_state
from asr.training.step import TrainingStep, describe
from asr.training.timing import LoaderClock
from asr.training.validation import Validation, alignment_figures, validate, validation_options
from asr.writing import atomic_write
from features.config import resolve_compute_on

logger = logging.getLogger("asr.train")


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite steps in a row)."""


class Trainer:
    """Owns the model, the optimiser and the loops; one instance per process."""

    def __init__(self, config: ExperimentConfig, resume: bool = False, overrides: list[str] | None = None,
                 command: str | None = None, verbose: bool = False):
        """``overrides`` (``key.sub=value``) and ``command`` are what the run was started with, recorded
        in ``train.log`` and TensorBoard; ``config`` already has the overrides applied. ``verbose`` logs
        every entry of the runtime record (which code computes the model), not only its one-line summary."""
        self.config = config
        self.verbose = verbose
        self.overrides = list(overrides or [])
        self.train_cfg = config.train
        self.dist = init_distributed(device_kind(config.train.device))
        self.device = resolve_device(config.train.device, self.dist.local_rank)
        self.exp_dir = Path(config.exp_dir)
        refused = refusal(self.exp_dir, resume)
        if refused:  # before anything is written: a refused run leaves the folder as it found it
            raise TrainingError(refused)
        self.command = command or "python -m asr.train (called from Python)"
        # resolved before config.yaml is written, so the run records where its features were computed
        chosen = config.features.compute_on
        config.features.compute_on = resolve_compute_on(chosen, self.device.type)
        # A resumed run's checkpoint is read and its settings compared with these before anything is written:
        # a refused resume leaves train.log and config.yaml as they were (its messages wait for train.log).
        with held_records(logger) as held:
            resume_state = self._resume_state(resume)
            self._record = self._settings_record(resume_state)
        self.exp_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(self.exp_dir / "train.log" if self.dist.is_main else None)
        logger.info("command line: %s", self.command)
        logger.info("overrides: %s", " ".join(self.overrides) or "none")
        logger.info("features computed on the %s (features.compute_on=%s, training on %s)",
                    config.features.compute_on, chosen, self.device)
        held.release()
        self._remove_stale_temporary_files()
        self.progress = Progress()
        self.last_metrics: dict[str, float] = {}  # of the latest validation, for the run's summary
        self._planned = 0  # batches planned for the epoch in progress
        self._ended_by: str | None = None  # the limit (train.max_steps or train.max_minutes) that ended the run
        self._seconds = 0.0  # the run's clock as of its latest update (train.max_minutes only)
        self.stop_signals = StopSignals()  # installed while fit() runs
        seed_everything(self.train_cfg.seed)
        self._write_config()
        self.data = build_training_data(config, resume_state, self.dist.world_size, self.dist.rank)
        self.tokenizer, self.pipeline = self.data.tokenizer, self.data.pipeline
        self.raw_model = build_model(config.model, self.pipeline.feature_dim, self.tokenizer).to(self.device)
        if hasattr(self.raw_model, "batch_shapes"):  # model.sdpa_backend's auto: are an epoch's shapes few? (asr.models.sdpa)
            self.raw_model.batch_shapes = len(set(batch_shapes(self.data.sampler.batches(), self.data.train_set.num_frames(),
                                                               config.data.pad_frames_to)))
        # which code computes the model here (LN-LSTM backends, C++ build flags, CUDA graphs): recorded with the run
        self.runtime = runtime.describe(self.raw_model, self.device)
        self._runtime_before = runtime.snapshot()  # "what ran" is this run's, not this process's
        if verbose:
            runtime.log(logger, self.runtime)
        else:  # one line: the whole record is in config.yaml
            logger.info("%s", runtime.summary(self.runtime, f"{self.exp_dir / 'config.yaml'}, runtime; --verbose"))
        self._write_config()
        self.model = self.raw_model
        if self.dist.enabled:
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.raw_model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.optimizer = build_optimizer(self.raw_model, self.train_cfg)
        self.schedules = build_run_schedules(config, self.raw_model, self.optimizer, len(self.data.sampler),
                                             minutes=self._minutes)
        use_amp = self.train_cfg.amp and self.device.type == "cuda"
        # No scheduler here: the schedules set the learning rate before each update.
        self.step = TrainingStep(
            self.model, self.optimizer, None, self.train_cfg.grad_clip, use_amp=use_amp,
            distributed=self.dist.enabled, pipeline=self.pipeline,
        )
        self.durations = [u.duration for u in self.data.train_set.utterances]
        self.epoch_end = EpochEnd(self.exp_dir, self.train_cfg.best_metric, self.train_cfg.keep_best,
                                  self.train_cfg.keep_last, self.train_cfg.early_stopping_patience, self.dist.is_main)
        logger.info(
            "model: %s, %.2fM parameters; features: %d-dim; vocabulary: %d",
            config.model.type, sum(p.numel() for p in self.raw_model.parameters()) / 1e6,
            self.pipeline.feature_dim, self.tokenizer.vocab_size,
        )
        if resume_state is not None:
            self._restore(resume_state)
        self.log = RunLog(self.exp_dir, self.train_cfg.log_every_steps, self.dist.is_main, self.train_cfg.max_steps)
        self.log.settings(experiment_config_to_dict(self.config), self.overrides, self.command)

    @property
    def writer(self):
        """The TensorBoard writer (None off rank 0)."""
        return self.log.writer

    def _resume_state(self, resume: bool) -> dict | None:
        last = self._resumed_from = self.exp_dir / "last.pt"
        if not resume:
            return None  # (a folder holding a run was refused before anything was written: refusal())
        if not last.is_file():
            return self._resume_fallback(last, "it is missing")
        logger.info("resuming from %s", last)
        try:
            return load_checkpoint(last)
        except CheckpointError as err:
            return self._resume_fallback(last, f"it cannot be read ({err})")

    def _settings_record(self, resume_state: dict | None) -> dict:
        """The settings config.yaml records, with its ``history`` of resumes (:mod:`asr.training.resume`).

        A new run records its resolved config. A resumed one is first compared with the checkpoint it
        resumes (a change that shapes the model, features, tokenizer, data or optimiser raises ConfigError
        naming each key); the settings it records stay those of its config.yaml (or, where that cannot be
        read, its checkpoint's), and the resume, with what it changed, is added to their history."""
        resolved = experiment_config_to_dict(self.config)
        if resume_state is None:
            return resolved
        changes = check_resume(resume_state["config"], resolved, str(self._resumed_from))
        for change in changes:
            logger.info("resumed with %s (recorded in config.yaml's history)", change)
        record = _read_record(self.exp_dir / "config.yaml")
        if record is None:
            record = dict(resume_state["config"])
            logger.warning("--resume: %s cannot be read; its settings are recorded again from %s",
                           self.exp_dir / "config.yaml", self._resumed_from)
        history = [entry for entry in record.pop("history", None) or [] if isinstance(entry, dict)]
        record.pop("runtime", None)  # written again once the model exists
        progress = (resume_state.get("training") or {}).get("progress") or {}
        history.append({
            "resumed": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "from": str(self._resumed_from), "at_step": progress.get("step"), "command": self.command,
            "changed": {change.key: {"from": change.old, "to": change.new} for change in changes},
        })
        return {**record, "history": history}

    def _resume_fallback(self, last: Path, why: str) -> dict:
        """``last.pt`` is missing (a full disk before it was first written) or cannot be read (cut short
        by a copy, say): resume from the newest readable ``epoch{E}.pt``, which carries the same training
        state at the end of its epoch."""
        numbered = _epoch_checkpoints(self.exp_dir)
        for _, path in sorted(numbered, reverse=True):
            try:
                state = load_checkpoint(path)
            except CheckpointError as other:
                logger.warning("--resume: %s cannot be read either (%s)", path, other)
                continue
            if "optimizer" not in (state.get("training") or {}):
                logger.warning("--resume: %s has no optimizer state (written by an older version)", path)
                continue
            logger.warning("--resume: %s: %s; resuming from %s instead", last, why, path)
            return state
        if not numbered and why == "it is missing":
            raise TrainingError(f"--resume: no checkpoint to resume from at {last} (nor any epoch{{E}}.pt beside it)")
        raise TrainingError(f"--resume: {last}: {why}, and no epoch checkpoint beside it can be resumed")

    # ------------------------------------------------------------------ loops

    def fit(self) -> Progress:
        self._clock = (time.time(), self.progress.seconds)  # a resumed run continues its clock
        self._seconds = self.progress.seconds
        why = f"train.max_epochs={self.train_cfg.max_epochs}"
        try:
            with self.stop_signals:
                while self.progress.epoch < self.train_cfg.max_epochs and not self._limit_reached():
                    self._stop_if_asked()
                    if self._train_epoch():
                        why = f"early stopping: train.early_stopping_patience={self.train_cfg.early_stopping_patience}"
                        break
        finally:
            self.log.close()
        if self._ended_by is not None:
            why = self._ended_by
        ran = runtime.ran(since=self._runtime_before, device=self.device)
        self.runtime.update(ran)
        if self.verbose:
            runtime.log(logger, ran)
        self._write_config()
        self.log.summary(end_summary(self.exp_dir, self.progress, why, self.train_cfg.best_metric, self.last_metrics,
                                     self._epochs_done()))
        return self.progress

    def _epochs_done(self) -> float:
        """Epochs done, with the share of the one in progress (a run that train.max_steps stopped inside it)."""
        planned = self._planned
        return self.progress.epoch + (self.progress.batch_in_epoch / planned if planned else 0.0)

    def _write_config(self) -> None:
        """config.yaml: the resolved recipe, and once the model exists a ``runtime:`` section (which code
        computes it: :func:`asr.models.runtime.describe`, then what ran); loading it as a recipe ignores that."""
        if self.dist.is_main:
            record = dict(self._record)
            history = record.pop("history", None)
            if getattr(self, "runtime", None) is not None:
                record["runtime"] = self.runtime
            if history:
                record["history"] = history
            atomic_write(self.exp_dir / "config.yaml", yaml.safe_dump(record, sort_keys=False))

    def _remove_stale_temporary_files(self) -> None:
        """Remove the temporary files of checkpoint writes that a killed run left (``.last.pt.*.tmp``: a
        write is a temporary file renamed over its target, asr.checkpointing), each logged. Only this run's
        own checkpoint names: an asr.average writing into the folder at the same time keeps its file."""
        if not self.dist.is_main:
            return
        for path in sorted(stale_checkpoint_writes(self.exp_dir)):
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            logger.warning("removed %s (%.1f MB), a checkpoint write that a stopped run left unfinished",
                           path, size / 1e6)

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

    def _minutes(self) -> float:
        """Minutes of training and validation so far, a resumed run's earlier ones included, as read after
        the latest update (train.max_minutes' check), so that every rank sees the same clock."""
        return self._seconds / 60.0

    def _limit_reached(self) -> bool:
        """Whether train.max_steps or train.max_minutes ends the run here; once it has, it stays ended.
        Every rank agrees (one any rank out of time stops them all after the same update)."""
        cfg = self.train_cfg
        if self._ended_by is None and cfg.max_steps is not None and self.progress.step >= cfg.max_steps:
            self._ended_by = f"train.max_steps={cfg.max_steps}"
        # The budget ends a run only once it has made an update: "after the first update past it", even on a
        # machine so busy that the budget is spent before the first batch arrives.
        if self._ended_by is None and cfg.max_minutes is not None and self.progress.step > 0:
            seconds = self._clock_now()
            if self.dist.enabled:  # the slowest rank's clock, the same on every rank
                seconds = all_max(seconds, self.device)
            self._seconds = seconds  # what the learning rate's cooldown reads until the next update
            if seconds >= cfg.max_minutes * 60:
                self._ended_by = f"train.max_minutes={cfg.max_minutes:g}"
        return self._ended_by is not None

    def _loader(self, batches, dataset, epoch: int):
        return make_loader(batches, dataset, self.config.data.num_workers, self.config.data.seed + epoch,
                           pin_memory=self.device.type == "cuda", pad_frames_to=self.config.data.pad_frames_to)

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
        for batch in clock.batches(self._loader(batches, self.data.train_set, epoch)):
            if accumulated == 0:  # a step boundary: nothing accumulated that a resume would lose
                self._stop_if_asked()
                values = self.schedules.apply(progress.step)  # the values this update is made with
            progress.batch_in_epoch += 1
            accumulated += 1
            self._count_skips(batch)
            outcome = self.step.backward(batch.to(self.device), scale=1.0 / cfg.accum_grad)
            bar.update(1)
            if outcome.loss is None:
                self._skipped(outcome.skipped, batch.ids)
                accumulated = 0
                self.optimizer.zero_grad(set_to_none=True)
                continue
            # A partial accumulation at the end of the epoch is applied, not carried over.
            if accumulated < cfg.accum_grad and progress.batch_in_epoch != planned:
                continue
            accumulated = 0
            update = self.step.update(group_norms=self.log.logs_step(progress.step + 1))
            if update.skipped:
                self._skipped(update.skipped, batch.ids)
                continue
            progress.step += 1
            clock.updated()
            progress.nonfinite_in_a_row = progress.oom_in_a_row = 0
            utterances += len(batch.ids) * cfg.accum_grad
            # refresh=False: the bar redraws at most every 0.1 s (tqdm's mininterval), not at every update
            bar.set_postfix(loss=f"{outcome.loss:.3f}", utt_per_s=f"{utterances / max(time.time() - start, 1e-9):.1f}",
                            refresh=False)
            self.log.step(number, progress.step, outcome.loss, update.grad_norm, update.group_norms, values,
                          epoch + progress.batch_in_epoch / planned,
                          clock.read() if self.log.logs_step(progress.step) else None)
            if cfg.save_every_steps and progress.step % cfg.save_every_steps == 0:
                self._save_last()
            if self._limit_reached():
                break
            if cfg.valid_every_steps and progress.step % cfg.valid_every_steps == 0 and progress.batch_in_epoch < planned:
                self._validate_within(number)
                clock.restart()  # the validation's time is no update's
        bar.close()
        self._save_last()  # the epoch's training is kept before its validation runs
        validation = self.validate()
        if self._ended_by is not None and progress.batch_in_epoch < planned:
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

    def _count_skips(self, batch) -> None:
        """Log each training item whose audio failed where it was read, and count it by reason for the epoch."""
        for skip in batch.skipped:
            logger.warning("training item skipped at epoch %d: %s [%s]", self.progress.epoch + 1, skip.message, skip.reason)
            self.progress.count_skip(skip.reason)

    def _skipped(self, why: str, ids: list[str]) -> None:
        """A step that did not reach the weights: logged with its utterances; non-finite ones are counted."""
        progress = self.progress
        logger.warning(
            "%s at epoch %d batch %d; step skipped, weights unchanged (utterances: %s)",
            why, progress.epoch + 1, progress.batch_in_epoch, describe(ids),
        )
        if why.startswith("CUDA out of memory"):
            self._out_of_memory(ids)
            return
        if not why.startswith("non-finite"):
            return
        progress.nonfinite_in_a_row += 1
        limit = self.train_cfg.max_nonfinite_in_a_row
        if progress.nonfinite_in_a_row >= limit:
            raise TrainingError(
                f"{progress.nonfinite_in_a_row} non-finite steps in a row (train.max_nonfinite_in_a_row={limit}); "
                f"last batch: {describe(ids)}. Lower train.lr, check the data, or enable gradient clipping."
            )

    def _out_of_memory(self, ids: list[str]) -> None:
        """A batch skipped for CUDA out of memory: counted with its utterances; too many in a row stop the run."""
        progress, limit = self.progress, self.train_cfg.max_oom_batches_in_a_row
        progress.count_skip("CUDA out of memory", len(ids))
        progress.oom_in_a_row += 1
        if progress.oom_in_a_row >= limit:
            raise TrainingError(
                f"{progress.oom_in_a_row} batches in a row ran out of CUDA memory "
                f"(train.max_oom_batches_in_a_row={limit}); last batch: {describe(ids)}. "
                "Lower data.max_frames_per_batch or use a smaller model."
            )

    def validation_options(self) -> DecodingOptions:
        """The decoding behind the validation WER and CER (``train.valid_*``)."""
        return validation_options(self.train_cfg, self.raw_model)

    def validate(self) -> Validation:
        """Every validation metric of the model (:mod:`asr.training.metrics`) on rank 0, shared with the
        other ranks. Scored nothing: the metrics are empty and the epoch goes unranked."""
        result = Validation({})
        if self.dist.is_main and len(self.data.valid_set) > 0:
            loader = self._loader(self.data.valid_batches, self.data.valid_set, 0)
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
        for line in self.schedules.observe(progress.step, metrics):
            logger.info(line)
        self.epoch_end.rank(progress, epoch, metrics)
        self._report(epoch, validation, progress.epoch)
        progress.skipped_in_epoch = {}
        self.epoch_end.checkpoint(epoch, progress, metrics, self._payload, self._training_state())
        self._save_last()
        if len(self.data.valid_set) > 0 and validation.utterances == 0 and self.dist.is_main:
            raise TrainingError(
                f"none of the {len(self.data.valid_set)} dev utterances could be read (data.dev={self.config.data.dev}); "
                f"epoch {epoch} is saved in {self.exp_dir}. Fix the dev set, then continue with --resume"
            )
        return self.epoch_end.should_stop(progress)

    def _report(self, epoch: int, validation: Validation, epochs_done: float) -> None:
        """A validation in train.log and TensorBoard (with attention pictures) after ``epochs_done`` epochs,
        in epoch number ``epoch``; the run's clock is brought up to it."""
        progress, metrics = self.progress, validation.metrics
        self._read_clock()
        figures = []
        if self.writer is not None and metrics:
            when = f"after epoch {epoch}" if epochs_done == epoch else f"step {progress.step} (in epoch {epoch})"
            figures = alignment_figures(self.raw_model, self.data.valid_set, self.tokenizer, self.device, when=when)
        self.log.validation(epoch, progress, metrics, figures, epochs_done)
        self.last_metrics = metrics

    # ------------------------------------------------------------------ checkpoints

    def _payload(self, training: dict | None = None) -> dict:
        return {
            "config": experiment_config_to_dict(self.config),
            "model": self.raw_model.state_dict(),
            "tokenizer": self.tokenizer.state_dict(),
            "features": self.pipeline.state_dict(),
            # longer recordings are decoded in pieces of at most the mean (asr.inference.segmentation)
            **training_lengths(self.data.train_set.utterances),
            "training": training,
        }

    def _training_state(self) -> dict:
        """What resuming needs (asr.checkpointing.RESUME_KEYS)."""
        return {
            "progress": vars(self.progress).copy(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedules.state_dict(),
            "rng": rng_state(),
        }

    def _save_last(self) -> None:
        self._read_clock()  # a run resumed from this checkpoint goes on from this time (train.max_minutes)
        if not self.dist.is_main:
            return
        save_checkpoint(self.exp_dir / "last.pt", self._payload(self._training_state()))

    def _read_clock(self) -> None:
        """Bring the run's clock (``progress.seconds``: training and validation so far, a resumed run's
        earlier time included) up to now."""
        self.progress.seconds = self._clock_now()

    def _clock_now(self) -> float:
        """The run's clock now, in seconds (a resumed run's earlier time included)."""
        started, before = self._clock
        return before + time.time() - started

    def _restore(self, state: dict) -> None:
        self.raw_model.load_state_dict(state["model"])
        training = state.get("training") or {}
        if "optimizer" not in training:
            raise TrainingError(f"{self.exp_dir / 'last.pt'} has no optimizer state; it cannot be resumed")
        self.optimizer.load_state_dict(training["optimizer"])
        self.schedules.load_state_dict(training.get("scheduler") or {})
        self.progress, from_zero = restore_progress(training["progress"])
        if from_zero:
            logger.warning("this run was started by an older version, which numbered epochs from 0: its "
                           "checkpoints so far are named one below their epoch (epoch0.pt is epoch 1); "
                           "from epoch %d on, names and numbers agree", self.progress.epoch + 1)
        set_rng_state(training["rng"])
        logger.info("resumed in epoch %d, after batch %d, at step %d",
                    self.progress.epoch + 1, self.progress.batch_in_epoch, self.progress.step)


def refusal(exp_dir: Path, resume: bool) -> str | None:
    """Why a run into ``exp_dir`` is refused before it writes anything, or None: without ``--resume``, a
    folder that holds a run (``last.pt``); with it, a folder with no checkpoint to resume from."""
    last = exp_dir / "last.pt"
    if not resume and last.exists():
        return f"{exp_dir} already holds a run (last.pt); pass --resume to continue it or choose another exp_dir"
    if resume and not last.exists() and not _epoch_checkpoints(exp_dir):
        return f"--resume: no checkpoint to resume from at {last} (nor any epoch{{E}}.pt beside it)"
    return None


def stale_checkpoint_writes(exp_dir: Path) -> list[Path]:
    """The temporary files of the trainer's checkpoint writes in ``exp_dir`` (``.last.pt.<random>.tmp``,
    ``.epoch3.pt.<random>.tmp``, ...): none is left while no run writes there, unless one was killed mid-write."""
    found = []
    for path in exp_dir.glob(".*.pt.*.tmp"):
        target = Path(path.name[1:].split(".pt.", 1)[0] + ".pt")
        if target.name == "last.pt" or any(epoch_of(target, prefix) is not None for prefix in ("epoch", "best_epoch")):
            found.append(path)
    return found


def _read_record(path: Path) -> dict | None:
    """A run's config.yaml as data, or None where it is missing or cannot be read."""
    try:
        record = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _epoch_checkpoints(exp_dir: Path) -> list[tuple[int, Path]]:
    """(E, path) of every ``epoch{E}.pt`` in ``exp_dir``."""
    found = [(epoch_of(path, "epoch"), path) for path in exp_dir.glob("epoch*.pt")]
    return [(epoch, path) for epoch, path in found if epoch is not None]


def training_lengths(utterances) -> dict[str, float]:
    """The longest and the mean training utterance in seconds, as a checkpoint records them."""
    durations = [u.duration for u in utterances]
    if not durations:
        return {}
    return {"longest_utterance_seconds": max(durations), "mean_utterance_seconds": sum(durations) / len(durations)}


def build_run_schedules(config: ExperimentConfig, model: torch.nn.Module, optimizer, batches_per_epoch: int,
                        minutes: Callable[[], float] | None = None) -> ScheduleSet:
    """The run's schedules: the learning rate (``train.lr``, ``train.scheduler``), each of
    ``train.schedules``, and a model's own regularisation schedule (the Transformer's DropHead).
    ``minutes()``: the run's clock (minutes of training and validation so far), for a learning-rate
    cooldown that ``train.max_minutes`` ends."""
    cfg = config.train
    total = planned_updates(cfg, batches_per_epoch)
    lr = LearningRateSchedule(cfg.lr, cfg.scheduler, d_model=config.model.schedule_dim, total_updates=total,
                              higher_is_better=higher_is_better, spent=run_spent(total, cfg.max_minutes, minutes))
    regularisation = None
    if isinstance(model, ScheduledRegularisation):
        warmup = warmup_updates(cfg.scheduler)

        def regularisation(step: int) -> dict[str, float]:
            return model.set_regularisation_progress(step, total, warmup)

    return build_schedules(cfg.schedules, lr, model, optimizer, regularisation)


def planned_updates(cfg, batches_per_epoch: int) -> int:
    """Optimizer steps the run is planned to take: ``max_epochs`` epochs (each ends with its partial
    accumulation applied), or ``max_steps`` when that comes first. Early stopping may end it sooner."""
    total = cfg.max_epochs * math.ceil(batches_per_epoch / cfg.accum_grad)
    return total if cfg.max_steps is None else min(total, cfg.max_steps)


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return kind(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)

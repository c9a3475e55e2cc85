"""The training loop: epochs of :class:`~asr.training.step.TrainingStep`, validation, checkpoints, resume.

The experiment directory (``exp_dir``) receives the resolved ``config.yaml``,
``train.log``, TensorBoard event files (``train/loss``, ``train/lr``,
``train/grad_norm`` and ``grad_norm/<group>`` per logged optimizer step, the
group norms before clipping, see :func:`asr.training.step.gradient_groups`;
for a model with scheduled regularisers their rates, e.g.
``train/drophead_encoder``; ``valid/loss``, ``valid/wer``, ``valid/cer``,
``train/skipped_utterances`` per epoch at step epoch + 1, with ``valid/step``,
the optimizer steps taken, and ``valid/minutes``, the wall-clock minutes of the
run so far, so that curves can be drawn against either; for models that expose
their attention, ``alignment/<utterance>`` images of a few dev utterances, also
written as ``alignment_<utterance>.png`` at every validation, so the files hold
the last one), ``last.pt`` (everything needed to resume), ``epoch{E}.pt`` for the last
``train.keep_last`` epochs (these can be resumed from too, should ``last.pt`` be unreadable)
and the best ``train.keep_best`` epochs as ``best_epoch{E}.pt`` (weights only). Every
checkpoint carries the config, tokenizer and feature pipeline, so any of them can be used
for inference. ``asr.train`` holds ``train.lock`` while it runs (:mod:`asr.training.runlock`).

A stop signal ends the loop at the next step boundary with ``last.pt`` written
(:mod:`asr.training.signals`); a batch that runs out of CUDA memory is skipped like a
non-finite one, logged with its size and counted with the epoch's skipped utterances.
"""

from __future__ import annotations

import io
import logging
import math
import sys
import time
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from asr.checkpointing import CheckpointError, load_checkpoint, save_checkpoint, save_epoch_checkpoints
from asr.decoding import DecodingOptions
from asr.experiment import ExperimentConfig, experiment_config_to_dict
from asr.models import runtime
from asr.models.interface import ScheduledRegularisation
from asr.models.registry import build_model
from asr.schedulers import build_scheduler, warmup_updates
from asr.training.data import build_training_data, make_loader
from asr.training.distributed import all_agree, device_kind, init_distributed, resolve_device
from asr.training.signals import StopSignals, TrainingStopped
from asr.training.state import Progress, rng_state, seed_everything, set_rng_state
from asr.training.step import TrainingStep, describe
from asr.training.validation import alignment_figures, alignment_file_name, validate
from asr.writing import atomic_write, writing
from features.config import resolve_compute_on

logger = logging.getLogger("asr.train")


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite steps in a row)."""


class Trainer:
    """Owns the model, the optimiser and the loops; one instance per process."""

    def __init__(self, config: ExperimentConfig, resume: bool = False):
        self.config = config
        self.train_cfg = config.train
        self.dist = init_distributed(device_kind(config.train.device))
        self.device = resolve_device(config.train.device, self.dist.local_rank)
        self.exp_dir = Path(config.exp_dir)
        self.exp_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(self.exp_dir / "train.log" if self.dist.is_main else None)
        # resolved before config.yaml is written, so the run records where its features were computed
        chosen = config.features.compute_on
        config.features.compute_on = resolve_compute_on(chosen, self.device.type)
        logger.info("features computed on the %s (features.compute_on=%s, training on %s)",
                    config.features.compute_on, chosen, self.device)
        self.progress = Progress()
        self.stop_signals = StopSignals()  # installed while fit() runs
        resume_state = self._resume_state(resume)
        seed_everything(self.train_cfg.seed)
        self._write_config()
        self.data = build_training_data(config, resume_state, self.dist.world_size, self.dist.rank)
        self.tokenizer, self.pipeline = self.data.tokenizer, self.data.pipeline
        self.raw_model = build_model(config.model, self.pipeline.feature_dim, self.tokenizer).to(self.device)
        # which code computes the model here (LN-LSTM backends, C++ build flags, CUDA graphs): recorded with the run
        self.runtime = runtime.describe(self.raw_model, self.device)
        self._runtime_before = runtime.snapshot()  # "what ran" is this run's, not this process's
        runtime.log(logger, self.runtime)
        self._write_config()
        self.model = self.raw_model
        if self.dist.enabled:
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.raw_model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.optimizer = build_optimizer(self.raw_model, self.train_cfg)
        self.scheduler = build_scheduler(
            self.optimizer, self.train_cfg.scheduler, d_model=config.model.schedule_dim,
            total_updates=planned_updates(self.train_cfg, len(self.data.sampler)),
        )
        use_amp = self.train_cfg.amp and self.device.type == "cuda"
        self.step = TrainingStep(
            self.model, self.optimizer, self.scheduler, self.train_cfg.grad_clip, use_amp=use_amp,
            distributed=self.dist.enabled, pipeline=self.pipeline,
        )
        logger.info(
            "model: %s, %.2fM parameters; features: %d-dim; vocabulary: %d",
            config.model.type, sum(p.numel() for p in self.raw_model.parameters()) / 1e6,
            self.pipeline.feature_dim, self.tokenizer.vocab_size,
        )
        if resume_state is not None:
            self._restore(resume_state)
        self.writer = None
        if self.dist.is_main:
            from torch.utils.tensorboard import SummaryWriter

            with writing(self.exp_dir / "tensorboard"):  # it writes its first event file at once
                self.writer = SummaryWriter(log_dir=str(self.exp_dir / "tensorboard"))

    def _resume_state(self, resume: bool) -> dict | None:
        last = self.exp_dir / "last.pt"
        if not resume:
            if last.exists():
                raise TrainingError(
                    f"{self.exp_dir} already holds a run (last.pt); pass --resume to continue it or choose another exp_dir"
                )
            return None
        if not last.is_file():
            raise TrainingError(f"--resume: no checkpoint to resume from at {last}")
        logger.info("resuming from %s", last)
        try:
            return load_checkpoint(last)
        except CheckpointError as err:
            return self._resume_fallback(last, err)

    def _resume_fallback(self, last: Path, err: CheckpointError) -> dict:
        """``last.pt`` cannot be read (cut short by a copy, say): resume from the newest readable
        ``epoch{E}.pt``, which carries the same training state at the end of its epoch."""
        numbered = [(int(p.stem[5:]), p) for p in self.exp_dir.glob("epoch*.pt") if p.stem[5:].isdigit()]
        for _, path in sorted(numbered, reverse=True):
            try:
                state = load_checkpoint(path)
            except CheckpointError as other:
                logger.warning("--resume: %s cannot be read either (%s)", path, other)
                continue
            if "optimizer" not in (state.get("training") or {}):
                logger.warning("--resume: %s has no optimizer state (written by an older version)", path)
                continue
            logger.warning("--resume: %s cannot be read (%s); resuming from %s instead", last, err, path)
            return state
        raise TrainingError(f"--resume: {last} cannot be read ({err}), and no epoch checkpoint beside it can be resumed")

    # ------------------------------------------------------------------ loops

    def fit(self) -> Progress:
        self._clock = (time.time(), self.progress.seconds)  # a resumed run continues its clock
        try:
            with self.stop_signals:
                while self.progress.epoch < self.train_cfg.max_epochs and not self._reached_max_steps():
                    self._stop_if_asked()
                    if self._train_epoch():  # early stopping fired
                        break
        finally:
            if self.writer is not None:
                with writing(self._event_file()):
                    self.writer.close()
        logger.info("training finished after %d steps (epoch %d)", self.progress.step, self.progress.epoch)
        ran = runtime.ran(since=self._runtime_before)
        self.runtime.update(ran)
        runtime.log(logger, ran)
        self._write_config()
        return self.progress

    def _write_config(self) -> None:
        """config.yaml: the resolved recipe, and once the model exists a ``runtime:`` section (which code
        computes it: :func:`asr.models.runtime.describe`, then what ran); loading it as a recipe ignores that."""
        if self.dist.is_main:
            record = experiment_config_to_dict(self.config)
            if getattr(self, "runtime", None) is not None:
                record["runtime"] = self.runtime
            atomic_write(self.exp_dir / "config.yaml", yaml.safe_dump(record, sort_keys=False))

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
        where = f"step {progress.step} (epoch {progress.epoch}, batch {progress.batch_in_epoch})"
        why = self.stop_signals.name or "a stop signal to another rank"
        message = f"stopped by {why} after {where}; {self.exp_dir / 'last.pt'} written, continue with --resume"
        logger.warning(message)
        raise TrainingStopped(message)

    def _reached_max_steps(self) -> bool:
        return self.train_cfg.max_steps is not None and self.progress.step >= self.train_cfg.max_steps

    def _loader(self, batches, dataset, epoch: int):
        return make_loader(batches, dataset, self.config.data.num_workers, self.config.data.seed + epoch,
                           pin_memory=self.device.type == "cuda")

    def _train_epoch(self) -> bool:
        """One epoch (or its remainder after a resume). Returns True when early stopping fired."""
        cfg, progress, sampler = self.train_cfg, self.progress, self.data.sampler
        epoch = progress.epoch
        sampler.set_epoch(epoch)
        self.data.train_set.set_epoch(epoch)
        batches = list(sampler)[progress.batch_in_epoch :]
        self.model.train()
        bar = tqdm(total=len(batches), desc=f"epoch {epoch}", disable=None if self.dist.is_main else True, leave=False)
        accumulated, utterances, start = 0, 0, time.time()
        for batch in self._loader(batches, self.data.train_set, epoch):
            if accumulated == 0:  # a step boundary: nothing accumulated that a resume would lose
                self._stop_if_asked()
            progress.batch_in_epoch += 1
            accumulated += 1
            self._count_skips(batch)
            rates = regularisation_progress(self.raw_model, self.train_cfg, len(sampler), progress.step)
            outcome = self.step.backward(batch.to(self.device), scale=1.0 / cfg.accum_grad)
            bar.update(1)
            if outcome.loss is None:
                self._skipped(outcome.skipped, batch.ids)
                accumulated = 0
                self.optimizer.zero_grad(set_to_none=True)
                continue
            # A partial accumulation at the end of the epoch is applied, not carried over.
            if accumulated < cfg.accum_grad and progress.batch_in_epoch != len(sampler):
                continue
            accumulated = 0
            update = self.step.update(group_norms=self._logs_step(progress.step + 1))
            if update.skipped:
                self._skipped(update.skipped, batch.ids)
                continue
            progress.step += 1
            progress.nonfinite_in_a_row = progress.oom_in_a_row = 0
            utterances += len(batch.ids) * cfg.accum_grad
            bar.set_postfix(loss=f"{outcome.loss:.3f}", utt_per_s=f"{utterances / max(time.time() - start, 1e-9):.1f}")
            self._log_step(outcome.loss, update, epoch, rates)
            if cfg.save_every_steps and progress.step % cfg.save_every_steps == 0:
                self._save_last()
            if self._reached_max_steps():
                break
        bar.close()
        if self._reached_max_steps() and progress.batch_in_epoch < len(sampler):
            self._save_last()
            return False
        metrics = self.validate()  # the epoch is complete
        progress.epoch += 1
        progress.batch_in_epoch = 0
        return self._end_of_epoch(epoch, metrics)

    def _logs_step(self, step: int) -> bool:
        """Whether optimizer step ``step`` is logged to TensorBoard."""
        return self.writer is not None and (step % self.train_cfg.log_every_steps == 0 or step == 1)

    def _log_step(self, loss: float, update, epoch: int, rates: dict[str, float]) -> None:
        step = self.progress.step
        if not self._logs_step(step):
            return
        lr = self.optimizer.param_groups[0]["lr"]
        with writing(self._event_file()):
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/lr", lr, step)
            self.writer.add_scalar("train/grad_norm", update.grad_norm, step)
            for group, norm in (update.group_norms or {}).items():
                self.writer.add_scalar(f"grad_norm/{group}", norm, step)
            for name, rate in rates.items():  # the scheduled regularisers' rates this update was made with
                self.writer.add_scalar(f"train/{name}", rate, step)
        logger.info("epoch %d step %d loss %.4f lr %.3g", epoch, step, loss, lr)

    def _count_skips(self, batch) -> None:
        """Log each training item whose audio failed where it was read, and count it by reason for the epoch."""
        for skip in batch.skipped:
            logger.warning("training item skipped at epoch %d: %s [%s]", self.progress.epoch, skip.message, skip.reason)
            self.progress.count_skip(skip.reason)

    def _skipped(self, why: str, ids: list[str]) -> None:
        """A step that did not reach the weights: logged with its utterances; non-finite ones are counted."""
        progress = self.progress
        logger.warning(
            "%s at epoch %d batch %d; step skipped, weights unchanged (utterances: %s)",
            why, progress.epoch, progress.batch_in_epoch, describe(ids),
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

    def validate(self) -> dict[str, float]:
        """Validation loss (token-weighted) and WER/CER on rank 0 (shared with the other ranks)."""
        metrics: dict[str, float] = {}
        if self.dist.is_main and len(self.data.valid_set) > 0:
            loader = self._loader(self.data.valid_batches, self.data.valid_set, 0)
            options = DecodingOptions(beam_size=self.train_cfg.valid_beam_size)
            result = validate(self.raw_model, loader, self.tokenizer, self.device, options, self.train_cfg.valid_max_utterances)
            if result.skipped:
                result.skipped.log("validation")
            metrics = result.metrics
        if self.dist.enabled:
            shared = [metrics]
            torch.distributed.broadcast_object_list(shared, src=0)
            metrics = shared[0]
        return metrics

    def _end_of_epoch(self, epoch: int, metrics: dict[str, float]) -> bool:
        """Log, rank and checkpoint the finished epoch. Returns True when early stopping fires."""
        cfg, progress = self.train_cfg, self.progress
        started, before = self._clock
        progress.seconds = before + time.time() - started
        skipped_text = progress.skipped_text()
        if metrics:
            logger.info(
                "epoch %d: valid loss %.4f, WER %.2f%%, CER %.2f%%; %s",
                epoch, metrics["valid_loss"], 100 * metrics["valid_wer"], 100 * metrics["valid_cer"], skipped_text,
            )
            value = metrics[cfg.best_metric]
            improved = not progress.best or value < progress.best[0][0]
            progress.epochs_without_improvement = 0 if improved else progress.epochs_without_improvement + 1
            progress.best = sorted(progress.best + [(value, epoch)])[: cfg.keep_best]
        else:
            logger.info("epoch %d done; %s", epoch, skipped_text)
        if self.writer is not None:
            figures = alignment_figures(self.raw_model, self.data.valid_set, self.tokenizer, self.device) if metrics else []
            with writing(self._event_file()):
                write_epoch_summaries(self.writer, self.exp_dir, epoch, progress, metrics, figures)
        progress.skipped_in_epoch = {}
        if self.dist.is_main:
            # epoch{E}.pt can be resumed from, should last.pt be unreadable (see _resume_fallback)
            extra = {"metric": metrics.get(cfg.best_metric), "metric_name": cfg.best_metric, "epoch": epoch,
                     "step": progress.step, **self._training_state()}
            save_epoch_checkpoints(self.exp_dir, epoch, self._payload(extra), cfg.keep_last, {e for _, e in progress.best})
        self._save_last()
        patience = cfg.early_stopping_patience
        if patience is not None and progress.epochs_without_improvement >= patience:
            logger.info("early stopping: no improvement of %s for %d epochs", cfg.best_metric, patience)
            return True
        return False

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
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
        }

    def _save_last(self) -> None:
        if not self.dist.is_main:
            return
        save_checkpoint(self.exp_dir / "last.pt", self._payload(self._training_state()))

    def _event_file(self) -> Path:
        """The TensorBoard event file being written (for an error naming it)."""
        writer = getattr(getattr(self.writer, "file_writer", None), "event_writer", None)
        return Path(getattr(writer, "_file_name", self.exp_dir / "tensorboard"))

    def _restore(self, state: dict) -> None:
        self.raw_model.load_state_dict(state["model"])
        training = state.get("training") or {}
        if "optimizer" not in training:
            raise TrainingError(f"{self.exp_dir / 'last.pt'} has no optimizer state; it cannot be resumed")
        self.optimizer.load_state_dict(training["optimizer"])
        self.scheduler.load_state_dict(training["scheduler"])
        self.progress = Progress(**training["progress"])
        self.progress.best = [tuple(b) for b in self.progress.best]
        set_rng_state(training["rng"])
        logger.info("resumed at epoch %d, batch %d, step %d", self.progress.epoch, self.progress.batch_in_epoch, self.progress.step)


def training_lengths(utterances) -> dict[str, float]:
    """The longest and the mean training utterance in seconds, as a checkpoint records them."""
    durations = [u.duration for u in utterances]
    if not durations:
        return {}
    return {"longest_utterance_seconds": max(durations), "mean_utterance_seconds": sum(durations) / len(durations)}


def write_epoch_summaries(writer, exp_dir: Path, epoch: int, progress: Progress, metrics: dict[str, float],
                          figures) -> None:
    """TensorBoard at the end of an epoch, at step epoch + 1: the skip count, the validation metrics
    with the optimizer steps and minutes so far, and the attention ``figures`` ((utterance id,
    figure) pairs), which also go to ``exp_dir/alignment_<utterance>.png``."""
    writer.add_scalar("train/skipped_utterances", sum(progress.skipped_in_epoch.values()), epoch + 1)
    for name, value in metrics.items():
        writer.add_scalar(name.replace("valid_", "valid/"), value, epoch + 1)
    if metrics:
        writer.add_scalar("valid/step", progress.step, epoch + 1)
        writer.add_scalar("valid/minutes", progress.seconds / 60, epoch + 1)
    for utt_id, figure in figures:
        picture = io.BytesIO()
        figure.savefig(picture, format="png", dpi=100)
        atomic_write(exp_dir / alignment_file_name(utt_id), picture.getvalue())  # whole or not at all
        writer.add_figure(f"alignment/{utt_id}", figure, epoch + 1)  # closes the figure
    writer.flush()
def regularisation_progress(model: torch.nn.Module, cfg, batches_per_epoch: int, step: int) -> dict[str, float]:
    """Tell a model with scheduled regularisers (DropHead) where training stands, before a batch of the
    update after ``step`` completed ones; returns their rates now (empty for other models)."""
    if not isinstance(model, ScheduledRegularisation):
        return {}
    return model.set_regularisation_progress(step, planned_updates(cfg, batches_per_epoch), warmup_updates(cfg.scheduler))


def planned_updates(cfg, batches_per_epoch: int) -> int:
    """Optimizer steps the run is planned to take: ``max_epochs`` epochs (each ends with its partial
    accumulation applied), or ``max_steps`` when that comes first. Early stopping may end it sooner."""
    total = cfg.max_epochs * math.ceil(batches_per_epoch / cfg.accum_grad)
    return total if cfg.max_steps is None else min(total, cfg.max_steps)


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return kind(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


def setup_logging(log_file: Path | None) -> None:
    """Log INFO and up to stderr (and to ``log_file``), replacing the handlers an earlier Trainer set."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        if getattr(handler, "_asr_handler", False):
            root.removeHandler(handler)
            handler.close()
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    handlers = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        handlers.append(_LogFileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler._asr_handler = True
        root.addHandler(handler)


class _LogFileHandler(logging.FileHandler):
    """``train.log``: when a record cannot be written (a full disk), say so once on stderr and stop
    writing the file, instead of logging's traceback for every record; stderr still gets them all."""

    def handleError(self, record) -> None:
        if not getattr(self, "_failed", False):
            self._failed = True
            err = sys.exc_info()[1]
            sys.stderr.write(f"warning: cannot write {self.baseFilename}: {getattr(err, 'strerror', None) or err}; "
                             "the log goes on on stderr only\n")

    def emit(self, record) -> None:
        if not getattr(self, "_failed", False):
            super().emit(record)

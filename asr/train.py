"""Train a recogniser from a YAML recipe.

Single process (CPU or one GPU)::

    python -m asr.train recipes/fsdd_las.yaml [key.sub=value ...] [--resume]

Several processes with DistributedDataParallel (gloo on CPU, nccl on GPUs)::

    torchrun --nproc_per_node=2 -m asr.train recipes/fsdd_las.yaml

The experiment directory (``exp_dir``) receives the resolved ``config.yaml``,
``train.log``, TensorBoard event files (``train/loss``, ``train/lr``,
``train/grad_norm`` per optimizer step; ``valid/loss``, ``valid/wer``,
``valid/cer`` per epoch), ``last.pt`` (everything needed to resume),
``epoch{E}.pt`` for the last ``train.keep_last`` epochs and the best
``train.keep_best`` epochs as ``best_epoch{E}.pt``. Every checkpoint carries the
config, tokenizer and feature pipeline, so any of them can be used for inference.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from torch.utils.data import DataLoader
from tqdm import tqdm

from asr.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from asr.config import ConfigError
from asr.data.corpus import build_tokenizer, load_split
from asr.data.batching import BucketBatchSampler, collate
from asr.data.dataset import SpeechDataset, compute_global_stats, prepare_utterances
from asr.data.report import DataError, SkipReport
from asr.data.tokenizer import tokenizer_from_state_dict
from asr.decoding import decode
from asr.experiment import ExperimentConfig, build_model, experiment_config_to_dict, load_experiment_config
from asr.metrics import error_rates
from asr.schedulers import build_scheduler
from features.pipeline import FeaturePipeline

logger = logging.getLogger("asr.train")


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite steps in a row)."""


@dataclass
class Progress:
    """Where the run is; saved in ``last.pt`` so ``--resume`` continues from here."""

    epoch: int = 0                 # current epoch (0-based)
    batch_in_epoch: int = 0        # batches of this epoch already consumed
    step: int = 0                  # optimizer steps taken
    nonfinite_in_a_row: int = 0
    epochs_without_improvement: int = 0
    best: list = field(default_factory=list)  # [(metric, epoch)], best first, at most keep_best
    skipped_in_epoch: dict = field(default_factory=dict)  # reason -> training items skipped so far this epoch


# ---------------------------------------------------------------------------- distributed


@dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_kind: str) -> Distributed:
    """Join the process group torchrun describes in the environment, if any."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed()
    backend = "nccl" if device_kind == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    return Distributed(rank=dist.get_rank(), world_size=world_size, local_rank=int(os.environ.get("LOCAL_RANK", 0)))


def resolve_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)


# ---------------------------------------------------------------------------- the trainer


class Trainer:
    """Owns the model, the optimiser and the loops; one instance per process."""

    def __init__(self, config: ExperimentConfig, resume: bool = False):
        self.config = config
        self.train_cfg = config.train
        requested = config.train.device
        kind = "cuda" if (requested == "auto" and torch.cuda.is_available()) or requested.startswith("cuda") else "cpu"
        self.dist = init_distributed(kind)
        self.device = resolve_device(requested, self.dist.local_rank)
        self.exp_dir = Path(config.exp_dir)
        self.exp_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(self.exp_dir / "train.log" if self.dist.is_main else None)
        self.progress = Progress()

        resume_state = None
        if resume:
            last = self.exp_dir / "last.pt"
            if not last.is_file():
                raise TrainingError(f"--resume: no checkpoint to resume from at {last}")
            resume_state = load_checkpoint(last)
            logger.info("resuming from %s", last)
        elif (self.exp_dir / "last.pt").exists():
            raise TrainingError(
                f"{self.exp_dir} already holds a run (last.pt); pass --resume to continue it or choose another exp_dir"
            )

        seed_everything(self.train_cfg.seed)
        if self.dist.is_main:
            with open(self.exp_dir / "config.yaml", "w") as f:
                yaml.safe_dump(experiment_config_to_dict(config), f, sort_keys=False)

        self._build_data(resume_state)
        self.model = build_model(config.model, self.pipeline.feature_dim, self.tokenizer).to(self.device)
        self.raw_model = self.model
        if self.dist.enabled:
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.optimizer = build_optimizer(self.raw_model, self.train_cfg)
        self.scheduler = build_scheduler(
            self.optimizer, self.train_cfg.scheduler, d_model=getattr(config.model, "d_model", None)
        )
        self.use_amp = self.train_cfg.amp and self.device.type == "cuda"
        self._last_grad_norm = 0.0
        logger.info(
            "model: %s, %.2fM parameters; features: %d-dim; vocabulary: %d",
            config.model.type,
            sum(p.numel() for p in self.raw_model.parameters()) / 1e6,
            self.pipeline.feature_dim,
            self.tokenizer.vocab_size,
        )
        if resume_state is not None:
            self._restore(resume_state)
        self.writer = None
        if self.dist.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.exp_dir / "tensorboard"))

    # ------------------------------------------------------------------ data

    def _build_data(self, resume_state: dict | None) -> None:
        data_cfg = self.config.data
        train_utts, train_report = load_split(data_cfg, "train")
        if resume_state is not None:
            # The tokenizer and the MVN statistics are part of the run: reuse, never rebuild.
            self.tokenizer = tokenizer_from_state_dict(resume_state["tokenizer"])
            self.pipeline = FeaturePipeline.from_state_dict(resume_state["features"])
        else:
            self.tokenizer = build_tokenizer(data_cfg, [u.text for u in train_utts if u.text])
        train_utts, _ = prepare_utterances(train_utts, data_cfg, self.tokenizer, train_report, name="train")
        if not train_utts:
            raise DataError(
                f"no usable training utterances (data.train={data_cfg.train}, "
                f"data.fsdd={data_cfg.fsdd!r})"
            )
        if resume_state is None:
            self.pipeline = FeaturePipeline(self.config.features)
            if self.config.features.mvn == "global":
                logger.info("accumulating global MVN statistics over %d training utterances", len(train_utts))
                stats_report = SkipReport(strict=data_cfg.strict)
                compute_global_stats(train_utts, self.pipeline, data_cfg.num_workers, stats_report)
                stats_report.log("global MVN statistics")
        valid_utts, valid_report = load_split(data_cfg, "dev")
        valid_utts, _ = prepare_utterances(
            valid_utts, data_cfg, self.tokenizer, valid_report, limit_duration=False, name="dev"
        )
        self.train_set = SpeechDataset(
            train_utts, self.pipeline, self.tokenizer, train=True, seed=data_cfg.seed, strict=data_cfg.strict
        )
        self.valid_set = SpeechDataset(
            valid_utts, self.pipeline, self.tokenizer, train=False, seed=data_cfg.seed, strict=data_cfg.strict
        )
        self.sampler = BucketBatchSampler(
            self.train_set.num_frames(),
            data_cfg.max_frames_per_batch,
            shuffle=True,
            seed=data_cfg.seed,
            num_replicas=self.dist.world_size,
            rank=self.dist.rank,
        )
        self.valid_batches = list(
            BucketBatchSampler(self.valid_set.num_frames(), data_cfg.max_frames_per_batch, shuffle=False)
        )
        logger.info("train: %d utterances, dev: %d utterances", len(train_utts), len(valid_utts))

    def _loader(self, batches, dataset, epoch: int) -> DataLoader:
        workers = self.config.data.num_workers
        # A private generator: creating the iterator must not draw from the global
        # RNG, or a resumed run's dropout masks would differ from the uninterrupted run's.
        generator = torch.Generator().manual_seed(self.config.data.seed + epoch)
        return DataLoader(
            dataset,
            batch_sampler=batches,
            collate_fn=collate,
            num_workers=workers,
            persistent_workers=False,
            generator=generator,
            pin_memory=self.device.type == "cuda",
        )

    # ------------------------------------------------------------------ loops

    def fit(self) -> Progress:
        cfg = self.train_cfg
        try:
            while self.progress.epoch < cfg.max_epochs and not self._reached_max_steps():
                if self._train_epoch():  # early stopping fired
                    break
        finally:
            if self.writer is not None:
                self.writer.close()
        logger.info("training finished after %d steps (epoch %d)", self.progress.step, self.progress.epoch)
        return self.progress

    def _reached_max_steps(self) -> bool:
        return self.train_cfg.max_steps is not None and self.progress.step >= self.train_cfg.max_steps

    def _train_epoch(self) -> bool:
        """One epoch (or its remainder after a resume). Returns True when early stopping fired."""
        cfg = self.train_cfg
        epoch = self.progress.epoch
        self.sampler.set_epoch(epoch)
        self.train_set.set_epoch(epoch)
        batches = list(self.sampler)[self.progress.batch_in_epoch :]
        loader = self._loader(batches, self.train_set, epoch)
        self.model.train()
        bar = tqdm(total=len(batches), desc=f"epoch {epoch}", disable=None if self.dist.is_main else True, leave=False)
        accumulated = 0
        utterances, start = 0, time.time()
        for batch in loader:
            self.progress.batch_in_epoch += 1
            accumulated += 1
            self._count_skips(batch)
            loss_value = self._forward_backward(batch, scale=1.0 / cfg.accum_grad)
            bar.update(1)
            if loss_value is None:
                accumulated = 0
                self.optimizer.zero_grad(set_to_none=True)
                continue
            last_batch = self.progress.batch_in_epoch == len(self.sampler)
            if accumulated < cfg.accum_grad and not last_batch:
                continue
            # A partial accumulation at the end of the epoch is applied, not carried over.
            accumulated = 0
            if not self._optimizer_step(batch.ids):
                continue
            step = self.progress.step
            utterances += len(batch.ids) * cfg.accum_grad
            bar.set_postfix(loss=f"{loss_value:.3f}", utt_per_s=f"{utterances / max(time.time() - start, 1e-9):.1f}")
            if self.writer is not None and (step % cfg.log_every_steps == 0 or step == 1):
                self.writer.add_scalar("train/loss", loss_value, step)
                self.writer.add_scalar("train/lr", self.optimizer.param_groups[0]["lr"], step)
                self.writer.add_scalar("train/grad_norm", self._last_grad_norm, step)
                logger.info("epoch %d step %d loss %.4f lr %.3g", epoch, step, loss_value, self.optimizer.param_groups[0]["lr"])
            if cfg.save_every_steps and step % cfg.save_every_steps == 0:
                self._save_last()
            if self._reached_max_steps():
                break
        bar.close()
        if self._reached_max_steps() and self.progress.batch_in_epoch < len(self.sampler):
            self._save_last()
            return False
        # The epoch is complete.
        metrics = self.validate()
        self.progress.epoch += 1
        self.progress.batch_in_epoch = 0
        stop = self._end_of_epoch(epoch, metrics)
        return stop

    def _count_skips(self, batch) -> None:
        """Log each training item whose audio failed where it was read, and count it by reason for the epoch."""
        counts = self.progress.skipped_in_epoch
        for skip in batch.skipped:
            logger.warning("training item skipped at epoch %d: %s [%s]", self.progress.epoch, skip.message, skip.reason)
            counts[skip.reason] = counts.get(skip.reason, 0) + 1

    def _forward_backward(self, batch, scale: float) -> float | None:
        """Loss and gradients of one batch; None when the loss is not finite or no item is left (batch skipped)."""
        usable = torch.tensor(float(len(batch) > 0), device=self.device)
        if self.dist.enabled:
            dist.all_reduce(usable, op=dist.ReduceOp.MIN)  # every rank skips together, or none does
        if usable.item() == 0:
            logger.warning("batch %d of epoch %d lost all its utterances; skipped", self.progress.batch_in_epoch, self.progress.epoch)
            return None
        batch = batch.to(self.device)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.use_amp):
            output = self.model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
        loss = output.loss
        finite = torch.isfinite(loss.detach()).float()
        if self.dist.enabled:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if finite.item() == 0:
            self._nonfinite(f"non-finite loss {loss.item()}", batch.ids)
            return None
        (loss * scale).backward()
        value = loss.detach()
        if self.dist.enabled:
            dist.all_reduce(value)
            value /= self.dist.world_size
        return float(value)

    def _optimizer_step(self, ids: list[str]) -> bool:
        """Clip, check and apply the accumulated gradients. False when they were not finite."""
        params = [p for p in self.raw_model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.train_cfg.grad_clip if self.train_cfg.grad_clip > 0 else float("inf"))
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            self._nonfinite(f"non-finite gradient norm {norm.item()}", ids)
            return False
        self._last_grad_norm = float(norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.step += 1
        self.progress.nonfinite_in_a_row = 0
        return True

    def _nonfinite(self, what: str, ids: list[str]) -> None:
        self.progress.nonfinite_in_a_row += 1
        shown = ", ".join(ids[:8]) + (f" ... ({len(ids)} utterances)" if len(ids) > 8 else "")
        logger.warning(
            "%s at epoch %d batch %d; step skipped, weights unchanged (utterances: %s)",
            what, self.progress.epoch, self.progress.batch_in_epoch, shown,
        )
        limit = self.train_cfg.max_nonfinite_in_a_row
        if self.progress.nonfinite_in_a_row >= limit:
            raise TrainingError(
                f"{self.progress.nonfinite_in_a_row} non-finite steps in a row (train.max_nonfinite_in_a_row={limit}); "
                f"last batch: {shown}. Lower train.lr, check the data, or enable gradient clipping."
            )

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation loss (token-weighted) and greedy/beam WER and CER, on rank 0."""
        metrics: dict[str, float] = {}
        if self.dist.is_main and len(self.valid_set) > 0:
            model = self.raw_model
            model.eval()
            total, tokens = 0.0, 0
            refs, hyps = [], []
            limit = self.train_cfg.valid_max_utterances
            skipped = SkipReport()
            for batch in self._loader(self.valid_batches, self.valid_set, 0):
                for skip in batch.skipped:
                    skipped.add(skip)
                if len(batch) == 0:
                    continue
                batch = batch.to(self.device)
                output = model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
                total += float(output.loss) * output.num_tokens
                tokens += output.num_tokens
                if limit is None or len(refs) < limit:
                    hyp_ids = decode(model, batch.features, batch.feature_lengths, beam_size=self.train_cfg.valid_beam_size)
                    hyps += [self.tokenizer.decode(h) for h in hyp_ids]
                    refs += [self.tokenizer.decode(t[:n].tolist()) for t, n in zip(batch.tokens, batch.token_lengths)]
            metrics["valid_loss"] = total / max(tokens, 1)
            rates = error_rates(refs, hyps)
            metrics["valid_wer"], metrics["valid_cer"] = rates["wer"], rates["cer"]
            if skipped:
                skipped.log("validation")
            model.train()
        if self.dist.enabled:
            shared = [metrics]
            dist.broadcast_object_list(shared, src=0)
            metrics = shared[0]
        return metrics

    def _end_of_epoch(self, epoch: int, metrics: dict[str, float]) -> bool:
        cfg = self.train_cfg
        progress = self.progress
        improved = False
        skipped = sum(progress.skipped_in_epoch.values())
        skipped_text = f"{skipped} training utterance(s) skipped" + (
            " (" + ", ".join(f"{n} {reason}" for reason, n in sorted(progress.skipped_in_epoch.items())) + ")"
            if skipped else ""
        )
        if self.writer is not None:
            self.writer.add_scalar("train/skipped_utterances", skipped, epoch + 1)
        if metrics:
            value = metrics[cfg.best_metric]
            logger.info(
                "epoch %d: valid loss %.4f, WER %.2f%%, CER %.2f%%; %s",
                epoch, metrics["valid_loss"], 100 * metrics["valid_wer"], 100 * metrics["valid_cer"], skipped_text,
            )
            if self.writer is not None:
                for name, v in metrics.items():
                    self.writer.add_scalar(name.replace("valid_", "valid/"), v, epoch + 1)
                self.writer.flush()
            improved = not progress.best or value < progress.best[0][0]
            progress.epochs_without_improvement = 0 if improved else progress.epochs_without_improvement + 1
            progress.best = sorted(progress.best + [(value, epoch)])[: cfg.keep_best]
        if self.dist.is_main:
            extra = {"metric": metrics.get(cfg.best_metric), "metric_name": cfg.best_metric, "epoch": epoch, "step": progress.step}
            save_checkpoint(self.exp_dir / f"epoch{epoch}.pt", self._payload(training=extra))
            stale = self.exp_dir / f"epoch{epoch - cfg.keep_last}.pt"
            if stale.exists():
                stale.unlink()
            kept = {e for _, e in progress.best}
            if epoch in kept:
                save_checkpoint(self.exp_dir / f"best_epoch{epoch}.pt", self._payload(training=extra))
            for path in self.exp_dir.glob("best_epoch*.pt"):
                if int(path.stem.removeprefix("best_epoch")) not in kept:
                    path.unlink()
        if not metrics:
            logger.info("epoch %d done; %s", epoch, skipped_text)
        progress.skipped_in_epoch = {}
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
            "training": training,
        }

    def _save_last(self) -> None:
        if not self.dist.is_main:
            return
        training = {
            "progress": vars(self.progress).copy(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
        }
        save_checkpoint(self.exp_dir / "last.pt", self._payload(training=training))

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


# ---------------------------------------------------------------------------- helpers


def build_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return kind(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def rng_state() -> dict:
    """Every RNG the run draws from, as tensors and plain numbers (checkpoints hold nothing else)."""
    import numpy as np

    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` saved."""
    import numpy as np

    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    numpy = state["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["kind"], keys, numpy["position"], numpy["has_gauss"], numpy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def setup_logging(log_file: Path | None) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        if getattr(handler, "_asr_handler", False):
            root.removeHandler(handler)
            handler.close()
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    handlers = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler._asr_handler = True
        root.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asr.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="recipe YAML (e.g. recipes/fsdd_las.yaml)")
    parser.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    parser.add_argument("--resume", action="store_true", help="continue the run in exp_dir from last.pt")
    args = parser.parse_args(argv)
    try:
        config = load_experiment_config(args.recipe, args.overrides)
        trainer = Trainer(config, resume=args.resume)
        trainer.fit()
    except (CheckpointError, ConfigError, DataError, TrainingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The end of an epoch: ranking it, deciding whether to stop, and its checkpoints.

``train.best_metric`` names any validation metric (:mod:`asr.training.metrics`), which says itself
whether higher is better; the ranking, early stopping (``train.early_stopping_patience`` epochs
without improvement) and the ``best_epoch{E}.pt`` files follow it. ``epoch{E}.pt`` is written for the
last ``train.keep_last`` epochs (numbered from 1), before anything else can fail, and ``last.pt`` after it. An epoch
whose validation scored nothing (every decoded dev utterance unreadable, say) is still checkpointed;
it is only left out of the ranking.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from asr.checkpoints.io import save_epoch_checkpoints
from asr.training.metrics import higher_is_better, is_better, ranking_key
from asr.training.state import Progress

logger = logging.getLogger("asr.train")


class EpochEnd:
    """Ranks epochs by ``best_metric``, keeps their checkpoints, and says when to stop early."""

    def __init__(self, exp_dir: Path, best_metric: str, keep_best: int, keep_last: int,
                 patience: int | None, main: bool):
        self.exp_dir = exp_dir
        self.best_metric = best_metric
        self.keep_best = keep_best
        self.keep_last = keep_last
        self.patience = patience
        self.main = main

    def rank(self, progress: Progress, epoch: int, metrics: dict[str, float]) -> None:
        """Enter ``epoch`` into ``progress.best`` (the ``keep_best`` best, best first) and count the
        epochs without improvement; an epoch without ``best_metric`` is not ranked."""
        value = metrics.get(self.best_metric)
        if value is None:
            if metrics:
                logger.warning("epoch %d has no %s (train.best_metric) to rank it by", epoch, self.best_metric)
            return
        improved = not progress.best or is_better(self.best_metric, value, progress.best[0][0])
        progress.epochs_without_improvement = 0 if improved else progress.epochs_without_improvement + 1
        ranked = sorted(progress.best + [(value, epoch)], key=lambda entry: (ranking_key(self.best_metric, entry[0]), entry[1]))
        progress.best = ranked[: self.keep_best]

    def checkpoint(self, epoch: int, progress: Progress, metrics: dict[str, float],
                   payload: Callable[[dict], dict], training_state: dict) -> None:
        """``epoch{E}.pt`` (resumable) and the ``best_epoch{E}.pt`` files (rank 0 only)."""
        if not self.main:
            return
        extra = {"metric": metrics.get(self.best_metric), "metric_name": self.best_metric,
                 "higher_is_better": higher_is_better(self.best_metric), "epoch": epoch, "step": progress.step,
                 **training_state}
        save_epoch_checkpoints(self.exp_dir, epoch, payload(extra), self.keep_last, {e for _, e in progress.best})

    def should_stop(self, progress: Progress) -> bool:
        if self.patience is not None and progress.epochs_without_improvement >= self.patience:
            logger.info("early stopping: no improvement of %s for %d epochs", self.best_metric, self.patience)
            return True
        return False

"""Training: the one training step, the loop around it, and what a run keeps to resume."""

from asr.training.step import StepOutcome, TrainingStep
from asr.training.trainer import Trainer, TrainingError

__all__ = ["StepOutcome", "Trainer", "TrainingError", "TrainingStep"]

"""Training: the one training step, the loop around it, and what a run keeps to resume.

The names below are imported when first used, so that the recipe's config (:mod:`asr.experiment`)
can read the schedules and metrics defined here without importing the trainer.
"""

__all__ = ["StepOutcome", "Trainer", "TrainingError", "TrainingStep"]


def __getattr__(name: str):
    if name in ("StepOutcome", "TrainingStep"):
        from asr.training import step

        return getattr(step, name)
    if name == "Trainer":
        from asr.training import trainer

        return trainer.Trainer
    if name == "TrainingError":
        from asr.training import errors

        return errors.TrainingError
    raise AttributeError(f"module 'asr.training' has no attribute {name!r}")

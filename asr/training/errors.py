"""The error that ends a run which cannot go on."""


class TrainingError(RuntimeError):
    """The run cannot go on (too many non-finite steps in a row, no checkpoint to resume from, ...)."""

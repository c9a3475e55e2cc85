"""Kept for old imports (``from asr.checkpointing import ...``, as asr/training/ still writes): the checkpoint
writer and reader is :mod:`asr.checkpoints.io`. A checkpoint holds plain data only, so no file names this path."""
from asr.checkpoints.io import *  # noqa: F401,F403

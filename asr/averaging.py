"""Kept for old imports (``from asr.averaging import ...``, as asr/training/ still writes): checkpoint
averaging is :mod:`asr.checkpoints.averaging`."""
from asr.checkpoints.averaging import *  # noqa: F401,F403

"""Kept for old imports (``from asr.metrics import ...``, as asr/training/metrics.py still writes): word and
character error rates are :mod:`asr.decoding.scoring`."""
from asr.decoding.scoring import *  # noqa: F401,F403

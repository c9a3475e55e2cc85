"""The learning-rate schedule's old home, kept so that ``from asr.schedulers import ...`` still works.

The learning rate is one schedule among the others: ``train.scheduler`` is read in
:mod:`asr.training.schedules` and its kinds are shapes of :mod:`asr.training.shapes`, where their
formulas are written out.
"""

from asr.training.schedules import (  # noqa: F401
    COOLDOWN_KINDS,
    SCHEDULE_KINDS,
    SchedulerConfig,
    build_scheduler,
    warmup_updates,
)
from asr.training.shapes import cooldown_factor, planned_share  # noqa: F401

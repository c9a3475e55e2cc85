"""Training: the loop and what it consults, one concern to a module.

``trainer`` (the loop, :class:`~asr.training.trainer.Trainer`), ``step`` (the one training step, shared with
speaker adaptation), ``hooks`` (the events that what watches or steers a run answers), ``config`` (the
``train:`` section), ``data``, ``plan``, ``schedules``, ``skips``, ``timing``, ``validation``, ``metrics``,
``epoch_end``, ``reporting``, ``resume``, ``state``, ``signals``, ``runlock``, ``distributed``, ``errors``.
Names are imported from their modules (``from asr.training.trainer import Trainer``); the run is built
above this package (:mod:`asr.run`), which nothing here imports, nor :mod:`asr.experiment`.
"""

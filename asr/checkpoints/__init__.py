"""Checkpoint files: the one writer and reader (:mod:`asr.checkpoints.io`: plain data only, no code runs on
load; the epoch and best checkpoints a run keeps; the converter of older formats) and the averaging of
several of them (:mod:`asr.checkpoints.averaging`, ``python -m asr.average``)."""

"""The one checkpoint writer and reader.

A checkpoint is self-contained: it carries the resolved experiment config, the
model weights, the tokenizer and the feature pipeline (config plus global MVN
statistics), so inference needs nothing but the file. Training checkpoints
(``last.pt``) additionally carry optimizer, scheduler, RNG states and progress
so ``--resume`` continues exactly where the run stopped.

Layout of the saved dict::

    format_version: int
    config:     plain dict of the ExperimentConfig (asr.experiment)
    model:      model state_dict
    tokenizer:  tokenizer.state_dict()
    features:   FeaturePipeline.state_dict()
    training:   optional dict (optimizer, scheduler, scaler, progress, rng)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or not one of ours; names the file."""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically: a temporary file in the same folder, then rename.

    A reader (or a run killed mid-write) never sees a half-written ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format_version": FORMAT_VERSION, **payload}
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU; a clear error if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises many types for a corrupt file
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise CheckpointError(f"{path} is not a checkpoint written by this toolkit")
    return payload

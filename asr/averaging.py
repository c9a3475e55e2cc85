"""Average the weights of several checkpoints of one run (``python -m asr.average``, :mod:`asr.cli.average`).

``--last N`` takes the N newest epoch checkpoints (``epoch{E}.pt``; the trainer
keeps ``train.keep_last`` of them), ``--best N`` the N best-scoring
``best_epoch{E}.pt`` (ranked by ``payload["training"]["metric"]``, the
validation metric named by ``train.best_metric``, in the direction its checkpoint records
(``training.higher_is_better``; lower is better for checkpoints of older versions); the trainer
keeps ``train.keep_best`` of them).

Floating-point weights are averaged (in float64, then cast back). Integer
buffers are counters such as BatchNorm's ``num_batches_tracked``, whose mean
means nothing, so they are taken from the newest checkpoint. The result
carries the config, tokenizer and feature pipeline of the newest checkpoint
and no optimizer state (it is for inference, not for ``--resume``); it is
written atomically, by default as ``avg_last{N}.pt`` / ``avg_best{N}.pt`` in
the run folder. All inputs must come from the same model config with the
same parameter names and shapes; anything else is an error naming the file.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from asr.checkpointing import CheckpointError, load_checkpoint

EPOCH_PREFIX = "epoch"
BEST_PREFIX = "best_epoch"


def epoch_of(path: Path, prefix: str) -> int | None:
    """E of ``{prefix}{E}.pt``, or None for any other name (``epoch3_copy.pt`` is not ours)."""
    number = path.stem.removeprefix(prefix)
    return int(number) if path.stem.startswith(prefix) and number.isdigit() else None


def _numbered(exp_dir: Path, prefix: str) -> list[tuple[int, Path]]:
    found = [(epoch_of(p, prefix), p) for p in exp_dir.glob(f"{prefix}*.pt")]
    return sorted((e, p) for e, p in found if e is not None)


def select_checkpoints(exp_dir: str | Path, last: int | None = None, best: int | None = None) -> list[Path]:
    """The checkpoint files to average, oldest epoch first (so the newest is last)."""
    exp_dir = Path(exp_dir)
    if (last is None) == (best is None):
        raise ValueError("give exactly one of last, best")
    if not exp_dir.is_dir():
        raise CheckpointError(f"experiment folder not found: {exp_dir}")
    if last is not None:
        epochs = _numbered(exp_dir, EPOCH_PREFIX)
        if len(epochs) < last:
            raise CheckpointError(
                f"{exp_dir}: asked for the last {last} checkpoints but found {len(epochs)} {EPOCH_PREFIX}{{E}}.pt"
                " (the trainer keeps train.keep_last of them)"
            )
        return [p for _, p in epochs[-last:]]
    ranked = []
    for epoch, path in _numbered(exp_dir, BEST_PREFIX):
        training = load_checkpoint(path).get("training") or {}
        metric = training.get("metric")
        if not isinstance(metric, (int, float)):
            raise CheckpointError(f"{path} has no validation metric (training.metric) to rank it by")
        sign = -1.0 if training.get("higher_is_better") else 1.0
        # A non-finite metric ranks last; ties go to the earlier epoch, as in the trainer's own ranking.
        ranked.append((not math.isfinite(metric), sign * metric, epoch, path))
    if len(ranked) < best:
        raise CheckpointError(
            f"{exp_dir}: asked for the best {best} checkpoints but found {len(ranked)} {BEST_PREFIX}{{E}}.pt"
            " (the trainer keeps train.keep_best of them)"
        )
    chosen = sorted(ranked)[:best]
    return [path for *_, path in sorted(chosen, key=lambda r: r[2])]


def average_checkpoints(paths: list[str | Path]) -> dict:
    """A checkpoint payload: the newest (last) of ``paths`` with its model's floating-point tensors
    replaced by the element-wise mean over all of ``paths``."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    paths = [Path(p) for p in paths]
    states = [load_checkpoint(p) for p in paths]
    newest, newest_path = states[-1], paths[-1]
    reference = newest["model"]
    for path, state in zip(paths, states):
        if state["config"].get("model") != newest["config"].get("model"):
            raise CheckpointError(f"{path} has another model config than {newest_path}: their weights cannot be averaged")
        names = set(state["model"])
        if names != set(reference):
            diff = sorted(names ^ set(reference))
            raise CheckpointError(f"{path} and {newest_path} hold different parameters (e.g. {diff[0]})")
        for name, tensor in state["model"].items():
            if tensor.shape != reference[name].shape:
                raise CheckpointError(
                    f"{name} has shape {tuple(tensor.shape)} in {path} but {tuple(reference[name].shape)} in {newest_path}"
                )
    averaged = {}
    for name, tensor in reference.items():
        if tensor.is_floating_point():
            total = torch.zeros_like(tensor, dtype=torch.float64)
            for state in states:
                total += state["model"][name].to(torch.float64)
            averaged[name] = (total / len(states)).to(tensor.dtype)
        else:
            averaged[name] = tensor.clone()
    return {
        "config": newest["config"],
        "model": averaged,
        "tokenizer": newest["tokenizer"],
        "features": newest["features"],
        **{key: newest[key] for key in ("longest_utterance_seconds", "mean_utterance_seconds") if key in newest},
        # No optimizer state: a record of what was averaged, for the reader of the file.
        "training": {"averaged_from": [str(p) for p in paths]},
    }

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
same parameter names and shapes, and the same tokenizer, feature front end and
normalisation statistics (two runs of one model size whose checkpoints share a folder have the same
shapes, but a token id or a feature dimension means something else in each); anything else is an
error naming the files and what differs.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from asr.checkpoints.io import CheckpointError, load_checkpoint

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


# Feature options that act in training alone (augmentation) or say where features are computed: weights
# trained with other values of these still read the same features at inference.
TRAINING_ONLY_FEATURES = ("dither", "speed_perturb", "vtlp", "spec_augment", "augment", "compute_on")


def front_end_difference(one: dict, other: dict) -> str | None:
    """What makes two checkpoints' weights mean different things although their models have the same
    shapes, in words, or None: their tokenizers (token ids that name other pieces), their feature
    front ends (other features in the same dimensions) or their global MVN statistics."""
    tokenizers = one.get("tokenizer"), other.get("tokenizer")
    if tokenizers[0] != tokenizers[1]:
        kinds = [t.get("type") if isinstance(t, dict) else None for t in tokenizers]
        if kinds[0] != kinds[1]:
            return f"their tokenizers differ ({kinds[0]} against {kinds[1]})"
        return f"their tokenizers differ (two {kinds[0]} tokenizers with other pieces: a token id means another piece in each)"
    features = [(f.get("config") or {}, f.get("stats")) if isinstance(f, dict) else ({}, None)
                for f in (one.get("features"), other.get("features"))]
    configs = [{k: v for k, v in config.items() if k not in TRAINING_ONLY_FEATURES} for config, _ in features]
    keys = [k for k in dict.fromkeys([*configs[0], *configs[1]]) if configs[0].get(k) != configs[1].get(k)]
    if keys:
        listed = ", ".join(f"features.{k}: {configs[0].get(k)} against {configs[1].get(k)}" for k in keys)
        return f"their feature front ends differ ({listed})"
    if not _same(features[0][1], features[1][1]):
        return "their global MVN statistics differ (features normalised with other means and variances)"
    return None


def _same(a, b) -> bool:
    """Plain data with tensors, compared exactly."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


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
        differs = front_end_difference(state, newest)
        if differs:
            raise CheckpointError(f"{path} and {newest_path} cannot be averaged: {differs}")
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

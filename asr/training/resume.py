"""Resuming a run: finding what to resume from, what may change when it is resumed, and putting it back.

:func:`refusal` says before anything is written whether a run may start in its folder at all;
:func:`read_resume_state` finds the checkpoint to resume from (``last.pt``, or the newest readable
``epoch{E}.pt`` where that is missing or unreadable); :func:`settings_record` adds the resume to the
history that ``config.yaml`` keeps; :func:`restore` puts the weights, the optimiser, the schedules, the
run's progress and its random state back; :func:`remove_stale_checkpoint_writes` removes what a killed
checkpoint write left.

A resumed run continues from its checkpoint's weights, optimizer state, tokenizer and feature
statistics. A key that shapes any of them (the model's sizes and norms, the features, the tokenizer,
the training data, the optimiser and its schedules, the seeds) cannot change half way: at best the
checkpoint does not load, at worst the run goes on with the old value while its record says the new
one. So ``--resume`` compares the resolved config with the one the checkpoint was written with
(:func:`check_resume`), before anything is written, and refuses any change outside
:data:`MAY_CHANGE_ON_RESUME` in one error naming each key with its old and new value.

The keys that may change say how long the run goes on, how it is watched and where it runs, never what it
computes: the budgets, logging, validation (its size, its decoding, the dev set: one that could not be
read may be mended), the checkpoints kept, the loader's workers and the compute backends (each computes the
same thing). Each change is logged in ``train.log`` and added to ``config.yaml``'s ``history``; the settings
above the history stay those the run was started with.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from asr.checkpoints.averaging import epoch_of
from asr.checkpoints.io import CheckpointError, load_checkpoint
from asr.config import ConfigError, flatten
from asr.training.errors import TrainingError
from asr.training.state import Progress, restore_progress, set_rng_state

logger = logging.getLogger("asr.train")

# Dotted keys (fnmatch patterns) that a resumed run may change; ``asr.train --show-config`` lists them.
MAY_CHANGE_ON_RESUME = (
    "exp_dir",  # a run folder that was moved
    "train.max_epochs", "train.max_steps", "train.max_minutes", "train.early_stopping_patience",  # budgets
    "train.device",  # where it runs (a checkpoint loads on any device)
    "train.log_every_steps", "train.save_every_steps", "train.keep_best", "train.keep_last",
    "train.max_nonfinite_in_a_row", "train.max_oom_batches_in_a_row",
    "train.valid_every_steps", "train.valid_max_utterances", "train.valid_beam_size", "train.valid_ctc_weight",
    "train.valid_max_len_ratio",
    "data.dev", "data.test",  # validation and test data: the model never learns from them
    "data.num_workers", "data.prepare_jobs", "data.cache_dir",  # how data is read, not what
    "features.compute_on",  # the same features, in the loader or on the device
    "model.*backend", "model.*cuda_graphs*", "model.lnlstm_check",  # implementations of the same arithmetic
    "model.lnlstm_build",  # the C++ operator's compiler flags: the same arithmetic too
)


def may_change_on_resume(key: str) -> bool:
    """Whether dotted config key ``key`` may take another value when its run is resumed."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in MAY_CHANGE_ON_RESUME)


@dataclass(frozen=True)
class Change:
    """One key whose value differs between a run's checkpoint and its resumed config."""

    key: str
    old: Any  # plain data; ABSENT where the checkpoint's config has no such key
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: {_shown(self.old)} -> {_shown(self.new)}"


ABSENT = "(absent)"


def _shown(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def config_changes(saved: dict, resolved: dict) -> list[Change]:
    """Every leaf key whose value differs between ``saved`` (a checkpoint's config, read as a recipe first
    where it can be, so that a key an older version did not write compares at its default:
    :func:`asr.experiment.as_recipe`) and ``resolved`` (the resumed run's), in ``resolved``'s order."""
    old, new = flatten(saved), flatten(resolved)
    changes = [Change(key, old.get(key, ABSENT), value) for key, value in new.items() if old.get(key, ABSENT) != value]
    changes += [Change(key, value, ABSENT) for key, value in old.items() if key not in new]
    return changes


def check_resume(saved: dict, resolved: dict, checkpoint: str) -> list[Change]:
    """The changes of a resumed run's ``resolved`` config against the ``saved`` one of ``checkpoint``, all of
    which may change on resume; any other raises :class:`ConfigError` naming every such key, old and new."""
    changes = config_changes(saved, resolved)
    refused = [change for change in changes if not may_change_on_resume(change.key)]
    if refused:
        listed = "; ".join(map(str, refused))
        raise ConfigError(
            f"--resume: {checkpoint} was written with other settings ({listed}); a resumed run keeps its model, "
            "features, tokenizer, data and optimiser. Resume with the recorded values (the run's config.yaml), "
            "or start a new exp_dir (the keys that may change on resume: asr.train RECIPE --show-config)"
        )
    return changes


def refusal(exp_dir: Path, resume: bool) -> str | None:
    """Why a run into ``exp_dir`` is refused before it writes anything, or None: without ``--resume``, a
    folder that holds a run (``last.pt``); with it, a folder with no checkpoint to resume from."""
    last = exp_dir / "last.pt"
    if not resume and last.exists():
        return f"{exp_dir} already holds a run (last.pt); pass --resume to continue it or choose another exp_dir"
    if resume and not last.exists() and not epoch_checkpoints(exp_dir):
        return f"--resume: no checkpoint to resume from at {last} (nor any epoch{{E}}.pt beside it)"
    return None


def read_resume_state(exp_dir: Path) -> dict:
    """The checkpoint a resumed run goes on from: ``exp_dir/last.pt``, or where that is missing (a full disk
    before it was first written) or cannot be read (cut short by a copy, say), the newest readable
    ``epoch{E}.pt``, which carries the same training state at the end of its epoch."""
    last = exp_dir / "last.pt"
    if not last.is_file():
        return _resume_fallback(exp_dir, "it is missing")
    logger.info("resuming from %s", last)
    try:
        return load_checkpoint(last)
    except CheckpointError as err:
        return _resume_fallback(exp_dir, f"it cannot be read ({err})")


def _resume_fallback(exp_dir: Path, why: str) -> dict:
    last = exp_dir / "last.pt"
    numbered = epoch_checkpoints(exp_dir)
    for _, path in sorted(numbered, reverse=True):
        try:
            state = load_checkpoint(path)
        except CheckpointError as other:
            logger.warning("--resume: %s cannot be read either (%s)", path, other)
            continue
        if "optimizer" not in (state.get("training") or {}):
            logger.warning("--resume: %s has no optimizer state (written by an older version)", path)
            continue
        logger.warning("--resume: %s: %s; resuming from %s instead", last, why, path)
        return state
    if not numbered and why == "it is missing":
        raise TrainingError(f"--resume: no checkpoint to resume from at {last} (nor any epoch{{E}}.pt beside it)")
    raise TrainingError(f"--resume: {last}: {why}, and no epoch checkpoint beside it can be resumed")


def settings_record(resolved: dict, resume_state: dict | None, exp_dir: Path, command: str,
                    as_recipe=lambda saved: saved) -> dict:
    """The settings ``config.yaml`` records, with its ``history`` of resumes.

    A new run records its ``resolved`` config. A resumed one is first compared with the checkpoint it
    resumes (``as_recipe`` reads that checkpoint's config as a recipe; a change that shapes the model,
    features, tokenizer, data or optimiser raises ConfigError naming each key); the settings it records
    stay those of its config.yaml (or, where that cannot be read, its checkpoint's), and the resume, with
    what it changed, is added to their history."""
    if resume_state is None:
        return resolved
    resumed_from = exp_dir / "last.pt"
    changes = check_resume(as_recipe(resume_state["config"]), resolved, str(resumed_from))
    for change in changes:
        logger.info("resumed with %s (recorded in config.yaml's history)", change)
    record = read_record(exp_dir / "config.yaml")
    if record is None:
        record = dict(resume_state["config"])
        logger.warning("--resume: %s cannot be read; its settings are recorded again from %s",
                       exp_dir / "config.yaml", resumed_from)
    history = [entry for entry in record.pop("history", None) or [] if isinstance(entry, dict)]
    record.pop("runtime", None)  # recorded again for this run once its model exists
    progress = (resume_state.get("training") or {}).get("progress") or {}
    history.append({
        "resumed": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "from": str(resumed_from), "at_step": progress.get("step"), "command": command,
        "changed": {change.key: {"from": change.old, "to": change.new} for change in changes},
    })
    return {**record, "history": history}


def restore(state: dict, model, optimizer, schedules, exp_dir: Path) -> Progress:
    """Put a resumed run back as its checkpoint ``state`` left it: the weights, the optimiser's state, the
    schedules', the random generators'; returns the run's :class:`Progress`."""
    model.load_state_dict(state["model"])
    training = state.get("training") or {}
    if "optimizer" not in training:
        raise TrainingError(f"{exp_dir / 'last.pt'} has no optimizer state; it cannot be resumed")
    optimizer.load_state_dict(training["optimizer"])
    schedules.load_state_dict(training.get("scheduler") or {})
    progress, from_zero = restore_progress(training["progress"])
    if from_zero:
        logger.warning("this run was started by an older version, which numbered epochs from 0: its "
                       "checkpoints so far are named one below their epoch (epoch0.pt is epoch 1); "
                       "from epoch %d on, names and numbers agree", progress.epoch + 1)
    set_rng_state(training["rng"])
    logger.info("resumed in epoch %d, after batch %d, at step %d",
                progress.epoch + 1, progress.batch_in_epoch, progress.step)
    return progress


def stale_checkpoint_writes(exp_dir: Path) -> list[Path]:
    """The temporary files of the trainer's checkpoint writes in ``exp_dir`` (``.last.pt.<random>.tmp``,
    ``.epoch3.pt.<random>.tmp``, ...): none is left while no run writes there, unless one was killed mid-write."""
    found = []
    for path in exp_dir.glob(".*.pt.*.tmp"):
        target = Path(path.name[1:].split(".pt.", 1)[0] + ".pt")
        if target.name == "last.pt" or any(epoch_of(target, prefix) is not None for prefix in ("epoch", "best_epoch")):
            found.append(path)
    return found


def remove_stale_checkpoint_writes(exp_dir: Path) -> None:
    """Remove the temporary files of checkpoint writes that a killed run left (a write is a temporary file
    renamed over its target, asr.checkpoints.io), each logged. Only this run's own checkpoint names: an
    asr.average writing into the folder at the same time keeps its file."""
    for path in sorted(stale_checkpoint_writes(exp_dir)):
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        logger.warning("removed %s (%.1f MB), a checkpoint write that a stopped run left unfinished",
                       path, size / 1e6)


def read_record(path: Path) -> dict | None:
    """A run's config.yaml as data, or None where it is missing or cannot be read."""
    try:
        record = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def epoch_checkpoints(exp_dir: Path) -> list[tuple[int, Path]]:
    """(E, path) of every ``epoch{E}.pt`` in ``exp_dir``."""
    found = [(epoch_of(path, "epoch"), path) for path in exp_dir.glob("epoch*.pt")]
    return [(epoch, path) for epoch, path in found if epoch is not None]

"""What may change when a run is resumed, and the check that refuses every other change.

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
from dataclasses import dataclass
from typing import Any

from asr.config import ConfigError, flatten, to_dict

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
    """Every leaf key whose value differs between ``saved`` (a checkpoint's config) and ``resolved`` (the
    resumed run's), in ``resolved``'s order. ``saved`` is read as a recipe first, so a key an older version
    did not write compares at its default; when it cannot be read so (a key since removed), its keys are
    compared as they are."""
    from asr.experiment import experiment_config_from_dict, experiment_config_to_dict

    try:
        saved = experiment_config_to_dict(experiment_config_from_dict(saved))
    except ConfigError:
        saved = to_dict(saved)
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

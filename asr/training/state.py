"""Where a run is and every random generator it draws from: what ``last.pt`` keeps for ``--resume``."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Progress:
    """Where the run is; saved in ``last.pt`` so ``--resume`` continues from here."""

    epoch: int = 0                 # epochs done; the one in progress is number epoch + 1 (numbered from 1)
    batch_in_epoch: int = 0        # batches of this epoch already consumed
    step: int = 0                  # optimizer steps taken
    nonfinite_in_a_row: int = 0
    oom_in_a_row: int = 0          # batches in a row skipped for CUDA out of memory
    epochs_without_improvement: int = 0
    best: list = field(default_factory=list)  # [(metric, epoch number)], best first, at most keep_best
    skipped_in_epoch: dict = field(default_factory=dict)  # reason -> training items skipped so far this epoch
    seconds: float = 0.0           # wall-clock seconds of training and validation so far (pauses between resumes excluded)
    epoch_first_step: int | None = None  # the step this epoch began at, which its plan depends on (asr.training.plan)
    # Epoch numbers (in best and the checkpoint names) count from 1; runs of older versions counted from 0
    # and saved no such field (:func:`restore_progress`).
    epochs_from_one: bool = True

    def count_skip(self, reason: str, count: int = 1) -> None:
        self.skipped_in_epoch[reason] = self.skipped_in_epoch.get(reason, 0) + count

    def skipped_text(self) -> str:
        """``"2 training utterance(s) skipped (1 non-finite samples, ...)"`` for this epoch."""
        total = sum(self.skipped_in_epoch.values())
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped_in_epoch.items()))
        return f"{total} training utterance(s) skipped" + (f" ({reasons})" if total else "")


def restore_progress(saved: dict) -> tuple[Progress, bool]:
    """The :class:`Progress` that ``last.pt`` saved, and whether the run was started by an older
    version, which numbered its epochs from 0. Such a run keeps its checkpoint names (``epoch0.pt``
    is its first epoch; ``best`` names them so) and numbers its new epochs from 1, in the same order:
    nothing is renamed under a run, and ``asr.average --last`` still takes the newest."""
    from_zero = "epochs_from_one" not in saved
    progress = Progress(**{**saved, "epochs_from_one": True})
    progress.best = [tuple(entry) for entry in progress.best]
    return progress, from_zero


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every RNG the run draws from, as tensors and plain numbers (checkpoints hold nothing else)."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` saved."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    numpy = state["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["kind"], keys, numpy["position"], numpy["has_gauss"], numpy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Training options (the ``train:`` section of a recipe).

Plain data checked on load, as :mod:`asr.data.config` and :mod:`features.config` are: importing it
loads no torch and no trainer, so the recipe's config (:mod:`asr.experiment`) reads it from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from asr.config import ConfigError
from asr.training.metrics import check_metric_name
from asr.training.schedules import ScheduleConfig, SchedulerConfig, check_schedule_values


FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping (the ``train:`` section)."""

    max_epochs: int = 20                # epochs to train (numbered from 1 in logs and checkpoint names)
    max_steps: int | None = None        # stop after this many optimizer steps (None: run all epochs)
    max_minutes: float | None = None    # stop at the first update after this many minutes of training and validation
                                        # (a resumed run's earlier time counts; pauses between resumes do not)
    seed: int = 0                       # weight initialisation and every random draw of training
    device: str = "auto"                # auto = cuda when available, else cpu
    optimizer: Literal["adam", "adamw"] = "adam"  # adamw decouples weight_decay from the gradient
    lr: float = 1e-3                    # peak rate for inverse_sqrt/linear_warmup; for noam the constant k (peak = k / sqrt(d_model * warmup))
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam's moment decay rates
    weight_decay: float = 0.0           # an L2 penalty (adam) or a decoupled decay (adamw); 0 = none
    # Learning-rate schedule, {kind: <shape>, <its options>}: a shape (asr.training.shapes) scaled by lr, noam |
    # inverse_sqrt | linear_warmup | cosine | constant | plateau | vshape or one registered from outside.
    # Post-norm Transformers need warmup; see docs/normalization.md. Where the warmup's peak falls as a share of
    # the run matters, not its count: on small data sets a few hundred to a few thousand updates.
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(kind="constant"))
    # Everything else that moves over the updates, by target: ctc_weight, label_smoothing,
    # sampling_probability, attention_prior, listener_layers, drophead_encoder, drophead_decoder, spec_augment,
    # max_duration (asr.training.schedules), each {points: [[update, value], ...], interpolation: hold | linear}
    # or any shape with its options, {shape: cosine, scale: 0.1, ...} (asr.training.shapes); null removes a recipe's
    schedules: dict[str, ScheduleConfig] = field(default_factory=dict)
    grad_clip: float = 5.0              # max global gradient norm; LSTMs need it
    accum_grad: int = 1                 # batches per optimizer step
    curriculum_epochs: int = 0          # first N epochs present batches shortest first (SortaGrad); 0 = off
    amp: bool = False                   # mixed precision; used on CUDA only
    early_stopping_patience: int | None = None  # epochs without improvement before stopping
    best_metric: str = "valid_loss"     # any validation metric (asr.training.metrics); each says which way is better
    keep_best: int = 3                  # best_epoch{E}.pt checkpoints kept by best_metric
    keep_last: int = 5                  # epoch{E}.pt checkpoints kept (for asr.average --last N)
    save_every_steps: int = 0           # also write last.pt every N steps (0: only at epoch ends)
    # Also validate every N updates inside an epoch (0: at epoch ends only), as icefall's valid_interval and
    # fairseq's validate_interval_updates: a long epoch's curves get points between its ends. Logged like
    # an epoch's validation; ranking, early stopping, checkpoints and the plateau rate see epochs only.
    valid_every_steps: int = 0
    log_every_steps: int = 10           # training scalars every N updates (and the first and the last)
    max_nonfinite_in_a_row: int = 10    # skipped NaN/inf steps in a row before the run stops
    max_oom_batches_in_a_row: int = 3   # batches in a row skipped for CUDA out of memory before the run stops
    # Decoding for the per-validation WER and CER: beam size (1 and no CTC weight = greedy), the CTC
    # prefix score's weight (beam 1 with it is greedy with CTC's help), and the step limit per encoder
    # frame. A greedy attention decode of an unaligned model loops until the limit and reads far worse than
    # the same model decoded with CTC (docs/usage.md, "My LAS does not converge").
    valid_beam_size: int = 1
    valid_ctc_weight: float = 0.0
    valid_max_len_ratio: float = 1.0
    valid_max_utterances: int | None = None  # decode exactly N validation utterances for WER, spread over the lengths

    def __post_init__(self) -> None:
        # The optimiser multiplies float32 tensors by the rate: one past float32's largest number is
        # infinite there, and one that is NaN, zero or negative makes no sense; any of them would reach
        # the weights before anything else noticed.
        if not (math.isfinite(self.lr) and 0 < self.lr <= FLOAT32_MAX):
            raise ConfigError(f"train.lr must be a finite positive number (at most {FLOAT32_MAX:.4g}), got {self.lr}")
        if self.curriculum_epochs < 0:
            raise ValueError(f"curriculum_epochs must be >= 0, got {self.curriculum_epochs}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"max_minutes must be positive or null, got {self.max_minutes}")
        if self.valid_every_steps < 0:
            raise ValueError(f"valid_every_steps must be >= 0 (0: at epoch ends only), got {self.valid_every_steps}")
        if self.valid_max_utterances is not None and self.valid_max_utterances < 1:
            raise ValueError(f"valid_max_utterances must be >= 1 or null, got {self.valid_max_utterances}")
        if not 0.0 <= self.valid_ctc_weight <= 1.0:
            raise ValueError(f"valid_ctc_weight must be in [0, 1], got {self.valid_ctc_weight}")
        if self.valid_max_len_ratio <= 0:
            raise ValueError(f"valid_max_len_ratio must be positive, got {self.valid_max_len_ratio}")
        check_metric_name(self.best_metric, "train.best_metric")
        for name, schedule in self.schedules.items():
            check_schedule_values(name, schedule)

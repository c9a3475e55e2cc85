"""Validation metrics: each one small object that names itself and says whether higher is better.

The trainer's validation (:func:`asr.training.validation.validate`) runs every dev batch through
the model once, teacher-forced, and decodes some of them; each metric then takes what it needs
from that one pass (:class:`ValidBatch`) and gives one number per validation. Which metrics a run
has depends on its model (:meth:`ValidationMetric.applies`); ``train.best_metric``, early stopping,
checkpoint ranking, averaging and a ``plateau`` learning rate accept any registered name.

Registered here (TensorBoard shows ``valid_x`` as ``valid/x``):

=============================  ======  ===============================================================
name                           better  what it says
=============================  ======  ===============================================================
``valid_loss``                 lower   the training loss on the dev set, per target token
``valid_wer``, ``valid_cer``   lower   of the decoded utterances (``train.valid_*`` decoding options)
``valid_ctc_cer``              lower   the CTC head's greedy (best path) CER on every dev utterance:
                                       whether the encoder learns, apart from the attention
``valid_attention_loss``       lower   the attention decoder's cross-entropy alone
``valid_loss_without_context`` lower   the same with the attention's context replaced by zeros (LAS):
                                       near ``valid_attention_loss``, the speller ignores the audio
                                       and has become a language model
``valid_attention_spearman``   higher  Spearman correlation between output step and the most
                                       attended encoder frame, teacher-forced, mean over utterances:
                                       about 1 for a monotonic alignment, about 0 for none
``valid_attention_at_end``     lower   the share of output steps (``<eos>`` excluded) whose most
                                       attended frame lies in the last 5% of the audio: attention
                                       collapsed onto the end
``valid_batchnorm_gap``        lower   for encoders with BatchNorm (the Conformer's ``conv_norm``): how far
                                       the encoder output with each dev batch's own statistics (training
                                       mode) lies from the output with the running ones (evaluation),
                                       ``||train - eval|| / ||eval||`` over the valid frames
=============================  ======  ===============================================================

A metric that is a share (WER, CER, ``valid_attention_at_end``) says so with ``percent = True``: it is
computed and ranked as a fraction, and shown in percent wherever a person reads it (``train.log``,
TensorBoard; :func:`as_shown`), as ``asr.evaluate`` and ``asr.study`` show WER.

A new metric is a subclass with ``name``, ``higher_is_better``, :meth:`add` and :meth:`result`
(and ``percent`` when it is a share), registered with :func:`register`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from asr.decoding.scoring import error_rates

END_SHARE = 0.05  # "at the end": the most attended frame within the last 5% of the utterance's frames


@dataclass
class ValidBatch:
    """What one dev batch gave: ``output`` of the teacher-forced forward pass (with its ``encoder``),
    the reference text of every row, the rows decoded for WER and their decoded texts."""

    batch: Any
    model: Any
    output: Any
    tokenizer: Any
    references: list[str]
    decoded_rows: list[int]
    hypotheses: list[str] | None


class ValidationMetric(ABC):
    name: ClassVar[str]
    higher_is_better: ClassVar[bool] = False
    percent: ClassVar[bool] = False  # a share: shown to people in percent (as_shown)

    @staticmethod
    def applies(model) -> bool:
        """Whether ``model`` can be measured this way."""
        return True

    @abstractmethod
    def add(self, view: ValidBatch) -> None:
        """Take one batch into account."""

    @abstractmethod
    def result(self) -> float | None:
        """The validation's value, or None when nothing was measured."""


METRICS: dict[str, type[ValidationMetric]] = {}


def register(cls: type[ValidationMetric]) -> type[ValidationMetric]:
    METRICS[cls.name] = cls
    return cls


def higher_is_better(name: str) -> bool:
    """Whether a larger ``name`` is an improvement (unknown names: lower is better)."""
    cls = METRICS.get(name)
    return bool(cls is not None and cls.higher_is_better)


def in_percent(name: str) -> bool:
    """Whether metric ``name`` is a share, shown in percent."""
    cls = METRICS.get(name)
    return bool(cls is not None and cls.percent)


def as_shown(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` as people read them (``train.log``, TensorBoard): shares in percent, the rest as they are."""
    return {name: 100 * value if in_percent(name) else value for name, value in metrics.items()}


def format_value(name: str, value: float) -> str:
    """One metric's value for a log line: ``"12.30%"`` for a share, ``"0.9120"`` otherwise."""
    return f"{100 * value:.2f}%" if in_percent(name) else f"{value:.4f}"


def check_metric_name(name: str, key: str) -> None:
    """Refuse a name no metric has, naming the config ``key``."""
    if name not in METRICS:
        from asr.config import ConfigError

        raise ConfigError(f"{key}: no validation metric {name!r} (known: {', '.join(sorted(METRICS))})")


def metrics_for(model) -> list[ValidationMetric]:
    """A fresh instance of every registered metric that applies to ``model``."""
    return [cls() for cls in METRICS.values() if cls.applies(model)]


def is_better(name: str, value: float, than: float) -> bool:
    return value > than if higher_is_better(name) else value < than


def ranking_key(name: str, value: float | None) -> tuple[bool, float]:
    """Sort key putting the best value first: NaN, inf and None last."""
    if value is None or not math.isfinite(value):
        return (True, 0.0)
    return (False, -value if higher_is_better(name) else value)


class _Ratio(ValidationMetric):
    def __init__(self) -> None:
        self.total, self.weight = 0.0, 0.0

    def result(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


@register
class ValidLoss(_Ratio):
    name = "valid_loss"

    def add(self, view: ValidBatch) -> None:
        self.total += float(view.output.loss) * view.output.num_tokens
        self.weight += view.output.num_tokens


def _has_attention_decoder(model) -> bool:
    """A LAS whose speller is trained (not a CTC-only one)."""
    return hasattr(model, "loss_without_context") and not getattr(model, "ctc_only", False)


@register
class AttentionLoss(_Ratio):
    name = "valid_attention_loss"

    @staticmethod
    def applies(model) -> bool:
        return _has_attention_decoder(model)

    def add(self, view: ValidBatch) -> None:
        if view.output.attention_loss is not None:
            self.total += float(view.output.attention_loss) * view.output.num_tokens
            self.weight += view.output.num_tokens


@register
class LossWithoutContext(_Ratio):
    name = "valid_loss_without_context"

    @staticmethod
    def applies(model) -> bool:
        return _has_attention_decoder(model)

    def add(self, view: ValidBatch) -> None:
        batch, encoder = view.batch, view.output.encoder
        if encoder is None:
            return
        loss, tokens = view.model.loss_without_context(encoder, batch.tokens, batch.token_lengths)
        self.total += float(loss) * tokens
        self.weight += tokens


class _ErrorRate(ValidationMetric):
    key: ClassVar[str]

    def __init__(self) -> None:
        self.references: list[str] = []
        self.hypotheses: list[str] = []

    def pairs(self, view: ValidBatch) -> tuple[list[str], list[str]] | None:
        if not view.decoded_rows or view.hypotheses is None:
            return None
        return [view.references[r] for r in view.decoded_rows], view.hypotheses

    def add(self, view: ValidBatch) -> None:
        pairs = self.pairs(view)
        if pairs is not None:
            self.references += pairs[0]
            self.hypotheses += pairs[1]

    def result(self) -> float | None:
        if not self.references:
            return None
        return error_rates(self.references, self.hypotheses)[self.key]


@register
class WordErrorRate(_ErrorRate):
    name, key, percent = "valid_wer", "wer", True


@register
class CharacterErrorRate(_ErrorRate):
    name, key, percent = "valid_cer", "cer", True


@register
class CTCCharacterErrorRate(_ErrorRate):
    name, key, percent = "valid_ctc_cer", "cer", True

    @staticmethod
    def applies(model) -> bool:
        return bool(getattr(model, "has_ctc", False))

    def pairs(self, view: ValidBatch) -> tuple[list[str], list[str]] | None:
        from asr.decoding import ctc_best_path

        encoder = view.output.encoder
        if encoder is None or encoder.ctc_log_probs is None:
            return None
        paths = ctc_best_path(encoder, view.model.pad_id)
        return view.references, [view.tokenizer.decode(p) for p in paths]


def attention_peaks(weights: torch.Tensor, steps: int, frames: int) -> np.ndarray:
    """The most attended encoder frame of each of the first ``steps`` output steps of one utterance's
    teacher-forced attention ``weights`` (L, T'), over its first ``frames`` frames."""
    return weights[:steps, :frames].float().argmax(-1).cpu().numpy()


def monotonicity(peaks: np.ndarray, frames: int) -> dict[str, float]:
    """How the most attended frame ``peaks`` (one per output step) moves over an utterance of ``frames``
    encoder frames: ``spearman``, the rank correlation of step and peak (ties ranked on average; 0 when
    the peak never moves), ``forward``, the share of steps that move it forward, and ``at_end``, the share
    of steps whose peak lies in the last :data:`END_SHARE` of the frames."""
    from scipy.stats import spearmanr

    spearman = float(spearmanr(np.arange(len(peaks)), peaks).statistic) if np.ptp(peaks) > 0 else 0.0
    forward = float(np.mean(np.diff(peaks) > 0)) if len(peaks) > 1 else 0.0
    at_end = float(np.mean(peaks >= (1.0 - END_SHARE) * (frames - 1)))
    return {"spearman": spearman, "forward": forward, "at_end": at_end}


class _Attention(ValidationMetric):
    """Measures of each utterance's teacher-forced attention, its ``<eos>`` step excluded."""

    @staticmethod
    def applies(model) -> bool:
        return callable(getattr(model, "decoder_attention", None)) and _has_attention_decoder(model)

    def __init__(self) -> None:
        self.values: list[float] = []
        self.steps = 0

    def utterances(self, view: ValidBatch):
        weights, encoder = view.output.attention_weights, view.output.encoder
        if weights is None or encoder is None:
            return
        for row in range(weights.size(0)):
            steps, frames = int(view.batch.token_lengths[row]), int(encoder.lengths[row])
            if steps >= 2 and frames >= 2:
                yield monotonicity(attention_peaks(weights[row], steps, frames), frames), steps


@register
class AttentionSpearman(_Attention):
    name = "valid_attention_spearman"
    higher_is_better = True

    def add(self, view: ValidBatch) -> None:
        self.values += [measures["spearman"] for measures, _ in self.utterances(view)]

    def result(self) -> float | None:
        return float(np.mean(self.values)) if self.values else None


@register
class AttentionAtEnd(_Attention):
    name = "valid_attention_at_end"
    percent = True

    def add(self, view: ValidBatch) -> None:
        for measures, steps in self.utterances(view):
            self.values.append(measures["at_end"] * steps)
            self.steps += steps

    def result(self) -> float | None:
        return float(sum(self.values) / self.steps) if self.steps else None


@register
class BatchNormGap(ValidationMetric):
    name = "valid_batchnorm_gap"

    @staticmethod
    def applies(model) -> bool:
        from asr.models.norms import MaskedBatchNorm1d

        return any(isinstance(m, MaskedBatchNorm1d) for m in model.modules())

    def __init__(self) -> None:
        self.difference, self.reference = 0.0, 0.0

    def add(self, view: ValidBatch) -> None:
        from asr.models.norms import batch_statistics

        evaluated, batch = view.output.encoder, view.batch
        if evaluated is None:
            return
        with batch_statistics(view.model):
            trained = view.model.encode(batch.features, batch.feature_lengths)
        valid = evaluated.mask.unsqueeze(-1)
        self.difference += float(((trained.out - evaluated.out) * valid).float().pow(2).sum())
        self.reference += float((evaluated.out * valid).float().pow(2).sum())

    def result(self) -> float | None:
        return math.sqrt(self.difference / self.reference) if self.reference > 0 else None

"""What a test-time strategy is handed: the recogniser's face as a protocol, and what its ``decode`` returns.

:class:`asr.inference.recogniser.Recogniser` implements :class:`RecogniserProtocol`. The strategies
(:mod:`asr.inference.strategies`, :mod:`asr.inference.adaptation`) and the settings that choose them
(:mod:`asr.inference.settings`) name the recogniser by this protocol rather than import its class,
because ``Recogniser.transcribe`` runs them: the modules depend one way, from the recogniser down::

    interface <- strategies <- adaptation <- settings <- recogniser

A new strategy takes a ``RecogniserProtocol`` and uses only what it lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Union

import numpy as np
import torch

from asr.data.report import Skip
from asr.data.tokenizer import Tokenizer
from asr.data.utterance import Utterance
from asr.decoding import DecodingOptions
from asr.experiment import ExperimentConfig
from features.pipeline import FeaturePipeline

# What Recogniser.transcribe takes for one recording: a file path; samples at the model's rate, (N,) or
# (channels, N); a (samples, rate) pair at any rate; or an Utterance (a corpus's, say).
AudioInput = Union[str, Path, np.ndarray, torch.Tensor, tuple, Utterance]


@dataclass
class Transcription:
    """Transcripts of a list of utterances, aligned with it.

    texts:   None where the audio failed where it was read (its :class:`Skip` is in ``skipped``).
    scores:  the model's log-probability of each transcript (``(1 - ctc_weight) * log p_att +
             ctc_weight * log p_ctc``, ``<eos>`` included) when asked for, else None.
    skipped: position in the list -> why it has no transcript.
    """

    texts: list[str | None]
    scores: list[float | None] | None = None
    skipped: dict[int, Skip] = field(default_factory=dict)


class RecogniserProtocol(Protocol):
    """A model in eval mode with the tokenizer and feature pipeline it was trained with
    (:class:`asr.inference.recogniser.Recogniser` documents each member)."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    pipeline: FeaturePipeline
    config: ExperimentConfig  # the first checkpoint's, for an ensemble
    device: torch.device

    def members(self) -> list[torch.nn.Module]: ...

    def with_models(self, models: list[torch.nn.Module]) -> RecogniserProtocol: ...

    def utterances(self, audio: Sequence[AudioInput]) -> list[Utterance]: ...

    def decode(self, utterances: list[Utterance], options: DecodingOptions = DecodingOptions(),
               warp: float | None = None, score: bool = False, batch_size: int = 16) -> Transcription: ...

    def ctc_best_paths(self, utterances: list[Utterance], warp: float | None = None,
                       batch_size: int = 16) -> list[str]: ...

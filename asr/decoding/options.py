"""How to search: one frozen set of options, given to every search.

Lengths. An utterance may take at most ``ceil(max_len_ratio * T')`` decoding
steps (``T'`` its encoder length after time reduction), capped by ``max_len``
when given; the ``<eos>`` counts as a step. A hypothesis that has not ended by
then is returned as it is (without ``<eos>``). The default ratio 1.0 suits
word pieces or a 4x-reduced encoder; characters on an 8x-reduced listener
(80 ms per encoder frame) may need 1.5-2.

Scores. A hypothesis' score is the sum of its tokens' log-probabilities,
``(1 - ctc_weight) * log p_att + ctc_weight * log p_ctc`` with CTC prefix
scoring (Watanabe et al. 2017). Hypotheses are ranked by that score divided by
their length (``length_normalization``) or plus ``length_penalty`` per token
(positive values favour longer outputs); length counts the ``<eos>``.

Two remedies of Chorowski & Jaitly (2017, sec. 3) for attention that stops
early or skips words, both off by default: a coverage bonus of
``coverage_weight`` per encoder frame whose attention, summed over the
hypothesis' steps, exceeds ``coverage_threshold`` (a hypothesis that skipped a
stretch of audio has covered fewer frames), and an end-of-sentence threshold:
``<eos>`` may only be chosen where its probability is at least
``eos_threshold`` times that of the most probable other token.
``ctc_greedy`` decodes with the CTC head alone (its best path), no decoder:
a second opinion on what the attention decoder drops.

Long recordings. A recording longer than ``segment_seconds`` is decoded in
pieces no longer than it, cut at pauses, and the pieces' transcripts joined
(:mod:`asr.inference.segmentation`): the remedy of long-form recognisers for a
decoder that skips words past the lengths it was trained on. The default
(None) is the longest utterance the model was trained on, recorded in its
checkpoint; 0 decodes every recording whole. The cut is made on the audio, so
it is :meth:`asr.inference.recogniser.Recogniser.transcribe` that applies it;
:func:`asr.decoding.search`, given an encoder output, cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asr.models.interface import EncoderOutput


MIN_SEGMENT_SECONDS = 0.5  # a piece shorter than a spoken word cannot be transcribed


@dataclass(frozen=True)
class DecodingOptions:
    """Options of :func:`asr.decoding.search`; invalid combinations are refused when built.

    ``beam_size == 1`` without a CTC weight is greedy search, which has no use
    for the length options (``length_penalty``, ``length_normalization``).
    """

    beam_size: int = 1
    ctc_weight: float = 0.0            # weight of the CTC prefix score (needs a model with a CTC head)
    length_penalty: float = 0.0        # added to the score per token, <eos> included
    length_normalization: bool = False  # rank finished hypotheses by log-prob / length instead
    max_len_ratio: float = 1.0         # at most ceil(ratio * T') steps per utterance
    min_len: int = 0                   # <eos> is not allowed before this many tokens
    max_len: int | None = None         # a cap on the steps, whatever T'
    ctc_candidates: int | None = None  # tokens CTC scores per hypothesis (default ceil(1.5 * beam_size))
    coverage_weight: float = 0.0       # bonus per encoder frame covered (beam search, models exposing attention)
    coverage_threshold: float = 0.5    # summed attention a frame needs to count as covered
    eos_threshold: float = 0.0         # <eos> only at >= this times the best other token's probability; 0 = off
    ctc_greedy: bool = False           # the CTC head's best path instead of the decoder
    segment_seconds: float | None = None  # longer recordings in pieces of at most this (None: the model's longest
                                          # training utterance; 0: all whole)

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not 0.0 <= self.ctc_weight <= 1.0:
            raise ValueError(f"ctc_weight must be in [0, 1], got {self.ctc_weight}")
        if self.length_normalization and self.length_penalty != 0.0:
            raise ValueError("use either length_normalization or length_penalty, not both")
        if self.max_len_ratio <= 0:
            raise ValueError(f"max_len_ratio must be positive, got {self.max_len_ratio}")
        if self.min_len < 0:
            raise ValueError(f"min_len must be >= 0, got {self.min_len}")
        if self.max_len is not None and self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        if self.ctc_candidates is not None and self.ctc_candidates < 1:
            raise ValueError(f"ctc_candidates must be >= 1, got {self.ctc_candidates}")
        if self.coverage_weight < 0 or self.coverage_threshold <= 0:
            raise ValueError(
                f"coverage_weight must be >= 0 and coverage_threshold > 0, got {self.coverage_weight}, "
                f"{self.coverage_threshold}"
            )
        if self.segment_seconds and self.segment_seconds < MIN_SEGMENT_SECONDS or (self.segment_seconds or 0) < 0:
            raise ValueError(
                f"segment_seconds must be 0 (off) or at least {MIN_SEGMENT_SECONDS}, got {self.segment_seconds}"
            )
        if not 0.0 <= self.eos_threshold <= 1.0:
            raise ValueError(f"eos_threshold must be in [0, 1], got {self.eos_threshold}")

    @property
    def greedy(self) -> bool:
        """Whether :func:`asr.decoding.search` runs greedy search (one hypothesis, no CTC, no coverage)."""
        return self.beam_size == 1 and self.ctc_weight == 0.0 and self.coverage_weight == 0.0


def max_steps(encoder: EncoderOutput, options: DecodingOptions) -> torch.Tensor:
    """(B,) long on the CPU: the most decoding steps (``<eos>`` included) each utterance may take."""
    limits = torch.ceil(encoder.lengths.float() * options.max_len_ratio).long().clamp(min=1)
    if options.max_len is not None:
        limits = limits.clamp(max=options.max_len)
    return limits.cpu()

"""Greedy and beam search for every model of the toolkit.

The search only talks to a model through the step-wise interface of
:mod:`asr.models.interface` (``init_decoder_state``, ``decode_step``,
``reorder_decoder_state``) and its ``sos_id``, ``eos_id`` and ``pad_id`` (the
pad id doubles as the CTC blank). ``<pad>`` and ``<sos>`` are never emitted.

    options = DecodingOptions(beam_size=4, ctc_weight=0.3)
    token_ids = search(model, model.encode(features, lengths), options)

:class:`DecodingOptions` (frozen) says how to search and what limits apply;
:func:`search` runs greedy search for one hypothesis without CTC and beam
search otherwise. Beam search adds up weighted scorers
(:mod:`asr.decoding.scorers`): the attention decoder, CTC prefix scores and a
length bonus; a new source of scores is one more :class:`Scorer`.

Call ``model.eval()`` first: the search runs without gradients but does not
change the model's mode. What was found is scored against references (WER, CER and the
alignments behind them) by :mod:`asr.decoding.scoring`.
"""

from __future__ import annotations

import torch

from asr.decoding.beam_search import BeamSearch, Hypothesis, beam_search
from asr.decoding.greedy import greedy_search
from asr.decoding.options import DecodingOptions, max_steps
from asr.decoding.rescoring import ctc_best_path, sequence_log_probs
from asr.decoding.scorers import CoverageScorer, CTCPrefixScore, DecoderScorer, LengthBonus, Scorer, default_scorers
from asr.models.interface import EncoderOutput

__all__ = [
    "BeamSearch", "CoverageScorer", "CTCPrefixScore", "DecoderScorer", "DecodingOptions", "Hypothesis", "LengthBonus", "Scorer",
    "beam_search", "ctc_best_path", "decode", "default_scorers", "greedy_search", "max_steps", "search",
    "sequence_log_probs",
]


@torch.no_grad()
def search(model, encoder: EncoderOutput, options: DecodingOptions = DecodingOptions()) -> list[list[int]]:
    """Token ids (no ``<sos>``/``<eos>``) of each of the B utterances of ``encoder``; a CTC-only model
    (``ctc_only``, its decoder never trained) is decoded by its CTC head's best path whatever ``options`` say."""
    if options.ctc_greedy or getattr(model, "ctc_only", False):
        return ctc_best_path(encoder, model.pad_id)
    if options.greedy:
        return greedy_search(model, encoder, options)
    return beam_search(model, encoder, options)


@torch.no_grad()
def decode(
    model, features: torch.Tensor, feature_lengths: torch.Tensor, options: DecodingOptions = DecodingOptions()
) -> list[list[int]]:
    """Encode features (B, T, D) with lengths (B,), then :func:`search`."""
    return search(model, model.encode(features, feature_lengths), options)

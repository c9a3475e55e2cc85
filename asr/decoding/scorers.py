"""What beam search adds up: each source of token scores is one :class:`Scorer`.

Beam search (:mod:`asr.decoding.beam_search`) extends every hypothesis by
candidate tokens and ranks the extensions by ``sum(weight * score)`` over its
scorers, in their order. A *full* scorer scores every token of the vocabulary
at once (the attention decoder, a length bonus, a language model); a
*partial* one scores only the candidates the full scorers pre-select (CTC
prefix scoring, which costs O(T') per candidate). A token that a full scorer
gives -inf (``<sos>``, ``<pad>``, an early ``<eos>``) stays impossible whatever
the weights.

Each scorer keeps its own state for the N hypotheses of the search:

``start(encoder)``                    the state before the first step (N = encoder rows)
``score(tokens, state, candidates, step)``  scores (N, V) (or broadcastable to it) for a full scorer,
                                      (N, K) for the
                                      candidates (N, K) of a partial one; and the state
                                      after the step, before any hypothesis is chosen
``select(state, rows, choice, candidates, same_utterances, encoder)``
                                      the state of the chosen extensions: new hypothesis i
                                      extends row ``rows[i]`` by its ``choice[i]``-th
                                      candidate (full scorers: by token ``choice[i]``);
                                      ``same_utterances`` is False when finished utterances
                                      left the batch, and ``encoder`` is then the smaller one

Adding a scorer (an external language model, say) is one class with these
three methods and a weight in :func:`default_scorers`' list.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch

from asr.models.ctc import CTCPrefixScorer, CTCPrefixState
from asr.models.interface import STATIC_STATE_KEY, EncoderOutput

NEG_INF = float("-inf")


class Scorer(ABC):
    """Base class: a weighted source of token scores (see the module docstring)."""

    full = True

    def __init__(self, weight: float):
        self.weight = weight

    def start(self, encoder: EncoderOutput) -> Any:
        return None

    @abstractmethod
    def score(self, tokens: torch.Tensor, state: Any, candidates: torch.Tensor | None, step: int):
        """Scores of the next token, (N, V) for a full scorer or (N, K) for a partial one's
        candidates (unweighted: beam search applies ``weight``), and the state after the step."""

    def select(self, state: Any, rows: torch.Tensor, choice: torch.Tensor, candidates, same_utterances: bool, encoder):
        return state


class DecoderScorer(Scorer):
    """The model's own next-token log-probabilities (``model.decode_step``).

    ``<sos>`` and ``<pad>`` are never emitted, and ``<eos>`` not before ``min_len`` tokens.
    """

    def __init__(self, model, weight: float, min_len: int = 0, eos_threshold: float = 0.0):
        super().__init__(weight)
        self.model = model
        self.min_len = min_len
        self.log_eos_threshold = math.log(eos_threshold) if eos_threshold > 0 else None
        self.encoder: EncoderOutput | None = None
        self.last_state = None  # the state after the latest step (CoverageScorer reads its attention)

    def start(self, encoder: EncoderOutput) -> Any:
        self.encoder = encoder
        return self.model.init_decoder_state(encoder)

    def score(self, tokens, state, candidates, step):
        log_probs, state = self.model.decode_step(tokens, state, self.encoder)
        self.last_state = state
        log_probs = mask_never_emitted(log_probs.float(), self.model, forbid_eos=step < self.min_len)
        if self.log_eos_threshold is not None:
            # <eos> only where it is within the threshold of the best other token.
            eos = self.model.eos_id
            others = log_probs.clone()
            others[:, eos] = NEG_INF
            too_unlikely = log_probs[:, eos] < others.max(-1).values + self.log_eos_threshold
            log_probs[:, eos] = log_probs[:, eos].masked_fill(too_unlikely, NEG_INF)
        return log_probs, state

    def select(self, state, rows, choice, candidates, same_utterances, encoder):
        self.encoder = encoder
        if same_utterances:
            return reorder_within_utterances(self.model, state, rows)
        return self.model.reorder_decoder_state(state, rows)


class LengthBonus(Scorer):
    """One point per token, ``<eos>`` included: with a positive weight, longer outputs gain."""

    def score(self, tokens, state, candidates, step):
        return torch.ones(1, 1, device=tokens.device), state  # the same for every token: broadcast


class CoverageScorer(Scorer):
    """The coverage bonus of Chorowski & Jaitly (2017): one point for every encoder frame whose attention,
    summed over the hypothesis' steps, exceeds ``threshold``.

    The attention of a step is the decoder's (the model's ``decoder_attention`` of the state
    ``decoder`` just computed), the same for every token the hypothesis could emit at that step,
    so the scorer gives each hypothesis one increment, broadcast over the vocabulary.
    """

    def __init__(self, decoder: DecoderScorer, weight: float, threshold: float):
        super().__init__(weight)
        self.decoder = decoder
        self.threshold = threshold

    def start(self, encoder: EncoderOutput) -> torch.Tensor:
        return torch.zeros(encoder.out.size(0), encoder.out.size(1), device=encoder.out.device)

    def score(self, tokens, state, candidates, step):
        attention = self.decoder.model.decoder_attention(self.decoder.last_state)
        if attention is None:
            raise ValueError("coverage needs a model whose decoder exposes its attention (decoder_attention)")
        summed = state + attention.float()
        covered = (summed > self.threshold).sum(-1) - (state > self.threshold).sum(-1)
        return covered.float().unsqueeze(1), summed

    def select(self, state, rows, choice, candidates, same_utterances, encoder):
        return state.index_select(0, rows)


class CTCPrefixScore(Scorer):
    """CTC prefix scores ``log psi(g + c) - log psi(g)`` of the candidates (:class:`asr.models.ctc.CTCPrefixScorer`)."""

    full = False

    def __init__(self, weight: float, blank_id: int, eos_id: int):
        super().__init__(weight)
        self.blank_id, self.eos_id = blank_id, eos_id
        self.prefix: CTCPrefixScorer | None = None

    def start(self, encoder: EncoderOutput) -> CTCPrefixState:
        if encoder.ctc_log_probs is None:
            raise ValueError("ctc_weight > 0 needs a model with a CTC head (encoder.ctc_log_probs is None)")
        self.prefix = CTCPrefixScorer(encoder.ctc_log_probs, encoder.lengths, self.blank_id, self.eos_id)
        return self.prefix.initial_state()

    def score(self, tokens, state, candidates, step):
        # Every prefix holds `step` tokens, which lets the recursion skip the first frames.
        delta, r, psi = self.prefix.score(state, candidates, min_prefix_length=step)
        return delta, (r, psi)

    def select(self, state, rows, choice, candidates, same_utterances, encoder):
        r, psi = state
        if not same_utterances:
            self.prefix = CTCPrefixScorer(encoder.ctc_log_probs, encoder.lengths, self.blank_id, self.eos_id)
        return CTCPrefixScorer.select(r, psi, candidates, rows, choice)


def default_scorers(model, options) -> list[Scorer]:
    """The scorers :class:`~asr.decoding.options.DecodingOptions` asks for, in the order their scores
    are summed: the attention decoder, CTC prefix scores (when weighted), a length bonus and the
    coverage bonus (when non-zero)."""
    decoder = DecoderScorer(model, 1.0 - options.ctc_weight, options.min_len, options.eos_threshold)
    scorers: list[Scorer] = [decoder]
    if options.ctc_weight > 0:
        scorers.append(CTCPrefixScore(options.ctc_weight, blank_id=model.pad_id, eos_id=model.eos_id))
    if options.length_penalty:
        scorers.append(LengthBonus(options.length_penalty))
    if options.coverage_weight:
        scorers.append(CoverageScorer(decoder, options.coverage_weight, options.coverage_threshold))
    return scorers


def mask_never_emitted(log_probs: torch.Tensor, model, forbid_eos: bool) -> torch.Tensor:
    """``log_probs`` (N, V) with ``<sos>``, ``<pad>`` (and, if ``forbid_eos``, ``<eos>``) at -inf."""
    log_probs = log_probs.clone()
    log_probs[:, model.sos_id] = NEG_INF
    log_probs[:, model.pad_id] = NEG_INF
    if forbid_eos:
        log_probs[:, model.eos_id] = NEG_INF
    return log_probs


def reorder_within_utterances(model, state, index: torch.Tensor):
    """``model.reorder_decoder_state`` for an ``index`` that keeps every hypothesis within its
    utterance: the state's static part (see :mod:`asr.models.interface`) is the same for all of an
    utterance's rows, so it is kept as it is instead of being copied."""
    if not (isinstance(state, dict) and STATIC_STATE_KEY in state):
        return model.reorder_decoder_state(state, index)
    dynamic = {key: value for key, value in state.items() if key != STATIC_STATE_KEY}
    reordered = model.reorder_decoder_state(dynamic, index)
    reordered[STATIC_STATE_KEY] = state[STATIC_STATE_KEY]
    return reordered

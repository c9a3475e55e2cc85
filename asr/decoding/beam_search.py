"""Batched beam search over weighted scorers (:mod:`asr.decoding.scorers`).

Each step extends every active hypothesis by every token (or, when a partial
scorer such as CTC is used, by the full scorers' ``ctc_candidates`` best tokens,
default ``ceil(1.5 * beam_size)`` as in ESPnet, and by ``<eos>``), keeps the
``2 * beam_size`` best extensions per utterance, sets aside those ending in
``<eos>`` that rank within the first ``beam_size`` as finished, and continues
with the ``beam_size`` best others. An utterance is done once it has
``beam_size`` finished hypotheses that all rank above its best active one
(exact without length bonus or normalisation, because scores only fall as
hypotheses grow; a heuristic with them), or at its maximum length, where the
active hypotheses are finished as they are. A done utterance leaves the batch
(its rows of every scorer's state and of the encoder output are dropped
once), so every step only computes the utterances still searching; each
utterance's result is the same as when decoded alone.

The active batch holds ``k = beam_size`` hypotheses per utterance still
searching; hypothesis i belongs to active utterance ``i // k`` and never
changes utterance, so the expanded encoder output (and the static part of the
decoder state) needs no reordering, only shrinking when utterances are done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from asr.decoding.options import DecodingOptions, max_steps
from asr.decoding.scorers import NEG_INF, Scorer, default_scorers
from asr.models.interface import EncoderOutput


@dataclass
class Hypothesis:
    """One finished hypothesis.

    tokens: output ids without ``<sos>``/``<eos>``.
    score: the ranking score (after length normalisation or penalty).
    log_prob: the summed (CTC-mixed) log-probability, ``<eos>`` included when
        the hypothesis ended with one (and the coverage bonus, when it is used).
    ended: False when it was cut off at the maximum length.
    """

    tokens: list[int]
    score: float
    log_prob: float
    ended: bool = True


@dataclass
class _Beams:
    """The hypotheses still searching: ``k`` per active utterance."""

    active: list[int]              # original index of each active utterance
    encoder: EncoderOutput         # expanded: one row per hypothesis
    states: list                   # one per scorer
    tokens: torch.Tensor           # (A * k,) last token of each hypothesis
    scores: torch.Tensor           # (A, k) running scores (length bonus included)
    history: torch.Tensor          # (A, k, step) tokens so far


@dataclass
class _Extensions:
    """The ``width`` best extensions per active utterance, and the ``k`` of them that go on."""

    scores: torch.Tensor       # (A, width) running score of each extension
    parent: torch.Tensor       # (A, width) its hypothesis within the utterance
    is_eos: torch.Tensor       # (A, width) whether it ends the hypothesis
    survivors: torch.Tensor    # (A, k) positions of the k best that do not end, in rank order
    candidates: torch.Tensor | None  # (N, K) the tokens scored per hypothesis (None: the whole vocabulary)
    choice: torch.Tensor       # (A, width) candidate index (the token itself without candidates)
    tokens: torch.Tensor       # (A, width) the token


class BeamSearch:
    """Beam search for ``model`` with ``options``; ``scorers`` default to :func:`default_scorers`."""

    def __init__(self, model, options: DecodingOptions, scorers: list[Scorer] | None = None):
        self.model = model
        self.options = options
        self.k = options.beam_size
        self.scorers = scorers or default_scorers(model, options)
        if not self.scorers[0].full:
            raise ValueError("the first scorer must be a full one: it pre-selects the tokens partial scorers score")
        self.partial = any(not scorer.full for scorer in self.scorers)
        self.bonus = options.length_penalty

    def __call__(self, encoder: EncoderOutput) -> list[list[Hypothesis]]:
        """Every utterance's finished hypotheses, best first (at most ``2 * beam_size`` or so)."""
        batch, k, device = encoder.out.size(0), self.k, encoder.out.device
        limits = max_steps(encoder, self.options).tolist()
        expanded = encoder.index_select(torch.arange(batch, device=device).repeat_interleave(k))
        # Only the first copy of each utterance is alive at the start, so the k copies do not
        # all pick the same first token.
        scores = torch.full((batch, k), NEG_INF, device=device)
        scores[:, 0] = 0.0
        beams = _Beams(
            active=list(range(batch)),
            encoder=expanded,
            states=[scorer.start(expanded) for scorer in self.scorers],
            tokens=torch.full((batch * k,), self.model.sos_id, dtype=torch.long, device=device),
            scores=scores,
            history=torch.zeros(batch, k, 0, dtype=torch.long, device=device),
        )
        finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
        for step in range(max(limits, default=0)):
            step_scores, candidates, pending = self._score(beams, step)
            extensions = self._extend(beams, step_scores, candidates)
            history = torch.cat(
                [beams.history.gather(1, extensions.parent.gather(1, extensions.survivors).unsqueeze(-1).expand(-1, -1, step)),
                 extensions.tokens.gather(1, extensions.survivors).unsqueeze(-1)], -1
            )
            still = self._collect_finished(beams, extensions, history, step, limits, finished)
            if not still:
                break
            beams = self._advance(beams, extensions, history, pending, still)
        return [sorted(hyps, key=lambda h: h.score, reverse=True) for hyps in finished]

    def _score(self, beams: _Beams, step: int):
        """Weighted scores (N, C) of each hypothesis' candidate extensions, the candidates (N, C)
        (None: all V tokens), and every scorer's state after the step."""
        full, pending = {}, [None] * len(self.scorers)
        for i, scorer in enumerate(self.scorers):
            if scorer.full:
                full[i], pending[i] = scorer.score(beams.tokens, beams.states[i], None, step)
        shapes = torch.broadcast_tensors(*full.values())
        full = dict(zip(full, shapes))
        forbidden = torch.zeros_like(next(iter(full.values())), dtype=torch.bool)
        for scores in full.values():
            forbidden |= scores == NEG_INF
        candidates = None
        if self.partial:
            candidates = self._pre_beam(full, forbidden)
            full = {i: scores.gather(1, candidates) for i, scores in full.items()}
            forbidden = forbidden.gather(1, candidates)
        total = None
        for i, scorer in enumerate(self.scorers):
            if scorer.full:
                scores = full[i]
            else:
                scores, pending[i] = scorer.score(beams.tokens, beams.states[i], candidates, step)
            total = scorer.weight * scores if total is None else total + scorer.weight * scores
        return total.masked_fill(forbidden, NEG_INF), candidates, pending

    def _pre_beam(self, full: dict[int, torch.Tensor], forbidden: torch.Tensor) -> torch.Tensor:
        """(N, K): the tokens partial scorers score. The first scorer's (the decoder's) best tokens,
        and ``<eos>`` always: ending is cheap to score, and without it an utterance whose ``<eos>``
        the decoder ranks low could run out of hypotheses that CTC allows."""
        eos = self.model.eos_id
        others = full[0].masked_fill(forbidden, NEG_INF)
        others[:, eos] = NEG_INF
        count = min(others.size(1) - 1, self.options.ctc_candidates or math.ceil(1.5 * self.k))
        best = others.topk(count, dim=-1).indices
        return torch.cat([best, torch.full_like(best[:, :1], eos)], dim=1)

    def _extend(self, beams: _Beams, step_scores: torch.Tensor, candidates) -> _Extensions:
        """The 2k best extensions per utterance, and the k best of them that do not end."""
        num, k = len(beams.active), self.k
        per_hypothesis = step_scores.size(1)
        total = (beams.scores.view(-1, 1) + step_scores).view(num, k * per_hypothesis)
        width = min(2 * k, k * per_hypothesis)
        top_scores, top_index = total.topk(width, dim=-1)
        parent = torch.div(top_index, per_hypothesis, rounding_mode="floor")
        choice = top_index % per_hypothesis
        if candidates is None:
            tokens = choice
        else:
            offsets = torch.arange(num, device=total.device).unsqueeze(1) * k
            tokens = candidates[parent + offsets, choice]
        is_eos = tokens == self.model.eos_id
        # The k best non-<eos> extensions, in rank order (a stable sort on "ends").
        order_key = is_eos.long() * width + torch.arange(width, device=total.device).unsqueeze(0)
        survivors = order_key.argsort(dim=-1)[:, :k]
        return _Extensions(top_scores, parent, is_eos, survivors, candidates, choice, tokens)

    def _hypothesis(self, tokens: list[int], running: float, length: int, ended: bool = True) -> Hypothesis:
        # Running scores include the length bonus; normalisation by length applies to rankings only.
        log_prob = running - self.bonus * length
        score = log_prob / length if self.options.length_normalization else running
        return Hypothesis(tokens, score, log_prob, ended)

    def _rank(self, running: float, length: int) -> float:
        return running / length if self.options.length_normalization else running

    def _collect_finished(self, beams, extensions, history, step, limits, finished) -> list[int]:
        """Set aside the hypotheses that end at this step; positions in the active batch of the
        utterances that go on."""
        k, width = self.k, extensions.scores.size(1)
        survivors_ended = extensions.is_eos.gather(1, extensions.survivors)
        new_scores = extensions.scores.gather(1, extensions.survivors).masked_fill(survivors_ended, NEG_INF).tolist()
        top_scores, is_eos, parent = extensions.scores.tolist(), extensions.is_eos.tolist(), extensions.parent.tolist()
        still = []
        for a, b in enumerate(beams.active):
            for j in range(min(k, width)):
                if is_eos[a][j] and top_scores[a][j] > NEG_INF:
                    tokens = beams.history[a, parent[a][j]].tolist()
                    finished[b].append(self._hypothesis(tokens, top_scores[a][j], step + 1))
            if step + 1 >= limits[b]:
                for j in range(k):
                    if new_scores[a][j] > NEG_INF:
                        finished[b].append(self._hypothesis(history[a, j].tolist(), new_scores[a][j], step + 1, ended=False))
                continue
            best_active = max((self._rank(s, step + 1) for s in new_scores[a] if s > NEG_INF), default=NEG_INF)
            if best_active == NEG_INF:
                continue
            if len(finished[b]) >= k:
                kth_best = sorted((h.score for h in finished[b]), reverse=True)[k - 1]
                if kth_best >= best_active:
                    continue
            still.append(a)
        return still

    def _advance(self, beams: _Beams, extensions: _Extensions, history, pending: list, still: list[int]) -> _Beams:
        """The next step's beams: the survivors of the utterances that go on."""
        num, k, device = len(beams.active), self.k, beams.tokens.device
        offsets = torch.arange(num, device=device).unsqueeze(1) * k
        survivors = extensions.survivors
        parent_rows = extensions.parent.gather(1, survivors) + offsets   # (A, k) rows of this step's batch
        choice = extensions.choice.gather(1, survivors)
        scores = extensions.scores.gather(1, survivors).masked_fill(extensions.is_eos.gather(1, survivors), NEG_INF)
        tokens = extensions.tokens.gather(1, survivors)
        encoder, active = beams.encoder, beams.active
        same_utterances = len(still) == num
        if not same_utterances:
            # Done utterances leave the batch: keep the rows of the others.
            keep = torch.tensor(still, device=device)
            rows = (keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            encoder = encoder.index_select(rows)
            parent_rows, choice, scores, tokens, history = (
                x.index_select(0, keep) for x in (parent_rows, choice, scores, tokens, history)
            )
            active = [active[a] for a in still]
        parent_rows, choice = parent_rows.view(-1), choice.view(-1)
        states = [
            scorer.select(state, parent_rows, choice, extensions.candidates, same_utterances, encoder)
            for scorer, state in zip(self.scorers, pending)
        ]
        return _Beams(active, encoder, states, tokens.view(-1), scores, history)


@torch.no_grad()
def beam_search(
    model, encoder: EncoderOutput, options: DecodingOptions, nbest: int | None = None, scorers: list[Scorer] | None = None
) -> list[list[int]] | list[list[Hypothesis]]:
    """Beam search over a whole batch (module docstring): B * beam_size hypotheses per decoder step.

    nbest: None returns the best token list per utterance; an integer n returns
    up to n :class:`Hypothesis` per utterance, best first.
    """
    results = BeamSearch(model, options, scorers)(encoder)
    if nbest is not None:
        return [hyps[:nbest] for hyps in results]
    return [hyps[0].tokens if hyps else [] for hyps in results]

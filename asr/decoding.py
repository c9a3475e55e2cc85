"""Greedy and beam search for every model of the toolkit.

The search only talks to a model through the step-wise interface of
:mod:`asr.models.interface` (``init_decoder_state``, ``decode_step``,
``reorder_decoder_state``) and reads three attributes every model has:
``sos_id``, ``eos_id`` and ``pad_id`` (the pad id doubles as the CTC blank).
``<pad>`` and ``<sos>`` are never emitted.

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

Call ``model.eval()`` first: the search runs without gradients but does not
change the model's mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asr.models.ctc import CTCPrefixScorer
from asr.models.interface import STATIC_STATE_KEY, EncoderOutput

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    """One finished hypothesis of :func:`beam_search`.

    tokens: output ids without ``<sos>``/``<eos>``.
    score: the ranking score (after length normalisation or penalty).
    log_prob: the summed (CTC-mixed) log-probability, ``<eos>`` included when
        the hypothesis ended with one.
    ended: False when it was cut off at the maximum length.
    """

    tokens: list[int]
    score: float
    log_prob: float
    ended: bool = True


def _special_ids(model) -> tuple[int, int, int]:
    missing = [name for name in ("sos_id", "eos_id", "pad_id") if not hasattr(model, name)]
    if missing:
        raise AttributeError(f"{type(model).__name__} lacks {', '.join(missing)}, which decoding needs")
    return int(model.sos_id), int(model.eos_id), int(model.pad_id)


def max_steps(encoder: EncoderOutput, max_len_ratio: float, max_len: int | None) -> torch.Tensor:
    """(B,) long: the most decoding steps (``<eos>`` included) each utterance may take."""
    if max_len_ratio <= 0:
        raise ValueError(f"max_len_ratio must be positive, got {max_len_ratio}")
    limits = torch.ceil(encoder.lengths.float() * max_len_ratio).long().clamp(min=1)
    if max_len is not None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        limits = limits.clamp(max=max_len)
    return limits.cpu()


def _mask_never_emitted(log_probs: torch.Tensor, sos: int, pad: int, eos: int, forbid_eos: bool) -> torch.Tensor:
    log_probs = log_probs.clone()
    log_probs[:, sos] = NEG_INF
    log_probs[:, pad] = NEG_INF
    if forbid_eos:
        log_probs[:, eos] = NEG_INF
    return log_probs


def _reorder_within_utterances(model, state, index: torch.Tensor):
    """``model.reorder_decoder_state`` for an ``index`` that keeps every
    hypothesis within its utterance: the state's static part (see
    :mod:`asr.models.interface`) is the same for all of an utterance's rows, so
    it is kept as it is instead of being copied."""
    if not (isinstance(state, dict) and STATIC_STATE_KEY in state):
        return model.reorder_decoder_state(state, index)
    dynamic = {key: value for key, value in state.items() if key != STATIC_STATE_KEY}
    reordered = model.reorder_decoder_state(dynamic, index)
    reordered[STATIC_STATE_KEY] = state[STATIC_STATE_KEY]
    return reordered


@torch.no_grad()
def greedy_search(
    model,
    encoder: EncoderOutput,
    max_len_ratio: float = 1.0,
    min_len: int = 0,
    max_len: int | None = None,
) -> list[list[int]]:
    """Most probable token at every step, for the whole batch at once.

    encoder: the model's :class:`EncoderOutput` for B utterances. ``<eos>`` is
    not allowed before ``min_len`` tokens. An utterance leaves the batch once
    it has ended or reached its own maximum length, so the rest decode without
    it. Returns B lists of token ids without ``<sos>``/``<eos>``.
    """
    sos, eos, pad = _special_ids(model)
    batch = encoder.out.size(0)
    limits = max_steps(encoder, max_len_ratio, max_len).tolist()
    device = encoder.out.device
    state = model.init_decoder_state(encoder)
    tokens = torch.full((batch,), sos, dtype=torch.long, device=device)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    active = list(range(batch))  # the utterance of each row of the batch still decoding
    for step in range(max(limits, default=0)):
        log_probs, state = model.decode_step(tokens, state, encoder)
        log_probs = _mask_never_emitted(log_probs, sos, pad, eos, forbid_eos=step < min_len)
        tokens = log_probs.argmax(-1)
        still = []
        for row, (b, token) in enumerate(zip(active, tokens.tolist())):
            if token != eos:
                outputs[b].append(token)
                if step + 1 < limits[b]:
                    still.append(row)
        if not still:
            break
        if len(still) < len(active):
            keep = torch.tensor(still, device=device)
            state = model.reorder_decoder_state(state, keep)
            encoder = encoder.index_select(keep)
            tokens = tokens.index_select(0, keep)
            active = [active[row] for row in still]
    return outputs


@torch.no_grad()
def beam_search(
    model,
    encoder: EncoderOutput,
    beam_size: int = 4,
    length_penalty: float = 0.0,
    length_normalization: bool = False,
    max_len_ratio: float = 1.0,
    min_len: int = 0,
    max_len: int | None = None,
    ctc_weight: float = 0.0,
    ctc_candidates: int | None = None,
    nbest: int | None = None,
) -> list[list[int]] | list[list[Hypothesis]]:
    """Beam search over a whole batch: B * beam_size hypotheses per decode_step call.

    Each step extends every active hypothesis by every token (or, with CTC, by
    its ``ctc_candidates`` best tokens under the decoder, default
    ``ceil(1.5 * beam_size)`` as in ESPnet, since CTC prefix scoring costs
    O(T') per candidate, and by ``<eos>``), keeps the ``2 * beam_size`` best extensions per
    utterance, sets aside those ending in ``<eos>`` that rank within the first
    ``beam_size`` as finished, and continues with the ``beam_size`` best others.
    An utterance is done once it has ``beam_size`` finished hypotheses that all
    rank above its best active one (exact without length bonus or normalisation,
    because scores only fall as hypotheses grow; a heuristic with them), or at
    its maximum length, where the active hypotheses are finished as they are.
    A done utterance leaves the batch (its rows of the decoder state, the
    encoder output and the CTC scorer are dropped once), so every step only
    computes the utterances still searching; each utterance's result is the
    same as when decoded alone.

    length_penalty: added per token (``<eos>`` included) to the score (0 =
        none). All active hypotheses have the same length, so it only matters
        between hypotheses ending at different steps: positive values favour
        longer outputs.
    length_normalization: rank finished hypotheses by log-prob / length
        (exclusive with a non-zero length_penalty); pruning uses the plain sums.
    ctc_weight: weight of CTC prefix scores; needs ``encoder.ctc_log_probs``.
    nbest: None returns the best token list per utterance; an integer n returns
        up to n :class:`Hypothesis` per utterance, best first.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if length_normalization and length_penalty != 0.0:
        raise ValueError("use either length_normalization or length_penalty, not both")
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
    if ctc_weight > 0 and encoder.ctc_log_probs is None:
        raise ValueError("ctc_weight > 0 needs a model with a CTC head (encoder.ctc_log_probs is None)")
    sos, eos, pad = _special_ids(model)

    # Running scores include the length penalty; normalisation by length
    # applies to rankings only.
    def hypothesis(tokens: list[int], running: float, length: int, ended: bool = True) -> Hypothesis:
        log_prob = running - length_penalty * length
        return Hypothesis(tokens, log_prob / length if length_normalization else running, log_prob, ended)

    def rank(running: float, length: int) -> float:
        return running / length if length_normalization else running

    batch, k = encoder.out.size(0), beam_size
    device = encoder.out.device
    limits = max_steps(encoder, max_len_ratio, max_len).tolist()
    # The active batch: the utterances still searching (``active[a]`` is the
    # original index of the a-th), k hypotheses each; hypothesis i belongs to
    # active utterance i // k and never changes utterance, so the expanded
    # encoder (and the CTC log-probs, and the decoder state's static part)
    # need no reordering, only shrinking when utterances are done.
    active = list(range(batch))
    expanded = encoder.index_select(torch.arange(batch, device=device).repeat_interleave(k))
    state = model.init_decoder_state(expanded)
    tokens = torch.full((batch * k,), sos, dtype=torch.long, device=device)
    # Only the first copy of each utterance is alive at the start, so the k
    # copies do not all pick the same first token.
    scores = torch.full((batch, k), NEG_INF, device=device)
    scores[:, 0] = 0.0
    history = torch.zeros(batch, k, 0, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]

    scorer = ctc_state = None
    if ctc_weight > 0:
        scorer = CTCPrefixScorer(expanded.ctc_log_probs, expanded.lengths, blank_id=pad, eos_id=eos)
        ctc_state = scorer.initial_state()

    for step in range(max(limits, default=0)):
        num = len(active)
        log_probs, state = model.decode_step(tokens, state, expanded)
        log_probs = _mask_never_emitted(log_probs.float(), sos, pad, eos, forbid_eos=step < min_len)
        vocab = log_probs.size(1)
        if scorer is not None:
            # The decoder's best tokens, plus <eos> always: ending is cheap to
            # score, and without it an utterance whose <eos> the decoder ranks
            # low could run out of CTC-feasible hypotheses before any ends.
            others = log_probs.clone()
            others[:, eos] = NEG_INF
            att_top, candidates = others.topk(min(vocab - 1, ctc_candidates or math.ceil(1.5 * k)), dim=-1)
            att_top = torch.cat([att_top, log_probs[:, eos : eos + 1]], dim=1)  # (N, K)
            candidates = torch.cat([candidates, torch.full_like(candidates[:, :1], eos)], dim=1)
            num_candidates = candidates.size(1)
            delta, ctc_r, ctc_psi = scorer.score(ctc_state, candidates, min_prefix_length=step)
            step_scores = (1.0 - ctc_weight) * att_top + ctc_weight * delta
            step_scores = step_scores.masked_fill(torch.isinf(att_top), NEG_INF)
        else:
            num_candidates = vocab
            candidates = None
            step_scores = log_probs
        if length_penalty:
            step_scores = step_scores + length_penalty
        total = (scores.view(-1, 1) + step_scores).view(num, k * num_candidates)
        width = min(2 * k, k * num_candidates)
        top_scores, top_index = total.topk(width, dim=-1)  # (A, 2k)
        parent = torch.div(top_index, num_candidates, rounding_mode="floor")  # beam within the utterance
        choice = top_index % num_candidates
        offsets = torch.arange(num, device=device).unsqueeze(1) * k
        flat_parent = parent + offsets  # (A, 2k) rows of the active batch
        if candidates is None:
            top_tokens = choice
        else:
            top_tokens = candidates[flat_parent, choice]
        is_eos = top_tokens == eos

        # Active hypotheses: the k best non-<eos> extensions (stable order).
        order_key = is_eos.long() * width + torch.arange(width, device=device).unsqueeze(0)
        survivors = order_key.argsort(dim=-1)[:, :k]  # (A, k); width >= k since K >= 1
        new_scores = top_scores.gather(1, survivors).masked_fill(is_eos.gather(1, survivors), NEG_INF)
        new_parent = parent.gather(1, survivors)  # beam within the utterance
        new_tokens = top_tokens.gather(1, survivors)
        new_choice = choice.gather(1, survivors)

        top_scores_cpu, is_eos_cpu, parent_cpu = top_scores.tolist(), is_eos.tolist(), parent.tolist()
        new_history = torch.cat(
            [history.gather(1, new_parent.unsqueeze(-1).expand(-1, -1, step)), new_tokens.unsqueeze(-1)], -1
        )
        new_scores_cpu = new_scores.tolist()
        still = []  # positions in the active batch of the utterances that go on
        for a, b in enumerate(active):
            for j in range(min(k, width)):
                if is_eos_cpu[a][j] and top_scores_cpu[a][j] > NEG_INF:
                    tokens_j = history[a, parent_cpu[a][j]].tolist()
                    finished[b].append(hypothesis(tokens_j, top_scores_cpu[a][j], step + 1))
            if step + 1 >= limits[b]:
                for j in range(k):
                    if new_scores_cpu[a][j] > NEG_INF:
                        tokens_j = new_history[a, j].tolist()
                        finished[b].append(hypothesis(tokens_j, new_scores_cpu[a][j], step + 1, ended=False))
                continue
            best_active = max((rank(s, step + 1) for s in new_scores_cpu[a] if s > NEG_INF), default=NEG_INF)
            if best_active == NEG_INF:
                continue
            if len(finished[b]) >= k:
                kth_best = sorted((h.score for h in finished[b]), reverse=True)[k - 1]
                if kth_best >= best_active:
                    continue
            still.append(a)
        if not still:
            break

        ctc_parent = (new_parent + offsets).view(-1)  # parent rows in this step's batch (the CTC variables')
        if len(still) < num:
            # Done utterances leave: select the rows of the others, then the
            # reordering below works within the smaller batch.
            keep = torch.tensor(still, device=device)
            rows = (keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            state = model.reorder_decoder_state(state, rows)
            expanded = expanded.index_select(rows)
            ctc_parent = ctc_parent.view(num, k).index_select(0, keep).view(-1)
            if scorer is not None:
                scorer = CTCPrefixScorer(expanded.ctc_log_probs, expanded.lengths, blank_id=pad, eos_id=eos)
            new_parent, new_scores, new_tokens, new_choice, new_history = (
                x.index_select(0, keep) for x in (new_parent, new_scores, new_tokens, new_choice, new_history)
            )
            active = [active[a] for a in still]
            num = len(still)
            offsets = torch.arange(num, device=device).unsqueeze(1) * k
        state = _reorder_within_utterances(model, state, (new_parent + offsets).view(-1))
        if scorer is not None:
            ctc_state = CTCPrefixScorer.select(ctc_r, ctc_psi, candidates, ctc_parent, new_choice.view(-1))
        tokens = new_tokens.view(-1)
        scores = new_scores
        history = new_history

    results = [sorted(hyps, key=lambda h: h.score, reverse=True) for hyps in finished]
    if nbest is not None:
        return [hyps[:nbest] for hyps in results]
    return [hyps[0].tokens if hyps else [] for hyps in results]


@torch.no_grad()
def sequence_log_probs(
    model, encoder: EncoderOutput, hypotheses: list[list[int]], ctc_weight: float = 0.0
) -> torch.Tensor:
    """Score given outputs the way :func:`beam_search` does: (B,) summed
    ``(1 - ctc_weight) * log p_att + ctc_weight * log p_ctc`` of each token list
    followed by ``<eos>`` (log p_ctc of the whole sequence). For rescoring and
    for checking a search against the model."""
    sos, eos, pad = _special_ids(model)
    batch = len(hypotheses)
    device = encoder.out.device
    lengths = torch.tensor([len(h) for h in hypotheses], dtype=torch.long)
    steps = int(lengths.max()) + 1 if batch else 0
    targets = torch.full((batch, steps), eos, dtype=torch.long)
    for b, hyp in enumerate(hypotheses):
        targets[b, : len(hyp)] = torch.tensor(hyp, dtype=torch.long)
    targets = targets.to(device)
    valid = (torch.arange(steps).unsqueeze(0) <= lengths.unsqueeze(1)).to(device)
    state = model.init_decoder_state(encoder)
    tokens = torch.full((batch,), sos, dtype=torch.long, device=device)
    total = torch.zeros(batch, device=device)
    for t in range(steps):
        log_probs, state = model.decode_step(tokens, state, encoder)
        picked = log_probs.float().gather(1, targets[:, t : t + 1]).squeeze(1)
        total = total + torch.where(valid[:, t], picked, torch.zeros_like(picked))
        tokens = targets[:, t]
    if ctc_weight > 0:
        if encoder.ctc_log_probs is None:
            raise ValueError("ctc_weight > 0 needs a model with a CTC head (encoder.ctc_log_probs is None)")
        ctc = -F.ctc_loss(
            encoder.ctc_log_probs.float().transpose(0, 1),
            targets[:, : max(steps - 1, 1)],  # the tokens; the <eos> column is past every length
            encoder.lengths,
            lengths.to(device),
            blank=pad,
            reduction="none",
            zero_infinity=False,
        )
        total = (1.0 - ctc_weight) * total + ctc_weight * ctc
    return total


def ctc_best_path(encoder: EncoderOutput, blank_id: int) -> list[list[int]]:
    """The CTC head's best path for each of the B utterances: the most probable
    token per encoder frame (``encoder.ctc_log_probs`` (B, T', V) within
    ``encoder.lengths``), repeats merged, blanks removed. No decoder is run, so
    it is an independent second opinion on the attention decoder's output."""
    if encoder.ctc_log_probs is None:
        raise ValueError("CTC best path needs a model with a CTC head (encoder.ctc_log_probs is None)")
    paths = []
    for frames, length in zip(encoder.ctc_log_probs.argmax(-1).tolist(), encoder.lengths.tolist()):
        tokens, previous = [], None
        for token in frames[:length]:
            if token != previous and token != blank_id:
                tokens.append(token)
            previous = token
        paths.append(tokens)
    return paths


_SEARCH_OPTIONS = {
    "length_penalty",
    "length_normalization",
    "max_len_ratio",
    "min_len",
    "max_len",
    "ctc_weight",
    "ctc_candidates",
}
_GREEDY_OPTIONS = {"max_len_ratio", "min_len", "max_len"}


@torch.no_grad()
def decode(
    model, features: torch.Tensor, feature_lengths: torch.Tensor, beam_size: int = 1, **options
) -> list[list[int]]:
    """Encode features (B, T, D) with lengths (B,) and search: greedy for
    ``beam_size == 1`` without CTC, beam search otherwise. ``options`` are
    :func:`beam_search`'s keywords (those only beam search uses are ignored by
    greedy search). Returns B token-id lists."""
    return search(model, model.encode(features, feature_lengths), beam_size, **options)


@torch.no_grad()
def search(model, encoder: EncoderOutput, beam_size: int = 1, **options) -> list[list[int]]:
    """:func:`decode` after the encoder: greedy or beam search on ``encoder`` (B utterances)."""
    unknown = sorted(set(options) - _SEARCH_OPTIONS)
    if unknown:
        known = ", ".join(sorted(_SEARCH_OPTIONS))
        raise TypeError(f"decode() got unknown option(s) {', '.join(unknown)}; known: {known}")
    if beam_size == 1 and options.get("ctc_weight", 0.0) == 0.0:
        return greedy_search(model, encoder, **{k: v for k, v in options.items() if k in _GREEDY_OPTIONS})
    return beam_search(model, encoder, beam_size=beam_size, **options)

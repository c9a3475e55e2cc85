"""Greedy and beam search (asr/decoding.py) and the CTC prefix scorer (asr/models/ctc.py)."""

import dataclasses
import itertools
import math

import pytest
import torch
from torch import nn

from asr.decoding import (
    CoverageScorer, DecoderScorer, DecodingOptions, beam_search, ctc_best_path, decode, greedy_search, max_steps, search,
    sequence_log_probs,
)
from asr.models.attention import AttentionConfig
from asr.models.common import lengths_to_mask
from asr.models.ctc import CTCPrefixScorer
from asr.models.interface import STATIC_STATE_KEY, EncoderOutput, reorder_nested
from asr.models.las import LAS, LASConfig
from asr.models.listener import ListenerConfig
from asr.models.speller import SpellerConfig

PAD, SOS, EOS = 0, 1, 2


class ToyModel(nn.Module):
    """A small recurrent decoder behind the model interface: its distributions
    depend on the whole history and on the (masked) encoder output, are peaky
    enough that searches differ, and favour <eos> more with every step."""

    def __init__(self, vocab: int = 8, dim: int = 6, sharpness: float = 3.0, seed: int = 0, eos_ramp: float = 1.0):
        super().__init__()
        torch.manual_seed(seed)
        self.pad_id, self.sos_id, self.eos_id = PAD, SOS, EOS
        self.embed = nn.Embedding(vocab, dim)
        self.cell = nn.GRUCell(dim, dim)
        self.out = nn.Linear(2 * dim, vocab)
        self.ctc = nn.Linear(dim, vocab)
        self.sharpness = sharpness
        self.eos_ramp = eos_ramp

    def encode(self, features, lengths):
        mask = lengths_to_mask(lengths, features.size(1))
        out = features * mask.unsqueeze(-1)
        ctc = torch.log_softmax(2.0 * self.ctc(out), -1)
        return EncoderOutput(out=out, mask=mask, lengths=lengths, ctc_log_probs=ctc)

    def init_decoder_state(self, encoder):
        pooled = encoder.out.sum(1) / encoder.lengths.unsqueeze(1)
        return {"h": pooled, "pooled": pooled, "step": torch.zeros_like(encoder.lengths, dtype=pooled.dtype)}

    def decode_step(self, tokens, state, encoder):
        h = self.cell(self.embed(tokens), state["h"])
        logits = self.sharpness * self.out(torch.cat([h, state["pooled"]], -1))
        logits[:, EOS] += self.eos_ramp * (state["step"] - 4.0)
        return torch.log_softmax(logits, -1), dict(state, h=h, step=state["step"] + 1)

    def reorder_decoder_state(self, state, index):
        return reorder_nested(state, index)


class StaticToyModel(ToyModel):
    """ToyModel with its per-utterance tensor in the state's static part, and a
    record of the batch size of every step and of every reorder call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.step_sizes, self.reorders = [], []

    def init_decoder_state(self, encoder):
        state = super().init_decoder_state(encoder)
        return {"h": state["h"], "step": state["step"], STATIC_STATE_KEY: {"pooled": state["pooled"]}}

    def decode_step(self, tokens, state, encoder):
        self.step_sizes.append(tokens.size(0))
        assert encoder.out.size(0) == tokens.size(0) == state[STATIC_STATE_KEY]["pooled"].size(0)
        flat = dict(state, pooled=state[STATIC_STATE_KEY]["pooled"])
        log_probs, flat = super().decode_step(tokens, flat, encoder)
        return log_probs, {"h": flat["h"], "step": flat["step"], STATIC_STATE_KEY: state[STATIC_STATE_KEY]}

    def reorder_decoder_state(self, state, index):
        self.reorders.append((STATIC_STATE_KEY in state, index.numel()))
        return reorder_nested(state, index)


def toy_batch(lengths=(9, 5, 7, 3), dim=6, seed=1):
    torch.manual_seed(seed)
    lengths = torch.tensor(lengths)
    return torch.randn(len(lengths), int(lengths.max()), dim), lengths


# ----------------------------------------------------------------------------- CTC prefix scorer


def brute_force(log_probs: torch.Tensor, prefix: tuple[int, ...], exact: bool) -> float:
    """log P(CTC output starts with / equals prefix) by summing over all T^V paths."""
    time, vocab = log_probs.shape
    total = 0.0
    for path in itertools.product(range(vocab), repeat=time):
        collapsed = [s for i, s in enumerate(path) if s != PAD and (i == 0 or s != path[i - 1])]
        match = tuple(collapsed) == prefix if exact else tuple(collapsed[: len(prefix)]) == prefix
        if match:
            total += math.exp(sum(log_probs[t, s].item() for t, s in enumerate(path)))
    return math.log(total) if total > 0 else float("-inf")


def run_scorer(scorer, prefixes: list[tuple[int, ...]], candidates: torch.Tensor, min_prefix_length: int = 0):
    """Extend each prefix token by token (prefixes of equal length), then score the candidates."""
    state = scorer.initial_state()
    (length,) = {len(p) for p in prefixes}
    for step in range(length):
        tokens = torch.tensor([[p[step]] for p in prefixes])
        _, r, psi = scorer.score(state, tokens)
        rows = torch.arange(len(prefixes))
        state = scorer.select(r, psi, tokens, rows, torch.zeros_like(rows))
    return scorer.score(state, candidates, min_prefix_length=min_prefix_length)


def test_ctc_prefix_scores_match_brute_force():
    torch.manual_seed(0)
    time, vocab = 4, 5  # blank, <sos>, <eos>, two labels
    log_probs = torch.log_softmax(torch.randn(1, time, vocab, dtype=torch.float64) * 1.5, -1)
    candidates = torch.tensor([[3, 4, EOS, PAD]])
    for prefix in [(), (3,), (4,), (3, 3), (3, 4), (4, 4, 3)]:
        scorer = CTCPrefixScorer(log_probs, torch.tensor([time]), blank_id=PAD, eos_id=EOS)
        if prefix:
            delta, _, psi = run_scorer(scorer, [prefix], candidates)
        else:
            delta, _, psi = scorer.score(scorer.initial_state(), candidates)
        for j, c in enumerate(candidates[0].tolist()):
            if c == PAD:
                assert psi[0, j] == float("-inf")
                continue
            expected = brute_force(log_probs[0], prefix, exact=True) if c == EOS else brute_force(
                log_probs[0], prefix + (c,), exact=False
            )
            assert psi[0, j].item() == pytest.approx(expected, abs=1e-9), (prefix, c)
        # delta is the increment over the prefix's own probability
        own = brute_force(log_probs[0], prefix, exact=False)
        torch.testing.assert_close(delta, psi - own)


def test_ctc_prefix_scorer_ignores_padding_and_may_skip_early_frames():
    torch.manual_seed(1)
    log_probs = torch.log_softmax(torch.randn(2, 7, 6, dtype=torch.float64), -1)
    lengths = torch.tensor([7, 4])
    candidates = torch.tensor([[3, 4, 5, EOS], [3, 4, 5, EOS]])
    prefixes = [(4, 5), (3, 3)]
    batch_scorer = CTCPrefixScorer(log_probs, lengths, blank_id=PAD, eos_id=EOS)
    delta, _, psi = run_scorer(batch_scorer, prefixes, candidates)
    _, _, psi_skip = run_scorer(batch_scorer, prefixes, candidates, min_prefix_length=2)
    torch.testing.assert_close(psi_skip, psi)
    alone = CTCPrefixScorer(log_probs[1:, :4], lengths[1:], blank_id=PAD, eos_id=EOS)
    _, _, psi_alone = run_scorer(alone, prefixes[1:], candidates[1:])
    torch.testing.assert_close(psi_alone[0], psi[1])
    # an impossible prefix (3 labels incl. a repeat need 4 frames) in 4 frames: (3, 3, 3) is -inf
    assert psi[1, 0].item() == float("-inf")
    assert torch.isfinite(psi[1, 1:]).all()


# ----------------------------------------------------------------------------- greedy and beam search


def test_ctc_best_path_merges_repeats_drops_blanks_and_respects_lengths():
    blank = 0
    best = torch.tensor([[0, 3, 3, 0, 3, 4, 4], [5, 5, 0, 5, 2, 2, 2]])  # the argmax per frame
    log_probs = torch.nn.functional.one_hot(best, 6).float().log_softmax(-1)
    encoder = EncoderOutput(
        out=torch.zeros(2, 7, 1), mask=torch.ones(2, 7, dtype=torch.bool), lengths=torch.tensor([6, 3]),
        ctc_log_probs=log_probs,
    )
    # A blank between two 3s keeps both; frames past an utterance's length are not read.
    assert ctc_best_path(encoder, blank) == [[3, 3, 4], [5]]
    with pytest.raises(ValueError, match="CTC head"):
        ctc_best_path(EncoderOutput(encoder.out, encoder.mask, encoder.lengths, None), blank)


def test_greedy_picks_the_argmax_and_respects_lengths():
    model = ToyModel().eval()
    features, lengths = toy_batch()
    encoder = model.encode(features, lengths)
    hyps = greedy_search(model, encoder, DecodingOptions(max_len_ratio=2.0))
    limits = max_steps(encoder, DecodingOptions(max_len_ratio=2.0)).tolist()
    for b, hyp in enumerate(hyps):
        assert len(hyp) <= limits[b]
        assert all(t not in (PAD, SOS, EOS) for t in hyp)
        # replay: every emitted token is the argmax over the allowed tokens
        one = encoder.index_select(torch.tensor([b]))
        state = model.init_decoder_state(one)
        token = torch.tensor([SOS])
        for t in hyp + ([EOS] if len(hyp) < limits[b] else []):
            log_probs, state = model.decode_step(token, state, one)
            log_probs[:, [PAD, SOS]] = float("-inf")
            assert log_probs.argmax(-1).item() == t
            token = torch.tensor([t])
    capped = greedy_search(model, encoder, DecodingOptions(max_len_ratio=2.0, max_len=2))
    assert all(len(h) <= 2 for h in capped)


def test_min_len_forbids_an_early_end():
    model = ToyModel(seed=2).eval()
    with torch.no_grad():
        model.out.bias[EOS] = 50.0  # <eos> is always the argmax
    features, lengths = toy_batch()
    encoder = model.encode(features, lengths)
    assert greedy_search(model, encoder, DecodingOptions(max_len_ratio=3.0)) == [[], [], [], []]
    assert all(len(h) == 3 for h in greedy_search(model, encoder, DecodingOptions(max_len_ratio=3.0, min_len=3)))
    assert all(len(h) == 3 for h in beam_search(model, encoder, DecodingOptions(beam_size=3, max_len_ratio=3.0, min_len=3)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(seed):
    model = ToyModel(seed=seed).eval()
    features, lengths = toy_batch(seed=seed + 10)
    encoder = model.encode(features, lengths)
    assert beam_search(model, encoder, DecodingOptions(beam_size=1, max_len_ratio=2.0)) == greedy_search(model, encoder, DecodingOptions(max_len_ratio=2.0))


@pytest.mark.parametrize("ctc_weight", [0.0, 0.4])
def test_batched_beam_search_equals_one_utterance_at_a_time(ctc_weight):
    model = ToyModel(seed=3).eval()
    features, lengths = toy_batch()
    encoder = model.encode(features, lengths)
    batched = beam_search(model, encoder, DecodingOptions(beam_size=3, max_len_ratio=2.0, ctc_weight=ctc_weight), nbest=3)
    for b in range(len(lengths)):
        n = int(lengths[b])
        alone_encoder = model.encode(features[b : b + 1, :n], lengths[b : b + 1])
        alone = beam_search(model, alone_encoder, DecodingOptions(beam_size=3, max_len_ratio=2.0, ctc_weight=ctc_weight), nbest=3)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[b]]
        for h1, h2 in zip(alone, batched[b]):
            assert h1.score == pytest.approx(h2.score, abs=1e-4)


@pytest.mark.parametrize("seed", [0, 4, 5])
def test_beam_finds_at_least_the_greedy_score_and_reports_true_scores(seed):
    model = ToyModel(seed=seed, sharpness=1.5).eval()
    features, lengths = toy_batch(seed=seed)
    encoder = model.encode(features, lengths)
    greedy = greedy_search(model, encoder, DecodingOptions(max_len_ratio=3.0))
    nbest = beam_search(model, encoder, DecodingOptions(beam_size=5, max_len_ratio=3.0), nbest=5)
    best = [hyps[0].tokens for hyps in nbest]
    assert best == beam_search(model, encoder, DecodingOptions(beam_size=5, max_len_ratio=3.0))
    greedy_scores = sequence_log_probs(model, encoder, greedy)
    beam_scores = sequence_log_probs(model, encoder, best)
    ended = [len(g) < max_steps(encoder, DecodingOptions(max_len_ratio=3.0))[b] for b, g in enumerate(greedy)]
    for b in range(len(greedy)):
        if ended[b]:  # greedy's hypothesis ended with <eos>, so both are scored the same way
            assert beam_scores[b] >= greedy_scores[b] - 1e-5
        hyps = nbest[b]
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:  # the search's own score is the model's log-probability of the hypothesis
            if h.ended:
                assert h.log_prob == pytest.approx(sequence_log_probs(model, encoder.index_select(
                    torch.tensor([b])), [h.tokens]).item(), abs=1e-4)
    assert sum(ended) >= 2  # the comparison above did happen


def test_beam_with_ctc_scores_are_the_mixed_log_probabilities():
    model = ToyModel(seed=6).eval()
    features, lengths = toy_batch()
    encoder = model.encode(features, lengths)
    # 2 T' steps: more than CTC allows (T' labels + <eos>), so every hypothesis must end
    nbest = beam_search(model, encoder, DecodingOptions(beam_size=4, max_len_ratio=2.0, ctc_weight=0.5), nbest=4)
    for b, hyps in enumerate(nbest):
        assert len(hyps) >= 4
        one = encoder.index_select(torch.tensor([b]))
        for h in hyps:
            assert h.ended
            # CTC can emit at most T' labels: the joint search never exceeds that
            assert len(h.tokens) <= int(lengths[b])
            expected = sequence_log_probs(model, one, [h.tokens], ctc_weight=0.5).item()
            assert h.log_prob == pytest.approx(expected, abs=1e-4)


def test_length_normalisation_and_penalty():
    model = ToyModel(seed=7, sharpness=1.0, eos_ramp=0.0).eval()
    features, lengths = toy_batch()
    encoder = model.encode(features, lengths)
    normalised = beam_search(model, encoder, DecodingOptions(beam_size=4, max_len_ratio=2.0, length_normalization=True), nbest=4)
    for hyps in normalised:
        for h in hyps:
            assert h.score == pytest.approx(h.log_prob / (len(h.tokens) + int(h.ended)))
    short = beam_search(model, encoder, DecodingOptions(beam_size=4, max_len_ratio=2.0, length_penalty=-2.0))
    long = beam_search(model, encoder, DecodingOptions(beam_size=4, max_len_ratio=2.0, length_penalty=2.0), nbest=4)
    assert sum(len(hyps[0].tokens) for hyps in long) > sum(map(len, short))
    for hyps in long:
        for h in hyps:
            assert h.score == pytest.approx(h.log_prob + 2.0 * (len(h.tokens) + int(h.ended)))
    with pytest.raises(ValueError, match="either length_normalization or length_penalty"):
        beam_search(model, encoder, DecodingOptions(length_normalization=True, length_penalty=1.0))


def test_decode_dispatches_and_checks_options():
    model = ToyModel(seed=8).eval()
    features, lengths = toy_batch()
    encoder = model.encode(features, lengths)
    assert decode(model, features, lengths, DecodingOptions(max_len_ratio=2.0)) == greedy_search(model, encoder, DecodingOptions(max_len_ratio=2.0))
    assert decode(model, features, lengths, DecodingOptions(beam_size=3, max_len_ratio=2.0)) == beam_search(model, encoder, DecodingOptions(beam_size=3, max_len_ratio=2.0))
    assert decode(model, features, lengths, DecodingOptions(ctc_weight=0.3)) == beam_search(model, encoder, DecodingOptions(beam_size=1, ctc_weight=0.3))
    with pytest.raises(TypeError, match="beam"):
        DecodingOptions(beam=3)  # an unknown option is refused when the options are made
    for bad, match in (({"beam_size": 0}, "beam_size"), ({"ctc_weight": 1.5}, "ctc_weight"),
                       ({"max_len_ratio": 0.0}, "max_len_ratio"), ({"max_len": 0}, "max_len")):
        with pytest.raises(ValueError, match=match):
            DecodingOptions(**bad)
    no_ctc = EncoderOutput(encoder.out, encoder.mask, encoder.lengths, None)
    with pytest.raises(ValueError, match="CTC head"):
        beam_search(model, no_ctc, DecodingOptions(ctc_weight=0.3))


@pytest.mark.parametrize("ctc_weight", [0.0, 0.4])
def test_finished_utterances_leave_the_batch_and_each_keeps_its_own_max_length(ctc_weight):
    lengths = torch.tensor([3, 9, 5])  # the short ones finish first; the long one runs on alone
    features, _ = toy_batch(lengths=lengths.tolist(), seed=2)
    k, ratio = 3, 2.0
    limits = [math.ceil(ratio * n) for n in lengths.tolist()]
    for never_ends in (True, False):
        model = StaticToyModel(seed=3, eos_ramp=0.0 if never_ends else 1.0).eval()
        if never_ends:  # no hypothesis ends: every one runs to its own utterance's limit
            with torch.no_grad():
                model.out.bias[EOS] = -50.0
        encoder = model.encode(features, lengths)
        batched = beam_search(model, encoder, DecodingOptions(beam_size=k, max_len_ratio=ratio, ctc_weight=ctc_weight), nbest=k)
        steps, reorders = model.step_sizes[:], model.reorders[:]
        for b, n in enumerate(lengths.tolist()):
            alone = beam_search(model, model.encode(features[b : b + 1, :n], lengths[b : b + 1]), DecodingOptions(beam_size=k, max_len_ratio=ratio, ctc_weight=ctc_weight), nbest=k)[0]
            assert [h.tokens for h in alone] == [h.tokens for h in batched[b]]
            assert [h.ended for h in alone] == [h.ended for h in batched[b]]
            for h1, h2 in zip(alone, batched[b]):
                assert h1.score == pytest.approx(h2.score, abs=1e-4)
            for h in batched[b]:
                assert len(h.tokens) + int(h.ended) <= limits[b]
                if never_ends and ctc_weight == 0.0:
                    assert not h.ended and len(h.tokens) == limits[b]
        if never_ends and ctc_weight == 0.0:
            # Each utterance is computed for exactly its own number of steps,
            # and the static part is only touched when utterances leave.
            assert steps == [k * sum(limit > t for limit in limits) for t in range(max(limits))]
            assert [n for has_static, n in reorders if has_static] == [2 * k, k]
        assert sum(steps) < k * len(limits) * max(limits)  # the batch did shrink
        model.step_sizes.clear()
        model.reorders.clear()
    greedy = greedy_search(model, encoder, DecodingOptions(max_len_ratio=ratio))
    sizes = model.step_sizes[:]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < len(limits)  # greedy shrinks its batch too
    for b, n in enumerate(lengths.tolist()):
        alone = model.encode(features[b : b + 1, :n], lengths[b : b + 1])
        assert greedy_search(model, alone, DecodingOptions(max_len_ratio=ratio))[0] == greedy[b]
        assert len(greedy[b]) <= limits[b]


def test_a_static_state_part_gives_the_same_search():
    features, lengths = toy_batch()
    plain, static = ToyModel(seed=4).eval(), StaticToyModel(seed=4).eval()
    for options in ({}, {"ctc_weight": 0.5}):
        search = DecodingOptions(beam_size=3, max_len_ratio=2.0, **options)
        one = beam_search(plain, plain.encode(features, lengths), search, nbest=3)
        two = beam_search(static, static.encode(features, lengths), search, nbest=3)
        assert [[h.tokens for h in hyps] for hyps in one] == [[h.tokens for h in hyps] for hyps in two]
        assert [[h.score for h in hyps] for hyps in one] == [[h.score for h in hyps] for hyps in two]


def test_las_beam_search_batched_equals_alone_and_beam_one_equals_greedy():
    config = LASConfig(
        listener=ListenerConfig(hidden_size=8, num_layers=2, pyramid_layers=1),
        attention=AttentionConfig(type="location", dim=8, conv_channels=2, conv_kernel=3),
        speller=SpellerConfig(embedding_dim=4, hidden_size=8, num_layers=1),
        ctc_weight=0.3,
    )
    torch.manual_seed(0)
    model = LAS(config, input_dim=5, vocab_size=9).eval()
    with torch.no_grad():
        model.speller.output.weight.mul_(8.0)  # peaky distributions, so that the searches differ
    features, lengths = torch.randn(3, 13, 5), torch.tensor([13, 8, 5])
    encoder = model.encode(features, lengths)
    assert beam_search(model, encoder, DecodingOptions(beam_size=1, max_len_ratio=2.0)) == greedy_search(model, encoder, DecodingOptions(max_len_ratio=2.0))
    for ctc_weight in (0.0, 0.3):
        batched = beam_search(model, encoder, DecodingOptions(beam_size=3, max_len_ratio=2.0, ctc_weight=ctc_weight))
        for b in range(3):
            n = int(lengths[b])
            alone = model.encode(features[b : b + 1, :n], lengths[b : b + 1])
            assert beam_search(model, alone, DecodingOptions(beam_size=3, max_len_ratio=2.0, ctc_weight=ctc_weight))[0] == batched[b]


# ----------------------------------------------------------------------------- remedies for long utterances


class FixedModel(nn.Module):
    """A decoder whose every step gives the same distribution and the same attention, both chosen by the test."""

    def __init__(self, probs: list[float], attention: list[float] | None = None):
        super().__init__()
        self.pad_id, self.sos_id, self.eos_id = PAD, SOS, EOS
        self.log_probs = torch.tensor(probs).log()
        self.attention = None if attention is None else torch.tensor(attention)

    def init_decoder_state(self, encoder):
        return {"n": torch.zeros(encoder.out.size(0))}

    def decode_step(self, tokens, state, encoder):
        return self.log_probs.expand(tokens.size(0), -1).clone(), state

    def decoder_attention(self, state):
        return None if self.attention is None else self.attention.expand(state["n"].size(0), -1)

    def reorder_decoder_state(self, state, index):
        return reorder_nested(state, index)


def test_the_eos_threshold_allows_eos_only_near_the_best_other_token():
    # p(<eos>) = 0.3, best other token 0.5: allowed at a threshold of 0.5 (0.3 >= 0.25), not at 0.7 (0.3 < 0.35).
    model = FixedModel([1e-9, 1e-9, 0.3, 0.5, 0.2 - 2e-9])
    encoder = EncoderOutput(torch.zeros(1, 4, 2), torch.ones(1, 4, dtype=torch.bool), torch.tensor([4]))
    tokens = torch.tensor([SOS])
    for threshold, allowed in ((0.0, True), (0.5, True), (0.7, False)):
        scorer = DecoderScorer(model, 1.0, eos_threshold=threshold)
        log_probs, _ = scorer.score(tokens, scorer.start(encoder), None, step=3)
        assert torch.isfinite(log_probs[0, EOS]).item() is allowed, threshold
        assert log_probs[0, 3].item() == pytest.approx(math.log(0.5))  # other tokens untouched
    # In the search: without the threshold the best hypothesis ends at once, with it later.
    assert beam_search(model, encoder, DecodingOptions(beam_size=2, max_len=3)) == [[]]
    assert beam_search(model, encoder, DecodingOptions(beam_size=2, max_len=3, eos_threshold=0.7)) == [[3, 3, 3]]


def test_coverage_counts_the_frames_whose_summed_attention_passes_the_threshold():
    # Each step attends 0.3 to frame 0, 0.6 to frame 1, 0.1 to frame 2.
    model = FixedModel([0.1, 0.1, 0.4, 0.4], attention=[0.3, 0.6, 0.1])
    encoder = EncoderOutput(torch.zeros(2, 3, 2), torch.ones(2, 3, dtype=torch.bool), torch.tensor([3, 3]))
    decoder = DecoderScorer(model, 1.0)
    coverage = CoverageScorer(decoder, weight=1.0, threshold=0.5)
    decoder_state, state = decoder.start(encoder), coverage.start(encoder)
    tokens = torch.tensor([SOS, SOS])
    gains = []
    for step in range(3):
        _, decoder_state = decoder.score(tokens, decoder_state, None, step)
        gain, state = coverage.score(tokens, state, None, step)
        gains.append(gain[:, 0].tolist())
    # Summed: (0.3, 0.6, 0.1) -> frame 1 covered; (0.6, 1.2, 0.2) -> frame 0 too; (0.9, 1.8, 0.3) -> nothing new.
    assert gains == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    assert coverage.select(state, torch.tensor([1]), None, None, True, encoder).shape == (1, 3)


def test_coverage_keeps_beam_search_per_utterance_and_needs_attention():
    config = LASConfig(
        listener=ListenerConfig(hidden_size=8, num_layers=2, pyramid_layers=1),
        attention=AttentionConfig(type="location", dim=8, conv_channels=2, conv_kernel=3),
        speller=SpellerConfig(embedding_dim=4, hidden_size=8, num_layers=1),
        ctc_weight=0.3,
    )
    torch.manual_seed(0)
    model = LAS(config, input_dim=5, vocab_size=9).eval()
    with torch.no_grad():
        model.speller.output.weight.mul_(8.0)
    features, lengths = torch.randn(3, 13, 5), torch.tensor([13, 8, 5])
    encoder = model.encode(features, lengths)
    options = DecodingOptions(beam_size=3, max_len_ratio=2.0, ctc_weight=0.3, coverage_weight=0.5)
    batched = beam_search(model, encoder, options, nbest=3)
    for b in range(3):
        alone = model.encode(features[b : b + 1, : int(lengths[b])], lengths[b : b + 1])
        assert [h.tokens for h in beam_search(model, alone, options, nbest=3)[0]] == [h.tokens for h in batched[b]]
    # The coverage bonus is what the ranking adds to the log-probabilities: without it the scores are those.
    plain = beam_search(model, encoder, dataclasses.replace(options, coverage_weight=0.0), nbest=3)
    for hyps in plain:
        for h in hyps:
            assert h.score == h.log_prob
    with pytest.raises(ValueError, match="decoder_attention"):
        beam_search(FixedModel([0.1, 0.1, 0.4, 0.4]), encoder, options)


def test_ctc_greedy_is_the_ctc_best_path():
    model = ToyModel(seed=3).eval()
    features, lengths = toy_batch()
    encoder = model.encode(features, lengths)
    assert search(model, encoder, DecodingOptions(ctc_greedy=True)) == ctc_best_path(encoder, PAD)


def _loop_recursions(scorer, state, candidates, start):
    """The prefix recursions as a loop over frames (the definition, asr.models.ctc.CTCPrefixScorer.score)."""
    time = scorer.x.size(0)
    x_c = scorer.x.gather(2, candidates.unsqueeze(0).expand(time, -1, -1))
    x_blank = scorer.x[:, :, scorer.blank_id].unsqueeze(-1)
    r_prev_n, r_prev_b = state.r[:, 0].unsqueeze(-1), state.r[:, 1].unsqueeze(-1)
    repeat = (candidates == state.last.unsqueeze(-1)).unsqueeze(0)
    phi = torch.logaddexp(r_prev_b, torch.where(repeat, torch.full_like(x_c, float("-inf")), r_prev_n))
    r_n, r_b = torch.full_like(x_c, float("-inf")), torch.full_like(x_c, float("-inf"))
    r_n[0] = torch.where((state.last < 0).unsqueeze(-1), x_c[0], torch.full_like(x_c[0], float("-inf")))
    psi = r_n[start - 1].clone()
    for t in range(start, time):
        r_n[t] = torch.logaddexp(r_n[t - 1], phi[t - 1]) + x_c[t]
        r_b[t] = torch.logaddexp(r_b[t - 1], r_n[t - 1]) + x_blank[t]
        psi = torch.logaddexp(psi, phi[t - 1] + x_c[t])
    return r_n, r_b, psi


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_unrolled_prefix_recursions_equal_the_loop_over_frames(dtype):
    torch.manual_seed(3)
    rows, time, vocab = 3, 60, 12
    log_probs = torch.log_softmax(torch.randn(rows, time, vocab, dtype=dtype) * 4, -1)
    lengths = torch.tensor([60, 41, 7])
    scorer = CTCPrefixScorer(log_probs, lengths, blank_id=PAD, eos_id=EOS)
    state = scorer.initial_state()
    for step in range(6):  # a few tokens in, including a repeat
        tokens = torch.tensor([[3], [4 + step % 2], [3]])
        rows_index = torch.arange(rows)
        candidates = torch.randint(3, vocab, (rows, 5))
        candidates[:, 0] = tokens[:, 0]
        _, r, psi = scorer.score(state, candidates, min_prefix_length=step)
        r_n, r_b, expected_psi = _loop_recursions(scorer, state, candidates, min(max(1, step), time))
        tolerance = {"atol": 2e-3, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-9, "rtol": 1e-12}
        real = torch.isfinite(expected_psi)
        assert torch.equal(real, torch.isfinite(psi))  # the same prefixes impossible
        torch.testing.assert_close(psi[real], expected_psi[real], **tolerance)
        for got, want in ((r[:, 0], r_n), (r[:, 1], r_b)):
            finite = torch.isfinite(want)
            assert torch.equal(finite, torch.isfinite(got))
            torch.testing.assert_close(got[finite], want[finite], **tolerance)
        state = scorer.select(r, psi, candidates, rows_index, torch.zeros_like(rows_index))

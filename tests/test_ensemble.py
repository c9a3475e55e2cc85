"""Ensembles (asr/models/ensemble.py): the averaged distributions, and search on them."""

import math

import pytest
import torch

from asr.decoding import DecodingOptions, beam_search, greedy_search, sequence_log_probs
from asr.models.attention import AttentionConfig
from asr.models.ensemble import Ensemble
from asr.models.las import LAS, LASConfig
from asr.models.listener import ListenerConfig
from asr.models.speller import SpellerConfig

VOCAB, DIM = 9, 5


def las(seed: int, pyramid_layers: int = 1) -> LAS:
    config = LASConfig(
        listener=ListenerConfig(hidden_size=8, num_layers=2, pyramid_layers=pyramid_layers),
        attention=AttentionConfig(type="location", dim=8, conv_channels=2, conv_kernel=3),
        speller=SpellerConfig(embedding_dim=4, hidden_size=8, num_layers=1),
        ctc_weight=0.3,
    )
    torch.manual_seed(seed)
    model = LAS(config, input_dim=DIM, vocab_size=VOCAB).eval()
    with torch.no_grad():
        model.speller.output.weight.mul_(8.0)  # peaky distributions, so that searches can differ
    return model


def batch():
    torch.manual_seed(7)
    return torch.randn(3, 13, DIM), torch.tensor([13, 8, 5])


def test_the_step_distribution_is_the_mean_of_the_members():
    a, b = las(0), las(1)
    features, lengths = batch()
    ensemble = Ensemble([a, b])
    encoder = ensemble.encode(features, lengths)
    state = ensemble.init_decoder_state(encoder)
    ea, eb = a.encode(features, lengths), b.encode(features, lengths)
    sa, sb = a.init_decoder_state(ea), b.init_decoder_state(eb)
    tokens = torch.full((3,), a.sos_id)
    for step_tokens in (tokens, torch.tensor([3, 4, 5])):
        log_probs, state = ensemble.decode_step(step_tokens, state, encoder)
        pa, sa = a.decode_step(step_tokens, sa, ea)
        pb, sb = b.decode_step(step_tokens, sb, eb)
        torch.testing.assert_close(log_probs.exp(), (pa.exp() + pb.exp()) / 2)
        torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3))
    # CTC posteriors are averaged frame by frame in the same way.
    torch.testing.assert_close(encoder.ctc_log_probs.exp(), (ea.ctc_log_probs.exp() + eb.ctc_log_probs.exp()) / 2)


@pytest.mark.parametrize("ctc_weight", [0.0, 0.4])
def test_an_ensemble_of_copies_searches_like_the_model(ctc_weight):
    model = las(0)
    features, lengths = batch()
    ensemble = Ensemble([model, model])
    alone, together = model.encode(features, lengths), ensemble.encode(features, lengths)
    assert greedy_search(ensemble, together, DecodingOptions(max_len_ratio=2.0)) == greedy_search(model, alone, DecodingOptions(max_len_ratio=2.0))
    # Beam search reorders the members' states (static parts included) at every step.
    expected = beam_search(model, alone, DecodingOptions(beam_size=3, max_len_ratio=2.0, ctc_weight=ctc_weight), nbest=3)
    found = beam_search(ensemble, together, DecodingOptions(beam_size=3, max_len_ratio=2.0, ctc_weight=ctc_weight), nbest=3)
    assert [[h.tokens for h in hyps] for hyps in found] == [[h.tokens for h in hyps] for hyps in expected]
    for hyps, others in zip(found, expected):
        assert [h.score for h in hyps] == pytest.approx([h.score for h in others], abs=1e-4)


def test_ensemble_sequence_score_is_the_log_of_the_mean_per_step():
    a, b = las(0), las(1)
    features, lengths = batch()
    hyps = [[3, 4], [5], []]
    ensemble = Ensemble([a, b])
    total = sequence_log_probs(ensemble, ensemble.encode(features, lengths), hyps)
    # Per-step mean, not the mean of whole-sequence probabilities: check it from the members' steps.
    expected = torch.zeros(3)
    ea, eb = a.encode(features, lengths), b.encode(features, lengths)
    sa, sb = a.init_decoder_state(ea), b.init_decoder_state(eb)
    tokens = torch.full((3,), a.sos_id)
    targets = [h + [a.eos_id] for h in hyps]
    for t in range(max(map(len, targets))):
        pa, sa = a.decode_step(tokens, sa, ea)
        pb, sb = b.decode_step(tokens, sb, eb)
        mean = torch.log((pa.exp() + pb.exp()) / 2)
        for row, target in enumerate(targets):
            if t < len(target):
                expected[row] += mean[row, target[t]]
        tokens = torch.tensor([target[min(t, len(target) - 1)] for target in targets])
    torch.testing.assert_close(total, expected)
    assert all(math.isfinite(x) for x in total.tolist())


def test_members_must_agree_on_time_reduction_and_special_ids():
    features, lengths = batch()
    with pytest.raises(ValueError, match="reduce time by the same factor"):
        Ensemble([las(0, pyramid_layers=1), las(1, pyramid_layers=0)]).encode(features, lengths)
    other = las(1)
    other.eos_id = other.pad_id + 5
    with pytest.raises(ValueError, match="sos, eos, pad"):
        Ensemble([las(0), other])
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])

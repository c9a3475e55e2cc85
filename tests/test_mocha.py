"""Monotonic chunkwise attention (asr/models/mocha.py): the closed forms against the
recurrences they stand for, the hard decision against the expected one, masking, padding,
and the speller's monotonic decoding."""

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.models.attention import AttentionConfig
from asr.models.common import lengths_to_mask
from asr.models.mocha import (
    MochaConfig,
    MonotonicChunkwiseAttention,
    chunkwise_weights,
    expected_alignment,
    hard_alignment,
)
from asr.models.speller import Speller, SpellerConfig

QUERY, KEY = 5, 7


def recursive_alignment(energies, mask, previous):
    """Raffel et al. (2017) eq. 9 as written: q_j = (1 - p_{j-1}) q_{j-1} + alpha'_j, alpha_j = p_j q_j."""
    p = torch.sigmoid(energies) * mask
    alpha = torch.zeros_like(energies)
    for b in range(energies.size(0)):
        q = 0.0
        for j in range(energies.size(1)):
            q = (1 - p[b, j - 1]) * q + previous[b, j] if j > 0 else previous[b, 0]
            alpha[b, j] = p[b, j] * q
    return alpha


def direct_chunkwise(alignment, energies, mask, width):
    """Chiu & Raffel (2018) eq. 20 as written, one frame pair at a time."""
    batch = energies.size(0)
    beta = torch.zeros_like(energies)
    for b in range(batch):
        valid = int(mask[b].sum())
        for k in range(valid):
            for j in range(k, min(k + width, valid)):
                chunk = energies[b, max(0, j - width + 1) : j + 1]
                beta[b, k] += alignment[b, j] * torch.exp(energies[b, k]) / torch.exp(chunk).sum()
    return beta


def random_problem(seed=0, scale=2.0):
    torch.manual_seed(seed)
    lengths = torch.tensor([9, 6, 1])
    mask = lengths_to_mask(lengths, 9)
    energies = scale * torch.randn(3, 9, dtype=torch.float64)
    previous = torch.rand(3, 9, dtype=torch.float64) * mask
    previous = 0.8 * previous / previous.sum(-1, keepdim=True)  # some mass already ran off the end
    return energies, mask, previous


def test_expected_alignment_equals_the_recurrence():
    energies, mask, previous = random_problem()
    expected = expected_alignment(energies, mask, previous)
    torch.testing.assert_close(expected, recursive_alignment(energies, mask, previous), atol=1e-12, rtol=1e-10)
    assert torch.all(expected[~mask] == 0)
    # Mass is never created: what does not stop runs off the end.
    assert torch.all(expected.sum(-1) <= previous.sum(-1) + 1e-12)


def test_expected_alignment_stays_finite_where_a_product_of_many_1_minus_p_underflows():
    # 400 frames with p ~ 1 - 1e-9 before the last: the product of (1 - p) is 1e-3600.
    energies = torch.full((1, 401), 20.0)
    mask = torch.ones(1, 401, dtype=torch.bool)
    previous = torch.zeros(1, 401)
    previous[0, -1] = 1.0  # all the previous mass on the last frame
    energies.requires_grad_(True)
    alignment = expected_alignment(energies, mask, previous)
    assert alignment[0, -1].item() == pytest.approx(torch.sigmoid(torch.tensor(20.0)).item(), rel=1e-6)
    alignment.sum().backward()
    assert torch.isfinite(energies.grad).all()


def test_chunkwise_weights_equal_the_definition_and_keep_the_mass():
    energies, mask, previous = random_problem(1)
    alignment = expected_alignment(torch.randn_like(energies), mask, previous)
    for width in (1, 2, 4):
        beta = chunkwise_weights(alignment, energies, mask, width)
        torch.testing.assert_close(beta, direct_chunkwise(alignment, energies, mask, width), atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(beta.sum(-1), alignment.sum(-1))
        assert torch.all(beta[~mask] == 0)
    # Width 1 attends to the stop frame itself.
    torch.testing.assert_close(chunkwise_weights(alignment, energies, mask, 1), alignment)


def test_chunkwise_weights_hold_energies_that_differ_by_more_than_exp_can():
    energies = torch.tensor([[-500.0, 0.0, 300.0, -200.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    alignment = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # stop at frame 1; chunk = frames 0-1
    beta = chunkwise_weights(alignment, energies, mask, 2)
    torch.testing.assert_close(beta, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    alignment = torch.tensor([[0.0, 0.0, 0.0, 1.0]])  # stop at frame 3; chunk = frames 2-3
    torch.testing.assert_close(chunkwise_weights(alignment, energies, mask, 2), torch.tensor([[0.0, 0.0, 1.0, 0.0]]))


def test_hard_alignment_stops_at_the_first_likely_frame_from_the_previous_stop():
    energies = torch.tensor([[1.0, -1.0, 2.0, -3.0, 0.5, 4.0], [1.0, -1.0, -2.0, -3.0, -0.5, 4.0]])
    mask = lengths_to_mask(torch.tensor([6, 5]), 6)
    previous = torch.zeros(2, 6)
    previous[:, 1] = 1.0
    hard = hard_alignment(energies, mask, previous)
    assert hard[0].tolist() == [0, 0, 1, 0, 0, 0]  # frame 0 is before the previous stop
    assert hard[1].tolist() == [0] * 6  # frame 5 would stop, but it is padding: ran off the end
    # After running off the end, nothing is attended any more.
    assert hard_alignment(torch.ones(2, 6), mask, hard)[1].tolist() == [0] * 6
    # Staying put is allowed: the previous stop frame may stop again.
    assert hard_alignment(energies, mask, hard)[0].tolist() == [0, 0, 1, 0, 0, 0]


def test_the_expected_alignment_becomes_the_hard_one_when_p_is_0_or_1():
    energies, mask, _ = random_problem(2)
    energies = 40.0 * energies.sign() + energies  # |e| > 40: p within 1e-17 of 0 or 1
    previous = torch.zeros_like(energies)
    previous[:, 0] = 1.0
    for _ in range(4):  # several steps, each from the last one's stop
        hard = hard_alignment(energies, mask, previous)
        torch.testing.assert_close(expected_alignment(energies, mask, previous), hard, atol=1e-12, rtol=0)
        previous = hard
        energies = torch.roll(energies, 1, dims=1)


def make_attention(**options):
    torch.manual_seed(0)
    return MonotonicChunkwiseAttention(MochaConfig(dim=6, **options), QUERY, KEY)


def module_inputs():
    torch.manual_seed(3)
    mask = lengths_to_mask(torch.tensor([8, 5, 2]), 8)
    keys = torch.randn(3, 8, KEY) * mask.unsqueeze(-1)
    return torch.randn(3, QUERY), keys, mask


@pytest.mark.parametrize("training", [True, False])
def test_same_output_alone_or_padded_in_a_batch(training):
    attention = make_attention(sigmoid_noise=0.0, monotonic_bias=0.0).train(training)
    query, keys, mask = module_inputs()
    previous = attention.initial_alignment(mask)
    context, weights, alignment = attention(query, keys, mask, previous)
    assert torch.all(weights.squeeze(1)[~mask] == 0) and torch.all(alignment[~mask] == 0)
    for b in range(3):
        n = int(mask[b].sum())
        one = attention(query[b : b + 1], keys[b : b + 1, :n], mask[b : b + 1, :n], previous[b : b + 1, :n])
        torch.testing.assert_close(one[0][0], context[b], atol=1e-6, rtol=0)
        torch.testing.assert_close(one[1][0, 0], weights[b, 0, :n], atol=1e-6, rtol=0)


def test_eval_mode_attends_with_a_softmax_over_the_chunk_ending_at_the_stop():
    attention = make_attention(chunk=3, monotonic_bias=0.0).eval()
    query, keys, mask = module_inputs()
    context, weights, alignment = attention(query, keys, mask, attention.initial_alignment(mask))
    monotonic, chunk = attention.energies(query, attention.project_keys(keys))
    for b in range(3):
        if alignment[b].sum() == 0:
            assert torch.all(context[b] == 0)
            continue
        stop = int(alignment[b].argmax())
        first = max(0, stop - 2)
        expected = torch.zeros(8)
        expected[first : stop + 1] = torch.softmax(chunk[b, first : stop + 1], 0)
        torch.testing.assert_close(weights[b, 0], expected)
        torch.testing.assert_close(context[b], expected @ keys[b])
        assert monotonic[b, stop] >= 0 and torch.all(monotonic[b, :stop] < 0)


def test_noise_only_in_training_and_gradients_reach_every_parameter_without_nan():
    attention = make_attention()
    query, keys, mask = module_inputs()
    previous = attention.initial_alignment(mask)
    attention.eval()
    assert torch.equal(attention(query, keys, mask, previous)[1], attention(query, keys, mask, previous)[1])
    attention.train()
    torch.manual_seed(5)
    first = attention(query, keys, mask, previous)[1]
    assert not torch.equal(first, attention(query, keys, mask, previous)[1])
    keys.requires_grad_(True)
    context, _, alignment = attention(query, keys, mask, previous)
    (context.square().sum() + alignment.sum()).backward()
    for name, parameter in attention.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name
    assert torch.isfinite(keys.grad).all() and torch.all(keys.grad[~mask] == 0)


def test_config_rejects_what_mocha_cannot_do():
    with pytest.raises(ValueError, match="heads"):
        MochaConfig(heads=2)
    # a window is not MoChA's key (its scan is monotonic already): refused naming the key and the type
    with pytest.raises(ConfigError, match=r"^unknown config key 'model.attention.window' for attention type 'mocha'; "
                                          r"it is a key of 'content', 'dot', 'location' \(the keys of 'mocha': "):
        from_dict(AttentionConfig, {"type": "mocha", "window": [2, 4]}, "model.attention")
    with pytest.raises(TypeError, match="window"):
        MochaConfig(window=[2, 4])
    with pytest.raises(ValueError, match="chunk"):
        MochaConfig(chunk=0)
    with pytest.raises(ValueError, match="sigmoid_noise"):
        MochaConfig(sigmoid_noise=-1.0)


def test_a_speller_with_mocha_decodes_monotonically_and_teacher_forcing_equals_its_steps():
    torch.manual_seed(0)
    speller = Speller(SpellerConfig(embedding_dim=5, hidden_size=QUERY, num_layers=1),
                      MochaConfig(dim=6, monotonic_bias=0.5), 11, KEY).eval()
    _, keys, mask = module_inputs()
    decoder_input = torch.randint(3, 11, (3, 6))
    with torch.no_grad():
        log_probs, weights = speller(decoder_input, keys, mask)
        state = speller.init_state(keys, mask)
        stops = []
        for i in range(6):
            step_log_probs, state = speller.step(decoder_input[:, i], state)
            torch.testing.assert_close(step_log_probs, log_probs[:, i], atol=1e-6, rtol=0)
            monotonic = state["monotonic"]
            # A row that has run off the end counts as past every frame.
            stops.append(torch.where(monotonic.sum(-1) > 0, monotonic.argmax(-1), torch.full((3,), 10**6)))
    stops = torch.stack(stops, 1)
    assert torch.all(stops[:, 1:] >= stops[:, :-1])
    assert weights.shape == (3, 6, 8) and torch.all(weights[~mask.unsqueeze(1).expand_as(weights)] == 0)

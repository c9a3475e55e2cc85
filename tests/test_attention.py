"""Attention (asr/models/attention.py): masking, batch invariance, the location term."""

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.models.attention import Attention, AttentionConfig
from asr.models.common import lengths_to_mask

TYPES = ["content", "dot", "location"]
QUERY, KEY = 6, 10


def make(kind: str, heads: int = 1) -> Attention:
    torch.manual_seed(0)
    att = Attention(AttentionConfig(type=kind, dim=8, heads=heads, conv_channels=3, conv_kernel=5), QUERY, KEY)
    return att.double()


def random_prev(mask: torch.Tensor, heads: int) -> torch.Tensor:
    """Non-uniform previous weights, zero on padding, summing to 1 per head."""
    w = torch.rand(mask.size(0), heads, mask.size(1), dtype=torch.float64) * mask.unsqueeze(1)
    return w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("kind", TYPES)
def test_padded_frames_get_exactly_zero_weight(kind, heads):
    att = make(kind, heads)
    lengths = torch.tensor([7, 3, 1])
    mask = lengths_to_mask(lengths, 7)
    # Garbage (large) values in the padding must not leak into weights or context.
    keys = torch.randn(3, 7, KEY, dtype=torch.float64) + 100.0 * (~mask).unsqueeze(-1)
    context, weights = att(torch.randn(3, QUERY, dtype=torch.float64), keys, mask, random_prev(mask, heads))
    assert context.shape == (3, KEY)
    assert weights.shape == (3, heads, 7)
    assert torch.all(weights.masked_select(~mask.unsqueeze(1).expand_as(weights)) == 0.0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, heads, dtype=torch.float64))
    assert torch.all(weights.masked_select(mask.unsqueeze(1).expand_as(weights)) > 0.0)


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("kind", TYPES)
def test_same_output_alone_or_padded_in_a_batch(kind, heads):
    att = make(kind, heads)
    lengths = torch.tensor([9, 4, 6])
    mask = lengths_to_mask(lengths)
    keys = torch.randn(3, 9, KEY, dtype=torch.float64)
    query = torch.randn(3, QUERY, dtype=torch.float64)
    prev = random_prev(mask, heads)
    context, weights = att(query, keys, mask, prev)
    for b, length in enumerate(lengths.tolist()):
        alone_mask = torch.ones(1, length, dtype=torch.bool)
        c1, w1 = att(query[b : b + 1], keys[b : b + 1, :length], alone_mask, prev[b : b + 1, :, :length])
        torch.testing.assert_close(c1[0], context[b])
        torch.testing.assert_close(w1[0], weights[b, :, :length])


@pytest.mark.parametrize("kind", TYPES)
def test_precomputed_keys_give_the_same_result(kind):
    att = make(kind, heads=2)
    mask = lengths_to_mask(torch.tensor([5, 3]))
    keys = torch.randn(2, 5, KEY, dtype=torch.float64)
    query = torch.randn(2, QUERY, dtype=torch.float64)
    c1, w1 = att(query, keys, mask)
    c2, w2 = att(query, keys, mask, projected_keys=att.project_keys(keys))
    torch.testing.assert_close(c1, c2)
    torch.testing.assert_close(w1, w2)


def test_location_attention_reads_the_previous_weights_and_others_do_not():
    mask = lengths_to_mask(torch.tensor([8, 5]))
    keys = torch.randn(2, 8, KEY, dtype=torch.float64)
    query = torch.randn(2, QUERY, dtype=torch.float64)
    prev_a, prev_b = random_prev(mask, 1), random_prev(mask, 1)
    for kind in TYPES:
        att = make(kind)
        _, wa = att(query, keys, mask, prev_a)
        _, wb = att(query, keys, mask, prev_b)
        if kind == "location":
            assert not torch.allclose(wa, wb)
        else:
            torch.testing.assert_close(wa, wb)


def test_location_default_previous_weights_are_uniform_over_valid_frames():
    att = make("location", heads=2)
    mask = lengths_to_mask(torch.tensor([4, 2]), 4)
    init = att.initial_weights(mask, torch.float64)
    expected = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    expected = expected.unsqueeze(1).expand(2, 2, 4)
    torch.testing.assert_close(init, expected)
    keys = torch.randn(2, 4, KEY, dtype=torch.float64)
    query = torch.randn(2, QUERY, dtype=torch.float64)
    c1, _ = att(query, keys, mask, None)
    c2, _ = att(query, keys, mask, init)
    torch.testing.assert_close(c1, c2)


def test_single_head_context_is_the_weighted_sum_of_keys():
    att = make("content")
    mask = lengths_to_mask(torch.tensor([6, 4]))
    keys = torch.randn(2, 6, KEY, dtype=torch.float64)
    context, weights = att(torch.randn(2, QUERY, dtype=torch.float64), keys, mask)
    torch.testing.assert_close(context, (weights.squeeze(1).unsqueeze(-1) * keys).sum(1))


def test_gradients_flow_to_every_parameter():
    for kind in TYPES:
        att = make(kind, heads=2)
        mask = lengths_to_mask(torch.tensor([5, 3]))
        keys = torch.randn(2, 5, KEY, dtype=torch.float64, requires_grad=True)
        context, _ = att(torch.randn(2, QUERY, dtype=torch.float64), keys, mask, random_prev(mask, 2))
        context.pow(2).sum().backward()
        for name, p in att.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), (kind, name)
        assert torch.all(keys.grad[1, 3:] == 0.0)  # padded keys do not influence anything


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="model.attention: type: 'monotonic' is not one of 'content', 'dot', "
                                          "'location', 'mocha'"):
        from_dict(AttentionConfig, {"type": "monotonic"}, "model.attention")
    with pytest.raises(ConfigError, match="conv_kernel must be odd"):
        from_dict(AttentionConfig, {"conv_kernel": 4}, "model.attention")
    with pytest.raises(ConfigError, match="model.attention.head"):
        from_dict(AttentionConfig, {"head": 2}, "model.attention")


def test_a_window_confines_attention_around_the_previous_focus():
    config = AttentionConfig(type="location", dim=8, conv_channels=3, conv_kernel=5, window=[1, 2])
    torch.manual_seed(0)
    att = Attention(config, QUERY, KEY).double()
    mask = lengths_to_mask(torch.tensor([9, 4]), 9)
    focus = torch.tensor([5, 3])
    attend = att.window_mask(mask, focus)
    assert attend[0].nonzero().flatten().tolist() == [4, 5, 6, 7]
    assert attend[1].nonzero().flatten().tolist() == [2, 3]  # clipped at the row's own end
    keys = torch.randn(2, 9, KEY, dtype=torch.float64)
    _, weights = att(torch.randn(2, QUERY, dtype=torch.float64), keys, mask, random_prev(mask, 1), attend=attend)
    assert torch.all(weights.masked_select(~attend.unsqueeze(1)) == 0.0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 1, dtype=torch.float64))
    # The focus of a step is the median frame of its weights.
    peaked = torch.tensor([[[0.1, 0.2, 0.3, 0.4]], [[0.6, 0.2, 0.1, 0.1]]])
    assert Attention.focus(peaked).tolist() == [2, 0]
    with pytest.raises(ValueError, match="window"):
        AttentionConfig(window=[3])

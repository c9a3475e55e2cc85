"""The fused C++ attention step (asr/models/attention_fused.py) against the PyTorch reference path:
values and every gradient, with padding, windows, the prior and the scaling; inside a LAS; and the
backend setting's choices and errors."""

from __future__ import annotations

import dataclasses
import pytest
import torch

from asr.models import attention_fused
from asr.models.attention import Attention, AttentionConfig
from asr.models.las import LAS, LASConfig
from asr.models.listener import ListenerConfig
from asr.models.lnlstm.backends import cpp
from asr.models.speller import SpellerConfig


@pytest.fixture(scope="module", autouse=True)
def operator_builds():
    cpp.load(strict=True)  # a build failure fails these tests, not a silent fallback to the reference path


def _pair(config: AttentionConfig, query_dim: int, key_dim: int, dtype: torch.dtype):
    reference = Attention(dataclasses.replace(config, backend="reference"), query_dim, key_dim).to(dtype)
    fused = Attention(dataclasses.replace(config, backend="cpp"), query_dim, key_dim).to(dtype)
    fused.load_state_dict(reference.state_dict())
    return reference, fused


def _run(attention, queries, keys, mask, attend, bias):
    """Four chained steps (each reads the last one's weights); a loss reading the contexts and the
    weights, so both outputs' gradients flow back. Returns the outputs and every gradient."""
    keys = keys.clone().requires_grad_()
    queries = queries.clone().requires_grad_()
    attention.zero_grad(set_to_none=True)
    weights, loss, contexts, all_weights = None, 0.0, [], []
    positions = torch.arange(keys.size(1), dtype=keys.dtype)
    readout = torch.linspace(-1.0, 1.0, keys.size(2), dtype=keys.dtype)
    for query in queries:
        context, weights = attention(query, keys, mask, weights, attend=attend, energy_bias=bias)
        loss = loss + (context * readout).sum() + 0.1 * (weights.squeeze(1) * positions).sum()
        contexts.append(context)
        all_weights.append(weights)
    loss.backward()
    grads = {"keys": keys.grad, "queries": queries.grad}
    grads.update({name: p.grad for name, p in attention.named_parameters()})
    return torch.stack(contexts), torch.stack(all_weights), grads


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("kind", ["location", "content"])
@pytest.mark.parametrize("extra", ["plain", "window", "prior_and_scaling"])
def test_fused_step_matches_the_reference_path_values_and_gradients(dtype, tolerance, kind, extra):
    torch.manual_seed(0)
    batch, time, key_dim, query_dim = 3, 23, 6, 5
    filters = {"conv_channels": 3, "conv_kernel": 7} if kind == "location" else {}  # location's keys
    config = AttentionConfig(type=kind, dim=4, scaling=2.0 if extra == "prior_and_scaling" else 1.0, **filters)
    reference, fused = _pair(config, query_dim, key_dim, dtype)
    keys = torch.randn(batch, time, key_dim, dtype=dtype)
    mask = torch.ones(batch, time, dtype=torch.bool)
    mask[1, 15:] = False
    mask[2, 4:] = False  # shorter than the location filter
    attend = None
    if extra == "window":
        attend = mask.clone()
        attend[0, :5] = False
        attend[1, 9:] = False
    bias = torch.randn(batch, time, dtype=dtype) if extra == "prior_and_scaling" else None
    queries = torch.randn(4, batch, query_dim, dtype=dtype)
    expected = _run(reference, queries, keys, mask, attend, bias)
    got = _run(fused, queries, keys, mask, attend, bias)
    assert attention_fused.chosen(fused, keys.device, keys.dtype) == "cpp"
    torch.testing.assert_close(got[0], expected[0], atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(got[1], expected[1], atol=tolerance, rtol=tolerance)
    assert set(got[2]) == set(expected[2])
    for name in expected[2]:
        assert got[2][name] is not None, name
        torch.testing.assert_close(got[2][name], expected[2][name], atol=tolerance, rtol=tolerance, msg=name)
    assert (got[1].squeeze(2)[:, 2, 4:] == 0).all()  # padded frames: exactly zero weight


def test_fused_step_passes_gradcheck():
    torch.manual_seed(1)
    attention = Attention(AttentionConfig(type="location", dim=3, conv_channels=2, conv_kernel=3, backend="cpp"), 4, 5)
    attention = attention.double()
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    keys = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    query = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    prev = torch.softmax(torch.randn(2, 1, 6, dtype=torch.float64), -1).masked_fill(~mask.unsqueeze(1), 0.0)
    prev.requires_grad_()
    bias = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)

    def step(keys, query, prev, bias):
        return attention(query, keys, mask, prev, energy_bias=bias)

    assert torch.autograd.gradcheck(step, (keys, query, prev, bias))


def _las(backend: str) -> LAS:
    config = LASConfig(ctc_weight=0.3, listener=ListenerConfig(hidden_size=8, num_layers=2, pyramid_layers=1),
                       attention=AttentionConfig(dim=8, conv_channels=3, conv_kernel=5, backend=backend),
                       speller=SpellerConfig(embedding_dim=8, hidden_size=12, dropout=0.0))
    torch.manual_seed(2)
    return LAS(config, input_dim=10, vocab_size=11).double()


def test_a_las_trains_and_decodes_alike_on_either_path():
    reference, fused = _las("reference"), _las("cpp")
    fused.load_state_dict(reference.state_dict())
    torch.manual_seed(3)
    features = torch.randn(3, 40, 10, dtype=torch.float64)
    lengths = torch.tensor([40, 31, 22])
    tokens = torch.randint(3, 11, (3, 6))
    token_lengths = torch.tensor([6, 4, 5])
    grads = []
    for model in (reference, fused):
        model.speller.attention_prior = 1.0  # the prior's energies reach the fused step too
        out = model(features, lengths, tokens, token_lengths)
        out.loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
        model.eval()
        with torch.no_grad():
            encoder = model.encode(features, lengths)
            state = model.init_decoder_state(encoder)
            step_tokens = torch.full((3,), model.sos_id)
            decoded = []
            for _ in range(5):
                log_probs, state = model.decode_step(step_tokens, state, encoder)
                step_tokens = log_probs.argmax(-1)
                decoded.append(log_probs)
        grads[-1]["decoded"] = torch.stack(decoded)
    assert set(grads[0]) == set(grads[1])
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-11, rtol=1e-9, msg=name)


def test_auto_takes_the_reference_path_where_the_fused_step_does_not_apply_and_cpp_says_why():
    keys = torch.randn(2, 5, 4)
    two_heads = Attention(AttentionConfig(dim=4, heads=2), 3, 4)
    assert attention_fused.chosen(two_heads, keys.device, keys.dtype) == "reference"
    dot = Attention(AttentionConfig(type="dot", dim=4), 3, 4)
    assert attention_fused.chosen(dot, keys.device, keys.dtype) == "reference"
    one_head = Attention(AttentionConfig(dim=4), 3, 4)
    assert attention_fused.chosen(one_head, keys.device, keys.dtype) == "cpp"
    assert attention_fused.chosen(one_head, keys.device, torch.bfloat16) == "reference"
    named = Attention(AttentionConfig(dim=4, heads=2, backend="cpp"), 3, 4)
    with pytest.raises(ValueError, match="model.attention.backend: cpp .*2 heads"):
        named(torch.randn(2, 3), keys, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="backend must be one of auto, reference, cpp"):
        AttentionConfig(backend="fast")


def test_the_path_that_ran_is_recorded():
    attention = Attention(AttentionConfig(dim=4), 3, 4)
    attention(torch.randn(2, 3), torch.randn(2, 5, 4), torch.ones(2, 5, dtype=torch.bool))
    assert "cpp" in attention_fused.ran()
    reference = Attention(AttentionConfig(dim=4, backend="reference"), 3, 4)
    reference(torch.randn(2, 3), torch.randn(2, 5, 4), torch.ones(2, 5, dtype=torch.bool))
    assert "reference" in attention_fused.ran()


def test_the_loop_accumulator_gives_each_gradient_when_only_some_steps_reach_the_loss():
    """The first step returns the summed key gradients; steps whose outputs the loss never reads add nothing."""
    reference, fused = _las("reference"), _las("cpp")
    fused.load_state_dict(reference.state_dict())
    torch.manual_seed(4)
    keys = torch.randn(2, 9, reference.listener.output_dim, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    decoder_input = torch.randint(3, 11, (2, 5))
    grads = []
    for model in (reference, fused):
        leaf = keys.clone().requires_grad_()
        log_probs, _ = model.speller(decoder_input, leaf, mask)
        log_probs[:, :2].sum().backward()  # the first two of five steps only
        grads.append([leaf.grad] + [p.grad for p in model.speller.parameters()])
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected, atol=1e-11, rtol=1e-9)

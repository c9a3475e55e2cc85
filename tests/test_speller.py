"""Speller (asr/models/speller.py): step-wise decoding equals teacher forcing,
scheduled sampling, masking."""

import pytest
import torch

from asr.config import from_dict
from asr.models.attention import Attention, AttentionConfig
from asr.models.common import lengths_to_mask
from asr.models.interface import reorder_nested
from asr.models.lnlstm import LNLSTMOptions
from asr.models.speller import Speller, SpellerConfig

VOCAB, KEY = 11, 8


def make(kind="location", heads=1, layers=2, **options) -> Speller:
    torch.manual_seed(0)
    speller = Speller(
        SpellerConfig(embedding_dim=5, hidden_size=7, num_layers=layers, **options),
        from_dict(AttentionConfig, {"type": kind, "dim": 6, "heads": heads,  # the filters: location's keys
                                    **({"conv_channels": 3, "conv_kernel": 3} if kind == "location" else {})}),
        VOCAB,
        KEY,
    )
    return speller


def inputs(batch=3, time=9, length=6):
    torch.manual_seed(1)
    keys = torch.randn(batch, time, KEY)
    mask = lengths_to_mask(torch.tensor([time, 5, 2][:batch]), time)
    keys = keys * mask.unsqueeze(-1)
    decoder_input = torch.randint(3, VOCAB, (batch, length))
    decoder_input[:, 0] = 1  # <sos>
    return decoder_input, keys, mask


@pytest.mark.parametrize("kind, heads, layers", [("location", 1, 2), ("content", 2, 1), ("dot", 1, 3), ("mocha", 1, 2)])
def test_step_by_step_equals_teacher_forcing(kind, heads, layers):
    speller = make(kind, heads, layers).eval()
    decoder_input, keys, mask = inputs()
    with torch.no_grad():
        log_probs, weights = speller(decoder_input, keys, mask)
        state = speller.init_state(keys, mask)
        for i in range(decoder_input.size(1)):
            step_log_probs, state = speller.step(decoder_input[:, i], state)
            torch.testing.assert_close(step_log_probs, log_probs[:, i], atol=1e-5, rtol=0)
            torch.testing.assert_close(state["weights"].mean(1), weights[:, i], atol=1e-5, rtol=0)
    assert log_probs.shape == (3, 6, VOCAB)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 6))
    assert torch.all(weights[~mask.unsqueeze(1).expand_as(weights)] == 0.0)


def test_reordered_state_continues_like_the_selected_rows():
    speller = make().eval()
    decoder_input, keys, mask = inputs()
    index = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        state = speller.init_state(keys, mask)
        _, state = speller.step(decoder_input[:, 0], state)
        _, state = speller.step(decoder_input[:, 1], state)
        reordered = reorder_nested(state, index)
        out_reordered, _ = speller.step(decoder_input[index, 2], reordered)
        out_full, _ = speller.step(decoder_input[:, 2], state)
    torch.testing.assert_close(out_reordered, out_full[index])


@pytest.mark.parametrize("kind, heads", [("location", 2), ("mocha", 1)])
def test_each_utterance_is_decoded_the_same_alone_or_in_a_batch(kind, heads):
    speller = make(kind, heads=heads).eval()
    decoder_input, keys, mask = inputs()
    with torch.no_grad():
        log_probs, _ = speller(decoder_input, keys, mask)
        for b in range(3):
            n = int(mask[b].sum())
            alone, _ = speller(decoder_input[b : b + 1], keys[b : b + 1, :n], mask[b : b + 1, :n])
            torch.testing.assert_close(alone[0], log_probs[b], atol=1e-5, rtol=0)


def test_scheduled_sampling_only_in_training_and_only_when_enabled():
    decoder_input, keys, mask = inputs()
    plain = make()
    with torch.no_grad():
        reference, _ = plain.eval()(decoder_input, keys, mask)
        # Training mode without dropout or sampling is exactly teacher forcing.
        train_out, _ = plain.train()(decoder_input, keys, mask)
        torch.testing.assert_close(train_out, reference)
        sampled = make(sampling_probability=1.0)
        eval_out, _ = sampled.eval()(decoder_input, keys, mask)
        torch.testing.assert_close(eval_out, reference)  # no sampling at inference
        torch.manual_seed(3)
        train_sampled, _ = sampled.train()(decoder_input, keys, mask)
    # The first step always sees <sos>; with p = 1 every later input is the model's own.
    torch.testing.assert_close(train_sampled[:, 0], reference[:, 0])
    assert not torch.allclose(train_sampled[:, 1:], reference[:, 1:])


def test_scheduled_sampling_draws_from_the_model_distribution():
    # With a speller whose output always puts (nearly) all mass on one token,
    # sampled inputs must be that token: feeding it as teacher input gives the same result.
    speller = make(sampling_probability=1.0)
    with torch.no_grad():
        speller.output.weight.zero_()
        speller.output.bias.fill_(-30.0)
        speller.output.bias[7] = 30.0
    decoder_input, keys, mask = inputs()
    forced = decoder_input.clone()
    forced[:, 1:] = 7
    with torch.no_grad():
        sampled, _ = speller.train()(decoder_input, keys, mask)
        teacher, _ = speller.eval()(forced, keys, mask)
    torch.testing.assert_close(sampled, teacher)


def test_layer_norm_switch_reaches_every_cell():
    for layer_norm in (True, False):
        speller = Speller(SpellerConfig(num_layers=3, hidden_size=4, embedding_dim=3), AttentionConfig(dim=4), 9, 6,
                          LNLSTMOptions(layer_norm=layer_norm))
        assert len(speller.cells) == 3
        for cell in speller.cells:
            assert cell.layer_norm is layer_norm
            assert any(name.startswith("ln_h") for name, _ in cell.named_parameters()) is layer_norm


def test_config_validation():
    with pytest.raises(ValueError, match="sampling_probability"):
        SpellerConfig(sampling_probability=1.5)
    with pytest.raises(ValueError, match="num_layers"):
        SpellerConfig(num_layers=0)


def test_a_windowed_speller_never_attends_outside_its_window():
    torch.manual_seed(0)
    attention = AttentionConfig(type="location", dim=8, conv_channels=2, conv_kernel=3, window=[1, 3])
    speller = Speller(SpellerConfig(embedding_dim=4, hidden_size=8), attention, vocab_size=7, context_dim=6).eval()
    keys, mask = torch.randn(2, 20, 6), lengths_to_mask(torch.tensor([20, 12]), 20)
    decoder_input = torch.randint(3, 7, (2, 6))
    _, weights = speller(decoder_input, keys, mask)
    focus = torch.zeros(2, dtype=torch.long)  # the first step's window starts at frame 0
    for step in range(weights.size(1)):
        outside = (torch.arange(20) < focus.unsqueeze(1) - 1) | (torch.arange(20) > focus.unsqueeze(1) + 3)
        assert torch.all(weights[:, step].masked_select(outside) == 0.0), step
        focus = Attention.focus(weights[:, step].unsqueeze(1))

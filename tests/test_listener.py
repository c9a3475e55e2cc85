"""Listener (asr/models/listener.py): time reduction, lengths and masks, odd lengths."""

import math

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.models.common import lengths_to_mask
from asr.models.listener import Listener, ListenerConfig, stack_frames
from asr.models.lnlstm import LNLSTMOptions

DIM = 5


def make(**options) -> Listener:
    torch.manual_seed(0)
    config = ListenerConfig(**{"hidden_size": 6, "num_layers": 4, "pyramid_layers": 3, **options})
    return Listener(config, DIM).double().eval()


def batch(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths_t = torch.tensor(lengths)
    x = torch.randn(len(lengths), max(lengths), DIM, dtype=torch.float64)
    # Non-zero garbage in the padding: the listener must ignore it.
    x = x + 50.0 * (~lengths_to_mask(lengths_t)).unsqueeze(-1)
    return x, lengths_t


def test_stack_frames_concatenates_neighbours_and_pads_the_odd_tail():
    x = torch.arange(2 * 5 * 2, dtype=torch.float32).view(2, 5, 2)
    x[1, 3:] = 0.0  # row 1 has 3 frames
    out, lengths = stack_frames(x, torch.tensor([5, 3]), 2)
    assert out.shape == (2, 3, 4)
    assert lengths.tolist() == [3, 2]
    torch.testing.assert_close(out[0, 1], torch.cat([x[0, 2], x[0, 3]]))
    torch.testing.assert_close(out[0, 2], torch.cat([x[0, 4], torch.zeros(2)]))  # odd tail padded with zeros
    torch.testing.assert_close(out[1, 1], torch.cat([x[1, 2], torch.zeros(2)]))


@pytest.mark.parametrize(
    "options, reduction",
    [
        ({}, 8),
        ({"pyramid_layers": 1}, 2),
        ({"pyramid_layers": 2, "frame_stacking": 3}, 12),
        ({"pyramidal": False}, 1),
        ({"pyramidal": False, "frame_stacking": 3}, 3),
        ({"input_projection": 7, "num_layers": 2, "pyramid_layers": 1}, 2),
    ],
)
def test_shapes_lengths_and_masks_through_the_reduction(options, reduction):
    listener = make(**options)
    assert listener.reduction == reduction
    lengths = [37, 20, 9, 2, 1]  # odd, even, shorter than the reduction, a single frame
    x, lengths_t = batch(lengths)
    out, out_lengths = listener(x, lengths_t)
    expected = [math.ceil(n / reduction) for n in lengths]  # odd tails are padded, never dropped
    assert out_lengths.tolist() == expected
    assert listener.output_lengths(lengths_t).tolist() == expected
    assert out.shape == (5, max(expected), 12)
    mask = lengths_to_mask(out_lengths, out.size(1))
    assert torch.all(out[~mask] == 0.0)
    assert torch.isfinite(out).all()
    # Every valid frame carries signal (an LSTM output of exactly 0 is improbable).
    assert torch.all(out.abs().sum(-1)[mask] > 0)


@pytest.mark.parametrize("options", [{}, {"pyramidal": False, "frame_stacking": 3}])
def test_same_output_alone_or_padded_in_a_batch(options):
    listener = make(**options)
    x, lengths = batch([29, 16, 5])
    out, out_lengths = listener(x, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone, alone_lengths = listener(x[b : b + 1, :n], lengths[b : b + 1])
        assert alone_lengths.item() == out_lengths[b].item()
        torch.testing.assert_close(alone[0], out[b, : out_lengths[b]])


def test_padding_beyond_the_longest_utterance_changes_nothing():
    listener = make()
    x, lengths = batch([21, 13])
    out, out_lengths = listener(x, lengths)
    longer = torch.cat([x, torch.randn(2, 11, DIM, dtype=torch.float64)], 1)
    out2, out_lengths2 = listener(longer, lengths)
    assert out_lengths2.tolist() == out_lengths.tolist()
    torch.testing.assert_close(out2, out)


def test_input_shorter_than_the_reduction_is_handled():
    listener = make(frame_stacking=2)  # 16x
    x, lengths = batch([3])
    out, out_lengths = listener(x, lengths)
    assert out.shape == (1, 1, 12) and out_lengths.tolist() == [1]
    assert torch.isfinite(out).all() and out.abs().sum() > 0


def test_empty_utterances_and_bad_lengths_are_clear_errors():
    listener = make()
    x, _ = batch([6, 6, 6])
    with pytest.raises(ValueError, match=r"length 0 at batch positions \[1\]"):
        listener(x, torch.tensor([6, 0, 4]))
    with pytest.raises(ValueError, match="exceed the padded length 6"):
        listener(x, torch.tensor([6, 7, 4]))


def test_layer_norm_switch_reaches_every_layer():
    for layer_norm in (True, False):
        listener = Listener(ListenerConfig(hidden_size=4, num_layers=3, pyramid_layers=2), DIM,
                            LNLSTMOptions(layer_norm=layer_norm))
        cells = [cell for lstm in listener.layers for cell in lstm.cells]
        assert len(cells) == 6  # 3 layers x 2 directions
        for cell in cells:
            assert cell.layer_norm is layer_norm
            assert (cell.ln_x is not None) is layer_norm
            assert any("ln_c" in name for name, _ in cell.named_parameters()) is layer_norm


def test_gradients_reach_the_input_only_from_valid_frames():
    listener = make(dropout=0.0)
    x, lengths = batch([14, 7])
    x.requires_grad_(True)
    out, _ = listener(x, lengths)
    out.sum().backward()
    assert torch.all(x.grad[1, 7:] == 0.0)
    assert x.grad[1, :7].abs().sum() > 0


def test_config_validation_names_the_key():
    with pytest.raises(ConfigError, match="model.listener: pyramid_layers must be in"):
        from_dict(ListenerConfig, {"num_layers": 3, "pyramid_layers": 3}, "model.listener")
    with pytest.raises(ConfigError, match="model.listener.pyramid"):
        from_dict(ListenerConfig, {"pyramid": True}, "model.listener")
    config = from_dict(ListenerConfig, {"pyramidal": False, "frame_stacking": 4, "num_layers": 2}, "model.listener")
    assert config.reduction == 4

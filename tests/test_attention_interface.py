"""A LAS attention type written outside the package (asr/models/attention_interface.py): registered with one
call, with a key of its own in its own config, it trains and decodes in a LAS built from a recipe naming it,
with no edit to the speller or to AttentionConfig."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from asr.config import ConfigError, describe_config, from_dict
from asr.decoding import DecodingOptions, beam_search, greedy_search
from asr.models import speller_graphs
from asr.models.attention import ATTENTION_TYPES, AttentionConfig, register_attention
from asr.models.attention_interface import LASAttention
from asr.models.las import LASConfig
from asr.models.interface import STATIC_STATE_KEY
from asr.models.las import LAS
from asr.models.registry import model_config_from_dict

from helpers import las_batch


@dataclass
class UniformConfig(AttentionConfig):
    """The toy's keys: every type's, and its own."""

    type: str = "toy"
    gain: float = 0.5  # the learnt gain's initial value

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gain <= 0:
            raise ValueError(f"gain must be positive, got {self.gain}")


class UniformAttention(LASAttention):
    """Every valid frame weighs the same; the context is that mean of the keys times a learnt gain. Its
    trivial state of its own: ``steps`` (N,), how many steps each hypothesis has taken."""

    config_class = UniformConfig

    def __init__(self, config: UniformConfig, query_dim: int, key_dim: int) -> None:
        super().__init__(key_dim)
        self.gain = nn.Parameter(torch.tensor(config.gain))

    def initial_state(self, keys, mask):
        weights = mask.to(keys.dtype) / mask.sum(1, keepdim=True).to(keys.dtype)
        return {"weights": weights.unsqueeze(1), "steps": torch.zeros(keys.size(0), dtype=torch.long,
                                                                       device=keys.device)}

    def step(self, query, state, energy_bias=None):
        static = state[STATIC_STATE_KEY]
        weights = self.initial_state(static["keys"], static["mask"])["weights"]
        context = self.gain * torch.bmm(weights, static["keys"]).squeeze(1)
        return context, weights, {"steps": state["steps"] + 1}


class RecordableUniformAttention(UniformAttention):
    recordable = True  # its step has no host synchronisation, and padded frames weigh 0


@pytest.fixture
def toy_types():
    register_attention("toy", UniformAttention)
    register_attention("toy_recordable", RecordableUniformAttention)
    yield
    del ATTENTION_TYPES["toy"], ATTENTION_TYPES["toy_recordable"]


def toy_las(kind: str = "toy", **keys) -> LAS:
    recipe = {"type": "las", "ctc_weight": 0.3, "attention": {"type": kind, "dim": 8, **keys},
              "listener": {"hidden_size": 8, "num_layers": 3, "pyramid_layers": 2},
              "speller": {"embedding_dim": 4, "hidden_size": 8, "num_layers": 2}}
    torch.manual_seed(0)
    return LAS(model_config_from_dict(recipe), input_dim=6, vocab_size=10)


def test_a_type_is_known_only_once_registered(toy_types):
    del ATTENTION_TYPES["toy"]
    with pytest.raises(ConfigError, match="type: 'toy' is not one of"):
        toy_las()
    register_attention("toy", UniformAttention)
    with pytest.raises(ValueError, match="registered already"):
        register_attention("toy", UniformAttention)
    with pytest.raises(TypeError, match="subclass LASAttention"):
        register_attention("other", nn.Linear)


def test_a_type_reads_its_own_keys_and_the_others_refuse_them_naming_the_key(toy_types):
    assert toy_las(gain=0.25).speller.attention.gain.item() == 0.25
    assert toy_las("toy_recordable", gain=2.0).speller.attention.gain.item() == 2.0  # two types, one config
    with pytest.raises(ConfigError, match="model.attention: gain must be positive, got -1"):
        toy_las(gain=-1.0)
    with pytest.raises(ConfigError) as refused:
        from_dict(LASConfig, {"attention": {"type": "location", "gain": 0.25}}, "model")
    assert str(refused.value).startswith("unknown config key 'model.attention.gain' for attention type 'location'; "
                                         "it is a key of 'toy', 'toy_recordable' (the keys of 'location': ")
    # and --show-config lists it, with its meaning, for a recipe naming the type
    keys = {k.key: k for k in describe_config(from_dict(LASConfig, {"attention": {"type": "toy"}}, "model"))}
    assert keys["attention.gain"].value == 0.5 and keys["attention.gain"].meaning == "the learnt gain's initial value"
    assert "attention.gain" not in {k.key for k in describe_config(LASConfig())}


def test_a_registered_type_trains_and_decodes_in_a_las(toy_types):
    model = toy_las()
    assert isinstance(model.speller.attention, UniformAttention)
    features, feature_lengths, tokens, token_lengths = las_batch()

    out = model.train()(features, feature_lengths, tokens, token_lengths)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.speller.attention.gain.grad.abs() > 0  # the loss reaches the attention's own parameter
    assert all(p.grad is not None for p in model.listener.parameters() if p.requires_grad)
    frames = model.listener.output_lengths(feature_lengths)
    for row, count in enumerate(frames.tolist()):  # the speller returns the type's weights as they are
        weights = out.attention_weights[row, : int(token_lengths[row]) + 1]
        torch.testing.assert_close(weights[:, :count], torch.full_like(weights[:, :count], 1 / count))
        assert torch.all(weights[:, count:] == 0)

    model.eval()
    with torch.no_grad():
        encoder = model.encode(features, feature_lengths)
        # greedy and beam search run over the type's state, reordered with the hypotheses
        greedy = greedy_search(model, encoder, DecodingOptions(max_len=4))
        beams = beam_search(model, encoder, DecodingOptions(beam_size=3, max_len=4))
        assert len(greedy) == len(beams) == 3 and all(len(h) <= 4 for h in greedy + beams)
        # step by step, the decoder computes what teacher forcing computed, and the state counts its steps
        decoder_input = torch.cat([torch.full((3, 1), model.sos_id), tokens], 1)
        forced, _ = model.speller(decoder_input, encoder.out, encoder.mask)
        state = model.init_decoder_state(encoder)
        for step in range(3):
            log_probs, state = model.decode_step(decoder_input[:, step], state, encoder)
            torch.testing.assert_close(log_probs, forced[:, step])
            assert torch.equal(state["steps"], torch.full((3,), step + 1))
        state = model.reorder_decoder_state(state, torch.tensor([2, 0]))
        assert state["steps"].tolist() == [3, 3] and state["weights"].shape == (2, 1, encoder.out.size(1))


def test_a_recordable_type_goes_through_the_recorded_decoding_step(toy_types):
    """The speller's recorded decoding step pads the type's entries by its frame_dims (``steps`` has no
    frames); on CPU the step runs eagerly on the padded buffers and gives the eager decoder's results."""
    model = toy_las("toy_recordable").eval()
    features, feature_lengths, *_ = las_batch()
    with torch.no_grad():
        encoder = model.encode(features, feature_lengths)
        eager = beam_search(model, encoder, DecodingOptions(beam_size=3, max_len=5), nbest=2)
        model.speller.step = lambda tokens, state: speller_graphs.decoding_step(model.speller, tokens, state)
        recorded = beam_search(model, encoder, DecodingOptions(beam_size=3, max_len=5), nbest=2)
    assert model.speller.__dict__["_cuda_graphs"].entries, "the steps went through a recording"
    assert [[(h.tokens, round(h.score, 5)) for h in hyps] for hyps in recorded] == \
        [[(h.tokens, round(h.score, 5)) for h in hyps] for hyps in eager]

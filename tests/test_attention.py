"""Attention (asr/models/attention.py): masking, batch invariance, the location term; each type owns its
keys (asr/models/attention_interface.py).

tests/fixtures/las_attention_da63599.json was written by the code before each type owned its keys (commit
da63599, every type's keys in every type's config): for recipes/study_las_demo.yaml with each attention type
(and with the keys now of some types only set: a window, the scaling, the backend, the location filters),
the ``model`` section its run wrote into config.yaml and its checkpoints, the state_dict (each entry's
shape and sum) of the LAS built from it with seed 0, and its loss on a fixed batch in train and eval mode."""

import json

import pytest
import torch

from asr.config import ConfigError, describe_config, from_dict, to_dict
from asr.experiment import as_recipe, experiment_config_to_dict, load_experiment_config
from asr.models.attention import Attention, AttentionConfig, ContentConfig, DotConfig, LocationConfig
from asr.models.common import lengths_to_mask
from asr.models.las import LAS
from asr.models.mocha import MochaConfig
from asr.models.registry import model_config_from_dict
from asr.training.resume import check_resume

from helpers import PROJECT_ROOT

OLD = json.loads((PROJECT_ROOT / "tests" / "fixtures" / "las_attention_da63599.json").read_text())
DEMO = PROJECT_ROOT / "recipes" / "study_las_demo.yaml"

TYPES = ["content", "dot", "location"]
QUERY, KEY = 6, 10


def make(kind: str, heads: int = 1) -> Attention:
    torch.manual_seed(0)
    filters = {"conv_channels": 3, "conv_kernel": 5} if kind == "location" else {}  # location's keys
    att = Attention(AttentionConfig(type=kind, dim=8, heads=heads, **filters), QUERY, KEY)
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
    with pytest.raises(ConfigError, match="model.attention.type: 'monotonic' is not one of 'content', 'dot', "
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


def _las_results(model_config) -> tuple[dict[str, torch.Tensor], float, float]:
    """The state_dict of the LAS ``model_config`` builds with seed 0 (20 features, 12 tokens) and its loss
    on a fixed batch, in train mode (seed 1: dropout, MoChA's noise) and in eval mode."""
    torch.manual_seed(0)
    model = LAS(model_config, input_dim=20, vocab_size=12)
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(2, 40, 20, generator=generator)
    tokens = torch.randint(3, 12, (2, 4), generator=generator)
    tokens[1, 2:] = 0
    batch = (features, torch.tensor([40, 27]), tokens, torch.tensor([4, 2]))
    torch.manual_seed(1)
    train_loss = model.train()(*batch).loss.item()
    with torch.no_grad():
        eval_loss = model.eval()(*batch).loss.item()
    return model.state_dict(), train_loss, eval_loss


# What each type's section leaves out of an old run's, which held every type's keys: the other types' own
MOCHA_KEYS, LOCATION_KEYS = {"chunk", "monotonic_bias", "sigmoid_noise"}, {"conv_channels", "conv_kernel"}
LEFT_OUT = {"location": MOCHA_KEYS, "content": MOCHA_KEYS | LOCATION_KEYS, "dot": MOCHA_KEYS | LOCATION_KEYS | {"backend"},
            "mocha": LOCATION_KEYS | {"scaling", "window", "backend"}}
CONFIG_CLASSES = {"location": LocationConfig, "content": ContentConfig, "dot": DotConfig, "mocha": MochaConfig}


@pytest.mark.parametrize("name", sorted(OLD))
def test_an_old_runs_attention_config_reads_as_its_recipe_does_today_and_builds_the_same_model(name):
    entry = OLD[name]
    written = entry["model"]
    today = load_experiment_config(DEMO, entry["overrides"])
    config = model_config_from_dict(written)  # MoChA's keys flat in every type's section, as runs wrote them
    assert config == today.model
    new = to_dict(config)["attention"]
    assert {key: written["attention"][key] for key in new} == new  # every key it keeps has its old value
    left_out = set(written["attention"]) - set(new)
    assert left_out == LEFT_OUT[config.attention.type]
    # an old run resumes: its checkpoint's config, read as a recipe, is the recipe's
    resolved = experiment_config_to_dict(today)
    assert check_resume(as_recipe({**resolved, "model": written}), resolved, "last.pt") == []
    # the same weights and losses as the old code's, and as today's recipe gives
    state, train_loss, eval_loss = _las_results(config)
    assert {key: [list(value.shape), pytest.approx(value.double().sum().item(), rel=1e-6, abs=1e-6)]
            for key, value in state.items()} == entry["state_dict"]
    assert (train_loss, eval_loss) == (pytest.approx(entry["train_loss"], rel=1e-5),
                                       pytest.approx(entry["eval_loss"], rel=1e-5))
    again, *losses = _las_results(today.model)
    assert losses == [train_loss, eval_loss] and all(torch.equal(again[key], state[key]) for key in state)


def test_another_types_key_is_refused_in_one_line_naming_the_key_and_the_type():
    with pytest.raises(ConfigError) as refused:
        load_experiment_config(DEMO, ["model.attention.type=location", "model.attention.chunk=3"])
    message = str(refused.value)
    assert "unknown config key 'model.attention.chunk' for attention type 'location'; it is a key of 'mocha'" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="'model.attention.monotonic_bias' for attention type 'content'"):
        from_dict(AttentionConfig, {"type": "content", "monotonic_bias": 4.0}, "model.attention")
    with pytest.raises(ConfigError, match="unknown config key 'model.attention.chunks' for attention type 'mocha' "
                                          "\\(the keys of 'mocha': chunk, dim, heads, monotonic_bias, prior_width, "
                                          "sigmoid_noise, type\\)$"):
        from_dict(AttentionConfig, {"type": "mocha", "chunks": 3}, "model.attention")
    # a config object of the wrong class for its type is refused too
    with pytest.raises(ValueError, match="type 'location' has its keys in LocationConfig, not MochaConfig"):
        MochaConfig(type="location")
    with pytest.raises(ValueError, match="type 'location' has its keys in LocationConfig, not ContentConfig"):
        ContentConfig(type="location")
    # AttentionConfig(type=...) in Python builds the type's own class, which takes its own keys only
    assert type(AttentionConfig(type="mocha")) is MochaConfig and type(AttentionConfig()) is LocationConfig
    assert AttentionConfig(type="dot", dim=8, scaling=2.0) == DotConfig(dim=8, scaling=2.0)
    with pytest.raises(TypeError, match="conv_kernel"):
        AttentionConfig(type="content", conv_kernel=5)


@pytest.mark.parametrize("kind, key, value, owners", [
    ("content", "conv_kernel", 201, "'location'"),
    ("dot", "conv_channels", 4, "'location'"),
    ("mocha", "conv_kernel", 5, "'location'"),
    ("dot", "backend", "cpp", "'content', 'location'"),
    ("mocha", "backend", "reference", "'content', 'location'"),
    ("mocha", "scaling", 2.0, "'content', 'dot', 'location'"),
    ("mocha", "window", [4, 24], "'content', 'dot', 'location'"),
])
def test_a_key_of_some_types_is_refused_for_another_at_any_other_value_than_its_default(kind, key, value, owners):
    with pytest.raises(ConfigError) as refused:
        load_experiment_config(DEMO, [f"model.attention.type={kind}", f"model.attention.{key}={json.dumps(value)}"])
    message = str(refused.value)
    assert message.startswith(f"{DEMO}: unknown config key 'model.attention.{key}' for attention type '{kind}'; "
                              f"it is a key of {owners} (the keys of '{kind}': ")
    assert "\n" not in message
    # at its default (what every run wrote before) it is left out, and the model is the type's as ever
    default = {"conv_kernel": 31, "conv_channels": 10, "backend": "auto", "scaling": 1.0, "window": []}[key]
    config = load_experiment_config(DEMO, [f"model.attention.type={kind}", f"model.attention.{key}={json.dumps(default)}"])
    assert config.model.attention == load_experiment_config(DEMO, [f"model.attention.type={kind}"]).model.attention


def test_dot_takes_backend_reference_which_is_what_it_runs():
    """An old dot run that named backend: reference (the only path dot has) still reads, as plain dot."""
    config = load_experiment_config(DEMO, ["model.attention.type=dot", "model.attention.backend=reference"])
    assert config.model.attention == DotConfig(dim=64) and config.model.attention.backend == "reference"
    assert Attention(config.model.attention, 4, 5).config.backend == "reference"


@pytest.mark.parametrize("kind", ["location", "content", "dot", "mocha"])
def test_the_listed_keys_are_the_types_own_each_with_its_meaning(kind):
    keys = {k.key: k for k in describe_config(load_experiment_config(DEMO, [f"model.attention.type={kind}"]))}
    attention = {key.rpartition(".")[2]: k for key, k in keys.items() if key.startswith("model.attention.")}
    assert set(attention) == {f.name for f in __import__("dataclasses").fields(CONFIG_CLASSES[kind])}
    assert all(k.meaning for k in attention.values()), [name for name, k in attention.items() if not k.meaning]
    every = {"type", "dim", "heads", "prior_width"}
    assert set(attention) == every | {"chunk", "monotonic_bias", "sigmoid_noise", "scaling", "window", "backend",
                                      "conv_channels", "conv_kernel"} - LEFT_OUT[kind]

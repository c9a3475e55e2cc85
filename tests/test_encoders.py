"""The encoder table (asr/models/encoders.py, asr/models/encoder_registry.py): each encoder owns its keys,
and the kinds, the keys and the refusals follow from the table (issue 79, step 2).

tests/fixtures/transformer_models_1c9e928.json was written by the code before the table (commit 1c9e928):
for each Transformer recipe, the ``model`` section its run wrote into config.yaml (every kind's keys, the
Conformer's beside a Transformer encoder's) and, for the small ones, its model's state_dict keys with
their shapes."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

import pytest
import torch
from torch import Tensor, nn

from asr.config import ConfigError, apply_overrides, describe_config, read_yaml, to_dict
from asr.experiment import as_recipe, experiment_config_from_dict, experiment_config_to_dict, load_experiment_config
from asr.models import encoder_registry
from asr.models.blocks import SubsampledEncoder
from asr.models.encoder_registry import EncoderConfig, register_encoder
from asr.models.encoders import encoder_kinds
from asr.models.registry import build_model, model_config_from_dict
from asr.training.resume import check_resume

from helpers import PROJECT_ROOT

OLD = json.loads((PROJECT_ROOT / "tests" / "fixtures" / "transformer_models_1c9e928.json").read_text())


@pytest.mark.parametrize("recipe", sorted(OLD))
def test_an_old_runs_config_yaml_reads_as_its_recipe_does_today_and_writes_its_own_kinds_keys(recipe):
    written = OLD[recipe]["model"]
    config = model_config_from_dict(written)
    assert to_dict(config) == to_dict(load_experiment_config(PROJECT_ROOT / "recipes" / f"{recipe}.yaml").model)
    new = to_dict(config)
    # every key but the encoder's other kinds' keys (at their defaults) keeps its value
    left_out = set(written["encoder"]) - set(new["encoder"])
    assert {k: v for k, v in written.items() if k != "encoder"} == {k: v for k, v in new.items() if k != "encoder"}
    assert {k: written["encoder"][k] for k in new["encoder"]} == new["encoder"]
    if written["encoder"]["kind"] == "conformer":
        assert not left_out
    else:
        assert left_out == {"conv_kernel", "conv_norm", "conv_norm_groups", "final_norm", "positions"}
    assert model_config_from_dict(new) == config  # and what a run writes now reads back the same
    # so an old run resumes: its checkpoint's config, read as a recipe, is the recipe's
    resolved = experiment_config_to_dict(load_experiment_config(PROJECT_ROOT / "recipes" / f"{recipe}.yaml"))
    assert check_resume(as_recipe({**resolved, "model": written}), resolved, "last.pt") == []


@pytest.mark.parametrize("recipe", sorted(name for name, entry in OLD.items() if "state_dict" in entry))
def test_a_model_built_from_an_old_runs_config_has_the_old_state_dict_keys_and_shapes(recipe):
    entry = OLD[recipe]
    tokenizer = SimpleNamespace(vocab_size=entry["vocab_size"], pad_id=0, sos_id=1, eos_id=2)
    model = build_model(model_config_from_dict(entry["model"]), entry["input_dim"], tokenizer)
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == entry["state_dict"]


# ---------------------------------------------------------------- a toy encoder, registered from here


@dataclass
class ToyConfig(EncoderConfig):
    """A toy encoder's keys besides those every encoder has."""

    kind: Literal["toy"] = "toy"
    width: int = 8                 # the inner width of each toy block

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.width < 1:
            raise ValueError(f"encoder.width must be >= 1, got {self.width}")


class ToyBlock(nn.Module):
    def __init__(self, d_model: int, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(d_model, width)
        self.outer = nn.Linear(width, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.outer(torch.relu(self.inner(x)))


class ToyEncoder(SubsampledEncoder):
    """The x4 subsampling and absolute positions of every encoder, then position-wise toy blocks."""

    kind = "toy"

    def __init__(self, config, input_dim: int) -> None:
        stack = config.encoder
        super().__init__(config, input_dim, lambda: [ToyBlock(config.d_model, stack.width) for _ in range(stack.num_layers)],
                         closing_norm=True)

    def embed(self, features: Tensor) -> tuple[Tensor, None]:
        return self.with_absolute_positions(self.scaled_input(features)), None

    def blocks(self, x: Tensor, mask: Tensor, extra: None = None) -> Tensor:
        return self.stack(x)


@pytest.fixture
def toy_registered(monkeypatch):
    """The table with the toy's line added, for this test only."""
    monkeypatch.setattr(encoder_registry, "_ENCODERS", dict(encoder_registry._ENCODERS))
    register_encoder("toy", ToyConfig, ToyEncoder)


def toy_recipe(*overrides: str):
    data = apply_overrides(read_yaml(PROJECT_ROOT / "recipes" / "fsdd_transformer.yaml"),
                           ["model.encoder.kind=toy", "model.encoder.num_layers=2", *overrides])
    return experiment_config_from_dict(data)


@pytest.mark.usefixtures("toy_registered")
def test_a_toy_encoder_registered_from_outside_trains_with_the_transformers_decoder_and_owns_its_keys():
    assert "toy" in encoder_kinds()
    config = toy_recipe("model.encoder.width=12")
    assert isinstance(config.model.encoder, ToyConfig) and config.model.encoder.width == 12
    assert {"model.encoder.width": "the inner width of each toy block"}.items() <= {
        key.key: key.meaning for key in describe_config(config)}.items()
    input_dim = config.features.feature_dim
    torch.manual_seed(0)
    model = build_model(config.model, input_dim, SimpleNamespace(vocab_size=11, pad_id=0, sos_id=1, eos_id=2))
    assert isinstance(model.encoder, ToyEncoder) and len(model.encoder.layers) == 2
    assert model.encoder.layers[0].inner.out_features == 12
    features, lengths = torch.randn(2, 40, input_dim), torch.tensor([40, 29])
    tokens, token_lengths = torch.tensor([[3, 4, 5], [6, 7, 0]]), torch.tensor([3, 2])
    model(features, lengths, tokens, token_lengths).loss.backward()
    for name, parameter in model.encoder.layers.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all() and parameter.grad.abs().sum() > 0, name
    # what the run writes into config.yaml reads back as the toy's config
    assert model_config_from_dict(to_dict(config.model)) == config.model


@pytest.mark.usefixtures("toy_registered")
def test_a_key_of_another_kind_is_refused_naming_the_key_and_the_kind():
    with pytest.raises(ConfigError, match=r"'model.encoder.conv_kernel' for encoder kind 'toy'; it is a key of 'conformer'"):
        toy_recipe("model.encoder.conv_kernel=5")
    with pytest.raises(ConfigError, match=r"'model.encoder.width' for encoder kind 'conformer'; it is a key of 'toy'"):
        toy_recipe("model.encoder.kind=conformer", "model.encoder.width=12")
    with pytest.raises(ConfigError, match=r"'model.encoder.wdith' for encoder kind 'toy' \(the keys of 'toy': "):
        toy_recipe("model.encoder.wdith=12")
    with pytest.raises(ConfigError, match="model.encoder.kind: 'toys' is not one of 'transformer', 'conformer', 'toy'"):
        toy_recipe("model.encoder.kind=toys")
    with pytest.raises(ConfigError, match="encoder.width must be >= 1"):
        toy_recipe("model.encoder.width=0")
    # another kind's key at its default is what runs before the table wrote into config.yaml: left out
    assert not hasattr(toy_recipe("model.encoder.conv_kernel=31").model.encoder, "conv_kernel")


def test_a_kind_is_registered_once_with_a_config_of_its_own(toy_registered):
    with pytest.raises(ValueError, match="registered already"):
        register_encoder("toy", ToyConfig, ToyEncoder)
    with pytest.raises(ValueError, match="must default to 'toy2'"):
        register_encoder("toy2", ToyConfig, ToyEncoder)
    with pytest.raises(ValueError, match="has its keys in ToyConfig, not ConformerConfig"):
        from asr.models.conformer import ConformerConfig

        ConformerConfig(kind="toy")


# ---------------------------------------------------------------- imports run one way

ENCODER_SIDE = ("blocks", "relative_attention", "encoder_registry", "transformer_encoder", "conformer", "encoders",
                "transformer")


def _imports(name: str) -> set[str]:
    """The asr.models modules ``asr/models/<name>.py`` imports, inside functions and TYPE_CHECKING blocks too."""
    tree = ast.parse((PROJECT_ROOT / "asr" / "models" / f"{name}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                   else [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                   if isinstance(node, ast.ImportFrom) and node.module else [])
        found |= {m.removeprefix("asr.models.") for m in modules if m.startswith("asr.models.")}
    return found & set(ENCODER_SIDE)


def test_no_encoder_imports_another_or_the_decoders_model_and_nothing_loops():
    graph = {name: _imports(name) for name in ENCODER_SIDE}
    assert not graph["transformer_encoder"] & {"conformer", "transformer", "encoders"}
    assert not graph["conformer"] & {"transformer_encoder", "transformer", "encoders"}
    assert graph["transformer"] & {"transformer_encoder", "conformer"} == set()  # it builds what the table names

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    assert [name for name in ENCODER_SIDE if reaches(name, name, set())] == []

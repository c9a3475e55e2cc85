"""``model.type`` -> (config class, model class): the one place a recipe's model is looked up.

Adding a model: write its config (a :class:`~asr.models.interface.ModelConfig`
subclass whose ``type`` is a one-value ``Literal``) and its module (a
:class:`~asr.models.interface.SpeechModel`), then call :func:`register_model`
here. Training, decoding, checkpoints and every entry point take it from there.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from asr.config import ConfigError, from_dict
from asr.models.interface import ModelConfig, SpeechModel
from asr.models.las import LAS, LASConfig
from asr.models.transformer import Transformer, TransformerConfig


@dataclass(frozen=True)
class ModelEntry:
    config_class: type[ModelConfig]
    model_class: type[nn.Module]


_MODELS: dict[str, ModelEntry] = {}


def register_model(name: str, config_class: type[ModelConfig], model_class: type[nn.Module]) -> None:
    """Make ``model.type: name`` build ``model_class(config, input_dim, vocab_size, pad_id=, sos_id=, eos_id=)``."""
    if name in _MODELS:
        raise ValueError(f"model type {name!r} is registered already")
    _MODELS[name] = ModelEntry(config_class, model_class)


register_model("las", LASConfig, LAS)
register_model("transformer", TransformerConfig, Transformer)


def model_types() -> list[str]:
    return sorted(_MODELS)


def model_config_from_dict(data: dict) -> ModelConfig:
    """The recipe's ``model:`` mapping as its model's config; ``type`` defaults to ``las``."""
    if not isinstance(data, dict):
        raise ConfigError("model: expected a mapping")
    kind = data.get("type", "las")
    if kind not in _MODELS:
        raise ConfigError(f"model.type: {kind!r} is not one of {', '.join(map(repr, model_types()))}")
    return from_dict(_MODELS[kind].config_class, data, "model")


def build_model(config: ModelConfig, input_dim: int, tokenizer) -> nn.Module:
    """The model ``config`` describes, sized for ``input_dim`` features and the tokenizer's vocabulary."""
    entry = _MODELS[config.type]
    ids = dict(pad_id=tokenizer.pad_id, sos_id=tokenizer.sos_id, eos_id=tokenizer.eos_id)
    model = entry.model_class(config, input_dim, tokenizer.vocab_size, **ids)
    if not isinstance(model, SpeechModel):
        raise TypeError(f"{entry.model_class.__name__} does not implement asr.models.interface.SpeechModel")
    return model

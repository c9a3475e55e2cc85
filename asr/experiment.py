"""The experiment config: a whole recipe.

A recipe YAML has five sections: ``exp_dir``, ``features`` (features.config),
``data`` (asr.data.config), ``model`` (the config class ``model.type`` names in
:mod:`asr.models.registry`) and ``train`` (asr.training.config). Command-line overrides ``key.sub=value`` are applied to
the YAML before validation, so they are checked exactly like the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from asr.config import ConfigError, apply_overrides, from_dict, read_yaml, to_dict
from asr.data.config import DataConfig
from asr.models.interface import ModelConfig
from asr.models.registry import model_config_from_dict
from asr.training.config import TrainConfig
from asr.training.schedules import check_schedule_target
from asr.training.shapes import check_scaled_shape
from features.config import FeatureConfig

__all__ = [
    "ExperimentConfig",
    "TrainConfig",
    "as_recipe",
    "experiment_config_from_dict",
    "experiment_config_to_dict",
    "load_experiment_config",
]


@dataclass
class ExperimentConfig:
    exp_dir: str = "exp/default"        # the run's folder: config.yaml, train.log, TensorBoard events, checkpoints
    features: FeatureConfig = field(default_factory=FeatureConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = None           # the config class model.type names (asr.models.registry)
    train: TrainConfig = field(default_factory=TrainConfig)


def experiment_config_from_dict(data: dict) -> ExperimentConfig:
    data = dict(data)
    # A run's config.yaml also records which code ran (asr.models.runtime): a record, not a setting.
    data.pop("runtime", None)
    data.pop("history", None)  # and its resumes (asr.training.resume): a record too
    model_data = data.pop("model", None) or {}
    train = data.get("train")
    if isinstance(train, dict) and isinstance(train.get("schedules"), dict):
        # a schedule set to null is no schedule: an override (train.schedules.attention_prior=null) removes
        # a recipe's, and the value it moved holds still (model.ctc_weight, data.max_duration, ...)
        for name, value in train["schedules"].items():
            if value is None:
                check_schedule_target(name)
        data["train"] = {**train, "schedules": {k: v for k, v in train["schedules"].items() if v is not None}}
    config = from_dict(ExperimentConfig, data)
    config.model = model_config_from_dict(model_data)
    # A model's keys that name a schedule shape are checked here, above both (a model does not import training).
    for key, name in getattr(config.model, "schedule_shapes", dict)().items():
        check_scaled_shape(name, f"model.{key}", advice="give it with its options in train.schedules instead")
    return config


def load_experiment_config(recipe: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a recipe, apply ``key.sub=value`` overrides, validate. Errors name the key."""
    data = apply_overrides(read_yaml(recipe), overrides or [])
    try:
        return experiment_config_from_dict(data)
    except ConfigError as err:
        raise ConfigError(f"{recipe}: {err}") from None


def experiment_config_to_dict(config: ExperimentConfig) -> dict:
    return to_dict(config)


def as_recipe(record: dict) -> dict:
    """A run's recorded config (a checkpoint's) read as a recipe and back as data, so that a key an older
    version did not write stands at its default; as it is where it cannot be read so (a key since removed)."""
    try:
        return experiment_config_to_dict(experiment_config_from_dict(record))
    except ConfigError:
        return to_dict(record)

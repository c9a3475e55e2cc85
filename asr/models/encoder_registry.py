"""``model.encoder.kind`` -> (config class, module class): how the encoder-decoder model's encoders are
looked up, and the keys every encoder has.

An encoder declares its options beside its code: a subclass of :class:`EncoderConfig` whose ``kind`` is a
one-value ``Literal`` (``asr/models/transformer_encoder.py``, ``asr/models/conformer.py``).
:mod:`asr.models.encoders` names each in one :func:`register_encoder` line. Everything else follows
from that table: the kinds a recipe may name, the keys each takes (its config's fields), and the refusal
of a key the named kind does not have, an error that names the key and the kind. The decoder's model
(:mod:`asr.models.transformer`) builds whatever the table names and imports no encoder itself.

This module knows no encoder (they import it), as :mod:`asr.models.interface` knows no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from torch import Tensor, nn

from asr.config import variant_class, variant_data
from asr.models.blocks import check_stack


class EncoderHost(Protocol):
    """What an encoder reads of the model's config besides its own keys (``model.encoder``):
    :class:`~asr.models.transformer.TransformerConfig` has these."""

    d_model: int
    heads: int
    dropout: float
    attention_dropout: float
    norm_type: str
    eps: float
    encoder: EncoderConfig


class Encoder(Protocol):
    """An encoder module, built as ``module_class(config: EncoderHost, input_dim)``.

    ``layers`` is its stack of blocks (LayerDrop pruning keeps some: :mod:`asr.models.pruning`).
    :class:`~asr.models.blocks.SubsampledEncoder` gives all of it but the blocks."""

    layers: nn.ModuleList

    def __call__(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """features (B, T, F), lengths (B,) -> out (B, T', d_model), mask (B, T') True = valid, lengths (B,)."""
        ...


@dataclass
class EncoderConfig:
    """The keys every encoder has (``model.encoder``). A kind's config subclasses it with its own keys;
    ``model.encoder`` is read as the class its ``kind`` names in the table (:meth:`config_variant`)."""

    kind: str = "transformer"      # the encoder, a kind of the table in asr/models/encoders.py
    num_layers: int = 12           # ESPnet's LibriSpeech Transformer uses 12 encoder layers
    ff_dim: int = 2048             # feed-forward inner size, 8 x d_model at the default d_model (each macaron half's in a Conformer)
    # "pre" trains without learning-rate warmup and stays stable when deep;
    # "post" is the original paper's placement and needs warmup (docs/normalization.md).
    layer_norm: Literal["pre", "post"] = "pre"
    layerdrop: float = 0.0         # probability of skipping a whole layer per training batch (Fan et al. 2019)
    # Peak probability of dropping a self-attention head per example (DropHead, Zhou et al. 2020);
    # the paper's best machine-translation setting is 0.1-0.2. Its schedule: model.drophead_schedule.
    drophead: float = 0.0

    def __post_init__(self) -> None:
        entry = _ENCODERS.get(self.kind)
        if entry is None:
            raise ValueError(f"encoder.kind must be one of {encoder_kinds()}, got {self.kind!r}")
        if not isinstance(self, entry.config_class):
            raise ValueError(f"encoder.kind {self.kind!r} has its keys in {entry.config_class.__name__}, "
                             f"not {type(self).__name__}")
        check_stack(self, "encoder")

    def check_model(self, model: EncoderHost) -> None:
        """Check this kind's keys against the model's (``d_model``, ``heads``); a ``ValueError`` names the key."""

    @classmethod
    def config_variant(cls, data: dict, path: str) -> type[EncoderConfig]:
        """The config class ``data`` is read as (:func:`asr.config.from_dict` asks): its ``kind``'s."""
        if cls is not EncoderConfig:
            return cls
        return variant_class(data, path, "kind", EncoderConfig.kind, _encoder_config_classes())

    @classmethod
    def config_data(cls, data: dict, path: str) -> dict:
        """``data`` as this kind reads it (:func:`asr.config.from_dict` asks; :func:`asr.config.variant_data`):
        runs before the table wrote every kind's keys into config.yaml (the Conformer's beside a
        Transformer encoder's, at their defaults), as the old single config had them, and those load."""
        return variant_data(cls, data, path, "encoder kind", cls.kind, _encoder_config_classes())


def _encoder_config_classes() -> dict[str, type[EncoderConfig]]:
    return {name: entry.config_class for name, entry in _ENCODERS.items()}


@dataclass(frozen=True)
class EncoderEntry:
    config_class: type[EncoderConfig]
    module_class: type[nn.Module]


_ENCODERS: dict[str, EncoderEntry] = {}


def register_encoder(kind: str, config_class: type[EncoderConfig], module_class: type[nn.Module]) -> None:
    """Make ``model.encoder.kind: kind`` read its keys as ``config_class`` (an :class:`EncoderConfig` whose
    ``kind`` defaults to ``kind``) and build ``module_class(config, input_dim)`` (an :class:`Encoder`)."""
    if kind in _ENCODERS:
        raise ValueError(f"encoder kind {kind!r} is registered already")
    if not (isinstance(config_class, type) and issubclass(config_class, EncoderConfig)):
        raise TypeError(f"the config of encoder kind {kind!r} must subclass EncoderConfig, got {config_class!r}")
    if config_class.kind != kind:
        raise ValueError(f"{config_class.__name__}.kind must default to {kind!r}, got {config_class.kind!r}")
    _ENCODERS[kind] = EncoderEntry(config_class, module_class)


def encoder_kinds() -> tuple[str, ...]:
    return tuple(_ENCODERS)


def build_encoder(config: EncoderHost, input_dim: int) -> nn.Module:
    """The encoder ``config.encoder.kind`` names, for ``input_dim`` features."""
    return _ENCODERS[config.encoder.kind].module_class(config, input_dim)

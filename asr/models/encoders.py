"""The encoder table: ``model.encoder.kind`` -> (its config class, its module class), one line each.

An encoder is one file, with its config (an :class:`~asr.models.encoder_registry.EncoderConfig` subclass)
beside its module, and one line here; :mod:`asr.models.encoder_registry` derives the kinds, their keys and
the refusals from this table, and the encoder-decoder model (:mod:`asr.models.transformer`) builds what
it names. docs/architecture.md ("How to add…") has the steps.
"""

from __future__ import annotations

from asr.models.conformer import ConformerConfig, ConformerEncoder
from asr.models.encoder_registry import EncoderConfig, build_encoder, encoder_kinds, register_encoder
from asr.models.transformer_encoder import TransformerEncoder, TransformerEncoderConfig

__all__ = ["EncoderConfig", "TransformerEncoderConfig", "build_encoder", "encoder_kinds", "register_encoder"]

register_encoder("transformer", TransformerEncoderConfig, TransformerEncoder)
register_encoder("conformer", ConformerConfig, ConformerEncoder)

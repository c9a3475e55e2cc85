"""What every attention type of the LAS speller implements (:class:`LASAttention`), the keys every type
has (:class:`AttentionConfig`), and the table of types, ``model.attention.type`` -> its class.

The speller (:mod:`asr.models.speller`) and its CUDA graphs (:mod:`asr.models.speller_graphs`) see an
attention through :class:`LASAttention` only, so a new type (one that keeps a state of its own, as MoChA
does) is one file with a subclass and one :func:`register_attention` line (:mod:`asr.models.attention`
names the toolkit's types; code outside the package calls it too).

A type declares its options beside its code: a subclass of :class:`AttentionConfig` whose ``type``
defaults to the type's name, with its own keys (MoChA's chunk, stop bias and noise:
:class:`asr.models.mocha.MochaConfig`; the location filters: :class:`asr.models.attention.LocationConfig`),
named by its class's ``config_class`` or by its line in the table (content, dot and location share one
class, each with keys of its own); a type without keys of its own reads :class:`AttentionConfig` itself.
Everything else follows from the table: the types a recipe may name, the keys each takes, and the refusal
of a key the named type does not have, one line naming the key and the type. This module knows no type
(they import it), as :mod:`asr.models.encoder_registry` knows no encoder.

An attention owns some entries of the speller's decoding state (a dict whose tensors have the
hypothesis as their first dimension, :class:`asr.models.speller.Speller`):

* ``"weights"`` (N, heads, T), the attention of the last step (uniform over the valid frames, or whatever
  the type says, before the first): every type keeps it, since the speller returns it and beam search's
  coverage reads it;
* entries of its own, e.g. the window's ``"focus"`` (N,) or MoChA's ``"monotonic"`` (N, T);
* entries of the static part (``state["static"]``, :data:`~asr.models.interface.STATIC_STATE_KEY`), beside
  the listener's ``keys`` (N, T, H) and ``mask`` (N, T, True = valid frame), computed once per
  utterance, e.g. the projected keys.

Masks follow the toolkit's convention (True = valid); every row has at least one valid frame.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from asr.config import variant_class, variant_data


@dataclass
class AttentionConfig:
    """The ``model.attention`` section of an LAS recipe: the keys every type has. Each type reads it as
    its own subclass (:func:`attention_config_class`), with the type's keys beside these:
    ``model.attention`` is read as the class its ``type`` names (:meth:`config_variant`), and so is
    ``AttentionConfig(type=..., **keys)`` in Python (which names the type's own keys only)."""

    # content, dot, location or mocha (ATTENTION_TYPES); location-aware copes best with long utterances
    type: str = "location"
    dim: int = 256            # size of the projected query/keys the energies are computed in
    heads: int = 1            # LAS uses one; Chiu et al. (2018) report gains from 4
    # Width of the soft diagonal prior (asr/models/speller.py, "Attention prior") in encoder frames per
    # output step; the prior acts only while the attention_prior schedule is above 0. The speller reads it
    # for every type (a type that applies no energy bias, as MoChA, leaves the prior unused).
    prior_width: float = 3.0

    def __new__(cls, *args, **kwargs):
        if cls is AttentionConfig:  # the keys of the type named: AttentionConfig(type="content", ...)
            kind = args[0] if args else kwargs.get("type", AttentionConfig.type)
            if kind in ATTENTION_TYPES:
                cls = attention_config_class(kind)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        """The checks of the keys every type has; a type's config adds its own after calling this."""
        if self.type not in ATTENTION_TYPES:
            raise ValueError(f"type: {self.type!r} is not one of {', '.join(map(repr, ATTENTION_TYPES))}")
        config_class = attention_config_class(self.type)
        if type(self) is not config_class:
            raise ValueError(f"type {self.type!r} has its keys in {config_class.__name__}, not {type(self).__name__}")
        if self.prior_width <= 0:
            raise ValueError(f"prior_width must be positive, got {self.prior_width}")
        for name in ("dim", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def config_variant(cls, data: dict, path: str) -> type[AttentionConfig]:
        """The config class ``data`` is read as (:func:`asr.config.from_dict` asks): its ``type``'s."""
        if cls is not AttentionConfig:
            return cls
        return variant_class(data, path, "type", AttentionConfig.type, _attention_config_classes())

    @classmethod
    def config_data(cls, data: dict, path: str) -> dict:
        """``data`` as this type reads it (:func:`asr.config.from_dict` asks; :func:`asr.config.variant_data`):
        runs before each type owned its keys wrote every type's keys (MoChA's chunk, monotonic_bias and
        sigmoid_noise; location's conv_channels and conv_kernel; the scaling, window and backend of content,
        dot and location) at their defaults into config.yaml and their checkpoints, and those load."""
        kind = data.get("type", cls.type)
        return variant_data(cls, data, path, "attention type", kind, _attention_config_classes())


def _attention_config_classes() -> dict[str, type[AttentionConfig]]:
    return {name: attention_config_class(name) for name in ATTENTION_TYPES}


class LASAttention(nn.Module, ABC):
    """One attention type of the LAS speller.

    Subclasses take ``(config, query_dim, key_dim)``: the ``model.attention`` section (an instance of their
    ``config_class``), Q the size of the query (the speller's top cell) and H the size of a key (a listener
    state), which is also the size of the context.
    """

    # The keys this type reads: AttentionConfig, or a subclass of it with the type's own keys (and its own
    # checks, in its __post_init__) whose ``type`` defaults to the type's name. A class registered under
    # several names may give each its own (register_attention's config_class).
    config_class: type[AttentionConfig] = AttentionConfig

    # The dimension that runs over the listener frames of each state entry this type keeps (its own, the
    # static ones and "weights"); entries without one (the window's focus) are left out. The speller's
    # recorded decoding step pads the frames of these entries to its recorded shape (speller_graphs).
    frame_dims: dict[str, int] = {"weights": 2}

    def __init__(self, key_dim: int) -> None:
        super().__init__()
        self.key_dim = key_dim

    @property
    def context_dim(self) -> int:
        """Size of the context vector: the key size H."""
        return self.key_dim

    @property
    def recordable(self) -> bool:
        """Whether the speller may record this attention's steps as CUDA graphs (:mod:`asr.models.speller_graphs`):
        its step runs no host synchronisation and no data-dependent shape, and padding the batch, the frames
        (masked: weight 0) and the output steps changes none of its results. False (run eagerly) unless a
        type says so and its tests show it."""
        return False

    def static_state(self, keys: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """What depends only on the utterance: keys (N, T, H), mask (N, T) -> entries of the state's static
        part (none by default). Computed once per utterance, never reordered among its hypotheses."""
        return {}

    def teacher_forcing_state(self) -> dict:
        """Entries added to the static part for one teacher-forced loop run with gradients (the fused step's
        gradient accumulator for :class:`~asr.models.attention.Attention`; none by default)."""
        return {}

    @abstractmethod
    def initial_state(self, keys: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The entries this type keeps in the decoding state before the first step, ``"weights"``
        (N, heads, T) among them: keys (N, T, H), mask (N, T)."""

    @abstractmethod
    def step(
        self, query: torch.Tensor, state: dict, energy_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One output step: the query (N, Q) and the speller's state (its static part, the previous
        ``"weights"`` and this type's entries) -> the context (N, H), the weights (N, heads, T), each
        head's summing to at most 1 over the valid frames and exactly 0 on padded ones, and the new values
        of this type's own entries (``"weights"`` aside). ``energy_bias`` (N, T): the attention prior's
        energies, added where a type has energies over the frames (a type may ignore it)."""


# model.attention.type -> the class that computes it, and the class of the keys it reads. Filled by
# register_attention: asr/models/attention.py names the toolkit's types, one line each.
ATTENTION_TYPES: dict[str, type[LASAttention]] = {}
_CONFIG_CLASSES: dict[str, type[AttentionConfig]] = {}


def register_attention(name: str, attention_class: type[LASAttention],
                       config_class: type[AttentionConfig] | None = None) -> None:
    """Make ``model.attention.type: name`` build ``attention_class`` and read its keys as ``config_class``
    (None: the class's ``config_class``). Several names may share a class, each with its keys (content,
    dot and location share :class:`~asr.models.attention.Attention`); ValueError where the name is taken."""
    if name in ATTENTION_TYPES:
        raise ValueError(f"attention type {name!r} is registered already")
    if not (isinstance(attention_class, type) and issubclass(attention_class, LASAttention)):
        raise TypeError(f"an attention type must subclass LASAttention, got {attention_class!r}")
    config_class = attention_class.config_class if config_class is None else config_class
    if not (isinstance(config_class, type) and issubclass(config_class, AttentionConfig)):
        raise TypeError(f"the config of attention type {name!r} must subclass AttentionConfig, got {config_class!r}")
    ATTENTION_TYPES[name] = attention_class
    _CONFIG_CLASSES[name] = config_class


def attention_config_class(name: str) -> type[AttentionConfig]:
    """The class attention type ``name`` (registered) reads its keys as."""
    return _CONFIG_CLASSES[name]

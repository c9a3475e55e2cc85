"""What every attention type of the LAS speller implements: :class:`LASAttention`.

The speller (:mod:`asr.models.speller`) and its CUDA graphs (:mod:`asr.models.speller_graphs`) see an
attention through this class only, so a new type (one that keeps a state of its own, as MoChA does) is
one file with a subclass and one line in ``ATTENTION_TYPES`` (:mod:`asr.models.attention`), which maps
``model.attention.type`` to its class.

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

import torch
from torch import nn


class LASAttention(nn.Module, ABC):
    """One attention type of the LAS speller.

    Subclasses take ``(config, query_dim, key_dim)``: the ``model.attention`` section
    (:class:`asr.models.attention.AttentionConfig`), Q the size of the query (the speller's top cell) and H
    the size of a key (a listener state), which is also the size of the context.
    """

    # The dimension that runs over the listener frames of each state entry this type keeps (its own, the
    # static ones and "weights"); entries without one (the window's focus) are left out. The speller's
    # recorded decoding step pads the frames of these entries to its recorded shape (speller_graphs).
    frame_dims: dict[str, int] = {"weights": 2}

    def __init__(self, key_dim: int) -> None:
        super().__init__()
        self.key_dim = key_dim

    @classmethod
    def check_config(cls, config) -> None:
        """Refuse, with a ValueError naming the key, a ``model.attention`` section this type cannot
        compute (``AttentionConfig`` asks when it is built). Nothing is refused by default."""

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

"""The contract every recogniser implements, so training and decoding are shared.

:class:`SpeechModel` states it as a ``typing.Protocol`` and :class:`ModelConfig`
holds the options every model's config has; :mod:`asr.models.registry` maps a
recipe's ``model.type`` to a (config class, model class) pair.

A model is an ``nn.Module`` with the special ids ``sos_id``, ``eos_id`` and
``pad_id`` (the pad id doubles as the CTC blank) and:

``forward(features, feature_lengths, tokens, token_lengths) -> ModelOutput``
    features (B, T, D) float, feature_lengths (B,) int, tokens (B, L) int padded
    with the tokenizer's pad id (no ``<sos>``/``<eos>``: the model adds them with
    :func:`asr.models.common.add_sos_eos`), token_lengths (B,).

``encode(features, feature_lengths) -> EncoderOutput``

and the step-wise decoding interface used by greedy and beam search
(``asr.decoding``):

``init_decoder_state(encoder: EncoderOutput) -> state``
    The state before the first step, for a batch of B hypotheses.
``decode_step(tokens, state, encoder: EncoderOutput) -> (log_probs, state)``
    tokens (N,) the last emitted token of each hypothesis (``<sos>`` first);
    log_probs (N, V). ``encoder`` has N rows, already expanded to the beam;
    N may shrink between steps (rows of finished utterances leave the batch
    through ``reorder_decoder_state``, and ``encoder`` loses the same rows).
``reorder_decoder_state(state, index) -> state``
    Select/duplicate hypotheses: ``index`` (N',) long picks rows of the state.

The state is opaque to the search (any nesting of tensors whose first
dimension is the hypothesis dimension works with :func:`reorder_nested`).

Static part (optional). A dict state may keep, under the key
:data:`STATIC_STATE_KEY` (``"static"``), tensors that depend only on the
utterance and never change during decoding (e.g. projected encoder keys,
masks), still with one row per hypothesis. Beam search never moves a
hypothesis to another utterance, so when it reorders hypotheses within their
utterances it calls ``reorder_decoder_state`` on the state *without* that key
and keeps the static part as it is; it selects rows of the whole state,
static part included, only when finished utterances leave the batch.
``reorder_decoder_state`` must therefore accept the state with or without its
static part; :func:`reorder_nested` does. Called directly, it reorders
everything, so any ``index`` stays valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

# Key of a dict decoder state's per-utterance part (see the module docstring).
STATIC_STATE_KEY = "static"


@dataclass
class ModelConfig:
    """What every model's config (the recipe's ``model:`` section) has; each model's config extends it.

    ``type`` names the model in :mod:`asr.models.registry`.
    """

    type: str = ""                 # the model: las or transformer (asr.models.registry)
    ctc_weight: float = 0.3        # CTC share of the loss; 0 builds no CTC head. 0.3 as in ESPnet's recipes:
                                   # CTC's monotonic alignment makes attention converge much faster
    label_smoothing: float = 0.1   # on the attention loss only; spreads this share of the target mass over V

    # Whether ctc_weight 1.0 is allowed: a CTC-only model of the same encoder, whose decoder is never run
    # and whose decoding takes the CTC head's best path (LAS offers it, for comparisons).
    ctc_only_allowed: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not (0.0 <= self.ctc_weight < 1.0 or (self.ctc_only_allowed and self.ctc_weight == 1.0)):
            # 1.0 would leave the decoder untrained while decoding still needs it.
            upper = "1]" if self.ctc_only_allowed else "1)"
            raise ValueError(f"ctc_weight must be in [0, {upper}, got {self.ctc_weight}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")

    @property
    def schedule_dim(self) -> int | None:
        """The model width a ``noam`` learning-rate schedule scales by (None: the model has none)."""
        return None


@runtime_checkable
class SpeechModel(Protocol):
    """The interface training (:mod:`asr.training`) and decoding (:mod:`asr.decoding`) rely on."""

    sos_id: int
    eos_id: int
    pad_id: int

    @property
    def has_ctc(self) -> bool:
        """Whether ``encode`` gives CTC log-probabilities (the model has a CTC head)."""
        ...

    def forward(
        self, features: torch.Tensor, feature_lengths: torch.Tensor, tokens: torch.Tensor, token_lengths: torch.Tensor
    ) -> ModelOutput: ...

    def encode(self, features: torch.Tensor, feature_lengths: torch.Tensor) -> EncoderOutput: ...

    def init_decoder_state(self, encoder: EncoderOutput) -> Any: ...

    def decode_step(self, tokens: torch.Tensor, state: Any, encoder: EncoderOutput) -> tuple[torch.Tensor, Any]: ...

    def reorder_decoder_state(self, state: Any, index: torch.Tensor) -> Any: ...

    def decoder_attention(self, state: Any) -> torch.Tensor | None:
        """The attention over the encoder frames of the step that made ``state``, (N, T') summing to 1
        over valid frames (averaged over heads), or None for a decoder that does not expose one."""
        ...


# Optional capabilities. A model offers one by having its methods; the one place
# that needs it checks ``isinstance(model, Capability)`` (the protocols are
# runtime-checkable), so a model without it is refused or skipped there, by name.


@runtime_checkable
class Scheduled(Protocol):
    """Settings a schedule may move during training (:mod:`asr.training.schedules`): ``ctc_weight``,
    ``label_smoothing``, and whatever else the model names (the Transformer's DropHead rates). A model
    may also give schedules of its own config's, as ``train.schedules`` entries in plain data, for the
    settings a recipe does not schedule: ``default_schedules() -> {name: {"shape": ..., ...}}``."""

    def scheduled(self) -> dict[str, float]:
        """The names this model lets a schedule set, each with its value from the config."""
        ...

    def set_scheduled(self, name: str, value: float) -> None:
        """Set ``name`` (one of :meth:`scheduled`'s) for the coming update."""
        ...


@dataclass(frozen=True)
class LayerStack:
    """A stack of layers inference may cut (LayerDrop pruning, :mod:`asr.models.pruning`)."""

    num_layers: int
    layerdrop: float  # the LayerDrop rate it was trained with; 0 means it never learnt to lose layers


@runtime_checkable
class PrunableLayers(Protocol):
    """A model whose layer stacks can be pruned after training (the Transformer's encoder and decoder)."""

    def layer_stacks(self) -> dict[str, LayerStack]:
        """The stacks by name (``"encoder"``, ``"decoder"``)."""
        ...

    def keep_layers(self, keep: dict[str, list[int]]) -> None:
        """Keep only layers ``keep[stack]`` (increasing indices) of each named stack, in place."""
        ...


@dataclass
class EncoderOutput:
    """What the encoder hands the decoder.

    out:  (B, T', H) encoder states after time reduction.
    mask: (B, T') bool, True = valid frame.
    lengths: (B,) valid lengths, ``mask.sum(1)``.
    ctc_log_probs: (B, T', V) log-softmax of the CTC head, or None without one.
    """

    out: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    ctc_log_probs: torch.Tensor | None = None

    def index_select(self, index: torch.Tensor) -> "EncoderOutput":
        """Rows ``index`` of every field: used to expand a batch to B*k beams."""
        return EncoderOutput(
            out=self.out.index_select(0, index),
            mask=self.mask.index_select(0, index),
            lengths=self.lengths.index_select(0, index),
            ctc_log_probs=None if self.ctc_log_probs is None else self.ctc_log_probs.index_select(0, index),
        )


@dataclass
class ModelOutput:
    """Loss terms of one batch. ``loss`` is what is optimised:
    ``(1 - ctc_weight) * attention_loss + ctc_weight * ctc_loss``; the parts are
    reported separately (None when absent). ``num_tokens`` counts target tokens
    incl. ``<eos>``, for token-weighted averaging across batches."""

    loss: torch.Tensor
    attention_loss: torch.Tensor | None
    ctc_loss: torch.Tensor | None
    num_tokens: int
    attention_weights: torch.Tensor | None = None  # (B, L, T') for plots, optional
    encoder: "EncoderOutput | None" = None          # what the forward pass encoded, for validation metrics


def reorder_nested(state, index: torch.Tensor):
    """Apply ``index_select(0, index)`` to every tensor in a nested state."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.index_select(0, index)
    if isinstance(state, (list, tuple)):
        return type(state)(reorder_nested(s, index) for s in state)
    if isinstance(state, dict):
        return {k: reorder_nested(v, index) for k, v in state.items()}
    if isinstance(state, EncoderOutput):
        return state.index_select(index)
    raise TypeError(f"cannot reorder decoder state of type {type(state).__name__}")

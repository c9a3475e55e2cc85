"""The listener: LAS's encoder, a stack of bidirectional (LN-)LSTM layers that
shortens the sequence as it goes up (Chan et al. 2016, sec. 3.1).

``pyramidal: true`` (LAS): between layers, adjacent frame pairs of the lower
layer's output are concatenated, halving the time resolution, before the first
``pyramid_layers`` layer boundaries (LAS: 4 layers, 3 reductions, 8x).
``pyramidal: false``: a plain stack at the input rate.

Either way ``frame_stacking: k`` first concatenates k adjacent input frames
(k x time reduction; the common cheap alternative to a pyramid).

Growing layer by layer (Zeyer et al. 2018, "Improved training of end-to-end attention models for
speech recognition", sec. 3: their LibriSpeech encoder starts with 2 layers and gains one at a time,
and configurations without it are recorded as failures). ``active_layers`` (a buffer, so checkpoints
carry it; set by the ``listener_layers`` schedule, :mod:`asr.training.schedules`) runs only the first k
BLSTM layers; each later one is bypassed, keeping the sequence's rate and size: a layer after a
reduction averages the frame pair instead (4H -> 2H), any other passes its input on. So the
attention and the CTC head see the same frame rate whatever k is, and a layer that becomes active
starts from its initial weights, as a layer added in Zeyer et al.'s pretraining does.

Odd lengths. A sequence whose length is not a multiple of the factor is
**padded with zero frames** (never truncated): the last output frame covers the
remaining 1..k-1 real frames, and lengths become ``ceil(T / k)``. The padding
is what a shorter utterance sees in a batch anyway (masked frames are zero), so
an utterance gets the same output alone or padded, no audio is dropped, and any
utterance of at least one frame keeps at least one encoder frame: inputs shorter
than the total reduction factor are handled, not rejected. Zero-length
utterances are an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from asr.models.common import lengths_to_mask
from asr.models.lnlstm import LNLSTM, LNLSTMOptions


@dataclass
class ListenerConfig:
    """The ``model.listener`` section of an LAS recipe."""

    hidden_size: int = 256           # per direction; the listener output is 2x this
    num_layers: int = 4              # LAS: one BLSTM + three pyramidal BLSTMs
    pyramidal: bool = True           # halve the frame rate between layers (LAS); false = plain BLSTM stack
    pyramid_layers: int = 3          # reductions, at the first layer boundaries: 3 -> 8x, 80 ms per encoder frame
    frame_stacking: int = 1          # concatenate k input frames first (k x reduction); 1 = off
    input_projection: int = 0        # linear projection of the input features to this size; 0 = none
    dropout: float = 0.0             # on the input of every layer but the first, training only

    def __post_init__(self) -> None:
        if self.hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {self.hidden_size}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.frame_stacking < 1:
            raise ValueError(f"frame_stacking must be >= 1, got {self.frame_stacking}")
        if self.input_projection < 0:
            raise ValueError(f"input_projection must be >= 0 (0 = none), got {self.input_projection}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.pyramidal and not 0 <= self.pyramid_layers <= self.num_layers - 1:
            raise ValueError(
                f"pyramid_layers must be in [0, num_layers - 1 = {self.num_layers - 1}] "
                f"(reductions sit between layers), got {self.pyramid_layers}"
            )

    @property
    def reduction(self) -> int:
        """Total time reduction factor of the listener."""
        return self.frame_stacking * (2**self.pyramid_layers if self.pyramidal else 1)


def stack_frames(x: torch.Tensor, lengths: torch.Tensor, factor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate ``factor`` adjacent frames: x (B, T, D) -> (B, ceil(T/factor), factor*D).

    Frames past each length must already be zero; a trailing partial group is
    completed with zero frames, and lengths become ``ceil(lengths / factor)``.
    """
    if factor == 1:
        return x, lengths
    batch, time, dim = x.shape
    remainder = (-time) % factor
    if remainder:
        x = F.pad(x, (0, 0, 0, remainder))
    x = x.reshape(batch, (time + remainder) // factor, factor * dim)
    return x, torch.div(lengths + factor - 1, factor, rounding_mode="floor")


class Listener(nn.Module):
    """Encoder of LAS.

    Args:
        config: layer sizes, pyramid, frame stacking, projection, dropout.
        input_dim: D, size of a feature frame.
        lstm: the LSTM layers' :class:`~asr.models.lnlstm.LNLSTMOptions` (layer norm or a plain LSTM,
            variant, backend, ...), handed to every :class:`LNLSTM` whole.
    """

    def __init__(self, config: ListenerConfig, input_dim: int, lstm: LNLSTMOptions = LNLSTMOptions()) -> None:
        super().__init__()
        self.config = config
        self.reduction = config.reduction
        if config.input_projection:
            self.input_proj = nn.Linear(input_dim, config.input_projection)
            layer_input = config.input_projection
        else:
            self.register_module("input_proj", None)
            layer_input = input_dim
        layer_input *= config.frame_stacking
        # reduce_before[l]: a frame-pair reduction sits between layer l-1 and layer l.
        self.reduce_before = [
            config.pyramidal and 1 <= layer <= config.pyramid_layers for layer in range(config.num_layers)
        ]
        self.layers = nn.ModuleList()
        for layer in range(config.num_layers):
            if layer > 0:
                layer_input = 2 * config.hidden_size * (2 if self.reduce_before[layer] else 1)
            self.layers.append(LNLSTM(layer_input, config.hidden_size, bidirectional=True, options=lstm))
        self.dropout = nn.Dropout(config.dropout)
        self.register_buffer("active_layers", torch.tensor(config.num_layers, dtype=torch.long))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints written before the listener could grow: every layer active
        state_dict.setdefault(prefix + "active_layers", torch.tensor(self.config.num_layers, dtype=torch.long))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def set_active_layers(self, count: int) -> None:
        """Run the first ``count`` (1..num_layers) layers and bypass the rest (module docstring)."""
        if not 1 <= count <= self.config.num_layers:
            raise ValueError(f"active listener layers must be in [1, {self.config.num_layers}], got {count}")
        self.active_layers.fill_(count)

    @property
    def output_dim(self) -> int:
        return 2 * self.config.hidden_size

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """(B,) input lengths -> (B,) encoder lengths: ceil at every reduction."""
        lengths = torch.div(lengths + self.config.frame_stacking - 1, self.config.frame_stacking, rounding_mode="floor")
        for reduce in self.reduce_before:
            if reduce:
                lengths = torch.div(lengths + 1, 2, rounding_mode="floor")
        return lengths

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, D), lengths (B,) -> out (B, T', 2H), zero at padded
        frames, and lengths (B,) after reduction; ``T' = ceil(T / reduction)``
        (see the module docstring for odd lengths)."""
        if features.dim() != 3:
            raise ValueError(f"listener expects features of shape (B, T, D), got {tuple(features.shape)}")
        lengths = lengths.to(features.device)
        if lengths.numel() and int(lengths.min()) < 1:
            empty = (lengths < 1).nonzero().flatten().tolist()
            raise ValueError(
                f"listener got utterances of length 0 at batch positions {empty}; every utterance needs a frame"
            )
        if lengths.numel() and int(lengths.max()) > features.size(1):
            raise ValueError(
                f"feature_lengths up to {int(lengths.max())} exceed the padded length {features.size(1)}"
            )
        # Frames past the longest utterance carry nothing: skip them.
        x = features[:, : int(lengths.max())] if lengths.numel() else features
        if self.input_proj is not None:
            x = self.input_proj(x)
        # Zero the padding: frame stacking and pyramid reduction glue padded
        # frames onto real ones, and zeros make that equal to the unpadded case.
        x = x.masked_fill(~lengths_to_mask(lengths, x.size(1)).unsqueeze(-1), 0.0)
        x, lengths = stack_frames(x, lengths, self.config.frame_stacking)
        active = int(self.active_layers)
        for layer, lstm in enumerate(self.layers):
            if layer >= active:  # not grown yet: keep the rate and size (module docstring)
                if self.reduce_before[layer]:
                    x, lengths = stack_frames(x, lengths, 2)
                    x = 0.5 * (x[..., : x.size(-1) // 2] + x[..., x.size(-1) // 2 :])
                continue
            if layer > 0:
                x = self.dropout(x)
            if self.reduce_before[layer]:
                # The LN-LSTM output is zero past each length, as stack_frames needs.
                x, lengths = stack_frames(x, lengths, 2)
            x, _ = lstm(x, lengths)
        return x, lengths

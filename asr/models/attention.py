"""Attention of the speller over the listener's states (LAS, Chan et al. 2016).

Three energy functions behind one module, chosen by ``AttentionConfig.type``:

* ``"content"``: additive MLP attention (Bahdanau et al. 2015),
  ``e_t = v^T tanh(W q + U k_t + b)``. The common "MLP attention" of LAS
  implementations.
* ``"dot"``: the energy written in the LAS paper, ``e_t = <phi(q), psi(k_t)>`` with
  ``phi``, ``psi`` one-layer tanh MLPs, scaled by ``1/sqrt(dim)`` so the softmax
  does not saturate at initialisation when ``dim`` is large.
* ``"location"``: location-aware attention (Chorowski et al. 2015),
  ``e_t = v^T tanh(W q + U k_t + V f_t + b)`` with ``f = conv1d(alpha_prev)``: a
  1-D convolution over the previous step's attention weights, which lets the
  model learn to move forwards monotonically.

A fourth type, ``"mocha"``, monotonic chunkwise attention (Chiu & Raffel 2018),
is its own module, :class:`asr.models.mocha.MonotonicChunkwiseAttention`: it
keeps a different state (where the previous step stopped) and has one head.
Every type implements :class:`~asr.models.attention_interface.LASAttention`, the
one interface the speller sees, and the table at the end of this file maps
``model.attention.type`` to its class and its keys: a new type is one file and one line there. The keys
every type has are :class:`~asr.models.attention_interface.AttentionConfig`'s; each of these three reads
its own subclass of it, declared here (:class:`DotConfig`: the softmax's ``scaling`` and the ``window``;
:class:`ContentConfig`: those and the ``backend``, since the fused C++ step computes content and location
only; :class:`LocationConfig`: those and the filters, ``conv_channels`` and ``conv_kernel``). MoChA's own
keys live beside it (:class:`~asr.models.mocha.MochaConfig`).

Masks follow the toolkit convention (True = valid frame). Energies of padded
frames are set to ``-inf`` before the softmax, so their weights are exactly 0,
and since the location convolution only sees zeros beyond an utterance's end
(weights there are 0 in a batch and zero padding of the convolution alone),
an utterance gets the same context alone or padded in a batch.

With ``heads > 1`` every head has its own energy function (its own ``W``,
``U``, ``v``; the location convolution is shared, its projection too) and its
own context, a weighted sum of the keys; the heads' contexts are concatenated
and projected back to the key size, so the context size never depends on
``heads``. With one head the context is the weighted sum of the keys, exactly
as in the LAS paper (no output projection).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import nn

from asr.models import attention_fused
from asr.models.attention_interface import ATTENTION_TYPES, AttentionConfig, LASAttention, register_attention
from asr.models.interface import STATIC_STATE_KEY
from asr.models.mocha import MonotonicChunkwiseAttention

__all__ = ["ATTENTION_TYPES", "Attention", "AttentionConfig", "ContentConfig", "DotConfig", "LocationConfig",
           "register_attention"]


@dataclass
class DotConfig(AttentionConfig):
    """``model.attention`` with ``type: dot``: the keys every type has, and those of the softmax over all
    frames that content and location share (the scaling, the window)."""

    type: str = "dot"         # content, dot, location or mocha (ATTENTION_TYPES); dot: the LAS paper's energy
    # The softmax's inverse temperature: weights = softmax(scaling * energies). ESPnet's AttLoc uses 2.0
    # by default (its `scaling`); 1.0 is Chorowski et al.'s. Larger values sharpen the attention.
    scaling: float = 1.0
    # [left, right]: attend only to encoder frames from `left` before to `right` after the previous
    # step's focus (the median of its attention; frame 0 at the first step), as Chorowski et al. (2015)
    # restrict it to keep attention from jumping ahead; [] attends everywhere. On utterances longer than
    # any trained on it did not stop the speller from skipping words (docs/studies/long_utterances.md).
    window: list[int] = field(default_factory=list)
    # dot's step is PyTorch ops always (the fused step computes content and location): no key, but what
    # asr.models.attention_fused and the run's record read
    backend: ClassVar[str] = "reference"

    @classmethod
    def config_data(cls, data: dict, path: str) -> dict:
        """As every type reads its data (:meth:`AttentionConfig.config_data`), but for dot a ``backend`` of
        ``reference``, what dot runs anyway, is left out too: it was a key of every type before."""
        if "backend" not in {f.name for f in dataclasses.fields(cls)} and data.get("backend") == cls.backend:
            data = {key: value for key, value in data.items() if key != "backend"}
        return super().config_data(data, path)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scaling <= 0:
            raise ValueError(f"scaling must be positive, got {self.scaling}")
        if self.window and (len(self.window) != 2 or min(self.window) < 0):
            raise ValueError(f"window must be [] or [left, right] with both >= 0, got {self.window}")


@dataclass
class ContentConfig(DotConfig):
    """``model.attention`` with ``type: content``: dot's keys, and the backend of its step."""

    type: str = "content"     # content, dot, location or mocha (ATTENTION_TYPES); content: additive (Bahdanau)
    # Which code computes a step of types content and location (asr/models/attention_fused.py): auto
    # (the fused C++ step on CPU with one head, where it builds; else PyTorch ops), reference (PyTorch
    # ops always) or cpp (an error where the fused step cannot run). The run records what ran.
    backend: Literal["auto", "reference", "cpp"] = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in attention_fused.BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(attention_fused.BACKENDS)}, got {self.backend!r}")


@dataclass
class LocationConfig(ContentConfig):
    """``model.attention`` with ``type: location``: content's keys, and the location filters."""

    # content, dot, location or mocha (ATTENTION_TYPES); location-aware copes best with long utterances
    type: str = "location"
    conv_channels: int = 10   # location filters; 10 as in Chorowski et al. (2015) and ESPnet
    # Odd width of the location filters in encoder frames. ESPnet's default (aconv-filts 100, a
    # 201-frame filter) is used by its RNN recipes after 4x reduction too (WSJ: subsample 1_2_2_1_1),
    # so 201 frames is not only for unreduced encoders; 31 reaches +-15 frames (0.6 s at 40 ms).
    conv_kernel: int = 31

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("conv_channels", "conv_kernel"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.conv_kernel % 2 == 0:
            # An odd kernel centred on each frame keeps frame t's filter output aligned with frame t.
            raise ValueError(f"conv_kernel must be odd, got {self.conv_kernel}")


class Attention(LASAttention):
    """Attention of a query (the speller state) over keys (the listener states): the types content,
    dot and location.

    Args:
        config: its type's keys (:class:`DotConfig`, :class:`ContentConfig`, :class:`LocationConfig`):
            energy type, projection size, heads, scaling, window, backend, location filters.
        query_dim: Q, size of the query.
        key_dim: H, size of each key; also the size of the returned context.

    Call :meth:`project_keys` once per utterance and pass the result to every
    :meth:`forward` step as ``projected_keys``; the keys' projection is the
    expensive part and does not depend on the step.
    """

    ENERGIES = ("content", "dot", "location")
    # Its state: the previous weights; the static part: the projected keys (B, heads, T, dim).
    frame_dims = {"weights": 2, "projected_keys": 2}

    def __init__(self, config: DotConfig, query_dim: int, key_dim: int) -> None:
        super().__init__(key_dim)
        if config.type not in self.ENERGIES:
            raise ValueError(f"Attention computes the types {', '.join(self.ENERGIES)}, not {config.type!r} "
                             f"({ATTENTION_TYPES[config.type].__name__} does)")
        self.config = config
        self.type = config.type
        self.heads = config.heads
        self.dim = config.dim
        inner = config.heads * config.dim
        self.query_proj = nn.Linear(query_dim, inner, bias=self.type != "dot")
        self.key_proj = nn.Linear(key_dim, inner, bias=self.type == "dot")
        if self.type == "dot":
            self.register_module("energy", None)
        else:
            # v of each head: (heads, dim); applied as a batched inner product.
            self.energy = nn.Parameter(torch.empty(config.heads, config.dim))
            nn.init.uniform_(self.energy, -1.0 / math.sqrt(config.dim), 1.0 / math.sqrt(config.dim))
        if self.type == "location":
            self.location_conv = nn.Conv1d(
                1, config.conv_channels, config.conv_kernel, padding=config.conv_kernel // 2, bias=False
            )
            self.location_proj = nn.Linear(config.conv_channels, config.dim, bias=False)
        else:
            self.register_module("location_conv", None)
            self.register_module("location_proj", None)
        if config.heads > 1:
            self.output_proj = nn.Linear(config.heads * key_dim, key_dim)
        else:
            self.register_module("output_proj", None)

    @property
    def recordable(self) -> bool:
        """Without a window (whose focus the recorded step does not carry), the speller's CUDA graphs may
        record it: padded frames get weight 0 and the location filters see zeros past the end anyway."""
        return not self.config.window

    def static_state(self, keys: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"projected_keys": self.project_keys(keys)}

    def teacher_forcing_state(self) -> dict:
        # The fused step sums the keys' gradients over the loop here (attention_fused.Accumulator).
        return {"accumulator": attention_fused.Accumulator()}

    def initial_state(self, keys: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """``weights`` (:meth:`initial_weights`), and with a window ``focus`` (N,), the frame it is centred
        on: the first."""
        state = {"weights": self.initial_weights(mask, keys.dtype)}
        if self.config.window:
            state["focus"] = torch.zeros(keys.size(0), dtype=torch.long, device=keys.device)
        return state

    def step(
        self, query: torch.Tensor, state: dict, energy_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`forward` on the speller's state (:class:`~asr.models.attention_interface.LASAttention`);
        with a window, its new ``focus``."""
        static = state[STATIC_STATE_KEY]
        attend = self.window_mask(static["mask"], state["focus"]) if self.config.window else None
        context, weights = self(
            query, static["keys"], static["mask"], state["weights"], projected_keys=static["projected_keys"],
            attend=attend, energy_bias=energy_bias, accumulator=static.get("accumulator"),
        )
        return context, weights, ({"focus": self.focus(weights)} if self.config.window else {})

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, T, H) -> (B, heads, T, dim), the step-independent part of the energies."""
        batch, time, _ = keys.shape
        projected = self.key_proj(keys)
        if self.type == "dot":
            projected = torch.tanh(projected)
        # Contiguous once here, so no step has to copy it (a no-op for one head).
        return projected.view(batch, time, self.heads, self.dim).transpose(1, 2).contiguous()

    def window_mask(self, mask: torch.Tensor, focus: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the valid frames within the window around ``focus`` (B,) (all valid frames
        when no window is configured). The focus frame itself is always inside."""
        if not self.config.window:
            return mask
        left, right = self.config.window
        frames = torch.arange(mask.size(1), device=mask.device).unsqueeze(0)
        focus = focus.unsqueeze(1)
        return mask & (frames >= focus - left) & (frames <= focus + right)

    @staticmethod
    def focus(weights: torch.Tensor) -> torch.Tensor:
        """(B,) long: the median frame of ``weights`` (B, heads, T) averaged over heads, the first
        frame where the cumulative weight reaches one half."""
        cumulative = weights.mean(1).cumsum(-1)
        return (cumulative < 0.5).sum(-1).clamp(max=weights.size(-1) - 1)

    def initial_weights(self, mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Weights before the first step, (B, heads, T) of ``dtype``: uniform over the valid frames.

        Only the location-aware energy reads them; uniform (rather than zeros)
        tells it nothing about where to look while keeping padded frames at 0.
        """
        weights = mask.to(dtype) / mask.sum(1, keepdim=True).clamp(min=1).to(dtype)
        return weights.unsqueeze(1).expand(-1, self.heads, -1).contiguous()

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        prev_weights: torch.Tensor | None = None,
        projected_keys: torch.Tensor | None = None,
        attend: torch.Tensor | None = None,
        energy_bias: torch.Tensor | None = None,
        accumulator: attention_fused.Accumulator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One attention step.

        query: (B, Q); keys: (B, T, H); mask: (B, T) bool, True = valid frame
        (every row needs at least one); prev_weights: (B, heads, T) weights of the
        previous step (location-aware only; None = :meth:`initial_weights`);
        projected_keys: :meth:`project_keys` of ``keys``, or None to compute it;
        attend: (B, T) bool, the frames this step may attend to (a window, :meth:`window_mask`),
        None = every valid frame; energy_bias: (B, T) added to every head's energies after the
        scaling (a prior), None = none; accumulator: a loop's
        :class:`~asr.models.attention_fused.Accumulator` (the fused step only; None = none).

        Returns context (B, H) and weights (B, heads, T), each head's weights
        summing to 1 over the valid frames and exactly 0 on padded frames.
        """
        if projected_keys is None:
            projected_keys = self.project_keys(keys)
        if self.config.backend != "reference" and attention_fused.chosen(self, keys.device, keys.dtype) == "cpp":
            attention_fused.record("cpp")
            return attention_fused.step(self, query, keys, mask, prev_weights, projected_keys, attend, energy_bias,
                                        accumulator)
        attention_fused.record("reference")
        batch, heads, time, dim = projected_keys.shape
        q = self.query_proj(query).view(batch, heads, 1, dim)
        # Every step touches (B, heads, T, dim) values: the code below makes as
        # few passes over them as it can (fused multiply-adds, in place
        # activation, matrix-vector products), since this is where decoding
        # spends most of its time. For the same reason the additive energies use
        # tanh(x) = 2 sigmoid(2x) - 1, i.e. v^T tanh(x) = (2v)^T sigmoid(2x) - sum(v):
        # torch's float sigmoid is much faster than its tanh on CPU, the factor 2 rides
        # on the multiply-adds, and the result differs from the tanh form only
        # by float rounding (~1e-6 on the energies).
        if self.type == "dot":
            energies = torch.matmul(projected_keys, torch.tanh(q).transpose(2, 3)).squeeze(-1) / math.sqrt(dim)
        else:
            if self.type == "location":
                if prev_weights is None:
                    prev_weights = self.initial_weights(mask, keys.dtype)
                # Padded frames carry weight 0, so the filters see the same zeros
                # past the end of an utterance whether it is padded or not.
                prev = prev_weights.masked_fill(~mask.unsqueeze(1), 0.0).reshape(batch * heads, 1, time)
                location = self.location_conv(prev).transpose(1, 2)  # (B*heads, T, C)
                # 2 * (projected_keys + location_proj(location)) in one batched matmul.
                doubled = torch.baddbmm(
                    projected_keys.reshape(batch * heads, time, dim),
                    location,
                    self.location_proj.weight.t().expand(batch * heads, -1, -1),
                    beta=2.0,
                    alpha=2.0,
                ).view(batch, heads, time, dim)
                doubled = doubled.add_(q, alpha=2.0)
            else:
                doubled = torch.add(2.0 * q, projected_keys, alpha=2.0)
            # (B, heads, T, dim), a fresh tensor: in place is safe for autograd.
            gates = doubled.sigmoid_()
            # 2v of each head applied as one matrix-vector product over all (B, T) rows.
            per_head = gates.transpose(0, 1).reshape(heads, batch * time, dim)
            energies = torch.bmm(per_head, 2.0 * self.energy.unsqueeze(-1)).view(heads, batch, time).transpose(0, 1)
            energies = energies - self.energy.sum(-1).view(1, heads, 1)
        if self.config.scaling != 1.0:
            energies = energies * self.config.scaling
        if energy_bias is not None:
            energies = energies + energy_bias.unsqueeze(1)
        allowed = mask if attend is None else attend
        energies = energies.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        weights = torch.softmax(energies, dim=-1)  # (B, heads, T)
        context = torch.bmm(weights, keys)  # (B, heads, H)
        if self.output_proj is None:
            context = context.squeeze(1)
        else:
            context = self.output_proj(context.reshape(batch, self.heads * self.key_dim))
        return context, weights


# The table: model.attention.type -> the class that computes it and the class of the keys it reads (by
# default the attention class's config_class; asr/models/attention_interface.py derives the rest). A new
# type: one file with a LASAttention subclass, its config beside it where it has keys of its own
# (asr/models/mocha.py is the example), and one line here; from outside the package, one register_attention call.
register_attention("content", Attention, ContentConfig)
register_attention("dot", Attention, DotConfig)
register_attention("location", Attention, LocationConfig)
register_attention("mocha", MonotonicChunkwiseAttention)

"""Transformer encoder-decoder for speech (Vaswani et al. 2017) with a pre/post-norm switch.

Audio path: features (B, T, F) -> convolutional subsampling x4 in time
(two 3x3 Conv2d with stride 2 and ReLU, as ESPnet's ``Conv2dSubsampling``)
-> times ``sqrt(d_model)`` + sinusoidal positions -> N encoder layers (self-attention, feed-forward).
Text path: ``<sos> y_1 .. y_n`` -> token embedding (times ``sqrt(d_model)``
when ``scale_embedding``) + sinusoidal positions -> M decoder layers (masked
self-attention, cross-attention to the encoder, feed-forward) -> output
projection (the embedding matrix itself when ``tie_embeddings``).

Norm placement, per stack (``model.encoder.layer_norm``, ``model.decoder.layer_norm``):

* ``post`` (the original paper): ``x = Norm(x + Dropout(Sublayer(x)))``, no
  final norm; the last layer's norms are the stack's output.
* ``pre``: ``x = x + Dropout(Sublayer(Norm(x)))`` and one ``final_norm`` after
  the stack, because the residual stream itself is never normalised.

Regularisers besides dropout, per stack: LayerDrop (``layerdrop``, Fan et al.
2019) skips a whole layer per training batch, and the layers of a model trained
with it can be pruned at inference (:mod:`asr.models.pruning`); DropHead
(``drophead``, Zhou et al. 2020, :mod:`asr.models.drophead`) drops whole
attention heads per example, on a schedule the trainer drives through
:meth:`Transformer.set_regularisation_progress`.

Every norm is an attribute with a fixed name so placement can be inspected:
``layer.self_attn_norm``, ``layer.cross_attn_norm`` (decoder), ``layer.ff_norm``
and ``stack.final_norm`` (``None`` in post-norm). ``norm_type`` picks LayerNorm
or ScaleNorm for all of them; ``fixnorm`` l2-normalises the token embedding
rows (Nguyen & Salazar 2019). docs/normalization.md has the diagrams.

Masks follow the toolkit convention (``asr.models.common``): boolean, True =
may attend / valid. They go straight into
``torch.nn.functional.scaled_dot_product_attention``; no additive constants.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.models.common import add_sos_eos, lengths_to_mask
from asr.models.ctc import CTCHead
from asr.models.drophead import DROPHEAD_SCHEDULES, drop_heads, scheduled_rate
from asr.models.interface import EncoderOutput, LayerStack, ModelConfig, ModelOutput, reorder_nested
from asr.models.norms import NORM_TYPES, FixNorm, make_norm

LAYER_NORM_PLACEMENTS = ("pre", "post")


@dataclass
class EncoderConfig:
    """The audio stack (``model.encoder``)."""

    num_layers: int = 12           # ESPnet's LibriSpeech Transformer uses 12 encoder layers
    ff_dim: int = 2048             # feed-forward inner size, 8 x d_model at the default d_model
    # "pre" trains without learning-rate warmup and stays stable when deep;
    # "post" is the original paper's placement and needs warmup (docs/normalization.md).
    layer_norm: Literal["pre", "post"] = "pre"
    layerdrop: float = 0.0         # probability of skipping a whole layer per training batch (Fan et al. 2019)
    # Peak probability of dropping a self-attention head per example (DropHead, Zhou et al. 2020);
    # the paper's best machine-translation setting is 0.1-0.2. Its schedule: model.drophead_schedule.
    drophead: float = 0.0

    def __post_init__(self) -> None:
        _check_stack(self, "encoder")


@dataclass
class DecoderConfig:
    """The text stack (``model.decoder``)."""

    num_layers: int = 6            # half the encoder depth: the text side is short and easy
    ff_dim: int = 2048             # feed-forward inner size
    layer_norm: Literal["pre", "post"] = "pre"  # as the encoder's (model.encoder.layer_norm)
    layerdrop: float = 0.0         # as the encoder's
    drophead: float = 0.0          # the same for the decoder's self- and cross-attention heads

    def __post_init__(self) -> None:
        _check_stack(self, "decoder")


@dataclass
class TransformerConfig(ModelConfig):
    """A Transformer recogniser (``model:`` with ``type: transformer``; ``ctc_weight`` and
    ``label_smoothing``: :class:`ModelConfig`, on the attention cross-entropy as in Vaswani et al.)."""

    type: Literal["transformer"] = "transformer"
    d_model: int = 256             # width of both stacks; cross-attention needs them equal
    heads: int = 4                 # 64 dimensions per head at d_model 256, as in the base Transformer
    dropout: float = 0.1           # residual dropout on every sublayer output and on the input sums (Vaswani et al.)
    attention_dropout: float = 0.0 # dropout on attention weights; ESPnet's Transformer recipes leave it off
    norm_type: Literal["layernorm", "scalenorm"] = "layernorm"  # every sublayer/final norm of both stacks
    # l2-normalise the token embedding rows (FixNorm); with tie_embeddings the output
    # projection uses the same normalised rows. Pairs naturally with scalenorm.
    fixnorm: bool = False
    scale_embedding: bool = True   # token embedding * sqrt(d_model), so it is not drowned by the positions
    tie_embeddings: bool = True    # output projection = decoder input embedding (one Parameter)
    eps: float = 1e-5              # added inside every LayerNorm / lower bound of the ScaleNorm/FixNorm length
    # How the DropHead rate moves: "vshape" (the paper's) falls from the peak to 0 over the
    # learning-rate warmup and rises back to the peak by the last update; "constant" keeps the peak.
    drophead_schedule: Literal["vshape", "constant"] = "vshape"
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)

    @property
    def schedule_dim(self) -> int:
        return self.d_model

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.type != "transformer":
            raise ValueError(f"type must be 'transformer', got {self.type!r}")
        if self.d_model < 2 or self.d_model % 2:
            # sinusoidal positions pair a sine and a cosine per frequency
            raise ValueError(f"d_model must be a positive even number, got {self.d_model}")
        if self.heads < 1 or self.d_model % self.heads:
            raise ValueError(f"heads must divide d_model={self.d_model}, got {self.heads}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.norm_type not in NORM_TYPES:
            raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {self.norm_type!r}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.drophead_schedule not in DROPHEAD_SCHEDULES:
            raise ValueError(f"drophead_schedule must be one of {DROPHEAD_SCHEDULES}, got {self.drophead_schedule!r}")


def _check_stack(config: EncoderConfig | DecoderConfig, name: str) -> None:
    if config.num_layers < 1:
        raise ValueError(f"{name}.num_layers must be >= 1, got {config.num_layers}")
    if config.ff_dim < 1:
        raise ValueError(f"{name}.ff_dim must be >= 1, got {config.ff_dim}")
    if config.layer_norm not in LAYER_NORM_PLACEMENTS:
        raise ValueError(f"{name}.layer_norm must be one of {LAYER_NORM_PLACEMENTS}, got {config.layer_norm!r}")
    for regulariser in ("layerdrop", "drophead"):
        if not 0.0 <= getattr(config, regulariser) < 1.0:
            raise ValueError(f"{name}.{regulariser} must be in [0, 1), got {getattr(config, regulariser)}")


def sinusoidal_positions(positions: Tensor, dim: int) -> Tensor:
    """Vaswani et al.'s encodings: (L,) integer positions -> (L, dim) float.

    ``pe[p, 2i] = sin(p / 10000^(2i/dim))``, ``pe[p, 2i+1] = cos(...)``,
    computed on demand so there is no maximum length and a single decoding
    step gets exactly the row the full pass uses.
    """
    exponents = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim
    inv_freq = torch.exp(exponents * -math.log(10000.0))
    angles = positions.to(torch.float32).unsqueeze(1) * inv_freq  # (L, dim/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention on top of SDPA.

    Keys and values are projected by :meth:`project_kv` separately from the
    attention itself, so callers can cache them: the decoder projects the
    encoder output once per utterance and appends one step's keys to the
    self-attention cache per token.

    ``drophead`` is the current DropHead rate (moved along its schedule by
    :meth:`Transformer.set_regularisation_progress`): in training, whole heads
    of each example are dropped after attending and before the output
    projection joins them (:func:`asr.models.drophead.drop_heads`).
    """

    def __init__(self, d_model: int, heads: int, dropout: float, drophead: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.dropout = dropout
        self.drophead = drophead
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def _split(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, H, L, D/H)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) -> keys, values, each (B, H, S, D/H)."""
        return self._split(self.key(x)), self._split(self.value(x))

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
        """x: (B, L, D) queries; keys/values: (B, H, S, D/H); mask broadcastable
        to (B, H, L, S), True = may attend, or None (attend everywhere).
        Returns (B, L, D)."""
        queries = self._split(self.query(x))
        dropout = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, dropout_p=dropout)
        if self.training:
            attended = drop_heads(attended, self.drophead)
        batch, _, length, _ = attended.shape
        return self.out(attended.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class FeedForward(nn.Module):
    """Position-wise ``Linear -> ReLU -> Linear``: (B, L, D) -> (B, L, D)."""

    def __init__(self, d_model: int, ff_dim: int) -> None:
        super().__init__()
        self.inner = nn.Linear(d_model, ff_dim)
        self.outer = nn.Linear(ff_dim, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.outer(F.relu(self.inner(x)))


class _ResidualLayer(nn.Module):
    """Pre- or post-norm residual wiring shared by encoder and decoder layers.

    A sublayer reads ``self._sublayer_input(x, norm)`` and its result is
    merged by ``self._residual(x, y, norm)``; that pair is the whole
    difference between the two placements.
    """

    def __init__(self, layer_norm: str, dropout: float) -> None:
        super().__init__()
        self.pre_norm = layer_norm == "pre"
        self.residual_dropout = nn.Dropout(dropout)

    def _sublayer_input(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x) if self.pre_norm else x

    def _residual(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        y = self.residual_dropout(y)
        return x + y if self.pre_norm else norm(x + y)


class EncoderLayer(_ResidualLayer):
    """Self-attention then feed-forward, each with a residual and a norm."""

    def __init__(self, config: TransformerConfig, stack: EncoderConfig) -> None:
        super().__init__(stack.layer_norm, config.dropout)
        d_model = config.d_model
        self.self_attn_norm = make_norm(config.norm_type, d_model, config.eps)
        self.self_attn = MultiHeadAttention(d_model, config.heads, config.attention_dropout, stack.drophead)
        self.ff_norm = make_norm(config.norm_type, d_model, config.eps)
        self.feed_forward = FeedForward(d_model, stack.ff_dim)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x: (B, T, D); mask: (B, 1, 1, T) True = valid key frame. Returns (B, T, D)."""
        h = self._sublayer_input(x, self.self_attn_norm)
        keys, values = self.self_attn.project_kv(h)
        x = self._residual(x, self.self_attn(h, keys, values, mask), self.self_attn_norm)
        h = self._sublayer_input(x, self.ff_norm)
        return self._residual(x, self.feed_forward(h), self.ff_norm)


class DecoderLayer(_ResidualLayer):
    """Masked self-attention, cross-attention to the encoder, feed-forward."""

    def __init__(self, config: TransformerConfig, stack: DecoderConfig) -> None:
        super().__init__(stack.layer_norm, config.dropout)
        d_model = config.d_model
        self.self_attn_norm = make_norm(config.norm_type, d_model, config.eps)
        self.self_attn = MultiHeadAttention(d_model, config.heads, config.attention_dropout, stack.drophead)
        self.cross_attn_norm = make_norm(config.norm_type, d_model, config.eps)
        self.cross_attn = MultiHeadAttention(d_model, config.heads, config.attention_dropout, stack.drophead)
        self.ff_norm = make_norm(config.norm_type, d_model, config.eps)
        self.feed_forward = FeedForward(d_model, stack.ff_dim)

    def forward(
        self,
        x: Tensor,
        self_mask: Tensor | None,
        memory_kv: tuple[Tensor, Tensor],
        memory_mask: Tensor,
        past_kv: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x: (B, L, D) the new positions; self_mask: (B, 1, L, S) or None;
        memory_kv: the cross-attention keys/values (B, H, T', D/H) from
        ``cross_attn.project_kv(encoder_out)``; memory_mask: (B, 1, 1, T');
        past_kv: cached self-attention keys/values (B, H, S-L, D/H) of earlier
        positions, or None. Returns (B, L, D) and the self-attention keys/values
        of all S positions (the new cache)."""
        h = self._sublayer_input(x, self.self_attn_norm)
        keys, values = self.self_attn.project_kv(h)
        if past_kv is not None:
            keys = torch.cat((past_kv[0], keys), dim=2)
            values = torch.cat((past_kv[1], values), dim=2)
        x = self._residual(x, self.self_attn(h, keys, values, self_mask), self.self_attn_norm)
        h = self._sublayer_input(x, self.cross_attn_norm)
        x = self._residual(x, self.cross_attn(h, *memory_kv, memory_mask), self.cross_attn_norm)
        h = self._sublayer_input(x, self.ff_norm)
        return self._residual(x, self.feed_forward(h), self.ff_norm), (keys, values)


class Conv2dSubsampling(nn.Module):
    """x4 time reduction: (B, T, F) -> (B, T', D), ``T' = ((T - 1) // 2 - 1) // 2``.

    Two 3x3 convolutions with stride 2 and no padding (ESPnet's
    ``Conv2dSubsampling``), then a linear map of channels x remaining
    frequency bins to ``d_model``. Without padding, output frame t sees input
    frames 4t .. 4t+6 only, so the valid outputs of an utterance never read
    its padding: the lengths above are exact.
    """

    MIN_FRAMES = 7  # the fewest input frames that give one output frame

    def __init__(self, input_dim: int, d_model: int) -> None:
        super().__init__()
        if input_dim < self.MIN_FRAMES:
            raise ValueError(
                f"the Transformer's convolutional front-end needs feature dimension >= {self.MIN_FRAMES}, "
                f"got {input_dim}"
            )
        self.conv = nn.Sequential(
            nn.Conv2d(1, d_model, kernel_size=3, stride=2),
            nn.ReLU(),
            nn.Conv2d(d_model, d_model, kernel_size=3, stride=2),
            nn.ReLU(),
        )
        self.proj = nn.Linear(d_model * self.output_lengths(input_dim), d_model)

    @staticmethod
    def output_lengths(lengths):
        """Frames (int or (B,) tensor) after both convolutions."""
        return ((lengths - 1) // 2 - 1) // 2

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x.unsqueeze(1))  # (B, C, T', F')
        batch, channels, frames, freqs = x.shape
        return self.proj(x.transpose(1, 2).reshape(batch, frames, channels * freqs))


class TransformerEncoder(nn.Module):
    """Subsampling, positions and the encoder layers: (B, T, F) -> (B, T', D)."""

    def __init__(self, config: TransformerConfig, input_dim: int) -> None:
        super().__init__()
        stack = config.encoder
        self.input_dim = input_dim
        self.d_model = config.d_model
        self.layerdrop = stack.layerdrop
        self.subsampling = Conv2dSubsampling(input_dim, config.d_model)
        self.input_scale = math.sqrt(config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(EncoderLayer(config, stack) for _ in range(stack.num_layers))
        # Pre-norm leaves the residual stream unnormalised; this norm gives the
        # decoder's cross-attention (and the CTC head) normalised input.
        self.final_norm = make_norm(config.norm_type, config.d_model, config.eps) if stack.layer_norm == "pre" else None

    def front_end(self, features: Tensor) -> Tensor:
        """(B, T, F) -> (B, T', D): subsampling, times sqrt(d_model), plus positions, dropout.

        The sqrt(d_model) scale is ESPnet's (its ``PositionalEncoding.xscale``):
        at initialisation the subsampling output of mean-variance normalised
        features is about 0.1 per coordinate against the positions' 0.7, and
        the scale puts content and positions on comparable footing, like
        ``scale_embedding`` does for tokens (docs/normalization.md, section 3).
        """
        x = self.subsampling(features) * self.input_scale
        positions = sinusoidal_positions(torch.arange(x.shape[1], device=x.device), self.d_model)
        return self.dropout(x + positions.to(x.dtype))

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """features: (B, T, F), lengths: (B,). Returns out (B, T', D), mask
        (B, T') True = valid, lengths (B,)."""
        if features.dim() != 3 or features.shape[-1] != self.input_dim:
            raise ValueError(f"expected features (B, T, {self.input_dim}), got {tuple(features.shape)}")
        lengths = lengths.to(features.device)
        too_short = lengths < Conv2dSubsampling.MIN_FRAMES
        if too_short.any():
            rows = too_short.nonzero().flatten().tolist()
            raise ValueError(
                f"utterances too short for the Transformer's x4 convolutional subsampling: it needs at least "
                f"{Conv2dSubsampling.MIN_FRAMES} feature frames, got lengths {lengths[too_short].tolist()} "
                f"(batch rows {rows})"
            )
        if int(lengths.max()) > features.shape[1]:
            raise ValueError(f"feature lengths {lengths.tolist()} exceed the padded length {features.shape[1]}")
        x = self.front_end(features)
        out_lengths = Conv2dSubsampling.output_lengths(lengths)
        mask = lengths_to_mask(out_lengths, x.shape[1])
        # Keys at padded frames are masked; padded query rows compute garbage
        # that no valid frame ever reads.
        attn_mask = mask[:, None, None, :]
        for layer in self.layers:
            if self.training and self.layerdrop > 0 and torch.rand(()) < self.layerdrop:
                continue
            x = layer(x, attn_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, mask, out_lengths


class TokenEmbedding(nn.Module):
    """Token ids (B, L) -> (B, L, D); optionally FixNorm-ed rows, times sqrt(D).

    The table starts at N(0, D^-0.5) (as fairseq): after the sqrt(D) scale the
    entries have unit variance, like the positions they are added to, and the
    tied output projection starts with logits of order one.
    """

    def __init__(self, vocab_size: int, d_model: int, scale_embedding: bool, fixnorm: bool, eps: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)
        self.fixnorm = FixNorm(eps=eps) if fixnorm else None
        self.scale = math.sqrt(d_model) if scale_embedding else 1.0

    def table(self) -> Tensor:
        """The (V, D) matrix actually used: rows of unit length under FixNorm."""
        weight = self.embedding.weight
        return weight if self.fixnorm is None else self.fixnorm(weight)

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.table()) * self.scale


class TransformerDecoder(nn.Module):
    """Embedding, positions, decoder layers, output projection: tokens (B, L) -> logits (B, L, V)."""

    def __init__(self, config: TransformerConfig, vocab_size: int) -> None:
        super().__init__()
        stack = config.decoder
        self.d_model = config.d_model
        self.layerdrop = stack.layerdrop
        self.tie_embeddings = config.tie_embeddings
        self.token_embedding = TokenEmbedding(
            vocab_size, config.d_model, config.scale_embedding, config.fixnorm, config.eps
        )
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(DecoderLayer(config, stack) for _ in range(stack.num_layers))
        self.final_norm = make_norm(config.norm_type, config.d_model, config.eps) if stack.layer_norm == "pre" else None
        self.output = nn.Linear(config.d_model, vocab_size, bias=False)
        if config.tie_embeddings:
            # One Parameter, two uses (Press & Wolf 2017).
            self.output.weight = self.token_embedding.embedding.weight

    def _embed(self, tokens: Tensor, start: int) -> Tensor:
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens)
        return self.dropout(x + sinusoidal_positions(positions, self.d_model).to(x.dtype))

    def project(self, x: Tensor) -> Tensor:
        """Stack output (B, L, D) -> logits (B, L, V): final norm (pre-norm only), then the output projection."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        # Tied: go through table() so FixNorm's unit rows are used for output too.
        weight = self.token_embedding.table() if self.tie_embeddings else self.output.weight
        return F.linear(x, weight)

    def memory_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Cross-attention keys/values of every layer for encoder output (B, T', D)."""
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

    def forward(self, tokens: Tensor, token_mask: Tensor, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """Teacher forcing. tokens: (B, L) decoder input (``<sos>`` first);
        token_mask: (B, L) True = valid; memory: (B, T', D) encoder output;
        memory_mask: (B, T') True = valid frame. Returns logits (B, L, V)."""
        length = tokens.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
        # (B, 1, L, L): position i sees j <= i, and never a padded position. For
        # valid positions the causal part already excludes padding (it comes
        # last); the padding part keeps the mask's meaning explicit.
        self_mask = causal & token_mask[:, None, None, :]
        cross_mask = memory_mask[:, None, None, :]
        x = self._embed(tokens, 0)
        for layer, kv in zip(self.layers, self.memory_kv(memory)):
            if self.training and self.layerdrop > 0 and torch.rand(()) < self.layerdrop:
                continue
            x, _ = layer(x, self_mask, kv, cross_mask)
        return self.project(x)

    def step(
        self, tokens: Tensor, cache: dict[str, list[Tensor]], memory_mask: Tensor
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """One position for N hypotheses. tokens: (N,); cache: see
        ``Transformer.init_decoder_state``; memory_mask: (N, T').
        Returns logits (N, V) and the cache grown by one position."""
        position = cache["self_keys"][0].shape[2]
        x = self._embed(tokens.unsqueeze(1), position)
        cross_mask = memory_mask[:, None, None, :]
        self_keys, self_values = [], []
        for i, layer in enumerate(self.layers):
            past = (cache["self_keys"][i], cache["self_values"][i])
            memory = (cache["memory_keys"][i], cache["memory_values"][i])
            # All cached positions are real tokens: no self-attention mask needed.
            x, (keys, values) = layer(x, None, memory, cross_mask, past_kv=past)
            self_keys.append(keys)
            self_values.append(values)
        return self.project(x).squeeze(1), {**cache, "self_keys": self_keys, "self_values": self_values}


class Transformer(nn.Module):
    """Speech Transformer implementing ``asr.models.interface``.

    config: :class:`TransformerConfig`; input_dim: feature dimension F;
    vocab_size: V incl. the special tokens; pad_id is also the CTC blank.
    """

    def __init__(
        self,
        config: TransformerConfig,
        input_dim: int,
        vocab_size: int,
        pad_id: int = 0,
        sos_id: int = 1,
        eos_id: int = 2,
    ) -> None:
        super().__init__()
        for name, value in (("pad_id", pad_id), ("sos_id", sos_id), ("eos_id", eos_id)):
            if not 0 <= value < vocab_size:
                raise ValueError(f"{name}={value} is outside the vocabulary of size {vocab_size}")
        if len({pad_id, sos_id, eos_id}) != 3:
            raise ValueError(f"pad_id, sos_id and eos_id must differ, got {pad_id}, {sos_id}, {eos_id}")
        self.config = config
        self.vocab_size = vocab_size
        self.pad_id, self.sos_id, self.eos_id = pad_id, sos_id, eos_id
        self.encoder = TransformerEncoder(config, input_dim)
        self.decoder = TransformerDecoder(config, vocab_size)
        self.ctc = CTCHead(config.d_model, vocab_size, blank_id=pad_id) if config.ctc_weight > 0 else None
        self.ctc_weight = config.ctc_weight            # a schedule may move these (asr.training.schedules)
        self.label_smoothing = config.label_smoothing

    @property
    def has_ctc(self) -> bool:
        return self.ctc is not None

    def scheduled(self) -> dict[str, float]:
        offered = {"label_smoothing": self.config.label_smoothing}
        if self.ctc is not None:
            offered["ctc_weight"] = self.config.ctc_weight
        return offered

    def set_scheduled(self, name: str, value: float) -> None:
        if name not in self.scheduled():
            raise KeyError(f"the Transformer has no scheduled setting {name!r}")
        setattr(self, name, value)

    # Optional capabilities (asr.models.interface): scheduled DropHead and LayerDrop pruning.

    def set_regularisation_progress(self, step: int, total_steps: int, warmup_steps: int) -> dict[str, float]:
        """Move every attention module's DropHead rate to ``model.drophead_schedule``'s value after
        ``step`` of ``total_steps`` updates (warmup: ``warmup_steps``). Returns
        ``{"drophead_encoder": r, "drophead_decoder": r}`` for the stacks that use DropHead."""
        rates = {}
        for name, stack, peak in (
            ("encoder", self.encoder, self.config.encoder.drophead),
            ("decoder", self.decoder, self.config.decoder.drophead),
        ):
            if peak == 0.0:
                continue
            rate = scheduled_rate(peak, self.config.drophead_schedule, step, total_steps, warmup_steps)
            for module in stack.modules():
                if isinstance(module, MultiHeadAttention):
                    module.drophead = rate
            rates[f"drophead_{name}"] = rate
        return rates

    def layer_stacks(self) -> dict[str, LayerStack]:
        return {
            "encoder": LayerStack(len(self.encoder.layers), self.config.encoder.layerdrop),
            "decoder": LayerStack(len(self.decoder.layers), self.config.decoder.layerdrop),
        }

    def keep_layers(self, keep: dict[str, list[int]]) -> None:
        """Keep only the layers ``keep["encoder"]`` / ``keep["decoder"]`` (increasing indices) of those stacks.

        The kept layers are the very modules (weights shared, not copied); ``self.config``
        is replaced by one whose ``num_layers`` describe the pruned model.
        """
        config = self.config
        for name, indices in keep.items():
            if name not in ("encoder", "decoder"):
                raise ValueError(f"the Transformer has no layer stack {name!r} (it has 'encoder' and 'decoder')")
            stack = self.encoder if name == "encoder" else self.decoder
            count = len(stack.layers)
            indices = list(indices)
            if not indices or indices != sorted(set(indices)) or indices[0] < 0 or indices[-1] >= count:
                raise ValueError(f"{name} layers to keep must be increasing indices in 0..{count - 1}, got {indices}")
            stack.layers = nn.ModuleList(stack.layers[i] for i in indices)
            stack_config = dataclasses.replace(getattr(config, name), num_layers=len(indices))
            config = dataclasses.replace(config, **{name: stack_config})
        self.config = config

    def encode(self, features: Tensor, feature_lengths: Tensor) -> EncoderOutput:
        """features (B, T, F), feature_lengths (B,) -> EncoderOutput with T' = T/4 frames."""
        out, mask, lengths = self.encoder(features, feature_lengths)
        ctc_log_probs = self.ctc(out) if self.ctc is not None else None
        return EncoderOutput(out=out, mask=mask, lengths=lengths, ctc_log_probs=ctc_log_probs)

    def decoder_log_probs(self, encoder: EncoderOutput, decoder_input: Tensor, decoder_lengths: Tensor) -> Tensor:
        """Teacher-forced log-probabilities (B, L, V) for decoder_input (B, L) with valid lengths (B,)."""
        token_mask = lengths_to_mask(decoder_lengths, decoder_input.shape[1])
        logits = self.decoder(decoder_input, token_mask, encoder.out, encoder.mask)
        return F.log_softmax(logits, dim=-1)

    def forward(self, features: Tensor, feature_lengths: Tensor, tokens: Tensor, token_lengths: Tensor) -> ModelOutput:
        """Loss of one batch; see ``asr.models.interface`` for the shapes.

        Both loss terms are sums over the batch divided by ``num_tokens``
        (target tokens incl. ``<eos>``), so they are per-token and batches of
        different sizes add up correctly.
        """
        encoder = self.encode(features, feature_lengths)
        token_lengths = token_lengths.to(tokens.device)
        decoder_input, target = add_sos_eos(tokens, token_lengths, self.sos_id, self.eos_id, self.pad_id)
        log_probs = self.decoder_log_probs(encoder, decoder_input, token_lengths + 1)  # <sos> + tokens
        num_tokens = int((token_lengths + 1).sum())
        attention_loss = (
            F.cross_entropy(  # on log-probs: log_softmax is idempotent
                log_probs.reshape(-1, log_probs.shape[-1]),
                target.reshape(-1),
                ignore_index=self.pad_id,
                label_smoothing=self.label_smoothing,
                reduction="sum",
            )
            / num_tokens
        )
        ctc_loss = None
        loss = attention_loss
        if encoder.ctc_log_probs is not None:
            # An utterance whose targets cannot fit its frames adds 0, not inf (zero_infinity).
            ctc_loss = self.ctc.loss(encoder.ctc_log_probs.float(), encoder.lengths, tokens, token_lengths) / num_tokens
            weight = self.ctc_weight
            loss = (1.0 - weight) * attention_loss + weight * ctc_loss
        return ModelOutput(loss=loss, attention_loss=attention_loss, ctc_loss=ctc_loss, num_tokens=num_tokens,
                           encoder=encoder)

    # Step-wise decoding (asr.decoding): the state is a dict of per-layer lists
    # of (N, H, S, D/H) tensors. Self-attention keys/values grow by one
    # position per step; the cross-attention ones are projected once here.

    def init_decoder_state(self, encoder: EncoderOutput) -> dict[str, list[Tensor]]:
        memory = self.decoder.memory_kv(encoder.out)
        batch, _, _ = encoder.out.shape
        heads = self.config.heads
        empty = encoder.out.new_zeros(batch, heads, 0, self.config.d_model // heads)
        return {
            "self_keys": [empty] * len(memory),
            "self_values": [empty] * len(memory),
            "memory_keys": [keys for keys, _ in memory],
            "memory_values": [values for _, values in memory],
        }

    def decode_step(
        self, tokens: Tensor, state: dict[str, list[Tensor]], encoder: EncoderOutput
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        logits, state = self.decoder.step(tokens, state, encoder.mask)
        return F.log_softmax(logits, dim=-1), state

    def decoder_attention(self, state: dict[str, list[Tensor]]) -> None:
        """None: the cross-attention of the decoder's layers and heads is not reduced to one alignment."""
        return None

    def reorder_decoder_state(self, state: dict[str, list[Tensor]], index: Tensor) -> dict[str, list[Tensor]]:
        return reorder_nested(state, index)

"""The encoder-decoder model for speech (Vaswani et al. 2017) with a pre/post-norm switch, and an
encoder slot: ``model.encoder.kind`` picks the audio stack, one file each with its own keys, named in the
encoder table (:mod:`asr.models.encoders`); this file imports none of them.

* ``transformer`` (:mod:`asr.models.transformer_encoder`): convolutional subsampling x4 in time
  (two 3x3 Conv2d with stride 2 and ReLU, as ESPnet's ``Conv2dSubsampling``) -> times
  ``sqrt(d_model)`` + sinusoidal positions -> N encoder layers (self-attention, feed-forward).
* ``conformer`` (:mod:`asr.models.conformer`, Gulati et al. 2020): the same subsampling, then
  Conformer blocks (macaron feed-forwards, relative or absolute positional self-attention, a
  convolution module, a closing norm), with its own norm keys.

Both feed the same decoder, CTC head and joint loss (:mod:`asr.models.joint`), so features, data,
training, decoding and studies are shared. Text path: ``<sos> y_1 .. y_n`` -> token embedding (times ``sqrt(d_model)``
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
attention heads per example, at a rate that is a scheduled setting like the others
(``drophead_encoder``, ``drophead_decoder``; ``model.drophead_schedule`` gives its default shape).

Every norm is an attribute with a fixed name so placement can be inspected:
``layer.self_attn_norm``, ``layer.cross_attn_norm`` (decoder), ``layer.ff_norm``
and ``stack.final_norm`` (``None`` in post-norm); the Conformer's are listed in its
module. ``norm_type`` picks LayerNorm, ScaleNorm or RMSNorm for all of them; ``fixnorm`` l2-normalises the token embedding
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

from asr.models import sdpa
from asr.models.blocks import (  # noqa: F401 (Conv2dSubsampling, sinusoidal_positions: also imported from here)
    Conv2dSubsampling, FeedForward, MultiHeadAttention, ResidualLayer, check_stack, sinusoidal_positions,
)
from asr.models.common import add_sos_eos, lengths_to_mask
from asr.models.ctc import CTCHead
from asr.models.encoders import EncoderConfig, TransformerEncoderConfig, build_encoder
from asr.models.interface import EncoderOutput, LayerStack, ModelConfig, ModelOutput, reorder_nested
from asr.models.joint import check_special_ids, ctc_only_output, joint_output
from asr.models.norms import NORM_TYPES, FixNorm, make_norm


@dataclass
class DecoderConfig:
    """The text stack (``model.decoder``)."""

    num_layers: int = 6            # half the encoder depth: the text side is short and easy
    ff_dim: int = 2048             # feed-forward inner size
    layer_norm: Literal["pre", "post"] = "pre"  # as the encoder's (model.encoder.layer_norm)
    layerdrop: float = 0.0         # as the encoder's
    drophead: float = 0.0          # the same for the decoder's self- and cross-attention heads

    def __post_init__(self) -> None:
        check_stack(self, "decoder")


@dataclass
class TransformerConfig(ModelConfig):
    """A Transformer recogniser (``model:`` with ``type: transformer``; ``ctc_weight`` and
    ``label_smoothing``: :class:`ModelConfig`, on the attention cross-entropy as in Vaswani et al.)."""

    type: Literal["transformer"] = "transformer"
    d_model: int = 256             # width of both stacks; cross-attention needs them equal
    heads: int = 4                 # 64 dimensions per head at d_model 256, as in the base Transformer
    dropout: float = 0.1           # residual dropout on every sublayer output and on the input sums (Vaswani et al.)
    attention_dropout: float = 0.0 # dropout on attention weights; ESPnet's Transformer recipes leave it off
    norm_type: Literal["layernorm", "scalenorm", "rmsnorm"] = "layernorm"  # every sublayer/final norm of both stacks
    # l2-normalise the token embedding rows (FixNorm); with tie_embeddings the output
    # projection uses the same normalised rows. Pairs naturally with scalenorm.
    fixnorm: bool = False
    scale_embedding: bool = True   # token embedding * sqrt(d_model), so it is not drowned by the positions
    tie_embeddings: bool = True    # output projection = decoder input embedding (one Parameter)
    eps: float = 1e-5              # added inside every LayerNorm / lower bound of the ScaleNorm/FixNorm length
    # How the DropHead rate moves: any schedule shape with a scale (asr.training.shapes, one registered from
    # outside too) at its default options, scaled by each stack's drophead. "vshape" (the paper's) falls from the
    # peak to 0 over the learning-rate warmup and rises back to the peak by the last update; "constant" keeps the
    # peak. A shape with options of its own: train.schedules.drophead_encoder (or _decoder), which replaces this.
    drophead_schedule: str = "vshape"
    encoder: EncoderConfig = field(default_factory=TransformerEncoderConfig)  # the config class its kind names
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    # Which backends scaled_dot_product_attention may use (asr/models/sdpa.py): auto leaves cuDNN out on CUDA,
    # whose attention builds a plan for every new shape, unless an epoch's batch shapes are few; a name pins one
    sdpa_backend: Literal["auto", "flash", "efficient", "math", "cudnn"] = "auto"

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
        self.encoder.check_model(self)

    def schedule_shapes(self) -> dict[str, str]:
        """Keys of this config that name a schedule shape with a scale (:mod:`asr.training.shapes`), which
        the recipe's reader checks: a model does not import training."""
        return {"drophead_schedule": self.drophead_schedule}


class DecoderLayer(ResidualLayer):
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
        check_special_ids(vocab_size, pad_id, sos_id, eos_id)
        self.config = config
        self.vocab_size = vocab_size
        self.pad_id, self.sos_id, self.eos_id = pad_id, sos_id, eos_id
        self.encoder = build_encoder(config, input_dim)
        self.decoder = TransformerDecoder(config, vocab_size)
        self.ctc = CTCHead(config.d_model, vocab_size, blank_id=pad_id) if config.ctc_weight > 0 else None
        self.ctc_weight = config.ctc_weight            # a schedule may move these (asr.training.schedules)
        self.label_smoothing = config.label_smoothing
        self.batch_shapes: int | None = None           # an epoch's distinct batch shapes, when the trainer knows them

    @property
    def has_ctc(self) -> bool:
        return self.ctc is not None

    def sdpa_backends(self, device_type: str) -> tuple[str, ...] | None:
        """The SDPA backends this model's attention may use on ``device_type`` (None: PyTorch's choice)."""
        return sdpa.allowed_backends(self.config.sdpa_backend, device_type, self.batch_shapes)

    @property
    def ctc_only(self) -> bool:
        """A ``train.schedules.ctc_weight`` phase at 1.0 trains the encoder and its CTC head alone: the
        decoder is not run, and decoding takes the CTC head's best path until the schedule lowers it."""
        return self.ctc is not None and self.ctc_weight >= 1.0

    def scheduled(self) -> dict[str, float]:
        offered = {"label_smoothing": self.config.label_smoothing}
        if self.ctc is not None:
            offered["ctc_weight"] = self.config.ctc_weight
        offered["drophead_encoder"] = self.config.encoder.drophead
        offered["drophead_decoder"] = self.config.decoder.drophead
        return offered

    def set_scheduled(self, name: str, value: float) -> None:
        if name not in self.scheduled():
            raise KeyError(f"the Transformer has no scheduled setting {name!r}")
        if name.startswith("drophead_"):  # the rate of every attention in that stack
            stack = self.encoder if name == "drophead_encoder" else self.decoder
            for module in stack.modules():
                if isinstance(module, MultiHeadAttention):
                    module.drophead = value
        else:
            setattr(self, name, value)

    def default_schedules(self) -> dict[str, dict]:
        """``model.drophead_schedule``'s shape, scaled by the peak, for each stack with DropHead (plain data,
        as ``train.schedules`` takes it; a recipe's own ``train.schedules.drophead_*`` replaces it)."""
        return {f"drophead_{name}": {"shape": self.config.drophead_schedule, "scale": stack.drophead}
                for name, stack in (("encoder", self.config.encoder), ("decoder", self.config.decoder))
                if stack.drophead > 0.0}

    # Optional capability (asr.models.interface): LayerDrop pruning.

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

    @sdpa.pinned
    def encode(self, features: Tensor, feature_lengths: Tensor) -> EncoderOutput:
        """features (B, T, F), feature_lengths (B,) -> EncoderOutput with T' = T/4 frames."""
        out, mask, lengths = self.encoder(features, feature_lengths)
        ctc_log_probs = self.ctc(out) if self.ctc is not None else None
        return EncoderOutput(out=out, mask=mask, lengths=lengths, ctc_log_probs=ctc_log_probs)

    @sdpa.pinned
    def decoder_log_probs(self, encoder: EncoderOutput, decoder_input: Tensor, decoder_lengths: Tensor) -> Tensor:
        """Teacher-forced log-probabilities (B, L, V) for decoder_input (B, L) with valid lengths (B,)."""
        token_mask = lengths_to_mask(decoder_lengths, decoder_input.shape[1])
        logits = self.decoder(decoder_input, token_mask, encoder.out, encoder.mask)
        return F.log_softmax(logits, dim=-1)

    @sdpa.pinned
    def forward(self, features: Tensor, feature_lengths: Tensor, tokens: Tensor, token_lengths: Tensor) -> ModelOutput:
        """Loss of one batch; see ``asr.models.interface`` for the shapes.

        The joint CTC-attention loss every model shares (:mod:`asr.models.joint`), both terms per
        target token (``<eos>`` included), so batches of different sizes add up correctly.
        """
        encoder = self.encode(features, feature_lengths)
        token_lengths = token_lengths.to(tokens.device)
        if self.ctc_only:
            return ctc_only_output(tokens, token_lengths, encoder, self.ctc)
        decoder_input, target = add_sos_eos(tokens, token_lengths, self.sos_id, self.eos_id, self.pad_id)
        log_probs = self.decoder_log_probs(encoder, decoder_input, token_lengths + 1)  # <sos> + tokens
        return joint_output(log_probs, target, tokens, token_lengths, encoder, self.ctc, self.ctc_weight,
                            self.label_smoothing)

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

    @sdpa.pinned
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

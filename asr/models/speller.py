"""The speller: LAS's attention decoder (Chan et al. 2016, sec. 3.2).

At output step i, with ``y_{i-1}`` the previous token and ``c_{i-1}`` the
previous context::

    s_i          = LSTM-stack([embed(y_{i-1}); c_{i-1}], s_{i-1})
    c_i, alpha_i = Attend(s_i, listener states)
    P(y_i)       = softmax(W [s_i; c_i] + b)

as in the paper, with the paper's "MLP" output made one linear layer on
``[s_i; c_i]`` (as ESPnet's RNN decoder does). ``s_i`` is the top cell's h
(after dropout in training). The first step sees ``<sos>``, a zero context and
zero LSTM states.

Training is teacher forcing with optional scheduled sampling (Bengio et al.
2015; LAS samples 10%): in training mode, each input token after ``<sos>`` is
replaced with probability ``sampling_probability`` by a token sampled from the
model's own previous output distribution. A schedule (``train.schedules``,
:mod:`asr.training.schedules`) may change ``speller.sampling_probability`` at any update.

Attention prior. While ``attention_prior`` is above 0 (only ever set by a schedule), teacher
forcing in training adds a soft diagonal prior to the attention energies, as wav2letter's
SoftPretrainWindow does for its first epochs: at output step i of the U + 1 steps (tokens and
``<eos>``) of an utterance of T' encoder frames, frame t gets ``-s (t - c_i)^2 / (2 w^2)`` with
``c_i = (i + 1/2) T' / (U + 1)`` the diagonal, ``w = prior_width * T' / (U + 1)`` (the attention
config's width, in frames per output step) and ``s`` the strength. It pulls a fresh attention towards
the diagonal until the listener and speller can find it themselves; decoding never uses it (U is
unknown there), so the schedule should take it to 0.

Context-free loss. :meth:`Speller.forward` with ``without_context=True`` replaces every attention
context with zeros (the LSTM input and the output layer see none): the loss of the speller as a pure
language model of its own history, a diagnostic (``valid_loss_without_context``).

The teacher-forced :meth:`Speller.forward` runs the very :meth:`Speller.step`
that decoding uses, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from asr.models import speller_graphs
from asr.models.attention import ATTENTION_TYPES, AttentionConfig
from asr.models.interface import STATIC_STATE_KEY
from asr.models.lnlstm import LNLSTMCell, LNLSTMOptions


@dataclass
class SpellerConfig:
    """The ``model.speller`` section of an LAS recipe."""

    embedding_dim: int = 256           # token embedding; characters need far less, BPE a little more
    hidden_size: int = 512             # LAS: 2 x 512
    num_layers: int = 2                # LSTM layers; LAS: 2
    dropout: float = 0.0               # on every cell's output (incl. the top, before the output layer), training only
    sampling_probability: float = 0.0  # scheduled sampling; 0 = pure teacher forcing, LAS used 0.1

    def __post_init__(self) -> None:
        for name in ("embedding_dim", "hidden_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 <= self.sampling_probability <= 1.0:
            raise ValueError(f"sampling_probability must be in [0, 1], got {self.sampling_probability}")


class Speller(nn.Module):
    """Attention decoder of LAS.

    Args:
        config: sizes, dropout, scheduled sampling.
        attention: the attention's config; its ``type`` picks the class (``ATTENTION_TYPES``,
            :mod:`asr.models.attention`), which the speller sees only through
            :class:`~asr.models.attention_interface.LASAttention`.
        vocab_size: V (characters or word pieces: only the size matters).
        context_dim: H, size of a listener state (the keys and the context).
        lstm: the cells' :class:`~asr.models.lnlstm.LNLSTMOptions` (LN-LSTM or plain LSTM cells, variant,
            backend, ...), handed to every :class:`LNLSTMCell` whole.
        pad_id: embedding row kept at zero (padded decoder inputs).
        cuda_graphs: on CUDA, replay the loop as recorded CUDA graphs (:mod:`asr.models.speller_graphs`).
        cuda_graphs_memory: the share of the GPU's memory those recordings may hold.

    The decoding state is a dict of tensors whose first dimension is the
    hypothesis (so :func:`asr.models.interface.reorder_nested` reorders it):
    ``h``, ``c``: lists of (N, hidden) per layer; ``context`` (N, H); the
    attention's entries (:meth:`LASAttention.initial_state`): ``weights`` (N, heads, T)
    the previous attention (read by location-aware attention) and the type's own (with a
    window, ``focus`` (N,) the frame the window is centred on; with MoChA,
    ``monotonic`` (N, T) the previous step's stop distribution); and under ``"static"``
    (:data:`asr.models.interface.STATIC_STATE_KEY`) what depends only on the
    utterance and is computed once: ``keys`` (N, T, H), ``mask`` (N, T) and the
    attention's (:meth:`LASAttention.static_state`: ``projected_keys`` (N, heads, T, dim)
    for the types of :mod:`asr.models.attention` and MoChA). Beam search never reorders the
    static part among an utterance's hypotheses (they share it), which saves
    copying (N, T, ...) tensors at every step.
    """

    def __init__(
        self,
        config: SpellerConfig,
        attention: AttentionConfig,
        vocab_size: int,
        context_dim: int,
        lstm: LNLSTMOptions = LNLSTMOptions(),
        pad_id: int = 0,
        cuda_graphs: bool = True,
        cuda_graphs_memory: float = 0.25,
    ) -> None:
        super().__init__()
        self.config = config
        self.cuda_graphs = bool(cuda_graphs)
        self.cuda_graphs_memory = float(cuda_graphs_memory)
        self.vocab_size = vocab_size
        self.sampling_probability = config.sampling_probability
        self.attention_prior = 0.0  # strength of the soft diagonal prior in training (module docstring)
        self.prior_width = attention.prior_width
        self.embedding = nn.Embedding(vocab_size, config.embedding_dim, padding_idx=pad_id)
        self.cells = nn.ModuleList(
            LNLSTMCell((config.embedding_dim + context_dim) if layer == 0 else config.hidden_size, config.hidden_size,
                       lstm)
            for layer in range(config.num_layers)
        )
        self.attention = ATTENTION_TYPES[attention.type](attention, config.hidden_size, context_dim)
        self.dropout = nn.Dropout(config.dropout)
        self.output = nn.Linear(config.hidden_size + context_dim, vocab_size)

    def init_state(self, keys: torch.Tensor, mask: torch.Tensor) -> dict:
        """State before the first step: keys (N, T, H) listener output, mask (N, T) True = valid."""
        num = keys.size(0)
        zeros = keys.new_zeros(num, self.config.hidden_size)
        return {
            "h": [zeros] * self.config.num_layers,
            "c": [zeros] * self.config.num_layers,
            "context": keys.new_zeros(num, keys.size(2)),
            **self.attention.initial_state(keys, mask),
            STATIC_STATE_KEY: {"keys": keys, "mask": mask, **self.attention.static_state(keys, mask)},
        }

    def step(self, tokens: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One output step: tokens (N,) previous tokens -> log-probs (N, V) and the new state.

        In inference on CUDA (greedy and beam search) the step runs as a recorded CUDA
        graph (:func:`asr.models.speller_graphs.decoding_step`); elsewhere :meth:`eager_step`.
        """
        if speller_graphs.decoding_applies(self, state):
            return speller_graphs.decoding_step(self, tokens, state)
        return self.eager_step(tokens, state)

    def eager_step(
        self, tokens: torch.Tensor, state: dict, energy_bias: torch.Tensor | None = None, without_context: bool = False
    ) -> tuple[torch.Tensor, dict]:
        """:meth:`step`, run op by op. ``energy_bias`` (N, T) is added to the attention energies (the
        prior); ``without_context`` zeroes the context wherever the speller reads it."""
        context = state["context"]
        if without_context:
            context = torch.zeros_like(context)
        x = torch.cat([self.embedding(tokens), context], dim=-1)
        new_h, new_c = [], []
        for cell, h, c in zip(self.cells, state["h"], state["c"]):
            h, c = cell(x, (h, c))
            new_h.append(h)
            new_c.append(c)
            x = self.dropout(h)
        context, weights, attended = self.attention.step(x, state, energy_bias)
        read = torch.zeros_like(context) if without_context else context
        log_probs = F.log_softmax(self.output(torch.cat([x, read], dim=-1)), dim=-1)
        return log_probs, dict(state, h=new_h, c=new_c, context=context, weights=weights, **attended)

    def forward(
        self, decoder_input: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor,
        target_lengths: torch.Tensor | None = None, without_context: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing over a whole batch.

        decoder_input: (B, L) ``<sos> y_1 .. y_n <pad>..``; keys (B, T, H); mask (B, T);
        target_lengths (B,): output steps per utterance (tokens + ``<eos>``), which the attention
        prior needs (module docstring); without_context: the context-free diagnostic.
        Returns log-probs (B, L, V) and attention weights (B, L, T) averaged
        over heads (exactly 0 on padded frames).

        In training on CUDA the loop runs as recorded CUDA graphs
        (:mod:`asr.models.speller_graphs`) unless the prior is on; elsewhere :meth:`teacher_forced` runs it.
        """
        prior = self.prior_active(target_lengths)
        if not prior and not without_context and speller_graphs.teacher_forcing_applies(self, keys):
            return speller_graphs.teacher_forced(self, decoder_input, keys, mask)
        return self.teacher_forced(decoder_input, keys, mask, target_lengths if prior else None, without_context)

    def prior_active(self, target_lengths: torch.Tensor | None) -> bool:
        return self.training and self.attention_prior > 0.0 and target_lengths is not None

    def prior_energies(self, step: int, mask: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
        """(B, T) the prior's energies at output ``step`` (module docstring)."""
        frames = mask.sum(1, keepdim=True).to(torch.float32)                    # (B, 1) T'
        per_step = frames / target_lengths.to(frames.device, torch.float32).clamp(min=1).unsqueeze(1)
        centre = (step + 0.5) * per_step
        width = (self.prior_width * per_step).clamp(min=1.0)
        t = torch.arange(mask.size(1), device=mask.device, dtype=torch.float32).unsqueeze(0)
        return -self.attention_prior * (t - centre).pow(2) / (2.0 * width.pow(2))

    def teacher_forced(
        self, decoder_input: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor,
        target_lengths: torch.Tensor | None = None, without_context: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`'s loop over output steps, run eagerly: :meth:`eager_step` per step (:meth:`step`
        when neither the prior nor the context-free diagnostic is asked for)."""
        state = self.init_state(keys, mask)
        if torch.is_grad_enabled():
            # e.g. the fused attention step's sum of the keys' gradients over the loop (attention_fused.Accumulator)
            state[STATIC_STATE_KEY].update(self.attention.teacher_forcing_state())
        sample = self.training and self.sampling_probability > 0.0
        plain = target_lengths is None and not without_context
        log_probs, weights = [], []
        tokens = decoder_input[:, 0]
        for i in range(decoder_input.size(1)):
            if i > 0:
                tokens = decoder_input[:, i]
                if sample:
                    drawn = torch.multinomial(log_probs[-1].detach().exp(), 1).squeeze(1)
                    use_model = torch.rand(tokens.shape, device=tokens.device) < self.sampling_probability
                    tokens = torch.where(use_model, drawn, tokens)
            if plain:
                step_log_probs, state = self.step(tokens, state)
            else:
                bias = None if target_lengths is None else self.prior_energies(i, mask, target_lengths).to(keys.dtype)
                step_log_probs, state = self.eager_step(tokens, state, bias, without_context)
            log_probs.append(step_log_probs)
            weights.append(state["weights"].mean(1))
        return torch.stack(log_probs, 1), torch.stack(weights, 1)

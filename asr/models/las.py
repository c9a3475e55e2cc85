"""Listen, Attend and Spell (Chan et al. 2016) with layer-normalised LSTMs and an
optional CTC head (joint CTC-attention, Kim, Hori & Watanabe 2017).

features (B, T, D) -> :class:`~asr.models.listener.Listener` (BLSTM stack with
time reduction) -> encoder states (B, T', 2H) -> :class:`~asr.models.speller.Speller`
(LSTM cells + attention) -> log-probs (B, L+1, V); optionally
:class:`~asr.models.ctc.CTCHead` on the encoder states.

Where layer normalisation goes is one config value, ``layer_norm``:
``both`` (listener LSTMs and speller cells are LN-LSTMs), ``listener``,
``speller`` or ``none`` (plain LSTMs everywhere). It only switches the LSTMs'
internal norms (see :mod:`asr.models.lnlstm`); nothing else in the model is
normalised. Which LN-LSTM cell that is, is ``lnlstm_variant``: ``ba2016``
(the default), ``tf_contrib`` or ``raw_gates``
(:mod:`asr.models.lnlstm.variants`), the same in the listener and the speller.

The loss is the joint CTC-attention loss every model shares, both terms per target token
(:mod:`asr.models.joint`): ``loss = (1 - ctc_weight) * attention_loss + ctc_weight * ctc_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from torch import nn

from asr.models.attention import AttentionConfig
from asr.models.common import add_sos_eos, lengths_to_mask
from asr.models.ctc import CTCHead
from asr.models.interface import EncoderOutput, ModelConfig, ModelOutput, reorder_nested
from asr.models.joint import attention_loss, check_special_ids, ctc_only_output, joint_output
from asr.models.listener import Listener, ListenerConfig
from asr.models.lnlstm import BUILDS, VARIANTS, LNLSTMOptions, check_backend
from asr.models.speller import Speller, SpellerConfig

LAYER_NORM_PLACES = ("both", "listener", "speller", "none")


@dataclass
class LASConfig(ModelConfig):
    """The ``model:`` section of an LAS recipe (``ctc_weight`` and ``label_smoothing``: :class:`ModelConfig`)."""

    type: Literal["las"] = "las"
    ctc_only_allowed = True  # ctc_weight 1.0: the listener and its CTC head alone (ModelConfig)
    listener: ListenerConfig = field(default_factory=ListenerConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    speller: SpellerConfig = field(default_factory=SpellerConfig)
    # Which LSTMs are layer-normalised: both | listener | speller | none.
    layer_norm: Literal["both", "listener", "speller", "none"] = "both"
    # Which LN-LSTM cell (asr/models/lnlstm/variants.py): ba2016 (Ba et al. 2016: LN over the
    # 4H gate vectors, un-normalised cell carried), tf_contrib (TensorFlow's LayerNormBasicLSTMCell)
    # or raw_gates (LN without gain or bias on the gates). Fused kernels: ba2016 on C++ and Triton,
    # tf_contrib on C++ only, raw_gates none (the reference path).
    lnlstm_variant: Literal["ba2016", "tf_contrib", "raw_gates"] = "ba2016"
    lnlstm_eps: float | None = None  # epsilon of every layer norm inside the LN-LSTMs; None: the variant's own
    # The initial gain of ba2016's norm of the recurrent term W_h h (LN_h); null: 1, as published. At 1 that
    # norm undoes the LSTM's small recurrent initialisation and the listener's first gradients explode; a
    # gain near the spread of W_h h at initialisation does not (docs/studies/ln_open_vocabulary.md).
    lnlstm_recurrent_gain: float | None = None
    forget_bias: float = 1.0       # added to every LSTM's forget gate, so fresh cells remember (Jozefowicz et al. 2015)
    # Which code computes the LSTMs (asr/models/lnlstm/selection.py): auto (fused C++ on CPU, Triton
    # on CUDA, each where it builds and supports the variant and dtype; else the reference loop),
    # reference, cpp or triton (named: raise where it cannot run). The run records what ran.
    lnlstm_backend: Literal["auto", "reference", "cpp", "triton"] = "auto"
    # How the C++ backend builds its operator (asr/models/lnlstm/backends/cpp.py): native (-march=native, every
    # vector extension of this CPU) or portable (what a CPU without them gets, e.g. no AVX-512: for measuring
    # that). The run records the flags it was built with.
    lnlstm_build: Literal["native", "portable"] = "native"
    # The first time a fused backend computes a kind of call on a device it is checked against the
    # reference path there (asr/models/lnlstm/selfcheck.py): fallback (a failure warns and runs the
    # reference path; the run records it), strict (a failure is an error) or off.
    lnlstm_check: Literal["fallback", "strict", "off"] = "fallback"
    # Replay the LSTMs' and the speller's loops on CUDA as recorded CUDA graphs (fewer launches);
    # false runs them eagerly (profiling, debugging). The speller's recordings keep their shapes'
    # activations, so they may hold at most speller_cuda_graphs_memory of the GPU's memory.
    lnlstm_cuda_graphs: bool = True
    speller_cuda_graphs: bool = True
    speller_cuda_graphs_memory: float = 0.25

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.type != "las":
            raise ValueError(f"type must be 'las', got {self.type!r}")
        if self.layer_norm not in LAYER_NORM_PLACES:
            raise ValueError(f"layer_norm must be one of {', '.join(LAYER_NORM_PLACES)}, got {self.layer_norm!r}")
        if self.lnlstm_variant not in VARIANTS:
            raise ValueError(f"lnlstm_variant must be one of {', '.join(VARIANTS)}, got {self.lnlstm_variant!r}")
        if self.lnlstm_eps is not None and self.lnlstm_eps <= 0.0:
            raise ValueError(f"lnlstm_eps must be positive, got {self.lnlstm_eps}")
        if self.lnlstm_recurrent_gain is not None:
            if self.lnlstm_recurrent_gain <= 0.0:
                raise ValueError(f"lnlstm_recurrent_gain must be positive, got {self.lnlstm_recurrent_gain}")
            if self.lnlstm_variant != "ba2016":
                raise ValueError(f"lnlstm_recurrent_gain: only the ba2016 cell normalises W_h h alone with a gain, "
                                 f"not {self.lnlstm_variant} (with it, set lnlstm_recurrent_gain to null)")
        check_backend(self.lnlstm_backend, where="lnlstm_backend")
        if self.lnlstm_build not in BUILDS:
            raise ValueError(f"lnlstm_build must be one of {', '.join(BUILDS)}, got {self.lnlstm_build!r}")
        if not 0.0 < self.speller_cuda_graphs_memory <= 1.0:
            raise ValueError(f"speller_cuda_graphs_memory must be in (0, 1], got {self.speller_cuda_graphs_memory}")

    def lnlstm_options(self) -> LNLSTMOptions:
        """The LN-LSTMs' options of this recipe in one object, which the model hands down whole (the
        listener's and the speller's layer norm set from ``layer_norm`` where each is built)."""
        return LNLSTMOptions(variant=self.lnlstm_variant, eps=self.lnlstm_eps, forget_bias=self.forget_bias,
                             backend=self.lnlstm_backend, build=self.lnlstm_build, check=self.lnlstm_check,
                             cuda_graphs=self.lnlstm_cuda_graphs, recurrent_gain=self.lnlstm_recurrent_gain)


class LAS(nn.Module):
    """Listen, Attend and Spell; implements :mod:`asr.models.interface`.

    Args:
        config: the model section of the recipe.
        input_dim: D, size of a feature frame.
        vocab_size: V, incl. the special tokens.
        pad_id, sos_id, eos_id: the tokenizer's special ids; the CTC blank is pad_id.
    """

    # Gradient norms are logged per group (asr.training.step.gradient_groups): listener,
    # speller and ctc by their modules, and the attention apart from the speller's LSTMs.
    gradient_groups = {"speller.attention.": "attention"}

    def __init__(
        self, config: LASConfig, input_dim: int, vocab_size: int, pad_id: int = 0, sos_id: int = 1, eos_id: int = 2
    ) -> None:
        super().__init__()
        check_special_ids(vocab_size, pad_id, sos_id, eos_id)
        self.config = config
        self.pad_id, self.sos_id, self.eos_id = pad_id, sos_id, eos_id
        self.vocab_size = vocab_size
        self.ctc_weight = config.ctc_weight
        self.label_smoothing = config.label_smoothing
        lstm = config.lnlstm_options()
        self.listener = Listener(
            config.listener, input_dim, replace(lstm, layer_norm=config.layer_norm in ("both", "listener"))
        )
        self.speller = Speller(
            config.speller,
            config.attention,
            vocab_size,
            self.listener.output_dim,
            replace(lstm, layer_norm=config.layer_norm in ("both", "speller")),
            pad_id=pad_id,
            cuda_graphs=config.speller_cuda_graphs,
            cuda_graphs_memory=config.speller_cuda_graphs_memory,
        )
        if config.ctc_weight > 0:
            self.ctc = CTCHead(self.listener.output_dim, vocab_size, blank_id=pad_id)
        else:
            self.register_module("ctc", None)

    @property
    def has_ctc(self) -> bool:
        return self.ctc is not None

    @property
    def ctc_only(self) -> bool:
        """The CTC weight is 1.0, in the recipe (``model.ctc_weight: 1.0``: a CTC-only model) or for now (a
        ``train.schedules.ctc_weight`` phase that trains the listener alone): the speller is not run, and
        decoding takes the CTC head's best path."""
        return self.ctc is not None and self.ctc_weight >= 1.0

    def encode(self, features: torch.Tensor, feature_lengths: torch.Tensor) -> EncoderOutput:
        """features (B, T, D), feature_lengths (B,) -> :class:`EncoderOutput` with
        out (B, T', 2H), T' = ceil(T / listener reduction)."""
        out, lengths = self.listener(features, feature_lengths)
        mask = lengths_to_mask(lengths, out.size(1))
        ctc_log_probs = self.ctc(out) if self.ctc is not None else None
        return EncoderOutput(out=out, mask=mask, lengths=lengths, ctc_log_probs=ctc_log_probs)

    def forward(
        self,
        features: torch.Tensor,
        feature_lengths: torch.Tensor,
        tokens: torch.Tensor,
        token_lengths: torch.Tensor,
    ) -> ModelOutput:
        """features (B, T, D), feature_lengths (B,), tokens (B, L) padded with pad_id
        (no ``<sos>``/``<eos>``), token_lengths (B,) -> losses (see the module docstring)."""
        encoder = self.encode(features, feature_lengths)
        token_lengths = token_lengths.to(tokens.device)
        if self.ctc_only:
            return ctc_only_output(tokens, token_lengths, encoder, self.ctc)
        decoder_input, target = add_sos_eos(tokens, token_lengths, self.sos_id, self.eos_id, self.pad_id)
        log_probs, weights = self.speller(decoder_input, encoder.out, encoder.mask, target_lengths=token_lengths + 1)
        return joint_output(log_probs, target, tokens, token_lengths, encoder, self.ctc, self.ctc_weight,
                            self.label_smoothing, weights)

    def loss_without_context(
        self, encoder: EncoderOutput, tokens: torch.Tensor, token_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, int]:
        """The attention loss (per token, without label smoothing) of the speller with every attention
        context replaced by zeros, and the token count: how well it predicts from its own history alone.
        Beside the real attention loss it shows a speller that has become a language model."""
        token_lengths = token_lengths.to(tokens.device)
        decoder_input, target = add_sos_eos(tokens, token_lengths, self.sos_id, self.eos_id, self.pad_id)
        log_probs, _ = self.speller(decoder_input, encoder.out, encoder.mask, without_context=True)
        return attention_loss(log_probs, target, token_lengths, 0.0)

    # Settings a schedule may move (asr.training.schedules); the CTC weight only with a CTC head.

    def scheduled(self) -> dict[str, float]:
        offered = {"label_smoothing": self.config.label_smoothing,
                   "sampling_probability": self.config.speller.sampling_probability,
                   "attention_prior": 0.0,
                   "listener_layers": float(self.config.listener.num_layers)}
        if self.ctc is not None and self.config.ctc_weight < 1.0:
            offered["ctc_weight"] = self.config.ctc_weight
        return offered

    def set_scheduled(self, name: str, value: float) -> None:
        if name == "ctc_weight" and self.ctc is not None and self.config.ctc_weight < 1.0:
            self.ctc_weight = value  # 1.0: the speller rests (ctc_only) until the schedule lowers it
        elif name == "label_smoothing":
            self.label_smoothing = value
        elif name == "sampling_probability":
            self.speller.sampling_probability = value
        elif name == "attention_prior":
            self.speller.attention_prior = value
        elif name == "listener_layers":
            self.listener.set_active_layers(min(max(int(round(value)), 1), self.config.listener.num_layers))
        else:
            raise KeyError(f"LAS has no scheduled setting {name!r}")

    def init_decoder_state(self, encoder: EncoderOutput) -> dict:
        """Speller state for ``encoder``'s N rows (see :class:`Speller` for its fields)."""
        return self.speller.init_state(encoder.out, encoder.mask)

    def decode_step(
        self, tokens: torch.Tensor, state: dict, encoder: EncoderOutput
    ) -> tuple[torch.Tensor, dict]:
        """tokens (N,) last token per hypothesis -> log-probs (N, V) and the next state.

        The listener states travel inside ``state`` (its static part, see
        :class:`Speller`), so ``encoder`` is not read again here.
        """
        return self.speller.step(tokens, state)

    def decoder_attention(self, state: dict) -> torch.Tensor:
        """(N, T') the speller's attention at the step that made ``state``, averaged over heads."""
        return state["weights"].mean(1)

    def reorder_decoder_state(self, state: dict, index: torch.Tensor) -> dict:
        """Rows ``index`` (N',) of every tensor in ``state``, its static part included when present."""
        return reorder_nested(state, index)

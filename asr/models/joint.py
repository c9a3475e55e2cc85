"""The joint CTC-attention loss (Kim, Hori & Watanabe 2017) and the special-id checks, in one place
for every model: LAS and the encoder-decoder model, whichever encoder it has.

Both terms are **per target token**. The attention term is the label-smoothed cross-entropy summed
over the target tokens (``<eos>`` included, padding excluded), the CTC term the CTC negative
log-likelihood summed over the utterances; each is divided by the batch's number of target tokens
incl. ``<eos>`` (``ModelOutput.num_tokens``). So the two are on one scale, the weight means what it
says, and ``loss * num_tokens`` adds up across batches::

    loss = (1 - ctc_weight) * attention_loss + ctc_weight * ctc_loss

Label smoothing is torch's (``F.cross_entropy(label_smoothing=e)``): ``(1 - e) * NLL + e * mean over
the vocabulary of -log p``. Both terms are computed in float32 whatever the model computed in (a
bfloat16 sum over thousands of tokens loses digits).
"""

from __future__ import annotations

from torch import Tensor

from asr.models.common import lengths_to_mask
from asr.models.interface import EncoderOutput, ModelOutput


def check_special_ids(vocab_size: int, pad_id: int, sos_id: int, eos_id: int) -> None:
    """Raise ValueError unless the three special ids are distinct and inside the vocabulary."""
    ids = {"pad_id": pad_id, "sos_id": sos_id, "eos_id": eos_id}
    bad = [f"{name}={value}" for name, value in ids.items() if not 0 <= value < vocab_size]
    if bad:
        raise ValueError(f"special ids {', '.join(bad)} out of range for vocab_size {vocab_size}")
    if len(set(ids.values())) != 3:
        raise ValueError(f"pad_id, sos_id and eos_id must differ, got {ids}")


def attention_loss(log_probs: Tensor, target: Tensor, token_lengths: Tensor, label_smoothing: float) -> tuple[Tensor, int]:
    """Label-smoothed cross-entropy per target token, and the token count.

    log_probs (B, L+1, V) of the decoder, teacher-forced; target (B, L+1) = ``y_1 .. y_n <eos>`` then
    padding (:func:`asr.models.common.add_sos_eos`); token_lengths (B,) without ``<eos>``."""
    valid = lengths_to_mask(token_lengths + 1, target.size(1))
    num_tokens = int(valid.sum())
    log_probs = log_probs.float()
    nll = -log_probs.gather(2, target.unsqueeze(-1)).squeeze(-1)
    per_token = nll if label_smoothing == 0.0 else (1.0 - label_smoothing) * nll - label_smoothing * log_probs.mean(-1)
    return per_token.masked_fill(~valid, 0.0).sum() / max(num_tokens, 1), num_tokens


def ctc_loss(head, encoder: EncoderOutput, tokens: Tensor, token_lengths: Tensor, num_tokens: int) -> Tensor:
    """The CTC head's summed negative log-likelihood divided by ``num_tokens`` (float32)."""
    return head.loss(encoder.ctc_log_probs.float(), encoder.lengths, tokens, token_lengths) / max(num_tokens, 1)


def joint_output(
    log_probs: Tensor,
    target: Tensor,
    tokens: Tensor,
    token_lengths: Tensor,
    encoder: EncoderOutput,
    ctc_head,
    ctc_weight: float,
    label_smoothing: float,
    attention_weights: Tensor | None = None,
) -> ModelOutput:
    """The model's :class:`ModelOutput` from its decoder's teacher-forced ``log_probs`` and its encoder
    output: the attention term, and the CTC term when the model has a CTC head (``ctc_head`` not None)."""
    attention, num_tokens = attention_loss(log_probs, target, token_lengths, label_smoothing)
    if ctc_head is None:
        return ModelOutput(attention, attention, None, num_tokens, attention_weights, encoder)
    ctc = ctc_loss(ctc_head, encoder, tokens, token_lengths, num_tokens)
    loss = (1.0 - ctc_weight) * attention + ctc_weight * ctc
    return ModelOutput(loss, attention, ctc, num_tokens, attention_weights, encoder)


def ctc_only_output(tokens: Tensor, token_lengths: Tensor, encoder: EncoderOutput, ctc_head) -> ModelOutput:
    """The :class:`ModelOutput` of a CTC-only model (``ctc_weight`` 1.0: no decoder is run)."""
    num_tokens = int((token_lengths + 1).sum())
    ctc = ctc_loss(ctc_head, encoder, tokens, token_lengths, num_tokens)
    return ModelOutput(ctc, None, ctc, num_tokens, None, encoder)


__all__ = ["attention_loss", "check_special_ids", "ctc_loss", "ctc_only_output", "joint_output"]

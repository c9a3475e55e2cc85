"""Scores of given outputs, and the CTC head's own best path: second opinions on a search."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from asr.models.interface import EncoderOutput


@torch.no_grad()
def sequence_log_probs(
    model, encoder: EncoderOutput, hypotheses: list[list[int]], ctc_weight: float = 0.0
) -> torch.Tensor:
    """Score given outputs the way beam search does: (B,) summed
    ``(1 - ctc_weight) * log p_att + ctc_weight * log p_ctc`` of each token list
    followed by ``<eos>`` (log p_ctc of the whole sequence). For rescoring and
    for checking a search against the model."""
    sos, eos, pad = model.sos_id, model.eos_id, model.pad_id
    batch = len(hypotheses)
    device = encoder.out.device
    lengths = torch.tensor([len(h) for h in hypotheses], dtype=torch.long)
    steps = int(lengths.max()) + 1 if batch else 0
    targets = torch.full((batch, steps), eos, dtype=torch.long)
    for b, hyp in enumerate(hypotheses):
        targets[b, : len(hyp)] = torch.tensor(hyp, dtype=torch.long)
    targets = targets.to(device)
    valid = (torch.arange(steps).unsqueeze(0) <= lengths.unsqueeze(1)).to(device)
    state = model.init_decoder_state(encoder)
    tokens = torch.full((batch,), sos, dtype=torch.long, device=device)
    total = torch.zeros(batch, device=device)
    for t in range(steps):
        log_probs, state = model.decode_step(tokens, state, encoder)
        picked = log_probs.float().gather(1, targets[:, t : t + 1]).squeeze(1)
        total = total + torch.where(valid[:, t], picked, torch.zeros_like(picked))
        tokens = targets[:, t]
    if ctc_weight > 0:
        if encoder.ctc_log_probs is None:
            raise ValueError("ctc_weight > 0 needs a model with a CTC head (encoder.ctc_log_probs is None)")
        ctc = -F.ctc_loss(
            encoder.ctc_log_probs.float().transpose(0, 1),
            targets[:, : max(steps - 1, 1)],  # the tokens; the <eos> column is past every length
            encoder.lengths,
            lengths.to(device),
            blank=pad,
            reduction="none",
            zero_infinity=False,
        )
        total = (1.0 - ctc_weight) * total + ctc_weight * ctc
    return total


def ctc_best_path(encoder: EncoderOutput, blank_id: int) -> list[list[int]]:
    """The CTC head's best path for each of the B utterances: the most probable
    token per encoder frame (``encoder.ctc_log_probs`` (B, T', V) within
    ``encoder.lengths``), repeats merged, blanks removed. No decoder is run, so
    it is an independent second opinion on the attention decoder's output."""
    if encoder.ctc_log_probs is None:
        raise ValueError("CTC best path needs a model with a CTC head (encoder.ctc_log_probs is None)")
    paths = []
    for frames, length in zip(encoder.ctc_log_probs.argmax(-1).tolist(), encoder.lengths.tolist()):
        tokens, previous = [], None
        for token in frames[:length]:
            if token != previous and token != blank_id:
                tokens.append(token)
            previous = token
        paths.append(tokens)
    return paths

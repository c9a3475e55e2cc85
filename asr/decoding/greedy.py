"""Greedy search: the decoder's most probable token at every step, for the whole batch at once."""

from __future__ import annotations

import torch

from asr.decoding.options import DecodingOptions, max_steps
from asr.decoding.scorers import mask_never_emitted
from asr.models.interface import EncoderOutput


@torch.no_grad()
def greedy_search(model, encoder: EncoderOutput, options: DecodingOptions = DecodingOptions()) -> list[list[int]]:
    """B token-id lists without ``<sos>``/``<eos>``, one per utterance of ``encoder``.

    Only the length options apply (``max_len_ratio``, ``min_len``, ``max_len``).
    An utterance leaves the batch once it has ended or reached its own maximum
    length, so the rest decode without it.
    """
    sos, eos = model.sos_id, model.eos_id
    batch = encoder.out.size(0)
    limits = max_steps(encoder, options).tolist()
    device = encoder.out.device
    state = model.init_decoder_state(encoder)
    tokens = torch.full((batch,), sos, dtype=torch.long, device=device)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    active = list(range(batch))  # the utterance of each row of the batch still decoding
    for step in range(max(limits, default=0)):
        log_probs, state = model.decode_step(tokens, state, encoder)
        log_probs = mask_never_emitted(log_probs, model, forbid_eos=step < options.min_len)
        tokens = log_probs.argmax(-1)
        still = []
        for row, (b, token) in enumerate(zip(active, tokens.tolist())):
            if token != eos:
                outputs[b].append(token)
                if step + 1 < limits[b]:
                    still.append(row)
        if not still:
            break
        if len(still) < len(active):
            keep = torch.tensor(still, device=device)
            state = model.reorder_decoder_state(state, keep)
            encoder = encoder.index_select(keep)
            tokens = tokens.index_select(0, keep)
            active = [active[row] for row in still]
    return outputs

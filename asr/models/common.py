"""Helpers every model shares: masks and target preparation.

Mask convention, used everywhere in this toolkit: a boolean mask is
**True = valid (keep)**, False = padding. This matches the boolean ``attn_mask``
of ``torch.nn.functional.scaled_dot_product_attention`` (True = may attend).
"""

from __future__ import annotations

import torch


def lengths_to_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """(B,) integer lengths -> (B, T) bool mask, True at valid positions."""
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    positions = torch.arange(max_len, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


def add_sos_eos(
    tokens: torch.Tensor, lengths: torch.Tensor, sos_id: int, eos_id: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forcing input and target, shifted by one.

    tokens: (B, L) padded with ``pad_id``; lengths: (B,).
    Returns ``decoder_input`` (B, L+1) = ``<sos> y_1 .. y_n <pad>..`` and
    ``target`` (B, L+1) = ``y_1 .. y_n <eos> <pad>..``.
    """
    batch, max_len = tokens.shape
    decoder_input = tokens.new_full((batch, max_len + 1), pad_id)
    target = tokens.new_full((batch, max_len + 1), pad_id)
    decoder_input[:, 0] = sos_id
    valid = lengths_to_mask(lengths, max_len)
    decoder_input[:, 1:] = torch.where(valid, tokens, decoder_input[:, 1:])
    target[:, :max_len] = torch.where(valid, tokens, target[:, :max_len])
    target[torch.arange(batch, device=tokens.device), lengths] = eos_id
    return decoder_input, target

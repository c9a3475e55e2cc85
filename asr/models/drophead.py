"""DropHead: structured dropout of whole attention heads, and its V-shaped rate schedule.

Zhou, Ge, Wei, Zhou & Xu (2020), "Scheduled DropHead: A Regularization Method
for Transformer Models" (Findings of EMNLP 2020). In training, each head of
each example is dropped with probability ``rate`` and the heads that remain
are scaled up so that the expected output is unchanged; in evaluation nothing
happens. Where the Transformer applies it, relative to its norms, is in
docs/normalization.md (section 1.6).

The scaling. For one example with ``H`` heads of which ``K`` are kept, every
kept head is multiplied by ``H / K`` (as the third-party drophead-pytorch
implementation of the paper does). Heads are exchangeable, so
``E[keep_i * H / K | K > 0] = 1`` exactly; an example whose ``H`` draws all
say "drop" (probability ``rate ** H``) keeps all of its heads instead (``H / 0``
has no meaning), which leaves the expectation at exactly 1. Unlike dropout's
fixed ``1 / (1 - rate)``, ``H / K`` keeps the sum of the head weights at ``H``
in every draw, so the output's scale does not jump when many heads fall.

The schedule (``model.drophead_schedule``) names a schedule shape of
:mod:`asr.training.shapes`, any with a ``scale`` (as ``train.scheduler.kind``
does; one registered from outside too), at its default options and scaled by
each stack's peak ``p``: ``vshape`` is the paper's, the rate falls linearly from
``p`` to 0 over the learning-rate warmup, then rises linearly back to ``p`` at
the last update; ``constant`` keeps ``p``; ``cosine`` falls from ``p`` to 0 at
the last update. The trainer sets the rates as scheduled settings
(``drophead_encoder``, ``drophead_decoder``); ``train.schedules`` may give either
a shape with options of its own, which replaces the model's.
"""

from __future__ import annotations

import torch
from torch import Tensor

def drop_heads(heads: Tensor, rate: float) -> Tensor:
    """heads: (B, H, L, D/H), each head's attention output before the heads are joined
    -> the same with whole heads of each example zeroed (probability ``rate``, drawn
    per example and head from the global generator) and the kept ones times ``H / K``.

    ``rate == 0`` returns ``heads`` itself and draws nothing.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"drophead rate must be in [0, 1), got {rate}")
    if rate == 0.0:
        return heads
    batch, num_heads = heads.shape[:2]
    keep = torch.rand(batch, num_heads, device=heads.device) >= rate  # (B, H)
    keep |= ~keep.any(dim=1, keepdim=True)  # an example that lost every head keeps them all
    kept = keep.sum(dim=1, keepdim=True)  # (B, 1), >= 1
    scale = keep.to(heads.dtype) * (num_heads / kept).to(heads.dtype)
    return heads * scale[:, :, None, None]


"""Transformer-XL relative self-attention (the Conformer's), a block any encoder may use: the
module (:class:`RelativeMultiHeadAttention`, with the embeddings of the distances, :func:`relative_positions`),
and its CPU computation with a backward pass written out (:func:`relative_attention`).

:class:`RelativeMultiHeadAttention` adds the position term to the content scores.
Handed to ``scaled_dot_product_attention`` as an additive mask that needs a gradient, that term keeps
SDPA's CPU kernel on its unfused math path, and autograd then keeps every intermediate (the gathered
term, its scaled and masked copies) and walks them back one by one. :func:`relative_attention` computes
the same function in one autograd node: it keeps the attention probabilities (and the dropout mask)
only, reads the distance-to-key shift as a strided view instead of a gather (Transformer-XL's trick),
computes the position term in blocks of queries, each over only the distances its rows reach, and its
backward pass is the softmax's and the matrix products', with nothing in between. docs/benchmarks.md
("The Conformer's training step against torchaudio's") has what each of these saves.

The score of query ``i`` for key ``j`` is ``s (q_u[i] . k[j] + q_v[i] . e[i - j])``, ``s`` the scale,
``q_u``/``q_v`` the queries plus the learned biases ``u``/``v`` and ``e`` the projected embedding of the
distance; padded keys are masked, then softmax, dropout and the values, as SDPA does them.
tests/test_conformer.py checks it against the autograd formulation: outputs and every gradient.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.models.blocks import MultiHeadAttention, sinusoidal_positions
from asr.models.drophead import drop_heads


CHUNKS = 4  # query blocks of the position term: each reads only the distances its rows reach


def _chunks(frames: int) -> list[tuple[int, int, int, int]]:
    """(first query, end, first distance column, columns) of each block of queries.

    Queries ``i0 <= i < i1`` reach the distances ``i - j`` of columns ``T - i1`` to ``2T - 2 - i0``:
    ``T + (i1 - i0) - 1`` of the ``2T - 1``, so blocks of a quarter of the frames compute 5/8 of the
    full product's columns."""
    size = max(1, -(-frames // CHUNKS))
    blocks = []
    for i0 in range(0, frames, size):
        i1 = min(i0 + size, frames)
        blocks.append((i0, i1, frames - i1, frames + (i1 - i0) - 1))
    return blocks


def _by_key(by_distance: Tensor, batch: int, rows: int, frames: int) -> Tensor:
    """(B, H, rows, T) strided view of ``by_distance`` (H, B rows, T + rows - 1), the position term of
    the block of queries ``i0 <= i < i1`` (``rows = i1 - i0``), whose column ``c`` holds the distance
    ``i1 - 1 - c``: element ``[b, h, i - i0, j]`` is row ``b rows + i - i0``, column ``rows - 1 - (i - i0) + j``,
    the distance ``i - j``.

    Consecutive rows start one column further left, ``width - 1`` elements apart; the view's elements
    are distinct, so it can be written through as well as read."""
    heads, _, width = by_distance.shape
    return by_distance.as_strided((batch, heads, rows, frames), (rows * width, by_distance.stride(0), width - 1, 1),
                                  by_distance.storage_offset() + rows - 1)


class _RelativeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_u: Tensor, q_v: Tensor, keys: Tensor, values: Tensor, embedded: Tensor,
                valid_keys: Tensor, keep: Tensor | None, dropout: float, scale: float) -> Tensor:
        batch, heads, frames, head = q_u.shape
        q_u = (q_u * scale).contiguous()
        # The position term per head over a block of queries of every utterance, (H, B rows, D/H) @
        # (H, D/H, columns): one batched product a block, with no copy of the embeddings per utterance.
        q_v = (q_v.transpose(0, 1) * scale).contiguous()  # (H, B, T, D/H)
        embedded = embedded.contiguous()
        # The padded keys' -inf enters as the product's initial value.
        key_bias = torch.zeros(valid_keys.shape, dtype=q_u.dtype, device=q_u.device).masked_fill_(~valid_keys, float("-inf"))
        scores = torch.baddbmm(key_bias.expand(batch, heads, 1, frames).reshape(batch * heads, 1, frames),
                               q_u.view(batch * heads, frames, head), keys.reshape(batch * heads, frames, head).transpose(1, 2))
        scores = scores.view(batch, heads, frames, frames)
        for i0, i1, first, columns in _chunks(frames):
            by_distance = torch.bmm(q_v[:, :, i0:i1].reshape(heads, batch * (i1 - i0), head),
                                    embedded[:, first:first + columns].transpose(-2, -1))
            scores[:, :, i0:i1] += _by_key(by_distance, batch, i1 - i0, frames)
        probs = torch.softmax(scores, dim=-1)
        del scores
        attended = (probs * keep * (1.0 / (1.0 - dropout)) if keep is not None else probs) @ values
        ctx.save_for_backward(q_u, q_v, keys, values, embedded, probs, keep)
        ctx.dropout, ctx.scale = dropout, scale
        return attended

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_attended: Tensor):
        q_u, q_v, keys, values, embedded, probs, keep = ctx.saved_tensors
        batch, heads, frames, head = q_u.shape
        needs = ctx.needs_input_grad
        dropped = probs * keep * (1.0 / (1.0 - ctx.dropout)) if keep is not None else probs
        grad_values = dropped.transpose(-2, -1) @ grad_attended if needs[3] else None
        del dropped
        grad_probs = grad_attended @ values.transpose(-2, -1)
        if keep is not None:
            grad_probs.mul_(keep).mul_(1.0 / (1.0 - ctx.dropout))
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        del grad_probs
        grad_q_u = (grad_scores @ keys).mul_(ctx.scale) if needs[0] else None
        grad_keys = grad_scores.transpose(-2, -1) @ q_u if needs[2] else None
        grad_q_v = grad_embedded = None
        if needs[1] or needs[4]:
            grad_q_v = torch.empty_like(q_v)  # (H, B, T, D/H)
            grad_embedded = torch.zeros_like(embedded)
            for i0, i1, first, columns in _chunks(frames):
                rows = i1 - i0
                grad_by_distance = grad_scores.new_zeros(heads, batch * rows, columns)
                _by_key(grad_by_distance, batch, rows, frames).copy_(grad_scores[:, :, i0:i1])
                window = embedded[:, first:first + columns]
                grad_q_v[:, :, i0:i1] = torch.bmm(grad_by_distance, window).view(heads, batch, rows, head)
                grad_embedded[:, first:first + columns] += torch.bmm(
                    grad_by_distance.transpose(-2, -1), q_v[:, :, i0:i1].reshape(heads, batch * rows, head))
            grad_q_v = grad_q_v.mul_(ctx.scale).transpose(0, 1)
        return grad_q_u, grad_q_v, grad_keys, grad_values, grad_embedded, None, None, None, None


def relative_attention(q_u: Tensor, q_v: Tensor, keys: Tensor, values: Tensor, embedded: Tensor,
                       valid_keys: Tensor, dropout: float = 0.0, keep: Tensor | None = None) -> Tensor:
    """Relative self-attention, (B, H, T, D/H).

    q_u, q_v: the queries plus ``u`` and plus ``v``, (B, H, T, D/H); keys, values: (B, H, T, D/H);
    embedded: the projected distance embeddings (H, 2T - 1, D/H), row ``c`` the distance ``T - 1 - c``;
    valid_keys: (B, 1, 1, T), True = a key that may be attended (every row needs one). dropout: the
    attention probabilities' dropout (0 at evaluation); keep: its mask (B, H, T, T), True = kept, drawn
    here when None and ``dropout`` > 0 (given, for tests that need the same mask twice).
    """
    if dropout > 0.0 and keep is None:
        shape = (*q_u.shape[:-1], keys.shape[-2])
        keep = torch.empty(shape, device=q_u.device).bernoulli_(1.0 - dropout).bool()
    if dropout == 0.0:
        keep = None
    return _RelativeAttention.apply(q_u, q_v, keys, values, embedded, valid_keys, keep, dropout,
                                    q_u.shape[-1] ** -0.5)


def relative_positions(frames: int, dim: int, device: torch.device) -> Tensor:
    """(2T - 1, D) sinusoidal embeddings of the relative distances ``T - 1, T - 2, .., -(T - 1)``."""
    return sinusoidal_positions(torch.arange(frames - 1, -frames, -1, device=device), dim)


class RelativeMultiHeadAttention(MultiHeadAttention):
    """Self-attention with Transformer-XL relative positions (Dai et al. 2019), as the Conformer uses it.

    The score of query frame ``i`` for key frame ``j`` is
    ``((q_i + u) . k_j + (q_i + v) . W_pos r_{i-j}) / sqrt(D/H)``, ``r`` the sinusoidal embedding of
    the distance ``i - j`` and ``u``, ``v`` learned per head (ESPnet's ``pos_bias_u``/``pos_bias_v``).
    Masking, dropout and DropHead are :class:`MultiHeadAttention`'s. On CUDA and under autocast the
    position term goes into SDPA as an additive bias (:meth:`_through_sdpa`); on the CPU, where that keeps
    SDPA on its unfused path, :func:`asr.models.relative_attention.relative_attention` computes the same.
    """

    def __init__(self, d_model: int, heads: int, dropout: float, drophead: float = 0.0) -> None:
        super().__init__(d_model, heads, dropout, drophead)
        self.position = nn.Linear(d_model, d_model, bias=False)
        self.bias_u = nn.Parameter(torch.empty(heads, self.head_dim))
        self.bias_v = nn.Parameter(torch.empty(heads, self.head_dim))
        nn.init.xavier_uniform_(self.bias_u)
        nn.init.xavier_uniform_(self.bias_v)
        # False: SDPA on the CPU too (benchmarks/conformer_step.py times the two; not a recipe setting,
        # since both compute the same function)
        self.cpu_node = True

    def forward(self, x: Tensor, positions: Tensor, mask: Tensor) -> Tensor:  # type: ignore[override]
        """x: (B, T, D); positions: (2T - 1, D) from :func:`relative_positions`; mask: (B, 1, 1, T)
        True = valid key. Returns (B, T, D)."""
        batch, frames, _ = x.shape
        queries = self.query(x).view(batch, frames, self.heads, self.head_dim)
        keys, values = self.project_kv(x)
        embedded = self.position(positions).view(-1, self.heads, self.head_dim).transpose(0, 1)  # (H, 2T-1, D/H)
        with_v = (queries + self.bias_v).transpose(1, 2)  # (B, H, T, D/H)
        dropout = self.dropout if self.training else 0.0
        with_u = (queries + self.bias_u).transpose(1, 2)
        if self.cpu_node and x.device.type == "cpu" and not torch.is_autocast_enabled("cpu"):
            # the same function in one autograd node (asr.models.relative_attention): SDPA cannot fuse it here
            attended = relative_attention(with_u, with_v, keys, values, embedded, mask, dropout)
        else:
            attended = self._through_sdpa(with_u, with_v, keys, values, embedded, mask, dropout)
        if self.training:
            attended = drop_heads(attended, self.drophead)
        return self.out(attended.transpose(1, 2).reshape(batch, frames, self.heads * self.head_dim))

    def _through_sdpa(self, with_u: Tensor, with_v: Tensor, keys: Tensor, values: Tensor, embedded: Tensor,
                      mask: Tensor, dropout: float) -> Tensor:
        """The position term as SDPA's additive mask (autograd keeps its intermediates): CUDA, autocast, ``cpu_node`` False."""
        batch, _, frames, _ = with_u.shape
        by_distance = with_v @ embedded.transpose(-2, -1)  # (B, H, T, 2T-1): column k is distance T-1-k
        # Row i, column j reads distance i - j, at column T - 1 - i + j.
        steps = torch.arange(frames, device=with_u.device)
        index = frames - 1 - steps[:, None] + steps
        bias = by_distance.gather(-1, index.expand(batch, self.heads, frames, frames)) / math.sqrt(self.head_dim)
        bias = bias.masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(with_u, keys, values, attn_mask=bias.to(with_u.dtype), dropout_p=dropout)

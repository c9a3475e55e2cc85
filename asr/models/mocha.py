"""Monotonic chunkwise attention, MoChA (Chiu & Raffel 2018), for the LAS speller.

Each output step scans the listener's frames left to right from where the
previous step stopped and stops at the first frame ``j`` whose "stop"
probability ``p_j = sigmoid(e_j)`` is at least one half; it then attends with
an ordinary softmax over the ``chunk`` frames ending at ``j``. It never
looks back past where it stopped before: one of the remedies offered for
attention that loses its place on utterances longer than those trained on
(Chorowski et al. 2015 and Chiu et al. 2019 describe the failure).

The monotonic energy is Raffel et al.'s (2017): ``e_j = g v^T/|v| tanh(W q +
U k_j + b) + r`` with ``g`` starting at ``1/sqrt(dim)`` and ``r`` at
``monotonic_bias`` (-4: the scan starts out reluctant to stop). The chunk
energy is the content one, ``u_j = w^T tanh(W' q + U' k_j + b')``.

Training cannot back-propagate through "the first frame where p >= 0.5", so
in training mode the step computes the *expected* stop distribution instead
(Raffel et al. 2017, eq. 9):

    q_j     = (1 - p_{j-1}) q_{j-1} + alpha'_j          (alpha' = the previous step's)
    alpha_j = p_j q_j

and the expected chunk attention (Chiu & Raffel 2018, eq. 20):

    beta_k = sum_{j=k}^{k+w-1} alpha_j exp(u_k) / sum_{l=j-w+1}^{j} exp(u_l)

both in closed form over all frames at once, in log space (``logcumsumexp``
and a windowed ``logsumexp``), so no product of many ``1 - p`` underflows and
no exponential overflows. Gaussian noise of standard deviation
``sigmoid_noise`` is added to ``e`` in training, which pushes ``p`` towards 0
or 1 so that the hard decision at test time matches what was trained.

In eval mode (decoding and validation) the step makes the hard decision: the
stop frame is one-hot, ``beta`` is the softmax over its chunk, and a scan that
reaches the end of the utterance without stopping attends to nothing (a zero
context, as in the paper) for this and every later step.

The speller keeps the previous stop distribution in its state
(``"monotonic"``, (N, T)); the returned weights are ``beta`` with a head axis,
like :class:`~asr.models.attention.Attention`'s. All of that is this file's, its keys too
(:class:`MochaConfig`): it implements :class:`~asr.models.attention_interface.LASAttention`, and
``type: mocha`` is one line of the table of types (:mod:`asr.models.attention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from asr.models.attention_interface import AttentionConfig, LASAttention
from asr.models.interface import STATIC_STATE_KEY


@dataclass
class MochaConfig(AttentionConfig):
    """``model.attention`` with ``type: mocha``: the keys every type has (one head) and MoChA's own; no
    window (the scan is monotonic already), no scaling (the chunk's softmax is its own) and no backend."""

    type: str = "mocha"       # content, dot, location or mocha (ATTENTION_TYPES); mocha: monotonic chunkwise attention
    # The softmax's chunk in encoder frames, the initial bias r of the stop energy, and the std of the
    # noise added to it in training (-4 and 1 as in Raffel et al. 2017, whom Chiu & Raffel 2018 follow)
    chunk: int = 2
    monotonic_bias: float = -4.0
    sigmoid_noise: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.heads != 1:
            raise ValueError(f"heads must be 1 with type 'mocha', got {self.heads}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")
        if self.sigmoid_noise < 0:
            raise ValueError(f"sigmoid_noise must be >= 0, got {self.sigmoid_noise}")


def expected_alignment(energies: torch.Tensor, mask: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Expected stop distribution (B, T) of one step, from the monotonic energies (B, T), the
    valid frames ``mask`` (B, T) and the previous step's distribution ``previous`` (B, T).

    Exactly 0 on padded frames; sums to at most the previous step's mass (the rest
    is the chance that the scan runs off the end).
    """
    log_stop = F.logsigmoid(energies).masked_fill(~mask, float("-inf"))
    log_go_on = F.logsigmoid(-energies).masked_fill(~mask, 0.0)
    # sum over l < j of log(1 - p_l): the log-probability of passing frames 0..j-1 without stopping
    passed = torch.cumsum(log_go_on, -1) - log_go_on
    log_previous = previous.clamp(min=torch.finfo(previous.dtype).tiny).log()
    return torch.exp(log_stop + passed + torch.logcumsumexp(log_previous - passed, -1))


def hard_alignment(energies: torch.Tensor, mask: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """One-hot stop frame (B, T) of one step at test time: the first valid frame at or after the
    previous stop where ``energies >= 0`` (p >= 0.5); all zeros if there is none, or if the
    previous step had already run off the end (``previous`` all zero)."""
    frames = torch.arange(energies.size(-1), device=energies.device)
    start = previous.argmax(-1, keepdim=True)
    still_scanning = previous.sum(-1, keepdim=True) > 0
    candidates = mask & (energies >= 0) & (frames >= start) & still_scanning
    first = candidates & (candidates.cumsum(-1) == 1)
    return first.to(previous.dtype)


def chunkwise_weights(alignment: torch.Tensor, energies: torch.Tensor, mask: torch.Tensor, width: int) -> torch.Tensor:
    """Attention ``beta`` (B, T) over the frames: each stop frame j's mass ``alignment[:, j]``
    spread by a softmax of the chunk ``energies`` over the ``width`` frames ending at j.
    Exactly 0 on padded frames."""
    energies = energies.masked_fill(~mask, float("-inf"))
    # log_norm[j] = logsumexp of the energies of frames j-width+1..j (the valid ones among them).
    windows = F.pad(energies, (width - 1, 0), value=float("-inf")).unfold(-1, width, 1)
    # A padded frame j never has stop mass; give its window finite values so that no
    # all -inf logsumexp makes a NaN gradient.
    windows = torch.where(mask.unsqueeze(-1), windows, torch.zeros_like(windows))
    log_norm = torch.logsumexp(windows, -1)
    # beta_k = sum over d < width of alignment[k+d] * exp(u_k - log_norm[k+d]); u_k <= log_norm[k+d],
    # since frame k lies in the chunk ending at k+d, so no term exceeds alignment[k+d].
    stops = F.pad(alignment, (0, width - 1)).unfold(-1, width, 1)
    norms = F.pad(log_norm, (0, width - 1)).unfold(-1, width, 1)
    return (stops * torch.exp(energies.unsqueeze(-1) - norms)).sum(-1)


class MonotonicChunkwiseAttention(LASAttention):
    """MoChA over keys (the listener states) for a query (the speller state).

    Args:
        config: the ``model.attention`` section with ``type: mocha`` (:class:`MochaConfig`: ``dim``,
            ``chunk``, ``monotonic_bias``, ``sigmoid_noise``).
        query_dim: Q, size of the query.
        key_dim: H, size of each key and of the returned context.
    """

    # Its state: the weights and the previous stop distribution; the static part: the projected keys.
    frame_dims = {"weights": 2, "monotonic": 1, "projected_keys": 2}
    config_class = MochaConfig

    def __init__(self, config: MochaConfig, query_dim: int, key_dim: int) -> None:
        super().__init__(key_dim)
        if not isinstance(config, MochaConfig):
            raise ValueError(f"MonotonicChunkwiseAttention needs a MochaConfig (type 'mocha'), got {config!r}")
        self.config = config
        self.dim = config.dim
        self.chunk = config.chunk
        self.sigmoid_noise = config.sigmoid_noise
        # Both energies' W q + b and U k in one projection each: [monotonic; chunk].
        self.query_proj = nn.Linear(query_dim, 2 * config.dim)
        self.key_proj = nn.Linear(key_dim, 2 * config.dim, bias=False)
        bound = 1.0 / math.sqrt(config.dim)
        self.monotonic_v = nn.Parameter(torch.empty(config.dim).uniform_(-bound, bound))
        self.monotonic_gain = nn.Parameter(torch.tensor(bound))
        self.monotonic_bias = nn.Parameter(torch.tensor(float(config.monotonic_bias)))
        self.chunk_v = nn.Parameter(torch.empty(config.dim).uniform_(-bound, bound))

    def static_state(self, keys: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"projected_keys": self.project_keys(keys)}

    def initial_state(self, keys: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """``weights`` (:meth:`initial_weights`) and ``monotonic`` (N, T), the stop distribution
        (:meth:`initial_alignment`, float32)."""
        return {"weights": self.initial_weights(mask, keys.dtype), "monotonic": self.initial_alignment(mask)}

    def step(
        self, query: torch.Tensor, state: dict, energy_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`forward` on the speller's state, and the new ``monotonic``. The attention prior
        (``energy_bias``) is not applied: the scan, not a softmax over all frames, decides where to look."""
        static = state[STATIC_STATE_KEY]
        context, weights, monotonic = self(
            query, static["keys"], static["mask"], state["monotonic"], projected_keys=static["projected_keys"]
        )
        return context, weights, {"monotonic": monotonic}

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, T, H) -> (B, 2, T, dim): ``U k`` of the monotonic and of the chunk energy."""
        batch, time, _ = keys.shape
        return self.key_proj(keys).view(batch, time, 2, self.dim).transpose(1, 2).contiguous()

    @staticmethod
    def initial_alignment(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The stop distribution before the first step, (B, T): all mass on frame 0, where the scan starts."""
        start = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        start[:, 0] = 1.0
        return start

    def initial_weights(self, mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Attention weights (B, 1, T) before the first step (read by nothing; kept for the state's shape)."""
        return self.initial_alignment(mask, dtype).unsqueeze(1)

    def energies(self, query: torch.Tensor, projected_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Monotonic and chunk energies, each (B, T), before any noise or mask."""
        batch, _, _, dim = projected_keys.shape
        hidden = torch.tanh(projected_keys + self.query_proj(query).view(batch, 2, 1, dim))
        v = self.monotonic_v * (self.monotonic_gain / self.monotonic_v.norm())
        monotonic = torch.matmul(hidden[:, 0], v) + self.monotonic_bias
        chunk = torch.matmul(hidden[:, 1], self.chunk_v)
        return monotonic, chunk

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        previous: torch.Tensor,
        projected_keys: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step: query (B, Q), keys (B, T, H), mask (B, T) True = valid (frame 0 valid in
        every row), ``previous`` (B, T) the previous step's stop distribution (``initial_alignment``
        at the first step).

        Returns the context (B, H), the weights ``beta`` (B, 1, T) and this step's
        stop distribution (B, T): expected in training mode, one-hot (or zero) in eval mode.
        """
        if projected_keys is None:
            projected_keys = self.project_keys(keys)
        monotonic, chunk = (e.float() for e in self.energies(query, projected_keys))
        previous = previous.float()
        if self.training:
            if self.sigmoid_noise > 0:
                monotonic = monotonic + self.sigmoid_noise * torch.randn_like(monotonic)
            alignment = expected_alignment(monotonic, mask, previous)
        else:
            alignment = hard_alignment(monotonic, mask, previous)
        weights = chunkwise_weights(alignment, chunk, mask, self.chunk)
        context = torch.bmm(weights.unsqueeze(1).to(keys.dtype), keys).squeeze(1)
        return context, weights.unsqueeze(1), alignment

"""CTC on the encoder output: the auxiliary loss of joint CTC-attention training
(Kim, Hori & Watanabe 2017) and the prefix scorer of joint decoding (Watanabe
et al. 2017, "Hybrid CTC/attention architecture", sec. III-B; the vectorised
form follows ESPnet's ``CTCPrefixScoreTH``).

The CTC blank is the tokenizer's pad id (0). ``<sos>`` and ``<eos>`` are
ordinary output units of the CTC head (never targets, so it learns to give them
~0 probability); the prefix scorer treats a candidate ``<eos>`` as "the
hypothesis ends here".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class CTCHead(nn.Module):
    """Linear layer + log-softmax over the vocabulary on every encoder frame.

    Args:
        input_dim: H, size of an encoder state.
        vocab_size: V, including the blank (= pad id).
        blank_id: index of the blank.
    """

    def __init__(self, input_dim: int, vocab_size: int, blank_id: int = 0) -> None:
        super().__init__()
        self.blank_id = blank_id
        self.proj = nn.Linear(input_dim, vocab_size)

    def forward(self, encoder_out: torch.Tensor) -> torch.Tensor:
        """encoder_out (B, T, H) -> log-probabilities (B, T, V)."""
        return F.log_softmax(self.proj(encoder_out), dim=-1)

    def loss(
        self,
        log_probs: torch.Tensor,
        lengths: torch.Tensor,
        tokens: torch.Tensor,
        token_lengths: torch.Tensor,
    ) -> torch.Tensor:
        """Summed CTC negative log-likelihood of the batch (a scalar).

        log_probs (B, T, V), lengths (B,), tokens (B, L) padded, token_lengths (B,).
        ``zero_infinity`` turns impossible alignments (targets longer than the
        reduced input allows) into a zero loss instead of inf/NaN gradients. The
        caller divides by its own normaliser (see ``LAS.forward``).
        """
        return F.ctc_loss(
            log_probs.transpose(0, 1),
            tokens,
            lengths,
            token_lengths,
            blank=self.blank_id,
            reduction="sum",
            zero_infinity=True,
        )


@dataclass
class CTCPrefixState:
    """Prefix-scorer state of N hypotheses.

    r: (T, 2, N) log forward variables of the prefix g: ``r[t, 0]`` = g emitted
       with its last frame t a non-blank, ``r[t, 1]`` = a blank.
    score: (N,) log prefix probability ``psi(g)`` (0 for the empty prefix).
    last: (N,) last token of g, -1 for the empty prefix.
    """

    r: torch.Tensor
    score: torch.Tensor
    last: torch.Tensor


class CTCPrefixScorer:
    """Prefix probabilities of hypotheses under CTC, for N hypotheses at once.

    ``psi(h)`` is the probability that the CTC output *begins with* h (sum over
    all label sequences with prefix h); for the candidate ``<eos>`` it is the
    probability that the output *is exactly* g. A hypothesis g extended by
    candidate c is scored ``psi(g + c) - psi(g)``, the CTC counterpart of the
    decoder's ``log p(c | g)``.

    Args:
        log_probs: (N, T, V) CTC log-probabilities, one row per hypothesis
            (expand the batch to the beam first).
        lengths: (N,) valid frames of each row.
        blank_id, eos_id: the blank and the end-of-sentence ids.

    Padded frames are rewritten as "certainly blank" (log-prob 0 for blank,
    -inf otherwise), so the recursion runs over the batch's longest row and
    every shorter row's variables simply carry over its own end.
    """

    def __init__(self, log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int, eos_id: int) -> None:
        time = log_probs.size(1)
        self.blank_id = blank_id
        self.eos_id = eos_id
        self.lengths = lengths
        valid = torch.arange(time, device=log_probs.device).unsqueeze(0) < lengths.unsqueeze(1)  # (N, T)
        padded = torch.full_like(log_probs, float("-inf"))
        padded[..., blank_id] = 0.0
        # (T, N, V): the recursion walks over time, so time goes first.
        self.x = torch.where(valid.unsqueeze(-1), log_probs, padded).transpose(0, 1).contiguous()

    def initial_state(self) -> CTCPrefixState:
        """State of the empty prefix (``<sos>`` only) for every row."""
        blank = self.x[:, :, self.blank_id]  # (T, N)
        r = torch.stack([torch.full_like(blank, float("-inf")), blank.cumsum(0)], dim=1)
        num = blank.size(1)
        return CTCPrefixState(
            r=r, score=blank.new_zeros(num), last=torch.full((num,), -1, dtype=torch.long, device=blank.device)
        )

    def score(
        self, state: CTCPrefixState, candidates: torch.Tensor, min_prefix_length: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Score extending each hypothesis by each of its candidates.

        state: N hypotheses; candidates: (N, K) token ids; min_prefix_length: a
        lower bound on the number of tokens in every prefix (lets the recursion
        skip the first frames, where every extension is still impossible; 0 is
        always correct).

        Returns ``delta`` (N, K) = ``psi(g + c) - psi(g)`` (-inf for the blank and
        impossible extensions), and the new forward variables ``r`` (T, 2, N, K)
        and prefix scores ``psi`` (N, K) for :meth:`select`.
        """
        time = self.x.size(0)
        k = candidates.size(1)
        neg_inf = float("-inf")
        x_c = self.x.gather(2, candidates.unsqueeze(0).expand(time, -1, -1))  # (T, N, K)
        x_blank = self.x[:, :, self.blank_id].unsqueeze(-1)  # (T, N, 1)
        r_prev_n, r_prev_b = state.r[:, 0].unsqueeze(-1), state.r[:, 1].unsqueeze(-1)  # (T, N, 1)
        empty = (state.last < 0).unsqueeze(-1)  # (N, 1)
        # phi_t = r^b_t(g) + r^n_t(g), except a repeated label needs a blank in between.
        repeat = (candidates == state.last.unsqueeze(-1)).unsqueeze(0)  # (1, N, K)
        phi = torch.logaddexp(r_prev_b, torch.where(repeat, torch.full_like(x_c, neg_inf), r_prev_n))

        r_n = torch.full_like(x_c, neg_inf)
        r_b = torch.full_like(x_c, neg_inf)
        r_n[0] = torch.where(empty, x_c[0], torch.full_like(x_c[0], neg_inf))
        # A prefix of m tokens cannot end before frame m - 1: with m >= min_prefix_length
        # for every g, all terms before frame min_prefix_length are -inf and the
        # recursion may start there.
        start = min(max(1, min_prefix_length), time)
        psi = r_n[start - 1].clone()
        if start < time:
            r_n[start:], r_b[start:], psi = _unrolled(x_c, x_blank, phi, r_n[start - 1], start)
        # Written as a loop over frames, the recursions are, for t >= start:
        #   r_n[t] = logaddexp(r_n[t - 1], phi[t - 1]) + x_c[t]
        #   r_b[t] = logaddexp(r_b[t - 1], r_n[t - 1]) + x_blank[t]
        #   psi    = logaddexp(psi, phi[t - 1] + x_c[t])
        # <eos>: the output is exactly g; read g's variables at the last frame
        # (padded frames are blank with certainty, so the last row frame of the
        # tensor equals each row's own last valid frame).
        final = torch.logaddexp(state.r[-1, 0], state.r[-1, 1]).unsqueeze(-1).expand(-1, k)
        is_eos = candidates == self.eos_id
        psi = torch.where(is_eos, final, psi)
        psi = psi.masked_fill(candidates == self.blank_id, neg_inf)
        delta = psi - state.score.unsqueeze(-1)
        # psi(g) = -inf only for hypotheses that are themselves impossible: keep them impossible.
        delta = torch.where(torch.isfinite(state.score).unsqueeze(-1), delta, torch.full_like(delta, neg_inf))
        return delta, torch.stack([r_n, r_b], dim=1), psi

    @staticmethod
    def select(
        r: torch.Tensor, psi: torch.Tensor, candidates: torch.Tensor, parent: torch.Tensor, choice: torch.Tensor
    ) -> CTCPrefixState:
        """State of the chosen extensions: hypothesis i of the new state is
        ``parent[i]`` extended by its ``choice[i]``-th candidate.

        r (T, 2, N, K), psi (N, K), candidates (N, K) from :meth:`score`;
        parent, choice: (N',) long.
        """
        return CTCPrefixState(
            r=r[:, :, parent, choice], score=psi[parent, choice], last=candidates[parent, choice]
        )


# A log-probability that stands for -inf inside _unrolled: the cumulative sums there must stay finite.
# Any path through one is impossible, and every sum at or below _IMPOSSIBLE / 2 is -inf again: a real
# prefix would need tens of thousands of frames of its least likely token to come near it.
_IMPOSSIBLE = -1.0e7


def _unrolled(x_c: torch.Tensor, x_blank: torch.Tensor, phi: torch.Tensor, r_n_before: torch.Tensor, start: int):
    """The prefix recursions of :meth:`CTCPrefixScorer.score` from frame ``start`` on, without a loop
    over frames: each is a first-order recursion in log space, ``y[t] = logaddexp(y[t - 1], a[t - 1]) + x[t]``,
    so with ``D[t] = x[start] + ... + x[t]`` (``D[start - 1] = 0``) it is
    ``y[t] = D[t] + logaddexp(y[start - 1], logcumsumexp over s = start-1..t-1 of (a[s] - D[s]))``.
    Computed in float64 (the cumulative sums subtract large numbers); returns ``r_n[start:]``,
    ``r_b[start:]`` (T - start, N, K) and ``psi`` (N, K) in the input's dtype."""
    dtype = x_c.dtype
    neg_inf = float("-inf")
    x = x_c[start:].double().clamp(min=_IMPOSSIBLE)                    # (T', N, K), T' = T - start
    blank = x_blank[start:].double().clamp(min=_IMPOSSIBLE)            # (T', N, 1)
    a = phi[start - 1 : -1].double()                                   # phi[s], s = start-1 .. T-2
    before = r_n_before.double()                                       # r_n[start - 1] (N, K)

    def shifted(total: torch.Tensor) -> torch.Tensor:  # D[s] for s = start-1 .. T-2
        return torch.cat([torch.zeros_like(total[:1]), total[:-1]], dim=0)

    d = x.cumsum(0)
    r_n = d + torch.logaddexp(before.unsqueeze(0), torch.logcumsumexp(a - shifted(d), dim=0))
    e = blank.cumsum(0)
    r_n_prev = torch.cat([before.unsqueeze(0), r_n[:-1]], dim=0)      # r_n[s], s = start-1 .. T-2
    r_b = e + torch.logcumsumexp(r_n_prev - shifted(e), dim=0)         # r_b[start - 1] = -inf
    psi = torch.logaddexp(before, torch.logsumexp(a + x, dim=0))

    def real(values: torch.Tensor) -> torch.Tensor:
        return values.masked_fill(values <= _IMPOSSIBLE / 2, neg_inf).to(dtype)

    return real(r_n), real(r_b), real(psi)

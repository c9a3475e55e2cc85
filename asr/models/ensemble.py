"""Several trained models decoding as one: their next-token distributions are averaged.

An :class:`Ensemble` implements the decoding interface of
:mod:`asr.models.interface`, so greedy and beam search (and CTC prefix
scoring) run on it unchanged. At every step each member sees the same
hypothesis and gives its own distribution; the ensemble's log-probabilities are
the log of their mean, ``log(1/M * sum_m p_m)``. The CTC posteriors, where
every member has a CTC head, are averaged frame by frame in the same way, which
needs the members' encoders to give the same number of frames (the same time
reduction).

The members must share the output vocabulary and its special ids; whether they
also share the features is the caller's business (see
:func:`asr.inference.load_recogniser`). Members of different architectures (an
LAS and a Transformer) are allowed as long as they agree on those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from asr.models.interface import EncoderOutput


@dataclass
class EnsembleEncoderOutput(EncoderOutput):
    """The members' encoder outputs; ``out``, ``mask`` and ``lengths`` are the first member's
    (what the search reads for batch size, device and maximum lengths)."""

    members: list[EncoderOutput] = field(default_factory=list)

    def index_select(self, index: torch.Tensor) -> EnsembleEncoderOutput:
        # Rows of the already averaged CTC posteriors: no second average, no second length check.
        base = super().index_select(index)
        members = [member.index_select(index) for member in self.members]
        return EnsembleEncoderOutput(base.out, base.mask, base.lengths, base.ctc_log_probs, members)


def _combine(members: list[EncoderOutput]) -> EnsembleEncoderOutput:
    first = members[0]
    for m, member in enumerate(members[1:], start=1):
        if not torch.equal(member.lengths, first.lengths):
            raise ValueError(
                f"ensemble member {m} gives encoder lengths {member.lengths.tolist()}, member 0 gives "
                f"{first.lengths.tolist()}: members must reduce time by the same factor"
            )
    ctc = None
    if all(member.ctc_log_probs is not None for member in members):
        ctc = _log_mean_exp([member.ctc_log_probs for member in members])
    return EnsembleEncoderOutput(first.out, first.mask, first.lengths, ctc, members)


def _log_mean_exp(log_probs: list[torch.Tensor]) -> torch.Tensor:
    """``log(mean_m exp(x_m))``, elementwise over tensors of one shape."""
    return torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))


class Ensemble(nn.Module):
    """Decode with the mean next-token distribution of ``models`` (at least one, all in eval mode)."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        ids = [(m.sos_id, m.eos_id, m.pad_id) for m in models]
        if len(set(ids)) != 1:
            raise ValueError(f"ensemble members disagree on the (sos, eos, pad) ids: {ids}")
        self.models = nn.ModuleList(models)
        self.sos_id, self.eos_id, self.pad_id = ids[0]

    @property
    def has_ctc(self) -> bool:
        """True when every member has a CTC head (their posteriors are averaged)."""
        return all(model.has_ctc for model in self.models)

    def encode(self, features: torch.Tensor, feature_lengths: torch.Tensor) -> EnsembleEncoderOutput:
        return _combine([model.encode(features, feature_lengths) for model in self.models])

    def init_decoder_state(self, encoder: EnsembleEncoderOutput) -> list:
        return [model.init_decoder_state(e) for model, e in zip(self.models, encoder.members)]

    def decode_step(
        self, tokens: torch.Tensor, state: list, encoder: EnsembleEncoderOutput
    ) -> tuple[torch.Tensor, list]:
        log_probs, states = [], []
        for model, member_state, member_encoder in zip(self.models, state, encoder.members):
            lp, s = model.decode_step(tokens, member_state, member_encoder)
            log_probs.append(lp.float())
            states.append(s)
        sizes = {lp.size(-1) for lp in log_probs}
        if len(sizes) != 1:
            raise ValueError(f"ensemble members have different vocabulary sizes: {sorted(sizes)}")
        return _log_mean_exp(log_probs), states

    def decoder_attention(self, state: list) -> torch.Tensor | None:
        """The mean of the members' attention, when every member exposes it."""
        found = [model.decoder_attention(s) for model, s in zip(self.models, state)]
        return None if any(a is None for a in found) else torch.stack(found).mean(0)

    def reorder_decoder_state(self, state: list, index: torch.Tensor) -> list:
        return [model.reorder_decoder_state(s, index) for model, s in zip(self.models, state)]

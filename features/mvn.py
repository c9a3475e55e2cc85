"""Mean-variance normalisation (MVN) of ``(T, D)`` features, per feature dimension.

Modes (``FeatureConfig.mvn``):

- ``none``: features are left as computed.
- ``utterance``: each utterance is shifted and scaled by its own per-dimension
  mean and standard deviation. Needs no statistics, but removes the absolute
  level (loudness, channel) of every utterance, and on very short utterances
  the statistics are noisy.
- ``global``: one mean and standard deviation per dimension, accumulated once
  over the training set (:class:`GlobalStats`), saved, and carried in the model
  checkpoint so that inference divides by exactly the numbers training used.

Both use the population standard deviation (divide by the frame count, not
count - 1) floored at ``std_floor``, so a constant dimension (e.g. a single
frame, or digital silence) is centred rather than blown up to inf/NaN.
Statistics are accumulated in float64: a training set has ~10^8 frames of
log-mel values around 10-20, and a float32 sum of squares would lose the
variance to cancellation.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from features.frames import valid_frames

DEFAULT_STD_FLOOR = 1e-5


def utterance_mvn(feats: Tensor, std_floor: float = DEFAULT_STD_FLOOR) -> Tensor:
    """``(T, D)`` -> ``(T, D)`` float32 with per-dimension mean 0 and std 1 over this utterance's T frames."""
    lengths = torch.tensor([feats.shape[0]], device=feats.device)
    return utterance_mvn_batch(feats.unsqueeze(0), lengths, std_floor).squeeze(0)


def utterance_mvn_batch(feats: Tensor, lengths: Tensor, std_floor: float = DEFAULT_STD_FLOOR) -> Tensor:
    """``(B, T, D)`` -> ``(B, T, D)`` float32, each row normalised by the mean and std of its first
    ``lengths[b]`` frames only (padded frames neither count nor matter)."""
    x = feats.double()
    padding = ~valid_frames(lengths.to(x.device), x.shape[1])[..., None]
    count = lengths.to(x.device, torch.float64).clamp(min=1)[:, None, None]
    mean = x.masked_fill(padding, 0.0).sum(dim=1, keepdim=True) / count
    centred = x - mean
    variance = centred.masked_fill(padding, 0.0).pow(2).sum(dim=1, keepdim=True) / count
    return (centred / variance.sqrt().clamp(min=std_floor)).float()


class GlobalStats:
    """Running per-dimension frame count, sum and sum of squares (float64) over a training set.

    Usage: ``stats = GlobalStats(dim)``; ``stats.update(feats)`` for every
    training utterance's raw ``(T, D)`` features; then ``stats.normalize(feats)``.
    """

    def __init__(self, dim: int, std_floor: float = DEFAULT_STD_FLOOR):
        if dim < 1:
            raise ValueError(f"GlobalStats: dim must be >= 1, got {dim}")
        if std_floor <= 0:
            raise ValueError(f"GlobalStats: std_floor must be positive, got {std_floor}")
        self.dim = dim
        self.std_floor = float(std_floor)
        self.count = 0
        self.sum = torch.zeros(dim, dtype=torch.float64)
        self.sum_squares = torch.zeros(dim, dtype=torch.float64)

    def update(self, feats: Tensor) -> None:
        """Add the frames of one utterance, ``feats (T, D)``; non-finite values are refused (ValueError)."""
        if feats.dim() != 2 or feats.shape[1] != self.dim:
            raise ValueError(
                f"GlobalStats.update: expected features of shape (T, {self.dim}), got {tuple(feats.shape)}"
            )
        x = feats.detach().to("cpu", torch.float64)
        if not bool(torch.isfinite(x).all()):
            # One NaN frame would make every later normalised feature NaN: refuse it here.
            raise ValueError("GlobalStats.update: the features hold NaN or infinite values")
        self.count += x.shape[0]
        self.sum += x.sum(dim=0)
        self.sum_squares += (x * x).sum(dim=0)

    @property
    def mean(self) -> Tensor:
        """Per-dimension mean, ``(D,)`` float64."""
        self._require_frames()
        return self.sum / self.count

    @property
    def std(self) -> Tensor:
        """Per-dimension population standard deviation, floored at ``std_floor``; ``(D,)`` float64."""
        mean = self.mean
        # E[x^2] - E[x]^2 can come out slightly negative from rounding when the variance is ~0.
        variance = (self.sum_squares / self.count - mean * mean).clamp(min=0.0)
        return variance.sqrt().clamp(min=self.std_floor)

    def normalize(self, feats: Tensor) -> Tensor:
        """``(..., T, D)`` -> the same shape in float32, ``(feats - mean) / std`` with the accumulated statistics
        (frame by frame, so a batch's padded frames change nothing else)."""
        if feats.dim() < 2 or feats.shape[-1] != self.dim:
            raise ValueError(f"global MVN: expected features of shape (T, {self.dim}), got {tuple(feats.shape)}")
        mean, std = self.mean.to(feats.device), self.std.to(feats.device)
        return ((feats.double() - mean) / std).float()

    def state_dict(self) -> dict:
        """Plain dict for a checkpoint: ``{"dim", "count", "sum", "sum_squares", "std_floor"}``."""
        return {
            "dim": self.dim,
            "count": self.count,
            "sum": self.sum.clone(),
            "sum_squares": self.sum_squares.clone(),
            "std_floor": self.std_floor,
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> GlobalStats:
        """The statistics of :meth:`state_dict`; ValueError (never another type) for anything else, so that
        a caller reading a file it cannot trust (a cache entry, a checkpoint) has one error to catch."""
        if not isinstance(state, dict):
            raise ValueError(f"GlobalStats state is a {type(state).__name__}, not a dict")
        missing = {"dim", "count", "sum", "sum_squares", "std_floor"} - set(state)
        if missing:
            raise ValueError(f"GlobalStats state is missing {sorted(missing)}")
        try:
            dim, count, std_floor = int(state["dim"]), int(state["count"]), float(state["std_floor"])
            total = torch.as_tensor(state["sum"], dtype=torch.float64)
            squares = torch.as_tensor(state["sum_squares"], dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as err:  # a string, None, a nested list
            raise ValueError(f"GlobalStats state of the wrong types: {err}") from err
        try:
            stats = cls(dim, std_floor)
        except ValueError as err:
            raise ValueError(f"GlobalStats state: {err}") from err
        if total.shape != (stats.dim,) or squares.shape != (stats.dim,):
            raise ValueError(
                f"GlobalStats state: sum {tuple(total.shape)} / sum_squares {tuple(squares.shape)} "
                f"do not match dim {stats.dim}"
            )
        stats.count = count
        stats.sum = total.clone()
        stats.sum_squares = squares.clone()
        return stats

    def check(self) -> None:
        """ValueError unless these are statistics that can be right: frames counted, finite sums and
        floor, and no variance below zero beyond float64 rounding.

        Loading cannot tell damaged statistics from real ones by their types (a flipped bit or a
        sum of squares too small still loads), and :attr:`std` would floor a negative variance to
        ``std_floor`` and scale every feature by 1e5 without a word. The preparation cache calls
        this on every entry it loads (:func:`asr.data.dataset.cached_global_stats`).
        """
        if self.count <= 0:
            raise ValueError(f"statistics over {self.count} frames: no frames")
        if not (torch.isfinite(self.sum).all() and torch.isfinite(self.sum_squares).all()):
            raise ValueError("the statistics hold NaN or infinite values")
        if not (0.0 < self.std_floor < float("inf")):
            raise ValueError(f"std_floor {self.std_floor} is not a positive number")
        mean_square = self.sum_squares / self.count
        variance = mean_square - self.mean * self.mean
        # E[x^2] - E[x]^2 of a constant dimension comes out a few ulps of E[x^2] below zero; far
        # more than float64 summation over 10^9 frames loses is a sum that is wrong.
        negative = variance < -1e-6 * mean_square.abs()
        if negative.any():
            raise ValueError(f"negative variance in {int(negative.sum())} of {self.dim} dimensions "
                             f"(the first: dimension {int(negative.nonzero()[0])}, {float(variance[negative][0]):.3g})")

    def save(self, path: str | Path) -> None:
        torch.save(self.state_dict(), Path(path))

    @classmethod
    def load(cls, path: str | Path) -> GlobalStats:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"MVN statistics file not found: {path}")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several unrelated types for a corrupt file
            raise ValueError(f"cannot read MVN statistics from {path}: {err}") from err
        if not isinstance(state, dict):
            raise ValueError(f"{path} does not hold MVN statistics (got {type(state).__name__})")
        try:
            return cls.from_state_dict(state)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err

    def _require_frames(self) -> None:
        if self.count == 0:
            raise ValueError("GlobalStats has no frames yet: call update() on the training features first")

    def __repr__(self) -> str:
        return f"GlobalStats(dim={self.dim}, count={self.count})"


def apply_mvn(feats: Tensor, mode: str, stats: GlobalStats | None = None, lengths: Tensor | None = None) -> Tensor:
    """Normalise ``feats (T, D)`` according to ``mode`` (``none | utterance | global``); float32 out.

    ``feats (B, T, D)`` with ``lengths (B,)``: a padded batch, each row normalised over its own valid frames.
    """
    if mode == "none":
        return feats
    if mode == "utterance":
        return utterance_mvn(feats) if lengths is None else utterance_mvn_batch(feats, lengths)
    if mode == "global":
        if stats is None:
            raise ValueError(
                "mvn: global needs global statistics, but none were given: accumulate them over the training set "
                "(asr.data.dataset.compute_global_stats), or load them from the model checkpoint"
            )
        return stats.normalize(feats)
    raise ValueError(f"mvn must be one of none, utterance, global; got {mode!r}")

"""How much of a batch is padding? The toolkit's BucketBatchSampler against lhotse's DynamicBucketingSampler.

    python benchmarks/batching_padding.py [--utterances 20000] [--epochs 3] [--budgets 12000 40000]

Both samplers batch the same manifest under the same budget: padded feature
frames per batch (``data.max_frames_per_batch``: batch size x longest
utterance), which for lhotse is ``max_duration`` in seconds of 10 ms frames
(its effective batch duration is also batch size x longest cut). Padding share
= padded frames / all frames of the batch tensors, summed over an epoch, and
averaged over ``--epochs`` shuffled epochs; the number of batches (optimizer
steps per epoch) is printed beside it. No timing: the figures are the same on
any machine.

The manifests are synthetic (no large corpus ships with the toolkit; the
shared data's few dozen real utterances say nothing about a corpus): lhotse
dummy cuts whose durations are drawn here, with a fixed seed, from

- ``read``: a gamma distribution (shape 8, scale 1.6 s) clipped to 1-20 s,
  mean about 12.8 s, like the utterances of a read-speech corpus such as
  LibriSpeech's training sets (not fitted to it);
- ``segments``: a log-normal distribution (median 2.7 s, sigma 0.8) clipped
  to 0.3-20 s: many short segments and a long tail, like the segments of a
  conversational corpus read through a Kaldi ``segments`` file or lhotse
  supervisions.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from lhotse import CutSet
from lhotse.dataset import DynamicBucketingSampler
from lhotse.testing.dummies import dummy_cut

from asr.data.batching import BucketBatchSampler
from features.config import FeatureConfig
from features.filterbank import num_frames

FRAME_SHIFT = 0.01  # seconds per feature frame (features.frame_shift_ms default)


def durations(kind: str, count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "read":
        return np.clip(rng.gamma(8.0, 1.6, count), 1.0, 20.0).round(2)
    if kind == "segments":
        return np.clip(rng.lognormal(1.0, 0.8, count), 0.3, 20.0).round(2)
    raise ValueError(kind)


def padding(batches: list[list[int]], frames: list[int]) -> tuple[float, int]:
    """(padded frames / all frames of the padded batches, number of batches)."""
    total = sum(len(b) * max(frames[i] for i in b) for b in batches)
    real = sum(frames[i] for b in batches for i in b)
    return (total - real) / total, len(batches)


def toolkit(frames: list[int], budget: int, epochs: int) -> tuple[float, float]:
    sampler = BucketBatchSampler(frames, budget, shuffle=True, seed=0)
    shares, counts = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        share, count = padding(list(sampler), frames)
        shares.append(share)
        counts.append(count)
    return float(np.mean(shares)), float(np.mean(counts))


def lhotse_sampler(cuts: CutSet, frames: list[int], budget: int, epochs: int, buckets: int) -> tuple[float, float]:
    index = {cut.id: i for i, cut in enumerate(cuts)}
    # It warns that an eager CutSet saves no memory: true, and beside the point here.
    warnings.filterwarnings("ignore", message="You are using DynamicBucketingSampler with an eagerly read CutSet")
    sampler = DynamicBucketingSampler(
        cuts, max_duration=budget * FRAME_SHIFT, num_buckets=buckets, shuffle=True, seed=0,
        buffer_size=len(cuts),  # the whole manifest in the buffer: its best case
    )
    shares, counts = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        batches = [[index[c.id] for c in batch] for batch in sampler]
        assert sorted(i for b in batches for i in b) == list(range(len(frames))), "every cut once per epoch"
        share, count = padding(batches, frames)
        shares.append(share)
        counts.append(count)
    return float(np.mean(shares)), float(np.mean(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--utterances", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--budgets", type=int, nargs="+", default=[12000, 40000], help="max_frames_per_batch values")
    args = parser.parse_args()
    config = FeatureConfig()
    print("manifest  budget(frames)  sampler                          padding  batches/epoch")
    for kind in ("read", "segments"):
        seconds = durations(kind, args.utterances)
        cuts = CutSet.from_cuts(dummy_cut(i, duration=float(d)) for i, d in enumerate(seconds))
        frames = [num_frames(round(d * config.sample_rate), config) for d in seconds]
        for budget in args.budgets:
            rows = [("asr BucketBatchSampler", toolkit(frames, budget, args.epochs))]
            for buckets in (10, 30):
                rows.append((f"lhotse Dynamic..., {buckets} buckets", lhotse_sampler(cuts, frames, budget, args.epochs, buckets)))
            for name, (share, count) in rows:
                print(f"{kind:9s} {budget:14d}  {name:32s} {100 * share:6.2f}%  {count:13.1f}")


if __name__ == "__main__":
    main()

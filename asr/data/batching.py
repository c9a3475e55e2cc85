"""Length-bucketed dynamic batches and the collate function that pads them.

Batches are filled under a budget of *padded* feature frames
(batch size x longest utterance in the batch), because that, not the number
of utterances, is what sets memory and compute: a batch of short utterances
holds many, a batch of long ones few. Sorting by length before filling keeps
padding small.

``data.pad_frames_to`` (:func:`padded_frames`) pads each batch's frames further, up to a multiple or
to one of a few fixed lengths, so that an epoch meets a few dozen batch shapes instead of hundreds:
on a GPU, what is prepared once per shape (CUDA graphs, an attention backend's plan) is then
prepared once. The padded length is what the budget counts, so a padded batch holds no more frames
than the budget either; every model masks the padding (tests/test_padding_equivalence.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch.utils.data import Sampler

from asr.data.padding import PadFramesTo, check_pad_frames_to, padded_frames
from asr.data.report import Skip
from asr.data.tokenizer import PAD_ID
from features.pipeline import AudioBatch, FeaturePipeline


def batch_shapes(batches: Sequence[Sequence[int]], num_frames: Sequence[int], pad_to: PadFramesTo = 1) -> list[tuple[int, int]]:
    """(utterances, padded frames) of each of ``batches`` (indices into ``num_frames``), as collated."""
    return [(len(batch), padded_frames(max(num_frames[i] for i in batch), pad_to)) for batch in batches if batch]


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices of similar length, under a padded-frame budget.

    num_frames:           feature frames of each utterance (an estimate from its duration is enough).
    max_frames_per_batch: budget: ``len(batch) * padded_frames(max(num_frames of batch)) <= max_frames_per_batch``.
                          An utterance longer than the whole budget is not dropped: it gets a
                          batch of its own (the only way such a batch exceeds the budget), so
                          filter very long utterances beforehand (``data.max_duration``).
    pad_frames_to:        the padding the batches will get (:func:`padded_frames`), which the
                          budget counts; the batches are a function of it, so a resumed run must
                          keep it (it does: a data key).
    shuffle:              shuffle the order of batches, and which of equal-length utterances share
                          one, differently each epoch; the draw depends only on ``seed + epoch``
                          (call :meth:`set_epoch` before each epoch). Without shuffling, batches
                          come shortest first.
    shortest_first_epochs: a length curriculum (SortaGrad, Amodei et al. 2016): in the first N
                          epochs the batches come shortest first (ties still drawn per epoch), so
                          the model learns to align on short utterances before it meets long ones.
    num_replicas, rank:   distributed training: rank ``r`` gets batches ``r, r + R, r + 2R, ...``
                          of the epoch's list, a disjoint share. So that every rank takes the same
                          number of steps (a rank that stops early would hang the others' gradient
                          all-reduce), the list is padded by repeating batches from its start;
                          with ``drop_last`` the tail that does not divide evenly is dropped instead.

    Every utterance is in exactly one batch per epoch (apart from the padding repeats).
    """

    def __init__(
        self,
        num_frames: Sequence[int],
        max_frames_per_batch: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
        shortest_first_epochs: int = 0,
        pad_frames_to: PadFramesTo = 1,
    ):
        check_pad_frames_to(pad_frames_to)
        if max_frames_per_batch <= 0:
            raise ValueError(f"max_frames_per_batch must be positive, got {max_frames_per_batch}")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"need num_replicas >= 1 and 0 <= rank < num_replicas, got {num_replicas}, {rank}")
        if any(n < 0 for n in num_frames):
            raise ValueError("num_frames must be non-negative")
        self.num_frames = [int(n) for n in num_frames]
        self.max_frames_per_batch = max_frames_per_batch
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.shortest_first_epochs = shortest_first_epochs
        self.pad_frames_to = pad_frames_to
        self.epoch = 0
        # Ties are the only thing the epoch changes in the packing, and packing depends
        # only on the sorted lengths, so the number of batches is the same every epoch.
        self._num_batches = len(self._pack(sorted(range(len(self.num_frames)), key=self.num_frames.__getitem__)))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        """All batches of the current epoch (every rank's), before the split between ranks."""
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.num_frames)))
        if self.shuffle:
            rng.shuffle(order)  # the stable sort below then breaks length ties in a random order
        order.sort(key=self.num_frames.__getitem__)
        batches = self._pack(order)
        if self.shuffle and self.epoch >= self.shortest_first_epochs:
            rng.shuffle(batches)
        return batches

    def _pack(self, order: list[int]) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        for index in order:  # ascending length, so the newest item is the longest in the batch
            padded = padded_frames(self.num_frames[index], self.pad_frames_to)
            if current and (len(current) + 1) * padded > self.max_frames_per_batch:
                batches.append(current)
                current = []
            current.append(index)
        if current:
            batches.append(current)
        return batches

    def _per_rank(self) -> int:
        if self.drop_last:
            return self._num_batches // self.num_replicas
        return math.ceil(self._num_batches / self.num_replicas)

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        total = self._per_rank() * self.num_replicas
        while len(batches) < total:  # pad by repeating from the start (several rounds if needed)
            batches.extend(batches[: total - len(batches)])
        return iter(batches[self.rank : total : self.num_replicas])

    def __len__(self) -> int:
        return self._per_rank()


@dataclass
class Batch:
    """A padded mini-batch.

    ids:             (B,) utterance ids, in batch order.
    features:        (B, T, D) float32, zero after each utterance's length; None while the batch
                     holds ``audio`` instead (features computed on the model's device, see :func:`with_features`).
    feature_lengths: (B,) long, valid frames per row (mask: ``lengths_to_mask``, True = valid); known
                     before the features are (from the sample counts).
    tokens:          (B, L) long, padded with the PAD id (0); no <sos>/<eos>.
    token_lengths:   (B,) long.
    skipped:         the items of this batch left out because their audio failed where it
                     was read; when every item failed, B is 0.
    audio:           the padded, prepared audio the features are to be computed from, or None.
    frames:          T, the padded length the features have or will have (``data.pad_frames_to``:
                     more than the longest row when the batches are padded further).
    """

    ids: list[str]
    features: torch.Tensor | None
    feature_lengths: torch.Tensor
    tokens: torch.Tensor
    token_lengths: torch.Tensor
    skipped: list[Skip] = field(default_factory=list)
    audio: AudioBatch | None = None
    frames: int | None = None  # None: the longest row's (a Batch made by an older caller)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """Called by ``DataLoader(pin_memory=True)`` for faster host-to-GPU copies."""
        return self._map(lambda t: t.pin_memory())

    def _map(self, move) -> "Batch":
        features = None if self.features is None else move(self.features)
        tensors = (self.feature_lengths, self.tokens, self.token_lengths)
        audio = None if self.audio is None else self.audio._map(move)
        return Batch(self.ids, features, *(move(t) for t in tensors), skipped=self.skipped, audio=audio,
                     frames=self.frames)

    def __len__(self) -> int:
        return len(self.ids)


def collate(items: Sequence[dict], pad_frames_to: PadFramesTo = 1) -> Batch:
    """Pad dataset items (``{"id", "features" (T, D), "tokens" (L,)}``) into a :class:`Batch`, order kept,
    their frames to ``padded_frames(longest, pad_frames_to)``.

    Items ``{"id", "skip": Skip}`` (audio that failed to read, see
    :class:`asr.data.dataset.SpeechDataset`) are left out and listed in ``Batch.skipped``.
    Items holding ``"audio"`` (:class:`~features.pipeline.PreparedAudio`) instead of features are
    padded into ``Batch.audio``; :func:`with_features` computes their features later (and pads them
    to ``Batch.frames``).
    """
    if not items:
        raise ValueError("cannot collate an empty batch")
    skipped = [item["skip"] for item in items if "skip" in item]
    items = [item for item in items if "skip" not in item]
    if not items:
        no_lengths = torch.zeros(0, dtype=torch.long)
        no_tokens = torch.zeros(0, 0, dtype=torch.long)
        return Batch([], torch.zeros(0, 0, 0), no_lengths, no_tokens, no_lengths.clone(), skipped=skipped)
    token_lengths = torch.tensor([item["tokens"].shape[0] for item in items], dtype=torch.long)
    tokens = torch.full((len(items), int(token_lengths.max())), PAD_ID, dtype=torch.long)
    for row, item in enumerate(items):
        tokens[row, : token_lengths[row]] = item["tokens"]
    ids = [item["id"] for item in items]
    if any("audio" in item for item in items):
        if not all("audio" in item for item in items):
            raise ValueError("a batch mixes items with features and items with audio")
        audio = AudioBatch.pad([item["audio"] for item in items])
        frames = padded_frames(int(audio.num_frames.max()), pad_frames_to)
        return Batch(ids, None, audio.num_frames.clone(), tokens, token_lengths, skipped=skipped, audio=audio,
                     frames=frames)
    dims = {item["features"].shape[1] for item in items}
    if len(dims) != 1:
        raise ValueError(f"feature dimensions differ within a batch: {sorted(dims)}")
    feature_lengths = torch.tensor([item["features"].shape[0] for item in items], dtype=torch.long)
    frames = padded_frames(int(feature_lengths.max()), pad_frames_to)
    features = torch.zeros(len(items), frames, dims.pop(), dtype=torch.float32)
    for row, item in enumerate(items):
        features[row, : feature_lengths[row]] = item["features"]
    return Batch(ids, features, feature_lengths, tokens, token_lengths, skipped=skipped, frames=frames)


def collate_padded(pad_frames_to: PadFramesTo):
    """:func:`collate` with ``pad_frames_to``, as a DataLoader's ``collate_fn`` (picklable for its workers)."""
    return partial(collate, pad_frames_to=pad_frames_to)


def with_features(batch: Batch, pipeline: FeaturePipeline) -> Batch:
    """``batch`` with its features: unchanged when the loader computed them; otherwise computed from
    ``batch.audio`` by ``pipeline``, batched, on the device the audio is on (move the batch to the
    model's device first). Call it outside autocast: the features are float32 either way."""
    if batch.audio is None:
        return batch
    features, lengths = pipeline.features(batch.audio)
    if batch.frames is not None and batch.frames > features.size(1):  # zeros, as after every row's length
        features = torch.nn.functional.pad(features, (0, 0, 0, batch.frames - features.size(1)))
    return Batch(batch.ids, features, lengths, batch.tokens, batch.token_lengths, skipped=batch.skipped,
                 frames=features.size(1))

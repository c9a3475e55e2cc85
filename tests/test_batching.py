"""BucketBatchSampler and collate."""

import random

import pytest
import torch

from asr.data.batching import Batch, BucketBatchSampler, collate
from asr.data.tokenizer import PAD_ID
from asr.models.common import lengths_to_mask

BUDGET = 6000


@pytest.fixture(scope="module")
def lengths():
    rng = random.Random(1)
    return [rng.randint(50, 1500) for _ in range(400)] + [1500] * 20  # ties at the top


def padded(batch, lengths):
    return len(batch) * max(lengths[i] for i in batch)


def test_every_index_once_and_budget_respected(lengths):
    sampler = BucketBatchSampler(lengths, BUDGET, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(padded(b, lengths) <= BUDGET for b in batches)
    assert len({len(b) for b in batches}) > 3  # dynamic batch size: short utterances travel in bigger batches
    # bucketing by length keeps padding small
    assert sum(padded(b, lengths) for b in batches) < 1.1 * sum(lengths)


def test_batches_fill_the_budget(lengths):
    sampler = BucketBatchSampler(lengths, BUDGET, shuffle=False)
    batches = list(sampler)
    for batch, following in zip(batches, batches[1:]):
        # the next (longer) utterance would have broken the budget
        assert (len(batch) + 1) * lengths[following[0]] > BUDGET
    assert [lengths[b[0]] for b in batches] == sorted(lengths[b[0]] for b in batches)  # shortest first


def test_deterministic_by_seed_and_different_across_epochs(lengths):
    a, b, c = (BucketBatchSampler(lengths, BUDGET, seed=s) for s in (5, 5, 6))
    assert list(a) == list(b)
    assert list(a) != list(c)
    first = list(a)
    a.set_epoch(1)
    second = list(a)
    assert first != second and len(first) == len(second)
    b.set_epoch(1)
    assert list(b) == second  # the epoch's order depends only on seed + epoch


def test_utterance_over_budget_gets_its_own_batch():
    lengths = [100, 200, 5000, 150, 120]
    batches = list(BucketBatchSampler(lengths, 1000, seed=0))
    assert [2] in batches
    assert sorted(i for b in batches for i in b) == list(range(5))
    assert all(padded(b, lengths) <= 1000 for b in batches if b != [2])


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_distributed_ranks_are_disjoint_equal_and_covering(lengths, replicas):
    total = len(list(BucketBatchSampler(lengths, BUDGET, seed=2)))
    per_rank = []
    for rank in range(replicas):
        sampler = BucketBatchSampler(lengths, BUDGET, seed=2, num_replicas=replicas, rank=rank)
        sampler.set_epoch(3)
        per_rank.append(list(sampler))
        assert len(per_rank[-1]) == len(sampler)
    assert len({len(r) for r in per_rank}) == 1  # same number of steps on every rank
    assert len(per_rank[0]) * replicas - total < replicas  # at most R-1 padding batches
    all_batches = [tuple(b) for r in per_rank for b in r]
    assert set(i for b in all_batches for i in b) == set(range(len(lengths)))  # covering
    distinct = set(all_batches)
    assert len(distinct) == total  # only the padding repeats a batch
    repeats = len(all_batches) - total
    for rank_a in range(replicas):
        for rank_b in range(rank_a + 1, replicas):
            shared = set(map(tuple, per_rank[rank_a])) & set(map(tuple, per_rank[rank_b]))
            assert len(shared) <= repeats


def test_drop_last_drops_the_uneven_tail(lengths):
    total = len(list(BucketBatchSampler(lengths, BUDGET)))
    replicas = 3 if total % 3 else 4
    assert total % replicas
    shares = [list(BucketBatchSampler(lengths, BUDGET, num_replicas=replicas, rank=r, drop_last=True))
              for r in range(replicas)]
    assert all(len(s) == total // replicas for s in shares)
    flat = [i for s in shares for b in s for i in b]
    assert len(flat) == len(set(flat))  # no repeats at all


def test_collate_pads_with_zeros_and_pad_id():
    torch.manual_seed(0)
    items = [
        {"id": f"u{n}", "features": torch.randn(t, 5), "tokens": torch.randint(4, 30, (l,))}
        for n, (t, l) in enumerate([(7, 3), (12, 1), (4, 6)])
    ]
    batch = collate(items)
    assert isinstance(batch, Batch) and batch.ids == ["u0", "u1", "u2"] and len(batch) == 3
    assert batch.features.shape == (3, 12, 5) and batch.features.dtype == torch.float32
    assert batch.tokens.shape == (3, 6) and batch.tokens.dtype == torch.long
    assert batch.feature_lengths.tolist() == [7, 12, 4] and batch.feature_lengths.dtype == torch.long
    assert batch.token_lengths.tolist() == [3, 1, 6] and batch.token_lengths.dtype == torch.long
    feature_mask = lengths_to_mask(batch.feature_lengths, 12)
    token_mask = lengths_to_mask(batch.token_lengths, 6)
    assert not batch.features[~feature_mask].any()
    assert (batch.tokens[~token_mask] == PAD_ID).all()
    for row, item in enumerate(items):
        assert batch.features[row, : len(item["features"])].equal(item["features"])
        assert batch.tokens[row, : len(item["tokens"])].equal(item["tokens"])

    moved = batch.to("cpu")
    assert moved.ids == batch.ids and moved.features.equal(batch.features)


def test_collate_rejects_mixed_feature_dims():
    items = [{"id": "a", "features": torch.zeros(3, 5), "tokens": torch.ones(1, dtype=torch.long)},
             {"id": "b", "features": torch.zeros(3, 6), "tokens": torch.ones(1, dtype=torch.long)}]
    with pytest.raises(ValueError, match="dimensions"):
        collate(items)


def test_a_length_curriculum_gives_the_first_epochs_shortest_first(lengths):
    sampler = BucketBatchSampler(lengths, BUDGET, shuffle=True, seed=3, shortest_first_epochs=2)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        longest = [max(lengths[i] for i in batch) for batch in sampler]
        assert longest == sorted(longest)
    sampler.set_epoch(2)
    longest = [max(lengths[i] for i in batch) for batch in sampler]
    assert longest != sorted(longest)  # shuffled again from here on
    # Every utterance still comes once per epoch.
    assert sorted(i for batch in sampler for i in batch) == list(range(len(lengths)))

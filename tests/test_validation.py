"""Which validation batches are decoded for WER (asr.training.validation.decoded_batches)."""

import random

import pytest

from asr.training.validation import decoded_batches


def test_every_batch_when_no_limit_or_the_limit_covers_them_all():
    sizes = [3, 5, 2]
    assert decoded_batches(sizes, None) == {0, 1, 2}
    assert decoded_batches(sizes, 10) == {0, 1, 2}
    assert decoded_batches(sizes, 500) == {0, 1, 2}


@pytest.mark.parametrize("seed", range(5))
def test_about_the_asked_number_of_utterances_spread_over_the_whole_list(seed):
    rng = random.Random(seed)
    # shortest first, as validation batches come: many utterances in the first batches, few in the last
    sizes = sorted((rng.randint(2, 60) for _ in range(rng.randint(40, 120))), reverse=True)
    limit = sum(sizes) // rng.randint(3, 8)
    chosen = decoded_batches(sizes, limit)
    decoded = sum(sizes[i] for i in chosen)
    assert limit - max(sizes) <= decoded <= limit + max(sizes)
    # each quarter of the utterances (by length) gets its share of the decoded ones, within a batch or two
    total, seen = sum(sizes), 0
    per_quarter = [0, 0, 0, 0]
    for index, size in enumerate(sizes):
        if index in chosen:
            per_quarter[min(3, 4 * seen // total)] += size
        seen += size
    for count in per_quarter:
        assert abs(count - limit / 4) <= 2 * max(sizes) + 1, per_quarter


def test_the_longest_utterances_are_decoded_where_the_first_n_would_miss_them():
    sizes = [20] * 25 + [5] * 10  # 500 short utterances, then 50 long ones in batches of 5
    chosen = decoded_batches(sizes, 110)
    assert sum(i >= 25 for i in chosen) == 2  # 50 of 550 utterances: a fifth of 110, two batches of 5
    assert sum(sizes[i] for i in chosen) <= 120

"""Which validation utterances are decoded for WER (asr.training.validation.decoded_counts)."""

import random

import pytest

from asr.training.validation import decoded_counts, spread_rows


def test_every_utterance_when_no_limit_or_the_limit_covers_them_all():
    sizes = [3, 5, 2]
    assert decoded_counts(sizes, None) == sizes
    assert decoded_counts(sizes, 10) == sizes
    assert decoded_counts(sizes, 500) == sizes


@pytest.mark.parametrize("limit", [1, 4, 9, 19])
def test_exactly_the_asked_number_even_when_every_batch_is_larger_than_it(limit):
    # issue 49: 20 dev utterances in one batch and a cap of 4 decoded nothing, and the run crashed
    assert sum(decoded_counts([20], limit)) == limit
    assert sum(decoded_counts([20, 20, 20], limit)) == limit


@pytest.mark.parametrize("seed", range(5))
def test_the_asked_number_of_utterances_spread_over_the_whole_list(seed):
    rng = random.Random(seed)
    # shortest first, as validation batches come: many utterances in the first batches, few in the last
    sizes = sorted((rng.randint(2, 60) for _ in range(rng.randint(40, 120))), reverse=True)
    limit = sum(sizes) // rng.randint(3, 8)
    counts = decoded_counts(sizes, limit)
    assert sum(counts) == limit
    assert all(0 <= c <= s for c, s in zip(counts, sizes))
    # each quarter of the utterances (by position) gets its share of the decoded ones, within one
    total, seen = sum(sizes), 0
    per_quarter = [0, 0, 0, 0]
    for size, count in zip(sizes, counts):
        for row in spread_rows(size, count):
            per_quarter[min(3, 4 * (seen + row) // total)] += 1
        seen += size
    for count in per_quarter:
        assert abs(count - limit / 4) <= 2, per_quarter


def test_the_longest_utterances_are_decoded_where_the_first_n_would_miss_them():
    sizes = [20] * 25 + [5] * 10  # 500 short utterances, then 50 long ones in batches of 5
    counts = decoded_counts(sizes, 110)
    assert sum(counts[25:]) == 10  # the last 50 of 550 utterances hold their share, 50/550 of 110
    assert sum(counts) == 110


def test_spread_rows_picks_distinct_rows_across_the_batch():
    assert spread_rows(20, 4) == [2, 7, 12, 17]
    assert spread_rows(3, 5) == [0, 1, 2]
    assert spread_rows(7, 0) == []


def test_a_negative_validation_interval_is_refused_naming_the_key():
    from helpers import LAS_RECIPE

    from asr.config import ConfigError
    from asr.experiment import load_experiment_config

    with pytest.raises(ConfigError, match=r"train: valid_every_steps must be >= 0 \(0: at epoch ends only\), got -1"):
        load_experiment_config(LAS_RECIPE, ["train.valid_every_steps=-1"])
    assert load_experiment_config(LAS_RECIPE, ["train.valid_every_steps=250"]).train.valid_every_steps == 250

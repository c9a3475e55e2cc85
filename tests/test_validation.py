"""Which validation utterances are decoded for WER (asr.training.validation.decoded_ids)."""

import random
from types import SimpleNamespace

import pytest

from asr.training.validation import decoded_ids, decoded_positions, spread_rows


def test_every_utterance_when_no_limit_or_the_limit_covers_them_all():
    assert decoded_positions(10, None) == decoded_positions(10, 10) == decoded_positions(10, 500) == list(range(10))


@pytest.mark.parametrize("limit", [1, 4, 9, 19])
def test_exactly_the_asked_number_of_distinct_utterances(limit):
    # issue 49: 20 dev utterances in one batch and a cap of 4 decoded nothing, and the run crashed
    for total in (20, 60):
        positions = decoded_positions(total, limit)
        assert len(set(positions)) == len(positions) == limit and all(0 <= p < total for p in positions)


@pytest.mark.parametrize("seed", range(5))
def test_the_asked_number_of_utterances_spread_over_the_whole_list(seed):
    rng = random.Random(seed)
    total = rng.randint(200, 2000)
    limit = total // rng.randint(3, 8)
    per_quarter = [0, 0, 0, 0]
    for position in decoded_positions(total, limit):
        per_quarter[4 * position // total] += 1
    for count in per_quarter:  # each quarter of the utterances (by length) gets its share, within one
        assert abs(count - limit / 4) <= 2, per_quarter


def test_the_longest_utterances_are_decoded_where_the_first_n_would_miss_them():
    # 500 short utterances, then 50 long ones: the long ones hold their share, 50/550 of 110
    assert sum(p >= 500 for p in decoded_positions(550, 110)) == 10


def test_the_same_utterances_are_decoded_whatever_the_batches():
    """issue 81: asr.validate --max-frames-per-batch A B C scored another sample at each budget (WER 93.9,
    87.1 and 100% for one model). The choice is made from the utterances and their lengths alone."""
    rng = random.Random(0)
    frames = [rng.randint(50, 800) for _ in range(97)]
    utterances = [SimpleNamespace(id=f"u{i}") for i in range(len(frames))]
    dataset = type("Dev", (), {"utterances": utterances, "num_frames": lambda self: frames,
                               "__len__": lambda self: len(frames)})()
    chosen = decoded_ids(dataset, 12)
    assert len(chosen) == 12
    lengths = sorted(frames[int(u[1:])] for u in chosen)
    assert lengths[0] < sorted(frames)[20] and lengths[-1] > sorted(frames)[-20]  # spread over the lengths
    assert decoded_ids(dataset, 97) is None and decoded_ids(dataset, None) is None

    def decoded_at(batch_size: int, unreadable: str | None = None) -> list[str]:
        """The ids validate() decodes when the dev set, in length order, comes in batches of ``batch_size``."""
        import torch

        from asr.training import validation

        order = sorted(range(len(frames)), key=frames.__getitem__)
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]

        class Batch(SimpleNamespace):
            def __len__(self):
                return len(self.ids)

            def to(self, device):
                return self

        def batch_of(indices):
            ids = [utterances[i].id for i in indices if utterances[i].id != unreadable]
            return Batch(ids=ids, skipped=[], audio=None, features=None, feature_lengths=None,
                         tokens=torch.zeros(len(ids), 1, dtype=torch.long), token_lengths=[1] * len(ids))

        decoded = []
        model = type("Model", (), {"training": False, "eval": lambda self: None, "train": lambda self, mode: None,
                                   "__call__": lambda self, *inputs: None})()
        originals = validation._decode_rows, validation.metrics_for
        validation._decode_rows = lambda model, output, batch, rows, *rest: decoded.extend(batch.ids[r] for r in rows) or []
        validation.metrics_for = lambda model: []
        try:
            iterable = type("Loader", (), {"__iter__": lambda self: iter([batch_of(b) for b in batches]),
                                           "dataset": dataset, "batch_sampler": batches})()
            validation.validate(model, iterable, SimpleNamespace(decode=lambda ids: ""), "cpu", None, 12)
        finally:
            validation._decode_rows, validation.metrics_for = originals
        return decoded

    assert sorted(decoded_at(5)) == sorted(decoded_at(16)) == sorted(decoded_at(97)) == sorted(chosen)
    missing = sorted(chosen)[0]
    replaced = decoded_at(16, unreadable=missing)  # one that cannot be read is replaced: the count holds
    assert len(set(replaced)) == 12 and missing not in replaced


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

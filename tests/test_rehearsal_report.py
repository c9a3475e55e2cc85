"""The attention measure of benchmarks/rehearsal_report.py: it must tell an alignment that moves along the
audio from attention collapsed onto one frame (which an earlier version of it scored as aligned)."""

import sys

import numpy as np

from helpers import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from rehearsal_report import monotonicity  # noqa: E402


def attention_peaked_at(peaks, frames):
    weights = np.full((len(peaks), frames), 0.01)
    weights[np.arange(len(peaks)), peaks] = 1.0
    return weights / weights.sum(axis=1, keepdims=True)


def test_a_diagonal_alignment_scores_as_aligned():
    measure = monotonicity(attention_peaked_at(np.linspace(0, 99, 40).round().astype(int), 100))
    assert measure["spearman"] > 0.99
    assert measure["steps_moving_forward"] > 0.9
    assert measure["steps_at_the_last_5pct"] < 0.1


def test_attention_stuck_on_the_last_frames_does_not():
    rng = np.random.default_rng(0)
    peaks = np.full(60, 99)
    peaks[rng.choice(60, 3, replace=False)] = rng.integers(0, 90, 3)  # a few stray steps
    measure = monotonicity(attention_peaked_at(peaks, 100))
    assert abs(measure["spearman"]) < 0.5
    assert measure["steps_moving_forward"] < 0.1
    assert measure["steps_at_the_last_5pct"] > 0.9

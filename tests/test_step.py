"""asr/training/step.py: the gradient norm of each module group, as the trainer logs it."""

from __future__ import annotations

import math

import pytest
import torch

from asr.data.batching import Batch
from asr.models.las import LAS
from asr.training.step import TrainingStep, gradient_groups
from test_las import random_batch, small_config
from test_transformer import make_model


def las_step(grad_clip: float) -> TrainingStep:
    torch.manual_seed(0)
    model = LAS(small_config(ctc_weight=0.3), input_dim=6, vocab_size=10)
    return TrainingStep(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_clip=grad_clip)


def batch_of(tensors) -> Batch:
    features, feature_lengths, tokens, token_lengths = tensors
    return Batch([f"u{i}" for i in range(len(features))], features, feature_lengths, tokens, token_lengths)


def expected_norms(model: torch.nn.Module, prefixes: dict[str, str]) -> dict[str, float]:
    """The norm of each group's gradients, grouped by the given name prefixes (longest first)."""
    squares: dict[str, float] = {}
    for name, p in model.named_parameters():
        group = next(g for prefix, g in sorted(prefixes.items(), key=lambda kv: -len(kv[0])) if name.startswith(prefix))
        squares[group] = squares.get(group, 0.0) + float(p.grad.double().pow(2).sum())
    return {group: math.sqrt(total) for group, total in squares.items()}


@pytest.mark.parametrize("grad_clip", [0.0, 1e-3])
def test_las_group_norms_are_taken_before_clipping_and_add_up_to_the_global_norm(grad_clip):
    step = las_step(grad_clip)
    assert step.backward(batch_of(random_batch())).loss is not None
    prefixes = {"listener.": "listener", "speller.": "speller", "speller.attention.": "attention", "ctc.": "ctc"}
    expected = expected_norms(step.model, prefixes)
    outcome = step.update(group_norms=True)
    assert set(outcome.group_norms) == {"listener", "speller", "attention", "ctc"}
    for group, norm in expected.items():
        assert outcome.group_norms[group] == pytest.approx(norm, rel=1e-5), group
    total = math.sqrt(sum(n**2 for n in outcome.group_norms.values()))
    assert total == pytest.approx(outcome.grad_norm, rel=1e-5)
    if grad_clip:  # the clipped gradient is far smaller than what was reported
        assert outcome.grad_norm > 100 * grad_clip


def test_group_norms_only_when_asked_for_and_transformer_groups():
    step = las_step(0.0)
    step.backward(batch_of(random_batch()))
    assert step.update().group_norms is None
    model = make_model(ctc_weight=0.3)
    assert set(gradient_groups(model).values()) == {"encoder", "decoder", "ctc"}
    wrapped = torch.nn.Module()
    wrapped.module = model  # as DistributedDataParallel holds it
    assert gradient_groups(wrapped) == gradient_groups(model)

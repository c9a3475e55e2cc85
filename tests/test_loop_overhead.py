"""benchmarks/loop_overhead.py: its stand-in has the recipe model's parameter tensors, and both loops run it."""

import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import loop_overhead  # noqa: E402

from asr.experiment import load_experiment_config  # noqa: E402
from asr.models.registry import build_model  # noqa: E402


def test_the_stand_in_has_the_recipe_models_tensors_groups_and_schedules():
    config = load_experiment_config(PROJECT_ROOT / "recipes" / "librispeech100_transformer.yaml")
    real = build_model(config.model, 80, SimpleNamespace(pad_id=0, sos_id=1, eos_id=2, vocab_size=300))
    model = loop_overhead.stand_in(config, 80, 300)
    assert len(list(model.parameters())) == len(list(real.parameters()))
    assert {name.split(".")[0] for name, _ in model.named_parameters()} == {n.split(".")[0] for n, _ in real.named_parameters()}
    assert model.scheduled() == real.scheduled()
    output = model(torch.zeros(2, 5, 80), torch.tensor([5, 3]), torch.ones(2, 2, dtype=torch.long), torch.tensor([2, 1]))
    output.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.slow
def test_both_loops_run_the_recipes_batches_and_the_report_compares_them(capsys):
    row, = loop_overhead.main(["--recipes", "librispeech100.yaml", "--updates", "25", "--rounds", "1"])
    assert row["trainer_ms"] > 0 and row["bare_ms"] > 0
    assert row["excess_ms"] == pytest.approx(row["trainer_ms"] - row["bare_ms"])
    assert "librispeech100.yaml" in capsys.readouterr().out

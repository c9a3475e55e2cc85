"""benchmarks/las_step.py --compare: one recipe's whole training step at each value of a key, in one run."""

import sys
from types import SimpleNamespace

import pytest
import torch

from helpers import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import las_step  # noqa: E402


@pytest.mark.slow  # builds and steps two LAS models of the rehearsal's size
def test_compare_builds_each_value_and_times_it_in_the_same_run(capsys):
    args = SimpleNamespace(batch=1, seconds=0.5, tokens_per_second=6.0, warmup=0, repeats=2)
    rows = las_step.compare_recipe("rehearsal_las.yaml", "model.layer_norm", ["both", "none"], args,
                                   torch.device("cpu"))
    (both, both_seconds, both_parameters), (none, none_seconds, none_parameters) = rows
    assert (both, none) == ("both", "none") and both_seconds > 0 and none_seconds > 0
    # the override reached the model: LN's gains and biases are parameters the plain LSTM lacks
    assert both_parameters > none_parameters
    out = capsys.readouterr().out
    assert "model.layer_norm=both" in out and "(1.000 x both)" in out and "model.layer_norm=none" in out


def test_compare_wants_a_key_and_two_values():
    with pytest.raises(SystemExit) as exit_info:
        las_step.main(["--device", "cpu", "--recipes", "rehearsal_las.yaml", "--compare", "model.layer_norm=both"])
    assert exit_info.value.code == 2

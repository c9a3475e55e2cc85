"""benchmarks/ln_init_gradients.py --through-time: a gradient's decay back through time in one LN-LSTM cell."""

import math
import sys

import pytest
import torch
from helpers import PROJECT_ROOT

from asr.models.lnlstm.cells import LNLSTMCell

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from ln_init_gradients import _decay  # noqa: E402


def cell(variant: str | None, seed: int = 0) -> LNLSTMCell:
    torch.manual_seed(seed)
    return LNLSTMCell(6, 8, layer_norm=variant is not None, variant=variant or "ba2016", backend="reference")


def test_the_step_by_step_gradient_is_autograd_through_the_whole_sequence():
    """The measure back-propagates one step at a time; unrolled in one graph, autograd gives the same norms."""
    lstm, x = cell("ba2016"), torch.randn(30, 6)
    direction = torch.nn.functional.normalize(torch.randn(8), dim=0)
    measured = _decay(lstm, x, direction)
    gates = lstm.input_gates(x.unsqueeze(1))
    h, c = lstm.recurrent_step(gates[0], torch.zeros(1, 8), torch.zeros(1, 8))
    h, c = h.detach().requires_grad_(), c.detach().requires_grad_()
    first = (h, c)  # the first state the cell computed, as the next step's input
    for t in range(1, 30):  # one graph through every later step
        h, c = lstm.recurrent_step(gates[t], h, c)
    (direction @ h[0]).backward()
    first = torch.cat([first[0].grad, first[1].grad], 1).norm()
    assert measured["log10_last"] == pytest.approx(math.log10(float(first)), abs=1e-4)


def test_the_recurrent_norm_makes_the_decay_independent_of_the_recurrent_weights_scale():
    """ba2016 normalises W_h h on its own, so scaling W_h changes nothing the gradient sees; a plain LSTM's
    gradient decays more slowly with larger recurrent weights. That is why the recurrent norm undoes the small
    initialisation (docs/studies/ln_open_vocabulary.md)."""
    x = torch.randn(60, 6)
    direction = torch.nn.functional.normalize(torch.randn(8), dim=0)
    slopes = {}
    for variant in ("ba2016", None):
        for scale in (1.0, 3.0):
            lstm = cell(variant)
            with torch.no_grad():
                lstm.weight_h.mul_(scale)
            slopes[variant, scale] = _decay(lstm, x, direction)["slope"]
    assert slopes["ba2016", 3.0] == pytest.approx(slopes["ba2016", 1.0], abs=1e-4)
    assert slopes[None, 3.0] > slopes[None, 1.0] + 0.02

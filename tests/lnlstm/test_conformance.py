"""One conformance body for every LN-LSTM backend (asr/models/lnlstm/backends/): outputs and every
gradient against the reference path computed in float64, the definition.

Each backend runs in the widest dtype it supports: float64 for the reference and C++ paths
(agreement to round-off), float32 parameters for Triton (agreement to float32 round-off over a
few steps). Sizes are odd and small, rows have different lengths (0 included), and the cases
cover one and two directions, one to three layers, a given initial state, and the plain LSTM; the
tf_contrib cases run on the backends that compute that cell (the reference path and C++).
Triton runs on CPU under its interpreter (TRITON_INTERPRET=1, set for that case only) and on
CUDA where there is a GPU; the C++ case needs a compiler (a build failure fails it).
"""

from __future__ import annotations

import copy

import pytest
import torch

from asr.models.lnlstm import LNLSTM, LNLSTMCell
from helpers import load_triton_kernels

INTERPRETED = load_triton_kernels()

# (backend, device, dtype, tolerance relative to each tensor's largest magnitude)
BACKENDS = [
    pytest.param(("reference", "cpu", torch.float64, 1e-12), id="reference"),
    pytest.param(("cpp", "cpu", torch.float64, 1e-10), id="cpp"),
    pytest.param(
        ("triton", "cpu", torch.float32, 2e-5), id="triton-interpreter",
        marks=pytest.mark.skipif(not INTERPRETED, reason="needs triton, interpreted (no GPU here)"),
    ),
    pytest.param(
        ("triton", "cuda", torch.float32, 2e-5), id="triton-cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ),
]

CASES = {  # name: (LNLSTM options, lengths or None, with an initial state)
    "bidirectional-2-layers": (dict(bidirectional=True, num_layers=2), [6, 3, 0], True),
    "forward-3-layers": (dict(num_layers=3), [2, 6, 5], False),
    "plain-bidirectional": (dict(bidirectional=True, layer_norm=False), [6, 1, 4], True),
    "no-lengths": (dict(), None, True),
    "tf_contrib-bidirectional-2-layers": (
        dict(bidirectional=True, num_layers=2, variant="tf_contrib"), [6, 3, 0], True
    ),
    "tf_contrib-forward-no-state": (dict(variant="tf_contrib"), [2, 6, 5], False),
}
# The Triton kernels compute ba2016 and the plain LSTM only (asr/models/lnlstm/variants.py, fused_backends).
NOT_ON_TRITON = {"tf_contrib-bidirectional-2-layers", "tf_contrib-forward-no-state"}


@pytest.fixture
def on_backend(request, monkeypatch):
    """The backend under test, with TRITON_INTERPRET set for this test where Triton runs on CPU."""
    backend, device, _, _ = request.param
    if backend == "triton" and device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return request.param


def perturbed(module: torch.nn.Module) -> torch.nn.Module:
    """Every parameter moved by noise (LN gains and biases too, so each is seen in use), LN_h's gains
    halved: a contracting recurrence, so float32 round-off stays that of a few steps."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
        for cell in module.modules():
            if isinstance(cell, LNLSTMCell) and cell.ln_h is not None:
                cell.ln_h.weight.mul_(0.5)
    return module


def outputs_and_gradients(model, x, lengths, state) -> dict[str, torch.Tensor]:
    """y, h_n, c_n and the gradients of a fixed random linear loss of them with respect to x, the
    state and every parameter, as float64 on CPU."""
    x = x.clone().requires_grad_()
    state = None if state is None else tuple(s.clone().requires_grad_() for s in state)
    y, (h_n, c_n) = model(x, lengths, state)
    generator = torch.Generator().manual_seed(9)
    weights = [torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in (y, h_n, c_n)]
    loss = sum((t.double() * w.to(t.device)).sum() for t, w in zip((y, h_n, c_n), weights))
    inputs = {"x": x, **({} if state is None else {"h0": state[0], "c0": state[1]}), **dict(model.named_parameters())}
    grads = torch.autograd.grad(loss, list(inputs.values()))
    results = {"y": y, "h_n": h_n, "c_n": c_n, **{f"grad {name}": g for name, g in zip(inputs, grads)}}
    return {name: value.detach().double().cpu() for name, value in results.items()}


# Under Triton's interpreter the two deepest cases take over a second each: they run in the full suite only.
SLOW_UNDER_INTERPRETER = {"bidirectional-2-layers", "forward-3-layers"}


def _layer_case(backend, case: str):
    slow = backend.id == "triton-interpreter" and case in SLOW_UNDER_INTERPRETER
    marks = [*backend.marks, *([pytest.mark.slow] if slow else [])]
    return pytest.param(backend.values[0], case, id=f"{backend.id}-{case}", marks=marks)


LAYER_CASES = [_layer_case(backend, case) for backend in BACKENDS for case in CASES
               if not (backend.values[0][0] == "triton" and case in NOT_ON_TRITON)]


@pytest.mark.parametrize(("on_backend", "case"), LAYER_CASES, indirect=["on_backend"])
def test_layer_conforms_to_the_reference(on_backend, case):
    backend, device, dtype, tolerance = on_backend
    options, lengths, with_state = CASES[case]
    torch.manual_seed(0)
    reference = perturbed(LNLSTM(5, 7, backend="reference", **options).double())
    model = copy.deepcopy(reference).to(device=device, dtype=dtype)
    for module in model.modules():
        if isinstance(module, (LNLSTM, LNLSTMCell)):
            module.backend = backend
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, 5, generator=generator, dtype=torch.float64)
    states = reference.num_layers * reference.num_directions
    state = tuple(0.5 * torch.randn(states, 3, 7, generator=generator, dtype=torch.float64) for _ in range(2))
    state = state if with_state else None
    lengths = None if lengths is None else torch.tensor(lengths)

    assert model.select_backend(x.to(device=device, dtype=dtype)) == backend, "the backend under test must run"
    expected = outputs_and_gradients(reference, x, lengths, state)
    actual = outputs_and_gradients(
        model, x.to(device=device, dtype=dtype), lengths,
        None if state is None else tuple(s.to(device=device, dtype=dtype) for s in state),
    )
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        scale = max(1.0, value.abs().max().item())
        torch.testing.assert_close(actual[name], value, rtol=0, atol=tolerance * scale, msg=lambda m: f"{name}: {m}")


SINGLE_STEP = [case for case in BACKENDS if case.values[0][0] != "cpp"]  # the C++ operator computes whole layers


@pytest.mark.parametrize("layer_norm", [True, False])
@pytest.mark.parametrize("on_backend", SINGLE_STEP, indirect=True)
def test_cell_step_conforms_to_the_reference(on_backend, layer_norm):
    """One step of one cell (the speller's), outputs and gradients."""
    backend, device, dtype, tolerance = on_backend
    torch.manual_seed(0)
    reference = perturbed(LNLSTMCell(5, 7, layer_norm=layer_norm, backend="reference").double())
    cell = copy.deepcopy(reference).to(device=device, dtype=dtype)
    cell.backend = backend
    generator = torch.Generator().manual_seed(2)
    x, h, c = (torch.randn(3, n, generator=generator, dtype=torch.float64) for n in (5, 7, 7))

    def run(module, cast):
        inputs = [cast(t).requires_grad_() for t in (x, h, c)]
        h_new, c_new = module(inputs[0], (inputs[1], inputs[2]))
        loss = (h_new.double() * 1.5 - c_new.double()).sum()
        grads = torch.autograd.grad(loss, [*inputs, *module.parameters()])
        return [t.detach().double().cpu() for t in (h_new, c_new, *grads)]

    expected = run(reference, lambda t: t.clone())
    actual = run(cell, lambda t: t.to(device=device, dtype=dtype))
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=tolerance * max(1.0, e.abs().max().item()))

"""Tests for asr/models/lnlstm/backends/triton.py: the Triton path against the reference path.

Without a GPU the kernels run on CPU tensors under Triton's interpreter:
:func:`helpers.load_triton_kernels` imports them with ``TRITON_INTERPRET=1`` set for that
import only, because ``triton.jit`` reads it when
asr/models/lnlstm/backends/triton_kernels.py is first imported (``test_kernels_are_interpreted_on_cpu``
checks that this happened). On a machine with a GPU the same tests also run on
CUDA with compiled kernels and CUDA graphs, and the CPU variants skip unless
TRITON_INTERPRET=1 is set by hand.

Float32 comparisons use a tolerance of 1e-5 relative to each tensor's largest
magnitude, as tests/test_lnlstm.py does for the C++ operator. The interpreter
costs about 30 ms per kernel launch here, so shapes are small (B <= 4, H <= 16,
at most 20 steps) and each test launches a few hundred kernels at most.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import asr.models
from asr.models import cuda_graphs as graphs
from asr.models import lnlstm
from asr.models.lnlstm.backends import cpp as lnlstm_ext
from asr.models.lnlstm.backends import triton as lnlstm_triton
from asr.models.attention import AttentionConfig
from asr.models.lnlstm import LNLSTM, LNLSTMCell
from asr.models.speller import Speller, SpellerConfig
from helpers import load_triton_kernels

_INTERPRETED = load_triton_kernels()  # before anything imports triton (see its docstring)
HAVE_TRITON = importlib.util.find_spec("triton") is not None

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")


def _interpreting() -> bool:
    return _INTERPRETED


DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not _interpreting(), reason="CPU tensors need TRITON_INTERPRET=1 set before the kernels are loaded"
        ),
    ),
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available() or not HAVE_TRITON or _interpreting(),
            reason="needs a CUDA device and compiled (not interpreted) kernels",
        ),
    ),
]


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    """The interpreter reads TRITON_INTERPRET while kernels run too: set it for each test here only."""
    if _INTERPRETED:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _no_overflow_in_the_interpreter():
    """Under the interpreter the kernels run in numpy: make an overflow or NaN in any
    lane an error, which catches reads of garbage (masked rows or columns included)."""
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        yield


@pytest.fixture
def implementation():
    """Restores the implementation switch after the test."""
    previous = lnlstm.get_implementation()
    yield
    lnlstm.set_implementation(previous)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5, name: str = "") -> None:
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol * scale, msg=lambda m: f"{name}: {m}")


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = max(1.0, expected.abs().max().item())
    return (actual.double() - expected.double()).abs().max().item() / scale


def perturb(module: nn.Module, std: float = 0.3) -> None:
    """Move every parameter (LN gains and biases too) by noise, so tests see each in use,
    then halve LN_h's gains.

    With unit LN_h gains these small random LN-LSTMs are chaotic over 20 steps:
    float32 round-off alone grows to 1e-5..3e-4 of the gradients on either path
    (measured against float64), so a 1e-5 comparison would test luck. At half
    the gain the recurrence contracts and round-off stays near 1e-6; the layer
    test checks that against float64 first.
    """
    generator = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=generator).to(p.device) * std)
        for m in module.modules():
            if isinstance(m, LNLSTMCell) and m.layer_norm:
                m.ln_h.weight.mul_(0.5)


def run_with_grads(model, x, lengths, state=None, implementation="python", autocast=None) -> dict:
    """Forward on one implementation, a random linear loss on y, h_n, c_n, backward
    -> outputs, every gradient and a no-grad forward's y."""
    lnlstm.set_implementation(implementation)
    device = next(model.parameters()).device
    x = x.detach().clone().to(device).requires_grad_()
    if state is not None:
        state = tuple(s.detach().clone().to(device).requires_grad_() for s in state)
    model.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        y, (h_n, c_n) = model(x, lengths, state)
        with torch.no_grad():
            no_grad_y = model(x, lengths, state)[0]
    generator = torch.Generator().manual_seed(7)
    loss = sum((t.float() * torch.randn(t.shape, generator=generator).to(device)).sum() for t in (y, h_n, c_n))
    loss.backward()
    results = {"y": y, "h_n": h_n, "c_n": c_n, "no-grad y": no_grad_y, "grad x": x.grad}
    if state is not None:
        results["grad h_0"], results["grad c_0"] = state[0].grad, state[1].grad
    results.update({f"grad {name}": p.grad for name, p in model.named_parameters()})
    return {name: value.detach().cpu().clone() for name, value in results.items()}


# --- the layer ----------------------------------------------------------------------


@needs_triton
def test_kernels_are_interpreted_on_cpu():
    """Without a GPU the suite must really run the kernels, under the interpreter."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the kernels are compiled for it")
    from triton.runtime.interpreter import InterpretedFunction

    from asr.models.lnlstm.backends import triton_kernels as lnlstm_kernels

    assert isinstance(lnlstm_kernels.lstm_forward_step, InterpretedFunction)
    assert isinstance(lnlstm_kernels.lstm_backward_step, InterpretedFunction)


@pytest.mark.slow  # seconds under the interpreter; the quick tier keeps the cell-step and single-direction checks
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer_norm", [True, False])
def test_layer_matches_reference(implementation, device, layer_norm):
    """Two bidirectional layers, variable lengths (one row empty), an initial state:
    outputs, states and every gradient as the reference path's."""
    torch.manual_seed(0)
    model = LNLSTM(5, 8, num_layers=2, bidirectional=True, layer_norm=layer_norm, forget_bias=0.5)
    perturb(model)
    model.to(device)
    time = 20
    x = torch.randn(4, time, 5)
    lengths = torch.tensor([time, 7, 0, 13])
    state = (torch.randn(4, 4, 8), torch.randn(4, 4, 8))
    expected = run_with_grads(model, x, lengths, state, "python")
    exact = run_with_grads(copy.deepcopy(model).double(), x.double(), lengths, [s.double() for s in state], "python")
    actual = run_with_grads(model, x, lengths, state, "triton")
    assert actual.keys() == expected.keys()
    for name in expected:
        reference_error = relative_error(expected[name], exact[name])
        if device == "cpu":
            assert reference_error < 3e-6, f"{name}: too sensitive to round-off for this test"
            assert_close(actual[name], expected[name], name=name)
        else:
            # cuBLAS sums in another order than the CPU: here the float32 reference path is up
            # to 7e-6 from float64, so both paths are held to float64 instead of to each other.
            assert reference_error < 1e-5, f"{name}: too sensitive to round-off for this test"
            error = relative_error(actual[name], exact[name])
            assert error <= max(1e-5, 2 * reference_error), f"{name}: {error:.2e} from float64"
    assert torch.all(actual["y"][1, 7:] == 0) and torch.all(actual["y"][2] == 0)
    assert torch.equal(actual["h_n"][:, 2], state[0][:, 2]), "an empty row keeps its initial state"


@pytest.mark.parametrize("device", DEVICES)
def test_single_direction_without_lengths(implementation, device):
    torch.manual_seed(1)
    model = LNLSTM(3, 6, num_layers=1, layer_norm=True).to(device)
    perturb(model)
    x = torch.randn(2, 9, 3)
    expected = run_with_grads(model, x, None, None, "python")
    actual = run_with_grads(model, x, None, None, "triton")
    for name in expected:
        assert_close(actual[name], expected[name], name=name)


@pytest.mark.slow  # seconds under the interpreter
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_is_as_close_to_float32_as_the_reference(implementation, device, dtype):
    """Under bf16 or fp16 autocast the recurrent GEMMs round their operands (as the
    reference path's F.linear does). Each output's and gradient's distance from the
    float32 reference (relative to its largest magnitude) must be at most twice the
    reference path's own distance under the same autocast plus 1e-2. On this test
    the reference path's bf16 distances are 0.3-2.1e-2 and the Triton path's
    0.4-1.4x those (at most 1.3e-2); in fp16 both stay below 5e-3. A wrong
    gradient would be off by O(1)."""
    torch.manual_seed(0)
    model = LNLSTM(5, 16, num_layers=2, bidirectional=True, layer_norm=True).to(device)
    perturb(model)
    time = 12
    x = torch.randn(3, time, 5)
    lengths = torch.tensor([time, 4, time - 3])
    state = (torch.randn(4, 3, 16), torch.randn(4, 3, 16))
    exact = run_with_grads(model, x, lengths, state, "python")
    reference = run_with_grads(model, x, lengths, state, "python", autocast=dtype)
    actual = run_with_grads(model, x, lengths, state, "triton", autocast=dtype)
    for name in exact:
        assert actual[name].dtype == reference[name].dtype, name
        error = relative_error(actual[name], exact[name])
        reference_error = relative_error(reference[name], exact[name])
        assert error <= 2 * reference_error + 1e-2, (
            f"{name}: {dtype} error {error:.2e}, the reference path's {reference_error:.2e}"
        )


@pytest.mark.slow  # seconds under the interpreter
@needs_triton
@pytest.mark.skipif(not _interpreting(), reason="needs the interpreter (TRITON_INTERPRET=1)")
def test_recorded_loops_reuse_padded_shared_buffers(implementation, monkeypatch):
    """The CUDA-graph bookkeeping, run on CPU with the recorded launches re-run where
    a GPU replays the graph: batches padded to one bucket share a recording; a
    result survives the next call; a bigger shape grows the arena and records anew."""
    # Off CUDA the backend never takes the recorded path: take it here, where run_recorded runs
    # each loop eagerly on the shared buffers instead of replaying a graph.
    monkeypatch.setattr(lnlstm_triton, "_static", lambda device, cuda_graphs: True)
    monkeypatch.setattr(lnlstm_triton, "_FORWARD_LOOPS", graphs.GraphCache())
    monkeypatch.setattr(lnlstm_triton, "_BACKWARD_LOOPS", graphs.GraphCache())
    torch.manual_seed(2)
    model = LNLSTM(3, 4, num_layers=1, bidirectional=True, layer_norm=True)
    perturb(model)
    cases = [  # (B, T, lengths): the first two pad to B = 8, T = 16
        (3, 9, torch.tensor([9, 2, 5])),
        (2, 13, torch.tensor([4, 13])),
        (9, 6, torch.tensor([6, 1, 0, 5, 6, 2, 3, 4, 6])),  # B pads to 16: a bigger arena
    ]
    inputs = [(torch.randn(b, t, 3), lengths) for b, t, lengths in cases]
    expected = [run_with_grads(model, x, lengths, None, "python") for x, lengths in inputs]
    first = run_with_grads(model, *inputs[0], None, "triton")
    forward_arena = lnlstm_triton._FORWARD_LOOPS.arenas[torch.device("cpu")]
    second = run_with_grads(model, *inputs[1], None, "triton")
    # One recording for training (states kept) and one for the no-grad forward, same bucket.
    cpu = torch.device("cpu")
    assert len(lnlstm_triton._FORWARD_LOOPS.entries[cpu]) == 2
    assert len(lnlstm_triton._BACKWARD_LOOPS.entries[cpu]) == 1
    third = run_with_grads(model, *inputs[2], None, "triton")
    assert lnlstm_triton._FORWARD_LOOPS.arenas[cpu].numel() > forward_arena.numel()
    assert len(lnlstm_triton._FORWARD_LOOPS.entries[cpu]) == 2, "recordings on the old arena are dropped"
    for actual, reference in zip((first, second, third), expected):
        for name in reference:
            assert_close(actual[name], reference[name], name=name)


def test_padded_time_buckets():
    padded = [graphs.padded_time(t) for t in range(1, 4001)]
    assert all(p >= t for t, p in zip(range(1, 4001), padded))
    assert all(p - t <= t / 8 for t, p in zip(range(128, 4001), padded[127:]))
    assert len(set(padded)) <= 64, "a few dozen CUDA graphs cover 1-4000 frames"
    assert graphs.padded_batch(26) == 32 and graphs.padded_batch(32) == 32


# Compiles the kernels as the host code launches them (lnlstm_triton._launch_sizes) for
# one GPU architecture, without a GPU, and prints each variant's resource use.
_COMPILE_FOR_GPU = """
import os, subprocess, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from asr.models.lnlstm.backends import triton as lnlstm_triton
from asr.models.lnlstm.backends import triton_kernels as lnlstm_kernels

cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
target = GPUTarget("cuda", int(sys.argv[1]), 32)
# hidden, rows, layer norm, whole layer (else one cell step), GEMM operand type: the
# listener's layers (B=32, bidirectional) in float32 and bf16, with and without layer
# norm; the speller's cell (beam 10 x batch 32); the tests' size.
cases = [
    (320, 64, True, True, "bf16"),
    (320, 64, False, True, "fp32"),
    (640, 320, True, False, "fp32"),
    (8, 8, True, True, "fp32"),
]
for hidden, rows, layer_norm, sequence, gemm in cases:
    _, rows_per_program, block_h, warps = lnlstm_triton._launch_sizes(rows, hidden, torch.device("cuda"))
    for kernel in (lnlstm_kernels.lstm_forward_step, lnlstm_kernels.lstm_backward_step):
        constexprs = dict(H=hidden, BLOCK_H=block_h, ROWS=rows_per_program, LAYER_NORM=layer_norm, SEQUENCE=sequence)
        if "ACCUMULATE" in kernel.arg_names:
            constexprs["ACCUMULATE"] = sequence
        gemm_ptrs = {"gh_ptr", "dgh_ptr"} | ({"h_in_ptr", "h_out_ptr", "dh_ptr"} if sequence else set())
        signature = {}
        for name in kernel.arg_names:
            if name in constexprs:
                signature[name] = "constexpr"
            elif name == "lengths_ptr" and sequence:
                signature[name] = "*i32"
            elif name.endswith("_ptr"):
                signature[name] = "*" + gemm if name in gemm_ptrs else "*fp32"
            else:
                signature[name] = "fp32" if name in ("forget_bias", "eps") else "i32"
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs), target=target, options={"num_warps": warps}
        )
        path = os.path.join(os.environ["TRITON_CACHE_DIR"], "kernel.cubin")
        with open(path, "wb") as file:
            file.write(compiled.asm["cubin"])
        usage = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
        line = next(line.strip() for line in usage.splitlines() if "REG:" in line)
        print(kernel.__name__, hidden, rows, layer_norm, sequence, gemm, line)
"""


@pytest.mark.slow  # a subprocess compiles for the GPU
@needs_triton
@pytest.mark.parametrize("arch", [90])
def test_kernels_compile_for_a_gpu_without_spills(tmp_path, arch):
    """The interpreter accepts code the compiler rejects: compile the kernels as the host
    code launches them for sm_90 (H100/H200) with Triton's own ptxas, which needs no GPU,
    and check that none spills registers to local memory. (All 48 variants of hidden 8,
    320, 640, layer norm on and off, layer and cell, float32 and bf16 compiled so for sm_80
    and sm_90 when this was written, without spills, using at most 110 registers.)"""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_FOR_GPU, str(arch)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 8
    for line in lines:
        assert "LOCAL:0 " in line and "STACK:0 " in line, f"spills: {line}"


# --- the single cell (the speller's) -------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer_norm", [True, False])
def test_cell_steps_match_reference(implementation, device, layer_norm):
    """Three steps of LNLSTMCell.forward with the state carried: outputs and gradients."""
    torch.manual_seed(3)
    cell = LNLSTMCell(6, 8, layer_norm=layer_norm, forget_bias=0.7).to(device)
    perturb(cell)
    xs = torch.randn(3, 5, 6, device=device)
    h0, c0 = torch.randn(5, 8, device=device), torch.randn(5, 8, device=device)

    def run(name):
        lnlstm.set_implementation(name)
        cell.zero_grad(set_to_none=True)
        x = xs.clone().requires_grad_()
        state = (h0.clone().requires_grad_(), c0.clone().requires_grad_())
        h, c = state
        generator = torch.Generator().manual_seed(5)
        loss = 0.0
        for t in range(3):
            h, c = cell(x[t], (h, c))
            loss = loss + sum((v * torch.randn(v.shape, generator=generator).to(device)).sum() for v in (h, c))
        loss.backward()
        out = {"h": h, "c": c, "grad x": x.grad, "grad h0": state[0].grad, "grad c0": state[1].grad}
        out.update({f"grad {n}": p.grad for n, p in cell.named_parameters()})
        return {k: v.detach().cpu().clone() for k, v in out.items()}

    expected, actual = run("python"), run("triton")
    for name in expected:
        assert_close(actual[name], expected[name], name=name)


@pytest.mark.parametrize("device", DEVICES)
def test_speller_teacher_forcing_matches_reference(implementation, device):
    """The speller's cells on the Triton path: log-probs and every gradient, with attention in between."""
    torch.manual_seed(4)
    speller = Speller(
        SpellerConfig(embedding_dim=6, hidden_size=8, num_layers=2),
        AttentionConfig(type="location", dim=6, conv_channels=2, conv_kernel=3),
        vocab_size=7,
        context_dim=10,
    ).to(device)
    perturb(speller, std=0.1)
    keys = torch.randn(2, 5, 10, device=device)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2], device=device)
    decoder_input = torch.tensor([[1, 3, 4, 5], [1, 6, 0, 0]], device=device)

    def run(name):
        lnlstm.set_implementation(name)
        speller.zero_grad(set_to_none=True)
        k = keys.clone().requires_grad_()
        log_probs, weights = speller(decoder_input, k, mask)
        generator = torch.Generator().manual_seed(6)
        (log_probs * torch.randn(log_probs.shape, generator=generator).to(device)).sum().backward()
        out = {"log_probs": log_probs, "weights": weights, "grad keys": k.grad}
        out.update({f"grad {n}": p.grad for n, p in speller.named_parameters() if p.grad is not None})
        return {n: v.detach().cpu().clone() for n, v in out.items()}

    expected, actual = run("python"), run("triton")
    assert actual.keys() == expected.keys()
    for name in expected:
        assert_close(actual[name], expected[name], name=name)


# --- choosing the path, falling back -------------------------------------------------------


def test_auto_keeps_cpu_tensors_off_the_triton_path(implementation, monkeypatch):
    def not_here(*args, **kwargs):
        raise AssertionError("the Triton path ran for CPU tensors under 'auto'")

    monkeypatch.setattr(lnlstm_ext, "load", lambda strict=False, build=None: None)  # as where the C++ operator cannot build
    monkeypatch.setattr(lnlstm_triton, "fused_layer", not_here)
    monkeypatch.setattr(lnlstm_triton, "cell_step", not_here)
    lnlstm.set_implementation("auto")
    model = LNLSTM(3, 4)
    model(torch.randn(2, 5, 3))
    model.cells[0](torch.randn(2, 3))


def test_float64_parameters_use_the_reference_path(implementation, monkeypatch):
    """The kernels compute in float32; other parameter dtypes keep the reference path."""
    monkeypatch.setattr(lnlstm_triton, "fused_layer", lambda *a: pytest.fail("Triton path used for float64"))
    lnlstm.set_implementation("triton")
    model = LNLSTM(3, 4).double()
    model(torch.randn(2, 5, 3, dtype=torch.float64))


@needs_triton
def test_cpu_tensors_without_the_interpreter_raise_a_clear_error(implementation, monkeypatch):
    monkeypatch.setattr(lnlstm_triton, "interpreting", lambda: False)
    lnlstm.set_implementation("triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        LNLSTM(3, 4)(torch.randn(2, 5, 3))
    assert not lnlstm_triton.usable(torch.device("cpu"))


def test_missing_triton_warns_once_and_forcing_it_raises(implementation, monkeypatch):
    monkeypatch.setattr(lnlstm_triton, "_kernels", None)
    monkeypatch.setattr(lnlstm_triton, "_load_error", None)
    monkeypatch.setitem(sys.modules, "asr.models.lnlstm.backends.triton_kernels", None)  # makes the import fail
    monkeypatch.delattr(asr.models.lnlstm.backends, "triton_kernels", raising=False)
    with pytest.warns(RuntimeWarning, match="reference path"):
        assert not lnlstm_triton.usable(torch.device("cuda"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not on every call
        assert not lnlstm_triton.usable(torch.device("cuda"))
    lnlstm.set_implementation("triton")
    with pytest.raises(RuntimeError, match="needs triton"):
        LNLSTM(3, 4)(torch.randn(2, 5, 3))


@needs_triton
@pytest.mark.skipif(not _interpreting(), reason="needs the interpreter (TRITON_INTERPRET=1)")
def test_the_probe_runs():
    """What usable() runs once per CUDA device before choosing the Triton path."""
    lnlstm_triton._probe(torch.device("cpu"))


@needs_triton
def test_kernel_failure_on_a_device_warns_once_and_forcing_it_raises(monkeypatch):
    """A kernel that does not compile (or run) on a GPU: 'auto' falls back to the
    reference path with one warning, 'triton' raises. The probe is faked here."""

    def failing_probe(device):
        raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(lnlstm_triton, "_probe", failing_probe)
    monkeypatch.setattr(lnlstm_triton, "_device_errors", {})
    monkeypatch.setattr(lnlstm_triton, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.warns(RuntimeWarning, match="no kernel image"):
        assert not lnlstm_triton.usable(torch.device("cuda"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not lnlstm_triton.usable(torch.device("cuda", 0))
    with pytest.raises(RuntimeError, match="no kernel image"):
        lnlstm_triton.usable(torch.device("cuda"), strict=True)


# --- CUDA only --------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_auto_uses_triton_and_graphs_match_eager(implementation, monkeypatch):
    torch.manual_seed(5)
    model = LNLSTM(5, 8, num_layers=2, bidirectional=True).cuda()
    perturb(model)
    x, lengths = torch.randn(3, 30, 5), torch.tensor([30, 11, 2])
    lnlstm.set_implementation("auto")
    assert model.select_backend(x.cuda()) == "triton"
    recorded = run_with_grads(model, x, lengths, None, "auto")
    replayed = run_with_grads(model, x, lengths, None, "auto")
    monkeypatch.setattr(graphs.LNLSTM_POLICY, "enabled", False)
    eager = run_with_grads(model, x, lengths, None, "auto")
    reference = run_with_grads(copy.deepcopy(model), x, lengths, None, "python")
    for name in reference:
        assert_close(recorded[name], eager[name], name=name)
        assert_close(replayed[name], eager[name], name=name)
        assert_close(eager[name], reference[name], name=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_survive_growing_shapes(implementation, monkeypatch):
    """Shapes that grow from call to call make the shared buffers grow, which drops every
    recorded loop (and with them their memory pool): recording again must work, with a
    random op (dropout between layers) in between, and give the eager results."""
    monkeypatch.setattr(lnlstm_triton, "_FORWARD_LOOPS", graphs.GraphCache())
    monkeypatch.setattr(lnlstm_triton, "_BACKWARD_LOOPS", graphs.GraphCache())
    torch.manual_seed(6)
    model = LNLSTM(4, 8, num_layers=2, bidirectional=True).cuda()
    perturb(model)
    cases = [(2, 10), (3, 40), (12, 40), (20, 90)]  # each one needs a bigger arena than the last
    inputs = [(torch.randn(b, t, 4), torch.randint(1, t + 1, (b,))) for b, t in cases]
    recorded = [run_with_grads(model, x, lengths, None, "triton") for x, lengths in inputs]
    dropout = torch.nn.Dropout(0.5).cuda()
    dropout(torch.ones(8, device="cuda"))  # the random number generator still works
    recorded_again = [run_with_grads(model, x, lengths, None, "triton") for x, lengths in inputs]  # replayed
    assert graphs.LNLSTM_POLICY.enabled, "a capture failed and the loops fell back to eager runs"
    for cache in (lnlstm_triton._FORWARD_LOOPS, lnlstm_triton._BACKWARD_LOOPS):
        (entries,) = cache.entries.values()
        assert all(graph is not None for _, graph in entries.values())
    monkeypatch.setattr(graphs.LNLSTM_POLICY, "enabled", False)
    eager = [run_with_grads(model, x, lengths, None, "triton") for x, lengths in inputs]
    for first, again, expected in zip(recorded, recorded_again, eager):
        for name in expected:
            assert_close(first[name], expected[name], name=name)
            assert_close(again[name], expected[name], name=name)

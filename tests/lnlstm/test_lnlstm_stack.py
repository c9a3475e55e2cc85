"""Tests for asr/models/lnlstm.py (reference path) and the fused C++ path.

Float32 comparisons use a tolerance of 1e-5 relative to each tensor's largest
magnitude (and at least 1e-5 absolute): the two paths sum in different orders,
so they agree to float32 round-off, not bit for bit.
"""

from __future__ import annotations

import copy
import shutil
import warnings

import pytest
import soundfile
import torch
import torchaudio
from torch import nn

from asr.models import lnlstm
from asr.models.lnlstm.backends import cpp as lnlstm_ext
from asr.models.lnlstm import LNLSTM, LNLSTMCell, load_from_torch_lstm, reverse_padded

HAVE_COMPILER = shutil.which("c++") is not None or shutil.which("g++") is not None
IMPLEMENTATIONS = ["python", pytest.param("cpp", marks=pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler"))]


@pytest.fixture
def implementation(request):
    """Force one implementation for the test, restoring the switch afterwards."""
    previous = lnlstm.get_implementation()
    lnlstm.set_implementation(request.param)
    if request.param == "cpp":
        lnlstm_ext.load(strict=True)  # a build failure fails the test, not a silent fallback
    yield request.param
    lnlstm.set_implementation(previous)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5, name: str = "") -> None:
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol * scale, msg=lambda m: f"{name}: {m}")


def perturb(module: nn.Module, std: float = 0.3) -> None:
    """Move every parameter (LN gains and biases too, initialised to 1 and 0) by random noise,
    so tests see each of them in use."""
    generator = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * std)


def run_with_grads(model: LNLSTM, x: torch.Tensor, lengths, state=None, input_grad=True):
    """Forward, a random linear loss on y, h_n, c_n, backward -> outputs and all grads."""
    x = x.detach().clone().requires_grad_(input_grad)
    if state is not None:
        state = tuple(s.detach().clone().requires_grad_() for s in state)
    model.zero_grad(set_to_none=True)
    y, (h_n, c_n) = model(x, lengths, state)
    generator = torch.Generator().manual_seed(7)
    # Drawn in float32 whatever the dtype: a float64 run of a case has the same loss.
    loss = sum((t * torch.randn(t.shape, generator=generator).to(t.dtype)).sum() for t in (y, h_n, c_n))
    loss.backward()
    results = {"y": y, "h_n": h_n, "c_n": c_n}
    if input_grad:
        results["grad x"] = x.grad
    if state is not None:
        results["grad h_0"], results["grad c_0"] = state[0].grad, state[1].grad
    results.update({f"grad {name}": p.grad for name, p in model.named_parameters()})
    return results


# --- equivalence with torch.nn.LSTM ---------------------------------------------


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (1, True), (2, False), (2, True)])
def test_plain_lstm_matches_torch_lstm(implementation, num_layers, bidirectional):
    torch.manual_seed(0)
    reference = nn.LSTM(5, 6, num_layers, batch_first=True, bidirectional=bidirectional)
    # forget_bias != 0 checks that load_from_torch_lstm folds it into the bias.
    model = LNLSTM(5, 6, num_layers, bidirectional, layer_norm=False, forget_bias=0.7)
    load_from_torch_lstm(model, reference)
    x = torch.randn(4, 9, 5)
    lengths = torch.tensor([9, 4, 7, 1])
    directions = 2 if bidirectional else 1
    h0 = torch.randn(num_layers * directions, 4, 6)
    c0 = torch.randn(num_layers * directions, 4, 6)

    ours = run_with_grads(model, x, lengths, (h0, c0))

    x_ref = x.clone().requires_grad_()
    h0_ref, c0_ref = h0.clone().requires_grad_(), c0.clone().requires_grad_()
    packed = nn.utils.rnn.pack_padded_sequence(x_ref, lengths, batch_first=True, enforce_sorted=False)
    y_packed, (h_n, c_n) = reference(packed, (h0_ref, c0_ref))
    y, _ = nn.utils.rnn.pad_packed_sequence(y_packed, batch_first=True, total_length=9)
    generator = torch.Generator().manual_seed(7)
    loss = sum((t * torch.randn(t.shape, generator=generator)).sum() for t in (y, h_n, c_n))
    loss.backward()

    assert_close(ours["y"], y, name="y")
    assert_close(ours["h_n"], h_n, name="h_n")
    assert_close(ours["c_n"], c_n, name="c_n")
    assert_close(ours["grad x"], x_ref.grad, name="grad x")
    assert_close(ours["grad h_0"], h0_ref.grad, name="grad h_0")
    assert_close(ours["grad c_0"], c0_ref.grad, name="grad c_0")
    order = [0, 2, 1, 3]  # nn.LSTM i, f, g, o -> i, j, f, o
    for layer in range(num_layers):
        for direction in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            cell = f"cells.{layer * directions + direction}"
            for ours_name, theirs_name in (("weight_x", "weight_ih"), ("weight_h", "weight_hh"), ("bias", "bias_ih")):
                theirs = getattr(reference, theirs_name + suffix).grad.chunk(4, 0)
                assert_close(
                    ours[f"grad {cell}.{ours_name}"], torch.cat([theirs[k] for k in order]), name=ours_name + suffix
                )


def test_load_from_torch_lstm_rejects_mismatch():
    with pytest.raises(ValueError, match="hidden_size"):
        load_from_torch_lstm(LNLSTM(5, 6), nn.LSTM(5, 7))
    with pytest.raises(ValueError, match="bidirectional"):
        load_from_torch_lstm(LNLSTM(5, 6), nn.LSTM(5, 6, bidirectional=True))


# --- variable lengths -------------------------------------------------------


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
@pytest.mark.parametrize("layer_norm", [True, False])
def test_padding_does_not_change_an_utterance(implementation, layer_norm):
    """Alone or padded (with garbage) beside longer rows: same outputs, states and grads."""
    torch.manual_seed(1)
    model = LNLSTM(4, 5, num_layers=2, bidirectional=True, layer_norm=layer_norm)
    perturb(model)
    short = torch.randn(1, 6, 4)
    batch = torch.randn(3, 11, 4) * 5  # garbage in the padding must not leak in
    batch[1, :6] = short[0]
    lengths = torch.tensor([11, 6, 9])
    weights = [torch.randn(6, 10), torch.randn(4, 5), torch.randn(4, 5)]  # loss on y, h_n, c_n of the utterance

    def run(x, lengths, row):
        x = x.clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        y, (h_n, c_n) = model(x, lengths)
        loss = (y[row, :6] * weights[0]).sum() + (h_n[:, row] * weights[1]).sum() + (c_n[:, row] * weights[2]).sum()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        return y, h_n, c_n, x.grad, grads

    y_alone, h_alone, c_alone, gx_alone, grads_alone = run(short, torch.tensor([6]), 0)
    y, h_n, c_n, gx, grads = run(batch, lengths, 1)

    assert_close(y[1, :6], y_alone[0], name="y")
    assert torch.all(y[1, 6:] == 0) and torch.all(y[2, 9:] == 0)
    assert_close(h_n[:, 1], h_alone[:, 0], name="h_n")
    assert_close(c_n[:, 1], c_alone[:, 0], name="c_n")
    assert_close(gx[1, :6], gx_alone[0], name="grad x")
    assert torch.all(gx[1, 6:] == 0) and torch.all(gx[[0, 2]] == 0)
    for (name, _), actual, expected in zip(model.named_parameters(), grads, grads_alone):
        assert_close(actual, expected, name=f"grad {name}")

    # Without lengths the backward direction would start in the padding.
    no_lengths, _ = model(batch)
    assert not torch.allclose(no_lengths[1, :6, 5:], y_alone[0, :, 5:], atol=1e-3)


def test_reverse_padded_is_an_involution_within_each_length():
    x = torch.arange(2 * 4, dtype=torch.float32).view(2, 4, 1)
    reversed_ = reverse_padded(x, torch.tensor([4, 2]))
    assert reversed_[:, :, 0].tolist() == [[3, 2, 1, 0], [5, 4, 6, 7]]
    assert torch.equal(reverse_padded(reversed_, torch.tensor([4, 2])), x)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
def test_zero_length_rows_keep_the_initial_state(implementation):
    model = LNLSTM(3, 4, bidirectional=True)
    h0, c0 = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    y, (h_n, c_n) = model(torch.randn(2, 5, 3), torch.tensor([5, 0]), (h0, c0))
    assert torch.all(y[1] == 0)
    assert torch.equal(h_n[:, 1], h0[:, 1]) and torch.equal(c_n[:, 1], c0[:, 1])


# --- gradients and numerical robustness -----------------------------------------


@pytest.mark.slow  # float64 gradcheck: about 1-3 s a backend
@pytest.mark.parametrize("variant", ["ba2016", "tf_contrib"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
def test_gradcheck_float64_layer_norm(implementation, variant):
    torch.manual_seed(2)
    model = LNLSTM(2, 3, num_layers=2, bidirectional=True, layer_norm=True, variant=variant).double()
    perturb(model)
    names = [name for name, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    x = torch.randn(2, 4, 2, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([4, 2])

    def f(x, h0, c0, *params):
        y, (h_n, c_n) = torch.func.functional_call(model, dict(zip(names, params)), (x, lengths, (h0, c0)))
        return y, h_n, c_n

    # The fused path's backward is hand-written: check its full Jacobian. The
    # reference path's is autograd's: a random projection (fast mode) suffices.
    fast_mode = implementation == "python"
    assert torch.autograd.gradcheck(f, (x, h0, c0, *params), eps=1e-6, atol=1e-6, fast_mode=fast_mode)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
@pytest.mark.parametrize(
    "case", [pytest.param("3000 frames", marks=pytest.mark.slow), "zero input", "constant input", "scaled 1e4", "scaled 1e-4"]
)
def test_outputs_and_gradients_stay_finite(implementation, case):
    torch.manual_seed(3)
    time = 3000 if case == "3000 frames" else 50
    x = torch.randn(2, time, 4)
    if case == "zero input":
        x = torch.zeros_like(x)  # zero variance in LN_x, LN_h and LN_c at the first step
    elif case == "constant input":
        x = torch.full_like(x, 3.0)
    elif case == "scaled 1e4":
        x = x * 1e4
    elif case == "scaled 1e-4":
        x = x * 1e-4
    model = LNLSTM(4, 8, bidirectional=True, layer_norm=True)
    results = run_with_grads(model, x, torch.tensor([time, time - 1]))
    for name, value in results.items():
        assert torch.isfinite(value).all(), f"{case}: {name} is not finite"


# --- the fast path against the reference ------------------------------------------


def run_both_paths(model, x, lengths, state=None, input_grad=True):
    """run_with_grads and a no-grad forward, on the reference and the fused path."""
    previous = lnlstm.get_implementation()
    results = {}
    try:
        for implementation in ("python", "cpp"):
            lnlstm.set_implementation(implementation)
            out = run_with_grads(model, x, lengths, state, input_grad=input_grad)
            with torch.no_grad():  # the no-grad forward saves nothing: a separate code path
                out["no-grad y"] = model(x, lengths, state)[0]
            results[implementation] = out
    finally:
        lnlstm.set_implementation(previous)
    return results["python"], results["cpp"]


def max_relative_error(actual: dict, expected: dict) -> float:
    """The largest |actual - expected| over all tensors, each relative to max(1, max |expected|)."""
    return max(
        (actual[name].double() - expected[name]).abs().max().item() / max(1.0, expected[name].abs().max().item())
        for name in expected
    )


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layer_norm", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_fused_path_matches_reference(layer_norm, bidirectional, dtype):
    torch.manual_seed(4)
    model = LNLSTM(7, 16, num_layers=2, bidirectional=bidirectional, layer_norm=layer_norm, forget_bias=0.5)
    perturb(model, std=0.5)
    # 40 rows: the fused path computes W_x x in chunks of ceil(128 / 40) = 4
    # steps, so 30 steps span eight chunks, the last one partial.
    x = torch.randn(40, 30, 7)
    lengths = torch.randint(1, 31, (40,))
    lengths[3] = 30
    layers = 2 * (2 if bidirectional else 1)
    state = (torch.randn(layers, 40, 16), torch.randn(layers, 40, 16))
    # In float64 both paths compute the same function to round-off: outputs and every gradient.
    reference64, fused64 = run_both_paths(
        copy.deepcopy(model).double(), x.double(), lengths, tuple(s.double() for s in state)
    )
    assert fused64.keys() == reference64.keys()
    if dtype == torch.float64:
        for name in reference64:
            assert_close(fused64[name], reference64[name], tol=1e-10, name=name)
        return
    # In float32, back-propagation through 30 steps of these random LN-LSTMs
    # amplifies round-off: each float32 path is some 1e-5 of a tensor's largest
    # value away from the float64 result here (and up to 5e-4 for other seeds),
    # so they cannot be held to 1e-5 of each other. The fused path is held to
    # the float64 result instead, within ten times the float32 reference
    # path's own error: as accurate, give or take the luck of the rounding.
    reference32, fused32 = run_both_paths(model, x, lengths, state)
    tol = max(1e-5, 10 * max_relative_error(reference32, reference64))
    for name in reference64:
        assert_close(fused32[name].double(), reference64[name], tol=tol, name=name)


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_fused_tf_contrib_matches_reference(bidirectional, dtype):
    """The tf_contrib cell (per-gate LN, no gate bias, the normalised cell carried) on the C++
    operator: outputs, final states and the gradients of x, the initial state and every parameter
    (the four gate norms' gains and shifts among them), with padding; tolerances as
    test_fused_path_matches_reference's."""
    torch.manual_seed(6)
    model = LNLSTM(5, 6, num_layers=2, bidirectional=bidirectional, variant="tf_contrib", forget_bias=0.5)
    perturb(model, std=0.5)
    # 32 rows: W_x x in chunks of 4 steps, so 10 steps span three chunks, the last one partial.
    x = torch.randn(32, 10, 5)
    lengths = torch.randint(1, 11, (32,))
    lengths[3] = 10
    layers = 2 * (2 if bidirectional else 1)
    state = (torch.randn(layers, 32, 6), torch.randn(layers, 32, 6))
    previous = lnlstm.get_implementation()
    lnlstm.set_implementation("cpp")
    try:
        assert copy.deepcopy(model).to(dtype).select_backend(x.to(dtype)) == "cpp", "C++ must compute tf_contrib"
    finally:
        lnlstm.set_implementation(previous)
    reference64, fused64 = run_both_paths(
        copy.deepcopy(model).double(), x.double(), lengths, tuple(s.double() for s in state)
    )
    assert fused64.keys() == reference64.keys()
    assert any(name.endswith("ln_gates.2.weight") for name in reference64)
    if dtype == torch.float64:
        for name in reference64:
            assert_close(fused64[name], reference64[name], tol=1e-10, name=name)
        return
    reference32, fused32 = run_both_paths(model, x, lengths, state)
    tol = max(1e-5, 10 * max_relative_error(reference32, reference64))
    for name in reference64:
        assert_close(fused32[name].double(), reference64[name], tol=tol, name=name)


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler")
@pytest.mark.parametrize("batch", range(1, 10))
def test_fused_path_matches_reference_at_odd_sizes(batch):
    """The fused path's matrix products work on blocks of rows and panels of
    columns (8 rows and 2 vectors with AVX-512, 6 rows with AVX2): batches of
    1-9 rows and widths 5 (hidden), 20 (gates) and 3 (input) leave a partial
    block and partial panels in every product, forward and backward."""
    torch.manual_seed(9)
    model = LNLSTM(3, 5, bidirectional=True, layer_norm=batch % 2 == 0).double()
    perturb(model)
    x = torch.randn(batch, 6, 3, dtype=torch.float64)
    lengths = torch.randint(1, 7, (batch,))
    lengths[0] = 6
    expected, actual = run_both_paths(model, x, lengths)
    for name in expected:
        assert_close(actual[name], expected[name], tol=1e-10, name=name)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler")
def test_fused_path_reusing_saved_memory_matches_reference():
    """Saved tensors of 8 MB and more live in buffers the operator keeps from
    step to step: a shorter step reuses a longer step's larger buffers, stale
    contents and all, and must still match the reference path."""
    torch.manual_seed(10)
    model = LNLSTM(20, 64, bidirectional=True).double()
    perturb(model)
    x = torch.randn(32, 100, 20, dtype=torch.float64)
    # 100 steps save 13 MB per projection-sized tensor; 70 steps, 9 MB.
    for time in (100, 70, 100):
        lengths = torch.randint(time // 2, time + 1, (32,))
        lengths[0] = time
        expected, actual = run_both_paths(model, x[:, :time], lengths)
        for name in expected:
            assert_close(actual[name], expected[name], tol=1e-10, name=f"{time} steps, {name}")


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler")
def test_fused_path_without_input_gradient():
    """A first layer reads features that need no gradient: the fused backward skips dx."""
    torch.manual_seed(8)
    model = LNLSTM(5, 8, bidirectional=True)
    perturb(model)
    x = torch.randn(3, 9, 5)
    expected, actual = run_both_paths(model, x, torch.tensor([9, 4, 7]), input_grad=False)
    assert "grad x" not in actual
    for name in expected:
        assert_close(actual[name], expected[name], name=name)


def test_fallback_warns_and_uses_reference_when_build_fails(monkeypatch):
    def failing_build(build):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(lnlstm_ext, "_build", failing_build)
    monkeypatch.setattr(lnlstm_ext, "_module", None)
    monkeypatch.setattr(lnlstm_ext, "_error", None)
    monkeypatch.setattr(lnlstm.selection, "_programmatic", None)  # no override: the recipe's auto
    model = LNLSTM(3, 4)
    x = torch.randn(2, 5, 3)
    with pytest.warns(RuntimeWarning, match="reference path"):
        y, _ = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not on every call
        assert torch.equal(model(x)[0], y)
    monkeypatch.setattr(lnlstm.selection, "_programmatic", "cpp")
    with pytest.raises(RuntimeError, match="no compiler here"):
        model(x)


def test_build_cache_key_names_the_flags_and_the_cpu():
    """A build cache shared between machines must not hand one CPU's binary to another."""
    avx512 = {"vendor_id": "AuthenticAMD", "model name": "AMD EPYC", "flags": "fpu sse2 avx2 fma avx512f"}
    avx2 = {**avx512, "flags": "fpu sse2 avx2 fma"}
    baseline = {**avx512, "flags": "fpu sse2"}
    (native, native_flags), (portable, portable_flags) = lnlstm_ext.build_configurations(avx512)
    assert "-march=native" in native_flags and "-march=native" not in portable_flags
    assert "-mavx2" in portable_flags
    assert "-mavx2" not in lnlstm_ext.build_configurations(baseline)[1][1]
    names = {name for cpu in (avx512, avx2, baseline) for name, _ in lnlstm_ext.build_configurations(cpu)}
    assert len(names) == 6  # per CPU and per set of flags
    assert lnlstm_ext.build_configurations(dict(avx512)) == [(native, native_flags), (portable, portable_flags)]


def test_build_cache_key_names_the_checkout(tmp_path):
    """Two checkouts sharing one build cache keep a build each, instead of rebuilding whenever the other ran."""
    other = tuple(tmp_path / "other_clone" / source.name for source in lnlstm_ext.SOURCES)
    here = lnlstm_ext.build_configurations()
    assert lnlstm_ext.build_configurations(sources=tuple(lnlstm_ext.SOURCES)) == here
    assert lnlstm_ext.build_configurations(sources=other) != here
    assert [flags for _, flags in lnlstm_ext.build_configurations(sources=other)] == [flags for _, flags in here]
    assert {name for name, _ in here}.isdisjoint(name for name, _ in lnlstm_ext.build_configurations(sources=other))


def test_build_falls_back_to_portable_flags_without_a_warning(monkeypatch):
    compiled = []

    def compile_without_native(cpp_extension, name, flags):
        compiled.append(name)
        if "-march=native" in flags:
            raise RuntimeError("cc1plus: error: bad value for '-march=' switch")

    monkeypatch.setattr(lnlstm_ext, "_compile", compile_without_native)
    monkeypatch.setattr(lnlstm_ext, "_flags", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the portable build is a working fused path: no warning
        lnlstm_ext._build()
    assert compiled == [name for name, _ in lnlstm_ext.build_configurations()]
    assert lnlstm_ext.build_flags() == lnlstm_ext.build_configurations()[1][1]


def test_portable_build_on_request(monkeypatch):
    """model.lnlstm_build: portable reaches the build through the options and the backend selection asks."""
    from asr.config import from_dict
    from asr.models.las import LAS, LASConfig

    compiled = []
    monkeypatch.setattr(lnlstm_ext, "_compile", lambda cpp_extension, name, flags: compiled.append(name))
    for name, value in (("_flags", None), ("_module", None), ("_error", None), ("_loaded_as", None)):
        monkeypatch.setattr(lnlstm_ext, name, value)  # a process that has not loaded the operator yet
    config = from_dict(LASConfig, {"lnlstm_build": "portable", "lnlstm_backend": "cpp", "lnlstm_check": "off"}, "model")
    listener = LAS(config, input_dim=6, vocab_size=10).listener.layers[0]
    assert listener.select_backend(torch.randn(2, 4, listener.input_size)) == "cpp"
    assert compiled == [lnlstm_ext.build_configurations()[1][0]]
    assert "-march=native" not in lnlstm_ext.build_flags()
    monkeypatch.setattr(lnlstm_ext, "_module", None)
    LNLSTM(3, 4, backend="cpp", check="off").select_backend(torch.randn(2, 4, 3))  # the default build
    assert compiled[1:] == [lnlstm_ext.build_configurations()[0][0]]
    assert "-march=native" in lnlstm_ext.build_flags()


def test_the_other_build_after_the_first_load_warns_once_and_runs_the_loaded_one(monkeypatch, caplog):
    loaded = object()
    monkeypatch.setattr(lnlstm_ext, "_module", loaded)
    monkeypatch.setattr(lnlstm_ext, "_loaded_as", "native")
    monkeypatch.setattr(lnlstm_ext, "_mismatches_warned", set())
    with caplog.at_level("WARNING", logger=lnlstm_ext.__name__):
        assert lnlstm_ext.load(build="native") is loaded and lnlstm_ext.load() is loaded
        assert not caplog.records
        assert lnlstm_ext.load(build="portable") is loaded and lnlstm_ext.load(build="portable") is loaded
    (record,) = caplog.records
    assert record.getMessage().startswith("LNLSTM: model.lnlstm_build asks for the portable build of the C++ "
                                          "operator, but this process loaded the native build first")


@pytest.mark.slow  # builds the portable operator once (about a minute on 2 cores), then loads it from the cache
def test_a_portable_build_is_what_a_process_asked_for_runs_and_records():
    import subprocess
    import sys

    from helpers import PROJECT_ROOT, subprocess_env

    script = ("from asr.config import from_dict; from asr.models.las import LAS, LASConfig; "
              "from asr.models import runtime; import torch; "
              "model = LAS(from_dict(LASConfig, {'lnlstm_build': 'portable', 'lnlstm_backend': 'cpp'}, 'model'), 6, 10); "
              "record = runtime.describe(model, 'cpu'); print(record['cpp_build_flags']); "
              "print(runtime.summary(record, 'here')); "
              "y, _ = model.listener(torch.randn(2, 8, 6), torch.tensor([8, 5])); print(bool(torch.isfinite(y).all()))")
    result = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=900, env=subprocess_env())
    assert result.returncode == 0, result.stderr[-2000:]
    flags, summary, finite = result.stdout.splitlines()[-3:]
    assert flags.split() == lnlstm_ext.build_configurations()[1][1]  # the portable flags of this CPU
    assert "C++ operator built portable" in summary and "LN-LSTM cpp (" in summary and finite == "True"


def test_a_build_says_so_and_how_long_it_takes_and_a_cached_one_says_nothing(tmp_path, capsys, monkeypatch):
    """The first transcribe on a machine waited about a minute in silence while the operator built (issue 80)."""
    import logging
    import os

    # Logging as in a Python session that set none up (an earlier test in this process may have: then it goes to the log).
    unconfigured = logging.getLogger("asr.test.unconfigured")
    unconfigured.propagate = False
    monkeypatch.setattr(lnlstm_ext, "_log", unconfigured)

    built = []

    class Extension:  # torch.utils.cpp_extension, with its build done in no time
        @staticmethod
        def _get_build_directory(name, verbose):
            return str(tmp_path / name)

        @staticmethod
        def load(name, **options):
            (tmp_path / name / f"{name}.so").write_bytes(b"")
            built.append(name)

    lnlstm_ext._compile(Extension, "asr_lnlstm_test", ["-O3"])
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"building the C++ LN-LSTM operator for this CPU, once ({lnlstm_ext.BUILD_TIME}) into {tmp_path / 'asr_lnlstm_test'}"
    assert err[1].startswith("built the C++ LN-LSTM operator in ") and len(err) == 2
    lnlstm_ext._compile(Extension, "asr_lnlstm_test", ["-O3"])  # cached: it only loads
    assert capsys.readouterr().err == "" and len(built) == 2
    library = tmp_path / "asr_lnlstm_test" / "asr_lnlstm_test.so"
    os.utime(library, (0, 0))  # older than the sources: ninja rebuilds it, and that is said too
    lnlstm_ext._compile(Extension, "asr_lnlstm_test", ["-O3"])
    assert "building the C++ LN-LSTM operator" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    torch.manual_seed(5)
    model = LNLSTM(3, 4, bidirectional=True)
    x, lengths = torch.randn(2, 6, 3), torch.tensor([6, 3])
    y_cpu, _ = model(x, lengths)
    y_cuda, _ = model.cuda()(x.cuda(), lengths.cuda())
    assert_close(y_cuda.cpu(), y_cpu, name="y")


# --- the cell, dropout, errors ----------------------------------------------------


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
@pytest.mark.parametrize("layer_norm", [True, False])
def test_cell_stepped_over_time_equals_sequence_forward(implementation, layer_norm):
    torch.manual_seed(6)
    model = LNLSTM(5, 6, layer_norm=layer_norm)
    perturb(model)
    cell = model.cells[0]
    assert isinstance(cell, LNLSTMCell)
    x = torch.randn(3, 8, 5)
    y, (h_n, c_n) = model(x)
    state = None
    for t in range(8):
        state = cell(x[:, t], state)
        assert_close(state[0], y[:, t], name=f"h at step {t}")
    assert_close(state[0], h_n[0], name="h_n")
    assert_close(state[1], c_n[0], name="c_n")


def test_cell_carries_the_unnormalised_cell_state():
    """Against the equations written out: c_2 = c_1 * sigmoid(f + fb) + sigmoid(i) * tanh(j)
    with the un-normalised c_1 (some implementations carry LN_c(c_1))."""
    torch.manual_seed(9)
    cell = LNLSTMCell(3, 4, forget_bias=1.0)
    perturb(cell)
    x1, x2 = torch.randn(2, 3), torch.randn(2, 3)
    h1, c1 = cell(x1)
    assert h1.shape == c1.shape == (2, 4)
    h2, c2 = cell(x2, (h1, c1))

    def ln(module, v):
        centred = v - v.mean(-1, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * module.weight + module.bias

    gates = ln(cell.ln_x, x2 @ cell.weight_x.T) + ln(cell.ln_h, h1 @ cell.weight_h.T) + cell.bias
    i, j, f, o = gates.chunk(4, -1)
    expected_c2 = c1 * torch.sigmoid(f + 1.0) + torch.sigmoid(i) * torch.tanh(j)
    assert_close(c2, expected_c2, name="c_2")
    assert_close(h2, torch.tanh(ln(cell.ln_c, expected_c2)) * torch.sigmoid(o), name="h_2")
    with pytest.raises(ValueError, match=r"\(B, 3\)"):
        cell(torch.randn(2, 5))


def test_dropout_only_between_layers_and_only_in_training():
    torch.manual_seed(7)
    x = torch.randn(2, 5, 3)
    single = LNLSTM(3, 4, num_layers=1, dropout=0.5).train()
    assert torch.equal(single(x)[0], single(x)[0]), "no dropout after the last layer"
    stacked = LNLSTM(3, 4, num_layers=2, dropout=0.5)
    stacked.train()
    assert not torch.equal(stacked(x)[0], stacked(x)[0])
    stacked.eval()
    assert torch.equal(stacked(x)[0], stacked(x)[0])


def test_bad_inputs_raise_clear_errors():
    model = LNLSTM(3, 4, num_layers=2)
    x = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match=r"\(B, T, 3\)"):
        model(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, T=5\]"):
        model(x, torch.tensor([6, 2]))
    with pytest.raises(ValueError, match="integers"):
        model(x, torch.tensor([5.0, 2.0]))
    with pytest.raises(ValueError, match=r"\(2,\)"):
        model(x, torch.tensor([5]))
    with pytest.raises(ValueError, match=r"\(2, 2, 4\)"):
        model(x, state=(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(ValueError, match=r"LNLSTM implementation \(set_implementation\) must be one of"):
        lnlstm.set_implementation("fortran")


# --- it learns real speech ----------------------------------------------------------


def fbank_utterances(recordings, speaker: str, takes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, T, 23) log-mel fbank, per-utterance mean/variance normalised, lengths, digit labels."""
    features, labels = [], []
    for digit in range(10):
        for take in takes:
            audio, rate = soundfile.read(str(recordings / f"{digit}_{speaker}_{take}.wav"), dtype="float32")
            fbank = torchaudio.compliance.kaldi.fbank(
                torch.from_numpy(audio).unsqueeze(0) * 32768, sample_frequency=rate, num_mel_bins=23, dither=0.0
            )
            features.append((fbank - fbank.mean(0)) / (fbank.std(0) + 1e-5))
            labels.append(digit)
    lengths = torch.tensor([len(f) for f in features])
    return nn.utils.rnn.pad_sequence(features, batch_first=True), lengths, torch.tensor(labels)


class DigitClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = LNLSTM(23, 64, layer_norm=True)
        self.out = nn.Linear(64, 10)

    def forward(self, x, lengths):
        y, _ = self.rnn(x, lengths)
        return self.out(y.sum(1) / lengths.unsqueeze(1))  # mean over valid frames: padding is zero


@pytest.mark.slow
def test_learns_spoken_digits(fsdd_recordings):
    torch.manual_seed(0)
    x_train, len_train, y_train = fbank_utterances(fsdd_recordings, "jackson", range(5, 50))
    x_test, len_test, y_test = fbank_utterances(fsdd_recordings, "jackson", range(5))
    model = DigitClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    epochs, batch_size = 6, 32
    steps = epochs * ((len(y_train) + batch_size - 1) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=steps)
    for _ in range(epochs):
        for batch in torch.randperm(len(y_train)).split(batch_size):
            frames = int(len_train[batch].max())
            logits = model(x_train[batch, :frames], len_train[batch])
            loss = nn.functional.cross_entropy(logits, y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            assert torch.isfinite(loss)
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test, len_test).argmax(1) == y_test).float().mean().item()
    assert accuracy >= 0.85, f"held-out accuracy {accuracy:.2f}"


def test_parameter_names_are_those_of_earlier_checkpoints():
    """Checkpoints written before asr/models/lnlstm became a package load: the state dict's names
    are the ones they hold (a renamed parameter would need a load-time mapping)."""
    model = LNLSTM(3, 4, num_layers=2, bidirectional=True)
    per_cell = ["weight_x", "weight_h", "bias", "ln_x.weight", "ln_x.bias", "ln_h.weight", "ln_h.bias",
                "ln_c.weight", "ln_c.bias"]
    assert list(model.state_dict()) == [f"cells.{k}.{name}" for k in range(4) for name in per_cell]
    plain = LNLSTM(3, 4, layer_norm=False)
    assert list(plain.state_dict()) == ["cells.0.weight_x", "cells.0.weight_h", "cells.0.bias"]


@pytest.mark.slow  # a second process loads the operator
def test_a_lock_left_by_a_process_stopped_while_loading_the_operator_does_not_hang_the_next_load(tmp_path):
    # torch's build lock file (a FileBaton) outlives a process killed while ninja checks the build; every
    # later load of the operator used to wait for it for ever (seen: a study's runs stopped by SIGTERM as
    # they started, then every evaluation and test hung)
    import subprocess
    import sys
    from pathlib import Path

    from torch.utils import cpp_extension

    from helpers import PROJECT_ROOT, subprocess_env

    if lnlstm_ext.load() is None:
        pytest.skip("the fused C++ operator cannot be built here")
    name = next(n for n, flags in lnlstm_ext.build_configurations() if flags == lnlstm_ext.build_flags())
    built = Path(cpp_extension._get_build_directory(name, verbose=False))
    root = tmp_path / "extensions"
    copy = root / built.name  # where torch looks under TORCH_EXTENSIONS_DIR
    shutil.copytree(built, copy)  # (with its times: ninja finds it up to date and does not rebuild)
    (copy / "lock").unlink(missing_ok=True)
    (copy / "lock").touch()  # what the stopped process left
    load = ("import logging; logging.basicConfig(); from asr.models.lnlstm.backends import cpp; "
            "cpp.load(strict=True); print('loaded')")
    result = subprocess.run([sys.executable, "-c", load], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=300, env=dict(subprocess_env(), TORCH_EXTENSIONS_DIR=str(root)))
    assert result.returncode == 0 and "loaded" in result.stdout, result.stderr[-2000:]
    assert "left by a process stopped" in result.stderr
    assert not (copy / "lock").exists()

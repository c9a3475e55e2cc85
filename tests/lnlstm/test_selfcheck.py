"""A fused LN-LSTM backend checks itself against the reference path before it computes anything
(asr/models/lnlstm/selfcheck.py): on CPU with the C++ operator, under Triton's interpreter, and with
deliberately broken backends."""

from __future__ import annotations

import logging

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.models import runtime
from asr.models.las import LAS, LASConfig
from asr.models.lnlstm import LNLSTM, LNLSTMCell, selfcheck
from asr.models.lnlstm.backends import backends
from asr.models.lnlstm.cells import CellSpec
from helpers import load_triton_kernels, small_las_config

INTERPRETED = load_triton_kernels()
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_verdicts():
    selfcheck.forget()
    yield
    selfcheck.forget()


def _cpp_runs() -> bool:
    try:
        return backends()["cpp"].available(CPU)
    except Exception:
        return False


needs_cpp = pytest.mark.skipif(not _cpp_runs(), reason="the C++ operator does not build here")


CPP_SPECS = [CellSpec(), CellSpec(layer_norm=False), CellSpec(variant="tf_contrib", eps=1e-12)]
CPP_SPEC_IDS = ["ba2016", "plain", "tf_contrib"]


@needs_cpp
@pytest.mark.parametrize("spec", CPP_SPECS, ids=CPP_SPEC_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cpp_operator_passes_its_check_and_runs(spec, dtype):
    assert selfcheck.passes("cpp", spec, CPU, dtype, dtype, single_step=False)
    lstm = LNLSTM(5, 4, bidirectional=True, layer_norm=spec.layer_norm, variant=spec.variant).to(dtype)
    assert lstm.select_backend(torch.randn(2, 3, 5, dtype=dtype)) == "cpp"
    assert selfcheck.fallbacks() == []


@needs_cpp
@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_a_first_call_from_a_decode_without_gradients_still_checks_and_uses_the_operator(context):
    # asr.evaluate's first LN-LSTM call comes under no_grad: the check's backward must still run there
    lstm = LNLSTM(5, 4, bidirectional=True)
    with context():
        assert lstm.select_backend(torch.randn(2, 3, 5)) == "cpp"
    assert selfcheck.fallbacks() == []


@pytest.mark.skipif(not INTERPRETED, reason="needs triton, interpreted (no GPU here)")
@pytest.mark.parametrize("single_step", [False, True], ids=["layer", "step"])
def test_the_triton_kernels_pass_their_check_under_the_interpreter(monkeypatch, single_step):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert selfcheck.passes("triton", CellSpec(), CPU, torch.float32, torch.float32, single_step)


def _broken_layer(real):
    def layer(params, x, lengths, h0, c0, cuda_graphs):
        y, h, c = real(params, x, lengths, h0, c0, cuda_graphs)
        return y * 1.01, h, c  # a kernel that is off by 1%

    return layer


def _raising(*args, **kwargs):
    raise RuntimeError("no kernel image is available for execution on the device")


@needs_cpp
@pytest.mark.parametrize("variant", ["ba2016", "tf_contrib"])
@pytest.mark.parametrize("fault", ["wrong", "raises"])
def test_a_broken_backend_falls_back_to_the_reference_path_saying_so_once(monkeypatch, caplog, fault, variant):
    cpp = backends()["cpp"]
    monkeypatch.setattr(cpp, "layer", _broken_layer(cpp.layer) if fault == "wrong" else _raising)
    lstm = LNLSTM(5, 4, bidirectional=True, variant=variant)
    x = torch.randn(2, 3, 5)
    with caplog.at_level(logging.WARNING):
        assert lstm.select_backend(x) == "reference"
        y, _ = lstm(x)  # runs, on the reference path
        assert lstm.select_backend(x) == "reference"
    warnings = [r.getMessage() for r in caplog.records if "failed its check" in r.getMessage()]
    assert len(warnings) == 1 and "'cpp'" in warnings[0] and "cpu" in warnings[0]
    assert ("differs from the reference path" if fault == "wrong" else "RuntimeError") in warnings[0]
    (entry,) = selfcheck.fallbacks()
    assert entry["backend"] == "cpp" and entry["instead"] == "reference" and variant in entry["call"]
    assert torch.isfinite(y).all()


@needs_cpp
def test_strict_makes_a_failed_check_an_error_naming_the_backend(monkeypatch):
    cpp = backends()["cpp"]
    monkeypatch.setattr(cpp, "layer", _broken_layer(cpp.layer))
    lstm = LNLSTM(5, 4, bidirectional=True, check="strict")
    with pytest.raises(selfcheck.BackendCheckError, match="'cpp' failed its check on cpu"):
        lstm(torch.randn(2, 3, 5))
    assert LNLSTM(5, 4, check="off").select_backend(torch.randn(2, 3, 5)) == "cpp"  # off: not checked


@pytest.mark.skipif(not INTERPRETED, reason="needs triton, interpreted (no GPU here)")
def test_a_broken_single_step_falls_back_for_the_speller(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton = backends()["triton"]
    real = triton.cell_step

    def off(cell, x, h, c):
        h_new, c_new = real(cell, x, h, c)
        return h_new + 0.01, c_new

    monkeypatch.setattr(triton, "cell_step", off)
    cell = LNLSTMCell(3, 4, backend="triton")
    h, _ = cell(torch.randn(2, 3))
    assert selfcheck.fallbacks()[0]["call"].startswith("one step")
    assert torch.isfinite(h).all()


@needs_cpp
def test_the_run_records_the_fallback_and_the_recipe_key_is_checked(monkeypatch):
    cpp = backends()["cpp"]
    monkeypatch.setattr(cpp, "layer", _raising)
    model = LAS(small_las_config(), 6, 10)
    record = runtime.describe(model, CPU)
    assert record["lnlstm_backends"]["reference"]  # the listener's layers went to the reference path
    assert record["lnlstm_fallbacks"][0]["backend"] == "cpp"
    assert runtime.ran()["lnlstm_fallbacks"] == record["lnlstm_fallbacks"]
    assert from_dict(LASConfig, {"lnlstm_check": "strict"}, "model").lnlstm_check == "strict"
    with pytest.raises(ConfigError, match="model.lnlstm_check"):
        from_dict(LASConfig, {"lnlstm_check": "sometimes"}, "model")


@needs_cpp
def test_the_check_leaves_the_runs_random_numbers_as_they_were():
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    selfcheck.passes("cpp", CellSpec(), CPU, torch.float32, torch.float32, single_step=False)
    assert torch.equal(torch.random.get_rng_state(), before)


@needs_cpp
def test_under_autocast_the_check_holds_both_paths_to_the_autocast_dtype_and_keeps_its_own_verdict(monkeypatch):
    # Under bf16 autocast the reference path's GEMMs run in bf16, 1e-2 from float32: a float32
    # tolerance failed every fused backend there (seen on an H200 in LAS training, 2026-11-26). A backend
    # 1% off float32 is inside bf16's tolerance but not float32's, so the two verdicts must differ.
    reference = backends()["reference"]

    def one_percent_off(params, x, lengths, h0, c0, cuda_graphs):
        with torch.autocast("cpu", enabled=False):
            y, h, c = reference.layer(params, x.float(), lengths, h0.float(), c0.float(), cuda_graphs)
        return y * 1.01, h, c

    monkeypatch.setattr(backends()["cpp"], "layer", one_percent_off)
    lstm = LNLSTM(5, 4, bidirectional=True)
    x = torch.randn(2, 3, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lstm.select_backend(x) == "cpp"
    assert selfcheck.fallbacks() == []
    assert lstm.select_backend(x) == "reference"  # float32: 1% is too far
    (entry,) = selfcheck.fallbacks()
    assert "autocast" not in entry["call"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lstm.select_backend(x) == "cpp"  # its own verdict, kept

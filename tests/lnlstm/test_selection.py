"""select_backend (asr/models/lnlstm/selection.py), the one place that chooses an LN-LSTM backend,
as the pure function it is: fake backends in, a name out; and the request from recipe to model."""

from __future__ import annotations

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.models.las import LAS, LASConfig
from asr.models.lnlstm import CellSpec, LNLSTM, LNLSTMCell, select_backend, selection
from asr.models.lnlstm.backends import backends

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
BA2016, PLAIN, TF_CONTRIB = CellSpec(), CellSpec(layer_norm=False), CellSpec(variant="tf_contrib", eps=1e-12)
RAW_GATES = CellSpec(variant="raw_gates", eps=1e-3)


class Fake:
    """A backend with fixed answers; ``asked`` records the availability questions (device, strict).
    It computes the plain LSTM and the LN-LSTM ``variants``."""

    def __init__(self, name, auto_devices, devices, dtypes, variants, available=True, single_step=False):
        self.name, self.auto_devices = name, auto_devices
        self.devices, self.dtypes, self.is_available, self.single_step = devices, dtypes, available, single_step
        self.variants = variants
        self.asked = []

    def supports(self, spec, device, dtype, param_dtype, single_step):
        return ((not spec.layer_norm or spec.variant in self.variants) and device.type in self.devices
                and param_dtype in self.dtypes and (self.single_step or not single_step))

    def available(self, device, strict=False):
        self.asked.append((device.type, strict))
        if not self.is_available and strict:
            raise RuntimeError(f"{self.name} cannot run here")
        return self.is_available


def fakes(triton_available=True, cpp_available=True):
    return {
        "triton": Fake("triton", ("cuda",), ("cuda", "cpu"), (F32,), ("ba2016",), triton_available,
                       single_step=True),
        "cpp": Fake("cpp", ("cpu",), ("cpu",), (F32, F64), ("ba2016", "tf_contrib"), cpp_available),
    }


@pytest.mark.parametrize(
    "request_, spec, device, param_dtype, single_step, expected",
    [
        ("auto", BA2016, CPU, F32, False, "cpp"),
        ("auto", BA2016, CPU, F64, False, "cpp"),
        ("auto", BA2016, CPU, BF16, False, "reference"),       # no backend takes bf16 parameters
        ("auto", BA2016, CUDA, F32, False, "triton"),
        ("auto", BA2016, CUDA, F64, False, "reference"),       # Triton takes float32 parameters only
        ("auto", PLAIN, CUDA, F32, False, "triton"),
        ("auto", TF_CONTRIB, CPU, F32, False, "cpp"),          # C++ computes tf_contrib too
        ("auto", TF_CONTRIB, CPU, F64, False, "cpp"),
        ("auto", TF_CONTRIB, CUDA, F32, False, "reference"),   # Triton does not
        ("auto", RAW_GATES, CPU, F32, False, "reference"),     # no backend computes raw_gates
        ("auto", BA2016, CPU, F32, True, "reference"),         # a single step: C++ computes whole layers
        ("auto", BA2016, CUDA, F32, True, "triton"),
        ("reference", BA2016, CUDA, F32, False, "reference"),
        ("cpp", BA2016, CPU, F32, False, "cpp"),
        ("cpp", BA2016, CUDA, F32, False, "reference"),        # supported nowhere but CPU: the reference path
        ("triton", BA2016, CPU, F32, False, "triton"),         # CPU under the interpreter
        ("triton", TF_CONTRIB, CUDA, F32, False, "reference"),
    ],
)
def test_the_choice(request_, spec, device, param_dtype, single_step, expected):
    assert select_backend(request_, spec, device, param_dtype, param_dtype, fakes(), single_step) == expected


def test_auto_falls_back_quietly_and_a_named_backend_raises():
    """auto asks without strictness (the backend warns once and the reference path runs); a named
    backend that supports the call but cannot run raises its reason."""
    backends = fakes(triton_available=False, cpp_available=False)
    assert select_backend("auto", BA2016, CUDA, F32, F32, backends) == "reference"
    assert select_backend("auto", BA2016, CPU, F32, F32, backends) == "reference"
    assert backends["triton"].asked == [("cuda", False)] and backends["cpp"].asked == [("cpu", False)]
    with pytest.raises(RuntimeError, match="cpp cannot run here"):
        select_backend("cpp", BA2016, CPU, F32, F32, backends)
    with pytest.raises(RuntimeError, match="triton cannot run here"):
        select_backend("triton", BA2016, CUDA, F32, F32, backends)


def test_unsupported_calls_never_ask_for_availability():
    """Nothing is built or compiled for a call a backend does not support."""
    backends = fakes()
    select_backend("auto", RAW_GATES, CPU, F32, F32, backends)
    select_backend("auto", TF_CONTRIB, CUDA, F32, F32, backends)
    select_backend("cpp", BA2016, CUDA, F32, F32, backends)
    assert backends["cpp"].asked == [] and backends["triton"].asked == []


def test_the_recipe_request_reaches_every_lstm_and_only_set_implementation_overrides_it(monkeypatch):
    config = from_dict(LASConfig, {"lnlstm_backend": "reference", "lnlstm_build": "portable"}, "model")
    model = LAS(config, input_dim=6, vocab_size=10)
    lstms = [m for m in model.modules() if isinstance(m, (LNLSTM, LNLSTMCell))]
    assert lstms and {m.backend for m in lstms} == {"reference"} and {m.build for m in lstms} == {"portable"}
    x = torch.randn(2, 4, 6)
    listener_lstm = model.listener.layers[0]
    assert listener_lstm.select_backend(torch.randn(2, 4, listener_lstm.input_size)) == "reference"
    monkeypatch.setattr(selection, "_warned", set())
    monkeypatch.setenv("ASR_LNLSTM_IMPL", "cpp")  # no longer read (a warning says so)
    assert selection.effective_request("reference") == "reference"
    assert listener_lstm.select_backend(torch.randn(2, 4, listener_lstm.input_size)) == "reference"
    monkeypatch.setattr(selection, "_programmatic", "cpp")  # set_implementation
    assert selection.effective_request("auto") == "cpp"
    monkeypatch.setattr(selection, "_programmatic", None)
    assert model(x, torch.tensor([4, 3]), torch.randint(3, 10, (2, 3)), torch.tensor([3, 2])) is not None


def test_the_build_request_reaches_the_cpp_backend_selection_asks():
    assert backends()["cpp"].build == "native" and backends("portable")["cpp"].build == "portable"
    assert backends("portable")["triton"] is backends()["triton"]  # the build is the C++ operator's alone
    with pytest.raises(ValueError, match="model.lnlstm_build must be one of native, portable, got 'fast'"):
        backends("fast")


def test_bad_requests_name_their_key():
    with pytest.raises(ConfigError, match="lnlstm_backend"):
        from_dict(LASConfig, {"lnlstm_backend": "fortran"}, "model")
    with pytest.raises(ValueError, match="model.lnlstm_backend"):
        LNLSTM(3, 4, backend="fortran")
    assert selection.check_backend("python") == "reference"  # the older name of the reference path
    with pytest.raises(ConfigError, match="model.lnlstm_build") as refused:
        from_dict(LASConfig, {"lnlstm_build": "fast"}, "model")
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="model.lnlstm_build must be one of native, portable, got 'fast'"):
        LNLSTM(3, 4, build="fast")


def test_a_retired_environment_variable_is_warned_about_once_naming_its_recipe_key(monkeypatch, caplog):
    monkeypatch.setattr(selection, "_warned", set())
    environ = {"ASR_LNLSTM_CUDA_GRAPHS": "0", "ASR_SPELLER_CUDA_GRAPHS_MEMORY": "0.5", "ASR_LNLSTM_BUILD": "",
               "HOME": "/root"}
    with caplog.at_level("WARNING", logger="asr.models.lnlstm.selection"):
        assert selection.warn_retired_variables(environ) == ["ASR_LNLSTM_CUDA_GRAPHS", "ASR_SPELLER_CUDA_GRAPHS_MEMORY"]
        assert selection.warn_retired_variables(environ) == []  # once per process
    assert [r.getMessage() for r in caplog.records] == [
        "ASR_LNLSTM_CUDA_GRAPHS=0 is set but no longer read: set model.lnlstm_cuda_graphs in the recipe or on "
        "the command line (model.lnlstm_cuda_graphs=...) instead",
        "ASR_SPELLER_CUDA_GRAPHS_MEMORY=0.5 is set but no longer read: set model.speller_cuda_graphs_memory in "
        "the recipe or on the command line (model.speller_cuda_graphs_memory=...) instead",
    ]
    assert set(selection.RETIRED_VARIABLES.values()) <= {f"model.{name}" for name in LASConfig.__dataclass_fields__}


def test_a_retired_variable_set_for_a_run_is_warned_about_when_its_lstms_pick_a_backend(monkeypatch, caplog):
    monkeypatch.setattr(selection, "_warned", set())
    monkeypatch.setenv("ASR_LNLSTM_IMPL", "cpp")
    layer = LNLSTM(4, 3, backend="reference")
    before = selection.calls()
    with caplog.at_level("WARNING", logger="asr.models.lnlstm.selection"):
        layer(torch.randn(2, 5, 4))
        layer(torch.randn(2, 5, 4))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["ASR_LNLSTM_IMPL=cpp is set but no longer read"]
    assert "model.lnlstm_backend" in caplog.records[0].getMessage()
    assert selection.ran(since=before) == {"cpu": ["reference"]}  # the recipe's request, not the variable's


def test_what_ran_counts_only_calls_after_the_snapshot():
    # A run records what computed its LSTMs during the run; calls made earlier in the same process
    # (another run, a test on another backend) must not appear in its record.
    layer = LNLSTM(4, 3, backend="reference")
    layer(torch.randn(2, 5, 4))
    selection.record(CPU, "triton")  # something else, earlier, in this process
    before = selection.calls()
    assert "triton" in selection.ran()["cpu"]
    layer(torch.randn(2, 5, 4))
    assert selection.ran(since=before) == {"cpu": ["reference"]}
    assert selection.ran(since=selection.calls()) == {}

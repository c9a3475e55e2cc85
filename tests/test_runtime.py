"""asr.models.runtime: the record of which code computes a model, and the one line train.log gives it (issue 80)."""

import torch
from torch import nn

from asr.models import runtime
from asr.models.lnlstm import LNLSTM, selection


def test_a_run_off_cuda_records_nothing_of_cuda_graphs():
    model = nn.Linear(2, 2)  # no LN-LSTM, no attention: nothing to choose, nothing to build
    assert "cuda_graphs" not in runtime.describe(model, "cpu")
    assert "cuda_graphs_recorded" not in runtime.ran(device="cpu")
    assert runtime.describe(model, "cuda")["cuda_graphs"] == {"lnlstm": None, "speller": None}
    assert "cuda_graphs_recorded" in runtime.ran(device="cuda")


def test_the_summary_is_one_line_with_the_backends_and_what_is_out_of_the_ordinary():
    record = {"device": "cpu", "lnlstm_backend_requested": ["auto"], "lnlstm_backend_override": None,
              "lnlstm_backends": {"cpp": ["listener.layers.0", "listener.layers.1"], "reference": ["speller.cells.0"]},
              "lnlstm_fallbacks": [], "attention_backends": {"cpp": ["speller.attention"]},
              "cpp_build_flags": "-O3 -fopenmp -march=native"}
    line = runtime.summary(record, "exp/config.yaml")
    assert line == ("runtime: cpu; LN-LSTM cpp (2), reference (1); attention cpp (1); C++ operator built native "
                    "(details: exp/config.yaml)")
    record.update(lnlstm_fallbacks=[{"backend": "cpp", "device": "cpu", "call": "a layer", "reason": "RuntimeError"}],
                  lnlstm_backend_override="reference", cpp_build_flags="-O3 -mavx2")
    line = runtime.summary(record, "exp/config.yaml")
    assert "C++ operator built portable" in line and "fell back to the reference path from cpp on cpu" in line
    assert "backend forced to reference" in line and "\n" not in line


def test_a_run_with_a_retired_variable_set_warns_as_it_starts_and_keeps_the_recipes_choice(monkeypatch, caplog):
    """ASR_LNLSTM_CUDA_GRAPHS and the other ASR_* overrides are no longer read; their recipe keys are."""
    monkeypatch.setattr(selection, "_warned", set())
    monkeypatch.setenv("ASR_LNLSTM_CUDA_GRAPHS", "0")
    model = nn.ModuleDict({"encoder": LNLSTM(2, 3, backend="reference", cuda_graphs=True)})
    with caplog.at_level("WARNING"):
        record = runtime.describe(model, torch.device("cuda"))  # what the trainer records as the run starts
    assert record["cuda_graphs"] == {"lnlstm": True, "speller": None}  # the recipe's, not the variable's
    assert "environment_overrides" not in record
    assert [r.getMessage() for r in caplog.records] == [
        "ASR_LNLSTM_CUDA_GRAPHS=0 is set but no longer read: set model.lnlstm_cuda_graphs in the recipe or on "
        "the command line (model.lnlstm_cuda_graphs=...) instead"
    ]


def test_what_ran_is_one_line_naming_each_backend_and_only_then_graphs_and_fallbacks():
    record = {"lnlstm_backends_ran": {"cpu": ["cpp", "reference"], "cuda": ["triton"]}, "lnlstm_fallbacks": [],
              "attention_backends_ran": ["cpp"],
              "cuda_graphs_recorded": {"lnlstm": {"recorded": 0, "failed": None}, "speller": {"recorded": 0, "failed": None}}}
    assert runtime.ran_summary(record) == "ran: LN-LSTM cpp, reference on cpu; triton on cuda; attention cpp"
    record["cuda_graphs_recorded"]["speller"] = {"recorded": 3, "failed": "capture error"}
    record["lnlstm_fallbacks"] = [{"backend": "triton", "device": "cuda", "reason": "RuntimeError"}]
    line = runtime.ran_summary(record)
    assert "CUDA graphs recorded lnlstm 0, speller 3 (capture failed: capture error)" in line
    assert line.endswith("; fell back to the reference path from triton on cuda") and "\n" not in line
    # what the process ran, as asr.models.runtime.ran gives it, reads the same way
    assert runtime.ran_summary(runtime.ran(device="cpu")).startswith("ran: LN-LSTM ")

"""What code computes a model here: the LN-LSTM, attention and SDPA backends, the C++ build flags, CUDA graphs.

Two runs of one recipe can run different code (a machine without a compiler falls back to the
reference path; a benchmark switches a path with a command-line override, which the recipe records).
The trainer writes :func:`describe` under ``runtime:`` in the run's ``config.yaml`` when the run
starts, and :func:`summary`, one line, into ``train.log``; :func:`ran`, known after training, goes
into ``train.log`` as one line (:func:`ran_summary`; every entry of both with ``--verbose``).
``asr.evaluate`` and ``asr.transcribe`` print :func:`describe` with ``--verbose``. CUDA graphs are
left out of the records of a run off CUDA, where they cannot apply.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from asr.models import attention_fused, cuda_graphs
from asr.models.attention import Attention
from asr.models.lnlstm import LNLSTM, LNLSTMCell, selection, selfcheck
from asr.models.lnlstm.backends import cpp as cpp_backend
from asr.models.speller import Speller


def describe(model: nn.Module, device: torch.device | str) -> dict:
    """The backend each LN-LSTM of ``model`` runs on ``device`` (by module name; the speller's cells
    take single steps), what the recipe asked for (the command line's overrides are in the recipe
    already) and what :func:`~asr.models.lnlstm.set_implementation` forced, the flags the C++ operator
    was built with (None where it was not loaded; ``model.lnlstm_build`` asks for native or portable)
    and the CUDA-graph switches.

    Choosing a backend may build the C++ operator or compile the Triton kernels, as the
    first forward pass would."""
    device = torch.device(device)
    chosen, requested = {}, set()
    for name, module in model.named_modules():
        if not isinstance(module, (LNLSTM, LNLSTMCell)) or _inside_lnlstm(name, model):
            continue
        cell = module.cells[0] if isinstance(module, LNLSTM) else module
        requested.add(module.backend)
        dtype = cell.weight_h.dtype
        chosen[name] = selection.checked(module.backend, cell.spec, device, dtype, dtype,
                                         single_step=isinstance(module, LNLSTMCell), check=module.check,
                                         build=module.build)
    attention = {}
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            dtype = module.query_proj.weight.dtype
            attention[name] = attention_fused.chosen(module, device, dtype)
    switches = {
        "lnlstm": [m.cuda_graphs for m in model.modules() if isinstance(m, LNLSTM)],
        "speller": [m.cuda_graphs for m in model.modules() if isinstance(m, Speller)],
    }
    sdpa = None
    if hasattr(model, "sdpa_backends"):  # scaled_dot_product_attention's backends (asr.models.sdpa), per run
        allowed = model.sdpa_backends(device.type)
        sdpa = {"requested": model.config.sdpa_backend, "batch_shapes": model.batch_shapes,
                "allowed": list(allowed) if allowed is not None else "pytorch's choice"}
    record = {
        "device": str(device),
        "lnlstm_backend_requested": sorted(requested),
        "lnlstm_backend_override": selection.get_implementation(),
        "lnlstm_backends": _grouped(chosen),
        # fused backends that failed their check against the reference path (asr.models.lnlstm.selfcheck)
        "lnlstm_fallbacks": selfcheck.fallbacks(),
        "attention_backends": _grouped(attention),  # the fused C++ step or PyTorch ops (asr.models.attention_fused)
        "sdpa_backend": sdpa,  # the Transformer's and Conformer's model.sdpa_backend, resolved for this run
        "cpp_build_flags": " ".join(cpp_backend.build_flags()) if cpp_backend.build_flags() else None,
        "cuda_graphs": {
            "lnlstm": all(switches["lnlstm"]) if switches["lnlstm"] else None,
            "speller": all(switches["speller"]) if switches["speller"] else None,
        },
    }
    if device.type != "cuda":
        del record["cuda_graphs"]
    return record


def snapshot() -> dict:
    """What has run in this process so far; :func:`ran` takes it to report only what ran after it."""
    return {"lnlstm_calls": selection.calls(), "cuda_graphs": cuda_graphs.report()}


def ran(since: dict | None = None, device: torch.device | str = "cuda") -> dict:
    """What ran (after the ``since`` :func:`snapshot`, else in this process): LN-LSTM backends per
    device type, the attention paths (in this process), and, on a CUDA ``device``, CUDA graphs
    recorded per kind with the capture failure if any."""
    graphs = cuda_graphs.report()
    if since is not None:
        for kind, entry in graphs.items():
            entry["recorded"] -= since["cuda_graphs"][kind]["recorded"]
    calls = since["lnlstm_calls"] if since is not None else None
    record = {"lnlstm_backends_ran": selection.ran(calls), "lnlstm_fallbacks": selfcheck.fallbacks(),
              "attention_backends_ran": attention_fused.ran(), "cuda_graphs_recorded": graphs}
    if torch.device(device).type != "cuda":
        del record["cuda_graphs_recorded"]
    return record


def summary(record: dict, details: str) -> str:
    """A :func:`describe` record as one line: the device, which backend runs how many LN-LSTMs and
    attentions, the C++ build, and anything out of the ordinary (a fallback, a forced backend);
    ``details`` says where the whole record is."""
    def grouped(backends: dict[str, list[str]]) -> str:
        return ", ".join(f"{backend} ({len(names)})" for backend, names in backends.items()) or "none"

    flags = record.get("cpp_build_flags") or ""
    build = "native" if "-march=native" in flags else "portable" if flags else None
    parts = [f"runtime: {record['device']}", f"LN-LSTM {grouped(record['lnlstm_backends'])}",
             f"attention {grouped(record['attention_backends'])}"]
    if record.get("sdpa_backend"):
        allowed = record["sdpa_backend"]["allowed"]
        parts.append(f"SDPA {record['sdpa_backend']['requested']}: {allowed if isinstance(allowed, str) else ', '.join(allowed)}")
    if build:
        parts.append(f"C++ operator built {build}")
    if record.get("lnlstm_backend_override"):
        parts.append(f"backend forced to {record['lnlstm_backend_override']}")
    fallbacks = record.get("lnlstm_fallbacks") or []
    if fallbacks:  # each is warned about, with its reason, where it happens
        names = sorted({f"{f.get('backend')} on {f.get('device')}" if isinstance(f, dict) else str(f) for f in fallbacks})
        parts.append(f"fell back to the reference path from {', '.join(names)}")
    return "; ".join(parts) + f" (details: {details})"


def ran_summary(record: dict) -> str:
    """A :func:`ran` record as one line for ``train.log``: the LN-LSTM backends that ran on each device
    type, the attention paths, and where there are any, the CUDA graphs recorded and the fallbacks."""
    lstm = "; ".join(f"{', '.join(backends)} on {device}" for device, backends in record["lnlstm_backends_ran"].items())
    parts = [f"ran: LN-LSTM {lstm or 'none'}", f"attention {', '.join(record['attention_backends_ran']) or 'none'}"]
    graphs = record.get("cuda_graphs_recorded") or {}
    if any(entry["recorded"] or entry["failed"] for entry in graphs.values()):
        parts.append("CUDA graphs recorded " + ", ".join(
            f"{kind} {entry['recorded']}" + (f" (capture failed: {entry['failed']})" if entry["failed"] else "")
            for kind, entry in graphs.items()))
    fallbacks = record.get("lnlstm_fallbacks") or []
    if fallbacks:
        names = sorted({f"{f.get('backend')} on {f.get('device')}" if isinstance(f, dict) else str(f) for f in fallbacks})
        parts.append(f"fell back to the reference path from {', '.join(names)}")
    return "; ".join(parts)


def lines(record: dict) -> list[str]:
    """One line per entry of a :func:`describe` or :func:`ran` record."""
    return [f"runtime: {key}: {value}" for key, value in record.items()]


def log(logger: logging.Logger, record: dict) -> None:
    for line in lines(record):
        logger.info("%s", line)


def _inside_lnlstm(name: str, model: nn.Module) -> bool:
    """Whether module ``name`` is a cell of an LNLSTM (described with its stack)."""
    parent = name.rpartition(".cells.")[0]
    return bool(parent) and isinstance(model.get_submodule(parent), LNLSTM)


def _grouped(chosen: dict[str, str]) -> dict[str, list[str]]:
    """backend -> the module names it runs, so a model with many layers gives a short record."""
    grouped: dict[str, list[str]] = {}
    for name, backend in chosen.items():
        grouped.setdefault(backend, []).append(name)
    return grouped

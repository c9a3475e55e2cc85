"""Which backend computes an LN-LSTM layer or step: :func:`select_backend`, the only place that decides.

The request comes from the recipe (``model.lnlstm_backend``, passed to :class:`LNLSTM` and
:class:`LNLSTMCell` as ``backend``); ``ASR_LNLSTM_IMPL`` (:mod:`asr.models.overrides`) or
:func:`set_implementation` override it for benchmarks and tests.

* ``reference``: always the PyTorch reference path.
* ``cpp`` / ``triton``: that backend where it supports the call (variant, device, dtypes), raising
  if it cannot be built or run; the reference path where it does not support the call.
* ``auto``: the first backend that runs this device by default (Triton on CUDA, C++ on CPU),
  supports the call and is available; otherwise the reference path (the backend warns once).

:func:`record` counts what ran, so a run can write down what ran during it (:func:`calls`
before, :func:`ran` after).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

import torch

from asr.models import overrides
from asr.models.lnlstm import selfcheck
from asr.models.lnlstm.backends import Backend
from asr.models.lnlstm.backends import backends as every_backend

_programmatic: str | None = None  # set_implementation's override
_calls: Counter[tuple[str, str]] = Counter()  # ("cpu", "cpp") -> calls computed there by that backend


def set_implementation(name: str | None) -> None:
    """Override every LN-LSTM's backend request in this process (tests, benchmarks): ``"auto"``,
    ``"reference"`` (or ``"python"``), ``"cpp"``, ``"triton"``; None removes the override."""
    global _programmatic
    _programmatic = None if name is None else overrides.check_backend(
        name, where="LNLSTM implementation (set_implementation / ASR_LNLSTM_IMPL)"
    )


def get_implementation() -> str | None:
    """The override in effect (:func:`set_implementation`, else ``ASR_LNLSTM_IMPL``), or None."""
    return _programmatic if _programmatic is not None else overrides.active().get("ASR_LNLSTM_IMPL")


def effective_request(requested: str) -> str:
    """The backend request after the overrides: :func:`get_implementation` where set, else ``requested``."""
    override = get_implementation()
    return override if override is not None else requested


def select_backend(
    request: str,
    spec,
    device: torch.device,
    dtype: torch.dtype,
    param_dtype: torch.dtype,
    backends: Mapping[str, Backend],
    single_step: bool = False,
    passes: Callable[[str], bool] | None = None,
) -> str:
    """The name of the backend that runs a call; a pure function of its arguments.

    request: ``auto``, ``reference``, ``cpp`` or ``triton`` (already past the overrides);
    spec: the cells' :class:`~asr.models.lnlstm.cells.CellSpec`; device, dtype: the input's;
    param_dtype: the parameters'; backends: name -> :class:`Backend` (the fused ones; the
    reference path needs none); single_step: one step of one cell (the speller) rather than a
    whole layer; passes: whether a backend passed its check against the reference path
    (:func:`checked`, :mod:`asr.models.lnlstm.selfcheck`), None: no check. A named backend that
    supports the call but is not available raises.
    """
    if request == "reference":
        return "reference"
    if request == "auto":
        candidates = [name for name, backend in backends.items() if device.type in backend.auto_devices]
    else:
        candidates = [request]
    for name in candidates:
        backend = backends[name]
        if backend.supports(spec, device, dtype, param_dtype, single_step) and backend.available(
            device, strict=request != "auto"
        ) and (passes is None or passes(name)):
            return name
    return "reference"


def checked(request: str, spec, device: torch.device, dtype: torch.dtype, param_dtype: torch.dtype,
            single_step: bool = False, check: str = "fallback") -> str:
    """:func:`select_backend` over every backend, past the overrides, with the self-check ``check``
    (``model.lnlstm_check``: fallback, strict or off; :mod:`asr.models.lnlstm.selfcheck`): what the
    LN-LSTM modules and the run's record call."""

    def passes(name: str) -> bool:
        return selfcheck.passes(name, spec, device, dtype, param_dtype, single_step, check)

    return select_backend(effective_request(request), spec, device, dtype, param_dtype, every_backend(), single_step,
                          passes)


def record(device: torch.device, backend: str) -> None:
    """Count one LN-LSTM call computed by ``backend`` on ``device``."""
    _calls[(device.type, backend)] += 1


def calls() -> Counter[tuple[str, str]]:
    """A snapshot of the call counts so far in this process, to pass to :func:`ran` later."""
    return Counter(_calls)


def ran(since: Counter[tuple[str, str]] | None = None) -> dict[str, list[str]]:
    """Device type -> the backends that computed a call there (after the ``since`` snapshot of
    :func:`calls`, else in this process), sorted."""
    done = _calls - since if since is not None else +_calls
    names: dict[str, list[str]] = {}
    for device, backend in sorted(done):
        names.setdefault(device, []).append(backend)
    return names

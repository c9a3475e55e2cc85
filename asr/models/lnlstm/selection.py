"""Which backend computes an LN-LSTM layer or step: :func:`select_backend`, the only place that decides.

The request comes from the recipe (``model.lnlstm_backend``, passed to :class:`LNLSTM` and
:class:`LNLSTMCell` as ``backend``; ``model.lnlstm_build`` says how the C++ operator is built), and
a run records it in its ``config.yaml``; a benchmark switches it with a command-line override
(``model.lnlstm_backend=reference``). :func:`set_implementation` overrides it in-process, for tests
and benchmarks that build their modules themselves.

* ``reference``: always the PyTorch reference path.
* ``cpp`` / ``triton``: that backend where it supports the call (variant, device, dtypes), raising
  if it cannot be built or run; the reference path where it does not support the call.
* ``auto``: the first backend that runs this device by default (Triton on CUDA, C++ on CPU),
  supports the call and is available; otherwise the reference path (the backend warns once).

:func:`record` counts what ran, so a run can write down what ran during it (:func:`calls`
before, :func:`ran` after).

Environment variables overrode these recipe keys once (:data:`RETIRED_VARIABLES`); they are no longer
read, and a process where one is set warns once, naming the key to set instead (:func:`warn_retired_variables`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping

import torch

from asr.models.lnlstm import selfcheck
from asr.models.lnlstm.backends import Backend
from asr.models.lnlstm.backends import backends as every_backend

logger = logging.getLogger(__name__)

BACKEND_REQUESTS = ("auto", "reference", "cpp", "triton")
_BACKEND_ALIASES = {"python": "reference"}  # the older name of the reference path

# Variable -> the recipe key that replaced it. Older docs and scripts set them, so a run where one is set
# says so rather than ignoring it silently. They are checked where an LN-LSTM first picks its backend
# (:func:`checked`; a run's record calls it as the run starts): every model the speller's variables
# applied to, the LAS, has LN-LSTMs.
RETIRED_VARIABLES = {
    "ASR_LNLSTM_IMPL": "model.lnlstm_backend",
    "ASR_LNLSTM_BUILD": "model.lnlstm_build",
    "ASR_LNLSTM_CUDA_GRAPHS": "model.lnlstm_cuda_graphs",
    "ASR_SPELLER_CUDA_GRAPHS": "model.speller_cuda_graphs",
    "ASR_SPELLER_CUDA_GRAPHS_MEMORY": "model.speller_cuda_graphs_memory",
}
_warned: set[str] = set()  # the retired variables warned about in this process

_programmatic: str | None = None  # set_implementation's override
_calls: Counter[tuple[str, str]] = Counter()  # ("cpu", "cpp") -> calls computed there by that backend


def check_backend(name: str, where: str = "model.lnlstm_backend") -> str:
    """The backend request ``name`` in its canonical spelling; ValueError naming ``where`` otherwise."""
    name = _BACKEND_ALIASES.get(name, name)
    if name not in BACKEND_REQUESTS:
        raise ValueError(f"{where} must be one of {', '.join(BACKEND_REQUESTS)}, got {name!r}")
    return name


def warn_retired_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """Warn once per process for each of :data:`RETIRED_VARIABLES` set (non-empty) in ``environ`` (default:
    the process environment), naming the recipe key that replaced it; returns the variables warned about now."""
    environ = os.environ if environ is None else environ
    warned = []
    for name, key in RETIRED_VARIABLES.items():
        value = environ.get(name)
        if value and name not in _warned:
            _warned.add(name)
            warned.append(name)
            logger.warning("%s=%s is set but no longer read: set %s in the recipe or on the command line "
                           "(%s=...) instead", name, value, key, key)
    return warned


def set_implementation(name: str | None) -> None:
    """Override every LN-LSTM's backend request in this process (tests, benchmarks): ``"auto"``,
    ``"reference"`` (or ``"python"``), ``"cpp"``, ``"triton"``; None removes the override."""
    global _programmatic
    _programmatic = None if name is None else check_backend(name, where="LNLSTM implementation (set_implementation)")


def get_implementation() -> str | None:
    """The override :func:`set_implementation` put in effect, or None."""
    return _programmatic


def effective_request(requested: str) -> str:
    """The backend request after the override: :func:`get_implementation` where set, else ``requested``."""
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

    request: ``auto``, ``reference``, ``cpp`` or ``triton`` (already past :func:`set_implementation`);
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
            single_step: bool = False, check: str = "fallback", build: str = "native") -> str:
    """:func:`select_backend` over every backend, past :func:`set_implementation`, with the self-check
    ``check`` (``model.lnlstm_check``: fallback, strict or off; :mod:`asr.models.lnlstm.selfcheck`) and the
    C++ operator built as ``build`` asks (``model.lnlstm_build``: native or portable,
    :mod:`asr.models.lnlstm.backends.cpp`): what the LN-LSTM modules and the run's record call."""
    warn_retired_variables()

    def passes(name: str) -> bool:
        return selfcheck.passes(name, spec, device, dtype, param_dtype, single_step, check)

    return select_backend(effective_request(request), spec, device, dtype, param_dtype, every_backend(build),
                          single_step, passes)


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

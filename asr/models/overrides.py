"""Environment variables that override a recipe's model fields: for benchmarks and debugging only.

A run's choices live in its recipe (``model.lnlstm_backend``, ``model.lnlstm_cuda_graphs``,
``model.speller_cuda_graphs``, ``model.speller_cuda_graphs_memory``) and are recorded with it.
These variables exist so a benchmark can switch a path without editing a recipe; this module
is the one place that reads them, and every override in effect is logged (once per value) and
recorded with the run (:func:`active`).

=================================  =========================================  ===============================
variable                           overrides                                  values
=================================  =========================================  ===============================
``ASR_LNLSTM_IMPL``                ``model.lnlstm_backend``                   auto, reference (or python), cpp, triton
``ASR_LNLSTM_BUILD``               the C++ operator's build (no recipe field) native (default), portable
``ASR_LNLSTM_CUDA_GRAPHS``         ``model.lnlstm_cuda_graphs``               0, 1
``ASR_SPELLER_CUDA_GRAPHS``        ``model.speller_cuda_graphs``              0, 1
``ASR_SPELLER_CUDA_GRAPHS_MEMORY`` ``model.speller_cuda_graphs_memory``       a fraction in (0, 1]
=================================  =========================================  ===============================
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

logger = logging.getLogger("asr.models")

BACKEND_REQUESTS = ("auto", "reference", "cpp", "triton")
_BACKEND_ALIASES = {"python": "reference"}  # the older name of the reference path
_logged: set[tuple[str, str]] = set()


def check_backend(name: str, where: str = "model.lnlstm_backend") -> str:
    """The backend request ``name`` in its canonical spelling; ValueError naming ``where`` otherwise."""
    name = _BACKEND_ALIASES.get(name, name)
    if name not in BACKEND_REQUESTS:
        raise ValueError(f"{where} must be one of {', '.join(BACKEND_REQUESTS)}, got {name!r}")
    return name


def _flag(name: str, value: str) -> bool:
    if value not in ("0", "1"):
        raise ValueError(f"environment variable {name} must be 0 or 1, got {value!r}")
    return value == "1"


def _fraction(name: str, value: str) -> float:
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 < share <= 1.0:
        raise ValueError(f"environment variable {name} must be a fraction in (0, 1], got {value!r}")
    return share


def _build_kind(name: str, value: str) -> str:
    if value not in ("native", "portable"):
        raise ValueError(f"environment variable {name} must be native or portable, got {value!r}")
    return value


_PARSERS = {
    "ASR_LNLSTM_IMPL": lambda name, value: check_backend(value, where=f"environment variable {name}"),
    "ASR_LNLSTM_BUILD": _build_kind,
    "ASR_LNLSTM_CUDA_GRAPHS": _flag,
    "ASR_SPELLER_CUDA_GRAPHS": _flag,
    "ASR_SPELLER_CUDA_GRAPHS_MEMORY": _fraction,
}


def active(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """The overrides set in ``environ`` (default: the process environment), parsed: variable -> value.

    Read at every call (it is a few dictionary look-ups), so a benchmark may set one between runs.
    """
    environ = os.environ if environ is None else environ
    found = {}
    for name, parse in _PARSERS.items():
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        found[name] = parse(name, raw)
        if (name, raw) not in _logged:
            _logged.add((name, raw))
            logger.warning("%s=%s overrides the recipe (an override meant for benchmarks)", name, raw)
    return found


def get(name: str, recipe_value):
    """The value of the setting that environment variable ``name`` overrides: the override where
    it is set, else ``recipe_value``."""
    return active().get(name, recipe_value)

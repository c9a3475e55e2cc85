"""The LN-LSTM's backends: one contract (:class:`~.base.Backend`, in :mod:`.base`), three implementations.

* :mod:`.reference`: the PyTorch loop over time of :mod:`asr.models.lnlstm.reference`, the
  definition; every device, dtype and variant.
* :mod:`.cpp`: a fused C++ operator for CPU (``csrc/lnlstm.cpp``), float32 and float64.
* :mod:`.triton`: fused Triton kernels for CUDA (CPU under ``TRITON_INTERPRET=1``), float32
  parameters, and the single step the speller takes.

What every backend takes and returns is :mod:`.base`'s; which one runs is decided in
:func:`asr.models.lnlstm.selection.select_backend` only. The backends import :mod:`.base`, never this
package's ``__init__``, so it can import them here.
"""

from __future__ import annotations

import functools

from asr.models.lnlstm.backends import cpp, reference, triton
from asr.models.lnlstm.backends.base import LAYER_INPUTS, LN_INPUTS, Backend, layer_inputs

__all__ = ["LAYER_INPUTS", "LN_INPUTS", "Backend", "backends", "layer_inputs"]


@functools.cache
def backends(build: str = "native") -> dict[str, Backend]:
    """Every backend by name, in the order ``auto`` tries them (the reference path is never
    a candidate of ``auto``: it is what runs when no other does); the C++ one builds its operator
    as ``build`` asks (``model.lnlstm_build``: native or portable, :mod:`.cpp`)."""
    return {"triton": triton.BACKEND, "cpp": cpp.BACKENDS[cpp.check_build(build)], "reference": reference.BACKEND}

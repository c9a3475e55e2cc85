"""Layer-normalised LSTM (Ba, Kiros & Hinton 2016, "Layer Normalization", sec. 3.1).

One step, per direction and layer::

    gates = LN_x(W_x x_t) + LN_h(W_h h_{t-1}) + b        ; i, j, f, o = split(gates)
    c_t   = c_{t-1} * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)
    h_t   = tanh(LN_c(c_t)) * sigmoid(o)

* Each LN has its own gain (init 1) and bias (init 0), uses the biased variance
  and ``eps`` inside the square root. ``LN_x`` and ``LN_h`` normalise over the
  whole 4H gate vector (not per gate), ``LN_c`` over the H cell units.
* **The un-normalised cell c_t is carried to the next step**; ``LN_c`` only feeds
  the output. Several public implementations carry ``LN_c(c_t)`` instead, which
  changes the recurrence (the cell can no longer grow to count/integrate) and
  is not what the paper writes.
* The variance is computed from mean-subtracted values (never as
  ``E[x^2] - E[x]^2``), so constant inputs (zero variance) and inputs scaled by
  1e4 or 1e-4 stay finite; a well-known TensorFlow LN-LSTM cell produced NaN there.
* Gate order inside every 4H vector is ``i, j, f, o`` (input gate, candidate,
  forget gate, output gate). ``torch.nn.LSTM`` uses ``i, f, g, o``; convert with
  :func:`load_from_torch_lstm`.
* ``layer_norm=False`` gives a plain LSTM: ``gates = W_x x_t + W_h h_{t-1} + b``
  and ``h_t = tanh(c_t) * sigmoid(o)``; ``b`` plays the role of nn.LSTM's
  ``b_ih + b_hh``.

The package (docs/architecture.md draws it):

* :mod:`.variants`: the cells' equations, one class per variant (its norms and its step);
* :mod:`.cells`: :class:`LNLSTMCell` (one direction's parameters, one step), its frozen
  :class:`CellSpec` (variant, LN on or off, epsilon, forget bias) and :class:`LNLSTMOptions`, every
  option of a model's LN-LSTMs in one frozen object (the spec's fields, the backend request, the
  self-check, CUDA graphs), built once from the recipe and handed down whole;
* :mod:`.reference`: the reference PyTorch path, a loop over time: the definition, on every
  device, dtype and variant, and what gradcheck and the conformance tests pin down;
* :mod:`.stack`: :class:`LNLSTM` (layers, directions, dropout, length checks);
* :mod:`.parameters`: one layer's per-direction tensors, gathered once for the fused backends;
* :mod:`.backends`: one contract (:mod:`.backends.base`), three backends: the reference path; a fused C++ operator
  for CPU float32/float64 (``backends/csrc/lnlstm.cpp``, JIT-compiled for this CPU on first
  use and cached, ``-march=native`` unless ``model.lnlstm_build: portable``; its speed against
  torch.nn.LSTM is in docs/benchmarks.md); fused Triton
  kernels for CUDA and float32 parameters (autocast included), one kernel per time step, a
  hand-written backward and the time loop replayed as a CUDA graph; with
  ``TRITON_INTERPRET=1`` they also run CPU tensors (slowly: that is for testing). The
  single-step :meth:`LNLSTMCell.forward` (the speller's) uses the same kernels;
* :mod:`.selection`: :func:`select_backend`, the one place that decides which backend runs,
  from the recipe's ``model.lnlstm_backend`` (auto, reference, cpp, triton); ``auto`` falls
  back to the reference path (with one warning) where a fused backend cannot build or run.
  ``model.lnlstm_build`` (native or portable) says how the C++ operator is built. A benchmark
  switches either with a command-line override (``model.lnlstm_backend=reference``), which the
  run records; :func:`set_implementation` overrides the request in-process, for tests.

Variants. The cell above is ``variant="ba2016"``, the default. Two other
LN-LSTM cells exist for the normalisation study (``model.lnlstm_variant``):
``tf_contrib`` (TensorFlow 1.x's ``LayerNormBasicLSTMCell``: per-gate LN of one
projection without bias, the normalised cell carried) and ``raw_gates`` (LN
without gain or bias, epsilon 1e-3, on ``W_x x`` and ``W_h h``); their
equations are in :mod:`asr.models.lnlstm.variants`. **The fused C++ operator
computes ba2016, tf_contrib and the plain LSTM; the Triton kernels ba2016 and
the plain LSTM only**: a backend asked for a cell it does not compute runs the
reference path instead, whatever the implementation switch says
(:meth:`CellSpec.fused_by`), so raw_gates always runs there.
"""

from asr.models.lnlstm.backends.cpp import BUILDS
from asr.models.lnlstm.cells import CellSpec, LNLSTMCell, LNLSTMOptions
from asr.models.lnlstm.reference import reverse_padded
from asr.models.lnlstm.selection import (
    BACKEND_REQUESTS,
    check_backend,
    get_implementation,
    select_backend,
    set_implementation,
)
from asr.models.lnlstm.stack import LNLSTM, load_from_torch_lstm
from asr.models.lnlstm.variants import VARIANTS

__all__ = [
    "BACKEND_REQUESTS",
    "BUILDS",
    "LNLSTM",
    "VARIANTS",
    "CellSpec",
    "LNLSTMCell",
    "LNLSTMOptions",
    "check_backend",
    "get_implementation",
    "load_from_torch_lstm",
    "reverse_padded",
    "select_backend",
    "set_implementation",
]

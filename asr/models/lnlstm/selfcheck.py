"""A fused backend checks itself before it computes anything: one small pass against the reference path.

The first time a fused backend (C++ or Triton) is chosen for a kind of call on a device (the cell's
spec, the input and parameter dtypes, a whole layer or the speller's single step), a tiny copy of that
call (2 utterances of 5 and 3 frames, 4 units, bidirectional for a layer; 2 rows for a step) runs
forward and backward through the backend and through the reference path, on that device, from the same
random weights, inside the caller's autocast region. The outputs, the final states and every gradient
must agree within the tolerance of the dtype the call computes in (autocast's, under autocast). This
costs milliseconds (docs/benchmarks.md; compiling the backend, which the first real call would do
anyway, aside) and catches a backend that raises on this device or computes something else:
a kernel broken by a driver, a changed compiler, code nobody could run on a GPU.

``model.lnlstm_check`` says what a failure does:

* ``fallback`` (the default): one warning line naming the backend, the device and the reason, and the
  call runs on the next candidate (the reference path); the run records it
  (:func:`fallbacks`: ``runtime: lnlstm_fallbacks`` in ``config.yaml`` for the checks made while the
  run was built, and the what-ran line ``train.log`` ends with for all);
* ``strict``: a :class:`BackendCheckError` instead, naming the same;
* ``off``: no check (benchmarks of the backends themselves).

Each verdict is kept for the process, so the check runs once per kind of call.
"""

from __future__ import annotations

import logging

import torch

from asr.models.lnlstm.backends import backends
from asr.models.lnlstm.parameters import LayerParameters

logger = logging.getLogger(__name__)

CHECK_MODES = ("fallback", "strict", "off")

# (atol, rtol) between a fused backend and the reference path, by the dtype the call computes in
_TOLERANCE = {
    torch.float64: (1e-9, 1e-7),
    torch.float32: (2e-4, 2e-3),
    torch.bfloat16: (5e-2, 5e-2),
    torch.float16: (2e-2, 2e-2),
}

_verdicts: dict[tuple, str | None] = {}  # key -> None (passed) or why it failed
_fallbacks: list[dict] = []


class BackendCheckError(RuntimeError):
    """A fused LN-LSTM backend failed its check and ``model.lnlstm_check`` is ``strict``."""


def passes(name: str, spec, device: torch.device, dtype: torch.dtype, param_dtype: torch.dtype,
           single_step: bool, mode: str = "fallback") -> bool:
    """Whether backend ``name`` may compute this kind of call (module docstring). The reference path
    always may; with ``mode`` "off" every backend may."""
    if name == "reference" or mode == "off":
        return True
    amp = _autocast_dtype(device)
    key = (name, str(device), dtype, param_dtype, spec, single_step, amp)
    if key not in _verdicts:
        _verdicts[key] = _check(name, spec, device, dtype, param_dtype, single_step, amp)
        if _verdicts[key] is not None:
            _fallbacks.append(_record(key, _verdicts[key]))
            if mode != "strict":
                logger.warning("LN-LSTM backend %r failed its check on %s (%s): %s; the reference path runs "
                               "instead (model.lnlstm_check: strict makes this an error)",
                               name, device, _describe(key), _verdicts[key])
    reason = _verdicts[key]
    if reason is not None and mode == "strict":
        raise BackendCheckError(f"LN-LSTM backend {name!r} failed its check on {device} ({_describe(key)}): {reason} "
                                "(model.lnlstm_check: fallback runs the reference path instead)")
    return reason is None


def fallbacks() -> list[dict]:
    """Every check that failed in this process: backend, device, what was checked, why."""
    return [dict(entry) for entry in _fallbacks]


def forget() -> None:
    """Drop every verdict (tests)."""
    _verdicts.clear()
    _fallbacks.clear()


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes in on ``device`` here, or None outside autocast. The check runs in the
    caller's autocast region, as the call it stands for does: under bf16 autocast both paths compute their
    GEMMs in bf16, and the two are held to bf16's tolerance, not float32's."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return None


def _describe(key: tuple) -> str:
    _, _, dtype, param_dtype, spec, single_step, amp = key
    kind = "one step" if single_step else "a layer"
    norm = spec.variant if spec.layer_norm else "no layer norm"
    under = f" under {str(amp).removeprefix('torch.')} autocast" if amp is not None else ""
    return (f"{kind}, {norm}, {str(dtype).removeprefix('torch.')} input, "
            f"{str(param_dtype).removeprefix('torch.')} weights{under}")


def _record(key: tuple, reason: str) -> dict:
    name, device = key[0], key[1]
    return {"backend": name, "device": device, "call": _describe(key), "reason": reason, "instead": "reference"}


def _check(name: str, spec, device: torch.device, dtype: torch.dtype, param_dtype: torch.dtype,
           single_step: bool, amp: torch.dtype | None) -> str | None:
    """None when ``name`` agrees with the reference path on a tiny call, else the reason it does not."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tensors this small gain nothing from threads, and lose to a busy machine's
    try:
        # The check runs backward; the first call of a kind may come from a decode under no_grad or
        # inference mode (asr.evaluate), where a backward would fail whatever the backend.
        with torch.inference_mode(False), torch.enable_grad(), torch.random.fork_rng(devices=[]):
            # (fork_rng: the cells' initialisation draws; the run's RNG stays as it was)
            generator = torch.Generator().manual_seed(0)
            compute = _step if single_step else _layer
            ours = compute(backends()[name], spec, device, dtype, param_dtype, generator)
            generator = torch.Generator().manual_seed(0)
            theirs = compute(backends()["reference"], spec, device, dtype, param_dtype, generator)
    except Exception as err:  # any failure of the backend is a reason not to use it
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    finally:
        torch.set_num_threads(threads)
    atol, rtol = _TOLERANCE.get(amp or dtype, _TOLERANCE[torch.float32])
    for what, got, want in zip(_NAMES, ours, theirs):
        if got is None and want is None:
            continue
        if got is None or want is None or got.shape != want.shape:
            return f"its {what} has another shape"
        got, want = got.double().cpu(), want.double().cpu()
        if not torch.isfinite(got).all():
            return f"its {what} is not finite"
        if not torch.allclose(got, want, atol=atol, rtol=rtol):
            return f"its {what} differs from the reference path by {float((got - want).abs().max()):.3g}"
    return None


_NAMES = ("output", "final hidden state", "final cell", "input gradient", "weight gradients")


def _cells(spec, input_size: int, hidden: int, count: int, device, param_dtype, generator):
    # The spec builds its own cells (CellSpec.cell): this module, which the cells' module imports, never
    # imports it back.
    cells = []
    for _ in range(count):
        cell = spec.cell(input_size, hidden, backend="reference")
        with torch.no_grad():
            for p in cell.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
        cells.append(cell.to(device=device, dtype=param_dtype))
    return cells


def _layer(backend, spec, device, dtype, param_dtype, generator):
    cells = _cells(spec, 3, 4, 2, device, param_dtype, generator)
    x = torch.randn(2, 5, 3, generator=generator).to(device=device, dtype=dtype).requires_grad_()
    lengths = torch.tensor([5, 3], device=device)
    zeros = torch.zeros(2, 2, 4, device=device, dtype=dtype)
    y, h, c = backend.layer(LayerParameters(cells), x, lengths, zeros, zeros, False)
    weights = torch.randn(y.shape, generator=generator).to(device=device, dtype=y.dtype)
    (y * weights).sum().add(h.float().sum()).add(c.float().sum()).backward()
    return y.detach(), h.detach(), c.detach(), x.grad, _gradients(cells)


def _step(backend, spec, device, dtype, param_dtype, generator):
    (cell,) = _cells(spec, 3, 4, 1, device, param_dtype, generator)
    x = torch.randn(2, 3, generator=generator).to(device=device, dtype=dtype).requires_grad_()
    h = torch.randn(2, 4, generator=generator).to(device=device, dtype=dtype)
    c = torch.randn(2, 4, generator=generator).to(device=device, dtype=dtype)
    h_new, c_new = backend.cell_step(cell, x, h, c)
    weights = torch.randn(h_new.shape, generator=generator).to(device=device, dtype=h_new.dtype)
    (h_new * weights).sum().add(c_new.float().sum()).backward()
    return h_new.detach(), h_new.detach(), c_new.detach(), x.grad, _gradients([cell])


def _gradients(cells) -> torch.Tensor:
    grads = [p.grad.flatten() if p.grad is not None else torch.zeros(p.numel(), device=p.device, dtype=p.dtype)
             for cell in cells for p in cell.parameters()]
    return torch.cat(grads)

"""Which backends ``scaled_dot_product_attention`` may use in the Transformer and the Conformer
(``model.sdpa_backend: auto | flash | efficient | math | cudnn``), chosen in one pure function.

PyTorch picks a backend per call among those enabled. Some prepare something for each new shape: cuDNN's
attention builds an execution graph per shape, at hundreds of milliseconds of host time each (public
reports; FunASR issues 3704/3705 measured 0.44 s forward and 0.55 s backward per new shape), and recent
PyTorch versions make it the first choice on H100/H200-class GPUs. A training epoch of the toolkit's
bucketed batches meets hundreds of shapes (benchmarks/epoch_shapes.py), so there ``auto`` leaves cuDNN
out; it leaves PyTorch's choice alone where the shapes are few (at most :data:`FEW_SHAPES` batch shapes
an epoch) and off CUDA. A named backend is pinned (``torch.nn.attention.sdpa_kernel``): ``flash`` cannot
take the padding masks these models pass, so on CUDA it raises at the first call; on the CPU only
``flash`` and ``math`` exist. Every backend computes the same attention (tests/test_sdpa.py); the run
records what was asked and what was allowed (:mod:`asr.models.runtime`).
"""

from __future__ import annotations

import functools

from asr.config import ConfigError

SDPA_BACKENDS = ("auto", "flash", "efficient", "math", "cudnn")
CPU_BACKENDS = ("flash", "math")
# Batch shapes an epoch at or below which a per-shape cost is paid few enough times to leave PyTorch's
# choice alone (a fixed-shape benchmark, a run whose batches are all padded alike)
FEW_SHAPES = 16
_WITHOUT_PER_SHAPE_COST = ("flash", "efficient", "math")  # PyTorch's own order, cuDNN left out


def allowed_backends(requested: str, device_type: str, batch_shapes: int | None = None) -> tuple[str, ...] | None:
    """The backends SDPA may choose from for ``requested`` on ``device_type``, given the run's distinct batch
    shapes an epoch (None: not known, taken as many); None leaves PyTorch's choice alone. A backend that does
    not exist on ``device_type`` is a :class:`ConfigError` naming the key."""
    if requested not in SDPA_BACKENDS:
        raise ConfigError(f"model.sdpa_backend: {requested!r} is not one of {', '.join(SDPA_BACKENDS)}")
    if requested != "auto":
        if device_type != "cuda" and requested not in CPU_BACKENDS:
            raise ConfigError(f"model.sdpa_backend={requested}: SDPA has no such backend on {device_type} "
                              f"(there: auto, {', '.join(CPU_BACKENDS)})")
        return (requested,)
    if device_type != "cuda" or (batch_shapes is not None and batch_shapes <= FEW_SHAPES):
        return None
    return _WITHOUT_PER_SHAPE_COST


def kernel_context(backends: tuple[str, ...]):
    """``torch.nn.attention.sdpa_kernel`` enabling ``backends`` only."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}
    return sdpa_kernel([names[name] for name in backends])


def pinned(method):
    """Run a model method (forward, encode, a decoding step) with the model's SDPA backends pinned; entered once
    per outermost call (the context manager costs tens of microseconds, an attention layer's call less)."""

    @functools.wraps(method)
    def run(model, *args, **kwargs):
        if model.__dict__.get("_sdpa_pinned"):
            return method(model, *args, **kwargs)
        backends = model.sdpa_backends(next(model.parameters()).device.type)
        if backends is None:
            return method(model, *args, **kwargs)
        model.__dict__["_sdpa_pinned"] = True
        try:
            with kernel_context(backends):
                return method(model, *args, **kwargs)
        finally:
            model.__dict__["_sdpa_pinned"] = False

    return run

"""Builds, loads and wraps the fused C++ LN-LSTM operator (``csrc/lnlstm.cpp``).

The operator is JIT-compiled with ``torch.utils.cpp_extension.load`` on first
use and cached (under ``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``); later processes only load the cached library.
It is built for the CPU it runs on (``-march=native``, or portable flags where
the compiler lacks that, or where the recipe's ``model.lnlstm_build: portable`` asks for them,
to measure what a CPU without this one's vector extensions gets), under a name that identifies
the flags, the CPU and the checkout (:func:`build_configurations`). Both builds can sit in the
cache side by side, but a process loads one: both register ``torch.ops.asr_lnlstm`` (and
``asr_attention``), and loading the second aborts the process, so the first load decides, and a later request for the other build is warned
about once and runs the loaded one (:func:`load`; the run's record names the flags that ran).
Where no compiler is available or the build fails, :func:`load` warns once and
returns None, and :class:`asr.models.lnlstm.LNLSTM` runs its PyTorch reference
path instead.

The operator computes a whole layer (all directions) forward, and backward by
hand (no autograd inside): :class:`_FusedLayer` connects it to autograd. Its
inputs, the tensors its forward saves and its gradients are positional in the
operator's schema; they are named once (:data:`~asr.models.lnlstm.backends.LAYER_INPUTS`, :data:`_SAVED`)
and this module packs and unpacks them by those names only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

from asr.models.lnlstm.backends.base import LAYER_INPUTS, LN_INPUTS, Backend, layer_inputs

SOURCE = Path(__file__).resolve().parent / "csrc" / "lnlstm.cpp"
# Built into the same library: the fused attention step (asr.models.attention_fused) and the math both share.
SHARED_SOURCES = Path(__file__).resolve().parents[2] / "csrc"
SOURCES = (SOURCE, SHARED_SOURCES / "attention.cpp")

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_module = None
_error: Exception | None = None
_flags: list[str] | None = None  # of the loaded build
_loaded_as: str | None = None  # the build the first load asked for (native may have fallen back to portable flags)
_mismatches_warned: set[str] = set()

BUILDS = ("native", "portable")  # model.lnlstm_build


def check_build(name: str, where: str = "model.lnlstm_build") -> str:
    """``name`` where it is one of :data:`BUILDS`; ValueError naming ``where`` otherwise."""
    if name not in BUILDS:
        raise ValueError(f"{where} must be one of {', '.join(BUILDS)}, got {name!r}")
    return name


def _cpu_description() -> dict[str, str]:
    """The CPU's vendor, model and feature flags from /proc/cpuinfo (empty where unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    # x86 names them vendor_id ... flags; ARM CPU implementer, CPU part, Features.
    keys = ("vendor_id", "cpu family", "model", "model name", "flags", "CPU implementer", "CPU part", "Features")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            fields.setdefault(key.strip(), value.strip())  # the first CPU's; all are alike
    return fields


def build_configurations(cpu: dict[str, str] | None = None,
                         sources: tuple[Path, ...] = SOURCES) -> list[tuple[str, list[str]]]:
    """(extension name, compiler flags) to try in order: native first, then portable.

    The native build (-march=native) uses every vector extension of this CPU
    (AVX-512 where there is one); a compiler without the flag gets the portable
    build. The name, which keys the build cache, carries a hash of the flags and
    of the CPU's model and feature flags: a cache shared between machines (a
    network home, a copied image) never loads a binary built for another CPU.
    It carries the sources' paths too: torch rebuilds an extension whose build
    file names other sources, so two checkouts sharing one cache under one name
    would each rebuild it (about 15 s) whenever the other had run last.
    cpu: :func:`_cpu_description`'s fields (default: this machine's).
    sources: the C++ files compiled (default: this checkout's).
    """
    cpu = _cpu_description() if cpu is None else cpu
    # -fno-trapping-math lets the compiler vectorise the branch-free exp/tanh
    # (torch itself is built with it and -fno-math-errno).
    base = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
    portable = list(base)
    if {"avx2", "fma"} <= set(cpu.get("flags", "").split()):
        portable += ["-mavx2", "-mfma"]
    cpu_key = "\n".join(f"{key}: {value}" for key, value in sorted(cpu.items()))
    configurations = []
    for kind, flags in (("native", base + ["-march=native"]), ("portable", portable)):
        key = "\n".join([*flags, cpu_key, *(str(Path(source).resolve()) for source in sources)])
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        configurations.append((f"asr_lnlstm_{kind}_{digest}", flags))
    return configurations


def _build(build: str = "native"):
    # Imported here: importing cpp_extension logs a CUDA_HOME warning on
    # CPU-only machines, irrelevant for this CPU-only operator.
    cpp_logger = logging.getLogger("torch.utils.cpp_extension")
    level = cpp_logger.level
    cpp_logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        cpp_logger.setLevel(level)
    if shutil.which("ninja") is None:
        # pip's ninja wheel installs its binary beside the interpreter, which
        # is not on PATH when the venv is not activated.
        try:
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass
    global _flags
    (native_name, native_flags), (portable_name, portable_flags) = build_configurations()
    if build == "portable":
        # For measuring what a CPU without this one's extensions gets.
        _compile(cpp_extension, portable_name, portable_flags)
        _flags = portable_flags
        return torch.ops.asr_lnlstm
    try:
        _compile(cpp_extension, native_name, native_flags)
        _flags = native_flags
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        # A compiler without -march=native: the portable build is as correct,
        # only slower, so this is logged, not warned.
        _log.info("LNLSTM: native build of %s failed (%s); building it portably", SOURCE, exc)
        _compile(cpp_extension, portable_name, portable_flags)
        _flags = portable_flags
    return torch.ops.asr_lnlstm


# How long a first build takes, said before it starts: the first command on a machine otherwise waits in
# silence (measured: about a minute on 2 CPU cores; a cached build loads in a second).
BUILD_TIME = "about a minute on 2 CPU cores, less on more"


def _compile(cpp_extension, name: str, flags: list[str]) -> None:
    directory = Path(cpp_extension._get_build_directory(name, verbose=False))
    library = directory / f"{name}.so"
    inputs = [*SOURCES, *SOURCE.parent.glob("*.h"), *SHARED_SOURCES.glob("*.h")]  # what ninja rebuilds it for
    building = not library.is_file() or any(path.stat().st_mtime > library.stat().st_mtime for path in inputs)
    if building:
        _tell(f"building the C++ LN-LSTM operator for this CPU, once ({BUILD_TIME}) into {directory}")
    start = time.perf_counter()
    with _build_directory_held(directory):
        cpp_extension.load(
            name=name,
            sources=[str(source) for source in SOURCES],
            extra_cflags=flags,
            extra_include_paths=[str(SHARED_SOURCES)],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,  # registers torch.ops.asr_lnlstm and asr_attention (TORCH_LIBRARY)
            verbose=False,
        )
    if building:
        _tell(f"built the C++ LN-LSTM operator in {time.perf_counter() - start:.0f} s")


def _tell(message: str) -> None:
    """Say ``message`` where it is seen: in the log when it shows INFO lines (training's ``train.log``),
    else on stderr (``asr.transcribe``, a Python session without logging set up)."""
    if _log.isEnabledFor(logging.INFO) and _log.hasHandlers():
        _log.info("%s", message)
    else:
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _build_directory_held(directory: Path):
    """Hold ``directory`` for one process while torch builds or checks the operator there, and clear the
    lock a stopped process left behind.

    Every load, cached or not, takes torch's lock file (``lock``, a ``FileBaton``) while ninja checks the
    build. A process stopped in that moment (a study run stopped by SIGTERM as it started, a preempted
    job) leaves the file, and every later load waits for it for ever, silently. Loads here first take an
    ``flock`` on ``asr.flock``, which the kernel releases when its holder dies: whoever holds it is the only
    process of this toolkit in the directory, so a ``lock`` it finds there was left by a dead one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "asr.flock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if stale.exists():
                _log.warning("LNLSTM: removing %s, left by a process stopped while it built or loaded the "
                             "operator (every later load would wait for it)", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def load(strict: bool = False, build: str | None = None):
    """The compiled operators (``torch.ops.asr_lnlstm``), building them on first call.

    strict=False: on failure warn once and return None (callers fall back to
    the reference path). strict=True: raise RuntimeError with the build error.
    build: ``native`` or ``portable`` (``model.lnlstm_build``), what a first load builds; None (the
    fused attention, which shares the library): whichever is loaded, else native. One build serves a
    process (the module docstring): asking for the other one after the first load logs one warning
    and returns the loaded one.
    """
    global _module, _error, _loaded_as
    if _module is not None:
        _check_loaded(build)
        return _module
    with _lock:
        if _module is None and _error is None:
            _loaded_as = check_build(build or "native")
            try:
                _module = _build(_loaded_as)
            except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as exc:
                # no compiler or ninja, a compile or link error, a library that will not load
                _error = exc
                if not strict:
                    warnings.warn(
                        f"LNLSTM: the fused C++ operator ({SOURCE}) could not be built, "
                        f"using the slower PyTorch reference path: {exc}",
                        RuntimeWarning,
                        stacklevel=3,
                    )
    if _module is None and strict:
        raise RuntimeError(f"LNLSTM: the fused C++ operator ({SOURCE}) could not be built: {_error}")
    if _module is not None:
        _check_loaded(build)
    return _module


def _check_loaded(build: str | None) -> None:
    if build is None or build == _loaded_as or build in _mismatches_warned:
        return
    _mismatches_warned.add(build)
    _log.warning("LNLSTM: model.lnlstm_build asks for the %s build of the C++ operator, but this process loaded "
                 "the %s build first and runs it (one build per process: both register torch.ops.asr_lnlstm)",
                 build, _loaded_as)


def build_flags() -> list[str] | None:
    """The compiler flags of the loaded operator (None before :func:`load` or where it failed)."""
    return list(_flags) if _flags is not None else None


# The operator's per-layer inputs, in the order of its schema (csrc/lnlstm.cpp, lnlstm_forward and
# lnlstm_backward; its gradients come back in this order too, then d_h0, d_c0), and the tensors its
# forward saves for backward (those of layer norm are empty without it; gates_x is empty for tf_contrib,
# whose xhat_h and ln_stats hold its four gate norms' normalised values and inverse deviations).
# (The inputs are every fused backend's: LAYER_INPUTS.)
_SAVED = ("gates_x", "states_h", "states_c", "activations", "xhat_h", "ln_stats", "xhat_c")
# _FusedLayer.apply's arguments: the settings, the lengths, the state, then LAYER_INPUTS.
_ARGUMENTS = ("config", "lengths", "h0", "c0", *LAYER_INPUTS)
# Per cell the operator computes: the LAYER_INPUTS it is given as empty placeholders (layer_inputs).
_ABSENT = {"plain": LN_INPUTS, "ba2016": (), "tf_contrib": ("bias", "ln_x_gain", "ln_x_bias")}


def cell_name(spec) -> str:
    """What the operator computes for a :class:`~asr.models.lnlstm.cells.CellSpec` it supports:
    ``plain`` (no layer norm), ``ba2016`` or ``tf_contrib`` (its ``cell`` argument)."""
    return spec.variant if spec.layer_norm else "plain"


class _FusedLayer(torch.autograd.Function):
    """Autograd wrapper: (config, lengths, h0, c0, *inputs by :data:`LAYER_INPUTS`) -> (y, h_n, c_n).
    config: (forget_bias, eps, cell, save), cell being what the operator computes (:func:`cell_name`)."""

    @staticmethod
    def forward(ctx, config, lengths, h0, c0, *tensors):
        forget_bias, eps, cell, save = config
        inputs = dict(zip(LAYER_INPUTS, tensors, strict=True))
        y, h_n, c_n, *saved = load(strict=True).forward(
            *inputs.values(), h0, c0, lengths, forget_bias, eps, cell, save
        )
        if save:
            ctx.names = (*LAYER_INPUTS, "lengths", *_SAVED)
            ctx.save_for_backward(*inputs.values(), lengths, *saved)
        ctx.config = config
        return y, h_n, c_n

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_n, dc_n):
        saved = dict(zip(ctx.names, ctx.saved_tensors, strict=True))
        forget_bias, eps, cell, _ = ctx.config
        need_dx = ctx.needs_input_grad[_ARGUMENTS.index("x")]  # not for a first layer reading features
        grads = load(strict=True).backward(
            dy, dh_n, dc_n, *(saved[name] for name in LAYER_INPUTS), saved["lengths"],
            [saved[name] for name in _SAVED], forget_bias, eps, cell, need_dx,
        )
        grads = dict(zip((*LAYER_INPUTS, "h0", "c0"), grads, strict=True))
        if not need_dx:
            grads["x"] = None
        # The parameters a cell does not have (LN without layer norm; b and LN_x for tf_contrib)
        # were empty placeholders: their gradients are empty too.
        for name in _ABSENT[cell]:
            grads[name] = None
        return tuple(grads.get(name) for name in _ARGUMENTS)


def fused_layer(params, x: torch.Tensor, lengths: torch.Tensor | None, h0: torch.Tensor, c0: torch.Tensor):
    """One layer, all directions, with the fused operator.

    params: the layer's :class:`~asr.models.lnlstm.parameters.LayerParameters`; x (B, T, I);
    lengths (B,) or None; h0, c0 (D, B, H). Returns y (B, T, D * H) zero at padding, h_n, c_n (D, B, H).
    """
    batch, time = x.shape[:2]
    spec = params.spec
    if lengths is None:
        lengths_cpu = torch.full((batch,), time, dtype=torch.long)
    else:
        lengths_cpu = lengths.to(device="cpu", dtype=torch.long).contiguous()
    inputs = layer_inputs(params, x.contiguous(), absent=x.new_empty(0))  # the operator wants tensors
    h0 = h0.contiguous()
    c0 = c0.contiguous()
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (*inputs.values(), h0, c0))
    config = (spec.forget_bias, spec.eps, cell_name(spec), save)
    return _FusedLayer.apply(config, lengths_cpu, h0, c0, *(inputs[name] for name in LAYER_INPUTS))


class CppBackend(Backend):
    """The fused C++ operator behind the backend contract: CPU, float32 and float64, whole layers;
    ``build`` (:data:`BUILDS`) is the build its first load makes (:func:`load`)."""

    name = "cpp"
    auto_devices = ("cpu",)

    def __init__(self, build: str = "native") -> None:
        self.build = check_build(build)

    def supports(self, spec, device, dtype, param_dtype, single_step) -> bool:
        return (spec.fused_by(self.name) and not single_step and device.type == "cpu"
                and dtype in (torch.float32, torch.float64))

    def available(self, device, strict: bool = False) -> bool:
        return load(strict, self.build) is not None

    def layer(self, params, x, lengths, h0, c0, cuda_graphs: bool):
        return fused_layer(params, x, lengths, h0, c0)


BACKENDS = {build: CppBackend(build) for build in BUILDS}

"""The one checkpoint writer and reader, and the converter for files of older versions.

A checkpoint is self-contained: it carries the resolved experiment config, the
model weights, the tokenizer and the feature pipeline (config plus global MVN
statistics), so inference needs nothing but the file. Training checkpoints
(``last.pt``) additionally carry optimizer, scheduler, RNG states and progress
so ``--resume`` continues exactly where the run stopped.

Layout of the saved dict::

    format_version: int
    config:     plain dict of the ExperimentConfig (asr.experiment)
    model:      model state_dict
    tokenizer:  tokenizer.state_dict()
    features:   FeaturePipeline.state_dict()
    longest_utterance_seconds, mean_utterance_seconds: floats, of the training utterances (absent before 2026-11-24)
    training:   optional dict (optimizer, scheduler, progress, rng)

**Loading never runs code.** A ``.pt`` file is a pickle, and unpickling an
arbitrary object can call any function. Checkpoints are therefore read with
``torch.load(weights_only=True)``, whose unpickler builds only tensors and plain
data (dicts, lists, tuples, strings, bytes, numbers, booleans, None), and
refuses everything else before it is built. The writer holds itself to the
same rule: :func:`save_checkpoint` refuses a payload holding anything else,
so every file this toolkit writes can be read back that way.

Format 1 (before 2026-11-22) stored numpy's RNG state inside ``last.pt``,
which the safe reader refuses. The converter reads such a file with the same
weights-only unpickler, allowed in addition only numpy's array and dtype
rebuilders (which build arrays and call nothing else), and rewrites it::

    python -m asr.checkpoint convert old/last.pt new/last.pt

Epoch, best and averaged checkpoints of format 1 held no numpy objects and
load as they are.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

from asr.writing import default_mode, writing

FORMAT_VERSION = 2

# What a checkpoint may hold: the types torch's weights-only unpickler rebuilds.
_PLAIN = (str, bytes, int, float, bool, type(None), torch.Tensor, torch.Size)


# What a checkpoint's "training" dict holds only to resume a run (last.pt and epoch{E}.pt).
RESUME_KEYS = ("progress", "optimizer", "scheduler", "rng")


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or not one of ours; names the file."""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically: a temporary file in the same folder, then rename.

    A reader (or a run killed mid-write) never sees a half-written ``path``, and a failed
    write (a full disk, a denied write) raises :class:`asr.writing.WriteError` naming ``path``
    and leaves its previous version in place.
    ``payload`` may hold only tensors and plain data (see the module docstring);
    anything else raises :class:`CheckpointError` naming where it sits, before
    anything is written. So does a weight or an optimizer state that is NaN or infinite: such a
    file could only spread its damage to the runs that resume or average it (the training step
    undoes an update that would make one, :mod:`asr.training.step`).
    """
    path = Path(path)
    payload = {"format_version": FORMAT_VERSION, **payload}
    _check_plain(payload, "checkpoint")
    _check_finite(payload.get("model"), "model")
    _check_finite((payload.get("training") or {}).get("optimizer"), "training.optimizer")
    with writing(path):  # no space, permission denied: one WriteError naming the file
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, default_mode())  # as open() would make it, not mkstemp's 0600
            with os.fdopen(fd, "wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, path)
        except BaseException:  # also a second stop signal (asr.training.signals): the old file stays
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
            raise


# The first bytes of files people give where a checkpoint belongs, and what they are.
_NOT_CHECKPOINTS = ((b"RIFF", "a WAV audio file"), (b"fLaC", "a FLAC audio file"), (b"OggS", "an Ogg audio file"),
                    (b"ID3", "an MP3 audio file"), (b"\xff\xfb", "an MP3 audio file"), (b"NIST_1A", "a SPHERE audio file"))


def not_a_checkpoint(path: str | Path) -> str | None:
    """What ``path`` is when it is plainly not a checkpoint (a folder, audio, text), else None.

    A checkpoint is a ``torch.save`` file: a zip archive or a pickle. This looks at the first bytes only,
    so an error can say what was given instead (and never suggest converting an audio file)."""
    path = Path(path)
    if path.is_dir():
        return "a folder"
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None  # load_checkpoint says why it cannot be read
    if head.startswith(b"PK\x03\x04") or head.startswith(b"\x80"):
        return None
    for magic, what in _NOT_CHECKPOINTS:
        if head.startswith(magic):
            return what
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "a text file" if text and all(c.isprintable() or c.isspace() for c in text) else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU without running any code in it; a clear error if it is not one."""
    path = Path(path)
    if path.is_dir():
        found = path / "last.pt"
        hint = f"; its checkpoint is {found}" if found.is_file() else " (it holds no last.pt)"
        raise CheckpointError(f"{path} is a folder, not a checkpoint{hint}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:  # torch's own error for it is empty too: "cannot read checkpoint e.pt: "
        raise CheckpointError(f"{path} is empty (0 bytes): not a checkpoint; a copy or a write that never finished")
    what = not_a_checkpoint(path)
    if what is not None:
        raise CheckpointError(f"{path} is not a checkpoint: it is {what} (a checkpoint is a .pt file written by "
                              "asr.train or asr.average)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # The weights-only unpickler stopped at an object it does not build: nothing in the file ran.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = [line for line in lines if "GLOBAL" in line or line.startswith("Unsupported")]
        first_line = (detail or lines or [type(err).__name__])[-1]
        if not any("GLOBAL" in line for line in detail):
            # Not an object the safe reader refused but bytes it could not parse: a damaged file, which
            # converting would not mend (the converter is for readable files of the old format only).
            raise CheckpointError(f"cannot read checkpoint {path}: it is damaged ({first_line})") from None
        raise CheckpointError(
            f"refused to load {path}: it holds objects other than tensors and plain data, and loading "
            f"those could run code ({first_line}). A last.pt written by lnasr before checkpoint format "
            f"{FORMAT_VERSION} holds numpy RNG state, which "
            f"'python -m asr.checkpoint convert {path} NEW.pt' rewrites without running code"
        ) from None
    except Exception as err:  # torch raises many types for a corrupt or truncated file
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from err
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise CheckpointError(f"{path} is not a checkpoint written by this toolkit")
    return payload


def save_epoch_checkpoints(
    exp_dir: str | Path, epoch: int, payload: dict[str, Any], keep_last: int, best_epochs: set[int]
) -> None:
    """Write ``epoch{E}.pt`` and keep the last ``keep_last`` of them; keep ``best_epoch{E}.pt`` for
    exactly the epochs in ``best_epochs`` (the trainer ranks them by its validation metric). The
    trainer numbers epochs from 1 (runs of versions before it, from 0).

    ``epoch{E}.pt`` keeps what ``payload["training"]`` holds to resume (optimizer, scheduler,
    progress, RNG), so that ``--resume`` can start from it when ``last.pt`` cannot be read;
    ``best_epoch{E}.pt`` keeps only the weights and the metric.
    """
    exp_dir = Path(exp_dir)
    save_checkpoint(exp_dir / f"epoch{epoch}.pt", payload)
    stale = exp_dir / f"epoch{epoch - keep_last}.pt"
    if stale.exists():
        stale.unlink()
    if epoch in best_epochs:
        training = {k: v for k, v in (payload.get("training") or {}).items() if k not in RESUME_KEYS}
        save_checkpoint(exp_dir / f"best_epoch{epoch}.pt", {**payload, "training": training})
    for path in exp_dir.glob("best_epoch*.pt"):
        number = path.stem.removeprefix("best_epoch")
        if number.isdigit() and int(number) not in best_epochs:
            path.unlink()


def convert_checkpoint(source: str | Path, target: str | Path) -> None:
    """Rewrite a checkpoint of an older format so that :func:`load_checkpoint` reads it.

    The file is read with the weights-only unpickler, allowed in addition only
    numpy's array and dtype rebuilders, so converting runs no code in the file
    either: anything else is refused as :func:`load_checkpoint` refuses it.
    Numpy RNG state (format 1) becomes tensors.
    """
    source = Path(source)
    if not source.is_file():
        raise CheckpointError(f"checkpoint not found: {source}")
    try:
        with torch.serialization.safe_globals(_numpy_rebuilders()):
            payload = torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if "GLOBAL" in line or line.startswith("Unsupported")]
        detail = lines[-1] if lines else type(err).__name__
        raise CheckpointError(
            f"refused to convert {source}: it holds objects other than tensors, plain data and numpy arrays, "
            f"and loading those could run code ({detail})"
        ) from None
    except Exception as err:
        raise CheckpointError(f"cannot read checkpoint {source}: {err}") from err
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise CheckpointError(f"{source} is not a checkpoint written by this toolkit")
    rng = (payload.get("training") or {}).get("rng")
    if isinstance(rng, dict):
        payload["training"]["rng"] = _plain_rng(rng)
    payload.pop("format_version", None)
    save_checkpoint(target, payload)


def _numpy_rebuilders() -> list:
    """The globals a pickled numpy array and its dtype name: they build arrays and run nothing else.

    A file pickled under numpy 1 names the rebuilder ``numpy.core.multiarray._reconstruct``,
    one pickled under numpy 2 ``numpy._core.multiarray._reconstruct``; both are allowed."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct
    dtype_classes = [type(np.dtype(name)) for name in ("uint32", "int64", "float64")]
    return [
        np.ndarray,
        np.dtype,
        *dtype_classes,
        (_reconstruct, "numpy.core.multiarray._reconstruct"),
        (_reconstruct, "numpy._core.multiarray._reconstruct"),
    ]


def _plain_rng(rng: dict) -> dict:
    """Format-1 RNG state (python tuple, numpy tuple with an array) as format-2 tensors."""
    import numpy as np

    converted = dict(rng)
    if isinstance(rng.get("python"), tuple):
        version, internal, gauss = rng["python"]
        converted["python"] = {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}
    if isinstance(rng.get("numpy"), tuple):
        kind, keys, position, has_gauss, cached = rng["numpy"]
        converted["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return converted


def _check_plain(value: Any, where: str) -> None:
    """Raise :class:`CheckpointError` at the first thing ``torch.load(weights_only=True)`` would refuse."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise CheckpointError(f"cannot save {where}: key {key!r} is a {type(key).__name__}, not str or int")
            _check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
    elif not isinstance(value, _PLAIN):
        raise CheckpointError(
            f"cannot save {where}: a {type(value).__module__}.{type(value).__name__} is not a tensor or plain data, "
            "and a checkpoint holding it could not be loaded safely"
        )


def _check_finite(value: Any, where: str) -> None:
    """Raise :class:`CheckpointError` at the first floating-point tensor in ``value`` that holds NaN or inf."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_finite(item, f"{where}[{index}]")
    elif isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        raise CheckpointError(f"cannot save {where}: {bad} of its {value.numel()} values are NaN or infinite; "
                              "a checkpoint never holds them")

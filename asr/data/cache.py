"""The preparation cache: what a training start computes from a corpus, kept for the next start.

Three things are kept, each under a name derived from what it was computed
from, in the cache folder (``data.cache_dir``, default
``$XDG_CACHE_HOME/lnasr`` or ``~/.cache/lnasr``):

- ``manifests/``: the durations of a subset's audio files (:mod:`asr.data.librispeech`);
- ``bpe/``: sentencepiece models, keyed by the training transcripts, the
  vocabulary size and the training options (:mod:`asr.data.tokenizer`);
- ``mvn/``: global MVN statistics, keyed by the training utterances' files and
  the feature options that change raw features (:mod:`asr.data.dataset`).

Every entry is written to a temporary file in its folder and renamed into
place, so a reader (another run starting at the same moment) never sees half
an entry. An entry that cannot be read back is ignored with a warning and
computed again; one that cannot be written costs only the computation next
time. Reading an entry never runs code: entries are tab-separated text,
sentencepiece model bytes, or tensors and plain containers read with
``torch.load(weights_only=True)``; never pickles.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/lnasr``, else ``~/.cache/lnasr``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lnasr"


def cache_folder(cache_dir: str | Path | None, kind: str) -> Path:
    """``<cache_dir>/<kind>`` (``cache_dir`` None or "" = :func:`default_cache_dir`)."""
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return root / kind


class Fingerprint:
    """A SHA-256 over the parts of a cache key, fed in one by one.

    Each part is written with its length first, so ``("ab", "c")`` and
    ``("a", "bc")`` give different keys.
    """

    def __init__(self, kind: str):
        self._hash = hashlib.sha256()
        self.add(kind)

    def add(self, *parts: object) -> "Fingerprint":
        for part in parts:
            data = part if isinstance(part, bytes) else str(part).encode("utf-8", "surrogatepass")
            self._hash.update(len(data).to_bytes(8, "little"))
            self._hash.update(data)
        return self

    def hexdigest(self, length: int = 32) -> str:
        return self._hash.hexdigest()[:length]


def write_atomic(path: Path, write, what: str = "cache entry") -> bool:
    """Create ``path`` by calling ``write(binary_file)`` on a temporary file in its folder, then renaming it.

    Returns False (with a warning naming ``what`` and ``path``) when it cannot be written:
    the cache is an optimisation, and a full disk or a read-only cache folder
    must not stop a run.
    """
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; others reading the same corpus may use it too
        os.replace(tmp, path)
        return True
    except OSError as err:
        logger.warning("could not write %s %s (%s); it will be computed again next time", what, path, err)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False

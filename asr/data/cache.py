"""The preparation cache: what a training start computes from a corpus, kept for the next start.

Three things are kept, each under a name derived from what it was computed
from, in the cache folder (``data.cache_dir``, default
``$XDG_CACHE_HOME/lnasr`` or ``~/.cache/lnasr``):

- ``manifests/``: the durations of a subset's audio files (:mod:`asr.data.librispeech`);
- ``bpe/``: sentencepiece models, keyed by the training transcripts, the
  vocabulary size and the training options (:mod:`asr.data.tokenizer`);
- ``mvn/``: global MVN statistics, keyed by the training utterances' files and
  the feature options that change raw features (:mod:`asr.data.dataset`).

**An entry verifies itself.** Its first line is a JSON header: the kind of
entry, the key it was made for, a few facts its writer knows about the
content (a BPE model's piece count) and the SHA-256 and length of the
content, which follows as written (tab-separated text, sentencepiece model
bytes, or a file of ``torch.save``). :func:`load_entry` trusts an entry only
when all of that holds: the header reads, the kind and the key are this
one's, the content has its checksum, and the reader's own checks of the
content pass (shapes, the piece count, finite statistics with no negative
variance). Anything else, one bit flipped included, is one warning line
naming the entry file, and the thing is computed again and the entry written
anew: nothing wrong is ever used, and no damaged entry ends a run. A file
name alone proves nothing: the key inside is compared in full, so an entry
copied under another entry's name is refused too. Entries written before
entries carried a checksum (by an older version of the toolkit) cannot be
verified; they are treated as damaged (computed again once, with the
warning), not trusted.

Every entry is written to a temporary file in its folder and renamed into
place, so a reader (another run starting at the same moment) never sees half
an entry. One that cannot be written costs only the computation next time.
Reading an entry never runs code: the header is JSON, and the content is
text, sentencepiece model bytes, or tensors and plain containers read with
``torch.load(weights_only=True)``; never pickles.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

logger = logging.getLogger(__name__)

ENTRY_FORMAT = "lnasr cache entry"  # the header's first field, with the format's version as its value
ENTRY_VERSION = 2  # 1: the content alone, no header (before entries carried a checksum)
T = TypeVar("T")


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


class CacheEntryError(ValueError):
    """A cache entry that must not be used; the message says why, on one line."""


@dataclass(frozen=True)
class Entry:
    """The verified content of a cache entry, and the facts its writer recorded about it."""

    content: bytes
    facts: dict


def write_entry(path: Path, kind: str, key: dict, content: bytes, what: str, facts: dict | None = None) -> bool:
    """Write ``content`` as the cache entry of ``kind`` made for ``key`` (atomically, see :func:`write_atomic`).

    ``key`` and ``facts`` hold plain JSON values (strings, numbers, lists). ``facts`` are what
    the reader cannot know before it reads the content but can check after (a BPE model's piece
    count). Returns False, with a warning, when it cannot be written.
    """
    header = {
        ENTRY_FORMAT: ENTRY_VERSION, "kind": kind, "key": key, "facts": facts or {},
        "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest(),
    }
    line = json.dumps(header, sort_keys=True, ensure_ascii=True).encode("ascii") + b"\n"

    def write(f) -> None:
        f.write(line)
        f.write(content)

    return write_atomic(path, write, what)


def read_entry(path: Path, kind: str, key: dict) -> Entry:
    """The content of the entry at ``path`` if it is a whole entry of ``kind`` made for ``key``;
    :class:`CacheEntryError` saying what is wrong otherwise (module docstring)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CacheEntryError(f"cannot read it: {err.strerror or err}") from err
    first_line, _, content = data.partition(b"\n")
    try:
        header = json.loads(first_line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or ENTRY_FORMAT not in header:
        raise CacheEntryError("no checksum header: written by an older version, or not a cache entry; unverifiable")
    if header[ENTRY_FORMAT] != ENTRY_VERSION or header.get("kind") != kind:
        raise CacheEntryError(f"a {header.get('kind')!r} entry of format {header[ENTRY_FORMAT]!r}, "
                              f"expected {kind!r} of format {ENTRY_VERSION}")
    expected = json.loads(json.dumps(key))  # as JSON gives it back: tuples are lists
    stored = header.get("key")
    if stored != expected:
        if not isinstance(stored, dict):
            raise CacheEntryError("its header holds no key")
        field = next(f for f in sorted(set(stored) | set(expected)) if stored.get(f) != expected.get(f))
        raise CacheEntryError(f"made for another key ({field} {stored.get(field)!r}, expected {expected.get(field)!r})")
    if header.get("bytes") != len(content) or header.get("sha256") != hashlib.sha256(content).hexdigest():
        raise CacheEntryError(f"its content ({len(content)} bytes) does not match its checksum "
                              f"({header.get('bytes')} bytes); damaged or cut short")
    facts = header.get("facts")
    if not isinstance(facts, dict):
        raise CacheEntryError("its header's facts are not a mapping")
    return Entry(content, facts)


def load_entry(path: Path, kind: str, key: dict, parse: Callable[[Entry], T], what: str, redo: str) -> T | None:
    """``parse(entry)`` of the verified entry at ``path``; None when there is none, or, with one warning
    line naming ``path`` (``"ignoring cached <what> <path> (<why>); <redo>"``), when it fails a check.

    ``parse`` turns the content into the thing kept and raises (ValueError, preferably) for content
    that cannot be right; it must have no other effect, as its result may still be thrown away.
    """
    if not path.is_file():
        return None
    try:
        return parse(read_entry(path, kind, key))
    except Exception as err:
        # Whatever parsing a checksummed entry raises (torch and sentencepiece raise several
        # unrelated types for a file they cannot use), computing the thing again is right, and
        # cheaper than a run ended by a cache that is only there to save time.
        why = " ".join(str(err).split())
        why = why if len(why) <= 300 else why[:297] + "..."
        logger.warning("ignoring cached %s %s (%s); %s", what, path, why or type(err).__name__, redo)
        return None

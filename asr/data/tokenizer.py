"""Tokenisers: transcripts <-> integer ids, with the special ids in one place.

Ids 0-3 are the same for every tokenizer, so models, losses and decoders can
rely on them::

    PAD = 0  <pad>  padding of target batches, and the CTC blank
    SOS = 1  <sos>  first decoder input
    EOS = 2  <eos>  last decoder target, ends a hypothesis
    UNK = 3  <unk>  a character the tokenizer was not trained on (non-strict encode only)

Sharing PAD with the CTC blank is safe: padded target positions are excluded
by the target lengths, so the blank never appears as a target.

Both tokenisers are trained on already normalised transcripts
(:func:`asr.data.text.normalize_text`) and do no normalisation of their own,
so ``decode(encode(x)) == x`` for any normalised ``x`` they know every
character of. Their :meth:`~Tokenizer.state_dict` is plain data (the BPE
model as bytes), stored inside checkpoints so a model file is self-contained.

Training BPE on a large corpus takes a while, so :func:`cached_bpe` keeps the
model in the cache folder under a key made from everything that decides it
(the transcripts, the vocabulary size, the training options and the
sentencepiece version): a new run on the same transcripts loads it. The entry
carries that key, the model's piece count and a checksum
(:mod:`asr.data.cache`), so a model cut short, damaged, or trained for
another vocabulary size is trained again, with a warning, never used.
"""

from __future__ import annotations

import abc
import io
import json
import logging
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece

from asr.data.cache import Entry, Fingerprint, cache_folder, load_entry, write_entry
from asr.data.parallel import resolve_jobs

logger = logging.getLogger(__name__)

PAD_ID, SOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<sos>", "<eos>", "<unk>")
UNK_SURFACE = "\u2047"  # how decode shows <unk>: "⁇" (sentencepiece's choice), visible and never in a transcript
BPE_WORD_BOUNDARY = "\u2581"  # sentencepiece's "▁" marking a word start

# How every BPE model is trained (besides the transcripts, the vocabulary size and the thread count).
# Part of the cache key: change one, and cached models are trained again.
BPE_OPTIONS = dict(
    model_type="bpe",
    hard_vocab_limit=False,
    character_coverage=1.0,              # never map a training character to <unk>
    normalization_rule_name="identity",  # normalize_text is the only normalisation
    pad_id=PAD_ID, bos_id=SOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
    pad_piece=SPECIAL_TOKENS[PAD_ID], bos_piece=SPECIAL_TOKENS[SOS_ID],
    eos_piece=SPECIAL_TOKENS[EOS_ID], unk_piece=SPECIAL_TOKENS[UNK_ID],
    unk_surface=UNK_SURFACE,
)


class UnknownCharactersError(ValueError):
    """``encode(strict=True)`` met characters the tokenizer has no symbol for; the message names them."""

    def __init__(self, characters: set[str], text: str):
        self.characters = characters
        shown = ", ".join(f"{c!r} ({_char_name(c)})" for c in sorted(characters))
        snippet = text if len(text) <= 80 else text[:77] + "..."
        super().__init__(f"characters not in the tokenizer's vocabulary: {shown} in {snippet!r}")


def _char_name(char: str) -> str:
    return f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed')}"


class Tokenizer(abc.ABC):
    """What every tokenizer provides: encode, decode, the special ids and a state dict."""

    pad_id = PAD_ID
    sos_id = SOS_ID
    eos_id = EOS_ID
    unk_id = UNK_ID
    blank_id = PAD_ID  # CTC blank (see the module docstring)

    def __init__(self) -> None:
        # Characters mapped to <unk> by non-strict encode, with how often; look here after loading a corpus.
        self.unknown_counts: Counter = Counter()

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, the specials included: the size of the model's output layer."""

    @abc.abstractmethod
    def known_characters(self) -> frozenset[str]:
        """The characters :meth:`encode` can represent without <unk> (space included)."""

    def unknown_characters(self, text: str) -> set[str]:
        """Characters of ``text`` this tokenizer cannot encode."""
        return set(text) - self.known_characters()

    def encode(self, text: str, strict: bool = True) -> list[int]:
        """Ids of ``text`` (no <sos>/<eos>: the model adds them).

        strict: characters the tokenizer does not know raise :class:`UnknownCharactersError`
        naming them; with ``strict=False`` they become <unk> and are counted in
        :attr:`unknown_counts`.
        """
        unknown = self.unknown_characters(text)
        if unknown:
            if strict:
                raise UnknownCharactersError(unknown, text)
            self.unknown_counts.update(c for c in text if c in unknown)
        return self._encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; <pad>/<sos>/<eos> (and so the CTC blank) are dropped, <unk> shows as "⁇"."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range 0..{self.vocab_size - 1}: {bad[:5]}")
        return self._decode([i for i in ids if i not in (PAD_ID, SOS_ID, EOS_ID)])

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Plain data that :func:`tokenizer_from_state_dict` rebuilds this tokenizer from."""

    @abc.abstractmethod
    def _encode(self, text: str) -> list[int]:
        """Ids of ``text``; unknown characters become <unk>."""

    @abc.abstractmethod
    def _decode(self, ids: list[int]) -> str:
        """Text of ``ids``, which contain no <pad>/<sos>/<eos>."""


class CharTokenizer(Tokenizer):
    """One id per character; the space between words is a symbol like any other.

    A character is a Unicode code point, as in ESPnet's and icefall's character units: a combining mark
    (a Devanagari vowel sign or virama, an accent NFKC could not compose) is a symbol of its own, after its
    letter (:mod:`asr.data.text` keeps it on its word), and ``decode(encode(x)) == x`` holds for such text too.

    symbols: the characters with ids 4, 5, ... in order (the specials come first).
    """

    def __init__(self, symbols: Sequence[str]):
        super().__init__()
        symbols = list(symbols)
        if len(set(symbols)) != len(symbols) or any(len(s) != 1 for s in symbols):
            raise ValueError(f"CharTokenizer symbols must be distinct single characters, got {symbols!r}")
        self.symbols = symbols
        self._ids = {s: i for i, s in enumerate(symbols, start=len(SPECIAL_TOKENS))}
        self._known = frozenset(symbols)

    @classmethod
    def train(cls, texts: Iterable[str]) -> "CharTokenizer":
        """Every character seen in ``texts``, in sorted order (so the ids do not depend on the corpus order)."""
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        if not chars:
            raise ValueError("cannot build a character tokenizer from empty transcripts")
        return cls(sorted(chars))

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.symbols)

    def known_characters(self) -> frozenset[str]:
        return self._known

    def _encode(self, text: str) -> list[int]:
        return [self._ids.get(c, UNK_ID) for c in text]

    def _decode(self, ids: list[int]) -> str:
        offset = len(SPECIAL_TOKENS)
        return "".join(UNK_SURFACE if i == UNK_ID else self.symbols[i - offset] for i in ids)

    def state_dict(self) -> dict:
        return {"type": "char", "symbols": list(self.symbols)}


class BPETokenizer(Tokenizer):
    """Byte-pair-encoding subwords from sentencepiece.

    model: the serialised sentencepiece model. It is kept as bytes (never as a
    file path) so the checkpoint, not a file beside it, carries the tokenizer.
    """

    def __init__(self, model: bytes):
        super().__init__()
        self.model = bytes(model)
        if not self.model:
            raise ValueError("empty sentencepiece model")
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=self.model)
        if self._sp.get_piece_size() < len(SPECIAL_TOKENS):
            raise ValueError(f"sentencepiece model has {self._sp.get_piece_size()} pieces, fewer than the specials")
        specials = tuple(self._sp.id_to_piece(i) for i in range(len(SPECIAL_TOKENS)))
        if specials != SPECIAL_TOKENS:
            raise ValueError(f"sentencepiece model has special pieces {specials}, expected {SPECIAL_TOKENS}")
        pieces = (self._sp.id_to_piece(i) for i in range(len(SPECIAL_TOKENS), self._sp.get_piece_size()))
        # With character_coverage=1.0 every training character is a piece of its own,
        # so the characters of the pieces are exactly the characters encode can represent.
        chars = {c for piece in pieces for c in piece}
        self._known = frozenset((chars - {BPE_WORD_BOUNDARY}) | {" "})

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, threads: int = 0) -> "BPETokenizer":
        """Train on ``texts`` in memory; ``vocab_size`` (specials included) is an upper bound.

        The vocabulary stops growing when no pair is left to merge, so a small
        corpus gives a smaller vocabulary instead of an error
        (``hard_vocab_limit=False``). ``threads``: sentencepiece's threads (0 =
        one per core); the pieces and their scores do not depend on it, only the
        thread count recorded in the model's training spec does.
        """
        texts = [t for t in texts if t]
        if not texts:
            raise ValueError("cannot train a BPE tokenizer on empty transcripts")
        buffer = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                model_writer=buffer,
                vocab_size=vocab_size,
                num_threads=resolve_jobs(threads),
                minloglevel=2,
                **BPE_OPTIONS,
            )
        except RuntimeError as err:
            raise ValueError(f"sentencepiece could not train a BPE model with vocab size {vocab_size}: {err}") from err
        return cls(buffer.getvalue())

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def known_characters(self) -> frozenset[str]:
        return self._known

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of ``text``, for inspecting what the model is asked to predict."""
        return self._sp.encode(text, out_type=str)

    def _encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def _decode(self, ids: list[int]) -> str:
        return self._sp.decode(ids)

    def state_dict(self) -> dict:
        return {"type": "bpe", "model": self.model}


def bpe_cache_key(texts: Sequence[str], vocab_size: int) -> dict:
    """The key of the model :func:`cached_bpe` trains on ``texts`` (empty ones left out) with ``vocab_size``.

    ``fingerprint`` is a SHA-256 over every transcript in order (sentencepiece's
    result may depend on the order), the vocabulary size, :data:`BPE_OPTIONS`
    and the sentencepiece version: all that decides the model. Hashing the
    transcripts costs a few milliseconds per thousand (docs/benchmarks.md, "Preparation").
    The vocabulary size and the version are in the key in plain words too, so
    that a refused entry says what it was made for.
    """
    fingerprint = Fingerprint("bpe v1").add(sentencepiece.__version__, vocab_size)
    fingerprint.add(json.dumps(BPE_OPTIONS, sort_keys=True))
    for text in texts:
        if text:
            fingerprint.add(text)
    return {"vocab_size": vocab_size, "sentencepiece": sentencepiece.__version__,
            "fingerprint": fingerprint.hexdigest(64)}


def bpe_cache_path(texts: Sequence[str], vocab_size: int, cache_dir: str | Path | None = None) -> Path:
    """Where :func:`cached_bpe` keeps the model trained on ``texts`` with ``vocab_size`` (see :func:`bpe_cache_key`)."""
    return _bpe_entry_path(bpe_cache_key(texts, vocab_size), cache_dir)


def _bpe_entry_path(key: dict, cache_dir: str | Path | None) -> Path:
    return cache_folder(cache_dir, "bpe") / f"bpe{key['vocab_size']}-{key['fingerprint'][:32]}.model"


def cached_bpe(
    texts: Iterable[str], vocab_size: int, cache_dir: str | Path | None = None, threads: int = 0
) -> BPETokenizer:
    """:meth:`BPETokenizer.train`, or the model it trained before on the same transcripts (see :func:`bpe_cache_key`).

    The entry is used only when it verifies (:mod:`asr.data.cache`: its checksum, and the key,
    the vocabulary size among it) and loads as a sentencepiece model with our special pieces
    and the piece count it was written with, no more than ``vocab_size``; any other is ignored
    with one warning and trained again. The model is written atomically, and a cache that
    cannot be written only costs training next time.
    """
    texts = [t for t in texts if t]
    key = bpe_cache_key(texts, vocab_size)
    path = _bpe_entry_path(key, cache_dir)
    tokenizer = load_entry(
        path, "bpe", key, lambda entry: _parse_bpe_entry(entry, vocab_size), "BPE model", "training it again"
    )
    if tokenizer is not None:
        logger.info("BPE model (vocabulary %d) of these %d transcripts from %s", tokenizer.vocab_size, len(texts), path)
        return tokenizer
    logger.info(
        "training a BPE model (vocabulary up to %d) on %d transcripts with %d threads",
        vocab_size, len(texts), resolve_jobs(threads),
    )
    start = time.perf_counter()
    tokenizer = BPETokenizer.train(texts, vocab_size, threads)
    elapsed = time.perf_counter() - start
    kept = write_entry(path, "bpe", key, tokenizer.model, "BPE model", facts={"pieces": tokenizer.vocab_size})
    logger.info("BPE model trained in %.1f s%s", elapsed, f", kept in {path}" if kept else "")
    return tokenizer


def _parse_bpe_entry(entry: Entry, vocab_size: int) -> BPETokenizer:
    """The tokenizer of a verified BPE entry; ValueError when it is not the model the entry says it is."""
    tokenizer = BPETokenizer(entry.content)  # RuntimeError from sentencepiece for a bad proto
    # A vocabulary can come out smaller than asked for (hard_vocab_limit=False on a small corpus),
    # never larger; and it must be the size it had when it was written.
    if tokenizer.vocab_size != entry.facts.get("pieces") or tokenizer.vocab_size > vocab_size:
        raise ValueError(f"a model of {tokenizer.vocab_size} pieces, written with {entry.facts.get('pieces')} "
                         f"for a vocabulary of at most {vocab_size}")
    return tokenizer


def tokenizer_from_state_dict(state: dict) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.state_dict` (e.g. from a checkpoint)."""
    kind = state.get("type")
    if kind == "char":
        return CharTokenizer(state["symbols"])
    if kind == "bpe":
        return BPETokenizer(state["model"])
    raise ValueError(f"unknown tokenizer type {kind!r} in state dict (expected 'char' or 'bpe')")

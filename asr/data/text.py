"""Transcript normalisation: the one function every transcript goes through.

Readers apply :func:`normalize_text` to every transcript they load, the
tokenisers are trained on its output, and WER scoring applies it to both the
reference and the hypothesis, so the text a model learns and the text it is
scored against are normalised the same way.

**One Unicode form: NFKC.** The same word can be written with different code
points: ``É`` precomposed or as ``E`` and a combining accent, ``ＯＮＥ`` in
fullwidth letters, ``ﬁ`` as a ligature, a no-break space between words. A
tokenizer sees different characters in each, so one spelling would be learnt
and the other skipped as unknown, or scored as an error. NFKC composes accents
onto their letters (as NFC does) and also folds these compatibility forms into
the plain characters, which is what a transcript means by them; the
distinctions it drops (width, ligatures, superscripts) are typography, not
speech. NFC alone would keep fullwidth and ligature forms apart.

**Every combining mark stays on its word.** NFKC composes what it can, but in many scripts the marks
have no composed form: a Devanagari vowel sign or virama (``नमस्ते`` is न म स ् त े), Hebrew points,
Tamil and Thai signs. Python's ``\\w`` does not match marks, so they are kept by their Unicode category
(``M*``), as are the zero-width joiner and non-joiner, which shape Indic and Persian words and never
end one (Unicode's word boundaries, UAX #29, do not break at them). Without that a word was cut into
pieces at each mark and the marks were lost (``नमस्ते`` became ``नमस त``). The character tokenizer
then has one symbol per code point, so a consonant and its vowel sign are two symbols, in their order,
and CER counts code points (a changed vowel sign costs one), as ESPnet's and icefall's character
units do.

Transcript files are read as bytes and decoded line by line (:func:`text_lines`), so that one line that
is not UTF-8 costs that line alone; a byte-order mark at the start of a file is dropped (an editor's, not
part of the first utterance's id).
"""

from __future__ import annotations

import codecs
import re
import unicodedata

# What may not be kept: anything that is not a word character, an apostrophe or a space, plus the
# underscore that ``\w`` lets through. ``\w`` is Unicode-aware, so letters and digits of any script pass
# at regex speed; the few characters it stops (punctuation, symbols, marks, joiners) are looked at one by
# one (:func:`_mark_or_space`), since ``re`` has no class for a Unicode category.
_NOT_WORD = re.compile(r"[^\w' ]|_")
_JOINERS = frozenset("\u200c\u200d")  # zero-width non-joiner and joiner: inside a word (module docstring)
_SPACES = re.compile(r"\s+")
UNICODE_FORM = "NFKC"

# The words digits are transcribed as (FSDD's connected digits, the demo corpus), in normalize_text's form.
DIGIT_WORDS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")


def text_lines(data: bytes) -> list[bytes]:
    """The lines of a transcript file's bytes, without a UTF-8 byte-order mark at its start."""
    return (data[len(codecs.BOM_UTF8):] if data.startswith(codecs.BOM_UTF8) else data).splitlines()


def normalize_text(text: str) -> str:
    """NFKC (the module docstring says why); upper-case; keep letters, digits, combining marks, joiners,
    apostrophes and spaces; collapse spaces.

    Every other character (punctuation, hyphens, symbols, tabs, newlines)
    becomes a space, so ``"well-known"`` turns into ``"WELL KNOWN"`` rather
    than ``"WELLKNOWN"``; runs of spaces collapse to one and the ends are
    stripped. Apostrophes are kept wherever they are (LibriSpeech writes
    ``"DON'T"``, ``"'TIS"`` and ``"JAMES'"``), so quotes written with
    apostrophes stay too. Upper-casing follows Python's Unicode rules
    (``"ß"`` -> ``"SS"``). LibriSpeech transcripts are already in this form,
    so for them this is the identity.
    """
    # NFKC again after upper-casing: a capital may have no precomposed form of its own (ǰ -> J + caron)
    upper = unicodedata.normalize(UNICODE_FORM, unicodedata.normalize(UNICODE_FORM, text).upper())
    return _SPACES.sub(" ", _NOT_WORD.sub(_mark_or_space, upper)).strip()


def _mark_or_space(match: re.Match) -> str:
    """A character ``\\w`` does not match: kept when it is a combining mark or a joiner on a word (after a
    letter or digit, through any marks between), else a space; a variation selector is dropped (``❤️`` is a
    heart and U+FE0F: it goes with its emoji)."""
    char = match.group()
    if 0xFE00 <= ord(char) <= 0xFE0F or 0xE0100 <= ord(char) <= 0xE01EF:
        return ""  # a variation selector: how to draw the character before it, not a sound
    if not _joins(char):
        return " "
    text, before = match.string, match.start() - 1
    while before >= 0 and _joins(text[before]):
        before -= 1
    return char if before >= 0 and text[before].isalnum() else " "


def _joins(char: str) -> bool:
    return char in _JOINERS or unicodedata.category(char).startswith("M")

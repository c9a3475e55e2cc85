"""Transcript normalisation: the one function every transcript goes through.

Readers apply :func:`normalize_text` to every transcript they load, the
tokenisers are trained on its output, and WER scoring applies it to both the
reference and the hypothesis, so the text a model learns and the text it is
scored against are normalised the same way.
"""

from __future__ import annotations

import re

# Anything that is not a word character or an apostrophe, plus the underscore
# that ``\w`` lets through. ``\w`` is Unicode-aware, so accented letters (and
# digits of any script) are kept rather than silently deleted.
_NOT_KEPT = re.compile(r"[^\w']|_")
_SPACES = re.compile(r"\s+")

# The words digits are transcribed as (FSDD's connected digits, the demo corpus), in normalize_text's form.
DIGIT_WORDS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")


def normalize_text(text: str) -> str:
    """Upper-case; keep letters, digits, apostrophes and spaces; collapse spaces.

    Every other character (punctuation, hyphens, symbols, tabs, newlines)
    becomes a space, so ``"well-known"`` turns into ``"WELL KNOWN"`` rather
    than ``"WELLKNOWN"``; runs of spaces collapse to one and the ends are
    stripped. Apostrophes are kept wherever they are (LibriSpeech writes
    ``"DON'T"``, ``"'TIS"`` and ``"JAMES'"``), so quotes written with
    apostrophes stay too. Upper-casing follows Python's Unicode rules
    (``"ß"`` -> ``"SS"``). LibriSpeech transcripts are already in this form,
    so for them this is the identity.
    """
    return _SPACES.sub(" ", _NOT_KEPT.sub(" ", text.upper())).strip()

"""Word and character error rates, and the per-utterance alignment behind them.

Normalisation happens here, once, before any counting: both the reference and
the hypothesis go through :func:`asr.data.text.normalize_text`, the same
function the corpus readers apply to transcripts and the tokenisers are
trained on. It upper-cases, keeps letters, digits, combining marks and apostrophes, turns every
other character (punctuation, hyphens, symbols) into a word break and
collapses runs of spaces. So ``"Hello, world!"`` and ``"HELLO WORLD"`` score
as identical, ``"well-known"`` counts as the two words ``WELL KNOWN``, and
``"don't"`` stays one word ``DON'T`` (it is not expanded to ``DO NOT``). No
other rewriting is done: no number normalisation, no spelling variants.

Counting is done by ``jiwer`` (Levenshtein alignment with unit costs):

* WER = (S + D + I) / N, N = reference words, summed over all utterances
  (a corpus-level rate, not the mean of per-utterance rates);
* CER is the same over characters of the normalised text, the single space
  between words included (so a wrongly split or merged word costs one
  character error). A character is a Unicode code point: a Devanagari vowel
  sign or virama counts as one, as its consonant does.

An utterance whose reference is empty after normalisation has no defined
error rate; it is an error that names the utterance rather than a silent 0 or
infinity.
"""

from __future__ import annotations

from dataclasses import dataclass

import jiwer

from asr.data.text import normalize_text


@dataclass
class UtteranceAlignment:
    """The word alignment of one utterance (normalised text).

    ref / hyp: the aligned columns; ``None`` marks the gap opposite an
    insertion (in ``ref``) or a deletion (in ``hyp``).
    ops: one of ``"="`` (hit), ``"S"``, ``"D"``, ``"I"`` per column.
    """

    id: str
    ref: list[str | None]
    hyp: list[str | None]
    ops: list[str]

    @property
    def substitutions(self) -> int:
        return self.ops.count("S")

    @property
    def deletions(self) -> int:
        return self.ops.count("D")

    @property
    def insertions(self) -> int:
        return self.ops.count("I")

    @property
    def hits(self) -> int:
        return self.ops.count("=")

    @property
    def ref_words(self) -> int:
        return self.hits + self.substitutions + self.deletions

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions


def normalized_pairs(refs: list[str], hyps: list[str], ids: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Normalise both sides; check they pair up and no reference is empty."""
    if len(refs) != len(hyps):
        raise ValueError(f"got {len(refs)} references but {len(hyps)} hypotheses")
    if ids is not None and len(ids) != len(refs):
        raise ValueError(f"got {len(ids)} utterance ids for {len(refs)} references")
    if not refs:
        raise ValueError("no utterances to score")
    norm_refs = [normalize_text(r) for r in refs]
    norm_hyps = [normalize_text(h) for h in hyps]
    for i, ref in enumerate(norm_refs):
        if not ref:
            name = f"utterance {ids[i]!r}" if ids is not None else f"reference {i}"
            raise ValueError(
                f"{name} is empty after normalisation (original: {refs[i]!r}); the error rate is undefined"
            )
    return norm_refs, norm_hyps


def error_rates(refs: list[str], hyps: list[str], ids: list[str] | None = None) -> dict:
    """Corpus-level WER and CER of ``hyps`` against ``refs`` (paired by position).

    Returns ``{"wer", "cer", "substitutions", "deletions", "insertions", "hits",
    "ref_words", "char_errors", "ref_chars"}``; the rates are fractions
    (0.25, not 25), the counts are word counts unless named ``char``.
    ``ids`` only make error messages name the utterance.
    """
    norm_refs, norm_hyps = normalized_pairs(refs, hyps, ids)
    words = jiwer.process_words(norm_refs, norm_hyps)
    chars = jiwer.process_characters(norm_refs, norm_hyps)
    ref_words = words.hits + words.substitutions + words.deletions
    ref_chars = chars.hits + chars.substitutions + chars.deletions
    return {
        "wer": float(words.wer),
        "cer": float(chars.cer),
        "substitutions": words.substitutions,
        "deletions": words.deletions,
        "insertions": words.insertions,
        "hits": words.hits,
        "ref_words": ref_words,
        "char_errors": chars.substitutions + chars.deletions + chars.insertions,
        "ref_chars": ref_chars,
    }


def rates_in_percent(rates: dict) -> dict:
    """:func:`error_rates` (or one bin of :func:`error_rates_by_length`) as people read it and
    ``wer.json`` stores it: ``wer`` and ``cer`` become ``wer_percent`` and ``cer_percent`` (25.0, not
    0.25), so a key never leaves its unit to be guessed; the counts stay as they are."""
    shown = {key: value for key, value in rates.items() if key not in ("wer", "cer")}
    return {"wer_percent": 100 * rates["wer"], "cer_percent": 100 * rates["cer"], **shown}


def align_words(refs: list[str], hyps: list[str], ids: list[str] | None = None) -> list[UtteranceAlignment]:
    """The word alignment of each utterance, after the same normalisation as :func:`error_rates`."""
    norm_refs, norm_hyps = normalized_pairs(refs, hyps, ids)
    ids = ids if ids is not None else [str(i) for i in range(len(refs))]
    out = jiwer.process_words(norm_refs, norm_hyps)
    result = []
    for utt_id, ref_words, hyp_words, chunks in zip(ids, out.references, out.hypotheses, out.alignments):
        ref: list[str | None] = []
        hyp: list[str | None] = []
        ops: list[str] = []
        for chunk in chunks:
            r = ref_words[chunk.ref_start_idx : chunk.ref_end_idx]
            h = hyp_words[chunk.hyp_start_idx : chunk.hyp_end_idx]
            if chunk.type in ("equal", "substitute"):
                ref += r
                hyp += h
                ops += ["=" if chunk.type == "equal" else "S"] * len(r)
            elif chunk.type == "delete":
                ref += r
                hyp += [None] * len(r)
                ops += ["D"] * len(r)
            else:  # insert
                ref += [None] * len(h)
                hyp += h
                ops += ["I"] * len(h)
        result.append(UtteranceAlignment(utt_id, ref, hyp, ops))
    return result


def format_alignment(alignment: UtteranceAlignment) -> str:
    """Three aligned lines, sclite style, under a header with the counts::

        9999-1-0001  S=1 D=1 I=0 N=4
        REF: THE CAT SAT DOWN
        HYP: THE BAT SAT ****
                 S       D

    Gaps are ``*`` as wide as the word opposite; hits have no marker.
    """
    a = alignment
    ref_cells, hyp_cells, op_cells = [], [], []
    for r, h, op in zip(a.ref, a.hyp, a.ops):
        width = max(len(r or ""), len(h or ""), 1)
        ref_cells.append((r if r is not None else "*" * width).ljust(width))
        hyp_cells.append((h if h is not None else "*" * width).ljust(width))
        op_cells.append(("" if op == "=" else op).ljust(width))
    header = f"{a.id}  S={a.substitutions} D={a.deletions} I={a.insertions} N={a.ref_words}"
    return "\n".join(
        [
            header,
            ("REF: " + " ".join(ref_cells)).rstrip(),
            ("HYP: " + " ".join(hyp_cells)).rstrip(),
            ("     " + " ".join(op_cells)).rstrip(),
        ]
    )


def alignment_report(refs: list[str], hyps: list[str], ids: list[str] | None = None) -> str:
    """Every utterance's alignment (:func:`format_alignment`), blank-line separated, then the totals."""
    alignments = align_words(refs, hyps, ids)
    totals = error_rates(refs, hyps, ids)
    blocks = [format_alignment(a) for a in alignments]
    blocks.append(
        f"TOTAL  S={totals['substitutions']} D={totals['deletions']} I={totals['insertions']} "
        f"N={totals['ref_words']}  WER {100 * totals['wer']:.2f}%  CER {100 * totals['cer']:.2f}%"
    )
    return "\n\n".join(blocks) + "\n"


# Bins of reference length (words) for utterances longer than PER_LENGTH_UP_TO words:
# roughly doubling widths, the shape of read-speech corpora (LibriSpeech's are 1-80+ words).
LENGTH_BIN_EDGES = (5, 10, 20, 40, 80)
PER_LENGTH_UP_TO = 10  # up to this many words, each length is its own bin (digit strings, commands)


def length_bins(lengths: list[int]) -> list[tuple[int, int]]:
    """Inclusive ``(low, high)`` word-count bins covering ``lengths``: one per length when no reference
    is longer than :data:`PER_LENGTH_UP_TO` words, else :data:`LENGTH_BIN_EDGES` (the last bin open-ended)."""
    if not lengths:
        return []
    longest = max(lengths)
    if longest <= PER_LENGTH_UP_TO:
        return [(n, n) for n in range(min(lengths), longest + 1)]
    bins, low = [], 1
    for edge in LENGTH_BIN_EDGES:
        bins.append((low, edge))
        low = edge + 1
    bins.append((low, max(longest, low)))
    return [b for b in bins if any(b[0] <= n <= b[1] for n in lengths)]


def error_rates_by_length(refs: list[str], hyps: list[str], ids: list[str] | None = None) -> list[dict]:
    """:func:`error_rates` per bin of reference length in words (:func:`length_bins`), each with
    ``"words": [low, high]`` and ``"utterances"``; bins without utterances are left out."""
    norm_refs, _ = normalized_pairs(refs, hyps, ids)
    lengths = [len(r.split()) for r in norm_refs]
    ids = ids if ids is not None else [str(i) for i in range(len(refs))]
    result = []
    for low, high in length_bins(lengths):
        chosen = [i for i, n in enumerate(lengths) if low <= n <= high]
        if not chosen:
            continue
        rates = error_rates([refs[i] for i in chosen], [hyps[i] for i in chosen], [ids[i] for i in chosen])
        result.append({"words": [low, high], "utterances": len(chosen), **rates})
    return result


def length_table(bins: list[dict]) -> str:
    """The by-length breakdown (bins :func:`rates_in_percent`) as printed lines: ``words  utts  WER %  S  D  I  N``."""
    lines = [f"{'words':>7} {'utts':>5} {'WER %':>7} {'S':>5} {'D':>5} {'I':>5} {'N':>6}"]
    for b in bins:
        low, high = b["words"]
        label = str(low) if low == high else f"{low}-{high}"
        lines.append(
            f"{label:>7} {b['utterances']:>5} {b['wer_percent']:>7.2f} {b['substitutions']:>5} "
            f"{b['deletions']:>5} {b['insertions']:>5} {b['ref_words']:>6}"
        )
    return "\n".join(lines)

"""asr.decoding.scoring: error counts on examples worked out by hand, normalisation, edge cases."""

import pytest

from asr.decoding.scoring import align_words, alignment_report, error_rates, format_alignment


def test_one_substitution_in_four_words():
    # THE CAT SAT DOWN / THE BAT SAT DOWN: one substituted word of 4;
    # one substituted character of 16 ("THE CAT SAT DOWN" has 13 letters + 3 spaces).
    r = error_rates(["the cat sat down"], ["the bat sat down"])
    assert r["wer"] == pytest.approx(1 / 4)
    assert r["cer"] == pytest.approx(1 / 16)
    assert (r["substitutions"], r["deletions"], r["insertions"], r["hits"], r["ref_words"]) == (1, 0, 0, 3, 4)
    assert r["ref_chars"] == 16 and r["char_errors"] == 1


def test_insertion_and_deletion_counts():
    # A B C -> A X B: C deleted at the end... the cheapest alignment is
    # A=A, insert X, B=B, delete C: 2 errors over 3 reference words.
    r = error_rates(["a b c"], ["a x b"])
    assert (r["substitutions"], r["deletions"], r["insertions"]) in {(0, 1, 1), (2, 0, 0)}
    assert r["wer"] == pytest.approx(2 / 3)
    r = error_rates(["a b"], ["a b c d"])
    assert (r["insertions"], r["hits"]) == (2, 2)
    assert r["wer"] == pytest.approx(1.0)  # WER can exceed the share of wrong words: 2 insertions / 2 words


def test_rates_are_corpus_level_not_mean_of_utterances():
    # Utterance 1: 1 error / 4 words; utterance 2: 1 error / 1 word.
    # Corpus WER = 2 / 5 = 0.4, whereas the mean of per-utterance WERs would be 0.625.
    r = error_rates(["one two three four", "five"], ["one two three for", "fife"])
    assert r["wer"] == pytest.approx(2 / 5)
    assert r["ref_words"] == 5


def test_normalisation_makes_case_and_punctuation_irrelevant():
    r = error_rates(["Hello, World! It's well-known."], ["HELLO WORLD IT'S WELL KNOWN"])
    assert r["wer"] == 0.0 and r["cer"] == 0.0
    assert r["ref_words"] == 5  # the hyphen is a word break: WELL KNOWN is two words
    # Apostrophes are kept, so a dropped apostrophe is still an error.
    assert error_rates(["don't"], ["dont"])["wer"] == 1.0
    # Extra spaces never count as errors.
    assert error_rates(["a  b"], ["  a b "])["cer"] == 0.0


def test_empty_hypothesis_is_all_deletions():
    r = error_rates(["the cat sat"], [""])
    assert r["wer"] == 1.0 and r["cer"] == 1.0
    assert (r["deletions"], r["substitutions"], r["insertions"]) == (3, 0, 0)
    # Punctuation-only hypotheses normalise to empty too.
    assert error_rates(["the cat sat"], ["?!"])["wer"] == 1.0


def test_empty_reference_is_an_error_naming_the_utterance():
    with pytest.raises(ValueError, match="utt-2.*empty after normalisation"):
        error_rates(["a b", "..."], ["a b", "c"], ids=["utt-1", "utt-2"])
    with pytest.raises(ValueError, match="reference 0"):
        error_rates([""], ["c"])


def test_mismatched_lists_and_no_utterances_are_errors():
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        error_rates(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no utterances"):
        error_rates([], [])


def test_alignment_columns_and_markers():
    (a,) = align_words(["the cat sat down"], ["the bat sat"], ids=["u1"])
    assert a.ref == ["THE", "CAT", "SAT", "DOWN"]
    assert a.hyp == ["THE", "BAT", "SAT", None]
    assert a.ops == ["=", "S", "=", "D"]
    text = format_alignment(a)
    header, ref, hyp, marks = text.split("\n")
    assert header == "u1  S=1 D=1 I=0 N=4"
    # Every marker sits under the first letter of its column.
    assert ref.index("CAT") == hyp.index("BAT") == marks.index("S")
    assert ref.index("DOWN") == hyp.index("****") == marks.index("D")
    (b,) = align_words(["a b"], ["a new b"])
    assert b.ref == ["A", None, "B"] and b.ops == ["=", "I", "="]
    _, ref, hyp, marks = format_alignment(b).split("\n")
    assert ref.index("***") == hyp.index("NEW") == marks.index("I")


def test_report_counts_agree_with_error_rates():
    refs = ["the cat sat down", "a b c", "one"]
    hyps = ["the bat sat", "a x b c d", "one"]
    ids = ["u1", "u2", "u3"]
    totals = error_rates(refs, hyps, ids)
    alignments = align_words(refs, hyps, ids)
    assert sum(a.substitutions for a in alignments) == totals["substitutions"]
    assert sum(a.deletions for a in alignments) == totals["deletions"]
    assert sum(a.insertions for a in alignments) == totals["insertions"]
    assert sum(a.ref_words for a in alignments) == totals["ref_words"]
    report = alignment_report(refs, hyps, ids)
    for utt in ids:
        assert f"\n{utt}  S=" in "\n" + report
    assert f"N={totals['ref_words']}" in report.splitlines()[-1]


def test_length_bins_are_per_length_for_short_references_and_doubling_for_long_ones():
    from asr.decoding.scoring import length_bins

    assert length_bins([3, 1, 7]) == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7)]
    assert length_bins([4, 12, 35, 300]) == [(1, 5), (11, 20), (21, 40), (81, 300)]
    assert length_bins([]) == []


def test_error_rates_by_length_partition_the_corpus():
    from asr.decoding.scoring import error_rates, error_rates_by_length

    refs = ["ONE", "ONE TWO", "THREE FOUR", "FIVE SIX SEVEN"]
    hyps = ["ONE", "ONE", "THREE FOUR FOUR", "FIVE SEVEN"]
    bins = error_rates_by_length(refs, hyps)
    assert [b["words"] for b in bins] == [[1, 1], [2, 2], [3, 3]]
    assert [b["utterances"] for b in bins] == [1, 2, 1]
    assert bins[1]["deletions"] == 1 and bins[1]["insertions"] == 1 and bins[1]["ref_words"] == 4
    total = error_rates(refs, hyps)
    for key in ("substitutions", "deletions", "insertions", "ref_words"):
        assert sum(b[key] for b in bins) == total[key]
    # Lengths no reference has are no bins.
    gaps = error_rates_by_length(["ONE", "ONE TWO THREE FOUR"], ["ONE", "ONE TWO"])
    assert [b["words"] for b in gaps] == [[1, 1], [4, 4]]

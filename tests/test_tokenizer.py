"""Tokenisers (char and BPE) and the text normalisation they are trained on."""

import pytest
import torch

from asr.data.config import DataConfig
from asr.data.corpus import build_tokenizer
from asr.data.librispeech import read_librispeech
from asr.data.text import normalize_text
from asr.data.tokenizer import (
    EOS_ID,
    PAD_ID,
    SOS_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    UNK_SURFACE,
    BPETokenizer,
    CharTokenizer,
    UnknownCharactersError,
    tokenizer_from_state_dict,
)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """build_tokenizer keeps BPE models in the cache folder: a per-test one, never the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="module")
def transcripts(librivox_mini, fsdd_dev, tmp_path_factory):
    """The librivox_mini and fsdd-dev transcripts, through the corpus reader."""
    cache = tmp_path_factory.mktemp("cache")
    return [u.text for u in read_librispeech([librivox_mini, fsdd_dev], cache_dir=cache)]


@pytest.fixture(scope="module")
def bpe(transcripts):
    return BPETokenizer.train(transcripts, vocab_size=120)


def test_normalize_text():
    assert normalize_text("  Hello,   world!\tIt's  well-known ") == "HELLO WORLD IT'S WELL KNOWN"
    assert normalize_text("snake_case: 3.5%") == "SNAKE CASE 3 5"
    assert normalize_text("café Straße") == "CAFÉ STRASSE"
    assert normalize_text("?!") == ""
    text = "AND MISTER JOHN DASHWOOD HAD THEN LEISURE 'TIS JAMES' DON'T"
    assert normalize_text(text) == text  # LibriSpeech transcripts are already normalised


def test_one_unicode_form_before_tokenising_in_training_and_scoring_alike():
    """issue 81: ONE + a combining accent lost the accent, the precomposed ONÉ was skipped as unknown
    characters, and fullwidth ＯＮＥ stayed as it was. NFKC makes each spelling one text."""
    from asr.decoding.scoring import error_rates

    assert normalize_text("ONE\u0301") == normalize_text("ON\u00c9") == "ON\u00c9"
    assert normalize_text("\uff2f\uff2e\uff25 \ufb01ve\u00a0two") == "ONE FIVE TWO"
    assert normalize_text("e\u0301cole \u01f0ab") == "\u00c9COLE J\u030cAB"  # a mark with no composed form stays on its word
    tokenizer = CharTokenizer.train([normalize_text("ON\u00c9 TWO")])
    assert not tokenizer.unknown_characters(normalize_text("one\u0301 \uff34\uff37\uff2f"))
    # the scorer normalises reference and hypothesis with the same function
    rates = error_rates(["ONE\u0301 \uff34\uff37\uff2f"], ["on\u00e9 two"])
    assert rates["wer"] == rates["cer"] == 0.0 and rates["ref_chars"] == 7



def test_devanagari_vowel_signs_and_viramas_stay_on_their_words_through_tokenizers_and_scoring(tmp_path):
    """issue 81: combining marks outside the Latin accent ranges (a Devanagari vowel sign, a virama) were
    turned into word breaks and lost: "नमस्ते दुनिया" became the six words "नमस त द न य"."""
    import unicodedata

    from asr.decoding.scoring import error_rates

    hello = "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e"  # नमस्ते दुनिया
    assert normalize_text(hello) == hello == unicodedata.normalize("NFKC", hello)
    assert normalize_text(f"  {hello}!  ") == hello
    for word in ("\u0939\u093f\u0928\u094d\u0926\u0940",   # हिन्दी: a vowel sign before its consonant's
                 "\u0ba4\u0bae\u0bbf\u0bb4\u0bcd",          # Tamil, with a pulli
                 "\u05e2\u05b4\u05d1\u05b0\u05e8\u05b4\u05d9\u05ea",  # pointed Hebrew
                 "\u0915\u094d\u200d\u0937",                 # क्‍ष: a half form made with the zero-width joiner
                 "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"):  # Persian, with the non-joiner
        assert normalize_text(word) == word
    # a mark on no letter is no word: an emoji's variation selector, a stray accent after a space
    assert normalize_text("I \u2764\ufe0f YOU \u0301\u0947 \u00a9\ufe0f") == "I YOU"
    # two spellings of one letter are one text: क़ precomposed (U+0958, which NFC and NFKC never
    # compose) and क + nukta
    assert normalize_text("\u0958") == normalize_text("\u0915\u093c") == "\u0915\u093c"

    # code-point units, in order, none lost: the round trip gives the normalised text back
    char = CharTokenizer.train([hello])
    assert char.decode(char.encode(hello)) == hello
    assert [char.symbols[i - len(SPECIAL_TOKENS)] for i in char.encode(hello)] == list(hello)
    assert "\u094d" in char.symbols and "\u0947" in char.symbols  # the virama and the vowel sign E
    bpe = BPETokenizer.train([hello, "\u0926\u0941\u0928\u093f\u092f\u093e \u0928\u092e\u0938\u094d\u0924\u0947"] * 20,
                             vocab_size=30)
    assert bpe.decode(bpe.encode(hello)) == hello

    # scoring: identical text scores 0, two words; a changed vowel sign (ते -> तो) is one word, one code point
    same = error_rates([hello], [hello])
    assert same["wer"] == same["cer"] == 0.0 and same["ref_words"] == 2 and same["ref_chars"] == len(hello) == 13
    changed = error_rates([hello], [hello.replace("\u0947", "\u094b")])
    assert (changed["substitutions"], changed["ref_words"], changed["char_errors"]) == (1, 2, 1)
    # a dropped virama (स्ते -> सते) is one deletion of a code point, not a word split
    dropped = error_rates([hello], [hello.replace("\u094d", "", 1)])
    assert (dropped["substitutions"], dropped["insertions"], dropped["char_errors"]) == (1, 0, 1)

def test_special_ids_are_shared(transcripts, bpe):
    char = CharTokenizer.train(transcripts)
    for tok in (char, bpe):
        assert (tok.pad_id, tok.sos_id, tok.eos_id, tok.unk_id, tok.blank_id) == (0, 1, 2, 3, 0)
    assert SPECIAL_TOKENS == ("<pad>", "<sos>", "<eos>", "<unk>")
    assert [bpe._sp.id_to_piece(i) for i in range(4)] == list(SPECIAL_TOKENS)


def test_char_round_trip(transcripts):
    tok = CharTokenizer.train(transcripts)
    assert tok.vocab_size == 4 + len(set("".join(transcripts)))
    for text in transcripts:
        ids = tok.encode(text)
        assert len(ids) == len(text) and min(ids) >= 4
        assert tok.decode(ids) == text


def test_bpe_round_trip_and_subwords(transcripts, bpe):
    assert 4 + len(set("".join(transcripts))) < bpe.vocab_size <= 120
    char = CharTokenizer.train(transcripts)
    bpe_len = char_len = 0
    for text in transcripts:
        ids = bpe.encode(text)
        assert min(ids) >= 4 and max(ids) < bpe.vocab_size
        assert bpe.decode(ids) == text
        bpe_len += len(ids)
        char_len += len(char.encode(text))
    assert bpe_len < 0.6 * char_len  # merges make targets much shorter than characters


def test_decode_drops_pad_sos_eos(transcripts, bpe):
    for tok in (CharTokenizer.train(transcripts), bpe):
        ids = tok.encode("THREE SEVEN ZERO")
        assert tok.decode([SOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == "THREE SEVEN ZERO"
        with pytest.raises(ValueError, match="out of range"):
            tok.decode([tok.vocab_size])


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_unknown_characters(kind, transcripts):
    tok = build_tokenizer(DataConfig(tokenizer=kind, bpe_vocab_size=120), transcripts)
    with pytest.raises(UnknownCharactersError, match="'Q'") as err:
        tok.encode("QUIET ZERO")  # no Q in these transcripts
    assert err.value.characters == {"Q"}
    ids = tok.encode("QUIET ZERO", strict=False)
    assert UNK_ID in ids and tok.unknown_counts["Q"] == 1
    assert tok.decode(ids).startswith(UNK_SURFACE) and tok.decode(ids).endswith("ZERO")
    assert tok.unknown_characters("QUIET ZERO!") == {"Q", "!"}


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_state_dict_round_trip_through_a_checkpoint(kind, transcripts, tmp_path):
    tok = build_tokenizer(DataConfig(tokenizer=kind, bpe_vocab_size=120), transcripts)
    torch.save({"tokenizer": tok.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["tokenizer"]
    restored = tokenizer_from_state_dict(state)
    assert type(restored) is type(tok) and restored.vocab_size == tok.vocab_size
    for text in transcripts[:20]:
        assert restored.encode(text) == tok.encode(text)


def test_bad_requests_are_clear_errors(transcripts):
    with pytest.raises(ValueError, match="vocab size 10"):
        BPETokenizer.train(transcripts, vocab_size=10)  # fewer than the characters
    with pytest.raises(ValueError, match="'wordpiece'"):
        build_tokenizer(DataConfig(tokenizer="wordpiece"), transcripts)  # bypassing from_dict's check
    with pytest.raises(ValueError, match="'spm'"):
        tokenizer_from_state_dict({"type": "spm"})
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.train(["", ""])

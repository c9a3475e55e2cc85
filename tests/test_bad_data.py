"""Files a real corpus or a shared model can contain, as a new user would meet them: audio with
NaN samples, a FLAC cut in the middle, a transcript line that is not UTF-8, and a checkpoint
whose unpickling runs code. None of them may stop a run, poison the statistics or run code."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from helpers import LAS_RECIPE as RECIPE
from helpers import SHARED_DATA, TINY, prepare_tiny_demo, require_shared_data, subprocess_env, tiny_valid

from asr.cli import average, check, evaluate, transcribe
from asr.checkpoints.io import CheckpointError, load_checkpoint
from asr.data import report as reasons
from asr.data.batching import collate
from asr.data.dataset import SpeechDataset, compute_global_stats
from asr.data.librispeech import read_subset
from asr.data.report import DataError, SkipReport
from asr.data.tokenizer import CharTokenizer
from asr.cli.train import main as train_main
from asr.training.state import rng_state, set_rng_state
from features.audio import AudioError, NonFiniteAudioError, load_audio
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline

DEV = SHARED_DATA / "fsdd_connected" / "LibriSpeech" / "fsdd-dev" / "9000" / "1"
NAN_ID, CUT_ID = "9000-1-9901", "9000-1-9902"


def write_nan_wav(path: Path, source: Path) -> None:
    """A float WAV of ``source``'s speech with 100 NaN samples in it (its header is fine)."""
    audio, rate = soundfile.read(str(source), dtype="float32")
    audio[1000:1100] = np.nan
    soundfile.write(str(path), audio, rate, subtype="FLOAT")


def write_cut_flac(path: Path, source: Path) -> None:
    """``source`` cut in the middle: its header reads, its samples do not."""
    data = source.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert soundfile.info(str(path)).frames > 0


def make_corpus(root: Path, good: int = 12, bad: bool = True, bad_line: bool = False) -> Path:
    """A LibriSpeech-layout copy of ``good`` dev utterances, plus (``bad``) a NaN WAV and a cut FLAC,
    plus (``bad_line``) a transcript line that is not UTF-8. Returns the subset folder."""
    folder = root / "subset" / "9000" / "1"
    folder.mkdir(parents=True)
    lines = (require_shared_data(DEV) / "9000-1.trans.txt").read_text().splitlines()[:good]
    for line in lines:
        shutil.copyfile(DEV / f"{line.split()[0]}.flac", folder / f"{line.split()[0]}.flac")
    raw = [line.encode() for line in lines]
    if bad:
        first = DEV / f"{lines[0].split()[0]}.flac"
        write_nan_wav(folder / f"{NAN_ID}.wav", first)
        write_cut_flac(folder / f"{CUT_ID}.flac", first)
        text = lines[0].split(" ", 1)[1].encode()
        raw += [NAN_ID.encode() + b" " + text, CUT_ID.encode() + b" " + text]
    if bad_line:
        raw[3] = raw[3] + b" \xff\xfe"
    (folder / "9000-1.trans.txt").write_bytes(b"\n".join(raw) + b"\n")
    return root / "subset"


# ---------------------------------------------------------------- where audio is read


def test_load_audio_names_nan_samples_and_damaged_files(tmp_path):
    first = require_shared_data(DEV) / "9000-1-0000.flac"
    write_nan_wav(tmp_path / "nan.wav", first)
    write_cut_flac(tmp_path / "cut.flac", first)
    with pytest.raises(NonFiniteAudioError, match=r"nan\.wav: 100 of \d+ samples are NaN"):
        load_audio(tmp_path / "nan.wav")
    with pytest.raises(AudioError, match=r"cut\.flac") as caught:
        load_audio(tmp_path / "cut.flac")
    assert caught.value.reason == reasons.UNDECODABLE_AUDIO
    with pytest.raises(NonFiniteAudioError):  # in-memory waveforms too
        FeaturePipeline(FeatureConfig()).from_waveform(torch.full((1, 16000), float("nan")), 16000)


def test_a_batch_loses_only_its_bad_items_and_says_which(tmp_path):
    utterances = read_subset(make_corpus(tmp_path, good=3), cache_dir=tmp_path / "cache")
    tokenizer = CharTokenizer.train(u.text for u in utterances)
    dataset = SpeechDataset(utterances, FeaturePipeline(FeatureConfig(mvn="utterance")), tokenizer, train=True)
    batch = collate([dataset[i] for i in range(len(dataset))])
    assert batch.ids == [u.id for u in utterances[:3]]
    assert torch.isfinite(batch.features).all()
    assert [s.reason for s in batch.skipped] == [reasons.NONFINITE_AUDIO, reasons.UNDECODABLE_AUDIO]
    assert f"{NAN_ID}.wav" in batch.skipped[0].message and f"{CUT_ID}.flac" in batch.skipped[1].message
    empty = collate([dataset[3], dataset[4]])  # nothing left: no rows, both skips kept
    assert len(empty) == 0 and len(empty.skipped) == 2

    strict = SpeechDataset(utterances, dataset.pipeline, tokenizer, strict=True)
    with pytest.raises(DataError, match=f"{NAN_ID}.wav"):
        strict[3]


@pytest.mark.slow  # DataLoader worker processes
def test_global_statistics_never_see_a_bad_frame(tmp_path):
    utterances = read_subset(make_corpus(tmp_path, good=4), cache_dir=tmp_path / "cache")
    clean = FeaturePipeline(FeatureConfig(mvn="global"))
    compute_global_stats(utterances[:4], clean)
    poisoned = FeaturePipeline(FeatureConfig(mvn="global"))
    report = SkipReport()
    compute_global_stats(utterances, poisoned, jobs=2, report=report)
    # Exactly the statistics of the good files: the bad ones added nothing.
    assert poisoned.stats.count == clean.stats.count
    assert torch.equal(poisoned.stats.sum, clean.stats.sum)
    assert torch.isfinite(poisoned.stats.std).all()
    assert report.counts() == {reasons.NONFINITE_AUDIO: 1, reasons.UNDECODABLE_AUDIO: 1}
    with pytest.raises(DataError, match=f"{NAN_ID}.wav"):
        compute_global_stats(utterances, FeaturePipeline(FeatureConfig(mvn="global")), report=SkipReport(strict=True))


# ---------------------------------------------------------------- training, evaluation, transcription


@pytest.fixture(scope="module")
def run_on_bad_data(tmp_path_factory):
    """A tiny LAS trained for two epochs on a corpus with a NaN WAV, a cut FLAC and a bad
    transcript line among good files, with global MVN and a DataLoader worker."""
    tmp = tmp_path_factory.mktemp("bad")
    corpus = make_corpus(tmp, bad_line=True)
    exp = tmp / "exp"
    prepare_tiny_demo(f"data.cache_dir={tmp / 'cache'}")
    args = [
        str(RECIPE), *TINY, f"exp_dir={exp}", f"data.dev=[{tiny_valid(tmp)}]", f"data.train=[{corpus}]",
        "features.mvn=global", "data.num_workers=1", "train.max_epochs=2", f"data.cache_dir={tmp / 'cache'}",
    ]
    code = train_main(args)
    return code, exp, corpus


@pytest.mark.slow
def test_training_goes_on_past_bad_files_and_counts_them_every_epoch(run_on_bad_data):
    code, exp, corpus = run_on_bad_data
    assert code == 0
    log = (exp / "train.log").read_text()
    # The reader lost one transcript line (and so its audio file has no transcript); the rest is read.
    assert f"{corpus}/9000/1/9000-1.trans.txt:4: line is not valid UTF-8" in log
    # Each epoch line counts the two items that failed where their samples were read, by reason.
    epoch_lines = [line for line in log.splitlines() if "training utterance(s) skipped" in line]
    assert len(epoch_lines) == 2
    for line in epoch_lines:
        assert "2 training utterance(s) skipped (1 audio that fails to decode, 1 non-finite samples)" in line
    assert log.count(f"{NAN_ID}.wav") >= 3 and log.count(f"{CUT_ID}.flac") >= 3  # statistics, then each epoch
    checkpoint = load_checkpoint(exp / "last.pt")
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())
    stats = checkpoint["features"]["stats"]
    assert torch.isfinite(stats["sum"]).all() and torch.isfinite(stats["sum_squares"]).all()
    assert checkpoint["training"]["progress"]["step"] > 0


@pytest.mark.slow
def test_strict_training_stops_at_the_bad_file_and_names_it(tiny_demo_corpus, tmp_path, capsys):
    corpus = make_corpus(tmp_path, good=6)
    args = [
        str(RECIPE), *TINY, f"exp_dir={tmp_path / 'exp'}", f"data.dev=[{tiny_valid(tmp_path)}]",
        f"data.train=[{corpus}]", "features.mvn=utterance", "data.strict=true", "train.max_epochs=1",
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "data.strict is true" in err and (f"{NAN_ID}.wav" in err or f"{CUT_ID}.flac" in err)


@pytest.mark.slow
def test_evaluation_scores_the_rest_and_lists_what_it_skipped(run_on_bad_data, tmp_path, capsys):
    _, exp, corpus = run_on_bad_data
    clean = make_corpus(tmp_path / "clean", bad=False)
    for data, out, extra in ((corpus, "bad", []), (clean, "clean", []), (corpus, "bad_vtln", ["--vtln-warps", "0.9,1.0"])):
        args = ["--checkpoint", str(exp / "last.pt"), "--data", str(data), "--out", str(tmp_path / out), *extra]
        assert evaluate.main(args) == 0
    printed = capsys.readouterr().out
    bad = json.loads((tmp_path / "bad" / "wer.json").read_text())
    assert bad["skips"]["by_reason"] == {
        reasons.MALFORMED_TRANSCRIPT: 1, reasons.MISSING_TRANSCRIPT: 1,
        reasons.NONFINITE_AUDIO: 1, reasons.UNDECODABLE_AUDIO: 1,
    }
    messages = " ".join(s["message"] for s in bad["skips"]["skipped"])
    assert f"{NAN_ID}.wav" in messages and f"{CUT_ID}.flac" in messages and "9000-1.trans.txt:4" in messages
    assert bad["skipped"] == 4 and bad["utterances"] == 11
    assert "4 (" in printed and "skipped)" in printed
    # Nothing else was lost: the other utterances are decoded exactly as in the clean copy.
    clean_hyps = dict(line.split(" ", 1) for line in (tmp_path / "clean" / "hyp.txt").read_text().splitlines())
    for hyp_file in ("bad", "bad_vtln"):
        hyps = dict(line.split(" ", 1) for line in (tmp_path / hyp_file / "hyp.txt").read_text().splitlines())
        assert set(hyps) == set(clean_hyps) - {"9000-1-0003"}
    bad_hyps = dict(line.split(" ", 1) for line in (tmp_path / "bad" / "hyp.txt").read_text().splitlines())
    assert all(bad_hyps[i] == clean_hyps[i] for i in bad_hyps)
    vtln = json.loads((tmp_path / "bad_vtln" / "wer.json").read_text())
    assert vtln["skipped"] == 4 and vtln["skips"]["by_reason"][reasons.NONFINITE_AUDIO] == 1


@pytest.mark.slow
def test_transcribe_names_the_bad_files_and_transcribes_the_others(run_on_bad_data, capsys):
    _, exp, corpus = run_on_bad_data
    folder = corpus / "9000" / "1"
    good = folder / "9000-1-0000.flac"
    assert transcribe.main([str(exp / "last.pt"), str(good)]) == 0
    alone = capsys.readouterr().out
    files = [str(folder / f"{NAN_ID}.wav"), str(good), str(folder / f"{CUT_ID}.flac")]
    assert transcribe.main([str(exp / "last.pt"), *files]) == 1
    captured = capsys.readouterr()
    assert captured.out == alone
    assert f"{NAN_ID}.wav" in captured.err and reasons.NONFINITE_AUDIO in captured.err
    assert f"{CUT_ID}.flac" in captured.err and reasons.UNDECODABLE_AUDIO in captured.err
    assert "2 (" in captured.err and "of 3 files skipped" in captured.err


# ---------------------------------------------------------------- checkpoints that would run code


class _Payload:
    """Unpickling this calls os.system: it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def write_malicious(path: Path, marker: Path, template: dict) -> None:
    """A checkpoint shaped like ours whose weights unpickle into a shell command."""
    torch.save({**template, "model": {"weight": _Payload(marker)}}, path)


@pytest.mark.slow
def test_no_entry_point_runs_code_from_a_checkpoint(run_on_bad_data, tiny_demo_corpus, tmp_path, capsys):
    _, exp, corpus = run_on_bad_data
    marker = tmp_path / "marker"
    template = load_checkpoint(exp / "last.pt")
    evil = tmp_path / "evil.pt"
    write_malicious(evil, marker, template)
    # The file really is malicious: the unsafe loader runs it.
    torch.load(evil, weights_only=False)
    assert marker.exists()
    marker.unlink()

    def refused(run) -> str:
        with pytest.raises(SystemExit) as exit_info:
            code = run()
            raise SystemExit(code)
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    wav = str(corpus / "9000" / "1" / "9000-1-0000.flac")
    assert "evil.pt" in refused(lambda: transcribe.main([str(evil), wav]))
    assert "evil.pt" in refused(lambda: evaluate.main(["--checkpoint", str(evil), "--data", str(corpus)]))
    assert "evil.pt" in refused(lambda: evaluate.main(["--checkpoint", str(evil), "--split", "dev"]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copyfile(exp / "epoch1.pt", run_dir / "epoch1.pt")
    write_malicious(run_dir / "epoch2.pt", marker, template)
    assert "epoch2.pt" in refused(lambda: average.main([str(run_dir), "--last", "2"]))
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    write_malicious(resumed / "last.pt", marker, template)
    args = [str(RECIPE), *TINY, f"exp_dir={resumed}", f"data.dev=[{tiny_valid(tmp_path)}]", "--resume"]
    assert "last.pt" in refused(lambda: train_main(args))
    assert not marker.exists()
    from asr.cli import checkpoint as checkpoint_cli

    assert "evil.pt" in refused(lambda: checkpoint_cli.main(["convert", str(evil), str(tmp_path / "converted.pt")]))
    assert not marker.exists() and not (tmp_path / "converted.pt").exists()
    with pytest.raises(CheckpointError, match="refused to load"):
        load_checkpoint(evil)
    assert not marker.exists()


@pytest.mark.slow
def test_an_old_last_pt_is_refused_until_converted_and_converting_runs_no_code(run_on_bad_data, tmp_path, capsys):
    _, exp, _ = run_on_bad_data
    state = load_checkpoint(exp / "last.pt")
    # Format 1 kept numpy's RNG state as numpy's own tuple, and Python's as a tuple.
    import random

    np.random.seed(123)
    random.seed(7)
    old_numpy, old_python = np.random.get_state(), random.getstate()
    state["training"]["rng"] = {"python": old_python, "numpy": old_numpy, "torch": torch.get_rng_state()}
    state["format_version"] = 1
    old = tmp_path / "last.pt"
    torch.save(state, old)
    with pytest.raises(CheckpointError, match=r"python -m asr\.checkpoint convert "):
        load_checkpoint(old)

    command = [sys.executable, "-m", "asr.checkpoint", "convert", str(old), str(tmp_path / "new.pt")]
    env = subprocess_env()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    # An existing target that is not the source is replaced only with --overwrite.
    before = (tmp_path / "new.pt").read_bytes()
    again = subprocess.run(command, capture_output=True, text=True, env=env)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--overwrite" in again.stderr, again.stderr
    assert (tmp_path / "new.pt").read_bytes() == before
    converted = load_checkpoint(tmp_path / "new.pt")
    assert converted["format_version"] == 2
    # The RNG state survives the conversion: restoring it gives the same draws as the original.
    np.random.seed(0)
    random.seed(0)
    set_rng_state(converted["training"]["rng"])
    draws = (np.random.rand(3).tolist(), random.random())
    np.random.set_state(old_numpy)
    random.setstate(old_python)
    assert draws == (np.random.rand(3).tolist(), random.random())
    for name, tensor in state["model"].items():
        assert torch.equal(converted["model"][name], tensor)


def test_rng_state_round_trips_through_a_safe_checkpoint(tmp_path):
    import random

    from asr.checkpoints.io import save_checkpoint

    np.random.seed(5)
    random.seed(5)
    torch.manual_seed(5)
    save_checkpoint(tmp_path / "c.pt", {"config": {}, "model": {}, "training": {"rng": rng_state()}})
    expected = (np.random.rand(2).tolist(), random.random(), torch.rand(2))
    set_rng_state(load_checkpoint(tmp_path / "c.pt")["training"]["rng"])
    got = (np.random.rand(2).tolist(), random.random(), torch.rand(2))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])
    with pytest.raises(CheckpointError, match=r"checkpoint\['extra'\].*numpy"):
        save_checkpoint(tmp_path / "d.pt", {"config": {}, "model": {}, "extra": np.zeros(2)})
    assert not (tmp_path / "d.pt").exists()


# ---------------------------------------------------------------- the corpus checker


@pytest.mark.slow  # DataLoader worker processes
def test_the_checker_finds_before_training_what_training_would_skip(tiny_demo_corpus, tmp_path, capsys):
    corpus = make_corpus(tmp_path, good=5, bad_line=True)
    out = tmp_path / "folder.json"
    assert check.main([str(corpus), "--jobs", "1", "--out", str(out)]) == 1
    written = json.loads(out.read_text())
    assert written["checked"] == {"sources": [str(corpus)]}  # what was checked, so another check is not replaced
    report = written["reports"][str(corpus)]
    assert report["by_reason"] == {
        reasons.MALFORMED_TRANSCRIPT: 1, reasons.MISSING_TRANSCRIPT: 1,
        reasons.NONFINITE_AUDIO: 1, reasons.UNDECODABLE_AUDIO: 1,
    }
    messages = [s["message"] for s in report["skipped"]]
    assert any(f"{NAN_ID}.wav" in m for m in messages) and any(f"{CUT_ID}.flac" in m for m in messages)
    assert any("9000-1.trans.txt:4" in m for m in messages)
    printed = capsys.readouterr().out
    assert "4 utterance(s) would be skipped" in printed and f"{CUT_ID}.flac" in printed

    # A recipe: every split, with training's own filters (the tokenizer, the duration limits).
    recipe_out = tmp_path / "recipe.json"
    args = [str(RECIPE), *TINY, f"data.train=[{corpus}]", f"data.dev=[{tiny_valid(tmp_path)}]",
            f"exp_dir={tmp_path / 'exp'}", "data.max_duration=3.0", "--jobs", "0", "--out", str(recipe_out)]
    assert check.main(args) == 1
    by_split = json.loads(recipe_out.read_text())["reports"]
    train = by_split["train"]["by_reason"]
    assert train[reasons.NONFINITE_AUDIO] == 1 and train[reasons.UNDECODABLE_AUDIO] == 1
    assert train[reasons.TOO_LONG] >= 1  # data.max_duration applies to the training split only
    assert by_split["dev"]["count"] == 0 and not (tmp_path / "exp" / "last.pt").exists()

    clean = make_corpus(tmp_path / "clean", good=3, bad=False)
    assert check.main([str(clean), "--jobs", "0", "--out", str(tmp_path / "clean.json")]) == 0
    assert check.main([str(tmp_path / "no-such-folder")]) == 2


def test_a_truncated_wav_is_skipped_in_training_and_decoded_with_a_warning_elsewhere(tmp_path, caplog):
    """issue 81: a WAV whose header promises more samples than the file holds was decoded without a word."""
    import logging

    from asr.data.dataset import utterance_features
    from asr.data.utterance import Utterance
    from features.audio import TruncatedAudioError

    source = require_shared_data(SHARED_DATA / "fsdd" / "recordings") / "0_george_0.wav"
    whole = soundfile.read(str(source), dtype="float32")[0]
    data = source.read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) // 2])  # a copy that stopped half way
    with pytest.raises(TruncatedAudioError, match=rf"{cut} is truncated: its header promises {len(whole)} samples, "
                                                   rf"the file holds \d+") as caught:
        load_audio(cut, truncated="refuse")
    assert caught.value.reason == reasons.TRUNCATED_AUDIO
    with caplog.at_level(logging.WARNING, logger="features.audio"):
        waveform, _ = load_audio(cut)
        load_audio(cut)
    assert 0 < waveform.shape[1] < len(whole)
    assert [r.getMessage() for r in caplog.records if str(cut) in r.getMessage()] == [
        f"audio file {cut} is truncated: its header promises {len(whole)} samples, the file holds "
        f"{waveform.shape[1]}; decoding what is there"]  # once per file, however often it is read
    caplog.clear()
    load_audio(source)
    assert not caplog.records  # a whole file: not a word

    utterance = Utterance("cut", cut, "ZERO", len(whole) / 8000, "george")
    tokenizer = CharTokenizer.train(["ZERO"])
    training = SpeechDataset([utterance], FeaturePipeline(FeatureConfig(sample_rate=8000)), tokenizer, train=True)
    item = training[0]
    assert item["skip"].reason == reasons.TRUNCATED_AUDIO and str(cut) in item["skip"].message
    # transcription and evaluation read it through the same function, outside training: decoded
    assert utterance_features(utterance, training.pipeline).shape[0] > 0

"""The inference entry points as a user runs them: evaluate, transcribe and average.

Two checkpoints: an untrained tiny LAS built here in the real checkpoint format
(80-dim fbank with global MVN, characters; fast, for the file formats, counts
and error paths on 16 kHz LibriVox speech), and a tiny LAS trained for two
epochs on real FSDD audio through ``asr.train`` (for beam search, batching,
averaging and a checkpoint the trainer wrote)."""

import argparse
import dataclasses
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import tiny_run

from asr.checkpoints.io import CheckpointError, load_checkpoint, save_checkpoint
from asr.cli import average, evaluate, options, transcribe
from asr.cli.train import main as train_main
from asr.data.dataset import compute_global_stats
from asr.data.librispeech import read_subset
from asr.data.tokenizer import CharTokenizer
from asr.data.utterance import InMemoryAudio, Utterance
from asr.decoding import DecodingOptions
from asr.experiment import ExperimentConfig, experiment_config_to_dict
from asr.inference import (
    AdaptationSettings, DecodeSettings, SelfTraining, VTLNSearch, load_recogniser, parse_warps, settings_tag,
    transcribe_speakers,
)
from asr.inference.segmentation import plan_pieces, read_piece, recording_levels
from asr.models.attention import AttentionConfig
from asr.models.las import LASConfig
from asr.models.listener import ListenerConfig
from asr.models.pruning import parse_pruning
from asr.models.registry import build_model
from asr.models.speller import SpellerConfig
from features.audio import AudioError, load_audio
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline


def decode_settings(argv: list[str]) -> DecodeSettings:
    """The settings the shared decoding options give (asr.cli.options), as asr.evaluate reads them."""
    parser = argparse.ArgumentParser()
    options.add_decode_arguments(parser)
    return options.decode_settings(parser.parse_args(argv))


def file_utterances(paths) -> list[Utterance]:
    """Files as the utterances of one speaker, as asr.transcribe takes them."""
    found = []
    for path in paths:
        waveform, rate = load_audio(path)
        found.append(Utterance(str(path), path, "", waveform.shape[-1] / rate, "files"))
    return found


@pytest.fixture(scope="module")
def untrained(tmp_path_factory, librivox_mini) -> Path:
    """An untrained tiny LAS checkpoint in the trainer's format, featurising as in a LibriSpeech recipe."""
    utterances = read_subset(librivox_mini)
    features = FeatureConfig(kind="fbank", num_mel_bins=80, mvn="global")
    pipeline = FeaturePipeline(features)
    compute_global_stats(utterances, pipeline)
    tokenizer = CharTokenizer.train(u.text for u in utterances)
    model_config = LASConfig(
        listener=ListenerConfig(hidden_size=8, num_layers=2, pyramid_layers=1),
        attention=AttentionConfig(type="content", dim=8),
        speller=SpellerConfig(embedding_dim=8, hidden_size=8, num_layers=1),
        ctc_weight=0.3,
    )
    config = ExperimentConfig(exp_dir="unused", features=features, model=model_config)
    torch.manual_seed(0)
    model = build_model(model_config, pipeline.feature_dim, tokenizer)
    path = tmp_path_factory.mktemp("untrained") / "model.pt"
    save_checkpoint(
        path,
        {
            "config": experiment_config_to_dict(config),
            "model": model.state_dict(),
            "tokenizer": tokenizer.state_dict(),
            "features": pipeline.state_dict(),
        },
    )
    return path


@pytest.fixture(scope="module")
def trained(tiny_demo_corpus, tmp_path_factory) -> tuple[Path, Path]:
    """(experiment folder, validation folder) of a 2-epoch tiny LAS run on real connected digits."""
    tmp = tmp_path_factory.mktemp("trained")
    assert train_main(tiny_run(tmp, "train.max_epochs=2", "train.keep_last=2")) == 0
    return tmp / "exp", tmp / "valid"


def _alignment_totals(text: str) -> list[int]:
    """Sum of the per-utterance S, D, I, N headers of alignment.txt."""
    totals = [0, 0, 0, 0]
    for match in re.finditer(r"^\S+  S=(\d+) D=(\d+) I=(\d+) N=(\d+)$", text, flags=re.MULTILINE):
        if not match.group(0).startswith("TOTAL"):
            totals = [t + int(v) for t, v in zip(totals, match.groups())]
    return totals


# ---------------------------------------------------------------- untrained checkpoint: formats and errors


def test_recogniser_is_rebuilt_from_the_checkpoint_alone(untrained, librivox_mini):
    recogniser = load_recogniser(untrained)
    state = load_checkpoint(untrained)
    assert not recogniser.model.training
    assert recogniser.tokenizer.state_dict() == state["tokenizer"]
    # Same features as the pipeline the checkpoint was made with, global MVN statistics included.
    utterances = read_subset(librivox_mini)
    original = FeaturePipeline(FeatureConfig(kind="fbank", num_mel_bins=80, mvn="global"))
    compute_global_stats(utterances, original)
    feats = recogniser.pipeline.from_file(utterances[1].audio)
    assert feats.shape[1] == 80
    torch.testing.assert_close(feats, original.from_file(utterances[1].audio))
    for name, tensor in recogniser.model.state_dict().items():
        assert torch.equal(tensor, state["model"][name]), name


@pytest.mark.slow  # decodes with a model; the quick tier stays under a minute
def test_a_long_recording_is_decoded_as_its_pieces_cut_at_pauses(untrained, librivox_mini, caplog):
    recogniser = load_recogniser(untrained)
    utterances = sorted(read_subset(librivox_mini), key=lambda u: u.duration)
    short, long = utterances[0], utterances[-1]
    seconds = short.duration + 0.2  # the short one is decoded whole, the long one in pieces
    plan = plan_pieces(recording_levels(long.audio)[0], seconds)
    assert len(plan) >= 2
    options = DecodingOptions(segment_seconds=seconds)

    with caplog.at_level(logging.INFO, logger="asr.inference.recogniser"):
        found = recogniser.decode([long, short], options, score=True, batch_size=1)  # pieces one at a time
    assert f"{long.id}: {long.duration:.1f} s, longer than {seconds:.1f} s, decoded in {len(plan)} pieces of at most" in caplog.text
    each = [
        recogniser.decode([Utterance("piece", InMemoryAudio(*read_piece(long.audio, piece)), "", 0.0, "x")],
                              DecodingOptions(segment_seconds=0), score=True)
        for piece in plan
    ]
    assert found.texts[0] == " ".join(piece.texts[0] for piece in each if piece.texts[0])
    assert found.scores[0] == pytest.approx(sum(piece.scores[0] for piece in each), rel=1e-5)
    # An utterance no longer than the pieces is decoded whole, as without segmenting.
    whole = recogniser.decode([short], DecodingOptions(segment_seconds=0), score=True)
    assert found.texts[1] == whole.texts[0]
    assert found.scores[1] == pytest.approx(whole.scores[0], rel=1e-5)
    # Pieces decoded together give what they give one at a time (up to float rounding).
    batched = recogniser.decode([long], options, score=True, batch_size=16)
    assert batched.scores[0] == pytest.approx(found.scores[0], rel=1e-4)


@pytest.mark.slow  # decodes with a model; the quick tier stays under a minute
def test_by_default_recordings_longer_than_the_training_utterances_are_cut(untrained, librivox_mini, tmp_path):
    """Recordings longer than the checkpoint's longest training utterance are cut, in pieces of at most its
    mean one; one written before these were recorded falls back to its recipe's data.max_duration for both;
    segment_seconds=S sets both; 0 decodes every recording whole."""
    old = load_recogniser(untrained)
    limit = ExperimentConfig().data.max_duration
    assert old.long_form(DecodingOptions()) == (limit, limit)
    utterances = sorted(read_subset(librivox_mini), key=lambda u: u.duration)
    longest, mean = utterances[-1].duration - 0.5, utterances[0].duration + 0.2
    state = load_checkpoint(untrained)
    save_checkpoint(tmp_path / "new.pt", {**state, "longest_utterance_seconds": longest, "mean_utterance_seconds": mean})
    recogniser = load_recogniser(tmp_path / "new.pt")
    assert recogniser.long_form(DecodingOptions()) == (longest, mean)
    assert recogniser.long_form(DecodingOptions(segment_seconds=3.0)) == (3.0, 3.0)
    assert recogniser.long_form(DecodingOptions(segment_seconds=0)) is None
    long = utterances[-1]
    default = recogniser.decode([long], DecodingOptions(), score=True)
    pieces = [
        recogniser.decode([Utterance("piece", InMemoryAudio(*read_piece(long.audio, piece)), "", 0.0, "x")],
                              DecodingOptions(segment_seconds=0), score=True)
        for piece in plan_pieces(recording_levels(long.audio)[0], mean)
    ]
    assert default.scores[0] == pytest.approx(sum(piece.scores[0] for piece in pieces), rel=1e-5)
    off = recogniser.decode([long], DecodingOptions(segment_seconds=0), score=True)
    assert off.texts == recogniser.transcribe_features([recogniser.features(long)])
    assert off.scores != default.scores
    # The second longest is not longer than the longest training utterance: decoded whole.
    second = recogniser.decode([utterances[-2]], DecodingOptions(), score=True)
    assert second.scores == recogniser.decode([utterances[-2]], DecodingOptions(segment_seconds=0), score=True).scores


def test_transcribe_says_when_it_cuts_a_recording(untrained, librivox_mini, capsys, caplog):
    """(The CLI logs the message at INFO while showing only warnings of the rest: on stderr for a user.)"""
    long = max(read_subset(librivox_mini), key=lambda u: u.duration)
    assert transcribe.main([str(untrained), str(long.audio), "--segment-seconds", "2"]) == 0
    assert f"{long.audio}: {long.duration:.1f} s, longer than 2.0 s, decoded in" in caplog.text
    assert capsys.readouterr().out.startswith(f"{long.audio}\t")
    caplog.clear()
    assert transcribe.main([str(untrained), str(long.audio), "--segment-seconds", "0"]) == 0
    assert "pieces" not in caplog.text


@pytest.mark.slow  # decodes with a model; the quick tier stays under a minute
def test_evaluate_cuts_long_recordings_says_so_and_scores_the_joined_pieces(untrained, librivox_mini, tmp_path, caplog):
    out = tmp_path / "eval"
    args = ["--checkpoint", str(untrained), "--data", str(librivox_mini), "--out", str(out), "--segment-seconds", "3"]
    with caplog.at_level(logging.INFO, logger="asr.inference.recogniser"):
        assert evaluate.main(args) == 0
    utterances = read_subset(librivox_mini)
    long = [u for u in utterances if u.duration > 3]
    assert long and all(f"{u.id}: {u.duration:.1f} s, longer than 3.0 s, decoded in" in caplog.text for u in long)
    expected = load_recogniser(untrained).decode(utterances, DecodingOptions(segment_seconds=3.0)).texts
    hyps = dict((line.split(" ", 1) + [""])[:2] for line in (out / "hyp.txt").read_text().splitlines())
    assert hyps == {u.id: text for u, text in zip(utterances, expected)}
    assert json.loads((out / "wer.json").read_text())["settings"]["decoding"]["segment_seconds"] == 3.0


def test_evaluate_writes_consistent_reports_on_librispeech_layout(untrained, librivox_mini, capsys):
    assert evaluate.main(["--checkpoint", str(untrained), "--data", str(librivox_mini)]) == 0
    out = untrained.parent / "eval_model_test-mini"  # the default: beside model.pt, named after it and the data
    printed = capsys.readouterr().out
    result = json.loads((out / "wer.json").read_text())
    refs = [line.split(" ", 1) for line in (out / "ref.txt").read_text().splitlines()]
    hyps = [line.split(" ", 1) + [""] for line in (out / "hyp.txt").read_text().splitlines()]
    ids = [u.id for u in read_subset(librivox_mini)]
    assert [r[0] for r in refs] == [h[0] for h in hyps] == sorted(ids)
    assert result["utterances"] == len(ids) == 5 and result["skipped"] == 0
    expected_refs = {u.id: u.text for u in read_subset(librivox_mini)}
    assert {i: t for i, t in refs} == expected_refs
    s, d, i, n = (result[k] for k in ("substitutions", "deletions", "insertions", "ref_words"))
    assert n == sum(len(t.split()) for t in expected_refs.values())
    assert result["wer_percent"] == pytest.approx(100 * (s + d + i) / n)  # in percent, as the key says
    assert "wer" not in result and "cer" not in result  # no second unit beside it
    assert s + d + result["hits"] == n
    alignment = (out / "alignment.txt").read_text()
    assert alignment.count("\nREF: ") + alignment.startswith("REF: ") == 5
    assert _alignment_totals(alignment) == [s, d, i, n]
    assert f"WER {result['wer_percent']:.2f}% (S={s} D={d} I={i} N={n})" in printed
    assert "on 5 utterances" in printed and "real-time factor" in printed
    assert result["rtf"] == pytest.approx(result["decode_seconds"] / result["audio_seconds"])


# ---------------------------------------------------------------- where evaluate writes by default


def test_the_default_folder_names_the_model_the_data_and_the_settings_not_at_their_default(tmp_path):
    settings = decode_settings(["--beam", "4", "--ctc-weight", "0.3"])
    assert settings_tag(settings) == "beam4_ctc0.3"
    exp = tmp_path / "exp" / "demo"
    assert evaluate.default_out([exp / "last.pt"], None, "test", decode_settings([])) == exp / "eval_last_test"
    assert evaluate.default_out([exp / "avg_last5.pt"], None, "test", settings) == exp / "eval_avg_last5_test_beam4_ctc0.3"
    manifest = str(tmp_path / "timit_supervisions_TEST.jsonl.gz")
    assert evaluate.default_out([exp / "last.pt"], manifest, None, settings).name == "eval_last_timit_supervisions_TEST_beam4_ctc0.3"
    ensemble = [tmp_path / "a" / "avg_last5.pt", tmp_path / "b" / "avg_last5.pt"]
    assert evaluate.default_out(ensemble, "data/dev/", None, settings) == tmp_path / "a" / "eval_ensemble2_avg_last5_dev_beam4_ctc0.3"
    # A default written out is the default; a batch size changes no transcript: neither is in the name.
    assert settings_tag(decode_settings(["--beam", "1", "--ctc-weight", "0", "--batch-size", "3"])) == ""


def test_every_setting_that_can_change_the_transcripts_changes_the_name():
    """One non-default value of each field, alone: each gives a name of its own, so no future option is left out."""
    changed = {
        "beam_size": 3, "ctc_weight": 0.5, "length_penalty": -0.5, "length_normalization": True, "max_len_ratio": 2.0,
        "min_len": 1, "max_len": 50, "ctc_candidates": 2, "coverage_weight": 0.1, "coverage_threshold": 0.7,
        "eos_threshold": 0.2, "ctc_greedy": True, "segment_seconds": 0.0,
    }
    assert set(changed) == {f.name for f in dataclasses.fields(DecodingOptions)}  # a new field: add it here
    variants = [DecodeSettings(DecodingOptions(**{name: value})) for name, value in changed.items()]
    variants += [DecodeSettings(DecodingOptions(segment_seconds=3.0)), DecodeSettings(vtln_warps=(0.9, 1.0, 1.1))]
    variants += [DecodeSettings(prune_layers=parse_pruning(["every_other"])), DecodeSettings(prune_layers=parse_pruning(["enc:0,2"]))]
    adapted = {"epochs": 1, "lr": 1e-3, "seed": 1, "parameters": "norms", "ctc_agreement": True}
    assert set(adapted) | {"rounds"} == {f.name for f in dataclasses.fields(AdaptationSettings)}
    variants += [DecodeSettings(adaptation=AdaptationSettings())]
    variants += [DecodeSettings(adaptation=AdaptationSettings(**{name: value})) for name, value in adapted.items()]
    tags = [settings_tag(v) for v in variants]
    assert "" not in tags and len(set(tags)) == len(tags), tags
    assert all(re.fullmatch(r"[\w.,+-]+", tag) for tag in tags), tags  # a plain folder name on every system


def _model_beside(untrained: Path, folder: Path, *names: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(untrained.read_bytes())
    return [folder / name for name in names]


@pytest.mark.slow  # decodes with a model; the quick tier stays under a minute
def test_evaluations_with_other_settings_or_checkpoints_keep_each_others_results(untrained, librivox_mini, tmp_path, capsys):
    last, averaged = _model_beside(untrained, tmp_path / "exp", "last.pt", "avg_last5.pt")
    data = ["--data", str(librivox_mini)]
    runs = {
        "eval_last_test-mini": ["--checkpoint", str(last), *data],
        "eval_last_test-mini_beam2_ctc0.3": ["--checkpoint", str(last), *data, "--beam", "2", "--ctc-weight", "0.3"],
        "eval_avg_last5_test-mini_beam2_ctc0.3": ["--checkpoint", str(averaged), *data, "--beam", "2", "--ctc-weight", "0.3"],
    }
    for folder, argv in runs.items():
        assert evaluate.main(argv) == 0
        assert capsys.readouterr().out.rstrip().endswith(f"results in {tmp_path / 'exp' / folder}")
    for folder, argv in runs.items():
        result = json.loads((tmp_path / "exp" / folder / "wer.json").read_text())
        record = json.loads((tmp_path / "exp" / folder / "evaluation.json").read_text())
        assert result["checkpoint"] == argv[1] and record["checkpoints"] == [argv[1]]
        assert result["beam"] == (2 if "beam2" in folder else 1) == record["settings"]["decoding"]["beam_size"]
        assert record["data"] == str(librivox_mini) and record["command"][3:] == argv
    # The same evaluation again (a default spelt out, another batch size) replaces its own results.
    before = (tmp_path / "exp" / "eval_last_test-mini" / "evaluation.json").stat().st_mtime_ns
    assert evaluate.main(runs["eval_last_test-mini"] + ["--beam", "1", "--batch-size", "2"]) == 0
    assert (tmp_path / "exp" / "eval_last_test-mini" / "evaluation.json").stat().st_mtime_ns > before
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == sorted(["avg_last5.pt", "last.pt", *runs])


@pytest.mark.slow  # decodes with a model; the quick tier stays under a minute
def test_a_default_folder_holding_another_evaluation_is_refused_naming_it(untrained, librivox_mini, tmp_path, capsys):
    (last,) = _model_beside(untrained, tmp_path / "exp", "last.pt")
    # Two data folders with one name: one default folder, two evaluations.
    other = tmp_path / "elsewhere" / librivox_mini.name
    shutil.copytree(librivox_mini, other)
    assert evaluate.main(["--checkpoint", str(last), "--data", str(librivox_mini)]) == 0
    folder = tmp_path / "exp" / "eval_last_test-mini"
    kept = (folder / "wer.json").read_text()
    with pytest.raises(SystemExit) as info:
        evaluate.main(["--checkpoint", str(last), "--data", str(other)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{folder} holds the results of another evaluation" in err
    assert f'data "{librivox_mini}", here "{other}"' in err and "--out" in err and "--overwrite" in err
    assert (folder / "wer.json").read_text() == kept  # untouched
    # Results that do not say what made them are another evaluation's too.
    (folder / "evaluation.json").unlink()
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(last), "--data", str(librivox_mini)])
    assert "without evaluation.json" in capsys.readouterr().err
    # --overwrite replaces them; --out writes where it is told, whatever is there.
    assert evaluate.main(["--checkpoint", str(last), "--data", str(other), "--overwrite"]) == 0
    assert json.loads((folder / "evaluation.json").read_text())["data"] == str(other)
    # --out follows the same rule: an earlier result folder of another evaluation is refused, unless --overwrite.
    chosen = tmp_path / "exp" / "eval_last_test-mini"
    kept = (chosen / "wer.json").read_text()
    given = ["--checkpoint", str(last), "--data", str(librivox_mini), "--out", str(chosen), "--beam", "2"]
    message = _one_line_error(capsys, lambda: evaluate.main(given))
    assert f"{chosen} holds the results of another evaluation" in message and "--overwrite" in message
    assert (chosen / "wer.json").read_text() == kept
    assert evaluate.main(given + ["--overwrite"]) == 0
    assert json.loads((chosen / "wer.json").read_text())["beam"] == 2
    assert evaluate.main(given) == 0  # the same evaluation again replaces its own
    assert evaluate.main(["--checkpoint", str(last), "--data", str(librivox_mini), "--out", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "wer.json").is_file()


def test_transcribe_prints_one_line_per_file_at_any_rate(untrained, fsdd_recordings, librivox_mini, capsys):
    files = [fsdd_recordings / "3_george_0.wav", librivox_mini / "9999" / "1" / "9999-1-0001.flac"]  # 8 kHz, 16 kHz
    assert transcribe.main([str(untrained), *map(str, files)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == list(map(str, files))
    assert all(line.count("\t") == 1 for line in lines)


def test_the_python_api_transcribes_files_and_arrays_as_the_command_line_does(untrained, fsdd_recordings, librivox_mini,
                                                                             capsys):
    """Issue 80: Recogniser.load(path).transcribe(files) with the command line's options, the same code."""
    from asr import Recogniser

    files = [fsdd_recordings / "3_george_0.wav", librivox_mini / "9999" / "1" / "9999-1-0001.flac"]  # 8 kHz, 16 kHz
    assert transcribe.main(["--checkpoint", str(untrained), *map(str, files), "--beam", "2", "--ctc-weight", "0.3"]) == 0
    printed = [line.split("\t", 1)[1] for line in capsys.readouterr().out.splitlines()]
    recogniser = Recogniser.load(str(untrained))
    texts = recogniser.transcribe([str(f) for f in files], beam=2, ctc_weight=0.3)
    assert texts == printed and len(texts) == 2
    # the options decide: greedy search finds what the library's greedy decoding finds
    greedy = recogniser.decode(file_utterances(files), DecodingOptions()).texts
    assert recogniser.transcribe(files) == greedy
    # arrays: samples at the model's rate, or (samples, rate) at any; one recording gives a list of one
    eight_khz, rate = load_audio(files[0])
    sixteen_khz, model_rate = load_audio(files[1])
    assert rate == 8000 and model_rate == recogniser.pipeline.config.sample_rate
    assert recogniser.transcribe([(eight_khz.numpy(), rate), sixteen_khz[0].numpy()]) == greedy
    assert recogniser.transcribe(str(files[1])) == greedy[1:]
    # a bad option or file is named
    with pytest.raises(ValueError, match="--beam: beam_size must be >= 1"):
        recogniser.transcribe(files, beam=0)
    with pytest.raises(ValueError, match="unknown decoding option 'beam_size'"):
        recogniser.transcribe(files, beam_size=2)
    with pytest.raises(AudioError, match="missing.wav"):
        recogniser.transcribe([files[0], files[0].parent / "missing.wav"])


def test_transcribe_takes_checkpoints_with_the_older_spellings_too(untrained, fsdd_recordings, capsys):
    """--checkpoint A [B] is the spelling of every command; a first positional checkpoint and --with still work."""
    wav = str(fsdd_recordings / "3_george_0.wav")
    spellings = [["--checkpoint", str(untrained), str(untrained), wav], [wav, "--checkpoint", str(untrained), str(untrained)],
                 [str(untrained), "--with", str(untrained), wav]]
    printed = []
    for argv in spellings:
        assert transcribe.main(argv) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0].startswith(f"{wav}\t") and printed == [printed[0]] * 3


def test_verbose_shows_which_code_computes_the_model(untrained, fsdd_recordings, capsys, monkeypatch):
    """--verbose names each LSTM's backend; a backend forced by the override is the one shown."""
    from asr.models.lnlstm import selection

    monkeypatch.setattr(selection, "_programmatic", "reference")
    wav = str(fsdd_recordings / "3_george_0.wav")
    assert transcribe.main([str(untrained), wav, "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "runtime: lnlstm_backend_override: reference" in err
    assert "runtime: lnlstm_backends: {'reference': ['listener.layers.0', 'listener.layers.1', 'speller.cells.0']}" in err
    assert transcribe.main([str(untrained), wav]) == 0
    assert "runtime:" not in capsys.readouterr().err


def test_transcribe_names_unreadable_and_missing_files_and_goes_on(untrained, tmp_path, capsys, fsdd_recordings):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"not audio at all")
    missing = tmp_path / "missing.flac"
    good = fsdd_recordings / "5_jackson_1.wav"
    assert transcribe.main([str(untrained), str(bad), str(good), str(missing)]) == 1
    captured = capsys.readouterr()
    err_lines = captured.err.splitlines()
    assert len(err_lines) == 3 and str(bad) in err_lines[0] and str(missing) in err_lines[1]
    assert "[missing audio file]" in err_lines[1]
    assert err_lines[2] == "2 (1 audio that fails to decode, 1 missing audio file) of 3 files skipped"
    assert captured.out.splitlines()[0].startswith(f"{good}\t")
    assert len(captured.out.splitlines()) == 1


def test_transcribe_with_nothing_it_could_use_exits_2(untrained, tmp_path, capsys):
    """Nothing transcribed is an input error (2, as every command's); a partial result above is 1."""
    missing = tmp_path / "missing.wav"
    assert transcribe.main(["--checkpoint", str(untrained), str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and str(missing) in captured.err.splitlines()[0]


def _one_line_error(capsys, run) -> str:
    """The error of a command given bad input: one line (no usage block), exit status 2."""
    with pytest.raises(SystemExit) as info:
        run()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_evaluate_errors_are_one_line_and_exit_2(untrained, tmp_path, capsys, librivox_mini):
    missing = tmp_path / "missing.pt"
    message = _one_line_error(capsys, lambda: evaluate.main(["--checkpoint", str(missing), "--data", str(librivox_mini)]))
    assert f"checkpoint not found: {missing}" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    message = _one_line_error(capsys, lambda: evaluate.main(["--checkpoint", str(untrained), "--data", str(empty)]))
    assert str(empty) in message and "no transcripts" in message
    message = _one_line_error(capsys, lambda: evaluate.main(["--checkpoint", str(untrained), "--data", str(tmp_path / "nope")]))
    assert str(tmp_path / "nope") in message
    # Transcripts whose audio is all missing: nothing usable, and the reason is counted.
    orphan = tmp_path / "orphan" / "1" / "2"
    orphan.mkdir(parents=True)
    (orphan / "1-2.trans.txt").write_text("1-2-0000 HELLO\n1-2-0001 WORLD\n")
    message = _one_line_error(capsys, lambda: evaluate.main(["--checkpoint", str(untrained), "--data", str(orphan.parents[1])]))
    assert "no usable utterances" in message and "2 transcript without audio" in message
    not_ours = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, not_ours)
    message = _one_line_error(capsys, lambda: evaluate.main(["--checkpoint", str(not_ours), "--data", str(librivox_mini)]))
    assert f"{not_ours} is not a checkpoint" in message
    message = _one_line_error(capsys, lambda: evaluate.main(["--checkpoint", str(untrained), "--data", str(librivox_mini), "--beam", "0"]))
    assert "--beam: beam_size must be >= 1" in message


def test_transcribe_missing_checkpoint_exits_2(tmp_path, capsys, fsdd_recordings):
    missing = tmp_path / "missing.pt"
    message = _one_line_error(capsys, lambda: transcribe.main([str(missing), str(fsdd_recordings / "0_george_0.wav")]))
    assert f"checkpoint not found: {missing}" in message


def test_checkpoint_that_does_not_fit_its_model_names_the_file(untrained, tmp_path, capsys, fsdd_recordings):
    state = load_checkpoint(untrained)
    state["model"].pop(next(k for k in state["model"] if k.endswith("weight")))  # a weight, not a buffer with a default
    broken = tmp_path / "broken.pt"
    save_checkpoint(broken, state)
    message = _one_line_error(capsys, lambda: transcribe.main([str(broken), str(fsdd_recordings / "0_george_0.wav")]))
    assert f"cannot rebuild a recogniser from {broken}" in message


# ---------------------------------------------------------------- a checkpoint written by the trainer


@pytest.mark.slow
def test_evaluate_greedy_and_beam_on_a_trained_checkpoint(trained, capsys):
    exp, valid = trained
    for beam in ("1", "3"):
        out = exp / f"eval_beam{beam}"  # a second evaluation into the first's folder is refused (not --overwrite)
        argv = ["--checkpoint", str(exp / "last.pt"), "--data", str(valid), "--out", str(out), "--beam", beam]
        assert evaluate.main(argv + ["--batch-size", "4"]) == 0
        result = json.loads((out / "wer.json").read_text())
        assert result["beam"] == int(beam) and result["utterances"] == 6
        assert len((out / "hyp.txt").read_text().splitlines()) == 6
        s, d, i, n = (result[k] for k in ("substitutions", "deletions", "insertions", "ref_words"))
        assert result["wer_percent"] == pytest.approx(100 * (s + d + i) / n)
        assert _alignment_totals((out / "alignment.txt").read_text()) == [s, d, i, n]
        # The by-length breakdown partitions the utterances and the errors.
        bins = result["by_length"]
        assert sum(b["utterances"] for b in bins) == 6
        assert [sum(b[k] for b in bins) for k in ("substitutions", "deletions", "insertions", "ref_words")] == [s, d, i, n]
        refs = dict(line.split(" ", 1) for line in (out / "ref.txt").read_text().splitlines())
        for b in bins:
            low, high = b["words"]
            assert b["utterances"] == sum(low <= len(r.split()) <= high for r in refs.values())
    printed = capsys.readouterr().out
    assert printed.count("real-time factor") == 2 and "by reference length" in printed


@pytest.mark.slow
def test_evaluate_a_split_of_the_recipe_in_the_checkpoint(trained, tmp_path):
    exp, valid = trained
    by_folder, by_split = tmp_path / "folder", tmp_path / "split"
    assert evaluate.main(["--checkpoint", str(exp / "last.pt"), "--data", str(valid), "--out", str(by_folder)]) == 0
    assert evaluate.main(["--checkpoint", str(exp / "last.pt"), "--split", "dev", "--out", str(by_split)]) == 0
    # The recipe's dev split is that same folder: the same utterances and transcripts.
    assert (by_split / "hyp.txt").read_text() == (by_folder / "hyp.txt").read_text()
    assert (by_split / "ref.txt").read_text() == (by_folder / "ref.txt").read_text()
    # The recipe names no test data: a clear error, not an empty score.
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(exp / "last.pt"), "--split", "test", "--out", str(tmp_path / "test")])


@pytest.mark.slow
def test_transcribe_matches_the_recogniser_and_batching_does_not_change_results(trained, capsys, fsdd_recordings):
    exp, _ = trained
    files = [fsdd_recordings / f"{d}_{s}_{t}.wav" for d, s, t in [(3, "george", 0), (7, "nicolas", 2), (1, "yweweler", 4)]]
    assert transcribe.main([str(exp / "last.pt"), *map(str, files)]) == 0
    printed = [line.split("\t", 1)[1] for line in capsys.readouterr().out.splitlines()]
    recogniser = load_recogniser(exp / "last.pt")
    assert recogniser.decode(file_utterances(files), batch_size=1).texts == printed
    assert recogniser.decode(file_utterances(files), batch_size=3).texts == printed  # padded together, same words


@pytest.mark.slow
def test_average_last_two_epochs_of_a_real_run(trained):
    exp, _ = trained
    assert average.main([str(exp), "--last", "2"]) == 0
    averaged = load_checkpoint(exp / "avg_last2.pt")
    first, second = load_checkpoint(exp / "epoch1.pt"), load_checkpoint(exp / "epoch2.pt")
    for name, tensor in averaged["model"].items():
        if tensor.is_floating_point():
            torch.testing.assert_close(tensor, (first["model"][name] + second["model"][name]) / 2)
    assert averaged["tokenizer"] == second["tokenizer"]
    load_recogniser(exp / "avg_last2.pt")  # a usable, self-contained checkpoint


# ---------------------------------------------------------------- ensembles and test-time VTLN


@pytest.mark.slow
def test_ensemble_of_two_checkpoints_evaluates_and_names_its_members(trained):
    exp, valid = trained
    members = [str(exp / "epoch1.pt"), str(exp / "last.pt")]
    assert evaluate.main(["--checkpoint", *members, "--data", str(valid)]) == 0
    result = json.loads((exp / "eval_ensemble2_epoch1+last_valid").joinpath("wer.json").read_text())  # default folder
    assert result["checkpoint"] == members and result["utterances"] == 6
    # One checkpoint given twice is that checkpoint: the mean of equal distributions.
    alone = load_recogniser(exp / "last.pt")
    twice = load_recogniser([exp / "last.pt", exp / "last.pt"])
    utterances = read_subset(valid)
    assert twice.decode(utterances).texts == alone.decode(utterances).texts


@pytest.mark.slow
def test_ensemble_members_must_share_tokenizer_and_features(trained, untrained):
    exp, _ = trained
    with pytest.raises(CheckpointError, match=rf"cannot decode {re.escape(str(untrained))} together with .*tokenizers differ"):
        load_recogniser([exp / "last.pt", untrained])


@pytest.mark.slow
def test_test_time_vtln_keeps_each_speakers_best_scored_warp(trained):
    exp, valid = trained
    recogniser = load_recogniser(exp / "last.pt")
    # Two made-up speakers of three utterances each.
    utterances = [dataclasses.replace(u, speaker="ab"[i % 2]) for i, u in enumerate(read_subset(valid))]
    warps = (0.9, 1.0, 1.1)
    result = transcribe_speakers(recogniser, utterances, VTLNSearch(warps))
    assert set(result.warps) == {"a", "b"}
    for speaker, chosen in result.warps.items():
        scores = result.warp_scores[speaker]
        assert list(scores) == list(warps) and chosen == max(scores, key=scores.get)
        own = [u for u in utterances if u.speaker == speaker]
        texts_alone = [t for u, t in zip(utterances, result.texts) if u.speaker == speaker]
        # Each speaker's choice is its own: the same without the other speaker, and the same as decoding
        # every utterance under the chosen warp.
        assert transcribe_speakers(recogniser, own, VTLNSearch(warps)).texts == texts_alone
        assert recogniser.decode(own, warp=chosen).texts == texts_alone
    # A single candidate of 1.0 is plain decoding.
    assert transcribe_speakers(recogniser, utterances, VTLNSearch((1.0,))).texts == recogniser.decode(utterances).texts


@pytest.mark.slow
def test_evaluate_with_vtln_writes_the_chosen_warps(trained, tmp_path):
    exp, valid = trained
    out = tmp_path / "vtln"
    argv = ["--checkpoint", str(exp / "last.pt"), "--data", str(valid), "--out", str(out), "--vtln-warps", "0.9:1.1:0.1"]
    assert evaluate.main(argv) == 0
    result = json.loads((out / "wer.json").read_text())
    assert list(result["vtln_warps"]) == ["9000"]  # the folder's one speaker
    assert list(result["vtln_scores"]["9000"]) == ["0.9", "1", "1.1"]
    scores = result["vtln_scores"]["9000"]
    assert result["vtln_warps"]["9000"] == float(max(scores, key=scores.get))


@pytest.mark.slow
def test_evaluate_with_speaker_adaptation_scores_every_round(trained, tmp_path, capsys):
    exp, valid = trained
    base = ["--checkpoint", str(exp / "last.pt"), "--data", str(valid)]
    assert evaluate.main(base + ["--out", str(tmp_path / "plain")]) == 0
    assert evaluate.main(base + ["--out", str(tmp_path / "adapted"), "--adapt-rounds", "2", "--adapt-epochs", "1"]) == 0
    plain = json.loads((tmp_path / "plain" / "wer.json").read_text())
    result = json.loads((tmp_path / "adapted" / "wer.json").read_text())
    adaptation = result["adaptation"]
    assert (adaptation["rounds"], adaptation["epochs"]) == (2, 1) and adaptation["warps"] == {"9000": 1.0}
    assert adaptation["ctc_agreement"] is False and adaptation["disagreed"] == 0  # the filter is off by default
    assert adaptation["seed"] == 0
    # Round 0 is plain decoding; the last round is what the hypotheses and the WER are.
    per_round = adaptation["wer_percent_per_round"]
    assert len(per_round) == 3
    assert per_round[0] == pytest.approx(plain["wer_percent"]) and per_round[2] == pytest.approx(result["wer_percent"])
    assert "WER before adaptation and after each round" in capsys.readouterr().out
    for bad, reason in ((["--adapt-rounds", "1", "--adapt-epochs", "0"], "at least one round and one epoch"),
                        (["--adapt-rounds", "1", "--adapt-lr", "-1"], "learning rate must be positive"),
                        (["--adapt-epochs", "2"], "--adapt-epochs needs --adapt-rounds")):
        with pytest.raises(SystemExit) as exit:
            evaluate.main(base + bad)
        err = capsys.readouterr().err
        assert exit.value.code == 2 and "--adapt-*" in err and reason in err


@pytest.mark.slow
def test_transcribe_adapted_to_the_files_matches_the_library(trained, capsys, fsdd_recordings):
    exp, _ = trained
    files = [fsdd_recordings / f"{d}_jackson_{t}.wav" for d, t in [(2, 1), (8, 3), (5, 0)]]
    assert transcribe.main([str(exp / "last.pt"), "--adapt-rounds", "2", *map(str, files)]) == 0
    captured = capsys.readouterr()
    printed = [line.split("\t", 1)[1] for line in captured.out.splitlines()]
    adapted = transcribe_speakers(load_recogniser(exp / "last.pt"), file_utterances(files), SelfTraining(AdaptationSettings(rounds=2)))
    assert printed == adapted.texts
    assert "adapted in 2 rounds for these 3 files" in captured.err
    with pytest.raises(SystemExit):
        transcribe.main([str(exp / "last.pt"), "--adapt-rounds", "-1", str(files[0])])
    assert "--adapt-*" in capsys.readouterr().err


def test_vtln_warp_lists_are_parsed_and_checked(untrained, librivox_mini, capsys):
    assert parse_warps("0.8:1.2:0.1") == (0.8, 0.9, 1.0, 1.1, 1.2)
    assert parse_warps("1.1,0.9,1.1") == (0.9, 1.1)
    for bad, reason in (("1.2:0.8:0.1", "LOW <= HIGH"), ("0.9,x", "not a comma list"), ("0.5,1.0", "outside [0.7, 1.3]")):
        argv = ["--checkpoint", str(untrained), "--data", str(librivox_mini), "--vtln-warps", bad]
        message = _one_line_error(capsys, lambda argv=argv: evaluate.main(argv))
        assert "--vtln-warps" in message and reason in message


@pytest.mark.slow
def test_transcribe_with_an_ensemble_and_vtln_matches_the_recogniser(trained, capsys, fsdd_recordings, tmp_path):
    exp, _ = trained
    files = [fsdd_recordings / f"{d}_nicolas_{t}.wav" for d, t in [(3, 0), (7, 2), (1, 4)]]
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"not audio")
    argv = [str(exp / "last.pt"), "--with", str(exp / "epoch1.pt"), "--vtln-warps", "0.9,1.0,1.1"]
    assert transcribe.main([*argv, str(files[0]), str(bad), *map(str, files[1:])]) == 1
    captured = capsys.readouterr()
    assert [line.split("\t")[0] for line in captured.out.splitlines()] == list(map(str, files))
    recogniser = load_recogniser([exp / "last.pt", exp / "epoch1.pt"])
    expected = transcribe_speakers(recogniser, file_utterances(files), VTLNSearch((0.9, 1.0, 1.1)))
    assert [line.split("\t", 1)[1] for line in captured.out.splitlines()] == expected.texts
    assert str(bad) in captured.err
    assert f"VTLN warp {expected.warps['files']:g} for these 3 files" in captured.err


@pytest.mark.slow
def test_a_decode_config_file_gives_the_same_settings_as_the_options(trained, tmp_path, capsys):
    exp, valid = trained
    config = tmp_path / "decode.yaml"
    config.write_text(
        "decoding:\n  beam_size: 3\n  ctc_weight: 0.3\n  segment_seconds: 1.5\nvtln_warps: 0.9:1.1:0.1\nbatch_size: 4\n"
    )
    base = ["--checkpoint", str(exp / "last.pt"), "--data", str(valid)]
    assert evaluate.main(base + ["--decode-config", str(config), "--out", str(tmp_path / "file")]) == 0
    flags = ["--beam", "3", "--ctc-weight", "0.3", "--segment-seconds", "1.5"]
    flags += ["--vtln-warps", "0.9,1.0,1.1", "--batch-size", "4"]
    assert evaluate.main(base + flags + ["--out", str(tmp_path / "flags")]) == 0
    from_file = json.loads((tmp_path / "file" / "wer.json").read_text())
    from_flags = json.loads((tmp_path / "flags" / "wer.json").read_text())
    assert from_file["settings"] == from_flags["settings"]
    assert from_file["settings"] == DecodeSettings(
        dataclasses.replace(DecodeSettings().decoding, beam_size=3, ctc_weight=0.3, segment_seconds=1.5),
        (0.9, 1.0, 1.1), None, 4,
    ).to_dict()
    assert (tmp_path / "file" / "hyp.txt").read_text() == (tmp_path / "flags" / "hyp.txt").read_text()
    # An option on the command line overrides the file.
    assert evaluate.main(base + ["--decode-config", str(config), "--beam", "1", "--out", str(tmp_path / "over")]) == 0
    assert json.loads((tmp_path / "over" / "wer.json").read_text())["settings"]["decoding"]["beam_size"] == 1
    config.write_text("decoding:\n  beam: 3\n")
    message = _one_line_error(capsys, lambda: evaluate.main(base + ["--decode-config", str(config)]))
    assert "decoding.beam" in message and str(config) in message


def test_ensemble_members_may_differ_in_training_only_augmentation(untrained, tmp_path):
    state = load_checkpoint(untrained)
    state["features"]["config"]["augment"]["noise"]["probability"] = 0.5
    augmented = tmp_path / "augmented.pt"
    save_checkpoint(augmented, state)
    assert load_recogniser([untrained, augmented]).pipeline.config.augment.noise.probability == 0.0
    state["features"]["config"]["frame_length_ms"] = 20.0  # a feature that inference uses: refused
    other = tmp_path / "other.pt"
    save_checkpoint(other, state)
    with pytest.raises(CheckpointError, match="feature pipelines differ"):
        load_recogniser([untrained, other])


def test_ensemble_members_must_agree_on_dither_when_it_applies_at_inference(untrained, tmp_path):
    def variant(name, dither, dither_inference):
        state = load_checkpoint(untrained)
        state["features"]["config"].update(dither=dither, dither_inference=dither_inference)
        save_checkpoint(tmp_path / name, state)
        return tmp_path / name

    assert load_recogniser([variant("a.pt", 1.0, False), variant("b.pt", 0.5, False)])  # training only: fine
    with pytest.raises(CheckpointError, match="feature pipelines differ"):
        load_recogniser([variant("c.pt", 1.0, True), variant("d.pt", 0.5, True)])
    with pytest.raises(CheckpointError, match="feature pipelines differ"):
        load_recogniser([variant("e.pt", 1.0, True), variant("f.pt", 1.0, False)])


def test_transcribe_checks_what_it_was_given_before_loading_anything(tmp_path, librivox_mini, capsys):
    """Issue 50: swapped arguments, a run folder or a log given as the checkpoint are named for what they
    are, and the converter (asr.checkpoint convert) is never suggested for them."""
    flac = str(next(librivox_mini.rglob("*.flac")))
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(run / "last.pt", {"config": {}, "model": {}})
    (run / "train.log").write_text("07:01:02 INFO asr.train: epoch 1: valid loss 1.2\n")
    cases = [
        ([flac, str(run / "last.pt")], f"{flac} is a FLAC audio file, not a checkpoint: the checkpoint comes first"),
        ([str(run), flac], f"{run} is a run folder, not a checkpoint; did you mean {run / 'last.pt'}?"),
        ([str(run / "train.log"), flac], f"{run / 'train.log'} is not a checkpoint: it is a text file"),
        ([str(run / "last.pt"), str(run / "last.pt")], "is a checkpoint, not audio: give the checkpoints first"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            transcribe.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err, err
        assert "asr.checkpoint convert" not in err and "Traceback" not in err


def test_a_progress_bar_moves_per_batch_and_the_transcripts_do_not_change():
    """transcribe_speakers tells its progress per batch for a strategy that takes utterances one by one
    (a bar that moves while asr.evaluate decodes), per speaker for one that works per speaker."""
    from asr.inference import SpeakerResult

    class Echo:
        """A strategy that 'transcribes' each utterance as its id, and notes the lists it was given."""

        def __init__(self, per_speaker):
            self.per_speaker, self.calls = per_speaker, []

        def run(self, recogniser, utterances, options, batch_size):
            self.calls.append([u.id for u in utterances])
            return SpeakerResult([u.id for u in utterances])

    utterances = [Utterance(f"u{i}", Path(f"u{i}.wav"), "x", 1.0, "ab"[i % 2]) for i in range(7)]
    for per_speaker, runs in ((False, [3, 3, 1]), (True, [4, 3])):
        strategy, told = Echo(per_speaker), []
        result = transcribe_speakers(None, utterances, strategy, batch_size=3, progress=told.append)
        assert result.texts == [u.id for u in utterances] and told == runs
        assert [len(c) for c in strategy.calls] == runs
    quiet = Echo(False)
    transcribe_speakers(None, utterances, quiet, batch_size=3)  # no bar: one run, as before
    assert [len(c) for c in quiet.calls] == [7]

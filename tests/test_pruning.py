"""LayerDrop pruning at inference (asr/models/pruning.py) and ``--prune-layers`` in the entry points."""

import copy
import json
import logging
from pathlib import Path

import pytest
import torch
from helpers import tiny_transformer_run, tiny_valid
from helpers import make_transformer as make_model
from helpers import teacher_forced
from helpers import transformer_batch as random_batch

from asr.checkpoints.io import save_checkpoint
from asr.cli import evaluate, transcribe
from asr.cli.train import main as train_main
from asr.config import ConfigError
from asr.data.librispeech import read_subset
from asr.data.tokenizer import CharTokenizer
from asr.decoding import DecodingOptions, beam_search, greedy_search
from asr.experiment import ExperimentConfig, experiment_config_to_dict
from asr.inference import DecodeSettings, load_recogniser, settings_from_dict
from asr.models.las import LASConfig
from asr.models.pruning import EVERY_OTHER, LayerPruning, parse_pruning, pruning_from_config, prune_model
from asr.models.registry import build_model
from asr.models.transformer import DecoderConfig, TransformerConfig
from asr.models.transformer_encoder import TransformerEncoderConfig
from features.config import FeatureConfig
from features.pipeline import FeaturePipeline

DEEP = {"encoder": {"num_layers": 5, "layerdrop": 0.2}, "decoder": {"num_layers": 3, "layerdrop": 0.2}}


def _layer_parameters(layer) -> int:
    return sum(p.numel() for p in layer.parameters())


# ---------------------------------------------------------------- the choice of layers


def test_the_command_line_forms_parse_to_the_layers_they_name():
    assert parse_pruning(["every_other"]) == LayerPruning(EVERY_OTHER, EVERY_OTHER)
    assert parse_pruning(["enc:0,2,4", "dec:0,2"]) == LayerPruning((0, 2, 4), (0, 2))
    assert parse_pruning(["decoder:every_other"]) == LayerPruning(None, EVERY_OTHER)
    assert LayerPruning(EVERY_OTHER, None).layers_to_keep({"encoder": 5, "decoder": 3}) == {"encoder": [0, 2, 4]}
    assert LayerPruning(EVERY_OTHER, EVERY_OTHER).layers_to_keep({"encoder": 6, "decoder": 1}) == {
        "encoder": [0, 2, 4], "decoder": [0],
    }
    for pruning in (LayerPruning(EVERY_OTHER, EVERY_OTHER), LayerPruning((0, 3), EVERY_OTHER), LayerPruning(None, (1,))):
        assert parse_pruning(pruning.describe().split()) == pruning
        assert pruning_from_config(pruning.to_config()) == pruning


@pytest.mark.parametrize("words, message", [
    (["enc:2,0"], "increasing"),
    (["enc:0,0"], "increasing"),
    (["enc:a,b"], "integers"),
    (["enc:0", "enc:1"], "named twice"),
    (["enc:0", "one.wav"], "'one.wav' is not every_other"),
    (["every_other", "dec:0"], "'every_other' is not"),
])
def test_bad_choices_say_what_is_wrong(words, message):
    with pytest.raises(ValueError, match=message):
        parse_pruning(words)


def test_decode_settings_carry_pruning_through_a_file_and_leave_it_out_when_off():
    settings = settings_from_dict({"prune_layers": {"encoder": [0, 2], "decoder": "every_other"}})
    assert settings.prune_layers == LayerPruning((0, 2), EVERY_OTHER)
    assert settings_from_dict(settings.to_dict()) == settings
    assert "prune_layers" not in DecodeSettings().to_dict()  # earlier evaluations' settings still compare equal
    with pytest.raises(ConfigError, match="prune_layers: unknown stack 'listener'"):
        settings_from_dict({"prune_layers": {"listener": [0]}})


# ---------------------------------------------------------------- the pruned model


def test_every_other_keeps_layers_0_2_4_and_their_parameters_only():
    model = make_model(**DEEP)
    original = copy.deepcopy(model)
    encoder_layers, decoder_layers = list(model.encoder.layers), list(model.decoder.layers)
    before = sum(p.numel() for p in model.parameters())
    pruned = prune_model(model, LayerPruning(EVERY_OTHER, EVERY_OTHER), "model.pt")
    assert list(model.encoder.layers) == [encoder_layers[i] for i in (0, 2, 4)]  # the very modules
    assert list(model.decoder.layers) == [decoder_layers[i] for i in (0, 2)]
    removed = 2 * _layer_parameters(encoder_layers[1]) + _layer_parameters(decoder_layers[1])
    assert pruned.parameters == sum(p.numel() for p in model.parameters()) == before - removed
    assert pruned.parameters_before == before and pruned.kept == {"encoder": [0, 2, 4], "decoder": [0, 2]}
    assert model.config.encoder.num_layers == 3 and model.config.decoder.num_layers == 2
    # The pruned encoder is the original's front end, layers 0, 2, 4 and final norm.
    model.eval(), original.eval()
    features, lengths, tokens, token_lengths = random_batch([40, 29], [4, 2])
    x = original.encoder.front_end(features)
    mask = torch.arange(x.shape[1])[None] < original.encoder(features, lengths)[2][:, None]
    for i in (0, 2, 4):
        x = original.encoder.layers[i](x, mask[:, None, None, :])
    expected = original.encoder.final_norm(x)
    assert torch.equal(model.encode(features, lengths).out[mask], expected[mask])


def test_pruned_to_all_its_layers_a_model_is_the_unpruned_model():
    model, original = make_model(**DEEP), make_model(**DEEP)
    pruned = prune_model(model, parse_pruning(["enc:0,1,2,3,4", "dec:0,1,2"]), "model.pt")
    assert pruned.parameters == pruned.parameters_before == sum(p.numel() for p in original.parameters())
    model.eval(), original.eval()
    batch = random_batch([40, 29], [4, 2])
    (encoder, log_probs), (expected_encoder, expected_log_probs) = teacher_forced(model, *batch), teacher_forced(original, *batch)
    assert torch.equal(encoder.out, expected_encoder.out)
    assert torch.equal(log_probs, expected_log_probs)


def test_a_pruned_decoder_still_decodes_step_by_step_like_its_full_pass():
    model = make_model(**DEEP)
    prune_model(model, parse_pruning(["dec:1"]), "model.pt")
    model.eval()
    features, lengths, _, _ = random_batch([40, 29], [4, 2])
    encoder = model.encode(features, lengths)
    assert len(model.init_decoder_state(encoder)["self_keys"]) == 1
    options = DecodingOptions(max_len_ratio=0.5)
    assert greedy_search(model, encoder, options) == beam_search(model, encoder, DecodingOptions(beam_size=1, max_len_ratio=0.5))


def test_a_model_without_layer_stacks_is_refused_by_name():
    las = build_model(LASConfig(), 20, CharTokenizer.train(["abc"]))
    with pytest.raises(ValueError, match="las.pt is a LAS, which has no layer stacks to prune"):
        prune_model(las, LayerPruning(EVERY_OTHER, EVERY_OTHER), "las.pt")


def test_missing_layers_are_refused_and_pruning_without_layerdrop_is_warned_about(caplog):
    with pytest.raises(ValueError, match="encoder: layer 5 does not exist .* in model.pt"):
        prune_model(make_model(**DEEP), parse_pruning(["enc:0,5"]), "model.pt")
    with caplog.at_level(logging.WARNING):
        prune_model(make_model(**DEEP), parse_pruning(["dec:0"]), "deep.pt")
        assert not caplog.records
        prune_model(make_model(), parse_pruning(["enc:0"]), "plain.pt")
    assert "pruning the encoder of plain.pt, which was trained without LayerDrop" in caplog.text


# ---------------------------------------------------------------- the entry points


def _checkpoint(path: Path, model_config, utterances) -> Path:
    """An untrained model of ``model_config`` in the trainer's checkpoint format."""
    features = FeatureConfig(kind="fbank", sample_rate=8000, num_mel_bins=23, mvn="utterance")
    pipeline = FeaturePipeline(features)
    tokenizer = CharTokenizer.train(u.text for u in utterances)
    torch.manual_seed(0)
    model = build_model(model_config, pipeline.feature_dim, tokenizer)
    config = ExperimentConfig(exp_dir="unused", features=features, model=model_config)
    save_checkpoint(path, {
        "config": experiment_config_to_dict(config), "model": model.state_dict(),
        "tokenizer": tokenizer.state_dict(), "features": pipeline.state_dict(),
    })
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(tiny Transformer trained-format checkpoint with LayerDrop, tiny LAS checkpoint, a few dev utterances)."""
    tmp = tmp_path_factory.mktemp("pruning")
    valid = tiny_valid(tmp, count=3)
    utterances = read_subset(valid)
    transformer = TransformerConfig(
        d_model=16, heads=2,
        encoder=TransformerEncoderConfig(num_layers=4, ff_dim=32, layerdrop=0.2),
        decoder=DecoderConfig(num_layers=2, ff_dim=32, layerdrop=0.2),
    )
    return (
        _checkpoint(tmp / "transformer.pt", transformer, utterances),
        _checkpoint(tmp / "las.pt", LASConfig(), utterances),
        valid,
    )


def test_evaluate_prunes_prints_and_records_the_pruned_model(checkpoints, tmp_path, capsys):
    transformer, _, valid = checkpoints
    full = load_recogniser(transformer)
    args = ["--checkpoint", str(transformer), "--data", str(valid), "--max-len-ratio", "0.3"]
    assert evaluate.main([*args, "--out", str(tmp_path / "pruned"), "--prune-layers", "every_other"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "pruned" / "wer.json").read_text())
    (record,) = result["pruning"]
    assert record["kept"] == {"encoder": [0, 2], "decoder": [0]} and record["layers"] == {"encoder": 4, "decoder": 2}
    assert record["parameters_before"] == full.parameters > record["parameters"] == result["parameters"]
    assert result["settings"]["prune_layers"] == "every_other"
    assert f"pruned to encoder layers 0,2 of 4, decoder layers 0 of 2: {record['parameters']:,} parameters" in printed
    assert "WER" in printed
    # Kept whole, the model transcribes exactly as the unpruned one.
    assert evaluate.main([*args, "--out", str(tmp_path / "all"), "--prune-layers", "enc:0,1,2,3"]) == 0
    assert evaluate.main([*args, "--out", str(tmp_path / "none")]) == 0
    assert (tmp_path / "all" / "hyp.txt").read_text() == (tmp_path / "none" / "hyp.txt").read_text()
    assert "pruning" not in json.loads((tmp_path / "none" / "wer.json").read_text())


def test_transcribe_prunes_and_names_the_kept_layers(checkpoints, capsys):
    transformer, _, valid = checkpoints
    audio = sorted(valid.rglob("*.flac"))[0]
    assert transcribe.main([str(transformer), str(audio), "--prune-layers", "enc:1,3"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{audio}\t")
    assert "pruned to encoder layers 1,3 of 4:" in captured.err


def test_pruning_a_las_checkpoint_is_a_usage_error_naming_it(checkpoints, capsys):
    _, las, valid = checkpoints
    with pytest.raises(SystemExit) as info:
        evaluate.main(["--checkpoint", str(las), "--data", str(valid), "--prune-layers", "every_other"])
    assert info.value.code == 2
    assert f"prune_layers: {las} is a LAS, which has no layer stacks to prune" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate.main(["--checkpoint", str(las), "--data", str(valid), "--prune-layers", "enc:x"])
    assert "--prune-layers: 'enc:x': layer indices must be integers" in capsys.readouterr().err


@pytest.mark.slow
def test_a_model_trained_with_layerdrop_evaluates_pruned(tmp_path, capsys):
    """Trained with LayerDrop through asr.train, then evaluated whole and pruned to every other layer."""
    assert train_main(tiny_transformer_run(
        tmp_path, "train.max_epochs=2", "model.encoder.layerdrop=0.3", "model.decoder.layerdrop=0.3",
    )) == 0
    checkpoint, valid = tmp_path / "exp" / "last.pt", tmp_path / "valid"
    for name, extra in (("whole", []), ("pruned", ["--prune-layers", "every_other"])):
        assert evaluate.main(["--checkpoint", str(checkpoint), "--data", str(valid), "--out", str(tmp_path / name), *extra]) == 0
    whole, pruned = (json.loads((tmp_path / name / "wer.json").read_text()) for name in ("whole", "pruned"))
    assert pruned["pruning"][0]["kept"] == {"encoder": [0, 2], "decoder": [0]}
    assert pruned["parameters"] < whole["parameters"] == pruned["pruning"][0]["parameters_before"]
    assert 0.0 <= pruned["wer_percent"] and pruned["utterances"] == whole["utterances"]
    assert "pruned to encoder layers 0,2 of 3, decoder layers 0 of 2" in capsys.readouterr().out

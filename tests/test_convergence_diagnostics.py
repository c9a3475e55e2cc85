"""What shows why a LAS does not converge: the validation metrics (asr/training/metrics.py), the
speller's context-free loss, the attention prior and the attention's sharpness."""

import dataclasses

import numpy as np
import pytest
import torch

from asr.models.attention import Attention, AttentionConfig
from asr.models.las import LAS
from asr.training.metrics import (
    METRICS,
    check_metric_name,
    higher_is_better,
    metrics_for,
    monotonicity,
    ranking_key,
)
from asr.training.epoch_end import EpochEnd
from asr.training.state import Progress
from helpers import las_batch, small_las_config

VOCAB = 10


def test_the_measure_tells_a_diagonal_from_attention_collapsed_onto_the_end():
    frames = 100
    diagonal = monotonicity(np.linspace(0, frames - 1, 30).astype(int), frames)
    assert diagonal["spearman"] == pytest.approx(1.0) and diagonal["at_end"] < 0.1 and diagonal["forward"] > 0.9
    collapsed = np.full(30, frames - 1)
    collapsed[:2] = [3, 98]
    stuck = monotonicity(collapsed, frames)
    assert stuck["at_end"] > 0.9 and stuck["forward"] < 0.1 and stuck["spearman"] < 0.5
    assert monotonicity(np.full(30, 40), frames)["spearman"] == 0.0  # a peak that never moves says nothing


def test_every_metric_says_which_way_is_better_and_best_metric_takes_any_of_them():
    assert not higher_is_better("valid_loss") and higher_is_better("valid_attention_spearman")
    for name in METRICS:
        check_metric_name(name, "train.best_metric")
    with pytest.raises(ValueError, match="train.best_metric: no validation metric 'valid_wr'"):
        check_metric_name("valid_wr", "train.best_metric")
    # sorting by the key puts the best first, whichever way is better; NaN last
    assert sorted([0.2, float("nan"), 0.9], key=lambda v: ranking_key("valid_attention_spearman", v))[0] == 0.9
    assert sorted([0.2, float("nan"), 0.9], key=lambda v: ranking_key("valid_loss", v))[0] == 0.2


def test_the_ranking_keeps_the_highest_when_higher_is_better(tmp_path):
    end = EpochEnd(tmp_path, "valid_attention_spearman", keep_best=2, keep_last=1, patience=2, main=False)
    progress = Progress()
    for epoch, value in enumerate([0.3, 0.8, 0.5, 0.6]):
        end.rank(progress, epoch, {"valid_attention_spearman": value})
    assert progress.best == [(0.8, 1), (0.6, 3)]
    assert progress.epochs_without_improvement == 2 and end.should_stop(progress)
    end.rank(progress, 4, {})  # an epoch that scored nothing is not ranked
    assert progress.best == [(0.8, 1), (0.6, 3)]


def test_las_offers_every_diagnostic_and_the_transformer_those_it_can():
    las = LAS(small_las_config(), 6, VOCAB)
    assert {m.name for m in metrics_for(las)} == set(METRICS) - {"valid_batchnorm_gap"}  # LAS has no BatchNorm
    from asr.models.conformer import ConformerConfig
    from asr.models.transformer import Transformer, TransformerConfig

    names = {m.name for m in metrics_for(Transformer(TransformerConfig(d_model=16, heads=2), 8, VOCAB))}
    assert names == {"valid_loss", "valid_wer", "valid_cer", "valid_ctc_cer"}
    conformer = TransformerConfig(d_model=16, heads=2, encoder=ConformerConfig(conv_kernel=3))
    names = {m.name for m in metrics_for(Transformer(conformer, 8, VOCAB))}
    assert names == {"valid_loss", "valid_wer", "valid_cer", "valid_ctc_cer", "valid_batchnorm_gap"}


def test_the_context_free_loss_ignores_the_audio_and_the_real_loss_does_not():
    torch.manual_seed(0)
    model = LAS(small_las_config(label_smoothing=0.0), 6, VOCAB).eval()
    features, lengths, tokens, token_lengths = las_batch(VOCAB)
    with torch.no_grad():
        output = model(features, lengths, tokens, token_lengths)
        free, count = model.loss_without_context(output.encoder, tokens, token_lengths)
        assert count == output.num_tokens
        other = model(features.flip(1) * 3, lengths, tokens, token_lengths)  # other audio, same text
        free_other, _ = model.loss_without_context(other.encoder, tokens, token_lengths)
    assert float(free) == pytest.approx(float(free_other), abs=1e-6)
    assert abs(float(output.attention_loss) - float(other.attention_loss)) > 1e-4
    assert abs(float(free) - float(output.attention_loss)) > 1e-4


def test_the_attention_prior_pulls_the_teacher_forced_attention_onto_the_diagonal_in_training_only():
    torch.manual_seed(0)
    model = LAS(small_las_config(), 6, VOCAB)
    features, lengths, tokens, token_lengths = las_batch(VOCAB)
    features, lengths = torch.randn(3, 120, 6), torch.tensor([120, 100, 80])
    model.train()
    for module in model.modules():  # dropout off: the comparison is about the prior alone
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    with torch.no_grad():
        plain = model(features, lengths, tokens, token_lengths)
        model.set_scheduled("attention_prior", 50.0)
        pulled = model(features, lengths, tokens, token_lengths)
        model.eval()
        evaluated = model(features, lengths, tokens, token_lengths)
        model.set_scheduled("attention_prior", 0.0)
        plain_eval = model(features, lengths, tokens, token_lengths)
    steps, frames = int(token_lengths[0]) + 1, int(pulled.encoder.lengths[0])
    peaks = pulled.attention_weights[0, :steps, :frames].argmax(-1).tolist()
    centres = [int((i + 0.5) * frames / steps) for i in range(steps)]
    assert all(abs(p - c) <= 1 for p, c in zip(peaks, centres)), (peaks, centres)
    assert not torch.allclose(plain.attention_weights, pulled.attention_weights)
    assert torch.equal(evaluated.attention_weights, plain_eval.attention_weights)  # never in evaluation


def test_scaling_sharpens_the_softmax_as_espnets_attloc_scaling_does():
    torch.manual_seed(0)
    config = AttentionConfig(type="location", dim=8, conv_channels=2, conv_kernel=3)
    plain, sharp = Attention(config, 5, 6), Attention(dataclasses.replace(config, scaling=2.0), 5, 6)
    sharp.load_state_dict(plain.state_dict())
    query, keys, mask = torch.randn(2, 5), torch.randn(2, 7, 6), torch.ones(2, 7, dtype=torch.bool)
    _, weights = plain(query, keys, mask)
    _, sharper = sharp(query, keys, mask)
    # softmax(2e) is softmax(e) squared and renormalised
    expected = weights.pow(2) / weights.pow(2).sum(-1, keepdim=True)
    assert torch.allclose(sharper, expected, atol=1e-6)
    with pytest.raises(ValueError, match="scaling must be positive"):
        AttentionConfig(scaling=0.0)


def test_the_schedulable_settings_reach_the_loss():
    torch.manual_seed(0)
    model = LAS(small_las_config(ctc_weight=0.3), 6, VOCAB).eval()
    assert set(model.scheduled()) == {"ctc_weight", "label_smoothing", "sampling_probability", "attention_prior",
                                      "listener_layers"}
    assert "ctc_weight" not in LAS(small_las_config(ctc_weight=0.0), 6, VOCAB).scheduled()
    batch = las_batch(VOCAB)
    with torch.no_grad():
        model.set_scheduled("ctc_weight", 0.5)
        out = model(*batch)
        assert float(out.loss) == pytest.approx(0.5 * float(out.attention_loss) + 0.5 * float(out.ctc_loss), rel=1e-6)
        model.set_scheduled("label_smoothing", 0.0)
        unsmoothed = model(*batch).attention_loss
        model.set_scheduled("label_smoothing", 0.2)
        assert float(model(*batch).attention_loss) != pytest.approx(float(unsmoothed))
    with pytest.raises(KeyError):
        model.set_scheduled("dropout", 0.1)


def test_a_growing_listener_keeps_its_rate_and_size_and_ignores_the_layers_not_yet_grown():
    torch.manual_seed(0)
    model = LAS(small_las_config(), 6, VOCAB).eval()  # 3 layers, 2 reductions
    features, lengths, _, _ = las_batch(VOCAB)
    with torch.no_grad():
        full, full_lengths = model.listener(features, lengths)
        model.set_scheduled("listener_layers", 1.0)
        grown, grown_lengths = model.listener(features, lengths)
        for p in model.listener.layers[1:].parameters():
            p.add_(1.0)  # the layers not yet grown play no part
        again, _ = model.listener(features, lengths)
    assert grown.shape == full.shape and torch.equal(grown_lengths, full_lengths)
    assert torch.equal(grown, again) and not torch.allclose(grown, full)
    # the first layer's output averaged over frame pairs twice: the rate of the whole listener
    first, first_lengths = model.listener.layers[0](features, lengths)
    assert grown.shape[1] == (first.shape[1] + 3) // 4
    # checkpoints carry the stage; those written before the listener could grow load with every layer
    state = model.state_dict()
    assert int(state["listener.active_layers"]) == 1
    fresh = LAS(small_las_config(), 6, VOCAB)
    fresh.load_state_dict(state)
    assert int(fresh.listener.active_layers) == 1
    del state["listener.active_layers"]
    fresh.load_state_dict(state)
    assert int(fresh.listener.active_layers) == 3


def test_a_ctc_only_las_trains_its_listener_alone_and_decodes_with_its_ctc_head():
    from asr.decoding import DecodingOptions, ctc_best_path, search

    torch.manual_seed(0)
    model = LAS(small_las_config(ctc_weight=1.0), 6, VOCAB)
    assert model.ctc_only and "ctc_weight" not in model.scheduled()
    batch = las_batch(VOCAB)
    output = model(*batch)
    assert output.attention_loss is None and output.attention_weights is None
    assert torch.equal(output.loss, output.ctc_loss)
    output.loss.backward()
    assert all(p.grad is None for p in model.speller.parameters())  # the speller is never run
    assert all(p.grad is not None for p in model.listener.parameters() if p.requires_grad)
    model.eval()
    encoder = model.encode(batch[0], batch[1])
    for options in (DecodingOptions(), DecodingOptions(beam_size=4, ctc_weight=0.3)):
        assert search(model, encoder, options) == ctc_best_path(encoder, model.pad_id)
    assert {m.name for m in metrics_for(model)} == {"valid_loss", "valid_wer", "valid_cer", "valid_ctc_cer"}
    with pytest.raises(ValueError, match=r"ctc_weight must be in \[0, 1\)"):
        from asr.models.transformer import TransformerConfig

        TransformerConfig(ctc_weight=1.0)  # only LAS offers the CTC-only comparison

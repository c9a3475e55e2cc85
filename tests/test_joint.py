"""The joint CTC-attention loss all models share (asr/models/joint.py): each model's loss is torch's
cross-entropy and CTC loss on its own outputs, combined per target token, whatever its encoder."""

import pytest
import torch
import torch.nn.functional as F

from helpers import EOS, PAD, SOS, las_batch, make_transformer, small_las_config, teacher_forced, transformer_batch

from asr.models.common import add_sos_eos
from asr.models.joint import attention_loss, check_special_ids
from asr.models.las import LAS
from asr.models.transformer import Transformer


def torchs_joint_loss(log_probs, ctc_log_probs, encoder_lengths, tokens, token_lengths, ctc_weight, smoothing):
    """What the loss must be, from torch's own functions: sums over the batch per target token (<eos> included)."""
    _, target = add_sos_eos(tokens, token_lengths, SOS, EOS, PAD)
    num_tokens = int((token_lengths + 1).sum())
    attention = F.cross_entropy(log_probs.reshape(-1, log_probs.shape[-1]), target.reshape(-1), ignore_index=PAD,
                                label_smoothing=smoothing, reduction="sum") / num_tokens
    if ctc_log_probs is None:
        return attention
    ctc = F.ctc_loss(ctc_log_probs.transpose(0, 1), tokens, encoder_lengths, token_lengths, blank=PAD,
                     reduction="sum", zero_infinity=True) / num_tokens
    return (1 - ctc_weight) * attention + ctc_weight * ctc


@pytest.mark.parametrize("ctc_weight, smoothing", [(0.3, 0.1), (0.0, 0.0), (0.5, 0.0)])
@pytest.mark.parametrize("kind", ["transformer", "conformer"])
def test_the_encoder_decoder_loss_is_torchs_cross_entropy_and_ctc_per_token(kind, ctc_weight, smoothing):
    encoder = {"kind": kind} if kind == "transformer" else {"kind": kind, "conv_kernel": 5}
    model = make_transformer(ctc_weight=ctc_weight, label_smoothing=smoothing, encoder=encoder).eval()
    batch = transformer_batch([40, 31, 22], [5, 3, 1])
    output = model(*batch)
    encoded, log_probs = teacher_forced(model, *batch)
    expected = torchs_joint_loss(log_probs, encoded.ctc_log_probs, encoded.lengths, batch[2], batch[3], ctc_weight, smoothing)
    torch.testing.assert_close(output.loss, expected, atol=1e-6, rtol=1e-5)
    assert output.num_tokens == 12


@pytest.mark.parametrize("ctc_weight, smoothing", [(0.3, 0.1), (0.0, 0.2)])
def test_the_las_loss_is_torchs_cross_entropy_and_ctc_per_token(ctc_weight, smoothing):
    torch.manual_seed(0)
    model = LAS(small_las_config(ctc_weight=ctc_weight, label_smoothing=smoothing), input_dim=6, vocab_size=10).eval()
    features, lengths, tokens, token_lengths = las_batch()
    output = model(features, lengths, tokens, token_lengths)
    encoded = model.encode(features, lengths)
    decoder_input, _ = add_sos_eos(tokens, token_lengths, SOS, EOS, PAD)
    log_probs, _ = model.speller(decoder_input, encoded.out, encoded.mask, target_lengths=token_lengths + 1)
    expected = torchs_joint_loss(log_probs, encoded.ctc_log_probs, encoded.lengths, tokens, token_lengths, ctc_weight, smoothing)
    torch.testing.assert_close(output.loss, expected, atol=1e-6, rtol=1e-5)


def test_a_bfloat16_decoder_output_is_scored_in_float32():
    generator = torch.Generator().manual_seed(0)
    log_probs = torch.log_softmax(torch.randn(4, 50, 300, generator=generator), -1)
    target = torch.randint(3, 300, (4, 50), generator=generator)
    lengths = torch.full((4,), 49)
    low = log_probs.bfloat16()
    got, _ = attention_loss(low, target, lengths, 0.1)
    expected, _ = attention_loss(low.float(), target, lengths, 0.1)
    assert got.dtype == torch.float32 and got.item() == expected.item()


def test_both_models_refuse_bad_special_ids_with_the_same_message():
    check_special_ids(10, 0, 1, 2)
    for model in (lambda: LAS(small_las_config(), 6, 10, pad_id=0, sos_id=1, eos_id=1),
                  lambda: Transformer(make_transformer().config, 20, 10, pad_id=0, sos_id=1, eos_id=1)):
        with pytest.raises(ValueError, match="pad_id, sos_id and eos_id must differ"):
            model()
    with pytest.raises(ValueError, match=r"special ids eos_id=12 out of range for vocab_size 10"):
        Transformer(make_transformer().config, 20, 10, pad_id=0, sos_id=1, eos_id=12)

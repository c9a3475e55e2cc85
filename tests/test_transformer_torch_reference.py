"""The Transformer's layers against PyTorch's own: ``EncoderLayer`` / ``DecoderLayer``
(asr/models/transformer_encoder.py, asr/models/transformer.py) with their weights copied into ``torch.nn.TransformerEncoderLayer`` /
``TransformerDecoderLayer`` give the same outputs on every valid position, to the last bit.

Mask conventions differ: here True = may attend / valid; PyTorch's boolean ``key_padding_mask``
and ``attn_mask`` say True = may NOT attend. PyTorch's packed ``in_proj_weight`` is the query,
key and value weights stacked in that order; ``norm_first=True`` is pre-norm.

Bit-exactness holds for PyTorch's general path (taken here: gradients enabled). In evaluation
under ``torch.no_grad`` its encoder layer takes a fused "fast path" that adds in another order,
so that comparison is to float32 rounding (the default tolerances of ``assert_close``).
"""

import pytest
import torch
from torch import nn

from asr.config import from_dict
from asr.models.transformer import DecoderLayer, MultiHeadAttention, TransformerConfig
from asr.models.transformer_encoder import EncoderLayer

D_MODEL, HEADS, FF = 32, 4, 48


def config(layer_norm: str, drophead: float = 0.0) -> TransformerConfig:
    stack = {"layer_norm": layer_norm, "ff_dim": FF, "drophead": drophead}
    return from_dict(TransformerConfig, {"d_model": D_MODEL, "heads": HEADS, "dropout": 0.0, "encoder": stack, "decoder": stack}, "model")


def copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.query.weight, ours.key.weight, ours.value.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.query.bias, ours.key.bias, ours.value.bias]))
        theirs.out_proj.weight.copy_(ours.out.weight)
        theirs.out_proj.bias.copy_(ours.out.bias)


def torch_layer(kind, layer_norm: str, eps: float):
    return kind(
        D_MODEL, HEADS, FF, dropout=0.0, activation="relu", layer_norm_eps=eps, batch_first=True,
        norm_first=layer_norm == "pre",
    )


def torch_encoder_layer(ours: EncoderLayer, layer_norm: str, eps: float) -> nn.TransformerEncoderLayer:
    theirs = torch_layer(nn.TransformerEncoderLayer, layer_norm, eps)
    copy_attention(ours.self_attn, theirs.self_attn)
    theirs.linear1.load_state_dict(ours.feed_forward.inner.state_dict())
    theirs.linear2.load_state_dict(ours.feed_forward.outer.state_dict())
    theirs.norm1.load_state_dict(ours.self_attn_norm.state_dict())
    theirs.norm2.load_state_dict(ours.ff_norm.state_dict())
    return theirs


def torch_decoder_layer(ours: DecoderLayer, layer_norm: str, eps: float) -> nn.TransformerDecoderLayer:
    theirs = torch_layer(nn.TransformerDecoderLayer, layer_norm, eps)
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_attention(ours.cross_attn, theirs.multihead_attn)
    theirs.linear1.load_state_dict(ours.feed_forward.inner.state_dict())
    theirs.linear2.load_state_dict(ours.feed_forward.outer.state_dict())
    theirs.norm1.load_state_dict(ours.self_attn_norm.state_dict())
    theirs.norm2.load_state_dict(ours.cross_attn_norm.state_dict())
    theirs.norm3.load_state_dict(ours.ff_norm.state_dict())
    return theirs


def padded(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, D) random inputs and their (B, T) mask, True = valid."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max(lengths), D_MODEL, generator=generator)
    return x, torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]


# drophead > 0 too: in evaluation DropHead must leave the layer exactly as it is.
@pytest.mark.parametrize("drophead", [0.0, 0.3])
@pytest.mark.parametrize("layer_norm", ["pre", "post"])
def test_encoder_layer_equals_pytorchs_to_the_last_bit(layer_norm, drophead):
    cfg = config(layer_norm, drophead)
    torch.manual_seed(0)
    ours = EncoderLayer(cfg, cfg.encoder).eval()
    theirs = torch_encoder_layer(ours, layer_norm, cfg.eps).eval()
    x, valid = padded([11, 7, 3], seed=1)
    expected = ours(x, valid[:, None, None, :])
    got = theirs(x, src_key_padding_mask=~valid)
    torch.testing.assert_close(got[valid], expected[valid], rtol=0, atol=0)
    with torch.no_grad():  # PyTorch's fused inference path
        torch.testing.assert_close(theirs(x, src_key_padding_mask=~valid)[valid], expected[valid])


@pytest.mark.parametrize("drophead", [0.0, 0.3])
@pytest.mark.parametrize("layer_norm", ["pre", "post"])
def test_decoder_layer_equals_pytorchs_to_the_last_bit(layer_norm, drophead):
    cfg = config(layer_norm, drophead)
    torch.manual_seed(0)
    ours = DecoderLayer(cfg, cfg.decoder).eval()
    theirs = torch_decoder_layer(ours, layer_norm, cfg.eps).eval()
    memory, memory_valid = padded([11, 7, 3], seed=1)
    y, valid = padded([6, 4, 1], seed=2)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    expected, _ = ours(
        y, causal & valid[:, None, None, :], ours.cross_attn.project_kv(memory), memory_valid[:, None, None, :]
    )
    got = theirs(
        y, memory, tgt_mask=~causal, tgt_key_padding_mask=~valid, memory_key_padding_mask=~memory_valid,
    )
    torch.testing.assert_close(got[valid], expected[valid], rtol=0, atol=0)


def test_the_comparison_notices_a_wrong_mask():
    """The reference is not blind: the same layer without the padding mask differs at valid positions."""
    cfg = config("pre")
    torch.manual_seed(0)
    ours = EncoderLayer(cfg, cfg.encoder).eval()
    theirs = torch_encoder_layer(ours, "pre", cfg.eps).eval()
    x, valid = padded([11, 7, 3], seed=1)
    expected = ours(x, valid[:, None, None, :])
    assert not torch.allclose(theirs(x)[valid], expected[valid], atol=1e-4)

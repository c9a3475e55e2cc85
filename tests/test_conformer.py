"""The Conformer encoder (issue 51): torchaudio's Conformer as the peer, relative attention against a
loop written from its formula, BatchNorm that padding and the batch cannot reach where it must not,
DDP-synced statistics, and the config keys."""

import math
import socket

import pytest
import torch
import torch.nn.functional as F
from torchaudio.models import Conformer as TorchaudioConformer

from asr.config import ConfigError, from_dict
from asr.decoding import DecodingOptions, decode
from asr.models.blocks import sinusoidal_positions
from asr.models.common import lengths_to_mask
from asr.models.conformer import ConformerEncoder
from asr.models.norms import ChannelLayerNorm, MaskedBatchNorm1d, MaskedGroupNorm
from asr.models.relative_attention import RelativeMultiHeadAttention, relative_attention, relative_positions
from asr.models.transformer import Transformer, TransformerConfig

D_MODEL, HEADS, FF, KERNEL, LAYERS, FEATURES = 16, 4, 32, 5, 2, 23


def config(**encoder) -> TransformerConfig:
    settings = {"kind": "conformer", "num_layers": LAYERS, "ff_dim": FF, "conv_kernel": KERNEL, **encoder}
    return from_dict(TransformerConfig, {"d_model": D_MODEL, "heads": HEADS, "dropout": 0.0, "attention_dropout": 0.0,
                                         "encoder": settings, "decoder": {"num_layers": 1, "ff_dim": 16}}, "model")


def encoder(seed: int = 0, **settings) -> ConformerEncoder:
    torch.manual_seed(seed)
    return ConformerEncoder(config(**settings), FEATURES)


def copy_to_torchaudio(ours: ConformerEncoder, group_norm: bool) -> TorchaudioConformer:
    """torchaudio's Conformer with our blocks' weights: the published layout, absolute positions."""
    peer = TorchaudioConformer(D_MODEL, HEADS, FF, len(ours.layers), KERNEL, dropout=0.0, use_group_norm=group_norm)
    with torch.no_grad():
        for block, layer in zip(ours.layers, peer.conformer_layers):
            for mine, theirs in ((block.ff1, layer.ffn1), (block.ff2, layer.ffn2)):
                theirs.sequential[1].load_state_dict(mine.inner.state_dict())
                theirs.sequential[4].load_state_dict(mine.outer.state_dict())
            layer.ffn1.sequential[0].load_state_dict(block.ff1_norm.state_dict())
            layer.ffn2.sequential[0].load_state_dict(block.ff2_norm.state_dict())
            layer.self_attn_layer_norm.load_state_dict(block.self_attn_norm.state_dict())
            attention = block.self_attn
            layer.self_attn.in_proj_weight.copy_(torch.cat([attention.query.weight, attention.key.weight,
                                                            attention.value.weight]))
            layer.self_attn.in_proj_bias.copy_(torch.cat([attention.query.bias, attention.key.bias, attention.value.bias]))
            layer.self_attn.out_proj.load_state_dict(attention.out.state_dict())
            conv, theirs = block.conv_module, layer.conv_module
            theirs.layer_norm.load_state_dict(block.conv_module_norm.state_dict())
            theirs.sequential[0].load_state_dict(conv.pointwise_in.state_dict())
            theirs.sequential[2].load_state_dict(conv.depthwise.state_dict())
            theirs.sequential[3].load_state_dict(conv.norm.state_dict())
            theirs.sequential[5].load_state_dict(conv.pointwise_out.state_dict())
            layer.final_layer_norm.load_state_dict(block.final_norm.state_dict())
    return peer


def with_trained_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Every norm's gain, bias and running statistics moved off their initial values, so a copy that
    misses one shows."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in model.modules():
            for name in ("weight", "bias", "running_mean"):
                value = getattr(module, name, None)
                if isinstance(module, (torch.nn.LayerNorm, torch.nn.BatchNorm1d, torch.nn.GroupNorm)) and value is not None:
                    value.add_(0.3 * torch.randn(value.shape, generator=generator))
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_var.mul_(0.5 + torch.rand(module.running_var.shape, generator=generator))
    return model


# ---------------------------------------------------------------- the peer: torchaudio.models.Conformer


@pytest.mark.parametrize("conv_norm", ["batchnorm", "groupnorm"])
def test_the_published_layout_gives_torchaudios_outputs_and_batch_statistics_for_copied_weights(conv_norm):
    ours = with_trained_norms(encoder(positions="absolute", conv_norm=conv_norm))
    peer = copy_to_torchaudio(ours, group_norm=conv_norm == "groupnorm")
    x = torch.randn(3, 20, D_MODEL)
    lengths = torch.full((3,), 20)  # no padding: torchaudio's norms would count it (the padded test is below)
    ours.train(), peer.train()
    mine = ours.blocks(x, lengths_to_mask(lengths, 20), None)
    theirs, _ = peer(x, lengths)
    torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-4)
    if conv_norm == "batchnorm":  # the running statistics learned the same batch
        for block, layer in zip(ours.layers, peer.conformer_layers):
            torch.testing.assert_close(block.conv_module.norm.running_var, layer.conv_module.sequential[3].running_var)
            torch.testing.assert_close(block.conv_module.norm.running_mean, layer.conv_module.sequential[3].running_mean)


def test_with_padding_at_evaluation_torchaudio_agrees_on_every_frame_its_padding_cannot_reach():
    # torchaudio's depthwise convolution reads padded frames (by design here it reads zeros instead),
    # so in one block the last KERNEL // 2 frames of an utterance may differ (in a second block the
    # attention would spread them to every frame).
    ours = with_trained_norms(encoder(positions="absolute", num_layers=1))
    peer = copy_to_torchaudio(ours, group_norm=False)
    ours.eval(), peer.eval()
    lengths = torch.tensor([30, 22, 14])
    x = torch.randn(3, 30, D_MODEL)
    mine = ours.blocks(x, lengths_to_mask(lengths, 30), None)
    theirs, _ = peer(x, lengths)
    reach = KERNEL // 2
    for row, length in enumerate(lengths.tolist()):
        torch.testing.assert_close(mine[row, : length - reach], theirs[row, : length - reach], atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------- relative positions


def test_relative_attention_matches_its_formula_written_as_a_loop():
    torch.manual_seed(1)
    attention = RelativeMultiHeadAttention(D_MODEL, HEADS, dropout=0.0).eval()
    with torch.no_grad():
        attention.bias_u.normal_(), attention.bias_v.normal_()
    frames, lengths = 7, torch.tensor([7, 4])
    x = torch.randn(2, frames, D_MODEL)
    mask = lengths_to_mask(lengths, frames)
    got = attention(x, relative_positions(frames, D_MODEL, x.device), mask[:, None, None, :])
    head = D_MODEL // HEADS
    q = attention.query(x).view(2, frames, HEADS, head)
    k = attention.key(x).view(2, frames, HEADS, head)
    v = attention.value(x).view(2, frames, HEADS, head)
    expected = torch.zeros(2, frames, HEADS, head)
    for b in range(2):
        for h in range(HEADS):
            for i in range(frames):
                scores = torch.full((frames,), float("-inf"))
                for j in range(int(lengths[b])):
                    distance = sinusoidal_positions(torch.tensor([i - j]), D_MODEL)[0]
                    r = attention.position(distance).view(HEADS, head)[h]
                    scores[j] = ((q[b, i, h] + attention.bias_u[h]) @ k[b, j, h]
                                 + (q[b, i, h] + attention.bias_v[h]) @ r) / math.sqrt(head)
                expected[b, i, h] = torch.softmax(scores, 0) @ v[b, :, h]
    expected = attention.out(expected.reshape(2, frames, D_MODEL))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_the_cpu_relative_attention_gives_the_sdpa_formulations_outputs_and_gradients():
    """One autograd node on the CPU (asr.models.relative_attention) against the position term handed to
    SDPA as an additive mask (the CUDA path), float64, with padded keys, in training mode."""
    torch.manual_seed(5)
    frames, lengths = 11, torch.tensor([11, 7, 3])
    attention = RelativeMultiHeadAttention(D_MODEL, HEADS, dropout=0.0).double().train()
    with torch.no_grad():
        attention.bias_u.normal_(), attention.bias_v.normal_()  # so that u and v enter the gradients unequally
    x = torch.randn(3, frames, D_MODEL, dtype=torch.float64, requires_grad=True)
    mask = lengths_to_mask(lengths, frames)[:, None, None, :]
    positions = relative_positions(frames, D_MODEL, x.device).double()
    got = attention(x, positions, mask)
    got_grads = torch.autograd.grad((got * torch.linspace(-1, 2, got.numel()).view_as(got)).sum(),
                                    [x, *attention.parameters()])
    attention.cpu_node = False
    expected = attention(x, positions, mask)
    expected_grads = torch.autograd.grad((expected * torch.linspace(-1, 2, got.numel()).view_as(got)).sum(),
                                         [x, *attention.parameters()])
    torch.testing.assert_close(got, expected)
    names = ["x", *(name for name, _ in attention.named_parameters())]
    for name, ours, theirs in zip(names, got_grads, expected_grads):
        torch.testing.assert_close(ours, theirs, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("frames", [1, 5, 9])  # one block of queries; blocks of 2 and 1; of 3
def test_the_cpu_relative_attention_passes_gradcheck_with_padding_and_a_dropout_mask(frames):
    torch.manual_seed(6)
    batch, heads, head = 2, 2, 3
    tensors = [torch.randn(batch, heads, frames, head, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    embedded = torch.randn(heads, 2 * frames - 1, head, dtype=torch.float64, requires_grad=True)
    valid = lengths_to_mask(torch.tensor([frames, (frames + 1) // 2]), frames)[:, None, None, :]
    keep = torch.rand(batch, heads, frames, frames) > 0.3
    for dropout, mask in ((0.0, None), (0.3, keep)):
        assert torch.autograd.gradcheck(
            lambda q_u, q_v, k, v, e: relative_attention(q_u, q_v, k, v, e, valid, dropout, mask), (*tensors, embedded))
    # with the mask: the probabilities' kept entries scaled by 1 / (1 - p), as SDPA's dropout
    q_u, q_v, k, v = tensors
    scores = (q_u @ k.transpose(-2, -1) + torch.stack(
        [torch.stack([embedded[:, frames - 1 - i + j] for j in range(frames)], -2) for i in range(frames)], -3)
        .unsqueeze(0).mul(q_v.unsqueeze(-2)).sum(-1)) / math.sqrt(head)
    probs = torch.softmax(scores.masked_fill(~valid, float("-inf")), -1)
    torch.testing.assert_close(relative_attention(q_u, q_v, k, v, embedded, valid, 0.3, keep),
                               (probs * keep / 0.7) @ v)


def test_the_cpu_relative_attentions_own_dropout_keeps_the_expected_output():
    """Dropout drawn inside (no mask given): each draw differs, and their mean is the output without it."""
    torch.manual_seed(7)
    q_u, q_v, k, v = (torch.randn(1, 1, 4, 2, dtype=torch.float64) for _ in range(4))
    embedded = torch.randn(1, 7, 2, dtype=torch.float64)
    valid = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    draws = torch.stack([relative_attention(q_u, q_v, k, v, embedded, valid, 0.5) for _ in range(4000)])
    assert not torch.equal(draws[0], draws[1])
    torch.testing.assert_close(draws.mean(0), relative_attention(q_u, q_v, k, v, embedded, valid), atol=0.05, rtol=0)


# ---------------------------------------------------------------- padding and the batch


def features_and_lengths(lengths=(60, 45, 31), extra: int = 0, seed: int = 2):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max(lengths), FEATURES, generator=generator)
    x = torch.cat([x, torch.zeros(len(lengths), extra, FEATURES)], dim=1)
    for row, length in enumerate(lengths):
        x[row, length:] = 50.0 * torch.randn(x.shape[1] - length, FEATURES, generator=generator)  # loud garbage
    return x, torch.tensor(lengths)


@pytest.mark.parametrize("positions", ["relative", "absolute"])
@pytest.mark.parametrize("conv_norm", ["batchnorm", "layernorm", "groupnorm", "none"])
def test_an_utterances_output_does_not_depend_on_how_much_its_batch_was_padded_even_in_training(conv_norm, positions):
    model = encoder(conv_norm=conv_norm, positions=positions).train()  # dropout is 0: training mode is deterministic
    x, lengths = features_and_lengths()
    padded, _ = features_and_lengths(extra=40)
    short, mask, out_lengths = model(x, lengths)
    long, _, _ = model(padded, lengths)
    for row, length in enumerate(out_lengths.tolist()):
        torch.testing.assert_close(long[row, :length], short[row, :length], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("conv_norm", ["layernorm", "groupnorm", "none"])
def test_norms_other_than_batchnorm_give_an_utterance_the_same_output_alone_or_in_a_batch_in_training(conv_norm):
    model = encoder(conv_norm=conv_norm).train()
    x, lengths = features_and_lengths()
    together, _, out_lengths = model(x, lengths)
    alone, _, _ = model(x[1:2, : int(lengths[1])], lengths[1:2])
    torch.testing.assert_close(alone[0], together[1, : int(out_lengths[1])], atol=1e-5, rtol=1e-4)


def test_batchnorm_uses_its_running_statistics_at_evaluation_so_an_utterance_alone_reads_as_in_a_batch():
    model = encoder().train()
    x, lengths = features_and_lengths()
    for _ in range(3):
        model(x, lengths)  # running statistics move off their initial values
    model.eval()
    together, _, out_lengths = model(x, lengths)
    alone, _, _ = model(x[2:3, : int(lengths[2])], lengths[2:3])
    torch.testing.assert_close(alone[0], together[2, : int(out_lengths[2])], atol=1e-5, rtol=1e-4)
    norm = model.layers[0].conv_module.norm
    assert int(norm.num_batches_tracked) == 3 and not torch.allclose(norm.running_var, torch.ones_like(norm.running_var))


# ---------------------------------------------------------------- the masked norms against torch's own


def test_masked_batchnorm_is_torchs_batchnorm_over_the_valid_frames_alone():
    torch.manual_seed(3)
    channels, lengths = 6, torch.tensor([9, 5, 2])
    x = torch.randn(3, channels, 9)
    mask = lengths_to_mask(lengths, 9)
    ours, peer = MaskedBatchNorm1d(channels), torch.nn.BatchNorm1d(channels)
    with torch.no_grad():
        ours.weight.normal_(), ours.bias.normal_()
    peer.load_state_dict(ours.state_dict())
    x.requires_grad_(True)
    got = ours(x, mask)
    valid = torch.cat([x[row, :, : int(n)] for row, n in enumerate(lengths)], dim=1)  # (C, valid frames)
    expected = peer(valid.T.unsqueeze(-1)).squeeze(-1).T  # every valid frame an item of torch's batch
    torch.testing.assert_close(torch.cat([got[row, :, : int(n)] for row, n in enumerate(lengths)], dim=1), expected)
    torch.testing.assert_close(ours.running_mean, peer.running_mean)
    torch.testing.assert_close(ours.running_var, peer.running_var)
    weights = torch.randn(expected.shape)
    (ours_grad,) = torch.autograd.grad((torch.cat([got[r, :, : int(n)] for r, n in enumerate(lengths)], 1) * weights).sum(), x)
    (peer_grad,) = torch.autograd.grad((expected * weights).sum(), x)
    torch.testing.assert_close(ours_grad, peer_grad)
    ours.eval(), peer.eval()
    torch.testing.assert_close(ours(x, mask), peer(x))


def test_masked_groupnorm_is_torchs_groupnorm_on_each_utterance_cut_to_its_length():
    torch.manual_seed(4)
    lengths = torch.tensor([9, 4])
    x = torch.randn(2, 8, 9)
    for groups in (1, 4):
        ours, peer = MaskedGroupNorm(groups, 8), torch.nn.GroupNorm(groups, 8)
        with torch.no_grad():
            ours.weight.normal_(), ours.bias.normal_()
        peer.load_state_dict(ours.state_dict())
        got = ours(x, lengths_to_mask(lengths, 9))
        for row, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(got[row, :, :n], peer(x[row : row + 1, :, :n])[0])


def test_channel_layernorm_is_torchs_layernorm_over_each_frames_channels():
    x = torch.randn(2, 8, 5)
    norm = ChannelLayerNorm(8)
    torch.testing.assert_close(norm(x), F.layer_norm(x.transpose(1, 2), (8,)).transpose(1, 2))


def _synced_batchnorm_worker(rank: int, port: int, results) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    x, mask, weights = _ddp_batches()
    norm = MaskedBatchNorm1d(4)
    mine = x[rank].clone().requires_grad_(True)
    ((norm(mine, mask[rank]) * weights[rank]).sum()).backward()
    results[rank] = (mine.grad.clone(), norm.running_mean.clone(), norm.running_var.clone())
    dist.destroy_process_group()


def _ddp_batches():
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 4, 10, generator=generator) * torch.tensor([1.0, 3.0]).view(2, 1, 1, 1)  # ranks differ
    mask = torch.stack([lengths_to_mask(torch.tensor([10, 6, 3]), 10), lengths_to_mask(torch.tensor([8, 8, 1]), 10)])
    return x, mask, torch.randn(2, 3, 4, 10, generator=generator)


@pytest.mark.slow
def test_under_ddp_batchnorm_statistics_and_gradients_are_the_whole_global_batchs():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_synced_batchnorm_worker, args=(port, results), nprocs=2, join=True)
    x, mask, weights = _ddp_batches()
    norm = MaskedBatchNorm1d(4)
    whole = torch.cat([x[0], x[1]]).requires_grad_(True)
    ((norm(whole, torch.cat([mask[0], mask[1]])) * torch.cat([weights[0], weights[1]])).sum()).backward()
    for rank in range(2):
        grad, running_mean, running_var = results[rank]
        torch.testing.assert_close(grad, whole.grad[3 * rank : 3 * rank + 3], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(running_mean, norm.running_mean)
        torch.testing.assert_close(running_var, norm.running_var)


# ---------------------------------------------------------------- placement, keys, the model


def test_each_placement_puts_the_norms_where_docs_normalization_md_draws_them():
    published = encoder()
    assert all(block.pre_norm and block.final_norm is not None for block in published.layers)
    assert published.final_norm is None  # each block closes with its own
    bare = encoder(final_norm=False)
    assert all(block.final_norm is None for block in bare.layers) and bare.final_norm is not None
    post = encoder(layer_norm="post", final_norm=False)
    assert not post.layers[0].pre_norm and post.final_norm is None
    rms = ConformerEncoder(from_dict(TransformerConfig, {**_plain(), "norm_type": "rmsnorm"}, "model"), FEATURES)
    assert isinstance(rms.layers[0].ff1_norm, torch.nn.RMSNorm)
    assert isinstance(rms.layers[0].conv_module.norm, MaskedBatchNorm1d)  # conv_norm is its own key


def _plain() -> dict:
    return {"d_model": D_MODEL, "heads": HEADS, "encoder": {"kind": "conformer", "num_layers": 1, "ff_dim": FF}}


def test_the_post_norm_block_normalises_after_each_residual_sum():
    block = encoder(layer_norm="post", final_norm=False, positions="absolute").eval().layers[0]
    x, mask = torch.randn(2, 6, D_MODEL), torch.ones(2, 6, dtype=torch.bool)
    h = block.ff1_norm(x + 0.5 * block.ff1(x))
    h = block.self_attn_norm(h + block.self_attn(h, *block.self_attn.project_kv(h), mask[:, None, None, :]))
    h = block.conv_module_norm(h + block.conv_module(h, mask))
    h = block.ff2_norm(h + 0.5 * block.ff2(h))
    torch.testing.assert_close(block(x, mask, None), h)


@pytest.mark.parametrize("key, value, message", [
    ("conv_norm", "layernorm", "'model.encoder.conv_norm' for encoder kind 'transformer'; it is a key of 'conformer'"),
    ("positions", "absolute", "'model.encoder.positions' for encoder kind 'transformer'; it is a key of 'conformer'"),
])
def test_a_conformer_key_on_a_transformer_encoder_is_an_error_naming_it(key, value, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(TransformerConfig, {"encoder": {key: value}}, "model")


def test_bad_conformer_keys_are_errors_naming_them():
    for settings, message in (({"conv_kernel": 4}, "conv_kernel must be a positive odd"),
                              ({"conv_norm": "instancenorm"}, "model.encoder.conv_norm"),
                              ({"conv_norm": "groupnorm", "conv_norm_groups": 3}, "conv_norm_groups must divide")):
        with pytest.raises(ConfigError, match=message):
            from_dict(TransformerConfig, {**_plain(), "encoder": {"kind": "conformer", **settings}}, "model")


@pytest.mark.slow
def test_the_conformer_model_trains_and_decodes_with_the_transformers_decoder_and_joint_loss():
    torch.manual_seed(0)
    model = Transformer(config(), FEATURES, vocab_size=12)
    assert isinstance(model.encoder, ConformerEncoder)
    x, lengths = features_and_lengths()
    tokens = torch.randint(3, 12, (3, 4))
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(120):
        output = model(x, lengths, tokens, torch.tensor([4, 3, 2]))
        optimiser.zero_grad()
        output.loss.backward()
        optimiser.step()
        losses.append(output.loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert output.ctc_loss is not None and output.attention_loss is not None
    model.eval()
    with torch.no_grad():
        greedy = decode(model, x, lengths, DecodingOptions(max_len_ratio=1.0))
        beam = decode(model, x, lengths, DecodingOptions(beam_size=3, ctc_weight=0.3, max_len_ratio=1.0))
    targets = [tokens[0].tolist(), tokens[1, :3].tolist(), tokens[2, :2].tolist()]
    assert greedy == targets and beam == targets  # three memorised utterances read back


# ---------------------------------------------------------------- the training/evaluation gap of BatchNorm


def test_batch_statistics_gives_training_modes_batchnorm_and_moves_no_running_statistic():
    import copy

    from asr.models.norms import batch_statistics

    model = encoder().train()
    x, lengths = features_and_lengths()
    model(x, lengths)  # running statistics off their initial values
    model.eval()
    before = copy.deepcopy(model.state_dict())
    trained = copy.deepcopy(model).train()(x, lengths)[0]  # dropout is 0: only the norms differ
    with batch_statistics(model) as count:
        inside = model(x, lengths)[0]
    assert count == LAYERS
    torch.testing.assert_close(inside, trained)
    assert not model.training and not any(m.training for m in model.modules())
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("conv_norm", ["batchnorm", "layernorm"])
def test_the_batchnorm_gap_metric_measures_encoders_with_batchnorm_only(conv_norm):
    from asr.training.metrics import BatchNormGap, ValidBatch, metrics_for

    torch.manual_seed(0)
    model = Transformer(config(conv_norm=conv_norm), FEATURES, vocab_size=12)
    names = [m.name for m in metrics_for(model)]
    assert ("valid_batchnorm_gap" in names) == (conv_norm == "batchnorm")
    if conv_norm != "batchnorm":
        return
    x, lengths = features_and_lengths()
    tokens, token_lengths = torch.randint(3, 12, (3, 4)), torch.tensor([4, 3, 2])
    for _ in range(2):
        model.train()(x, lengths, tokens, token_lengths)
    model.eval()

    class Batch:
        features, feature_lengths = x, lengths

    gap = BatchNormGap()
    with torch.no_grad():  # as validation runs
        gap.add(ValidBatch(Batch, model, model(x, lengths, tokens, token_lengths), None, [], [], None))
    trained = Transformer(config(conv_norm=conv_norm), FEATURES, vocab_size=12)
    trained.load_state_dict(model.state_dict())
    with torch.no_grad():
        train_out, mask, _ = trained.encoder.train()(x, lengths)
        eval_out, _, _ = model.encoder(x, lengths)
    valid = mask.unsqueeze(-1)
    expected = float(((train_out - eval_out) * valid).norm() / (eval_out * valid).norm())
    assert gap.result() == pytest.approx(expected, rel=1e-4) and gap.result() > 0.01

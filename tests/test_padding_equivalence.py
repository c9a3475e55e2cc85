"""``data.pad_frames_to`` pads a batch's frames past its longest utterance (asr.data.batching). Every model
must give each utterance of a padded batch the outputs, the loss and the gradients of the unpadded batch:
the masks hold, and BatchNorm leaves the padding out of its statistics (the Conformer's convolution module).

Each test collates the same items twice, once as the loader did before the option and once padded
(with loud values written into the padding after collating, so that a mask that leaks shows), and
compares in training mode (dropout 0: deterministic), where BatchNorm normalises with the batch's own
statistics and moves its running ones.
"""

from __future__ import annotations

import pytest
import torch

from asr.data.batching import BucketBatchSampler, collate
from asr.data.padding import padded_frames
from asr.models.las import LAS
from helpers import INPUT_DIM, VOCAB, make_transformer, small_las_config

LENGTHS = (37, 29, 18)  # frames of the three utterances; the longest is 37
TOKENS = (6, 4, 2)


def items(input_dim: int, vocab: int) -> list[dict]:
    generator = torch.Generator().manual_seed(5)
    return [
        {"id": f"utt{i}", "features": torch.randn(frames, input_dim, generator=generator),
         "tokens": torch.randint(3, vocab, (tokens,), generator=generator)}
        for i, (frames, tokens) in enumerate(zip(LENGTHS, TOKENS))
    ]


def las():
    torch.manual_seed(0)
    return LAS(small_las_config(ctc_weight=0.3, label_smoothing=0.1), input_dim=6, vocab_size=10), 6, 10


def transformer():
    return make_transformer(dropout=0.0), INPUT_DIM, VOCAB


def conformer_batchnorm():
    model = make_transformer(dropout=0.0, encoder={"kind": "conformer", "conv_kernel": 5, "conv_norm": "batchnorm"})
    return model, INPUT_DIM, VOCAB


def conformer_through_sdpa():
    """The Conformer with its relative attention through SDPA's additive mask, as on CUDA."""
    model, input_dim, vocab = conformer_batchnorm()
    for module in model.modules():
        if hasattr(module, "cpu_node"):
            module.cpu_node = False
    return model, input_dim, vocab


MODELS = {"las": las, "transformer": transformer, "conformer": conformer_batchnorm,
          "conformer-sdpa": conformer_through_sdpa}


def run(model, batch):
    """Training-mode loss, per-utterance outputs (encoder states within each length, CTC and decoder
    log-probabilities) and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    output = model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
    output.loss.backward()
    with torch.no_grad():
        encoder = model.encode(batch.features, batch.feature_lengths)  # training mode too: BatchNorm's batch statistics
        decoder = teacher_forced_steps(model, encoder, batch.tokens)
    rows = []
    for row in range(len(batch)):
        frames = int(encoder.lengths[row])
        rows.append({
            "encoder": encoder.out[row, :frames],
            "ctc": None if encoder.ctc_log_probs is None else encoder.ctc_log_probs[row, :frames],
            "decoder": decoder[row, : int(batch.token_lengths[row]) + 1],  # <sos> + its tokens
        })
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    return output.loss.detach(), rows, gradients, buffers


@pytest.mark.parametrize("pad_to", [64, [40, 48, 96]], ids=["multiple", "buckets"])
@pytest.mark.parametrize("name", MODELS)
def test_a_padded_batch_gives_each_utterance_the_outputs_loss_and_gradients_of_the_unpadded_one(name, pad_to):
    model, input_dim, vocab = MODELS[name]()
    model.train()
    data = items(input_dim, vocab)
    plain, padded = collate(data), collate(data, pad_frames_to=pad_to)
    assert plain.features.shape[1] == max(LENGTHS) == plain.frames
    assert padded.features.shape[1] == padded.frames == padded_frames(max(LENGTHS), pad_to) > max(LENGTHS)
    torch.testing.assert_close(padded.features[:, : max(LENGTHS)], plain.features, rtol=0, atol=0)
    for row, length in enumerate(LENGTHS):
        padded.features[row, length:] = 1e3  # a leaking mask would carry these into the outputs
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss, rows, gradients, buffers = run(model, plain)
    model.load_state_dict(state)  # BatchNorm's running statistics back to where they were
    padded_loss, padded_rows, padded_gradients, padded_buffers = run(model, padded)

    torch.testing.assert_close(padded_loss, loss, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(padded_rows, rows):
        for key in ("encoder", "ctc", "decoder"):
            if theirs[key] is not None:
                torch.testing.assert_close(mine[key], theirs[key], rtol=1e-4, atol=1e-5)
    assert gradients.keys() == padded_gradients.keys() and gradients
    for key, gradient in gradients.items():
        torch.testing.assert_close(padded_gradients[key], gradient, rtol=1e-4, atol=1e-6, msg=f"gradient of {key}")
    # BatchNorm's running statistics moved by the valid frames alone
    for key, buffer in buffers.items():
        torch.testing.assert_close(padded_buffers[key], buffer, rtol=1e-5, atol=1e-6, msg=f"buffer {key}")


def teacher_forced_steps(model, encoder, tokens: torch.Tensor) -> torch.Tensor:
    """(B, L + 1, V) decoder log-probabilities fed ``<sos>`` and then ``tokens`` step by step, through the
    interface every model implements (so one comparison serves the LAS and the Transformers alike)."""
    state = model.init_decoder_state(encoder)
    previous = torch.full((tokens.size(0),), model.sos_id, dtype=torch.long)
    steps = []
    for step in range(tokens.size(1) + 1):
        log_probs, state = model.decode_step(previous, state, encoder)
        steps.append(log_probs)
        if step < tokens.size(1):
            previous = tokens[:, step]
    return torch.stack(steps, dim=1)


def test_the_budget_counts_the_padding_so_a_padded_batch_holds_no_more_frames_than_unpadded():
    generator = torch.Generator().manual_seed(0)
    frames = torch.randint(50, 1700, (3000,), generator=generator).tolist()
    budget = 20000
    for pad_to in (1, 64, [200, 400, 800, 1200, 1600, 1700]):
        sampler = BucketBatchSampler(frames, budget, shuffle=True, seed=3, pad_frames_to=pad_to)
        batches = list(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(len(frames)))  # each utterance once
        for batch in batches:
            assert len(batch) * padded_frames(max(frames[i] for i in batch), pad_to) <= budget


def test_padded_batches_are_split_between_ranks_as_unpadded_ones_are():
    """Distributed training: every rank gets the same number of batches and together they cover the epoch."""
    frames = [(37 * i) % 1500 + 100 for i in range(1000)]
    ranks = [BucketBatchSampler(frames, 16000, seed=1, num_replicas=3, rank=r, pad_frames_to=128) for r in range(3)]
    for sampler in ranks:
        sampler.set_epoch(2)
    shares = [list(sampler) for sampler in ranks]
    assert len({len(share) for share in shares}) == 1
    assert {i for share in shares for batch in share for i in batch} == set(range(len(frames)))

"""The teacher-forced speller on CUDA graphs (asr/models/speller_graphs.py).

On CPU (CI): the padding the recordings rely on changes no output and no gradient
(:func:`padded_call` around the eager loop), and the graphs are only used where
they apply. On a GPU: replayed graphs give the eager loop's outputs and gradients.
"""

from __future__ import annotations

import copy

import pytest
import torch

from asr.models import cuda_graphs as graphs
from asr.models import speller_graphs
from asr.config import from_dict, to_dict
from asr.models.attention import AttentionConfig
from asr.models.common import lengths_to_mask
from asr.models.speller import Speller, SpellerConfig

VOCAB, KEY = 13, 10
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make(kind="location", heads=1, layers=2, device="cpu", **options) -> Speller:
    torch.manual_seed(0)
    speller = Speller(
        SpellerConfig(embedding_dim=6, hidden_size=12, num_layers=layers, **options),
        from_dict(AttentionConfig, {"type": kind, "dim": 8, "heads": heads,  # the filters: location's keys
                                    **({"conv_channels": 3, "conv_kernel": 5} if kind == "location" else {})}),
        VOCAB,
        KEY,
    )
    return speller.to(device)


def inputs(batch, time, length, device="cpu", seed=1):
    """Rows of different lengths (frames and tokens), padded as a batch would be."""
    generator = torch.Generator().manual_seed(seed)
    frame_lengths = torch.randint(1, time + 1, (batch,), generator=generator)
    frame_lengths[0] = time
    mask = lengths_to_mask(frame_lengths, time)
    keys = torch.randn(batch, time, KEY, generator=generator) * mask.unsqueeze(-1)
    decoder_input = torch.randint(3, VOCAB, (batch, length), generator=generator)
    decoder_input[:, 0] = 1  # <sos>
    token_lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    decoder_input[~lengths_to_mask(token_lengths, length)] = 0  # <pad>
    return decoder_input.to(device), keys.to(device), mask.to(device)


def outputs_and_grads(speller, decoder_input, keys, mask, forward) -> dict:
    """forward(decoder_input, keys, mask) -> log-probs, weights, and the gradients of a
    random linear loss on both with respect to the keys and every parameter."""
    speller.zero_grad(set_to_none=True)
    keys = keys.detach().clone().requires_grad_()
    log_probs, weights = forward(decoder_input, keys, mask)
    generator = torch.Generator().manual_seed(3)
    loss = sum((t.float() * torch.randn(t.shape, generator=generator).to(t.device)).sum() for t in (log_probs, weights))
    loss.backward()
    result = {"log_probs": log_probs, "weights": weights, "grad keys": keys.grad}
    result.update({f"grad {name}": p.grad for name, p in speller.named_parameters() if p.grad is not None})
    return {name: value.detach().float().cpu().clone() for name, value in result.items()}


def recorded(speller, kind: str) -> list:
    """The keys of the speller's recordings of one kind ("teacher-forced" or "step")."""
    recordings = speller.__dict__.get("_cuda_graphs")
    return [key for key in (recordings.entries if recordings else {}) if key[0] == kind]


def assert_close(actual: dict, expected: dict, tol: float) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        scale = max(1.0, value.abs().max().item())
        torch.testing.assert_close(actual[name], value, rtol=tol, atol=tol * scale, msg=lambda m, name=name: f"{name}: {m}")


def test_padded_shapes():
    assert speller_graphs.padded_shape(26, 130, 19) == (32, 144, 24)
    assert speller_graphs.padded_shape(32, 128, 24) == (32, 128, 24)
    for batch, time, length in [(1, 1, 1), (9, 300, 77), (40, 1000, 200)]:
        b, t, n = speller_graphs.padded_shape(batch, time, length)
        assert batch <= b < batch + 8 and time <= t <= max(time + 15, time * 9 // 8) and length <= n < length + 8


@pytest.mark.parametrize("kind, heads", [("location", 1), ("content", 2), ("dot", 1)])
def test_padding_changes_no_output_or_gradient(kind, heads):
    """The eager loop on padded inputs (more rows, frames and steps), cut back, equals the
    eager loop on the batch as it is: outputs, the keys' gradient and every parameter's."""
    speller = make(kind, heads).train()  # no dropout, no sampling: deterministic
    decoder_input, keys, mask = inputs(batch=5, time=21, length=11)
    expected = outputs_and_grads(speller, decoder_input, keys, mask, speller.teacher_forced)

    def padded(decoder_input, keys, mask):
        return speller_graphs.padded_call(speller, decoder_input, keys, mask, speller.teacher_forced)

    actual = outputs_and_grads(speller, decoder_input, keys, mask, padded)
    assert actual["log_probs"].shape == (5, 11, VOCAB) and actual["weights"].shape == (5, 11, 21)
    assert_close(actual, expected, tol=1e-5)


def test_graphs_apply_only_to_cuda_training_with_gradients():
    speller = make().train()
    keys = torch.randn(2, 4, KEY)
    assert not speller_graphs.teacher_forcing_applies(speller, keys)  # CPU
    if torch.cuda.is_available():
        speller.cuda()
        keys = keys.cuda()
        assert speller_graphs.teacher_forcing_applies(speller, keys)
        with torch.no_grad():
            assert not speller_graphs.teacher_forcing_applies(speller, keys)
        assert not speller_graphs.teacher_forcing_applies(speller.eval(), keys)
        assert not speller_graphs.teacher_forcing_applies(make("mocha", device="cuda").train(), keys)


@needs_cuda
@pytest.mark.parametrize("kind, heads", [("location", 1), ("content", 2), ("dot", 1)])
def test_replayed_graphs_match_the_eager_loop(kind, heads):
    """Recorded once, replayed for another batch of the same bucket and for a bigger one:
    outputs and gradients as the eager loop's."""
    speller = make(kind, heads, device="cuda").train()
    for batch, time, length, seed in [(5, 21, 11, 1), (7, 24, 13, 2), (5, 21, 11, 3), (19, 70, 30, 4)]:
        decoder_input, keys, mask = inputs(batch, time, length, "cuda", seed)
        expected = outputs_and_grads(speller, decoder_input, keys, mask, speller.teacher_forced)
        assert speller_graphs.teacher_forcing_applies(speller, keys)
        actual = outputs_and_grads(speller, decoder_input, keys, mask, speller)
        assert_close(actual, expected, tol=1e-5)
    assert len(recorded(speller, "teacher-forced")) == 2, "the first three batches share one bucket"
    assert graphs.SPELLER_POLICY.enabled, "a recording failed and the loop fell back to eager runs"
    copied = copy.deepcopy(speller)  # a copy starts without the original's graphs
    assert len(copied.__dict__["_cuda_graphs"].entries) == 0


@needs_cuda
def test_replayed_graphs_under_bf16_autocast():
    """Under bf16 autocast (as asr.train with amp: true), within bf16's rounding of the
    eager loop under the same autocast, with scheduled sampling and dropout recorded too."""
    speller = make(device="cuda").train()
    decoder_input, keys, mask = inputs(6, 30, 12, "cuda")

    def under_autocast(forward):
        def run(*args):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return forward(*args)

        return run

    expected = outputs_and_grads(speller, decoder_input, keys, mask, under_autocast(speller.teacher_forced))
    actual = outputs_and_grads(speller, decoder_input, keys, mask, under_autocast(speller))
    assert_close(actual, expected, tol=3e-2)
    with torch.no_grad():  # as an optimizer step would: the replay must cast the new weights
        for p in speller.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    expected = outputs_and_grads(speller, decoder_input, keys, mask, under_autocast(speller.teacher_forced))
    actual = outputs_and_grads(speller, decoder_input, keys, mask, under_autocast(speller))
    assert_close(actual, expected, tol=3e-2)
    noisy = make(device="cuda", dropout=0.3, sampling_probability=0.5).train()
    first = outputs_and_grads(noisy, decoder_input, keys, mask, under_autocast(noisy))
    second = outputs_and_grads(noisy, decoder_input, keys, mask, under_autocast(noisy))
    assert torch.isfinite(first["log_probs"]).all() and not torch.equal(first["log_probs"], second["log_probs"])


# --- decoding ----------------------------------------------------------------------------


def step_through_recordings(speller) -> None:
    """Decode with this speller's steps taken through its recordings (:func:`speller_graphs.decoding_step`)
    although they are on CPU: a recording there holds its padded buffers but no graph, and runs the step
    eagerly on them, so the bookkeeping is exercised without a GPU."""
    speller.step = lambda tokens, state: speller_graphs.decoding_step(speller, tokens, state)


def decode_all(model, batch, device):
    """Greedy and beam search (with and without CTC) on ``batch``: hypotheses and scores."""
    from asr.decoding import DecodingOptions, beam_search, greedy_search

    features, lengths = batch[0].to(device), batch[1].to(device)
    with torch.no_grad():
        encoder = model.encode(features, lengths)
        results = {"greedy": greedy_search(model, encoder, DecodingOptions(max_len_ratio=1.0))}
        for name, options in {
            "beam": DecodingOptions(beam_size=3, max_len_ratio=1.0),
            "beam+ctc": DecodingOptions(beam_size=4, ctc_weight=0.4, max_len_ratio=1.0),
        }.items():
            hypotheses = beam_search(model, encoder, options, nbest=3)
            results[name] = [[(h.tokens, round(h.score, 4)) for h in hyps] for hyps in hypotheses]
    return results


def small_las(kind):
    from helpers import small_las_config as small_config

    from asr.models.las import LAS

    torch.manual_seed(2)
    config = small_config(ctc_weight=0.3)
    # read as its type's class; the filters are location's keys
    own = to_dict(config.attention) if kind == "location" else {"dim": config.attention.dim}
    config.attention = from_dict(AttentionConfig, {**own, "type": kind})
    return LAS(config, input_dim=6, vocab_size=10).eval()


def decoding_batch():
    """Five utterances of different lengths: under an untrained model each runs to its own
    maximum length, so utterances leave the beam search's batch at different steps."""
    generator = torch.Generator().manual_seed(4)
    lengths = torch.tensor([60, 41, 33, 20, 9])
    features = torch.randn(5, 60, 6, generator=generator) * lengths_to_mask(lengths, 60).unsqueeze(-1)
    return features, lengths


@pytest.mark.parametrize("kind", ["location", "content", "dot"])
def test_decoding_recordings_bookkeeping_on_cpu(kind):
    """The recorded decoding step's buffers (padded rows and frames, stale values from an earlier
    call, the listener part copied in only when utterances leave), run on CPU with the step
    re-run eagerly on them: greedy and beam search give the eager decoder's hypotheses and scores."""
    model = small_las(kind)
    batch = decoding_batch()
    expected = decode_all(model, batch, "cpu")
    with torch.no_grad():
        state = model.init_decoder_state(model.encode(*batch))
        assert not speller_graphs.decoding_applies(model.speller, state), "off CUDA a step runs eagerly"
    step_through_recordings(model.speller)
    actual = decode_all(model, batch, "cpu")
    assert len(recorded(model.speller, "step")) >= 2, "15 rows and then fewer use several recordings"
    assert actual == expected


def test_decoding_runs_eagerly_once_the_recordings_are_full(monkeypatch):
    """Beyond its capacity (or memory share) a speller records no new shape: those steps run
    eagerly, with the same results."""
    model = small_las("location")
    batch = decoding_batch()
    expected = decode_all(model, batch, "cpu")
    step_through_recordings(model.speller)
    monkeypatch.setattr(speller_graphs, "CAPACITY", 1)
    actual = decode_all(model, batch, "cpu")
    assert len(recorded(model.speller, "step")) == 1 and model.speller.__dict__["_cuda_graphs"].full
    assert actual == expected


@needs_cuda
@pytest.mark.parametrize("kind", ["location", "content", "dot"])
def test_replayed_decoding_steps_match_the_eager_decoder(kind, monkeypatch):
    model = small_las(kind).cuda()
    batch = decoding_batch()
    monkeypatch.setattr(model.speller, "cuda_graphs", False)
    expected = decode_all(model, batch, "cuda")
    monkeypatch.setattr(model.speller, "cuda_graphs", True)
    actual = decode_all(model, batch, "cuda")
    assert graphs.SPELLER_POLICY.enabled, "a recording failed and the decoder fell back to eager steps"
    assert len(recorded(model.speller, "step")) >= 2
    assert actual == expected

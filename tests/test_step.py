"""asr/training/step.py: the gradient norm of each module group, as the trainer logs it."""

from __future__ import annotations

import math

import pytest
import torch

from asr.data.batching import Batch
from asr.models.las import LAS
from asr.training.skips import SkipReason
from asr.training.step import TrainingStep, all_finite, gradient_groups
from helpers import las_batch as random_batch
from helpers import small_las_config as small_config
from helpers import make_transformer as make_model


def las_step(grad_clip: float) -> TrainingStep:
    torch.manual_seed(0)
    model = LAS(small_config(ctc_weight=0.3), input_dim=6, vocab_size=10)
    return TrainingStep(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_clip=grad_clip)


def batch_of(tensors) -> Batch:
    features, feature_lengths, tokens, token_lengths = tensors
    return Batch([f"u{i}" for i in range(len(features))], features, feature_lengths, tokens, token_lengths)


def expected_norms(model: torch.nn.Module, prefixes: dict[str, str]) -> dict[str, float]:
    """The norm of each group's gradients, grouped by the given name prefixes (longest first)."""
    squares: dict[str, float] = {}
    for name, p in model.named_parameters():
        group = next(g for prefix, g in sorted(prefixes.items(), key=lambda kv: -len(kv[0])) if name.startswith(prefix))
        squares[group] = squares.get(group, 0.0) + float(p.grad.double().pow(2).sum())
    return {group: math.sqrt(total) for group, total in squares.items()}


@pytest.mark.parametrize("grad_clip", [0.0, 1e-3])
def test_las_group_norms_are_taken_before_clipping_and_add_up_to_the_global_norm(grad_clip):
    step = las_step(grad_clip)
    assert step.backward(batch_of(random_batch())).loss is not None
    prefixes = {"listener.": "listener", "speller.": "speller", "speller.attention.": "attention", "ctc.": "ctc"}
    expected = expected_norms(step.model, prefixes)
    outcome = step.update(group_norms=True)
    assert set(outcome.group_norms) == {"listener", "speller", "attention", "ctc"}
    for group, norm in expected.items():
        assert outcome.group_norms[group] == pytest.approx(norm, rel=1e-5), group
    total = math.sqrt(sum(n**2 for n in outcome.group_norms.values()))
    assert total == pytest.approx(outcome.grad_norm, rel=1e-5)
    if grad_clip:  # the clipped gradient is far smaller than what was reported
        assert outcome.grad_norm > 100 * grad_clip


def test_group_norms_only_when_asked_for_and_transformer_groups():
    step = las_step(0.0)
    step.backward(batch_of(random_batch()))
    assert step.update().group_norms is None
    model = make_model(ctc_weight=0.3)
    assert set(gradient_groups(model).values()) == {"encoder", "decoder", "ctc"}
    wrapped = torch.nn.Module()
    wrapped.module = model  # as DistributedDataParallel holds it
    assert gradient_groups(wrapped) == gradient_groups(model)


# ---------------------------------------------------------------- CUDA out of memory, simulated on CPU


def _out_of_memory(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


class _OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        _out_of_memory()


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_batch_out_of_memory_is_skipped_with_its_size_and_its_gradients_dropped(where):
    step = las_step(grad_clip=5.0)
    model = step.model
    batch = batch_of(random_batch())
    assert step.backward(batch, scale=0.5).loss is not None  # a first accumulated batch
    before = {k: v.clone() for k, v in model.state_dict().items()}
    original = model.forward

    def forward(*args):
        if where == "forward":
            _out_of_memory()
        output = original(*args)
        output.loss = _OutOfMemoryInBackward.apply(output.loss)
        return output

    model.forward = forward
    outcome = step.backward(batch, scale=0.5)
    frames, longest = int(batch.feature_lengths.sum()), int(batch.feature_lengths.max())
    assert outcome.loss is None
    assert outcome.skipped.reason is SkipReason.OUT_OF_MEMORY
    assert outcome.skipped.message == (f"CUDA out of memory in the {where} pass of a batch of 3 utterances, "
                               f"{frames} frames (longest {longest})")
    assert all(p.grad is None for p in model.parameters())  # what was accumulated is dropped with it
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.forward = original
    assert step.backward(batch).loss is not None and step.update().grad_norm > 0  # and training goes on


def _ddp_out_of_memory_worker(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    from datetime import timedelta

    # a rank left waiting (the ranks disagreeing on the skip) fails within a minute instead of hanging
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    raw = LAS(small_config(ctc_weight=0.3), input_dim=6, vocab_size=10)
    model = torch.nn.parallel.DistributedDataParallel(raw)
    step = TrainingStep(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_clip=5.0, distributed=True)
    features, *rest = random_batch()
    batch = batch_of((features + 0.1 * rank, *rest))  # each rank its own batch
    original = raw.forward
    if rank == 1:  # only rank 1 runs out of memory, in the forward pass
        raw.forward = _out_of_memory
    first = step.backward(batch)
    raw.forward = original
    second = step.backward(batch)  # both ranks go on together: no rank is left waiting in an all-reduce
    update = step.update()
    results[rank] = (first.skipped, second.loss, update.grad_norm, float(sum(p.sum() for p in raw.parameters())))
    dist.destroy_process_group()


@pytest.mark.slow
def test_under_ddp_every_rank_skips_the_batch_one_rank_ran_out_of_memory_on():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_ddp_out_of_memory_worker, args=(port, results), nprocs=2, join=True)
    assert results[0][0] == results[1][0] and results[0][0].reason is SkipReason.OUT_OF_MEMORY
    assert results[0][0].message.startswith("CUDA out of memory in the forward pass")
    assert results[0][1] == results[1][1] is not None  # the next batch: the loss averaged over both ranks
    assert results[0][2:] == results[1][2:]  # the same update on both ranks


def _audio_and_feature_batches(pipeline, seconds=(0.5, 0.8, 0.3)):
    """The same three utterances as a batch of audio (features.compute_on: device) and of features."""
    from asr.data.batching import collate

    generator = torch.Generator().manual_seed(3)
    waveforms = [0.1 * torch.randn(int(16000 * s), generator=generator) for s in seconds]
    tokens = [torch.tensor([4, 5, 6][: i + 1]) for i in range(len(waveforms))]
    audio = collate([{"id": f"u{i}", "audio": pipeline.prepare(w, 16000), "tokens": t}
                     for i, (w, t) in enumerate(zip(waveforms, tokens))])
    features = collate([{"id": f"u{i}", "features": pipeline.from_waveform(w, 16000), "tokens": t}
                        for i, (w, t) in enumerate(zip(waveforms, tokens))])
    return audio, features


def test_an_audio_batch_gets_its_features_inside_the_step_and_out_of_memory_there_is_skipped():
    from features.config import FeatureConfig
    from features.pipeline import FeaturePipeline

    pipeline = FeaturePipeline(FeatureConfig(kind="fbank", num_mel_bins=6, mvn="utterance"))
    step = las_step(grad_clip=5.0)
    step.pipeline = pipeline
    audio, features = _audio_and_feature_batches(pipeline)
    assert audio.features is None
    from_audio = step.backward(audio).loss
    step.optimizer.zero_grad(set_to_none=True)
    assert from_audio == pytest.approx(step.backward(features).loss, rel=1e-5)  # the same features, the same loss
    step.optimizer.zero_grad(set_to_none=True)

    pipeline.features = _out_of_memory  # the batch's first allocation on a GPU is its features
    outcome = step.backward(audio)
    assert outcome.loss is None and outcome.skipped.message.startswith("CUDA out of memory in the forward pass of a batch of 3")
    del pipeline.features
    assert step.backward(audio).loss == pytest.approx(from_audio)

    step.pipeline = None
    with pytest.raises(ValueError, match="compute_on: device"):
        step.backward(audio)


def test_an_update_that_would_make_a_weight_non_finite_is_undone_with_the_optimizer_state():
    """A finite gradient times a huge rate overflows the weights (issue 81: lr=.inf saved 74 non-finite
    tensors in last.pt); the step is skipped as a non-finite gradient is, and nothing of it remains."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e38, momentum=0.9)
    step = TrainingStep(model, optimizer, grad_clip=0.0)  # a gradient norm of 500 times 1e38: past float32
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model(torch.full((2, 4), 10.0)).pow(2).sum().backward()
    outcome = step.update()
    assert outcome.skipped is not None and outcome.skipped.reason is SkipReason.NONFINITE_UPDATE
    assert outcome.skipped.message.startswith("non-finite weights after the update")
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
        assert p.grad is None and optimizer.state[p] == {}  # no momentum from the undone step
    # the same step at a sane rate then goes through as it would have on a fresh optimizer
    for group in optimizer.param_groups:
        group["lr"] = 0.1
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    fresh = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for net, opt in ((model, optimizer), (reference, fresh)):
        net(torch.full((2, 4), 10.0)).pow(2).sum().backward()
        TrainingStep(net, opt, grad_clip=0.0).update() if net is reference else step.update()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name


def test_a_checkpoint_with_a_non_finite_weight_is_not_written(tmp_path):
    from asr.checkpoints.io import CheckpointError, save_checkpoint

    weights = {"layer.weight": torch.tensor([1.0, math.inf]), "count": torch.tensor(3)}
    with pytest.raises(CheckpointError, match=r"cannot save model.layer.weight: 1 of its 2 values are NaN or infinite"):
        save_checkpoint(tmp_path / "last.pt", {"config": {}, "model": weights})
    assert list(tmp_path.iterdir()) == []


def test_the_multi_tensor_finite_check_agrees_with_checking_each_tensor():
    """OptimizerSnapshot's check (one multi-tensor norm per dtype) against torch.isfinite tensor by tensor:
    huge finite values are finite, one NaN or inf anywhere is not, in any dtype of a mixed list."""
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(5, generator=generator) * 1e38, torch.randn(3, 2, generator=generator).bfloat16(),
               torch.zeros(()), torch.randn(7, dtype=torch.float64, generator=generator)]
    assert all_finite(tensors)
    for index in range(len(tensors)):
        for bad in (float("nan"), float("inf"), float("-inf")):
            spoilt = [t.clone() for t in tensors]
            spoilt[index].view(-1)[-1] = bad
            assert all_finite(spoilt) == all(bool(torch.isfinite(t).all()) for t in spoilt) is False


def _largest_magnitudes(optimizer: torch.optim.Optimizer) -> tuple[float, float, float]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    states = [optimizer.state[p] for p in params]
    weights = max(float(p.detach().abs().max()) for p in params)
    first = max(float(s["exp_avg"].abs().max()) for s in states)
    second = max(float(s[k].abs().max()) for s in states for k in ("exp_avg_sq", "max_exp_avg_sq") if k in s)
    return weights, first, second


@pytest.mark.parametrize("kind, options", [
    (torch.optim.Adam, {"lr": 0.05}),
    (torch.optim.Adam, {"lr": 0.3, "weight_decay": 0.5, "amsgrad": True, "betas": (0.5, 0.9)}),
    (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 3.0, "eps": 1e-3}),
    (torch.optim.AdamW, {"lr": 1.0, "weight_decay": 2.5, "betas": (0.0, 0.5)}),  # |1 - lr wd| > 1: the decay grows |w|
])
@pytest.mark.parametrize("grad_clip", [0.0, 0.5])
def test_the_adam_bound_holds_the_magnitudes_the_optimizer_reaches(kind, options, grad_clip):
    """AdamBound's bounds on the weights and Adam's two moments are never below what the tensors hold, over
    steps with gradients of very different sizes and signs; a bound that was wrong would let a step go
    unchecked that could overflow."""
    generator = torch.Generator().manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    optimizer = kind(model.parameters(), **options)
    step = TrainingStep(model, optimizer, grad_clip=grad_clip)
    for update in range(60):
        scale = 10.0 ** float(torch.randint(-3, 4, (), generator=generator))
        inputs = torch.randn(4, 5, generator=generator) * scale
        model(inputs).pow(3).sum().backward()
        skipped = step.update().skipped  # a gradient that overflowed is skipped before the bound is consulted
        assert skipped is None or skipped.reason is SkipReason.NONFINITE_GRADIENT
        bounds = (step._bound._weights, step._bound._first, step._bound._second)
        for held, bound in zip(_largest_magnitudes(optimizer), bounds):
            assert held <= bound, (update, held, bound)


@pytest.mark.parametrize("kind, options, updates", [
    (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01}, 30),
    # L2 decay feeds the weights back into the gradient: a bound through 1 / eps grew without end here
    (torch.optim.Adam, {"lr": 1e-3, "weight_decay": 1e-4, "eps": 1e-9, "betas": (0.9, 0.98)}, 300),
])
def test_a_sane_adam_run_keeps_no_copies_and_steps_as_the_checked_path_does(monkeypatch, kind, options, updates):
    """With a sane rate every step is proven safe, so the copy that undoes a step is never made; the weights
    are those of the same steps made through the copy and the check."""
    from asr.training import step as step_module

    kept = []
    keep = step_module.OptimizerSnapshot.keep
    monkeypatch.setattr(step_module.OptimizerSnapshot, "keep", lambda self, opt: (kept.append(1), keep(self, opt)))
    models = []
    for proven in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 4)
        step = TrainingStep(model, kind(model.parameters(), **options), grad_clip=5.0)
        step._bound.enabled = proven
        for update in range(updates):
            model(torch.randn(3, 6)).pow(2).sum().backward()
            assert step.update().skipped is None
        models.append(model)
        assert (len(kept) == 0) if proven else (len(kept) == updates)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(p, q)


def test_an_adam_step_the_bound_cannot_prove_safe_is_copied_and_checked(monkeypatch):
    """Adam at a rate of 1e30: its first step moves the weights by about the rate, finite, but the bound
    (rate / epsilon) cannot prove it, so the step takes the copy and the check, and goes through."""
    from asr.training import step as step_module

    kept = []
    keep = step_module.OptimizerSnapshot.keep
    monkeypatch.setattr(step_module.OptimizerSnapshot, "keep", lambda self, opt: (kept.append(1), keep(self, opt)))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    step = TrainingStep(model, torch.optim.Adam(model.parameters(), lr=1e30), grad_clip=1.0)
    model(torch.ones(2, 4)).sum().backward()
    assert step.update().skipped is None and kept == [1]
    assert 1e29 < float(model.weight.detach().abs().max()) < 1e31

"""The one training step, shared by :class:`asr.training.trainer.Trainer` and speaker adaptation.

    step = TrainingStep(model, optimizer, scheduler, grad_clip=5.0)
    for batch in batches:
        outcome = step.backward(batch)          # forward under autocast, finite check, backward
        if outcome.loss is not None:
            step.update()                       # clip, finite check, optimiser and scheduler step

A step whose loss or gradient norm is not finite never reaches the weights:
``backward`` leaves the gradients untouched when the loss is not finite (the
caller decides whether to drop what was accumulated), and ``update`` clears
the gradients without stepping when their norm is not finite. A finite gradient can still make a
weight non-finite (a huge learning rate, an optimiser state that overflowed): ``update`` keeps the
weights and the optimiser state as they were before it stepped, checks them after, and undoes a step
that left any of them non-finite, so that no checkpoint ever holds one. For Adam and AdamW it first asks
:class:`AdamBound` whether the step can do that at all: the bound, from the step's rate, epsilon, betas,
weight decay and clipped gradient norm, proves that it cannot in any run with a sane rate, and then the
copy and the check (the loop's largest cost of its own on a CPU) are not needed. A batch that runs
CUDA out of memory in the forward or backward pass is skipped the same way, with
its gradients dropped and the cache emptied (under DistributedDataParallel only in
the forward pass, where the ranks still agree before any gradient is exchanged; in
the backward pass the error is raised). Either way the
returned :class:`StepOutcome` says why (a :class:`~asr.training.skips.SkippedStep`), so the caller
can log it with the batch's utterances and count it by its reason (:mod:`asr.training.skips`). With gradient accumulation, call ``backward``
for each batch (``scale=1 / accum``) and ``update`` once.

``update(group_norms=True)`` also returns the gradient norm of each module
group (:func:`gradient_groups`), before clipping, so a reader can see where
the gradient is (e.g. where layer normalisation acts); the group norms add
up in quadrature to the global norm. It costs one norm per parameter, so the
trainer asks for it only at the steps it logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from asr.data.batching import with_features
from asr.training.skips import SkippedStep, SkipReason, describe  # noqa: F401 (describe re-exported)
from features.pipeline import FeaturePipeline


@dataclass(frozen=True)
class StepOutcome:
    """What one call did: ``loss`` (the batch's loss, averaged over ranks) or ``skipped`` (why not)."""

    loss: float | None = None
    skipped: SkippedStep | None = None
    grad_norm: float | None = None
    group_norms: dict[str, float] | None = None  # group -> its gradient norm before clipping, when asked for


def gradient_groups(model: torch.nn.Module) -> dict[str, str]:
    """Parameter name -> its group: the model's top-level module (``listener``, ``speller``,
    ``ctc``; ``encoder``, ``decoder``), unless a prefix in the model's ``gradient_groups``
    attribute (e.g. LAS: ``{"speller.attention.": "attention"}``) names another. A wrapper
    (DistributedDataParallel) is looked through."""
    model = getattr(model, "module", model)
    overrides = getattr(model, "gradient_groups", {})
    groups = {}
    for name, _ in model.named_parameters():
        matches = [prefix for prefix in overrides if name.startswith(prefix)]
        groups[name] = overrides[max(matches, key=len)] if matches else name.split(".", 1)[0]
    return groups


def out_of_memory_message(batch, where: str) -> str:
    """``"CUDA out of memory in the forward pass of a batch of 12 utterances, 9600 frames (longest 800)"``."""
    lengths = batch.feature_lengths
    return (
        f"CUDA out of memory in the {where} pass of a batch of {len(batch)} utterances, "
        f"{int(lengths.sum())} frames (longest {int(lengths.max())})"
    )


def _out_of_memory(batch, where: str) -> StepOutcome:
    return StepOutcome(skipped=SkippedStep(SkipReason.OUT_OF_MEMORY, out_of_memory_message(batch, where)))


class TrainingStep:
    """Forward, backward and update of ``model`` with ``optimizer`` (and ``scheduler``, stepped per update).

    parameters: what is clipped (default: every parameter with a gradient);
    grad_clip: the maximum global gradient norm (0 = no clipping, the norm is still checked);
    use_amp: run the forward under bf16 autocast (CUDA);
    distributed: all-reduce the finiteness checks and the reported loss over the process group;
    pipeline: computes the features of batches that hold audio (``features.compute_on: device``), inside
    the out-of-memory guard, since on a GPU they are the first thing the batch allocates.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler=None,
        grad_clip: float = 0.0,
        parameters: list[torch.nn.Parameter] | None = None,
        use_amp: bool = False,
        distributed: bool = False,
        pipeline: FeaturePipeline | None = None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.max_norm = grad_clip if grad_clip > 0 else float("inf")
        self.parameters = parameters
        self.use_amp = use_amp
        self.distributed = distributed
        self.pipeline = pipeline
        self.groups = gradient_groups(model)
        self._before = OptimizerSnapshot()
        self._bound = AdamBound(optimizer, parameters)
        self._model_parameters = list(model.parameters())

    def backward(self, batch, scale: float = 1.0) -> StepOutcome:
        """Loss of ``batch`` (a :class:`~asr.data.batching.Batch` on the model's device) and its gradients
        times ``scale``; skipped when the loss is not finite or the batch has no utterance left."""
        device = next(self.model.parameters()).device
        usable = torch.tensor(float(len(batch) > 0), device=device)
        if self.distributed:
            dist.all_reduce(usable, op=dist.ReduceOp.MIN)  # every rank skips together, or none does
        if usable.item() == 0:
            return StepOutcome(skipped=SkippedStep(SkipReason.EMPTY_BATCH, "no utterance left in the batch"))
        if batch.audio is not None and self.pipeline is None:
            raise ValueError("the batch holds audio (features.compute_on: device) but the step has no pipeline")
        try:
            batch = with_features(batch, self.pipeline)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.use_amp):
                output = self.model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
            loss = output.loss
            finite = torch.isfinite(loss.detach()).float()
        except torch.cuda.OutOfMemoryError:
            output = loss = finite = None
        if finite is None:  # out of memory; freed here, outside the except block, whose traceback holds the activations
            self._free_memory()
            finite = torch.tensor(-1.0, device=device)  # -1: out of memory, agreed on like a non-finite loss
        if self.distributed:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if finite.item() < 0:
            return _out_of_memory(batch, "forward")
        if finite.item() == 0:
            return StepOutcome(skipped=SkippedStep(SkipReason.NONFINITE_LOSS, f"non-finite loss {loss.item()}"))
        try:
            (loss * scale).backward()
        except torch.cuda.OutOfMemoryError:
            if self.distributed:
                # The other ranks are inside DistributedDataParallel's gradient all-reduce,
                # which this rank cannot join: no agreed skip is possible here.
                raise torch.cuda.OutOfMemoryError(
                    f"{out_of_memory_message(batch, 'backward')}; under DistributedDataParallel a batch can be "
                    "skipped only when the forward pass runs out of memory. Lower data.max_frames_per_batch"
                ) from None
            output = loss = None  # the graph and its activations go with them
        if loss is None:  # out of memory in the backward pass
            self._free_memory()
            return _out_of_memory(batch, "backward")
        value = loss.detach()
        if self.distributed:
            dist.all_reduce(value)
            value /= dist.get_world_size()
        return StepOutcome(loss=float(value))

    def update(self, group_norms: bool = False) -> StepOutcome:
        """Clip and check the accumulated gradients, then step the optimiser (and scheduler).

        Gradients are cleared either way; a non-finite norm skips the step.
        group_norms: also return the norm of each parameter group's gradient (before clipping).
        """
        params = self.parameters
        if params is None:
            # the model's parameter list is walked once (module.parameters() recurses through every submodule:
            # 1.8 ms an update for the Conformer's 587 tensors on a CPU, in benchmarks/loop_overhead.py's profile)
            params = [p for p in self._model_parameters if p.grad is not None]
        groups = self._group_norms(params) if group_norms else None
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return StepOutcome(skipped=SkippedStep(SkipReason.NONFINITE_GRADIENT, f"non-finite gradient norm {norm.item()}"))
        proven = self._bound.after_step(min(float(norm), self.max_norm))
        if proven is not None:  # no value can leave the finite range in this step: nothing to keep or check
            self.optimizer.step()
            self._bound.advance(proven)
        else:
            self._before.keep(self.optimizer)
            self.optimizer.step()
            spoilt = self._before.nonfinite(self.optimizer)
            if spoilt is not None:
                self._before.restore(self.optimizer)
                self.optimizer.zero_grad(set_to_none=True)
                message = f"non-finite {spoilt} after the update (gradient norm {float(norm):.4g}); the update was undone"
                return StepOutcome(skipped=SkippedStep(SkipReason.NONFINITE_UPDATE, message))
            if self._bound.enabled:
                self._bound.measure()  # checked finite: the bounds start again from what the tensors hold
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(grad_norm=float(norm), group_norms=groups)

    def _free_memory(self) -> None:
        """After CUDA ran out of memory: drop the gradients (the caller skips the batch) and return
        the cached blocks, so the next batch starts from what the weights and optimizer hold."""
        self.optimizer.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _group_norms(self, params: list[torch.nn.Parameter]) -> dict[str, float]:
        """Group -> norm of the gradients of ``params`` in that group."""
        clipped = {id(p) for p in params}
        squares: dict[str, list[torch.Tensor]] = {}
        for name, p in getattr(self.model, "module", self.model).named_parameters():
            if p.grad is not None and id(p) in clipped:
                squares.setdefault(self.groups[name], []).append(torch.linalg.vector_norm(p.grad.float()) ** 2)
        return {group: float(torch.stack(values).sum().sqrt()) for group, values in squares.items()}


class AdamBound:
    """Upper bounds on the magnitudes an Adam or AdamW optimiser's tensors can reach, carried from step to
    step, so that a step which cannot make any of them non-finite needs no copy to undo it.

    Per element, with a gradient ``g`` of magnitude at most ``G`` (the clipped global norm bounds every element;
    Adam's L2 decay adds ``wd |w|``), PyTorch's Adam sets ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``
    and moves the weight by ``lr * m_hat / (sqrt(v_hat) + eps)``. Both moments sum the same gradients, so by
    Cauchy-Schwarz ``|m_hat| / sqrt(v_hat) <= 1 / sqrt((1 - b2)(1 - b1^2 / b2))`` whenever ``b1^2 < b2``
    (17 for betas 0.9 and 0.98, 73 for 0.9 and 0.999), whatever the gradients: ``|w|`` grows by at most
    ``lr`` times that a step (times ``|1 - lr wd|`` first, for AdamW's decoupled decay). Otherwise the
    denominator is at least ``eps`` and ``m_hat <= M / (1 - b1)``. ``M`` and ``V`` follow their own recurrences.
    The bounds start from the tensors' largest magnitudes (measured at the first step and after every checked
    one; a resumed run's moments came from the same recurrence). With a rate of 1e-3 the weights' bound grows
    by at most 0.073 a step, so a sane run never needs the copy. A step is proven safe while
    every bound stays below ``SAFE_SHARE`` of its dtype's largest finite value; any other optimiser, a rate or
    epsilon that is not finite and positive, or a bound past that share sends the step back to the copy and
    the check (:class:`OptimizerSnapshot`).
    """

    SAFE_SHARE = 1e-8

    def __init__(self, optimizer: torch.optim.Optimizer, parameters: list[torch.nn.Parameter] | None = None):
        self.optimizer = optimizer
        params = OptimizerSnapshot._params(optimizer)
        modelled = type(optimizer) in (torch.optim.Adam, torch.optim.AdamW)
        # the clipped norm bounds a gradient only of what was clipped: with a list given, the optimiser's
        # parameters must all be in it
        clipped = parameters is None or {id(p) for p in params} <= {id(p) for p in parameters}
        self.enabled = modelled and clipped and all(p.is_floating_point() for p in params)
        self._count = -1
        self._weights = self._first = self._second = float("inf")
        self._limit = 0.0

    def measure(self) -> None:
        """Take the bounds from the largest magnitudes the parameters and the optimiser's moments hold now."""
        params = OptimizerSnapshot._params(self.optimizer)
        self._count = len(params)
        self._limit = self.SAFE_SHARE * min(torch.finfo(p.dtype).max for p in params) if params else 0.0
        states = [self.optimizer.state.get(p, {}) for p in params]
        first = [s["exp_avg"] for s in states if isinstance(s.get("exp_avg"), torch.Tensor)]
        second = [s[k] for s in states for k in ("exp_avg_sq", "max_exp_avg_sq") if isinstance(s.get(k), torch.Tensor)]
        self._weights = _largest([p.detach() for p in params])
        self._first, self._second = _largest(first), _largest(second)

    def after_step(self, gradient_bound: float) -> tuple[float, float, float] | None:
        """The bounds after a step whose gradient elements are at most ``gradient_bound``, when all stay safe;
        None when this step must be copied and checked instead."""
        if not self.enabled:
            return None
        if self._count != sum(len(group["params"]) for group in self.optimizer.param_groups):
            self.measure()
        weights, first, second = self._weights, self._first, self._second
        new = [0.0, 0.0, 0.0]
        for group in self.optimizer.param_groups:
            lr, eps, decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            b1, b2 = (float(b) for b in group["betas"])
            if not (0.0 < lr < float("inf") and 0.0 < eps < float("inf") and 0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0
                    and decay >= 0.0):
                return None
            decoupled = isinstance(self.optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
            gradient = gradient_bound + (0.0 if decoupled else decay * weights)
            m = b1 * first + (1.0 - b1) * gradient
            v = max(second, b2 * second + (1.0 - b2) * gradient * gradient)  # amsgrad keeps the largest v seen
            shrink = max(1.0, abs(1.0 - lr * decay)) if decoupled else 1.0
            if b1 * b1 < b2:
                # |m_hat / sqrt(v_hat)| <= 1 / sqrt((1 - b2)(1 - b1^2 / b2)) whatever the gradients were
                # (Cauchy-Schwarz over the two moments' sums of the same gradients; 17 for betas 0.9, 0.98)
                ratio = 1.0 / math.sqrt((1.0 - b2) * (1.0 - b1 * b1 / b2))
            else:
                ratio = m / ((1.0 - b1) * eps)  # the denominator is at least eps
            w = weights * shrink + lr * ratio
            new = [max(new[0], w, ratio), max(new[1], m), max(new[2], v)]
        if not all(value < self._limit for value in new):  # a NaN fails the comparison as well
            return None
        return new[0], new[1], new[2]

    def advance(self, bounds: tuple[float, float, float]) -> None:
        self._weights, self._first, self._second = bounds


def _largest(tensors: list[torch.Tensor]) -> float:
    """The largest magnitude in ``tensors`` (0 for none; NaN when one holds a NaN), read from the device once."""
    largest = [torch.zeros((), dtype=torch.float64)]
    for indices in _by_device_and_dtype(tensors).values():
        norms = torch._foreach_norm([tensors[i] for i in indices], float("inf"))
        largest.append(torch.stack(norms).max().to("cpu", torch.float64))
    return float(torch.stack(largest).max())  # max propagates a NaN


class OptimizerSnapshot:
    """The tensors an optimiser step changes (its parameters and their state), copied before the step so
    that a step which made any of them non-finite can be undone.

    The copies live in buffers made at the first step and refilled at every one after it, so a step costs
    one copy of the parameters and the optimiser state (Adam: three times the parameters), and no
    allocation; that is what it takes to undo an update that cannot be predicted from the gradient alone.
    The copies and the finiteness check are multi-tensor operations (``torch._foreach_*``): on a GPU a few
    launches for the whole model instead of about four per tensor (some 3,000 an update for the LibriSpeech
    Transformer's 361 parameter tensors and their Adam state). Looped tensor by tensor in Python they were
    the training loop's largest cost of its own (benchmarks/loop_overhead.py); on a CPU, where these
    operations still go tensor by tensor, they now cost 2.7-3.6 times less (docs/benchmarks.md).
    """

    def __init__(self):
        self._sources: list[torch.Tensor] = []  # what keep() copied last: parameters, each followed by its state
        self._targets: list[torch.Tensor] = []  # their copies, in the same order
        self._kept: list[tuple[torch.Tensor, dict]] = []

    def keep(self, optimizer: torch.optim.Optimizer) -> None:
        params = self._params(optimizer)
        states = [optimizer.state.get(p, {}) for p in params]
        sources = [t for p, state in zip(params, states) for t in (p, *state.values()) if isinstance(t, torch.Tensor)]
        # An optimiser updates its parameters and state tensors in place, so from the second step on they are the
        # very tensors of the step before and their copies can be reused as they are: no allocation, and no
        # per-tensor bookkeeping in Python (what a step costs the host here is one list and one multi-tensor copy).
        if len(sources) != len(self._sources) or any(a is not b for a, b in zip(sources, self._sources)):
            self._sources, self._targets = sources, [torch.empty_like(t) for t in sources]
        copies = iter(self._targets)
        self._kept = []
        for state in states:
            weights = next(copies)
            # values that are not tensors (a step count an optimiser keeps as a number) are kept as they are now
            self._kept.append((weights, {k: next(copies) if isinstance(v, torch.Tensor) else v for k, v in state.items()}))
        with torch.no_grad():
            _copy_all(self._targets, sources)

    def nonfinite(self, optimizer: torch.optim.Optimizer) -> str | None:
        """What the step left non-finite ("weights", "optimizer state"), or None when all is finite."""
        params = [p.detach() for p in self._params(optimizer)]
        states = [v for p in self._params(optimizer) for v in optimizer.state.get(p, {}).values()
                  if isinstance(v, torch.Tensor) and v.is_floating_point()]
        for what, tensors in (("weights", params), ("optimizer state", states)):
            if tensors and not all_finite(tensors):
                return what
        return None

    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for param, (weights, state) in zip(self._params(optimizer), self._kept):
                param.copy_(weights)
                optimizer.state[param] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}

    @staticmethod
    def _params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
        return [p for group in optimizer.param_groups for p in group["params"]]


def _by_device_and_dtype(tensors: list[torch.Tensor]) -> dict:
    """Indices of ``tensors`` grouped by (device, dtype): a multi-tensor operation takes one group at a time."""
    groups: dict[tuple, list[int]] = {}
    for index, tensor in enumerate(tensors):
        groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    return groups


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    for indices in _by_device_and_dtype(sources).values():
        torch._foreach_copy_([targets[i] for i in indices], [sources[i] for i in indices])


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value of every tensor is finite: the largest magnitude of each (NaN where one is NaN,
    inf where one is infinite, finite otherwise, however large) with one multi-tensor norm per group."""
    largest = []
    for indices in _by_device_and_dtype(tensors).values():
        largest += [n.float() for n in torch._foreach_norm([tensors[i] for i in indices], float("inf"))]
    return bool(torch.isfinite(torch.stack(largest)).all())

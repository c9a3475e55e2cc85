"""The one training step, shared by :class:`asr.training.trainer.Trainer` and speaker adaptation.

    step = TrainingStep(model, optimizer, scheduler, grad_clip=5.0)
    for batch in batches:
        outcome = step.backward(batch)          # forward under autocast, finite check, backward
        if outcome.loss is not None:
            step.update()                       # clip, finite check, optimiser and scheduler step

A step whose loss or gradient norm is not finite never reaches the weights:
``backward`` leaves the gradients untouched when the loss is not finite (the
caller decides whether to drop what was accumulated), and ``update`` clears
the gradients without stepping when their norm is not finite. Either way the
returned :class:`StepOutcome` says why, so the caller can log it with the
batch's utterances (:func:`describe`) and count it. With gradient accumulation, call ``backward``
for each batch (``scale=1 / accum``) and ``update`` once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class StepOutcome:
    """What one call did: ``loss`` (the batch's loss, averaged over ranks) or ``skipped`` (why not)."""

    loss: float | None = None
    skipped: str | None = None
    grad_norm: float | None = None


def describe(ids: list[str]) -> str:
    """The first few utterance ids of a batch, for a message about it."""
    return ", ".join(ids[:8]) + (f" ... ({len(ids)} utterances)" if len(ids) > 8 else "")


class TrainingStep:
    """Forward, backward and update of ``model`` with ``optimizer`` (and ``scheduler``, stepped per update).

    parameters: what is clipped (default: every parameter with a gradient);
    grad_clip: the maximum global gradient norm (0 = no clipping, the norm is still checked);
    use_amp: run the forward under bf16 autocast (CUDA);
    distributed: all-reduce the finiteness checks and the reported loss over the process group.
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
    ):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.max_norm = grad_clip if grad_clip > 0 else float("inf")
        self.parameters = parameters
        self.use_amp = use_amp
        self.distributed = distributed

    def backward(self, batch, scale: float = 1.0) -> StepOutcome:
        """Loss of ``batch`` (a :class:`~asr.data.batching.Batch` on the model's device) and its gradients
        times ``scale``; skipped when the loss is not finite or the batch has no utterance left."""
        device = next(self.model.parameters()).device
        usable = torch.tensor(float(len(batch) > 0), device=device)
        if self.distributed:
            dist.all_reduce(usable, op=dist.ReduceOp.MIN)  # every rank skips together, or none does
        if usable.item() == 0:
            return StepOutcome(skipped="no utterance left in the batch")
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.use_amp):
            output = self.model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
        loss = output.loss
        finite = torch.isfinite(loss.detach()).float()
        if self.distributed:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if finite.item() == 0:
            return StepOutcome(skipped=f"non-finite loss {loss.item()}")
        (loss * scale).backward()
        value = loss.detach()
        if self.distributed:
            dist.all_reduce(value)
            value /= dist.get_world_size()
        return StepOutcome(loss=float(value))

    def update(self) -> StepOutcome:
        """Clip and check the accumulated gradients, then step the optimiser (and scheduler).

        Gradients are cleared either way; a non-finite norm skips the step.
        """
        params = self.parameters
        if params is None:
            params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return StepOutcome(skipped=f"non-finite gradient norm {norm.item()}")
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(grad_norm=float(norm))

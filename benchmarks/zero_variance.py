"""What zero-variance input rows do to each LN-LSTM variant: a numerical experiment, not a speed benchmark.

    python benchmarks/zero_variance.py            # about a minute on one core
    python benchmarks/zero_variance.py --steps 0  # the gradient tables only

The study that asked for ``model.lnlstm_variant`` ran row-by-row MNIST: each
28-pixel image row is one time step, and the top and bottom rows of an MNIST
digit are blank (exact zeros). Here the images are synthetic stand-ins (no
MNIST on this machine): ten random stroke prototypes, drawn with jitter in a
16-row band, so that 4-8 rows at the top and the bottom are exactly zero. One
LN-LSTM layer (H = 128) reads the rows and a linear layer classifies its last
output, in float32.

Part 1, gradients at initialisation: for every variant and input kind (blank
rows as in MNIST, the same images with the blank rows set to a constant 0.5,
noise in place of them, and noise with only the first row blank), the loss, ``max |dL/dh_t|`` and
``max |dL/dc_t|`` at each step (the carried state), the largest gradient of
every parameter group, and whether any is NaN/inf. Part 2, training: Adam,
clipping by global norm as TensorFlow's ``clip_by_global_norm`` (a
non-finite norm makes every gradient NaN), and NO finite check (the study's
TensorFlow loop had none); the step at which the loss first becomes NaN, and
the training accuracy at the end. Results go to docs/normalization.md by hand.
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import torch
import torch.nn.functional as F
from torch import nn

from asr.models.lnlstm import LNLSTMCell
from asr.models.lnlstm.variants import VARIANTS, per_gate_layer_norm

ROWS = 28
HIDDEN = 128


def prototypes(generator: torch.Generator) -> torch.Tensor:
    """Ten (16, 16) stroke images in [0, 1]: three thick random line segments each."""
    images = torch.zeros(10, 16, 16)
    grid = torch.stack(torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij"), -1)
    for digit in range(10):
        for _ in range(3):
            a, b = torch.rand(2, 2, generator=generator) * 15
            direction = b - a
            along = ((grid - a) @ direction / direction.dot(direction).clamp_min(1e-6)).clamp(0, 1)
            distance = (grid - (a + along.unsqueeze(-1) * direction)).norm(dim=-1)
            images[digit] = torch.maximum(images[digit], (1.5 - distance).clamp(0, 1))
    return images


BACKGROUNDS = ("zero", "first row zero", "constant", "noise")


def digit_batch(protos: torch.Tensor, size: int, generator: torch.Generator, background: str = "zero"):
    """(size, 28, 28) images and (size,) labels. The ink sits in rows 4+s .. 19+s, s in 0..4,
    so 4-8 rows at either end are background: ``zero`` (blank rows, as in MNIST),
    ``constant`` (0.5), ``noise`` (uniform in [0, 0.1]: no row has zero variance), or
    ``first row zero`` (noise, but the first row is blank)."""
    labels = torch.randint(0, 10, (size,), generator=generator)
    noise = 0.8 + 0.4 * torch.rand(size, 16, 16, generator=generator)
    ink = (protos[labels] * noise).clamp(0, 1)
    if background == "zero":
        images = torch.zeros(size, ROWS, ROWS)
    elif background == "constant":
        images = torch.full((size, ROWS, ROWS), 0.5)
    else:
        images = 0.1 * torch.rand(size, ROWS, ROWS, generator=generator)
        if background == "first row zero":
            images[:, 0] = 0.0
    shifts = torch.randint(0, 5, (size, 2), generator=generator)
    for n in range(size):
        top, left = 4 + int(shifts[n, 0]), 4 + int(shifts[n, 1])
        images[n, top : top + 16, left : left + 16] = ink[n]
    return images, labels


class UnnormalisedCarry(LNLSTMCell):
    """Ablation: tf_contrib, but carrying the un-normalised cell (LN_c feeding the output only)."""

    def recurrent_step(self, input_gates, h, c):
        gates = per_gate_layer_norm(input_gates + F.linear(h, self.weight_h), self.ln_gates)
        i, j, f, o = gates.chunk(4, dim=-1)
        c = c * torch.sigmoid(f + self.forget_bias) + torch.sigmoid(i) * torch.tanh(j)
        return torch.tanh(self.ln_c(c)) * torch.sigmoid(o), c


# The cells compared: (name, variant, eps, ablation); the ablations change one thing of tf_contrib.
CELLS = [(v, v, None, None) for v in VARIANTS] + [
    ("tf_contrib, eps 1e-5", "tf_contrib", 1e-5, None),
    ("tf_contrib, random gate shifts", "tf_contrib", None, "random shifts"),
    ("tf_contrib, un-normalised c carried", "tf_contrib", None, "unnormalised carry"),
]


class RowClassifier(nn.Module):
    def __init__(self, variant: str, eps: float | None = None, ablation: str | None = None):
        super().__init__()
        kind = UnnormalisedCarry if ablation == "unnormalised carry" else LNLSTMCell
        self.cell = kind(ROWS, HIDDEN, variant=variant, eps=eps)
        if ablation == "random shifts":  # what the gate bias b of the other variants does at x = h = 0
            bound = 1.0 / math.sqrt(HIDDEN)
            with torch.no_grad():
                for norm in self.cell.ln_gates:
                    norm.bias.uniform_(-bound, bound)
        self.head = nn.Linear(HIDDEN, 10)

    def forward(self, images: torch.Tensor, keep_states: bool = False):
        """images (B, 28, 28) -> logits (B, 10), and the per-step (h, c) when keep_states."""
        state, states = None, []
        for row in images.unbind(1):
            state = self.cell(row, state)
            if keep_states:
                for t in state:
                    t.retain_grad()
                states.append(state)
        return self.head(state[0]), states


def fmt(value: float) -> str:
    return f"{value:.2g}" if math.isfinite(value) else str(value)


def largest(values) -> float:
    """The largest value, NaN if any is NaN (Python's max skips NaN depending on the order)."""
    values = list(values)
    return float("nan") if any(math.isnan(v) for v in values) else max(values)


def gradient_report(cell: tuple, background: str, seed: int) -> None:
    name, variant, eps, ablation = cell
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    images, labels = digit_batch(prototypes(torch.Generator().manual_seed(0)), 32, generator, background)
    model = RowClassifier(variant, eps, ablation)
    logits, states = model(images, keep_states=True)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    dh = [h.grad.abs().max().item() if h.grad is not None else 0.0 for h, _ in states]
    dc = [c.grad.abs().max().item() if c.grad is not None else 0.0 for _, c in states]
    zero_state = sum(1 for h, c in states if not h.any() and not c.any())
    groups: dict[str, float] = {}
    for parameter, p in model.cell.named_parameters():
        group = parameter.split(".")[0]
        groups[group] = largest([groups.get(group, 0.0), p.grad.abs().max().item()])
    bad = sum(int((~torch.isfinite(p.grad)).sum()) for p in model.parameters())
    first_bad = next((t for t, v in enumerate(dc) if not math.isfinite(v)), None)
    print(f"| {name} | {background} | {loss.item():.3f} | {zero_state} | "
          + " ".join(fmt(v) for v in dc[:9]) + f" | {fmt(largest(dc[9:]))} | {fmt(largest(dh))} | "
          + ", ".join(f"{k} {fmt(v)}" for k, v in groups.items())
          + f" | {bad} | {first_bad if first_bad is not None else '-'} |")


def train(cell: tuple, steps: int, seed: int, clip: float, lr: float) -> None:
    name, variant, eps, ablation = cell
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    protos = prototypes(torch.Generator().manual_seed(0))
    model = RowClassifier(variant, eps, ablation)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    first_nan, largest_norm, start = None, 0.0, time.time()
    correct = seen = 0
    for step in range(1, steps + 1):
        images, labels = digit_batch(protos, 32, generator)
        logits, _ = model(images)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if not torch.isfinite(norm):  # tf.clip_by_global_norm: a non-finite norm gives NaN gradients
            for p in model.parameters():
                p.grad.fill_(float("nan"))
        largest_norm = max(largest_norm, norm.item()) if math.isfinite(norm.item()) else float("inf")
        optimizer.step()
        if first_nan is None and not math.isfinite(loss.item()):
            first_nan = step
        if step > steps - 20:
            correct += int((logits.argmax(-1) == labels).sum())
            seen += len(labels)
    print(f"| {name} | {steps} | {first_nan or 'never'} | {fmt(largest_norm)} | "
          f"{100 * correct / seen:.0f}% | {time.time() - start:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per variant (0: skip part 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clip", type=float, default=1.0, help="global-norm clipping threshold")
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, one thread, float32, H={HIDDEN}\n")
    print(f"Part 1: gradients at initialisation (batch 32, seed {args.seed})\n")
    print("| variant | background | loss | steps with h = c = 0 | max abs dL/dc_t, t = 0..8 | t >= 9 | "
          "max abs dL/dh_t | max abs grad per parameter group | non-finite grads | first non-finite dL/dc_t |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |")
    for background in BACKGROUNDS:
        for cell in CELLS:
            gradient_report(cell, background, args.seed)
    if args.steps:
        print(f"\nPart 2: training, Adam lr {args.lr:g}, clip at global norm {args.clip:g}, no finite check, "
              f"blank rows = 0\n")
        print("| variant | steps | first NaN loss at step | largest gradient norm | train accuracy, last 20 steps | time |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for cell in CELLS:
            train(cell, args.steps, args.seed, args.clip, args.lr)


if __name__ == "__main__":
    main()

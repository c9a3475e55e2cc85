"""Time the Conformer encoder's training step against torchaudio.models.Conformer's, as ratios from one run.

    python benchmarks/conformer_step.py                   # recipes/librispeech100_conformer.yaml's blocks
    python benchmarks/conformer_step.py --threads 2 --batch 4 --seconds 8

Both stacks get the recipe's block sizes (``d_model``, heads, ``ff_dim``, ``conv_kernel``, blocks; no
dropout, as torchaudio's ``dropout=0``) and the same input: --batch utterances of (B, T', d_model)
frames after the x4 subsampling (40 ms a frame), --seconds long at most, shorter ones padded (each
utterance ``1 - 0.1 * row`` of the longest), as a bucketed batch is. One training step is the blocks'
forward, a random linear loss on the valid frames, backward and an Adam step. Rounds alternate
between the cases (so a load that comes and goes hits them alike); each case's time is the median of
--repeats rounds after --warmup.

Cases, each printed with its ratio to torchaudio's step (issue 51's goal: at most 1.1 for the
published layout):

* ``torchaudio``: ``torchaudio.models.Conformer`` (plain self-attention, no positions: the reference);
* ``ours, absolute``: the same computation here (``positions: absolute``; BatchNorm that leaves padded
  frames out, and the padding zeroed before the depthwise convolution);
* ``ours, relative``: the recipe's own (``positions: relative``, Transformer-XL attention): what a
  LibriSpeech run pays for relative positions;
* ``relative, SDPA``: the same weights with the position term handed to SDPA as an additive mask, as on
  CUDA (``cpu_node = False``), against which the CPU's own node is measured.

Then the attention kernels each case reaches (torch.autograd.profiler over one more step): SDPA's, or
the relative case's own autograd node on the CPU (``_RelativeAttention``, asr.models.relative_attention),
since a position bias that needs a gradient would keep SDPA off its fused kernel.

Results go to docs/benchmarks.md by hand, with the command, machine and date.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from torchaudio.models import Conformer as TorchaudioConformer

from asr.config import from_dict, to_dict
from asr.experiment import load_experiment_config
from asr.models.common import lengths_to_mask
from asr.models.conformer import ConformerEncoder
from asr.models.relative_attention import RelativeMultiHeadAttention, relative_positions
from asr.models.transformer import TransformerConfig

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "librispeech100_conformer.yaml"
FRAMES_PER_SECOND = 25  # after the x4 subsampling of 10 ms frames


def our_encoder(recipe: TransformerConfig, positions: str, input_dim: int) -> ConformerEncoder:
    data = to_dict(recipe)
    data.update(dropout=0.0, attention_dropout=0.0)
    data["encoder"] = {**data["encoder"], "positions": positions, "layerdrop": 0.0}
    return ConformerEncoder(from_dict(TransformerConfig, data, "model"), input_dim)


def step_of(run_blocks, parameters, shape: torch.Size, mask: torch.Tensor):
    """One training step of the stack ``run_blocks`` runs: a fixed random linear loss on its valid
    frames, backward, Adam."""
    optimizer = torch.optim.Adam(parameters, lr=1e-4)
    weights = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * mask.unsqueeze(-1)

    def step() -> None:
        (run_blocks() * weights).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def attention_kernels(step) -> str:
    """The attention kernels one training step reaches, from torch.autograd.profiler: SDPA's fused (flash) CPU
    kernel, the unfused math path that SDPA falls back to when the attention mask needs a gradient, or the
    relative attention's own node (``_RelativeAttention``)."""
    with torch.autograd.profiler.profile() as profile:
        step()
    names = {event.key.removeprefix("aten::") for event in profile.key_averages()}
    kernels = sorted(name for name in names if (name.startswith("_scaled_dot_product") and "backward" not in name)
                     or name == "_RelativeAttention")
    return ", ".join(kernels) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--batch", type=int, default=4, help="utterances per batch (4)")
    parser.add_argument("--seconds", type=float, default=8.0, help="the longest utterance (8 s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2: the 2-core machine)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = load_experiment_config(args.recipe).model
    if recipe.encoder.kind != "conformer":
        parser.error(f"{args.recipe}: model.encoder.kind is {recipe.encoder.kind!r}, not conformer")
    d_model, stack = recipe.d_model, recipe.encoder
    frames = round(args.seconds * FRAMES_PER_SECOND)
    lengths = torch.tensor([max(1, round(frames * (1 - 0.1 * row))) for row in range(args.batch)])
    mask = lengths_to_mask(lengths, frames)
    x = torch.randn(args.batch, frames, d_model, generator=torch.Generator().manual_seed(0))

    torch.manual_seed(0)
    peer = TorchaudioConformer(d_model, recipe.heads, stack.ff_dim, stack.num_layers, stack.conv_kernel, dropout=0.0).train()
    absolute = our_encoder(recipe, "absolute", 80).train()
    relative = our_encoder(recipe, "relative", 80).train()

    through_sdpa = copy.deepcopy(relative)
    for module in through_sdpa.modules():
        if isinstance(module, RelativeMultiHeadAttention):
            module.cpu_node = False

    def run_relative(encoder):
        return lambda: encoder.blocks(x, mask, relative_positions(frames, d_model, x.device))

    cases = {
        "torchaudio": step_of(lambda: peer(x, lengths)[0], peer.parameters(), x.shape, mask),
        "ours, absolute": step_of(lambda: absolute.blocks(x, mask, None), absolute.layers.parameters(), x.shape, mask),
        "ours, relative": step_of(run_relative(relative), relative.layers.parameters(), x.shape, mask),
        "relative, SDPA": step_of(run_relative(through_sdpa), through_sdpa.layers.parameters(), x.shape, mask),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_index in range(args.warmup + args.repeats):
        for name, step in cases.items():
            start = time.perf_counter()
            step()
            if round_index >= args.warmup:
                times[name].append(time.perf_counter() - start)
    reference = statistics.median(times["torchaudio"])
    print(f"{args.recipe.name}: {stack.num_layers} blocks of d_model {d_model}, {recipe.heads} heads, ff {stack.ff_dim}, "
          f"kernel {stack.conv_kernel}; batch {args.batch} x {frames} frames (lengths {lengths.tolist()}), "
          f"{args.threads} threads, median of {args.repeats}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:16s} {median * 1000:8.1f} ms a training step   {median / reference:5.2f} x torchaudio")
    for name, step in cases.items():
        print(f"  {name:16s} attention: {attention_kernels(step)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

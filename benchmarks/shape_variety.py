"""Does a training step cost more the first time it meets a batch shape? Per attention backend.

    python benchmarks/shape_variety.py --device cuda                      # the Transformer recipe
    python benchmarks/shape_variety.py --device cuda --pad-multiple 64    # frames padded to a multiple of 64
    python benchmarks/shape_variety.py --device cpu --steps 3 --frames 800 --min-seconds 1 --max-seconds 2

asr.train's batches each have their own length (the bucketing sampler fills ``data.max_frames_per_batch``
with utterances of about one length, so the padded length and the batch size change from batch to
batch). ``benchmarks/las_step.py`` times one shape again and again, so any cost paid once per new shape
(a kernel choice, a plan or a graph built and cached for that shape) never shows there. On an H200 the
Transformer recipe's loop ran at 0.72-1.08 s an update with the GPU 5-8% busy and no loader wait, while
that benchmark's step took about 0.1 s a batch (docs/benchmarks.md).

This script builds a recipe's model (``--recipe``, the Transformer's by default) and times whole training
steps (loss, backward, clipping, Adam, under the recipe's autocast) on ``--steps`` batches whose padded
lengths are drawn between ``--min-seconds`` and ``--max-seconds``, each batch holding as many utterances as
``--frames`` allows (default: the recipe's ``max_frames_per_batch``). It runs the batches twice: the first
pass meets every shape for the first time, the second meets them again. It does so with
``scaled_dot_product_attention`` left to choose its backend, then pinned to each backend in turn
(``torch.nn.attention.sdpa_kernel``); a backend that cannot run the model's masked attention is reported
as such. A second pass much faster than the first means a per-shape cost; ``--pad-multiple N`` pads every
batch's frames to a multiple of N, so that fewer shapes are new. Results go to docs/benchmarks.md by
hand, with the command, the machine and the date.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from asr.experiment import load_experiment_config
from asr.models.registry import build_model
from asr.run import build_optimizer
from las_step import FRAMES_PER_SECOND, stand_ins, step_case

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("default", "flash", "efficient", "cudnn", "math")


def batch_shapes(steps: int, frames: int, low: float, high: float, pad_multiple: int, seed: int = 0):
    """(utterances, padded frames) of ``steps`` batches: lengths drawn uniformly in seconds, each batch
    as many utterances of its length as ``frames`` holds (at least one)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = []
    for _ in range(steps):
        seconds = low + (high - low) * float(torch.rand((), generator=generator))
        length = max(1, round(seconds * FRAMES_PER_SECOND))
        padded = -(-length // pad_multiple) * pad_multiple if pad_multiple > 1 else length
        shapes.append((max(1, frames // padded), length, padded))
    return shapes


def make_batch(utterances: int, length: int, padded: int, feature_dim: int, vocab_size: int,
               tokens_per_second: float, device: torch.device):
    """Random features (B, padded, D) with ``length`` valid frames per row, and random targets."""
    generator = torch.Generator().manual_seed(length * 1000 + utterances)
    features = torch.randn(utterances, padded, feature_dim, generator=generator)
    features[:, length:] = 0.0
    num_tokens = max(1, round(length / FRAMES_PER_SECOND * tokens_per_second))
    tokens = torch.randint(3, vocab_size, (utterances, num_tokens), generator=generator)  # 0-2: pad, sos, eos
    lengths = torch.full((utterances,), length)
    token_lengths = torch.full((utterances,), num_tokens)
    return [t.to(device) for t in (features, lengths, tokens, token_lengths)]


def sdpa_context(backend: str):
    """A context that pins scaled_dot_product_attention to ``backend`` (``default``: no pin)."""
    import contextlib

    if backend == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]
    return sdpa_kernel(chosen)


def run_pass(model, optimizer, grad_clip: float, batches, device, amp: bool) -> list[float]:
    """Seconds of each whole training step, in order."""
    times = []
    for batch in batches:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            step_case(model, optimizer, grad_clip, batch)()  # as las_step.measure runs it
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def measure(args, device) -> list[dict]:
    config = load_experiment_config(ROOT / "recipes" / args.recipe, args.overrides)
    tokenizer, feature_dim = stand_ins(config)
    vocab_size = tokenizer.vocab_size
    amp = bool(config.train.amp) and device.type == "cuda"
    frames = args.frames or config.data.max_frames_per_batch
    shapes = batch_shapes(args.steps, frames, args.min_seconds, args.max_seconds, args.pad_multiple)
    batches = [make_batch(b, length, padded, feature_dim, vocab_size, args.tokens_per_second, device)
               for b, length, padded in shapes]
    print(f"{args.recipe}: {len(shapes)} batches, {len({p for _, _, p in shapes})} distinct padded lengths "
          f"({min(p for _, _, p in shapes)}-{max(p for _, _, p in shapes)} frames), about {frames} frames each; "
          f"{'bf16 autocast' if amp else 'float32'}; device {device}")
    # a shape none of the timed batches has, stepped twice before each backend's passes: what is paid once
    # per process or per backend (kernels loaded, handles made, the allocator grown) is paid there
    warm_length = max(p for _, _, p in shapes) + args.pad_multiple
    warmup = [make_batch(max(1, frames // warm_length), warm_length, warm_length, feature_dim, vocab_size,
                         args.tokens_per_second, device)] * 2
    rows = []
    for backend in args.backends:
        torch.manual_seed(0)
        model = build_model(config.model, feature_dim, tokenizer).to(device).train()
        optimizer = build_optimizer(model, config.train)
        row = {"backend": backend}
        try:
            with sdpa_context(backend):
                run_pass(model, optimizer, config.train.grad_clip, warmup, device, amp)
                row["first"] = run_pass(model, optimizer, config.train.grad_clip, batches, device, amp)
                row["again"] = run_pass(model, optimizer, config.train.grad_clip, batches, device, amp)
        except RuntimeError as err:  # the backend cannot serve these calls (masks, dtype, device)
            row["error"] = str(err).splitlines()[0][:120]
        rows.append(row)
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def report(rows: list[dict]) -> None:
    print(f"\n{'backend':<10} {'first pass ms/step':>19} {'again ms/step':>14} {'first / again':>14}")
    for row in rows:
        if "error" in row:
            print(f"{row['backend']:<10} not usable here: {row['error']}")
            continue
        first, again = statistics.mean(row["first"]), statistics.mean(row["again"])
        print(f"{row['backend']:<10} {first * 1e3:19.1f} {again * 1e3:14.1f} {first / again:14.2f}")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--recipe", default="librispeech100_transformer.yaml", help="a recipe file in recipes/")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides of the recipe, as asr.train takes them")
    parser.add_argument("--steps", type=int, default=40, help="batches, each of its own length")
    parser.add_argument("--frames", type=int, default=None, help="frames a batch (default: the recipe's max_frames_per_batch)")
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--max-seconds", type=float, default=17.0)
    parser.add_argument("--pad-multiple", type=int, default=1, help="pad each batch's frames to a multiple of this")
    parser.add_argument("--tokens-per-second", type=float, default=6.0)
    parser.add_argument("--backends", default=None, help=f"comma-separated, of {','.join(BACKENDS)} "
                        "(default: all on cuda; default,math on cpu)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (cpu only)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    if not 0 < args.min_seconds <= args.max_seconds:
        parser.error("--min-seconds must be > 0 and at most --max-seconds")
    if args.steps < 1 or args.pad_multiple < 1:
        parser.error("--steps and --pad-multiple must be at least 1")
    if args.backends is None:
        args.backends = list(BACKENDS) if device.type == "cuda" else ["default", "math"]
    else:
        args.backends = args.backends.split(",")
        unknown = [b for b in args.backends if b not in BACKENDS]
        if unknown:
            parser.error(f"--backends: unknown {unknown}; choose from {','.join(BACKENDS)}")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    rows = measure(args, device)
    report(rows)
    return rows


if __name__ == "__main__":
    main()

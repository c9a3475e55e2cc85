"""The fused C++ attention step (asr/models/attention_fused.py) against the PyTorch reference path, on CPU.

    python benchmarks/attention_step.py                      # recipes/rehearsal_las.yaml's LAS, 2 threads
    python benchmarks/attention_step.py --recipe fsdd.yaml --batch 32 --seconds 1

The recipe's LAS twice, with ``model.attention.backend`` ``reference`` and ``cpp`` (the same weights), on
one batch of --batch utterances of --seconds each with --tokens-per-second random BPE targets (the
defaults: the recipe's ``max_frames_per_batch`` of 12.7 s utterances, 8.6 pieces a second, about what
the rehearsal slice's 300-piece BPE gives). Timed, as the median of --repeats rounds after --warmup,
the two paths alternating round by round so both see the same machine:

* the speller's teacher-forced forward and backward on a fixed listener output (the attention runs
  once per output step, so this is where the paths differ), and the same with the soft diagonal
  attention prior on (the rehearsal recipe's first 800 updates of the speller: its energies leave most
  frames' weights tiny, where denormal arithmetic is slow);
* the whole training step (loss, backward, clipping, Adam), as asr.train runs it;
* greedy decoding of the batch (no gradients), up to --decode-steps output steps.

Prints the seconds and the ratio cpp / reference for each (below 1: the fused step is faster); the
results go to docs/benchmarks.md by hand, with the command, the CPU and the date.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from las_step import decoder_case, stand_ins, step_case, synthetic_batch  # noqa: E402

from asr.experiment import load_experiment_config  # noqa: E402
from asr.models import attention_fused  # noqa: E402
from asr.models.registry import build_model  # noqa: E402
from asr.run import build_optimizer  # noqa: E402


def greedy_case(model, features, lengths, steps: int):
    def run() -> None:
        model.eval()
        with torch.no_grad():
            encoder = model.encode(features, lengths)
            state = model.init_decoder_state(encoder)
            tokens = torch.full((features.size(0),), model.sos_id)
            for _ in range(steps):
                log_probs, state = model.decode_step(tokens, state, encoder)
                tokens = log_probs.argmax(-1)
        model.train()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="rehearsal_las.yaml", help="an LAS recipe in recipes/")
    parser.add_argument("--batch", type=int, default=None, help="utterances (default: fill max_frames_per_batch)")
    parser.add_argument("--seconds", type=float, default=12.7)
    parser.add_argument("--tokens-per-second", type=float, default=8.6)
    parser.add_argument("--decode-steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = load_experiment_config(ROOT / "recipes" / args.recipe)
    if config.model.type != "las":
        parser.error(f"{args.recipe} is not an LAS recipe")
    tokenizer, feature_dim = stand_ins(config)
    vocab_size = tokenizer.vocab_size
    batch_size = args.batch or max(1, config.data.max_frames_per_batch // round(args.seconds * 100))
    batch = synthetic_batch(batch_size, args.seconds, args.tokens_per_second, vocab_size, feature_dim, "cpu")
    torch.manual_seed(0)
    cases = {}
    for backend in ("reference", "cpp"):
        model_config = copy.deepcopy(config.model)
        model_config.attention.backend = backend
        torch.manual_seed(0)
        model = build_model(model_config, feature_dim, tokenizer).train()
        path = attention_fused.chosen(model.speller.attention, torch.device("cpu"), torch.float32)
        if path != backend:
            raise SystemExit(f"the {backend} path cannot run here ({path} would)")
        optimizer = build_optimizer(model, config.train)
        cases[backend] = {
            "speller forward + backward": decoder_case(model, *batch),
            "the same with the attention prior": decoder_case(model, *batch, prior=1.0),
            "whole training step": step_case(model, optimizer, config.train.grad_clip, batch),
            f"greedy decoding, {args.decode_steps} steps": greedy_case(model, batch[0], batch[1], args.decode_steps),
        }
    print(f"{args.recipe}: batch {batch_size} x {args.seconds:g} s, {batch[2].size(1)} target tokens, "
          f"{args.threads} threads, median of {args.repeats}")
    times = {(backend, name): [] for backend, named in cases.items() for name in named}
    for round_index in range(args.warmup + args.repeats):
        for backend, named in cases.items():
            for name, run in named.items():
                start = time.perf_counter()
                run()
                if round_index >= args.warmup:
                    times[backend, name].append(time.perf_counter() - start)
    for name in cases["reference"]:
        reference = statistics.median(times["reference", name])
        fused = statistics.median(times["cpp", name])
        print(f"  {name:<34} reference {reference:7.3f} s   cpp {fused:7.3f} s   ratio {fused / reference:5.2f}")


if __name__ == "__main__":
    main()

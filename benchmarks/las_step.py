"""Time one training step of each LibriSpeech-100 recipe, on synthetic features.

    python benchmarks/las_step.py --device cuda
    python benchmarks/las_step.py --device cpu        # small batch (see --batch, --seconds)

For recipes/librispeech100.yaml (LAS) and recipes/librispeech100_transformer.yaml,
each at its own model and feature sizes: a batch of --batch utterances of --seconds each
(on CUDA the default fills the recipe's ``max_frames_per_batch`` with 12.7 s
utterances, train-clean-100's mean: 100.6 h over 28,539 utterances), random
features of the recipe's dimension per 10 ms frame, and random BPE targets
(``data.bpe_vocab_size``) at --tokens-per-second (6 by default: an
assumption, not a measurement; set it to your tokenizer's rate, which decides
how many steps the LAS speller runs). The model is in training mode (dropout,
scheduled sampling) and, as asr.train does, under bf16 autocast on CUDA when
the recipe says ``amp: true``.

Timed, each as the median of --repeats rounds after --warmup rounds (the
warm-up compiles the Triton kernels and records the CUDA graphs):

* listener / encoder: forward and backward of the encoder alone;
* speller / decoder: forward and backward of the decoder alone, on a fixed
  encoder output;
* whole step: loss, backward, gradient clipping and the optimizer step, as
  in asr.train; with its peak memory (CUDA: allocated tensors; CPU: the
  process's peak resident set, which includes everything loaded before).

Then the estimated time of one train-clean-100 epoch: 100.6 h of audio in
batches of this size (padding ignored) times the whole step. Results go to
docs/benchmarks.md by hand, with the command, GPU and date.

``--compare KEY=V1,V2,...`` times instead the whole step of each recipe with KEY at each value, the
rounds interleaved (each round times every value once, in turn, so that what else the machine does falls
on all alike), and prints each value's median and its ratio to the first value's, measured in the same
run: what LN costs a LAS, say::

    python benchmarks/las_step.py --device cpu --threads 1 --recipes rehearsal_las.yaml \
        --batch 8 --seconds 8 --compare model.layer_norm=both,none
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from asr.experiment import load_experiment_config
from asr.models import lnlstm, runtime
from asr.models.registry import build_model
from asr.models.common import add_sos_eos, lengths_to_mask
from asr.models.interface import EncoderOutput
from asr.run import build_optimizer
from features.pipeline import FeaturePipeline

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("librispeech100.yaml", "librispeech100_transformer.yaml")
EPOCH_AUDIO_SECONDS = 100.6 * 3600  # train-clean-100
MEAN_UTTERANCE_SECONDS = 12.7  # 100.6 h / 28,539 utterances
FRAMES_PER_SECOND = 100  # 10 ms frame shift


def stand_ins(config) -> tuple[SimpleNamespace, int]:
    """What ``build_model`` needs from a corpus, without one: a tokenizer stand-in with the recipe's BPE
    vocabulary (ids 0-2: pad, sos, eos; 300 where the recipe names none) and the feature size of its front end."""
    tokenizer = SimpleNamespace(pad_id=0, sos_id=1, eos_id=2, vocab_size=config.data.bpe_vocab_size or 300)
    return tokenizer, FeaturePipeline(config.features).feature_dim


def synthetic_batch(batch: int, seconds: float, tokens_per_second: float, vocab_size: int, feature_dim: int, device):
    """Features (B, T, feature_dim), lengths (B,), tokens (B, L) and token lengths (B,): every
    utterance as long as the longest, as in a well-bucketed batch."""
    frames = max(1, round(seconds * FRAMES_PER_SECOND))
    num_tokens = max(1, round(seconds * tokens_per_second))
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch, frames, feature_dim, generator=generator)
    tokens = torch.randint(3, vocab_size, (batch, num_tokens), generator=generator)  # 0-2: pad, sos, eos
    lengths = torch.full((batch,), frames)
    token_lengths = torch.full((batch,), num_tokens)
    return features.to(device), lengths.to(device), tokens.to(device), token_lengths.to(device)


def encoder_case(model, features, lengths):
    """Encoder forward + backward (a random linear loss on its output)."""
    probe = {}

    def run() -> None:
        encoder = model.encode(features, lengths)
        if "weights" not in probe:
            generator = torch.Generator().manual_seed(1)
            probe["weights"] = torch.randn(encoder.out.shape, generator=generator).to(encoder.out.device)
        (encoder.out.float() * probe["weights"]).sum().backward()

    return run


def decoder_case(model, features, lengths, tokens, token_lengths, prior: float = 0.0):
    """Decoder forward + backward on a fixed (detached) encoder output; the loss is the
    summed NLL of the targets. ``prior``: a LAS speller's attention prior strength while it runs (0: none)."""
    with torch.no_grad():
        encoder = model.encode(features, lengths)
    decoder_input, target = add_sos_eos(tokens, token_lengths, model.sos_id, model.eos_id, model.pad_id)
    keys = encoder.out.detach().requires_grad_()

    def run() -> None:
        if hasattr(model, "speller"):
            model.speller.attention_prior = prior
            try:
                log_probs, _ = model.speller(decoder_input, keys, encoder.mask,
                                             target_lengths=token_lengths + 1 if prior else None)
            finally:
                model.speller.attention_prior = 0.0
        else:
            fixed = EncoderOutput(out=keys, mask=encoder.mask, lengths=encoder.lengths)
            log_probs = model.decoder_log_probs(fixed, decoder_input, token_lengths + 1)
        valid = lengths_to_mask(token_lengths + 1, target.size(1))
        nll = -log_probs.float().gather(2, target.unsqueeze(-1)).squeeze(-1)
        nll.masked_fill(~valid, 0.0).sum().backward()

    return run


def step_case(model, optimizer, grad_clip, batch):
    def run() -> None:
        output = model(*batch)
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return run


def measure(run, device, amp: bool, warmup: int, repeats: int) -> float:
    """Median seconds of ``run`` under the recipe's autocast."""
    times = []
    for index in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def recipe_model(recipe: str, overrides: list[str], args, device, batch=None):
    """The recipe's config (with ``overrides``), its model built from seed 0 in training mode, and
    ``batch``, or when it is None a synthetic batch of --batch utterances of --seconds (default: the
    recipe's max_frames_per_batch filled)."""
    config = load_experiment_config(ROOT / "recipes" / recipe, overrides)
    tokenizer, feature_dim = stand_ins(config)
    torch.manual_seed(0)
    model = build_model(config.model, feature_dim, tokenizer).to(device).train()
    if batch is not None:
        return config, model, batch
    batch_size = args.batch or max(1, config.data.max_frames_per_batch // round(args.seconds * FRAMES_PER_SECOND))
    batch = synthetic_batch(batch_size, args.seconds, args.tokens_per_second, tokenizer.vocab_size, feature_dim,
                            device)
    return config, model, batch


def benchmark_recipe(recipe: str, args, device) -> None:
    config, model, batch = recipe_model(recipe, [], args, device)
    for line in runtime.lines(runtime.describe(model, device)):  # which code this measures
        print(f"  {line}")
    optimizer = build_optimizer(model, config.train)
    amp = config.train.amp and device.type == "cuda"
    frames_per_utterance = round(args.seconds * FRAMES_PER_SECOND)
    batch_size = batch[0].size(0)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"\n{recipe}: {config.model.type}, {parameters / 1e6:.1f} M parameters; batch {batch_size} x "
        f"{args.seconds:g} s ({batch_size * frames_per_utterance} frames, {batch[2].size(1)} target tokens each); "
        f"{'bf16 autocast' if amp else 'float32'}"
    )
    names = ("listener", "speller") if config.model.type == "las" else ("encoder", "decoder")
    encoder_time = measure(encoder_case(model, batch[0], batch[1]), device, amp, args.warmup, args.repeats)
    model.zero_grad(set_to_none=True)
    decoder_time = measure(decoder_case(model, *batch), device, amp, args.warmup, args.repeats)
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step = step_case(model, optimizer, config.train.grad_clip, batch)
    step_time = measure(step, device, amp, args.warmup, args.repeats)
    if device.type == "cuda":
        peak = f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB allocated"
    else:
        peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB resident (process)"
    print(f"  {names[0]:<9} forward + backward {encoder_time * 1e3:9.1f} ms")
    print(f"  {names[1]:<9} forward + backward {decoder_time * 1e3:9.1f} ms")
    print(f"  whole step (+ clip, optimizer) {step_time * 1e3:9.1f} ms; peak memory {peak}")
    steps = EPOCH_AUDIO_SECONDS / (batch_size * args.seconds)
    print(
        f"  train-clean-100 epoch (100.6 h): {steps:.0f} batches x {step_time:.3f} s = "
        f"{steps * step_time / 3600:.2f} h (padding and data loading not counted)"
    )


def compare_recipe(recipe: str, key: str, values: list[str], args, device) -> list[tuple[str, float, int]]:
    """The whole training step of ``recipe`` with ``key`` set to each of ``values`` (one model each, built
    from seed 0, on one synthetic batch sized as the first value's recipe says), rounds interleaved; per
    value its median seconds and its parameter count."""
    cases = []
    batch = None
    for value in values:
        config, model, batch = recipe_model(recipe, [f"{key}={value}"], args, device, batch)
        step = step_case(model, build_optimizer(model, config.train), config.train.grad_clip, batch)
        amp = config.train.amp and device.type == "cuda"
        cases.append((value, step, amp, sum(p.numel() for p in model.parameters())))
    times: dict[str, list[float]] = {value: [] for value in values}
    for index in range(args.warmup + args.repeats):
        for value, step, amp, _ in cases:
            seconds = measure(step, device, amp, warmup=0, repeats=1)
            if index >= args.warmup:
                times[value].append(seconds)
    rows = [(value, statistics.median(times[value]), parameters) for value, _, _, parameters in cases]
    print(f"\n{recipe}: whole step (+ clip, optimizer), batch {batch[0].size(0)} x {args.seconds:g} s, "
          f"{key} at each value, {args.repeats} interleaved rounds after {args.warmup} warm-up")
    for value, seconds, parameters in rows:
        print(f"  {key}={value}: {seconds * 1e3:9.1f} ms ({seconds / rows[0][1]:.3f} x {values[0]}), "
              f"{parameters / 1e6:.2f} M parameters")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--batch", type=int, default=None, help="utterances per batch (default: cuda: the recipe's "
                        "max_frames_per_batch filled; cpu: 2)")
    parser.add_argument("--seconds", type=float, default=None, help="utterance length (default: cuda 12.7, cpu 2.0)")
    parser.add_argument("--tokens-per-second", type=float, default=6.0, help="target BPE pieces per second of audio")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (cpu only)")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), help="recipe files in recipes/")
    parser.add_argument("--compare", metavar="KEY=V1,V2", help="time the whole step with KEY at each value, "
                        "rounds interleaved, as ratios to the first value")
    args = parser.parse_args(argv)
    compare = None
    if args.compare:
        key, _, values = args.compare.partition("=")
        compare = (key, [value for value in values.split(",") if value])
        if not key or len(compare[1]) < 2:
            parser.error(f"--compare {args.compare!r}: give KEY=V1,V2 with two or more values")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    if args.seconds is None:
        args.seconds = MEAN_UTTERANCE_SECONDS if device.type == "cuda" else 2.0
    if args.batch is None and device.type == "cpu":
        args.batch = 2
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
        where = f"CPU, {args.threads} threads"
    else:
        where = f"GPU: {torch.cuda.get_device_name(device)}"
    override = lnlstm.get_implementation() or "none (each recipe's model.lnlstm_backend)"
    print(f"{where}; torch {torch.__version__}; LNLSTM backend override: {override}")
    print(f"median of {args.repeats} rounds after {args.warmup} warm-up")
    for recipe in args.recipes:
        if compare:
            compare_recipe(recipe, *compare, args, device)
        else:
            benchmark_recipe(recipe, args, device)


if __name__ == "__main__":
    main()

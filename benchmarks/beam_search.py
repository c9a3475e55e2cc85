"""Batched beam search versus a loop over utterances, on real speech.

    python benchmarks/beam_search.py [--checkpoint CKPT] [--beam 4] [--utterances 32]
    python benchmarks/beam_search.py --threads 1 --clock cpu     # load-robust
    python benchmarks/beam_search.py --device cuda --checkpoint CKPT --utterances 64

Decodes the first N utterances of the connected-digit dev set (real recordings)
with beam size k twice, in the same run: once as one batch (all hypotheses of
all utterances in one decoder call per step; utterances leave the batch when
their search is done) and once one utterance at a time. Checks that both give
the same hypotheses, then times them, interleaved over ``--repeats`` rounds
(medians), and prints utterances per second for the search alone, for encoding
plus search, their ratios, and the real-time factor (time / audio duration).
Without --checkpoint a freshly initialised model of recipes/fsdd_las.yaml is
used: it does not stop early, so every utterance runs to its own maximum
output length (the worst case).

The search and the encoder are timed apart because batching helps them for
different reasons: the listener's BiLSTMs run over time either way, while the
search's cost per step is mostly per-call overhead at beam x 1 rows. Load from
other processes hits the batched run harder (its large ops synchronise threads,
the loop's small ones mostly run on one), so the load average is printed, and
``--threads 1 --clock cpu`` (CPU time of this process) compares the work done.

With ``--device cuda`` the speller's steps replay recorded CUDA graphs
(asr/models/speller_graphs.py); a third variant, the batched search with the
steps run eagerly, is timed in the same run as the reference, and whether both
gave the same hypotheses is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from asr.data.batching import collate
from asr.data.librispeech import read_subset
from asr.data.tokenizer import CharTokenizer
from asr.decoding import DecodingOptions, beam_search
from asr.experiment import load_experiment_config
from asr.models.registry import build_model
from features.pipeline import FeaturePipeline

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT.parent / "shared" / "data" / "fsdd_connected" / "LibriSpeech" / "fsdd-dev"


def load_model(checkpoint: str | None):
    if checkpoint:
        from asr.inference import load_recogniser

        recogniser = load_recogniser(checkpoint)
        return recogniser.model, recogniser.pipeline, recogniser.tokenizer
    config = load_experiment_config(ROOT / "recipes" / "fsdd_las.yaml", ["features.mvn=utterance"])
    pipeline = FeaturePipeline(config.features)
    tokenizer = CharTokenizer.train(["ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE"])
    torch.manual_seed(0)
    return build_model(config.model, pipeline.feature_dim, tokenizer).eval(), pipeline, tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--utterances", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctc-weight", type=float, default=0.0, help="CTC prefix scoring weight (needs a CTC head)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall clock or this process' CPU time")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--data", type=Path, default=DEV, help="a LibriSpeech-layout folder (default: the connected-digit dev set)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    def clock() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() if args.clock == "wall" else time.process_time()

    model, pipeline, tokenizer = load_model(args.checkpoint)
    model = model.to(device)
    utterances = sorted(read_subset(args.data)[: args.utterances], key=lambda u: u.duration)
    items = [
        {"id": u.id, "features": pipeline.from_file(u.audio), "tokens": torch.tensor(tokenizer.encode(u.text))}
        for u in utterances
    ]
    audio_seconds = sum(u.duration for u in utterances)
    batch = collate(items).to(device)
    singles = [collate([item]).to(device) for item in items]
    options = DecodingOptions(beam_size=args.beam, ctc_weight=args.ctc_weight)

    @torch.no_grad()
    def batched() -> tuple[float, float, list[list[int]]]:
        start = clock()
        encoder = model.encode(batch.features, batch.feature_lengths)
        encoded = clock()
        hypotheses = beam_search(model, encoder, options)
        return encoded - start, clock() - encoded, hypotheses

    @torch.no_grad()
    def looped() -> tuple[float, float, list[list[int]]]:
        encode_s = search_s = 0.0
        hypotheses = []
        for single in singles:
            start = clock()
            encoder = model.encode(single.features, single.feature_lengths)
            encoded = clock()
            hypotheses += beam_search(model, encoder, options)
            encode_s, search_s = encode_s + encoded - start, search_s + clock() - encoded
        return encode_s, search_s, hypotheses

    def batched_eager_steps() -> tuple[float, float, list[list[int]]]:
        model.speller.cuda_graphs = False
        try:
            return batched()
        finally:
            model.speller.cuda_graphs = True

    # Warm-up, and the check that batching changes nothing but the speed.
    if batched()[2] != looped()[2]:
        raise SystemExit("batched and per-utterance beam search disagree")
    variants = [("batched", batched), ("loop", looped)]
    if device.type == "cuda":
        variants.append(("eager", batched_eager_steps))
        same = batched_eager_steps()[2] == batched()[2]
    times = {name: {"encode": [], "search": []} for name, _ in variants}
    for _ in range(args.repeats):  # interleaved, so all see the same machine load
        for name, run in variants:
            encode_s, search_s, _ = run()
            times[name]["encode"].append(encode_s)
            times[name]["search"].append(search_s)
    median = {name: {part: statistics.median(t) for part, t in parts.items()} for name, parts in times.items()}
    n = len(utterances)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(
        f"{n} utterances, {audio_seconds:.1f} s of audio, beam {args.beam}, ctc_weight {args.ctc_weight}, "
        f"{where}, {args.clock} clock, median of {args.repeats}, "
        f"load average {os.getloadavg()[0]:.1f}; batched and loop results identical"
    )
    labels = {"batched": "batched", "loop": "per-utterance loop", "eager": "batched, eager steps"}
    for name, _ in variants:
        label = labels[name]
        search_s = median[name]["search"]
        total_s = search_s + median[name]["encode"]
        print(
            f"{label:19s}: search {n / search_s:7.1f} utt/s (RTF {search_s / audio_seconds:.4f}), "
            f"encode + search {n / total_s:7.1f} utt/s (RTF {total_s / audio_seconds:.4f})"
        )
    search_ratio = median["loop"]["search"] / median["batched"]["search"]
    total_ratio = sum(median["loop"].values()) / sum(median["batched"].values())
    print(f"speed-up of batching: search {search_ratio:.2f}x, encode + search {total_ratio:.2f}x")
    if device.type == "cuda":
        graph_ratio = median["eager"]["search"] / median["batched"]["search"]
        print(f"speed-up of the recorded speller steps (batched search): {graph_ratio:.2f}x; "
              f"hypotheses {'identical' if same else 'NOT identical'} to the eager steps'")


if __name__ == "__main__":
    main()

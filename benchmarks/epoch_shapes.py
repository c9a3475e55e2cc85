"""How many batch shapes a recipe's epoch meets, how much of its batches is padding, and what the LAS's
CUDA graphs would record, from a corpus's durations alone (no audio, no model, no GPU).

    python benchmarks/epoch_shapes.py                                   # the three LibriSpeech recipes, a synthetic 100 h
    python benchmarks/epoch_shapes.py data.pad_frames_to=1              # the same without the padding (overrides: every recipe)
    python benchmarks/epoch_shapes.py --durations durations.txt         # one duration in seconds a line (the last column)
    python benchmarks/epoch_shapes.py --data /data/LibriSpeech/train-clean-100   # a corpus (headers only; or a manifest)
    python benchmarks/epoch_shapes.py --recipes librispeech100.yaml

The durations default to those the synthetic LibriSpeech-100 plans (``asr.synthesis.librispeech.plan``,
100 hours, seed 0: 28,415 utterances, the distribution of train-clean-100), which needs no audio either.
Each recipe's epoch is packed as ``asr.train`` packs it (its duration limits, ``BucketBatchSampler`` with its
``max_frames_per_batch`` and ``pad_frames_to``, a shuffled epoch: the second, after the recipe's
shortest-first one), without its length curriculum (``train.schedules.max_duration``), as a LibriSpeech
epoch after the first 500 updates.

Printed per recipe: the batches, the distinct padded frame lengths T, the distinct (B, T) and (B, T, L) shapes
(L: the longest transcript plus <sos>, in the recipe's tokenizer when the source has texts, else
``--tokens-per-second``), and the padding share (padded frames / all frames of the batch tensors). For a LAS,
the recordings its CUDA graphs would make in that epoch, by the rules of asr/models/cuda_graphs.py and
asr/models/speller_graphs.py: the LN-LSTM's time loops (forward and backward, keyed by B padded to a
multiple of 8 and each layer's frames to ``padded_time``, recorded again whenever a larger shape grows the
shared buffer arena and drops them all), and the speller's loop (keyed by B, the listener's output frames
and L, padded; at most ``CAPACITY`` of them, then eager). Training only: validation records its own.
These are counts, the same on any machine.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path

import torch

from asr.data.batching import BucketBatchSampler
from asr.data.padding import padded_frames
from asr.experiment import load_experiment_config
from asr.models import cuda_graphs, speller_graphs
from asr.models.lnlstm.backends import triton as triton_backend
from features.filterbank import num_frames

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("librispeech100.yaml", "librispeech100_transformer.yaml", "librispeech100_conformer.yaml")


def synthetic_corpus(hours: float = 100.0) -> list[tuple[float, str]]:
    """(seconds, transcript) of every training utterance the synthetic LibriSpeech plans (no audio made)."""
    from asr.synthesis.librispeech import Options, plan

    corpus = plan(Options(hours=hours))
    return [(u.planned_seconds(c.speaker), u.words.upper()) for c in corpus.chapters
            if c.subset == "train-clean-100" for u in c.utterances]


def read_durations(path: Path) -> list[tuple[float, str | None]]:
    """One duration in seconds a line, its last whitespace-separated column (a duration manifest's too)."""
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            try:
                rows.append((float(fields[-1]), None))
            except ValueError:
                continue  # a header
    return rows


def corpus_durations(path: str) -> list[tuple[float, str | None]]:
    """(seconds, transcript) of a corpus in any form the recipes read (LibriSpeech folder, Kaldi, lhotse)."""
    from asr.data.sources import read_source

    return [(u.duration, u.text) for u in read_source(path)]


def token_counts(config, corpus, tokens_per_second: float) -> list[int]:
    """Tokens of each utterance: the recipe's tokenizer on the transcripts where there are any (trained as
    ``asr.train`` trains it, cached in data.cache_dir), else ``tokens_per_second`` times its duration."""
    if all(text for _, text in corpus):
        from asr.data.corpus import build_tokenizer

        tokenizer = build_tokenizer(config.data, [text for _, text in corpus])
        return [len(tokenizer.encode(text)) for _, text in corpus]
    return [max(1, round(seconds * tokens_per_second)) for seconds, _ in corpus]


def epoch_batches(config, frames: list[int], epoch: int = 1) -> list[list[int]]:
    sampler = BucketBatchSampler(frames, config.data.max_frames_per_batch, shuffle=True, seed=config.data.seed,
                                 pad_frames_to=config.data.pad_frames_to)
    sampler.set_epoch(epoch)
    return list(sampler)


def listener_frames(listener, frames: int) -> list[int]:
    """Frames each listener layer runs over, for a batch whose longest utterance has ``frames`` (the listener
    cuts the batch back to its longest utterance first; frame stacking, then a halving before each
    pyramid layer: asr.models.listener)."""
    lengths, length = [], math.ceil(frames / listener.frame_stacking)
    for layer in range(listener.num_layers):
        if listener.pyramidal and 1 <= layer <= listener.pyramid_layers:
            length = math.ceil(length / 2)
        lengths.append(length)
    return lengths


class ArenaCache:
    """The recordings of one kind of LN-LSTM loop, as ``cuda_graphs.GraphCache`` keeps them: a miss records;
    a shape whose buffers need a larger arena than the largest so far drops every recording."""

    def __init__(self) -> None:
        self.entries: collections.OrderedDict = collections.OrderedDict()
        self.arena = 0
        self.recorded = 0
        self.dropped = 0

    def call(self, key, needed: int) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        if needed > self.arena:
            self.dropped += len(self.entries)
            self.entries.clear()
            self.arena = needed
        self.entries[key] = True
        self.recorded += 1
        while len(self.entries) > cuda_graphs.GraphCache.capacity:
            self.entries.popitem(last=False)


def las_recordings(config, shapes: list[tuple[int, int, int]]) -> dict:
    """What the LAS's CUDA graphs would record over an epoch of (B, longest frames, L) batches, in order."""
    model = config.model
    listener = model.listener
    gemm = torch.bfloat16 if config.train.amp else torch.float32
    spec = triton_backend._Config(listener.hidden_size, model.layer_norm in ("both", "listener"), model.forget_bias,
                                  model.lnlstm_eps, gemm)
    forward, backward = ArenaCache(), ArenaCache()
    speller_keys: list[tuple] = []
    for batch, longest, steps in shapes:
        rows = cuda_graphs.padded_batch(batch)
        layers = listener_frames(listener, longest)
        for time in layers:
            padded = cuda_graphs.padded_time(time)
            forward.call((rows, padded), cuda_graphs.arena_bytes(triton_backend._forward_specs(2, rows, padded, spec, True)))
        for time in reversed(layers):
            padded = cuda_graphs.padded_time(time)
            backward.call((rows, padded), cuda_graphs.arena_bytes(triton_backend._backward_specs(2, rows, padded, spec)))
        speller_keys.append(speller_graphs.padded_shape(batch, layers[-1], steps))
    distinct_speller = list(dict.fromkeys(speller_keys))
    recorded = set(distinct_speller[: speller_graphs.CAPACITY])
    return {
        "lnlstm_recordings": forward.recorded + backward.recorded,
        "lnlstm_keys": len(_keys(shapes, listener)),
        "lnlstm_dropped": forward.dropped + backward.dropped,
        "speller_shapes": len(distinct_speller),
        "speller_recorded": len(recorded),
        "speller_eager_batches": sum(key not in recorded for key in speller_keys),
    }


def _keys(shapes, listener) -> set:
    """The distinct LN-LSTM loop shapes of the epoch, forward and backward (what would be recorded if the
    arena were sized for the largest from the start)."""
    keys = set()
    for batch, longest, _ in shapes:
        for time in listener_frames(listener, longest):
            keys.add((cuda_graphs.padded_batch(batch), cuda_graphs.padded_time(time)))
    return {(kind, key) for key in keys for kind in ("forward", "backward")}


def measure(recipe: str, overrides: list[str], corpus, tokens_per_second: float) -> dict:
    config = load_experiment_config(ROOT / "recipes" / recipe, overrides)
    data = config.data
    kept = [(s, t) for s, t in corpus if data.min_duration <= s <= data.max_duration]
    frames = [num_frames(round(s * config.features.sample_rate), config.features) for s, _ in kept]
    tokens = token_counts(config, kept, tokens_per_second)
    batches = epoch_batches(config, frames)
    shapes = []  # (B, padded T, L, longest T) in the epoch's order
    valid = total = 0
    for batch in batches:
        longest = max(frames[i] for i in batch)
        padded = padded_frames(longest, data.pad_frames_to)
        steps = max(tokens[i] for i in batch) + 1  # <sos> + the longest transcript
        shapes.append((len(batch), padded, steps, longest))
        valid += sum(frames[i] for i in batch)
        total += len(batch) * padded
    row = {
        "recipe": recipe, "pad_frames_to": data.pad_frames_to, "utterances": len(kept), "batches": len(batches),
        "updates": math.ceil(len(batches) / config.train.accum_grad),
        "lengths": len({p for _, p, _, _ in shapes}), "bt": len({(b, p) for b, p, _, _ in shapes}),
        "btl": len({(b, p, l) for b, p, l, _ in shapes}), "padding": 1.0 - valid / total,
    }
    if config.model.type == "las":
        row.update(las_recordings(config, [(b, longest, l) for b, _, l, longest in shapes]))
    return row


def report(rows: list[dict]) -> None:
    print(f"{'recipe':<34} {'pad_frames_to':<16} {'batches':>7} {'T':>5} {'(B,T)':>6} {'(B,T,L)':>8} {'padding':>8}")
    for row in rows:
        pad = str(row["pad_frames_to"]).replace(" ", "")
        pad = pad if len(pad) <= 16 else pad[:13] + "..."
        print(f"{row['recipe']:<34} {pad:<16} {row['batches']:>7} {row['lengths']:>5} {row['bt']:>6} "
              f"{row['btl']:>8} {100 * row['padding']:>7.2f}%")
    for row in rows:
        if "lnlstm_recordings" in row:
            print(f"\n{row['recipe']}: CUDA graphs over the epoch's training steps")
            print(f"  LN-LSTM time loops: {row['lnlstm_recordings']} recordings of {row['lnlstm_keys']} distinct "
                  f"(forward and backward) shapes; {row['lnlstm_dropped']} dropped when a larger shape grew the arena")
            print(f"  speller loop: {row['speller_shapes']} distinct shapes, {row['speller_recorded']} recorded "
                  f"(at most {speller_graphs.CAPACITY}), {row['speller_eager_batches']} of {row['batches']} batches eager")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides of every recipe, as asr.train takes them")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipe files in recipes/")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--durations", type=Path, help="a text file: one duration in seconds a line (its last column)")
    source.add_argument("--data", help="a corpus: LibriSpeech subset folder, Kaldi data directory or lhotse manifest")
    source.add_argument("--hours", type=float, default=100.0, help="the synthetic corpus' hours (default 100)")
    parser.add_argument("--tokens-per-second", type=float, default=6.0,
                        help="transcript tokens a second where the source has no texts (--durations)")
    args = parser.parse_args(argv)
    if args.durations is not None:
        if not args.durations.is_file():
            parser.error(f"--durations: no such file: {args.durations}")
        corpus = read_durations(args.durations)
    elif args.data is not None:
        corpus = corpus_durations(args.data)
    else:
        corpus = synthetic_corpus(args.hours)
    if not corpus:
        parser.error("no durations read")
    rows = [measure(recipe, args.overrides, corpus, args.tokens_per_second) for recipe in args.recipes.split(",")]
    seconds = [s for s, _ in corpus]
    print(f"{len(corpus)} utterances, {sum(seconds) / 3600:.1f} h (mean {sum(seconds) / len(seconds):.1f} s)\n")
    report(rows)
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)

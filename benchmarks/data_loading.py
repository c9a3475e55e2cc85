"""Does data loading keep the model busy? Feature throughput and loader wait, features in the loader and on the device.

    python benchmarks/data_loading.py --data-root OUT --workers 8 train.device=cuda          # the target's measurement
    python benchmarks/data_loading.py --tile 40 --workers 2 --steps 6 --las KEY=VALUE --transformer KEY=VALUE  # on CPU

For each LibriSpeech recipe (recipes/librispeech100.yaml, LAS, and recipes/librispeech100_transformer.yaml)
on a LibriSpeech-layout corpus (``--data-root``: the folder holding ``LibriSpeech/``, e.g. the rehearsal
corpus of ``python -m asr.synth_librispeech OUT``; without it, ``--tile N`` copies of the five LibriVox
utterances in ../shared/data (``--shared-data``), linked into a temporary folder), the recipe's trainer is built once
(tokenizer, global MVN statistics, the model at the recipe's sizes unless overridden), and then, for
``features.compute_on`` = ``loader`` (DataLoader workers compute the features) and ``device`` (workers
only read the audio; fbank, MVN and SpecAugment run batched on the training device), both in this run:

(a) throughput, in audio-seconds of features per CPU-second: one pass over the batches (the loader's
    reading, and for the device path the features computed on the training device, no model). CPU time
    is the user + system time of this process (all its threads) plus that of the DataLoader workers:
    ``resource.getrusage(RUSAGE_SELF)`` and ``getrusage(RUSAGE_CHILDREN)``, the workers counted when they
    exit and are reaped at the end of the pass, start-up included. On CUDA the GPU's own time is not CPU
    time: the line also gives audio-seconds per second of on-device feature time (synchronised).
(b) the loader wait as a share of step time: ``--steps`` training steps (after ``--warmup`` that are not
    counted), each timed from asking the loader for a batch to the end of the optimizer update; the wait
    is the time blocked on the loader. On-device features count as step time, not as wait.
    Two things would hide a slow loader, and are kept out. The workers fill a queue of ``workers x 2``
    batches (the DataLoader's prefetch) while they start, so those cost no wait: ``--warmup`` defaults to
    that many, and fewer timed steps than that are flagged and not judged against the target. And the
    first step of each new batch shape is slow (allocator growth, cuDNN choices, CUDA-graph recording),
    which would swell the step time of whichever path ran first: every timed batch is stepped once,
    untimed, before either path is measured.

Target, on one H100/H200 with ``train.device=cuda`` and at most 8 workers: loader wait at most 5% of step
time, for both recipes. Overrides ``key=value`` apply to both recipes; ``--las`` / ``--transformer`` add
overrides for one of them (on CPU, smaller models); every override is printed with the results.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from asr.data.batching import with_features
from asr.data.dataset import SpeechDataset
from asr.experiment import load_experiment_config
from asr.run import build_trainer
from asr.training.trainer import Trainer
from asr.training.data import make_loader

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"las": "librispeech100.yaml", "transformer": "librispeech100_transformer.yaml"}
SHARED_DATA = ROOT.parent / "shared" / "data"
TARGET_WAIT_SHARE = 0.05  # on one H100/H200 (issue 39)
TARGET_WORKERS = 8
PREFETCH = 2  # batches each DataLoader worker keeps ready: torch's default prefetch_factor, which make_loader keeps


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds of this process, and of its reaped children (the DataLoader workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def tiled_corpus(target: Path, copies: int, shared_data: Path) -> Path:
    """A LibriSpeech-layout folder under ``target`` (returned: the folder holding ``LibriSpeech/``) whose
    train-clean-100 is ``copies`` speakers each reading the five LibriVox utterances, and whose dev-clean
    is one more: links to the same FLAC files, so only the reading is real."""
    mini = shared_data.resolve() / "librivox_mini" / "LibriSpeech" / "test-mini"
    lines = (mini / "9999" / "1" / "9999-1.trans.txt").read_text().split("\n")
    utterances = [line.split(" ", 1) for line in lines if line.strip()]
    for subset, speakers in (("train-clean-100", range(1000, 1000 + copies)), ("dev-clean", [9000])):
        for speaker in speakers:
            chapter = target / "LibriSpeech" / subset / str(speaker) / "1"
            chapter.mkdir(parents=True)
            text = []
            for utt_id, words in utterances:
                name = f"{speaker}-1-{utt_id.rsplit('-', 1)[1]}"
                (chapter / f"{name}.flac").symlink_to(mini / "9999" / "1" / f"{utt_id}.flac")
                text.append(f"{name} {words}")
            (chapter / f"{speaker}-1.trans.txt").write_text("\n".join(text) + "\n")
    return target


def throughput(batches, dataset: SpeechDataset, trainer: Trainer, workers: int) -> dict[str, float]:
    """(a): one pass over ``batches`` of ``dataset``, features computed as ``dataset.compute_on`` says."""
    device, seed = trainer.device, trainer.data.train_set.seed  # data.seed
    audio = sum(dataset.utterances[i].duration for batch in batches for i in batch)
    start_cpu, start = cpu_seconds(), time.perf_counter()
    on_device = 0.0
    loader = make_loader(batches, dataset, workers, seed, pin_memory=device.type == "cuda")
    for batch in loader:
        batch = batch.to(device)
        synchronize(device)
        before = time.perf_counter()
        with_features(batch, trainer.pipeline)
        synchronize(device)
        on_device += time.perf_counter() - before
    del loader  # the workers have exited at the end of the pass; their CPU time is in RUSAGE_CHILDREN now
    (main, workers), (main_before, workers_before) = cpu_seconds(), start_cpu
    return {"audio": audio, "main": main - main_before, "workers": workers - workers_before,
            "wall": time.perf_counter() - start, "device_features": on_device}


def loader_wait(batches, dataset: SpeechDataset, trainer: Trainer, workers: int, warmup: int) -> tuple[float, float]:
    """(b): (seconds waiting for batches, seconds in total) over the steps after ``warmup``."""
    device, step = trainer.device, trainer.step
    loader = make_loader(batches, dataset, workers, trainer.data.train_set.seed, pin_memory=device.type == "cuda")
    iterator = iter(loader)
    wait = total = 0.0
    for index in range(len(batches)):
        start = time.perf_counter()
        batch = next(iterator)
        fetched = time.perf_counter()
        if step.backward(with_features(batch.to(device), trainer.pipeline)).loss is not None:
            step.update()
        synchronize(device)
        end = time.perf_counter()
        if index >= warmup:  # the first batches include worker start-up
            wait += fetched - start
            total += end - start
    # End the pass, which shuts the workers down. They ignore SIGTERM (the training process stops a run,
    # asr.training.signals), so a worker left waiting would hold up this process's exit for good.
    assert next(iterator, None) is None
    return wait, total


def training_set(trainer: Trainer, compute_on: str) -> SpeechDataset:
    """The trainer's training utterances, their features computed where ``compute_on`` says, epoch 0."""
    data = trainer.data.train_set  # its data.seed and data.strict
    dataset = SpeechDataset(data.utterances, trainer.pipeline, trainer.tokenizer, train=True,
                            seed=data.seed, strict=data.strict, compute_on=compute_on)
    dataset.set_epoch(0)
    return dataset


def warm_shapes(batches, trainer: Trainer) -> None:
    """One untimed training step on each of ``batches``, features computed in this process, so that no
    measured path pays for a shape's first step."""
    for batch in make_loader(batches, training_set(trainer, "device"), 0, trainer.data.train_set.seed, pin_memory=False):
        if trainer.step.backward(with_features(batch.to(trainer.device), trainer.pipeline)).loss is not None:
            trainer.step.update()
    synchronize(trainer.device)


def run_recipe(name: str, root: Path, overrides: list[str], args, fixed: list[str]) -> None:
    recipe = ROOT / "recipes" / RECIPES[name]
    with tempfile.TemporaryDirectory() as exp_dir:
        # a constant rate: the speed of a step does not depend on it, and a few steps on a small corpus
        # plan fewer updates than the LAS recipe's cosine schedule warms up over
        fixed = [*fixed, f"data.root={root}", f"exp_dir={exp_dir}", f"data.num_workers={args.workers}",
                 "features.compute_on=loader", "train.scheduler.kind=constant"]
        config = load_experiment_config(recipe, fixed + overrides)
        trainer = build_trainer(config)
        data = trainer.data
        data.sampler.set_epoch(0)
        batches = list(data.sampler)[: args.steps + args.warmup]
        if len(batches) < args.steps + args.warmup:
            raise SystemExit(f"{recipe.name}: only {len(batches)} batches; use a larger corpus or fewer --steps")
        parameters = sum(p.numel() for p in trainer.raw_model.parameters()) / 1e6
        utterances = sum(len(b) for b in batches)
        print(f"\n{recipe.name} ({config.model.type}, {parameters:.1f}M parameters) on {trainer.device}, "
              f"{args.workers} workers, {torch.get_num_threads()} threads in the training process; "
              f"{len(batches)} batches of {utterances / len(batches):.1f} utterances on average, "
              f"max_frames_per_batch={config.data.max_frames_per_batch}")
        print(f"  overrides: {' '.join(overrides) or 'none (the recipe as shipped, data.root aside)'}")
        warm_shapes(batches[args.warmup:], trainer)
        results = defaultdict(dict)
        for where in ("loader", "device"):
            dataset = training_set(trainer, where)
            results[where]["pass"] = throughput(batches, dataset, trainer, args.workers)
            results[where]["wait"] = loader_wait(batches, dataset, trainer, args.workers, args.warmup)
        for where, result in results.items():
            done, (wait, total) = result["pass"], result["wait"]
            device_part = ""
            if where == "device":
                device_part = (f", {done['audio'] / max(done['device_features'], 1e-9):.0f} audio-s per second of "
                               f"on-device feature time")
            cpu = done["main"] + done["workers"]
            print(f"  features on the {where}: {done['audio'] / cpu:.0f} audio-s of features per CPU-s "
                  f"({done['audio']:.0f} s of audio, {cpu:.1f} CPU-s = workers {done['workers']:.1f} + training "
                  f"process {done['main']:.1f}, {done['wall']:.1f} s wall{device_part}); "
                  f"loader wait {100 * wait / total:.1f}% of step time ({args.steps} steps in {total:.1f} s, "
                  f"waiting {wait:.2f} s)")
            if args.steps < args.workers * PREFETCH:
                print(f"    {args.steps} timed steps are fewer than the {args.workers * PREFETCH} batches the workers "
                      f"keep ready (--workers x {PREFETCH}): a loader slower than the model may not show; not judged")
            elif trainer.device.type == "cuda":
                met = wait / total <= TARGET_WAIT_SHARE and args.workers <= TARGET_WORKERS
                print(f"    target (at most {100 * TARGET_WAIT_SHARE:.0f}% with at most {TARGET_WORKERS} workers): "
                      f"{'met' if met else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, help="the folder holding LibriSpeech/ (train-clean-100, dev-clean)")
    parser.add_argument("--tile", type=int, default=40,
                        help="without --data-root: speakers in the tiled LibriVox corpus (5 utterances each)")
    parser.add_argument("--shared-data", type=Path, default=SHARED_DATA, help="where librivox_mini is (for --tile)")
    parser.add_argument("--recipe", action="append", choices=sorted(RECIPES),
                        help="las or transformer (repeat for both; default: both)")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (the recipes set 4)")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per path")
    parser.add_argument("--warmup", type=int,
                        help=f"steps before the timed ones: worker start-up and the batches the workers prefetch "
                             f"meanwhile (default: --workers x {PREFETCH}, at least 1)")
    parser.add_argument("--threads", type=int, help="torch threads of the training process (default: torch's)")
    parser.add_argument("--las", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for the LAS recipe only (repeat the option for more)")
    parser.add_argument("--transformer", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for the Transformer recipe only (repeat the option for more)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides key.sub=value for both recipes")
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = max(1, args.workers * PREFETCH)
    if args.threads:
        torch.set_num_threads(args.threads)
    temporary, fixed = None, []
    root = args.data_root
    if root is None:
        temporary = Path(tempfile.mkdtemp(prefix="data_loading_"))
        root = tiled_corpus(temporary / "corpus", args.tile, args.shared_data)
        fixed = [f"data.cache_dir={temporary / 'cache'}"]  # its manifests go with it
        print(f"corpus: {args.tile} x the 5 LibriVox utterances of {args.shared_data} (linked under {root})")
    try:
        for name in args.recipe or ["las", "transformer"]:
            run_recipe(name, root, [*args.overrides, *getattr(args, name)], args, fixed)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary)


if __name__ == "__main__":
    main()

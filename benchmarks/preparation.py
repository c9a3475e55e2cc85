"""What the first start of a LibriSpeech-100 run spends preparing, cold and from the cache.

    python benchmarks/preparation.py [--files 2000] [--jobs 0] [--serial] [--manifest-files N] [--keep DIR] [--source DIR]
    python benchmarks/preparation.py --corpus OUT     # a corpus made by python -m asr.synth_librispeech OUT

Builds a corpus of ``--files`` utterances in LibriSpeech layout
(``LibriSpeech/train-clean-100/<speaker>/<chapter>/<speaker>-<chapter>-<n>.flac``
and ``<speaker>-<chapter>.trans.txt``) in a temporary folder: the five real
LibriVox utterances of the shared data tiled to a duration drawn like
train-clean-100's (a normal of mean 12.7 s and sd 3.5 s clipped to 1-24.5 s),
(``--source``, default ``../shared/data/librivox_mini/LibriSpeech/test-mini``)
with a little white noise so that no two files are alike, 16 kHz 16-bit FLAC;
about 49 utterances per chapter and 2.3 chapters per speaker, as in
train-clean-100; transcripts of pseudo-words (30,000 of them, drawn with
Zipf's law, 2.7 per second of audio). Then it times the three steps of
preparation as ``asr.train`` runs them for ``recipes/librispeech100.yaml``
(its features, its BPE vocabulary size), each cold (an empty cache) and warm
(the same call again, answered from the cache):

* the duration manifest (:func:`asr.data.librispeech.read_subset`: every
  audio header read in ``--jobs`` processes);
* BPE (:func:`asr.data.tokenizer.cached_bpe`, sentencepiece with ``--jobs`` threads);
* global MVN statistics (:func:`asr.data.dataset.cached_global_stats` in
  ``--jobs`` processes).

It prints for each the wall-clock and CPU seconds (this process and its
workers), files per second and per CPU-second, and the cold/warm ratio, and
their extrapolation to train-clean-100's 28,539 files (linear in the number
of files: every step is a loop over files or transcripts). On a busy machine
the CPU seconds are the figure to trust: wall-clock time there measures the
other users too. ``--serial`` also
times the manifest and the statistics in one process, the reference for the
speed-up of ``--jobs``. ``--manifest-files 28539`` times the manifest alone
at train-clean-100's full count, on files of 0.5 s (reading a header costs
the same whatever the length of the audio). The files were just written, so they are in the page
cache: a cold disk reads headers more slowly. The main process runs torch on
one thread, so one process means one core. The corpus is deleted at the end
unless ``--keep`` names a folder to build it in.

``--corpus DIR`` times the same steps on an existing corpus instead
(``DIR/LibriSpeech/train-clean-100``, e.g. the rehearsal corpus of
``python -m asr.synth_librispeech``), with the utterances the recipe trains on
(``data.min_duration``-``data.max_duration``) in the statistics and BPE, as
``asr.train`` does; nothing is built or deleted there, and its files may not be
in the page cache.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import soundfile
import torch

from asr.data.dataset import cached_global_stats, compute_global_stats
from asr.data.librispeech import read_subset
from asr.data.parallel import resolve_jobs
from asr.data.report import SkipReport
from asr.data.tokenizer import cached_bpe
from asr.experiment import load_experiment_config
from features.pipeline import FeaturePipeline

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "data" / "librivox_mini" / "LibriSpeech" / "test-mini"
RECIPE = ROOT / "recipes" / "librispeech100.yaml"
TRAIN_CLEAN_100 = 28539
RATE = 16000


def pseudo_words(count: int, rng: np.random.Generator) -> list[str]:
    letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(letters, size=int(rng.integers(2, 11)))))
    return sorted(words)


def corpus_plan(files: int, seed: int, fixed_seconds: float | None = None) -> list[tuple[str, float, str]]:
    """(relative path without suffix, seconds, transcript) of each utterance (``fixed_seconds``: all that long)."""
    rng = np.random.default_rng(seed)
    words = pseudo_words(30000, rng)
    zipf = 1.0 / np.arange(1, len(words) + 1)
    zipf /= zipf.sum()
    plan = []
    speaker, chapter, index = 100, 0, 0
    for _ in range(files):
        if index == 0 or index >= 49:  # a new chapter every 49 utterances, a new speaker every 2-3 chapters
            chapter += 1
            index = 0
            if chapter % 7 in (0, 3, 5):
                speaker += 1
        seconds = float(np.clip(rng.normal(12.7, 3.5), 1.0, 24.5)) if fixed_seconds is None else fixed_seconds
        text = " ".join(rng.choice(words, size=max(1, round(2.7 * seconds)), p=zipf))
        plan.append((f"{speaker}/{chapter}/{speaker}-{chapter}-{index:04d}", seconds, text))
        index += 1
    return plan


def write_audio(subset: Path, sources: list[np.ndarray], seed: int, job: tuple[int, str, float]) -> None:
    number, name, seconds = job
    rng = np.random.default_rng([seed, number])
    length = round(seconds * RATE)
    pieces, have = [], 0
    while have < length:
        piece = sources[int(rng.integers(len(sources)))]
        pieces.append(piece)
        have += len(piece)
    audio = np.concatenate(pieces)[:length] + rng.normal(0.0, 0.003, length)
    soundfile.write(str(subset / f"{name}.flac"), np.clip(audio, -1, 1), RATE, subtype="PCM_16")


def build_corpus(
    subset: Path, source: Path, files: int, jobs: int, seed: int, fixed_seconds: float | None = None
) -> float:
    """Write the corpus; returns its hours of audio."""
    plan = corpus_plan(files, seed, fixed_seconds)
    sources = [soundfile.read(str(path), dtype="float64")[0] for path in sorted(source.glob("*/*/*.flac"))]
    if not sources:
        raise SystemExit(f"no audio under {source} (--source)")
    chapters: dict[Path, list[str]] = {}
    for name, _, text in plan:
        folder = subset / Path(name).parent
        chapters.setdefault(folder, []).append(f"{Path(name).name} {text}")
    for folder, lines in chapters.items():
        folder.mkdir(parents=True, exist_ok=True)
        speaker, chapter = folder.parent.name, folder.name
        (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(lines) + "\n")
    jobs_list = [(number, name, seconds) for number, (name, seconds, _) in enumerate(plan)]
    with multiprocessing.Pool(jobs) as pool:
        pool.map(partial(write_audio, subset, sources, seed), jobs_list, chunksize=16)
    return sum(seconds for _, seconds, _ in plan) / 3600


def cpu_seconds() -> float:
    """CPU time of this process and of its ended children (the worker processes, joined when a step ends)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(function):
    """(wall seconds, CPU seconds, result) of ``function()``."""
    start, start_cpu = time.perf_counter(), cpu_seconds()
    result = function()
    return time.perf_counter() - start, cpu_seconds() - start_cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000, help="utterances in the corpus (train-clean-100: 28539)")
    parser.add_argument("--jobs", type=int, default=0, help="processes (and BPE threads); 0 = one per core")
    parser.add_argument("--serial", action="store_true", help="also time the manifest and the statistics in one process")
    parser.add_argument("--manifest-files", type=int, default=0,
                        help="also time the manifest alone on this many files of 0.5 s (e.g. 28539)")
    parser.add_argument("--keep", type=Path, help="build the corpus in this folder and keep it (default: a temporary one)")
    parser.add_argument("--source", type=Path, default=SOURCE, help="LibriSpeech-layout folder of real speech to tile")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, help="time an existing corpus (DIR/LibriSpeech/train-clean-100) instead")
    args = parser.parse_args()
    jobs = resolve_jobs(args.jobs)
    torch.set_num_threads(1)
    config = load_experiment_config(RECIPE)

    work = Path(tempfile.mkdtemp(prefix="lnasr-preparation-"))
    root = args.corpus or args.keep or work / "corpus"
    subset = root / "LibriSpeech" / "train-clean-100"
    try:
        if args.corpus:
            args.files = sum(1 for _ in subset.glob("*/*/*.flac"))
            print(f"corpus: {args.files} files under {subset}")
        else:
            built, _, hours = timed(lambda: build_corpus(subset, args.source, args.files, jobs, args.seed))
            print(f"corpus: {args.files} files, {hours:.1f} h of audio, built in {built:.0f} s under {subset}")
        print(f"{jobs} process(es), {torch.get_num_threads()} torch thread per process")
        rows = []

        def stage(name: str, cold, warm, count: int):
            cold_s, cold_cpu, result = timed(cold)
            warm_s, _, _ = timed(warm)
            rows.append((name, cold_s, cold_cpu, count, warm_s))
            return result

        cache = work / "cache"
        utterances = stage(
            "manifest", lambda: read_subset(subset, SkipReport(), cache, jobs),
            lambda: read_subset(subset, SkipReport(), cache, jobs), args.files,
        )
        if args.corpus:
            data = config.data
            kept = [u for u in utterances if data.min_duration <= u.duration <= data.max_duration]
            print(f"{len(utterances)} utterances, {sum(u.duration for u in utterances) / 3600:.1f} h; "
                  f"{len(kept)} of {data.min_duration}-{data.max_duration} s ({sum(u.duration for u in kept) / 3600:.1f} h)"
                  " go into BPE and the statistics")
            utterances = kept
        texts = [u.text for u in utterances]
        vocab = config.data.bpe_vocab_size
        stage(f"BPE ({vocab})", lambda: cached_bpe(texts, vocab, cache, jobs), lambda: cached_bpe(texts, vocab, cache, jobs),
              len(texts))
        features = config.features

        def stats():
            return cached_global_stats(utterances, FeaturePipeline(features), jobs, SkipReport(), cache)

        stage("global MVN", stats, stats, len(utterances))
        if args.serial:
            serial_cache = work / "serial-cache"
            manifest_1, manifest_1_cpu, _ = timed(lambda: read_subset(subset, SkipReport(), serial_cache, 1))
            stats_1, stats_1_cpu, _ = timed(lambda: compute_global_stats(utterances, FeaturePipeline(features), 1))

        scale = TRAIN_CLEAN_100 / args.files
        print(f"\n{'step':<12} {'cold s':>8} {'CPU s':>8} {'files/s':>8} {'files/CPU s':>12} {'warm s':>7}"
              f" {'cold/warm':>9} | {'28,539 files (extrapolated): cold s':>36} {'CPU s':>7}")
        for name, cold_s, cold_cpu, count, warm_s in rows:
            print(f"{name:<12} {cold_s:8.2f} {cold_cpu:8.2f} {count / cold_s:8.1f} {count / cold_cpu:12.1f} {warm_s:7.3f}"
                  f" {cold_s / warm_s:9.0f} | {cold_s * scale:36.0f} {cold_cpu * scale:7.0f}")
        cold, cold_cpu, warm = (sum(row[i] for row in rows) for i in (1, 2, 4))
        print(f"{'total':<12} {cold:8.2f} {cold_cpu:8.2f} {'':>8} {'':>12} {warm:7.3f} {cold / warm:9.0f}"
              f" | {cold * scale:36.0f} {cold_cpu * scale:7.0f}")
        if args.manifest_files:
            short = root / "LibriSpeech" / "short"
            built, _, _ = timed(lambda: build_corpus(short, args.source, args.manifest_files, jobs, args.seed, 0.5))
            print(f"\nthe manifest alone, {args.manifest_files} files of 0.5 s (built in {built:.0f} s):")
            for processes in (jobs, 1) if args.serial else (jobs,):
                manifest_cache = work / f"manifest-cache-{processes}"
                cold_s, cold_cpu, _ = timed(lambda: read_subset(short, SkipReport(), manifest_cache, processes))
                warm_s, warm_cpu, _ = timed(lambda: read_subset(short, SkipReport(), manifest_cache, processes))
                print(f"  {processes} process(es): cold {cold_s:.2f} s ({cold_cpu:.2f} CPU s, "
                      f"{args.manifest_files / cold_s:.0f} files/s), warm {warm_s:.2f} s ({warm_cpu:.2f} CPU s), "
                      f"cold/warm {cold_s / warm_s:.1f}")
        if args.serial:
            print(f"\nin one process: manifest {manifest_1:.2f} s ({manifest_1_cpu:.2f} CPU s), "
                  f"{manifest_1 / rows[0][1]:.2f}x the {jobs}-process time; global MVN {stats_1:.2f} s "
                  f"({stats_1_cpu:.2f} CPU s), {stats_1 / rows[2][1]:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

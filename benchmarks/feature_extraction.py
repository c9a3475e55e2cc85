"""Training-time feature extraction per utterance, against torchaudio's functions in the same run.

    python benchmarks/feature_extraction.py [--utterances 40] [--repeats 5] [--threads 1]

On CPU, data loader workers share the cores with the training step, so every
millisecond of feature extraction is one the step does not get. This times,
on real speech (the connected-digit dev set, 8 kHz recordings played at 16 kHz
as the demo recipe reads them), the steps of the demo recipe's training
features that have a torchaudio or scipy counterpart, each against that
counterpart (the reference) on the same waveforms in the same run:

* MFCC with a VTLP warp drawn per utterance: ``features.filterbank.extract``
  against ``torchaudio.compliance.kaldi.mfcc`` (which rebuilds the mel filters per call);
* resampling (the 8 kHz round trip of band limiting and a speed-perturbation
  factor): ``features.audio.resample`` against ``torchaudio.functional.resample``;
* the band limit's low-pass: ``features.augment.lowpass`` against scipy's
  Butterworth ``sosfiltfilt``;

and prints each one's time per utterance and its ratio to the reference (lower
is better; the median of ``--repeats`` rounds, the variants interleaved). Then
the whole training pipeline of ``recipes/demo.yaml``
(``FeaturePipeline.from_waveform(train=True)``) per utterance, which has no
reference. A figure from one machine says nothing about another.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import scipy.signal
import torch
import torchaudio
from torchaudio.compliance import kaldi

from asr.experiment import load_experiment_config
from features.audio import load_audio, resample
from features.augment import lowpass
from features.filterbank import INT16_SCALE, VTLN_HIGH, VTLN_LOW, extract
from features.pipeline import FeaturePipeline

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT.parent / "shared" / "data" / "fsdd_connected" / "LibriSpeech" / "fsdd-dev"


def waveforms(count: int, rate: int) -> list[torch.Tensor]:
    paths = sorted(DEV.rglob("*.flac"))[:count]
    if not paths:
        raise SystemExit(f"no audio under {DEV}")
    return [resample(*load_audio(path), rate)[0] for path in paths]


def per_utterance_ms(function, inputs: list) -> float:
    start = time.perf_counter()
    for item in inputs:
        function(item)
    return 1000 * (time.perf_counter() - start) / len(inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--utterances", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a loader worker has 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = load_experiment_config(ROOT / "recipes" / "demo.yaml", ["exp_dir=/tmp/unused"]).features
    rate = config.sample_rate
    audio = waveforms(args.utterances, rate)
    generator = torch.Generator().manual_seed(0)
    warps = [0.9 + 0.2 * float(torch.rand((), generator=generator)) for _ in audio]  # VTLP's range
    cutoffs = [3000 + 4000 * float(torch.rand((), generator=generator)) for _ in audio]  # the band limit's
    pairs = list(zip(audio, warps, cutoffs))
    kaldi_options = dict(
        num_mel_bins=config.num_mel_bins, num_ceps=config.num_ceps, sample_frequency=float(rate), dither=0.0,
        vtln_low=VTLN_LOW, vtln_high=VTLN_HIGH,
    )

    def sosfiltfilt(waveform, cutoff):
        sections = scipy.signal.butter(8, cutoff, btype="low", fs=rate, output="sos")
        return torch.from_numpy(scipy.signal.sosfiltfilt(sections, waveform.double().numpy()).copy()).float()

    variants = {
        "MFCC + VTLP": (
            lambda p: extract(p[0], config, warp=p[1]),
            lambda p: kaldi.mfcc((p[0] * INT16_SCALE)[None], vtln_warp=p[1], **kaldi_options),
        ),
        "8 kHz round trip": (
            lambda p: resample(resample(p[0], rate, 8000), 8000, rate),
            lambda p: torchaudio.functional.resample(torchaudio.functional.resample(p[0], rate, 8000), 8000, rate),
        ),
        "speed 0.9": (
            lambda p: resample(p[0], round(0.9 * rate), rate),
            lambda p: torchaudio.functional.resample(p[0], round(0.9 * rate), rate),
        ),
        "low-pass": (lambda p: lowpass(p[0], rate, p[2]), lambda p: sosfiltfilt(p[0], p[2])),
    }
    times = {name: ([], []) for name in variants}
    for _ in range(args.repeats + 1):  # the first round warms up (and fills the kept filters and kernels)
        for name, (ours, reference) in variants.items():
            times[name][0].append(per_utterance_ms(ours, pairs))
            times[name][1].append(per_utterance_ms(reference, pairs))
    seconds = sum(a.numel() for a in audio) / rate / len(audio)
    print(f"{len(audio)} utterances of {seconds:.2f} s on average at {rate} Hz, {args.threads} thread(s), "
          f"median of {args.repeats} rounds")
    print(f"{'step':<18} {'ours ms/utt':>12} {'reference ms/utt':>17} {'ratio':>7}")
    for name, (ours, reference) in times.items():
        a, b = statistics.median(ours[1:]), statistics.median(reference[1:])
        print(f"{name:<18} {a:12.2f} {b:17.2f} {a / b:7.2f}")

    pipeline = FeaturePipeline(config)
    training = []
    for _ in range(args.repeats + 1):
        training.append(
            per_utterance_ms(lambda w: pipeline.from_waveform(w, rate, train=True, generator=generator), audio)
        )
    print(f"whole training pipeline of recipes/demo.yaml: {statistics.median(training[1:]):.2f} ms/utt")


if __name__ == "__main__":
    main()

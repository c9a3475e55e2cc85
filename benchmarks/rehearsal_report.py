"""What a LibriSpeech rehearsal run learnt: test WER/CER of each epoch, and the attention of a long test utterance.

After a run of a LibriSpeech recipe on the synthetic corpus (``python -m asr.synth_librispeech``), this
decodes the test split (voices and sentences never in training) with every ``epoch<N>.pt`` the run kept,
greedily, and draws the teacher-forced attention of the longest test utterance over 12 s with the last one::

    python benchmarks/rehearsal_report.py EXP --data CORPUS/LibriSpeech/test-clean [--epochs 1,8,16]

It writes ``EXP/rehearsal/`` (one ``asr.evaluate`` folder per epoch, ``attention_<id>.png``,
``report.json``) and prints a table. Whether the attention "aligns" is put as two numbers over the
utterance's output tokens, so a reader need not judge a picture alone: the Spearman correlation
between token index and the most attended encoder frame (near 1 for a monotonic alignment; near 0
for attention that ignores the audio's order), the share of steps that move that frame forward, and
the share whose peak lies in the last 5% of the frames (attention collapsed onto the end).
The results of a run are in docs/studies/las_open_vocabulary.md, "Before the bootstraps".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

from asr.cli.evaluate import main as evaluate
from asr.data.batching import collate, with_features
from asr.data.dataset import SpeechDataset
from asr.data.sources import read_source
from asr.inference.recogniser import load_recogniser
from asr.training.metrics import monotonicity as measure
from asr.training.validation import alignment_figures

LONG_SECONDS = 12.0


def epoch_checkpoints(exp: Path) -> list[tuple[int, Path]]:
    found = [(int(m.group(1)), p) for p in exp.glob("epoch*.pt") if (m := re.fullmatch(r"epoch(\d+)\.pt", p.name))]
    return sorted(found)


def test_rates(exp: Path, data: str, out: Path, epochs: set[int] | None) -> list[dict]:
    rows = []
    for epoch, checkpoint in epoch_checkpoints(exp):
        if epochs is not None and epoch not in epochs:
            continue
        folder = out / f"test_epoch{epoch}"
        if evaluate(["--checkpoint", str(checkpoint), "--data", data, "--out", str(folder)]) != 0:
            raise SystemExit(f"asr.evaluate failed on {checkpoint}")
        summary = json.loads((folder / "wer.json").read_text())
        rows.append({"epoch": epoch, "wer_percent": summary["wer_percent"], "cer_percent": summary["cer_percent"]})
    return rows


def monotonicity(weights: np.ndarray) -> dict:
    """How the most attended encoder frame moves over the output steps of ``weights`` (steps, frames):
    the training's own measure (:func:`asr.training.metrics.monotonicity`, ``valid/attention_*``)."""
    peaks = weights.argmax(axis=1)
    measures = measure(peaks, weights.shape[1])
    return {"spearman": measures["spearman"], "steps_moving_forward": measures["forward"],
            "steps_at_the_last_5pct": measures["at_end"], "tokens": int(len(peaks))}


def attention(checkpoint: Path, data: str, out: Path) -> dict:
    """Draw the teacher-forced attention of the longest test utterance over 12 s; measure its monotonicity."""
    recogniser = load_recogniser(checkpoint)
    long = [u for u in read_source(data) if u.text and u.duration > LONG_SECONDS]
    if not long:
        raise SystemExit(f"{data}: no utterance longer than {LONG_SECONDS:.0f} s")
    utt = max(long, key=lambda u: u.duration)
    dataset = SpeechDataset([utt], recogniser.pipeline, recogniser.tokenizer, train=False)
    # the figure the trainer writes to TensorBoard for its dev utterances
    [(_, figure)] = alignment_figures(recogniser.model, dataset, recogniser.tokenizer, recogniser.device, count=1)
    figure.savefig(out / f"attention_{utt.id}.png", dpi=110, bbox_inches="tight")
    batch = with_features(collate([dataset[0]]), dataset.pipeline)
    with torch.no_grad():
        output = recogniser.model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
    steps = int(batch.token_lengths[0]) + 1  # + <eos>
    frames = max(1, round(int(batch.feature_lengths[0]) * output.attention_weights.size(-1) / batch.features.size(1)))
    weights = output.attention_weights[0, :steps, :frames].float().numpy()
    return {"utterance": utt.id, "seconds": round(utt.duration, 2), "image": str(out / f"attention_{utt.id}.png"),
            "checkpoint": str(checkpoint), **monotonicity(weights)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exp", type=Path, help="the run's folder (exp_dir)")
    parser.add_argument("--data", required=True, help="the test split: a LibriSpeech-layout folder, Kaldi folder or manifest")
    parser.add_argument("--epochs", help="comma-separated epochs to decode (default: every epoch<N>.pt)")
    args = parser.parse_args(argv)
    epochs = {int(e) for e in args.epochs.split(",")} if args.epochs else None
    out = args.exp / "rehearsal"
    out.mkdir(exist_ok=True)
    rows = test_rates(args.exp, args.data, out, epochs)
    if not rows:
        raise SystemExit(f"{args.exp}: no epoch<N>.pt checkpoints")
    aligned = attention(epoch_checkpoints(args.exp)[-1][1], args.data, out)
    (out / "report.json").write_text(json.dumps({"test": rows, "attention": aligned}, indent=2) + "\n")
    print("| epoch | test WER | test CER |\n| ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['epoch']} | {row['wer_percent']:.1f}% | {row['cer_percent']:.1f}% |")
    print(json.dumps(aligned, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

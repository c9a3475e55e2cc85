"""What a LAS validation costs, part by part, on a run's own dev set:

    python benchmarks/validation_cost.py EXP/epoch3.pt [--utterances 60] [--threads 1]

Times, with the checkpoint's model and recipe: reading the dev batches, the teacher-forced pass over
every dev utterance (the losses and the attention measures), the speller's context-free pass
(``valid_loss_without_context``), and decoding ``--utterances`` of them spread over the lengths, greedy
and greedy with CTC prefix scores (``train.valid_ctc_weight: 0.3``), both stopped at the recipe's
``train.valid_max_len_ratio``. Prints seconds and each part as a ratio to the teacher-forced pass.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from asr.checkpoints.io import load_checkpoint
from asr.decoding import DecodingOptions
from asr.experiment import experiment_config_from_dict
from asr.models.registry import build_model
from asr.training.data import build_training_data, make_loader
from asr.training.validation import _decode_rows, decoded_counts, spread_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="an epoch{E}.pt or last.pt of a LAS run")
    parser.add_argument("--utterances", type=int, default=60, help="dev utterances decoded (default 60)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    state = load_checkpoint(args.checkpoint)
    config = experiment_config_from_dict(state["config"])
    data = build_training_data(config, state)
    model = build_model(config.model, data.pipeline.feature_dim, data.tokenizer)
    model.load_state_dict(state["model"])
    model.eval()
    seconds = {}
    start = time.perf_counter()
    batches = list(make_loader(data.valid_batches, data.valid_set, 0, 0, False))
    seconds["reading the dev batches"] = time.perf_counter() - start
    outputs = []
    with torch.no_grad():
        start = time.perf_counter()
        for batch in batches:
            outputs.append(model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths))
        seconds["teacher-forced pass"] = time.perf_counter() - start
        if hasattr(model, "loss_without_context"):
            start = time.perf_counter()
            for batch, output in zip(batches, outputs):
                model.loss_without_context(output.encoder, batch.tokens, batch.token_lengths)
            seconds["context-free pass"] = time.perf_counter() - start
        counts = decoded_counts([len(b) for b in batches], args.utterances)
        ratio = config.train.valid_max_len_ratio
        for name, ctc_weight in (("greedy", 0.0), ("greedy with CTC 0.3", 0.3)):
            if ctc_weight and not model.has_ctc:
                continue
            options = DecodingOptions(beam_size=1, ctc_weight=ctc_weight, max_len_ratio=ratio)
            start = time.perf_counter()
            for batch, output, count in zip(batches, outputs, counts):
                if count:
                    _decode_rows(model, output, batch, spread_rows(len(batch), count), data.tokenizer, options)
            seconds[f"decoding {sum(counts)}, {name}"] = time.perf_counter() - start
    reference = seconds["teacher-forced pass"]
    utterances = sum(len(b) for b in batches)
    print(f"{args.checkpoint}: {utterances} dev utterances, {torch.get_num_threads()} thread(s), "
          f"max_len_ratio {config.train.valid_max_len_ratio}")
    for name, value in seconds.items():
        print(f"  {name:<36} {value:7.1f} s   {value / reference:5.2f}x the teacher-forced pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())

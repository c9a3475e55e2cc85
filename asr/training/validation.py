"""Validation: the token-weighted loss and the WER/CER of the dev set, and pictures of the attention."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from asr.data.batching import collate, with_features
from asr.data.dataset import SpeechDataset
from asr.data.report import SkipReport
from asr.decoding import DecodingOptions, decode
from asr.metrics import error_rates

ALIGNMENT_UTTERANCES = 3  # dev utterances whose attention is drawn at every validation
ALIGNMENT_PREFIX = "alignment_"


def alignment_file_name(utt_id: str) -> str:
    """``alignment_<utterance id>.png``, with characters other than letters, digits, ``-``, ``_``
    and ``.`` replaced by ``_``: the trainer's picture of that dev utterance's attention."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in utt_id)
    return f"{ALIGNMENT_PREFIX}{safe}.png"


@dataclass
class Validation:
    metrics: dict[str, float]                 # valid_loss, valid_wer, valid_cer
    skipped: SkipReport = field(default_factory=SkipReport)


def decoded_batches(batch_sizes: list[int], max_utterances: int | None) -> set[int]:
    """Indices of the batches whose utterances are decoded for WER: all of them when ``max_utterances``
    is None or covers every utterance, else about ``max_utterances`` utterances' worth of batches spread
    evenly over the list.

    Validation batches come shortest first, so the first N utterances would be the N shortest, and a
    speller that loses its alignment on long utterances would not show in the WER. A batch is taken when that brings the
    count decoded so far nearer to ``max_utterances / total`` of the utterances seen so far, so the
    count stays within half a batch of that line all along the list.
    """
    total = sum(batch_sizes)
    if max_utterances is None or max_utterances >= total:
        return set(range(len(batch_sizes)))
    chosen, seen, decoded = set(), 0, 0
    for index, size in enumerate(batch_sizes):
        seen += size
        if decoded + size / 2 <= seen * max_utterances / total:
            chosen.add(index)
            decoded += size
    return chosen


@torch.no_grad()
def validate(model, loader, tokenizer, device: torch.device, options: DecodingOptions, max_utterances: int | None) -> Validation:
    """Loss over every batch of ``loader``; WER and CER of about ``max_utterances`` utterances spread
    over the lengths (see :func:`decoded_batches`; all: None)."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    refs, hyps = [], []
    skipped = SkipReport()
    decoded = decoded_batches([len(b) for b in loader.batch_sampler], max_utterances)
    for index, batch in enumerate(loader):
        for skip in batch.skipped:
            skipped.add(skip)
        if len(batch) == 0:
            continue
        batch = batch.to(device)
        if batch.audio is not None:  # features.compute_on: device; the dataset's pipeline computes them here
            batch = with_features(batch, loader.dataset.pipeline)
        output = model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
        total += float(output.loss) * output.num_tokens
        tokens += output.num_tokens
        if index in decoded:
            hyps += [tokenizer.decode(h) for h in decode(model, batch.features, batch.feature_lengths, options)]
            refs += [tokenizer.decode(t[:n].tolist()) for t, n in zip(batch.tokens, batch.token_lengths)]
    model.train(was_training)
    rates = error_rates(refs, hyps)
    metrics = {"valid_loss": total / max(tokens, 1), "valid_wer": rates["wer"], "valid_cer": rates["cer"]}
    return Validation(metrics, skipped)


@torch.no_grad()
def alignment_figures(model, dataset: SpeechDataset, tokenizer, device: torch.device, count: int = ALIGNMENT_UTTERANCES):
    """``(utterance id, figure)`` of the attention of the first ``count`` readable dev utterances
    (teacher-forced on their transcripts), for models whose output carries attention weights."""
    items = [item for item in (dataset[i] for i in range(min(count, len(dataset)))) if "skip" not in item]
    if not items:
        return []
    was_training = model.training
    model.eval()
    batch = with_features(collate(items).to(device), dataset.pipeline)
    output = model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
    model.train(was_training)
    if output.attention_weights is None:
        return []
    from asr.plots import alignment_figure  # matplotlib and librosa: only where a figure is drawn

    frame_seconds = dataset.pipeline.config.frame_shift_ms / 1000.0
    figures = []
    for row, utt_id in enumerate(batch.ids):
        frames, length = int(batch.feature_lengths[row]), int(batch.token_lengths[row]) + 1  # + <eos>
        weights = output.attention_weights[row, :length].float().cpu().numpy()
        reduction = batch.features.size(1) / output.attention_weights.size(-1)
        weights = weights[:, : max(1, round(frames / reduction))]
        labels = [tokenizer.decode([t]) or "?" for t in batch.tokens[row, : length - 1].tolist()] + ["<eos>"]
        figure = alignment_figure(batch.features[row, :frames].cpu().numpy(), weights, frame_seconds, utt_id, labels)
        figures.append((utt_id, figure))
    return figures

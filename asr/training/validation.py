"""Validation: the metrics of the dev set (:mod:`asr.training.metrics`), and pictures of the attention."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from asr.data.batching import collate, with_features
from asr.data.dataset import SpeechDataset
from asr.data.report import SkipReport
from asr.decoding import DecodingOptions, search
from asr.training.metrics import ValidBatch, metrics_for

ALIGNMENT_UTTERANCES = 3  # dev utterances whose attention is drawn at every validation
ALIGNMENT_PREFIX = "alignment_"


def alignment_title(utt_id: str, when: str | None) -> str:
    """The title of a picture of an utterance's attention: what it is (teacher-forced on the
    transcript, not what decoding does) and when (``"after epoch 3"``)."""
    return f"{utt_id}: teacher-forced attention" + (f", {when}" if when else "")


def alignment_file_name(utt_id: str) -> str:
    """``alignment_<utterance id>.png``, with characters other than letters, digits, ``-``, ``_``
    and ``.`` replaced by ``_``: the trainer's picture of that dev utterance's attention."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in utt_id)
    return f"{ALIGNMENT_PREFIX}{safe}.png"


@dataclass
class Validation:
    metrics: dict[str, float]                 # by metric name (asr.training.metrics); empty: nothing scored
    skipped: SkipReport = field(default_factory=SkipReport)
    utterances: int = 0                       # dev utterances scored (their audio could be read)
    decoded: int = 0                          # of which decoded for WER and CER


def decoded_positions(total: int, max_utterances: int | None) -> list[int]:
    """Positions, in length order, of the utterances to decode for WER: all ``total`` when ``max_utterances``
    is None or covers them, else ``max_utterances`` spread evenly (the k-th at ``(k + 1/2) * total / max``).

    Validation batches come shortest first, so the first N utterances would be the N shortest, and a
    speller that loses its alignment on long utterances would not show in the WER. Utterances, not
    batches, are chosen, so the count is exact whatever the batches hold, and the same utterances are
    decoded at every batch budget (``asr.validate --max-frames-per-batch A B C``).
    """
    if max_utterances is None or max_utterances >= total:
        return list(range(total))
    return [int((k + 0.5) * total / max_utterances) for k in range(max_utterances)]


def decoded_ids(dataset, max_utterances: int | None) -> set[str] | None:
    """The ids of ``dataset``'s utterances to decode for WER (:func:`decoded_positions` over them in order of
    length, ties in dataset order), or None for all of them: chosen from the utterances alone, never from
    how they are batched."""
    if max_utterances is None or max_utterances >= len(dataset):
        return None
    frames = dataset.num_frames()
    order = sorted(range(len(frames)), key=frames.__getitem__)
    return {dataset.utterances[order[p]].id for p in decoded_positions(len(order), max_utterances)}


def spread_rows(size: int, count: int) -> list[int]:
    """``count`` of ``size`` rows, evenly spread (all of them when ``count >= size``)."""
    if count >= size:
        return list(range(size))
    return sorted({int((k + 0.5) * size / count) for k in range(count)})


def validation_options(train_cfg, model) -> DecodingOptions:
    """The decoding behind the validation WER and CER: ``train.valid_beam_size``, ``train.valid_ctc_weight``
    (0 for a model without a CTC head) and ``train.valid_max_len_ratio`` of ``train_cfg``."""
    ctc_weight = train_cfg.valid_ctc_weight if model.has_ctc else 0.0
    return DecodingOptions(beam_size=train_cfg.valid_beam_size, ctc_weight=ctc_weight,
                           max_len_ratio=train_cfg.valid_max_len_ratio)


@torch.no_grad()
def validate(model, loader, tokenizer, device: torch.device, options: DecodingOptions, max_utterances: int | None) -> Validation:
    """Every registered metric that applies to ``model`` (:mod:`asr.training.metrics`) over the batches
    of ``loader``: one teacher-forced pass per batch, and a decode of ``max_utterances`` utterances spread
    over the lengths for WER and CER (see :func:`decoded_ids`; all: None), the same whatever the batches.
    An unreadable utterance meant to be decoded is replaced by the next batch's, so the count holds while
    enough can be read."""
    was_training = model.training
    model.eval()
    metrics = metrics_for(model)
    skipped = SkipReport()
    chosen = decoded_ids(loader.dataset, max_utterances)
    planned = [[loader.dataset.utterances[i].id for i in indices] for indices in loader.batch_sampler]
    owed, scored, decoded_total = 0, 0, 0
    for index, batch in enumerate(loader):
        for skip in batch.skipped:
            skipped.add(skip)
        if chosen is None:
            owed += len(planned[index])
        else:  # a chosen utterance that could not be read is owed, and taken from those read after it
            owed += sum(utt_id in chosen for utt_id in planned[index]) - sum(utt_id in chosen for utt_id in batch.ids)
        if len(batch) == 0:
            continue
        batch = batch.to(device)
        if batch.audio is not None:  # features.compute_on: device; the dataset's pipeline computes them here
            batch = with_features(batch, loader.dataset.pipeline)
        output = model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths)
        references = [tokenizer.decode(t[:n].tolist()) for t, n in zip(batch.tokens, batch.token_lengths)]
        if chosen is None:
            rows = spread_rows(len(batch), owed)
        else:
            rows = [row for row, utt_id in enumerate(batch.ids) if utt_id in chosen]
            others = [row for row in range(len(batch)) if row not in rows]
            rows = sorted(rows + [others[r] for r in spread_rows(len(others), owed)])
            owed -= len(rows) - sum(utt_id in chosen for utt_id in batch.ids)
        if chosen is None:
            owed -= len(rows)
        hypotheses = None
        if rows:
            hypotheses = _decode_rows(model, output, batch, rows, tokenizer, options)
        view = ValidBatch(batch, model, output, tokenizer, references, rows, hypotheses)
        for metric in metrics:
            metric.add(view)
        scored += len(batch)
        decoded_total += len(rows)
    model.train(was_training)
    values = {m.name: m.result() for m in metrics}
    return Validation({k: v for k, v in values.items() if v is not None}, skipped, scored, decoded_total)


def _decode_rows(model, output, batch, rows: list[int], tokenizer, options: DecodingOptions) -> list[str]:
    """The decoded texts of ``rows`` of ``batch``, from the encoder output of its teacher-forced pass
    (the same in eval mode) when the model kept it, else encoded again."""
    index = torch.tensor(rows, device=batch.features.device)
    encoder = output.encoder
    if encoder is None:
        encoder = model.encode(batch.features.index_select(0, index), batch.feature_lengths.index_select(0, index))
    elif len(rows) < len(batch):
        encoder = encoder.index_select(index)
    return [tokenizer.decode(h) for h in search(model, encoder, options)]


@torch.no_grad()
def alignment_figures(model, dataset: SpeechDataset, tokenizer, device: torch.device, count: int = ALIGNMENT_UTTERANCES,
                      when: str | None = None):
    """``(utterance id, figure)`` of the attention of the first ``count`` readable dev utterances
    (teacher-forced on their transcripts), for models whose output carries attention weights; each
    titled with the utterance, "teacher-forced" and ``when`` (``"after epoch 3"``) when given."""
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
        figure = alignment_figure(batch.features[row, :frames].cpu().numpy(), weights, frame_seconds,
                                  alignment_title(utt_id, when), labels)
        figures.append((utt_id, figure))
    return figures

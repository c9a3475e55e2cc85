"""Unsupervised speaker adaptation: fine-tune on the model's own transcripts of a speaker.

A recogniser trained on a few speakers makes systematic errors on a new one
(one speaker's TWO heard as EIGHT again and again), yet most of what it
writes for that speaker is right. Self-training turns those right
transcripts into training targets, per speaker:

1. decode the speaker's utterances with the first-pass strategy (plain
   decoding, or test-time VTLN, which fixes the speaker's warp);
2. ``rounds`` times: fine-tune a copy of every model (each ensemble member)
   on the speaker's audio with the current transcripts as targets, then
   decode again with the adapted models at the speaker's warp; the new
   transcripts are the next round's targets.

No reference transcript is read: it is the two-pass speaker adaptation of
classic recognisers (decode, adapt to the speaker, decode again), with
fine-tuning in place of a feature transform. Fine-tuning uses the
recogniser's own training augmentation (speed perturbation, dither,
SpecAugment: the first checkpoint's settings for an ensemble) with the mel
warp fixed at the speaker's, plain Adam at ``lr``, the gradient clipping of
the training recipe, and the training step of :mod:`asr.training.step`.
Utterances decoded as empty, or with the unknown token, are left out of
that round's fine-tuning and counted. With ``ctc_agreement``, so are those
whose CTC best path (the most probable token per frame, no decoder) differs
from the decoder's transcript.

Self-training can amplify a confusion instead of fixing it: when the first
pass writes THREE for many of a speaker's EIGHTs, fine-tuning on those
transcripts teaches it further. ``asr.evaluate`` records the WER after every
round in ``wer.json`` to show when that happens; docs/studies/fsdd_loso.md has the
measurements behind the defaults.

Every speaker starts from the unadapted models, so the result for one
speaker does not depend on the others.
"""

from __future__ import annotations

import copy
import logging
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from asr.data.batching import BucketBatchSampler, collate
from asr.data.dataset import SpeechDataset
from asr.data.utterance import Utterance
from asr.decoding import DecodingOptions
from asr.inference.config import ADAPTABLE, AdaptationSettings  # noqa: F401 (re-exported)
from asr.inference.interface import RecogniserProtocol
from asr.inference.strategies import PlainDecoding, SpeakerResult, Strategy
from asr.models.norms import ScaleNorm
from asr.training.step import TrainingStep, describe

logger = logging.getLogger("asr.adapt")

# The layers whose parameters "norms" adapts (FixNorm and conv_norm: none have none): LayerNorm (the
# Conformer's per-frame conv_norm among them), ScaleNorm, RMSNorm, and the Conformer's BatchNorm and GroupNorm.
NORM_LAYERS = (torch.nn.LayerNorm, ScaleNorm, torch.nn.RMSNorm, torch.nn.BatchNorm1d, torch.nn.GroupNorm)


@dataclass(frozen=True)
class SelfTraining:
    """Self-training adaptation per speaker (module docstring), after ``first_pass``."""

    settings: AdaptationSettings
    first_pass: Strategy = field(default_factory=PlainDecoding)
    per_speaker = True

    def run(self, recogniser: RecogniserProtocol, utterances: list[Utterance], options: DecodingOptions, batch_size: int) -> SpeakerResult:
        start = time.perf_counter()
        first = self.first_pass.run(recogniser, utterances, options, batch_size)
        warp = first.warp if first.warp is not None else 1.0
        readable = [k for k, text in enumerate(first.texts) if text is not None]  # the others stay None
        own = [utterances[k] for k in readable]
        texts = [first.texts[k] for k in readable]
        rounds = [texts]
        counts: Counter = Counter()
        models = [copy.deepcopy(m) for m in recogniser.members()]
        current = recogniser
        speaker = utterances[0].speaker if utterances else ""
        for round_index in range(1, self.settings.rounds + 1):
            targets = self._targets(current, own, texts, warp, batch_size, counts)
            for member, model in enumerate(models):
                seed = self.settings.seed + 1000 * round_index + member + zlib.crc32(speaker.encode())
                counts["nonfinite_steps"] += fine_tune(model, targets, recogniser, warp, self.settings, seed)
            current = recogniser.with_models(models)
            texts = current.decode(own, options, warp=warp, batch_size=batch_size).texts
            rounds.append(texts)
            logger.info(
                "speaker %s, round %d: %d model(s) fine-tuned on %d of %d utterances at warp %g, decoded again (%.0f s)",
                speaker, round_index, len(models), len(targets), len(own), warp, time.perf_counter() - start,
            )
        aligned = [_realign(round_texts, readable, len(utterances)) for round_texts in rounds]
        return SpeakerResult(aligned[-1], first.skipped, warp, first.warp_scores, aligned, counts)

    def _targets(self, current, own, texts, warp, batch_size, counts: Counter) -> list[Utterance]:
        """The utterances with their current transcripts as targets, leaving out the unusable ones."""
        second = current.ctc_best_paths(own, warp, batch_size) if self.settings.ctc_agreement else [None] * len(own)
        targets = []
        for utt, text, ctc_text in zip(own, texts, second):
            if not _usable(text, current):
                counts["untranscribed"] += 1
            elif ctc_text is not None and ctc_text != text:
                counts["disagreed"] += 1
            else:
                targets.append(replace(utt, text=text))
        return targets


def _realign(texts: list[str], positions: list[int], size: int) -> list[str | None]:
    aligned: list[str | None] = [None] * size
    for position, text in zip(positions, texts):
        aligned[position] = text
    return aligned


def _usable(text: str, recogniser: RecogniserProtocol) -> bool:
    """A transcript can be a target: not empty, and no unknown-token mark the tokenizer cannot encode."""
    return bool(text.strip()) and not recogniser.tokenizer.unknown_characters(text)


def fine_tune(
    model: torch.nn.Module,
    targets: list[Utterance],
    recogniser: RecogniserProtocol,
    warp: float,
    settings: AdaptationSettings,
    seed: int,
) -> int:
    """Fine-tune ``model`` in place on ``targets`` at mel warp ``warp``; returns the steps skipped as non-finite."""
    if not targets:
        return 0
    config = recogniser.config
    dataset = SpeechDataset(targets, recogniser.pipeline, recogniser.tokenizer, train=True, seed=seed, warp=warp)
    sampler = BucketBatchSampler(dataset.num_frames(), config.data.max_frames_per_batch, shuffle=True, seed=seed)
    tuned = adapted_parameters(model, settings.parameters)
    step = TrainingStep(model, torch.optim.Adam(tuned, lr=settings.lr), grad_clip=config.train.grad_clip, parameters=tuned)
    skipped = 0
    # Only the tuned parameters need gradients; the flags are restored afterwards.
    tuned_ids = {id(p) for p in tuned}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in tuned_ids]
    for parameter in frozen:
        parameter.requires_grad_(False)
    # Dropout draws from the global generator: seed it here without disturbing the caller's.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.train()
        for epoch in range(settings.epochs):
            sampler.set_epoch(epoch)
            dataset.set_epoch(epoch)
            for indices in sampler:
                batch = collate([dataset[i] for i in indices]).to(recogniser.device)
                outcome = step.backward(batch)
                if outcome.loss is not None:
                    outcome = step.update()
                if outcome.skipped:
                    skipped += outcome.skipped.reason.nonfinite
                    logger.warning("adaptation: %s; step skipped (utterances: %s)", outcome.skipped, describe(batch.ids))
        model.eval()
    for parameter in frozen:
        parameter.requires_grad_(True)
    return skipped


def adapted_parameters(model: torch.nn.Module, which: str) -> list[torch.nn.Parameter]:
    """The parameters ``which`` (:attr:`AdaptationSettings.parameters`) names in ``model``."""
    if which == "all":
        return list(model.parameters())
    found = [p for m in model.modules() if isinstance(m, NORM_LAYERS) for p in m.parameters(recurse=False)]
    if not found:
        raise ValueError("adaptation parameters 'norms': the model has no normalisation layers (model.layer_norm=none?)")
    return found

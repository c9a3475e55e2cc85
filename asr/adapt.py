"""Unsupervised speaker adaptation: fine-tune on the model's own transcripts of a speaker.

A recogniser trained on a few speakers makes systematic errors on a new one
(one speaker's TWO heard as EIGHT again and again), yet most of what it
writes for that speaker is right. Self-training turns those right
transcripts into training targets, per speaker:

1. decode the speaker's utterances (with test-time VTLN when ``warps`` are
   given, which fixes the speaker's warp; else at no warp);
2. ``rounds`` times: fine-tune a copy of every model (each ensemble member)
   on the speaker's audio with the current transcripts as targets, then
   decode again with the adapted models; the new transcripts are the next
   round's targets.

No reference transcript is read: it is the two-pass speaker adaptation of
classic recognisers (decode, adapt to the speaker, decode again), with
fine-tuning in place of a feature transform. Fine-tuning uses the
recogniser's own training augmentation (speed perturbation, dither,
SpecAugment: the first checkpoint's settings for an ensemble) with the mel
warp fixed at the speaker's, plain Adam at ``lr`` and the gradient clipping
of the training recipe. Utterances decoded as empty, or with the unknown
token, are left out of that round's fine-tuning and counted. With
``ctc_agreement`` (off by default, see :class:`AdaptationSettings`), so are
those whose CTC best path (the most probable token per frame, no decoder)
differs from the decoder's transcript.

Self-training can amplify a confusion instead of fixing it: when the first
pass writes THREE for many of a speaker's EIGHTs, fine-tuning on those
transcripts teaches it further. The WER after every round is in ``wer.json``
(``asr.evaluate``) to show when that happens. A step whose loss is not finite is
skipped and logged with its utterances, so the weights never see it.

Every speaker starts from the unadapted models, so the result for one
speaker does not depend on the others.
"""

from __future__ import annotations

import copy
import logging
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field, replace

import torch

from asr.data.batching import BucketBatchSampler, collate
from asr.data.dataset import SpeechDataset
from asr.data.report import SkipReport
from asr.data.utterance import Utterance
from asr.inference import Recogniser
from asr.models.ensemble import Ensemble
from asr.models.norms import ScaleNorm

logger = logging.getLogger("asr.adapt")


ADAPTABLE = ("all", "norms")
# The layers whose parameters "norms" adapts (FixNorm has none).
NORM_LAYERS = (torch.nn.LayerNorm, ScaleNorm)


@dataclass
class AdaptationSettings:
    # Measured on the leave-one-speaker-out FSDD folds (docs/results.md): the third round
    # still gains; four epochs at 3e-4 move a model trained at 2e-3 enough to fix a
    # speaker's systematic confusions without forgetting the rest.
    rounds: int = 3
    epochs: int = 4        # passes over the speaker's utterances per round
    lr: float = 3e-4
    seed: int = 0          # dropout, augmentation and batch order
    # What is fine-tuned: "all" parameters, or "norms": only the gains and biases of the
    # normalisation layers (LayerNorm, ScaleNorm): a per-speaker re-normalisation that
    # leaves every weight matrix as trained.
    parameters: str = "all"
    # Train only on the transcripts the CTC head's best path agrees with. Off: on FSDD it
    # made adaptation worse (5.9% against 4.0% pooled, docs/results.md). Where the CTC head
    # shares the decoder's confusion for a speaker, it keeps the wrong transcripts of that
    # word and drops the right ones, and the rounds then amplify the confusion.
    ctc_agreement: bool = False

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.epochs < 1:
            raise ValueError(f"adaptation needs at least one round and one epoch, got {self.rounds} and {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"the adaptation learning rate must be positive, got {self.lr}")
        if self.parameters not in ADAPTABLE:
            raise ValueError(f"adaptation parameters must be one of {', '.join(ADAPTABLE)}, got {self.parameters!r}")


@dataclass
class AdaptationResult:
    """Transcripts per round (round 0: before adaptation), aligned with the utterances given;
    None for an utterance whose audio could not be read."""

    texts_per_round: list[list[str | None]]
    warps: dict[str, float] = field(default_factory=dict)  # speaker -> the warp adapted and decoded at
    untranscribed: int = 0       # (utterance, round) pairs left out of fine-tuning: empty, or the unknown token
    disagreed: int = 0           # (utterance, round) pairs left out: the CTC best path wrote something else
    nonfinite_steps: int = 0     # fine-tuning steps skipped for a non-finite loss
    seconds: float = 0.0         # fine-tuning and decoding, all speakers and rounds

    @property
    def texts(self) -> list[str | None]:
        """The final transcripts."""
        return self.texts_per_round[-1]


def adapt_and_transcribe(
    recogniser: Recogniser,
    utterances: list[Utterance],
    settings: AdaptationSettings,
    warps: list[float] | None = None,
    beam_size: int = 1,
    batch_size: int = 16,
    report: SkipReport | None = None,
    **options,
) -> AdaptationResult:
    """Transcribe ``utterances`` with the models adapted to each ``Utterance.speaker`` (module docstring).

    ``warps``, ``beam_size``, ``batch_size``, ``report`` and ``options``
    (``ctc_weight``, ``length_penalty``, ...) are those of
    :meth:`asr.inference.Recogniser.transcribe_utterances` and apply to every
    decoding pass. An utterance whose audio cannot be read is recorded in
    ``report`` once, gets None in every round, and takes no further part.
    ``recogniser`` is left unchanged.
    """
    start = time.perf_counter()
    by_speaker: dict[str, list[int]] = defaultdict(list)
    for i, utt in enumerate(utterances):
        by_speaker[utt.speaker].append(i)
    result = AdaptationResult([[None] * len(utterances) for _ in range(settings.rounds + 1)])
    decode = dict(beam_size=beam_size, batch_size=batch_size, **options)
    for speaker, indices in by_speaker.items():
        texts = recogniser.transcribe_utterances([utterances[i] for i in indices], warps=warps, report=report, **decode)
        readable = [k for k, text in enumerate(texts) if text is not None]
        indices, texts = [indices[k] for k in readable], [texts[k] for k in readable]
        own = [utterances[i] for i in indices]
        warp = recogniser.chosen_warps[speaker] if warps else 1.0
        result.warps[speaker] = warp
        rounds = [texts]
        models = [copy.deepcopy(m) for m in _members(recogniser.model)]
        current = recogniser
        for round_index in range(1, settings.rounds + 1):
            round_start = time.perf_counter()
            second = current.ctc_transcribe_utterances(own, batch_size, warp) if settings.ctc_agreement else None
            targets = []
            for utt, text, ctc_text in zip(own, texts, second or [None] * len(own)):
                if not _usable(text, recogniser):
                    result.untranscribed += 1
                elif ctc_text is not None and ctc_text != text:
                    result.disagreed += 1
                else:
                    targets.append(replace(utt, text=text))
            for member, model in enumerate(models):
                seed = settings.seed + 1000 * round_index + member + zlib.crc32(speaker.encode())
                result.nonfinite_steps += fine_tune(model, targets, recogniser, warp, settings, seed)
            current = _recogniser(recogniser, models)
            texts = current.transcribe_utterances(own, warps=[warp], **decode)
            rounds.append(texts)
            logger.info(
                "speaker %s, round %d: %d model(s) fine-tuned on %d of %d utterances at warp %g, decoded again (%.0f s)",
                speaker, round_index, len(models), len(targets), len(own), warp, time.perf_counter() - round_start,
            )
        for round_index, round_texts in enumerate(rounds):
            for i, text in zip(indices, round_texts):
                result.texts_per_round[round_index][i] = text
    result.seconds = time.perf_counter() - start
    return result


def _usable(text: str, recogniser: Recogniser) -> bool:
    """A transcript can be a target: not empty, and no unknown-token mark the tokenizer cannot encode."""
    return bool(text.strip()) and not recogniser.tokenizer.unknown_characters(text)


def _members(model: torch.nn.Module) -> list[torch.nn.Module]:
    return list(model.models) if isinstance(model, Ensemble) else [model]


def _recogniser(template: Recogniser, models: list[torch.nn.Module]) -> Recogniser:
    """A recogniser like ``template`` (tokenizer, features, config) decoding with ``models``."""
    model = Ensemble(models) if len(models) > 1 else models[0]
    return Recogniser(model.eval(), template.tokenizer, template.pipeline, template.config, template.device)


def fine_tune(
    model: torch.nn.Module,
    targets: list[Utterance],
    recogniser: Recogniser,
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
    optimizer = torch.optim.Adam(tuned, lr=settings.lr)
    clip = config.train.grad_clip if config.train.grad_clip > 0 else float("inf")
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
                if len(batch) == 0:  # every item's audio failed to read (they were read before, so rarely)
                    continue
                loss = model(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths).loss
                if not torch.isfinite(loss):
                    skipped += 1
                    shown = ", ".join(batch.ids[:8]) + (" ..." if len(batch.ids) > 8 else "")
                    logger.warning("adaptation: non-finite loss %s; step skipped (utterances: %s)", loss.item(), shown)
                    continue
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(tuned, clip)
                if not torch.isfinite(norm):
                    skipped += 1
                    logger.warning("adaptation: non-finite gradient norm; step skipped (utterances: %s)", batch.ids[0])
                    continue
                optimizer.step()
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

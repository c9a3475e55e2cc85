"""Unsupervised speaker adaptation (asr/inference/adaptation.py) on real FSDD speech with a tiny LAS."""

import copy
import dataclasses

import pytest
import torch

import asr.inference.adaptation as adaptation
from asr.data.batching import collate
from asr.data.dataset import SpeechDataset
from asr.data.fsdd import build_connected_digits, read_fsdd
from asr.data.tokenizer import CharTokenizer
from asr.experiment import ExperimentConfig
from asr.inference import PlainDecoding, Recogniser, SelfTraining, Transcription, VTLNSearch, transcribe_speakers
from asr.inference.adaptation import AdaptationSettings, adapted_parameters, fine_tune
from asr.models.registry import build_model
from asr.models.attention import AttentionConfig
from asr.models.las import LASConfig
from asr.models.listener import ListenerConfig
from asr.models.speller import SpellerConfig
from features.config import FeatureConfig, SpecAugmentConfig
from features.pipeline import FeaturePipeline


pytestmark = pytest.mark.slow  # fine-tuning is training


def adapt(recogniser, utterances, settings, warps=None):
    """Self-training per speaker, after VTLN over ``warps`` when given."""
    first = VTLNSearch(tuple(warps)) if warps else PlainDecoding()
    return transcribe_speakers(recogniser, utterances, SelfTraining(settings, first))


@pytest.fixture(scope="module")
def utterances(fsdd_recordings):
    """Three connected-digit utterances of george, then three of jackson."""
    found = []
    for speaker in ("george", "jackson"):
        takes = read_fsdd(fsdd_recordings, [speaker], take_range=(0, 2))
        found += build_connected_digits(takes, 3, digits_per_utterance=(1, 2), seed=0)
    return found


def recogniser(utterances, layer_norm: str = "both") -> Recogniser:
    """An untrained tiny LAS with the FSDD recipe's kind of features and augmentation."""
    features = FeatureConfig(
        kind="mfcc", num_ceps=13, sample_rate=8000, num_mel_bins=23, mvn="utterance",
        speed_perturb=[0.9, 1.0, 1.1], spec_augment=SpecAugmentConfig(enabled=True, freq_mask_width=2, time_mask_width=5),
    )
    tokenizer = CharTokenizer.train(u.text for u in utterances)
    model_config = LASConfig(
        listener=ListenerConfig(hidden_size=16, num_layers=2, pyramid_layers=1),
        attention=AttentionConfig(type="location", dim=16),
        speller=SpellerConfig(embedding_dim=8, hidden_size=16, num_layers=1),
        ctc_weight=0.3,
        layer_norm=layer_norm,
    )
    config = ExperimentConfig(exp_dir="unused", features=features, model=model_config)
    pipeline = FeaturePipeline(features)
    torch.manual_seed(0)
    model = build_model(model_config, pipeline.feature_dim, tokenizer).eval()
    return Recogniser(model, tokenizer, pipeline, config, torch.device("cpu"))


@pytest.fixture(scope="module")
def taught(utterances) -> Recogniser:
    """The tiny LAS fine-tuned on the six references, so that it writes digit words, not unknown tokens."""
    rec = recogniser(utterances)
    fine_tune(rec.model, utterances, rec, warp=1.0, settings=AdaptationSettings(epochs=30, lr=3e-3), seed=0)
    return rec


def loss_on(model, recogniser, utterances) -> float:
    """The model's loss on ``utterances`` (no augmentation, eval mode)."""
    dataset = SpeechDataset(utterances, recogniser.pipeline, recogniser.tokenizer)
    batch = collate([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        return float(model.eval()(batch.features, batch.feature_lengths, batch.tokens, batch.token_lengths).loss)


def test_fine_tuning_learns_its_targets(utterances):
    rec = recogniser(utterances)
    model = copy.deepcopy(rec.model)
    before = loss_on(model, rec, utterances)
    skipped = fine_tune(model, utterances, rec, warp=1.0, settings=AdaptationSettings(epochs=15, lr=3e-3), seed=0)
    assert skipped == 0
    assert loss_on(model, rec, utterances) < 0.8 * before
    assert not model.training  # left ready to decode


def test_norms_only_adaptation_changes_only_the_layer_norms(utterances):
    rec = recogniser(utterances)
    model = copy.deepcopy(rec.model)
    before = copy.deepcopy(model.state_dict())
    norms = {name for name, _ in model.named_parameters() if ".ln_" in name}  # every LN of the LN-LSTMs
    assert {id(p) for p in adapted_parameters(model, "norms")} == {id(p) for n, p in model.named_parameters() if n in norms}
    before_loss = loss_on(model, rec, utterances)
    fine_tune(model, utterances, rec, warp=1.0, settings=AdaptationSettings(epochs=10, lr=1e-2, parameters="norms"), seed=0)
    changed = {name for name, tensor in model.state_dict().items() if not torch.equal(tensor, before[name])}
    assert changed and changed <= norms
    assert loss_on(model, rec, utterances) < before_loss  # the gains and biases alone still learn
    assert all(p.requires_grad for p in model.parameters())  # the frozen weights are trainable again
    # A model without norms has nothing to adapt that way.
    with pytest.raises(ValueError, match="no normalisation layers"):
        adapted_parameters(recogniser(utterances, layer_norm="none").model, "norms")


def test_a_non_finite_loss_never_reaches_the_weights(utterances):
    rec = recogniser(utterances)

    class NaNLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            output = self.inner(*args)
            return dataclasses.replace(output, loss=output.loss * float("nan"))

    model = NaNLoss(copy.deepcopy(rec.model))
    before = copy.deepcopy(model.state_dict())
    skipped = fine_tune(model, utterances, rec, warp=1.0, settings=AdaptationSettings(epochs=2), seed=0)
    assert skipped >= 2  # every step of both epochs
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_adaptation_is_per_speaker_and_leaves_the_recogniser_unchanged(utterances, taught):
    rec = taught
    weights = copy.deepcopy(rec.model.state_dict())
    settings = AdaptationSettings(rounds=2, epochs=2, lr=3e-3)
    warps = [0.9, 1.0, 1.1]
    result = adapt(rec, utterances, settings, warps)
    assert len(result.rounds) == 3 and result.texts == result.rounds[-1]
    assert result.counts["untranscribed"] < 6  # some transcripts were targets
    # Round 0 is decoding with test-time VTLN, each speaker at the warp it chose.
    vtln = transcribe_speakers(rec, utterances, VTLNSearch(tuple(warps)))
    assert result.rounds[0] == vtln.texts
    assert result.warps == vtln.warps and set(result.warps) == {"george", "jackson"}
    for name, tensor in rec.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    # Fine-tuning changed the models: some transcript differs after the rounds.
    assert result.rounds[2] != result.rounds[0]
    # One speaker's adaptation does not depend on the other speaker's utterances.
    alone = adapt(rec, utterances[3:], settings, warps)
    assert alone.rounds == [texts[3:] for texts in result.rounds]


def test_empty_transcripts_are_left_out_and_counted(utterances, monkeypatch):
    rec = recogniser(utterances)
    decode = Recogniser.decode

    def first_is_empty(self, utts, *args, **options):
        decode(self, utts, *args, **options)
        return Transcription(["" if u is utterances[0] else u.text for u in utts])

    monkeypatch.setattr(Recogniser, "decode", first_is_empty)
    result = adapt(rec, utterances, AdaptationSettings(rounds=2, epochs=1))
    assert result.counts["untranscribed"] == 2  # once per round
    assert result.warps == {"george": 1.0, "jackson": 1.0}  # no VTLN: adapted and decoded at no warp


@pytest.mark.parametrize("ctc_agreement", [True, False])
def test_targets_are_the_transcripts_the_ctc_best_path_agrees_with(utterances, monkeypatch, ctc_agreement):
    rec = recogniser(utterances)
    # The decoder writes the references; the CTC head agrees on every other utterance.
    monkeypatch.setattr(Recogniser, "decode", lambda self, utts, *args, **options: Transcription([u.text for u in utts]))
    monkeypatch.setattr(
        Recogniser, "ctc_best_paths",
        lambda self, utts, warp, batch_size: [u.text if u.id[-1] in "02468" else "ONE" for u in utts],
    )
    trained_on = []

    def record(model, targets, recogniser, warp, settings, seed):
        trained_on.append([t.id for t in targets])
        return 0

    monkeypatch.setattr(adaptation, "fine_tune", record)
    settings = AdaptationSettings(rounds=2, epochs=1, ctc_agreement=ctc_agreement)
    result = adapt(rec, utterances, settings)
    agreed = [[u.id for u in utterances[:3] if u.id[-1] in "02468"], [u.id for u in utterances[3:] if u.id[-1] in "02468"]]
    everything = [[u.id for u in utterances[:3]], [u.id for u in utterances[3:]]]
    expected = agreed if ctc_agreement else everything
    # One model, two rounds per speaker, george first.
    assert trained_on == [expected[0], expected[0], expected[1], expected[1]]
    assert result.counts["disagreed"] == (2 * 2 if ctc_agreement else 0)  # one of three per speaker, per round


@pytest.mark.parametrize("bad", [dict(rounds=0), dict(epochs=0), dict(lr=0.0), dict(parameters="weights")])
def test_settings_refuse_what_cannot_adapt(bad):
    with pytest.raises(ValueError, match="adaptation"):
        AdaptationSettings(**bad)

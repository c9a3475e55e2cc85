"""Listen-Attend-Spell (asr/models/las.py): config, layer-norm placement, the
loss combination, and learning real connected digits."""

import pytest
import soundfile
import torch
import torch.nn.functional as F
import torchaudio
from torch.nn.utils.rnn import pad_sequence

from asr.config import ConfigError, from_dict, to_dict
from asr.decoding import DecodingOptions, beam_search, greedy_search
from asr.models.attention import AttentionConfig
from asr.models.mocha import MochaConfig
from asr.models.common import add_sos_eos
from asr.models.las import LAS, LASConfig
from asr.models.listener import ListenerConfig
from asr.models.lnlstm import LNLSTM, CellSpec, LNLSTMCell, LNLSTMOptions
from asr.models.speller import SpellerConfig

from helpers import las_batch as random_batch
from helpers import small_las_config as small_config

PAD, SOS, EOS = 0, 1, 2


@pytest.mark.parametrize(
    "place, listener_ln, speller_ln",
    [("both", True, True), ("listener", True, False), ("speller", False, True), ("none", False, False)],
)
def test_layer_norm_value_builds_the_model_it_names(place, listener_ln, speller_ln):
    model = LAS(small_config(layer_norm=place), input_dim=6, vocab_size=10)
    listener_cells = [m for m in model.listener.modules() if isinstance(m, LNLSTMCell)]
    speller_cells = [m for m in model.speller.modules() if isinstance(m, LNLSTMCell)]
    assert len(listener_cells) == 6 and len(speller_cells) == 2
    for cells, expected in ((listener_cells, listener_ln), (speller_cells, speller_ln)):
        for cell in cells:
            names = {name for name, _ in cell.named_parameters()}
            norm_names = {n for n in names if n.startswith("ln_")}
            if expected:
                assert norm_names == {f"ln_{x}.{p}" for x in "xhc" for p in ("weight", "bias")}
            else:
                assert norm_names == set()
    # Nothing else in the model is a norm.
    other_norms = [
        name for name, m in model.named_modules() if "Norm" in type(m).__name__ and ".cells." not in name
    ]
    assert other_norms == []


def test_every_lnlstm_option_of_the_recipe_reaches_every_lstm():
    """The recipe's LN-LSTM options travel as one object (LASConfig.lnlstm_options): each reaches every
    cell of the listener and the speller, and the layer norm follows ``layer_norm``'s placement."""
    config = small_config(layer_norm="speller", lnlstm_variant="raw_gates", lnlstm_eps=1e-4, forget_bias=0.5,
                          lnlstm_backend="reference", lnlstm_check="off", lnlstm_cuda_graphs=False)
    model = LAS(config, input_dim=6, vocab_size=10)
    for part, layer_norm in ((model.listener, False), (model.speller, True)):
        cells = [m for m in part.modules() if isinstance(m, LNLSTMCell)]
        assert cells
        for cell in cells:
            assert cell.spec == CellSpec("raw_gates", layer_norm, 1e-4, 0.5)
            assert (cell.backend, cell.check) == ("reference", "off")
    stacks = [m for m in model.modules() if isinstance(m, LNLSTM)]
    assert len(stacks) == 3 and not any(stack.cuda_graphs for stack in stacks)
    assert config.lnlstm_options() == LNLSTMOptions(variant="raw_gates", eps=1e-4, forget_bias=0.5,
                                                    backend="reference", check="off", cuda_graphs=False)


def test_ctc_head_exists_only_with_a_positive_weight_and_losses_combine():
    features, feature_lengths, tokens, token_lengths = random_batch()
    without = LAS(small_config(ctc_weight=0.0), input_dim=6, vocab_size=10)
    assert without.ctc is None
    out = without(features, feature_lengths, tokens, token_lengths)
    assert out.ctc_loss is None and out.loss is out.attention_loss
    assert without.encode(features, feature_lengths).ctc_log_probs is None

    torch.manual_seed(0)
    model = LAS(small_config(ctc_weight=0.3, label_smoothing=0.1), input_dim=6, vocab_size=10)
    assert model.ctc is not None
    out = model(features, feature_lengths, tokens, token_lengths)
    assert out.num_tokens == int(token_lengths.sum()) + 3  # each utterance's <eos> counts
    torch.testing.assert_close(out.loss, 0.7 * out.attention_loss + 0.3 * out.ctc_loss)

    # Recompute both terms independently from the model's parts.
    encoder = model.encode(features, feature_lengths)
    assert encoder.ctc_log_probs.shape == (3, encoder.out.size(1), 10)
    decoder_input, target = add_sos_eos(tokens, token_lengths, SOS, EOS, PAD)
    log_probs, weights = model.speller(decoder_input, encoder.out, encoder.mask)
    attention = F.cross_entropy(
        log_probs.transpose(1, 2), target, ignore_index=PAD, label_smoothing=0.1, reduction="sum"
    ) / out.num_tokens
    ctc = F.ctc_loss(
        encoder.ctc_log_probs.transpose(0, 1), tokens, encoder.lengths, token_lengths, blank=PAD, reduction="sum"
    ) / out.num_tokens
    torch.testing.assert_close(out.attention_loss, attention)
    torch.testing.assert_close(out.ctc_loss, ctc)
    assert out.attention_weights.shape == (3, 6, encoder.out.size(1))
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("attention", ["location", "content", "dot", "mocha"])
def test_decode_step_with_teacher_tokens_equals_the_teacher_forced_pass(attention):
    config = small_config(ctc_weight=0.3)
    # read as the class of its type (MoChA's keys are MochaConfig's)
    heads = 2 if attention == "content" else 1
    # (the filters are location's keys, refused for another type at values other than their defaults)
    own = to_dict(config.attention) if attention == "location" else {"dim": config.attention.dim}
    config.attention = from_dict(AttentionConfig, {**own, "type": attention, "heads": heads})
    torch.manual_seed(0)
    model = LAS(config, input_dim=6, vocab_size=10).eval()
    features, feature_lengths, tokens, token_lengths = random_batch()
    with torch.no_grad():
        encoder = model.encode(features, feature_lengths)
        decoder_input, _ = add_sos_eos(tokens, token_lengths, SOS, EOS, PAD)
        teacher, _ = model.speller(decoder_input, encoder.out, encoder.mask)
        # Through the search interface, with the batch reversed by reorder_decoder_state.
        order = torch.tensor([2, 1, 0])
        state = model.reorder_decoder_state(model.init_decoder_state(encoder), order)
        for i in range(decoder_input.size(1)):
            log_probs, state = model.decode_step(decoder_input[order, i], state, encoder.index_select(order))
            torch.testing.assert_close(log_probs, teacher[order, i], atol=1e-5, rtol=0)


def test_impossible_ctc_alignment_gives_zero_not_inf():
    model = LAS(small_config(ctc_weight=0.5), input_dim=6, vocab_size=10)
    features = torch.randn(1, 8, 6)  # 8 frames -> 2 encoder frames, 5 labels cannot align
    out = model(features, torch.tensor([8]), torch.randint(3, 10, (1, 5)), torch.tensor([5]))
    assert out.ctc_loss.item() == 0.0
    assert torch.isfinite(out.loss)


def test_short_input_is_handled_and_empty_input_is_a_clear_error():
    model = LAS(small_config(), input_dim=6, vocab_size=10).eval()
    features = torch.randn(2, 3, 6)  # both shorter than the 4x reduction
    out = model(features, torch.tensor([3, 1]), torch.tensor([[4, 5], [6, 0]]), torch.tensor([2, 1]))
    assert torch.isfinite(out.loss)
    encoder = model.encode(features, torch.tensor([3, 1]))
    assert encoder.lengths.tolist() == [1, 1]
    with pytest.raises(ValueError, match="length 0"):
        model.encode(features, torch.tensor([3, 0]))


def test_config_from_yaml_dict_and_errors_name_the_key():
    data = {
        "type": "las",
        "layer_norm": "speller",
        "ctc_weight": 0.3,
        "listener": {"hidden_size": 16, "pyramidal": False, "frame_stacking": 3, "num_layers": 2},
        "attention": {"type": "dot", "heads": 2},
        "speller": {"sampling_probability": 0.1},
    }
    config = from_dict(LASConfig, data, "model")
    assert config.listener.reduction == 3 and config.attention.heads == 2
    assert from_dict(LASConfig, to_dict(config), "model") == config
    with pytest.raises(ConfigError, match="model.layer_norm"):
        from_dict(LASConfig, {"layer_norm": "pre"}, "model")
    with pytest.raises(ConfigError, match="model.speller.hiden_size"):
        from_dict(LASConfig, {"speller": {"hiden_size": 3}}, "model")
    with pytest.raises(ConfigError, match=r"ctc_weight must be in \[0, 1\]"):
        from_dict(LASConfig, {"ctc_weight": 1.5}, "model")
    with pytest.raises(ValueError, match="must differ"):
        LAS(LASConfig(), input_dim=4, vocab_size=10, pad_id=0, sos_id=1, eos_id=1)


def load_utterances(root, count: int) -> list[tuple[torch.Tensor, str]]:
    """`count` short connected-digit utterances (2-3 digits) spread over the
    speakers, as normalised 40-bin fbank features and transcripts."""
    chosen = []
    for trans in sorted(root.glob("*/*/*.trans.txt")):
        for line in trans.read_text().splitlines():
            uid, text = line.split(" ", 1)
            if len(text.split()) in (2, 3):
                chosen.append((trans.parent / f"{uid}.flac", text))
    chosen = chosen[:: max(1, len(chosen) // count)][:count]
    utterances = []
    for path, text in chosen:
        audio, rate = soundfile.read(path, dtype="float32")
        fbank = torchaudio.compliance.kaldi.fbank(
            torch.from_numpy(audio).unsqueeze(0) * 32768, num_mel_bins=40, sample_frequency=rate, dither=0.0
        )
        fbank = (fbank - fbank.mean(0)) / fbank.std(0).clamp(min=1e-5)
        utterances.append((fbank, text))
    return utterances


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["location", "mocha"])
def test_small_las_learns_real_connected_digits(fsdd_dev, attention):
    utterances = load_utterances(fsdd_dev, 6)
    chars = sorted(set("".join(text for _, text in utterances)))
    ids = {c: i + 4 for i, c in enumerate(chars)}  # 0-3 are pad/sos/eos/unk
    features = pad_sequence([f for f, _ in utterances], batch_first=True)
    feature_lengths = torch.tensor([len(f) for f, _ in utterances])
    targets = [[ids[c] for c in text] for _, text in utterances]
    tokens = pad_sequence([torch.tensor(t) for t in targets], batch_first=True, padding_value=PAD)
    token_lengths = torch.tensor([len(t) for t in targets])

    torch.manual_seed(0)
    config = LASConfig(
        listener=ListenerConfig(hidden_size=32, num_layers=3, pyramid_layers=2, frame_stacking=2),  # 8x
        # MoChA with a stop bias of +4 (p = 0.98): with the paper's -4 (p = 0.02) the scan expects
        # to pass 50 frames before it stops, more than these utterances have after the 8x
        # reduction, so the stop mass runs off the end and the speller learns without its audio.
        attention=(MochaConfig(dim=32, monotonic_bias=4.0) if attention == "mocha"
                   else AttentionConfig(type=attention, dim=32,  # the filters: location's keys
                                        **({"conv_channels": 4, "conv_kernel": 5} if attention == "location" else {}))),
        speller=SpellerConfig(embedding_dim=16, hidden_size=64, num_layers=1),
        ctc_weight=0.3,
    )
    model = LAS(config, input_dim=40, vocab_size=4 + len(chars))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first_loss = errors = None
    for step in range(200):
        model.train()
        out = model(features, feature_lengths, tokens, token_lengths)
        optimizer.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        first_loss = first_loss if first_loss is not None else out.loss.item()
        if step >= 30 and step % 5 == 4:
            model.eval()
            hyps = greedy_search(model, model.encode(features, feature_lengths), DecodingOptions(max_len_ratio=2.0))
            errors = sum(h != t for h, t in zip(hyps, targets))
            if errors == 0:
                break
    assert errors == 0, f"{errors} of {len(targets)} utterances still wrong after {step + 1} steps"
    assert out.loss.item() < 0.5 * first_loss
    # The trained model decodes the same with beam search (with and without CTC).
    encoder = model.encode(features, feature_lengths)
    assert beam_search(model, encoder, DecodingOptions(beam_size=3, max_len_ratio=2.0)) == targets
    assert beam_search(model, encoder, DecodingOptions(beam_size=3, max_len_ratio=2.0, ctc_weight=0.3)) == targets

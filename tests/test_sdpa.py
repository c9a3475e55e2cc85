"""model.sdpa_backend (asr/models/sdpa.py): the rule that resolves it, that the Transformer's and Conformer's
attention runs under the backends it names, that every backend the CPU has gives the same outputs and
gradients, and that the run records it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import TRANSFORMER_RECIPE, make_transformer, teacher_forced, transformer_batch

from asr.cli.train import main
from asr.config import ConfigError
from asr.models import runtime, sdpa


def test_auto_leaves_cudnn_out_on_cuda_unless_the_shapes_are_few_and_pins_nothing_elsewhere():
    assert sdpa.allowed_backends("auto", "cpu") is None
    assert sdpa.allowed_backends("auto", "cpu", batch_shapes=1000) is None
    many = sdpa.allowed_backends("auto", "cuda", batch_shapes=sdpa.FEW_SHAPES + 1)
    assert "cudnn" not in many and set(many) == {"flash", "efficient", "math"}
    assert sdpa.allowed_backends("auto", "cuda") == many  # not known: taken as many
    assert sdpa.allowed_backends("auto", "cuda", batch_shapes=sdpa.FEW_SHAPES) is None
    for name in ("flash", "efficient", "math", "cudnn"):
        assert sdpa.allowed_backends(name, "cuda") == (name,)
    assert sdpa.allowed_backends("math", "cpu") == ("math",)


@pytest.mark.parametrize("name", ["efficient", "cudnn", "fast"])
def test_a_backend_the_device_lacks_is_a_config_error_naming_the_key(name):
    with pytest.raises(ConfigError, match="model.sdpa_backend"):
        sdpa.allowed_backends(name, "cpu")


def test_a_wrong_value_in_a_recipe_is_one_line_and_exit_status_2(tmp_path, capsys):
    assert main([str(TRANSFORMER_RECIPE), "model.sdpa_backend=fast", f"exp_dir={tmp_path / 'exp'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.sdpa_backend" in err and "'fast'" in err and len(err.splitlines()) == 1 and "Traceback" not in err


def enabled() -> tuple[bool, bool]:
    return torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()


@pytest.mark.parametrize("name,expected", [("auto", (True, True)), ("flash", (True, False)), ("math", (False, True))])
def test_the_models_attention_runs_under_the_backends_the_key_names(monkeypatch, name, expected):
    """Every SDPA call of a forward pass and of a decoding step sees only the named backends enabled; the flags
    are as they were after it."""
    seen = []
    original = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = make_transformer(sdpa_backend=name, dropout=0.0).eval()
    before = enabled()
    features, lengths, tokens, token_lengths = transformer_batch([40, 31], [5, 3])
    with torch.no_grad():
        model(features, lengths, tokens, token_lengths)
        encoder = model.encode(features, lengths)
        model.decode_step(torch.ones(2, dtype=torch.long), model.init_decoder_state(encoder), encoder)
    assert len(seen) >= 3 * 2 + 2  # encoder and decoder layers in the forward, the encoder, a decoding step
    assert set(seen) == {expected}
    assert enabled() == before


def conformer(name: str):
    """On CPU tensors the Conformer's relative self-attention is its own autograd node, so SDPA serves its
    decoder; through SDPA (``cpu_node`` False, as on CUDA) the position term is a mask with a gradient, which
    the CPU's flash kernel refuses (only math takes it there)."""
    return make_transformer(sdpa_backend=name, dropout=0.0, encoder={"kind": "conformer", "conv_kernel": 5})


@pytest.mark.parametrize("build", [lambda name: make_transformer(sdpa_backend=name, dropout=0.0), conformer],
                         ids=["transformer", "conformer"])
def test_every_backend_the_cpu_has_gives_the_same_outputs_and_gradients(build):
    features, lengths, tokens, token_lengths = transformer_batch([44, 37, 21], [6, 4, 2])
    results = {}
    for name in ("auto", *sdpa.CPU_BACKENDS):
        model = build(name).train()  # seeded alike: the same weights
        output = model(features, lengths, tokens, token_lengths)
        output.loss.backward()
        with torch.no_grad():
            encoder, log_probs = teacher_forced(model.eval(), features, lengths, tokens, token_lengths)
        results[name] = (output.loss.detach(), encoder.out, log_probs,
                         {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    reference = results["math"]
    for name, (loss, out, log_probs, grads) in results.items():
        torch.testing.assert_close(loss, reference[0], rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(out, reference[1], rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(log_probs, reference[2], rtol=1e-4, atol=1e-5, msg=name)
        for key, grad in grads.items():
            torch.testing.assert_close(grad, reference[3][key], rtol=1e-4, atol=1e-5, msg=f"{name}: {key}")


def test_the_run_records_what_was_asked_and_what_was_allowed():
    model = make_transformer(sdpa_backend="math")
    model.batch_shapes = 32
    record = runtime.describe(model, "cpu")["sdpa_backend"]
    assert record == {"requested": "math", "batch_shapes": 32, "allowed": ["math"]}
    assert "SDPA math: math" in runtime.summary(runtime.describe(model, "cpu"), "config.yaml")
    assert runtime.describe(make_transformer(), "cpu")["sdpa_backend"]["allowed"] == "pytorch's choice"

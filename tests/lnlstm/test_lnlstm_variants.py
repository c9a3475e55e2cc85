"""The three LN-LSTM cells of ``model.lnlstm_variant`` (asr/models/lnlstm_variants.py) against a
direct transcription of their equations, written here independently of the module: forward
outputs and every gradient, in float64 with every parameter moved away from its initial value.
Also: which path runs each variant, the LAS switch, and what zero-variance inputs do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from asr.models import lnlstm
from asr.models.lnlstm.backends import cpp as lnlstm_ext
from asr.models.lnlstm.backends import triton as lnlstm_triton
from asr.models.las import LAS, LASConfig
from asr.models.lnlstm import LNLSTM, LNLSTMCell
from asr.models.lnlstm.variants import VARIANTS

FORGET_BIAS = 0.7


def normalise(v: torch.Tensor, eps: float) -> torch.Tensor:
    """(v - mean) / sqrt(biased variance + eps) over the last dimension, written out."""
    mean = v.sum(-1, keepdim=True) / v.size(-1)
    variance = ((v - mean) ** 2).sum(-1, keepdim=True) / v.size(-1)
    return (v - mean) / torch.sqrt(variance + eps)


def ba2016_step(cell, x, h, c):
    """Ba et al. (2016): LN over the whole 4H of W_x x and of W_h h (gain, bias), LN_c for the output only."""
    gx = normalise(x @ cell.weight_x.T, 1e-5) * cell.ln_x.weight + cell.ln_x.bias
    gh = normalise(h @ cell.weight_h.T, 1e-5) * cell.ln_h.weight + cell.ln_h.bias
    i, j, f, o = (gx + gh + cell.bias).split(cell.hidden_size, -1)
    c = c * torch.sigmoid(f + FORGET_BIAS) + torch.sigmoid(i) * torch.tanh(j)
    h = torch.tanh(normalise(c, 1e-5) * cell.ln_c.weight + cell.ln_c.bias) * torch.sigmoid(o)
    return h, c


def tf_contrib_step(cell, x, h, c):
    """TensorFlow's LayerNormBasicLSTMCell: one kernel over [x; h] without bias, LN per gate
    (eps 1e-12), forget bias after the forget gate's LN, the normalised new cell carried."""
    kernel = torch.cat([cell.weight_x, cell.weight_h], dim=1)  # TF's kernel, transposed
    projected = torch.cat([x, h], dim=1) @ kernel.T
    gates = []
    for k, block in enumerate(projected.split(cell.hidden_size, -1)):  # i, j, f, o
        norm = cell.ln_gates[k]
        gates.append(normalise(block, 1e-12) * norm.weight + norm.bias)
    i, j, f, o = gates
    new_c = c * torch.sigmoid(f + FORGET_BIAS) + torch.sigmoid(i) * torch.tanh(j)
    new_c = normalise(new_c, 1e-12) * cell.ln_c.weight + cell.ln_c.bias
    return torch.tanh(new_c) * torch.sigmoid(o), new_c


def raw_gates_step(cell, x, h, c):
    """The study's hand-written cell: LN without gain or bias (eps 1e-3) on W_x x and on W_h h,
    LN_c with gain and bias (eps 1e-5) for the output; the un-normalised cell carried."""
    gates = normalise(x @ cell.weight_x.T, 1e-3) + normalise(h @ cell.weight_h.T, 1e-3) + cell.bias
    i, j, f, o = gates.split(cell.hidden_size, -1)
    c = c * torch.sigmoid(f + FORGET_BIAS) + torch.sigmoid(i) * torch.tanh(j)
    h = torch.tanh(normalise(c, 1e-5) * cell.ln_c.weight + cell.ln_c.bias) * torch.sigmoid(o)
    return h, c


TRANSCRIPTIONS = {"ba2016": ba2016_step, "tf_contrib": tf_contrib_step, "raw_gates": raw_gates_step}


def perturb(module: nn.Module, std: float = 0.3) -> None:
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * std)


def transcribed_sequence(cell, x, h, c):
    outputs = []
    for t in range(x.size(1)):
        h, c = TRANSCRIPTIONS[cell.variant](cell, x[:, t], h, c)
        outputs.append(h)
    return torch.stack(outputs, 1), h, c


def outputs_and_grads(run, model, x, h0, c0):
    """run(x, h0, c0) -> (y, h_n, c_n); a random linear loss of all three, and the gradients of
    x, h0, c0 and every parameter of ``model``."""
    inputs = [t.detach().clone().requires_grad_() for t in (x, h0, c0)]
    model.zero_grad(set_to_none=True)
    outputs = run(*inputs)
    generator = torch.Generator().manual_seed(5)
    loss = sum((t * torch.randn(t.shape, generator=generator, dtype=t.dtype)).sum() for t in outputs)
    loss.backward()
    results = dict(zip(("y", "h_n", "c_n"), outputs))
    results.update(zip(("grad x", "grad h0", "grad c0"), (t.grad for t in inputs)))
    results.update({f"grad {name}": p.grad for name, p in model.named_parameters()})
    return results


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_computes_its_equations_forward_and_backward(variant):
    torch.manual_seed(1)
    model = LNLSTM(3, 5, forget_bias=FORGET_BIAS, variant=variant).double()
    perturb(model)
    cell = model.cells[0]
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    h0, c0 = torch.randn(2, 4, 5, dtype=torch.float64).unbind(0)

    def ours(x, h0, c0):
        y, (h_n, c_n) = model(x, state=(h0.unsqueeze(0), c0.unsqueeze(0)))
        return y, h_n[0], c_n[0]

    actual = outputs_and_grads(ours, model, x, h0, c0)
    expected = outputs_and_grads(lambda *a: transcribed_sequence(cell, *a), model, x, h0, c0)
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert value is not None, name
        torch.testing.assert_close(actual[name], value, rtol=1e-9, atol=1e-9, msg=lambda m: f"{variant} {name}: {m}")


def test_the_variants_differ_in_their_parameters_and_epsilons():
    cells = {v: LNLSTMCell(3, 5, variant=v) for v in VARIANTS}
    names = {v: sorted(n for n, _ in cell.named_parameters()) for v, cell in cells.items()}
    assert names["ba2016"] == sorted(
        ["weight_x", "weight_h", "bias"] + [f"{ln}.{p}" for ln in ("ln_x", "ln_h", "ln_c") for p in ("weight", "bias")]
    )
    # TensorFlow: no projection bias when LN is on; a gain and shift per gate and for the cell.
    assert cells["tf_contrib"].bias is None
    assert names["tf_contrib"] == sorted(
        ["weight_x", "weight_h"] + [f"{ln}.{p}" for ln in ("ln_gates.0", "ln_gates.1", "ln_gates.2", "ln_gates.3", "ln_c")
                                    for p in ("weight", "bias")]
    )
    assert all(norm.eps == 1e-12 for norm in [*cells["tf_contrib"].ln_gates, cells["tf_contrib"].ln_c])
    # raw_gates: the gate norms have nothing to learn.
    assert names["raw_gates"] == sorted(["weight_x", "weight_h", "bias", "ln_c.weight", "ln_c.bias"])
    assert (cells["raw_gates"].ln_x.eps, cells["raw_gates"].ln_c.eps) == (1e-3, 1e-5)
    # Without layer_norm every variant is the same plain LSTM.
    plain = [sorted(n for n, _ in LNLSTMCell(3, 5, layer_norm=False, variant=v).named_parameters()) for v in VARIANTS]
    assert plain == [["bias", "weight_h", "weight_x"]] * 3
    with pytest.raises(ValueError, match="lnlstm_variant must be one of"):
        LNLSTMCell(3, 5, variant="tf")


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_and_the_stepped_cell_agree_with_the_sequence(variant):
    torch.manual_seed(2)
    model = LNLSTM(3, 4, bidirectional=True, variant=variant)
    perturb(model)
    x = torch.randn(2, 7, 3)
    y, _ = model(x, torch.tensor([7, 4]))
    alone, _ = model(x[1:, :4])
    torch.testing.assert_close(y[1, :4], alone[0])
    assert torch.equal(y[1, 4:], torch.zeros_like(y[1, 4:]))
    forward = LNLSTM(3, 4, variant=variant)
    perturb(forward)
    y, (h_n, c_n) = forward(x)
    state = None
    for t in range(7):
        state = forward.cells[0](x[:, t], state)
        torch.testing.assert_close(state[0], y[:, t])
    torch.testing.assert_close(state[1], c_n[0])


# The fused backends that compute each variant, written out here: the C++ operator computes ba2016
# and tf_contrib, the Triton kernels ba2016 only; raw_gates runs the reference path everywhere.
FUSED_BACKENDS = {"ba2016": {"cpp", "triton"}, "tf_contrib": {"cpp"}, "raw_gates": set()}


@pytest.mark.parametrize("implementation", ["cpp", "triton"])
def test_each_variant_reaches_only_the_fused_backends_that_compute_it(monkeypatch, implementation):
    """Whatever the implementation switch says, a variant the named backend does not compute runs the
    reference path; one it computes goes to the fused path (here a stand-in that raises, so no kernel
    is built). Only Triton takes the single step of a cell."""

    class Fused(Exception):
        pass

    def fused(*args, **kwargs):
        raise Fused

    monkeypatch.setattr(lnlstm_ext, "load", lambda strict, build=None: object())
    monkeypatch.setattr(lnlstm_triton, "usable", lambda device, strict=False: True)
    for name in ("fused_layer",):
        monkeypatch.setattr(lnlstm_ext, name, fused)
    monkeypatch.setattr(lnlstm_triton, "fused_layer", fused)
    monkeypatch.setattr(lnlstm_triton, "cell_step", fused)
    x = torch.randn(2, 5, 3)
    for variant in VARIANTS:
        torch.manual_seed(3)
        model = LNLSTM(3, 4, variant=variant, check="off")  # routing, not the self-check (its own tests)
        monkeypatch.setattr(lnlstm.selection, "_programmatic", "reference")
        expected = model(x)[0]
        monkeypatch.setattr(lnlstm.selection, "_programmatic", implementation)
        assert model.cells[0].spec.fused_by(implementation) == (implementation in FUSED_BACKENDS[variant])
        if implementation in FUSED_BACKENDS[variant]:
            assert model.select_backend(x) == implementation
            with pytest.raises(Fused):
                model(x)
            if implementation == "triton":
                with pytest.raises(Fused):
                    model.cells[0](x[:, 0])
            else:
                model.cells[0](x[:, 0])  # the C++ operator computes whole layers: a step is the reference's
        else:
            assert model.select_backend(x) == "reference"
            assert torch.equal(model(x)[0], expected)
            model.cells[0](x[:, 0])
        assert model.cells[0].fusable == bool(FUSED_BACKENDS[variant])


@pytest.mark.parametrize("variant", VARIANTS)
def test_las_passes_the_variant_to_every_ln_lstm(variant):
    config = LASConfig(lnlstm_variant=variant, layer_norm="both")
    config.listener.hidden_size, config.listener.num_layers, config.listener.pyramid_layers = 8, 2, 1
    config.speller.hidden_size, config.speller.embedding_dim, config.attention.dim = 8, 4, 8
    config.speller.num_layers = 1
    model = LAS(config, input_dim=5, vocab_size=7)
    cells = [m for m in model.modules() if isinstance(m, LNLSTMCell)]
    assert len(cells) == 2 * 2 + 1 and {c.variant for c in cells} == {variant}
    assert all(c.layer_norm for c in cells)
    loss = model(torch.randn(2, 9, 5), torch.tensor([9, 6]), torch.tensor([[3, 4], [5, 0]]), torch.tensor([2, 1])).loss
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("variant", VARIANTS)
def test_leading_zero_rows_make_only_tf_contrib_gradients_non_finite(variant):
    """Blank rows first (as in row-by-row MNIST) with the zero initial state: tf_contrib has no
    gate bias, so x = h = c = 0 is a fixed point at which every one of its norms sees zero
    variance; each such step multiplies the gradient by about 1/sqrt(1e-12) twice (gate norm,
    carried cell norm), and float32 overflows within 4 rows. ba2016 and raw_gates leave the
    fixed point at the first step (through b) and stay finite; so does tf_contrib when the first
    rows are not blank. docs/normalization.md, section 2.4, has the numbers."""
    torch.manual_seed(0)
    model = LNLSTM(8, 16, variant=variant)
    for blank in (0, 6):
        x = torch.randn(4, 12, 8)
        x[:, :blank] = 0.0
        model.zero_grad(set_to_none=True)
        y, _ = model(x)
        y[:, -1].pow(2).sum().backward()
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters())
        largest = max(p.grad.abs().max().item() for p in model.parameters())
        if variant == "tf_contrib" and blank:
            assert torch.equal(y[:, :blank], torch.zeros_like(y[:, :blank]))  # stuck at the fixed point
            assert not finite
        else:
            assert finite and largest < 1e3, (blank, largest)

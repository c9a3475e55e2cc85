"""ScaleNorm, FixNorm and the norm factory (asr/models/norms.py)."""

import math

import pytest
import torch
from torch import nn

from asr.models.norms import FixNorm, ScaleNorm, make_norm


def test_scalenorm_projects_onto_sphere_of_learned_radius():
    torch.manual_seed(0)
    norm = ScaleNorm(16)
    # Starts at sqrt(d): the length of a vector whose coordinates have unit variance.
    assert norm.scale.item() == pytest.approx(math.sqrt(16))
    x = torch.randn(3, 5, 16) * torch.rand(3, 5, 1) * 10
    y = norm(x)
    torch.testing.assert_close(y.norm(dim=-1), torch.full((3, 5), math.sqrt(16)))
    # Direction kept: y is a positive multiple of x.
    torch.testing.assert_close(torch.nn.functional.cosine_similarity(x, y, dim=-1), torch.ones(3, 5))
    with torch.no_grad():
        norm.scale.fill_(2.5)
    torch.testing.assert_close(norm(x).norm(dim=-1), torch.full((3, 5), 2.5))


def test_scalenorm_has_one_parameter_and_it_learns():
    norm = ScaleNorm(8)
    assert [p.numel() for p in norm.parameters()] == [1]
    x = torch.randn(4, 8)
    norm(x).sum().backward()
    assert norm.scale.grad is not None and norm.scale.grad.abs() > 0


def test_scalenorm_zero_vector_gives_zero_not_nan():
    y = ScaleNorm(8)(torch.zeros(2, 8))
    assert torch.equal(y, torch.zeros(2, 8))


def test_scalenorm_differs_from_layernorm_by_not_centring():
    # LayerNorm removes the mean; ScaleNorm keeps a constant offset direction.
    x = torch.ones(1, 8) * 3.0
    assert torch.allclose(nn.LayerNorm(8)(x), torch.zeros(1, 8))
    torch.testing.assert_close(ScaleNorm(8)(x), torch.ones(1, 8))


def test_fixnorm_gives_rows_of_fixed_length_and_no_parameters():
    weight = torch.randn(10, 6) * torch.arange(1, 11).unsqueeze(1)
    torch.testing.assert_close(FixNorm()(weight).norm(dim=-1), torch.ones(10))
    torch.testing.assert_close(FixNorm(radius=3.0)(weight).norm(dim=-1), torch.full((10,), 3.0))
    assert list(FixNorm().parameters()) == []
    assert torch.equal(FixNorm()(torch.zeros(2, 6)), torch.zeros(2, 6))


def test_make_norm_builds_the_named_norm():
    layer_norm = make_norm("layernorm", 12, eps=1e-6)
    assert isinstance(layer_norm, nn.LayerNorm) and layer_norm.eps == 1e-6 and layer_norm.normalized_shape == (12,)
    scale_norm = make_norm("scalenorm", 12, eps=1e-6)
    assert isinstance(scale_norm, ScaleNorm) and scale_norm.eps == 1e-6
    rms_norm = make_norm("rmsnorm", 12, eps=1e-6)
    assert isinstance(rms_norm, nn.RMSNorm) and rms_norm.eps == 1e-6
    x = torch.randn(3, 12)
    with torch.no_grad():
        rms_norm.weight.normal_()
    # RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * g, no centring, no bias
    torch.testing.assert_close(rms_norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * rms_norm.weight)
    with pytest.raises(ValueError, match="norm_type.*'batchnorm'"):
        make_norm("batchnorm", 12)


def test_both_sublayer_norms_ignore_the_input_scale_and_only_layernorm_ignores_a_common_offset():
    """What a norm removes decides what feature MVN still has to do (docs/normalization.md)."""
    torch.manual_seed(0)
    x = torch.randn(5, 24)
    for norm_type in ("layernorm", "scalenorm"):
        norm = make_norm(norm_type, 24)
        torch.testing.assert_close(norm(37.0 * x), norm(x), atol=1e-5, rtol=1e-5)
    layer_norm, scale_norm = make_norm("layernorm", 24), make_norm("scalenorm", 24)
    torch.testing.assert_close(layer_norm(x + 12.0), layer_norm(x), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(scale_norm(x + 12.0), scale_norm(x), atol=1e-2)
    # A per-dimension offset (what MVN's mean removes) survives either norm.
    offset = torch.linspace(-10.0, 10.0, 24)
    assert not torch.allclose(layer_norm(x + offset), layer_norm(x), atol=1e-2)
    assert not torch.allclose(scale_norm(x + offset), scale_norm(x), atol=1e-2)

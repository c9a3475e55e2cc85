"""model.lnlstm_recurrent_gain: the initial gain of ba2016's recurrent norm LN_h (issue 78's why)."""

import pytest
import torch

from asr.config import ConfigError, from_dict
from asr.models.las import LAS, LASConfig
from asr.models.lnlstm import LNLSTMCell

from helpers import small_las_config as small_config


def cells(model):
    return [m for m in model.modules() if isinstance(m, LNLSTMCell)]


@pytest.mark.parametrize("place", ["both", "listener", "speller"])
def test_only_the_recurrent_norms_gains_start_elsewhere(place):
    """Every LN_h gain of the layer-normalised cells starts at the value; every other tensor is what the same
    seed gives without it (the gain is set after the random initialisation, drawing nothing)."""
    torch.manual_seed(0)
    plain = LAS(small_config(layer_norm=place), input_dim=6, vocab_size=10)
    torch.manual_seed(0)
    gained = LAS(small_config(layer_norm=place, lnlstm_recurrent_gain=0.2), input_dim=6, vocab_size=10)
    before, after = plain.state_dict(), gained.state_dict()
    assert before.keys() == after.keys()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    normalised = [cell for cell in cells(gained) if cell.layer_norm]
    assert normalised and changed == {name for name in after if name.endswith("ln_h.weight")}
    assert len(changed) == len(normalised)
    for cell in normalised:
        assert torch.equal(cell.ln_h.weight, torch.full_like(cell.ln_h.weight, 0.2))


@pytest.mark.parametrize("bad", [dict(lnlstm_recurrent_gain=0.0), dict(lnlstm_variant="tf_contrib", lnlstm_recurrent_gain=0.2),
                                 dict(lnlstm_variant="raw_gates", lnlstm_recurrent_gain=0.2)])
def test_a_gain_the_cell_cannot_take_is_refused_by_its_key(bad):
    with pytest.raises((ValueError, ConfigError), match="lnlstm_recurrent_gain"):
        from_dict(LASConfig, {"type": "las", **bad})

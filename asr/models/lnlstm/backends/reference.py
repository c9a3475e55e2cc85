"""The reference path (:mod:`asr.models.lnlstm.reference`) behind the backend contract."""

from __future__ import annotations

import torch

from asr.models.lnlstm.backends.base import Backend
from asr.models.lnlstm.reference import reference_layer


class ReferenceBackend(Backend):
    name = "reference"
    auto_devices: tuple[str, ...] = ()  # it is the fallback, never a candidate of "auto"

    def supports(self, spec, device, dtype, param_dtype, single_step) -> bool:
        return True

    def available(self, device: torch.device, strict: bool = False) -> bool:
        return True

    def layer(self, params, x, lengths, h0, c0, cuda_graphs: bool):
        return reference_layer(params.cells, x, lengths, h0, c0)

    def cell_step(self, cell, x, h, c):
        return cell.recurrent_step(cell.input_gates(x), h, c)


BACKEND = ReferenceBackend()

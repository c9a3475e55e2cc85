"""One layer's parameters, gathered once per call for the fused backends."""

from __future__ import annotations

from functools import cached_property

import torch


def stack_directions(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Per-direction tensors -> one (D, ...) tensor (a view for one direction)."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)


class LayerParameters:
    """The cells of one layer (forward, then backward direction) and their tensors stacked over
    directions, each gathered on first use and kept for the call: ``weight_x`` (D, 4H, I),
    ``weight_h`` (D, 4H, H), ``bias`` (D, 4H), and with layer norm ``ln_x``, ``ln_h`` (gain,
    bias) each (D, 4H) and ``ln_c`` (gain, bias) each (D, H); a ``tf_contrib`` layer has
    ``ln_gates`` (gain, shift) each (D, 4H), its four per-gate norms' in gate order, instead of
    ``bias``, ``ln_x`` and ``ln_h``.

    A backend reads parameters here and nowhere else, so a renamed parameter changes this
    class only. Stacking is autograd-tracked: gradients reach each cell's parameters.
    """

    def __init__(self, cells) -> None:
        self.cells = list(cells)
        self.spec = self.cells[0].spec
        self.directions = len(self.cells)
        self.hidden_size = self.cells[0].hidden_size

    def _stack(self, name: str) -> torch.Tensor:
        return stack_directions([getattr(cell, name) for cell in self.cells])

    def _norm(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        norms = [getattr(cell, name) for cell in self.cells]
        return stack_directions([n.weight for n in norms]), stack_directions([n.bias for n in norms])

    @cached_property
    def weight_x(self) -> torch.Tensor:
        return self._stack("weight_x")

    @cached_property
    def weight_h(self) -> torch.Tensor:
        return self._stack("weight_h")

    @cached_property
    def bias(self) -> torch.Tensor:
        return self._stack("bias")

    @cached_property
    def ln_x(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._norm("ln_x")

    @cached_property
    def ln_h(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._norm("ln_h")

    @cached_property
    def ln_gates(self) -> tuple[torch.Tensor, torch.Tensor]:
        gains = [torch.cat([norm.weight for norm in cell.ln_gates]) for cell in self.cells]
        shifts = [torch.cat([norm.bias for norm in cell.ln_gates]) for cell in self.cells]
        return stack_directions(gains), stack_directions(shifts)

    @cached_property
    def ln_c(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._norm("ln_c")

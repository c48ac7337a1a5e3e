# Tangled from book/chapters/ch02_layers.ipynb — edit the notebook, not this file.
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up]: [..., 2I] -> silu(gate) * up: [..., I]。"""
    gate, up = x.chunk(2, dim=-1)  # [..., I] ×2
    return F.silu(gate) * up

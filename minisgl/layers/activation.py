# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import fused_kernels


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up]: [..., 2I] -> silu(gate) * up: [..., I]。GPU 上 bf16/fp16 时是一个融合 kernel。"""
    fi = fused_kernels(x)
    if fi is not None:
        return fi.activation.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)  # [..., I] ×2
    return F.silu(gate) * up

# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from __future__ import annotations

import torch

from minisgl.core import get_global_ctx

from .base import StateLessOP
from .rotary import RotaryEmbedding


class AttentionLayer(StateLessOP):
    """RoPE + 交给 Context 里的注意力后端。q: [T, H, D]，k/v: [T, Hkv, D] → [T, H·D]。"""

    def __init__(self, layer_id: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 rotary: RotaryEmbedding) -> None:
        self.layer_id = layer_id
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self._rotary = rotary

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k = self._rotary.forward(positions, q, k)
        ctx = get_global_ctx()
        o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)  # [T, H, D]
        return o.reshape(-1, self.num_qo_heads * self.head_dim)

# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.kernel import qk_norm_rope_store, qk_norm_rope_store_supported

from .base import StateLessOP, fused_kernels
from .norm import RMSNorm
from .rotary import RotaryEmbedding


class AttentionLayer(StateLessOP):
    """（q/k norm +）RoPE + 交给 Context 里的注意力后端。q: [T, H, D]，k/v: [T, Hkv, D] → [T, H·D]。

    GPU 上 bf16/fp16 时 q/k norm、RoPE 和写 KV 是一个 Triton kernel，后端只算注意力。
    """

    def __init__(self, layer_id: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 rotary: RotaryEmbedding) -> None:
        self.layer_id = layer_id
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self._rotary = rotary

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None) -> torch.Tensor:
        ctx = get_global_ctx()
        fused = fused_kernels(q) is not None  # CPU、float32：直接走老路，不必去拿池子的视图
        if fused:
            k_cache, v_cache = ctx.kv_cache.k_cache(self.layer_id), ctx.kv_cache.v_cache(self.layer_id)
            fused = qk_norm_rope_store_supported(q, k, v, k_cache, v_cache, self._rotary.rotary_dim)
        if fused:
            norm = q_norm is not None and k_norm is not None
            qk_norm_rope_store(q, k, v, positions, self._rotary.table(q.device),
                               q_norm.weight if norm else None, k_norm.weight if norm else None,
                               q_norm.eps if norm else 0.0, k_cache, v_cache, ctx.batch.out_loc)
            o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch, save_kv=False)  # [T, H, D]
        else:
            if q_norm is not None and k_norm is not None:  # Qwen3：每个头各自归一化
                q, k = q_norm.forward(q), k_norm.forward(k)
            q, k = self._rotary.forward(positions, q, k)
            o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)  # [T, H, D]
        return o.reshape(-1, self.num_qo_heads * self.head_dim)

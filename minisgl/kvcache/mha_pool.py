# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from __future__ import annotations

import torch

from minisgl.kernel import store_cache

from .base import BaseKVCachePool


class MHAKVCache(BaseKVCachePool):
    """多头注意力（MHA/GQA）的分页 KV 池；只存本 rank 的 KV 头。"""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"the KV pool needs num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}")
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        shape = (2, num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self._buffer = torch.zeros(shape, dtype=dtype, device=device)  # [2, L, pages, page_size, Hkv, D]
        self._k = self._buffer[0].view(num_layers, -1, num_kv_heads, head_dim)  # [L, slots, Hkv, D]
        self._v = self._buffer[1].view(num_layers, -1, num_kv_heads, head_dim)  # [L, slots, Hkv, D]

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._k[layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._v[layer_id]

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int) -> None:
        store_cache(self._k[layer_id], self._v[layer_id], out_loc, k, v)

    @property
    def device(self) -> torch.device:
        return self._buffer.device

    @property
    def dtype(self) -> torch.dtype:
        return self._buffer.dtype

    @property
    def nbytes(self) -> int:
        return self._buffer.numel() * self._buffer.element_size()

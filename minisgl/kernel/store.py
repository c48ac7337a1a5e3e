# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from __future__ import annotations

import torch


def store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """k_cache/v_cache：[slots, Hkv, D]（池子的视图），out_loc：[T]，k/v：[T, Hkv, D]。原地写入。"""
    index = out_loc.long()  # index_copy_ 要 int64 下标
    k_cache.index_copy_(0, index, k.to(k_cache.dtype))
    v_cache.index_copy_(0, index, v.to(v_cache.dtype))

# Tangled from book/chapters/ch06_kvcache.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from typing import Callable

import torch

from minisgl.kvcache import BaseKVCachePool
from minisgl.utils import Registry

from .base import BaseAttnBackend, BaseAttnMetadata

AttnFactory = Callable[[BaseKVCachePool, torch.Tensor, int], BaseAttnBackend]
ATTN_BACKENDS: Registry[AttnFactory] = Registry("attention backend")


@ATTN_BACKENDS.register("torch")
def _torch(kv_cache: BaseKVCachePool, page_table: torch.Tensor, num_qo_heads: int) -> BaseAttnBackend:
    from .native import NativeAttnBackend

    return NativeAttnBackend(kv_cache, page_table)


@ATTN_BACKENDS.register("fi")
def _fi(kv_cache: BaseKVCachePool, page_table: torch.Tensor, num_qo_heads: int) -> BaseAttnBackend:
    if kv_cache.device.type != "cuda":
        raise ValueError(f"--attn fi needs a CUDA device, but the KV pool is on {kv_cache.device}; use --attn torch")
    from .fi import FlashInferSplitKVBackend

    return FlashInferSplitKVBackend(kv_cache, page_table, num_qo_heads)


def create_attention_backend(name: str, kv_cache: BaseKVCachePool, page_table: torch.Tensor,
                             num_qo_heads: int) -> BaseAttnBackend:
    """按名字创建注意力后端；num_qo_heads 是本 rank 的 q 头数。不认识的名字报错并列出可选项。"""
    return ATTN_BACKENDS.get(name)(kv_cache, page_table, num_qo_heads)


__all__ = ["ATTN_BACKENDS", "BaseAttnBackend", "BaseAttnMetadata", "create_attention_backend"]

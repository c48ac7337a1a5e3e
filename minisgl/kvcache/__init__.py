# Tangled from book/chapters/ch07_prefix_cache.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import Callable

import torch

from minisgl.utils import Registry

from .base import BaseCacheHandle, BaseKVCachePool, BasePrefixCache, InsertResult, MatchResult, SizeInfo
from .mha_pool import MHAKVCache
from .naive_cache import NaivePrefixCache
from .radix_cache import RadixPrefixCache

PrefixCacheFactory = Callable[[torch.device, int], BasePrefixCache]
PREFIX_CACHES: Registry[PrefixCacheFactory] = Registry("prefix cache")
PREFIX_CACHES.register("naive")(NaivePrefixCache)
PREFIX_CACHES.register("radix")(RadixPrefixCache)


def create_prefix_cache(name: str, device: torch.device, page_size: int = 1) -> BasePrefixCache:
    """按名字创建前缀缓存（naive 或 radix）；不认识的名字报 ValueError 并列出可选项。"""
    return PREFIX_CACHES.get(name)(device, page_size)


__all__ = [
    "BaseCacheHandle", "BaseKVCachePool", "BasePrefixCache", "InsertResult", "MHAKVCache", "MatchResult",
    "NaivePrefixCache", "PREFIX_CACHES", "RadixPrefixCache", "SizeInfo", "create_prefix_cache",
]

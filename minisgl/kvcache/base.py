# Tangled from book/chapters/ch06_kvcache.ipynb and ch07_prefix_cache.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

import torch


class BaseKVCachePool(ABC):
    """每层 K/V 的存储，按槽寻址：槽 s 在第 s // page_size 页的第 s % page_size 个位置。"""

    num_layers: int
    num_pages: int
    page_size: int

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @abstractmethod
    def k_cache(self, layer_id: int) -> torch.Tensor:
        """第 layer_id 层的 K：[num_slots, Hkv, D]，是池子的视图（写它就是写池子）。"""

    @abstractmethod
    def v_cache(self, layer_id: int) -> torch.Tensor:
        """第 layer_id 层的 V：[num_slots, Hkv, D]。"""

    @abstractmethod
    def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int) -> None:
        """k、v：[T, Hkv, D]，out_loc：[T] 槽号；把第 t 行写进第 out_loc[t] 个槽。"""

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...


@dataclass(frozen=True)
class BaseCacheHandle(ABC):
    """缓存里的一个位置：从根走到这里共 cached_len 个 token。锁住它，这段前缀就不会被淘汰。"""

    cached_len: int


class MatchResult(NamedTuple):
    handle: BaseCacheHandle
    indices: torch.Tensor  # [handle.cached_len] int32，缓存的 device 上：这些 token 的 K/V 所在的槽


class InsertResult(NamedTuple):
    cached_len: int  # 插入之前就已经在缓存里的 token 数：调用方这部分槽是重复的
    handle: BaseCacheHandle  # 覆盖本次插入的位置；handle.cached_len 之后的槽缓存没有收下


class SizeInfo(NamedTuple):
    evictable_size: int  # 没被锁住、可以淘汰的 token 数
    protected_size: int  # 被运行中的请求锁住的 token 数

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size


class BasePrefixCache(ABC):
    """前缀缓存：记住"哪串 token 的 K/V 在 KV 池的哪些槽"，让后来的请求跳过已经算过的前缀。

    page_size > 1 时只缓存整页：插入截到 page_size 的整数倍，匹配到的长度也是 page_size 的整数倍。
    """

    def __init__(self, device: torch.device, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be a positive number of tokens, got {page_size}")
        self.device = device
        self.page_size = page_size

    @abstractmethod
    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """input_ids（1-D int32，CPU）已缓存的最长前缀。不改变缓存的内容；句柄锁住之前，槽随时可能被淘汰。"""

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """句柄所在位置到根的整条路径引用计数加一（unlock 时减一）；被锁住的 token 不会被淘汰。"""

    @abstractmethod
    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        """收下 input_ids 和它们的槽 indices（一样长）。缓存接管 indices[cached_len:handle.cached_len]。"""

    @abstractmethod
    def evict(self, size: int) -> torch.Tensor:
        """淘汰至少 size 个 token（整页）并返回它们的槽（1-D int32）；可淘汰的不够时抛 RuntimeError。"""

    @abstractmethod
    def reset(self) -> None:
        """清空缓存；调用方同时收回缓存里的全部槽。"""

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo:
        """缓存里可淘汰的和被锁住的 token 数。"""

    @abstractmethod
    def check_integrity(self) -> None:
        """检查内部的不变量，不成立时抛 AssertionError（测试在每一步之后调用）。"""

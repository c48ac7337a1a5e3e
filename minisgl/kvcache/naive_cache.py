# Tangled from book/chapters/ch07_prefix_cache.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import BaseCacheHandle, BasePrefixCache, InsertResult, MatchResult, SizeInfo


@dataclass(frozen=True)
class NaiveCacheHandle(BaseCacheHandle):
    """什么也没缓存的位置：cached_len 恒为 0。"""


class NaivePrefixCache(BasePrefixCache):
    """不复用任何前缀：每个请求从头预填充，结束时它的槽全部还给分配器。"""

    def __init__(self, device: torch.device, page_size: int = 1) -> None:
        super().__init__(device, page_size)
        self._empty = torch.empty(0, dtype=torch.int32, device=device)

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        return MatchResult(NaiveCacheHandle(0), self._empty)

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        assert handle.cached_len == 0, f"not a naive cache handle: {handle}"

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        return InsertResult(0, NaiveCacheHandle(0))  # 一个都不收：调用方释放 indices[0:]

    def evict(self, size: int) -> torch.Tensor:
        if size > 0:
            raise RuntimeError(f"cannot evict {size} tokens: the naive cache holds none")
        return self._empty

    def reset(self) -> None:
        pass

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=0, protected_size=0)

    def check_integrity(self) -> None:
        pass

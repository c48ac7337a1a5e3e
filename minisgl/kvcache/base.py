# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from __future__ import annotations

from abc import ABC, abstractmethod

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

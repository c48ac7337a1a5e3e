# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.core import Batch

# T = 本批 token 数，B = 请求数，H/Hkv = 本 rank 的 q/kv 头数，D = head_dim，L = 批里最长的上下文


class BaseAttnMetadata:
    """一批的注意力元数据；last_indices 是每个请求最后一个 token 在 [T] 里的下标（LM head 只算这些行）。"""

    last_indices: torch.Tensor  # [B] int64，设备上


class BaseAttnBackend(ABC):
    """paged 注意力：prepare_metadata 每批一次，forward 每层一次。"""

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """在 batch.prepare() 之后调用，设置 batch.attn_metadata。"""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch,
                save_kv: bool = True) -> torch.Tensor:
        """q: [T, H, D]，k/v: [T, Hkv, D]（这一批的新 token）→ [T, H, D]。

        先把 k/v 写进池子的 out_loc；save_kv=False 时调用方已经写好了（第 8 章的融合 kernel）。"""

    # 下面两个给第 8 章的 CUDA Graph 用：decode 的元数据要写进地址固定的缓冲区
    supports_cuda_graph: bool = False

    def init_capture_graph(self, max_bs: int, max_seq_len: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be captured in a CUDA graph")

    def prepare_for_graph(self, batch: Batch) -> None:
        """录制和回放 decode 之前调用（代替 prepare_metadata）：元数据写进 init_capture_graph 分配的缓冲区。"""
        raise NotImplementedError(f"{type(self).__name__} cannot be captured in a CUDA graph")

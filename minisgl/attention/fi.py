# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List

import torch

from minisgl.kvcache import BaseKVCachePool

from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch

# T = 本批 token 数，B = 请求数，H/Hkv = q/kv 头数，D = head_dim，N = 本批所有请求的上下文长度之和


@dataclass
class FlashInferMetadata(BaseAttnMetadata):
    last_indices: torch.Tensor  # [B] int64
    wrapper: Any  # plan 过的 FlashInfer wrapper：forward 里直接 run


class FlashInferBackend(BaseAttnBackend):
    """FlashInfer 的 paged prefill / decode。池子当作 page_size=1 来读：页表里本来就是逐 token 的槽号。"""

    def __init__(self, kv_cache: BaseKVCachePool, page_table: torch.Tensor, num_qo_heads: int) -> None:
        import flashinfer  # 只在 GPU 上需要：CPU 安装不必有它

        self.kv_cache, self.page_table = kv_cache, page_table
        k0 = kv_cache.k_cache(0)
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, k0.shape[1], k0.shape[2]
        self.device = kv_cache.device
        self.workspace = torch.empty(256 << 20, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        # decode 用张量核心的路径：GQA 时比 CUDA core 的路径快约 11%（perf-notes，H200）
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                           use_tensor_cores=True)

    def _kv_indices(self, batch: Batch, seq_lens: List[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(kv_indptr [B+1] int32 CPU, kv_indices [N] int32 设备上)：每个请求的全部槽号首尾相接。"""
        indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor(seq_lens).cumsum(0)
        total = int(indptr[-1])
        host = torch.tensor([[r.table_idx for r in batch.reqs], seq_lens, indptr[:-1].tolist()])  # [3, B]
        rows, lens, starts = host.to(self.device, non_blocking=True).unbind(0)
        row_of = torch.repeat_interleave(rows, lens, output_size=total)  # [N]
        col_of = torch.arange(total, device=self.device) - torch.repeat_interleave(starts, lens, output_size=total)
        return indptr, self.page_table[row_of, col_of]  # [N] int32

    def prepare_metadata(self, batch: Batch) -> None:
        seq_lens = [r.device_len for r in batch.reqs]
        indptr, indices = self._kv_indices(batch, seq_lens)
        last_page_len = torch.ones(batch.size, dtype=torch.int32)  # page_size=1：每页都是满的
        dtype = self.kv_cache.dtype
        qo_indptr = torch.zeros(batch.size + 1, dtype=torch.int32)
        qo_indptr[1:] = torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0)
        if batch.is_prefill:
            wrapper = self.prefill_wrapper
            wrapper.plan(qo_indptr, indptr, indices, last_page_len, self.num_qo_heads, self.num_kv_heads,
                         self.head_dim, 1, causal=True, q_data_type=dtype, kv_data_type=dtype)
        else:
            wrapper = self.decode_wrapper
            wrapper.plan(indptr, indices, last_page_len, self.num_qo_heads, self.num_kv_heads, self.head_dim, 1,
                         q_data_type=dtype, kv_data_type=dtype)
        last = (qo_indptr[1:] - 1).to(self.device, non_blocking=True).long()  # [B]
        batch.attn_metadata = FlashInferMetadata(last_indices=last, wrapper=wrapper)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: Batch) -> torch.Tensor:
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        meta = batch.attn_metadata
        assert isinstance(meta, FlashInferMetadata)
        shape = (-1, 1, self.num_kv_heads, self.head_dim)  # [slots, page_size=1, Hkv, D]
        kv = (self.kv_cache.k_cache(layer_id).view(shape), self.kv_cache.v_cache(layer_id).view(shape))
        return meta.wrapper.run(q, kv)  # [T, H, D]

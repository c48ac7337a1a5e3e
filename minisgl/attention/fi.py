# Tangled from book/chapters/ch06_kvcache.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

import torch

from minisgl.env import load_env
from minisgl.kernel import split_kv_decode, split_kv_splits, split_kv_supported
from minisgl.kvcache import BaseKVCachePool

from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch, Req

# T = 本批 token 数，B = 请求数，H/Hkv = q/kv 头数，D = head_dim，N = 本批所有请求的上下文长度之和


@dataclass
class FlashInferMetadata(BaseAttnMetadata):
    last_indices: torch.Tensor  # [B] int64
    wrapper: Any  # plan 过的 FlashInfer wrapper：forward 里直接 run


class FlashInferBackend(BaseAttnBackend):
    """FlashInfer 的 paged prefill / decode，按池子真实的页大小读：页 p 是槽 p·P … p·P+P-1，连续的一块。"""

    def __init__(self, kv_cache: BaseKVCachePool, page_table: torch.Tensor, num_qo_heads: int) -> None:
        import flashinfer  # 只在 GPU 上需要：CPU 安装不必有它

        self.kv_cache, self.page_table, self.page_size = kv_cache, page_table, kv_cache.page_size
        k0 = kv_cache.k_cache(0)
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, k0.shape[1], k0.shape[2]
        self.device = kv_cache.device
        self.workspace = torch.empty(256 << 20, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        # decode 用张量核心的路径：GQA 时一个 kv 头带 G 个 q 头，正好凑成矩阵乘喂给张量核心
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                           use_tensor_cores=True)
        self.graph_wrappers: Dict[int, Any] = {}  # 批大小 → 录 CUDA Graph 用的 decode wrapper

    supports_cuda_graph = True

    def init_capture_graph(self, max_bs: int, max_seq_len: int) -> None:
        """decode 的 indptr / indices / last_page_len 缓冲区：一次分配，所有批大小共用，地址从此不变。"""
        dev = self.device
        self._graph_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self._graph_indices = torch.zeros(max_bs * -(-max_seq_len // self.page_size), dtype=torch.int32, device=dev)
        self._graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)

    def prepare_for_graph(self, batch: Batch) -> None:
        import flashinfer

        bs = batch.padded_size
        if bs not in self.graph_wrappers:
            self.graph_wrappers[bs] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self._graph_indptr[:bs + 1], paged_kv_indices_buffer=self._graph_indices,
                paged_kv_last_page_len_buffer=self._graph_last_page_len[:bs])
        self._plan_decode(batch, self.graph_wrappers[bs])

    def _kv_indices(self, reqs: List[Req]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """每个请求的页号首尾相接：(kv_indptr [B+1] int32 CPU, kv_indices [N] int32 设备上, last_page_len [B] int32
        CPU)。N = 各请求页数之和；页号从页表每页的第一个槽号来（槽号 // P），最后一页只用了 last_page_len 个槽。"""
        P = self.page_size
        lens = [r.device_len for r in reqs]
        pages = [-(-n // P) for n in lens]
        indptr = torch.zeros(len(reqs) + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor(pages).cumsum(0)
        total = int(indptr[-1])
        host = torch.tensor([[r.table_idx for r in reqs], pages, indptr[:-1].tolist()])  # [3, B]
        rows, npages, starts = host.to(self.device, non_blocking=True).unbind(0)
        row_of = torch.repeat_interleave(rows, npages, output_size=total)  # [N]
        page_of = torch.arange(total, device=self.device) - torch.repeat_interleave(starts, npages, output_size=total)
        first_slots = self.page_table[row_of, page_of * P]  # [N] int32：每页第一个槽
        last_page_len = torch.tensor([n - (k - 1) * P for n, k in zip(lens, pages)], dtype=torch.int32)
        return indptr, first_slots // P if P > 1 else first_slots, last_page_len

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.padded_reqs
        if batch.is_decode:
            return self._plan_decode(batch, self.decode_wrapper)
        indptr, indices, last_page_len = self._kv_indices(reqs)
        dtype = self.kv_cache.dtype
        qo_indptr = torch.zeros(len(reqs) + 1, dtype=torch.int32)
        qo_indptr[1:] = torch.tensor([r.extend_len for r in reqs]).cumsum(0)
        self.prefill_wrapper.plan(qo_indptr, indptr, indices, last_page_len, self.num_qo_heads, self.num_kv_heads,
                                  self.head_dim, self.page_size, causal=True, q_data_type=dtype, kv_data_type=dtype)
        last = (qo_indptr[1:] - 1).to(self.device, non_blocking=True).long()  # [B]
        batch.attn_metadata = FlashInferMetadata(last_indices=last, wrapper=self.prefill_wrapper)

    def _plan_decode(self, batch: Batch, wrapper: Any) -> None:
        indptr, indices, last_page_len = self._kv_indices(batch.padded_reqs)
        dtype = self.kv_cache.dtype
        wrapper.plan(indptr, indices, last_page_len, self.num_qo_heads, self.num_kv_heads, self.head_dim,
                     self.page_size, q_data_type=dtype, kv_data_type=dtype)
        last = torch.arange(batch.padded_size, device=self.device)  # decode：每个 token 都是最后一个
        batch.attn_metadata = FlashInferMetadata(last_indices=last, wrapper=wrapper)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch,
                save_kv: bool = True) -> torch.Tensor:
        if save_kv:
            self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        meta = batch.attn_metadata
        assert isinstance(meta, FlashInferMetadata)
        shape = (-1, self.page_size, self.num_kv_heads, self.head_dim)  # [pages, P, Hkv, D]
        kv = (self.kv_cache.k_cache(layer_id).view(shape), self.kv_cache.v_cache(layer_id).view(shape))
        return meta.wrapper.run(q, kv)  # [T, H, D]


@dataclass
class SplitKVDecode:
    """和 FlashInfer 的 wrapper 一样有 run(q, kv)：minisgl 自己的 split-KV decode（kernel/decode.py）。"""

    page_table: torch.Tensor  # [R, L] int32
    rows: torch.Tensor  # [2, B] int32：每个请求在页表的哪一行、上下文多长
    splits: int
    sm_scale: float

    def run(self, q: torch.Tensor, kv: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        k, v = (t.flatten(0, 1) for t in kv)  # [pages, P, Hkv, D] -> [slots, Hkv, D]
        return split_kv_decode(q, k, v, self.page_table, self.rows[0], self.rows[1], self.splits, self.sm_scale)


class FlashInferSplitKVBackend(FlashInferBackend):
    """fi 后端：decode 批不大于 MAX_BS 时用 split-KV kernel，prefill 和大批的 decode 仍用 FlashInfer。"""

    MAX_BS = 64  # benchmarks/bench_attention.py 量过、在引擎里验证过的范围：到 64 为止各种上下文长度都不慢于 FlashInfer

    def __init__(self, kv_cache: BaseKVCachePool, page_table: torch.Tensor, num_qo_heads: int) -> None:
        super().__init__(kv_cache, page_table, num_qo_heads)
        self.split_kv = load_env().fused_kernels and split_kv_supported(
            kv_cache.dtype, self.num_qo_heads, self.num_kv_heads, self.head_dim)

    def _use_split_kv(self, batch: Batch) -> bool:
        return self.split_kv and batch.is_decode and batch.padded_size <= self.MAX_BS

    def init_capture_graph(self, max_bs: int, max_seq_len: int) -> None:
        super().init_capture_graph(max_bs, max_seq_len)
        self._graph_rows = torch.zeros(2, max_bs, dtype=torch.int32, device=self.device)  # 行号、长度

    def prepare_for_graph(self, batch: Batch) -> None:
        if not self._use_split_kv(batch):
            return super().prepare_for_graph(batch)
        rows = self._graph_rows[:, :batch.padded_size]  # 录图和每次回放都是这块地址
        rows.copy_(self._rows(batch), non_blocking=True)
        self._set_split_kv(batch, rows)

    def prepare_metadata(self, batch: Batch) -> None:
        if not self._use_split_kv(batch):
            return super().prepare_metadata(batch)
        self._set_split_kv(batch, self._rows(batch).to(self.device, non_blocking=True))

    @staticmethod
    def _rows(batch: Batch) -> torch.Tensor:
        """[2, B] int32，CPU：补齐后每个请求的页表行号和上下文长度。"""
        reqs = batch.padded_reqs
        return torch.tensor([[r.table_idx for r in reqs], [r.device_len for r in reqs]], dtype=torch.int32)

    def _set_split_kv(self, batch: Batch, rows: torch.Tensor) -> None:
        bs = batch.padded_size
        runner = SplitKVDecode(self.page_table, rows, split_kv_splits(bs, self.num_kv_heads, self.device),
                               self.head_dim ** -0.5)
        batch.attn_metadata = FlashInferMetadata(last_indices=torch.arange(bs, device=self.device), wrapper=runner)

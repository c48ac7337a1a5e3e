# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import torch
import torch.nn.functional as F

from minisgl.kvcache import BaseKVCachePool

from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch

# T = 本批 token 数，B = 请求数，H/Hkv = q/kv 头数，D = head_dim，L = 批里最长的上下文


@dataclass
class NativeAttnMetadata(BaseAttnMetadata):
    last_indices: torch.Tensor  # [B] int64
    kv_slots: torch.Tensor  # [B, L] int64：每个请求前 L 个位置的槽号（超出自己长度的部分被掩码盖住）
    kv_mask: torch.Tensor  # [B, L] bool：位置 < 这个请求的上下文长度
    cu_seqlens_q: List[int]  # [B+1]，CPU：第 i 个请求的 query 是 [T] 里的 [cu[i], cu[i+1])
    seq_lens: List[int]  # [B]，CPU：每个请求的上下文长度（缓存的 + 这一步的）


class NativeAttnBackend(BaseAttnBackend):
    """纯 PyTorch：CPU 和 CUDA 都能跑。decode 一次批量 SDPA；prefill 每个请求一次 SDPA。"""

    def __init__(self, kv_cache: BaseKVCachePool, page_table: torch.Tensor) -> None:
        self.kv_cache = kv_cache
        self.page_table = page_table  # [R, S] int32

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.padded_reqs
        seq_lens = [r.device_len for r in reqs]
        cu = [0]
        for r in reqs:
            cu.append(cu[-1] + r.extend_len)
        dev = self.page_table.device
        host = torch.tensor([[r.table_idx, r.device_len, c - 1] for r, c in zip(reqs, cu[1:])])  # [B, 3]
        rows, lens, last = host.to(dev, non_blocking=True).unbind(1)  # [B] ×3
        L = max(seq_lens)
        batch.attn_metadata = NativeAttnMetadata(
            last_indices=last,
            kv_slots=self.page_table[rows, :L].long(),  # [B, L]
            kv_mask=torch.arange(L, device=dev)[None, :] < lens[:, None],  # [B, L]
            cu_seqlens_q=cu, seq_lens=seq_lens)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch,
                save_kv: bool = True) -> torch.Tensor:
        if save_kv:
            self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        meta = batch.attn_metadata
        assert isinstance(meta, NativeAttnMetadata)
        k_cache, v_cache = self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id)  # [slots, Hkv, D]
        if batch.is_decode:
            B, L = meta.kv_slots.shape
            slots = meta.kv_slots.flatten()  # [B·L]
            keys = k_cache.index_select(0, slots).view(B, L, *k_cache.shape[1:]).transpose(1, 2)  # [B, Hkv, L, D]
            values = v_cache.index_select(0, slots).view(B, L, *v_cache.shape[1:]).transpose(1, 2)  # [B, Hkv, L, D]
            mask = meta.kv_mask[:, None, None, :]  # [B, 1, 1, L]
            out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask,
                                                 enable_gqa=True)  # [B, H, 1, D]
            return out.squeeze(2)  # [T=B, H, D]
        out = torch.empty_like(q)  # [T, H, D]
        for i, (start, end) in enumerate(zip(meta.cu_seqlens_q, meta.cu_seqlens_q[1:])):
            slots = meta.kv_slots[i, :meta.seq_lens[i]]  # [S_i]：这个请求的全部上下文
            keys = k_cache.index_select(0, slots).transpose(0, 1)  # [Hkv, S_i, D]
            values = v_cache.index_select(0, slots).transpose(0, 1)  # [Hkv, S_i, D]
            positions = batch.positions[start:end]  # [Q_i]
            causal = torch.arange(len(slots), device=q.device)[None, :] <= positions[:, None]  # [Q_i, S_i]
            out[start:end] = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1), keys, values, attn_mask=causal, enable_gqa=True).transpose(0, 1)
        return out

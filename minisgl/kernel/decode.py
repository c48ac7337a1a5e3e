# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

import functools
from typing import Any, Tuple

import torch

from .fused import triton_kernel

# B = 请求数，H/Hkv = q/kv 头数，G = H / Hkv（一个 kv 头带几个 q 头），D = head_dim，S = KV 切成几段

MIN_CHUNK = 64  # 一段至少 64 个 token：上下文短时少切几段，不让每段只有几个 token
MAX_GROUP = 16  # q 的 G 个头补到 16 行做 tl.dot


@triton_kernel
def _kernels(triton: Any, tl: Any) -> Any:
    @triton.jit
    def split_kv(q, k_cache, v_cache, page_table, table_idx, seq_lens, out, part_o, part_lse,
                 q_stride, slot_stride, table_stride, out_stride, sm_scale,
                 G: tl.constexpr, D: tl.constexpr, S: tl.constexpr, BLOCK_T: tl.constexpr, MIN_CHUNK: tl.constexpr):
        b = tl.program_id(0)  # 第 b 个请求
        g = tl.program_id(1)  # 的第 g 个 kv 头（带 G 个 q 头）
        s = tl.program_id(2)  # 的第 s 段 KV
        length = tl.load(seq_lens + b)
        chunk = tl.cdiv(tl.cdiv(length, S), MIN_CHUNK) * MIN_CHUNK  # 段长：length 分成 S 段，取到 MIN_CHUNK 的倍数
        start = s * chunk
        if start < length:  # 上下文短时后面几段是空的：什么都不做
            end = tl.minimum(start + chunk, length)
            row = tl.load(table_idx + b).to(tl.int64)
            r = tl.arange(0, 16)  # q 的行：前 G 行是这个 kv 头带的 q 头，其余补零
            d = tl.arange(0, D)
            heads = g * G + r
            qt = tl.load(q + b * q_stride + heads[:, None] * D + d[None, :], mask=r[:, None] < G, other=0.0)
            m_i = tl.full((16,), float("-inf"), dtype=tl.float32)  # 每行见过的最大分数（以 2 为底）
            l_i = tl.zeros((16,), dtype=tl.float32)  # 每行 2^(分数 - m_i) 之和
            acc = tl.zeros((16, D), dtype=tl.float32)
            scale = sm_scale * 1.4426950408889634  # e^x = 2^(x·log2 e)
            for t0 in range(start, end, BLOCK_T):
                t = t0 + tl.arange(0, BLOCK_T)
                valid = t < end
                slot = tl.load(page_table + row * table_stride + t, mask=valid, other=0).to(tl.int64)  # [BT]
                kv_off = slot[:, None] * slot_stride + g * D + d[None, :]  # [BT, D]：按槽号 gather
                kt = tl.load(k_cache + kv_off, mask=valid[:, None], other=0.0)
                sc = tl.where(valid[None, :], tl.dot(qt, tl.trans(kt)) * scale, float("-inf"))  # [16, BT]
                m_new = tl.maximum(m_i, tl.max(sc, 1))
                alpha = tl.exp2(m_i - m_new)  # 旧的累加量按新的最大值缩小
                p = tl.exp2(sc - m_new[:, None])  # [16, BT]
                l_i = l_i * alpha + tl.sum(p, 1)
                vt = tl.load(v_cache + kv_off, mask=valid[:, None], other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)  # [16, D]，float32
                m_i = m_new
            mask = r < G
            if S == 1:  # 不切：直接写结果
                dst = out + b * out_stride + heads[:, None] * D + d[None, :]
                tl.store(dst, (acc / l_i[:, None]).to(out.dtype.element_ty), mask=mask[:, None])
            else:  # 这一段的部分结果（已归一化）和它的 log-sum-exp，留给 merge
                at = (b * tl.num_programs(1) * G + heads) * S + s  # [16]：part_* 里 (b, 头, s) 的下标
                tl.store(part_o + at[:, None] * D + d[None, :], acc / l_i[:, None], mask=mask[:, None])
                tl.store(part_lse + at, m_i + tl.log2(l_i), mask=mask)

    @triton.jit
    def merge(part_o, part_lse, seq_lens, out, out_stride, D: tl.constexpr, S: tl.constexpr,
              MIN_CHUNK: tl.constexpr):
        b = tl.program_id(0)  # 第 b 个请求
        h = tl.program_id(1)  # 的第 h 个 q 头
        length = tl.load(seq_lens + b)
        s = tl.arange(0, S)
        chunk = tl.cdiv(tl.cdiv(length, S), MIN_CHUNK) * MIN_CHUNK  # 与 split_kv 同一个式子
        live = s * chunk < length  # 非空的段
        d = tl.arange(0, D)
        at = (b * tl.num_programs(1) + h) * S + s  # [S]
        lse = tl.load(part_lse + at, mask=live, other=float("-inf"))  # [S]
        w = tl.exp2(lse - tl.max(lse, 0))  # 每段的权重 ∝ 2^lse；空段为 0
        po = tl.load(part_o + at[:, None] * D + d[None, :], mask=live[:, None], other=0.0)  # [S, D]
        o = tl.sum(po * w[:, None], 0) / tl.sum(w, 0)  # [D]
        tl.store(out + b * out_stride + h * D + d, o.to(out.dtype.element_ty))

    return split_kv, merge


@functools.cache
def split_kv_splits(batch_size: int, num_kv_heads: int, device: torch.device) -> int:
    """S：B·Hkv·S 个程序实例约为 SM 数的两倍（取 2 的幂，1–64）。benchmarks/bench_attention.py 的扫描在 H200 上得出。"""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = max(1, 2 * sms // (batch_size * num_kv_heads))
    return min(64, 1 << (want.bit_length() - 1))


@functools.cache
def _tiles(head_dim: int, elt: int, programs: int, device: torch.device) -> Tuple[int, int]:
    """(BLOCK_T, num_stages)：每轮读的 token 数和流水线级数。K、V 各一块 [BLOCK_T, D]，每级两块都要放进共享内存。
    程序实例多于 SM 数的 3 倍时块减半（H200、Hkv = 8：多于 48 个请求）：扫描里 56、64 个请求时快 9–21%。
    只在后端用到的范围（MAX_BS = 64，实例数到 SM 数的 4 倍）和测量对得上：128、256 个请求时 128 的块又快 2–5%。"""
    props = torch.cuda.get_device_properties(device)
    block_t = 128 if head_dim <= 128 and programs <= 3 * props.multi_processor_count else 64
    smem = props.shared_memory_per_block_optin
    return block_t, 2 if 2 * 2 * block_t * head_dim * elt <= smem - 16384 else 1


def split_kv_supported(dtype: torch.dtype, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """有 Triton；bf16/fp16；一个 kv 头至多带 16 个 q 头；head_dim 是 2 的幂（16–256）。"""
    group = num_qo_heads // num_kv_heads
    return (_kernels() is not None and dtype in (torch.bfloat16, torch.float16) and 1 <= group <= MAX_GROUP
            and num_qo_heads % num_kv_heads == 0 and head_dim in (16, 32, 64, 128, 256))


def split_kv_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                    table_idx: torch.Tensor, seq_lens: torch.Tensor, splits: int, sm_scale: float, *,
                    block_t: int | None = None, min_chunk: int = MIN_CHUNK, num_warps: int = 4,
                    num_stages: int | None = None) -> torch.Tensor:
    """decode 注意力：q: [B, H, D]；k_cache/v_cache: [slots, Hkv, D]（每个槽一行）；page_table: [R, L] int32；
    table_idx/seq_lens: [B] int32（第 b 个请求在页表的哪一行、上下文多长，>= 1）→ [B, H, D]。每个 (请求, kv 头)
    的 KV 切成 splits 段并行读，再按 log-sum-exp 合并（flash-decoding）。关键字参数只给 benchmarks/bench_attention.py 扫描用。"""
    B, H, D = q.shape
    Hkv = k_cache.shape[1]
    assert q.stride(2) == 1 and q.stride(1) == D and k_cache.stride(1) == D and k_cache.stride() == v_cache.stride()
    split_kv, merge = _kernels()
    auto_t, auto_stages = _tiles(D, q.element_size(), B * Hkv * splits, q.device)
    block_t, num_stages = block_t or auto_t, num_stages or auto_stages
    out = torch.empty_like(q)
    if splits > 1:
        part_o = torch.empty(B, H, splits, D, device=q.device, dtype=torch.float32)
        part_lse = torch.empty(B, H, splits, device=q.device, dtype=torch.float32)
    else:
        part_o = part_lse = out
    split_kv[(B, Hkv, splits)](q, k_cache, v_cache, page_table, table_idx, seq_lens, out, part_o, part_lse,
                               q.stride(0), k_cache.stride(0), page_table.stride(0), out.stride(0), sm_scale,
                               G=H // Hkv, D=D, S=splits, BLOCK_T=block_t, MIN_CHUNK=min_chunk,
                               num_warps=num_warps, num_stages=num_stages)
    if splits > 1:
        merge[(B, H)](part_o, part_lse, seq_lens, out, out.stride(0), D=D, S=splits, MIN_CHUNK=min_chunk,
                      num_warps=4)
    return out

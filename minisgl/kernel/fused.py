# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

# T = token 数，H/Hkv = 本 rank 的 q/kv 头数，D = head_dim；qkv 的一行 = [q 的 H 个头 | k 的 Hkv 个 | v 的 Hkv 个]


def triton_kernel(build: Callable[[Any, Any], Any]) -> Callable[[], Any]:
    """装饰器：build(triton, tl) 定义并返回一个 @triton.jit 的 kernel。得到的函数第一次调用时才 import Triton、
    建 kernel，之后缓存；没有 Triton（CPU 上的安装）时返回 None。kernel 按参数特化的编译结果缓存在磁盘上。"""

    @functools.cache
    def get() -> Any | None:
        try:
            import triton
            import triton.language as tl
        except ImportError:
            return None
        return build(triton, tl)

    return get


@triton_kernel
def _kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def qk_norm_rope_store(qkv, row_stride, positions, out_loc, cos_sin, q_weight, k_weight, eps,
                           k_cache, v_cache, slot_stride,
                           H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr):
        t = tl.program_id(0)  # 第 t 个 token
        h = tl.program_id(1)  # 的第 h 个头：[0, H) 是 q，[H, H+Hkv) 是 k，其余是 v
        lo = tl.arange(0, D // 2)  # RoPE 把第 i 维和第 i + D/2 维配成一对：两半分开读
        hi = lo + D // 2
        src = qkv + t * row_stride + h * D
        slot = tl.load(out_loc + t).to(tl.int64)
        if h >= H + HKV:  # v：原样写进池子
            dst = v_cache + slot * slot_stride + (h - H - HKV) * D
            tl.store(dst + lo, tl.load(src + lo))
            tl.store(dst + hi, tl.load(src + hi))
        else:
            x1 = tl.load(src + lo).to(tl.float32)  # [D/2]
            x2 = tl.load(src + hi).to(tl.float32)  # [D/2]
            if NORM:  # 每个头各自的 RMSNorm（Qwen3）：float32 里算，中间不舍入
                if h < H:
                    w1 = tl.load(q_weight + lo).to(tl.float32)
                    w2 = tl.load(q_weight + hi).to(tl.float32)
                else:
                    w1 = tl.load(k_weight + lo).to(tl.float32)
                    w2 = tl.load(k_weight + hi).to(tl.float32)
                rstd = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
                x1 = x1 * rstd * w1
                x2 = x2 * rstd * w2
            pos = tl.load(positions + t).to(tl.int64)
            cos = tl.load(cos_sin + pos * D + lo)  # 第 2 章的 [P, R] 表：前一半 cos，后一半 sin
            sin = tl.load(cos_sin + pos * D + hi)
            y1 = x1 * cos - x2 * sin
            y2 = x2 * cos + x1 * sin
            if h < H:  # q：原地写回 qkv
                dst = src
            else:  # k：写进池子的第 slot 个槽
                dst = k_cache + slot * slot_stride + (h - H) * D
            tl.store(dst + lo, y1.to(dst.dtype.element_ty))
            tl.store(dst + hi, y2.to(dst.dtype.element_ty))

    return qk_norm_rope_store


def qk_norm_rope_store_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                                 v_cache: torch.Tensor, rotary_dim: int) -> bool:
    """能不能用融合 kernel：有 Triton、在 GPU 上；q/k/v 是同一个 qkv 行里首尾相接的三段（qkv_proj 输出的视图）；
    池子与它们同 dtype、每个槽是 [Hkv, D] 连续的；整个头都做 RoPE，D 是 2 的幂（tl.arange 的要求）。"""
    if _kernel() is None or not q.is_cuda:
        return False
    T, H, D = q.shape
    Hkv, step = k.shape[1], q.element_size()
    return (k_cache.dtype == v_cache.dtype == q.dtype and rotary_dim == D and D & (D - 1) == 0
            and q.stride()[1:] == k.stride()[1:] == v.stride()[1:] == (D, 1)
            and (T == 1 or q.stride(0) == k.stride(0) == v.stride(0))  # 只有一行时 view 给的行步长各不相同
            and k.data_ptr() == q.data_ptr() + H * D * step and v.data_ptr() == k.data_ptr() + Hkv * D * step
            and k_cache.stride() == v_cache.stride() and k_cache.stride()[1:] == (D, 1))


def qk_norm_rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                       cos_sin: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                       eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor) -> None:
    """一个 kernel：（q/k 的按头 RMSNorm，权重为 None 时跳过）→ RoPE → q 原地写回，k、v 写进池子的 out_loc。

    q: [T, H, D]，k/v: [T, Hkv, D]（qkv_proj 输出的视图），positions/out_loc: [T]，cos_sin: [P, D] float32，
    k_cache/v_cache: [slots, Hkv, D]。先用 qk_norm_rope_store_supported 检查。"""
    T, H, D = q.shape
    Hkv = k.shape[1]
    norm = q_weight is not None and k_weight is not None
    _kernel()[(T, H + 2 * Hkv)](
        q, q.stride(0), positions, out_loc, cos_sin, q_weight if norm else q, k_weight if norm else q, eps,
        k_cache, v_cache, k_cache.stride(0), H=H, HKV=Hkv, D=D, NORM=norm, num_warps=1)

# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

import os
from typing import Any

import torch

from .fused import triton_kernel

# G = 采样的行数，V = 词表。每行一个程序实例，按 BLOCK 个词一块扫过这一行

BLOCK = 4096  # 一块读 4096 个词：H200 上批大、带 top_p 时比 1024、2048 快
NUM_WARPS = 8  # 每行 8 个 warp：H200 上量过 4、8、16 个，8 个最快或并列最快（批 1 到 256，带不带 top_p）
MAX_ROUNDS = 32  # 拒绝这么多轮还没收下（几乎不会发生），就取 logit 最大的词：它总在集合里


@triton_kernel
def _kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def race_sample(x_ptr, row_stride, keys, temperatures, top_ks, top_ps, min_ps, out, V,
                    BLOCK: tl.constexpr, MAX_ROUNDS: tl.constexpr, HAS_MIN_P: tl.constexpr):
        row = tl.program_id(0)
        base = x_ptr + row.to(tl.int64) * row_stride
        key = tl.load(keys + row)  # 只由 (seed, 位置) 决定
        inv_t = 1.0 / tl.load(temperatures + row)
        k = tl.load(top_ks + row)  # V：不截
        p = tl.load(top_ps + row)  # 1：不截
        min_p = tl.load(min_ps + row) if HAS_MIN_P else 0.0
        check = (k < V) | (p < 1.0) | (min_p > 0.0)  # 三个都没开：第一轮的赢家就是答案，不读第二遍
        floor = inv_t * 0.0 - float("inf")  # 只有 logit 大于它的词参赛：被拒绝的词和比它小的都出局
        m = floor  # 这一行最大的 logit
        top = k * 0  # 它的位置
        rnd = k * 0  # 第几轮
        racing = k > 0
        j = k * 0
        while racing:
            # 第一遍：竞赛。分数 = x/T + Gumbel 噪声，最高的赢；赢家按 exp(x/T) 的比例分布
            best = inv_t * 0.0 - float("inf")
            for s in range(0, V, BLOCK):
                offs = s + tl.arange(0, BLOCK)
                x = tl.load(base + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
                x = tl.where(x == x, x, -float("inf"))  # NaN（模型出了问题）当作抽不到
                xmax = tl.max(x, 0)
                top = tl.where(xmax > m, tl.argmax(x, 0) + s, top)
                m = tl.maximum(m, xmax)
                u = tl.rand(key, offs + rnd * V)  # Philox：只由种子和 (第几轮, 第几个词) 决定，[0, 1)
                score = tl.where(x > floor, x * inv_t - tl.log(-tl.log(u)), -float("inf"))
                smax = tl.max(score, 0)
                j = tl.where(smax > best, tl.argmax(score, 0) + s, j)
                best = tl.maximum(best, smax)
            xj = floor
            accept = ~check
            if check:
                # 第二遍：j 在不在集合里？比它大的词有几个、概率（没归一化，最大的是 1）加起来多少
                xj = tl.load(base + j).to(tl.float32)
                total = 0.0
                above = 0.0
                count = 0
                for s in range(0, V, BLOCK):
                    offs = s + tl.arange(0, BLOCK)
                    x = tl.load(base + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
                    x = tl.where(x == x, x, -float("inf"))
                    w = tl.exp((x - m) * inv_t)  # −inf（被掩掉的词）是 0
                    heavier = x > xj
                    total += tl.sum(w, 0)
                    above += tl.sum(tl.where(heavier, w, 0.0), 0)
                    count += tl.sum(heavier.to(tl.int32), 0)
                accept = (count < k) & (above <= p * total) & (tl.exp((xj - m) * inv_t) >= min_p)
            rnd += 1
            j = tl.where(~accept & (rnd >= MAX_ROUNDS), top, j)
            racing = ~accept & (rnd < MAX_ROUNDS)
            floor = tl.where(racing, xj, floor)  # 下一轮只让比 j 大的词参赛
        tl.store(out + row, j.to(tl.int32))

    return race_sample


def race_sample_supported() -> bool:
    """有 Triton 就能用（GPU 上；CPU 上只有 Triton 的解释器，TRITON_INTERPRET=1，测试用它逐行执行这个 kernel）。"""
    return _kernel() is not None


def race_sample(x: torch.Tensor, keys: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, min_p: torch.Tensor | None) -> torch.Tensor:
    """x: [G, V] logits（bf16 或 float32，行内连续；−inf 的词抽不到）；keys: [G] int64 随机数种子；temperatures、
    top_p、min_p: [G] float32（min_p 整组没开时为 None）；top_k: [G] int64（V 表示不截）→ [G] int32。"""
    G, V = x.shape
    assert x.stride(1) == 1 and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
    out = torch.empty(G, dtype=torch.int32, device=x.device)
    _kernel()[(G,)](x, x.stride(0), keys, temperatures, top_k, top_p, top_p if min_p is None else min_p, out, V,
                    BLOCK=min(BLOCK, 1 << (V - 1).bit_length()), MAX_ROUNDS=MAX_ROUNDS, HAS_MIN_P=min_p is not None,
                    num_warps=NUM_WARPS)
    return out

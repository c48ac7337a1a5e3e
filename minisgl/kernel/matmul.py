# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

import functools
from typing import Any, Tuple

import torch

from .fused import triton_kernel

# M = x 的行数（decode 的批大小），N = 输出维，K = 输入维；w: [N, K]，与 nn.Linear 的权重同样按行存

MAX_ROWS = 16  # tl.dot 最小的块是 16 行：x 不足 16 行时补零，多于 16 行时交给 cuBLAS
ROW_MAX_N = 2048  # 批大小 1、输出不超过这么多列时，换成不用张量核、每个实例只读几行的 gemv_rows
_does_not_fit: set = set()  # (N, K)：这块 GPU 的共享内存放不下规则给的分块，以后都交给 cuBLAS


@triton_kernel
def _kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def gemv(x, w, bias, y, M, K, x_stride, y_stride,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # 这个程序实例负责的输出列
        m = tl.arange(0, 16)  # x 的行补到 16 行（MAX_ROWS）
        k = tl.arange(0, BLOCK_K)
        w_ptrs = w + n[None, :] * K + k[:, None]  # [BK, BN]：w 的 BLOCK_N 行，转置着读
        x_ptrs = x + m[:, None] * x_stride + k[None, :]  # [16, BK]
        acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K, BLOCK_K):
            xt = tl.load(x_ptrs, mask=m[:, None] < M, other=0.0)  # 补的行是 0
            acc = tl.dot(xt, tl.load(w_ptrs), acc)  # 张量核：[16, BK] @ [BK, BN]，float32 累加
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(bias + n).to(tl.float32)[None, :]
        tl.store(y + m[:, None] * y_stride + n[None, :], acc.to(y.dtype.element_ty), mask=m[:, None] < M)

    return gemv


@triton_kernel
def _row_kernel(triton: Any, tl: Any) -> Any:
    @triton.jit
    def gemv_rows(x, w, bias, y, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # 这个程序实例负责的几个输出
        k = tl.arange(0, BLOCK_K)
        w_ptrs = w + n[:, None] * K + k[None, :]  # [BN, BK]：w 的 BLOCK_N 行，每行连续读 BLOCK_K 个
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xt = tl.load(x + k0 + k).to(tl.float32)  # [BK]：x 只有一行
            acc += tl.sum(tl.load(w_ptrs).to(tl.float32) * xt[None, :], axis=1)  # CUDA core 上逐元素乘、行内求和
            w_ptrs += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(bias + n).to(tl.float32)
        tl.store(y + n, acc.to(y.dtype.element_ty))

    return gemv_rows


def _row_blocks(N: int, K: int) -> Tuple[int, int, int] | None:
    """批大小 1 时 gemv_rows 的 (BLOCK_N, BLOCK_K, num_stages)：bench_gemv.py 在 H100 上的扫描；N 太大或整除不了时 None。"""
    if N > ROW_MAX_N:
        return None
    block_n = 2 if N <= 1024 else 4  # N/2 或 N/4 个实例：几百个，每个 SM 好几个
    block_k = 2048
    while block_k > 256 and K % block_k:
        block_k //= 2
    return None if N % block_n or K % block_k else (block_n, block_k, 1)


def _blocks(N: int, K: int) -> Tuple[int, int, int] | None:
    """(BLOCK_N, BLOCK_K, num_stages)：benchmarks/bench_gemv.py 在 H200 上扫描各种分块得出的规则；整除不了时 None。"""
    block_n = 16 if N <= 2048 else 32 if N <= 4096 else 64  # 程序实例 64–384 个（H200 有 132 个 SM）
    # 实例少（每个 SM 一个左右）时每块沿 K 读得长一些，路上的字节才够多；3 级流水线的共享内存放得下 32K 个元素
    block_k = min(1024, 32768 // block_n) if N // block_n <= 128 and K >= 2048 else 128
    while block_n > 16 and N % block_n:
        block_n //= 2
    while block_k > 16 and K % block_k:
        block_k //= 2
    return None if N % block_n or K % block_k else (block_n, block_k, 3)


@functools.cache  # 每个线性层每一步要问两次（gemv_supported、gemv）：按形状和行数记住
def _choose(M: int, N: int, K: int) -> Tuple[bool, Tuple[int, int, int] | None]:
    """(是否用 gemv_rows, 它的分块)：批大小 1 且 _row_blocks 给得出分块时按行读，否则 tl.dot 的 gemv。"""
    rows = _row_blocks(N, K) if M == 1 else None
    return (True, rows) if rows is not None else (False, _blocks(N, K))


def gemv_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """有 Triton、在 GPU 上、bf16/fp16；x 是 1–16 行、行内连续；w 连续，形状能被分块整除、分块放得进共享内存。"""
    if _kernel() is None or not x.is_cuda or x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        return False
    N, K = w.shape
    return (x.dtype == w.dtype and x.dtype in (torch.bfloat16, torch.float16) and x.shape[1] == K
            and x.stride(1) == 1 and w.is_contiguous() and N * K < 2 ** 31
            and _choose(x.shape[0], N, K)[1] is not None and (N, K) not in _does_not_fit)


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.T (+ bias)：x: [M, K]，M <= 16；w: [N, K]；bias: [N] 或 None → [M, N]。先用 gemv_supported 检查。"""
    (M, K), N = x.shape, w.shape[0]
    rows, (block_n, block_k, stages) = _choose(M, N, K)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    b = w if bias is None else bias  # 没有偏置时随便给一个指针：HAS_BIAS=False 的 kernel 不读它
    try:
        if rows:
            _row_kernel()[(N // block_n,)](x, w, b, y, K, BLOCK_N=block_n, BLOCK_K=block_k,
                                           HAS_BIAS=bias is not None, num_warps=4, num_stages=stages)
        else:
            _kernel()[(N // block_n,)](x, w, b, y, M, K, x.stride(0), y.stride(0), BLOCK_N=block_n,
                                       BLOCK_K=block_k, HAS_BIAS=bias is not None, num_warps=4, num_stages=stages)
    except Exception as e:  # 规则是在 H200 上定的：共享内存小的 GPU（消费级卡约 100 KB）可能放不下
        if type(e).__name__ != "OutOfResources":
            raise
        _does_not_fit.add((N, K))
        return torch.nn.functional.linear(x, w, bias)
    return y

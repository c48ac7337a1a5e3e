#!/usr/bin/env python3
"""Probe: does programmatic dependent launch (PDL) shorten a chain of small-batch GEMVs replayed from a CUDA graph?

    python benchmarks/probe_pdl.py [--layers 48]

At batch 1 a decode step is a chain of dependent kernels, each reading a few MB of weights; every kernel pays a
ramp-up (its first loads in flight) and a tail (its last programs draining) during which the GPU reads little. With
PDL (Hopper and later) the next kernel may start while the previous one drains: it waits (griddepcontrol.wait,
tl.extra.cuda.gdc_wait) only before it reads what the previous kernel wrote, and the weights it reads do not depend
on it. This times chains of minisgl's GEMV (minisgl/kernel/matmul.py's kernel and block rule, copied here with the
two PDL calls added) in three ways: plain launches; PDL with the wait at the top; PDL with each program's first
weight tile loaded before the wait. Chains: Qwen3-30B-A3B's per-layer GEMVs (qkv, o, router) and Qwen3-8B's
(qkv, o, gate_up, down), `layers` copies with their own weights, M = 1, bf16. The floor is the weight bytes over the
copy bandwidth measured here. Every variant's output is checked against the plain chain.

Result on an H100 (book/data/h100/probe_pdl.txt): PDL with the wait first takes 7% off the Qwen3-30B-A3B chain
(0.57 us per GEMV: about the gap between two kernels) and adds 6% to Qwen3-8B's, whose GEMVs fill every SM, so
minisgl does not launch with PDL. The third variant says nothing about prefetching: its loop carries a whole weight
tile from one iteration to the next in registers (spilled), which makes every GEMV about 10x slower.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import copy_bandwidth, cuda_time  # noqa: E402  (this folder: the same timing as the MoE benchmark)
from minisgl.kernel.matmul import _blocks  # noqa: E402


@triton.jit
def gemv(x, w, y, K, x_stride, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr,
         PREFETCH: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, 16)
    k = tl.arange(0, BLOCK_K)
    w_ptrs = w + n[None, :] * K + k[:, None]  # [BK, BN]
    x_ptrs = x + m[:, None] * x_stride + k[None, :]  # [16, BK]
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    if PREFETCH:
        wt = tl.load(w_ptrs)  # the first weight tile: it does not depend on the previous kernel
    if GDC:
        tl.extra.cuda.gdc_wait()  # the previous kernel has finished and its writes are visible
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start as soon as there is room
    if PREFETCH:
        for k0 in range(0, K, BLOCK_K):
            xt = tl.load(x_ptrs, mask=m[:, None] < 1, other=0.0)
            acc = tl.dot(xt, wt, acc)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
            wt = tl.load(w_ptrs, mask=(k[:, None] < K - k0 - BLOCK_K), other=0.0)
    else:
        for _ in range(0, K, BLOCK_K):
            xt = tl.load(x_ptrs, mask=m[:, None] < 1, other=0.0)
            acc = tl.dot(xt, tl.load(w_ptrs), acc)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
    tl.store(y + m[:, None] * 0 + n[None, :], acc.to(y.dtype.element_ty), mask=m[:, None] < 1)


def chain(shapes, layers: int):
    """Weights for `layers` copies of the shapes; each GEMV reads the previous one's output (its first K columns)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [[(torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16) for N, K in shapes]
          for _ in range(layers)]
    width = max(max(N, K) for N, K in shapes)
    bufs = [torch.zeros(16, width, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    bufs[0][0].normal_(generator=g)
    return ws, bufs


def run_chain(ws, bufs, gdc: bool, prefetch: bool) -> torch.Tensor:
    src, dst = bufs
    for layer in ws:
        for w in layer:
            N, K = w.shape
            bn, bk, stages = _blocks(N, K)
            gemv[(N // bn,)](src, w, dst, K, src.stride(0), BLOCK_N=bn, BLOCK_K=bk, GDC=gdc, PREFETCH=prefetch,
                             num_warps=4, num_stages=stages, launch_pdl=gdc)
            src, dst = dst, src
    return src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}; "
          f"copy bandwidth {bw / 1e12:.2f} TB/s")
    chains = {"qwen3-30b-a3b attention + router": [(5120, 2048), (2048, 4096), (128, 2048)],
              "qwen3-8b qkv, o, gate_up, down": [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]}
    variants = {"plain": (False, False), "pdl, wait first": (True, False), "pdl, first tile before wait": (True, True)}
    for name, shapes in chains.items():
        layers = args.layers if "30b" in name else min(args.layers, 36)
        ws, bufs = chain(shapes, layers)
        nbytes = sum(w.numel() * 2 for layer in ws for w in layer)
        floor_us = nbytes / bw * 1e6
        print(f"\n{name}: {layers} layers, {len(shapes) * layers} GEMVs, {nbytes / 1e9:.2f} GB, floor {floor_us:.0f} us")
        ref = None
        init = bufs[0].clone()

        def reset() -> None:
            bufs[1].zero_()
            bufs[0].copy_(init)

        for vname, (gdc, pre) in variants.items():
            try:
                reset()
                out = run_chain(ws, bufs, gdc, pre).clone()
                torch.cuda.synchronize()
                if ref is None:
                    ref = out
                ok = torch.equal(out, ref)
                graph = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    run_chain(ws, bufs, gdc, pre)
                torch.cuda.current_stream().wait_stream(s)
                reset()
                with torch.cuda.graph(graph):
                    got = run_chain(ws, bufs, gdc, pre)
                reset()
                graph.replay()
                torch.cuda.synchronize()
                ok_graph = torch.equal(got, ref)
                us = cuda_time(graph.replay, 20) * 1000
                eager = cuda_time(lambda: run_chain(ws, bufs, gdc, pre), 10) * 1000
                print(f"  {vname:<28} graph {us:8.0f} us ({us / floor_us:4.2f}x floor, "
                      f"{us / (len(shapes) * layers):5.2f} us per GEMV)  eager {eager:8.0f} us  "
                      f"same output: eager {ok}, graph {ok_graph}")
            except Exception as e:  # noqa: BLE001 -- report and go on with the next variant
                print(f"  {vname:<28} FAILED: {type(e).__name__}: {str(e)[:300]}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

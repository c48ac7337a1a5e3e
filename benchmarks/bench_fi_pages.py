#!/usr/bin/env python3
"""Decode attention at the offline benchmark's shapes, read through FlashInfer as pages of 1 or of 16 slots.

    python benchmarks/bench_fi_pages.py [H HKV]          # default 16 8 (Qwen3-0.6B's heads); needs a GPU

minisgl's pool layout (K and V apart, [slots, Hkv, D], bf16; pages of 16 slots in random order), batches of
256 ... 64 requests with contexts like the offline workload's as it runs (input 100-1024 plus what has been
decoded). Per layer, microseconds per call and the multiple of the floor (K/V bytes / 4.25 TB/s):
  fi p1 / fi p16            FlashInfer's tensor-core decode given token slots (page_size 1) or page numbers;
  ... graph                 the wrapper built for CUDA graphs (use_cuda_graph=True), run outside a graph;
  ... graph-nosplit         the same with plan(disable_split_kv=True) (only past 2 x SMs / Hkv requests: at 32
                            requests it crashed with an illegal memory access on FlashInfer 0.6.13);
  split-kv                  minisgl's split-KV kernel (chapter 8) on the same table.
"""
import random
import sys
from pathlib import Path

import flashinfer
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's minisgl (resolve(): a chapter tree links benchmarks/ here)
from minisgl.kernel import split_kv_decode, split_kv_splits  # noqa: E402

HQ, HKV = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (16, 8)
D, P = 128, 16
DEV, DT = torch.device("cuda"), torch.bfloat16
WORKSPACE = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)


def bench(fn, iters: int = 50) -> float:
    """microseconds per call, CUDA events around iters calls after 5 warm-up calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters * 1000


def fi_decode(q, k, v, page: int, indptr, indices, last, graph: str) -> tuple:
    """(output, us per call) of FlashInfer's tensor-core decode reading the pool as pages of `page` slots."""
    kv = (k.view(-1, page, HKV, D), v.view(-1, page, HKV, D))
    n = len(last)
    kw = {}
    if graph:
        kw = dict(use_cuda_graph=True, paged_kv_indptr_buffer=torch.zeros(n + 1, dtype=torch.int32, device=DEV),
                  paged_kv_indices_buffer=torch.zeros(indices.numel(), dtype=torch.int32, device=DEV),
                  paged_kv_last_page_len_buffer=torch.zeros(n, dtype=torch.int32, device=DEV))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD", use_tensor_cores=True, **kw)
    w.plan(indptr, indices, last, HQ, HKV, D, page, q_data_type=DT, kv_data_type=DT,
           disable_split_kv=graph == "nosplit")
    return w.run(q, kv), bench(lambda: w.run(q, kv))


def main() -> None:
    random.seed(0)
    for n, decoded in ((256, 300), (192, 500), (128, 700), (96, 900), (64, 1000)):
        lens = [random.randint(100, 1024) + decoded for _ in range(n)]
        npages = [-(-length // P) for length in lens]
        total = sum(npages) + 8
        k = torch.randn(total * P, HKV, D, dtype=DT, device=DEV)
        v = torch.randn_like(k)
        pages = torch.randperm(total)[:sum(npages)].split(npages)  # 每个请求的页，乱序
        table = torch.zeros(n, max(npages) * P, dtype=torch.int32)
        for b, pg in enumerate(pages):
            table[b, :len(pg) * P] = (pg[:, None] * P + torch.arange(P)).flatten()
        table = table.to(DEV)
        q = torch.randn(n, HQ, D, dtype=DT, device=DEV)
        floor = sum(lens) * HKV * D * 2 * 2 / 4.25e12 * 1e6
        slots = torch.cat([table[b, :length] for b, length in enumerate(lens)])
        ways = {1: (torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32), slots,
                    torch.ones(n, dtype=torch.int32)),
                P: (torch.tensor([0] + torch.tensor(npages).cumsum(0).tolist(), dtype=torch.int32),
                    torch.cat(pages).to(DEV, torch.int32),
                    torch.tensor([(length - 1) % P + 1 for length in lens], dtype=torch.int32))}
        res, ref = {}, None
        for page, (indptr, indices, last) in ways.items():
            for graph in ("", "graph", "nosplit"):
                out, us = fi_decode(q, k, v, page, indptr, indices, last, graph)
                ref = out if ref is None else ref
                assert (out - ref).abs().max() < 2e-2, (page, graph)
                res[f"fi p{page}" + {"": "", "graph": " graph", "nosplit": " graph-nosplit"}[graph]] = us
        rows, seq = torch.arange(n, dtype=torch.int32, device=DEV), torch.tensor(lens, dtype=torch.int32, device=DEV)
        splits = split_kv_splits(n, HKV, DEV)
        out = split_kv_decode(q, k, v, table, rows, seq, splits, D ** -0.5)
        assert (out - ref).abs().max() < 2e-2
        res["split-kv"] = bench(lambda: split_kv_decode(q, k, v, table, rows, seq, splits, D ** -0.5))
        print(f"B={n:3d} ctx~{sum(lens) // n:4d} floor {floor:6.1f} us | "
              + "  ".join(f"{name} {us:6.1f} ({us / floor:.2f})" for name, us in res.items()), flush=True)


if __name__ == "__main__":
    main()

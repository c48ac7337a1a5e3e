#!/usr/bin/env python3
"""Decode attention alone on a GPU: FlashInfer's tensor-core path against its CUDA-core path, per batch size.

    python tools/bench_attention.py [--heads 32 8] [--batch-sizes 1 4 8 16 32 64 256] [--contexts 512 4096]

The fi backend's decode (page_size 1 view of the pool, bf16, head_dim 128), with every request at the same context
length. Each case is planned once and 36 runs (one per layer of Qwen3-8B) are captured in a CUDA graph, as in a
decode step; the table gives microseconds per run (median of 20 replays) and the KV bytes read per second; the last
column is the tensor-core path through the wrapper the engine captures its graphs with (use_cuda_graph=True).
"""
from __future__ import annotations

import argparse

import torch


def time_decode(bs: int, context: int, H: int, Hkv: int, D: int, tensor_cores: bool, graph_wrapper: bool = False,
                layers: int = 36) -> float:
    """us per run; graph_wrapper: the wrapper the engine records CUDA graphs with (use_cuda_graph=True, fixed
    buffers), whose plan must hold for any context length, so it splits the KV more conservatively."""
    import flashinfer

    dev, dt = torch.device("cuda"), torch.bfloat16
    slots = bs * context
    k_cache = torch.randn(slots, 1, Hkv, D, device=dev, dtype=dt)
    v_cache = torch.randn(slots, 1, Hkv, D, device=dev, dtype=dt)
    q = torch.randn(bs, H, D, device=dev, dtype=dt)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    indptr = torch.arange(bs + 1, dtype=torch.int32) * context
    indices = torch.randperm(slots, device=dev).int()
    if graph_wrapper:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.zeros(slots, dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=dev))
    else:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    wrapper.plan(indptr, indices, torch.ones(bs, dtype=torch.int32), H, Hkv, D, 1, q_data_type=dt, kv_data_type=dt)
    for _ in range(3):
        wrapper.run(q, (k_cache, v_cache))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(layers):
                wrapper.run(q, (k_cache, v_cache))
    torch.cuda.current_stream().wait_stream(stream)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / layers)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("H", "HKV"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    args = ap.parse_args()
    H, Hkv, D = *args.heads, args.head_dim
    print(f"\nFlashInfer decode, {H} q heads, {Hkv} kv heads, head_dim {D}, bf16: us per layer (36 runs in a graph)")
    print(f"{'context':>8} {'batch':>6} {'CUDA cores':>11} {'tensor cores':>13} {'faster':>12} {'KV TB/s':>8} "
          f"{'tensor, graph wrapper':>22}")
    for context in args.contexts:
        for bs in args.batch_sizes:
            cc = time_decode(bs, context, H, Hkv, D, tensor_cores=False)
            tc = time_decode(bs, context, H, Hkv, D, tensor_cores=True)
            kv_bytes = 2 * bs * context * Hkv * D * 2
            best = min(cc, tc)
            tcg = time_decode(bs, context, H, Hkv, D, tensor_cores=True, graph_wrapper=True)
            print(f"{context:>8} {bs:>6} {cc:>11.2f} {tc:>13.2f} {'tensor' if tc < cc else 'CUDA':>12} "
                  f"{kv_bytes / best / 1e6:>8.2f} {tcg:>22.2f}")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

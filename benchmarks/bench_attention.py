#!/usr/bin/env python3
"""Decode attention alone on a GPU: FlashInfer against minisgl's Triton split-KV kernel, per batch size.

    python benchmarks/bench_attention.py [--heads 32 8] [--batch-sizes 1 4 8 16 32 64 256] [--contexts 512 4096]
                                    [--sweep [--json F]]

Every request has the same context length; the pool is read as page_size 1 (one slot per token, slots in random
order). Each case is prepared once and 36 runs (one per layer of Qwen3-8B) are captured in a CUDA graph, as in a
decode step; the table gives microseconds per run (median of 20 replays). "graph wrapper" is FlashInfer's
tensor-core path through the wrapper the engine would capture with (use_cuda_graph=True: its plan must hold for any
context length, so it splits the KV more conservatively); "split-KV" is minisgl.kernel.decode with the splits the
engine picks for that batch size. --sweep instead times split-KV's splits, block size and minimum chunk per batch size
over the given contexts (the data behind kernel/decode.py's defaults: book/data/h200/attention_split_kv_sweep.*).
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Callable, Dict, List

import torch

LAYERS = 36


def graph_us(run: Callable[[], object], layers: int = LAYERS) -> float:
    """us per run: `layers` runs captured in one CUDA graph, median of 20 replays."""
    for _ in range(3):
        run()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(layers):
                run()
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


class Case:
    """bs requests of `context` tokens each in a pool of bs·context slots (random order), bf16."""

    def __init__(self, bs: int, context: int, H: int, Hkv: int, D: int) -> None:
        dev, dt = torch.device("cuda"), torch.bfloat16
        self.bs, self.context, self.H, self.Hkv, self.D = bs, context, H, Hkv, D
        slots = bs * context
        self.k_cache = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
        self.v_cache = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
        self.q = torch.randn(bs, H, D, device=dev, dtype=dt)
        self.indices = torch.randperm(slots, device=dev).int()  # [bs·context]
        self.page_table = self.indices.view(bs, context)  # 第 b 行 = 第 b 个请求的槽号
        self.table_idx = torch.arange(bs, device=dev, dtype=torch.int32)
        self.seq_lens = torch.full((bs,), context, device=dev, dtype=torch.int32)
        self.workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)

    def flashinfer(self, tensor_cores: bool, graph_wrapper: bool = False) -> float:
        import flashinfer

        bs, slots = self.bs, self.bs * self.context
        dev = self.q.device
        if graph_wrapper:
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buffer=torch.zeros(slots, dtype=torch.int32, device=dev),
                paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=dev))
        else:
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                    use_tensor_cores=tensor_cores)
        indptr = torch.arange(bs + 1, dtype=torch.int32) * self.context
        wrapper.plan(indptr, self.indices, torch.ones(bs, dtype=torch.int32), self.H, self.Hkv, self.D, 1,
                     q_data_type=self.q.dtype, kv_data_type=self.q.dtype)
        kv = (self.k_cache.view(-1, 1, self.Hkv, self.D), self.v_cache.view(-1, 1, self.Hkv, self.D))
        return graph_us(lambda: wrapper.run(self.q, kv))

    def split_kv(self, splits: int | None = None, **knobs) -> float:
        from minisgl.kernel.decode import split_kv_decode, split_kv_splits

        splits = splits or split_kv_splits(self.bs, self.Hkv, self.q.device)
        return graph_us(lambda: split_kv_decode(self.q, self.k_cache, self.v_cache, self.page_table, self.table_idx,
                                                self.seq_lens, splits, self.D ** -0.5, **knobs))


def sweep(batch_sizes: List[int], contexts: List[int], H: int, Hkv: int, D: int) -> Dict[str, Dict[str, dict]]:
    """split-KV's knobs: S (B·Hkv·S between 64 and 1024 programs, and S = 1 always), BLOCK_T, MIN_CHUNK (2 stages) for
    each batch size over all contexts; prints the configs ranked by their mean time relative to each context's best."""
    results: Dict[str, Dict[str, dict]] = {}
    for bs in batch_sizes:
        table: Dict[tuple, Dict[int, float]] = {}
        for context in contexts:
            case = Case(bs, context, H, Hkv, D)
            for splits, block_t, min_chunk in itertools.product((1, 2, 4, 8, 16, 32, 64), (32, 64, 128), (32, 64)):
                programs = bs * Hkv * splits
                if splits > 1 and not 64 <= programs <= 1024 or min_chunk > block_t and min_chunk != 64:
                    continue
                table.setdefault((splits, block_t, min_chunk), {})[context] = case.split_kv(
                    splits, block_t=block_t, min_chunk=min_chunk, num_stages=2)
            del case
            torch.cuda.empty_cache()
        best = {c: min(t[c] for t in table.values()) for c in contexts}
        ranked = sorted((sum(t[c] / best[c] for c in contexts) / len(contexts), k) for k, t in table.items())
        print(f"\nbs={bs} best: " + ", ".join(f"{c}: {best[c]:.2f}" for c in contexts))
        for score, k in ranked[:6]:
            print(f"   S={k[0]:<3} BLOCK_T={k[1]:<4} MIN_CHUNK={k[2]:<3} mean/best {score:.3f}  "
                  + "  ".join(f"{table[k][c]:.2f}" for c in contexts))
        results[str(bs)] = {str(k): t for k, t in table.items()}
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("H", "HKV"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--sweep", action="store_true",
                    help="instead of the table, sweep split-KV's knobs (e.g. --batch-sizes 1 2 4 8 16 --contexts 512 2048 4096)")
    ap.add_argument("--json", type=Path, help="with --sweep: write every config's time here")
    args = ap.parse_args()
    from minisgl.kernel.decode import split_kv_splits

    H, Hkv, D = *args.heads, args.head_dim
    print(f"\nDecode attention, {H} q heads, {Hkv} kv heads, head_dim {D}, bf16: us per layer "
          f"({LAYERS} runs in a graph)")
    if args.sweep:
        results = sweep(args.batch_sizes, args.contexts, H, Hkv, D)
        if args.json:
            args.json.write_text(json.dumps(results))
        return
    print(f"{'context':>8} {'batch':>6} {'CUDA cores':>11} {'tensor cores':>13} {'graph wrapper':>14} "
          f"{'split-KV':>9} {'splits':>7} {'KV TB/s':>8}")
    for context in args.contexts:
        for bs in args.batch_sizes:
            case = Case(bs, context, H, Hkv, D)
            cc = case.flashinfer(tensor_cores=False)
            tc = case.flashinfer(tensor_cores=True)
            tcg = case.flashinfer(tensor_cores=True, graph_wrapper=True)
            sk = case.split_kv()
            kv_bytes = 2 * bs * context * Hkv * D * 2
            print(f"{context:>8} {bs:>6} {cc:>11.2f} {tc:>13.2f} {tcg:>14.2f} {sk:>9.2f} "
                  f"{split_kv_splits(bs, Hkv, case.q.device):>7} {kv_bytes / min(cc, tc, tcg, sk) / 1e6:>8.2f}")
            del case
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

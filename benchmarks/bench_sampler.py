#!/usr/bin/env python3
"""The sampler alone: `Sampler.prepare` + `Sampler.sample` per batch size, for the sampling settings users send.

    python benchmarks/bench_sampler.py                                   # CPU: SmolLM2's vocabulary, fp32, 1 thread
    python benchmarks/bench_sampler.py --device cuda --vocab 151936      # GPU: Qwen3's vocabulary, bf16 logits

What one decode step pays after the LM head: the host work of `prepare` (building the batch's sampling arguments
and copying them to the device) plus the device work of `sample` (and `logprobs`), timed together over --iters
calls: the median of this process's CPU time on CPU (a busy machine inflates wall time, not CPU time much), of
wall time with a synchronize after each call on CUDA. On CUDA a second table gives the GPU time of `sample` (and
`logprobs`) alone, with the arguments prepared once: --iters calls queued behind a sleeping kernel, timed by CUDA events.
That is what a decode step pays when the scheduler overlaps (chapter 11): the host work of the next step's `prepare`
and of launching the kernels runs while the GPU is still busy with the forward. The logits are synthetic but shaped like a language model's: each row
is a random permutation of -log(rank) plus a little noise (Zipf-like); the header prints how many tokens the
top_p=0.9 nucleus at T=0.7 keeps. Every request sits at position 256 with a 256-token context (what the penalties read),
held in a token table on the device and passed to `prepare` as the scheduler passes its own (chapter 11).

Rows: greedy; T=0.7; T=0.7 + top_p=0.9; T=0.7 + top_k=50; the same as the third with a per-request seed;
T=0.7 + top_p=0.9 + presence_penalty; greedy + logprobs (top 5). "vs greedy" divides by the greedy row.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # minisgl from this tree

from minisgl.core import Req, SamplingParams  # noqa: E402
from minisgl.engine import Sampler  # noqa: E402

CONTEXT = 256

SETTINGS = [
    ("greedy", SamplingParams()),
    ("T=0.7", SamplingParams(temperature=0.7)),
    ("T=0.7 top_p=0.9", SamplingParams(temperature=0.7, top_p=0.9)),
    ("T=0.7 top_k=50", SamplingParams(temperature=0.7, top_k=50)),
    ("seeded T=0.7 top_p=0.9", SamplingParams(temperature=0.7, top_p=0.9, seed=1234)),
    ("T=0.7 top_p=0.9 presence=0.5", SamplingParams(temperature=0.7, top_p=0.9, presence_penalty=0.5)),
    ("greedy + logprobs(5)", SamplingParams(logprobs=True, top_logprobs=5)),
]


def zipf_logits(B: int, V: int, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    base = -torch.log(torch.arange(1, V + 1, dtype=torch.float32))  # [V]
    rows = [base[torch.randperm(V, generator=gen)] for _ in range(B)]
    x = torch.stack(rows) + 0.1 * torch.randn(B, V, generator=gen)  # [B, V]
    return x.to(device=device, dtype=dtype)


def make_reqs(B: int, sp: SamplingParams, V: int) -> List[Req]:
    gen = torch.Generator().manual_seed(1)
    reqs = []
    for i in range(B):
        ids = torch.randint(0, V, (CONTEXT,), generator=gen, dtype=torch.int32)
        reqs.append(Req(ids, table_idx=i, cached_len=CONTEXT - 1, output_len=64, uid=i, sampling_params=sp))
    return reqs


def time_ms(fn: Callable[[], None], device: torch.device, iters: int) -> float:
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    for _ in range(3):  # warm-up: FlashInfer JIT, allocator
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    times = []
    for _ in range(iters):
        t0 = clock()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        times.append((clock() - t0) * 1e3)
    return statistics.median(times)


def gpu_ms(fn: Callable[[], None], device: torch.device, iters: int) -> float:
    """The GPU time of one call: iters calls queued while the GPU sleeps (so the host's launch cost is hidden), the
    span between two events around them, divided by iters."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(5e8))  # ~0.25 s at 2 GHz: longer than queueing the calls takes
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, default=49152, help="vocabulary size (49152 SmolLM2, 151936 Qwen3)")
    ap.add_argument("--dtype", default=None, help="logits dtype (default float32 on CPU, bfloat16 on CUDA)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default 1 8 32 (CPU), 1 8 64 256")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per cell (default 20 CPU, 200 CUDA)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--no-flashinfer", action="store_true", help="CUDA: sample every row by race_sample (ch08's kernel)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    sizes = args.batch_sizes or ([1, 8, 64, 256] if cuda else [1, 8, 32])
    iters = args.iters or (200 if cuda else 20)
    V = args.vocab
    sampler = Sampler(device, V, random_seed=0, use_flashinfer=not args.no_flashinfer, dtype=dtype)
    fi = ("inverse CDF for every row" if not cuda else
          "FlashInfer for unseeded rows, race_sample for seeded ones" if sampler._fi is not None else
          "race_sample for every row")

    probe = zipf_logits(1, V, torch.device("cpu"), torch.float32)[0]
    p = (probe / 0.7).softmax(-1).sort(descending=True).values
    nucleus = int((p.cumsum(-1) - p <= 0.9).sum())
    table, gpu_table = {}, {}
    for B in sizes:
        logits = zipf_logits(B, V, device, dtype)
        for name, sp in SETTINGS:
            reqs = make_reqs(B, sp, V)
            pool = torch.stack([r.input_ids for r in reqs]).to(device)  # [B, CONTEXT]：row table_idx = i

            def step() -> None:
                args_ = sampler.prepare(reqs, token_pool=pool)
                tokens = sampler.sample(logits, args_)
                sampler.logprobs(logits, tokens, args_)

            with torch.inference_mode():
                table[name, B] = time_ms(step, device, iters)
                if cuda:
                    prepared = sampler.prepare(reqs, token_pool=pool)
                    gpu_table[name, B] = gpu_ms(
                        lambda: sampler.logprobs(logits, sampler.sample(logits, prepared), prepared), device, iters)

    clock = "wall time" if cuda else "process CPU time"
    print(f"Sampler.prepare + sample on {device} ({fi}), vocab {V}, {dtype} logits, "
          f"{torch.get_num_threads()} thread(s); median {clock} of {iters} calls, and the ratio to greedy; "
          f"T=0.7 top_p=0.9 keeps {nucleus} tokens")
    print_table(table, sizes)
    if cuda:
        print(f"\nGPU time of sample (+ logprobs) alone, arguments prepared once: {iters} calls queued behind a "
              f"sleeping kernel, CUDA events; the ratio to greedy")
        print_table(gpu_table, sizes)


def print_table(table: Dict[Tuple[str, int], float], sizes: List[int]) -> None:
    w = max(len(n) for n, _ in SETTINGS)
    print(f"{'setting':<{w}} " + " ".join(f"{'B=' + str(B):>17}" for B in sizes))
    for name, _ in SETTINGS:
        cells = [f"{table[name, B]:7.3f} ms {table[name, B] / table['greedy', B]:5.1f}x" for B in sizes]
        print(f"{name:<{w}} " + " ".join(f"{c:>17}" for c in cells))


if __name__ == "__main__":
    main()

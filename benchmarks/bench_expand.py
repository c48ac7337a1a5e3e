#!/usr/bin/env python3
"""How long Batch.prepare's per-token expansion takes on the CPU, and how badly it can stall.

    python benchmarks/bench_expand.py [--threads 0 1] [--load 2] [--calls 3000]

Batch.prepare (chapter 11) expands three integers per request (page-table row, cached length, tokens this step)
into a row and a position per token; both come from which request each token belongs to. `repeat_interleave`
gives that in one call, but on the CPU it hands even a few hundred elements to every OpenMP thread (grain size 1)
and waits for the slowest: when the OS has taken one of them off its core, the call stalls for milliseconds.
minisgl's `token_owner` marks each request's first token and takes a prefix sum instead, which stays on one
thread at these sizes.

Each case is timed `--calls` times; the table gives the median, the 99th percentile and the worst call. `--load N`
starts N busy processes for the run (as a GPU server's other processes keep cores busy); `--threads 0` is
PyTorch's default thread count. The Batch.prepare row times the whole of it (CPU page table) for the same batch.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's minisgl
from minisgl.core import Batch, Req, token_owner  # noqa: E402


def owner_repeat(lens: torch.Tensor) -> torch.Tensor:
    return torch.arange(len(lens)).repeat_interleave(lens, output_size=int(lens.sum()))


def owner_minisgl(lens: torch.Tensor) -> torch.Tensor:
    return token_owner(lens.cumsum(0) - lens, int(lens.sum()))


def spin() -> None:
    while True:
        pass


def timed(fn, calls: int) -> str:
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return f"{ts[calls // 2] * 1e6:>7.0f} {ts[int(calls * 0.99)] * 1e6:>8.0f} {ts[-1] * 1e3:>7.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[0, 1], help="torch threads (0: PyTorch's default)")
    ap.add_argument("--load", type=int, default=2, help="busy processes during the run")
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    default_threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    batches = {  # name: tokens this step per request
        "decode, 256 requests": torch.ones(256, dtype=torch.int32),
        "mixed, 64 decode + 512-token prompt": torch.cat([torch.ones(64, dtype=torch.int32), torch.tensor([512])]),
        "prefill, 32 prompts of 100-1024": torch.randint(100, 1025, (32,), dtype=torch.int32, generator=g),
    }
    page_table = torch.zeros(300, 2048, dtype=torch.int32)
    busy = [mp.Process(target=spin, daemon=True) for _ in range(args.load)]
    for p in busy:
        p.start()
    try:
        print(f"{torch.get_num_threads()} default torch threads, {args.load} busy processes, {args.calls} calls each; "
              "µs at the median and the 99th percentile, ms for the worst call")
        print(f"{'batch':<38} {'threads':>7} {'expansion':<17} {'median':>7} {'p99':>8} {'max ms':>7}")
        for name, lens in batches.items():
            B, T = len(lens), int(lens.sum())
            cached = torch.randint(0, 900, (B,), dtype=torch.int32, generator=g)
            assert torch.equal(owner_repeat(lens), owner_minisgl(lens)), "the two expansions differ"
            reqs = [Req(torch.zeros(int(c) + int(n), dtype=torch.int32), i, int(c), 1, i)
                    for i, (c, n) in enumerate(zip(cached, lens))]
            batch = Batch(reqs, "decode" if T == B else "prefill")
            for threads in args.threads:
                torch.set_num_threads(threads or default_threads)
                label = f"{threads or default_threads}"
                for kind, fn in (("repeat_interleave", owner_repeat), ("token_owner", owner_minisgl)):
                    print(f"{name:<38} {label:>7} {kind:<17} {timed(lambda: fn(lens), args.calls)}")
                print(f"{name:<38} {label:>7} {'Batch.prepare':<17} {timed(lambda: batch.prepare(page_table), args.calls)}")
    finally:
        for p in busy:
            p.terminate()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where one eager forward's time goes: a prefill of --tokens tokens (eager: prefill never replays a CUDA graph)
with random weights in a real config, timed (synchronize around it) and profiled with torch.profiler.

    python tools/profile_forward.py [--config tools/configs/qwen3-0.6b.json] [--tokens 64 1024 4096]

Prints, for each size, the median wall time of prepare_batch + forward_batch and the GPU time of the kernels it
launched; then the profiler's table of the smallest size (host-bound if any is), sorted by self CPU time. On a
CPU-only machine it runs the same on cpu with the torch backend (a smoke test; the numbers mean little there).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))  # minisgl from this tree
sys.path.insert(0, str(TOOLS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=TOOLS / "configs" / "qwen3-0.6b.json")
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 1024, 4096])
    ap.add_argument("--rows", type=int, default=25, help="rows of the profiler table")
    args = ap.parse_args()

    from minisgl.core import Batch, Req
    from minisgl.engine import Engine, EngineConfig

    from bench_decode import random_checkpoint

    cuda = torch.cuda.is_available()
    folder = random_checkpoint(args.config, Path(tempfile.mkdtemp(prefix="minisgl-prof-")))
    top = max(args.tokens)
    engine = Engine(EngineConfig(folder, page_size=16, max_running_req=1, max_seq_len_override=top + 16,
                                 num_pages=top // 16 + 4, cuda_graph_max_bs=0))
    engine.page_table[0, : top + 16] = torch.arange(top + 16, dtype=torch.int32)

    def step(n: int) -> None:
        req = Req(torch.randint(0, min(20000, engine.model_config.vocab_size), (n,), dtype=torch.int32), 0, 0, 1, 0)
        batch = Batch([req], "prefill")
        engine.prepare_batch(batch)
        engine.forward_batch(batch, engine.sampler.prepare([req]))

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    print(f"\n{args.config.stem}: one prefill step (prepare_batch + forward_batch, eager), "
          f"{engine.ctx.attn_backend.__class__.__name__}, {engine.dtype}, {engine.device}")
    print("wall: median of 10, synchronized; kernels: GPU time of the kernels launched; ops ms: self CPU time of")
    print("the torch ops (the rest of the wall time is Python between them, or waiting)")
    print(f"{'tokens':>7} {'wall ms':>8} {'kernels ms':>10} {'kernels':>8} {'torch ops':>9} {'ops ms':>7}")
    smallest = None  # the profiler's events of the smallest size: the table printed below
    with torch.inference_mode():
        for n in args.tokens:
            for _ in range(3):
                step(n)
            walls = []
            for _ in range(10):
                sync()
                t0 = time.perf_counter()
                step(n)
                sync()
                walls.append(time.perf_counter() - t0)
            with torch.profiler.profile(activities=acts) as prof:
                step(n)
                sync()
            events = prof.key_averages()
            kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            gpu_ms = sum(e.self_device_time_total for e in kernels) / 1000
            n_kernels = sum(e.count for e in kernels)
            cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
            ops, ops_ms = sum(e.count for e in cpu), sum(e.self_cpu_time_total for e in cpu) / 1000
            print(f"{n:>7} {sorted(walls)[5] * 1000:>8.2f} {gpu_ms:>10.2f} {n_kernels:>8} {ops:>9} {ops_ms:>7.2f}")
            if n == min(args.tokens):
                smallest = events
    n = min(args.tokens)
    print(f"\nprofiler, {n} tokens, sorted by self CPU time (top {args.rows}):")
    print(smallest.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    engine.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

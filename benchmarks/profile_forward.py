#!/usr/bin/env python3
"""Where one forward's time goes, with random weights in a real config, profiled with torch.profiler.

    python benchmarks/profile_forward.py [--config benchmarks/configs/qwen3-0.6b.json] [--tokens 64 1024 4096]
    python benchmarks/profile_forward.py --config benchmarks/configs/qwen3-8b.json --decode 1 64   # needs a GPU
    python benchmarks/profile_forward.py --config benchmarks/configs/qwen3-30b-a3b.json --decode 1 --dummy-weight \
        --num-layers 8   # MoE: random weights made on the GPU from the config alone, no checkpoint on disk

Prefill (default): an eager prefill of --tokens tokens (prefill never replays a CUDA graph), timed (synchronize
around it): the median wall time of prepare_batch + forward_batch and the GPU time of the kernels it launched;
then the profiler's table of the smallest size (host-bound if any is), sorted by self CPU time. On a CPU-only
machine it runs the same on cpu with the torch backend (a smoke test; the numbers mean little there).

Decode (--decode BS...): the decode step of bench_decode (fi, page 16, 512 tokens of context, CUDA graphs on):
forward_batch timed with CUDA events, then 10 replays profiled — the kernels of one step grouped by kind (GEMM,
attention, norm, ...), with their count and GPU time, against the forward's time: what is left is the GPU idle
between kernels. Then the kernels with the most time.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))  # minisgl from this tree
sys.path.insert(0, str(BENCH))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=BENCH / "configs" / "qwen3-0.6b.json")
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 1024, 4096])
    ap.add_argument("--rows", type=int, default=25, help="rows of the profiler table")
    ap.add_argument("--decode", type=int, nargs="+", metavar="BS", help="profile decode steps at these batch sizes")
    ap.add_argument("--context", type=int, default=512, help="decode: tokens of context per request")
    ap.add_argument("--dummy-weight", action="store_true",
                    help="decode: random weights made on the device (no checkpoint written; large configs)")
    ap.add_argument("--num-layers", type=int, default=None, help="decode: cut the config to this many layers")
    args = ap.parse_args()
    if args.decode:
        return profile_decode(args)

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


KINDS = [  # (kind, regex on the lower-cased kernel name): the first match wins
    ("qk_norm_rope_store", r"qk_norm_rope_store"),
    ("moe", r"^(route|align|route_align|gate_up|down|pair_gate_up|pair_down)$"),  # chapter 4's fused MoE kernels (Triton names)
    # FlashInfer's decode/prefill (FA2 and sm90) and merge kernels, torch's SDPA kernels, kernel/decode.py's two
    ("attention", r"batchdecode|prefill|mergestate|attention|flash_fwd|fmha|^split_kv$|^merge$"),
    ("gemm", r"gemm|gemv|nvjet|cutlass|xmma|splitk|cublas"),
    ("norm", r"norm"),
    ("rope", r"rope"),
    ("silu_and_mul", r"silu|act_and_mul"),
    ("kv store / copy", r"index_copy|indexcopy|copy|scatter"),
    ("sampling", r"argmax|sampl|softmax|topk|top_k|reduce|^race_chunk$|^check_chunk$|^race_finish$"),  # + kernel/sample.py
]


def kind_of(kernel: str) -> str:
    """The kind of a CUDA kernel by its name (KINDS; bench_offline.py's profile uses it too)."""
    return next((k for k, rx in KINDS if re.search(rx, kernel.lower())), "other")


def profile_decode(args: argparse.Namespace) -> None:
    from bench_decode import decode_engine, decode_reqs, random_checkpoint

    assert torch.cuda.is_available(), "--decode needs a GPU (fi attention, CUDA graphs)"
    if args.num_layers and not args.dummy_weight:
        raise SystemExit("error: --num-layers needs --dummy-weight (the random checkpoint has every layer)")
    if args.dummy_weight:
        from bench_moe import model_folder  # config.json (cut to --num-layers) and the tokenizer, no weights

        folder = model_folder(args.config, args.num_layers)
    else:
        folder = random_checkpoint(args.config, Path(tempfile.mkdtemp(prefix="minisgl-prof-")))
    max_bs = max(args.decode)
    engine = decode_engine(folder, max_bs, args.context, graphs=max_bs, use_dummy_weight=args.dummy_weight)
    print(f"\n{args.config.stem}: one decode step (forward_batch; CUDA graphs on), fi, {engine.dtype}, "
          f"context {args.context}, {engine.model_config.num_layers} layers")
    graph_sizes = engine.graph_runner.batch_sizes
    for bs in args.decode:
        reqs = decode_reqs(bs, args.context)
        # graphs: the real step; eager (graphs switched off): the same kernels launched one by one, in case the
        # profiler cannot see inside a graph replay (then the graph rows are empty)
        for mode in ("graph", "eager"):
            engine.graph_runner.batch_sizes = graph_sizes if mode == "graph" else []
            profile_decode_step(engine, reqs, args, f"batch {bs}, {mode}")
        engine.graph_runner.batch_sizes = graph_sizes
    engine.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def profile_decode_step(engine, reqs: list, args: argparse.Namespace, title: str) -> None:
    from bench_decode import decode_batch

    def prepare() -> tuple:  # CPU work of a step (not timed below)
        batch = decode_batch(reqs, args.context)
        engine.prepare_batch(batch)
        return batch, engine.sampler.prepare(reqs)

    def step() -> None:
        engine.forward_batch(*prepare())

    with torch.inference_mode():
        for _ in range(5):
            step()
        times = []
        for _ in range(20):
            batch, sargs = prepare()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            engine.forward_batch(batch, sargs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        fwd_us = sorted(times)[len(times) // 2] * 1000
        steps = 10
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_kind: dict = {}
    for e in kernels:
        kind = kind_of(e.key)
        n, us = by_kind.get(kind, (0, 0.0))
        by_kind[kind] = (n + e.count, us + e.self_device_time_total)
    total_n = sum(n for n, _ in by_kind.values()) / steps
    total_us = sum(us for _, us in by_kind.values()) / steps
    print(f"\n{title}: forward {fwd_us:.0f} us (CUDA events, median of 20); kernels {total_us:.0f} us in "
          f"{total_n:.0f} kernels per step; GPU idle between them {fwd_us - total_us:.0f} us "
          f"({(fwd_us - total_us) / max(total_n, 1):.2f} us per kernel)")
    print(f"{'kind':<20} {'kernels':>8} {'us':>8} {'share':>6} {'us each':>8}")
    for kind, (n, us) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"{kind:<20} {n / steps:>8.0f} {us / steps:>8.0f} {us / steps / fwd_us:>6.1%} {us / max(n, 1):>8.2f}")
    print("top kernels, per step:")
    print(f"{'us':>8} {'count':>6} {'us each':>8}  name")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:args.rows]:
        print(f"{e.self_device_time_total / steps:>8.1f} {e.count / steps:>6.0f} "
              f"{e.self_device_time_total / e.count:>8.2f}  {e.key[:100]}")


if __name__ == "__main__":
    main()

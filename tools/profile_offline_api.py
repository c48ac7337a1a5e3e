#!/usr/bin/env python3
"""The offline benchmark's run under the torch profiler: the longest CUDA API calls and the longest torch ops.

    python tools/profile_offline_api.py            # GPU: Qwen3-0.6B config, random bf16 weights, 256 sequences

Same workload and engine settings as `tools/offline_timeline.py --gpu` (overlap on, graphs up to 256, page 16,
16,384-token prefill budget), warmed up with one short request. tools/offline_timeline.py finds the steps whose
launch is slow; this says what inside them was slow: a CUDA call that waited (cudaEventSynchronize is the overlap
scheduler waiting for the last step's tokens, as it should), an allocation (the caching allocator's counters
before and after), or a torch op whose CPU time is far above its usual (the first use of a cuBLAS kernel, an op
that woke every OpenMP thread). Times are inflated by the profiler (the run takes about twice as long).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path[:0] = [str(ROOT), str(TOOLS)]
from bench_offline import random_checkpoint, workload  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=TOOLS / "configs" / "qwen3-0.6b.json")
    ap.add_argument("--rows", type=int, default=30, help="rows in each list")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_offline_api.py needs a CUDA GPU")
    path = random_checkpoint(args.config)
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    prompts, outputs = workload(256, 100, 1024, vocab)
    llm = LLM(str(path), enable_overlap=True, max_running_req=256, device="cuda", page_size=16,
              cuda_graph_max_bs=256, max_extend_tokens=16384)
    llm.generate(["Benchmark: "], SamplingParams(max_tokens=16), use_tqdm=False)  # warm-up
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=k) for k in outputs]
    before = torch.cuda.memory_stats()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
    print(f"timed run under the profiler: {time.perf_counter() - t0:.2f} s")
    after = torch.cuda.memory_stats()
    for key in ("segment.all.allocated", "num_alloc_retries", "reserved_bytes.all.peak", "num_device_alloc"):
        print(key, before.get(key), "->", after.get(key))
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        events = [e for e in json.load(open(f"{tmp}/trace.json"))["traceEvents"] if e.get("ph") == "X"]
    start = min(e["ts"] for e in events)
    kernel_of = {e["args"].get("correlation"): e["name"] for e in events if e.get("cat") == "kernel"}
    api = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: -e["dur"])
    print("longest CUDA API calls: ms, at ms, name, kernel")
    for e in api[:args.rows]:
        kernel = kernel_of.get(e["args"].get("correlation"), "")
        print(f"{e['dur'] / 1000:8.2f} {(e['ts'] - start) / 1000:9.1f}  {e['name'][:40]:40s} {kernel[:90]}")
    total, calls = collections.Counter(), collections.Counter()
    for e in api:
        total[e["name"]] += e["dur"]
        calls[e["name"]] += 1
    print("CUDA API totals: ms, calls, name")
    for name, us in total.most_common(15):
        print(f"{us / 1000:9.2f} {calls[name]:7d}  {name}")
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: -e["dur"])
    print("longest torch ops: ms, at ms, name")
    for e in ops[:args.rows]:
        print(f"{e['dur'] / 1000:8.2f} {(e['ts'] - start) / 1000:9.1f}  {e['name'][:80]}")


if __name__ == "__main__":
    main()

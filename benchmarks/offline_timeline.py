#!/usr/bin/env python3
"""Where the offline benchmark's wall time goes, step by step: the GPU's time per step, the gaps between steps,
and the scheduler's CPU work, by kind of step.

    python benchmarks/offline_timeline.py --gpu [--json steps.json]     # the published size (bench_offline.py --gpu)
    python benchmarks/offline_timeline.py                               # CPU: SmolLM2, 32 sequences (a smoke run)

Same workload and engine settings as `benchmarks/bench_offline.py` (overlap on, graphs up to 256, page 16,
16,384-token prefill budget). Chapter 11's `Timeline` records each step's CPU work (pick the batch, launch it,
process the last step's results) and, on a GPU, CUDA events around the launched work. A step's GPU span runs
from the first to the last of its kernels' events as the GPU reaches them, so a gap between two spans is time the
GPU had nothing queued: it waited for the CPU. CPU spans do not include waiting for the GPU's results.
Python's garbage collections during the run are recorded too (`gc.callbacks`): the five slowest launches say
how much of their time was a collection.
With --profile-api the timed run goes under the torch profiler (its times then run about twice as long), and
the longest CUDA API calls and torch ops are listed: what inside a slow launch was slow (a CUDA call that waited;
cudaEventSynchronize is the overlap scheduler waiting for the last step's tokens, as it should), an allocation
(the caching allocator's counters before and after), or a torch op far above its usual time.
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH), str(ROOT / "examples")]
from bench_offline import random_checkpoint, workload  # noqa: E402
from ch11_overlap import Timeline  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402


class StepTimeline(Timeline):
    """Timeline, plus what each launched step was: decode or mixed, how many requests and tokens."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: List[dict] = []

    def launch(self, batch, last=None):
        """The scheduler (chapter 17 on) hands over the unprocessed previous step and, with no constrained request in
        the batch, processes it right after submitting this one, as chapter 11 does. Done here after chapter 11's
        Timeline.launch, so that submitting and processing stay two spans."""
        assert not self.grammars, "the timeline times unconstrained workloads"
        n_spans = len(self.spans)
        kind = "decode" if batch.is_decode else ("mixed" if any(r.extend_len == 1 for r in batch.reqs) else "prefill")
        tokens = sum(r.extend_len for r in batch.reqs)  # 在 launch 改动长度之前
        step = super().launch(batch)
        lane, a, b = self.spans[n_spans]
        self.steps.append(dict(kind=kind, bs=batch.size, tokens=tokens, launch=(a, b)))
        if last is not None:
            self.process(last)
        return step


def bucket(step: dict) -> str:
    if step["kind"] != "decode":
        return step["kind"]
    bs = step["bs"]
    return "decode bs 1-64" if bs <= 64 else ("decode bs 65-128" if bs <= 128 else "decode bs 129-256")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--gpu", action="store_true", help="Qwen3-0.6B config, random bf16 weights, 256 sequences")
    ap.add_argument("--config", type=Path, default=BENCH / "configs" / "qwen3-0.6b.json")
    ap.add_argument("--json", type=Path, default=None, help="write every step (kind, size, spans) here")
    ap.add_argument("--full-warmup", action="store_true",
                    help="warm up with the whole workload, not one short request: whatever is slow only the first "
                         "time (kernels loaded, memory allocated, graphs first replayed) then stays out of the timing")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() after the warm-up: later collections skip every object alive by then")
    ap.add_argument("--profile-api", action="store_true",
                    help="time the run under the torch profiler and list the longest CUDA API calls and torch ops")
    args = ap.parse_args()
    if args.gpu:
        n, lo, hi, path = 256, 100, 1024, random_checkpoint(args.config)
        kw = dict(device="cuda", page_size=16, cuda_graph_max_bs=256, max_extend_tokens=16384)
    else:
        from minisgl.utils.hf import default_model_path

        torch.set_num_threads(1)
        n, lo, hi, path = 32, 16, 128, default_model_path()
        kw = dict(device="cpu", page_size=1, max_extend_tokens=8192)
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    prompts, outputs = workload(n, lo, hi, vocab)
    llm = StepTimeline(str(path), enable_overlap=True, max_running_req=256, **kw)
    llm.generate(["Benchmark: "], SamplingParams(max_tokens=16), use_tqdm=False)  # warm-up
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=k) for k in outputs]
    if args.full_warmup:
        llm.generate(prompts, params, use_tqdm=False)
        llm.cache.flush()  # 前缀缓存清空：计时的那一次和平常一样从头预填充
    llm.spans.clear()
    llm._gpu.clear()
    llm.steps.clear()
    if args.gc_freeze:
        gc.freeze()
    pauses: List[tuple] = []  # Python 的垃圾回收：(代, 开始, 结束)

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            pauses.append((info["generation"], time.perf_counter(), None))
        else:
            pauses[-1] = (*pauses[-1][:2], time.perf_counter())

    gc.callbacks.append(on_gc)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if llm._cuda else [])
    mem_before = torch.cuda.memory_stats() if llm._cuda else {}
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) if args.profile_api else contextlib.nullcontext() as prof:
        got = llm.generate(prompts, params, use_tqdm=False)
        if llm._cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    gc.callbacks.remove(on_gc)
    assert [len(o["token_ids"]) for o in got] == outputs
    spans = llm.timeline()
    model = sorted((a, b) for lane, a, b in spans if lane == "model")
    assert len(model) == len(llm.steps), (len(model), len(llm.steps))
    cpu = sum(b - a for lane, a, b in spans if lane == "cpu")
    # 每一步：GPU 上的时间、它之前 GPU 的空闲、提交它的 CPU 时间
    rows: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    prev_end = t0
    for st, (a, b) in zip(llm.steps, model):
        st["gpu"], st["idle_before"] = (a, b), max(a - prev_end, 0.0)
        prev_end = max(prev_end, b)
        r = rows[bucket(st)]
        r["steps"] += 1
        r["tokens"] += st["bs"] if st["kind"] == "decode" else st["tokens"]
        r["gpu"] += b - a
        r["idle"] += st["idle_before"]
        r["launch"] += st["launch"][1] - st["launch"][0]
    tail_idle = max(t0 + wall - prev_end, 0.0)
    gpu = sum(b - a for a, b in model)
    out_tokens = sum(outputs)
    print(f"{n} sequences, lengths in [{lo}, {hi}], {sum(map(len, prompts))} prompt + {out_tokens} output tokens; "
          f"{kw['device']}, overlap on")
    print(f"wall {wall:.2f} s ({out_tokens / wall:,.0f} output tok/s), {len(model)} steps; "
          f"GPU busy {gpu:.2f} s ({100 * gpu / wall:.0f}%), idle between steps {wall - gpu:.2f} s; "
          f"scheduler CPU work {cpu:.2f} s ({100 * cpu / wall:.0f}%)")
    print(f"{'step kind':<18} {'steps':>6} {'tokens':>8} {'GPU s':>7} {'GPU ms/step':>11} {'launch ms/step':>14} "
          f"{'GPU idle before s':>17}")
    for name in ("prefill", "mixed", "decode bs 129-256", "decode bs 65-128", "decode bs 1-64"):
        r = rows.get(name)
        if not r:
            continue
        print(f"{name:<18} {r['steps']:>6} {r['tokens']:>8} {r['gpu']:>7.2f} {1e3 * r['gpu'] / r['steps']:>11.2f} "
              f"{1e3 * r['launch'] / r['steps']:>14.2f} {r['idle']:>17.2f}")
    print(f"{'(after the last)':<18} {'':>6} {'':>8} {'':>7} {'':>11} {'':>14} {tail_idle:>17.2f}")
    # CPU work per step against the GPU's: with overlap, a step costs max(the two) when the CPU is the slower one
    per_step_cpu = cpu / max(len(model), 1)
    print(f"scheduler CPU work per step {1e3 * per_step_cpu:.2f} ms on average")
    # 最慢的几次 launch，其中有多少是 Python 的垃圾回收（GC 停顿原样加在那一步的 CPU 时间上）
    launch_s = [b - a for a, b in (st["launch"] for st in llm.steps)]
    for i in sorted(sorted(range(len(launch_s)), key=launch_s.__getitem__, reverse=True)[:5]):
        st, (a, b) = llm.steps[i], llm.steps[i]["launch"]
        in_gc = sum(e - s for g, s, e in pauses if a <= s and e <= b)
        print(f"slow launch: step {i} ({st['kind']}, bs {st['bs']}) {1e3 * (b - a):.1f} ms, "
              f"{1e3 * in_gc:.1f} ms of it in GC")
    for g in range(3):
        d = [e - s for gen, s, e in pauses if gen == g]
        print(f"GC generation {g}: {len(d)} collections, {1e3 * sum(d):.1f} ms in all, "
              f"longest {1e3 * max(d, default=0):.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(dict(wall=wall, steps=[
            dict(kind=s["kind"], bs=s["bs"], tokens=s["tokens"], gpu=[s["gpu"][0] - t0, s["gpu"][1] - t0],
                 launch=[s["launch"][0] - t0, s["launch"][1] - t0]) for s in llm.steps],
            cpu=[(a - t0, b - t0) for lane, a, b in spans if lane == "cpu"],
            gc=[(g, s - t0, e - t0) for g, s, e in pauses])))
    if args.profile_api:
        mem_after = torch.cuda.memory_stats() if llm._cuda else {}
        for key in ("segment.all.allocated", "num_alloc_retries", "num_device_alloc"):
            print(f"{key}: {mem_before.get(key)} -> {mem_after.get(key)}")
        print_api_profile(prof)
    llm.shutdown()


def print_api_profile(prof: torch.profiler.profile, rows: int = 30) -> None:
    """The longest CUDA API calls (with the kernel each launched), the API totals, and the longest torch ops."""
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        events = [e for e in json.load(open(f"{tmp}/trace.json"))["traceEvents"] if e.get("ph") == "X"]
    start = min(e["ts"] for e in events)
    kernel_of = {e["args"].get("correlation"): e["name"] for e in events if e.get("cat") == "kernel"}
    api = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: -e["dur"])
    print("longest CUDA API calls: ms, at ms (from the profiler's start), name, kernel")
    for e in api[:rows]:
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
    for e in ops[:rows]:
        print(f"{e['dur'] / 1000:8.2f} {(e['ts'] - start) / 1000:9.1f}  {e['name'][:80]}")


if __name__ == "__main__":
    main()

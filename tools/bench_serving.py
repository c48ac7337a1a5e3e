#!/usr/bin/env python3
"""Online serving benchmark: N concurrent clients against a `python -m minisgl` server (the official OpenAI client).

    python tools/bench_serving.py [--url http://127.0.0.1:1919] [--model PATH] [--concurrency 16]
                                  [--num-requests 32] [--input-len 64] [--output-len 32] [--hf-baseline | --no-hf-baseline]

Without --url it starts `python -m minisgl --model PATH` on a free port (its own process group) and kills it at
the end. Every request streams a /v1/completions answer of exactly --output-len tokens (ignore_eos) for a prompt of
about --input-len tokens (seeded random words), --concurrency of them in flight at a time. Reported: TTFT (time
to the first streamed chunk), TPOT (time per output token after the first), end-to-end latency (p50/p90/p99), and
output-token / request throughput. On a CPU (or with --hf-baseline) the same prompts are then generated with
transformers in this process, one request at a time (greedy `generate`, same output length): what serving with
a plain loop over requests gives. The ratio is minisgl's output throughput over that one.

Where the time goes: the CPU seconds each process spent during the measured run — this client, and, when the
server was started here, each process of its group (API server, scheduler, detokenizer, tokenizers, named by
launch.py's start order; Linux only: it reads /proc) — as a share of the wall time. A process near 100% of one core is the
bottleneck of the pipeline, whatever the GPU could do.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex every jolly "
         "merchant selling fresh bread in the old market near river bank").split()


@dataclass
class Result:
    ttft: float  # seconds to the first chunk
    e2e: float  # seconds to the last chunk
    output_tokens: int

    @property
    def tpot(self) -> float:
        return (self.e2e - self.ttft) / max(self.output_tokens - 1, 1)


def make_prompts(n: int, input_len: int, seed: int = 0) -> List[str]:
    rng = random.Random(seed)
    return [f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(input_len - 4)) for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, extra: List[str], log: Path) -> Tuple[subprocess.Popen, str]:
    """python -m minisgl in its own process group, output to `log`; the caller waits for it (wait_ready)."""
    port = free_port()
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "minisgl", "--model", model, "--port", str(port), *extra],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout: float = 600) -> None:
    import httpx

    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            sys.exit(f"bench_serving: the server exited with code {proc.returncode}; the end of its log:\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            sys.exit(f"bench_serving: the server did not start within {timeout:.0f} s (log: {log})")
        time.sleep(0.3)


async def run_clients(url: str, prompts: List[str], output_len: int, concurrency: int,
                      api_key: str) -> Tuple[List[Result], float]:
    from openai import AsyncOpenAI
    from tqdm.auto import tqdm

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=3600)
    sem = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(prompts), desc=f"minisgl x{concurrency}")

    async def one(prompt: str) -> Result:
        async with sem:
            t0 = time.perf_counter()
            ttft, tokens = None, 0
            stream = await client.completions.create(
                model="bench", prompt=prompt, max_tokens=output_len, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            async for chunk in stream:
                if ttft is None and chunk.choices:
                    ttft = time.perf_counter() - t0
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            bar.update(1)
            assert ttft is not None and tokens == output_len, (ttft, tokens)
            return Result(ttft, time.perf_counter() - t0, tokens)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - t0
    bar.close()
    return list(results), wall


def hf_baseline(model: str, prompts: List[str], output_len: int) -> Tuple[List[float], float]:
    """transformers, one request at a time: the same prompts, exactly output_len greedy tokens each."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    lat = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for p in tqdm(prompts, desc="transformers x1"):
            ids = torch.tensor([tok.encode(p)])
            t = time.perf_counter()
            out = m.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False)
            assert out.shape[1] - ids.shape[1] == output_len
            lat.append(time.perf_counter() - t)
    return lat, time.perf_counter() - t0


def group_cpu(pgid: int) -> Dict[int, Tuple[str, float, int]]:
    """pid -> (command line, user+system CPU seconds, start tick) of every live process in process group pgid."""
    if not os.path.isdir("/proc"):  # not Linux: the report then has this client only
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        f = stat[stat.rindex(")") + 2:].split()  # fields 3.. of proc(5): state ppid pgrp ... utime(14) stime(15)
        if int(f[2]) == pgid:
            out[int(pid)] = (cmd, (int(f[11]) + int(f[12])) / tick, int(f[19]))
    return out


def server_roles(pgid: int, procs: Dict[int, Tuple[str, float, int]], server_args: str) -> Dict[int, str]:
    """Names for the server's processes: the main one is the API server; the spawned workers start in
    launch.py's order (schedulers, detokenizer, tokenizers) — named so only for the default single-GPU layout."""
    roles = {pgid: "API server (main)"}
    workers = sorted((start, pid) for pid, (cmd, _, start) in procs.items() if "spawn_main" in cmd)
    names = [f"worker {i + 1}" for i in range(len(workers))]
    if "--tp" not in server_args and len(workers) >= 2:
        names = ["scheduler", "detokenizer" if len(workers) > 2 else "(de)tokenizer"]  # --num-tokenizer 0: one
        names += [f"tokenizer {i}" for i in range(len(workers) - 2)]  # process tokenizes and detokenizes
    roles.update({pid: name for (_, pid), name in zip(workers, names)})
    for pid, (cmd, _, _) in procs.items():
        roles.setdefault(pid, "resource tracker" if "resource_tracker" in cmd else f"other ({cmd[:40]})")
    return roles


def pct(xs: List[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server; default: start one")
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2)")
    ap.add_argument("--random-config", type=Path, default=None,
                    help="instead of --model: random bf16 weights in this config (e.g. tools/configs/qwen3-0.6b.json; "
                         "made on the GPU, Qwen3's tokenizer)")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64, help="about this many prompt tokens")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--hf-baseline", action=argparse.BooleanOptionalAction, default=None,
                    help="also run transformers one request at a time (default: on a CPU-only machine)")
    ap.add_argument("--server-args", default="", help="extra flags for python -m minisgl, one string")
    args = ap.parse_args()
    if args.concurrency < 1 or args.num_requests < 1 or args.output_len < 2 or args.input_len < 5:
        ap.error("--concurrency and --num-requests must be >= 1, --output-len >= 2, --input-len >= 5")

    from minisgl.utils.hf import resolve_model_path

    tmp = None
    if args.random_config:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_offline import random_checkpoint

        model = str(random_checkpoint(args.random_config))
        tmp = model
    else:
        model = str(resolve_model_path(args.model))
    prompts = make_prompts(args.num_requests, args.input_len)
    proc = None
    url = args.url
    # SIGTERM (e.g. from `timeout`) exits through the finally below, which takes the server's process group down too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if url is None:
            log = Path(tempfile.mkdtemp(prefix="minisgl-bench-serving-")) / "server.log"
            proc, url = start_server(model, args.server_args.split(), log)
            wait_ready(proc, url, log)
        asyncio.run(run_clients(url, prompts[: args.concurrency], args.output_len, args.concurrency,
                                args.api_key))  # warm-up
        before = group_cpu(proc.pid) if proc is not None else {}
        me0 = time.process_time()
        results, wall = asyncio.run(run_clients(url, prompts, args.output_len, args.concurrency, args.api_key))
        cpu = [("this client", time.process_time() - me0)]
        if proc is not None:
            after = group_cpu(proc.pid)
            roles = server_roles(proc.pid, after, args.server_args)
            cpu += [(roles[pid], sec - before.get(pid, ("", 0.0, 0))[1]) for pid, (_, sec, _) in after.items()]
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):  # the server may have died already
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if tmp:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)

    tokens = sum(r.output_tokens for r in results)
    rows = [("TTFT (s)", [r.ttft for r in results]), ("TPOT (ms)", [r.tpot * 1000 for r in results]),
            ("E2E (s)", [r.e2e for r in results])]
    name = f"random {args.random_config.stem}" if args.random_config else Path(model).name
    print(f"\nmodel {name}, {args.num_requests} requests, {args.concurrency} concurrent, "
          f"~{args.input_len} prompt tokens, {args.output_len} output tokens each")
    print(f"{'metric':<12}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name, xs in rows:
        print(f"{name:<12}{statistics.mean(xs):>10.3f}{pct(xs, 50):>10.3f}{pct(xs, 90):>10.3f}{pct(xs, 99):>10.3f}")
    ours = tokens / wall
    print(f"minisgl: {wall:.1f} s, {ours:.1f} output tok/s, {len(results) / wall:.2f} req/s")
    print(f"CPU time during the run ({wall:.1f} s wall), as a share of one core:")
    for role, sec in sorted(cpu, key=lambda x: -x[1]):
        print(f"  {role:<20}{sec:>8.1f} s {sec / wall:>6.0%}")

    use_hf = args.hf_baseline
    if use_hf is None:
        import torch

        use_hf = not torch.cuda.is_available()
    if use_hf:
        lat, hf_wall = hf_baseline(model, prompts, args.output_len)
        hf = tokens / hf_wall
        print(f"transformers, one request at a time: {hf_wall:.1f} s, {hf:.1f} output tok/s, "
              f"E2E p50 {pct(lat, 50):.3f} s")
        print(f"minisgl / transformers throughput: {ours / hf:.2f}x")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Online serving benchmark: N concurrent clients against a `python -m minisgl` server (the official OpenAI client).

    python benchmarks/bench_serving.py [--url http://127.0.0.1:1919] [--model PATH] [--concurrency 16]
                                  [--num-requests 32] [--input-len 64] [--output-len 32 | --lengths 16 128]
                                  [--client-procs N] [--rounds N]
                                  [--sampling greedy|sampled|both] [--max-tokens-unset]
                                  [--hf-baseline | --no-hf-baseline]

Without --url it starts `python -m minisgl --model PATH` on a free port (its own process group) and kills it at
the end. With --peer DIR it starts upstream mini-sglang's server from DIR (its python/ folder, git-ignored, as for
benchmarks/bench_peer.py) instead, with dummy weights in --random-config, and streams the same prompts through the
endpoint it has (/v1/chat/completions with a raw `prompt`; it reports no usage, so each answer counts --output-len
tokens, which ignore_eos makes exact). Every request streams a /v1/completions answer of exactly --output-len tokens (ignore_eos) for a prompt of
about --input-len tokens (seeded random words), --concurrency of them in flight at a time; with --lengths LO HI each
request's prompt and output lengths are instead drawn uniform in [LO, HI] (bench_offline's protocol). Reported: TTFT (time
to the first streamed chunk), TPOT (time per output token after the first), end-to-end latency (p50/p90/p99), and
output-token / request throughput. --sampling picks the workload: greedy (temperature 0), sampled (temperature 0.7,
top_p 0.9), or both, one after the other on the same server. --max-tokens-unset sends /v1/chat/completions without
max_tokens and without ignore_eos instead: every answer runs to its EOS or to the end of the context, as a chat client
that never sets max_tokens does (the output length then varies per request). With --client-procs N the measured run is shared by N processes, so that one Python
event loop parsing every stream does not set the pace. On a CPU (or with --hf-baseline) the same prompts are then generated with
transformers in this process, greedy `generate` with the same output length, twice: one request at a time (what
serving with a plain loop over requests gives) and in static batches of --concurrency (left padding, every row of a batch runs to the batch's
longest output and only its own count is credited: what a batch job with plain transformers gives). Each line ends with minisgl's output throughput over that one. --rounds N repeats
the measured run (each round with its own prompts, so no round reuses another's prefix cache), and then each
transformers baseline on the same N prompt sets; the tables show minisgl's round of median throughput, and the ratios
compare median rounds (on a 2-core machine, runs of the same work differ by a fifth).

Where the time goes: the CPU seconds each process spent during the measured run — each client process, and, when the
server was started here, each process of its group (API server, scheduler, detokenizer, tokenizers, named by
launch.py's start order; Linux only: it reads /proc) — as a share of the wall time. A process near 100% of one core is the
bottleneck of the pipeline, whatever the GPU could do. --stages (with a server started here) also splits the way of
every measured request to its first token inside the server into stages (API server, tokenizer, scheduler, prefill,
detokenizer): benchmarks/ttft_stages/ wraps a few methods in each server process, the engine is unchanged.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple, TypeVar

ROOT = Path(__file__).resolve().parent.parent  # minisgl from this tree, here and in the server it starts
STAGES_DIR = Path(__file__).resolve().parent / "ttft_stages"  # --stages: the server's sitecustomize.py
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex every jolly "
         "merchant selling fresh bread in the old market near river bank").split()


SAMPLING = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.7, "top_p": 0.9}}


@dataclass
class Result:
    ttft: float  # seconds to the first chunk
    e2e: float  # seconds to the last chunk
    output_tokens: int

    @property
    def tpot(self) -> float:
        return (self.e2e - self.ttft) / max(self.output_tokens - 1, 1)


Job = Tuple[str, int]  # (prompt, output tokens it asks for)


def make_jobs(n: int, input_len: int, output_len: int, seed: int = 0, tag: str = "Request",
              lengths: Tuple[int, int] | None = None) -> List[Job]:
    """n prompts of seeded random words, each about input_len tokens and asking for output_len tokens; with
    lengths=(lo, hi) each request's prompt and output length are drawn uniform in [lo, hi] instead (bench_offline's
    protocol, here with words: a word and its space are about one token)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        k, out = (rng.randint(*lengths), rng.randint(*lengths)) if lengths else (input_len, output_len)
        jobs.append((f"{tag} {i}: " + " ".join(rng.choice(WORDS) for _ in range(max(k - 4, 1))), out))
    return jobs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, extra: List[str], log: Path, trace_dir: Path | None = None,
                 peer: Path | None = None) -> Tuple[subprocess.Popen, str]:
    """python -m minisgl in its own process group, output to `log`; the caller waits for it (wait_ready).
    trace_dir: every server process records each request's stages there (benchmarks/ttft_stages/sitecustomize.py).
    peer: upstream's python/ folder: its server instead, with dummy weights (`model` holds a config and a tokenizer)."""
    port = free_port()
    # PYTHONSAFEPATH (Python 3.11+): `-m` would put the working directory first, and a minisgl there would win
    shim = [str(STAGES_DIR)] if trace_dir is not None else []
    first = [str(peer.resolve())] + [str(d) for d in [peer.resolve().parent / "sgl_kernel_shim"] if d.is_dir()] \
        if peer is not None else [*shim, str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [*first, os.environ.get("PYTHONPATH")])),
           "PYTHONSAFEPATH": "1", **({"TTFT_TRACE_DIR": str(trace_dir)} if trace_dir is not None else {})}
    cmd = ["--model-path", model, "--dummy-weight"] if peer is not None else ["--model", model]
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "minisgl", *cmd, "--port", str(port), *extra],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return proc, f"http://127.0.0.1:{port}"


class ClientFailed(Exception):
    """A client process of the measured run failed (its error is in the message)."""


def log_tail(log: Path, n: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout: float = 600, path: str = "/health") -> None:
    import httpx

    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            sys.exit(f"bench_serving: the server exited with code {proc.returncode}; the end of its log:\n"
                     f"{log_tail(log)}")
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            sys.exit(f"bench_serving: the server did not start within {timeout:.0f} s (log: {log})")
        time.sleep(0.3)


async def run_clients(url: str, jobs: List[Job], concurrency: int, api_key: str,
                      workload: str = "greedy", chat_unset: bool = False, on_done=None,
                      upstream: bool = False) -> Tuple[List[Result], float]:
    """Stream every job's prompt, at most `concurrency` in flight; on_done() after each finished request.
    chat_unset: /v1/chat/completions without max_tokens or ignore_eos (each answer runs to EOS or a full context).
    upstream: upstream's server (its chat endpoint takes a raw `prompt` when `messages` is empty; no usage)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=3600)
    sem = asyncio.Semaphore(concurrency)
    kw = dict(model="bench", stream=True, **SAMPLING[workload])
    if not upstream:  # upstream's server has no stream_options (and reports no usage)
        kw["stream_options"] = {"include_usage": True}

    async def one(prompt: str, output_len: int) -> Result:
        async with sem:
            t0 = time.perf_counter()
            ttft, tokens = None, 0
            if upstream:
                stream = await client.chat.completions.create(messages=[], max_tokens=output_len, extra_body={
                    "prompt": prompt, "ignore_eos": True}, **kw)
                tokens = output_len
            elif chat_unset:
                stream = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kw)
            else:
                stream = await client.completions.create(prompt=prompt, max_tokens=output_len,
                                                         extra_body={"ignore_eos": True}, **kw)
            async for chunk in stream:
                if ttft is None and chunk.choices:
                    ttft = time.perf_counter() - t0
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            if on_done is not None:
                on_done()
            assert ttft is not None and tokens > 0 and (chat_unset or tokens == output_len), (ttft, tokens)
            return Result(ttft, time.perf_counter() - t0, tokens)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(p, n) for p, n in jobs))
    wall = time.perf_counter() - t0
    await client.close()  # before asyncio.run closes the loop: otherwise its connections are closed on a dead loop
    return list(results), wall


def _client_proc(url: str, jobs: List[Job], concurrency: int, api_key: str, workload: str,
                 chat_unset: bool, upstream: bool, go, done, out) -> None:
    """One client process (spawned): waits at `go` for the others, runs its share, sends (results, start, end, CPU seconds)."""
    import openai  # noqa: F401  imported before the start line, not inside the measured time

    def bump() -> None:
        with done.get_lock():
            done.value += 1

    go.wait()
    cpu0, t0 = time.process_time(), time.monotonic()
    try:
        results, _ = asyncio.run(run_clients(url, jobs, concurrency, api_key, workload, chat_unset, bump, upstream))
        rows = [(r.ttft, r.e2e, r.output_tokens) for r in results]  # plain tuples: Result lives in __main__
        out.put((rows, t0, time.monotonic(), time.process_time() - cpu0))
    except BaseException as e:  # the parent must not wait forever for this share
        out.put(f"{type(e).__name__}: {e}")
        raise


def run_measured(url: str, jobs: List[Job], concurrency: int, api_key: str,
                 procs: int, workload: str = "greedy", chat_unset: bool = False,
                 upstream: bool = False) -> Tuple[List[Result], float, List[float]]:
    """The measured run over `procs` client processes (request i goes to process i % procs, each with its share
    of the concurrency): (results, wall seconds from the common start to the last answer, CPU seconds per
    client process). One process runs in this one; several are spawned, so that no single Python event loop
    parsing every SSE stream limits what is measured."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc=f"{'upstream' if upstream else 'minisgl'} {workload} x{concurrency}")
    if procs == 1:
        cpu0 = time.process_time()
        results, wall = asyncio.run(run_clients(url, jobs, concurrency, api_key, workload, chat_unset,
                                                lambda: bar.update(1), upstream))
        bar.close()
        return results, wall, [time.process_time() - cpu0]
    ctx = mp.get_context("spawn")
    go, done, out = ctx.Barrier(procs + 1), ctx.Value("i", 0), ctx.Queue()  # go: all start together
    shares = [(jobs[i::procs], concurrency // procs + (i < concurrency % procs)) for i in range(procs)]
    workers = [ctx.Process(target=_client_proc, args=(url, ps, c, api_key, workload, chat_unset, upstream, go, done,
                                                      out), daemon=True) for ps, c in shares]
    for w in workers:
        w.start()
    try:
        go.wait(timeout=120)  # every client has imported its libraries
    except threading.BrokenBarrierError:
        raise ClientFailed("a client process did not start") from None
    parts = []
    while len(parts) < procs:
        try:
            part = out.get(timeout=0.2)
        except queue.Empty:
            bar.update(done.value - bar.n)
            if any(w.exitcode not in (None, 0) for w in workers) and out.empty():  # finished ones exit with 0
                raise ClientFailed("a client process died")
            continue
        if isinstance(part, str):
            raise ClientFailed(f"a client process failed: {part}")
        parts.append(part)
    bar.update(done.value - bar.n)
    bar.close()
    for w in workers:
        w.join()
    results = [Result(*row) for part in parts for row in part[0]]
    return results, max(p[2] for p in parts) - min(p[1] for p in parts), [p[3] for p in parts]


def load_hf(model: str):
    """transformers' model on the server's device and dtype (bf16 on a GPU), with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
    return AutoTokenizer.from_pretrained(model), m.to(dev).eval()


def hf_baseline(hf, jobs: List[Job], batch: int = 1) -> Tuple[List[float], float]:
    """transformers (load_hf) on the same jobs, greedy: one request at a time (batch 1), or static batches of
    `batch` in submission order (left padding; every row of a batch runs to the batch's longest output and finishes
    with it, as bench_offline's static baseline: the caller credits each job its own count only)."""
    import torch
    from tqdm.auto import tqdm

    tok, m = hf
    dev = m.device
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    lat = []
    with torch.inference_mode():
        m.generate(torch.tensor([tok.encode(jobs[0][0])[:8]], device=dev), max_new_tokens=2, do_sample=False,
                   pad_token_id=pad)  # warm-up
        t0 = time.perf_counter()
        for i in tqdm(range(0, len(jobs), batch), desc=f"transformers x{batch}"):
            rows = [tok.encode(p) for p, _ in jobs[i:i + batch]]
            output_len = max(n for _, n in jobs[i:i + batch])
            L = max(len(r) for r in rows)
            ids = torch.tensor([[pad] * (L - len(r)) + r for r in rows])
            mask = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows])
            t = time.perf_counter()
            out = m.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=output_len,
                             min_new_tokens=output_len, do_sample=False, pad_token_id=pad)
            assert out.shape[1] - L == output_len
            if dev.type == "cuda":
                torch.cuda.synchronize()
            lat += [time.perf_counter() - t] * len(rows)
        return lat, time.perf_counter() - t0


def stat_fields(pid: int) -> List[str]:
    """Fields 3.. of /proc/<pid>/stat (proc(5)): state ppid pgrp ... utime(14) stime(15) ... starttime(22)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()


def cpu_seconds(fields: List[str]) -> float:
    """User + system CPU seconds from stat_fields."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_cpu(pgid: int) -> Dict[int, Tuple[str, float, int]]:
    """pid -> (command line, user+system CPU seconds, start tick) of every live process in process group pgid."""
    if not os.path.isdir("/proc"):  # not Linux: the report then has this client only
        return {}
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            f = stat_fields(int(pid))
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if int(f[2]) == pgid:
            out[int(pid)] = (cmd, cpu_seconds(f), int(f[19]))
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


T = TypeVar("T")


def median_round(runs: List[T], rate: Callable[[T], float]) -> T:
    """The run of median throughput, output tokens per second (the middle one; the faster middle one of an even
    count): the rounds of one engine are compared as whole runs, so that its latency table and its throughput come
    from the same round. Throughput, not wall time: with --lengths each round asks for its own number of tokens."""
    return sorted(runs, key=rate, reverse=True)[(len(runs) - 1) // 2]


def pct(xs: List[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


# --stages: (from, to, label) per row; each stage is recorded by benchmarks/ttft_stages/sitecustomize.py
STAGES = [("api_recv", "api_sent", "API server: request -> sending"),
          ("api_sent", "tok_start", "sending -> tokenizer starts"), ("tok_start", "tok_done", "tokenize"),
          ("tok_done", "sched_recv", "tokenizer -> scheduler receives"),
          ("sched_recv", "launch", "scheduler: received -> launched"),
          ("launch", "sched_first", "launched -> first token sent"),
          ("sched_first", "detok", "scheduler -> detokenizer reply"), ("detok", "api_reply", "detokenizer -> API server"),
          ("api_recv", "api_reply", "inside the server, in all")]


def stage_table(trace_dir: Path, first: int = 0, count: int | None = None, since: float = 0.0,
                until: float = float("inf")) -> str:
    """The --stages table from the <pid>.txt files in trace_dir: requests with uid >= first whose API server got them
    in [since, until], at most count of them; mean / p50 / p90 ms per stage."""
    events: Dict[int, Dict[str, float]] = {}
    for f in sorted(trace_dir.glob("*.txt")):
        for line in f.read_text().splitlines():
            uid, stage, t = line.split()
            events.setdefault(int(uid), {}).setdefault(stage, float(t))
    wanted = [u for u in sorted(events) if u >= first and since <= events[u].get("api_recv", -1.0) <= until][:count]
    if not wanted:
        raise SystemExit(f"bench_serving --stages: no request in {trace_dir} was selected")
    rows = STAGES
    if not any("api_sent" in events[u] for u in wanted):  # traced before the tracer recorded api_sent
        rows = [("api_recv", "tok_start", "API server -> tokenizer starts")] + STAGES[2:]
    stages = {s for a, b, _ in rows for s in (a, b)}
    done = [u for u in wanted if stages <= events[u].keys()]
    if not done:
        raise SystemExit(f"bench_serving --stages: no request in {trace_dir} went through every stage")
    lines = [f"where the first token waits, inside the server: {len(done)} of {len(wanted)} requests traced "
             f"through every stage (uids {wanted[0]}..{wanted[-1]})",
             f"{'stage':<36}{'mean ms':>9}{'p50':>8}{'p90':>8}"]
    for a, b, label in rows:
        xs = [1e3 * (events[u][b] - events[u][a]) for u in done]
        lines.append(f"{label:<36}{statistics.mean(xs):>9.1f}{pct(xs, 50):>8.1f}{pct(xs, 90):>8.1f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server; default: start one")
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2)")
    ap.add_argument("--random-config", type=Path, default=None,
                    help="instead of --model: random bf16 weights in this config (e.g. benchmarks/configs/qwen3-0.6b.json; "
                         "made on the GPU, Qwen3's tokenizer)")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64, help="about this many prompt tokens")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--lengths", type=int, nargs=2, metavar=("LO", "HI"), default=None,
                    help="instead of --input-len/--output-len: each request's prompt and output lengths uniform in "
                         "[LO, HI] (seeded; bench_offline's protocol, e.g. 16 128)")
    ap.add_argument("--hf-baseline", action=argparse.BooleanOptionalAction, default=None,
                    help="also run transformers one request at a time (default: on a CPU-only machine)")
    ap.add_argument("--server-args", default="", help="extra flags for python -m minisgl, one string")
    ap.add_argument("--sampling", choices=["greedy", "sampled", "both"], default="greedy",
                    help="greedy: temperature 0; sampled: temperature 0.7, top_p 0.9; both: one after the other")
    ap.add_argument("--max-tokens-unset", action="store_true",
                    help="/v1/chat/completions without max_tokens or ignore_eos: answers run to EOS or a full context")
    ap.add_argument("--client-procs", type=int, default=1,
                    help="client processes sharing the requests and the concurrency (one Python process tops out at "
                         "about 7,000 streamed tokens/s on the H200 machine's CPU)")
    ap.add_argument("--peer", type=Path, default=None,
                    help="upstream mini-sglang's python/ folder: start its server instead (dummy weights in "
                         "--random-config), e.g. .peer/python; --server-args then go to it (default: --attn fi "
                         "--page-size 256, as benchmarks/bench_peer.py runs it)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the measured run (new prompts each round) and the transformers baselines this many "
                         "times; report medians")
    ap.add_argument("--stages", action="store_true",
                    help="also split each measured request's time to its first token into stages inside the server")
    args = ap.parse_args()
    if args.stages and args.url:
        ap.error("--stages needs a server started here (no --url): it installs a tracer in the server's processes")
    if args.peer is not None:
        if args.url or args.stages or args.max_tokens_unset or not args.random_config:
            ap.error("--peer needs --random-config, and no --url, --stages or --max-tokens-unset")
        if not (args.peer / "minisgl").is_dir():
            ap.error(f"--peer {args.peer}: no minisgl package there (put upstream's python/ folder there)")
        args.server_args = args.server_args or "--attn fi --page-size 256"
    if args.concurrency < 1 or args.num_requests < 1 or args.output_len < 2 or args.input_len < 5:
        ap.error("--concurrency and --num-requests must be >= 1, --output-len >= 2, --input-len >= 5")
    if args.lengths and not 5 <= args.lengths[0] <= args.lengths[1]:
        ap.error(f"--lengths {args.lengths[0]} {args.lengths[1]}: need 5 <= LO <= HI")
    if args.lengths and args.max_tokens_unset:
        ap.error("--lengths sets each request's max_tokens; --max-tokens-unset sends none")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds} must be >= 1")
    if not 1 <= args.client_procs <= min(args.concurrency, args.num_requests):
        ap.error(f"--client-procs {args.client_procs} must be between 1 and --concurrency / --num-requests")

    sys.path.insert(0, str(ROOT))
    from minisgl.utils.hf import resolve_model_path

    tmp = None
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_peer, bench_offline
    if args.peer is not None:  # a config and Qwen3's tokenizer: upstream makes the dummy weights itself
        from bench_peer import model_dir

        model = str(model_dir(args.peer.resolve().parent / args.random_config.stem, args.random_config))
    elif args.random_config:
        from bench_offline import random_checkpoint

        model = str(random_checkpoint(args.random_config))
        tmp = model
    else:
        model = str(resolve_model_path(args.model))
    # 每轮一组提示词：第一轮的种子 0，之后 2、3……（1 是预热的），谁也不沾别人的前缀缓存
    lengths = tuple(args.lengths) if args.lengths else None
    rounds = [make_jobs(args.num_requests, args.input_len, args.output_len, seed=r + 1 if r else 0, lengths=lengths)
              for r in range(args.rounds)]
    warmup = make_jobs(args.concurrency, args.input_len, args.output_len, seed=1, tag="Warm-up", lengths=lengths)  # 和计时的提示词不同：预热不给前缀缓存铺路
    proc = None
    url = args.url
    # SIGTERM (e.g. from `timeout`) exits through the finally below, which takes the server's process group down too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if url is None:
            log = Path(tempfile.mkdtemp(prefix="minisgl-bench-serving-")) / "server.log"
            trace_dir = log.parent / "stages" if args.stages else None
            if args.stages:
                trace_dir.mkdir()
            proc, url = start_server(model, args.server_args.split(), log, trace_dir, args.peer)
            wait_ready(proc, url, log, path="/v1/models" if args.peer else "/health")
        runs = []  # (workload, results, wall, cpu, the --stages table or None) per workload and round
        for workload, jobs in [(w, j) for w in (["greedy", "sampled"] if args.sampling == "both" else [args.sampling])
                               for j in rounds]:
            if jobs is rounds[0]:
                asyncio.run(run_clients(url, warmup, args.concurrency, args.api_key, workload, args.max_tokens_unset,
                                        upstream=args.peer is not None))  # warm-up
            before = group_cpu(proc.pid) if proc is not None else {}
            since = time.time()
            try:
                results, wall, client_cpu = run_measured(url, jobs, args.concurrency, args.api_key,
                                                         args.client_procs, workload, args.max_tokens_unset,
                                                         args.peer is not None)
            except ClientFailed as e:
                sys.exit(f"bench_serving: {e}" + (f"; the end of the server's log:\n{log_tail(log, 60)}" if proc else ""))
            cpu = [(f"client {i}" if len(client_cpu) > 1 else "this client", sec) for i, sec in enumerate(client_cpu)]
            if proc is not None:
                after = group_cpu(proc.pid)
                roles = server_roles(proc.pid, after, args.server_args)
                cpu += [(roles[pid], sec - before.get(pid, ("", 0.0, 0))[1]) for pid, (_, sec, _) in after.items()]
            stages = stage_table(trace_dir, since=since, until=time.time()) if args.stages else None
            runs.append((workload, results, wall, cpu, stages))
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):  # the server may have died already
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if tmp:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)

    name = f"random {args.random_config.stem}" if args.random_config else Path(model).name
    output = ("chat, max_tokens unset (to EOS)" if args.max_tokens_unset else
              f"output tokens uniform in [{lengths[0]}, {lengths[1]}] each" if lengths else
              f"{args.output_len} output tokens each")
    prompt_len = f"prompt tokens uniform in ~[{lengths[0]}, {lengths[1]}]" if lengths else f"~{args.input_len} prompt tokens"
    by_workload: Dict[str, list] = {}
    for run in runs:
        by_workload.setdefault(run[0], []).append(run)

    def rate(run) -> float:  # output tokens per second of one measured run
        return sum(r.output_tokens for r in run[1]) / run[2]

    shown = [median_round(group, rate) for group in by_workload.values()]
    for group in by_workload.values():
        if len(group) > 1:
            rates = ", ".join(f"{rate(run):.1f}" for run in group)
            print(f"\n{group[0][0]}: {len(group)} rounds, output tok/s {rates} (in round order); the tables below "
                  "are the median round")
    for workload, results, wall, cpu, stages in shown:
        tokens = sum(r.output_tokens for r in results)
        rows = [("TTFT (s)", [r.ttft for r in results]), ("TPOT (ms)", [r.tpot * 1000 for r in results]),
                ("E2E (s)", [r.e2e for r in results])]
        print(f"\nmodel {name}, {workload} ({', '.join(f'{k} {v}' for k, v in SAMPLING[workload].items())}), "
              f"{args.num_requests} requests, {args.concurrency} concurrent, {prompt_len}, {output}, "
              f"{args.client_procs} client process{'es' if args.client_procs > 1 else ''}")
        print(f"{'metric':<12}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
        for row, xs in rows:
            print(f"{row:<12}{statistics.mean(xs):>10.3f}{pct(xs, 50):>10.3f}{pct(xs, 90):>10.3f}{pct(xs, 99):>10.3f}")
        ours = tokens / wall
        print(f"{'upstream @20fcd7f' if args.peer else 'minisgl'}: {wall:.1f} s, {tokens} output tokens, "
              f"{ours:.1f} output tok/s, {len(results) / wall:.2f} req/s")
        print(f"CPU time during the run ({wall:.1f} s wall), as a share of one core:")
        for role, sec in sorted(cpu, key=lambda x: -x[1]):
            print(f"  {role:<20}{sec:>8.1f} s {sec / wall:>6.0%}")
        if stages is not None:
            print(stages)
    workload, results, wall, _, _ = shown[0]
    tokens = sum(r.output_tokens for r in results)
    ours = tokens / wall

    use_hf = args.hf_baseline
    if use_hf is None:
        import torch

        use_hf = not torch.cuda.is_available() and args.peer is None  # upstream's dummy weights are not on disk
    if use_hf and (workload != "greedy" or args.max_tokens_unset):
        print("(no transformers baseline: it runs the greedy /v1/completions workload only)")
    elif use_hf:
        hf_model = load_hf(model)
        for batch in sorted({1, args.concurrency}):
            done = [(*hf_baseline(hf_model, jobs, batch), sum(n for _, n in jobs)) for jobs in rounds]
            lat, hf_wall, hf_tokens = median_round(done, lambda x: x[2] / x[1])  # as for minisgl
            hf = hf_tokens / hf_wall
            how = "one request at a time" if batch == 1 else f"static batches of {batch} (generate, left padding)"
            med = f" (median of {len(done)} rounds)" if len(done) > 1 else ""
            print(f"transformers, {how}: {hf_wall:.1f} s{med}, {hf:.1f} output tok/s, E2E p50 {pct(lat, 50):.3f} s; "
                  f"minisgl / this: {ours / hf:.2f}x")


if __name__ == "__main__":
    main()

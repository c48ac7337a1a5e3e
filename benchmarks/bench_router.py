#!/usr/bin/env python3
"""What replicas and routing policies buy, measured: two `python -m minisgl` replicas, sglang-router in front.

    python benchmarks/bench_router.py [--model PATH] [--requests 16] [--output-len 64]
                                 [--sessions 8] [--turns 4] [--context-words 150] [--answer-len 24]

Starts the replicas with tools/serve_dp.py and a router (round_robin) in front of them:

1. throughput: `--requests` concurrent requests (distinct short prompts, ignore_eos, `--output-len` tokens
   each) through one replica using every CPU core, one replica using half of them, two replicas each using
   every core (twice as many threads as cores), and two replicas with the cores split between them
   (OMP_NUM_THREADS, what serve_dp.py does);
2. with the last two replicas, prefix-cache hits on a multi-turn workload: `--sessions` conversations at once, each with its own background
   text (about 1.3 tokens per word) as system prompt and `--turns` question/answer turns (each turn carries the
   whole history), through round_robin and then cache_aware. Every run uses newly generated texts, so what an
   earlier run left in the caches does not help. Hit rate = the replicas' `minisgl_cached_tokens_total` growth /
   the prompt tokens of the run (`usage.prompt_tokens`).

Prints one table per measurement. A benchmark: the numbers vary with the machine and its load.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Sequence

import httpx
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import serve_dp  # noqa: E402

WORDS = ("river stone lantern harbor copper meadow signal orchard engine basket winter timber ladder falcon "
         "garden mirror pepper velvet canyon rocket marble saddle thunder violet anchor biscuit cobalt ember "
         "glacier hammer island jungle kettle lemon magnet needle oyster pillow quartz ribbon tunnel umbrella").split()


def metrics(url: str) -> Dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}


def counters(urls: Sequence[str]) -> List[List[float]]:
    """[requests finished, cached tokens] per replica, once the schedulers have pushed their idle stats."""
    def read() -> List[List[float]]:
        out = []
        for u in urls:
            m = metrics(u)
            out.append([sum(v for k, v in m.items() if k.startswith("minisgl_requests_finished_total")),
                        m["minisgl_cached_tokens_total"]])
        return out

    last = read()
    for _ in range(10):
        time.sleep(0.3)
        now = read()
        if now == last:
            break
        last = now
    return last


def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)


def throughput(router: str, n: int, output_len: int, seed: int) -> tuple[float, int]:
    rng = random.Random(seed)
    prompts = [f"Write a story about a {rng.choice(WORDS)}, a {rng.choice(WORDS)} and a {rng.choice(WORDS)}."
               for _ in range(n)]

    def one(p: str) -> int:
        r = client(router).chat.completions.create(model="m", messages=[{"role": "user", "content": p}],
                                                   max_tokens=output_len, temperature=0,
                                                   extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as ex:
        tokens = sum(ex.map(one, prompts))
    return time.perf_counter() - t0, tokens


def conversations(router: str, sessions: int, turns: int, words: int, answer_len: int, seed: int) -> tuple[float, int, int]:
    """Returns (seconds, requests, prompt tokens)."""
    rng = random.Random(seed)
    contexts = [f"Notes of project {seed}-{s}: " + " ".join(rng.choice(WORDS) for _ in range(words))
                for s in range(sessions)]

    def session(ctx: str) -> tuple[int, int]:
        messages = [{"role": "system", "content": ctx}]
        prompt_tokens = 0
        for t in range(turns):
            messages.append({"role": "user", "content": f"Question {t + 1}: which words in the notes start with "
                                                        f"the letter {'abcdefghijklmnop'[t]}?"})
            r = client(router).chat.completions.create(model="m", messages=messages, max_tokens=answer_len,
                                                       temperature=0)
            prompt_tokens += r.usage.prompt_tokens
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        return turns, prompt_tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(sessions) as ex:
        results = list(ex.map(session, contexts))
    return time.perf_counter() - t0, sum(r for r, _ in results), sum(p for _, p in results)


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench_router.py", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--context-words", type=int, default=150)
    ap.add_argument("--answer-len", type=int, default=24)
    args = ap.parse_args()
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        print('bench_router.py needs SGLang\'s router: pip install -e ".[scale]"', file=sys.stderr)
        return 1
    flags = ["--num-pages", "8192", "--max-seq-len-override", "2048"] + (["--model", args.model] if args.model else [])
    print(f"machine: {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}", flush=True)
    seed = int(time.time())
    cores = os.cpu_count() or 1
    split = max(1, cores // 2)
    # (副本数, 每个副本的线程数)：一个副本用满所有核；一个副本只用一半的核（对照）；两个副本各用满所有核（线程数
    # 是核数的两倍）；两个副本平分所有核（serve_dp.py 的默认做法）
    configs = [(1, cores), (1, split), (2, cores), (2, split)]
    print(f"\nthroughput: {args.requests} concurrent requests, {args.output_len} output tokens each (ignore_eos), "
          f"round_robin")
    print(f"{'replicas':>8}  {'threads/replica':>15}  {'seconds':>7}  {'output tok/s':>12}", flush=True)
    for n, threads in configs:
        with serve_dp.fleet(n, flags, policy="round_robin", threads=threads) as (router, replicas):
            throughput(router.url, 2 * n, 4, seed)  # 预热：每个副本的第一个请求慢一些
            seconds, tokens = throughput(router.url, args.requests, args.output_len, seed + n)
            print(f"{n:>8}  {threads:>15}  {seconds:7.1f}  {tokens / seconds:12.1f}", flush=True)
            if (n, threads) != configs[-1]:
                continue
            urls = [r.url for r in replicas]
            print(f"\nmulti-turn: {args.sessions} conversations at once, {args.turns} turns each, a "
                  f"{args.context_words}-word system prompt per conversation, {args.answer_len}-token answers; "
                  f"{n} replicas, {threads} thread(s) each")
            print(f"{'policy':>12}  {'requests/replica':>16}  {'prompt tokens':>13}  {'cached':>7}  {'hit rate':>8}  "
                  f"{'seconds':>7}", flush=True)
            for i, policy in enumerate(("round_robin", "cache_aware")):
                with serve_dp.running_router(urls, policy) as rt:
                    before = counters(urls)
                    seconds, requests, prompt = conversations(rt.url, args.sessions, args.turns,
                                                              args.context_words, args.answer_len, seed + 10 + i)
                    after = counters(urls)
                served = [int(a[0] - b[0]) for a, b in zip(after, before)]
                hits = sum(a[1] - b[1] for a, b in zip(after, before))
                assert sum(served) == requests, (served, requests)
                print(f"{policy:>12}  {' + '.join(map(str, served)):>16}  {prompt:>13}  {int(hits):>7}  "
                      f"{hits / prompt:8.1%}  {seconds:7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

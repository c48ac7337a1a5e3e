#!/usr/bin/env python3
"""How long a new request waits in a busy (de)tokenizer process (chapter 13's tokenize_worker, --num-tokenizer 0).

    python benchmarks/bench_tokenizer_queue.py [--rates 20000 40000 60000] [--seconds 8] [--batch 64]

One tokenize_worker process (Qwen3's tokenizer) is started as the server starts it. This process plays the other two
sides: a scheduler that sends a batch of --batch tokens (one per running request) at a steady rate, so that the
worker detokenizes --rates tokens per second, and an API server that sends a new prompt (512 words) every 13 ms.
Measured per prompt: from handing its TokenizeMsg to ZMQ to receiving its UserMsg where the scheduler listens, i.e.
the time a new request's first token waits for the tokenizer. Also reported: the worker's CPU time as a share of one
core (Linux: /proc). With one worker both tokenizing and detokenizing, new requests must not queue behind the token
batches: they are tokenized first (chapter 13).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_serving import cpu_seconds, pct, stat_fields  # noqa: E402  (this folder is on sys.path: the script's own)
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.message import BatchBackendMsg, BatchTokenizerMsg, DetokenizeMsg, TokenizeMsg, UserMsg, encode  # noqa: E402
from minisgl.tokenizer import tokenize_worker  # noqa: E402
from minisgl.utils.hf import load_tokenizer, qwen3_tokenizer_dir  # noqa: E402
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue  # noqa: E402

PROMPT_EVERY = 0.013  # s between new prompts


def one_rate(rate: float, seconds: float, batch: int, ids: List[int]) -> str:
    d = tempfile.mkdtemp(prefix="minisgl-tokq-")
    addr, backend_addr, frontend_addr = (f"ipc://{d}/{n}" for n in ("in", "backend", "frontend"))
    backend: ZmqPullQueue = ZmqPullQueue(backend_addr, create=True)
    frontend: ZmqPullQueue = ZmqPullQueue(frontend_addr, create=True)
    ctx = mp.get_context("spawn")
    ack = ctx.Queue()
    proc = ctx.Process(target=tokenize_worker, kwargs=dict(
        tokenizer_path=str(qwen3_tokenizer_dir()), addr=addr, create=True, backend_addr=backend_addr,
        frontend_addr=frontend_addr, ack_queue=ack))
    proc.start()
    send: ZmqPushQueue = ZmqPushQueue(addr, create=False)
    ack.get(timeout=120)
    sent: Dict[int, float] = {}
    got: Dict[int, float] = {}
    stop = threading.Event()

    def drain_frontend() -> None:  # the API server's side: take the replies, nothing else
        while not stop.is_set():
            try:
                frontend.get(timeout=0.1)
            except TimeoutError:
                pass

    def drain_backend() -> None:  # the scheduler's side: note when each UserMsg arrives
        while not stop.is_set():
            try:
                msg = backend.get(timeout=0.1)
            except TimeoutError:
                continue
            for m in msg.data if isinstance(msg, BatchBackendMsg) else [msg]:
                if isinstance(m, UserMsg):
                    got[m.uid] = time.perf_counter()

    threads = [threading.Thread(target=f, daemon=True) for f in (drain_frontend, drain_backend)]
    for t in threads:
        t.start()
    wire = [encode(BatchTokenizerMsg([DetokenizeMsg(1000 + u, ids[(i * batch + u) % len(ids)], False)
                                      for u in range(batch)])) for i in range(256)]
    prompt = " ".join(["hello world"] * 256)
    period = batch / rate
    cpu0 = cpu_seconds(stat_fields(proc.pid))
    t0 = time.perf_counter()
    next_batch, next_prompt, i = t0, t0 + 0.05, 0
    while (now := time.perf_counter()) - t0 < seconds:
        if now >= next_prompt:
            uid = len(sent)
            sent[uid] = time.perf_counter()
            send.put(TokenizeMsg(uid=uid, text=prompt, sampling_params=SamplingParams(max_tokens=4)))
            next_prompt = now + PROMPT_EVERY
        if now >= next_batch:
            send.put_raw(wire[i % len(wire)])
            i += 1
            next_batch += period
        time.sleep(0.0002)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(stat_fields(proc.pid)) - cpu0
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    proc.terminate()
    proc.join(30)
    for q in (send, backend, frontend):
        q.stop()
    shutil.rmtree(d, ignore_errors=True)
    lat = [1e3 * (got[u] - sent[u]) for u in sent if u in got]
    return (f"{i * batch / wall:>10,.0f} {len(lat):>5}/{len(sent):<5} {pct(lat, 50):>8.1f} {pct(lat, 90):>8.1f} "
            f"{max(lat):>8.1f} {100 * cpu / wall:>9.0f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rates", type=float, nargs="+", default=[20000, 40000, 60000],
                    help="tokens per second the worker detokenizes")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured time per rate")
    ap.add_argument("--batch", type=int, default=64, help="tokens per scheduler step (running requests)")
    args = ap.parse_args()
    if not all(r > 0 for r in args.rates) or args.seconds <= 0 or args.batch < 1:
        ap.error("--rates and --seconds must be > 0, --batch >= 1")
    tok = load_tokenizer(str(qwen3_tokenizer_dir()))
    ids = tok.encode(" ".join(f"第 {i} 句：the quick brown fox 跳过了 lazy dog。" for i in range(400)))
    print(f"tokenize_worker (Qwen3 tokenizer), {args.batch} tokens per step, a 512-word prompt every "
          f"{1e3 * PROMPT_EVERY:.0f} ms, {args.seconds:g} s per rate; a new request's wait: TokenizeMsg sent -> "
          f"UserMsg at the scheduler")
    print(f"{'tokens/s':>10} {'requests':>11} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8} {'worker CPU':>10}")
    for rate in args.rates:
        print(one_rate(rate, args.seconds, args.batch, ids), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What structured output costs per decode step: filling the token bitmask (CPU) and applying it to the logits.

    python benchmarks/bench_structured.py [--device cpu|cuda] [--batch-sizes 1 8 64 256] [--json OUT.json]

Two tables, on the real Qwen3 tokenizer (a 151,936-token vocabulary, Qwen3-0.6B's lm_head):
- fill: one request's `Grammar.fill` (xgrammar's fill_next_token_bitmask) at a few places of a JSON schema, in
  microseconds (median and 99th percentile): the CPU work the scheduler hides behind the GPU's forward;
- apply: masking a [B, V] float32 batch of logits on the device with minisgl's plain-torch `apply_vocab_mask`
  and with xgrammar's kernel (`apply_token_bitmask_inplace`: C++ on CPU, Triton on CUDA), median milliseconds.
  On CUDA the times come from CUDA events around each call (the first calls, which compile the Triton kernel,
  are warm-up).

The appendix on structured output (ch17) quotes it; on a GPU: `python benchmarks/bench_structured.py --device cuda`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's minisgl
from minisgl.structured import GrammarBackend, allocate_vocab_mask, apply_vocab_mask  # noqa: E402
from minisgl.utils.hf import load_tokenizer, qwen3_tokenizer_dir  # noqa: E402

VOCAB = 151936
SCHEMA = json.dumps({"type": "object", "required": ["name", "age", "tags"], "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string"}}}})
PLACES = [("start", ""), ("in a string", '{"name": "Ada Love'), ("in a number", '{"name": "Ada", "age": 3'),
          ("in an array", '{"name": "Ada", "age": 36, "tags": ["math", ')]


def time_cpu(fn: Callable[[], None], calls: int) -> List[float]:
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def time_device(fn: Callable[[], None], calls: int, device: torch.device) -> List[float]:
    if device.type != "cuda":
        return time_cpu(fn, calls)
    for _ in range(5):  # 第一次调用要编译 Triton kernel
        fn()
    ts = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) / 1e3)
    return ts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    import xgrammar as xgr

    device = torch.device(args.device)
    tokenizer = load_tokenizer(qwen3_tokenizer_dir())
    backend = GrammarBackend(tokenizer, VOCAB)
    out: Dict[str, object] = {"device": str(device), "vocab_size": VOCAB, "fill_us": {}, "apply_ms": {}}

    print(f"fill one row of the mask (CPU, Qwen3 vocabulary {VOCAB}), microseconds")
    print(f"{'place':<14} {'allowed':>8} {'median':>8} {'p99':>8}")
    mask = allocate_vocab_mask(1, VOCAB)
    for name, prefix in PLACES:
        g = backend.grammar("json_schema", SCHEMA)
        assert all(g.accept(t) for t in tokenizer.encode(prefix, add_special_tokens=False)), prefix
        ts = sorted(time_cpu(lambda: g.fill(mask, 0), args.calls))
        allowed = int(((mask[0, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).sum())
        med, p99 = ts[len(ts) // 2] * 1e6, ts[int(len(ts) * 0.99)] * 1e6
        out["fill_us"][name] = {"allowed": allowed, "median": med, "p99": p99}  # type: ignore[index]
        print(f"{name:<14} {allowed:>8} {med:>8.1f} {p99:>8.1f}")

    print(f"\napply a [B, {VOCAB}] mask to float32 logits on {device}, median milliseconds")
    print(f"{'B':>5} {'torch':>9} {'xgrammar':>9}")
    gen = torch.Generator().manual_seed(0)
    for bs in args.batch_sizes:
        bits = torch.randint(-2**31, 2**31 - 1, (bs, (VOCAB + 31) // 32), dtype=torch.int32, generator=gen)
        logits = torch.randn(bs, VOCAB, generator=gen).to(device)
        bits = bits.to(device)
        ours = statistics.median(time_device(lambda: apply_vocab_mask(logits, bits), args.calls // 4, device))
        theirs = statistics.median(time_device(lambda: xgr.apply_token_bitmask_inplace(logits, bits),
                                               args.calls // 4, device))
        out["apply_ms"][str(bs)] = {"torch": ours * 1e3, "xgrammar": theirs * 1e3}  # type: ignore[index]
        print(f"{bs:>5} {ours * 1e3:>9.3f} {theirs * 1e3:>9.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

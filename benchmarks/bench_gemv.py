#!/usr/bin/env python3
"""Small-batch matmul (GEMV) on a GPU: cuBLAS against Triton kernels, on the matmuls of a decode step.

    python benchmarks/bench_gemv.py [--config benchmarks/configs/qwen3-8b.json] [--m 1 8] [--kinds dot]
    TRITON_INTERPRET=1 python benchmarks/bench_gemv.py --smoke      # CPU: every kernel variant against torch

At batch 1 cuBLAS reads the weights of Qwen3-8B's qkv / o_proj / down at 2.6-3.3 TB/s (benchmarks/profile_forward.py
--decode 1), 0.63 ms per step over the copy-bandwidth floor. This sweeps two Triton kernels over block shapes:
"fma" (each program multiplies BLOCK_N weight rows by the M inputs with a broadcast multiply-sum, fp32
accumulation; at M = 1 this is minisgl's gemv_rows) and "dot" (minisgl's gemv, minisgl/kernel/matmul.py: the inputs
padded to 16 rows, tl.dot on tensor cores), each with the block shape given. minisgl uses gemv_rows at batch 1 for
N <= 2048 (the block rule from the batch-1 sweep on an H100) and the dot kernel otherwise. Each case is timed with
triton.testing.do_bench_cudagraph (replays of a captured graph, as in a decode step); the table gives, per shape,
cuBLAS, the best Triton config and minisgl's kernel with the block rule it ships (drawn from this sweep) in us and
TB/s of weight read, and what each would save per decode step.
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from minisgl.kernel.matmul import _choose, _kernel, gemv, gemv_supported


@triton.jit
def gemv_fma(x, w, y, M, N, K, stride_x, stride_y,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K]^T; one program per BLOCK_N output columns, all M rows (M <= BLOCK_M)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    w_ptrs = w + rn[:, None] * K + rk[None, :]  # [BN, BK]
    x_ptrs = x + rm[:, None] * stride_x + rk[None, :]  # [BM, BK]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        wt = tl.load(w_ptrs).to(tl.float32)
        xt = tl.load(x_ptrs, mask=rm[:, None] < M, other=0.0).to(tl.float32)
        acc += tl.sum(xt[:, None, :] * wt[None, :, :], axis=2)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    tl.store(y + rm[:, None] * stride_y + rn[None, :], acc.to(y.dtype.element_ty), mask=rm[:, None] < M)


def _rule(m: int, N: int, K: int) -> str:
    """minisgl's choice for this shape: gemv_rows (batch 1, narrow) or the tl.dot gemv, with (BLOCK_N, BLOCK_K, stages)."""
    rows, blocks = _choose(m, N, K)
    return f"{'rows' if rows else 'dot'} {blocks}" if blocks else "cuBLAS"


def run(cfg: dict, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
    M, K = x.shape
    N = w.shape[0]
    grid = (N // cfg["BLOCK_N"],)
    if cfg["kind"] == "fma":
        bm = triton.next_power_of_2(M)
        gemv_fma[grid](x, w, y, M, N, K, x.stride(0), y.stride(0), BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"],
                       BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["warps"], num_stages=cfg["stages"])
    else:  # minisgl's own kernel (ch08), with this block shape instead of its rule
        _kernel()[grid](x, w, w, y, M, K, x.stride(0), y.stride(0), BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                        HAS_BIAS=False, num_warps=cfg["warps"], num_stages=cfg["stages"])


def configs(m: int, kinds: tuple = ("fma", "dot")) -> list:
    out = []
    if "fma" in kinds:
        for bn, bk, warps, stages in itertools.product([2, 4, 8, 16], [512, 1024, 2048], [4, 8], [1, 3]):
            if bn * bk * triton.next_power_of_2(m) <= 16384 and bn * bk >= 1024:
                out.append(dict(kind="fma", BLOCK_N=bn, BLOCK_K=bk, warps=warps, stages=stages))
    if "dot" in kinds:
        for bn, bk, stages in itertools.product([16, 32, 64], [128, 256, 512, 1024], [3, 4]):
            out.append(dict(kind="dot", BLOCK_N=bn, BLOCK_K=bk, warps=4, stages=stages))
    return out


def shapes(config_path: Path) -> list:
    c = json.loads(config_path.read_text())
    E, I, D = c["hidden_size"], c["intermediate_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    H, Hkv, V = c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
    attn = [("qkv_proj", (H + 2 * Hkv) * D, E), ("o_proj", E, H * D)]
    if c.get("num_experts"):  # MoE: the router is the third GEMV of a layer (the experts are chapter 4's kernels)
        return attn + [("router", c["num_experts"], E), ("lm_head", V, E)], c["num_hidden_layers"]
    return attn + [("gate_up_proj", 2 * I, E), ("down_proj", E, I), ("lm_head", V, E)], c["num_hidden_layers"]


def smoke() -> None:
    """Every variant on small shapes against torch (CPU with TRITON_INTERPRET=1, or a GPU)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    n_ok = 0
    for m in (1, 3, 8):
        for cfg in configs(m)[::5]:
            N, K = cfg["BLOCK_N"] * 3, 2 * cfg["BLOCK_K"]
            x, w = torch.randn(m, K, device=dev, dtype=dt), torch.randn(N, K, device=dev, dtype=dt)
            y = torch.empty(m, N, device=dev, dtype=dt)
            run(cfg, x, w, y)
            ref = x.float() @ w.float().T
            torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
            n_ok += 1
    print(f"smoke: {n_ok} kernel configs equal torch's matmul")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "qwen3-8b.json")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8], help="rows of x (the decode batch size)")
    ap.add_argument("--kinds", nargs="*", default=["fma", "dot"], choices=["fma", "dot"],
                    help="Triton kernels to sweep (none: only cuBLAS and minisgl)")
    ap.add_argument("--json", type=Path, help="write every config's time here")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        return smoke()
    from triton.testing import do_bench_cudagraph

    dev, dt = torch.device("cuda"), torch.bfloat16
    todo, layers = shapes(args.config)
    print(f"\n{args.config.stem}: y = x @ W^T, bf16, us per call (graph replays); TB/s = weight bytes / time")
    print(f"{'shape':<13} {'N':>7} {'K':>6} {'M':>3} {'cuBLAS':>8} {'TB/s':>5} {'Triton':>8} {'TB/s':>5} "
          f"{'minisgl':>8} {'TB/s':>5}  best config / minisgl's kernel (BLOCK_N, BLOCK_K, stages)")
    saved = {m: 0.0 for m in args.m}
    saved_ours = {m: 0.0 for m in args.m}
    results = []
    for (name, N, K), m in itertools.product(todo, args.m):
        w = torch.randn(N, K, device=dev, dtype=dt) * 0.02
        x = torch.randn(m, K, device=dev, dtype=dt)
        y = torch.empty(m, N, device=dev, dtype=dt)
        ref = x @ w.T
        cublas = do_bench_cudagraph(lambda: torch.matmul(x, w.T, out=y), rep=50) * 1000
        best = (float("inf"), None)
        every = []
        for cfg in configs(m, tuple(args.kinds)):
            if N % cfg["BLOCK_N"] or K % cfg["BLOCK_K"]:
                continue
            try:
                run(cfg, x, w, y)
                torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item())
                us = do_bench_cudagraph(lambda: run(cfg, x, w, y), rep=50) * 1000
            except Exception as e:  # out of resources (shared memory / registers) for this block shape
                print(f"  skip {cfg}: {type(e).__name__}")
                continue
            every.append(dict(cfg, us=us))
            best = min(best, (us, cfg), key=lambda b: b[0])
        nbytes = N * K * 2
        us, cfg = best
        ours = float("nan")
        if gemv_supported(x, w):  # the kernel and block rule in minisgl/kernel/matmul.py (ch08)
            torch.testing.assert_close(gemv(x, w).float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item())
            ours = do_bench_cudagraph(lambda: gemv(x, w), rep=50) * 1000
        cfg_s = {k: v for k, v in (cfg or {}).items() if k != "kind"}
        print(f"{name:<13} {N:>7} {K:>6} {m:>3} {cublas:>8.2f} {nbytes / cublas / 1e6:>5.2f} {us:>8.2f} "
              f"{nbytes / us / 1e6:>5.2f} {ours:>8.2f} {nbytes / ours / 1e6:>5.2f}  {cfg_s} / {_rule(m, N, K)}")
        per_step = 1 if name == "lm_head" else layers
        saved[m] += max(0.0, cublas - us) * per_step
        if name != "lm_head" and ours == ours:  # minisgl keeps cuBLAS for the LM head and unsupported shapes
            saved_ours[m] += (cublas - ours) * per_step
        results.append(dict(shape=name, N=N, K=K, m=m, cublas_us=cublas, triton_us=us, config=cfg, minisgl_us=ours,
                            minisgl_blocks=_rule(m, N, K), every=every))
        torch.cuda.empty_cache()
    for m, s in saved.items():
        swept = f"the best Triton config where it beats cuBLAS would save {s:.0f} us per decode step; " if args.kinds else ""
        print(f"batch {m}: {swept}minisgl's rule (qkv, o, gate_up, down) saves {saved_ours[m]:.0f} us")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

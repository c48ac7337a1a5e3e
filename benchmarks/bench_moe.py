#!/usr/bin/env python3
"""MoE on a GPU: Qwen3-30B-A3B's config (benchmarks/configs/qwen3-30b-a3b.json) with dummy weights, no checkpoint.

    python benchmarks/bench_moe.py layer   [--batch-sizes 1 2 4 8 64 256 4096] [--layers 8] [--sweep] [--sweep-pairs]
    python benchmarks/bench_moe.py decode  [--num-layers N] [--batch-sizes 1 2 4 8 64 256] [--context 512] [--graphs 0 256]
    python benchmarks/bench_moe.py offline [--engine minisgl|upstream] [--num-layers N] [--num-seqs 128]
                                           [--min-len 100] [--max-len 512]
    python benchmarks/bench_moe.py summarize OUT/moe_offline_*.json

layer: one MoE block (router + experts) of the config, `layers` copies with their own weights called one after
    another (as in the model: one layer's experts do not stay in L2 for the next), one decode step at each batch
    size: GroupedMoe (PyTorch) eager, TritonMoe eager, TritonMoe replayed from a CUDA graph, the latter with rows sorted into
    blocks (both ways of summing a token's k rows: in down's epilogue / a sum kernel) and with one program per
    (token, expert) pair (Blocks.pairs, small batches); choose_blocks' pick marked *; the floor is the bytes
    of the experts the step touches (E·(1-(1-k/E)^B) of them on average under uniform routing) over the measured
    copy bandwidth. Imports only minisgl.moe: it runs in chapter 4's tree (its GPU cell). --sweep times block
    shapes for fused_moe per batch size (where choose_blocks' table comes from); --sweep-pairs the same for the
    one-program-per-pair kernels (Blocks.pairs), whose column the table also shows up to --pairs-up-to.
decode: the engine (fi attention, page 16) with dummy weights, one decode step per batch size, CUDA graphs off/on,
    against the floor: the weights one step reads (attention, norms, routers, LM head, embedding rows, and the
    distinct experts the batch touches) plus the live KV, over the copy bandwidth.
offline: nano-vllm's protocol scaled to the MoE (128 sequences, lengths uniform in [100, 512], greedy, ignore_eos;
    the run in benchmarks/bench_peer.py's spirit): minisgl, or upstream mini-sglang @20fcd7f from the ignored .peer/
    folder with the sgl_kernel shim (benchmarks/sgl_kernel_shim: topk_softmax and moe_align_block_size in plain
    torch, since the GPU machine has no sgl_kernel) first on its path. Both warm up on one prefill of each size tier first, so that no Triton kernel compiles
    inside the timed run. --json writes rows that `summarize` (and bench_peer.py --summarize) read.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

BENCH = Path(__file__).resolve().parent
CONFIG = BENCH / "configs" / "qwen3-30b-a3b.json"
WARMUP_PREFILLS = (200, 800, 3000, 9000)  # 一次 prefill 这么多 token：fused_moe 的四档分块各编译一次


def expected_distinct(batch: int, num_experts: int, top_k: int) -> float:
    """B 个 token 各自均匀地选 k 个不同的专家：平均碰到几个不同的专家。"""
    return num_experts * (1 - (1 - top_k / num_experts) ** batch)


def copy_bandwidth() -> float:
    """bytes/s of a 2 GiB device-to-device copy (read + write counted once each), as benchmarks/bench_decode.py."""
    sys.path.insert(0, str(BENCH))
    from bench_decode import copy_bandwidth as measure

    return measure()


def cuda_time(fn: Callable[[], object], reps: int) -> float:
    """Median of `reps` timings of fn (ms), CUDA events, after 3 untimed calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------------------------
# layer: one MoE block, chapter 4's code only


def run_layer(args: argparse.Namespace) -> None:
    import torch.nn.functional as F
    from minisgl.moe import create_moe_backend, fused_moe, select_experts
    from minisgl.moe.fused import Blocks, choose_blocks

    cfg = json.loads(args.config.read_text())
    H, E, K, I = cfg["hidden_size"], cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    renorm, L, dev, dt = bool(cfg["norm_topk_prob"]), args.layers, torch.device("cuda"), torch.bfloat16
    bw = copy_bandwidth()
    g = torch.Generator(device=dev).manual_seed(0)
    layers = [(torch.randn(E, H, device=dev, generator=g).mul_(0.02).to(dt),  # router [E, H]
               torch.randn(E, 2 * I, H, device=dev, generator=g).mul_(0.02).to(dt),  # gate_up [E, 2I, H]
               torch.randn(E, H, I, device=dev, generator=g).mul_(0.02).to(dt)) for _ in range(L)]  # down [E, H, I]
    expert_bytes = 3 * H * I * 2
    backends = {"torch": create_moe_backend("torch"), "triton": create_moe_backend("triton")}

    def block_chain(backend, x: torch.Tensor, blocks=None) -> torch.Tensor:
        for router, gate_up, down in layers:  # 每层自己的权重和路由，依次调用：和模型里一样
            logits = F.linear(x, router)  # [B, E]
            if blocks is None:
                out = backend.forward(x, gate_up, down, logits, K, renorm)
            else:
                out = fused_moe(x, gate_up, down, logits, K, renorm, blocks)
        return out

    def graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay

    rows = []
    for B in args.batch_sizes:
        x = torch.randn(B, H, device=dev, generator=g).to(dt)
        distinct = statistics.mean(
            select_experts(F.linear(x, router), K, renorm)[1].unique().numel() for router, _, _ in layers)
        exp = expected_distinct(B, E, K)
        floor_ms = (exp * expert_bytes + E * H * 2) / bw * 1000  # 碰到的专家 + 路由器
        flops = 2 * B * K * 3 * H * I + 2 * B * E * H
        reps = 10 if B > 1024 else 30
        try:  # GroupedMoe 只是参照：torch._grouped_mm 在这块 GPU 上不支持时记 nan，其余照测
            torch_ms = cuda_time(lambda: block_chain(backends["torch"], x), reps) / L
        except RuntimeError as e:
            print(f"batch {B}: GroupedMoe failed: {str(e)[:200]}")
            torch_ms = float("nan")
        chosen, blocked = choose_blocks(B * K, E, dt), choose_blocks(B * K, E, dt, pairs=False)
        t = {"torch eager": torch_ms,
             "triton eager": cuda_time(lambda: block_chain(backends["triton"], x), reps) / L}
        for fuse in (True, False):  # 沿 k 的求和：在 down 的收尾里 / 另起一个 kernel
            t[f"graph sum {'in down' if fuse else 'kernel'}"] = cuda_time(
                graphed(lambda: block_chain(None, x, blocked._replace(fuse_sum=fuse))), reps) / L
        t["graph pairs"] = (cuda_time(graphed(lambda: block_chain(None, x, choose_blocks(B * K, E, dt, pairs=True))),
                                      reps) / L if B <= args.pairs_up_to else float("nan"))  # 一个对一个实例
        pick = "pairs" if chosen.pairs else f"sum {'in down' if chosen.fuse_sum else 'kernel'}"
        t["triton graph"] = t[f"graph {pick}"]
        rows.append(dict(batch=B, distinct_measured=distinct, distinct_expected=exp, floor_ms=floor_ms,
                         tflops_triton_graph=flops / (t["triton graph"] / 1000) / 1e12, blocks=list(chosen), pick=pick,
                         **{k.replace(" ", "_") + "_ms": v for k, v in t.items()}))
        torch.cuda.empty_cache()
    print(f"\nQwen3-30B-A3B MoE block (router + {E} experts, top-{K}, H {H}, I {I}, bf16) on "
          f"{torch.cuda.get_device_name()}; {L} layers with their own weights, time per layer")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; floor = distinct experts (expected, uniform routing) x "
          f"{expert_bytes / 2**20:.1f} MiB + router, over that bandwidth")
    print(f"{'':>39} {'triton graph: blocks, sum':>29}")
    print(f"{'batch':>6} {'distinct':>9} {'floor ms':>9} {'torch eager':>12} {'triton eager':>13} "
          f"{'in down':>14} {'kernel':>14} {'pairs':>14} {'graph/floor':>11} {'TFLOP/s':>8}")
    keys = {p: "graph_" + p.replace(" ", "_") + "_ms" for p in ("sum in down", "sum kernel", "pairs")}
    for r in rows:
        cols = "".join(f"{r[key]:>13.4f}{'*' if r['pick'] == p else ' '}" for p, key in keys.items())
        print(f"{r['batch']:>6} {r['distinct_measured']:>5.1f}/{r['distinct_expected']:<4.0f}{r['floor_ms']:>8.4f} "
              f"{r['torch_eager_ms']:>12.4f} {r['triton_eager_ms']:>13.4f} {cols}"
              f"{r['triton_graph_ms'] / r['floor_ms']:>11.2f} {r['tflops_triton_graph']:>8.1f}")
    print("(distinct: measured on these random inputs / expected under uniform routing; blocks: rows sorted by expert "
          "into blocks, a token's k rows added in down's epilogue or by a sum kernel; pairs: one program per "
          "(token, expert) pair, timed up to batch " f"{args.pairs_up_to}; * = choose_blocks' pick, used in graph/floor "
          "and TFLOP/s)")
    if args.sweep:
        sweep(args, layers, block_chain, graphed, Blocks)
    if args.sweep_pairs:
        sweep_pairs(args, layers, block_chain, graphed, Blocks)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def sweep(args, layers, block_chain, graphed, Blocks) -> None:
    """Block shapes for fused_moe per batch size, each replayed from a CUDA graph: the best per batch first."""
    H, E = layers[0][1].shape[2], layers[0][1].shape[0]
    candidates = [Blocks(bm, bn1, bn2, bk, w, s)
                  for bm in (16, 32, 64, 128) for bn1, bn2 in ((16, 32), (32, 64), (64, 128))
                  for bk in (64, 128) for w in (4, 8) for s in (3, 4) if not (bm == 128 and w == 4)]
    print(f"\nsweep: up to {len(candidates)} block shapes per batch size (ms per layer, graph replay; each new shape "
          "compiles first: minutes)")
    g = torch.Generator(device="cuda").manual_seed(1)
    for B in args.batch_sizes:
        x = torch.randn(B, H, device="cuda", generator=g).to(torch.bfloat16)
        res = []
        rows = B * 8 / E  # 每个专家平均几行
        for b in candidates:
            if b.bm > max(16, 4 * rows) or (rows > 64 and b.bm < 64):  # 块高和行数差得太远的不试
                continue
            try:
                res.append((cuda_time(graphed(lambda: block_chain(None, x, b)), 10) / len(layers), b))
            except Exception as e:  # noqa: BLE001 -- a shape that does not fit this GPU's shared memory
                if "OutOfResources" not in type(e).__name__:
                    raise
        res.sort()
        print(f"batch {B}: " + "; ".join(f"{ms:.4f} {tuple(b)}" for ms, b in res[:5]))


def sweep_pairs(args, layers, block_chain, graphed, Blocks) -> None:
    """Block shapes for the one-program-per-pair kernels (Blocks.pairs) at the batch sizes up to --pairs-up-to."""
    H = layers[0][1].shape[2]
    candidates = [Blocks(1, bn1, bn2, bk, w, 1, pairs=True)
                  for bn1, bn2 in ((1, 1), (2, 2), (2, 4), (4, 8)) for bk in (512, 1024, 2048) for w in (2, 4, 8)]
    print(f"\nsweep (pairs): {len(candidates)} block shapes (ms per layer, graph replay)")
    g = torch.Generator(device="cuda").manual_seed(1)
    for B in [b for b in args.batch_sizes if b <= args.pairs_up_to]:
        x = torch.randn(B, H, device="cuda", generator=g).to(torch.bfloat16)
        res = sorted((cuda_time(graphed(lambda: block_chain(None, x, b)), 10) / len(layers), b) for b in candidates)
        print(f"batch {B}: " + "; ".join(f"{ms:.4f} {tuple(b)[1:6]}" for ms, b in res[:6]))


# ---------------------------------------------------------------------------------------------------------------
# decode: the engine, one decode step


def model_folder(config: Path, num_layers: int | None) -> Path:
    """A temp folder with config.json (num_hidden_layers cut when asked) and Qwen3's tokenizer."""
    from minisgl.utils.hf import qwen3_tokenizer_dir

    cfg = json.loads(config.read_text())
    if num_layers:
        cfg["num_hidden_layers"] = cfg["max_window_layers"] = num_layers
    folder = Path(tempfile.mkdtemp(prefix="minisgl-moe-"))
    (folder / "config.json").write_text(json.dumps(cfg))
    for f in qwen3_tokenizer_dir().iterdir():
        shutil.copy(f, folder / f.name)
    return folder


def step_floor_bytes(engine, batch: int, context: int) -> Dict[str, float]:
    """What one decode step of `batch` requests must read: weights it uses, and the live KV."""
    mc = engine.model_config
    experts = embed = other = 0
    for name, t in engine.model.state_dict().items():
        n = t.numel() * t.element_size()
        if ".experts." in name:
            experts += n
        elif name.endswith("embed_tokens.weight"):
            embed += n
        else:
            other += n
    used = expected_distinct(batch, mc.num_experts, mc.num_experts_per_tok) / mc.num_experts
    kv = 2 * mc.num_layers * engine.kv_cache.k_cache(0).shape[1] * mc.head_dim * engine.dtype.itemsize
    if mc.tie_word_embeddings:  # 共享词嵌入：LM head 读整个矩阵，已算在 embed 里
        other += embed
        embed = 0
    rows = batch * mc.hidden_size * engine.dtype.itemsize  # 只读这批 token 的词嵌入行
    return dict(experts=experts * used, other=other + (rows if embed else 0), kv=batch * context * kv,
                all_experts=experts)


def run_decode(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(BENCH))
    from bench_decode import decode_engine, time_decode

    bw = copy_bandwidth()
    folder = model_folder(args.config, args.num_layers)
    rows = []
    max_bs, ctx = max(args.batch_sizes), args.context
    try:
        for graphs in args.graphs:
            t0 = time.perf_counter()
            engine = decode_engine(folder, max_bs, ctx, graphs, use_dummy_weight=True)
            startup = time.perf_counter() - t0
            mc = engine.model_config
            for bs in args.batch_sizes:
                step_ms, fwd_ms = time_decode(engine, bs, ctx)
                parts = step_floor_bytes(engine, bs, ctx)
                floor_ms = (parts["experts"] + parts["other"] + parts["kv"]) / bw * 1000
                rows.append(dict(layers=mc.num_layers, graphs=bool(graphs), batch=bs, step_ms=step_ms,
                                 forward_ms=fwd_ms, floor_ms=floor_ms, startup_s=startup,
                                 distinct=expected_distinct(bs, mc.num_experts, mc.num_experts_per_tok),
                                 floor_gb={k: v / 1e9 for k, v in parts.items()}))
            engine.shutdown()
            del engine
            torch.cuda.empty_cache()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    L = rows[0]["layers"]
    print(f"\nQwen3-30B-A3B ({L} layers, dummy bf16 weights) decode step, context {ctx} tokens per request, fi "
          f"attention, page 16, on {torch.cuda.get_device_name()}")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; floor = (weights the step reads + live KV) / bandwidth, where the "
          "experts read are the distinct ones the batch touches under uniform routing")
    print("startup (dummy weights + graph capture): " +
          ", ".join(f"graphs {'on' if r['graphs'] else 'off'} {r['startup_s']:.1f} s"
                    for r in rows if r["batch"] == rows[0]["batch"]))
    print(f"{'graphs':>7} {'batch':>6} {'experts/layer':>13} {'floor GB':>9} {'step ms':>8} {'forward ms':>10} "
          f"{'floor ms':>9} {'fwd/floor':>9} {'tokens/s':>9}")
    for r in rows:
        gb = r["floor_gb"]
        print(f"{('on' if r['graphs'] else 'off'):>7} {r['batch']:>6} {r['distinct']:>13.1f} "
              f"{gb['experts'] + gb['other'] + gb['kv']:>9.2f} {r['step_ms']:>8.3f} {r['forward_ms']:>10.3f} "
              f"{r['floor_ms']:>9.3f} {r['forward_ms'] / r['floor_ms']:>9.2f} {r['batch'] / r['step_ms'] * 1000:>9.0f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


# ---------------------------------------------------------------------------------------------------------------
# offline: minisgl or upstream on the same workload


def run_offline(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(BENCH))
    from bench_offline import print_rows, timed, workload  # (its import puts this repository first on sys.path)

    cfg = json.loads(args.config.read_text())
    prompts, outputs = workload(args.num_seqs, args.min_len, args.max_len, cfg["vocab_size"])
    L = args.num_layers or cfg["num_hidden_layers"]
    if args.engine == "upstream":
        llm, generate, desc, folder = upstream_llm(args)
    else:
        llm, generate, desc, folder = minisgl_llm(args)
    for n in WARMUP_PREFILLS:  # 一次 prefill n 个 token（1000 个一条、各不相同）：每档分块的 kernel 都先编译好
        top = min(10000, cfg["vocab_size"]) - 1
        warm = [[(131 * j + 7 * i) % top + 1 for i in range(min(n, 1000))] for j in range(-(-n // 1000))]
        generate(warm, [2] * len(warm))

    def go(ps, outs) -> int:
        got = generate(ps, outs)
        assert got == list(outs), f"{args.engine} produced a different number of tokens than asked"
        return sum(got)

    rows = [(f"{desc} · {L} layers", *timed(lambda: go(prompts, outputs), "cuda"))]
    print(f"\nQwen3-30B-A3B config ({L} layers, dummy weights) on {torch.cuda.get_device_name()}, {args.num_seqs} "
          f"sequences, input and output lengths uniform in [{args.min_len}, {args.max_len}], "
          f"{sum(len(p) for p in prompts)} prompt tokens, ignore_eos, greedy")
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps([dict(engine=d, tokens=t, seconds=s) for d, t, s in rows], indent=1))
    if args.engine == "upstream":
        os._exit(0)  # upstream's scheduler threads and NCCL/ZMQ state: leave without waiting on them
    llm.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def minisgl_llm(args: argparse.Namespace):
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    folder = model_folder(args.config, args.num_layers)
    llm = LLM(str(folder), use_dummy_weight=True, attention_backend="fi", page_size=16, cuda_graph_max_bs=256,
              max_running_req=256, max_extend_tokens=16384, enable_overlap=True)

    def generate(ps: List[List[int]], outs: List[int]) -> List[int]:
        params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n) for n in outs]
        return [len(o["token_ids"]) for o in llm.generate(ps, params, use_tqdm=False)]

    moe = type(llm.engine.ctx.moe_backend).__name__
    return llm, generate, f"minisgl (overlap on, radix cache, page 16, attn fi, graphs on, moe {moe})", folder


def upstream_llm(args: argparse.Namespace):
    """Upstream in this process: its package is also named minisgl, so this repository leaves sys.path first."""
    if not (args.peer / "minisgl").is_dir():
        raise SystemExit(f"error: --peer {args.peer}: no minisgl package there (put upstream's python/ folder there)")
    if not (args.shim / "sgl_kernel").is_dir():
        raise SystemExit(f"error: --shim {args.shim}: no sgl_kernel folder there")
    from bench_peer import model_dir

    cfg = json.loads(args.config.read_text())
    if args.num_layers:
        cfg["num_hidden_layers"] = cfg["max_window_layers"] = args.num_layers
    folder = args.model_dir / f"qwen3-30b-a3b-l{cfg['num_hidden_layers']}"
    tmp_cfg = Path(tempfile.mkdtemp()) / "config.json"
    tmp_cfg.write_text(json.dumps(cfg))
    if (folder / "config.json").exists() and json.loads((folder / "config.json").read_text()) != cfg:
        shutil.rmtree(folder)
    model_dir(folder, tmp_cfg)
    here = BENCH.parent.resolve()
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != here]
    sys.path.insert(0, str(args.peer.resolve()))
    sys.path.insert(0, str(args.shim.resolve()))
    for name in [m for m in sys.modules if m == "minisgl" or m.startswith("minisgl.")]:
        del sys.modules[name]
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    where = [Path(p) for p in sys.modules["minisgl"].__path__]
    assert all(p.is_relative_to(args.peer.resolve()) for p in where), f"not upstream's minisgl: {where}"
    llm = LLM(str(folder), max_seq_len_override=4096, max_extend_tokens=16384, cuda_graph_max_bs=256,
              page_size=256, use_dummy_weight=True, attention_backend="fi")

    def generate(ps: List[List[int]], outs: List[int]) -> List[int]:
        res = llm.generate(ps, [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n) for n in outs])
        return [len(r["token_ids"]) for r in res]

    return llm, generate, "upstream mini-sglang @20fcd7f (overlap on, page 256, attn fi, graphs on, moe fused)", folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("layer", help="one MoE block: torch vs triton, eager vs CUDA graph, against the floor")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 64, 256, 4096])
    p.add_argument("--layers", type=int, default=8, help="copies of the layer with their own weights")
    p.add_argument("--sweep", action="store_true", help="also time block shapes for fused_moe")
    p.add_argument("--sweep-pairs", action="store_true", help="also time block shapes for the pairs kernels")
    p.add_argument("--pairs-up-to", type=int, default=16, help="time the pairs kernels up to this batch size")
    p = sub.add_parser("decode", help="the engine's decode step per batch size against the floor")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 64, 256])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--graphs", type=int, nargs="+", default=[0, 256], help="cuda_graph_max_bs values")
    p.add_argument("--num-layers", type=int, default=None, help="cut the config to this many layers")
    p = sub.add_parser("offline", help="offline throughput of minisgl or upstream")
    p.add_argument("--engine", choices=["minisgl", "upstream"], default="minisgl")
    p.add_argument("--num-layers", type=int, default=None, help="cut the config to this many layers")
    p.add_argument("--num-seqs", type=int, default=128)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--peer", type=Path, default=BENCH.parent / ".peer" / "python")
    p.add_argument("--shim", type=Path, default=BENCH / "sgl_kernel_shim")
    p.add_argument("--model-dir", type=Path, default=BENCH.parent / ".peer")
    p = sub.add_parser("summarize", help="minisgl / upstream from offline --json files (turns)")
    p.add_argument("files", type=Path, nargs="+")
    for name in ("layer", "decode", "offline"):
        sub.choices[name].add_argument("--config", type=Path, default=CONFIG)
        sub.choices[name].add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.cmd == "summarize":
        sys.path.insert(0, str(BENCH))
        from bench_peer import summarize

        return summarize(args.files)
    if not torch.cuda.is_available():
        raise SystemExit(f"error: bench_moe.py {args.cmd} needs a CUDA GPU")
    {"layer": run_layer, "decode": run_decode, "offline": run_offline}[args.cmd](args)


if __name__ == "__main__":
    main()

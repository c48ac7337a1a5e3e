#!/usr/bin/env python3
"""Decode step latency of the minisgl engine on a GPU, against the memory-bandwidth floor.

    python benchmarks/bench_decode.py [--config benchmarks/configs/qwen3-0.6b.json] [--batch-sizes 1 8 64 256]
                                 [--context 512] [--graphs 0 256] [--split-kv-max-bs N]

Random bf16 weights in a real config (written once to a temp folder), the fi attention backend. For each
batch size, bs requests whose first `context` tokens are already in the KV pool take one decode step; the
time per step is measured with CUDA events over 30 steps (after warm-up), CUDA graphs off and on. The floor
is what one step must read — the weights (of an untied embedding table only the batch's rows) plus the live KV —
over the device copy bandwidth measured here.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Tuple

import torch


def random_checkpoint(config_path: Path, folder: Path) -> Path:
    """config.json + model.safetensors with N(0, 0.02) bf16 weights, made with transformers (on the GPU if any)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    (folder / "config.json").write_text(config_path.read_text())
    cfg = AutoConfig.from_pretrained(folder)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    from minisgl.utils.hf import qwen3_tokenizer_dir  # Qwen3 的真实分词器：LLM 要用它

    for f in qwen3_tokenizer_dir().iterdir():
        shutil.copy(f, folder / f.name)
    return folder


def decode_engine(folder: Path, max_bs: int, context: int, graphs: int, **config):
    """fi 后端、页大小 16 的引擎，池子够 max_bs 个请求各 context + 64 个 token；页表第 i 行指向自己的一段槽。
    config：EngineConfig 的其余字段（如 use_dummy_weight=True）。"""
    from minisgl.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(folder, attention_backend="fi", page_size=16, max_running_req=max_bs,
                                 max_seq_len_override=context + 64, num_pages=max_bs * (context + 64) // 16 + 16,
                                 cuda_graph_max_bs=graphs, **config))
    P = engine.config.page_size
    table = torch.arange(max_bs * engine.page_table.shape[1], dtype=torch.int32, device="cuda")
    engine.page_table[:max_bs] = table.view(max_bs, -1) % (engine.num_pages * P)
    return engine


def decode_reqs(bs: int, context: int) -> list:
    """bs 个请求，每个的前 context - 1 个 token 算作已经在池子里（内容是什么不影响时间）。"""
    from minisgl.core import Req

    return [Req(torch.randint(0, 1000, (context,), dtype=torch.int32), i, context - 1, 8, i) for i in range(bs)]


def decode_batch(reqs: list, context: int):
    """这些请求的一个 decode 批；每一步都在同一个位置上 decode：时间与真实 decode 一样，池子不会越界。"""
    from minisgl.core import Batch

    for r in reqs:
        r.cached_len, r.device_len = context - 1, context
    return Batch(reqs, "decode")


def time_decode(engine, bs: int, context: int, steps: int = 40, warmup: int = 10) -> Tuple[float, float]:
    """bs 个请求的一步 decode，CUDA 事件计时、取中位数：(一步 ms, 前向 ms)。"一步"含 prepare_batch 和采样参数的准备
    （CPU：拼输入、plan，第 11 章的重叠调度把它藏到 GPU 计算后面），"前向"只有 forward_batch。"""
    reqs = decode_reqs(bs, context)
    times = []
    with torch.inference_mode():
        for step in range(steps):
            batch = decode_batch(reqs, context)
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            torch.cuda.synchronize()
            ev[0].record()
            engine.prepare_batch(batch)
            args = engine.sampler.prepare(reqs)
            ev[1].record()
            engine.forward_batch(batch, args)
            ev[2].record()
            torch.cuda.synchronize()
            if step >= warmup:
                times.append((ev[0].elapsed_time(ev[2]), ev[1].elapsed_time(ev[2])))
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def copy_bandwidth() -> float:
    """bytes/s of a 2 GiB device-to-device copy (read + write counted once each)."""
    a = torch.empty(1 << 30, dtype=torch.uint16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * a.element_size() * 10 / (start.elapsed_time(end) / 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "qwen3-0.6b.json")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--graphs", type=int, nargs="+", default=[0, 256], help="cuda_graph_max_bs values to compare")
    ap.add_argument("--split-kv-max-bs", type=int, default=None,
                    help="the largest decode batch that uses minisgl's split-KV attention (default: the backend's MAX_BS)")
    args = ap.parse_args()
    from minisgl.attention.fi import FlashInferSplitKVBackend

    if args.split_kv_max_bs is not None:
        FlashInferSplitKVBackend.MAX_BS = args.split_kv_max_bs

    bw = copy_bandwidth()
    folder = Path(tempfile.mkdtemp(prefix="minisgl-bench-"))
    random_checkpoint(args.config, folder)
    rows = []
    for graphs in args.graphs:
        max_bs = max(args.batch_sizes)
        ctx = args.context
        engine = decode_engine(folder, max_bs, ctx, graphs)
        weights = engine.model.state_dict()
        weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        embed = weights["model.embed_tokens.weight"]
        untied = not engine.model_config.tie_word_embeddings  # 绑定时 LM head 整个读一遍词表，下限里留着它
        per_token = 2 * engine.model_config.num_layers * engine.kv_cache.k_cache(0).shape[1] * \
            engine.model_config.head_dim * engine.dtype.itemsize
        for bs in args.batch_sizes:
            step_ms, fwd_ms = time_decode(engine, bs, ctx)
            # 一步真正读的：权重（没绑定时词嵌入只读 bs 行，不是整张表）+ 活着的 KV
            read = weight_bytes - untied * (embed.numel() - bs * embed.shape[1]) * embed.element_size()
            floor_ms = (read + bs * ctx * per_token) / bw * 1000
            rows.append((engine.model_config.architecture, graphs, bs, step_ms, fwd_ms, floor_ms))
        engine.shutdown()
        del engine
        torch.cuda.empty_cache()
    name = args.config.stem
    print(f"\n{name}: decode step, context {args.context} tokens per request, bf16, fi attention, page size 16, "
          f"split-KV up to {FlashInferSplitKVBackend.MAX_BS} requests")
    print(f"device copy bandwidth {bw / 1e12:.2f} TB/s; floor = (bytes a step reads: the weights, of an untied "
          f"embedding only the batch's rows, and the live KV) / bandwidth")
    print("step = prepare_batch + forward_batch (host work included); forward = forward_batch alone")
    print(f"{'graphs':>7} {'batch':>6} {'step ms':>8} {'forward ms':>10} {'floor ms':>9} {'fwd/floor':>9} "
          f"{'tokens/s':>9}")
    for _, graphs, bs, ms, fwd, floor in rows:
        print(f"{('on' if graphs else 'off'):>7} {bs:>6} {ms:>8.3f} {fwd:>10.3f} {floor:>9.3f} {fwd / floor:>9.2f} "
              f"{bs / ms * 1000:>9.0f}")
    shutil.rmtree(folder, ignore_errors=True)
    out = json.dumps([dict(config=name, graphs=bool(g), batch=bs, step_ms=ms, forward_ms=fw, floor_ms=f)
                      for _, g, bs, ms, fw, f in rows])
    print("JSON", out)


if __name__ == "__main__":
    main()

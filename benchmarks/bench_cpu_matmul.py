#!/usr/bin/env python3
"""The matmuls of one decode step on the CPU: torch's F.linear (MKL) against oneDNN with weights reordered once.

    python benchmarks/bench_cpu_matmul.py                 # the built-in SmolLM2-135M config, float32, 1 thread

The model is minisgl's own (random weights from its config, float32, on the CPU). One "step" calls forward on every
linear layer and the LM head once, each on its own random input of the batch size, in model order: the weights
(and so the bytes read) are exactly those of a decode step, without attention or norms. Each time is the median
of --repeats steps. Then every layer switches to oneDNN (use_onednn: the engine's default on the CPU) and the same
steps are timed again; the first column of results checks that both give the same logits. The header gives the
single-thread read bandwidth of this machine (a sum over 512 MB), and so the floor of a step at batch 1.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a model directory (default: the built-in SmolLM2-135M)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 256])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    from minisgl.distributed import set_tp_info
    from minisgl.layers import BaseOP
    from minisgl.models import ModelConfig, create_model, init_dummy_weight
    from minisgl.utils.hf import default_model_path, load_hf_config

    path = Path(args.model) if args.model else default_model_path()
    set_tp_info(0, 1)
    config = ModelConfig.from_hf(load_hf_config(path))
    with torch.device("cpu"):
        model = create_model(config)
    init_dummy_weight(model)

    ops, stack = [], [model]  # every op with use_onednn, in model order (what Engine._use_onednn switches)
    while stack:
        op = stack.pop(0)
        stack[:0] = [child for _, child in op.children() if isinstance(child, BaseOP)]
        if hasattr(op, "use_onednn"):
            ops.append(op)
    head = model.lm_head
    shapes = [(head.num_embeddings, config.hidden_size) if op is head else (op.output_size, op.input_size) for op in ops]
    in_size = {id(op): k for op, (_, k) in zip(ops, shapes)}
    nbytes = 4 * sum(n * k for n, k in shapes)
    flops = 2 * sum(n * k for n, k in shapes)  # per row of the batch

    big = torch.ones(128 * 2**20)  # 512 MB
    big.sum()
    t = time.perf_counter()
    for _ in range(3):
        big.sum()
    bandwidth = 3 * big.numel() * 4 / (time.perf_counter() - t)
    del big

    def step_ms(batch: int) -> float:
        g = torch.Generator().manual_seed(batch)
        xs = [torch.randn(batch, in_size[id(op)], generator=g) for op in ops]
        for op, x in zip(ops, xs):  # warm-up
            op.forward(x)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            for op, x in zip(ops, xs):
                op.forward(x)
            times.append(time.perf_counter() - t)
        return 1e3 * statistics.median(times)

    probe = torch.randn(4, config.hidden_size, generator=torch.Generator().manual_seed(0))
    before = {b: step_ms(b) for b in args.batch_sizes}
    want = head.forward(probe)
    for op in ops:
        op.use_onednn()
    got = head.forward(probe)
    after = {b: step_ms(b) for b in args.batch_sizes}

    print(f"{config.architecture} ({path.name}) on cpu ({cpu_name()}), float32, {torch.get_num_threads()} thread(s), torch {torch.__version__}; "
          f"{len(ops)} matmuls a step ({len(ops) - 1} linear layers + the LM head), {nbytes / 1e6:.0f} MB of weights")
    print(f"read bandwidth (a sum over 512 MB): {bandwidth / 1e9:.1f} GB/s, so reading the weights once takes "
          f"{nbytes / bandwidth * 1e3:.1f} ms; LM head logits, oneDNN vs F.linear: max |diff| "
          f"{(got - want).abs().max().item():.1e} (|logit| up to {want.abs().max().item():.1f})")
    print(f"{'batch':>5} {'F.linear ms':>12} {'oneDNN ms':>10} {'speed-up':>9} {'F.linear GFLOP/s':>17} {'oneDNN GFLOP/s':>15}")
    for b in args.batch_sizes:
        print(f"{b:>5} {before[b]:>12.1f} {after[b]:>10.1f} {before[b] / after[b]:>8.2f}x "
              f"{flops * b / before[b] / 1e6:>17.1f} {flops * b / after[b] / 1e6:>15.1f}")


if __name__ == "__main__":
    main()

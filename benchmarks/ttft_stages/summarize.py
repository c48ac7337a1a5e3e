#!/usr/bin/env python3
"""The table of `bench_serving.py --stages`: per stage of a request's way to its first token, mean/p50/p90 in ms.

    python benchmarks/ttft_stages/summarize.py TRACE_DIR [--first UID] [--count N]

TRACE_DIR holds the <pid>.txt files sitecustomize.py wrote; --first/--count pick the requests (API server uids, in
arrival order: bench_serving's warm-up requests come first). bench_serving.py picks the requests of its measured
run by their arrival time instead (since/until).
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

STAGES = [("api_recv", "api_sent", "API server: request -> sending"),
          ("api_sent", "tok_start", "sending -> tokenizer starts"), ("tok_start", "tok_done", "tokenize"),
          ("tok_done", "sched_recv", "tokenizer -> scheduler receives"),
          ("sched_recv", "launch", "scheduler: received -> launched"),
          ("launch", "sched_first", "launched -> first token sent"),
          ("sched_first", "detok", "scheduler -> detokenizer reply"), ("detok", "api_reply", "detokenizer -> API server"),
          ("api_recv", "api_reply", "inside the server, in all")]


def read_trace(trace_dir: Path) -> Dict[int, Dict[str, float]]:
    events: Dict[int, Dict[str, float]] = defaultdict(dict)
    for f in sorted(trace_dir.glob("*.txt")):
        for line in f.read_text().splitlines():
            uid, stage, t = line.split()
            events[int(uid)].setdefault(stage, float(t))
    return events


def pct(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def stage_table(trace_dir: Path, first: int = 0, count: int | None = None, since: float = 0.0,
                until: float = float("inf")) -> str:
    events = read_trace(trace_dir)
    wanted = [u for u in sorted(events) if u >= first and since <= events[u].get("api_recv", -1.0) <= until][:count]
    if not wanted:
        raise SystemExit(f"ttft_stages: no request in {trace_dir} was selected")
    rows = STAGES
    if not any("api_sent" in events[u] for u in wanted):  # traced before the tracer recorded api_sent
        rows = [("api_recv", "tok_start", "API server -> tokenizer starts")] + STAGES[2:]
    stages = {s for a, b, _ in rows for s in (a, b)}
    done = [u for u in wanted if stages <= events[u].keys()]
    if not done:
        raise SystemExit(f"ttft_stages: no request in {trace_dir} went through every stage")
    lines = [f"where the first token waits, inside the server: {len(done)} of {len(wanted)} requests traced "
             f"through every stage (uids {wanted[0]}..{wanted[-1]})",
             f"{'stage':<36}{'mean ms':>9}{'p50':>8}{'p90':>8}"]
    for a, b, label in rows:
        xs = [1e3 * (events[u][b] - events[u][a]) for u in done]
        lines.append(f"{label:<36}{statistics.mean(xs):>9.1f}{pct(xs, 50):>8.1f}{pct(xs, 90):>8.1f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--first", type=int, default=0, help="first uid to count")
    ap.add_argument("--count", type=int, default=None, help="how many uids from --first")
    args = ap.parse_args()
    print(stage_table(args.trace_dir, args.first, args.count))


if __name__ == "__main__":
    main()

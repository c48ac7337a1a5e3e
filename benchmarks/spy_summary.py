#!/usr/bin/env python3
"""Where one process's CPU time goes, from py-spy's raw (collapsed-stack) output.

    py-spy record --subprocesses --nonblocking --rate 200 --format raw -o spy.txt -p <server pid>
    python benchmarks/spy_summary.py spy.txt [--under _run_scheduler] [--skip Scheduler.__init__] [--top 30]

Keeps the samples whose stack passes through --under (default: the scheduler process's entry, launch.py's
_run_scheduler) and not through --skip (default: start-up, the scheduler's constructor), then prints each function's
inclusive share (it or anything it calls is on the CPU) and self share (it is the innermost frame). Line numbers
are dropped for the inclusive table and kept for the self table.
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path


def summarize(path: Path, under: str, skip: str, top: int) -> None:
    inclusive: collections.Counter[str] = collections.Counter()
    innermost: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        if not any(under in f for f in frames) or any(skip in f for f in frames):
            continue
        total += int(count)
        for name in {re.sub(r":\d+\)$", ")", f) for f in frames}:
            inclusive[name] += int(count)
        innermost[frames[-1]] += int(count)
    if not total:
        raise SystemExit(f"error: no sample in {path} passes through {under!r}")
    print(f"{total} samples through {under} (not {skip})")
    for title, table in (("inclusive", inclusive), ("self", innermost)):
        print(f"\n{title}:")
        for name, count in table.most_common(top):
            if count < total:  # the frames every sample has (process entry) say nothing
                print(f"{100 * count / total:5.1f}%  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw", type=Path, help="py-spy record --format raw output")
    ap.add_argument("--under", default="_run_scheduler", help="keep samples whose stack has this function")
    ap.add_argument("--skip", default="Scheduler.__init__", help="drop samples whose stack has this (default: start-up)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    summarize(args.raw, args.under, args.skip, args.top)


if __name__ == "__main__":
    main()

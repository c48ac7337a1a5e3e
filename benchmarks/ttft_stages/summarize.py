#!/usr/bin/env python3
"""The table of `bench_serving.py --stages` (bench_serving.stage_table) from a trace folder kept from an earlier run.

    python benchmarks/ttft_stages/summarize.py TRACE_DIR [--first UID] [--count N]

TRACE_DIR holds the <pid>.txt files sitecustomize.py wrote; --first/--count pick the requests (API server uids, in
arrival order: bench_serving's warm-up requests come first). bench_serving.py itself picks the requests of its
measured run by their arrival time.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_serving import stage_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--first", type=int, default=0, help="first uid to count")
    ap.add_argument("--count", type=int, default=None, help="how many uids from --first")
    args = ap.parse_args()
    print(stage_table(args.trace_dir, args.first, args.count))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Chapter 11's timeline on a GPU: a random-weight checkpoint in a real config, then examples/ch11_overlap.py on it.

    python benchmarks/timeline_gpu.py OUT.json [--config benchmarks/configs/qwen3-0.6b.json]

Writes the JSON the chapter's plot reads (copy it to book/data/ch11_timeline_h200.json).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import random_checkpoint  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("out")
ap.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "qwen3-0.6b.json")
args = ap.parse_args()
folder = random_checkpoint(args.config, Path(tempfile.mkdtemp(prefix="minisgl-timeline-")))
root = Path(__file__).resolve().parent.parent
sys.exit(subprocess.call([sys.executable, str(root / "examples" / "ch11_overlap.py"), "--model", str(folder),
                          "--out", args.out], cwd=root))

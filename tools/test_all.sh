#!/usr/bin/env bash
# Install, then run every check the project has (CI runs this as the README's command 2: .ci/run).
#   bash tools/test_all.sh
# At the end (and on a failure) it prints how long each step took. The edit-test loop is `python tools/quick.py`
# (CONTRIBUTING.md): the tangle, the touched chapters' tests and the judge, in minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STEPS=()  # "seconds|name" of each finished step
CURRENT="" ; STARTED=0 ; T0=$(date +%s)
FAILED="" ; BG_PID="" ; BG_NAME="" ; BG_LOG="" ; BG_STARTED=0  # the one step that runs in the background (see `background`)
step() {
  finish_step
  CURRENT="$*"; STARTED=$(date +%s)
  echo; echo "=== $* ($(date +%H:%M:%S))"
}
finish_step() {
  [ -n "$CURRENT" ] && STEPS+=("$(( $(date +%s) - STARTED ))|$CURRENT")
  CURRENT=""
}
# background NAME CMD...: start a step that runs alongside the steps after it (the machine's second core is idle
# during a one-process step); `wait_background` collects it, prints its output and fails if it failed.
background() {
  finish_step
  BG_NAME="$1"; shift
  BG_LOG=$(mktemp); BG_STARTED=$(date +%s)
  echo; echo "=== $BG_NAME ($(date +%H:%M:%S); in the background, alongside the next steps: its output comes when it ends)"
  set -m  # its own process group: a failure elsewhere stops it together with its children (node, chromium)
  ( rc=0; "$@" || rc=$?; date +%s >"$BG_LOG.end"; exit $rc ) >"$BG_LOG" 2>&1 &
  BG_PID=$!
  set +m
}
wait_background() {
  [ -n "$BG_PID" ] || return 0
  finish_step
  local rc=0 pid=$BG_PID
  wait "$pid" || rc=$?
  BG_PID=""
  echo; echo "=== $BG_NAME: its output (it ran in the background)"
  cat "$BG_LOG"
  STEPS+=("$(( $(cat "$BG_LOG.end" 2>/dev/null || date +%s) - BG_STARTED ))|[background] $BG_NAME")
  rm -f "$BG_LOG" "$BG_LOG.end"
  if [ $rc != 0 ]; then FAILED="$BG_NAME"; return $rc; fi
}
report() {
  local rc=$? failed="${FAILED:-$CURRENT}"
  finish_step
  if [ -n "$BG_PID" ]; then  # a failure while the background step runs: stop it (its process group), show its output
    kill -- -"$BG_PID" 2>/dev/null || kill "$BG_PID" 2>/dev/null || true
    wait "$BG_PID" 2>/dev/null || true
    echo; echo "=== $BG_NAME: stopped; its output so far"; cat "$BG_LOG"; rm -f "$BG_LOG" "$BG_LOG.end"
  fi
  echo; echo "=== time per step ([background]: ran alongside the steps after it, so the rows add up to more than the total)"
  local row
  for row in "${STEPS[@]}"; do
    printf '%6ss  %s\n' "${row%%|*}" "${row#*|}" | cut -c1-110
  done
  printf '%6ss  total (wall clock)\n' "$(( $(date +%s) - T0 ))"
  [ $rc = 0 ] || echo "FAILED in: $failed (exit $rc)"
}
trap report EXIT

step install
bash tools/install.sh

step "tangle --check: minisgl/, examples/, tests/ equal what the notebooks tangle to"
"$PY" tools/steps.py tangle --check

# Each chapter's example runs once, in the nbval step (its cell runs inside chapter N's tree, so it sees the code of
# chapters 1..N alone, and its output is compared strictly); here only a static check that it compiles and that
# chapters 1..N make every minisgl module and name it imports. Run them alone: `python tools/steps.py check [N ...]`.
step "steps.py check --static: each chapter's example compiles and imports only what chapters 1..N make; pyflakes finds no undefined name in any chapter's tree"
"$PY" tools/steps.py check --static

# The book first (a few minutes): it reads only stored outputs, so a broken build is known before the long
# notebook run.
step "book: lint (no project-internal words — leases, issue numbers, paths outside the repository — on a page a reader sees)"
"$PY" tools/book.py lint

# On the core the book build (one process) leaves idle, one after the other: the judge (one pytest process at a
# time); a smoke run of the feature benchmarks (they subclass the scheduler: a changed hook signature breaks them);
# bench_serving against a real server on the embedded model, two client processes (every stream complete). One torch
# thread each, so that they do not fight the build for its core.
beside_the_build() {
  "$PY" practice/judge.py --self-check
  echo; echo "--- benchmarks/bench_features.py shared --quick (smoke: the TimedLLM hooks still fit the scheduler)"
  OMP_NUM_THREADS=1 "$PY" benchmarks/bench_features.py shared --quick
  echo; echo "--- benchmarks/bench_serving.py --stages (smoke: every stream complete; the stage tracer still fits the server)"
  OMP_NUM_THREADS=1 "$PY" benchmarks/bench_serving.py --concurrency 4 --num-requests 8 --input-len 16 --output-len 8 \
    --client-procs 2 --no-hf-baseline --stages
  echo; echo "--- benchmarks/bench_serving.py --lengths --rounds 2 (smoke: per-request lengths, median rounds, both transformers baselines)"
  OMP_NUM_THREADS=1 "$PY" benchmarks/bench_serving.py --concurrency 4 --num-requests 8 --lengths 5 12 --rounds 2
  echo; echo "--- benchmarks/bench_tokenizer_queue.py (smoke: it still drives a tokenize_worker)"
  OMP_NUM_THREADS=1 "$PY" benchmarks/bench_tokenizer_queue.py --rates 5000 --seconds 1
}
background "practice judge; bench_features, bench_serving and bench_tokenizer_queue smoke runs" beside_the_build

step "book: jupyter-book build, warnings as errors"
"$PY" tools/book.py build

wait_background

step "benchmarks: bench_expand.py (smoke: the two per-token expansions agree on decode, mixed and prefill batches)"
"$PY" benchmarks/bench_expand.py --calls 20 --load 0 --threads 1
step "benchmarks: sgl_kernel_shim (upstream's two sgl_kernel ops in plain torch, for the MoE A/B) against upstream's example"
"$PY" benchmarks/sgl_kernel_shim/sgl_kernel/__init__.py

practice_web() {
  if [ -x /usr/bin/chromium ] && [ -d practice/web/node_modules/playwright-core ] && [ -f _build/html/practice/exercises.json ]; then
    node tools/test_practice_web.mjs _build/html
  elif [ "${CI:-}" = true ]; then
    echo "FAIL: no /usr/bin/chromium, playwright-core (practice/web/node_modules) or _build/html/practice: see tools/install.sh"; return 1
  else
    echo "skipped: no /usr/bin/chromium, playwright-core (practice/web/node_modules) or _build/html/practice (bash tools/install.sh installs them)"
  fi
}
# The browser test (about a minute: Pyodide loads once, the exercises switch inside the page) runs alongside the notebooks; it
# starts after the benchmarks, whose server takes every core (a busy core slows its OpenMP threads ~5x).
background "practice page: every browser exercise in headless Chromium (stub fails, reference passes)" practice_web

# Each chapter's tests (tests/test_chNN_*.py inside .build/trees/chNN/, the code as of chapter N) run once, here:
# every notebook's test cell is `steps.py test N` and its output is compared strictly, and the root conftest.py
# refuses a chapter whose test cell is missing, excused or stored failing. One notebook per CPU core at a time.
step "notebooks: every cell runs and prints what it stored (nbval, strict), incl. each chapter's tests; gpu cells skipped on CPU"
"$PY" tools/book.py nbval

wait_background

step "all checks passed"
finish_step

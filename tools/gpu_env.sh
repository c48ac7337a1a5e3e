# Sourced by tools/gpu_check.sh and tools/gpu_moe.sh (not run alone): the repository root as the working directory,
# $OUT, the carried wheels installed once into /tmp/site (the GPU machine has no network), and `run NAME CMD...`,
# which tees CMD's output to $OUT/NAME.txt and sets rc=1 when it fails. GPU_TAG names the script in that message.
# A call to the GPU machine has a time limit and brings back only a few files: GPU_BUDGET=SECONDS makes `run` start
# nothing once fewer than 30 s are left and give each command only what is left (a skipped or cut command counts as a
# failure, its name goes to $OUT/skipped.txt), counted from the first script that sourced this file; GPU_PACK=FILE.tgz
# packs $OUT into that one file after every command, so that whatever finished comes back even if the call is cut:
#   GPU_BUDGET=560 GPU_PACK=$OUT/gpu.tgz OUT=/tmp/gpu bash tools/gpu_check.sh
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD || export PYTHONPATH=$PWD
export PYTHONUNBUFFERED=1
export TQDM_DISABLE=1  # no progress bars (weights loading, shard writing) in the stored GPU outputs and tables
rc=0
export GPU_T0=${GPU_T0:-$(date +%s)}  # exported: gpu_moe.sh, run by gpu_check.sh, shares the budget
left() { echo $(( ${GPU_BUDGET:-999999} - ($(date +%s) - GPU_T0) )); }
run() {  # run NAME CMD...: tee the output to $OUT/NAME.txt, remember a failure
  local name=$1; shift
  local rest; rest=$(left)
  if [ "$rest" -lt 30 ]; then
    echo "${GPU_TAG:-gpu}: $name skipped: ${rest} s of GPU_BUDGET left" | tee -a "$OUT/skipped.txt"; rc=1
  else
    echo "=== $name: $*"
    local limit=(); [ -n "${GPU_BUDGET:-}" ] && limit=(timeout "$rest")
    "${limit[@]}" "$@" 2>&1 | grep --line-buffered -v "Loading weights" | tee "$OUT/$name.txt"  # line-buffered: a command killed at the time limit keeps what it printed
    local status=${PIPESTATUS[0]}
    [ "$status" -eq 124 ] && echo "${GPU_TAG:-gpu}: $name cut at the end of GPU_BUDGET" | tee -a "$OUT/skipped.txt"
    [ "$status" -eq 0 ] || { echo "${GPU_TAG:-gpu}: $name FAILED"; rc=1; }
  fi
  [ -n "${GPU_PACK:-}" ] && tar czf "$GPU_PACK" -C "$OUT" . 2>/dev/null  # skipped.txt too: the last pack has it
  return 0
}
run_cells() {  # run_cells [chNN ...]: those chapters' cells tagged gpu (default: every chapter's), outputs stored in the
  # notebooks; the notebooks go to $OUT/notebooks/ and book/data's JSON (ch11's cell rewrites its timeline) to $OUT/data/
  # back here: python tools/nb_take_outputs.py $OUT/notebooks/chNN_*.ipynb; cp $OUT/data/*.json book/data/
  local name=gpu_cells nb; [ $# -gt 0 ] && name="gpu_cells_$(IFS=_; echo "$*")"
  run "$name" python3 tools/steps.py execute "$@" --gpu-only
  mkdir -p "$OUT/notebooks" "$OUT/data"
  for nb in $(grep -l '"gpu"' book/chapters/*.ipynb); do
    [ $# -eq 0 ] || case " $* " in *" $(basename "$nb" | cut -c1-4) "*) ;; *) continue;; esac
    cp "$nb" "$OUT/notebooks/"
  done
  cp book/data/*.json "$OUT/data/"
}

# Sourced by tools/gpu_check.sh and tools/gpu_moe.sh (not run alone): the repository root as the working directory,
# $OUT, the carried wheels installed once into /tmp/site (the GPU machine has no network), and `run NAME CMD...`,
# which tees CMD's output to $OUT/NAME.txt and sets rc=1 when it fails. GPU_TAG names the script in that message.
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
run() {  # run NAME CMD...: tee the output to $OUT/NAME.txt, remember a failure
  local name=$1; shift
  echo "=== $name: $*"
  "$@" 2>&1 | grep --line-buffered -v "Loading weights" | tee "$OUT/$name.txt"  # line-buffered: a command killed at the time limit keeps what it printed
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "${GPU_TAG:-gpu}: $name FAILED"; rc=1; }
}

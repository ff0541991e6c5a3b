#!/usr/bin/env bash
# The checks for a machine with one CUDA GPU, about 9 minutes on an H200: the tests marked gpu,
# then benchmarks/megatron_train.py on qwen3-0.6b and qwen3-1.7b with each trainer, megatron-core
# in the shipped layout and then trainer.backend=torch (FSDP2), each with the plain PyTorch loop
# beside it (--baseline, 3 timed rollouts), and a summary of their tokens/s, memory and ratio rows.
#
# From the project root on the GPU machine, after the GPU packaging of ../shared/gpu/README.md
# (make-site.sh: .gpu/site holds the Python packages that travel, .gpu/main a copy of the code):
#     bash benchmarks/gpu_checks.sh             # this checkout's code
#     bash .gpu/main/benchmarks/gpu_checks.sh   # the packaged copy, where only .gpu travelled
# Logs go to $OUT (default ./gpu-out), one per check, with status.txt (exit code and seconds of
# each). Every check runs under `timeout`; one that fails or runs out of time does not stop
# the rest. PYTHON: the interpreter (default python3). SIZES: the model sizes (default
# "0.6b 1.7b"; SIZES=tiny runs the whole script on a CPU in about a minute).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SITE=""
for dir in "$PWD/.gpu/site" "$ROOT/.gpu/site" "$ROOT/../site"; do
  if [ -d "$dir/hydra" ]; then SITE=$(cd "$dir" && pwd); break; fi
done
export PYTHONPATH="${SITE:+$SITE:}$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
: >"$OUT/status.txt"
cd "$ROOT" || exit 1

# check NAME LIMIT_S COMMAND...: COMMAND's output to $OUT/NAME.log, its exit code to status.txt
check() {
  local name=$1 limit=$2 start=$SECONDS rc note=""
  shift 2
  echo "== $name (at most $limit s)"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  [ "$rc" -eq 124 ] && note=" (timed out)"
  echo "$name: exit $rc$note, $((SECONDS - start)) s" | tee -a "$OUT/status.txt"
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', \
torch.__version__, 'transformers', transformers.__version__)"
  "$PY" -c "import megatron.core as m; print('megatron-core', m.__version__)"
  echo "code: $ROOT, packages: ${SITE:-none}"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

mapfile -t GPU_TESTS < <(grep -rl "mark.gpu" tests)
check pytest_gpu 100 "$PY" -m pytest -m gpu -p no:cacheprovider -q -rA "${GPU_TESTS[@]}"
for size in ${SIZES:-0.6b 1.7b}; do
  limit=100
  [ "$size" = 1.7b ] && limit=120
  bench=(benchmarks/megatron_train.py --size "$size" --steps 3 --baseline)
  check "train_${size}_megatron" "$limit" "$PY" "${bench[@]}"
  check "train_${size}_torch" "$limit" "$PY" "${bench[@]}" trainer.backend=torch
done

ROWS='^(layout|train tokens/s|MFU \(of|max_memory_allocated|peak RSS growth|plan train estimate'
ROWS+='|reference weights|measured / \(estimate|step time / plan|plain |rlpost / plain)'
echo
echo "== summary (logs in $OUT)"
cat "$OUT/status.txt"
echo "-- pytest -m gpu"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed|skipped|error)" "$OUT/pytest_gpu.log" \
  || tail -n 5 "$OUT/pytest_gpu.log"
for size in ${SIZES:-0.6b 1.7b}; do
  for backend in megatron torch; do
    log="$OUT/train_${size}_${backend}.log"
    echo "-- $size, $backend"
    grep -E "$ROWS" "$log" || tail -n 5 "$log"
  done
done

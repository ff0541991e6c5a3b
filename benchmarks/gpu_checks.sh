#!/usr/bin/env bash
# The checks for a machine with one CUDA GPU, most important first: the tests marked gpu; the
# layer's elementwise kernels eager and compiled (benchmarks/layer_kernels.py); then
# benchmarks/megatron_train.py on qwen3-0.6b and qwen3-1.7b with the megatron trainer in the
# shipped layout beside the plain PyTorch loop (--baseline, 3 timed rollouts), the torch
# trainer (FSDP2) on the same shapes (its ratio is taken against the megatron check's plain
# loop), the torch trainer on 0.6b with SDPA's own backend order instead of cuDNN's attention
# first, qwen3-0.6b without recompute (beside the plain loop without checkpointing) and with
# selective recompute (memory against the plan), 0.6b without recompute on the padded path
# (SDPA) and on the varlen kernel alone (the training checks choose between them by a
# measurement, benchmarks/megatron_train.py --attention), 0.6b on samples of ragged lengths
# with each of the three and with the torch trainer (both pad each group of samples of similar
# lengths to its longest: memory against the plan's bound), the padded two again with cuDNN's
# plans keyed by lengths rounded up to powers of two, qwen3-4b in the shipped layout, 1.7b
# and 4b without recompute (the MFU goal's runs), a profiled 0.6b step (top kernels, and by input shapes; host reads), the torch trainer
# with its layers kept gathered from forward to backward; after the training checks of SIZES,
# one MoE layer's experts as grouped GEMMs against one at a time (benchmarks/moe_experts.py).
# A summary of tokens/s, memory and ratio rows ends it.
#
# From the project root on the GPU machine, after the GPU packaging of ../shared/gpu/README.md
# (make-site.sh: .gpu/site holds the Python packages that travel):
#     bash benchmarks/gpu_checks.sh                     # every check, in order
#     CHECKS="train_4b_megatron profile_0.6b" bash benchmarks/gpu_checks.sh
# Logs go to $OUT (default ./gpu-out), one per check, with status.txt (exit code and seconds of
# each). Every check runs under `timeout`; one that fails or runs out of time does not stop the
# rest. BUDGET_S (default 540): the seconds the whole script may take; a check gets at most
# what is left of it, and none starts with under 30 s left. PYTHON: the interpreter (default
# python3). SIZES: the model sizes of the training checks (default "0.6b 1.7b"; SIZES=tiny
# runs them on a CPU in about a minute; 4b and the memory and profile checks follow SIZES'
# first size there).
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
BUDGET_S=${BUDGET_S:-540}
SIZES=${SIZES:-0.6b 1.7b}
read -r FIRST _ <<<"$SIZES"
LAST=${SIZES##* }
BIG=4b SMALL=0.6b
[ "$FIRST" = tiny ] && BIG=tiny SMALL=tiny
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
: >"$OUT/status.txt"
cd "$ROOT" || exit 1

# check NAME LIMIT_S COMMAND...: COMMAND's output to $OUT/NAME.log, its exit code to status.txt;
# skipped when CHECKS names others, or when under 30 s of BUDGET_S is left
check() {
  local name=$1 limit=$2 start=$SECONDS rc note=""
  shift 2
  if [ -n "${CHECKS:-}" ] && [[ " $CHECKS " != *" $name "* ]]; then return; fi
  local left=$((BUDGET_S - SECONDS))
  if [ "$left" -lt 30 ]; then
    echo "$name: skipped, ${left} s of the budget left" | tee -a "$OUT/status.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
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

bench() {  # bench SIZE STEPS ARGS...: megatron_train.py's command
  local size=$1 steps=$2
  shift 2
  echo "$PY" benchmarks/megatron_train.py --size "$size" --steps "$steps" "$@"
}
mapfile -t GPU_TESTS < <(grep -rl "mark.gpu" tests)
check pytest_gpu 180 "$PY" -m pytest -m gpu -p no:cacheprovider -q -rA "${GPU_TESTS[@]}"
# a torch build whose fused RMSNorm kernels fail their test: the benchmarks without them
if grep -q "^FAILED.*test_rms_norm_runs_torchs_fused_kernels_on_cuda" "$OUT/pytest_gpu.log" 2>/dev/null; then
  export RLPOST_FUSED_RMS_NORM=0
  echo "fused RMSNorm failed its gpu test: RLPOST_FUSED_RMS_NORM=0 for the rest" | tee -a "$OUT/status.txt"
fi
# compiled kernels that differ from the eager arithmetic: the benchmarks without them
if grep -q "^FAILED.*test_inductor_kernels_match_the_eager_arithmetic_on_cuda" "$OUT/pytest_gpu.log" 2>/dev/null; then
  export RLPOST_COMPILE=0
  echo "compiled kernels failed their gpu test: RLPOST_COMPILE=0 for the rest" | tee -a "$OUT/status.txt"
fi
check "kernels_${SMALL}" 90 "$PY" benchmarks/layer_kernels.py --size "$SMALL"
for size in $SIZES; do
  check "train_${size}_megatron" 130 $(bench "$size" 3 --baseline)
done
for size in $SIZES; do
  check "train_${size}_torch" 120 $(bench "$size" 3) trainer.backend=torch
done
# one MoE layer's experts (qwen3-30b-a3b's) as grouped GEMMs against one at a time
# (model.moe.grouped_gemm), the local experts of 8 expert-parallel ranks and of one
if [ "$FIRST" = tiny ]; then
  check "experts_tiny" 60 "$PY" benchmarks/moe_experts.py --tiny
else
  for ep in 8 1; do
    check "experts_30b_ep${ep}" 60 "$PY" benchmarks/moe_experts.py --model qwen3-30b-a3b --ep "$ep"
  done
fi
# the torch trainer's attention in SDPA's own order (train_0.6b_torch asks for cuDNN's first)
check "torch_${SMALL}_sdpa_order" 90 env RLPOST_CUDNN_ATTENTION=0 $(bench "$SMALL" 2) \
  trainer.backend=torch
check "memory_${SMALL}_none" 90 $(bench "$SMALL" 2 --baseline) layout.train.recompute.granularity=none
check "memory_${SMALL}_selective" 70 $(bench "$SMALL" 2) layout.train.recompute.granularity=selective
# equal samples (no padding) on the padded path and on the varlen kernel, against
# memory_0.6b_none's choice between them (auto: the padded path where it measured faster)
for attention in padded varlen; do
  check "${attention}_${SMALL}" 70 $(bench "$SMALL" 2 --attention "$attention") \
    layout.train.recompute.granularity=none
done
for attention in auto padded varlen; do  # samples of 1,024-4,096 tokens
  check "ragged_${SMALL}_$attention" 70 $(bench "$SMALL" 2 --ragged --attention "$attention") \
    layout.train.recompute.granularity=none
done
check "ragged_${SMALL}_torch" 70 $(bench "$SMALL" 2 --ragged) trainer.backend=torch \
  layout.train.recompute.granularity=none
# the same two padded runs with torch's cuDNN plans keyed by lengths rounded up to powers of
# two (rlpost.backends.sdpa.RAGGED_PLANS_ENV): ragged groups share plans, and the budget of
# plans (sdpa.CUDNN_PLANS) counts them so
check "ragged_${SMALL}_padded_pow2" 70 env TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 \
  $(bench "$SMALL" 2 --ragged --attention padded) layout.train.recompute.granularity=none
check "ragged_${SMALL}_torch_pow2" 70 env TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 \
  $(bench "$SMALL" 2 --ragged) trainer.backend=torch layout.train.recompute.granularity=none
check "train_${BIG}_megatron" 150 $(bench "$BIG" 2)
# the MFU goal's models without recompute, as layout=auto runs them where they fit (the plan
# refuses 4b so on an 80 GB card: exit 2 within seconds); 1.7b beside the plain loop without
# checkpointing
check "train_${LAST}_megatron_none" 130 $(bench "$LAST" 3 --baseline) \
  layout.train.recompute.granularity=none
if [ "$BIG" != "$LAST" ]; then
  check "train_${BIG}_megatron_none" 150 $(bench "$BIG" 2) layout.train.recompute.granularity=none
fi
check "profile_${SMALL}" 120 $(bench "$SMALL" 1 --profile) layout.train.recompute.granularity=none
# the torch trainer with every layer kept gathered from forward to backward (one gather a
# micro-batch instead of two; on one GPU a cast, not a collective), beside train_0.6b_torch
check "torch_${SMALL}_kept" 90 $(bench "$SMALL" 2) trainer.backend=torch \
  layout.train.fsdp.reshard_after_forward=false
ROWS='^(layout|step time s|train tokens/s|MFU \(of|max_memory_(allocated|reserved)|peak RSS growth'
ROWS+='|plan train estimate|reference weights|measured / \(estimate|reserved / estimate'
ROWS+='|step time / plan|plain |rlpost / plain|padded attention share|padded rows per token'
ROWS+='|cuDNN attention plans)'
row() {  # row LOG NAME: the value printed on LOG's row NAME, thousands separators dropped
  grep -E "^$2 " "$1" 2>/dev/null | sed -E "s|^$2 +||; s|,||g; s| .*||"
}
echo
echo "== summary (logs in $OUT)"
cat "$OUT/status.txt"
if [ -f "$OUT/pytest_gpu.log" ]; then
  echo "-- pytest -m gpu"
  grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed|skipped|error)" \
    "$OUT/pytest_gpu.log" || tail -n 5 "$OUT/pytest_gpu.log"
fi
if [ -f "$OUT/kernels_${SMALL}.log" ]; then
  echo "-- kernels_${SMALL}"
  grep -v -i warn "$OUT/kernels_${SMALL}.log" | tail -n 25
fi
for log in "$OUT"/train_*.log "$OUT"/torch_*.log "$OUT"/memory_*.log "$OUT"/padded_*.log \
  "$OUT"/varlen_*.log "$OUT"/ragged_*.log; do
  [ -f "$log" ] || continue
  echo "-- $(basename "$log" .log)"
  grep -E "$ROWS" "$log" || tail -n 5 "$log"
done
for size in $SIZES; do  # the torch trainer against the megatron check's plain loop
  plain=$(row "$OUT/train_${size}_megatron.log" "plain train tokens/s")
  ours=$(row "$OUT/train_${size}_torch.log" "train tokens/s")
  if [ -n "$plain" ] && [ -n "$ours" ]; then
    echo "-- $size: torch trainer / plain loop tokens/s $(awk "BEGIN {printf \"%.3f\", $ours / $plain}")"
  fi
done
for log in "$OUT"/experts_*.log; do
  [ -f "$log" ] || continue
  echo "-- $(basename "$log" .log)"
  grep -E "^(cuda|cpu|experts one|grouped)" "$log" || tail -n 5 "$log"
done
if [ -f "$OUT/profile_${SMALL}.log" ]; then
  echo "-- profile_${SMALL}"
  sed -n '/rlpost train step, profiled/,$p' "$OUT/profile_${SMALL}.log" | head -n 75
fi

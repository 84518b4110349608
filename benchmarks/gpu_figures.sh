#!/usr/bin/env bash
# The GPU figures of docs/performance.md (issue 20), one stage per argument:
#
#   bash benchmarks/gpu_figures.sh throughput hmid attention token_drop sigmoid xla_flags fsdp \
#     memory_options profile stability torch tests
#   bash benchmarks/gpu_figures.sh --dry_run            # every stage, tiny shapes, on the CPU
#
# throughput:     MERU, CLIP, ATMG at ViT-B/16 batch 256 and MERU ViT-L/16 batch 128,
#                 default settings.
# hmid:           HMID-Net ViT-B/16 batch 256 at mask ratio 0, then 0.5 (two commands).
# attention:      MERU ViT-B/16 batch 256 with XLA's attention, then cuDNN's fused attention
#                 (the GPU default), then (unless GELU_TANH=0) cuDNN with the tanh GELU.
# token_drop:     MERU ViT-B/16 batch 256 with FLIP's token dropping at each fraction of
#                 $TOKEN_DROPS (default "0.5 0.75"; config.model.image_token_drop).
# sigmoid:        MERU and CLIP ViT-B/16 batch 256 with the pairwise sigmoid loss (loss=sigmoid);
#                 with several GPUs, MERU's also with its text columns passed around a ring.
# xla_flags:      MERU ViT-B/16 batch 256 under XLA GPU flags, one at a time.
# fsdp:           MERU ViT-L/16, 16 rows per GPU, config.mesh.fsdp = 1, 2, 4, 8 up to the
#                 GPU count: state bytes per device, XLA's memory analysis, step time.
# memory_options: MERU ViT-B/16 batch 256 with rematerialised towers (every config.model
#                 key ending in "remat" set to $REMAT, default "full") and with gradient
#                 accumulation (config.optim.accumulation_steps=$ACCUM_STEPS, default 4),
#                 each only where this checkout's config has the key; bf16 first moment
#                 (config.optim.mu_dtype=bfloat16).
# profile:        a jax.profiler trace of 3 MERU ViT-B/16 batch 256 steps, split by
#                 kernel class (benchmarks/profile_split.py).
# stability:      2,000 bf16 MERU ViT-S/16 steps on synthetic input, every scalar
#                 metric checked for NaN/Inf every 100 steps.
# torch:          MERU's PyTorch step side by side (needs MERU_REPO, a checkout of
#                 facebookresearch/meru, and loguru importable).
# tests:          a CPU subset of the test suite under the installed jax.
#
# No stage argument runs every stage. Each command has its own time limit (at
# most 540 s, so each fits a 10-minute slot) and compiled steps are kept in
# the persistent compilation cache ($JAX_COMPILATION_CACHE_DIR, default
# $LOG_DIR/jax_cache), so a repeated command skips its compilation.
# --dry_run: every step_throughput command of the named stages compiled at
# tiny shapes (step_throughput --dry_run) on 8 virtual CPU devices, nothing
# timed; cuDNN attention is compiled as XLA attention there, and the torch and
# tests stages are skipped. Each stage appends to $LOG_DIR/<stage>.log
# (default /tmp/gpu_figures); the exit status is 1 if any command failed.
set -u -o pipefail
DRY_RUN=0
STAGES=()
for argument in "$@"; do
  case $argument in
    --dry_run) DRY_RUN=1 ;;
    *) STAGES+=("$argument") ;;
  esac
done
if [ ${#STAGES[@]} -eq 0 ]; then
  STAGES=(throughput hmid attention token_drop sigmoid xla_flags fsdp memory_options profile stability torch tests)
fi
LOG_DIR=${LOG_DIR:-/tmp/gpu_figures}
STEPS=${STEPS:-20}
mkdir -p "$LOG_DIR"
export PYTHONUNBUFFERED=1
# The checkout's root on the path, so scripts run by file name (the torch
# stage) import configs/ and the package without `pip install -e .`.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$LOG_DIR/jax_cache}
FAILED=0
if [ "$DRY_RUN" = 1 ]; then
  export JAX_PLATFORMS=cpu
  GPUS=8
  CPU_DEVICES=--xla_force_host_platform_device_count=8
else
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
  [ "${GPUS:-0}" -gt 0 ] || GPUS=1
  CPU_DEVICES=
fi

bench() {
  local log=$1 limit=$2
  shift 2
  local extra=()
  [ "$DRY_RUN" = 1 ] && extra=(--dry_run)
  echo "=== $(date -u +%T) python -m hyperbolic_vl.tools.step_throughput $* ${extra[*]}" | tee -a "$log"
  # XLA reads a non-empty XLA_FLAGS that does not start with "--" as a file
  # name, so a blank one (no flags on a GPU) is unset, not passed as " ".
  local xla_flags
  xla_flags=$(echo "${XLA_FLAGS:-} $CPU_DEVICES" | xargs)
  (
    if [ -n "$xla_flags" ]; then export XLA_FLAGS="$xla_flags"; else unset XLA_FLAGS; fi
    timeout "$limit" python -m hyperbolic_vl.tools.step_throughput "$@" "${extra[@]}"
  ) 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" | tee -a "$log"
  local status=${PIPESTATUS[0]}
  [ "$status" = 0 ] || FAILED=1
  echo "=== rc=$status" | tee -a "$log"
}

skip() {
  local log=$1
  shift
  echo "=== skipped: $*" | tee -a "$log"
}

# The model keys of configs/meru.py:vit_b that end in "remat", space separated;
# exit status 0 if config.optim has accumulation_steps.
remat_keys() {
  python -c "
from configs import meru
print(' '.join(k for k in meru.get_config('vit_b').model if k.endswith('remat')))"
}
has_accumulation() {
  python -c "
import sys
from configs import meru
sys.exit(0 if 'accumulation_steps' in meru.get_config('vit_b').optim else 1)"
}

for stage in "${STAGES[@]}"; do
  log="$LOG_DIR/$stage.log"
  case $stage in
    throughput)
      [ "$DRY_RUN" = 1 ] ||
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$log"
      bench "$log" 240 --config=configs/meru.py:vit_b --config.input.batch_size=256 --steps="$STEPS"
      bench "$log" 240 --config=configs/clip.py:vit_b --config.input.batch_size=256 --steps="$STEPS"
      bench "$log" 240 --config=configs/atmg.py:vit_b --config.input.batch_size=256 --steps="$STEPS"
      bench "$log" 300 --config=configs/meru.py:vit_l --config.input.batch_size=128 --steps="$STEPS"
      ;;
    hmid)
      for ratio in 0 0.5; do
        bench "$log" 420 --config=configs/hmid.py:vit_b --config.input.batch_size=256 \
          --steps="$STEPS" --mask_ratios="$ratio"
      done
      ;;
    attention)
      for attention in xla cudnn; do
        bench "$log" 240 --config=configs/meru.py:vit_b --config.input.batch_size=256 \
          --steps="$STEPS" --attention="$attention"
      done
      if [ "${GELU_TANH:-1}" = 1 ]; then
        bench "$log" 240 --config=configs/meru.py:vit_b --config.input.batch_size=256 \
          --steps="$STEPS" --attention=cudnn --config.model.activation=gelu_tanh
      fi
      ;;
    token_drop)
      for drop in ${TOKEN_DROPS:-0.5 0.75}; do
        bench "$log" 240 --config=configs/meru.py:vit_b --config.input.batch_size=256 \
          --steps="$STEPS" --config.model.image_token_drop="$drop"
      done
      ;;
    sigmoid)
      bench "$log" 240 --config=configs/meru.py:vit_b,loss=sigmoid --config.input.batch_size=256 \
        --steps="$STEPS"
      if [ "$GPUS" -gt 1 ]; then
        bench "$log" 240 --config=configs/meru.py:vit_b,loss=sigmoid --config.input.batch_size=256 \
          --steps="$STEPS" --config.objective.sigmoid_columns=ring
      else
        skip "$log" "the ring of text columns needs several GPUs ($GPUS here)"
      fi
      bench "$log" 240 --config=configs/clip.py:vit_b,loss=sigmoid --config.input.batch_size=256 \
        --steps="$STEPS"
      ;;
    xla_flags)
      for flag in --xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false; do
        XLA_FLAGS=$flag bench "$log" 240 --config=configs/meru.py:vit_b \
          --config.input.batch_size=256 --steps="$STEPS"
      done
      ;;
    fsdp)
      for fsdp in 1 2 4 8; do
        if [ "$fsdp" -gt "$GPUS" ]; then
          skip "$log" "fsdp=$fsdp needs $fsdp GPUs ($GPUS here)"
          continue
        fi
        bench "$log" 360 --config=configs/meru.py:vit_l --config.input.batch_size=$((16 * GPUS)) \
          --config.mesh.fsdp="$fsdp" --steps="$STEPS"
      done
      ;;
    memory_options)
      keys=$(remat_keys)
      if [ -n "$keys" ]; then
        overrides=()
        for key in $keys; do overrides+=("--config.model.$key=${REMAT:-full}"); done
        bench "$log" 300 --config=configs/meru.py:vit_b --config.input.batch_size=256 \
          --steps="$STEPS" "${overrides[@]}"
      else
        skip "$log" "rematerialisation: no config.model key ending in remat in this checkout"
      fi
      if has_accumulation; then
        bench "$log" 300 --config=configs/meru.py:vit_b --config.input.batch_size=256 \
          --steps="$STEPS" --config.optim.accumulation_steps="${ACCUM_STEPS:-4}"
      else
        skip "$log" "gradient accumulation: no config.optim.accumulation_steps in this checkout"
      fi
      bench "$log" 240 --config=configs/meru.py:vit_b --config.input.batch_size=256 \
        --steps="$STEPS" --config.optim.mu_dtype=bfloat16
      ;;
    profile)
      profile_dir="$LOG_DIR/profile_meru_vit_b"
      # XLA:GPU replays a step's kernels as CUDA graphs ("command buffers"),
      # which the trace shows as one event each (on an H100, 96% of the step
      # in command_buffer_1): the profiled step runs without them, so each
      # kernel is its own event (its step time is printed beside the split).
      XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" bench "$log" 300 \
        --config=configs/meru.py:vit_b --config.input.batch_size=256 \
        --steps=5 --profile_dir="$profile_dir"
      if [ "$DRY_RUN" = 1 ]; then
        skip "$log" "profile_split (a dry run takes no trace)"
      else
        python benchmarks/profile_split.py --profile="$profile_dir" --top=5 2>&1 | tee -a "$log"
        [ "${PIPESTATUS[0]}" = 0 ] || FAILED=1
      fi
      ;;
    stability)
      bench "$log" 540 --config=configs/meru.py:vit_s --config.input.batch_size="${STABILITY_BATCH:-256}" \
        --steps=2000 --warmup=0 --check_finite_every=100
      ;;
    torch)
      if [ "$DRY_RUN" = 1 ]; then
        skip "$log" "torch (needs PyTorch and a MERU checkout; nothing to compile)"
        continue
      fi
      echo "=== $(date -u +%T) torch side by side" | tee -a "$log"
      timeout 300 python benchmarks/torch_step_side_by_side.py --meru_repo="$MERU_REPO" \
        --device=gpu --shapes=vit_b --rounds=3 --vit_steps="${TORCH_STEPS:-10}" 2>&1 |
        grep -v "^WARNING\|^I0000\|^W0000" | tee -a "$log"
      status=${PIPESTATUS[0]}
      [ "$status" = 0 ] || FAILED=1
      echo "=== rc=$status" | tee -a "$log"
      ;;
    tests)
      if [ "$DRY_RUN" = 1 ]; then
        skip "$log" "tests (they run themselves)"
        continue
      fi
      echo "=== $(date -u +%T) CPU tests" | tee -a "$log"
      JAX_PLATFORMS=cpu timeout 480 python -m pytest -q -x -p no:cacheprovider \
        tests/geometry/test_geometry.py tests/objectives/test_meru_clip.py \
        tests/objectives/test_chunked_loss.py tests/train/test_fsdp.py 2>&1 | tee -a "$log"
      status=${PIPESTATUS[0]}
      [ "$status" = 0 ] || FAILED=1
      echo "=== rc=$status" | tee -a "$log"
      ;;
    *)
      echo "unknown stage $stage" >&2
      exit 2
      ;;
  esac
done
exit $FAILED

#!/usr/bin/env bash
# The GPU figures of README "Performance", one stage per argument:
#
#   bash benchmarks/gpu_figures.sh throughput hmid attention xla_flags torch stability tests
#
# throughput: MERU, CLIP, ATMG at ViT-B/16 batch 256 and MERU ViT-L/16 batch
#             128, default settings.
# hmid:       HMID-Net ViT-B/16 batch 256 at mask ratios 0 and 0.5.
# attention:  MERU ViT-B/16 batch 256 with cuDNN fused attention.
# xla_flags:  MERU ViT-B/16 batch 256 under XLA GPU flags, one at a time.
# torch:      MERU's PyTorch step side by side (needs MERU_REPO, a checkout of
#             facebookresearch/meru, and loguru importable).
# stability:  2,000 bf16 MERU ViT-S/16 steps on synthetic input, every scalar
#             metric checked for NaN/Inf every 100 steps.
# tests:      a CPU subset of the test suite under the installed jax.
#
# Each stage appends to $LOG_DIR/<stage>.log (default /tmp/gpu_figures).
set -u -o pipefail
LOG_DIR=${LOG_DIR:-/tmp/gpu_figures}
STEPS=${STEPS:-20}
mkdir -p "$LOG_DIR"
export PYTHONUNBUFFERED=1

bench() {
  local log=$1 limit=$2
  shift 2
  echo "=== $(date -u +%T) python -m hyperbolic_vl.step_throughput $*" | tee -a "$log"
  timeout "$limit" python -m hyperbolic_vl.step_throughput "$@" 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" |
    tee -a "$log"
  echo "=== rc=$?" | tee -a "$log"
}

for stage in "$@"; do
  log="$LOG_DIR/$stage.log"
  case $stage in
    throughput)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$log"
      bench "$log" 150 --config=configs/meru.py:vit_b --config.input.batch_size=256 --steps="$STEPS"
      bench "$log" 150 --config=configs/clip.py:vit_b --config.input.batch_size=256 --steps="$STEPS"
      bench "$log" 150 --config=configs/atmg.py:vit_b --config.input.batch_size=256 --steps="$STEPS"
      bench "$log" 180 --config=configs/meru.py:vit_l --config.input.batch_size=128 --steps="$STEPS"
      ;;
    hmid)
      bench "$log" 300 --config=configs/hmid.py:vit_b --config.input.batch_size=256 \
        --steps="$STEPS" --mask_ratios=0,0.5
      ;;
    attention)
      bench "$log" 150 --config=configs/meru.py:vit_b --config.input.batch_size=256 \
        --steps="$STEPS" --attention=cudnn
      ;;
    xla_flags)
      for flag in --xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false; do
        XLA_FLAGS=$flag bench "$log" 150 --config=configs/meru.py:vit_b \
          --config.input.batch_size=256 --steps="$STEPS"
      done
      ;;
    torch)
      echo "=== $(date -u +%T) torch side by side" | tee -a "$log"
      timeout 240 python benchmarks/torch_step_side_by_side.py --meru_repo="$MERU_REPO" \
        --device=gpu --shapes=vit_b --rounds=3 --vit_steps="${TORCH_STEPS:-10}" 2>&1 |
        grep -v "^WARNING\|^I0000\|^W0000" | tee -a "$log"
      echo "=== rc=$?" | tee -a "$log"
      ;;
    stability)
      bench "$log" 500 --config=configs/meru.py:vit_s --config.input.batch_size="${STABILITY_BATCH:-256}" \
        --steps=2000 --warmup=0 --check_finite_every=100
      ;;
    tests)
      echo "=== $(date -u +%T) CPU tests" | tee -a "$log"
      JAX_PLATFORMS=cpu timeout 400 python -m pytest -q -x -p no:cacheprovider \
        tests/geometry/test_geometry.py tests/objectives/test_meru_clip.py tests/objectives/test_chunked_loss.py 2>&1 | tee -a "$log"
      echo "=== rc=$?" | tee -a "$log"
      ;;
    *)
      echo "unknown stage $stage" >&2
      exit 2
      ;;
  esac
done

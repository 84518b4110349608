#!/usr/bin/env bash
# Cloud TPU VM pod slice: the same command on every worker; JAX finds its
# peers from the TPU metadata (jax.distributed.initialize()).
#
#   bash launch/tpu_vm.sh my-tpu us-central2-b configs/meru.py:vit_l,data=tfds gs://bucket/runs/meru_l \
#       --config.input.data.tfds_name=my_captions \
#       --config.input.data.data_dir=gs://bucket/tfds
#
# Before anything runs on the slice, this machine compiles the config's step
# for the slice's topology (python -m hyperbolic_vl.tools.aot, the `aot`
# extra) and stops when it cannot fit a chip (exit 2, the levers in one
# line). The topology is the slice's own (gcloud describe), or TOPOLOGY=v5p:4x4x8;
# SKIP_AOT=1 skips the check.
set -euo pipefail
tpu=${1:?tpu name}; zone=${2:?zone}; config=${3:?config}; workdir=${4:?workdir}; shift 4
extra=$(printf ' %q' "$@")
if [[ "${SKIP_AOT:-0}" != 1 ]]; then
  topology=${TOPOLOGY:-}
  if [[ -z "$topology" ]]; then
    read -r type shape < <(gcloud compute tpus tpu-vm describe "$tpu" --zone="$zone" \
      --format='value(acceleratorConfig.type,acceleratorConfig.topology)')
    case "$type" in
      V4) topology="v4:$shape" ;;
      V5LITE_POD) topology="v5e:$shape" ;;
      V5P) topology="v5p:$shape" ;;
      V6E) topology="v6e:$shape" ;;
      *) echo "error: cannot name the topology of $tpu ($type $shape); set TOPOLOGY= or SKIP_AOT=1" >&2; exit 2 ;;
    esac
  fi
  overrides=()
  for arg in "$@"; do [[ "$arg" == --config.* ]] && overrides+=("$arg"); done
  JAX_PLATFORMS=cpu python -m hyperbolic_vl.tools.aot --config="$config" --topology="$topology" \
    "${overrides[@]}" || { echo "error: the step does not compile or fit on $topology; nothing was started (SKIP_AOT=1 skips this check)" >&2; exit 2; }
fi
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command="
  cd ~/hyperbolic_vl && python -m hyperbolic_vl.main --multihost \
    --config='$config' --workdir='$workdir'$extra"

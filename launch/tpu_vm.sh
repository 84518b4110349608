#!/usr/bin/env bash
# Cloud TPU VM pod slice: the same command on every worker; JAX finds its
# peers from the TPU metadata (jax.distributed.initialize()). From the
# repository root of this machine (the workers' checkout is ~/hyperbolic_vl):
#
#   bash launch/tpu_vm.sh my-tpu us-central2-b configs/meru.py:vit_l,data=tfds gs://bucket/runs/meru_l \
#       --config.input.data.tfds_name=my_captions \
#       --config.input.data.data_dir=gs://bucket/tfds
#
# Before anything runs on the slice, this machine compiles the config's step
# for the slice's topology (python -m hyperbolic_vl.tools.aot, the `aot`
# extra): a step that cannot fit a chip, a bad argument, a missing extra or
# Ctrl-C stops it with one line and nothing starts. The topology is the
# slice's own (gcloud describe), or TOPOLOGY=v5p:4x4x8; SKIP_AOT=1 skips the
# check. The run's outcome is the workers' exit status (0 finished, 2 a
# configuration error, 3 pre-empted with its step saved: the same command
# resumes), with one line saying which.
set -euo pipefail
tpu=${1:?tpu name}; zone=${2:?zone}; config=${3:?config}; workdir=${4:?workdir}; shift 4
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
      *) echo "launch/tpu_vm.sh: cannot name the topology of $tpu ($type $shape); set TOPOLOGY= or SKIP_AOT=1" >&2; exit 2 ;;
    esac
  fi
  LAUNCHER=launch/tpu_vm.sh
  source "$(dirname "$0")/check_step.sh"
  check_step "$config" "$topology" "$@"
fi
# Every argument quoted for the workers' shell; no trailing arguments add
# nothing (printf ' %q' of none would add an empty argument).
command="cd ~/hyperbolic_vl && python -m hyperbolic_vl.main --multihost"
command+=" --config=$(printf '%q' "$config") --workdir=$(printf '%q' "$workdir")"
if (($# > 0)); then command+=$(printf ' %q' "$@"); fi
status=0
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command="$command" || status=$?
case $status in
  0) echo "launch/tpu_vm.sh: the run finished; its results are in $workdir" ;;
  3) echo "launch/tpu_vm.sh: pre-empted with its step saved; the same command resumes from $workdir" >&2 ;;
  2) echo "launch/tpu_vm.sh: a configuration, data or workdir error (the line above)" >&2 ;;
  *) echo "launch/tpu_vm.sh: a worker failed (exit $status; its lines above)" >&2 ;;
esac
exit "$status"

#!/usr/bin/env bash
# Cloud TPU VM pod slice: the same command on every worker; JAX finds its
# peers from the TPU metadata (jax.distributed.initialize()).
#
#   bash launch/tpu_vm.sh my-tpu us-central2-b configs/meru.py:vit_l,data=tfds gs://bucket/runs/meru_l \
#       --config.input.data.tfds_name=my_captions \
#       --config.input.data.data_dir=gs://bucket/tfds
set -euo pipefail
tpu=${1:?tpu name}; zone=${2:?zone}; config=${3:?config}; workdir=${4:?workdir}; shift 4
extra=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command="
  cd ~/hyperbolic_vl && python -m hyperbolic_vl.main --multihost \
    --config='$config' --workdir='$workdir'$extra"

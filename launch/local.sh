#!/usr/bin/env bash
# One machine, every local accelerator (or the CPU):
#   bash launch/local.sh configs/meru.py:tiny /tmp/meru [--config.total_steps=200 ...]
set -euo pipefail
config=${1:?config, e.g. configs/meru.py:vit_b}; workdir=${2:?workdir}; shift 2
exec python -m hyperbolic_vl.main --config="$config" --workdir="$workdir" "$@"

# Sourced by the launchers (not run): the pre-flight before anything is
# submitted or started. check_step CONFIG TOPOLOGY ARGS... compiles the
# config's step for TOPOLOGY on this machine (python -m
# hyperbolic_vl.tools.aot, the `aot` extra) with the --config.* overrides
# among ARGS; on anything but exit 0 it says in one line why nothing was
# started and exits the launcher with the check's status.
check_step() {
  local config=$1 topology=$2 status=0 why
  shift 2
  local overrides=()
  for arg in "$@"; do
    if [[ "$arg" == --config.* ]]; then overrides+=("$arg"); fi
  done
  JAX_PLATFORMS=cpu python -m hyperbolic_vl.tools.aot --config="$config" --topology="$topology" \
    ${overrides[@]+"${overrides[@]}"} || status=$?
  if ((status == 0)); then return 0; fi
  case $status in
    130 | 143) why="the check was interrupted" ;;
    2) why="a bad argument or config (the line above)" ;;
    4) why="the step does not fit a chip of $topology (the levers above)" ;;
    5) why="the check needs the aot extra: pip install -e '.[aot]'" ;;
    *) why="the check failed with exit $status (its traceback above)" ;;
  esac
  echo "$LAUNCHER: nothing was started: $why; SKIP_AOT=1 skips the check" >&2
  exit "$status"
}

#!/usr/bin/env bash
# A multi-host run simulated on one machine: N JAX processes on 127.0.0.1,
# started the way tpu.sh / gpu.sh start them (same module and flags,
# RLREASON_MULTIHOST=1), with CPU devices and gloo collectives.
#
#   launch/local.sh [--dry-run] 2 experiments.grpo --steps=4 --workdir=/tmp/mh
#
# Env: DEVICES_PER_PROCESS (default 2), PORT (default: a free one),
# TIMEOUT seconds per process (default 900), LOG_DIR (default
# ./rlreason-logs/local); the caller's XLA_FLAGS are kept, ahead of the
# device count and collective timeouts set here (XLA takes a flag's last
# value). Exits non-zero if any process fails, 75 if they were stopped
# (Ctrl-C or SIGTERM to this script reaches every process; see below).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"

if [[ "${1:-}" == "--dry-run" ]]; then
  export DRY_RUN=1
  shift
fi
(($# >= 2)) || die "usage: launch/local.sh [--dry-run] N <module> [flags]"
n="$1"
module="$2"
shift 2
[[ "$n" =~ ^[1-9][0-9]*$ ]] || die "N must be a positive integer, got $n"
python="${PYTHON:-python3}"
port="${PORT:-$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
log_dir="${LOG_DIR:-rlreason-logs/local}"
run mkdir -p "$log_dir"

# XLA:CPU aborts a collective whose participants arrive more than 40 s apart;
# processes sharing a few cores can be that far apart.
collective_timeouts="--xla_cpu_collective_call_warn_stuck_timeout_seconds=120 --xla_cpu_collective_call_terminate_timeout_seconds=300"

pids=()
for ((i = 0; i < n; i++)); do
  cmd=(timeout "${TIMEOUT:-900}" env JAX_PLATFORMS=cpu
    XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=${DEVICES_PER_PROCESS:-2} $collective_timeouts"
    RLREASON_MULTIHOST=1 RLREASON_DISTRIBUTED_TIMEOUT=300 JAX_COORDINATOR_ADDRESS="127.0.0.1:$port"
    JAX_NUM_PROCESSES="$n" JAX_PROCESS_ID="$i"
    "$python" -m "$module" "$@")
  printf '+ %s > %s 2>&1 &\n' "$(quote_all "${cmd[@]}")" "$log_dir/process-$i.log"
  if [[ "$DRY_RUN" != 1 ]]; then
    "${cmd[@]}" >"$log_dir/process-$i.log" 2>&1 &
    pids+=("$!")
  fi
done

# Ctrl-C or SIGTERM to this script goes to every process (each runs in a
# process group of its own under `timeout`, out of the terminal's reach):
# they stop together at their next sampler call, evaluation chunk or step
# end, with a checkpoint (exit 75); Ctrl-C again stops them at once.
signalled=0
# shellcheck disable=SC2329 # called by the traps below
forward() {
  signalled=1
  echo "local.sh: SIG$1 to the ${#pids[@]} processes" >&2
  kill -s "$1" "${pids[@]}" 2>/dev/null || true
}
trap 'forward INT' INT
trap 'forward TERM' TERM

status=0
stopped=0
for i in "${!pids[@]}"; do
  while true; do
    signalled=0
    rc=0
    wait "${pids[$i]}" || rc=$?
    ((signalled)) || break # else the trap ended `wait`, not the process
  done
  if ((rc == 75)); then
    stopped=1
  elif ((rc != 0)); then
    echo "process $i failed (exit $rc); see $log_dir/process-$i.log" >&2
    status=1
  fi
done
if ((status == 0 && stopped)); then
  echo "stopped with a checkpoint; rerun the same command to resume" >&2
  status=75
fi
exit "$status"

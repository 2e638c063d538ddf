#!/usr/bin/env bash
# GPU clusters with SLURM: one JAX process per node, jax.distributed on.
#
#   launch/gpu.sh [--dry-run] submit experiments.grpo --scale=paper \
#       --model=/ckpt/Qwen2.5-Math-7B --workdir=/shared/runs/grpo-1
#   launch/gpu.sh [--dry-run] logs JOB_ID      # follow the job's output
#   launch/gpu.sh [--dry-run] stop JOB_ID      # checkpoint, then stop
#   launch/gpu.sh [--dry-run] cancel JOB_ID    # this job only, now
#
# Run from a checkout on the cluster's shared filesystem after
# `pip install -e '.[gpu]'`. Nodes, GPUs per node, partition and time limit
# come from launch/env.sh (or the environment). The run gets SIGTERM
# SLURM_STOP_BEFORE seconds before the time limit, and from `stop`: the
# processes stop together at their next sampler call, evaluation chunk or
# step end, save one checkpoint and exit (code
# 75; submit the same command to resume). --dry-run prints the sbatch
# command and the srun line the batch script would run.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
# shellcheck source=env.sh
source "$HERE/env.sh"
# shellcheck source=common.sh
source "$HERE/common.sh"

if [[ "${1:-}" == "--dry-run" ]]; then
  export DRY_RUN=1
  shift
fi

cmd_submit() {
  (($# >= 1)) || die "usage: launch/gpu.sh submit <module> [flags]"
  [[ "$1" =~ ^[A-Za-z0-9_.]+$ ]] || die "not a python module: $1"
  run mkdir -p "$ROOT/rlreason-logs"
  run sbatch --chdir="$ROOT" --nodes="$NODES" --gpus-per-node="$GPUS_PER_NODE" \
    --partition="$SLURM_PARTITION" --time="$SLURM_TIME" \
    --signal="TERM@$SLURM_STOP_BEFORE" "$HERE/slurm.sbatch" "$@"
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "# the batch script then runs, on its first node:"
    NODES="$NODES" bash "$HERE/slurm.sbatch" "$@"
  fi
}

cmd_logs() {
  (($# == 1)) || die "usage: launch/gpu.sh logs JOB_ID"
  run tail -n 200 -F "$ROOT/rlreason-logs/rlreason-$1.out"
}

cmd_stop() {
  (($# == 1)) || die "usage: launch/gpu.sh stop JOB_ID"
  # SIGTERM to the job's processes (not the batch script): they checkpoint.
  run scancel --signal=TERM "$1"
}

cmd_cancel() {
  (($# == 1)) || die "usage: launch/gpu.sh cancel JOB_ID"
  run scancel "$1"
}

main() {
  local sub="${1:-}"
  (($#)) && shift
  case "$sub" in
    submit | logs | stop | cancel) "cmd_$sub" "$@" ;;
    *) sed -n '2,16p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
}

main "$@"

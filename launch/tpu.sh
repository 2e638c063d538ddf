#!/usr/bin/env bash
# Cloud TPU VM slices: create -> sync -> setup -> run -> logs -> stop -> delete.
#
#   launch/tpu.sh [--dry-run] create
#   launch/tpu.sh [--dry-run] sync                # the exact HEAD commit
#   launch/tpu.sh [--dry-run] setup               # pip install -e .[tpu]
#   launch/tpu.sh [--dry-run] run experiments.grpo --scale=paper \
#       --model=/ckpt/Qwen2.5-Math-7B --workdir=gs://BUCKET/grpo/run1
#   launch/tpu.sh [--dry-run] logs [WORKER]       # follow a worker's log
#   launch/tpu.sh [--dry-run] stop                # checkpoint, then stop
#   launch/tpu.sh [--dry-run] kill                # our tmux session, now
#   launch/tpu.sh [--dry-run] delete
#   launch/tpu.sh workers                         # hosts in ACCELERATOR_TYPE
#
# Settings come from launch/env.sh (or the environment). `run` starts the
# same command on every worker inside a tmux session named "rlreason", with
# jax.distributed on (RLREASON_MULTIHOST=1: JAX finds the coordinator on TPU
# VMs by itself); only process 0 writes logs and metrics. `stop` presses
# Ctrl-C in that session on every worker: the run stops at its next sampler
# call, evaluation chunk or step end, saves a checkpoint and exits (code 75; `run` the same command resumes it);
# `kill` ends the session at once (a rerun resumes from the last periodic
# checkpoint). --dry-run prints every command without running it.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
# shellcheck source=env.sh
source "$HERE/env.sh"
# shellcheck source=common.sh
source "$HERE/common.sh"

SESSION=rlreason  # the tmux session `run` creates, `stop` / `kill` end
# Paths on the workers, expanded by their shell, not this one.
# shellcheck disable=SC2016
REMOTE_DIR='$HOME/rlreason'
# shellcheck disable=SC2016
LOG_DIR='$HOME/rlreason-logs'
LOG="$LOG_DIR/run.log"

if [[ "${1:-}" == "--dry-run" ]]; then
  export DRY_RUN=1
  shift
fi

gcloud_tpu() {
  run gcloud compute tpus tpu-vm "$@" --project="$PROJECT" --zone="$ZONE"
}

on_workers() {  # a command string, on every worker of the slice
  echo "# on every worker: $1"
  gcloud_tpu ssh "$TPU_NAME" --worker=all --command="$1"
}

# Hosts (JAX processes) of a slice, from its accelerator type.
workers() {
  local kind="${ACCELERATOR_TYPE%-*}" size="${ACCELERATOR_TYPE##*-}"
  [[ "$size" =~ ^[0-9]+$ ]] || die "cannot parse ACCELERATOR_TYPE=$ACCELERATOR_TYPE"
  case "$kind" in
    v2 | v3 | v4 | v5p) echo $(((size + 7) / 8)) ;;  # size = TensorCores
    v5litepod | v5e | v6e)                          # size = chips
      if ((size <= 8)); then echo 1; else echo $((size / 4)); fi ;;
    *) die "unknown TPU generation in ACCELERATOR_TYPE=$ACCELERATOR_TYPE" ;;
  esac
}

cmd_create() {
  local spot=()
  [[ "$TPU_SPOT" == 1 ]] && spot=(--spot)
  echo "# $TPU_NAME: $ACCELERATOR_TYPE, $(workers) worker(s)"
  gcloud_tpu create "$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" \
    --version="$TPU_VERSION" "${spot[@]}"
}

cmd_sync() {
  local commit archive
  commit="$(git -C "$ROOT" rev-parse HEAD)"
  if [[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]]; then
    echo "# warning: uncommitted changes are not synced (HEAD $commit is)" >&2
  fi
  archive="/tmp/rlreason-$commit.tar.gz"
  run git -C "$ROOT" archive --format=tar.gz -o "$archive" "$commit"
  gcloud_tpu scp "$archive" "$TPU_NAME:rlreason-$commit.tar.gz" --worker=all
  # COMMIT is what loop.write_run_info records when there is no .git.
  on_workers "rm -rf $REMOTE_DIR && mkdir -p $REMOTE_DIR && tar xzf rlreason-$commit.tar.gz -C $REMOTE_DIR && echo $commit > $REMOTE_DIR/COMMIT"
}

cmd_setup() {
  on_workers "cd $REMOTE_DIR && $PYTHON -m pip install -U pip && $PYTHON -m pip install -e '.[tpu]'"
}

cmd_run() {
  (($# >= 1)) || die "usage: launch/tpu.sh run <module, e.g. experiments.grpo> [flags]"
  local module="$1" job
  shift
  [[ "$module" =~ ^[A-Za-z0-9_.]+$ ]] || die "not a python module: $module"
  # `stop`'s Ctrl-C is the run's alone: the shell traps it (a shell that
  # died of it would take the run down with the terminal) and tee ignores it
  # (the run keeps printing to it).
  job="trap : INT; cd $REMOTE_DIR && RLREASON_MULTIHOST=1 $PYTHON -m $(quote_all "$module" "$@") 2>&1 | tee -i -a $LOG"
  on_workers "tmux has-session -t $SESSION 2>/dev/null && { echo 'rlreason is already running: launch/tpu.sh stop (or kill) first' >&2; exit 1; }; mkdir -p $LOG_DIR && tmux new-session -d -s $SESSION $(shell_quote "$job")"
}

cmd_logs() {
  local worker="${1:-0}"
  gcloud_tpu ssh "$TPU_NAME" --worker="$worker" --command="tail -n 200 -F $LOG"
}

cmd_stop() {
  # Ctrl-C in our session: every worker's run stops at its next sampler
  # call, evaluation chunk or step end (all at the same point), checkpoints
  # and exits.
  on_workers "tmux send-keys -t $SESSION C-c 2>/dev/null || echo 'no rlreason session here' >&2"
  echo "# each worker's run stops at its next sampler call, evaluation chunk or step end, with a checkpoint (logs to follow)"
}

cmd_kill() {
  # Only our tmux session: never a broad pkill on shared machines.
  on_workers "tmux kill-session -t $SESSION 2>/dev/null || true"
}

cmd_delete() {
  gcloud_tpu delete "$TPU_NAME" --quiet
}

main() {
  local sub="${1:-}"
  (($#)) && shift
  case "$sub" in
    create | sync | setup | run | logs | stop | kill | delete) "cmd_$sub" "$@" ;;
    workers) workers ;;
    *) sed -n '2,22p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
}

main "$@"

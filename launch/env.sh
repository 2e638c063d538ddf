# shellcheck shell=bash
# Cloud settings for launch/: the ONLY place they are set. Every launch script
# sources this file; any value can be overridden from the environment for one
# command, e.g.  TPU_NAME=rl-v5e ACCELERATOR_TYPE=v5litepod-16 launch/tpu.sh create

# --- Google Cloud TPU VMs (launch/tpu.sh) -----------------------------------
: "${PROJECT:=my-gcp-project}"          # gcloud project id
: "${ZONE:=us-central2-b}"              # a zone that has ACCELERATOR_TYPE
: "${TPU_NAME:=rlreason}"               # name of the TPU VM (slice)
: "${ACCELERATOR_TYPE:=v4-32}"          # v4-32 = 16 chips on 4 hosts (workers)
: "${TPU_VERSION:=tpu-ubuntu2204-base}" # TPU VM software image
: "${TPU_SPOT:=0}"                      # 1 = spot capacity (preemptible)
: "${BUCKET:=gs://my-bucket/rlreason}"  # workdirs: $BUCKET/<experiment>/<date>

# --- GPU clusters with SLURM (launch/gpu.sh) --------------------------------
: "${SLURM_PARTITION:=gpu}"
: "${NODES:=4}"                         # one JAX process per node
: "${GPUS_PER_NODE:=8}"
: "${SLURM_TIME:=24:00:00}"
# SIGTERM this many seconds before SLURM_TIME ends, so the run can stop (at
# its next sampler call, evaluation chunk or step end) and checkpoint (SLURM
# kills 30 s after its own SIGTERM): longer than one sampler call, a step's
# updates and a checkpoint write.
: "${SLURM_STOP_BEFORE:=900}"
: "${PYTHON:=python3}"                  # interpreter on the workers

export PROJECT ZONE TPU_NAME ACCELERATOR_TYPE TPU_VERSION TPU_SPOT BUCKET
export SLURM_PARTITION NODES GPUS_PER_NODE SLURM_TIME SLURM_STOP_BEFORE PYTHON

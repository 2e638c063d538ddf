#!/usr/bin/env bash
# One GPU session's measurements, in one call (at most 9 1/3 minutes):
#   bash experiments/bench/gpu_check.sh OUT_DIR
# Session 29 (H100) measured the ragged decode with the Pallas kernel's
# fp32 output carrying the residual stream, and so every later product of
# the step, to fp32 (fixed since: attention_kernels.ragged). This measures
# it again (traced), then under XLA's exhaustive Triton tiling search (its
# MLP products were 2-4x off their bound with XLA's default config set),
# then the defaults (train + dense rollout, JSON and HLO in OUT_DIR) as
# the regression check and the dense reference.
# Each run is bounded, so one that hangs leaves the rest their time.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
bench="python3 -m experiments.bench.measured_vs_planned --repeats=1"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
timeout 150 $bench --phase=rollout --decode_attention=ragged \
  --profile_top=15 --dump_hlo="$out/hlo_ragged" 2>&1 | tee "$out/ragged.txt"
XLA_FLAGS=--xla_gpu_exhaustive_tiling_search=true timeout 170 \
  $bench --phase=rollout --decode_attention=ragged \
  2>&1 | tee "$out/ragged_exhaustive.txt"
timeout 230 $bench --phase_timeout=110 --out="$out/mvp.json" \
  --dump_hlo="$out/hlo" 2>&1 | tee "$out/mvp.txt"

#!/usr/bin/env bash
# One GPU session's measurements, in one call (at most 7 1/2 minutes):
#   bash experiments/bench/gpu_check.sh OUT_DIR
# Session 34 (H100): a decode step's gate and up products over one stacked
# [D, 2F] weight took 35.5 us at 256 rows against 53.8 us as two kernels
# (bench.decode_gemms), so the sampler's layout now stacks them
# (ModelConfig.stack_gate_up); a 256-row call then took 7.22 s (session
# 33: 7.68 s as two kernels), but the device time ran out before the
# short sampler that gives the per-step decode time. XLA's exhaustive
# tiling search tuned one product in 100 s: not worth its compile time.
# So: (1) the products alone; (2) the rollout as the default lays it out
# (stacked, ragged attention), traced; (3) the same with the two kernels,
# the A/B in one lease; (4) the train step as the regression check.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
quiet() { grep -v "^[IW][0-9]\{4\} "; }  # absl's log lines
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
timeout 45 python3 -m experiments.bench.decode_gemms \
  --gemm_out="$out/gemms.json" 2>&1 | quiet | tee "$out/gemms.txt"
bench="python3 -m experiments.bench.measured_vs_planned --repeats=2"
timeout 150 $bench --phase=rollout --profile_top=25 --dump_hlo="$out/hlo" \
  2>&1 | quiet | tee "$out/rollout_stacked.txt"
timeout 120 $bench --phase=rollout --nostack_gate_up 2>&1 | quiet \
  | tee "$out/rollout_two_kernels.txt"
timeout 130 $bench --phase=train 2>&1 | quiet | tee "$out/train.txt"
echo "${SECONDS} s"

#!/usr/bin/env bash
# One GPU session's measurements, in one call (at most 9 2/3 minutes):
#   bash experiments/bench/gpu_check.sh OUT_DIR
# Session 33 (H100) measured the ragged decode after session 29's fp32 fix:
# 6.71 ms per step, 49.3% of the HBM-bandwidth bound (dense 8.78 ms,
# 37.7%), so --decode_attention=auto (the default) now decodes ragged on
# such a GPU. Left: the MLP's gate/up product, 2-3x off its bound at 256
# rows under XLA's default Triton configs; XLA's exhaustive tiling search
# did not finish compiling within 145 s, so it gets 245 s here.
# Then the defaults (train + rollout, JSON and HLO in OUT_DIR) as the
# regression check, and the dense decode as the reference (traced).
# Each run is bounded, so one that hangs leaves the rest their time.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
bench="python3 -m experiments.bench.measured_vs_planned --repeats=1"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
XLA_FLAGS=--xla_gpu_exhaustive_tiling_search=true timeout 270 \
  $bench --phase=rollout --decode_attention=auto \
  2>&1 | tee "$out/ragged_exhaustive.txt"
timeout 210 $bench --phase_timeout=100 --out="$out/mvp.json" \
  --dump_hlo="$out/hlo" 2>&1 | tee "$out/mvp.txt"
timeout 100 $bench --phase=rollout --decode_attention=dense \
  --profile_top=15 2>&1 | tee "$out/dense.txt"

#!/usr/bin/env bash
# One GPU session's measurements, in one call (at most 9 1/3 minutes):
#   bash experiments/bench/gpu_check.sh OUT_DIR
# Session 29 (H100) found the decode step's MLP products 2-4x off their
# bound (a Triton gemm per layer, [256, 1536] x [1536, 17920]), picked from
# XLA's default config set; this retries the decode with the exhaustive
# tiling search, dense then ragged attention (traced), then the defaults
# (train + rollout, JSON and HLO in OUT_DIR) as the regression check.
# Each run is bounded, so one that hangs leaves the rest their time.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
bench="python3 -m experiments.bench.measured_vs_planned --repeats=1"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
for attention in dense ragged; do
  XLA_FLAGS=--xla_gpu_exhaustive_tiling_search=true timeout 170 \
    $bench --phase=rollout --decode_attention=$attention --profile_top=12 \
    2>&1 | tee "$out/exhaustive_$attention.txt"
done
timeout 210 $bench --phase_timeout=100 --out="$out/mvp.json" \
  --dump_hlo="$out/hlo" 2>&1 | tee "$out/mvp.txt"

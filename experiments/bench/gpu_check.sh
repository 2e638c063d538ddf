#!/usr/bin/env bash
# One GPU session's measurements, in one call (at most 9 2/3 minutes):
#   bash experiments/bench/gpu_check.sh OUT_DIR
# Session 33 (H100) measured the ragged decode (the default on such GPUs)
# at 6.71 ms per step, 49.3% of the HBM-bandwidth bound; the largest gap
# left is the MLP's gate/up product at 256 rows (48.7 us vs ~16 us of
# weight reads) under XLA's default Triton configs, and XLA's exhaustive
# tiling search did not finish compiling the rollout within 145 s.
# So: (1) the decode's products alone (bench.decode_gemms) under the
# default configs, the exhaustive search and cuBLAS; (2) the rollout
# under the exhaustive search with a per-fusion autotuning cache, twice:
# the first run may run out of time, but each product it tuned is kept,
# so the second compiles in time; its trace names every kernel.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
cache=/tmp/rlreason_autotune
mkdir -p "$cache"
left() { echo $((${1} - SECONDS)); }  # seconds until a deadline
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
gemms="python3 -m experiments.bench.decode_gemms"
timeout 45 $gemms --gemm_out="$out/gemms_default.json" 2>&1 \
  | grep -v "^W0\|^I0" | tee "$out/gemms_default.txt"
XLA_FLAGS=--xla_gpu_exhaustive_tiling_search=true timeout 100 \
  $gemms --gemm_out="$out/gemms_exhaustive.json" 2>&1 \
  | grep -v "^W0\|^I0" | tee "$out/gemms_exhaustive.txt"
XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 40 \
  $gemms --gemm_out="$out/gemms_cublas.json" 2>&1 \
  | grep -v "^W0\|^I0" | tee "$out/gemms_cublas.txt"
bench="python3 -m experiments.bench.measured_vs_planned --repeats=1"
export XLA_FLAGS="--xla_gpu_exhaustive_tiling_search=true \
--xla_gpu_per_fusion_autotune_cache_dir=$cache"
timeout 180 $bench --phase=rollout 2>&1 | tee "$out/rollout_tuning.txt"
echo "autotuning cache: $(ls "$cache" | wc -l) fusions"
timeout $(left 565) $bench --phase=rollout --profile_top=60 \
  --dump_hlo="$out/hlo" 2>&1 | tee "$out/rollout_tuned.txt"
echo "autotuning cache: $(ls "$cache" | wc -l) fusions; ${SECONDS} s"

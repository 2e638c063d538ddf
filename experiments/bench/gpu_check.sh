#!/usr/bin/env bash
# One GPU session's measurements, in one call (at most 9 1/3 minutes):
#   bash experiments/bench/gpu_check.sh OUT_DIR
# 1. measured vs planned at the defaults (train + rollout, JSON in OUT_DIR);
# 2. the decode A/B: --decode_attention=ragged (filled slots only) vs dense;
# 3. the train step without remat, traced (its longest kernels);
# 4. the programs' HLO (OUT_DIR/hlo/), to name the fusions the traces show.
# Each run is bounded, so one that hangs leaves the rest their time.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
bench="python3 -m experiments.bench.measured_vs_planned --repeats=2"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
timeout 280 $bench --phase_timeout=135 --out="$out/mvp.json" \
  --dump_hlo="$out/hlo" 2>&1 | tee "$out/mvp.txt"
timeout 150 $bench --phase=rollout --decode_attention=ragged \
  --repeats=1 --profile_top=25 2>&1 | tee "$out/ragged.txt"
timeout 130 $bench --phase=train --remat_policy=none --profile_top=25 \
  2>&1 | tee "$out/train_none.txt"

"""The measured-vs-planned benchmark end to end on this CPU (tiny model),
and the GPU table the planner's local topology reads its peaks from."""

import json
import os
import subprocess
import sys
import types

import pytest

from rlreason import testing
from rlreason.model import transformer
from rlreason.plan import chips

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_local_peaks_come_from_the_device_kind():
  h200 = types.SimpleNamespace(device_kind="NVIDIA H200", platform="gpu")
  pcie = types.SimpleNamespace(device_kind="NVIDIA H100 PCIe", platform="gpu")
  sxm = types.SimpleNamespace(
    device_kind="NVIDIA H100 80GB HBM3", platform="gpu"
  )
  cpu = types.SimpleNamespace(device_kind="cpu", platform="cpu")
  assert chips.local_peaks(h200) == (989e12, 4.8e12)
  assert chips.local_peaks(pcie) == (756e12, 2.0e12)
  assert chips.local_peaks(sxm) == (989e12, 3.35e12)
  assert chips.local_peaks(cpu) is None
  # TPUs as JAX names them (one megacore device per v4 / v5p chip).
  for kind, family in (
    ("TPU v4", "v4"),
    ("TPU v5 lite", "v5e"),
    ("TPU v5p", "v5p"),
    ("TPU v5", "v5p"),
    ("TPU v6 lite", "v6e"),
  ):
    tpu = types.SimpleNamespace(device_kind=kind, platform="tpu")
    chip = chips.CHIPS[family]
    assert chips.local_peaks(tpu) == (chip.peak_flops, chip.hbm_bandwidth)


def test_model_flops_per_token_by_hand():
  """6 per parameter and 12 L H Dh context / 2 for attention (PaLM). The
  tiny model: per layer q/k/v/o 32 x 8 x (2 x 4 + 2 x 2) = 3072, MLP
  3 x 32 x 64 = 6144, norms 64; 2 layers, untied 128 x 32 embeddings
  twice, the final norm: 26784 parameters."""
  cfg = testing.tiny_model_config()
  assert cfg.num_params() == 2 * (3072 + 6144 + 64) + 2 * 4096 + 32
  assert (
    transformer.flops_per_token(cfg, 100)
    == 6 * 26784 + 12 * 2 * 4 * 8 * 100 / 2
  )


def test_a_program_planned_over_the_device_is_not_run():
  from experiments.bench import measured_vs_planned as mvp
  from rlreason.plan import program as program_lib

  sizes = dict(argument_bytes=6, output_bytes=2, alias_bytes=2, code_bytes=0)
  prog = program_lib.Program(
    name="rollout", temp_bytes=10, resident_bytes=4, flops=0.0,
    bytes_accessed=0.0, largest=[], **sizes,
  )  # fmt: skip
  mvp.check_fits(prog, hbm=20)  # peak 4 + 6 + 2 - 2 + 10 = 20: fits
  with pytest.raises(RuntimeError, match="rollout: the plan's peak"):
    mvp.check_fits(prog, hbm=19)


def test_the_planned_programs_run_and_are_reported(tmp_path):
  out = tmp_path / "mvp.json"
  env = {**os.environ, "XLA_FLAGS": testing.xla_flags()}  # 1 device
  proc = subprocess.run(
    [
      sys.executable, "-m", "experiments.bench.measured_vs_planned",
      "--model=tiny", "--rows=16", "--micro_batches=2", "--prompt_len=16",
      "--new_tokens=32", "--short_tokens=8", "--rollout_rows=8",
      "--ceiling_n=128", "--repeats=1", f"--out={out}",
      f"--dump_hlo={tmp_path / 'hlo'}",
    ],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  train, rollout = json.loads(out.read_text())
  for r in (train, rollout):
    assert "error" not in r, r["error"]
    assert r["device"] == "cpu" and not r["peaks_known"]
    assert r["planned_peak_bytes"] >= r["planned_temp_bytes"] > 0
    assert r["measured_s"] > 0 and r["planned_s"] > 0
  assert train["phase"] == "train" and rollout["phase"] == "rollout"
  # The train step ran: a finite loss, and the model FLOPs of 16 rows of
  # 48 tokens.
  assert abs(train["loss"]) < 1e3
  assert train["model_flops"] > 6 * train["params"] * 16 * 48
  # The sampler generated tokens for its 8 rows (at most 32 each).
  assert 0 < rollout["generated_tokens"] <= 8 * 32
  assert "MFU" in proc.stdout and "HBM-bandwidth bound" in proc.stdout
  for phase in ("train_step", "rollout"):  # the programs that ran, as HLO
    assert (
      (tmp_path / "hlo" / f"{phase}.hlo.txt")
      .read_text()
      .startswith("HloModule")
    )


def test_the_gpu_script_passes_only_the_benchmarks_flags():
  """experiments/bench/gpu_check.sh (the next GPU session's one call)
  names flags that exist, in each benchmark it runs."""
  import re

  from experiments.bench import decode_gemms
  from experiments.bench import measured_vs_planned as mvp

  text = open(os.path.join(ROOT, "experiments/bench/gpu_check.sh")).read()
  text = text.replace("\\\n", " ")  # continuation lines joined
  text = re.sub(r"(?m)^#.*$", "", text)  # comments
  calls = re.findall(
    r"(?:\$bench|-m experiments.bench.decode_gemms)[^\n]*", text
  )
  used = {f for call in calls for f in re.findall(r" --(\w+)", call)}
  assert len(calls) == 4, calls
  assert {"phase", "profile_top", "nostack_gate_up", "gemm_out"} <= used
  known = set(mvp.FLAGS) | {"no" + name for name in mvp.FLAGS}
  assert decode_gemms.FLAGS is mvp.FLAGS  # absl's one registry
  assert used <= known, used - known


def test_decode_gemms_forms_agree_and_run(tmp_path):
  """bench.decode_gemms: the stacked gate/up form computes the two
  kernels' product (from the same weights), bytes and FLOPs by hand, and a
  CPU run writes one timed row per product."""
  import numpy as np

  from experiments.bench import decode_gemms
  from rlreason.model import presets

  cfg = presets.get("tiny")
  d, f, rows = cfg.d_model, cfg.mlp_dim, 4
  products = decode_gemms.products(cfg, rows)
  fn, args, nbytes, flops = products["gate,up"]
  assert (nbytes, flops) == (2 * 2 * d * f, 2 * rows * 2 * d * f)
  stacked_fn, stacked_args, stacked_bytes, _ = products["gate|up stacked"]
  assert stacked_bytes == nbytes
  np.testing.assert_allclose(
    np.float32(fn(*args)),
    np.float32(stacked_fn(*stacked_args)),
    rtol=2e-2,
    atol=1e-4,
  )
  out = tmp_path / "gemms.json"
  subprocess.run(
    [sys.executable, "-m", "experiments.bench.decode_gemms",
     "--gemm_model=tiny", "--gemm_rows=4", "--gemm_repeats=2",
     f"--gemm_out={out}"],
    check=True, cwd=ROOT, timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )  # fmt: skip
  rows_out = json.loads(out.read_text())["rows"]
  assert [r["product"] for r in rows_out] == list(products)
  assert all(r["us"] > 0 for r in rows_out)

"""experiments/plan.py's usage errors: named before anything compiles."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _plan(*args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-m", "experiments.plan", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


@pytest.mark.parametrize(
  "args, message",
  [
    (
      ["--topology=local", "--programs=train_step,trian_step,rollout"],
      "--programs: unknown trian_step; expected some of train_step, "
      "critic_step, rollout",
    ),
    (
      ["--all", "--merge"],
      "--merge takes one TPU slice's plan (--topology)",
    ),
    # --method, as experiments.reproduce names it, is --experiment here.
    (["--method=nosuch"], "--experiment: unknown nosuch; expected one of"),
  ],
)
def test_a_usage_error_is_named_before_any_compile(args, message):
  """An unknown --programs name (a typo) and --merge without one slice
  are absl usage errors (exit 1) that say what is wrong before any
  program compiles (a 7B train step takes minutes)."""
  out = _plan(*args)
  assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
  assert message in out.stderr, out.stderr[-2000:]
  assert "compiling" not in out.stdout + out.stderr


def test_the_local_topology_of_a_cpu_is_its_hosts_ram():
  """--topology=local on a CPU: each device's share of the host's RAM (the
  simulated devices share it), not a 1 TiB stand-in, and the roofline's
  placeholder peaks (no published CPU peak), which the report names."""
  code = """
import sys
sys.argv = ["plan", "--topology=local"]
import jax
from experiments import grpo, plan
from rlreason import devices
_, hbm, n, peak, bw, _ = plan.mesh_for("local", grpo.TinyConfig())
ram = devices.total_memory()[0]
assert n == jax.device_count() and n > 1, n
assert hbm == ram // n and ram < 1 << 40, (hbm, ram)
assert (peak, bw) == plan.LOCAL_PLACEHOLDERS
print("ok")
"""
  out = subprocess.run(
    [sys.executable, "-c", code],
    cwd=ROOT,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.stdout.strip() == "ok", out.stderr[-2000:]

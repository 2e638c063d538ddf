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
      "--programs: unknown trian_step; expected some of train_step, rollout",
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

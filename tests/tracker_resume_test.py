"""A tracker-driven run killed with SIGKILL resumes exactly.

experiments.adacl (ADCL + EGSR) draws every batch from
difficulty.AdaptivePrompts, whose weights depend on the difficulty.Tracker
that the rollouts update; EGSR re-samples all-wrong groups with keys of
(seed, step, round). The tracker and the draw counter are checkpointed
with the prompt iterator's state. Run A goes through 4 steps; run B is
killed (SIGKILL) once checkpoint 2 exists and rerun with the same command:
its metrics, its checkpointed iterator state after every step (which
prompts were drawn how often, the tracker's statistics) and its final
parameters equal A's.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rlreason import testing

STEPS = 4


def _cmd(workdir, cache):
  flags = {
    **testing.SMOKE,
    "steps": STEPS,
    "keep_checkpoints": STEPS + 1,  # every step's iterator state
  }
  return [
    sys.executable,
    "-m",
    "experiments.adacl",
    *[f"--{k}={v}" for k, v in flags.items()],
    f"--workdir={workdir}",
    f"--cache_dir={cache}",
  ]


def _train_rows(workdir):
  """Last row per step, without wall-clock fields."""
  rows = {}
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    r = json.loads(line)
    if "loss" in r:
      rows[r["step"]] = {
        k: v
        for k, v in r.items()
        if not k.startswith(("time", "tokens_per_sec"))
      }
  return rows


def _checkpoints(workdir):
  """step -> (iterator state, params) of every kept checkpoint."""
  mgr = ocp.CheckpointManager(
    os.path.join(workdir, "checkpoints"), item_names=("state", "meta")
  )
  out = {}
  for step in mgr.all_steps():
    got = mgr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()
      ),
    )
    state = got.state
    params = state[0] if isinstance(state, (list, tuple)) else state["params"]
    out[step] = (got.meta, params)
  mgr.close()
  return out


@pytest.mark.slow
def test_sigkill_then_rerun_resumes_tracker_and_draws(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  cache = tmp_path / "cache"
  subprocess.run(
    _cmd(tmp_path / "a", cache),
    check=True,
    env=env,
    capture_output=True,
    timeout=600,
  )

  proc = subprocess.Popen(
    _cmd(tmp_path / "b", cache),
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )
  deadline = time.time() + 600
  while not os.path.exists(tmp_path / "b/checkpoints/2"):
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    assert time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  saved = [
    int(d) for d in os.listdir(tmp_path / "b/checkpoints") if d.isdigit()
  ]
  assert 2 <= max(saved) < STEPS  # the rerun has steps left to resume
  resumed = subprocess.run(
    _cmd(tmp_path / "b", cache),
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]

  a, b = _train_rows(tmp_path / "a"), _train_rows(tmp_path / "b")
  assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
  assert a == b
  ca, cb = _checkpoints(tmp_path / "a"), _checkpoints(tmp_path / "b")
  assert sorted(ca) == sorted(cb) == list(range(1, STEPS + 1))
  for step in ca:
    meta_a, meta_b = ca[step][0], cb[step][0]
    assert meta_a == meta_b, step
    data = meta_a["data"]
    assert data["drawn"] == step
    # Every draw of B prompts is recorded per uid: G attempts per prompt
    # per draw (one round-0 group each).
    attempts = sum(r[0] for r in data["tracker"]["prompts"].values())
    assert (
      attempts
      == step * testing.SMOKE["batch_size"] * (testing.SMOKE["group_size"])
    )
  jax.tree.map(np.testing.assert_array_equal, ca[STEPS][1], cb[STEPS][1])

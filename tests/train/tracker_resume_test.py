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

import os
import re

import jax
import numpy as np
import pytest

from rlreason import metrics
from rlreason import testing

STEPS = 4


@pytest.mark.slow
def test_sigkill_then_rerun_resumes_tracker_and_draws(tmp_path):
  cmd = lambda run: testing.experiment_cmd(  # noqa: E731
    "adacl",
    tmp_path / run,
    tmp_path / "cache",
    steps=STEPS,
    keep_checkpoints=STEPS + 1,  # every step's iterator state
  )
  # --compile_cache=auto as a user's run has it (<cache_dir>/xla: not the
  # suite's shared cache), each compile logged.
  env = {"JAX_COMPILATION_CACHE_DIR": None, "JAX_LOG_COMPILES": "1"}
  saved, log = testing.run_killed_and_resumed(
    cmd("a"), cmd("b"), tmp_path / "b", env=env
  )
  assert 2 <= max(saved) < STEPS  # the rerun had steps left to resume
  # The rerun loaded what the runs before it compiled: its train step too.
  assert os.listdir(tmp_path / "cache" / "xla")
  hits = re.findall(r"Persistent compilation cache hit for '(\w+)'", log)
  assert "jit_step_on_mesh" in hits, (sorted(set(hits)), log[-3000:])
  a, b = testing.train_rows(tmp_path / "a"), testing.train_rows(tmp_path / "b")
  assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
  assert a == b
  # The steps B redid after the kill are logged once (metrics.jsonl was
  # cut back to the checkpoint it resumed from).
  rows = metrics.read_jsonl(tmp_path / "b" / "metrics.jsonl")
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, STEPS + 1))
  ca = testing.checkpoints(tmp_path / "a")
  cb = testing.checkpoints(tmp_path / "b")
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

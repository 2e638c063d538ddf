"""One process of a multi-process run, for tests/multihost_test.py (not a test).

  python tests/multihost_worker.py grpo '<config overrides as JSON>' OUT_PREFIX
  python tests/multihost_worker.py evaluate '<flags as JSON>' OUT_PREFIX

grpo runs experiments.grpo.run with the overrides, then writes OUT_PREFIX.npz
(the final parameters, gathered from every process: all processes must take
part) and OUT_PREFIX.json (the returned scalar metrics). evaluate runs
experiments.evaluate.run with those flags and writes OUT_PREFIX.json: the
row offset of each chunk's sampler call and whether the run stopped. With
RLREASON_TEST_SIGTERM_AT=P:C, process P sends itself SIGTERM as its C-th
sampler call starts, the others none (either mode); with P:C:H, after that
call's H-th host call. Multi-process settings come
from the environment (RLREASON_MULTIHOST=1, JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID), as in a real launch.
"""

import dataclasses
import json
import os
import signal
import sys

import jax
import numpy as np

# Run as a script: the repository root is not on the path by itself.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The same numerics as the tests (tests/conftest.py).
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")
# Compile-bound (a few steps of a tiny model): skip XLA's optimisation passes,
# as tests/conftest.py does for the suite (this process's environment is
# built without JAX_ variables).
jax.config.update("jax_disable_most_optimizations", True)

from experiments import evaluate as evaluate_cli  # noqa: E402
from experiments import grpo  # noqa: E402
from rlreason import mesh as mesh_lib  # noqa: E402
from rlreason import testing  # noqa: E402
from rlreason.sampling import engine  # noqa: E402
from rlreason.train import context  # noqa: E402

testing.register_digits_reward()  # --reward=digits: moves the parameters
# The rollout's progress in host calls of 4 decode steps, each one's line
# printed (multihost_test.py's continuous sampler).
engine.PROGRESS_STEPS = 4
context.PROGRESS_SECONDS = 0.0


def evaluate(flags: str, out_prefix: str) -> None:
  generate, calls = context.Context.generate, []

  def counted(self, *args, **kw):
    calls.append(kw["row_offset"])
    return generate(self, *args, **kw)

  context.Context.generate = counted
  out = evaluate_cli.run(evaluate_cli.Config(**json.loads(flags)))
  with open(out_prefix + ".json", "w") as f:
    json.dump({"calls": calls, "stopped": bool(out.get("stopped"))}, f)


def _sigterm_at(process: int, call: int, host_call: int = 0) -> None:
  """This process sends itself SIGTERM as its call-th sampler call starts
  (rollout.generate's; each runs in host calls of 4 decode steps, between
  which the run may stop), or after that call's host_call-th host call
  (continuous batching's) where host_call > 0."""
  if int(os.environ["JAX_PROCESS_ID"]) != process:  # before the run's init
    return
  sample_rows, calls = context.rollout_lib._sample_rows, []  # noqa: SLF001

  def hooked(*args, **kwargs):
    calls.append(1)
    if len(calls) == call and not host_call:
      os.kill(os.getpid(), signal.SIGTERM)
    if len(calls) == call and host_call:
      interrupt, seen = kwargs["interrupt"], []

      def counted():
        seen.append(1)
        if len(seen) == host_call:
          os.kill(os.getpid(), signal.SIGTERM)
        interrupt()

      kwargs = {**kwargs, "interrupt": counted}
    return sample_rows(*args, **kwargs)

  context.rollout_lib._sample_rows = hooked  # noqa: SLF001


def main(mode: str, overrides: str, out_prefix: str) -> None:
  if at := os.environ.get("RLREASON_TEST_SIGTERM_AT"):
    _sigterm_at(*map(int, at.split(":")))
  if mode == "evaluate":
    return evaluate(overrides, out_prefix)
  cfg = dataclasses.replace(grpo.TinyConfig(), **json.loads(overrides))
  out = grpo.run(cfg)
  params = mesh_lib.to_host(out["state"].params)
  flat = {
    jax.tree_util.keystr(path): np.asarray(x)
    for path, x in jax.tree_util.tree_leaves_with_path(params)
  }
  np.savez(out_prefix + ".npz", **flat)
  scalars = {
    k: float(v)
    for k, v in out.items()
    if isinstance(v, (int, float, np.floating, np.integer))
  }
  scalars["process_index"] = jax.process_index()
  scalars["process_count"] = jax.process_count()
  scalars["device_count"] = jax.device_count()
  with open(out_prefix + ".json", "w") as f:
    json.dump(scalars, f)


if __name__ == "__main__":
  main(*sys.argv[1:])

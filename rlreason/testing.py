"""Helpers shared by the tests (and usable from notebooks)."""

import jax
from absl.testing import parameterized


class FastCompileTestCase(parameterized.TestCase):
  """Compiles without XLA's optimisation passes, restored after each test.

  For tests that compile hundreds of tiny programs (every jitted variant and
  every eager op) and run each once: XLA's passes would be about half of
  their time.
  """

  def setUp(self):
    super().setUp()
    flag = "jax_disable_most_optimizations"
    self.addCleanup(jax.config.update, flag, jax.config.read(flag))
    jax.config.update(flag, True)


# Config overrides for a run of seconds on CPU that keeps each method's
# algorithmic choices: 2 steps, a 2-step warm start, 4 eval problems, a
# checkpoint every step. tests/experiments_test.py smoke-runs every
# experiment with them.
SMOKE = dict(
  steps=2,
  batch_size=4,
  group_size=4,
  max_new_tokens=16,
  warm_start_steps=2,
  warm_start_batch_size=8,
  eval_size=4,
  checkpoint_every=1,
  tensorboard=False,
  # One device: no cross-device collectives to starve on a loaded 2-core
  # machine; sharded == single-device is tested in train_step_test.py.
  mesh_fsdp=1,
)

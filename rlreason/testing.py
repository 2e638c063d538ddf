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

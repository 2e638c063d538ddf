"""Tests for rlreason.rl.token_weights.

Expected values are written out by hand (or by numpy from the written
formula), never by calling the function under test.
"""

import functools

from absl.testing import absltest
import chex
import numpy as np

from rlreason import testing
from rlreason.rl import token_weights

LN = np.log

_TestCase = testing.FastCompileTestCase


class TokenWeightsTest(_TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_top_entropy_mask(self):
    entropy = np.array([[0.1, 0.9, 0.5], [0.7, 0.3, 100.0]])
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    # 5 valid tokens, keep ceil(0.4 * 5) = 2: entropies 0.9 and 0.7.
    fn = self.variant(
      functools.partial(token_weights.top_entropy_mask, top_frac=0.4)
    )
    np.testing.assert_array_equal(fn(entropy, mask), [[0, 1, 0], [1, 0, 0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_truncated_is_weight(self):
    sampler_logp = np.array([[-1.0, -1.0, -1.0, -1.0]])
    old_logp = sampler_logp + np.array([[LN(1.5), LN(3.0), LN(0.5), 9.0]])
    mask = np.array([[1, 1, 1, 0]])
    fn = self.variant(token_weights.truncated_is_weight)
    np.testing.assert_allclose(
      fn(old_logp, sampler_logp, mask),
      [[1.5, 2.0, 0.5, 0.0]],
      rtol=1e-6,
      atol=1e-6,
    )
    seq = self.variant(
      functools.partial(
        token_weights.truncated_is_weight, level="sequence", cap=5.0
      )
    )
    # prod = 1.5 * 3 * 0.5 = 2.25.
    np.testing.assert_allclose(
      seq(old_logp, sampler_logp, mask),
      [[2.25, 2.25, 2.25, 0.0]],
      rtol=1e-6,
      atol=1e-6,
    )


if __name__ == "__main__":
  absltest.main()

"""Tests for rlreason.rl.token_weights.

Expected values are written out by hand (or by numpy from the written
formula), never by calling the function under test.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import numpy as np

from rlreason.rl import token_weights

LN = np.log


class TokenWeightsTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_top_entropy_mask(self):
    entropy = np.array([[0.1, 0.9, 0.5], [0.7, 0.3, 100.0]])
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    # 5 valid tokens, keep ceil(0.4 * 5) = 2: entropies 0.9 and 0.7.
    fn = self.variant(
      functools.partial(token_weights.top_entropy_mask, top_frac=0.4)
    )
    np.testing.assert_array_equal(fn(entropy, mask), [[0, 1, 0], [1, 0, 0]])

  def test_top_entropy_count(self):
    # ceil(0.2 * n): 5 -> 1 (0.2 * 5 is a hair above 1 in float32),
    # 10 -> 2, 11 -> 3, 0 -> 0.
    np.testing.assert_array_equal(
      token_weights.top_entropy_count(np.array([5, 10, 11, 0])), [1, 2, 3, 0]
    )

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

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_is_weight(self):
    sampler_logp = np.array([[-1.0, -1.0, -1.0, -1.0, -1.0]])
    ratios = np.array([[1.5, 3.0, 0.5, 0.4, 1.0]])
    old_logp = sampler_logp + np.log(ratios)
    mask = np.array([[1, 1, 1, 1, 0]])
    fn = self.variant(token_weights.masked_is_weight)
    # C = 2: 3.0 > 2 and 0.4 < 1/2 are dropped, 0.5 = 1/2 kept; padding 0.
    np.testing.assert_allclose(
      fn(old_logp, sampler_logp, mask),
      [[1.5, 0.0, 0.5, 0.0, 0.0]],
      rtol=1e-6,
      atol=1e-6,
    )
    seq = self.variant(
      functools.partial(
        token_weights.masked_is_weight, level="sequence", cap=3.0
      )
    )
    # Sequence ratio 1.5 * 3 * 0.5 * 0.4 = 0.9: kept (C = 3) on every
    # token; with C = 1.05 the whole sequence is dropped.
    np.testing.assert_allclose(
      seq(old_logp, sampler_logp, mask),
      [[0.9, 0.9, 0.9, 0.9, 0.0]],
      rtol=1e-6,
      atol=1e-6,
    )
    np.testing.assert_array_equal(
      token_weights.masked_is_weight(
        old_logp, sampler_logp, mask, level="sequence", cap=1.05
      ),
      np.zeros((1, 5)),
    )

  def test_mismatch_metrics(self):
    sampler_logp = np.array([[-1.0, -2.0, -1.0], [-1.0, -1.0, -1.0]])
    log_r = np.array([[0.5, -0.5, 0.0], [2.0, 7.0, 7.0]])
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    weight = np.array([[1.0, 0.6, 0.0], [0.0, 0.0, 0.0]])
    got = token_weights.mismatch_metrics(
      sampler_logp + log_r, sampler_logp, mask, weight
    )
    # Valid log ratios 0.5, -0.5, 0.0, 2.0 (n = 4).
    k3 = [np.exp(x) - 1 - x for x in (0.5, -0.5, 0.0, 2.0)]
    want = {
      "abs_log_ratio": 3.0 / 4,
      "k3_kl": sum(k3) / 4,
      "max_abs_log_ratio": 2.0,
      "dropped": 2 / 4,  # the third token and the fourth (row 2)
      "mean_weight": 1.6 / 4,
    }
    for k, v in want.items():
      np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-9, err_msg=k)


if __name__ == "__main__":
  absltest.main()

"""Tests for rlreason.rl.returns.

Expected values are written out by hand (or by numpy from the written
formula), never by calling the function under test.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import numpy as np

from rlreason.rl import returns as returns_lib


class TokenEstimatorsTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_outcome_token_rewards(self):
    # Row 1 starts late (multi-turn), row 2 is fully masked.
    mask = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    out = self.variant(returns_lib.outcome_token_rewards)(
      np.array([2.0, 3.0, 4.0]), mask
    )
    np.testing.assert_array_equal(out, [[0, 2, 0], [0, 0, 3], [0, 0, 0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_plus_plus_hand_computed(self):
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    fn = self.variant(returns_lib.reinforce_plus_plus)
    # gamma = 1: returns [[1, 1, 1], [0, 0, -]]; over 5 tokens mean 0.6,
    # var (ddof=1) = (3 * 0.16 + 2 * 0.36) / 4 = 0.3.
    expected = (np.array([[1, 1, 1], [0, 0, 0.6]]) - 0.6) / np.sqrt(0.3 + 1e-8)
    np.testing.assert_allclose(
      fn(np.array([1.0, 0.0]), mask), expected, rtol=1e-5, atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_plus_plus_discount_kl_and_observation_tokens(self):
    # One sequence, token 1 is an observation (mask 0). Reward 1 on token 3,
    # token rewards -0.1 (a KL penalty) on every completion token, gamma 0.5:
    #   G3 = 1 - 0.1 = 0.9, G2 = -0.1 + 0.45 = 0.35, G1 = G2 (carried),
    #   G0 = -0.1 + 0.5 * 0.35 = 0.075.
    mask = np.array([[1, 0, 1, 1], [1, 1, 1, 1]])
    kl = np.array([[-0.1, 0.0, -0.1, -0.1], [0.0] * 4])
    fn = self.variant(
      functools.partial(returns_lib.reinforce_plus_plus, gamma=0.5)
    )
    adv = fn(np.array([1.0, 0.0]), mask, token_rewards=kl)
    g = np.array([0.075, 0.35, 0.9, 0, 0, 0, 0])  # the 7 valid tokens
    expected = (g - g.mean()) / np.sqrt(g.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(
      adv[0, [0, 2, 3]], expected[:3], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(adv[1], expected[3:], rtol=1e-5, atol=1e-6)
    self.assertEqual(float(adv[0, 1]), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_plus_plus_baseline_hand_computed(self):
    fn = self.variant(
      functools.partial(returns_lib.reinforce_plus_plus_baseline, group_size=2)
    )
    adv = fn(np.array([1.0, 0.0, 1.0, 1.0]), np.ones((4, 2)))
    # Centered [0.5, -0.5, 0, 0] on 8 tokens: mean 0, var = 4 * 0.25 / 7.
    a = 0.5 / np.sqrt(1 / 7 + 1e-8)
    np.testing.assert_allclose(
      adv, [[a, a], [-a, -a], [0, 0], [0, 0]], rtol=1e-5, atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_gae_hand_computed(self):
    fn = self.variant(
      functools.partial(
        returns_lib.gae, gamma=1.0, lam=0.5, whiten_advantages=False
      )
    )
    adv, ret = fn(
      np.array([[0.0, 0.0, 1.0]]),
      np.array([[0.5, 0.6, 0.7]]),
      np.ones((1, 3)),
    )
    # delta = (0.1, 0.1, 0.3); A2 = 0.3, A1 = 0.1 + 0.5 A2, A0 = 0.1 + 0.5 A1.
    np.testing.assert_allclose(adv, [[0.225, 0.25, 0.3]], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ret, [[0.725, 0.85, 1.0]], rtol=1e-6, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gae_skips_observation_tokens(self):
    fn = self.variant(
      functools.partial(
        returns_lib.gae, gamma=0.9, lam=0.5, whiten_advantages=False
      )
    )
    # Token 1 is an observation with a garbage value; it is skipped:
    # A2 = 1 - 0.7 = 0.3; A0 = (0.9 * 0.7 - 0.5) + 0.9 * 0.5 * 0.3 = 0.265.
    adv, ret = fn(
      np.array([[0.0, 5.0, 1.0]]),
      np.array([[0.5, 9.0, 0.7]]),
      np.array([[1, 0, 1]]),
    )
    np.testing.assert_allclose(adv, [[0.265, 0.0, 0.3]], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ret, [[0.765, 0.0, 1.0]], rtol=1e-6, atol=1e-6)

  def test_gae_whitened(self):
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    rewards = np.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = np.array([[0.5, 0.6, 0.7], [0.1, 0.2, 0.3]])
    gae = jax.jit(returns_lib.gae, static_argnames="whiten_advantages")
    raw, _ = gae(rewards, values, mask, whiten_advantages=False)
    white, _ = gae(rewards, values, mask)
    a = np.asarray(raw)[np.asarray(mask) > 0]
    np.testing.assert_allclose(
      np.asarray(white)[np.asarray(mask) > 0],
      (a - a.mean()) / np.sqrt(a.var(ddof=1) + 1e-8),
      rtol=1e-5,
      atol=1e-6,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_entropy_shaped_hand_computed(self):
    fn = self.variant(returns_lib.entropy_shaped)
    entropy = np.array([[0.5, 3.0], [1.0, 1.0], [2.0, 2.0]])
    # psi = min(0.4 H, |A| / 2).
    out = fn(np.array([1.0, -0.5, 0.0]), entropy)
    np.testing.assert_allclose(
      out, [[1.2, 1.5], [-0.25, -0.25], [0.0, 0.0]], rtol=1e-6, atol=1e-6
    )
    grad = jax.grad(lambda h: fn(np.array([1.0, -0.5, 0.0]), h).sum())(entropy)
    # Exact: the entropy term is behind a stop_gradient.
    np.testing.assert_array_equal(grad, np.zeros((3, 2)))

  def test_no_nan_on_fully_masked_and_constant_inputs(self):
    @jax.jit
    def all_estimators(rewards, empty, full):
      return [
        returns_lib.reinforce_plus_plus(rewards, empty),
        returns_lib.reinforce_plus_plus_baseline(rewards, empty, 2),
        returns_lib.reinforce_plus_plus(rewards, full),  # constant returns
        returns_lib.gae(full, full, empty)[0],
        returns_lib.gae(empty, empty, full)[0],  # constant advantages
        returns_lib.whiten(full, full),
      ]

    ones = np.ones((2, 3), np.float32)
    for adv in all_estimators(np.ones(2, np.float32), 0 * ones, ones):
      # Exact: empty masks and constant values are zeroed by a where.
      np.testing.assert_array_equal(adv, np.zeros((2, 3)))


class RegistryTest(parameterized.TestCase):
  def test_get(self):
    self.assertIs(returns_lib.get("gae"), returns_lib.gae)
    self.assertIs(
      returns_lib.get("reinforce_plus_plus"), returns_lib.reinforce_plus_plus
    )

  def test_unknown_name_lists_valid_ones(self):
    with self.assertRaisesRegex(ValueError, "valid names.*gae"):
      returns_lib.get("grpo")


if __name__ == "__main__":
  absltest.main()

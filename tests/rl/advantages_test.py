"""Tests for rlreason.rl.advantages.

Expected values are written out by hand (or by numpy from the written
formula), never by calling the function under test.
"""

import functools
import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import numpy as np

from rlreason.rl import advantages

_GROUP_ESTIMATORS = {
  "grpo": functools.partial(advantages.group_normalized, group_size=4),
  "dr_grpo": functools.partial(
    advantages.group_normalized, group_size=4, scale_by_std=False
  ),
  "lite_ppo": functools.partial(advantages.batch_std_normalized, group_size=4),
  "rloo": functools.partial(advantages.leave_one_out, group_size=4),
  "gpg": functools.partial(advantages.gpg_scaled, group_size=4),
}


class GroupNormalizedTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # B=2, G=4. Group 0: mean 0.5, std (ddof=1) sqrt(1/3). Group 1: all equal.
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    fn = self.variant(
      functools.partial(advantages.group_normalized, group_size=4)
    )
    a = 0.5 / (np.sqrt(1 / 3) + 1e-6)
    np.testing.assert_allclose(
      fn(rewards), [a, -a, -a, a, 0, 0, 0, 0], rtol=1e-6, atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_dr_grpo_and_ddof(self):
    # Shapes repeat across tests so the eager variants share compilations.
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    dr = self.variant(
      functools.partial(
        advantages.group_normalized, group_size=4, scale_by_std=False
      )
    )
    np.testing.assert_allclose(
      dr(rewards), [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0], rtol=1e-6, atol=1e-6
    )
    pop = self.variant(
      functools.partial(
        advantages.group_normalized, group_size=4, ddof=0, eps=0.0
      )
    )
    std = np.sqrt((0.75**2 + 3 * 0.25**2) / 4)  # sqrt(3/16)
    np.testing.assert_allclose(
      pop(rewards),
      np.array([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]) / std,
      rtol=1e-6,
      atol=1e-6,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_valid_mask_and_empty_group(self):
    # Group 0: member 2 is unscorable. Group 1: every member is (empty group).
    rewards = np.array([1.0, 0.0, 5.0, 0.0, 3.0, 1.0, 2.0, 7.0])
    valid = np.array([1, 1, 0, 1, 0, 0, 0, 0], bool)
    fn = self.variant(
      functools.partial(advantages.group_normalized, group_size=4, eps=0.0)
    )
    # mean 1/3; centered (2/3, -1/3, -1/3); std sqrt((4+1+1)/9/2) = sqrt(1/3).
    s = np.sqrt(1 / 3)
    np.testing.assert_allclose(
      fn(rewards, valid=valid),
      [2 / 3 / s, -1 / 3 / s, 0, -1 / 3 / s, 0, 0, 0, 0],
      rtol=1e-6,
      atol=1e-6,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_singletons_give_zero(self):
    fn = self.variant(
      functools.partial(advantages.group_normalized, group_size=1, eps=0.0)
    )
    rewards = np.array([1.0, 0.0, 3.0, 1.0, 2.0, 0.5, 0.0, 4.0])
    # Exact here and below: constant and invalid groups are zeroed by a
    # where (the module's contract), not by arithmetic.
    np.testing.assert_array_equal(fn(rewards), np.zeros(8))
    # One valid member in a group: no baseline, zero advantage.
    fn4 = self.variant(
      functools.partial(advantages.group_normalized, group_size=4, eps=0.0)
    )
    valid = np.array([1, 0, 0, 0, 0, 1, 0, 0], bool)
    np.testing.assert_array_equal(fn4(rewards, valid=valid), np.zeros(8))

  @chex.variants(with_jit=True, without_jit=True)
  def test_all_equal_non_binary_rewards_are_exactly_zero(self):
    # mean([0.1] * G) need not be exactly 0.1 in float32; the result must be.
    fn = self.variant(
      functools.partial(advantages.group_normalized, group_size=4, eps=0.0)
    )
    np.testing.assert_array_equal(
      fn(np.full((8,), 0.1, np.float32)), np.zeros(8)
    )


class OtherGroupEstimatorsTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_batch_std_hand_computed(self):
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    fn = self.variant(
      functools.partial(advantages.batch_std_normalized, group_size=4)
    )
    # Group means 0.25 and 0.75; batch: four 1s and four 0s, var = 2/7.
    centered = np.array([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25])
    np.testing.assert_allclose(
      fn(rewards), centered / (np.sqrt(2 / 7) + 1e-6), rtol=1e-6, atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_leave_one_out_hand_computed(self):
    fn = self.variant(functools.partial(advantages.leave_one_out, group_size=4))
    # A_i = r_i - (sum_g r - r_i) / 3.
    np.testing.assert_allclose(
      fn(np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])),
      [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0],
      rtol=1e-6,
      atol=1e-6,
    )
    fn2 = self.variant(
      functools.partial(advantages.leave_one_out, group_size=2)
    )
    np.testing.assert_allclose(
      fn2(np.array([3.0, 1.0])), [2.0, -2.0], rtol=1e-6, atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_opo_hand_computed(self):
    fn = self.variant(
      functools.partial(advantages.length_weighted, group_size=2)
    )
    # Group 0: baseline (2 * 1 + 6 * 0) / 8 = 0.25. Group 1: zero lengths ->
    # plain mean 1.5.
    adv = fn(np.array([1.0, 0.0, 1.0, 2.0]), np.array([2, 6, 0, 0]))
    np.testing.assert_allclose(
      adv, [0.75, -0.25, -0.5, 0.5], rtol=1e-6, atol=1e-6
    )
    # Invariant: length-weighted zero mean.
    np.testing.assert_allclose(2 * adv[0] + 6 * adv[1], 0.0, rtol=0, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gpg_hand_computed(self):
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    centered = np.array([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    paper = self.variant(functools.partial(advantages.gpg_scaled, group_size=4))
    # alpha = B / (B - M) = 8 / (8 - 4): group 1 is all-equal.
    np.testing.assert_allclose(
      paper(rewards), 2.0 * centered, rtol=1e-6, atol=1e-6
    )
    verl = self.variant(
      functools.partial(
        advantages.gpg_scaled, group_size=4, alpha_count="nonzero_rewards"
      )
    )
    # alpha = 8 / #{r != 0} = 8 / 6.
    np.testing.assert_allclose(
      verl(rewards), 8 / 6 * centered, rtol=1e-6, atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_pass_at_k_hand_computed(self):
    fn = self.variant(
      functools.partial(advantages.pass_at_k, group_size=4, k=2)
    )
    rewards = np.array([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    # Group 0 (1 correct): R = 1 - C(3,2)/C(4,2) = 1/2, s = 1/2,
    #   A_pos = 1, A_neg = (1/2 - C(2,1)/C(3,1)) / (1/2) = -1/3.
    # Group 1 (2 correct): R = 5/6, s = sqrt(5)/6, A = +-1/sqrt(5).
    # Group 2 (all correct): 0.
    b = 1 / np.sqrt(5)
    np.testing.assert_allclose(
      fn(rewards),
      [1, -1 / 3, -1 / 3, -1 / 3, b, b, -b, -b, 0, 0, 0, 0],
      rtol=1e-6,
      atol=2e-6,
    )

  def test_pass_at_k_general_formula_and_k1_is_grpo(self):
    rewards = np.array([1.0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
    for k in (5, 3, 1):
      expected = []
      for g in rewards.reshape(2, 8):
        n, n_neg = 8, int((g == 0).sum())
        mean = 1 - math.comb(n_neg, k) / math.comb(n, k)
        s = math.sqrt(mean * (1 - mean))
        a_neg = 1 - mean - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)
        expected += [((1 - mean) if r else a_neg) / s for r in g]
      adv = jax.jit(functools.partial(advantages.pass_at_k, group_size=8, k=k))
      np.testing.assert_allclose(adv(rewards), expected, rtol=1e-5, atol=1e-5)
    grpo = jax.jit(
      functools.partial(
        advantages.group_normalized, group_size=8, ddof=0, eps=0.0
      )
    )
    # k = 1
    np.testing.assert_allclose(expected, grpo(rewards), rtol=1e-5, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_max_minus_second_hand_computed(self):
    rewards = np.array([0.2, 0.9, 0.5, 0.1, 1.0, 0.0, 1.0, 0.0])
    fn = self.variant(
      functools.partial(advantages.max_minus_second, group_size=4)
    )
    # Group 1 has a tie at the top: margin 0.
    np.testing.assert_allclose(
      fn(rewards), [0, 0.4, 0, 0, 0, 0, 0, 0], rtol=1e-6, atol=1e-6
    )
    scaled = self.variant(
      functools.partial(
        advantages.max_minus_second, group_size=4, scale_by_std=True
      )
    )
    std = np.std([0.2, 0.9, 0.5, 0.1], ddof=1)
    np.testing.assert_allclose(
      scaled(rewards)[1], 0.4 / (std + 1e-6), rtol=1e-5, atol=1e-6
    )

  def test_zero_mean_within_each_group(self):
    rewards = np.arange(12.0) ** 2 % 7
    out = jax.jit(lambda r: {k: f(r) for k, f in _GROUP_ESTIMATORS.items()})(
      rewards
    )
    for name, adv in out.items():
      np.testing.assert_allclose(
        adv.reshape(3, 4).mean(-1), 0.0, rtol=0, atol=1e-5, err_msg=name
      )

  def test_all_equal_rewards_give_zero_not_nan(self):
    out = jax.jit(lambda r: {k: f(r) for k, f in _GROUP_ESTIMATORS.items()})(
      np.full((8,), 0.3, np.float32)
    )
    for name, adv in out.items():  # exact: zeroed by a where, as above
      np.testing.assert_array_equal(adv, np.zeros(8), err_msg=name)


class RegistryTest(parameterized.TestCase):
  def test_get(self):
    self.assertIs(advantages.get("grpo"), advantages.group_normalized)
    rewards = np.array([1.0, 0.0])
    np.testing.assert_allclose(
      advantages.get("dr_grpo")(rewards, 2), [0.5, -0.5], rtol=1e-6, atol=1e-6
    )

  def test_unknown_name_lists_valid_ones(self):
    with self.assertRaisesRegex(ValueError, "valid names.*grpo"):
      advantages.get("grpo2")
    with self.assertRaisesRegex(ValueError, "token-level.*returns.get"):
      advantages.get("gae")

  def test_bad_group_size(self):
    with self.assertRaisesRegex(ValueError, "groups of 3"):
      advantages.group_normalized(np.zeros(4), 3)


if __name__ == "__main__":
  absltest.main()

"""Tests for rlreason.rl.losses and rlreason.rl.kl.

Expected values are written out by hand (or by numpy from the written
formula), never by calling the function under test.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.rl import aggregation
from rlreason.rl import kl
from rlreason.rl import losses
from rlreason.model import policy

LN = np.log


def _on_policy_grads(loss_fn, logp, adv, mask, modes, **kw):
  """[d aggregate(loss_fn(logp, sg(logp), ...), mode) / d logp for modes]."""

  def total(lp, mode, kw):
    per_token, _ = loss_fn(lp, jax.lax.stop_gradient(lp), adv, mask, **kw)
    return aggregation.aggregate(per_token, mask, mode)

  return [jax.grad(total)(logp, mode, kw) for mode in modes]


class PolicyLossTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_clipped_surrogate_hand_computed(self):
    # One row of tokens with ratios (1.5, 0.5, 0.5, 1.5, 4.0) and A (1, 1, -1,
    # -1, -1); the last column is padding with a -inf log-prob.
    ratio = np.array([1.5, 0.5, 0.5, 1.5, 4.0, 1.0])
    old_logp = np.full((1, 6), -1.0)
    logp = LN(ratio)[None] - 1.0
    logp[0, 5] = -np.inf
    adv = np.array([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0]])
    mask = np.array([[1, 1, 1, 1, 1, 0]])
    ppo = self.variant(losses.clipped_surrogate)
    loss, metrics = ppo(logp, old_logp, adv, mask)
    # max(-A rho, -A clip(rho, 0.8, 1.2)).
    np.testing.assert_allclose(
      loss, [[-1.2, -0.5, 0.8, 1.5, 4.0, 0.0]], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_array_equal(metrics["clipfrac"], [[1, 0, 1, 0, 0, 0]])
    np.testing.assert_allclose(
      metrics["approx_kl"][0, :5], -LN(ratio[:5]), rtol=1e-5, atol=1e-6
    )
    higher_dual = self.variant(
      functools.partial(
        losses.clipped_surrogate, clip_eps_high=0.28, dual_clip=3.0
      )
    )
    loss, metrics = higher_dual(logp, old_logp, adv, mask)
    # Clip-higher: 1 + 0.28. Dual clip: min(4.0, 3 * 1) for A < 0.
    np.testing.assert_allclose(
      loss, [[-1.28, -0.5, 0.8, 1.5, 3.0, 0.0]], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_array_equal(
      metrics["clipfrac_lower"], [[0, 0, 0, 0, 1, 0]]
    )
    capped = self.variant(
      functools.partial(
        losses.clipped_surrogate, log_ratio_clip=LN(2.0), ratio_cap=1.4
      )
    )
    loss, _ = capped(logp, old_logp, adv, mask)
    # rho clamped to 2 (token 4); the unclipped term uses min(rho, 1.4).
    np.testing.assert_allclose(
      loss, [[-1.2, -0.5, 0.8, 1.4, 1.4, 0.0]], rtol=1e-6, atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_gspo_hand_computed(self):
    # Two sequences of lengths 2 and 1; log-ratios (0.1, 0.3) and (-0.2).
    old_logp = np.full((2, 2), -1.0)
    logp = old_logp + np.array([[0.1, 0.3], [-0.2, 7.0]])
    mask = np.array([[1, 1], [1, 0]])
    adv = np.array([1.0, -1.0])
    fn = self.variant(losses.gspo)
    loss, metrics = fn(logp, old_logp, adv, mask)
    # s_0 = e^0.2 > 1 + 4e-4 (clipped), s_1 = e^-0.2 < 1 - 3e-4 (clipped).
    np.testing.assert_allclose(
      loss, [[-1.0004, -1.0004], [0.9997, 0.0]], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(
      metrics["ratio"][:, 0], np.exp([0.2, -0.2]), rtol=1e-6, atol=1e-6
    )
    wide = self.variant(
      functools.partial(losses.gspo, clip_eps_low=0.5, clip_eps_high=0.5)
    )

    def total(lp):
      return wide(lp, old_logp, adv, mask)[0].sum()

    # Unclipped: every token has gradient -A_i s_i.
    np.testing.assert_allclose(
      jax.grad(total)(logp),
      [[-np.exp(0.2), -np.exp(0.2)], [np.exp(-0.2), 0.0]],
      rtol=1e-5,
      atol=1e-6,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_cispo_hand_computed(self):
    old_logp = np.array([[-2.0, -2.0, -2.0]])
    logp = old_logp + np.array([[LN(3.0), LN(0.5), 0.0]])
    adv = np.array([1.0])
    mask = np.ones((1, 3))
    fn = self.variant(functools.partial(losses.cispo, clip_eps_high=1.0))
    loss, metrics = fn(logp, old_logp, adv, mask)
    # weight = min(rho, 2) with no lower bound: (2, 0.5, 1).
    w = np.array([2.0, 0.5, 1.0])
    np.testing.assert_allclose(
      loss, [-w * np.asarray(logp[0])], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_array_equal(metrics["clipfrac"], [[1, 0, 0]])
    grad = jax.grad(lambda lp: fn(lp, old_logp, adv, mask)[0].sum())(logp)
    np.testing.assert_allclose(grad, [-w], rtol=1e-6, atol=1e-6)
    low = self.variant(
      functools.partial(losses.cispo, clip_eps_low=0.2, clip_eps_high=1.0)
    )
    grad = jax.grad(lambda lp: low(lp, old_logp, adv, mask)[0].sum())(logp)
    np.testing.assert_allclose(grad, [[-2.0, -0.8, -1.0]], rtol=1e-6, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_policy_gradient_hand_computed(self):
    logp = np.array([[-1.0, -2.0], [-0.5, -np.inf]])
    mask = np.array([[1, 1], [1, 0]])
    loss, _ = self.variant(losses.policy_gradient)(
      logp, logp, np.array([2.0, -1.0]), mask
    )
    np.testing.assert_allclose(
      loss, [[2.0, 4.0], [-0.5, 0.0]], rtol=1e-6, atol=1e-6
    )

  def _cov_batch(self):
    # 4 valid tokens, A = (2, 2, -2, -2), logp deviations from their mean -2:
    # (1.5, -1.5, -1, 1), so cov = (3, -3, 2, -2). Token 4 is padding.
    logp = np.array([[-0.5, -3.5, -3.0, -1.0, -np.inf]])
    adv = np.array([[2.0, 2.0, -2.0, -2.0, 5.0]])
    mask = np.array([[1, 1, 1, 1, 0]])
    return logp, adv, mask

  @chex.variants(with_jit=True, without_jit=True)
  def test_clip_cov_detaches_a_random_candidate(self):
    logp, adv, mask = self._cov_batch()
    # Candidates (1 < cov < 5): tokens 0 and 2; k = floor(0.25 * 4) = 1.
    fn = self.variant(functools.partial(losses.clip_cov, clip_ratio=0.25))

    @jax.jit
    @jax.vmap
    def grads_and_metrics(rng):  # one compilation for every rng
      def total(lp):
        per_token, metrics = fn(
          lp, jax.lax.stop_gradient(lp), adv, mask, rng=rng
        )
        return per_token.sum(), metrics

      return jax.grad(total, has_aux=True)(logp)

    grads, metrics = grads_and_metrics(jax.random.split(jax.random.key(0), 8))
    selected = np.asarray(metrics["cov_clipped"][:, 0])  # [8 rngs, 5]
    np.testing.assert_array_equal(selected.sum(-1), np.ones(8))
    np.testing.assert_array_equal(selected[:, [1, 3, 4]], np.zeros((8, 3)))
    self.assertTrue(selected[:, 0].any() and selected[:, 2].any())  # random
    # Gradient -A (token-sum) except on the detached token.
    expected = -np.array([2.0, 2.0, -2.0, -2.0, 0.0]) * (1 - selected)
    np.testing.assert_allclose(grads[:, 0], expected, rtol=1e-6, atol=1e-6)
    # clip_ratio = 1: k = 4, both candidates are detached.
    fn = self.variant(functools.partial(losses.clip_cov, clip_ratio=1.0))
    _, metrics = fn(logp, logp, adv, mask, rng=jax.random.key(0))
    np.testing.assert_array_equal(metrics["cov_clipped"], [[1, 0, 1, 0, 0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_cov_hand_computed(self):
    logp, adv, mask = self._cov_batch()
    delta = np.array([[0.1, -0.2, 0.3, -0.4, 0.0]])
    old_logp = logp - delta
    fn = self.variant(functools.partial(losses.kl_cov, kl_cov_ratio=0.25))
    loss, metrics = fn(logp, old_logp, adv, mask)
    # Top-1 cov is token 0: -A rho + 1.0 * |delta| there; -A rho elsewhere.
    d = np.array([0.1, -0.2, 0.3, -0.4])
    a = np.array([2.0, 2.0, -2.0, -2.0])
    expected = -a * np.exp(d) + np.array([0.1, 0, 0, 0])
    np.testing.assert_allclose(loss[0, :4], expected, rtol=1e-5, atol=1e-6)
    self.assertEqual(float(loss[0, 4]), 0.0)
    np.testing.assert_array_equal(metrics["kl_penalized"], [[1, 0, 0, 0, 0]])

  @parameterized.parameters("ppo", "gspo", "cispo", "gpg", "kl_cov", "clip_cov")
  def test_on_policy_gradient_is_reinforce(self, name):
    # At logp == old_logp every loss has the REINFORCE gradient -A grad(logp)
    # (GSPO-token: d s_it / d logp_it = s_i = 1).
    logp = np.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, -np.inf]])
    adv = np.array([[0.5, 0.5, 0.5], [-1.5, -1.5, -1.5]])
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    # no clip_cov candidate has 1 < cov < 5 here.
    kw = {"rng": jax.random.key(0)} if name == "clip_cov" else {}
    modes = aggregation.AGGREGATION_MODES
    grads = jax.jit(
      functools.partial(
        _on_policy_grads, losses.get_policy_loss(name), modes=modes
      )
    )(logp, adv, mask, **kw)
    reinforce = jax.jit(
      functools.partial(_on_policy_grads, losses.policy_gradient, modes=modes)
    )(logp, adv, mask)
    for mode, grad, expected in zip(modes, grads, reinforce, strict=True):
      np.testing.assert_allclose(
        grad, expected, rtol=1e-6, atol=1e-7, err_msg=mode
      )
    # ... and that is -A / normaliser on every valid token.
    np.testing.assert_allclose(
      reinforce[0], -np.where(mask, adv, 0) / 5, rtol=1e-6, atol=1e-7
    )

  @parameterized.parameters("ppo", "gspo", "cispo", "gpg", "kl_cov", "clip_cov")
  def test_no_nan_on_fully_masked_sequences(self, name):
    logp = np.array([[-np.inf, np.nan], [-1.0, -2.0]])
    old_logp = np.array([[np.inf, 0.0], [-1.5, -2.0]])
    mask = np.array([[0, 0], [1, 1]])
    fn = losses.get_policy_loss(name)
    if name == "clip_cov":
      fn = functools.partial(fn, rng=jax.random.key(0))

    @jax.jit
    def values_and_grads(lp):
      def total(lp, mode):
        per_token, _ = fn(lp, old_logp, jnp.ones(2), mask)
        return aggregation.aggregate(per_token, mask, mode)

      return [
        jax.value_and_grad(total)(lp, mode)
        for mode in aggregation.AGGREGATION_MODES
      ]

    for value, grad in values_and_grads(logp):
      self.assertTrue(np.isfinite(value))
      self.assertTrue(np.isfinite(grad).all())
      np.testing.assert_array_equal(grad[0], [0.0, 0.0])

  def test_registry(self):
    self.assertIs(losses.get_policy_loss("ppo"), losses.clipped_surrogate)
    with self.assertRaisesRegex(ValueError, "valid names.*ppo"):
      losses.get_policy_loss("ppo2")


class EntropyTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    logits = np.array([[0.0, 0.0, 0.0, 0.0], [LN(3.0), 0.0, -np.inf, -np.inf]])
    fn = self.variant(policy.entropy_from_logits)
    # Uniform over 4: ln 4. (3/4, 1/4): -(3/4 ln 3/4 + 1/4 ln 1/4).
    np.testing.assert_allclose(
      fn(logits),
      [LN(4.0), -(0.75 * LN(0.75) + 0.25 * LN(0.25))],
      rtol=1e-6,
      atol=1e-6,
    )
    grad = jax.grad(lambda z: fn(z).sum())(logits)
    self.assertTrue(np.isfinite(grad).all())
    np.testing.assert_array_equal(grad[1, 2:], [0.0, 0.0])

  def test_matches_numpy_and_shapes(self):
    logits = np.random.default_rng(0).normal(size=(2, 3, 7)) * 3
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    entropy = jax.jit(policy.entropy_from_logits)
    out = entropy(logits.astype(jnp.bfloat16))
    chex.assert_shape(out, (2, 3))
    self.assertEqual(out.dtype, jnp.float32)
    np.testing.assert_allclose(
      entropy(logits.astype(np.float32)),
      -(p * np.log(p)).sum(-1),
      rtol=1e-5,
      atol=1e-6,
    )
    bonus = losses.entropy_bonus(np.ones((1, 2)), np.array([[1, 0]]), coef=0.1)
    np.testing.assert_allclose(bonus, [[-0.1, 0.0]], rtol=1e-6, atol=1e-7)


class KLTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    ref_logp = np.array([[-1.0, -1.0, -1.0]])
    logp = ref_logp + np.array([[0.0, LN(2.0), -LN(2.0)]])
    d = np.array([0.0, LN(2.0), -LN(2.0)])
    expected = {
      "k1": d,
      "abs": np.abs(d),
      "k2": d**2 / 2,
      # exp(-d) + d - 1: (0, 1/2 + ln 2 - 1, 2 - ln 2 - 1).
      "k3": np.array([0.0, LN(2.0) - 0.5, 1.0 - LN(2.0)]),
      "k3+": np.array([0.0, LN(2.0) - 0.5, 1.0 - LN(2.0)]),
    }
    for name, value in expected.items():
      out = self.variant(kl.get(name))(logp, ref_logp)
      np.testing.assert_allclose(out[0], value, rtol=1e-6, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_clamps(self):
    ref_logp = np.zeros((1, 2))
    logp = np.array([[30.0, -30.0]])
    k3 = self.variant(
      functools.partial(kl.kl_k3, log_ratio_clip=20.0, value_clip=10.0)
    )
    np.testing.assert_allclose(
      k3(logp, ref_logp), [[10.0, 10.0]], rtol=1e-6, atol=1e-6
    )
    k3_delta = self.variant(functools.partial(kl.kl_k3, log_ratio_clip=2.0))
    np.testing.assert_allclose(
      k3_delta(logp, ref_logp),
      [[np.exp(-2.0) + 1.0, np.exp(2.0) - 3.0]],
      rtol=1e-6,
      atol=1e-6,
    )
    k1 = self.variant(functools.partial(kl.kl_k1, value_clip=10.0))
    np.testing.assert_allclose(
      k1(logp, ref_logp), [[10.0, -10.0]], rtol=1e-6, atol=1e-6
    )

  @parameterized.parameters("k1", "abs", "k2", "k3", "k3+")
  def test_zero_at_reference(self, name):
    logp = np.array([[-0.3, -2.0, -7.0]])
    # Exact: logp - logp is 0 and exp(0) is 1 in every float format.
    np.testing.assert_array_equal(kl.get(name)(logp, logp), np.zeros((1, 3)))

  def test_k3_plus_has_k2_gradient_and_k3_value(self):
    ref_logp = np.array([[-1.0, -2.0, -0.5]])
    logp = np.array([[-0.5, -2.5, -0.4]])

    def summed(fn):
      return jax.value_and_grad(lambda lp: fn(lp, ref_logp).sum())(logp)

    v_plus, g_plus = summed(kl.kl_k3_plus)
    v_k3, g_k3 = summed(kl.kl_k3)
    _, g_k2 = summed(kl.kl_k2)
    np.testing.assert_allclose(v_plus, v_k3, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g_plus, g_k2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g_k2, logp - ref_logp, rtol=1e-6, atol=1e-6)
    self.assertFalse(np.allclose(g_k3, g_k2, rtol=1e-5, atol=1e-6))

  def test_registry(self):
    with self.assertRaisesRegex(ValueError, "valid names.*k3"):
      kl.get("k4")

  @chex.variants(with_jit=True, without_jit=True)
  def test_penalized_token_rewards(self):
    kl_values = np.array([[0.5, 1.0, 2.0], [1.0, 1.0, 1.0]])
    mask = np.array([[1, 1, 0], [1, 1, 1]])
    fn = self.variant(functools.partial(kl.penalized_token_rewards, coef=0.1))
    np.testing.assert_allclose(
      fn(np.array([1.0, 0.0]), kl_values, mask),
      [[-0.05, 0.9, 0.0], [-0.1, -0.1, -0.1]],
      rtol=1e-6,
      atol=1e-7,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_adaptive_kl_coef(self):
    state = kl.KLCoef(jnp.asarray(0.1))
    fn = self.variant(
      functools.partial(kl.adaptive_kl_coef, target_kl=0.1, horizon=10_000)
    )
    # error = clip(0.2 / 0.1 - 1, -0.2, 0.2) = 0.2; 0.1 (1 + 0.2 * 256 / 1e4).
    np.testing.assert_allclose(
      fn(state, 0.2, 256).coef, 0.100512, rtol=1e-6, atol=1e-7
    )
    # error = 0.09 / 0.1 - 1 = -0.1.
    np.testing.assert_allclose(
      fn(state, 0.09, 1000).coef, 0.1 * (1 - 0.01), rtol=1e-6, atol=1e-7
    )
    fixed = kl.adaptive_kl_coef(state, 5.0, 256, target_kl=None)
    self.assertIs(fixed, state)


if __name__ == "__main__":
  absltest.main()

"""Tests for rlreason.rl.entropy_reg (SIREN, Lp-Reg) and policy's logits.

Expected values are written out by hand from the formulas.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.rl import entropy_reg
from rlreason.rl import losses
from rlreason.model import policy
from rlreason.model import transformer

LN = np.log

MODEL = transformer.ModelConfig(
  vocab_size=32,
  d_model=16,
  n_layers=1,
  n_heads=2,
  n_kv_heads=1,
  head_dim=8,
  mlp_dim=32,
)


def _h(q):
  q = np.asarray(q, np.float64)
  return -(q * LN(q)).sum()


class NucleusEntropyTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    probs = np.array([0.15, 0.5, 0.05, 0.3])  # unsorted on purpose
    logits = np.log(probs)[None]
    fn = self.variant(entropy_reg.nucleus_entropy, static_argnums=1)
    # cum of sorted probs: 0.5, 0.8, 0.95, 1.0.
    np.testing.assert_allclose(
      fn(logits, 0.9), [_h([0.625, 0.375])], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
      fn(logits, 0.99),
      [_h(np.array([0.5, 0.3, 0.15]) / 0.95)],
      rtol=1e-5,
      atol=1e-6,
    )
    # The token that crosses top_p is excluded: {0.5} -> H = 0, and a top
    # token with p >= top_p leaves the head empty -> 0.
    np.testing.assert_allclose(fn(logits, 0.6), [0.0], rtol=0, atol=1e-7)
    np.testing.assert_allclose(fn(logits, 0.5), [0.0], rtol=0, atol=1e-7)

  def test_gradient_is_that_of_the_renormalised_head(self):
    z = jnp.array([0.3, -0.2, 1.0, -2.0])

    def by_hand(z):
      # p = [0.269, 0.163, 0.541, 0.027]; sorted cum 0.541, 0.810, 0.973:
      # the head is tokens 2 and 0.
      p = jax.nn.softmax(z)[jnp.array([2, 0])]
      q = p / p.sum()
      return -jnp.sum(q * jnp.log(q))

    g = jax.grad(lambda z: entropy_reg.nucleus_entropy(z, 0.95))(z)
    # Tokens outside the head have a gradient of 0 up to rounding (~1e-8):
    # atol well above that, far below the head's gradients (~0.1).
    np.testing.assert_allclose(g, jax.grad(by_hand)(z), rtol=1e-5, atol=1e-6)
    g0 = jax.grad(lambda z: entropy_reg.nucleus_entropy(z, 0.1))(z)
    # Empty head: no NaN, and exactly 0 (a masked where, not arithmetic).
    np.testing.assert_array_equal(g0, np.zeros(4))


def _sorted_nucleus_entropy(logits, top_p):
  """The head by a sort (this module's definition, as the authors): the
  reference for the sort-free nucleus_entropy."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  logp = -jnp.sort(-logp, axis=-1)
  head = jnp.cumsum(jnp.exp(jax.lax.stop_gradient(logp)), axis=-1) < top_p
  log_z = jax.nn.logsumexp(
    jnp.where(head.at[..., 0].set(True), logp, -jnp.inf), axis=-1
  )
  logq = jnp.where(head, logp - log_z[..., None], 0.0)
  return -jnp.sum(jnp.where(head, jnp.exp(logq) * logq, 0.0), axis=-1)


class SortFreeNucleusTest(absltest.TestCase):
  def test_equals_the_sorted_head_on_random_logits(self):
    # 3 x 7 rows of 300 logits; the sorted and the bisected heads agree
    # unless a cumulative mass lands within rounding of top_p.
    z = 2.5 * jax.random.normal(jax.random.key(4), (3, 7, 300))
    for top_p in (0.3, 0.8, 0.95):
      np.testing.assert_allclose(
        entropy_reg.nucleus_entropy(z, top_p),
        _sorted_nucleus_entropy(z, top_p),
        rtol=1e-5,
        atol=1e-6,
      )
      # The entropy is a function of the head's logits only: so is the
      # gradient (sorting permutes it back).
      weights = jnp.linspace(0.5, 1.5, 21).reshape(3, 7)

      def weighted(fn, z, top_p=top_p, weights=weights):
        return (weights * fn(z, top_p)).sum()

      np.testing.assert_allclose(
        jax.grad(functools.partial(weighted, entropy_reg.nucleus_entropy))(z),
        jax.grad(functools.partial(weighted, _sorted_nucleus_entropy))(z),
        rtol=1e-4,
        atol=1e-6,
      )

  def test_top_p_one_is_the_plain_entropy(self):
    z = jax.random.normal(jax.random.key(5), (4, 50))
    np.testing.assert_allclose(
      entropy_reg.nucleus_entropy(z, 1.0),
      policy.entropy_from_logits(z),
      rtol=1e-6,
      atol=1e-6,
    )


class PeakEntropyMaskTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    entropy = np.array(
      [[1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 1.0, 2.0, 9.0, 9.0], [1.0] * 5]
    )
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0] * 5])
    fn = self.variant(
      functools.partial(entropy_reg.peak_entropy_mask, quantile=0.8)
    )
    # Row 0: q = 4 + 0.2 (5 - 4) = 4.2. Row 1 (valid 3, 1, 2): q = 2.6,
    # padding (9) never kept. Row 2 is empty.
    np.testing.assert_array_equal(
      fn(entropy, mask),
      [[0, 0, 0, 0, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]],
    )


class AnchoredPenaltyTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    entropy = np.array([[1.0, 2.0], [3.0, 0.0]])
    mask = np.array([[1.0, 1.0], [1.0, 0.0]])
    fn = self.variant(
      functools.partial(entropy_reg.anchored_entropy_penalty, coef=0.5)
    )
    penalty, h_bar = fn(entropy, mask, 1.0)
    # seq-mean-token-mean
    np.testing.assert_allclose(h_bar, (1.5 + 3.0) / 2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(penalty, 0.5 * 1.25**2, rtol=1e-6, atol=1e-6)
    # d/dH = 2 coef (Hbar - anchor) * dHbar/dH = 1.25 * [[1/4, 1/4], [1/2, 0]]
    g = jax.grad(lambda h: fn(h, mask, 1.0)[0])(jnp.asarray(entropy))
    np.testing.assert_allclose(
      g, 1.25 * np.array([[0.25, 0.25], [0.5, 0]]), rtol=1e-6, atol=1e-7
    )


class MinpProxyTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    logits = np.log(np.array([[0.6, 0.3, 0.09, 0.01]] * 3))
    targets = np.array([1, 3, 0])
    fn = self.variant(
      functools.partial(entropy_reg.minp_proxy_logprobs, kappa=0.02)
    )
    # kappa * max = 0.012: token 3 (0.01) is noise; Z = 0.99.
    out = fn(logits, targets)
    np.testing.assert_allclose(out[0], LN(0.3 / 0.99), rtol=1e-5, atol=1e-6)
    self.assertEqual(out[1], -np.inf)
    np.testing.assert_allclose(out[2], LN(0.6 / 0.99), rtol=1e-5, atol=1e-6)


class LpRegTest(parameterized.TestCase):
  def _inputs(self):
    logp = jnp.array([[-1.0, -3.0, -2.0], [-0.5, -4.0, -1.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = jnp.array([-1.0, 2.0])
    proxy = jnp.array([[-0.9, -2.5, -1.5], [-0.4, -3.0, -jnp.inf]])
    return logp, adv, mask, proxy

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    logp, adv, mask, proxy = self._inputs()
    fn = self.variant(
      functools.partial(entropy_reg.lp_reg, neg_frac=0.5, coef=2.0)
    )
    # Negative row 0 has 3 tokens: floor(1.5) = 1, the lowest logp (-3.0)
    # whose proxy (-2.5) is above it. Row 1 has A > 0: plain PPO.
    loss, m = fn(logp, logp, adv, mask, proxy_logp=proxy)
    d = -3.0 - -2.5
    k3 = np.exp(-d) + d - 1
    np.testing.assert_array_equal(m["lp_reg"], [[0, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(
      loss,
      [[1.0, 1.0 + 2.0 * k3, 1.0], [-2.0, -2.0, 0.0]],
      rtol=1e-6,
      atol=1e-6,
    )

  def test_gradient_raises_the_shielded_token(self):
    logp, adv, mask, proxy = self._inputs()

    def total(lp):
      per_token, _ = entropy_reg.lp_reg(
        lp,
        jax.lax.stop_gradient(lp),
        adv,
        mask,
        proxy_logp=proxy,
        neg_frac=0.5,
        coef=2.0,
      )
      return per_token.sum()

    g = jax.grad(total)(logp)
    # PPO on-policy: d/dlogp = -A. Shielded: -A + coef (1 - exp(proxy - logp)).
    expected = np.array(
      [[1.0, 1.0 + 2.0 * (1 - np.exp(0.5)), 1.0], [-2.0, -2.0, 0.0]]
    )
    np.testing.assert_allclose(g, expected, rtol=1e-6, atol=1e-6)
    self.assertTrue(np.isfinite(g).all())

  def test_token_the_proxy_filters_is_not_shielded(self):
    logp, adv, mask, _ = self._inputs()
    proxy = jnp.full_like(logp, -jnp.inf)
    loss, m = entropy_reg.lp_reg(
      logp, logp, adv, mask, proxy_logp=proxy, neg_frac=0.5
    )
    np.testing.assert_array_equal(m["lp_reg"], np.zeros((2, 3)))
    ppo, _ = losses.clipped_surrogate(logp, logp, adv, mask)
    np.testing.assert_allclose(loss, ppo, rtol=1e-6, atol=1e-6)


class CompletionStatsTest(absltest.TestCase):
  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    self.p = 3
    self.tokens = jnp.asarray(rng.integers(3, 32, (2, 8)))
    self.positions = jnp.broadcast_to(jnp.arange(8), (2, 8))
    self.mask = jnp.ones((2, 5)).at[1, 3:].set(0.0)
    self.params = transformer.init(MODEL, jax.random.key(0))

  def _full_logits(self, temperature=1.0):
    """The scored logits [N, T, V] of a full forward (the reference)."""
    full = policy.logits(self.params, self.tokens, MODEL, self.positions)
    return full[:, self.p - 1 : -1] / temperature

  def test_per_token_functions_see_the_scored_logits(self):
    def picked(z, y):  # by a masked sum, as per_token functions must
      hit = jnp.arange(z.shape[-1]).reshape(1, 1, -1) == y[..., None]
      return jnp.sum(jnp.where(hit, jax.nn.log_softmax(z), 0.0), axis=-1)

    logp, ent, again, ent_again, z5 = policy.completion_logprobs(
      self.params,
      self.tokens,
      self.positions,
      MODEL,
      self.p,
      temperature=0.7,
      with_entropy=True,
      per_token=(
        picked,
        lambda z, _: policy.entropy_from_logits(z),
        lambda z, _: z[..., 5],
      ),
    )
    np.testing.assert_allclose(again, logp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ent_again, ent, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
      z5, self._full_logits(0.7)[..., 5], rtol=1e-5, atol=1e-5
    )
    only = policy.completion_logprobs(
      self.params,
      self.tokens,
      self.positions,
      MODEL,
      self.p,
      temperature=0.7,
    )
    np.testing.assert_allclose(only, logp, rtol=1e-5, atol=1e-5)

  def test_cached_per_token_functions_equal_their_definitions(self):
    logits = self._full_logits(0.7)
    targets = self.tokens[:, self.p :]
    nucleus = entropy_reg.nucleus_entropy_fn(0.5)
    proxy = entropy_reg.minp_proxy_fn(0.5)
    # One object per argument: outside a jit, calls reuse one program.
    self.assertIs(entropy_reg.nucleus_entropy_fn(0.5), nucleus)
    self.assertIs(entropy_reg.minp_proxy_fn(0.5), proxy)
    _, h, q = policy.completion_logprobs_by_rows(
      self.params,
      self.tokens,
      self.positions,
      MODEL,
      self.p,
      rows=1,
      temperature=0.7,
      per_token=(nucleus, proxy),
    )
    np.testing.assert_allclose(
      h, entropy_reg.nucleus_entropy(logits, 0.5), rtol=1e-5, atol=1e-5
    )
    self.assertGreater(float(h.max()), 0.1)
    np.testing.assert_allclose(
      q,
      entropy_reg.minp_proxy_logprobs(logits, targets, kappa=0.5),
      rtol=1e-5,
      atol=1e-5,
    )


if __name__ == "__main__":
  absltest.main()

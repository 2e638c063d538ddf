"""Tests for rlreason.rl.value (critic, extended GAE) and per-key optimizers."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason.rl import aggregation
from rlreason import mesh as mesh_lib
from rlreason.train import optimizer as optimizer_lib
from rlreason.train import train_step as ts
from rlreason.rl import value
from rlreason.model import transformer

MODEL = transformer.ModelConfig(
  vocab_size=32,
  d_model=16,
  n_layers=1,
  n_heads=2,
  n_kv_heads=1,
  head_dim=8,
  mlp_dim=32,
)  # untied: the critic trunk must drop the lm_head
P, T, N = 3, 5, 8


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.ones((N, T), np.float32)
  mask[1, 3:] = 0
  mask[2, 1:] = 0
  return {
    "tokens": jnp.asarray(rng.integers(3, 32, (N, P + T))),
    "positions": jnp.broadcast_to(jnp.arange(P + T), (N, P + T)),
    "mask": jnp.asarray(mask),
    "old_values": jnp.asarray(rng.normal(0.0, 0.5, (N, T)), jnp.float32),
    "returns": jnp.asarray(rng.normal(0.0, 1.0, (N, T)), jnp.float32),
  }


class ExtendedGaeTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    token_rewards = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    values = np.array([[0.5, 0.2, 9.0, 9.0], [0.1, 0.3, 0.6, 0.4]])
    mask = np.array([[1, 1, 0], [1, 1, 1]])
    fn = self.variant(
      functools.partial(value.extended_gae, whiten_advantages=False)
    )
    # Row 0 ends (EOS): delta = (0 + 0.2 - 0.5, 1 + 0 - 0.2) = (-0.3, 0.8).
    # Row 1 is truncated after 3 tokens: bootstraps V(s_3) = 0.4, so
    # delta = (0.3 - 0.1, 0.6 - 0.3, 0.4 - 0.6) = (0.2, 0.3, -0.2).
    adv, ret = fn(token_rewards, values, mask, np.array([False, True]))
    np.testing.assert_allclose(
      adv, [[0.5, 0.8, 0.0], [0.3, 0.1, -0.2]], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(
      ret, [[1.0, 1.0, 0.0], [0.4, 0.4, 0.4]], rtol=1e-6, atol=1e-6
    )
    # Not truncated: V = 0 after the last token, as returns.gae.
    adv, ret = fn(token_rewards, values, mask, np.array([False, False]))
    # delta = (0.2, 0.3, -0.6), summed backward.
    np.testing.assert_allclose(adv[1], [-0.1, -0.3, -0.6], rtol=1e-6, atol=1e-6)

  def test_discounting(self):
    # One truncated token, gamma = 0.9: A = r + 0.9 V(s_1) - V(s_0).
    adv, ret = value.extended_gae(
      jnp.array([[0.5]]),
      jnp.array([[1.0, 2.0]]),
      jnp.array([[1]]),
      jnp.array([True]),
      gamma=0.9,
      lam=0.5,
      whiten_advantages=False,
    )
    np.testing.assert_allclose(adv, [[0.5 + 1.8 - 1.0]], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ret, [[2.3]], rtol=1e-6, atol=1e-6)


class ValueLossTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_value_loss_hand_computed(self):
    values = np.array([[1.0, 0.6, 0.0, 1.2]])
    old_values = np.array([[0.5, 0.5, 0.5, 0.5]])
    returns = np.array([[0.0, 1.0, 1.0, 2.0]])
    mask = np.ones((1, 4))
    loss, metrics = self.variant(value.value_loss)(
      values, old_values, returns, mask
    )
    # Clipped values (0.7, 0.6, 0.3, 0.7); 0.5 max of the squared errors.
    np.testing.assert_allclose(
      loss, [[0.5, 0.08, 0.5, 0.5 * 1.69]], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(metrics["vf_clipfrac"], [[0, 0, 0, 1]])
    unclipped = self.variant(functools.partial(value.value_loss, clip_eps=None))
    loss, _ = unclipped(values, old_values, returns, mask)
    np.testing.assert_allclose(
      loss, [[0.5, 0.08, 0.5, 0.32]], rtol=1e-5, atol=1e-6
    )


class CriticTest(absltest.TestCase):
  def setUp(self):
    super().setUp()
    self.policy = transformer.init(MODEL, jax.random.key(0))
    self.critic = value.init(
      MODEL, jax.random.key(1), policy_params=self.policy
    )
    self.critic["head"] = {
      "kernel": jnp.arange(16.0) / 16.0,
      "bias": jnp.asarray(0.25),
    }

  def test_trunk_is_the_policy_without_lm_head(self):
    self.assertIn("lm_head", self.policy)
    self.assertNotIn("lm_head", self.critic["trunk"])
    fresh = value.init(MODEL, jax.random.key(1))
    np.testing.assert_array_equal(fresh["head"]["kernel"], np.zeros(16))
    chex.assert_trees_all_equal_structs(
      fresh, {**self.critic, "head": fresh["head"]}
    )
    axes = value.param_axes(MODEL)
    chex.assert_trees_all_equal_structs(
      jax.tree.map(lambda _: 0, fresh),
      jax.tree.map(lambda _: 0, axes, is_leaf=mesh_lib.is_axes),
    )

  def test_values_are_the_head_on_the_policy_hidden_states(self):
    b = _batch()
    hidden, _ = transformer.hidden_states(
      self.policy, b["tokens"], b["positions"], MODEL
    )
    manual = hidden @ (jnp.arange(16.0) / 16.0) + 0.25  # [N, S]
    v = value.completion_values(
      self.critic, b["tokens"], b["positions"], MODEL, P
    )
    np.testing.assert_allclose(v, manual[:, P - 1 : -1], rtol=1e-5, atol=5e-5)
    v_next = value.completion_values(
      self.critic, b["tokens"], b["positions"], MODEL, P, with_next=True
    )
    np.testing.assert_allclose(v_next, manual[:, P - 1 :], rtol=1e-5, atol=5e-5)

  def test_loss_is_the_token_mean_clipped_value_loss(self):
    b = _batch()
    norm = aggregation.normalizers(b["mask"])
    out, m = value.loss(self.critic, b, norm, model_cfg=MODEL, clip_eps=0.2)
    v = value.completion_values(
      self.critic, b["tokens"], b["positions"], MODEL, P
    )
    per_token, _ = value.value_loss(
      v, b["old_values"], b["returns"], b["mask"], clip_eps=0.2
    )
    expected = (per_token * b["mask"]).sum() / b["mask"].sum()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m["value_loss"], expected, rtol=1e-5, atol=1e-5)


class GroupOptimizerTest(absltest.TestCase):
  def test_first_adam_step_is_scaled_per_key(self):
    opt = optimizer_lib.make_optimizer(
      0.1, total_steps=10, grad_clip=0.0, lr_scales={"critic": 5.0}
    )
    params = {"w": jnp.array([1.0]), "critic": {"v": jnp.array([1.0])}}
    grads = {"w": jnp.array([2.0]), "critic": {"v": jnp.array([-3.0])}}
    updates, _ = opt.update(grads, opt.init(params), params)
    # Adam's first step is -lr * sign(g) (bias-corrected m / sqrt(v)).
    np.testing.assert_allclose(updates["w"], [-0.1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
      updates["critic"]["v"], [0.5], rtol=1e-5, atol=1e-6
    )

  def test_each_group_is_clipped_alone(self):
    clip = optimizer_lib.clip_by_group_norm(1.0, ("critic",))
    grads = {
      "a": jnp.array([3.0]),
      "b": jnp.array([4.0]),
      "critic": jnp.array([0.5]),
    }
    out, _ = clip.update(grads, clip.init(grads))
    # |(3, 4)| = 5 -> 1
    np.testing.assert_allclose(out["a"], [0.6], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["b"], [0.8], rtol=1e-6, atol=1e-6)
    # below 1: kept
    np.testing.assert_allclose(out["critic"], [0.5], rtol=1e-6, atol=1e-6)

  def test_sharded_step_trains_policy_and_critic(self):
    mesh = mesh_lib.make_mesh(1, -1, 1)
    policy = transformer.init(MODEL, jax.random.key(0))
    extra = value.extra_params(lr_scale=3.0)(
      type("Cfg", (), {"seed": 0})(), MODEL, policy
    )
    params = {**policy, **extra.params}
    axes = {**transformer.param_axes(MODEL), **extra.axes}
    opt = optimizer_lib.make_optimizer(
      1e-2, total_steps=4, lr_scales=extra.lr_scales
    )

    def loss_fn(p, batch, norm):
      v_loss, m = value.loss(p[value.KEY], batch, norm, model_cfg=MODEL)
      logits, _ = transformer.apply(
        p, batch["tokens"], batch["positions"], MODEL
      )
      return v_loss + jnp.mean(logits**2), m

    state, step, batch_sh = ts.setup(
      mesh, MODEL, params, opt, loss_fn, axes=axes
    )
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = step(state, mesh_lib.put_global(_batch(), batch_sh))
    self.assertEqual(float(metrics["skipped"]), 0.0)
    after = jax.tree.map(np.asarray, state.params)
    for key in ("embedding", "lm_head"):
      self.assertFalse(np.allclose(before[key], after[key], rtol=0, atol=1e-3))
    self.assertFalse(
      np.allclose(
        before[value.KEY]["head"]["kernel"],
        after[value.KEY]["head"]["kernel"],
        rtol=0,
        atol=1e-3,
      )
    )


def _policy_and_critic():
  policy = transformer.init(MODEL, jax.random.key(0))
  extra = value.extra_params(lr_scale=3.0)(
    type("Cfg", (), {"seed": 0})(), MODEL, policy
  )
  return {**policy, **extra.params}


def _pg_loss(p, batch, norm):
  """A stand-in for the policy's term: its logits alone (no critic)."""
  del norm
  policy = {k: v for k, v in p.items() if k != value.KEY}
  logits, _ = transformer.apply(
    policy, batch["tokens"], batch["positions"], MODEL
  )
  return jnp.mean(logits**2), {}


def _critic_loss(p, batch, norm):
  return value.loss(p[value.KEY], batch, norm, model_cfg=MODEL)


def _joint_loss(p, batch, norm):
  pg, _ = _pg_loss(p, batch, norm)
  v_loss, m = _critic_loss(p, batch, norm)
  return pg + v_loss, m


def _counts(opt_state) -> list[int]:
  return sorted(
    {
      int(c)
      for _, c in optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    }
  )


def _assert_trees_close(a, b):
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), a, b
  )


class OwnUpdatesTest(absltest.TestCase):
  """make_optimizer(group_steps=...): a critic with an optimizer of its
  own, updated in steps of its own (Open-Reasoner-Zero's 12 critic
  updates to the policy's 1, ppo --critic_minibatches)."""

  def _optimizers(self):
    kw = dict(total_steps=4, warmup_steps=2, lr_scales={value.KEY: 3.0})
    return (
      optimizer_lib.make_optimizer(1e-2, **kw),
      optimizer_lib.make_optimizer(1e-2, group_steps={value.KEY: 4}, **kw),
    )

  def test_joint_steps_train_as_the_shared_optimizer(self):
    """Both groups updated every step: their counts agree, so the grouped
    optimizer's updates are the shared one's (lr * 3 for the critic,
    each group clipped alone)."""
    shared, own = self._optimizers()
    params, batch = _policy_and_critic(), _batch()
    states = [ts.init_state(params, o) for o in (shared, own)]
    steps = [
      ts.make_train_step(_joint_loss, o, donate=False) for o in (shared, own)
    ]
    for _ in range(3):
      states = [s(st, batch)[0] for s, st in zip(steps, states)]
    _assert_trees_close(states[0].params, states[1].params)
    before = jax.tree.map(np.asarray, params)
    self.assertFalse(
      np.allclose(
        before[value.KEY]["head"]["kernel"],
        states[1].params[value.KEY]["head"]["kernel"],
        rtol=0,
        atol=1e-4,
      )
    )

  def test_a_group_step_trains_that_group_alone(self):
    """A critic step changes the critic's params and Adam state only; the
    policy's keep their values and step count (0), the critic's counts 2
    after two of its steps; then policy steps move only the policy."""
    _, own = self._optimizers()
    params, batch = _policy_and_critic(), _batch()
    state = ts.init_state(params, own)
    critic_step = ts.make_train_step(
      _critic_loss, own, donate=False, groups=(value.KEY,)
    )
    policy_step = ts.make_train_step(
      _pg_loss, own, donate=False, groups=(optimizer_lib.POLICY,)
    )
    after, metrics = critic_step(state, batch)
    after, _ = critic_step(after, batch)
    self.assertEqual(float(metrics["skipped"]), 0.0)
    for k in params:
      same = jax.tree.leaves(
        jax.tree.map(np.array_equal, params[k], after.params[k])
      )
      self.assertEqual(all(same), k != value.KEY, k)
    chex.assert_trees_all_equal(
      state.opt_state[optimizer_lib.POLICY],
      after.opt_state[optimizer_lib.POLICY],
    )
    self.assertEqual(_counts(after.opt_state[optimizer_lib.POLICY]), [0])
    self.assertEqual(_counts(after.opt_state[value.KEY]), [2])
    moved, _ = policy_step(policy_step(after, batch)[0], batch)
    chex.assert_trees_all_equal(
      moved.params[value.KEY], after.params[value.KEY]
    )
    # (Its warm-up's first rate is 0: the second step moves it.)
    self.assertEqual(_counts(moved.opt_state[optimizer_lib.POLICY]), [2])
    self.assertFalse(
      np.allclose(
        moved.params["embedding"],
        after.params["embedding"],
        rtol=0,
        atol=1e-4,
      )
    )

  def test_policy_then_critic_step_is_the_joint_step(self):
    """The two groups touch disjoint params: a policy step and a critic
    step on the same minibatch equal one joint step, twice over."""
    _, own = self._optimizers()
    params, batch = _policy_and_critic(), _batch()
    joint = ts.make_train_step(_joint_loss, own, donate=False)
    policy_step = ts.make_train_step(
      _pg_loss, own, donate=False, groups=(optimizer_lib.POLICY,)
    )
    critic_step = ts.make_train_step(
      _critic_loss, own, donate=False, groups=(value.KEY,)
    )
    a = b = ts.init_state(params, own)
    for _ in range(2):
      a, _ = joint(a, batch)
      b, _ = critic_step(policy_step(b, batch)[0], batch)
    _assert_trees_close(a.params, b.params)
    _assert_trees_close(a.opt_state, b.opt_state)

  def test_sharded_state_lays_each_groups_moments_as_its_params(self):
    mesh = mesh_lib.make_mesh(1, -1, 1)
    _, own = self._optimizers()
    params = _policy_and_critic()
    axes = {
      **transformer.param_axes(MODEL),
      value.KEY: value.param_axes(MODEL),
    }
    state, _, _ = ts.setup(mesh, MODEL, params, own, _pg_loss, axes=axes)
    mu = optax.tree_utils.tree_get(state.opt_state[value.KEY], "mu")
    self.assertEqual(
      mu[value.KEY]["trunk"]["embedding"].sharding,
      state.params[value.KEY]["trunk"]["embedding"].sharding,
    )


if __name__ == "__main__":
  absltest.main()

"""The shared GRPO-family objective equals its hand-composed parts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.rl import advantages
from rlreason.rl import aggregation
from rlreason.rl import kl
from rlreason.rl import losses
from rlreason.rl import objective
from rlreason.model import policy
from rlreason.model import transformer

MODEL = transformer.ModelConfig(
  vocab_size=32,
  d_model=16,
  n_layers=1,
  n_heads=2,
  n_kv_heads=1,
  head_dim=8,
  mlp_dim=32,
)
P, T, N = 3, 5, 4


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, MODEL.vocab_size, (N, P + T))
  positions = np.broadcast_to(np.arange(P + T), (N, P + T)).copy()
  mask = np.ones((N, T), np.float32)
  mask[1, 3:] = 0
  mask[2, 1:] = 0
  return {
    "tokens": jnp.asarray(tokens),
    "positions": jnp.asarray(positions),
    "mask": jnp.asarray(mask),
    "old_logp": jnp.asarray(rng.normal(-2.0, 0.3, (N, T)), jnp.float32),
    "ref_logp": jnp.asarray(rng.normal(-2.0, 0.3, (N, T)), jnp.float32),
    "adv": jnp.asarray([1.0, -0.5, 0.25, -0.75]),
  }


def test_pg_loss_is_the_sum_of_its_terms():
  cfg = objective.PGConfig(
    clip_eps_low=0.1,
    clip_eps_high=0.3,
    kl_coef=0.05,
    kl_estimator="k2",
    entropy_coef=0.01,
    aggregation="token-mean",
  )
  params = transformer.init(MODEL, jax.random.key(0))
  batch = _batch()
  norm = aggregation.normalizers(batch["mask"])
  loss, metrics = objective.pg_loss(
    params, batch, norm, cfg=cfg, model_cfg=MODEL
  )

  logp, entropy = policy.completion_logprobs(
    params, batch["tokens"], batch["positions"], MODEL, P, with_entropy=True
  )
  mask = batch["mask"]
  surrogate, _ = losses.clipped_surrogate(
    logp,
    batch["old_logp"],
    batch["adv"],
    mask,
    clip_eps_low=0.1,
    clip_eps_high=0.3,
  )
  kl_tok = kl.kl_k2(logp, batch["ref_logp"])
  per_token = surrogate + 0.05 * kl_tok - 0.01 * entropy
  expected = jnp.sum(per_token * mask) / jnp.sum(mask)
  np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    metrics["kl"], jnp.sum(kl_tok * mask) / jnp.sum(mask), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
    metrics["entropy"],
    jnp.sum(entropy * mask) / jnp.sum(mask),
    rtol=1e-5,
    atol=1e-6,
  )


def test_token_weight_and_extra_terms():
  cfg = objective.PGConfig(aggregation="token-sum")
  params = transformer.init(MODEL, jax.random.key(1))
  batch = _batch(1)
  norm = aggregation.normalizers(batch["mask"])
  base, _ = objective.pg_loss(params, batch, norm, cfg=cfg, model_cfg=MODEL)
  zero, _ = objective.pg_loss(
    params,
    batch,
    norm,
    cfg=cfg,
    model_cfg=MODEL,
    token_weight=lambda logp, ent, b: jnp.zeros_like(logp),
  )
  assert float(zero) == 0.0  # exact: every token's loss times 0
  half, _ = objective.pg_loss(
    params,
    {**batch, "weight": 0.5 * batch["mask"]},
    norm,
    cfg=cfg,
    model_cfg=MODEL,
  )
  np.testing.assert_allclose(half, 0.5 * base, rtol=1e-5, atol=1e-5)
  plus_one, m = objective.pg_loss(
    params,
    batch,
    norm,
    cfg=cfg,
    model_cfg=MODEL,
    extra=lambda logp, ent, b: (b["mask"], {"extra": jnp.ones(())}),
  )
  np.testing.assert_allclose(
    plus_one, base + batch["mask"].sum(), rtol=1e-5, atol=1e-5
  )
  assert float(m["extra"]) == 1.0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_outcome_advantages_use_the_registry(name):
  cfg = objective.PGConfig(advantage=name, group_size=4, std_eps=1e-4)
  rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0], np.float32)
  got = objective.outcome_advantages(rewards, cfg)
  kwargs = {"eps": 1e-4} if name == "grpo" else {}
  want = advantages.get(name)(jnp.asarray(rewards), 4, **kwargs)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert np.allclose(got.reshape(2, 4).sum(-1), 0.0, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
  "override, message",
  [
    (dict(advantage="gae"), "--advantage='gae'"),
    (dict(aggregation="mean"), "--aggregation='mean'"),
    (dict(group_size=1), "--group_size must be >= 2"),
    (dict(policy_loss="nope"), "Unknown policy loss 'nope'"),
    (dict(kl_estimator="k9"), "Unknown KL estimator 'k9'"),
  ],
)
def test_validate_names_the_flag(override, message):
  cfg = dataclasses.replace(objective.PGConfig(), **override)
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    cfg.validate()


def test_dr_grpo_aggregation_divides_by_the_generation_budget():
  # seq-mean-token-sum-norm: sum_i sum_t l_it / (N * T), with T the padded
  # completion width (the rollout's max_new_tokens) whatever the lengths.
  cfg = objective.PGConfig(aggregation="seq-mean-token-sum-norm")
  params = transformer.init(MODEL, jax.random.key(2))
  batch = _batch(2)
  norm = aggregation.normalizers(batch["mask"])
  loss, _ = objective.pg_loss(params, batch, norm, cfg=cfg, model_cfg=MODEL)
  logp = policy.completion_logprobs(
    params, batch["tokens"], batch["positions"], MODEL, P
  )
  surrogate, _ = losses.clipped_surrogate(
    logp,
    batch["old_logp"],
    batch["adv"],
    batch["mask"],
    clip_eps_low=0.2,
    clip_eps_high=0.2,
  )
  expected = jnp.sum(surrogate * batch["mask"]) / (N * T)
  np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-6)


def test_dual_clip_caps_a_negative_advantages_loss():
  # verl's clip_ratio_c: with A < 0 and ratio r above c, the PPO loss
  # -A * r is capped at -A * c. Here logp - old_logp = 1.5 on row 1
  # (r = e^1.5 = 4.48 > c = 1.5), A = -0.5: each of its tokens costs 0.75.
  cfg = objective.PGConfig(aggregation="token-sum", dual_clip=1.5)
  cfg.validate()
  params = transformer.init(MODEL, jax.random.key(3))
  batch = _batch(3)
  logp = policy.completion_logprobs(
    params, batch["tokens"], batch["positions"], MODEL, P
  )
  batch["old_logp"] = batch["old_logp"].at[1].set(logp[1] - 1.5)
  norm = aggregation.normalizers(batch["mask"])
  plain, _ = objective.pg_loss(
    params,
    batch,
    norm,
    cfg=dataclasses.replace(cfg, dual_clip=0.0),
    model_cfg=MODEL,
  )
  capped, _ = objective.pg_loss(params, batch, norm, cfg=cfg, model_cfg=MODEL)
  row1 = batch["mask"][1]
  # Row 1 alone changes: from 0.5 * e^1.5 per token to 0.75.
  np.testing.assert_allclose(
    plain - capped,
    (0.5 * np.exp(1.5) - 0.75) * row1.sum(),
    rtol=1e-4,
    atol=1e-5,
  )
  for bad in (dict(dual_clip=1.0), dict(dual_clip=3.0, policy_loss="gspo")):
    with pytest.raises(ValueError, match="dual_clip"):
      objective.PGConfig(**bad).validate()

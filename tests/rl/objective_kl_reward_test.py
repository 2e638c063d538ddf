"""PGConfig's KL-in-reward, token estimators and per-outcome lengths."""

import dataclasses
import types

import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.rl import objective
from rlreason.rl import returns as returns_lib
from rlreason.data.sources import Example


def test_outcome_estimator_adds_the_summed_token_rewards():
  # RLOO, G = 2: A_i = r'_i - r'_j with r' = r + sum_t token_rewards.
  cfg = objective.PGConfig(advantage="rloo", group_size=2)
  rewards = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
  token_rewards = np.array(
    [[-0.1, -0.1], [0.0, -0.2], [-0.3, 0.0], [0.0, 0.0]], np.float32
  )
  got = objective.outcome_advantages(
    rewards, cfg, mask=np.ones((4, 2)), token_rewards=token_rewards
  )
  # r' = [0.8, -0.2, -0.3, 1.0]
  np.testing.assert_allclose(got, [1.0, -1.0, -1.3, 1.3], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
  "name", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"]
)
def test_token_estimators_get_mask_and_token_rewards(name):
  cfg = objective.PGConfig(advantage=name, group_size=2)
  rewards = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
  mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], np.float32)
  token_rewards = -0.1 * mask
  got = objective.outcome_advantages(
    rewards, cfg, mask=mask, token_rewards=token_rewards
  )
  args = (jnp.asarray(rewards), jnp.asarray(mask))
  if name.endswith("baseline"):
    args += (2,)
  want = returns_lib.get(name)(*args, token_rewards=jnp.asarray(token_rewards))
  assert got.shape == (4, 3)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="needs the mask"):
    objective.outcome_advantages(rewards, cfg)


def test_kl_reward_penalty_is_minus_beta_k1_on_valid_tokens():
  cfg = objective.PGConfig(kl_reward_coef=0.1)
  batch = {
    "old_logp": np.array([[-1.0, -2.0, -1.0]], np.float32),
    "ref_logp": np.array([[-1.5, -1.0, -1.0]], np.float32),
    "mask": np.array([[1.0, 1.0, 0.0]], np.float32),
  }
  # k1 = old - ref = [0.5, -1.0, 0.0]; the third token is masked.
  np.testing.assert_allclose(
    objective.kl_reward_penalty(batch, cfg),
    [[-0.05, 0.1, 0.0]],
    rtol=1e-6,
    atol=1e-7,
  )


def test_validate_and_needs_ref():
  objective.PGConfig(advantage="reinforce_plus_plus", group_size=1).validate()
  with pytest.raises(ValueError, match="group_size must be >= 2"):
    objective.PGConfig(
      advantage="reinforce_plus_plus_baseline", group_size=1
    ).validate()
  with pytest.raises(ValueError, match="Unknown KL estimator 'k9'"):
    objective.PGConfig(kl_reward_estimator="k9").validate()
  assert not objective.PGConfig().needs_ref
  assert objective.PGConfig(kl_coef=0.1).needs_ref
  assert objective.PGConfig(kl_reward_coef=0.1).needs_ref


def _fake(cfg, texts, lengths, answers):
  rollout = types.SimpleNamespace(
    texts=texts,
    lengths=np.asarray(lengths),
    prompt_ids=np.repeat(np.arange(len(answers)), cfg.group_size),
    mask=None,
  )
  examples = [Example(str(i), "q", a) for i, a in enumerate(answers)]
  n, t = len(texts), max(lengths)
  mask = (np.arange(t)[None] < np.asarray(lengths)[:, None]).astype("f4")

  def correct_fn(completions, gold):
    return np.array([c == g for c, g in zip(completions, gold)], np.float32)

  ctx = types.SimpleNamespace(
    cfg=cfg,
    correct_fn=correct_fn,
    score=lambda r, ex: (correct_fn(r.texts, ["1"] * n), {}),
    batch_from_rollout=lambda r: {
      "mask": mask,
      "old_logp": np.full((n, t), -1.0, np.float32),
    },
    ref_logp=lambda r: np.full((n, t), -1.5, np.float32),
  )
  return rollout, examples, ctx


def test_reward_metrics_split_length_by_outcome():
  cfg = objective.PGConfig(group_size=2)
  rollout, examples, ctx = _fake(cfg, ["1", "2", "2", "2"], [3, 5, 7, 9], "12")
  # correct: [1, 0, 1, 1] (gold 1, 2): right lengths 3, 7, 9; wrong 5.
  m = objective.reward_metrics(np.zeros(4), {}, rollout, examples, ctx)
  assert m["length/correct"] == pytest.approx(19 / 3, rel=1e-6, abs=1e-6)
  assert m["length/incorrect"] == pytest.approx(5.0, rel=1e-6, abs=1e-6)
  assert m["accuracy"] == pytest.approx(0.75, rel=1e-6, abs=1e-6)
  rollout, examples, ctx = _fake(cfg, ["1", "1"], [2, 4], "1")
  m = objective.reward_metrics(np.zeros(2), {}, rollout, examples, ctx)
  assert "length/incorrect" not in m


def test_outcome_batch_puts_kl_in_the_reward():
  cfg = dataclasses.replace(
    objective.PGConfig(advantage="rloo", group_size=2), kl_reward_coef=0.2
  )
  rollout, examples, ctx = _fake(cfg, ["1", "2", "1", "1"], [1, 2, 2, 2], "11")
  batch, m = objective.outcome_batch(rollout, examples, ctx)
  # Scores [1, 0, 1, 1]; k1 = 0.5 per valid token, penalty 0.1 per token:
  # r' = [0.9, -0.2, 0.8, 0.8]; RLOO with G = 2: [1.1, -1.1, 0, 0].
  np.testing.assert_allclose(
    batch["adv"], [1.1, -1.1, 0.0, 0.0], rtol=1e-6, atol=1e-6
  )
  assert "ref_logp" in batch
  assert m["kl_reward"] == pytest.approx(0.5, rel=1e-6, abs=1e-6)

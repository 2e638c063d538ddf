"""Multi-turn rollouts: cache continuation, observation masking, returns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import advantages
from rlreason import multiturn
from rlreason import objective
from rlreason import policy
from rlreason import turn_credit
from rlreason.data import Example
from rlreason.envs import StepResult
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer

CFG = transformer.ModelConfig(
  vocab_size=128,
  d_model=32,
  n_layers=2,
  n_heads=4,
  n_kv_heads=2,
  head_dim=8,
  mlp_dim=64,
)
TOK = tokenizer_lib.CharTokenizer()


class EchoEnv:
  """Observation `obs<k>\\n` after every turn; done after `turns` turns."""

  def __init__(self, turns):
    self.turns, self.k = turns, 0

  def reset(self, example):
    self.k = 0
    return ""

  def step(self, action):
    self.k += 1
    done = self.k >= self.turns
    obs = "" if done else f"obs{self.k}" + "!" * self.k + "\n"
    return StepResult(obs, float(self.k), done)


@pytest.fixture(scope="module")
def rollout():
  params = transformer.init(CFG, jax.random.key(0))
  prompts = [TOK.encode("Q: 1+2?\n"), TOK.encode("Q: ab\n")]
  envs = [EchoEnv(t) for t in (1, 2, 3, 3)]  # ragged episode lengths
  for e in envs:
    e.reset(Example("u", "q", "a"))
  ro = multiturn.generate(
    params,
    prompts,
    envs,
    jax.random.key(1),
    0,
    model_cfg=CFG,
    tokenizer=TOK,
    max_turns=3,
    turn_tokens=6,
    obs_tokens=8,
    group_size=2,
    turn_stop_ids=TOK.encode("\n"),
    bucket=1,
  )
  return params, ro


def test_shapes_and_turns(rollout):
  _, ro = rollout
  t = 3 * 6 + 2 * 8
  assert ro.mask.shape == (4, t) and ro.tokens.shape[1] == ro.prompt_len + t
  np.testing.assert_array_equal(ro.num_turns, [1, 2, 3, 3])
  np.testing.assert_array_equal(ro.turn_rewards[1], [1, 2, 0])
  # Observation tokens sit in the sequence, with mask 0.
  obs = ro.segment == multiturn.OBSERVATION
  assert obs[2].sum() == len("obs1!\n") + len("obs2!!\n")
  assert not np.asarray(ro.mask)[obs].any()
  assert "obs1!\n" in ro.texts[2] and "obs2!!\n" in ro.texts[2]
  np.testing.assert_array_equal(np.asarray(ro.mask).sum(-1), ro.lengths)


def test_cached_multiturn_logp_equals_full_forward(rollout):
  # The cache after prefill + turns + appended observations gives the same
  # log-probs as one forward over the compacted sequence.
  params, ro = rollout
  full = policy.completion_logprobs(
    params, ro.tokens, ro.positions, CFG, ro.prompt_len
  )
  m = np.asarray(ro.mask) > 0
  np.testing.assert_allclose(
    np.asarray(full)[m], np.asarray(ro.policy_logp)[m], atol=1e-4
  )


def test_observation_tokens_get_exactly_zero_gradient(rollout):
  params, ro = rollout
  cfg = objective.PGConfig(group_size=2)
  mask = np.asarray(ro.mask, np.float32)
  logp = jnp.asarray(ro.logp)
  # Advantages deliberately non-zero on observation tokens too.
  adv = jnp.ones_like(logp) * 0.7
  batch = {
    "tokens": ro.tokens,
    "positions": ro.positions,
    "mask": jnp.asarray(mask),
    "old_logp": logp,
    "adv": adv,
  }

  def loss(lp):
    return objective.pg_loss(
      params,
      batch,
      {},
      cfg=cfg,
      model_cfg=CFG,
      forward=(lp, jnp.zeros_like(lp)),
    )[0]

  g = np.asarray(jax.grad(loss)(logp))
  obs = ro.segment == multiturn.OBSERVATION
  assert obs.any()
  assert (g[obs] == 0).all()
  assert (g[mask > 0] != 0).all()


def test_turn_token_rewards_and_returns_across_observations():
  # One row: action tokens at columns 0-1 (turn 0), observation 2-3,
  # action 4-5 (turn 1), padding 6.
  mask = jnp.array([[1, 1, 0, 0, 1, 1, 0]], jnp.float32)
  turn_end = np.array([[1, 5]])
  r = turn_credit.turn_token_rewards(np.array([[0.5, 1.0]]), turn_end, 7)
  np.testing.assert_array_equal(r, [[0, 0.5, 0, 0, 0, 1.0, 0]])
  # REINFORCE++ returns, gamma 0.9: G5 = 1, G4 = .9, G1 = .5 + .81 = 1.31,
  # G0 = .9 * 1.31 (observations carry the return, do not discount it).
  g = advantages._discounted_returns(jnp.asarray(r), mask, 0.9)
  np.testing.assert_allclose(
    np.asarray(g)[0, [0, 1, 4, 5]], [1.179, 1.31, 0.9, 1.0], atol=1e-6
  )
  adv = advantages.reinforce_plus_plus(
    jnp.zeros(1), mask, token_rewards=jnp.asarray(r), gamma=0.9
  )
  x = np.array([1.179, 1.31, 0.9, 1.0])
  want = (x - x.mean()) / np.sqrt(x.var(ddof=1) + 1e-8)
  np.testing.assert_allclose(np.asarray(adv)[0, [0, 1, 4, 5]], want, atol=1e-5)
  assert (np.asarray(adv)[0, [2, 3, 6]] == 0).all()
  # GAE, gamma .9, lam .8, values V = [.1, .2, x, x, .3, .4]: the value after
  # column 1 is V4 (the observation is skipped).
  v = jnp.array([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4, 9.0]])
  a, ret = advantages.gae(
    jnp.asarray(r), v, mask, gamma=0.9, lam=0.8, whiten_advantages=False
  )
  d5 = 1.0 - 0.4
  d4 = 0.9 * 0.4 - 0.3
  a5, a4 = d5, d4 + 0.72 * d5
  d1 = 0.5 + 0.9 * 0.3 - 0.2
  a1 = d1 + 0.72 * a4
  d0 = 0.9 * 0.2 - 0.1
  a0 = d0 + 0.72 * a1
  np.testing.assert_allclose(
    np.asarray(a)[0], [a0, a1, 0, 0, a4, a5, 0], atol=1e-6
  )
  np.testing.assert_allclose(
    np.asarray(ret)[0],
    [a0 + 0.1, a1 + 0.2, 0, 0, a4 + 0.3, a5 + 0.4, 0],
    atol=1e-6,
  )


def test_information_gain_and_turn_advantages_hand_computed():
  probs = np.array([[0.1, 0.4, 0.0], [0.2, 0.0, 0.0]], np.float32)
  r = turn_credit.information_gain_rewards(
    probs, np.array([1.0, 0.0]), np.array([2, 1])
  )
  np.testing.assert_allclose(r, [[0.3, 1.0, 0], [0.0, 0, 0]], atol=1e-6)
  adv = turn_credit.turn_advantages(r, np.array([2, 1]), 2, gamma=0.5)
  vals = np.array([0.3, 1.0, 0.0])  # the group's taken turns
  z = (vals - vals.mean()) / (vals.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(
    adv, [[z[0] + 0.5 * z[1], z[1], 0], [z[2], 0, 0]], atol=1e-5
  )
  turn = np.array([[0, 0, 1, 1, -1], [0, 0, -1, -1, -1]])
  mask = np.array([[1, 0, 1, 1, 0], [1, 1, 0, 0, 0]])
  tok = turn_credit.spread_to_tokens(adv, turn, mask)
  np.testing.assert_allclose(
    tok,
    [[adv[0, 0], 0, adv[0, 1], adv[0, 1], 0], [adv[1, 0], adv[1, 0], 0, 0, 0]],
    atol=1e-6,
  )


def test_answer_prob_at_turn_zero_is_the_prompt_alone(rollout):
  params, ro = rollout
  answers = ["3", "3", "xy", "xy"]
  probs = turn_credit.answer_prob_at_turns(
    params, ro, answers, model_cfg=CFG, tokenizer=TOK
  )
  assert (probs[ro.num_turns == 1, 1:] == 0).all()
  ids = TOK.encode("Q: 1+2?\n") + TOK.encode("answer: 3")
  lp = policy.completion_logprobs(
    params,
    np.asarray([ids]),
    np.arange(len(ids))[None],
    CFG,
    len(ids) - len("answer: 3"),
  )
  np.testing.assert_allclose(probs[0, 0], np.exp(np.mean(lp)), rtol=1e-4)


def test_sharded_rollout_matches_single_device(rollout):
  from rlreason import mesh as mesh_lib

  params, ro = rollout
  mesh = mesh_lib.make_mesh(fsdp=4, devices=jax.devices()[:4])
  envs = [EchoEnv(t) for t in (1, 2, 3, 3)]
  sharded = multiturn.generate(
    params,
    [TOK.encode("Q: 1+2?\n"), TOK.encode("Q: ab\n")],
    envs,
    jax.random.key(1),
    0,
    model_cfg=CFG,
    tokenizer=TOK,
    max_turns=3,
    turn_tokens=6,
    obs_tokens=8,
    group_size=2,
    turn_stop_ids=TOK.encode("\n"),
    bucket=1,
    mesh=mesh,
  )
  np.testing.assert_array_equal(
    np.asarray(sharded.tokens), np.asarray(ro.tokens)
  )
  np.testing.assert_allclose(
    np.asarray(sharded.logp), np.asarray(ro.logp), atol=1e-5
  )

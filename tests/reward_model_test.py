"""Model-based rewards: scalar-head reward model and generative judge."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.rewards import model as rm

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


def test_score_reads_last_real_token_whatever_the_padding():
  params = rm.init(CFG, jax.random.key(0))
  params["head"]["w"] = jax.random.normal(jax.random.key(1), (CFG.d_model,))
  ids = TOK.encode("Q: 1+1\nanswer: 2")
  n = len(ids)
  left = np.array([[0, 0] + ids]), np.array([[-1, -1] + list(range(n))])
  right = np.array([ids + [0, 0]]), np.array([list(range(n)) + [-1, -1]])
  a = rm.score(params, *left, CFG)
  b = rm.score(params, *right, CFG)
  np.testing.assert_allclose(a, b, atol=1e-5)


def test_bradley_terry_training_ranks_chosen_above_rejected():
  params = rm.init(CFG, jax.random.key(0))
  good = [f"answer: {i + 1}" for i in range(4)]
  bad = [f"answer: x{i}" for i in range(4)]

  def enc(texts):
    from rlreason import rollout

    return rollout.pad_prompts([TOK.encode(t) for t in texts], 0, bucket=1)

  chosen, rejected = enc(good), enc(bad)
  opt = optax.adam(1e-2)
  state = opt.init(params)
  loss_fn = lambda p: rm.bradley_terry_loss(p, chosen, rejected, CFG)
  first = float(loss_fn(params))
  for _ in range(30):
    g = jax.grad(loss_fn)(params)
    upd, state = opt.update(g, state, params)
    params = optax.apply_updates(params, upd)
  assert float(loss_fn(params)) < first
  r = rm.score_texts(params, [""] * 8, good + bad, model_cfg=CFG, tokenizer=TOK)
  assert r[:4].min() > r[4:].max()


def test_parse_verdict():
  assert rm.parse_verdict(" Yes, it is") == 1.0
  assert rm.parse_verdict("no") == 0.0
  assert rm.parse_verdict("score: 7") == 0.7


def test_generative_judge_samples_through_the_sampler():
  params = transformer.init(CFG, jax.random.key(0))
  r, texts = rm.judge(
    params,
    ["1+1?", "2+2?"],
    ["2", "5"],
    jax.random.key(0),
    model_cfg=CFG,
    tokenizer=TOK,
    max_new_tokens=3,
  )
  assert r.shape == (2,) and len(texts) == 2
  assert set(np.unique(r)) <= {0.0, 1.0}
  np.testing.assert_array_equal(r, [rm.parse_verdict(t) for t in texts])


def test_model_rewards_combine_with_verifiable_rewards():
  from rlreason import rewards

  params = rm.init(CFG, jax.random.key(0))
  params["head"]["b"] = jnp.asarray(0.25)  # zero head: every score is b
  fn = rewards.combine(
    {"exact_match": 1.0, "rm": 0.5},
    fns={"rm": rm.reward_model_fn(params, model_cfg=CFG, tokenizer=TOK)},
  )
  total, parts = fn(["2", "3"], ["2", "2"], questions=["1+1=", "1+1="])
  np.testing.assert_allclose(parts["rm"], [0.25, 0.25], atol=1e-6)
  np.testing.assert_allclose(total, parts["exact_match"] + 0.125, atol=1e-6)

"""Model-based rewards: scalar-head reward model and generative judge."""

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import testing
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.rewards import model as rm

CFG = testing.tiny_model_config()
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
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_model_rewards_combine_with_verifiable_rewards():
  from rlreason import rewards

  params = rm.init(CFG, jax.random.key(0))
  params["head"]["b"] = jnp.asarray(0.25)  # zero head: every score is b
  fn = rewards.combine(
    {"exact_match": 1.0, "rm": 0.5},
    fns={"rm": rm.reward_model_fn(params, model_cfg=CFG, tokenizer=TOK)},
  )
  total, parts = fn(["2", "3"], ["2", "2"], questions=["1+1=", "1+1="])
  np.testing.assert_allclose(parts["rm"], [0.25, 0.25], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    total, parts["exact_match"] + 0.125, rtol=1e-6, atol=1e-6
  )


def test_save_and_load_params_round_trip(tmp_path):
  params = rm.init(CFG, jax.random.key(0))
  params["head"]["b"] = jnp.asarray(0.5)
  rm.save_params(str(tmp_path / "rm.safetensors"), params)
  back = rm.load_params(str(tmp_path / "rm.safetensors"))
  jax.tree.map(np.testing.assert_array_equal, params, back)


def test_a_rollout_scores_by_rows_on_the_mesh_as_all_at_once(monkeypatch):
  """The RL loop's reward-model forward (rm_grpo.scalar_reward): one train
  micro-batch of rows per forward, activations split by batch on the
  run's mesh, weights frozen in the compute dtype and laid out as the
  train state's; the same rewards as one whole-batch forward."""
  from rlreason import mesh as mesh_lib

  params = rm.init(CFG, jax.random.key(0))
  params["head"]["w"] = jax.random.normal(jax.random.key(1), (CFG.d_model,))
  rng = np.random.default_rng(0)
  n, s = 16, 12
  tokens = rng.integers(1, 40, (n, s)).astype(np.int32)
  pad = rng.integers(0, 4, n)  # left padding of each row
  positions = np.maximum(np.arange(s)[None] - pad[:, None], -1)
  tokens = np.where(positions < 0, 0, tokens)
  rollout = type("R", (), {"tokens": tokens, "positions": positions})
  want = np.asarray(rm.score(params, tokens, positions, CFG))
  mesh = mesh_lib.make_mesh(2, 4, 1)  # batch over data x fsdp: 8 shards
  frozen = rm.frozen_on_mesh(params, CFG, mesh, "float32")
  emb = jax.tree.leaves(frozen["backbone"])[0]
  assert emb.sharding.mesh is mesh, emb.sharding
  # From the host (a cached model, load_params), in bf16.
  host = jax.tree.map(np.asarray, params)
  half = rm.frozen_on_mesh(host, CFG, mesh, "bfloat16")
  dtypes = {x.dtype for x in jax.tree.leaves(half["backbone"])}
  assert dtypes == {jnp.dtype(jnp.bfloat16)}, dtypes
  assert half["head"]["w"].dtype == jnp.float32
  seen = []
  forward = rm.score

  def spy(p, t, *args):
    seen.append((t.shape[0], mesh_lib.active_mesh()))
    return forward(p, t, *args)

  monkeypatch.setattr(rm, "score", spy)
  got = rm.score_rollout(frozen, rollout, CFG, rows=8, mesh=mesh)
  assert [r for r, _ in seen] == [8, 8] and all(m is mesh for _, m in seen)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

"""Tree rollouts: shared-prefix branches score like independent samples."""

import jax
import numpy as np
import pytest

from rlreason import policy
from rlreason import sampling
from rlreason import tree
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
T = 12


@pytest.fixture(scope="module")
def setup():
  params = transformer.init(CFG, jax.random.key(0))
  prompts = [TOK.encode("Q: 12+3="), TOK.encode("Q: x")]
  tr = tree.generate(
    params,
    prompts,
    jax.random.key(3),
    0,
    model_cfg=CFG,
    tokenizer=TOK,
    max_new_tokens=T,
    roots=2,
    forks=2,
    bucket=1,
  )
  return params, tr


def test_structure(setup):
  _, tr = setup
  assert tr.mask.shape == (2 * 2 * 3, T)
  br = tr.parent >= 0
  assert br.sum() == 8 and (tr.fork_col[br] >= 0).all()
  assert (tr.fork_col[br] < tr.lengths[tr.parent[br]]).all()
  toks = np.asarray(tr.tokens)[:, tr.prompt_len :]
  for i in np.flatnonzero(br):  # branches share their parent's prefix
    f = tr.fork_col[i]
    np.testing.assert_array_equal(toks[i, :f], toks[tr.parent[i], :f])
    assert not np.asarray(tr.mask)[i, :f].any()


def test_branch_logp_equals_full_forward(setup):
  params, tr = setup
  full = policy.completion_logprobs(
    params, tr.tokens, tr.positions, CFG, tr.prompt_len
  )
  m = tr.mask_full > 0
  np.testing.assert_allclose(
    np.asarray(full)[m], np.asarray(tr.policy_logp)[m], atol=1e-4
  )


@pytest.mark.parametrize("depth", [0, 4])
def test_branch_equals_independent_sample_from_its_prefix(depth):
  # Resampling from a fork with the same key as an independent sampler
  # started on prompt + prefix gives the same tokens and log-probs.
  params = transformer.init(CFG, jax.random.key(0))
  prompt = TOK.encode("Q: 7*8=")
  tr = tree.generate(
    params,
    [prompt],
    jax.random.key(5),
    0,
    model_cfg=CFG,
    tokenizer=TOK,
    max_new_tokens=T,
    roots=1,
    forks=1,
    fork_at="depth",
    depths=(depth,),
    bucket=1,
  )
  toks = np.asarray(tr.tokens)[1, tr.prompt_len :]
  prefix = list(prompt) + toks[:depth].tolist()
  out = sampling.sample(
    params,
    np.asarray([prefix], np.int32),
    np.arange(len(prefix), dtype=np.int32)[None],
    jax.random.fold_in(jax.random.fold_in(jax.random.key(5), 0), 1),
    model_cfg=CFG,
    max_new_tokens=T - depth,
    stop_ids=(TOK.eos_id,),
  )
  n = int(out.lengths[0])
  np.testing.assert_array_equal(
    np.asarray(out.tokens)[0, :n], toks[depth : depth + n]
  )
  np.testing.assert_allclose(
    np.asarray(out.logp)[0, :n],
    np.asarray(tr.logp)[1, depth : depth + n],
    atol=1e-5,
  )


def test_tree_advantages_hand_computed():
  # One prompt. Root 0 (reward 1) forks: row 1 at col 2 (reward 0), row 2 at
  # col 4 (reward 0). Root 3 (reward 1), no forks. T = 6, all full length.
  parent = np.array([-1, 0, 0, -1])
  fork = np.array([0, 2, 4, 0])
  r = np.array([1.0, 0.0, 0.0, 1.0])
  mask = (np.arange(6)[None] >= fork[:, None]).astype(np.int32)
  adv = tree.tree_advantages(r, parent, fork, mask, np.zeros(4, int))
  vroot = 0.5
  # Row 0 segments: [0,2) leaves {0,1,2} V=1/3; [2,4) leaves {0,2} V=1/2;
  # [4,6) leaves {0} V=1.
  a0 = (2 * (1 / 3) - 2 * vroot) / np.sqrt(3)
  a1 = ((0.5 - vroot) + (0.5 - 1 / 3)) / np.sqrt(2)
  a2 = (1 - vroot) + (1 - 0.5)
  np.testing.assert_allclose(adv[0], [a0, a0, a1, a1, a2, a2], atol=1e-6)
  # Row 1 (parent node: row 0's [0,2), V=1/3): V=0.
  b = (0 - vroot) + (0 - 1 / 3)
  np.testing.assert_allclose(adv[1], [0, 0, b, b, b, b], atol=1e-6)
  # Row 2 (parent node: row 0's [2,4), V=1/2).
  c = (0 - vroot) + (0 - 0.5)
  np.testing.assert_allclose(adv[2], [0, 0, 0, 0, c, c], atol=1e-6)
  np.testing.assert_allclose(adv[3], [1.0] * 6, atol=1e-6)  # 2*(1-.5)


def test_prompt_major_keeps_parents(setup):
  _, tr = setup
  pm = tree.prompt_major(tr)
  assert (np.diff(pm.prompt_ids) >= 0).all()
  toks = np.asarray(pm.tokens)
  for i in np.flatnonzero(pm.parent >= 0):
    f = pm.fork_col[i] + pm.prompt_len
    np.testing.assert_array_equal(toks[i, :f], toks[pm.parent[i], :f])

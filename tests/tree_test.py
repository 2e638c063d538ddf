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


# Two expansion rounds (EPTree L = 2, T = 2 branches per fork point).
@pytest.fixture(scope="module")
def setup2():
  params = transformer.init(CFG, jax.random.key(0))
  prompts = [TOK.encode("Q: 12+3="), TOK.encode("Q: x")]
  kw = dict(
    model_cfg=CFG,
    tokenizer=TOK,
    max_new_tokens=T,
    roots=2,
    forks=2,
    bucket=1,
  )
  tr = tree.generate(
    params, prompts, jax.random.key(3), 0, levels=2, branches=2, **kw
  )
  one = tree.generate(
    params, prompts, jax.random.key(3), 0, levels=1, branches=2, **kw
  )
  return params, tr, one


def test_two_levels_structure(setup2):
  _, tr, _ = setup2
  # 2 prompts x 2 roots x (1 + L * N * T) = 4 * (1 + 2 * 2 * 2) leaves.
  assert tr.mask.shape == (4 * tree.leaves_per_tree(2, 2, 2), T)
  np.testing.assert_array_equal(np.bincount(tr.level), [4, 16, 16])
  lvl2 = np.flatnonzero(tr.level == 2)
  assert (tr.parent[lvl2] >= 0).all()
  # Round 2 forks chains of round 1 (pooled with the roots): some branch
  # of a branch exists, and no fork point is taken twice.
  assert (tr.level[tr.parent[lvl2]] == 1).any()
  points = {(p, c) for p, c in zip(tr.parent[lvl2], tr.fork_col[lvl2])}
  lvl1 = np.flatnonzero(tr.level == 1)
  assert not points & set(zip(tr.parent[lvl1], tr.fork_col[lvl1]))
  assert len(points) == 2 * 4  # N distinct points per tree, T rows each
  # Each fork point lies in the parent's own span, after a branch's own
  # first token.
  par = tr.parent[lvl2]
  assert (tr.fork_col[lvl2] < tr.lengths[par]).all()
  first = tr.fork_col[par] + (tr.parent[par] >= 0)
  assert (tr.fork_col[lvl2] >= first).all()
  # Every row's tree is its root's: prompt ids follow the roots.
  toks = np.asarray(tr.tokens)
  for i in np.flatnonzero(tr.parent >= 0):
    f = tr.prompt_len + tr.fork_col[i]
    np.testing.assert_array_equal(toks[i, :f], toks[tr.parent[i], :f])
    assert tr.prompt_ids[i] == tr.prompt_ids[tr.parent[i]]


def test_two_levels_extend_one_level(setup2):
  # Round 1 draws with the same keys whatever L is: the first rows of the
  # 2-level tree are the 1-level tree (the larger cache only adds holes).
  _, tr, one = setup2
  n = one.mask.shape[0]
  np.testing.assert_array_equal(np.asarray(tr.tokens)[:n], one.tokens)
  np.testing.assert_array_equal(tr.parent[:n], one.parent)
  np.testing.assert_allclose(
    np.asarray(tr.logp)[:n], np.asarray(one.logp), atol=1e-5
  )


def test_two_levels_logp_equals_full_forward(setup2):
  params, tr, _ = setup2
  full = policy.completion_logprobs(
    params, tr.tokens, tr.positions, CFG, tr.prompt_len
  )
  m = tr.mask_full > 0
  assert (m[tr.level == 2]).sum() > 0
  np.testing.assert_allclose(
    np.asarray(full)[m], np.asarray(tr.policy_logp)[m], atol=1e-4
  )


def test_two_levels_train_every_token_once(setup2):
  # Each (row, column) of each leaf's response is owned by exactly one row:
  # the nearest ancestor-or-self whose own span [fork_col, len) holds it;
  # the mask is 1 exactly on the owned cells, which hold the same token.
  _, tr, _ = setup2
  toks = np.asarray(tr.tokens)[:, tr.prompt_len :]
  mask = np.asarray(tr.mask)
  owned = set()
  for i in range(len(tr.lengths)):
    for j in range(tr.lengths[i]):
      o = i
      while tr.fork_col[o] > j:
        o = tr.parent[o]
      assert mask[o, j] == 1
      assert toks[o, j] == toks[i, j]
      owned.add((o, j))
  assert mask.sum() == len(owned)
  assert mask.sum() == sum(
    tr.lengths[i] - tr.fork_col[i] for i in range(len(tr.lengths))
  )


def test_level_two_branch_equals_independent_sample():
  # fork_at=depth, one root, N = T = 1: row 1 forks the root at 3, row 2
  # forks row 1 three tokens after its fork (column 6). Resampling row 2
  # from its prefix with round 2's key reproduces its tokens and log-probs.
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
    levels=2,
    fork_at="depth",
    depths=(3,),
    bucket=1,
  )
  np.testing.assert_array_equal(tr.parent, [-1, 0, 1])
  np.testing.assert_array_equal(tr.fork_col, [0, 3, 6])
  toks = np.asarray(tr.tokens)[2, tr.prompt_len :]
  prefix = list(prompt) + toks[:6].tolist()
  out = sampling.sample(
    params,
    np.asarray([prefix], np.int32),
    np.arange(len(prefix), dtype=np.int32)[None],
    jax.random.fold_in(jax.random.fold_in(jax.random.key(5), 0), 2),
    model_cfg=CFG,
    max_new_tokens=T - 6,
    stop_ids=(TOK.eos_id,),
  )
  n = int(out.lengths[0])
  np.testing.assert_array_equal(np.asarray(out.tokens)[0, :n], toks[6 : 6 + n])
  np.testing.assert_allclose(
    np.asarray(out.logp)[0, :n], np.asarray(tr.logp)[2, 6 : 6 + n], atol=1e-5
  )


def test_tree_advantages_two_levels_hand_computed():
  # One prompt, T = 8. Root 0 (r=1) has round-1 branches 1 (col 2, r=0) and
  # 2 (col 5, r=1); round 2 forks branch 1 at col 4 (row 3, r=1) and the
  # root again at col 6 (row 4, r=0). Root 5 (r=0) has no branches.
  parent = np.array([-1, 0, 0, 1, 0, -1])
  fork = np.array([0, 2, 5, 4, 6, 0])
  r = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
  mask = (np.arange(8)[None] >= fork[:, None]).astype(np.int32)
  adv = tree.tree_advantages(r, parent, fork, mask, np.zeros(6, int))
  vr = 0.5  # 3 of 6 leaves correct
  a = lambda v, vp, n: ((v - vr) + (v - vp)) / np.sqrt(n)
  # Row 0 nodes: [0,2) leaves {0,1,3,2,4} V=3/5; [2,5) {0,2,4} V=2/3;
  # [5,6) {0,4} V=1/2; [6,8) {0} V=1.
  row0 = [a(0.6, vr, 5)] * 2 + [a(2 / 3, 0.6, 3)] * 3
  row0 += [a(0.5, 2 / 3, 2)] + [a(1.0, 0.5, 1)] * 2
  np.testing.assert_allclose(adv[0], row0, atol=1e-6)
  # Row 1 (parent node row 0 [0,2), V=3/5): [2,4) {1,3} V=1/2; [4,8) {1} V=0.
  row1 = [0, 0] + [a(0.5, 0.6, 2)] * 2 + [a(0.0, 0.5, 1)] * 4
  np.testing.assert_allclose(adv[1], row1, atol=1e-6)
  # Row 3 hangs off row 1's [2,4) (V=1/2); row 2 off row 0's [2,5) (V=2/3);
  # row 4 off row 0's [5,6) (V=1/2); root 5 off the virtual root.
  np.testing.assert_allclose(adv[3], [0] * 4 + [a(1.0, 0.5, 1)] * 4, atol=1e-6)
  np.testing.assert_allclose(
    adv[2], [0] * 5 + [a(1.0, 2 / 3, 1)] * 3, atol=1e-6
  )
  np.testing.assert_allclose(adv[4], [0] * 6 + [a(0.0, 0.5, 1)] * 2, atol=1e-6)
  np.testing.assert_allclose(adv[5], [a(0.0, vr, 1)] * 8, atol=1e-6)


def test_tree_advantages_fork_at_a_branch_start_is_the_parents_fork():
  # Row 2 forks branch 1 at branch 1's first own column (3): it shares
  # only the root's tokens [0, 3), the same tree as forking the root there.
  r = np.array([1.0, 0.0, 1.0])
  fork = np.array([0, 3, 3])
  mask = (np.arange(6)[None] >= fork[:, None]).astype(np.int32)
  ids = np.zeros(3, int)
  nested = tree.tree_advantages(r, np.array([-1, 0, 1]), fork, mask, ids)
  flat = tree.tree_advantages(r, np.array([-1, 0, 0]), fork, mask, ids)
  np.testing.assert_allclose(nested, flat, atol=1e-6)
  np.testing.assert_allclose(nested.sum(-1) != 0, [True, True, True])


def test_make_generate_fn_builds_l_level_trees():
  import types

  cfg = types.SimpleNamespace(
    forks=1,
    fork_levels=2,
    fork_branches=1,
    max_new_tokens=6,
    max_prompt_len=16,
  )
  fn = tree.make_generate_fn(cfg)
  ctx = types.SimpleNamespace(
    encode_prompts=lambda ex: [TOK.encode(e) for e in ex],
    model_cfg=CFG,
    tokenizer=TOK,
    mesh=None,
  )
  params = transformer.init(CFG, jax.random.key(0))
  kw = dict(group_size=6, sampling=sampling.Sampling())
  out = fn(ctx, params, ["Q: 1+1=", "Q: 2"], jax.random.key(1), 0, **kw)
  # 6 leaves per prompt = 2 roots x (1 + 2 * 1 * 1), prompt-major.
  np.testing.assert_array_equal(out.prompt_ids, np.repeat([0, 1], 6))
  np.testing.assert_array_equal(np.bincount(out.level), [4, 4, 4])
  # ETTRL's whole leaves: each row's mask is its own whole response.
  whole = tree.make_generate_fn(cfg, whole_leaves=True)
  out = whole(ctx, params, ["Q: 1+1=", "Q: 2"], jax.random.key(1), 0, **kw)
  np.testing.assert_array_equal(out.mask, out.mask_full)
  kw["group_size"] = 1  # not a multiple of 3: plain chains (evaluation)
  plain = fn(ctx, params, ["Q: 1+1="], jax.random.key(1), 0, **kw)
  assert not hasattr(plain, "parent")


def test_pooled_fork_points_hand_made_tree():
  # Root 0 (len 6) and its round-1 branch 1 (forked at col 2, len 6).
  ent = np.array(
    [[0.1, 0.9, 0.5, 0.2, 0.8, 0.3], [0, 0, 0.95, 0.7, 0.1, 0.6]], np.float32
  )
  used = np.zeros((2, 6), bool)
  used[0, 2] = True  # branch 1's fork point
  args = (
    ent,
    np.array([6, 6]),
    np.array([-1, 0]),
    np.array([0, 2]),
    np.array([0, 0]),
    np.array([0, 1]),
    used,
  )
  # Pooled over the whole tree: the root's own tokens win; the branch's
  # first token (0.95) and the used (0, 2) are not candidates.
  rows, cols = tree.pooled_fork_points(*args, 2, round_=2)
  assert list(zip(rows, cols)) == [(0, 1), (0, 4)]
  rows, cols = tree.pooled_fork_points(*args, 3, round_=2)
  assert list(zip(rows, cols)) == [(0, 1), (0, 4), (1, 3)]
  # depth: round 1's chain (row 1) two tokens after its own fork.
  rows, cols = tree.pooled_fork_points(
    *args, 2, round_=2, fork_at="depth", depths=(2,)
  )
  assert list(zip(rows, cols)) == [(1, 4), (1, 4)]
  # No candidate left: the root at column 0.
  rows, cols = tree.pooled_fork_points(
    ent, np.array([1, 3]), *args[2:6], np.ones((2, 6), bool), 1, round_=2
  )
  assert list(zip(rows, cols)) == [(0, 0)]

"""Tree rollouts: shared-prefix branches score like independent samples."""

import dataclasses

import jax
import numpy as np
import pytest

from rlreason.model import policy
from rlreason.sampling import sampler as sampling
from rlreason.sampling import draw
from rlreason import testing
from rlreason.sampling import tree
from rlreason.sampling import tree_loop
from rlreason.sampling import tree_forks
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer

CFG = testing.tiny_model_config()
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
    np.asarray(full)[m], np.asarray(tr.policy_logp)[m], rtol=1e-5, atol=1e-4
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
    rtol=1e-5,
    atol=1e-5,
  )


def test_prompt_major_keeps_parents(setup):
  _, tr = setup
  pm = tree_loop.prompt_major(tr)
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
    np.asarray(tr.logp)[:n], np.asarray(one.logp), rtol=1e-5, atol=1e-5
  )


def test_two_levels_logp_equals_full_forward(setup2):
  params, tr, _ = setup2
  full = policy.completion_logprobs(
    params, tr.tokens, tr.positions, CFG, tr.prompt_len
  )
  m = tr.mask_full > 0
  assert (m[tr.level == 2]).sum() > 0
  np.testing.assert_allclose(
    np.asarray(full)[m], np.asarray(tr.policy_logp)[m], rtol=1e-5, atol=1e-4
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
    np.asarray(out.logp)[0, :n],
    np.asarray(tr.logp)[2, 6 : 6 + n],
    rtol=1e-5,
    atol=1e-5,
  )


def _tree_loop_setup(rollout_rows=0, mesh=None, rollout_tensor=0):
  """(cfg, ctx, params) for tree_loop's generate_fn: forks 1, levels 2
  (3 leaves per root), 6 new tokens per round."""
  import types

  cfg = types.SimpleNamespace(
    forks=1,
    fork_levels=2,
    fork_branches=1,
    max_new_tokens=6,
    max_prompt_len=16,
    rollout_rows=rollout_rows,
  )
  ctx = types.SimpleNamespace(
    encode_prompts=lambda ex: [TOK.encode(e) for e in ex],
    model_cfg=CFG,
    # Context's: the run's rollout flags (--rollout_tensor).
    segments_model_cfg=dataclasses.replace(CFG, rollout_tensor=rollout_tensor),
    tokenizer=TOK,
    mesh=mesh,
  )
  return cfg, ctx, transformer.init(CFG, jax.random.key(0))


def test_make_generate_fn_builds_l_level_trees():
  cfg, ctx, params = _tree_loop_setup()
  fn = tree_loop.make_generate_fn(cfg)
  kw = dict(group_size=6, sampling=draw.Sampling())
  out = fn(ctx, params, ["Q: 1+1=", "Q: 2"], jax.random.key(1), 0, **kw)
  # 6 leaves per prompt = 2 roots x (1 + 2 * 1 * 1), prompt-major.
  np.testing.assert_array_equal(out.prompt_ids, np.repeat([0, 1], 6))
  np.testing.assert_array_equal(np.bincount(out.level), [4, 4, 4])
  # ETTRL's whole leaves: each row's mask is its own whole response.
  whole = tree_loop.make_generate_fn(cfg, whole_leaves=True)
  out = whole(ctx, params, ["Q: 1+1=", "Q: 2"], jax.random.key(1), 0, **kw)
  np.testing.assert_array_equal(out.mask, out.mask_full)
  kw["group_size"] = 1  # not a multiple of 3: plain chains (evaluation)
  plain = fn(ctx, params, ["Q: 1+1="], jax.random.key(1), 0, **kw)
  assert not hasattr(plain, "parent")


def _tree_fn_run(
  rollout_rows=0, mesh=None, rollout_tensor=0, progress=None, interrupt=None
):
  """tree_loop's generate_fn: 3 prompts, group 6 = 2 roots x 3 leaves,
  per prompt 6 leaves + 2 roots' copies = 8 rows."""
  cfg, ctx, params = _tree_loop_setup(rollout_rows, mesh, rollout_tensor)
  ctx.interrupt = interrupt
  return tree_loop.make_generate_fn(cfg)(
    ctx,
    params,
    ["Q: 1+1=", "Q: 2", "Q: 345*"],
    jax.random.key(1),
    0,
    group_size=6,
    sampling=draw.Sampling(),
    progress=progress,
  )


def _assert_same_trees(a, b):
  for k in ("tokens", "positions", "mask"):
    np.testing.assert_array_equal(np.asarray(getattr(a, k)), getattr(b, k))
  for k in ("parent", "prompt_ids", "level", "fork_col", "lengths"):
    np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
  assert a.texts == b.texts
  for k in ("logp", "policy_logp"):
    np.testing.assert_allclose(
      np.asarray(getattr(a, k)),
      np.asarray(getattr(b, k)),
      rtol=1e-5,
      atol=1e-6,
    )


@pytest.fixture(scope="module")
def one_call():
  return _tree_fn_run()


def test_trees_sampled_a_prompt_per_call_equal_one_call(one_call, monkeypatch):
  """--rollout_rows=8 holds one prompt's tree per call: 3 calls, each
  round's rows drawing with their keys in one call (row_offsets), so the
  forest is the one call's."""
  calls = testing.spy(
    monkeypatch, tree, "generate", lambda *a, **k: k["row_offsets"]
  )
  reports, checks = [], []
  _assert_same_trees(
    _tree_fn_run(
      rollout_rows=8,
      progress=reports.append,
      interrupt=lambda: checks.append(len(calls)),
    ),
    one_call,
  )
  # 2 roots, then 2 branches per level, per prompt.
  assert calls == [(0, 0, 0), (2, 2, 2), (4, 4, 4)]
  assert reports == [6, 12]  # the loop's rows (leaves) after calls 1 and 2
  assert checks == [1, 2]  # ctx.interrupt: there too


def test_tree_calls_are_sized_from_the_devices_free_memory(
  one_call, monkeypatch
):
  """On 8 devices (rows over data x fsdp = 4) with room for 5 sequences
  per device, a call holds 20 rows: two prompts' 8, then the third's."""
  from rlreason import mesh as mesh_lib

  # Prompts bucketed to 32 tokens, capped at max_prompt_len = 16; 3
  # rounds of 6 tokens.
  testing.room_for(monkeypatch, CFG, 16, 3 * 6, 5.5, tensor=2)
  sizes = testing.spy(monkeypatch, tree, "generate", lambda *a, **k: len(a[1]))
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  _assert_same_trees(_tree_fn_run(mesh=mesh), one_call)
  assert sizes == [2, 1]


def test_tree_loop_samples_on_the_samplers_own_mesh(one_call, monkeypatch):
  """--rollout_tensor=4 over a (1, 8, 1) run: the loop lays the weights
  out once on the sampler's (1, 2, 4) mesh, sizes its calls there (room
  for 5 sequences per device, rows over 2 shards: 10 rows, one prompt's
  tree per call) and samples the one call's forest."""
  from rlreason import mesh as mesh_lib

  testing.room_for(monkeypatch, CFG, 16, 3 * 6, 5.5, tensor=4)
  laid = testing.spy(
    monkeypatch, tree_loop.rollout_layout, "to_layout",
    lambda *a: dict(a[1].shape),
  )  # fmt: skip
  sizes = testing.spy(monkeypatch, tree, "generate", lambda *a, **k: len(a[1]))
  mesh = mesh_lib.make_mesh(data=1, fsdp=8, tensor=1)
  out = _tree_fn_run(mesh=mesh, rollout_tensor=4)
  _assert_same_trees(out, one_call)
  assert laid[0] == {"data": 1, "fsdp": 2, "tensor": 4}, laid
  assert sizes == [1, 1, 1]
  assert out.tokens.sharding.mesh == mesh


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
  rows, cols = tree_forks.pooled_fork_points(*args, 2, round_=2)
  assert list(zip(rows, cols)) == [(0, 1), (0, 4)]
  rows, cols = tree_forks.pooled_fork_points(*args, 3, round_=2)
  assert list(zip(rows, cols)) == [(0, 1), (0, 4), (1, 3)]
  # depth: round 1's chain (row 1) two tokens after its own fork.
  rows, cols = tree_forks.pooled_fork_points(
    *args, 2, round_=2, fork_at="depth", depths=(2,)
  )
  assert list(zip(rows, cols)) == [(1, 4), (1, 4)]
  # No candidate left: the root at column 0.
  rows, cols = tree_forks.pooled_fork_points(
    ent, np.array([1, 3]), *args[2:6], np.ones((2, 6), bool), 1, round_=2
  )
  assert list(zip(rows, cols)) == [(0, 0)]


@pytest.mark.parametrize("rollout_tensor", [0, 4])
def test_sharded_tree_matches_single_device(
  setup2, rollout_tensor, monkeypatch
):
  """8 devices: rows split over (data, fsdp) = 4 shards, heads over tensor
  = 2 (or, --rollout_tensor=4, decoded on the same devices as (2, 1, 4):
  rows over 2 shards, heads over 4); two rounds (caches concatenated)
  give the same tree, and the outputs (prompt-major too) are split by
  rows on the run's mesh."""
  from rlreason import mesh as mesh_lib

  params, ref, _ = setup2
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  assert mesh.devices.size == 8
  layout = tree.rollout_layout  # the meshes it lays the weights out on
  decoded_on = testing.spy(
    monkeypatch, layout, "on_mesh", lambda *a: dict(a[2].shape)
  )
  tr = tree.generate(
    params,
    [TOK.encode("Q: 12+3="), TOK.encode("Q: x")],
    jax.random.key(3),
    0,
    model_cfg=dataclasses.replace(CFG, rollout_tensor=rollout_tensor),
    tokenizer=TOK,
    max_new_tokens=T,
    roots=2,
    forks=2,
    levels=2,
    branches=2,
    bucket=1,
    mesh=mesh,
  )
  np.testing.assert_array_equal(np.asarray(tr.tokens), np.asarray(ref.tokens))
  tensor = rollout_tensor or 2
  assert decoded_on == [{"data": 2, "fsdp": 8 // 2 // tensor, "tensor": tensor}]
  for name in ("parent", "fork_col", "lengths", "level"):
    np.testing.assert_array_equal(getattr(tr, name), getattr(ref, name))
  for name in ("logp", "policy_logp"):
    np.testing.assert_allclose(
      np.asarray(getattr(tr, name)),
      np.asarray(getattr(ref, name)),
      rtol=1e-5,
      atol=1e-5,
    )
  for out in (tr, tree_loop.prompt_major(tr)):
    for name in ("tokens", "positions", "logp", "policy_logp", "mask"):
      x = getattr(out, name)
      assert x.sharding.spec[0] == ("data", "fsdp"), name
      assert x.sharding.mesh == mesh, name
      shapes = {sh.data.shape for sh in x.addressable_shards}
      assert shapes == {(36 // 4, x.shape[1])}, (name, shapes)


def _first_end(toks, seq, lo):
  """Length up to the first occurrence of seq ending at column >= lo."""
  k = len(seq)
  for e in range(max(lo, k - 1), len(toks)):
    if tuple(toks[e - k + 1 : e + 1]) == tuple(seq):
      return e + 1
  return None


def test_branch_stops_after_a_stop_sequence():
  # One root forked at depth 4: with a 2-token stop sequence the root and
  # the branch stop right after its first occurrence in their completion,
  # the branch's counting its shared prefix (a sequence across the fork).
  params = transformer.init(CFG, jax.random.key(0))
  d = 4
  kw = dict(
    model_cfg=CFG,
    tokenizer=TOK,
    max_new_tokens=T,
    roots=1,
    forks=1,
    fork_at="depth",
    depths=(d,),
    bucket=1,
  )
  prompt = [TOK.encode("Q: 7*8=")]
  free = tree.generate(params, prompt, jax.random.key(5), 0, **kw)
  assert (free.lengths == T).all() and (free.fork_col[1] == d)
  comp = np.asarray(free.tokens)[:, free.prompt_len :]
  root, branch = comp[0].tolist(), comp[1].tolist()
  inside = (branch[d + 1], branch[d + 2])  # the branch's own tokens
  across = (branch[d - 1], branch[d])  # ends on the branch's first token
  for seq in (inside, across):
    root_len = _first_end(root, seq, 1) or T
    assert root_len > d  # the fork stays at d (this key's chains)
    want = _first_end(branch, seq, d)
    assert want is not None and want < T
    tr = tree.generate(
      params, prompt, jax.random.key(5), 0, stop_sequences=(seq,), **kw
    )
    assert tr.lengths[0] == root_len, seq
    assert tr.lengths[1] == want, (seq, tr.lengths, want)
    assert tr.finish_reasons[1] == "eos"
    toks = np.asarray(tr.tokens)[1, tr.prompt_len :]
    assert tuple(toks[want - 2 : want]) == seq
    np.testing.assert_array_equal(toks[:want], branch[:want])
    assert (toks[want:] == TOK.pad_id).all()
    assert not np.asarray(tr.mask_full)[1, want:].any()


def test_check_shape_names_the_flags():
  import types

  cfg = types.SimpleNamespace(
    forks=2, fork_levels=2, fork_branches=1, group_size=12
  )
  with pytest.raises(ValueError, match=r"--group_size=12 .* = 5"):
    tree_loop.check_shape(cfg)
  tree_loop.check_shape(types.SimpleNamespace(forks=2, group_size=6))  # 1 + 2
  with pytest.raises(ValueError, match="must be >= 1"):
    tree_loop.check_shape(types.SimpleNamespace(forks=0, group_size=6))

"""The planner's tree rollout (treerl, ettrl): a call holds whole prompts'
trees, each row a cache of P + (1 + L) T slots (tree.generate), sized as
tree_loop sizes its calls; compiled here for the local 8-device CPU mesh
(the TPU path is the same code, plan_test.py compiles for TPU)."""

import dataclasses

import jax

from experiments import treerl
from rlreason import mesh as mesh_lib
from rlreason import testing
from rlreason.plan import aot
from rlreason.plan import rollout as plan_rollout
from rlreason.rl import objective
from rlreason.sampling import tree_loop


def _cfg(**kw):
  # 4 leaves per prompt = 2 roots x (1 + 1 level x 1 fork x 1 branch):
  # 6 rows with the roots' copy; P + (1 + L) T = 16 + 2 * 24 = 64 slots.
  return dataclasses.replace(
    treerl.Config(),
    **{"batch_size": 4, **kw},
    group_size=4,
    forks=1,
    fork_levels=1,
    fork_branches=1,
    max_prompt_len=16,
    max_new_tokens=24,
  )


def test_a_tree_call_holds_whole_prompts_whose_rows_split_over_the_shards():
  # Rows for 2 prompts of 8 over 4 shards: 2 (any count of 8 rows splits).
  assert tree_loop.call_prompts(20, 8, 4) == 2
  # 36 rows per prompt over 16 shards: groups of 4 prompts (144 rows).
  assert tree_loop.call_prompts(500, 36, 16) == 12  # 13 prompts' rows
  assert tree_loop.call_prompts(600, 36, 16) == 16
  # Fewer rows than one group: still one group (split, not replicated).
  assert tree_loop.call_prompts(100, 36, 16) == 4
  assert tree_loop.call_prompts(5, 6, 1) == 1


def test_a_tree_call_holds_whole_trees_of_the_tree_caches_length():
  cfg = _cfg()
  assert tree_loop.call_shape(cfg) == (6, 64, 2)
  assert tree_loop.call_shape(cfg, group_size=8) == (12, 64, 2)
  plain = dataclasses.replace(cfg, forks=0)
  assert tree_loop.call_shape(plain) is None
  mesh = mesh_lib.make_mesh(1, -1, 1)
  model_cfg = testing.tiny_model_config()
  # No HBM figure: all 4 prompts' 24 rows (their leaves and roots' copies).
  assert plan_rollout.rows_for(cfg, model_cfg, mesh, None, 0) == 24
  # 7 rows asked (the loop's call sizing): whole prompts whose rows split
  # over the 8 devices, 4 prompts' 24 rows (one prompt's 6 would be
  # replicated on every device).
  prog = plan_rollout.compile_rollout(cfg, model_cfg, mesh, 7)
  assert prog.rows == 24
  # The caches the call keeps, per device: K and V of 3 rows x 2 heads x
  # 64 slots x 8 dims per layer (float32), and the slots' positions.
  cache = 2 * model_cfg.n_layers * 3 * 2 * 64 * 8 * 4
  assert prog.output_bytes >= cache, (prog.output_bytes, cache)
  shapes = [s for _, s, _ in prog.largest]
  assert any(",64," in s or ",64]" in s for s in shapes), shapes
  # Plain sampling of the same rows holds P + T = 40 slots per row.
  flat = plan_rollout.compile_rollout(plain, model_cfg, mesh, 24)
  assert flat.peak_bytes < prog.peak_bytes, (flat, prog)


def test_a_tree_rollout_over_its_fit_is_retried_at_whole_prompts():
  """Over the fit, the planner halves a rollout's rows per call: a tree's
  in whole prompts (6 rows each here), down to one prompt (on one
  device), and the --rollout_rows it names is the rows it compiled."""
  cfg = _cfg(batch_size=2)  # 2 prompts: 12 rows in one call
  mesh = mesh_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  progs = aot.compile_run(
    cfg,
    objective.loss_fn,
    mesh,
    programs=("rollout",),
    model_cfg=testing.tiny_model_config(),
    fit_bytes=1,  # nothing fits: halved until one prompt's rows
  )
  prog = progs["rollout"]
  assert (prog.rows, prog.rows_flag) == (6, 6), prog

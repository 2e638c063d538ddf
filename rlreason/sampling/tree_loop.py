"""Tree rollouts in the training loop: a generate_fn that samples trees.

  def validate(self):  # of an experiment Config
    super().validate()
    tree_loop.check_shape(self)

  loop.train(..., generate_fn=tree_loop.make_generate_fn(cfg))

`make_generate_fn` samples each training group as EPTree forests
(tree.generate) and returns them `prompt_major`, each prompt's tree
contiguous as the loop's group statistics expect; evaluation group sizes
sample plain chains (rollout.generate). The prompts' trees are sampled in
calls of as many as the devices' free memory holds (--rollout_rows, else
rollout_memory.call_rows; a prompt counts its leaves and its roots'
cache copy), each round's rows drawing with their keys in one call
(tree.generate's row_offsets), so the forest does not depend on the call
size; `concat` joins the calls. `tree_shape` reads (forks, levels,
branches) off an experiment Config, `check_shape` checks that its
group_size is a whole number of trees. experiments/treerl.py and
experiments/ettrl.py train with it.
"""

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.sampling import rollout as rollout_lib
from rlreason.sampling import padding
from rlreason.sampling import rollout_layout
from rlreason.sampling import rollout_memory
from rlreason.sampling import tree


def _like(x: np.ndarray, ref: jax.Array) -> jax.Array:
  """Host x on ref's sharding when ref is split over a mesh."""
  if isinstance(ref.sharding, jax.sharding.NamedSharding):
    return mesh_lib.put_global(x, ref.sharding)
  return jnp.asarray(x)


def prompt_major(tr: tree.TreeRollout) -> tree.TreeRollout:
  """Rows reordered so each prompt's tree is contiguous (roots, branches),
  as the loop's group statistics expect; `parent` is remapped. Device
  arrays keep their sharding."""
  order = np.argsort(tr.prompt_ids, kind="stable")
  new = np.empty_like(order)
  new[order] = np.arange(len(order))
  take = lambda x: x[order] if isinstance(x, np.ndarray) else x
  fields = {k: take(v) for k, v in tr._asdict().items()}
  for k in ("tokens", "positions", "logp", "policy_logp", "mask"):
    x = getattr(tr, k)
    fields[k] = _like(mesh_lib.to_host(x)[order], x)
  fields["texts"] = [tr.texts[i] for i in order]
  fields["parent"] = np.where(tr.parent[order] >= 0, new[tr.parent[order]], -1)
  return tree.TreeRollout(**fields)


def tree_shape(cfg) -> tuple[int, int, int]:
  """(forks, levels, branches) of an experiment Config: cfg.forks,
  cfg.fork_levels (default 1), cfg.fork_branches (default 1)."""
  return (
    int(cfg.forks),
    int(getattr(cfg, "fork_levels", 1)),
    int(getattr(cfg, "fork_branches", 1)),
  )


def call_shape(cfg, group_size: int = 0):
  """(rows per prompt, cache slots per row, rounds) of the tree rollout
  calls make_generate_fn makes for groups of `group_size` (default
  cfg.group_size) leaves: a prompt's leaves and its roots' cache copy,
  P + (1 + L) T slots per row (tree.generate), the roots' round and L
  expansion rounds; None for a config without `forks` (plain sampling)."""
  if not getattr(cfg, "forks", 0):
    return None
  forks, levels, branches = tree_shape(cfg)
  group_size = group_size or cfg.group_size
  roots = group_size // tree.leaves_per_tree(forks, levels, branches)
  slots = cfg.max_prompt_len + (1 + levels) * cfg.max_new_tokens
  return group_size + roots, slots, 1 + levels


def call_prompts(rows: int, per_prompt: int, shards: int = 1) -> int:
  """Prompts per tree call: as many whole prompts as `rows` rows hold, in
  groups of the fewest prompts whose rows split evenly over the `shards`
  batch shards (rows that do not divide are replicated, mesh.put_rows:
  every device would hold the whole call's caches); at least one group."""
  group = shards // math.gcd(per_prompt, shards)
  return max(group, rows // per_prompt // group * group)


def check_shape(cfg) -> None:
  """Raises ValueError unless cfg's tree shape is valid and its group_size
  a whole number of trees (make_generate_fn's requirement)."""
  forks, levels, branches = tree_shape(cfg)
  if min(forks, levels, branches) < 1:
    raise ValueError(
      "Invalid config: --forks, --fork_levels and --fork_branches must be >= 1"
    )
  k = tree.leaves_per_tree(forks, levels, branches)
  if cfg.group_size % k:
    raise ValueError(
      f"Invalid config: --group_size={cfg.group_size} must be a multiple of "
      f"1 + --fork_levels * --forks * --fork_branches = {k} (leaves per "
      "tree)"
    )


def make_generate_fn(
  cfg,
  *,
  fork_at: str = "entropy",
  depths: Sequence[int] = (),
  whole_leaves: bool = False,
):
  """A loop generate_fn (train(generate_fn=...)) sampling trees per prompt.

  Training rollouts (group_size divisible by k = leaves_per_tree of
  tree_shape(cfg)) are EPTree forests of group_size / k roots, returned
  prompt-major; any other group size (evaluation) samples plain chains.
  whole_leaves: every leaf's mask covers its whole response, shared prefix
  included (ETTRL); otherwise each token is owned by one leaf (TreeRL).
  Its `progress` (Context.generate's) gets the rows sampled after each
  sampler call of trees but the last, and ctx.interrupt is called there.
  """
  forks, levels, branches = tree_shape(cfg)
  k = tree.leaves_per_tree(forks, levels, branches)

  def fn(
    ctx, params, examples, rng, step, *, group_size, sampling, progress=None
  ):
    prompts = ctx.encode_prompts(examples)
    model_cfg = ctx.segments_model_cfg  # the run's rollout flags
    interrupt = getattr(ctx, "interrupt", None)  # Context's
    kw = dict(
      model_cfg=model_cfg,
      tokenizer=ctx.tokenizer,
      max_new_tokens=cfg.max_new_tokens,
      sampling=sampling,
      max_prompt_len=cfg.max_prompt_len,
      mesh=ctx.mesh,
    )
    if group_size % k:  # evaluation: plain chains
      return rollout_lib.generate(
        params, prompts, rng, step, group_size=group_size, progress=progress,
        interrupt=interrupt, **kw,
      )  # fmt: skip
    roots = group_size // k
    # The sampler's mesh (--rollout_tensor: rollout_layout.sampling_mesh).
    mesh = rollout_layout.sampling_mesh(ctx.mesh, model_cfg)
    if mesh is not None:  # placed once, for the sizing and every call
      params = rollout_layout.to_layout(params, mesh, model_cfg)
    # One prompt length for every call: the batch's (padding.pad_prompts).
    p = padding.prompt_length(max(map(len, prompts)), 32, cfg.max_prompt_len)
    # Its leaves and its roots' copy, each (1 + L) T slots past the prompt.
    per_prompt, slots, _ = call_shape(cfg, group_size)
    rows = rollout_memory.call_rows(
      getattr(cfg, "rollout_rows", 0),
      len(prompts) * per_prompt,
      model_cfg,
      p,
      slots - cfg.max_prompt_len,
      mesh,
      params,
    )
    shards = 1
    if mesh is not None:
      shards = mesh_lib.batch_divisor(mesh, mesh_lib.ROLLOUT_RULES)
    step_prompts = call_prompts(rows, per_prompt, shards)
    offsets = np.zeros(1 + levels, np.int64)
    calls = []
    for lo in range(0, len(prompts), step_prompts):
      tr = tree.generate(
        params,
        prompts[lo : lo + step_prompts],
        rng,
        step,
        roots=roots,
        forks=forks,
        levels=levels,
        branches=branches,
        fork_at=fork_at,
        depths=depths,
        bucket=p,
        row_offsets=tuple(int(x) for x in offsets),
        **kw,
      )
      offsets += np.bincount(tr.level, minlength=1 + levels)
      calls.append(prompt_major(tr))
      if lo + step_prompts < len(prompts):
        if progress is not None:
          progress((lo + step_prompts) * group_size)  # rows of whole trees
        if interrupt is not None:
          interrupt()
    out = concat(calls, ctx.mesh)
    if whole_leaves:
      out = out._replace(mask=_like(out.mask_full, out.mask))
    return out

  return fn


def concat(calls: Sequence[tree.TreeRollout], mesh) -> tree.TreeRollout:
  """Prompt-major tree rollouts of consecutive prompts as one: prompt ids
  and parents shifted past the earlier calls', device arrays split by rows
  over `mesh` (mesh_lib.put_rows)."""
  if len(calls) == 1:
    return calls[0]
  first = calls[0]
  fields = {}
  for k, v in first._asdict().items():
    parts = [getattr(c, k) for c in calls]
    if k == "prompt_len":
      fields[k] = v
    elif k == "texts":
      fields[k] = sum((list(x) for x in parts), [])
    elif isinstance(v, np.ndarray):
      fields[k] = np.concatenate(parts)
    else:  # device arrays
      fields[k] = mesh_lib.put_rows(
        mesh, np.concatenate([mesh_lib.to_host(x) for x in parts])
      )
  rows = np.cumsum([0] + [len(c.lengths) for c in calls[:-1]])
  prompts = np.cumsum([0] + [int(c.prompt_ids.max()) + 1 for c in calls[:-1]])
  fields["parent"] = np.concatenate(
    [np.where(c.parent >= 0, c.parent + r, -1) for c, r in zip(calls, rows)]
  )
  fields["prompt_ids"] = np.concatenate(
    [c.prompt_ids + q for c, q in zip(calls, prompts)]
  )
  return tree.TreeRollout(**fields)

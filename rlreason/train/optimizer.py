"""The optimizers of the train step: AdamW on a warm-up + constant/cosine
schedule with global-norm clipping, and groups of parameters trained as if
by their own optimizers (a critic beside the policy, value.py).

  optimizer = make_optimizer(lr=1e-6, total_steps=500, grad_clip=1.0)
  optimizer = make_optimizer(1e-6, total_steps=500, lr_scales={"critic": 5})
  optimizer = make_optimizer(1e-6, total_steps=500, lr_scales={"critic": 5},
                             group_steps={"critic": 6000})   # `grouped`

With `lr_scales` the groups share Adam's step count and every update steps
them all; with `group_steps` each group has an optimizer of its own
(`grouped`: its moments, step count, warm-up and schedule), so a train step
may update one group alone (train_step.make_train_step(groups=...)).
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from rlreason import mesh as mesh_lib


def make_schedule(
  lr: float,
  *,
  total_steps: int,
  warmup_steps: int = 0,
  schedule: str = "constant",
) -> optax.Schedule:
  """Linear warmup from 0, then constant or cosine decay to 0."""
  if schedule == "constant":
    after = optax.constant_schedule(lr)
  elif schedule == "cosine":
    after = optax.cosine_decay_schedule(lr, max(total_steps - warmup_steps, 1))
  else:
    raise ValueError(
      f"Unknown schedule {schedule!r}; expected constant or cosine"
    )
  if warmup_steps <= 0:
    return after
  warmup = optax.linear_schedule(0.0, lr, warmup_steps)
  return optax.join_schedules([warmup, after], [warmup_steps])


def make_optimizer(
  lr: float,
  *,
  total_steps: int,
  warmup_steps: int = 0,
  schedule: str = "constant",
  weight_decay: float = 0.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  grad_clip: float = 1.0,
  lr_scales: dict[str, float] | None = None,
  group_steps: dict[str, int] | None = None,
) -> optax.GradientTransformation:
  """AdamW with warmup + constant/cosine schedule and global-norm clipping.

  `lr_scales` ({top-level params key: factor}) trains those subtrees as if
  by their own optimizer (e.g. a critic beside the policy, value.py): each
  is clipped to `grad_clip` on its own, and its updates (Adam step and
  weight decay) are scaled by the factor, i.e. its peak lr is lr * factor.
  The other keys form one group at `lr`. All groups share Adam's step
  count: every update steps them all.

  `group_steps` ({key of lr_scales: its updates in the run}) makes them
  truly their own optimizers (`grouped`): each its own Adam moments and
  step count, so its warmup and schedule follow its own updates, and a
  train step may update one group alone (make_train_step(groups=...)),
  e.g. Open-Reasoner-Zero's critic taking 12 updates per rollout to the
  policy's one. The other keys are the POLICY group, `total_steps` long.
  """
  opt = functools.partial(
    _adamw,
    warmup_steps=warmup_steps,
    schedule=schedule,
    weight_decay=weight_decay,
    b1=b1,
    b2=b2,
    eps=eps,
    grad_clip=grad_clip,
  )
  if group_steps:
    scales = lr_scales or {}
    return grouped(
      {
        POLICY: opt(lr, total_steps),
        **{k: opt(lr * scales.get(k, 1.0), n) for k, n in group_steps.items()},
      }
    )
  if lr_scales:
    adam = opt(lr, total_steps, grad_clip=0.0)
    parts = [adam, scale_by_key(lr_scales)]
    if grad_clip > 0:
      parts.insert(0, clip_by_group_norm(grad_clip, tuple(lr_scales)))
    return optax.chain(*parts)
  return opt(lr, total_steps)


def _adamw(
  lr,
  total_steps,
  *,
  warmup_steps,
  schedule,
  weight_decay,
  b1,
  b2,
  eps,
  grad_clip,
):
  """One group's AdamW on its schedule, after global-norm clipping."""
  sched = make_schedule(
    lr, total_steps=total_steps, warmup_steps=warmup_steps, schedule=schedule
  )
  adam = optax.adamw(sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  if grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(grad_clip), adam)
  return adam


# The group of the policy's top-level keys in a `grouped` optimizer.
POLICY = "policy"


def group_of(key: str, groups) -> str:
  """The group of top-level params `key` among `groups` (a grouped
  optimizer's transforms or state): its own when named, else POLICY."""
  return key if key in groups and key != POLICY else POLICY


class Grouped(NamedTuple):
  """A GradientTransformation (init, update) of `grouped`, with its
  groups' transforms."""

  init: Callable
  update: Callable
  transforms: dict


def _split_by_group(tree, groups) -> dict:
  """Top-level dict `tree` as {group: its keys' subtree} (group_of)."""
  out = {}
  for k, v in (tree or {}).items():
    out.setdefault(group_of(k, groups), {})[k] = v
  return out


def grouped(transforms: dict[str, optax.GradientTransformation]) -> Grouped:
  """One optimizer per group of top-level params keys: a key named in
  `transforms` is a group of its own, every other key is POLICY's. The
  state is {group: that optimizer's state}. `update` steps only the groups
  that `updates` holds keys of and leaves the others' state as it was, so
  a step may pass one group's gradients alone."""

  parts = functools.partial(_split_by_group, groups=transforms)

  def init(params):
    split = parts(params)
    return {g: t.init(split.get(g, {})) for g, t in transforms.items()}

  def update(updates, state, params=None):
    split, of_params = parts(updates), parts(params)
    out, new_state = {}, dict(state)
    for g, part in split.items():
      done, new_state[g] = transforms[g].update(
        part, state[g], of_params.get(g)
      )
      out.update(done)
    return out, new_state

  return Grouped(init, update, transforms)


def clip_by_group_norm(
  max_norm: float, keys: tuple[str, ...]
) -> optax.GradientTransformation:
  """Global-norm clipping, separately for each top-level key in `keys` and
  for all the other keys together (stateless)."""

  def update(updates, state, params=None):
    del params
    out = {}
    for group in _split_by_group(updates, keys).values():
      norm = optax.tree.norm(group)
      scale = jnp.minimum(1.0, max_norm / jnp.maximum(norm, 1e-12))
      out.update(jax.tree.map(lambda u, s=scale: u * s.astype(u.dtype), group))
    return out, state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def scale_by_key(scales: dict[str, float]) -> optax.GradientTransformation:
  """Multiplies the updates of top-level key k by scales[k] (stateless)."""

  def update(updates, state, params=None):
    del params
    out = {}
    for k, v in updates.items():
      scale = scales.get(k, 1.0)
      out[k] = jax.tree.map(lambda u, s=scale: u * s, v)
    return out, state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def optimizer_from_config(
  cfg,
  total_updates: int,
  lr_scales: dict[str, float] | None = None,
  group_steps: dict[str, int] | None = None,
):
  return make_optimizer(
    cfg.lr,
    total_steps=total_updates,
    warmup_steps=cfg.warmup_steps,
    schedule=cfg.schedule,
    weight_decay=cfg.weight_decay,
    b1=cfg.adam_b1,
    b2=cfg.adam_b2,
    grad_clip=cfg.grad_clip,
    lr_scales=lr_scales,
    group_steps=group_steps,
  )


def moment_shardings(optimizer, opt_shapes, param_sh, mesh):
  """The optimizer state's shardings: each moment as its parameter, the
  rest (step counts) replicated; a Grouped optimizer's group by group."""
  if isinstance(optimizer, Grouped):
    split = _split_by_group(param_sh, optimizer.transforms)
    return {
      g: moment_shardings(t, opt_shapes[g], split.get(g, {}), mesh)
      for g, t in optimizer.transforms.items()
    }
  return optax.tree_map_params(
    optimizer,
    lambda _, sh: sh,
    opt_shapes,
    param_sh,
    transform_non_params=lambda _: mesh_lib.replicated(mesh),
  )

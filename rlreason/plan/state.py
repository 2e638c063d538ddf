"""Abstract run state for the planner: what a run holds, as ShapeDtypeStructs.

  state, shardings, optimizer = state.train_state(cfg, model_cfg, mesh)
  state.resident_bytes(cfg, model_cfg, mesh)   # {"rollout": ..., ...}

The train state (parameters or LoRA adapters, an experiment's critic beside
them, optimizer moments), the rollout's, reference's and critic's parameter
layouts, and the train step's batch, all `jax.eval_shape`d with their
shardings on the mesh: nothing is materialised. plan/aot.py compiles the
programs over them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason import mesh as mesh_lib
from rlreason.model import lora
from rlreason.model import transformer
from rlreason.rl import objective
from rlreason.rl import value
from rlreason.train import adapters as adapters_lib
from rlreason.train import optimizer as optimizer_lib
from rlreason.train import train_step as ts


def abstract(tree, shardings):
  return jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
    tree,
    shardings,
  )


def train_batch(cfg, rows: int, fields=None) -> dict:
  """Abstract [rows, ...] batch with the fields objective.loss_fn reads,
  and `fields` ({name: per-row shape}, float32) that an experiment's loss
  reads beyond them (a critic's returns and old values) or at another
  per-row shape (IGPO's token-level adv replaces the [rows] one)."""
  p, t = cfg.max_prompt_len, cfg.max_new_tokens
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
  batch = {
    "tokens": jax.ShapeDtypeStruct((rows, p + t), jnp.int32),
    "positions": jax.ShapeDtypeStruct((rows, p + t), jnp.int32),
    "mask": f32(rows, t),
    "old_logp": f32(rows, t),
    "sampler_logp": f32(rows, t),
  }
  token_adv = getattr(cfg, "advantage", "") in objective.TOKEN_ESTIMATORS
  batch["adv"] = f32(rows, t) if token_adv else f32(rows)
  if getattr(cfg, "needs_ref", False):
    batch["ref_logp"] = f32(rows, t)
  for name, shape in (fields or {}).items():
    batch[name] = f32(rows, *shape)
  return batch


def per_device_bytes(tree) -> int:
  """Bytes one device holds of abstract arrays with shardings (the
  fullest shard's shape)."""
  return sum(
    int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
    for x in jax.tree.leaves(tree)
  )


def lora_base(cfg, model_cfg, mesh):
  """A LoRA run's frozen base as the loop holds it (compute dtype or
  quantised, TRAIN_RULES): (abstract params, logical axes); None without
  LoRA."""
  lcfg = adapters_lib.lora_config(cfg)
  if lcfg is None:
    return None
  shapes = jax.eval_shape(
    lambda p: lora.quantize(p, lcfg), ref_params(model_cfg, mesh)
  )
  axes = lora.quantized_axes(transformer.param_axes(model_cfg), shapes)
  sh = mesh_lib.shardings(mesh, axes, mesh_lib.TRAIN_RULES, shapes)
  return abstract(shapes, sh), axes


def extra_shapes(cfg, model_cfg, extra_params):
  """An experiment's loop hook (loop.train's `extra_params`) run on
  abstract policy parameters: types.ExtraParams with abstract params."""
  out = {}

  def make(policy):
    out["extra"] = extra_params(cfg, model_cfg, policy)
    return out["extra"].params

  shapes = jax.eval_shape(make, transformer.param_shapes(model_cfg))
  return out["extra"]._replace(params=shapes)


def trained_shapes(cfg, model_cfg, extra_params=None):
  """(shapes, logical axes, lr scales) of what the optimizer trains: the
  params, or a LoRA run's adapters, and what `extra_params` adds beside
  them (a critic), as adapters.trainable assembles them."""
  axes = transformer.param_axes(model_cfg)
  shapes = transformer.param_shapes(model_cfg)
  lcfg = adapters_lib.lora_config(cfg)
  if lcfg is not None:
    shapes = jax.eval_shape(lambda: lora.init(shapes, lcfg, jax.random.key(0)))
    axes = lora.axes(axes, shapes)
  if extra_params is None:
    return shapes, axes, None
  extra = extra_shapes(cfg, model_cfg, extra_params)
  return (
    {**shapes, **extra.params},
    {**axes, **extra.axes},
    extra.lr_scales,
  )


def train_state(cfg, model_cfg, mesh, extra_params=None):
  """(abstract TrainState with its shardings, shardings, optimizer)."""
  shapes, axes, lr_scales = trained_shapes(cfg, model_cfg, extra_params)
  groups = None  # a critic's own optimizer (its own updates), as the run's
  if extra_params is not None:
    extra = extra_shapes(cfg, model_cfg, extra_params)
    groups = adapters_lib.group_steps(cfg, extra)
  optimizer = optimizer_lib.optimizer_from_config(
    cfg, max(cfg.steps, 1), lr_scales, groups
  )
  state_sh = ts.state_shardings(mesh, axes, shapes, optimizer)
  state = jax.eval_shape(
    functools.partial(ts.init_state, optimizer=optimizer), shapes
  )
  return abstract(state, state_sh), state_sh, optimizer


def layout(model_cfg, mesh, rules, tree=None):
  """Abstract parameters laid out by `rules`; `tree` (shapes, axes)
  defaults to the model's (transformer.param_shapes, param_axes)."""
  shapes, axes = tree or (
    transformer.param_shapes(model_cfg),
    transformer.param_axes(model_cfg),
  )
  return abstract(shapes, mesh_lib.shardings(mesh, axes, rules, shapes))


def compute_bytes(model_cfg) -> int:
  """Bytes per parameter in the compute dtype (the rollout's weights)."""
  return jnp.dtype(model_cfg.compute_dtype).itemsize


def rollout_params(model_cfg, mesh, hbm_bytes=None):
  """Abstract parameters as rollout_layout.on_mesh lays them out: compute dtype,
  gate and up stacked (ModelConfig.stack_gate_up), mesh.rollout_rules for
  the slice's HBM and model_cfg.rollout_layout."""
  rules = mesh_lib.rollout_rules(
    mesh,
    compute_bytes(model_cfg) * model_cfg.num_params(),
    hbm_bytes,
    model_cfg.rollout_layout,
  )
  return jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(
      s.shape, model_cfg.compute_dtype, sharding=s.sharding
    ),
    layout(model_cfg, mesh, rules, transformer.rollout_param_tree(model_cfg)),
  )


def ref_params(model_cfg, mesh):
  """The reference parameters as the loop keeps them: the train layout, in
  the compute dtype."""
  return jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(
      s.shape, model_cfg.compute_dtype, sharding=s.sharding
    ),
    layout(model_cfg, mesh, mesh_lib.TRAIN_RULES),
  )


def critic_params(cfg, model_cfg, mesh, extra_params):
  """The critic's parameters as the train state holds them (TRAIN_RULES,
  param dtype), or None when `extra_params` adds no critic."""
  if extra_params is None:
    return None
  extra = extra_shapes(cfg, model_cfg, extra_params)
  if value.KEY not in extra.params:
    return None
  shapes, axes = extra.params[value.KEY], extra.axes[value.KEY]
  return abstract(
    shapes, mesh_lib.shardings(mesh, axes, mesh_lib.TRAIN_RULES, shapes)
  )


def reward_model_params(model_cfg, mesh, trained: bool = False):
  """A scalar reward model as the RL loop keeps it (rewards/model.py's
  frozen_on_mesh): the backbone as the reference's (ref_params), the head
  replicated in float32. `trained`: as rm_grpo trains it before the RL
  (rewards/bradley_terry.py's train_bt), the backbone in the param dtype as the
  policy's weights it starts from (TRAIN_RULES)."""
  rep = mesh_lib.replicated(mesh)
  return {
    "backbone": layout(model_cfg, mesh, mesh_lib.TRAIN_RULES)
    if trained
    else ref_params(model_cfg, mesh),
    "head": {
      "w": jax.ShapeDtypeStruct(
        (model_cfg.d_model,), jnp.float32, sharding=rep
      ),
      "b": jax.ShapeDtypeStruct((), jnp.float32, sharding=rep),
    },
  }


def optimizer_state(optimizer, params, mesh):
  """Abstract optimizer state of abstract `params`: the moments laid out
  as their parameters, the rest (step counts) replicated."""
  shapes = jax.eval_shape(optimizer.init, params)
  shardings = optax.tree_map_params(
    optimizer,
    lambda _, sh: sh,
    shapes,
    jax.tree.map(lambda x: x.sharding, params),
    transform_non_params=lambda _: mesh_lib.replicated(mesh),
  )
  return abstract(shapes, shardings)


def resident_bytes(
  cfg, model_cfg, mesh, extra_params=None, frozen=None
) -> dict[str, int]:
  """Per-device bytes live beside each program that are not its own
  arguments: the train state during the rollout and the reference
  forward (less the critic, the values forward's own argument); the
  reference parameters (KL runs) during the rollout and the train step;
  the frozen models the run scores with (`frozen`: {program: per-device
  bytes of its parameters}, plan/scoring.py's SCORERS) beside every program
  but their own forward, beside which lie the train state and the
  reference parameters (LoRA: the base); beside rm_grpo's reward-model
  training (before the RL) the policy's weights as loaded."""
  state = per_device_bytes(train_state(cfg, model_cfg, mesh, extra_params)[0])
  critic = critic_params(cfg, model_cfg, mesh, extra_params)
  values = state - (0 if critic is None else per_device_bytes(critic))
  frozen = frozen or {}
  base = lora_base(cfg, model_cfg, mesh)
  if base is not None:
    # LoRA: the base (also the reference) is an argument of the train step
    # and the reference forward, and stays resident beside the rollout's
    # merged copy.
    # (A quantised base is the rollout's argument too: sampled unmerged.)
    base_bytes = per_device_bytes(base[0])
    rollout = 0 if cfg.lora_quantize else base_bytes
    out = {
      "train_step": 0,
      "critic_step": base_bytes,  # (not its argument: the critic's alone)
      "rollout": state + rollout,
      "ref_logp": state,
      "values": values + base_bytes,
    }
    scoring = state + base_bytes
  else:
    ref = 0
    if getattr(cfg, "needs_ref", False):
      ref = per_device_bytes(ref_params(model_cfg, mesh))
    out = {
      "train_step": ref,
      "critic_step": ref,
      "rollout": state + ref,
      "ref_logp": state,
      "values": values + ref,
    }
    scoring = state + ref
  out.update({name: scoring for name in frozen})
  out = {
    k: v + sum(b for name, b in frozen.items() if name != k)
    for k, v in out.items()
  }
  # rm_grpo's reward-model training, before the RL: beside it only the
  # policy's weights as loaded (param dtype, TRAIN_RULES), its start.
  out["reward_model_train"] = per_device_bytes(
    layout(model_cfg, mesh, mesh_lib.TRAIN_RULES)
  )
  return out

"""The sampler's parameter layout: the rollout copy of the policy on the
training mesh, in the compute dtype, with each MLP's gate and up kernels
stacked into one [D, 2, F] product (ModelConfig.stack_gate_up), laid out
by mesh.rollout_rules (replicated over data / fsdp where they fit, split
over tensor: no parameter all-gathers while decoding), on the sampler's
own mesh where --rollout_tensor gives it one (mesh.rollout_mesh).

  mesh = rollout_layout.sampling_mesh(mesh, model_cfg)
  params, rng = rollout_layout.on_mesh(params, rng, mesh, model_cfg)

rollout.generate, multiturn.generate and tree.generate decode with it;
the planner compiles its rollout over the same shapes
(plan/state.rollout_params, through transformer.rollout_param_tree).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rlreason import mesh as mesh_lib
from rlreason.model import attention
from rlreason.model import blocks
from rlreason.model import transformer
from rlreason.model.transformer import ModelConfig


def sampled_as(cfg, model_cfg: ModelConfig, mesh=None) -> ModelConfig:
  """`model_cfg` as a run with config `cfg` samples with it (its
  single-turn sampler: Context.sampled_as; the planner's rollout
  programs): in cfg.rollout_dtype ('' = the model's dtype), decoding with
  cfg.decode_attention ("auto" resolved for `mesh`'s devices), its
  parameters laid out as cfg.rollout_layout says, on the mesh of
  cfg.rollout_tensor (sampling_mesh)."""
  return dataclasses.replace(
    model_cfg,
    dtype=getattr(cfg, "rollout_dtype", "") or model_cfg.dtype,
    decode_attention=attention.resolve_decode(
      getattr(cfg, "decode_attention", "auto"), mesh
    ),
    rollout_layout=getattr(cfg, "rollout_layout", "auto"),
    rollout_tensor=getattr(cfg, "rollout_tensor", 0),
  )


def sampling_mesh(mesh, model_cfg: ModelConfig):
  """The mesh the sampler decodes on: `mesh` regrouped to
  model_cfg.rollout_tensor devices per tensor group (mesh.rollout_mesh;
  `mesh` itself for 0, its own size, or None)."""
  if mesh is None:
    return None
  return mesh_lib.rollout_mesh(mesh, model_cfg.rollout_tensor)


@functools.lru_cache(maxsize=8)
def rollout_shardings(mesh: jax.sharding.Mesh, model_cfg: ModelConfig):
  """NamedShardings of the parameters in the rollout layout (cached):
  replicated over data / fsdp when they fit (mesh.rollout_rules), or as
  model_cfg.rollout_layout says."""
  shapes, axes = transformer.rollout_param_tree(model_cfg)
  compute_bytes = jnp.dtype(model_cfg.compute_dtype).itemsize
  param_bytes = sum(compute_bytes * x.size for x in jax.tree.leaves(shapes))
  rules = mesh_lib.rollout_rules(
    mesh, param_bytes, layout=model_cfg.rollout_layout
  )
  return mesh_lib.shardings(mesh, axes, rules, shapes)


def on_mesh(params, rng: jax.Array, mesh, model_cfg: ModelConfig):
  """(params in the rollout layout, rng replicated) for decoding on `mesh`;
  unchanged when mesh is None (multi-turn and tree rollouts)."""
  if mesh is None:
    return params, rng
  params = to_layout(params, mesh, model_cfg)
  return params, mesh_lib.put_global(rng, mesh_lib.replicated(mesh))


def to_layout(params, mesh: jax.sharding.Mesh, model_cfg: ModelConfig):
  """`params` in the rollout layout on `mesh`, where they are the model's
  plain tree (else as they are: `_plain`). Cast to the compute dtype while
  resharding: a bf16 rollout of fp32 master weights holds half the bytes
  per replica (the sampler would cast them anyway)."""
  if _plain(params, model_cfg):
    params = _rollout_caster(mesh, model_cfg)(params)
  return params


def _plain(params, model_cfg) -> bool:
  """Whether `params` is the model's plain tree. A LoRA-combined or
  quantised one (model/lora.py) samples where it is: relaid out, its
  dequantised weights would not fit beside it."""
  return jax.tree.structure(params) == _plain_structure(model_cfg)


@functools.lru_cache(maxsize=8)
def _plain_structure(model_cfg: ModelConfig):
  return jax.tree.structure(transformer.param_shapes(model_cfg))


def _to_rollout(params, model_cfg: ModelConfig):
  """Cast to the compute dtype; gate and up stacked (stack_gate_up)."""
  params = transformer.compute_params(params, model_cfg)
  if model_cfg.stack_gate_up:
    params = blocks.stack_gate_up(params)
  return params


@functools.lru_cache(maxsize=8)
def _rollout_caster(mesh: jax.sharding.Mesh, model_cfg: ModelConfig):
  """params -> params in the rollout layout (compute dtype, gate and up
  stacked, mesh.rollout_rules)."""
  return jax.jit(
    functools.partial(_to_rollout, model_cfg=model_cfg),
    out_shardings=rollout_shardings(mesh, model_cfg),
  )

"""What the shared loop trains, and LoRA runs' frozen base and adapters.

  run = adapters.trainable(cfg, model_cfg, params, mesh, loss_fn, ...)
  state, run.step_fn(state, batch)          # the jitted update
  run.policy_of(state.params)               # the policy rollouts sample

`trainable` assembles the optimizer's tree (the params, or a LoRA run's
adapters, and what an experiment's `extra_params` adds beside them, e.g.
a critic), the KL reference, the optimizer and the jitted train step.

  adapted, adapters = adapters.prepare(cfg, model_cfg, params, mesh)
  loss = adapted.loss(loss_fn, extra_keys)  # (p, batch, norm, base)
  policy = adapted.policy(adapters)         # merged params, for rollouts

With --lora_rank > 0 (model/lora.py) the optimizer state covers the
adapters only; the base stays on the mesh in the compute dtype (or
quantised: --lora_quantize) and enters every train step as a frozen
argument, never donated or updated. Rollouts and evaluations merge base
and adapters once per step (one plain params tree, so the sampler runs
unchanged), except over a quantised base, where they sample the combined
tree as the train step uses it: each weight dequantised and adapted at use,
one layer at a time (experiments/bench/lora.py times the two).
"""

import dataclasses
import functools
from typing import Any, Callable

import jax

from rlreason import mesh as mesh_lib
from rlreason.model import lora
from rlreason.model import transformer
from rlreason.train import optimizer as optimizer_lib
from rlreason.train import train_step as ts


def lora_config(cfg) -> lora.LoraConfig | None:
  """The run's LoraConfig, or None for full fine-tuning (rank 0)."""
  rank = getattr(cfg, "lora_rank", 0)
  if not rank:
    return None
  return lora.LoraConfig(
    rank=rank,
    alpha=cfg.lora_alpha,
    targets=cfg.lora_targets,
    quantize=cfg.lora_quantize,
  )


@dataclasses.dataclass
class Adapted:
  """A LoRA run's frozen half.

  Attributes:
    lcfg: the LoraConfig.
    base: the frozen params on the mesh (TRAIN_RULES), compute dtype or
      quantised; also the KL reference.
    base_axes: their logical axes.
    axes: the adapters' logical axes.
  """

  lcfg: lora.LoraConfig
  base: Any
  base_axes: Any
  axes: Any

  def loss(self, loss_fn, extra_keys=()):
    return adapted_loss(loss_fn, self.lcfg, extra_keys)

  def policy(self, adapters):
    """The params rollouts and evaluations use: base + adapters merged into
    one plain copy, or, over a quantised base (whose point is memory: a
    merged 7B copy alone fills a 16 GiB chip), the combined tree, whose
    weights the model dequantises and adapts at use."""
    if self.lcfg.quantize:
      return lora.combine(self.base, adapters, self.lcfg)
    return _merge(self.base, adapters, self.lcfg)


def adapted_loss(loss_fn, lcfg: lora.LoraConfig, extra_keys=()):
  """loss_fn(params, batch, norm) -> the train step's
  fn(trained, batch, norm, base): the adapters in `trained` joined to the
  frozen base (extra params, e.g. a critic, passed through)."""

  def fn(trained, batch, norm, base):
    own = {k: v for k, v in trained.items() if k not in extra_keys}
    # (None of them in a step that trains the policy alone.)
    extra = {k: trained[k] for k in extra_keys if k in trained}
    return loss_fn({**lora.combine(base, own, lcfg), **extra}, batch, norm)

  return fn


@functools.partial(jax.jit, static_argnums=2)
def _merge(base, adapters, lcfg):
  return lora.merge(base, adapters, lcfg)


def prepare(cfg, model_cfg, params, mesh, lcfg: lora.LoraConfig):
  """(Adapted, adapters): the frozen base from `params` and fresh adapters
  (B = 0, so the adapted policy starts as the base)."""
  base = transformer.compute_params(params, model_cfg)
  base = lora.quantize(base, lcfg)
  param_axes = transformer.param_axes(model_cfg)
  base_axes = lora.quantized_axes(param_axes, base)
  base = jax.device_put(
    base,
    mesh_lib.shardings(mesh, base_axes, mesh_lib.TRAIN_RULES, base),
  )
  adapters = lora.init(params, lcfg, jax.random.key(cfg.seed))
  axes = lora.axes(param_axes, adapters)
  adapters = jax.device_put(
    adapters, mesh_lib.shardings(mesh, axes, mesh_lib.TRAIN_RULES, adapters)
  )
  return Adapted(lcfg, base, base_axes, axes), adapters


@dataclasses.dataclass
class Trainable:
  """What a run trains (`trainable`).

  Attributes:
    state: the TrainState on the mesh.
    step_fn: the jitted update, (state, batch) -> (state, metrics); it
      donates `state`.
    batch_sh: the train batch's sharding (mesh.put_global).
    ref_params: the frozen KL reference, or None.
    extra_keys: the top-level keys of params trained beside the policy's.
    adapted: a LoRA run's Adapted, or None.
    extra_step: when the extra params take updates of their own
      (types.ExtraParams.minibatches): their jitted update, as step_fn
      (which then trains the policy alone); else None.
    extra_minibatches, extra_rows: their updates per epoch and rows in each
      (train_step.group_minibatch).
  """

  state: Any
  step_fn: Callable
  batch_sh: Any
  ref_params: Any
  extra_keys: tuple
  adapted: Adapted | None
  extra_step: Callable | None = None
  extra_minibatches: int = 0
  extra_rows: int = 0

  def policy_of(self, params):
    """The policy's params (merged with LoRA) from the state's."""
    own = {k: v for k, v in params.items() if k not in self.extra_keys}
    return self.adapted.policy(own) if self.adapted else own


def trainable(
  cfg, model_cfg, params, mesh, loss_fn, needs_ref, extra_params=None
) -> Trainable:
  """The run's Trainable from the loaded `params`: with LoRA the base is
  frozen (and is the reference) and only adapters train; `loss_fn` and
  `extra_params` as loop.train takes them."""
  adapted, trained = None, params
  if lcfg := lora_config(cfg):
    adapted, trained = prepare(cfg, model_cfg, params, mesh, lcfg)
  # The frozen reference in the compute dtype, as the rollout holds its
  # weights (the model casts every weight to it before use; in bf16 runs
  # the norm scales round as the sampler's do): half the bytes in bf16.
  ref_params = None
  if needs_ref and adapted:
    ref_params = adapted.base
  elif needs_ref:
    ref_params = transformer.compute_params(params, model_cfg, copy=True)
  axes = adapted.axes if adapted else None
  lr_scales, extra_keys, extra = None, (), None
  if extra_params is not None:
    extra = extra_params(cfg, model_cfg, params)
    trained = {**trained, **extra.params}
    axes = {**(axes or transformer.param_axes(model_cfg)), **extra.axes}
    lr_scales, extra_keys = extra.lr_scales, tuple(extra.params)
  del params
  updates = cfg.steps * cfg.ppo_epochs * cfg.minibatches
  groups = group_steps(cfg, extra)
  optimizer = optimizer_lib.optimizer_from_config(
    cfg, updates, lr_scales, groups
  )
  loss = functools.partial(loss_fn, cfg=cfg, model_cfg=model_cfg)
  own_updates = groups is not None
  state, step_fn, batch_sh = ts.setup(
    mesh,
    model_cfg,
    trained,
    optimizer,
    adapted.loss(loss, extra_keys) if adapted else loss,
    micro_batches=cfg.micro_batches,
    axes=axes,
    frozen=adapted.base if adapted else None,
    frozen_axes=adapted.base_axes if adapted else None,
    temp_budget_mib=cfg.train_temp_budget_mib,
    groups=(optimizer_lib.POLICY,) if own_updates else None,
  )
  run = Trainable(state, step_fn, batch_sh, ref_params, extra_keys, adapted)
  if own_updates:
    rows, micro = ts.group_minibatch(
      cfg, extra.minibatches, mesh_lib.batch_divisor(mesh)
    )
    run.extra_minibatches, run.extra_rows = extra.minibatches, rows
    run.extra_step = ts.make_train_step(
      functools.partial(extra.loss_fn, cfg=cfg, model_cfg=model_cfg),
      optimizer,
      state_sharding=jax.tree.map(lambda x: x.sharding, state),
      batch_sharding=batch_sh,
      micro_batches=micro,
      options=ts.compiler_options(cfg.train_temp_budget_mib, mesh),
      groups=extra_keys,
    )
  return run


def group_steps(cfg, extra) -> dict[str, int] | None:
  """{extra key: its updates in the run} when the extra params
  (types.ExtraParams) take updates of their own, else None: the
  optimizer's groups (optimizer.make_optimizer)."""
  if extra is None or not extra.minibatches:
    return None
  n = cfg.steps * cfg.ppo_epochs * extra.minibatches
  return {k: n for k in extra.params}

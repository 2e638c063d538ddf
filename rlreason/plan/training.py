"""The train steps' programs, compiled on abstract arrays (plan/aot.py).

train_step   one minibatch (N / minibatches rows) through loss, gradient
             (micro_batches scanned) and optimizer update, state donated,
             as adapters.trainable builds it (LoRA: the base a frozen
             argument);
critic_step  where a critic takes updates of its own (ppo
             --critic_minibatches: own_updates), the critic alone on its
             loss over one of its minibatches; the train step is then the
             policy's alone.
"""

import dataclasses
import functools

import jax

from rlreason import mesh as mesh_lib
from rlreason.plan import program as program_lib
from rlreason.plan import state as state_lib
from rlreason.rl import value
from rlreason.train import adapters as adapters_lib
from rlreason.train import optimizer as optimizer_lib
from rlreason.train import train_step as ts


def own_updates(cfg, model_cfg, extra_params):
  """The extra params' types.ExtraParams where they take updates of their
  own (ppo --critic_minibatches: the "critic_step" program), else None."""
  if extra_params is None:
    return None
  extra = state_lib.extra_shapes(cfg, model_cfg, extra_params)
  return extra if extra.minibatches else None


def compile_train_step(
  cfg, model_cfg, mesh, loss_fn, extra_params=None, fields=None, name=""
) -> program_lib.Program:
  """The train step over one minibatch, as adapters.trainable builds it:
  name "train_step" (the policy's, with a critic beside it unless that
  takes its own updates) or "critic_step" (those updates: the critic alone
  on its loss, train_step.group_minibatch's rows and micro-batches)."""
  name = name or "train_step"
  state, state_sh, optimizer = state_lib.train_state(
    cfg, model_cfg, mesh, extra_params
  )
  own = own_updates(cfg, model_cfg, extra_params)
  batch_sh = mesh_lib.batch_sharding(mesh, 1)
  rows, micro, calls = (
    cfg.num_sequences // cfg.minibatches,
    cfg.micro_batches,
    0,
  )
  groups = None if own is None else (optimizer_lib.POLICY,)
  frozen = state_lib.lora_base(cfg, model_cfg, mesh)
  if name == "critic_step":
    rows, micro = ts.group_minibatch(
      cfg, own.minibatches, mesh_lib.batch_divisor(mesh)
    )
    calls, groups = cfg.ppo_epochs * own.minibatches, tuple(own.params)
    loss_fn, frozen = own.loss_fn, None  # the critic's own loss alone
  batch = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=batch_sh),
    state_lib.train_batch(cfg, rows, fields),
  )
  loss = functools.partial(loss_fn, cfg=cfg, model_cfg=model_cfg)
  if frozen is not None:  # LoRA: the base is the step's frozen argument
    extra_keys = (
      ()
      if extra_params is None
      else tuple(state_lib.extra_shapes(cfg, model_cfg, extra_params).params)
    )
    loss = adapters_lib.adapted_loss(
      loss, adapters_lib.lora_config(cfg), extra_keys
    )
  step = ts.make_train_step(
    loss,
    optimizer,
    state_sharding=state_sh,
    batch_sharding=batch_sh,
    micro_batches=micro,
    frozen_sharding=None
    if frozen is None
    else jax.tree.map(lambda x: x.sharding, frozen[0]),
    options=ts.compiler_options(cfg.train_temp_budget_mib, mesh),
    groups=groups,
  )
  args = (state, batch) if frozen is None else (state, batch, frozen[0])
  compiled = step.lower(*args).compile()
  joint = own is None and value.KEY in state.params
  return dataclasses.replace(
    program_lib.analyse(name, compiled, loop_trips=micro),
    decoders=2 if joint else 1,
    temp_budget_mib=cfg.train_temp_budget_mib,
    rows=rows if calls else 0,
    calls=calls,
  )

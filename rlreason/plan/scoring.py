"""The planner's whole-rollout forwards: reference / old log-probs, critic
values and the frozen models a run scores its rollouts with.

  prog = scoring.compile_ref_logp(cfg, model_cfg, mesh, rows)
  prog = scoring.compile_scorer("teacher", cfg, teacher_cfg, mesh, rows)

Each is one forward over `rows` rows (a train micro-batch, as
Context.score_rows), activations split by batch under the activation mesh,
as the loop runs it; plan/aot.py compiles them beside the run's other
programs. Also here: the training of a scorer that the run trains before
its RL (compile_reward_model_train: rm_grpo's Bradley-Terry step).
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from rlreason import mesh as mesh_lib
from rlreason.model import policy
from rlreason.plan import program as program_lib
from rlreason.plan import state as state_lib
from rlreason.rewards import bradley_terry
from rlreason.rewards import model as reward_model
from rlreason.rl import value
from rlreason.train import train_step as ts


def _compile_scoring(name, score, params, cfg, model_cfg, mesh, rows):
  """A whole-rollout forward `score(params, tokens, positions, model_cfg,
  P)` over `rows` rows, activations split by batch and temporaries under
  --score_temp_budget_mib (as the loop runs it: Context.scoring)."""
  sh = mesh_lib.batch_sharding(mesh, 2)
  length = cfg.max_prompt_len + cfg.max_new_tokens
  ids = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=sh)

  def forward(params, tokens, positions):
    with mesh_lib.activation_mesh(mesh):
      return score(params, tokens, positions, model_cfg, cfg.max_prompt_len)

  budget = getattr(cfg, "score_temp_budget_mib", 0)
  options = ts.compiler_options(budget, mesh)
  jitted = jax.jit(forward, compiler_options=options)
  compiled = jitted.lower(params, ids, ids).compile()
  return dataclasses.replace(
    program_lib.analyse(name, compiled),
    rows=rows,
    temp_budget_mib=budget if options else 0,
  )


def compile_ref_logp(cfg, model_cfg, mesh, rows: int) -> program_lib.Program:
  # LoRA: the base is the reference.
  frozen = state_lib.lora_base(cfg, model_cfg, mesh)
  params = (
    state_lib.ref_params(model_cfg, mesh) if frozen is None else frozen[0]
  )
  return _compile_scoring(
    "ref_logp",
    policy.completion_logprobs,
    params,
    cfg,
    model_cfg,
    mesh,
    rows,
  )


def _reward_model_score(params, tokens, positions, model_cfg, prompt_len):
  del prompt_len  # the reward is read at each row's last token
  return reward_model.score(params, tokens, positions, model_cfg)


# The frozen models a run may score its rollouts with: program name ->
# (its forward (params, tokens, positions, model_cfg, P), its abstract
# parameters as the run keeps them (model_cfg, mesh)).
SCORERS = {
  "teacher": (policy.completion_logprobs, state_lib.ref_params),
  "reward_model": (_reward_model_score, state_lib.reward_model_params),
}


def compile_scorer(
  name, cfg, scorer_cfg, mesh, rows: int
) -> program_lib.Program:
  """Frozen model `name`'s forward (SCORERS) over `rows` rows, as the loop
  scores the reference; `model_params` times its FLOPs."""
  forward, params = SCORERS[name]
  return dataclasses.replace(
    _compile_scoring(
      name, forward, params(scorer_cfg, mesh), cfg, scorer_cfg, mesh, rows
    ),
    model_params=scorer_cfg.num_params(),
  )


def compile_values(
  cfg, model_cfg, mesh, rows: int, critic
) -> program_lib.Program:
  """The critic's rollout-time forward (ppo.make_batch) over `rows` rows."""
  return _compile_scoring(
    "values",
    value.completion_values,
    critic,
    cfg,
    model_cfg,
    mesh,
    rows,
  )


def compile_reward_model_train(
  cfg, rm_cfg, mesh, pairs: int
) -> program_lib.Program:
  """rm_grpo's Bradley-Terry step before the RL (rewards/bradley_terry.py's
  bt_update, as train_bt runs it): `pairs` chosen and rejected rows of
  P + T tokens and their weights, split by rows where they divide
  (mesh.put_rows), in cfg.rm_micro_batches gradient-accumulation
  micro-batches (1 without it) under --train_temp_budget_mib, the reward
  model's weights (param dtype, TRAIN_RULES; head replicated) and AdamW
  moments donated."""
  params = state_lib.reward_model_params(rm_cfg, mesh, trained=True)
  optimizer = optax.adamw(1e-5)  # the rate does not change the program
  opt_state = state_lib.optimizer_state(optimizer, params, mesh)
  shape = (pairs, cfg.max_prompt_len + cfg.max_new_tokens)
  split = mesh_lib.spec(("batch", None), mesh_lib.ROLLOUT_RULES, shape, mesh)
  ids = jax.ShapeDtypeStruct(
    shape, jnp.int32, sharding=jax.sharding.NamedSharding(mesh, split)
  )
  micro = getattr(cfg, "rm_micro_batches", 1)
  budget = cfg.train_temp_budget_mib  # rm_grpo's, as the policy's step's
  options = ts.compiler_options(budget, mesh)
  step = bradley_terry.bt_update(rm_cfg, optimizer, mesh, micro, options)
  split = mesh_lib.spec(("batch",), mesh_lib.ROLLOUT_RULES, (pairs,), mesh)
  weights = jax.ShapeDtypeStruct(
    (pairs,), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, split)
  )
  compiled = step.lower(
    params, opt_state, ids, ids, ids, ids, weights
  ).compile()
  return dataclasses.replace(
    program_lib.analyse("reward_model_train", compiled),
    temp_budget_mib=budget if options else 0,
    rows=2 * pairs,
    model_params=rm_cfg.num_params(),
  )

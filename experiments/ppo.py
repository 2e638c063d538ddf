r"""PPO with a learned critic and GAE (RLVR with a value model).

Papers: Schulman et al. 2017, "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, with GAE (Schulman et al. 2016, arXiv:1506.02438), as
used for language models by InstructGPT (Ouyang et al. 2022,
arXiv:2203.02155) and for reasoning by Open-Reasoner-Zero (Hu et al. 2025,
"Open-Reasoner-Zero: An Open Source Approach to Scaling Up Reinforcement
Learning on the Base Model", arXiv:2503.24290). Defaults follow ORZ's
recipe (GAE gamma = lambda = 1, no KL, rule-based reward) and verl's PPO
defaults where ORZ does not say (research/peers.md). The parent of the
GRPO family; it differs from experiments/grpo.py in exactly:
  (1) a critic: a copy of the policy's trunk with a scalar head
      (rlreason/rl/value.py), trained beside the policy in the same step
      (params["critic"], its own gradient clipping and a critic_lr_scale
      times larger learning rate; checkpointed with the policy), on the
      clipped value loss 0.5 max((V - R)^2, (V_clip - R)^2) (clip 0.5,
      verl's cliprange_value), token-mean;
  (2) token-level advantages by GAE on the critic's rollout-time values,
      with the outcome reward on the last token (returns.gae,
      gamma = lam = 1, whitened over the batch), instead of group-
      normalised outcome rewards; no group is needed (G = 1 is allowed);
  (3) no KL in the loss; --kl_reward_coef > 0 puts InstructGPT's per-token
      penalty -beta * KL(old || ref) into the token rewards instead
      (kl.penalized_token_rewards' placement; ORZ uses none);
  (4) token-mean aggregation of the clipped surrogate (verl's default);
  (5) --critic_minibatches > 0 (ORZ: 12, to the policy's 1): the
      critic takes updates of its own after the policy's, on its loss
      alone, with its own Adam (moments, step count, warm-up), each on
      N / critic_minibatches rows cut to whole micro-batches (ORZ's critic
      likewise leaves out what does not fill its last update).

Reproduces (paper scale): ORZ's PPO runs on base models (reward and
response length rising together; benchmark numbers not restated here: read
them from the paper). Expected at laptop scale: held-out greedy accuracy
above the warm start's, with the critic's explained variance
(value/explained_var) rising above 0 within the first steps.

CPU:  python -m experiments.ppo
      python -m experiments.ppo --kl_reward_coef=0.02 --lam=0.95  # InstructGPT
      python -m experiments.ppo --minibatches=1 --critic_minibatches=12  # ORZ
TPU:  launch/tpu.sh run experiments.ppo --scale=paper \
        --model=/ckpt/Qwen2.5-7B \
        --workdir=gs://$BUCKET/ppo/$(date +%m%d_%H%M)
"""

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from experiments import grpo
from rlreason.rl import aggregation
from rlreason import config
from rlreason.train import flags as rr_flags
from rlreason.rl import kl
from rlreason.train import loop
from rlreason.rl import losses
from rlreason import mesh as mesh_lib
from rlreason.rl import objective
from rlreason.rl import returns as returns_lib
from rlreason.rl import value
from rlreason.train import train_step as ts


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.py's laptop setup; PPO's critic, GAE and losses."""

  estimators: ClassVar[tuple[str, ...]] = ("gae",)

  advantage: str = "gae"  # (2)
  gamma: float = 1.0  # (2) ORZ / verl
  lam: float = 1.0  # (2) ORZ / verl (InstructGPT: 0.95)
  whiten_advantages: bool = True  # (2) verl's masked_whiten
  kl_coef: float = 0.0  # (3) no KL loss
  kl_reward_coef: float = 0.0  # (3) ORZ: none (InstructGPT: 0.02)
  aggregation: str = "token-mean"  # (4)
  critic_lr_scale: float = 5.0  # (1) ORZ: critic 5e-6 vs actor 1e-6
  critic_init: str = "policy"  # (1) policy (verl, ORZ) | random
  value_clip: float = 0.5  # (1) verl's cliprange_value; 0 = no clipping
  # Reward 0 for responses cut at the token budget (ORZ: only stopped
  # responses acquire reward)
  zero_truncated: bool = False
  minibatches: int = 2  # PPO takes several optimizer steps per rollout
  # (5) 0 = the critic updates with the policy; > 0 = its own updates per
  # epoch on its loss alone, with its own Adam (ORZ: 12 to the policy's 1)
  critic_minibatches: int = 0

  def validate(self) -> None:
    # PGConfig's checks, except that GAE needs no group (G = 1 is fine).
    super(objective.PGConfig, self).validate()
    self.validate_rollout_correction()
    losses.get_policy_loss(self.policy_loss)
    kl.get(self.kl_reward_estimator)
    if self.advantage != "gae":
      raise ValueError("Invalid config: PPO's --advantage is gae")
    if self.aggregation not in aggregation.AGGREGATION_MODES:
      raise ValueError(f"Invalid config: --aggregation={self.aggregation!r}")
    if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
      raise ValueError("Invalid config: --gamma and --lam must be in [0, 1]")
    if self.critic_init not in ("policy", "random"):
      raise ValueError(f"Invalid config: --critic_init={self.critic_init!r}")
    if self.kl_coef:
      raise ValueError(
        "Invalid config: PPO puts the KL in the reward (--kl_reward_coef)"
      )
    if self.critic_minibatches < 0:
      raise ValueError("Invalid config: --critic_minibatches must be >= 0")
    if (
      self.critic_minibatches
      and not ts.group_minibatch(self, self.critic_minibatches, 1)[0]
    ):
      raise ValueError(
        f"Invalid config: --critic_minibatches={self.critic_minibatches} "
        f"is more than the {self.num_sequences} sequences of a step"
      )


# ORZ (arXiv:2503.24290): Qwen2.5-7B / 32B base, PPO with GAE gamma = lambda
# = 1, no KL, actor lr 1e-6, critic lr 5e-6, 128 prompts x 64 responses per
# step, temperature 1; its released config also sets 50 warm-up steps,
# value clip 0.2, Adam betas (0.9, 0.95), reward 0 for responses that do
# not stop, and 1 policy and 12 critic updates per rollout
# (playground/orz_7b_ppo.py: policy_update_steps / critic_update_steps;
# (5)). Its 57k curated math set is not among our data specs
# (DAPO-Math-17k stands in). Not taken: 2048-token prompts and 8000
# generated tokens (1024 + 8192 here). The planner's fits (the README's
# table; plan_results/NOTES.md, session 100): v5p-8 at 79.98 GiB per chip
# (the rollout's, 68 rows per call; the policy's step 76.35 GiB, the
# critic's 73.20 at 672 rows a call), where verl-style 4 joint updates
# (this preset until 2026-12-07: --minibatches=4 --micro_batches=128) are
# out of HBM and fit v5p-16; v4-32 and v6e-16 in 4-row micro-batches
# (--micro_batches=2048 --mesh_tensor=4), v5e-32 with --mesh_tensor=4
# --sequence_parallel.
PAPER = dict(
  config.PAPER_COMMON,
  model="/ckpt/Qwen2.5-7B",  # no preset; a local HF checkpoint
  data="hf:BytedTsinghua-SIA/DAPO-Math-17k",
  eval_data="hf:HuggingFaceH4/MATH-500:split=test",
  steps=500,
  batch_size=128,
  group_size=64,
  minibatches=1,  # (5) ORZ's 1 policy update a rollout
  critic_minibatches=12,  # (5) and its 12 critic updates
  # 16-row micro-batches of the policy's 8192 rows (the critic's 672 rows
  # in 42) and libtpu's bound on the train step's temporaries: the
  # planner's fit is v5p-8 (above).
  micro_batches=512,
  train_temp_budget_mib=71986,
  max_prompt_len=1024,
  max_new_tokens=8192,
  lr=1e-6,
  critic_lr_scale=5.0,
  warmup_steps=50,
  value_clip=0.2,
  adam_b2=0.95,
  zero_truncated=True,
  eval_size=500,
  checkpoint_every=50,
)


def explained_variance(returns, values, mask) -> float:
  """1 - Var(R - V) / Var(R) over the valid tokens (a critic diagnostic)."""
  m = mask > 0
  if m.sum() < 2:
    return 0.0
  var = returns[m].var()
  if var < 1e-8:  # all returns (nearly) equal: undefined
    return 0.0
  return float(1.0 - (returns[m] - values[m]).var() / var)


def make_batch(rollout, examples, ctx):
  """(2), (3): token rewards, rollout-time values, GAE; on the host."""
  cfg = ctx.cfg
  total, parts = ctx.score(rollout, examples)
  total = np.asarray(total, np.float32)
  if cfg.zero_truncated:
    total = objective.zero_truncated(total, rollout)
  batch = ctx.batch_from_rollout(rollout)
  mismatch = (
    objective.correct_rollout(batch, rollout, ctx)
    if cfg.rollout_correction
    else {}
  )
  mask = batch["mask"]
  token_rewards = np.asarray(
    returns_lib.outcome_token_rewards(jnp.asarray(total), jnp.asarray(mask))
  )
  if cfg.kl_reward_coef:
    batch["ref_logp"] = ctx.ref_logp(rollout)
    token_rewards = token_rewards + objective.kl_reward_penalty(batch, cfg)
  with ctx.scoring():  # split by batch, budgeted: as ctx.ref_logp
    values = mesh_lib.to_host(
      value.completion_values_by_rows(
        ctx.extra[value.KEY],
        rollout.tokens,
        rollout.positions,
        ctx.model_cfg,
        rollout.prompt_len,
        rows=ctx.score_rows,
      )
    )
  values = np.where(mask > 0, values, 0.0).astype(np.float32)
  adv, returns = returns_lib.gae(
    jnp.asarray(token_rewards),
    jnp.asarray(values),
    jnp.asarray(mask),
    gamma=cfg.gamma,
    lam=cfg.lam,
    whiten_advantages=cfg.whiten_advantages,
  )
  batch["adv"] = np.asarray(adv, np.float32)
  batch["returns"] = np.asarray(returns, np.float32)
  batch["old_values"] = values
  metrics = objective.reward_metrics(total, parts, rollout, examples, ctx)
  metrics["value/explained_var"] = explained_variance(
    batch["returns"], values, mask
  )
  metrics["value/rollout_mean"] = float(values[mask > 0].mean())
  metrics.update({f"mismatch/{k}": v for k, v in mismatch.items()})
  return batch, metrics


def critic(cfg: Config, own_loss=None):
  """(1) The critic trained beside the policy (loop.train's extra_params);
  (5) in updates of its own with --critic_minibatches, on `own_loss`
  (default critic_loss)."""
  return value.extra_params(
    cfg.critic_lr_scale,
    from_policy=cfg.critic_init == "policy",
    minibatches=cfg.critic_minibatches,
    loss_fn=own_loss or critic_loss,
  )


def train_fields(cfg: Config) -> dict:
  """Per-row shapes of the batch fields the critic's loss reads (the
  planner's abstract batch, experiments/plan.py)."""
  return {"returns": (cfg.max_new_tokens,), "old_values": (cfg.max_new_tokens,)}


def critic_loss(params, batch, norm, *, cfg: Config, model_cfg):
  """(1) The clipped value loss on params[value.KEY] alone."""
  return value.loss(
    params[value.KEY],
    batch,
    norm,
    model_cfg=model_cfg,
    clip_eps=cfg.value_clip or None,
  )


def loss_fn(params, batch, norm, *, cfg: Config, model_cfg, own_critic=None):
  """Clipped surrogate on the policy + clipped value loss on the critic
  (`own_critic`, default critic_loss); the surrogate alone in a step
  without the critic (5)."""
  policy_params = {k: v for k, v in params.items() if k != value.KEY}
  pg, metrics = objective.pg_loss(
    policy_params, batch, norm, cfg=cfg, model_cfg=model_cfg
  )
  metrics = {**metrics, "pg_loss": pg}
  if value.KEY not in params:  # (5) the critic takes its own updates
    return pg, metrics
  # The two terms touch disjoint parameters, each group with its own
  # clipping and Adam: no value-loss coefficient is needed.
  v_loss, v_metrics = (own_critic or critic_loss)(
    params, batch, norm, cfg=cfg, model_cfg=model_cfg
  )
  return pg + v_loss, {**metrics, **v_metrics}


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="ppo",
    title="PPO (critic + GAE)",
    make_batch=make_batch,
    loss_fn=loss_fn,
    extra_params=critic(cfg),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

r"""DARS: difficulty-adaptive rollout sampling; DARS-B; BroRL as a config.

Paper: Yang et al. 2025, "Depth-Breadth Synergy in RLVR: Unlocking LLM
Reasoning Gains with Adaptive Exploration", arXiv:2508.13755; official
code github.com/yangzhch6/DARS. Differs from experiments/grpo.py in
exactly:
  (1) multi-stage rollouts: after the first G rollouts per prompt, K * G
      more rollouts (K = --extra_groups) are sampled for the prompts whose
      accuracy is below --hard_threshold, shared in proportion to the
      authors' per-accuracy extra counts (rlreason/data/allocation.py:
      "equal treatment", 24 / 10 / 3 / 1 extra at accuracy 0 / 1/8 / 2/8 /
      3/8 of 8, or "hardness weighted", 40 / 16 / 4 / 1,
      --extra_schedule=hardness); the budget is fixed per step, so shapes
      stay (B + K) * G;
  (2) a prompt's extra rollouts join its first group for the advantage:
      rewards are normalised over all its samples (allocation.
      pooled_advantages), which raises the cumulative advantage of hard
      prompts that GRPO's per-group normalisation under-weights;
      --pooled_std=false drops the std scaling, as the official scripts
      (grpo_use_std=False; PAPER). Prompts whose pooled accuracy is 0 or 1
      are dropped from the update (mask zeroed: out of the normalisers
      too), as the authors' trainer does after pooling.
  (3) DARS-B, "DARS-Breadth" (--variant=dars_b, DARS_B below): DARS plus
      large breadth: a much larger batch of prompts per step (official
      README / experiments/DARS-*-Breadth.sh: 3072 prompts instead of
      128; laptop: 64 instead of 16, with K scaled alike) and PPO's
      mini-batch iterations replaced by full-batch updates over several
      epochs (ppo_mini_batch_size = train_batch_size, ppo_epochs = 2:
      --minibatches=1 --ppo_epochs=2), with a larger learning rate
      (5e-6 instead of 1e-6, about sqrt(3072 / 128) = 4.9 times;
      laptop: 2e-4 -> 4e-4, the same square-root rule for 4x, assumed).
      The paper: breadth raises Pass@1 and keeps token entropy high;
      DARS-B gains in Pass@1 and Pass@K together.
  Deviation: the official DARS schedules give each prompt its count
  outright (32 rollouts in all at accuracy 0, ..., 8 at >= 1/2), so the
  step's total varies; here a fixed budget of K * G extra rollouts per step
  is shared in the same proportions (fixed shapes), and goes to the
  lowest-accuracy prompts when none is below the threshold. The laptop
  DARS makes one full-batch update per step (grpo.py's setting), as the
  authors' trainer does each epoch (PAPER keeps 2 mini-batches).

BroRL (Hu et al. 2025, "BroRL: Scaling Reinforcement Learning via
Broadened Exploration", arXiv:2510.01180) is this file with
--variant=brorl (BRORL below): no adaptive stage, many more rollouts per
prompt (paper: N = 512 instead of 16; laptop: 32 instead of 8).

A --variant's preset sets every field it names that is still at the
scale's default (Config() or PAPER); flags given with other values win
(`resolve`).

Reproduces:
  laptop: DARS vs GRPO with the same number of sampled rollouts per step
    (GRPO's G raised to match), BroRL's wide groups and DARS-B's breadth:
      python -m experiments.reproduce --method=dars --seeds=0,1,2
    Expected: dars's held-out pass@k (eval_after.json) >= grpo_matched's
    (the paper's claim: Pass@K gains at equal inference cost), and
    dars_b's pass@1 and pass@k >= dars's.
  paper: DARS Pass@K curves on Qwen2.5-Math 1.5B / 7B (numbers not quoted
    in our sources); DARS-B above DARS and GRPO in both Pass@1 and Pass@K;
    BroRL revives a 1.5B model saturated after 3K ProRL steps.

CPU:  python -m experiments.dars        (--variant=dars_b or brorl)
TPU:  launch/tpu.sh run experiments.dars --scale=paper --variant=dars_b \
        --model=/ckpt/Qwen2.5-Math-7B \
        --workdir=gs://$BUCKET/dars/$(date +%m%d_%H%M)
"""

import dataclasses
from typing import ClassVar

import numpy as np

from experiments import grpo
from rlreason import config
from rlreason.data import allocation
from rlreason.data import difficulty
from rlreason.rl import dynamic_sampling
from rlreason.train import flags as rr_flags
from rlreason.guidance import resampling as guided
from rlreason.train import loop
from rlreason.rl import objective


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with DARS's allocation; paper: PAPER."""

  # Its own make_batch does not apply --rollout_correction.
  corrects_rollouts: ClassVar[bool] = False

  data: str = "task:arithmetic:difficulty=1-2,n=4000"
  extra_groups: int = 8  # (1) K: K * G extra rollouts per step (laptop B / 2)
  hard_threshold: float = 0.5  # (1) accuracy below which a prompt is hard
  extra_schedule: str = "equal"  # (1) "equal" or "hardness"
  pooled_std: bool = True  # (2) laptop: GRPO's std scaling, as grpo.py
  variant: str = "dars"  # dars | dars_b (3) | brorl: preset, resolve
  eval_samples: int = 8  # pass@8 for the Pass@K claim

  def validate(self) -> None:
    super().validate()
    config.require(
      self.extra_schedule in ("equal", "hardness"),
      f"--extra_schedule={self.extra_schedule!r}; expected equal or hardness",
    )
    if self.variant not in VARIANTS:
      raise ValueError(
        f"Invalid config: --variant={self.variant!r}; expected one of "
        f"{sorted(VARIANTS)}"
      )


# Sec. 5 and the official 1.5B / 7B scripts (github.com/yangzhch6/DARS,
# scripts/train/DARS-*-bs128-pp2.sh): Qwen2.5-Math-1.5B / 7B, 128 prompts
# x 8 first-stage rollouts, PPO mini-batch 64 (2 per batch) x 2 epochs,
# lr 1e-6, no KL, no std scaling, responses up to 3072 tokens, and verl's
# default entropy bonus 0.001 (ppo_trainer.yaml; no script overrides it).
# Their trainer's fit() updates on the whole batch each epoch
# (update_actor_full_ministep), whatever the mini-batch: not taken here.
PAPER = dict(
  grpo.PAPER,
  model="qwen2.5-math-7b",
  data="/data/openr1_math.jsonl",  # assumed local copy of their openr1 set
  group_size=8,
  extra_groups=64,  # assumed (a fixed budget; see the deviation)
  batch_size=128,
  minibatches=2,
  ppo_epochs=2,
  lr=1e-6,
  kl_coef=0.0,
  entropy_coef=0.001,
  pooled_std=False,
  max_prompt_len=1024,
  max_new_tokens=3072,
  eval_samples=128,
)

# (3) DARS-B. Laptop: 4x the prompts (16 -> 64) with K = B / 2, one
# full-batch update per epoch over 2 epochs, lr x sqrt(4) (assumed).
DARS_B = dict(
  batch_size=64, extra_groups=32, minibatches=1, ppo_epochs=2, lr=4e-4
)
# Paper: the official DARS-B command (README "Run DARS-B";
# experiments/DARS-{1.5B,7B}-{ET,HW}-Breadth.sh): train_batch_size =
# ppo_mini_batch_size = 3072, ppo_epochs 2, lr 5e-6, 8 rollouts.
DARS_B_PAPER = dict(
  PAPER,
  batch_size=3072,
  extra_groups=1536,  # assumed: PAPER's K / B ratio
  minibatches=1,
  ppo_epochs=2,
  lr=5e-6,
  micro_batches=768,  # assumed: 48 sequences per micro-batch, as PAPER
  steps=86,  # the Breadth scripts' total_training_steps
)

# BroRL: no adaptive stage, very wide groups (paper: N = 512 rollouts per
# prompt, Sec. 4; laptop: 32).
BRORL = dict(extra_groups=0, group_size=32, batch_size=4)
BRORL_PAPER = dict(
  PAPER, model="/ckpt/ProRL-1.5B", extra_groups=0, group_size=512, batch_size=32
)

# --variant -> (laptop preset, paper preset).
VARIANTS = {
  "dars": ({}, {}),
  "dars_b": (DARS_B, DARS_B_PAPER),
  "brorl": (BRORL, BRORL_PAPER),
}


def resolve(cfg: Config) -> Config:
  """cfg with its variant's preset on every field still at the default.

  run() applies it first, and experiments/reproduce.py before it compares
  a config with a finished run's config.json (which holds the resolved
  settings).

  The default is the scale's: Config() at laptop scale, Config() with
  PAPER at --scale=paper. A field set to another value (a flag, a claim
  override) keeps its value.
  """
  laptop, paper = VARIANTS[cfg.variant]
  base = Config()
  if cfg.scale == "paper":
    base, preset = dataclasses.replace(base, **PAPER), paper
  else:
    preset = laptop
  keep = {
    k: v for k, v in preset.items() if getattr(cfg, k) == getattr(base, k)
  }
  return dataclasses.replace(cfg, **keep)


def make_batch(rollout, examples, ctx):
  """Round 0, extra groups for hard prompts (1), pooled advantages (2)."""
  cfg = ctx.cfg
  g = cfg.group_size
  total, parts = ctx.score(rollout, examples)
  metrics = objective.reward_metrics(total, parts, rollout, examples, ctx)
  batch = ctx.batch_from_rollout(rollout)
  rewards = [np.asarray(total, np.float32)]
  uids = [examples[i].uid for i in rollout.prompt_ids]
  if cfg.extra_groups:
    correct = objective.correctness(rollout, examples, ctx)
    acc = correct.reshape(-1, g).mean(-1)
    counts = allocation.extra_rollouts(
      acc,
      cfg.extra_groups * g,
      group_size=g,
      threshold=cfg.hard_threshold,
      schedule=cfg.extra_schedule,
    )
    more = allocation.repeat_for(examples, counts)
    ro = allocation.sample_again(ctx, more, 0, group_size=1)
    extra_total, _ = ctx.score(ro, more)
    batch = dynamic_sampling.concat(
      [batch, ctx.batch_from_rollout(ro)], ctx.tokenizer.pad_id
    )
    rewards.append(np.asarray(extra_total, np.float32))
    uids += [more[i].uid for i in ro.prompt_ids]
    extra_correct = objective.correctness(ro, more, ctx)
    metrics["dars/hard_prompts"] = float((acc < cfg.hard_threshold).mean())
    metrics["dars/extra_accuracy"] = float(extra_correct.mean())
  reward = np.concatenate(rewards)
  batch["adv"] = allocation.pooled_advantages(
    reward, uids, eps=cfg.std_eps, scale=cfg.pooled_std
  )
  if cfg.extra_groups:  # (2) pooled accuracy 0 or 1: out of the update
    pooled = allocation.pooled_means(
      np.concatenate([correct, extra_correct]), uids
    )
    keep = (pooled > 0) & (pooled < 1)
    batch = objective.drop_groups(batch, keep, 1)
    metrics["dars/kept"] = float(keep.mean())
  if cfg.needs_ref:
    batch["ref_logp"] = guided.batch_ref_logp(batch, ctx)
  metrics["adv_abs"] = float(np.abs(batch["adv"]).mean())
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  cfg = resolve(cfg)
  tracker = difficulty.Tracker()
  title = {
    "dars": "DARS (arXiv:2508.13755)",
    "dars_b": "DARS-B (arXiv:2508.13755)",
    "brorl": "BroRL (arXiv:2510.01180)",
  }[cfg.variant]
  return loop.train_and_report(
    cfg,
    name="dars",
    title=title,
    make_batch=difficulty.tracking(make_batch, tracker),
    loss_fn=objective.loss_fn,
    prompt_iterator=difficulty.tracked_iterator(tracker),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

r"""DLER: doing length penalty right (truncation + the right optimiser).

Paper: Liu et al. 2025, "DLER: Doing Length pEnalty Right - Incentivizing
More Intelligence per Token via Reinforcement Learning", arXiv:2510.15110.
Differs from experiments/grpo.py in exactly:
  (1) the simplest length penalty, truncation: training generates at most
      --max_new_tokens (the length limit), and a response that reaches it
      without finishing earns 0 whatever it says; a finished response
      earns its 0/1 correctness (rewards/length.py `truncation`;
      --truncation_length below max_new_tokens also zeroes finished
      responses longer than it);
  (2) batch-wise reward normalisation, the paper's fix for the biased
      advantages that truncation causes under GRPO's per-group
      normalisation, as the authors' script runs it (verl-dler/dler.sh:
      adv_estimator=reinforce_plus_plus_baseline): each reward minus its
      group's mean, then whitened over all the batch's completion tokens
      (returns.reinforce_plus_plus_baseline; --advantage=lite_ppo divides
      by the batch's sequence-level std instead);
  (3) higher clipping: epsilon_high 0.28 (DAPO's clip-higher), so the
      low-probability tokens that would shorten a response can grow;
  (4) dynamic sampling (rlreason/rl/dynamic_sampling.py): groups whose G
      rewards are all equal are dropped and refilled (at most
      --max_sample_rounds rollouts per step);
  (5) no KL term; token-mean aggregation (the script's loss_agg_mode).
  Deviations: the batch std of (2) is over each sampled round (before the
  filter of (4)), and (4) keeps groups by their 0/1 correctness, which
  equals the truncated reward except for an answer that ends exactly at
  the limit (or, with --truncation_length, for finished responses past
  it, and with --cutoff_reward_scale, for right answers cut off). PAPER
  has the script's extras beside the paper's recipe: dual clip at 10,
  weight decay 0.01, a cut-off response's correctness times 0.1 where (1)
  gives 0 (--cutoff_reward_scale, the script's stop_properly_penalty) and
  +0.1 on every token's advantage of a right answer, cut off or not
  (--correct_advantage_boost, its correct_sample_advantage_boost_value,
  on its score before the cut-off scale, added after (2)); the laptop
  config keeps the paper's 0 and 0. (The script's group filter reads
  that score too: (4)'s correctness.) PAPER has its KL loss too
  (kl_loss_coef 5e-4, low_var_kl: k3 here, without verl's clamps), where
  (5) has none. Not implemented: the difficulty-aware limit (DA-DLER)
  and the update-selective weight merging.
After training, accuracy_vs_tokens.png in the workdir plots the train
accuracy against the mean response length, step by step.

Reproduces:
  laptop: a truncation penalty with the right optimiser shortens responses
    and recovers accuracy at a tight budget (20 tokens, the warm start's
    median solution length; grpo.py samples 40):
      python -m experiments.reproduce --method=dler --seeds=0,1,2
    Expected: dler's `length` well below grpo's, and its held-out accuracy
    at the 20-token budget above its own start. Measured numbers in
    experiments/README.md.
  paper: DLER-R1-1.5B / 7B cut the response length by more than 70% with
    accuracy at or above DeepSeek-R1-Distill's (abstract; the per-benchmark
    table is not restated here).

CPU:  python -m experiments.dler
TPU:  launch/tpu.sh run experiments.dler --scale=paper \
        --model=/ckpt/DeepSeek-R1-Distill-Qwen-7B \
        --workdir=gs://$BUCKET/dler/$(date +%m%d_%H%M)
"""

import dataclasses
import os

import jax
import numpy as np

from experiments import grpo
from rlreason import config
from rlreason.rl import dynamic_sampling
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason import metrics as metrics_lib
from rlreason.rl import objective
from rlreason import storage
from rlreason.rewards import length


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with DLER's recipe; paper: PAPER."""

  max_new_tokens: int = 20  # (1) the limit: the warm start's median
  truncation_length: int = 0  # (1) 0 = max_new_tokens
  # The warm start sees whole solutions (grpo.py's, whose cache it shares).
  warm_start_max_new_tokens: int = grpo.TinyConfig.max_new_tokens
  advantage: str = "reinforce_plus_plus_baseline"  # (2)
  clip_eps_high: float = 0.28  # (3)
  dynamic_sampling: bool = True  # (4) drop all-equal groups, sample more
  max_sample_rounds: int = 3  # (4) a budget, as dapo.py's
  kl_coef: float = 0.0  # (5)
  aggregation: str = "token-mean"  # (5)
  cutoff_reward_scale: float = 0.0  # script: cut-off right answers earn this
  correct_advantage_boost: float = 0.0  # script: on right answers' advantages

  @property
  def limit(self) -> int:
    return self.truncation_length or self.max_new_tokens

  def validate(self) -> None:
    super().validate()
    config.require(
      self.max_sample_rounds >= 1,
      f"--max_sample_rounds={self.max_sample_rounds} must be >= 1",
    )
    config.require(
      0.0 <= self.cutoff_reward_scale <= 1.0,
      f"--cutoff_reward_scale={self.cutoff_reward_scale} must be in [0, 1]"
      " (a cut-off right answer's share of a finished one's reward)",
    )


# The shipped-base testbed (reproduce.py --testbed=base): the limit at the
# base's median length on its level-2 problems (base card: 73 tokens).
BASE = dict(max_new_tokens=72)


# DeepSeek-R1-Distill-Qwen-7B trained with the truncation penalty. The
# authors' verl-dler/dler.sh (for the 1.5B model) gives the data
# (DeepScaleR's train.parquet), the 4000-token limit, 256 prompts x 16,
# mini-batch 64 and lr 1e-6, and trains one epoch; the step count here is
# an assumption.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/DeepSeek-R1-Distill-Qwen-7B",  # a local HF dir
  data="data/deepscaler/train.parquet:problem,answer",
  eval_data="hf:HuggingFaceH4/aime_2024:split=train",
  eval_size=30,
  eval_samples=16,
  template="chat",
  reward="math",
  batch_size=256,
  group_size=16,
  minibatches=4,  # ppo_mini_batch_size 64
  # 32 rows of 1024 + 4000 tokens per micro-batch: the planner's (16 left
  # 89.8 GiB of train-step temporaries per chip on v5p-16).
  micro_batches=32,
  max_prompt_len=1024,
  max_new_tokens=4000,  # (1) the limit
  max_sample_rounds=10,
  temperature=1.0,
  lr=1e-6,
  weight_decay=0.01,
  dual_clip=10.0,  # clip_ratio_c
  kl_coef=5e-4,  # use_kl_loss, kl_loss_coef (low_var_kl: k3)
  cutoff_reward_scale=0.1,  # stop_properly_penalty.penalty_coef
  correct_advantage_boost=0.1,  # correct_sample_advantage_boost_value
  steps=1000,  # assumption
  eval_every=50,
)


def make_batch(rollout, examples, ctx):
  """Truncated correctness (1); batch-normalised advantages (2); the
  script's cut-off reward and correct-response boost when set."""
  cfg = ctx.cfg
  correct = objective.correctness(rollout, examples, ctx)
  finished = np.asarray(rollout.finish_reasons) == "eos"
  r = length.truncation(
    rollout.texts,
    lengths=rollout.lengths,
    max_length=cfg.limit,
    correct=correct * finished,
  )
  r = r + np.float32(cfg.cutoff_reward_scale) * correct * ~finished
  batch, metrics = objective.outcome_batch(
    rollout, examples, ctx, rewards=(r, {"truncation": r})
  )
  if cfg.correct_advantage_boost:
    # On the score before the cut-off scale, as the script's actor reads
    # token_level_scores: right answers cut off are boosted too.
    boost = np.float32(cfg.correct_advantage_boost) * (correct >= 1.0)
    adv = batch["adv"]
    batch["adv"] = adv + boost.reshape((-1,) + (1,) * (adv.ndim - 1))
  metrics["truncated_correct"] = float((correct * ~finished).mean())
  return batch, metrics


def plot_accuracy_vs_tokens(workdir: str, title: str = "") -> str:
  """accuracy_vs_tokens.png: train accuracy against mean length per step."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = [
    r
    for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    if "loss" in r and "accuracy" in r and "length" in r
  ]
  path = os.path.join(workdir, "accuracy_vs_tokens.png")
  fig, ax = plt.subplots(figsize=(5, 4))
  if rows:
    points = ax.scatter(
      [r["length"] for r in rows],
      [r["accuracy"] for r in rows],
      c=[r["step"] for r in rows],
      cmap="viridis",
      s=14,
    )
    fig.colorbar(points, ax=ax, label="RL step")
  ax.set_xlabel("mean response length (tokens)")
  ax.set_ylabel("train accuracy")
  ax.set_title(title or "accuracy vs tokens")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=110)
  plt.close(fig)
  return path


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  cfg = loop.warm_started(
    cfg, "dler", max_new_tokens=cfg.warm_start_max_new_tokens
  )
  batch_fn = make_batch
  if cfg.dynamic_sampling:  # (4)
    batch_fn = dynamic_sampling.refill(
      make_batch, max_rounds=cfg.max_sample_rounds
    )
  out = loop.train_and_report(
    cfg,
    name="dler",
    title="DLER (arXiv:2510.15110)",
    make_batch=batch_fn,
    loss_fn=objective.loss_fn,  # (2), (3), (5)
  )
  if jax.process_index() == 0:
    plot_accuracy_vs_tokens(out["workdir"], "DLER: accuracy vs tokens")
  return out


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

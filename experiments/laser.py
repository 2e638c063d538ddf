r"""LASER / LASER-D / LASER-DE: length-based step reward, adaptive targets.

Paper: Liu et al. 2025, "Learn to Reason Efficiently with Adaptive
Length-based Reward Shaping", arXiv:2505.15612. Authors' code:
hkust-nlp/Laser. Differs from experiments/grpo.py in exactly:
  (1) a step length reward on top of correctness C in {0, 1}: a correct
      response no longer than the target L_T gets +0.5 (mode "reward";
      "penalty" and "hybrid" are the paper's other shapes), wrong ones
      nothing (rewards/length.py `laser`, the authors' length_penalty.py);
  (2) --variant=laser_d (default): the target depends on the prompt's
      difficulty, bucketed by its group accuracy (>= 2/3 easy, >= 1/3
      medium, else hard), and adapts during training: each bucket's
      target is the shortest candidate length (--target_lower ..
      --target_upper by --target_interval, below the batch's longest
      response) at which the share of the bucket's responses no longer
      than it, times the fewest correct responses a prompt of the bucket
      has, keeps at least one (length.laser_d_adaptive_targets, the
      authors' _choose_target_length); --variant=laser uses the fixed
      --target_length; --variant=laser_de adds LASER-DE's exploration
      bonus: a wrong response that gives an answer (extract.extract), is
      longer than its bucket's target and does not loop
      (repetition.loop_start, the authors' token n-gram check) gets
      +--length_reward_scale (length.laser_exploration, the authors'
      compute_length_reward_larse_de);
  (3) the authors' verl settings: clip 0.2 / 0.28, a k3 KL loss of 0.001,
      an entropy bonus of 0.001, temperature 0.6, two updates per batch,
      token-mean loss aggregation (their verl's compute_policy_loss).
  Deviations: the authors measure the adaptive targets' coverage on a
  500-prompt monitoring set every 20 steps; here on each training batch.
  The correctness reward is the task's 0/1 (the authors' scorer gives a
  wrong answer -0.5, one without a final answer -1; LASER-DE's bonus goes
  to the -0.5 ones, here the wrong responses with an answer to read).

Reproduces:
  laptop: the length reward shortens responses, LASER-D at least as well
    as LASER with accuracy kept:
      python -m experiments.reproduce --method=laser --seeds=0,1,2
    Expected: `length` of laser and laser_d below grpo's; laser_d's
    accuracy at least laser's. Measured numbers in experiments/README.md.
  paper: LASER-D on DeepSeek-R1-Distill-Qwen-1.5B: +6.1 AIME 2024 with 63%
    fewer tokens (abstract).

CPU:  python -m experiments.laser
TPU:  launch/tpu.sh run experiments.laser --scale=paper \
        --model=/ckpt/DeepSeek-R1-Distill-Qwen-1.5B \
        --data=/data/deepscaler/train.parquet:problem,answer \
        --workdir=gs://$BUCKET/laser/$(date +%m%d_%H%M)
"""

import dataclasses


from experiments import grpo
from rlreason import config
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective
from rlreason import mesh as mesh_lib
from rlreason.data import extract
from rlreason.rewards import length
from rlreason.rewards import repetition


VARIANTS = ("laser", "laser_d", "laser_de")


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with the length reward; paper: PAPER."""

  variant: str = "laser_d"  # (2) laser | laser_d | laser_de
  length_reward_scale: float = 0.5  # (1) the authors' length_reward_scalar
  length_reward_mode: str = "reward"  # (1) reward | penalty | hybrid
  target_length: int = 20  # (2) LASER's fixed L_T: the median solution
  target_lower: int = 12  # (2) LASER-D candidate targets
  target_upper: int = 40  # (2) the longest candidate target
  target_interval: int = 4  # (2) the candidates' spacing in tokens
  clip_eps_high: float = 0.28  # (3)
  kl_coef: float = 0.001  # (3)
  entropy_coef: float = 0.001  # (3)
  temperature: float = 0.6  # (3)
  minibatches: int = 2  # (3) ppo_mini_batch_size 64 of 128 prompts
  aggregation: str = "token-mean"  # (3)

  def validate(self) -> None:
    super().validate()
    config.require(
      self.length_reward_mode in ("reward", "penalty", "hybrid"),
      f"--length_reward_mode={self.length_reward_mode!r}; expected reward, "
      "penalty or hybrid",
    )
    if self.variant not in VARIANTS:
      raise ValueError(
        f"Invalid config: --variant={self.variant!r}; expected one of "
        f"{', '.join(VARIANTS)}"
      )
    if not 0 < self.target_lower <= self.target_upper:
      raise ValueError(
        "Invalid config: need 0 < --target_lower <= --target_upper"
      )
    if self.target_interval < 1:
      raise ValueError("Invalid config: --target_interval must be >= 1")

  @property
  def thresholds(self) -> list[int]:
    return list(
      range(self.target_lower, self.target_upper + 1, self.target_interval)
    )


# The shipped-base testbed (reproduce.py --testbed=base): the fixed target at
# the base's median length on its level-2 problems (base card: 73 tokens),
# LASER-D's candidates around it up to the 128-token budget.
BASE = dict(
  target_length=72, target_lower=40, target_upper=128, target_interval=8
)


# The authors' scripts/training/laser-d-1.5b/laser-d-1.5b-l4096.sh:
# DeepSeek-R1-Distill-Qwen-1.5B on DeepScaleR, batch 128 x 8 samples,
# mini-batch 64, lr 1e-6, clip 0.2 / 0.28, KL 0.001 low_var_kl, entropy
# 0.001, temperature 0.6, 1024 + 16384 tokens, targets 4096..16384 by
# 1024, 5 epochs, monitoring every 20 steps.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/DeepSeek-R1-Distill-Qwen-1.5B",  # a local HF dir
  data="data/deepscaler/train.parquet:problem,answer",
  eval_data="hf:HuggingFaceH4/aime_2024:split=train",
  eval_size=30,
  eval_samples=16,
  template="chat",
  reward="math",
  batch_size=128,
  group_size=8,
  minibatches=2,
  micro_batches=16,
  max_prompt_len=1024,
  max_new_tokens=16384,
  temperature=0.6,
  lr=1e-6,
  clip_eps_high=0.28,
  kl_coef=0.001,
  kl_estimator="k3",
  entropy_coef=0.001,
  target_length=4096,
  target_lower=4096,
  target_upper=16384,
  target_interval=1024,
  steps=1575,  # total_epochs 5 over DeepScaleR (~40K problems) at 128
  eval_every=10,
  checkpoint_every=10,
)


def make_batch(rollout, examples, ctx):
  """Correctness + the step length reward (1) with adaptive targets and
  LASER-DE's exploration bonus (2)."""
  cfg = ctx.cfg
  correct = objective.correctness(rollout, examples, ctx)
  extra, parts = {}, {}
  if cfg.variant == "laser":
    target = float(cfg.target_length)
  else:
    targets = length.laser_d_adaptive_targets(
      rollout.lengths,
      correct,
      cfg.group_size,
      cfg.thresholds,
    )
    target = length.laser_d_bucket_targets(correct, cfg.group_size, targets)
    extra = {f"laser/target_{k}": v for k, v in targets.items()}
  bonus = length.laser(
    rollout.texts,
    lengths=rollout.lengths,
    target_length=target,
    correct=correct,
    scale=cfg.length_reward_scale,
    mode=cfg.length_reward_mode,
  )
  if cfg.variant == "laser_de":
    tokens = mesh_lib.to_host(rollout.tokens)[:, rollout.prompt_len :]
    looping = repetition.loops(tokens, rollout.lengths)
    parts["explore"] = length.laser_exploration(
      rollout.lengths,
      target,
      correct=correct,
      answered=[extract.extract(t) is not None for t in rollout.texts],
      looping=looping,
      scale=cfg.length_reward_scale,
    )
    extra["laser/looping"] = float(looping.mean())
  total = correct + bonus + sum(parts.values())
  batch, metrics = objective.outcome_batch(
    rollout,
    examples,
    ctx,
    rewards=(total, {"correct": correct, "laser": bonus, **parts}),
  )
  metrics.update(extra)
  return batch, metrics


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  return loop.train_and_report(
    cfg,
    name="laser",
    title="LASER (arXiv:2505.15612)",
    make_batch=make_batch,
    loss_fn=objective.loss_fn,
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

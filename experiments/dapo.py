r"""DAPO: decoupled clip and dynamic sampling policy optimisation.

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning
System at Scale", arXiv:2503.14476. Authors' code: the DAPO recipe of
volcengine/verl. Differs from experiments/grpo.py in exactly:
  (1) clip-higher: the ratio is clipped to [1 - 0.2, 1 + 0.28] (Sec. 3.1),
      so low-probability tokens can grow and entropy does not collapse;
  (2) dynamic sampling (Sec. 3.2, Eq. 11): groups whose G answers are all
      right or all wrong are dropped and more prompts are sampled until B
      informative groups fill the batch (rlreason/rl/dynamic_sampling.py; at
      most --max_sample_rounds rollouts per step, then the rest of the
      batch is weightless padding);
  (3) token-level loss (Sec. 3.3): the token losses of the whole batch are
      averaged ("token-mean"), so long completions weigh by their length;
  (4) soft overlong punishment (Sec. 3.4, Eq. 13): completions longer than
      max_new_tokens - overlong_buffer lose up to 1 reward, linearly
      (rewards/length.py `overlong`); the length-truncation *filter* of
      Table 1's second row is not used (the verl recipe keeps only the
      soft punishment);
  (5) no KL term (Sec. 2.3);
  (6) 16 gradient updates per rollout batch (mini-batches of 32 prompts x
      16 answers; the verl recipe), so the clip of (1) is active; the
      laptop default takes 4.
  The correctness reward is +1 / -1, as the paper's (Eq. 1) and verl's
  math_dapo scorer: the run's 0/1 reward r enters as 2r - 1
  (--signed_reward; false keeps 0/1). Group normalisation makes the two
  identical but for the overlong penalty's weight, twice as strong against
  0/1.

Reproduces:
  laptop: Fig. 2 (b), clip-higher keeps the policy's entropy higher than
    symmetric clipping:
      python -m experiments.reproduce --method=dapo --seeds=0,1,2
    (this file with --clip_eps_high=0.28 vs 0.2). Expected: higher mean
    entropy with clip-higher; measured numbers in experiments/README.md.
  paper: Table 1, Qwen2.5-32B base: AIME 2024 avg@32 = 50 for full DAPO
    (30 for naive GRPO; 42 before dynamic sampling is added).

CPU:  python -m experiments.dapo
TPU:  launch/tpu.sh run experiments.dapo --scale=paper \
        --model=/ckpt/Qwen2.5-32B \
        --workdir=gs://$BUCKET/dapo/$(date +%m%d_%H%M)
"""

import dataclasses
from typing import ClassVar

import numpy as np

from experiments import grpo
from rlreason import config
from rlreason.rl import dynamic_sampling
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective
from rlreason.rewards import length


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with DAPO's objective; paper: PAPER."""

  # Runs recorded before --signed_reward existed scored 0 / 1.
  absent_means: ClassVar[dict[str, object]] = {"signed_reward": False}

  clip_eps_low: float = 0.2  # (1) epsilon_low, Sec. 3.1
  clip_eps_high: float = 0.28  # (1) epsilon_high, Sec. 3.1
  dynamic_sampling: bool = True  # (2) drop all-equal groups, sample more
  # (2) rollouts per step at most (the loop's + refills); verl's
  # max_num_gen_batches. A budget, not in the paper.
  max_sample_rounds: int = 3
  aggregation: str = "token-mean"  # (3)
  # (4) L_cache of Eq. 13 (paper: 4096 of L_max = 20480, a fifth); the
  # penalty starts at max_new_tokens - overlong_buffer.
  overlong_buffer: int = 8
  overlong_penalty: float = 1.0  # (4) verl's overlong_penalty_factor
  signed_reward: bool = True  # correctness as +1 / -1 (the paper's Eq. 1)
  kl_coef: float = 0.0  # (5)
  minibatches: int = 4  # (6) paper: 16

  def validate(self) -> None:
    super().validate()
    config.require(
      0 <= self.overlong_buffer < self.max_new_tokens,
      f"--overlong_buffer={self.overlong_buffer} must be in [0, "
      f"--max_new_tokens={self.max_new_tokens})",
    )
    config.require(
      self.overlong_penalty >= 0,
      f"--overlong_penalty={self.overlong_penalty} must be >= 0",
    )
    config.require(
      self.max_sample_rounds >= 1,
      f"--max_sample_rounds={self.max_sample_rounds} must be >= 1",
    )


# The shipped-base testbed (reproduce.py --testbed=base): the soft overlong
# buffer at the paper's share of the budget (4096 of 20480: 20% of 128).
BASE = dict(overlong_buffer=26)


# Sec. 4.1 (training details) and the authors' verl recipe
# (recipe/dapo/run_dapo_qwen2.5_32b.sh) for what the paper leaves out.
PAPER = dict(
  grpo.PAPER,
  # Qwen2.5-32B base (Sec. 4.1). Not a preset: pass the local HF directory.
  model="/ckpt/Qwen2.5-32B",
  data="hf:BytedTsinghua-SIA/DAPO-Math-17k",  # DAPO-Math-17K (Sec. 4.1)
  # AIME 2024, avg@32 (Sec. 4.1). The paper samples evaluation answers with
  # temperature 1.0 and top-p 0.7; our evaluation uses top-p 1.
  eval_data="hf:BytedTsinghua-SIA/AIME-2024",
  eval_size=30,
  eval_samples=32,
  # The dataset's prompts carry their own instruction ("... Answer:
  # $Answer"); the recipe applies the chat template.
  template="chat",
  reward="math",
  batch_size=512,  # prompt batch 512 (Sec. 4.1)
  group_size=16,  # 16 responses per prompt (Sec. 4.1)
  minibatches=16,  # (6) mini-batch of 512 responses (Sec. 4.1)
  # 64 rows per micro-batch: one 22.5k-token row per chip of a v5p-128
  # (experiments.plan; 16 would leave 32 rows for 64 chips).
  micro_batches=8,
  ppo_epochs=1,
  max_prompt_len=2048,  # recipe max_prompt_length
  max_new_tokens=20480,  # 16384 expected + 4096 soft buffer (Sec. 4.1)
  overlong_buffer=4096,  # (4) L_cache (Sec. 4.1)
  overlong_penalty=1.0,
  # The recipe samples 3 x 512 prompts per generation batch and allows 10
  # such batches: up to 30 rounds of 512 here.
  max_sample_rounds=30,
  temperature=1.0,
  lr=1e-6,  # AdamW, constant (Sec. 4.1)
  # Linear warm-up over 20 rollout steps (Sec. 4.1); warmup_steps counts
  # optimizer updates, 16 a step here.
  warmup_steps=20 * 16,
  weight_decay=0.1,  # recipe value (not in the paper)
  dual_clip=10.0,  # recipe clip_ratio_c (verl's dual clip)
  # Not stated as a number in the text; Fig. 1 spans several thousand steps.
  steps=5000,
  eval_every=50,  # our choice
  checkpoint_every=20,
)


def make_batch(rollout, examples, ctx):
  """Correctness (+1 / -1) + soft overlong punishment (4); GRPO
  advantages."""
  cfg = ctx.cfg
  total, parts = ctx.score(rollout, examples)
  if cfg.signed_reward:  # the paper's +1 / -1 from the run's 0/1
    total = 2.0 * np.asarray(total, np.float32) - 1.0
  penalty = length.overlong(
    rollout.texts,
    lengths=rollout.lengths,
    max_length=cfg.max_new_tokens,
    buffer_length=cfg.overlong_buffer,
    penalty_factor=cfg.overlong_penalty,
  )
  parts = {**parts, "overlong": penalty}
  return objective.outcome_batch(
    rollout, examples, ctx, rewards=(total + penalty, parts)
  )


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  batch_fn = make_batch
  if cfg.dynamic_sampling:  # (2)
    batch_fn = dynamic_sampling.refill(
      make_batch, max_rounds=cfg.max_sample_rounds
    )
  return loop.train_and_report(
    cfg,
    name="dapo",
    title="DAPO (arXiv:2503.14476)",
    make_batch=batch_fn,
    loss_fn=objective.loss_fn,  # (1), (3), (5)
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

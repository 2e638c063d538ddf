r"""DUMP: distribution-level curriculum by UCB over data sources.

Paper: Wang et al. 2025, "DUMP: Automated Distribution-Level Curriculum
Learning for RL-based LLM Post-training", arXiv:2504.09710. Differs from
experiments/grpo.py in exactly:
  (1) the training data are several distributions (here the arithmetic
      task's difficulty levels 1-4, one source each; the paper: K&K
      puzzles of 3-14 people, one source per size);
  (2) each distribution's learnability is the mean absolute GRPO advantage
      of its last --signal_window samples (a sliding window of samples,
      difficulty.Tracker; the authors' window_size 300);
  (3) sources are scored by UCB, L_j + c sqrt(2 ln(sum n + 1) / (n_j + 1))
      with n_j the samples drawn from source j (the authors'
      curriculum_learning.py), and prompts are drawn with source
      probabilities softmax(UCB / tau) (difficulty.ucb_source_weights via
      difficulty.AdaptivePrompts); the tracker is checkpointed with the
      prompt iterator.

Reproduces:
  laptop: DUMP's scheduling vs uniform sampling of the same mixture
    (grpo on the same data):
      python -m experiments.reproduce --method=dump --seeds=0,1,2
    Expected: dump's held-out accuracy >= uniform's, and its sampling
    probabilities (dump/p/<source>) move toward the learnable levels.
  paper: faster convergence and higher final reward on the K&K mixture
    (numbers not quoted in our sources).

CPU:  python -m experiments.dump
TPU:  launch/tpu.sh run experiments.dump --scale=paper \
        --model=/ckpt/Qwen2.5-7B-Instruct-1M \
        --workdir=gs://$BUCKET/dump/$(date +%m%d_%H%M)
"""

import dataclasses

from experiments import claims
from experiments import grpo
from rlreason import config
from rlreason.data import difficulty
from rlreason.train import flags as rr_flags
from rlreason.train import loop
from rlreason.rl import objective


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale on a 4-source mixture; paper: PAPER."""

  data: str = "task:arithmetic:difficulty=1-4,n=4000"  # (1)
  max_new_tokens: int = 76  # level 4's solutions: up to 73 tokens
  ucb_c: float = 1.0  # (3) exploration weight c (the authors' 1)
  source_temperature: float = 0.1  # (3) softmax temperature (theirs)
  signal_window: int = 300  # (2) samples per source's window (theirs)

  def validate(self) -> None:
    super().validate()
    config.require(
      self.signal_window >= 1,
      f"--signal_window={self.signal_window} must be >= 1",
    )
    config.require(
      self.source_temperature > 0,
      f"--source_temperature={self.source_temperature} must be > 0",
    )
    config.require(self.ucb_c >= 0, f"--ucb_c={self.ucb_c} must be >= 0")


# The shipped-base testbed (reproduce.py --testbed=base): the base's own
# levels, one source each; the arithmetic mixture above is outside its
# pretraining.
BASE = claims.BASE_MIXTURE


# The paper trains Qwen2.5-7B-Instruct-1M on K&K logic puzzles (Sec. 4).
# The authors' script (main_grpo_..._combinedkk.sh) sets KL 0.001, verl's
# entropy bonus 0.001, a token-mean loss, weight decay 0.01 and 2 epochs of
# 10,800 puzzles (~168 steps); its 12 sources of 3-14 people (ours: the
# knights task's 2-7), 128 prompts x 16 samples, 4096 + 20480 tokens and 4
# mini-batches are not taken: they change the planned programs (the
# README's planning table).
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B-Instruct-1M",
  data="task:knights:difficulty=1-6,n=30000",  # K&K, 6 sources (assumed n)
  eval_data="task:knights:difficulty=1-6,n=600",
  group_size=8,  # assumed
  max_new_tokens=4096,  # assumed
  signal_window=300,  # (2) the authors' window_size
  kl_coef=0.001,
  entropy_coef=0.001,
  aggregation="token-mean",
  weight_decay=0.01,
  steps=168,
)


def make_batch_fn(tracker):
  inner = difficulty.tracking(objective.make_batch, tracker)  # (2)

  def make_batch(rollout, examples, ctx):
    batch, metrics = inner(rollout, examples, ctx)
    for src in sorted(tracker.sources):
      n, _, sig = tracker.source_stats(src)
      metrics[f"dump/n/{src}"] = float(n)
      if sig == sig:  # not nan
        metrics[f"dump/signal/{src}"] = sig
    return batch, metrics

  return make_batch


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  tracker = difficulty.Tracker(window=cfg.signal_window)
  weights = difficulty.ucb_source_weights(  # (3)
    c=cfg.ucb_c, temperature=cfg.source_temperature
  )
  return loop.train_and_report(
    cfg,
    name="dump",
    title="DUMP (arXiv:2504.09710)",
    make_batch=make_batch_fn(tracker),
    loss_fn=objective.loss_fn,
    prompt_iterator=difficulty.prompts(tracker, weights),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

r"""ADCL: adaptive difficulty curriculum, re-estimated as the policy learns.

Paper: "Learning Like Humans: Advancing LLM Reasoning Capabilities via
Adaptive Difficulty Curriculum Learning and Expert-Guided
Self-Reformulation" (2025, arXiv:2505.08364), the ADCL part (EGSR, the
expert-reformulation RL, is not implemented). Differs from
experiments/grpo.py in exactly:
  (1) a curriculum over a mixture of difficulty levels (arithmetic 1-4);
  (2) difficulty is the CURRENT policy's: the per-prompt running accuracy
      (difficulty.Tracker), and for a prompt not drawn yet its level's
      mean accuracy ("difficulty shift": the estimate changes as the
      policy improves);
  (3) batches are drawn with weights exp(-((acc - target) / width)^2),
      so the policy trains on problems of appropriate difficulty and
      moves on to harder levels as easier ones are mastered
      (difficulty.target_weights via difficulty.AdaptivePrompts).
  Deviation: the paper sorts the data easy-to-hard once and periodically
  re-estimates and re-sorts the upcoming batches with extra rollouts; here
  the estimate comes from the training rollouts themselves, every step.

Reproduces:
  laptop: the adaptive curriculum vs uniform sampling of the same mixture
    (grpo on the same data):
      python -m experiments.reproduce --method=adacl --seeds=0,1,2
    Expected: adacl's held-out accuracy >= uniform's.
  paper: ADCL + EGSR on Qwen2.5-7B: +10% AIME24, +16.6% AIME25 over the
    Zero-RL baseline (abstract; ADCL alone not quoted in our sources).

CPU:  python -m experiments.adacl
TPU:  launch/tpu.sh run experiments.adacl --scale=paper \
        --model=/ckpt/Qwen2.5-7B --workdir=gs://$BUCKET/adacl/$(date +%m%d_%H%M)
"""

import dataclasses

from experiments import grpo
from rlreason import difficulty
from rlreason import flags as rr_flags
from rlreason import loop
from rlreason import objective


@dataclasses.dataclass(frozen=True)
class Config(grpo.Config):
  """grpo.Config's laptop scale on a mixture of levels; paper: PAPER."""

  data: str = "task:arithmetic:difficulty=1-4,n=4000"  # (1)
  max_new_tokens: int = 56
  target_accuracy: float = 0.5  # (3) assumed
  target_width: float = 0.3  # (3) assumed
  tracker_decay: float = 0.5  # (2)


# Qwen2.5-7B base, Zero-RL on math (abstract); the rest assumed.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B",
  data="/data/math_mixture.jsonl",  # assumed
  group_size=8,  # assumed
  max_new_tokens=4096,  # assumed
)


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  tracker = difficulty.Tracker(decay=cfg.tracker_decay)
  weights = difficulty.target_weights(  # (3)
    cfg.target_accuracy, cfg.target_width, source_prior=True
  )
  return loop.train_and_report(
    cfg,
    name="adacl",
    title="ADCL (arXiv:2505.08364)",
    make_batch=difficulty.tracking(objective.make_batch, tracker),  # (2)
    loss_fn=objective.loss_fn,
    prompt_iterator=difficulty.prompts(tracker, weights),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

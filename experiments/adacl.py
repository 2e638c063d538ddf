r"""ADCL + EGSR: adaptive difficulty curriculum and expert-guided
self-reformulation.

Paper: Zhang et al. 2025, "Learning Like Humans: Advancing LLM Reasoning
Capabilities via Adaptive Difficulty Curriculum Learning and Expert-Guided
Self-Reformulation", arXiv:2505.08364 (EMNLP 2025). Differs from
experiments/grpo.py in exactly:
  ADCL, the curriculum:
  (1) a curriculum over a mixture of difficulty levels (arithmetic 1-4);
  (2) difficulty is the CURRENT policy's: the per-prompt running accuracy
      (difficulty.Tracker), and for a prompt not drawn yet its level's
      mean accuracy ("difficulty shift": the estimate changes as the
      policy improves);
  (3) batches are drawn with weights exp(-((acc - target) / width)^2),
      so the policy trains on problems of appropriate difficulty and
      moves on to harder levels as easier ones are mastered
      (difficulty.target_weights via difficulty.AdaptivePrompts).
  EGSR, the guidance (--egsr, on by default; --egsr=false is ADCL alone):
  (4) a prompt whose G rollouts are all wrong is sampled again with the
      whole reference solution shown as an expert's
      (hints.expert_hint, before the question; --egsr_instruction adds
      the request to solve it in the policy's own words): the policy
      writes the solution itself, a reformulation in its own words and
      distribution, instead of being trained on the expert's tokens
      (LUFFY-style imitation);
  (5) up to --egsr_rows verified-correct reformulations replace that
      many of the group's failed rollouts (guided.replacement_rows), so
      the group baseline gives them a positive advantage and the
      policy's own failures a negative one;
  (6) the reformulations are trained in the hint-free context
      (hints.unhinted_batch): --egsr_correction=importance keeps the
      behaviour log-prob, PPO ratio pi_theta(o | q) / pi_old(o | q, e)
      with the clipped surrogate (Guide's correction); =on_policy
      rescores them under q, log pi_old(o | q), i.e. treats them as the
      policy's own samples of q (ratio 1 at the first update);
  (7) evaluation is hint-free.
  Deviations: the paper sorts the data easy-to-hard once and periodically
  re-estimates and re-sorts the upcoming batches with extra rollouts; here
  the estimate comes from the training rollouts themselves, every step.
  Our sources (the abstract and reviews) describe EGSR only as "guiding
  models to reformulate expert solutions within their own conceptual
  framework, rather than relying on direct imitation"; (4)-(6) are our
  reading: when to guide (all-wrong groups), how many rows to replace
  (--egsr_rows), correct-only selection, the hint format and the
  correction are assumed.

Reproduces:
  laptop: ADCL + EGSR vs ADCL alone vs uniform sampling of the same
    mixture (grpo on the same data):
      python -m experiments.reproduce --method=adacl --seeds=0,1,2
    Expected: adacl's held-out accuracy >= adcl_only's >= uniform's, with
    guided/groups > 0 early in training.
  paper: ADCL + EGSR on Qwen2.5-7B: +10% AIME24, +16.6% AIME25 over the
    Zero-RL baseline (abstract; the single components not quoted in our
    sources).

CPU:  python -m experiments.adacl                (ADCL alone: --egsr=false)
TPU:  launch/tpu.sh run experiments.adacl --scale=paper \
        --model=/ckpt/Qwen2.5-7B --workdir=gs://$BUCKET/adacl/$(date +%m%d_%H%M)
"""

import dataclasses
from typing import ClassVar

from experiments import claims
from experiments import grpo
from rlreason.data import difficulty
from rlreason.train import flags as rr_flags
from rlreason.guidance import resampling as guided
from rlreason.guidance import hints
from rlreason.train import loop
from rlreason.rl import objective


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale on a mixture of levels; paper: PAPER."""

  # Runs recorded before --egsr existed re-sampled no failed group.
  absent_means: ClassVar[dict[str, object]] = {"egsr": False}

  # EGSR's make_batch (guidance.resampling) does not apply
  # --rollout_correction: the flag is an error here, not a no-op.
  corrects_rollouts: ClassVar[bool] = False

  data: str = "task:arithmetic:difficulty=1-4,n=4000"  # (1)
  max_prompt_len: int = 128  # (4) room for the expert solution (<= 104)
  max_new_tokens: int = 76  # level 4's solutions: up to 73 tokens
  # Laptop: the warm start learns to read a hint before the question (half
  # its demonstrations show one, sft.encode_pairs). Without, hints cut the
  # warm start's greedy accuracy (guide's data: 11.5% -> 1.0% with 2
  # knowledge points, 0.5% with an expert solution); with, they help (7.8%
  # -> 9.9% and 20.3%). Measured 2026-11-22; every variant shares it.
  warm_start_hints: float = 0.5
  target_accuracy: float = 0.5  # (3) the accuracy batches aim at (assumed)
  target_width: float = 0.3  # (3) the weights' width around it (assumed)
  tracker_decay: float = 0.5  # (2) the running accuracy's decay per draw
  egsr: bool = True  # (4)-(6) False: ADCL alone (the ablation)
  egsr_rows: int = 2  # (5) reformulations per all-wrong group (assumed)
  egsr_correction: str = "importance"  # (6) importance | on_policy (assumed)
  # (4) "": the tiny char-level policy cannot read instructions; the
  # expert line alone conditions it. PAPER sets one (wording assumed).
  egsr_instruction: str = ""

  def validate(self) -> None:
    super().validate()
    if self.egsr_correction not in ("importance", "on_policy"):
      raise ValueError(
        f"Invalid config: --egsr_correction={self.egsr_correction!r}; "
        "expected importance or on_policy"
      )
    if self.egsr and not 0 < self.egsr_rows <= self.group_size:
      raise ValueError(
        f"Invalid config: --egsr_rows={self.egsr_rows} not in "
        f"[1, group_size={self.group_size}]"
      )


# The shipped-base testbed (reproduce.py --testbed=base): the base's own
# levels, one source each; the arithmetic mixture above is outside its
# pretraining.
BASE = claims.BASE_MIXTURE


# Qwen2.5-7B base, Zero-RL on math (abstract); the rest assumed.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B",
  data="/data/math_mixture.jsonl",  # assumed: problems with solutions
  group_size=8,  # assumed
  max_new_tokens=4096,  # assumed
  max_prompt_len=4096,  # room for an expert solution (assumed)
  egsr_instruction=(  # (4) assumed wording
    "Above is an expert's solution. Understand it, then solve the "
    "problem below step by step in your own words."
  ),
)


def expert_fn(cfg: Config):
  """(4) The example with its reference solution as an expert hint."""

  def fn(example, ctx):
    hint = hints.expert_hint(example.solution, cfg.egsr_instruction)
    return hints.with_hint(example, hint=hint) if hint else None

  return fn


def make_batch_fn(cfg: Config):
  if not cfg.egsr:
    return objective.make_batch
  return guided.make_batch(
    [expert_fn(cfg)],  # (4)
    replace=cfg.egsr_rows,  # (5)
    correct_only=True,
    unhinted_context=True,  # (6)
    rescore=cfg.egsr_correction == "on_policy",
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
    title="ADCL + EGSR (arXiv:2505.08364)"
    if cfg.egsr
    else "ADCL (arXiv:2505.08364)",
    # (2): the tracker sees round 0, the unguided policy's rollouts.
    make_batch=difficulty.tracking(make_batch_fn(cfg), tracker),
    loss_fn=objective.loss_fn,
    prompt_iterator=difficulty.prompts(tracker, weights),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

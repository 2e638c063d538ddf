r"""Guide-GRPO: adaptive in-context hints with an off-policy correction.

Paper: Nath et al. 2025, "Adaptive Guidance Accelerates Reinforcement
Learning of Reasoning Models", arXiv:2506.13923. Authors' code:
vaskar-open-source-research/guide_rl. Differs from
experiments/grpo.py in exactly:
  (1) adaptive guidance: a prompt whose G rollouts are all incorrect is
      sampled again with a natural-language hint in its context (here the
      task's first --hint_points knowledge points, hints.knowledge_hint:
      the rule used and the first intermediate result), and the hinted
      group replaces the all-wrong one (rlreason/guidance/resampling.py);
  (2) off-policy correction: the hinted completions are scored under the
      hint-free prompt (hints.unhinted_batch), so their ratio is
      r = pi_theta(o | q) / pi_old(o | q, h) and the update optimises the
      policy for contexts without the hint. As the authors' code
      (compute_policy_loss, gamma_strategy "percentile", gamma 0.9) those
      rows are not clipped: their loss is -A r / (r + gamma), gamma the
      0.9-quantile of their ratios (no gradient;
      offpolicy.mixed_policy_loss); the other rows keep PPO's clip;
  (3) evaluation is hint-free.

Reproduces:
  laptop: hinted re-sampling with the correction vs plain GRPO on the same
    prompts (the paper's Guide-GRPO vs vanilla GRPO comparison):
      python -m experiments.reproduce --method=guide --seeds=0,1,2
    Expected: guide's held-out accuracy >= grpo's, with guided/groups > 0
    early in training.
  paper: Guide-GRPO on 7B / 32B, up to +4% macro-average over vanilla GRPO
    on math benchmarks (abstract; per-benchmark numbers not restated).

CPU:  python -m experiments.guide
TPU:  launch/tpu.sh run experiments.guide --scale=paper \
        --model=/ckpt/Qwen2.5-7B --workdir=gs://$BUCKET/guide/$(date +%m%d_%H%M)
"""

import dataclasses
from typing import ClassVar

from experiments import grpo
from rlreason import config
from rlreason.data import difficulty
from rlreason.train import flags as rr_flags
from rlreason.guidance import resampling as guided
from rlreason.guidance import offpolicy
from rlreason.guidance import hints
from rlreason.train import loop


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with Guide's hinting; paper: PAPER."""

  # Its own make_batch does not apply --rollout_correction.
  corrects_rollouts: ClassVar[bool] = False

  data: str = "task:arithmetic:difficulty=1-3,n=4000"
  max_prompt_len: int = 128  # room for the hint line
  max_new_tokens: int = 48
  # Laptop: the warm start learns to read a hint before the question (half
  # its demonstrations show one, sft.encode_pairs). Without, hints cut the
  # warm start's greedy accuracy (guide's data: 11.5% -> 1.0% with 2
  # knowledge points, 0.5% with an expert solution); with, they help (7.8%
  # -> 9.9% and 20.3%). Measured 2026-11-22; every variant shares it.
  warm_start_hints: float = 0.5
  hint_points: int = 2  # (1) knowledge points in the hint (laptop choice)
  unhinted_context: bool = True  # (2) False: train in the hinted context
  # (2) q of the hinted rows' shaping gamma (the authors' gamma_value).
  gamma_quantile: float = 0.9

  def validate(self) -> None:
    super().validate()
    config.require(
      self.hint_points >= 0, f"--hint_points={self.hint_points} must be >= 0"
    )
    config.require(
      0 < self.gamma_quantile <= 1,
      f"--gamma_quantile={self.gamma_quantile} not in (0, 1]",
    )


# Sec. 5 of the paper trains Qwen2.5 7B / 32B with GRPO on >500k math,
# science and code problems; the hint source is a stronger model's
# summary of the reference solution. The authors' guide_grpo_qwen.sh (for
# Qwen2.5-Math-7B) has KL 0, 128 prompts x 8 samples, 2 mini-batches and
# 1024 / 3072 tokens, and drops (and refills) groups still all right or
# all wrong; not taken here: grpo.PAPER's KL, batch and the budgets below.
PAPER = dict(
  grpo.PAPER,
  model="/ckpt/Qwen2.5-7B",  # assumed size variant
  data="/data/guide_math_with_hints.jsonl",  # assumed: problems + hints
  group_size=8,  # assumed
  max_new_tokens=8192,  # assumed
  max_prompt_len=2048,
)


def hint_fn(cfg):
  def fn(example, ctx):
    hint = example.hint or hints.knowledge_hint(
      example.knowledge, cfg.hint_points
    )
    return hints.with_hint(example, hint=hint) if hint else None

  return fn


def train_fields(cfg) -> dict:
  """Per-row shapes of the batch fields the loss reads beyond
  objective.loss_fn's (the planner's abstract batch, experiments/plan.py)."""
  del cfg
  return {"off_policy": ()}


def loss_fn(params, batch, norm, *, cfg: Config, model_cfg):
  """(2) PPO on the model's own rows, the shaped ratio on hinted ones."""
  return offpolicy.mixed_pg_loss(
    params,
    batch,
    norm,
    cfg=cfg,
    model_cfg=model_cfg,
    gamma_quantile=cfg.gamma_quantile,
  )


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  tracker = difficulty.Tracker()
  make_batch = guided.make_batch(  # (1), (2)
    [hint_fn(cfg)], unhinted_context=cfg.unhinted_context
  )
  return loop.train_and_report(
    cfg,
    name="guide",
    title="Guide-GRPO (arXiv:2506.13923)",
    make_batch=difficulty.tracking(make_batch, tracker),
    loss_fn=loss_fn,
    prompt_iterator=difficulty.tracked_iterator(tracker),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.

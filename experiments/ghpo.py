r"""GHPO: difficulty-aware guided hybrid policy optimisation.

Paper: Liu et al. 2025, "GHPO: Adaptive Guidance for Stable and Efficient
LLM Reinforcement Learning", arXiv:2507.10628. Differs from
experiments/grpo.py in exactly:
  (1) difficulty detection: a prompt whose G rollouts are all wrong is
      beyond the policy's reach; the others are trained with plain
      on-policy GRPO;
  (2) adaptive prompt refinement: such a prompt is sampled again with a
      growing part of its ground-truth solution (hints.solution_prefix):
      --hint_placement=question (PAPER) puts it in the user message after
      the question, introduced by the authors' sentence (hkgc-1/GHPO's
      ghpo_trainer.py: "The following text is the beginning part of the
      answer, which you can refer to for solving the problem:"), so the
      policy writes the whole solution; =answer (the laptop default: the
      shipped base never saw that sentence) makes it the start of the
      answer, which the policy continues. Stage s uses ratio
      --hint_ratios[s] (0.25, 0.5, 0.75) of the solution's lines (the
      authors cut characters), stopping at the first stage that yields a
      correct answer (rlreason/guidance/resampling.py);
  (3) the guided groups replace the all-wrong ones and are trained
      on-policy in their guided context (imitation-like on hard prompts).

Reproduces:
  laptop: GHPO vs GRPO on the same mixed-difficulty prompts:
      python -m experiments.reproduce --method=ghpo --seeds=0,1,2
    Expected: ghpo's held-out accuracy >= grpo's and fewer all-wrong
    groups in its batches (guided/groups falls over training).
  paper: about +5% average over GRPO on six math benchmarks (abstract;
    Qwen2.5-Math-7B, as we read it).

CPU:  python -m experiments.ghpo
TPU:  launch/tpu.sh run experiments.ghpo --scale=paper \
        --model=/ckpt/Qwen2.5-Math-7B \
        --workdir=gs://$BUCKET/ghpo/$(date +%m%d_%H%M)
"""

import dataclasses
from typing import ClassVar

from experiments import grpo
from rlreason import config
from rlreason.data import difficulty
from rlreason.train import flags as rr_flags
from rlreason.guidance import resampling as guided
from rlreason.guidance import hints
from rlreason.train import loop
from rlreason.rl import objective


@dataclasses.dataclass(frozen=True)
class Config(grpo.TinyConfig):
  """grpo.TinyConfig's laptop scale with GHPO's guidance; paper: PAPER."""

  # Its own make_batch does not apply --rollout_correction.
  corrects_rollouts: ClassVar[bool] = False

  data: str = "task:arithmetic:difficulty=1-3,n=4000"
  max_prompt_len: int = 64
  max_new_tokens: int = 48
  hint_ratios: str = "0.25,0.5,0.75"  # (2) one stage per ratio
  # (2) where the solution part goes: "question" (after it, the authors')
  # or "answer" (the answer's start)
  hint_placement: str = "answer"

  def ratios(self) -> list[float]:
    try:  # "" (no hinted stages: the GRPO control) is allowed
      ratios = [float(r) for r in self.hint_ratios.split(",") if r.strip()]
    except ValueError:
      ratios = None
    config.require(
      ratios is not None and all(0 < r <= 1 for r in ratios),
      f"--hint_ratios={self.hint_ratios!r}: comma-separated ratios in (0, 1]",
    )
    return ratios

  def validate(self) -> None:
    super().validate()
    self.ratios()
    config.require(
      self.hint_placement in ("question", "answer"),
      f"--hint_placement={self.hint_placement!r}; expected question or answer",
    )


# Qwen2.5-Math-7B. The authors' recipes/Qwen2.5-Math-7B/ghpo/
# config_ghpo.yaml (hkgc-1/GHPO): data hkgc/math3to5_olympiads_aime, a
# cosine schedule with 10% warm-up, token-mean loss (TRL's "bnpo"); not
# taken here: beta 0 (grpo.PAPER's KL kept), 2048-token responses and a
# 0.5 x format term in the reward.
PAPER = dict(
  grpo.PAPER,
  model="qwen2.5-math-7b",
  data="hf:hkgc/math3to5_olympiads_aime",  # needs worked solutions
  eval_data="hf:HuggingFaceH4/MATH-500:split=test",
  eval_size=500,
  group_size=8,  # assumed
  max_new_tokens=4096,  # assumed
  max_prompt_len=2048,
  schedule="cosine",
  warmup_steps=50,  # 10% of grpo.PAPER's 500 one-update steps
  aggregation="token-mean",
  hint_placement="question",  # (2) the authors'
)

# (2) The authors' words between the question and the solution's start.
REFERENCE_INTRO = (
  "\n The following text is the beginning part of the answer, which you "
  "can refer to for solving the problem:\n"
)


def stage_fn(ratio: float, placement: str = "answer"):
  def fn(example, ctx):
    prefix = hints.solution_prefix(example.solution, ratio)
    if not prefix:
      return None
    if placement == "question":
      return hints.with_hint(example, hint_after=REFERENCE_INTRO + prefix)
    return hints.with_hint(example, prefix=prefix)

  return fn


def run(cfg: Config) -> dict:
  """Entry point for the CLI, tests/experiments_test.py and notebooks."""
  tracker = difficulty.Tracker()
  make_batch = guided.make_batch(
    [stage_fn(r, cfg.hint_placement) for r in cfg.ratios()]
  )
  return loop.train_and_report(
    cfg,
    name="ghpo",
    title="GHPO (arXiv:2507.10628)",
    make_batch=difficulty.tracking(make_batch, tracker),
    loss_fn=objective.loss_fn,
    prompt_iterator=difficulty.tracked_iterator(tracker),
  )


if __name__ == "__main__":
  rr_flags.run_main(Config, run, PAPER)  # Only here: imports define no flags.
